"""The environment lock's ``frameworks`` section: torch and jax as the program uses them,
recorded in the signed manifest, read back, refused when malformed."""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import torch

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.frozen import thaw
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import NUMERIC_ENV_NAMES, environment, environment_lock
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.statement.predicate import EnvironmentLock
from tests.helpers import assert_bad_input, run_cli


@pytest.fixture
def fresh_environment() -> Iterator[None]:
    environment.cache_clear()
    yield
    environment.cache_clear()


@pytest.fixture
def deterministic() -> Iterator[None]:
    """torch's deterministic algorithms on for the test, and off again after it."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def test_the_lock_of_a_torch_and_jax_program_describes_both(
    fresh_environment: None, deterministic: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = environment()
    frameworks = env["frameworks"]
    assert list(frameworks) == ["torch", "jax"]
    t = frameworks["torch"]
    assert t["version"] == torch.__version__
    assert t["cuda"] == torch.version.cuda
    assert t["deterministic_algorithms"] is True
    assert t["cudnn_deterministic"] is bool(torch.backends.cudnn.deterministic)
    assert t["num_threads"] == torch.get_num_threads()
    assert t["cublas_workspace_config"] == ":4096:8"
    assert t["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert "cudnn" in t
    j = frameworks["jax"]
    assert j["version"] == jax.__version__
    assert j["jaxlib"] == importlib.metadata.version("jaxlib")
    assert j["backend"] == jax.default_backend() == "cpu"
    assert j["x64"] is (jax.numpy.asarray(1.0).dtype == np.float64)
    assert j["devices"] == {"cpu": len(jax.devices())}
    # The digest covers the section: it is over everything but itself.
    rest = {k: v for k, v in env.items() if k != "digest"}
    assert env["digest"] == hashlib.sha256(canonical_json(rest)).hexdigest()
    torch.use_deterministic_algorithms(False)
    environment.cache_clear()
    assert environment()["frameworks"]["torch"]["deterministic_algorithms"] is False
    assert environment()["digest"] != env["digest"]


def test_the_framework_variables_are_recorded() -> None:
    for name in (
        "CUBLAS_WORKSPACE_CONFIG",
        "PYTHONHASHSEED",
        "XLA_FLAGS",
        "JAX_ENABLE_X64",
        "JAX_PLATFORMS",
        "CUDA_VISIBLE_DEVICES",
    ):
        assert name in NUMERIC_ENV_NAMES


def test_a_program_without_frameworks_has_no_section_and_imports_none() -> None:
    script = textwrap.dedent(
        """
        import sys
        from kronos_audit.provenance.environment import environment
        env = environment()
        assert "frameworks" not in env, env.get("frameworks")
        assert "torch" not in sys.modules and "jax" not in sys.modules
        # Imported later, it is described from then on (the cache is per set imported).
        import torch
        assert list(environment()["frameworks"]) == ["torch"]
        assert "jax" not in sys.modules
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_lock_names_only_the_allow_listed_frameworks() -> None:
    # Whatever a caller asks for, only torch and jax are ever described (or imported).
    lock = environment_lock(["numpy", "os", "torch"])
    assert list(lock["frameworks"]) == ["torch"]


def test_a_run_signs_the_section_and_it_reads_back_typed(
    project: Project, key: SigningKey, fresh_environment: None
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("fw", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"x": np.zeros(2)})
    m = ka.read_manifest(root / "fw" / "step-00000001.h5.kaudit.json")
    lock = m.record.environment
    assert lock.frameworks["torch"]["version"] == torch.__version__
    assert lock.frameworks["jax"]["backend"] == "cpu"
    assert lock.to_json_obj() == thaw(m.predicate["environment"])
    assert all(r.ok for r in ka.verify(root / "fw"))


def test_an_old_lock_without_frameworks_reads_and_writes_back_as_it_was() -> None:
    old = {k: v for k, v in environment_lock().items() if k != "frameworks"}
    lock = EnvironmentLock.from_json_obj(old)
    assert dict(lock.frameworks) == {}
    assert lock.to_json_obj() == old  # no empty section added: the digest is over the lock


@pytest.fixture
def signed(project: Project, key: SigningKey, checkpoint: Path) -> Path:
    (m,) = snapshot(checkpoint, run="run1", step=1)
    return m.path


def resign(manifest: Path, key: SigningKey, frameworks: Any) -> None:
    statement = json.loads(read_manifest(manifest).envelope.payload)
    statement["predicate"]["environment"]["frameworks"] = frameworks
    # Bytes written as they are: kaudit's own writer refuses what the schema refuses.
    manifest.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))


@pytest.mark.parametrize(
    "frameworks",
    [
        ["torch"],
        "torch",
        {"torch": "2.13.0"},
        {"torch": ["2.13.0"]},
        {"torch": {"version": ["2.13.0"]}},
        {"jax": {"devices": {"cpu": {"count": 1}}}},
        {"jax": {"devices": {"cpu": [1]}}},
    ],
)
def test_a_malformed_section_is_refused_by_the_schema(
    signed: Path, key: SigningKey, project: Project, frameworks: Any
) -> None:
    resign(signed, key, frameworks)
    with pytest.raises(ManifestError, match="schema violation at predicate/environment"):
        read_manifest(signed)
    assert_bad_input(run_cli("show", str(signed), cwd=project.root), "schema violation")


def test_an_odd_but_well_formed_section_reads(signed: Path, key: SigningKey) -> None:
    odd = {"not-a-framework": {"version": "\x1b[31mred", "n": 3, "flag": None}}
    resign(signed, key, copy.deepcopy(odd))
    lock = read_manifest(signed).record.environment
    assert lock.to_json_obj()["frameworks"] == odd
