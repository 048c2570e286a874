"""Replay runs nothing it should not: placeholders are whole arguments (a hostile run
directory cannot inject into a shell), the command sees a copy of the parent only (not the
run directory, not the recorded data, not the repository's file), and the recorded working
directory cannot lead out of the worktree. Every attack goes through the real CLI, on real
runs."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay import ReplayError
from kronos_audit.replay.handover import hand_over
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage import configure_remote
from tests.helpers import git, replay_repository, run_cli
from tests.replay import recorded
from tests.replay.helpers import bad_input, commit_all, manifest, record, resign, worktrees

pytestmark = pytest.mark.slow

# The fixtures over the repository recorded once for the session (tests/replay/recorded.py).
heat = recorded.heat
key = recorded.key
project = recorded.project


@pytest.fixture
def repo(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    repo_templates: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """conftest's ``repo``, this test's own copy of one recorded for the session: with the
    ``heat`` run recorded in it when the test asks for that run (a real run, as the
    conftest's fixture makes, but run once, not once a test)."""
    then = None
    if "solver_run" in request.fixturenames:
        name, form = request.node.callspec.params["name"], solver_form(request)

        def solver(root: Path) -> None:
            record_solver(root, name, form)

        then = (f"solver-{HOSTILE.index(name)}-{form}", solver)
    return replay_repository(
        tmp_path_factory,
        repo_templates,
        tmp_path / "repo",
        monkeypatch,
        heat="heat" in request.fixturenames,
        then=then,
    )


def solver_form(request: pytest.FixtureRequest) -> str:
    form: str = request.node.callspec.params.get("form", "whole")
    return form


@pytest.fixture
def solver_run(request: pytest.FixtureRequest, repo: Path) -> Path:
    """:func:`record_solver`'s run under the test's hostile ``name``, its command in the
    test's ``form`` (whole arguments unless it names one): the run directory, in this
    test's own copy of a repository where it was recorded once for the session."""
    name: str = request.node.callspec.params["name"]
    return repo / "programs" / name


HOSTILE = ["ckpt;touch pwned;", "ckpt $(touch pwned) x"]
"""Run directory names a shell would parse as commands, were a path spliced into its code."""

SOLVE_OPTS = '''\
"""solver.sh's computation, told where to start, stop and write by options:
solve_opts.py --resume=CKPT --stop=N --out=DIR"""
import argparse
import os

import h5py
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--resume", default="")
p.add_argument("--stop", type=int, required=True)
p.add_argument("--out", required=True)
a = p.parse_args()
if a.resume:
    with h5py.File(a.resume, "r") as f:
        u, start = f["u"][...], int(f["step"][()])
else:
    u, start = np.linspace(0.0, 1.0, 50) ** 3, 0
for _ in range(start, a.stop):
    u = 0.25 * np.roll(u, 1) + 0.5 * u + 0.25 * np.roll(u, -1)
os.makedirs(a.out, exist_ok=True)
with h5py.File(os.path.join(a.out, f"step-{a.stop:08d}.h5"), "w") as f:
    f["u"] = u
    f["step"] = np.int64(a.stop)
'''

FORMS = {
    "whole": ("bash solver.sh {resume_from} {stop_at} {out}", ["bash", "solver.sh"]),
    "option": (
        "python solve_opts.py --resume={resume_from} --stop={stop_at} --out={out}",
        [sys.executable, "solve_opts.py"],
    ),
}


def record_solver(repo: Path, run_dir_name: str, form: str = "whole") -> Path:
    """Steps 5 and 10 of the solver, written into ``programs/<run_dir_name>`` and
    snapshotted with the command of ``form``; returns the run directory."""
    programs = repo / "programs"
    if not (programs / "solve_opts.py").exists():
        (programs / "solve_opts.py").write_text(SOLVE_OPTS)
        commit_all(repo, "solve_opts")
    command, program = FORMS[form]
    previous = ""
    for step in (5, 10):
        if form == "whole":
            args = [*program, previous, str(step), run_dir_name]
        else:
            args = [*program, f"--resume={previous}", f"--stop={step}", f"--out={run_dir_name}"]
        subprocess.run(args, cwd=programs, check=True)
        ckpt = f"{run_dir_name}/step-{step:08d}.h5"
        parent = ["--parent", f"{previous}.kaudit.json"] if previous else []
        made = run_cli(
            "snapshot", ckpt, "--run", "solver", "--step", str(step), *parent,
            "--command", command, cwd=programs,
        )  # fmt: skip
        assert made.exit_code == 0, made.output
        previous = ckpt
    return programs / run_dir_name


def hostile_workdir(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The replay's work directory under the hostile name too: whatever path is handed over
    (the parent's copy lives there), the value substituted carries the name."""
    base = tmp_path / name / "tmp"
    base.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


def pwned(tmp_path: Path) -> list[Path]:
    return [*tmp_path.rglob("pwned"), *Path.cwd().glob("pwned")]


def replay_doc(target: Path, *args: str, exit_code: int = 0) -> dict[str, Any]:
    result = run_cli("replay", str(target), *args, "--json")
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 1. placeholders are whole arguments -------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE)
def test_a_placeholder_spliced_into_a_shell_string_is_refused_and_nothing_runs(
    repo: Path,
    solver_run: Path,
    key: SigningKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    run_dir = solver_run
    witness = tmp_path / "witness"  # where the shell would run an injected `touch pwned`
    witness.mkdir()
    spliced = f"cd {shlex.quote(str(witness))}; python solve.py --resume {{resume_from}}"
    target = resign(manifest(run_dir, 10), key, lambda p: p.update(command=["sh", "-c", spliced]))
    base = hostile_workdir(tmp_path, name, monkeypatch)
    line = bad_input(
        run_cli("replay", str(target)),
        "argument 2 of the recorded command",
        "{resume_from}",
        "placeholders must be whole arguments",
        '"$KAUDIT_RESUME_FROM"',
    )
    assert "solve.py --resume" in line
    assert pwned(tmp_path) == []
    assert list(witness.iterdir()) == []
    assert list(base.iterdir()) == []  # refused before the work directory was made
    assert worktrees(repo) == [str(repo)]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", HOSTILE)
def test_whole_arguments_and_option_values_replay_bitwise_under_a_hostile_name(
    solver_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, form: str
) -> None:
    run_dir = solver_run
    hostile_workdir(tmp_path, name, monkeypatch)
    for step in (5, 10):
        doc = replay_doc(manifest(run_dir, step))
        assert doc["outcome"] == "REPRODUCED"
        assert {d["path"]: d["verdict"] for d in doc["datasets"]} == {
            "/step": "IDENTICAL",
            "/u": "IDENTICAL",
        }
    executed = doc["command"]["executed"]
    resume = executed[2] if form == "whole" else executed[2].removeprefix("--resume=")
    assert name in resume  # one argument, carrying the name, never parsed by a shell
    assert Path(resume).name == "step-00000005.h5"
    assert pwned(tmp_path) == []


# -- 2. the command sees a copy of the parent only ---------------------------------------------

PEEK = """\
import json, os, runpy, sys
resume = os.environ["KAUDIT_RESUME_FROM"]
here = os.path.dirname(resume)
st = os.lstat(resume)
seen = {
    "resume": resume,
    "placeholder": sys.argv[1],
    "listing": sorted(os.listdir(here)),
    "sibling": os.path.exists(os.path.join(here, "step-00000020.h5")),
    "recorded": os.path.exists(os.environ["KAUDIT_TEST_RECORDED"]),
    "inode": [st.st_dev, st.st_ino],
    "links": st.st_nlink,
    "symlink": os.path.islink(resume),
}
with open(os.environ["KAUDIT_TEST_WITNESS"], "w") as f:
    json.dump(seen, f)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""Says what a replayed command can see, then runs the recorded program as it was."""


def peeking(run_dir: Path, key: SigningKey, monkeypatch: pytest.MonkeyPatch, witness: Path) -> None:
    """Re-sign the step-20 manifest so that its command reports what it sees to
    ``witness``, then runs the recorded program."""
    monkeypatch.setenv("KAUDIT_TEST_WITNESS", str(witness))
    monkeypatch.setenv("KAUDIT_TEST_RECORDED", str(run_dir / "step-00000020.h5"))

    def peek(p: dict[str, Any]) -> None:
        p["command"] = ["python", "-c", PEEK, "{resume_from}", *p["command"][1:]]

    resign(manifest(run_dir, 20), key, peek)


def test_the_command_sees_a_copy_of_the_parent_alone_in_a_fresh_directory(
    heat: Path, repo: Path, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    witness = tmp_path / "seen.json"
    peeking(heat, key, monkeypatch, witness)
    doc = replay_doc(manifest(heat, 20))
    assert doc["outcome"] == "REPRODUCED"  # the copy resumes as well as the original
    seen = json.loads(witness.read_text())
    resume = Path(seen["resume"])
    assert seen["placeholder"] == str(resume)
    assert not resume.is_relative_to(repo)
    assert resume.parent.name == "parent"
    assert seen["listing"] == ["step-00000010.h5", "step-00000010.h5.kaudit.json"]
    assert seen["sibling"] is False  # where the old code's sibling of resume_from was
    # A copy: not the repository's file, not a link to it.
    original = (heat / "step-00000010.h5").stat()
    assert seen["inode"] != [original.st_dev, original.st_ino]
    assert seen["links"] == 1
    assert seen["symlink"] is False
    assert not resume.exists()  # and it went with the work directory


def test_a_tolerance_replay_fetches_the_recorded_data_only_after_the_command(
    heat: Path, repo: Path, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    witness = tmp_path / "seen.json"
    peeking(heat, key, monkeypatch, witness)
    configure_remote(Project(repo), str(tmp_path / "remote"))
    # Steps 10 and 20 only: step 30's signed parent is the step 20 re-signed above, not
    # the one in the remote, and push refuses to fork the remote's chain.
    pushed = run_cli("push", str(manifest(heat, 10)), str(manifest(heat, 20)))
    assert pushed.exit_code == 0, pushed.output
    commit_all(repo)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    run_dir = clone / "heat" / "checkpoints" / "heat"
    recorded = run_dir / "step-00000020.h5"
    assert not recorded.exists()
    monkeypatch.setenv("KAUDIT_TEST_RECORDED", str(recorded))
    doc = replay_doc(manifest(run_dir, 20), "--rtol", "1e-12")
    assert doc["outcome"] == "REPRODUCED"
    assert doc["basis"] == "data"
    assert doc["parent"]["fetched"] is True
    seen = json.loads(witness.read_text())
    assert seen["recorded"] is False  # not fetched while the command ran
    assert seen["listing"] == ["step-00000010.h5", "step-00000010.h5.kaudit.json"]
    assert recorded.exists()  # fetched afterwards, to compare with


def test_a_command_that_writes_to_its_input_cannot_change_the_verified_parent(
    heat: Path, key: SigningKey
) -> None:
    parent = heat / "step-00000010.h5"
    before = sha256(parent)
    scribble = (
        "import os\n"
        "p = os.environ['KAUDIT_RESUME_FROM']\n"
        "os.chmod(p, 0o644)\n"
        "with open(p, 'r+b') as f:\n"
        "    f.write(b'written by the replayed command')\n"
    )
    target = resign(manifest(heat, 20), key, lambda p: p.update(command=["python", "-c", scribble]))
    bad_input(run_cli("replay", str(target)), "wrote no checkpoint")  # it did scribble
    assert sha256(parent) == before
    verified = run_cli("verify", str(manifest(heat, 10)))
    assert verified.exit_code == 0, verified.output


# -- 3. the recorded working directory stays in the worktree -----------------------------------


@pytest.mark.parametrize(
    ("link", "cwd"),
    [
        ("absolute", "programs/outside"),
        ("relative", "programs/up/elsewhere"),
    ],
)
def test_a_working_directory_through_a_symlink_out_of_the_worktree_is_refused(
    repo: Path, key: SigningKey, tmp_path: Path, link: str, cwd: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if link == "absolute":
        (repo / "programs" / "outside").symlink_to(elsewhere)
    else:
        # From programs/ in the worktree (WORK/src/programs), ../../.. is WORK's parent:
        # the replay's temporary base, where this test puts a directory to be found.
        (repo / "programs" / "up").symlink_to("../../..")
        (Path(tempfile.gettempdir()) / "elsewhere").mkdir()
        elsewhere = Path(tempfile.gettempdir()) / "elsewhere"
    commit_all(repo, "links")
    record(repo, "heat", "run.py", "--steps", "20", "--every", "10", "--n", "16")
    run_dir = repo / "heat" / "checkpoints" / "heat"

    def moved(p: dict[str, Any]) -> None:
        p["cwd"] = cwd
        p["command"] = ["sh", "-c", "touch ran"]

    target = resign(manifest(run_dir, 20), key, moved)
    bad_input(run_cli("replay", str(target)), cwd, "leads outside the worktree")
    assert list(elsewhere.iterdir()) == []
    assert worktrees(repo) == [str(repo)]


def test_a_working_directory_through_a_symlink_inside_the_worktree_replays(
    repo: Path, key: SigningKey
) -> None:
    (repo / "alias").symlink_to("heat")
    commit_all(repo, "alias")
    record(repo, "heat", "run.py", "--steps", "20", "--every", "10", "--n", "16")
    run_dir = repo / "heat" / "checkpoints" / "heat"
    target = resign(manifest(run_dir, 20), key, lambda p: p.update(cwd="alias"))
    assert replay_doc(target)["outcome"] == "REPRODUCED"


def test_what_is_handed_over_must_be_what_was_signed(
    checkpoint: Path, key: SigningKey, tmp_path: Path
) -> None:
    made = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert made.exit_code == 0, made.output
    parent = read_manifest(manifest_path_for(checkpoint))
    handed = hand_over(parent, tmp_path / "a")
    assert handed == tmp_path / "a" / checkpoint.name
    assert sha256(handed) == parent.subject_sha256
    assert manifest_path_for(handed).read_bytes() == manifest_path_for(checkpoint).read_bytes()
    assert not handed.is_symlink()
    assert handed.stat().st_ino != checkpoint.stat().st_ino
    assert handed.stat().st_mode & 0o222 == 0  # an input, handed over read-only
    # Swapped after verification (as during the copy): the copy's hash says so.
    checkpoint.chmod(0o644)
    with open(checkpoint, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"swapped!")
    with pytest.raises(ReplayError, match="changed after it was verified") as info:
        hand_over(parent, tmp_path / "b")
    assert info.value.stage == "data"
    checkpoint.unlink()
    os.mkfifo(checkpoint)  # never a hang
    with pytest.raises(ReplayError, match="not a regular file"):
        hand_over(parent, tmp_path / "c")


def test_a_parent_manifest_changed_after_verification_is_not_handed_over(
    checkpoint: Path, key: SigningKey, tmp_path: Path
) -> None:
    assert run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1").exit_code == 0
    path = manifest_path_for(checkpoint)
    parent = read_manifest(path)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b"\n")
    with pytest.raises(ReplayError, match="parent manifest changed after it was verified"):
        hand_over(parent, tmp_path / "a")


def test_a_parent_of_another_size_is_refused_before_a_byte_is_copied(
    checkpoint: Path, key: SigningKey, tmp_path: Path
) -> None:
    assert run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1").exit_code == 0
    parent = read_manifest(manifest_path_for(checkpoint))
    checkpoint.chmod(0o644)
    with open(checkpoint, "ab") as f:  # grown after verification
        f.truncate(checkpoint.stat().st_size + (64 << 20))
    dest = tmp_path / "a"
    with pytest.raises(ReplayError, match=r"not the [\d,]+ signed") as info:
        hand_over(parent, dest)
    assert info.value.stage == "data"
    assert not (dest / checkpoint.name).exists()  # nothing copied, not even a part
