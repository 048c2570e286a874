"""The replay tests' ``repo``, ``heat``, ``project`` and ``key`` over a repository recorded
once for the session (:func:`tests.helpers.replay_repository`), for the modules whose
tests only read what was recorded: each test gets its own copy. A module imports them
(``from tests.replay.recorded import heat, key, project, repo``) in place of the conftest
fixtures, which record anew for every test."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.keys.home import select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from tests.helpers import replay_repository


@pytest.fixture
def repo(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    repo_templates: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """conftest's ``repo``, this test's own copy of one recorded for the session: with the
    ``heat`` run recorded in it when the test asks for that run, and its step 20 replayed
    with ``--attest`` when it asks for ``attested`` (real runs and a real replay, as the
    conftest fixtures make them, but once, not once a test)."""
    return replay_repository(
        tmp_path_factory,
        repo_templates,
        tmp_path / "repo",
        monkeypatch,
        heat="heat" in request.fixturenames,
        attested="attested" in request.fixturenames,
    )


@pytest.fixture
def heat(repo: Path) -> Path:
    """The heat example run for 30 steps, a checkpoint every 10; returns the run directory."""
    return repo / "heat" / "checkpoints" / "heat"


@pytest.fixture
def project(repo: Path) -> Project:
    """The kaudit project ``repo`` is."""
    return find_project(repo)


@pytest.fixture
def key(repo: Path) -> SigningKey:
    """The user's key that signed the recorded runs, trusted by ``repo``."""
    return select_key("tester")
