"""Progress on long operations: a rich bar on stderr when stderr is a terminal (a real
pseudo-terminal here), and nothing but results through a pipe, with -q, or with --json.
A replay on a terminal shows the replayed command's output as it runs. The installed
kaudit runs as a subprocess, its stderr on a pty."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from kronos_audit._internal.progress import report, reporting
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.storage import Storage, configure_remote
from tests.helpers import KAUDIT, discard, git, recorded_project
from tests.replay.helpers import commit_all, manifest, record

HEAT = Path(__file__).resolve().parents[2] / "examples" / "heat" / "run.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "CI")}
    env.update(TERM="xterm-256color", COLUMNS="100", LINES="40")
    return env


def on_pty(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run kaudit with stderr on a pseudo-terminal and stdout on a pipe: (exit code,
    stdout, what reached the terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*KAUDIT, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=slave, env=_env()
    )
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    stdout, _ = proc.communicate()
    reader.join()
    os.close(master)
    return proc.returncode, stdout.decode(), b"".join(chunks).decode("utf-8", "replace")


def piped(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KAUDIT, *args], cwd=cwd, capture_output=True, text=True, env=_env())


def record_heat(root: Path) -> None:
    """A real run of the heat example (20 steps, a checkpoint every 10), its program
    committed."""
    (root / "heat").mkdir()
    shutil.copy(HEAT, root / "heat" / "run.py")
    commit_all(root, "heat")
    record(root, "heat", "run.py", "--steps", "20", "--every", "10", "--n", "16")


@pytest.fixture
def project(
    request: pytest.FixtureRequest,
    project: Project,
    tmp_path_factory: pytest.TempPathFactory,
    repo_templates: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """conftest's ``project``; for a test that asks for ``heat``, its own copy of one in
    which :func:`record_heat` ran once for the whole session (a real run, but one, not one
    a test), KAUDIT_HOME the key directory of the key that signed it."""
    if "heat" not in request.fixturenames:
        return project
    assert "key" not in request.fixturenames  # the recording's key is the user's
    shutil.rmtree(project.root)
    root = recorded_project(
        "progress-heat", tmp_path_factory, repo_templates, record_heat, project.root, monkeypatch
    )
    return find_project(root)


@pytest.fixture
def heat(project: Project) -> Path:
    """A real run of the heat example (20 steps, a checkpoint every 10), committed."""
    return project.root / "heat" / "checkpoints" / "heat"


def test_verify_shows_a_bar_on_a_terminal_only(project: Project, heat: Path) -> None:
    code, stdout, terminal = on_pty("verify", str(heat), cwd=project.root)
    assert code == 0, terminal
    assert "verifying manifests" in terminal
    assert "\x1b[" in terminal  # drawn by rich, as a terminal gets it
    assert "2 manifest(s): 2 ok" in stdout  # the results stay on stdout, plain
    assert "\x1b" not in stdout
    assert "verifying" not in stdout

    done = piped("verify", str(heat), cwd=project.root)
    assert done.returncode == 0
    assert done.stderr == ""
    assert done.stdout == stdout


def test_an_error_line_is_shown_beside_the_bar(project: Project, heat: Path) -> None:
    bad = heat / "step-00000099.h5.kaudit.json"
    bad.write_text("{not json")
    code, stdout, terminal = on_pty("verify", str(heat), cwd=project.root)
    assert code == 2
    (line,) = [x for x in terminal.splitlines() if "kaudit: error: " in x]
    # on a line of its own (erased, then written whole), above the bar
    assert line.removeprefix("\x1b[2K").startswith("kaudit: error: ")
    assert f"{bad.relative_to(project.root)}: not valid JSON" in line
    assert "2 manifest(s): 2 ok" in stdout


@pytest.mark.parametrize("args", [("-q", "verify"), ("verify", "--json")])
def test_quiet_and_json_show_no_bar_even_on_a_terminal(
    project: Project, heat: Path, args: tuple[str, ...]
) -> None:
    code, stdout, terminal = on_pty(*args, str(heat), cwd=project.root)
    assert code == 0
    assert terminal == ""
    # -q: nothing at all on success, on a terminal too; --json: the document
    assert bool(stdout.strip()) is ("--json" in args)


def test_push_and_pull_show_their_bars_on_a_terminal_only(
    project: Project, heat: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    code, stdout, terminal = on_pty("push", str(heat), cwd=project.root)
    assert code == 0, terminal
    assert "pushing 2 checkpoint(s)" in terminal
    assert stdout.startswith("pushed 2 checkpoint(s)")
    discard(Storage(project), heat / "step-00000020.h5")
    code, stdout, terminal = on_pty("pull", str(heat), cwd=project.root)
    assert code == 0, terminal
    assert "pulling and checking" in terminal
    assert "(fetched)" in stdout
    for args in (("-q", "push", str(heat)), ("pull", str(heat), "--json")):
        code, stdout, terminal = on_pty(*args, cwd=project.root)
        assert code == 0
        assert terminal.strip() == ""  # DVC's push clears its own (empty) lines on a tty
        assert bool(stdout) is ("--json" in args)  # -q: nothing on success
    done = piped("pull", str(heat), cwd=project.root)
    assert done.returncode == 0
    assert done.stderr == ""


def test_log_shows_a_bar_on_a_terminal_only(project: Project, heat: Path) -> None:
    code, stdout, terminal = on_pty("log", cwd=project.root)
    assert code == 0, terminal
    assert "reading manifests" in terminal
    assert stdout.startswith("run heat")
    assert piped("log", cwd=project.root).stderr == ""


CHATTY = """\
import sys

