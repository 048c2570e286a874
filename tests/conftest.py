"""Fixtures that build real assets: git repositories, keys, HDF5 checkpoints. The helpers
they use, and that tests import, are in tests/helpers.py."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.storage.setup import init_project
from tests.helpers import attacker_key, git, write_checkpoint

# Open MPI's libfabric transport (btl ofi) probes for network fabrics at every MPI_Init, a
# second of each launch on a machine without any; the tests' ranks all run on this host and
# meet in shared memory (btl sm) whatever the setting. Set for the session, so that every
# mpiexec the tests start, and every one `kaudit replay` starts for them, inherits it.
os.environ.setdefault("OMPI_MCA_btl", "^ofi")


def isolate(mp: pytest.MonkeyPatch, make_dir: Callable[[str], Path]) -> Path:
    """The environment every test runs in: a key directory of its own (returned), the git
    identity, no GIT_DIR, and DVC's global and system config in empty directories of its
    own, so that neither the machine's settings reach a test nor a test's reach the
    machine. ``make_dir(name)`` makes a fresh directory."""
    home = make_dir("kaudit-home")
    mp.setenv("KAUDIT_HOME", str(home))
    mp.delenv("KAUDIT_KEY", raising=False)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        mp.delenv(var, raising=False)
    mp.setenv("GIT_AUTHOR_NAME", "Test")
    mp.setenv("GIT_AUTHOR_EMAIL", "test@example.com")
    mp.setenv("GIT_COMMITTER_NAME", "Test")
    mp.setenv("GIT_COMMITTER_EMAIL", "test@example.com")
    mp.setenv("DVC_NO_ANALYTICS", "1")
    for var in ("NO_COLOR", "FORCE_COLOR"):  # colour as the test asks, not as the machine's
        mp.delenv(var, raising=False)
    for var in ("DVC_GLOBAL_CONFIG_DIR", "DVC_SYSTEM_CONFIG_DIR"):
        mp.setenv(var, str(make_dir(var.lower())))
    return home


LONG_FIRST = (
    "tests/frameworks/",
    "tests/integrations/",
    "tests/parallel/",
    "tests/slurm/",
    "tests/checkpoint/test_formats_dcp.py",
    "tests/cli/test_output.py",
    "tests/cli/test_progress.py",
    "tests/gate/test_gate.py",
    "tests/replay/test_dispatch.py",
    "tests/replay/test_replay_cli.py",
    "tests/replay/test_replay_directories.py",
    "tests/runtime/test_campaign_faults.py",
    "tests/runtime/test_campaign_ray.py",
    "tests/runtime/test_disk_faults.py",
    "tests/runtime/test_faults.py",
    "tests/runtime/test_kill_points.py",
    "tests/runtime/test_restore_hostile.py",
    "tests/signing/test_writer_lock_children.py",
    "tests/test_bench_smoke.py",
    "tests/test_corpus.py",
    "tests/test_tutorial.py",
    "tests/storage/test_one_chain.py",
    "tests/storage/test_remote_faults.py",
    "tests/storage/test_resume_elsewhere.py",
    "tests/storage/test_ssh.py",
    "tests/storage/test_uploads.py",
)
"""Suites that drive real processes for seconds a test. Under pytest-xdist's worksteal each
worker is first handed one contiguous share of the list, and an idle worker later steals
the tail of a busy one's queue; so each share starts with its part of these suites, and
no worker is left running long tests alone at the end (the order is otherwise kept; every
test is independent of every other)."""


def _shares(total: int, workers: int) -> list[int]:
    """The sizes of the shares worksteal hands out first: the list split evenly, in order."""
    sizes = []
    for i in range(workers):
        sizes.append(total // (workers - i))
        total -= sizes[-1]
    return sizes


def pytest_configure(config: pytest.Config) -> None:
    # Where every test must run (CI: KAUDIT_TEST_NO_SKIP=1), a skip fails (tests/no_skip.py).
    config.pluginmanager.import_plugin("tests.no_skip")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath

    def long(item: pytest.Item) -> bool:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        return where.startswith(LONG_FIRST)

    # The same order on every worker (xdist requires it): the count is in their input.
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    is_long = [long(item) for item in items]
    slow = [item for item, yes in zip(items, is_long, strict=True) if yes]
    rest = iter(item for item, yes in zip(items, is_long, strict=True) if not yes)
    # A module's long tests stay together, in one share: a module-scoped fixture (a
    # reference training run, a fresh clone) is then made by one worker, not by each.
    # Modules are dealt largest first to the share with the fewest tests so far.
    modules: dict[Path, list[pytest.Item]] = {}
    for item in slow:
        modules.setdefault(item.path, []).append(item)
    long_shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for module in sorted(modules.values(), key=len, reverse=True):
        min(long_shares, key=len).extend(module)
    ordered: list[pytest.Item] = []
    for k, size in enumerate(_shares(len(items), workers)):
        share = long_shares[k]
        # (a selection of long suites alone leaves fewer of the rest than the shares hold)
        ordered += share + list(itertools.islice(rest, max(size - len(share), 0)))
    ordered += list(rest)
    assert len(ordered) == len(items)
    items[:] = ordered


@pytest.fixture(autouse=True)
def kaudit_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own key directory; the user's real keys are never touched."""
    return isolate(monkeypatch, tmp_path_factory.mktemp)


