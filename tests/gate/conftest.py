"""Fixtures for the gate's tests: the replay tests' real, replayable runs (the heat
example, a program that cannot reproduce) in a committed kaudit repository."""

from __future__ import annotations

from tests.replay.conftest import heat, replay_tmp, repo

__all__ = ["heat", "replay_tmp", "repo"]
