"""A program using ``ka.Run`` ends on kaudit's own errors as the `kaudit` command does: one
line, ``kaudit: error: ...``, no traceback, and the error's exit status (2 for bad setup,
which `kaudit run` never restarts), while its own ``except Exception`` still catches them.

Real processes: how a program ends is what Python does with an exception nobody caught."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.conftest import Tmpfs
from tests.helpers import KAUDIT
from tests.runtime.test_faults import HANG_GUARD

# argv: root, key name ("" for the default), "catch" to catch Exception, a file each
# launch appends a line to.
PROGRAM = """
import sys

import numpy as np

import kronos_audit as ka

root, key, catch, launches = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "catch", sys.argv[4]
with open(launches, "a") as f:
    f.write("launched\\n")


def run():
    with ka.Run("r", root=root, seed=1, key=key, every=ka.EverySteps(1)) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"x": np.zeros(2)})


if catch:
    try:
        run()
    except Exception as e:
        print(f"caught {type(e).__name__}")
else:
    run()
"""


def program(
    cwd: Path,
    tmp_path: Path,
    root: str,
    *,
    key: str = "",
    catch: bool = False,
    under: Sequence[str] = (),
) -> tuple[subprocess.CompletedProcess[str], int]:
    """The program run from ``cwd`` (``under`` a launcher such as `kaudit run`): what it
    did, and how many times it was started."""
    source = tmp_path / "program.py"
    source.write_text(PROGRAM)
    launches = tmp_path / "launches"
    launches.unlink(missing_ok=True)
    argv = [sys.executable, str(source), root, key, "catch" if catch else "-", str(launches)]
    done = subprocess.run(
        [*under, *argv], cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD
    )
    return done, len(launches.read_text().splitlines())


def one_line(stderr: str, *mentions: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("kaudit: error: ")]
    assert "Traceback" not in stderr, stderr
    for m in mentions:
        assert m in line, line
    return line


def test_a_read_only_run_directory_is_one_line_exit_2_and_never_restarted(
    project: Project, key: SigningKey, tmp_path: Path, tmpfs: Callable[..., Tmpfs]
) -> None:
    checkpoints = project.root / "checkpoints"
    disk = tmpfs(checkpoints, 64 * 4096)
    (checkpoints / "r").mkdir()
    disk.remount("ro")

    done, launched = program(project.root, tmp_path, "checkpoints")
    assert (done.returncode, launched) == (2, 1), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    one_line(done.stderr, "checkpoints/r/", "Read-only file system")

    # `kaudit run --retries 2` starts it once: a restart would be refused the same way.
    supervised = [*KAUDIT, "run", "--retries", "2", "--backoff", "0", "--"]
    done, launched = program(project.root, tmp_path, "checkpoints", under=supervised)
    assert (done.returncode, launched) == (2, 1), done.stderr
    one_line(done.stderr, "Read-only file system")
    assert "not restarted" in done.stderr

    # The program's own `except Exception` catches it: nothing printed, its own status.
    done, _ = program(project.root, tmp_path, "checkpoints", catch=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "caught UsageError\n", "")


@pytest.mark.parametrize(
    ("where", "key_name", "mention", "kind"),
    [
        ("project", "nobody", "no signing key named 'nobody'", "SigningKeyError"),
        ("outside", "", "not inside a git repository", "ProjectError"),
    ],
)
def test_bad_setup_is_one_line_and_exit_2_unless_the_program_catches_it(
    project: Project,
    key: SigningKey,
    tmp_path: Path,
    where: str,
    key_name: str,
    mention: str,
    kind: str,
) -> None:
    cwd = project.root if where == "project" else tmp_path / "not-a-repository"
    cwd.mkdir(exist_ok=True)
    done, _ = program(cwd, tmp_path, "checkpoints", key=key_name)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    one_line(done.stderr, mention)

    done, _ = program(cwd, tmp_path, "checkpoints", key=key_name, catch=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"caught {kind}\n", "")


def test_a_checkpoint_passed_over_is_one_kaudit_warning_line(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    done, _ = program(project.root, tmp_path, "checkpoints")
    assert done.returncode == 0, done.stderr
    newest = project.root / "checkpoints" / "r" / "step-00000002.h5"
    newest.chmod(0o644)
    newest.write_bytes(newest.read_bytes()[:100])  # truncated: restore passes over it

    done, _ = program(project.root, tmp_path, "checkpoints")
    lines = done.stderr.splitlines()
    (warning,) = [x for x in lines if "step-00000002.h5" in x]
    assert warning.startswith("kaudit: warning: "), done.stderr
    # not Python's FILE:LINE: CheckpointSkipped: and the program's source line under it
    assert "CheckpointSkipped" not in done.stderr
    assert "run.steps" not in done.stderr