@pytest.fixture(scope="session")
def repo_templates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Made once per session (per worker), in the tests' environment: a git repository with
    one commit, and the same with `kaudit init` done and committed. `git_repo` and
    `project` copy them: `kaudit init` (DVC's included) costs far more than a copy."""
    base = tmp_path_factory.mktemp("templates")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path_factory.mktemp)
        repo = base / "repo"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / "solver.py").write_text("print('solve')\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", "initial")
        initialised = base / "project"
        shutil.copytree(repo, initialised, symlinks=True)
        init_project(initialised)
        git(initialised, "add", "-A")
        git(initialised, "commit", "-q", "-m", "kaudit init")
    return repo, initialised


@pytest.fixture
def git_repo(tmp_path: Path, repo_templates: tuple[Path, Path]) -> Path:
    """A git repository with one commit."""
    repo = tmp_path / "repo"
    shutil.copytree(repo_templates[0], repo, symlinks=True)
    return repo


@pytest.fixture
def project(git_repo: Path, repo_templates: tuple[Path, Path]) -> Project:
    """`kaudit init` done (DVC included) and committed."""
    shutil.rmtree(git_repo)
    shutil.copytree(repo_templates[1], git_repo, symlinks=True)
    return find_project(git_repo)


@pytest.fixture
def key(project: Project) -> SigningKey:
    """A signing key held by the user and trusted by ``project``."""
    k = generate_key("tester")
    project.trust_store().add(k.private_key.public_key(), "tester")
    return k


@pytest.fixture
def mallory(tmp_path: Path) -> SigningKey:
    """The attacker's key, made on the attacker's machine (their own KAUDIT_HOME)."""
    return attacker_key("mallory", tmp_path / "mallory-home")


@pytest.fixture
def checkpoint(project: Project) -> Path:
    return write_checkpoint(project.root / "checkpoints" / "run1" / "step-00000001.h5", seed=1)


class Tmpfs:
    """A tmpfs mounted for one test: fill it, resize it, turn it read-only."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def remount(self, options: str) -> None:
        """``mount -o remount,OPTIONS`` (``size=4m``, ``ro``, ``rw``)."""
        subprocess.run(
            ["mount", "-o", f"remount,{options}", str(self.where)], check=True, capture_output=True
        )


@pytest.fixture
def tmpfs() -> Iterator[Callable[..., Tmpfs]]:
    """``tmpfs(directory, size, options="")`` mounts a tmpfs of ``size`` bytes on
    ``directory`` (made if missing; ``options`` such as ``nr_inodes=9`` added), unmounted
    when the test ends. Skips where mounting is not permitted."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mounted: list[Path] = []

    def mount(where: Path, size: int, options: str = "") -> Tmpfs:
        where.mkdir(parents=True, exist_ok=True)
        opts = f"size={size},{options}" if options else f"size={size}"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"mount -t tmpfs is not permitted here: {done.stderr.strip()}")
        mounted.append(where)
        return Tmpfs(where)

    yield mount
    for where in reversed(mounted):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # busy: detach
