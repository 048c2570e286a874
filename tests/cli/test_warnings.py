"""Which Python warnings the `kaudit` command shows (kronos_audit.cli._warnings): its own,
never another package's, which go to kronos_audit's log and are printed at -v only.

The third-party warning is made to happen, whatever the releases installed: a tiny package
of the test's own, on PYTHONPATH, warns as it is imported, and it is imported at the moment
kaudit first imports DVC (an audit hook in the test's sitecustomize), as asyncssh warns when
DVC opens an ssh:// remote with cryptography 51."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from kronos_audit._internal.warnline import is_kaudits
from kronos_audit.cli._warnings import LOGGER, third_party_warnings_to_log
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import configure_remote
from tests.helpers import run_cli, write_checkpoint
from tests.sshd import unused_port

# the console script pip installed beside this interpreter: the entry point users run
KAUDIT = [str(Path(sys.executable).with_name("kaudit"))]
# the click group alone, as a program that embeds it runs it (not through main())
EMBEDDED = [sys.executable, "-c", "from kronos_audit.cli import cli; cli(prog_name='kaudit')"]

SITECUSTOMIZE = """\
import sys

_fired = []


def _on_import(event, args):
    # the first import of DVC, which kaudit imports as it pushes
    if event == "import" and args[0] == "dvc" and not _fired:
        _fired.append(True)
        import thirdparty_probe  # noqa: F401  (it warns as it is imported)


sys.addaudithook(_on_import)
"""

PROBE = '''\
"""A dependency that warns as it is imported, in its own category and in Python's."""
import warnings

from kronos_audit.errors import CheckpointSkipped


class ProbeDeprecationWarning(UserWarning):
    """Defined outside kronos_audit, as cryptography's CryptographyDeprecationWarning is."""


warnings.warn("probe's DSA is deprecated", ProbeDeprecationWarning)
warnings.warn("probe's \\x1b[31mred\\x1b[0m\\nsecond line", UserWarning)
# kaudit's own category, wherever its stacklevel points: shown
warnings.warn("step-7.h5: skipped: kaudit's own warning", CheckpointSkipped)
'''


@pytest.fixture
def unreachable_push(
    project: Project, key: SigningKey, tmp_path: Path
) -> tuple[Path, dict[str, str]]:
    """A repository with one signed checkpoint whose DVC remote is an ssh:// URL where
    nothing listens, and the environment that plants the warning probe."""
    ckpt = write_checkpoint(project.root / "checkpoints" / "r" / "step-1.h5")
    snap = run_cli("snapshot", "-q", str(ckpt), "--run", "r", "--step", "1", cwd=project.root)
    assert snap.exit_code == 0, snap.output
    configure_remote(project, f"ssh://127.0.0.1:{unused_port()}/nowhere")
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    (probe / "thirdparty_probe.py").write_text(PROBE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's defaults
    env["PYTHONPATH"] = os.pathsep.join([str(probe), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return project.root, env


def kaudit(
    where: Path, env: dict[str, str], *args: str, entry: list[str] = KAUDIT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*entry, *args],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("entry", "verbosity"),
    [(KAUDIT, ["-q"]), (KAUDIT, []), (EMBEDDED, ["-q"])],
    ids=["quiet", "default", "embedded-group"],
)
def test_a_dependencys_warning_is_not_shown(
    unreachable_push: tuple[Path, dict[str, str]], entry: list[str], verbosity: list[str]
) -> None:
    where, env = unreachable_push
    push = kaudit(where, env, *verbosity, "push", entry=entry)
    assert push.returncode == 2, push.stderr
    lines = push.stderr.splitlines()
    # kaudit's own warning, one kaudit line (no file:line: category:, no source line)
    shown = [i for i, line in enumerate(lines) if "step-7.h5" in line]
    assert len(shown) == 1, push.stderr
    assert lines[shown[0]] == "kaudit: warning: step-7.h5: skipped: kaudit's own warning"
    del lines[shown[0]]
    # and then the error line alone: no third-party warning, no block of its source
    (error,) = lines
    assert error.startswith("kaudit: error: "), push.stderr
    assert "unreachable" in error
    assert push.stdout == ""


def test_a_dependencys_warning_is_in_the_log_at_v(
    unreachable_push: tuple[Path, dict[str, str]],
) -> None:
    where, env = unreachable_push
    push = kaudit(where, env, "-v", "push")
    assert push.returncode == 2, push.stderr
    logged = [
        line for line in push.stderr.splitlines() if line.startswith(f"kaudit: INFO: {LOGGER}: ")
    ]
    assert logged[:2] == [
        f"kaudit: INFO: {LOGGER}: ProbeDeprecationWarning from thirdparty_probe.py:11: "
        "probe's DSA is deprecated",
        # one line, its control characters escaped
        f"kaudit: INFO: {LOGGER}: UserWarning from thirdparty_probe.py:12: "
        "probe's \\x1b[31mred\\x1b[0m second line",
    ]
    # and nowhere else: no Python warning block of theirs
    assert [line for line in push.stderr.splitlines() if "probe's" in line] == logged[:2]
    assert "kaudit: warning: step-7.h5" in push.stderr  # kaudit's own, as at any verbosity


def test_kaudits_own_and_pythons_own_in_kaudits_code_are_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import kronos_audit.runtime.steps.interface as publish

    ours = publish.__file__
    assert is_kaudits(CheckpointSkipped, "/home/ana/train.py")  # stacklevel into the program
    assert is_kaudits(UserWarning, ours)
    assert not is_kaudits(UserWarning, "/venv/site-packages/asyncssh/crypto/dsa.py")
    assert not is_kaudits(DeprecationWarning, "/venv/site-packages/asyncssh/crypto/dsa.py")
    with (
        warnings.catch_warnings(record=True) as shown,
        caplog.at_level(logging.INFO, logger=LOGGER),
    ):
        warnings.simplefilter("always")
        with third_party_warnings_to_log(), third_party_warnings_to_log():  # nested: once
            warnings.warn_explicit("ours", UserWarning, ours, 1, module="kronos_audit.x")
            warnings.warn_explicit(
                "theirs", FutureWarning, "/venv/site-packages/numpy/core.py", 9, module="numpy"
            )
        # and the hook that was in place is back
        warnings.warn_explicit("after", FutureWarning, "/venv/site-packages/numpy/core.py", 9)
    assert [str(w.message) for w in shown] == ["ours", "after"]
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "FutureWarning from /venv/site-packages/numpy/core.py:9: theirs"
    ]
