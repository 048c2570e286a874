"""docs/ci.md's GitHub Actions workflow and GitLab CI job work as written: each is parsed
as YAML and its shell steps that run git and kaudit are run here, in a repository holding
a real run, with the CI's variables filled in as the CI would; .pre-commit-hooks.yaml
parses and its entry verifies manifests (and refuses a tampered one)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests.gate.helpers import junit_cases
from tests.helpers import git
from tests.replay.helpers import commit_all, manifest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # where the installed kaudit is


def yaml_blocks(markdown: Path) -> list[Any]:
    text = markdown.read_text()
    return [YAML(typ="safe").load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def workflow() -> dict[str, Any]:
    (doc,) = [b for b in yaml_blocks(ROOT / "docs" / "ci.md") if "jobs" in b]
    assert isinstance(doc, dict)
    return doc


def gitlab_job() -> dict[str, Any]:
    (doc,) = [b for b in yaml_blocks(ROOT / "docs" / "ci.md") if "kaudit-gate" in b]
    assert isinstance(doc, dict)
    job: dict[str, Any] = doc["kaudit-gate"]
    return job


def ci_repository(repo: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone of ``repo`` (its runs committed) with ``origin/main``, as a CI job checks it
    out, and the environment of a CI machine: kaudit on PATH, no user trust store."""
    commit_all(repo, "the runs")
    clone = tmp_path / "ci"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    # the checkpoints travel beside git in a real setup (the DVC remote); copy them here
    for h5 in repo.rglob("*.h5"):
        target = clone / h5.relative_to(repo)
        if not target.exists():
            target.write_bytes(h5.read_bytes())
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "KAUDIT_HOME": str(tmp_path / "ci-home"),  # a CI machine trusts nothing of its own
    }
    return clone, env


def run_step(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_github_workflow_gates_a_pull_request(heat: Path, repo: Path, tmp_path: Path) -> None:
    flow = workflow()
    assert set(flow["on"]) == {"pull_request", "push"}  # YAML 1.2: `on` is a key
    (job,) = flow["jobs"].values()
    steps = job["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0  # origin/main for --trust-ref
    kaudit_steps = [s["run"] for s in steps if "kaudit " in s.get("run", "")]
    assert kaudit_steps, "no kaudit step"
    clone, env = ci_repository(repo, tmp_path)
    summary = tmp_path / "step-summary.md"
    env["GITHUB_STEP_SUMMARY"] = str(summary)
    context = {"github.base_ref": "main", "github.event.repository.default_branch": "main"}

    def expand(match: re.Match[str]) -> str:
        # `a || b`: the first that is set, as GitHub evaluates it
        for name in (n.strip() for n in match.group(1).split("||")):
            assert name in context, f"unexpected expression {name}"
            if context[name]:
                return context[name]
        return ""

    for script in kaudit_steps:
        command = re.sub(r"\$\{\{(.*?)\}\}", expand, script)
        done = run_step(command, clone, env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1] == "gate PASSED"
    assert summary.read_text().startswith("# ✅ kaudit gate: PASSED")
    report = clone / "kaudit-gate.xml"
    assert (
        report.name
        == next(s for s in steps if "upload-artifact" in s.get("uses", ""))["with"]["path"]
    )
    cases = junit_cases(report)
    assert len(cases) == 4
    assert all(c.is_passed for c in cases.values())

    # The same step on a change with a tampered manifest fails.
    target = manifest(clone / "heat" / "checkpoints" / "heat", 30)
    target.write_text(target.read_text().replace('"sig": "', '"sig": "AAAA', 1))
    failed = run_step(re.sub(r"\$\{\{(.*?)\}\}", expand, kaudit_steps[-1]), clone, env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stdout.splitlines()[-1] == "gate FAILED"


def test_the_gitlab_job_gates_a_merge_request(heat: Path, repo: Path, tmp_path: Path) -> None:
    job = gitlab_job()
    assert job["artifacts"]["reports"]["junit"] == "kaudit-gate.xml"
    assert str(job["variables"]["GIT_DEPTH"]) == "0"
    clone, env = ci_repository(repo, tmp_path)
    # GitLab's variables for a merge request into main, and the job's own
    env |= {"CI_DEFAULT_BRANCH": "main", "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main"}
    for name, value in job["variables"].items():  # expanded as GitLab does
        env[name] = run_step(f'printf %s "{value}"', clone, env).stdout
    steps = [s for s in job["script"] if s.startswith(("kaudit ", "git "))]
    assert any(s.startswith("kaudit gate") for s in steps)
    for script in steps:
        done = run_step(script, clone, env)
        assert done.returncode == 0, done.stdout + done.stderr
    cases = junit_cases(clone / "kaudit-gate.xml")
    assert len(cases) == 4
    assert all(c.is_passed for c in cases.values())


def test_the_pre_commit_hook_verifies_the_manifests_of_a_commit(
    heat: Path, repo: Path, tmp_path: Path
) -> None:
    hooks = YAML(typ="safe").load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = hooks
    assert hook["id"] == "kaudit-verify"
    assert hook["language"] == "python"
    files = re.compile(hook["files"])
    staged = sorted(str(p.relative_to(repo)) for p in heat.iterdir())
    chosen = [f for f in staged if files.search(f)]
    assert chosen == [f"heat/checkpoints/heat/step-{s:08d}.h5.kaudit.json" for s in (10, 20, 30)]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    # pre-commit runs the entry with the matching file names appended
    ok = subprocess.run(
        [*shlex.split(hook["entry"]), *chosen], cwd=repo, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ckpt = heat / "step-00000020.h5"
    ckpt.chmod(0o644)
    ckpt.write_bytes(ckpt.read_bytes()[:-1] + b"\0")
    bad = subprocess.run(
        [*shlex.split(hook["entry"]), "--json", *chosen],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert json.loads(bad.stdout)
