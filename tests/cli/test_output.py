"""What every reporting command prints when its output is not a terminal (a pipe, a file,
CI's log): plain text, with no ANSI code, no box drawing, no trailing space, and no key id
or path broken in two, however narrow COLUMNS says the screen is; and, on a terminal
(a pseudo-terminal here), colour but still no box drawing and no broken path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_audit.keys.home import generate_key, select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.storage import configure_remote
from tests.helpers import KAUDIT, git, on_terminal, recorded_project, write_checkpoint

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Longer than a line: a terminal that folds would break a path that holds it.
LONG = "a-run-directory-whose-name-is-long-enough-that-any-folding-would-break-it-in-two"
BOX_DRAWING = re.compile("[\u2500-\u257f]")


def kaudit(*args: str, cwd: Path, code: int = 0) -> tuple[str, str]:
    """`kaudit ARGS` as a process whose stdout and stderr are pipes; (stdout, stderr)."""
    done = subprocess.run(
        [*KAUDIT, *args],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "40"},  # a narrow screen must not matter
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout, done.stderr


def assert_plain(text: str, *whole: str) -> None:
    """``text`` is plain, and each of ``whole`` is on one of its lines, unbroken."""
    assert text.strip(), "nothing printed"
    assert "\x1b" not in text, text
    assert not BOX_DRAWING.search(text), text
    lines = text.splitlines()
    for line in lines:
        assert line == line.rstrip(), f"trailing space in {line!r}"
    for w in whole:
        assert any(w in line for line in lines), (w, text)


def record(root: Path, seed: int, run_id: str) -> Path:
    """The heat example, 20 steps, a checkpoint every 10, under the long directory."""
    done = subprocess.run(
        [sys.executable, "run.py", "--steps", "20", "--every", "10", "--n", "16",
         "--seed", str(seed), "--root", f"checkpoints/{LONG}", "--run-id", run_id],
        cwd=root / "heat", capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root / "heat" / "checkpoints" / LONG / run_id


def record_runs(root: Path) -> None:
    """Two runs of the heat example (seeds 1 and 2, run ids a and b), committed."""
    (root / "heat").mkdir()
    shutil.copy(EXAMPLES / "heat" / "run.py", root / "heat" / "run.py")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the heat example")
    record(root, 1, "a")
    record(root, 2, "b")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "records")


@pytest.fixture
def project(
    request: pytest.FixtureRequest,
    project: Project,
    tmp_path_factory: pytest.TempPathFactory,
    repo_templates: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """conftest's ``project``; for a test that asks for ``runs``, its own copy of one in
    which :func:`record_runs` ran once for the whole session (real runs, but once, not once
    a test), KAUDIT_HOME the key directory of the key that signed them."""
    if "runs" not in request.fixturenames:
        return project
    shutil.rmtree(project.root)
    root = recorded_project(
        "output-runs", tmp_path_factory, repo_templates, record_runs, project.root, monkeypatch
    )
    return find_project(root)


@pytest.fixture
def key(request: pytest.FixtureRequest, project: Project) -> SigningKey:
    """conftest's ``key`` (a key held by the user and trusted by ``project``); for a test
    that asks for ``runs``, the one that signed them."""
    if "runs" in request.fixturenames:
        return select_key("tester")
    k = generate_key("tester")
    project.trust_store().add(k.private_key.public_key(), "tester")
    return k


@pytest.fixture
def runs(project: Project, key: SigningKey, tmp_path: Path) -> tuple[Path, Path]:
    """Two recorded runs of the heat example (seeds differ), committed, with a DVC remote;
    paths relative to the repository root."""
    root = project.root
    a = root / "heat" / "checkpoints" / LONG / "a"
    b = root / "heat" / "checkpoints" / LONG / "b"
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    return a.relative_to(root), b.relative_to(root)


def test_manifest_and_storage_commands(
    project: Project, key: SigningKey, runs: tuple[Path, Path]
) -> None:
    root = project.root
    a, _ = runs
    ckpt = str(a / "step-00000010.h5")
    manifest = ckpt + ".kaudit.json"

    out, _ = kaudit("keys", "list", cwd=root)
    assert_plain(out, key.key_id)
    out, _ = kaudit("keys", "generate", "--name", "second", cwd=root)
    assert_plain(out, re.search(r"key second: ([0-9a-f]{64})", out)[1])  # type: ignore[index]
    out, _ = kaudit("init", cwd=root)
    assert_plain(out, f"kaudit repository at {root}")

    out, _ = kaudit("verify", str(a), cwd=root)
    assert_plain(out, f"ok   {manifest}  (run a, step 10")
    out, _ = kaudit("show", manifest, cwd=root)
    sha256 = re.search(r"sha256\s+([0-9a-f]{64})$", out, re.MULTILINE)
    assert sha256 is not None, out
    assert_plain(out, manifest, sha256[1])

    out, _ = kaudit("status", str(a), cwd=root)
    assert_plain(out, ckpt, "2 local")
    out, _ = kaudit("push", str(a), cwd=root)
    assert_plain(out, "pushed 2 checkpoint(s)")
    out, _ = kaudit("status", str(a), cwd=root)
    assert_plain(out, ckpt, "2 pushed")
    out, _ = kaudit("pull", str(a), cwd=root)
    assert_plain(out, f"ok   {ckpt} (here)")

    extra = write_checkpoint(root / "heat" / "checkpoints" / LONG / "extra.h5")
    out, _ = kaudit(
        "snapshot",
        str(extra.relative_to(root)),
        "--run",
        "x",
        "--step",
        "1",
        "--key",
        "tester",
        cwd=root,
    )
    assert_plain(out, f"heat/checkpoints/{LONG}/extra.h5.kaudit.json")


def test_comparison_commands(project: Project, key: SigningKey, runs: tuple[Path, Path]) -> None:
    root = project.root
    a, b = runs
    a10, b10 = str(a / "step-00000010.h5"), str(b / "step-00000010.h5")

    out, _ = kaudit("diff", a10, b10, cwd=root, code=1)
    assert_plain(out, f"A: {a10} (reference)   B: {b10}", "/fields/u DIFFERENT: 256 of 256")
    out, _ = kaudit("bisect", str(a), str(b), cwd=root, code=1)
    assert_plain(out, f"A: {a}/step-00000020.h5.kaudit.json", "DIVERGED at step 10")
    out, _ = kaudit("replay", str(a / "step-00000020.h5.kaudit.json"), cwd=root)
    assert_plain(out, f"replay of {a}/step-00000020.h5 (run a, step 20)", "REPRODUCED")


def test_interval_and_run(tmp_path: Path) -> None:
    out, _ = kaudit("interval", "--mtbf", "6h", "--cost", "5min", "--simulate", "--trials",
                    "20", cwd=tmp_path)  # fmt: skip
    assert_plain(out, "◀ both", "Daly (2006)")
    out, err = kaudit("run", "--", sys.executable, "-c", "print('the command says hi ')",
                      cwd=tmp_path)  # fmt: skip
    assert out == "the command says hi \n"  # the command's own output, as it wrote it
    assert_plain(err, "exit status 0", sys.executable)


def test_on_a_terminal_colour_but_no_box_and_no_broken_path(
    project: Project, key: SigningKey, runs: tuple[Path, Path]
) -> None:
    root = project.root
    a, _ = runs
    text = on_terminal("status", "--local-only", str(a), cwd=root, env={"COLUMNS": "40"})
    assert "\x1b[" in text  # colour, on a terminal
    assert not BOX_DRAWING.search(text)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\r\n", "\n")
    assert any(str(a / "step-00000010.h5") in line for line in plain.splitlines()), plain
