"""The pytest plugin (entry point ``pytest11``): a project's own tests, run by pytester in
a subprocess against a real kaudit repository holding a real run of the heat example,
assert that runs verify and segments replay; a tampered checkpoint fails with every
failed check named. Loading the plugin imports nothing heavy."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.replay.conftest import NOISY
from tests.replay.helpers import commit_all, manifest, record

pytest_plugins = ["pytester"]

HEAT = Path(__file__).resolve().parents[1] / "examples" / "heat" / "run.py"


@pytest.fixture
def runs(project: Project, key: SigningKey) -> tuple[Path, Path]:
    """Two real runs of the heat example (20 steps, a checkpoint every 10): one left as
    it is, one whose newest checkpoint is then altered."""
    root = project.root
    (root / "heat").mkdir()
    shutil.copy(HEAT, root / "heat" / "run.py")
    commit_all(root, "heat")
    args = ("run.py", "--steps", "20", "--every", "10", "--n", "16")
    record(root, "heat", *args)
    record(root, "heat", *args, "--run-id", "tampered")
    good, bad = root / "heat" / "checkpoints" / "heat", root / "heat" / "checkpoints" / "tampered"
    with h5py.File(bad / "step-00000020.h5", "r+") as f:
        u = f["fields/u"]
        assert isinstance(u, h5py.Dataset)
        u[0, 0] = u[0, 0] + 1.0
    return good, bad


def test_the_entry_point_names_the_plugin() -> None:
    (ep,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "kaudit"]
    assert ep.value == "kronos_audit.pytest_plugin"


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    heavy = ["h5py", "numpy", "rich", "dvc", "jsonschema", "cryptography"]
    code = (
        "import sys, kronos_audit\n"
        "package = set(sys.modules)\n"
        "import kronos_audit.pytest_plugin\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "loaded += [m for m in sys.modules if m.startswith('kronos_audit.')"
        " and m not in package and m != 'kronos_audit.pytest_plugin']\n"
        "print(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # kronos_audit/__init__ is the package's own cost (its lazy table and version, no
    # heavy library); the plugin adds none of the library to it
    assert [m for m in eval(done.stdout) if m in heavy] == []
    assert [m for m in eval(done.stdout) if m.startswith("kronos_audit.")] == []


def test_a_project_asserts_its_runs_verify_and_replay(
    pytester: pytest.Pytester, runs: tuple[Path, Path]
) -> None:
    good, bad = runs
    pytester.makepyfile(
        test_campaign=f"""
        GOOD = {str(good)!r}
        BAD = {str(bad)!r}

        def test_the_run_verifies(kaudit):
            results = kaudit.assert_verifies(GOOD)
            assert [r.step for r in results] == [10, 20]

        def test_its_last_segment_replays(kaudit):
            result = kaudit.assert_replays({str(manifest(good, 20))!r}, rtol=1e-12)
            assert result.ok

        def test_the_tampered_run_verifies(kaudit):
            kaudit.assert_verifies(BAD)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_the_tampered_run_verifies*",
            "E*kaudit: 1 of 2 manifest(s) do not verify:",
            f"E*{manifest(bad, 20)}: file digest: sha256 * differs from the recorded *",
            f"E*{manifest(bad, 20)}: dataset /fields/u: *",
        ]
    )
    # the traceback stops at the project's test: the plugin's own frames are hidden
    assert "pytest_plugin.py" not in result.stdout.str()


def test_a_segment_that_does_not_reproduce_fails_naming_its_datasets(
    pytester: pytest.Pytester, project: Project, key: SigningKey
) -> None:
    root = project.root
    (root / "programs").mkdir()
    (root / "programs" / "noisy.py").write_text(NOISY)
    commit_all(root, "noisy")
    record(root, "programs", "noisy.py", "10")
    noisy = manifest(root / "programs" / "checkpoints" / "noisy", 10)
    pytester.makepyfile(
        test_replay=f"""
        def test_noisy_replays(kaudit):
            kaudit.assert_replays({str(noisy)!r}, rtol=1e-9)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"E*kaudit: the segment of {noisy} (run noisy, step 10) did not reproduce "
            "(NOT_REPRODUCED):",
            "E*/noise: DIFFERENT*",
        ]
    )
    assert "/u:" not in result.stdout.str()  # the seeded dataset reproduced