import numpy as np

import kronos_audit as ka

with ka.Run("chatty", root="checkpoints", seed=3, every=ka.EverySteps(5)) as run:
    state = run.restore() or {"u": np.zeros(4)}
    for step in run.steps(10):
        state = {"u": state["u"] + run.rng.random(4)}
        print(f"chatty step {step}", flush=True)
        print(f"chatty note {step}", file=sys.stderr, flush=True)
        run.checkpoint(step, state)
"""


def test_replay_tails_the_command_on_a_terminal(project: Project, key: SigningKey) -> None:
    root = project.root
    (root / "chatty.py").write_text(CHATTY)
    commit_all(root, "chatty")
    record(root, ".", "chatty.py")
    target = str(manifest(root / "checkpoints" / "chatty", 10))

    code, stdout, terminal = on_pty("replay", target, cwd=root)
    assert code == 0, terminal
    assert "replaying" in terminal
    assert "running the recorded command" in terminal
    # the replayed segment (steps 6 to 10), both streams, as the command wrote them
    for step in range(6, 11):
        assert f"| chatty step {step}" in terminal
        assert f"| chatty note {step}" in terminal
    assert "chatty step 5" not in terminal
    assert "REPRODUCED" in stdout
    assert "chatty step" not in stdout
    assert "chatty note" not in stdout

    code, stdout, terminal = on_pty("replay", target, "--keep-workdir", cwd=root)
    assert code == 0, terminal
    assert "| chatty step 10" in terminal
    (kept,) = [x for x in stdout.splitlines() if x.startswith("work directory kept: ")]
    workdir = Path(kept.removeprefix("work directory kept: ").split(" (")[0])
    assert (workdir / "stdout.log").read_text().splitlines()[-1] == "chatty step 10"
    shutil.rmtree(workdir.parent)
    git(root, "worktree", "prune")

    for args in (("-q", "replay", target), ("replay", target, "--json")):
        code, stdout, terminal = on_pty(*args, cwd=root)
        assert code == 0
        assert terminal == ""
        assert "chatty step" not in stdout
        assert bool(stdout) is ("--json" in args)  # -q: nothing when it reproduces
    done = piped("replay", target, cwd=root)
    assert done.returncode == 0
    assert done.stderr == ""
    assert "chatty step" not in done.stdout


def test_library_reports_to_the_listener_of_its_context() -> None:
    seen: list[tuple[str, int, int]] = []
    report("nobody listens", 1, 2)
    with reporting(lambda *a: seen.append(a)):
        report("hashing bytes", 5, 10)
        with reporting(None):
            report("hidden", 1, 1)
    report("after", 1, 1)
    assert seen == [("hashing bytes", 5, 10)]


def test_report_shows_a_bar_on_a_terminal_only(project: Project, heat: Path) -> None:
    out = project.root / "report.md"
    code, stdout, terminal = on_pty("report", str(heat), "--out", str(out), cwd=project.root)
    assert code == 0, terminal
    assert "verifying for the report" in terminal
    assert "\x1b" not in stdout
    done = piped("report", str(heat), "--out", str(out), cwd=project.root)
    assert done.returncode == 0
    assert done.stderr == ""


def test_hashing_a_large_checkpoint_shows_its_bytes(project: Project, key: SigningKey) -> None:
    import numpy as np

    from kronos_audit.checkpoint.hashing import HASHING_PHASE, SMALL_FILE
    from kronos_audit.signing.snapshot import snapshot
    from tests.helpers import write_checkpoint

    big = write_checkpoint(project.root / "checkpoints" / "big" / "step-00000001.h5", 1)
    import h5py

    with h5py.File(big, "a") as f:  # large enough to be hashed on two threads, in blocks
        f["payload"] = np.zeros(SMALL_FILE // 8 * 3)
    (m,) = snapshot(big, run="big", step=1)
    seen: list[tuple[str, int, int]] = []
    with reporting(lambda phase, done, total: seen.append((phase, done, total))):
        from kronos_audit.verification.batch import verify

        (result,) = verify(m.path)
    assert result.ok
    hashed = [(done, total) for phase, done, total in seen if phase == HASHING_PHASE]
    assert hashed, seen
    assert hashed[-1][0] == hashed[-1][1] == big.stat().st_size
    code, _, terminal = on_pty("verify", str(m.path), cwd=project.root)
    assert code == 0, terminal
    assert "hashing (bytes)" in terminal
