"""Fixtures for report tests: a real run of the heat example with a real, signed replay
attestation (the replay tests' fixtures), and a long chain signed fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli
from tests.replay.conftest import heat, replay_tmp, repo
from tests.replay.helpers import manifest
from tests.report.helpers import long_chain

__all__ = ["heat", "replay_tmp", "repo"]


@pytest.fixture
def attested(heat: Path) -> Path:
    """The heat run (steps 10, 20, 30) with step 20 replayed and attested; its directory."""
    result = run_cli("replay", str(manifest(heat, 20)), "--attest")
    assert result.exit_code == 0, result.output
    assert (heat / "step-00000020.h5.replay.json").is_file()
    return heat


@pytest.fixture
def chain_1000(project: Project, key: SigningKey) -> Path:
    """A run of 1,000 checkpoints (one tiny file copied), with a restart and a pause."""
    return long_chain(project, key, 1000)
