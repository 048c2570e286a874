"""`kaudit replay --attest` where the attestation cannot be written: said before the
segment is replayed, not after (as `kaudit report` does with a FILE it cannot write)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from tests.conftest import Tmpfs
from tests.helpers import assert_bad_input, run_cli, write_checkpoint


def test_a_read_only_run_directory_is_refused_before_the_replay(
    project: Project, key: SigningKey, tmp_path: Path, tmpfs: Callable[..., Tmpfs]
) -> None:
    run = project.root / "checkpoints" / "r"
    disk = tmpfs(run, 4 << 20)
    ckpt = write_checkpoint(run / "step-00000001.h5", n=8)
    marker = tmp_path / "replayed"
    # the recorded command: what a replay would run, leaving a mark
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    (m,) = snapshot(ckpt, run="r", step=1, key=key, command=command, cwd=project.root)
    disk.remount("ro")

    result = run_cli("replay", "--attest", str(m.path), cwd=project.root)
    assert_bad_input(
        result, "checkpoints/r/step-00000001.h5.replay.json", "cannot write the attestation"
    )
    assert "Read-only file system" in result.stderr
    assert not marker.exists(), shlex.join(command)  # nothing was replayed
