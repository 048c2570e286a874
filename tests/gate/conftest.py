"""Fixtures for the gate's tests: the replay tests' real, replayable runs (the heat
example, a program that cannot reproduce) in a committed kaudit repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from tests.replay.conftest import heat, replay_tmp, repo

__all__ = ["heat", "mallory", "replay_tmp", "repo"]


@pytest.fixture
def mallory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kaudit_home: Path) -> SigningKey:
    """The attacker's key, made on the attacker's machine (their own KAUDIT_HOME)."""
    monkeypatch.setenv("KAUDIT_HOME", str(tmp_path / "mallory-home"))
    k = generate_key("mallory")
    monkeypatch.setenv("KAUDIT_HOME", str(kaudit_home))
    return k
