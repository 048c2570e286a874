"""The environment lock's ``threadpools``: the BLAS and OpenMP libraries the process has
loaded and their thread counts (threadpoolctl), beside how numpy was built; signed in the
manifest, read back, and refused by the schema when malformed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.frozen import thaw
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment_lock
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.statement.predicate import EnvironmentLock
from tests.helpers import run_cli


def _loaded_files() -> set[str]:
    """The names of the shared libraries mapped into this process (Linux)."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return {os.path.basename(line.split()[-1]) for line in maps if "/" in line}


def _numpy_openblas(pools: list[dict[str, Any]]) -> dict[str, Any]:
    """numpy's own OpenBLAS among the pools: the one its wheel ships (``numpy.libs``), where
    the process may have loaded another (SciPy's, once a test imported it)."""
    shipped = Path(np.__file__).resolve().parents[1] / "numpy.libs"
    own = {f.name for f in shipped.iterdir()} if shipped.is_dir() else None
    (pool,) = [
        p
        for p in pools
        if (p["user_api"], p["internal_api"]) == ("blas", "openblas")
        and (own is None or p["library"] in own)
    ]
    return pool


def test_a_lock_lists_the_openblas_numpy_loaded_and_its_threads() -> None:
    built = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    assert "openblas" in built["name"], "this machine's numpy is a wheel built with OpenBLAS"
    lock = environment_lock()
    pool = _numpy_openblas(lock["threadpools"])
    assert pool["version"] == built["version"]  # the library loaded is the one numpy was built on
    assert pool["num_threads"] >= 1
    assert "/" not in pool["library"]  # a file name: the directory may name the user's home
    assert pool["library"] in _loaded_files()
    assert set(pool) >= {"user_api", "internal_api", "version", "num_threads", "library"}
    # the digest covers them: a lock with other thread counts is another lock
    rest = {k: v for k, v in lock.items() if k != "digest"}
    rest["threadpools"] = [{**pool, "num_threads": pool["num_threads"] + 1}]
    assert canonical_json(rest) != canonical_json({k: v for k, v in lock.items() if k != "digest"})


def test_a_lock_records_the_thread_count_openblas_was_given() -> None:
    code = (
        "import json\nfrom kronos_audit.provenance.environment import environment_lock\n"
        "lock = environment_lock()\n"
        "print(json.dumps({'pools': lock['threadpools'], 'variables': lock['variables']}))\n"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert _numpy_openblas(seen["pools"])["num_threads"] == 1
    assert seen["variables"]["OPENBLAS_NUM_THREADS"] == "1"


def test_the_signed_lock_reads_back_and_an_old_one_without_them_too(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="run1", step=1)
    signed = thaw(m.predicate["environment"])
    lock = read_manifest(m.path).record.environment
    assert lock.threadpools is not None
    assert _numpy_openblas([dict(p) for p in lock.threadpools])["num_threads"] >= 1
    assert lock.to_json_obj() == signed
    pool = _numpy_openblas(signed["threadpools"])
    shown = run_cli("show", str(m.path), cwd=project.root)
    assert shown.exit_code == 0, shown.output
    assert f"openblas {pool['version']} (blas, {pool['num_threads']} threads)" in shown.stdout
    old = {k: v for k, v in signed.items() if k != "threadpools"}
    resign(m.path, key, old)
    lock = read_manifest(m.path).record.environment  # the schema still takes it
    assert lock.threadpools is None
    shown = run_cli("show", str(m.path), cwd=project.root)
    assert shown.exit_code == 0, shown.output
    assert "threadpools" not in shown.stdout
    assert lock.to_json_obj() == old  # nothing added: the digest is over the lock
    assert EnvironmentLock.from_json_obj(signed).to_json_obj() == signed


def resign(manifest: Path, key: SigningKey, environment: dict[str, Any]) -> None:
    statement = json.loads(read_manifest(manifest).envelope.payload)
    statement["predicate"]["environment"] = environment
    # Bytes written as they are: kaudit's own writer refuses what the schema refuses.
    manifest.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))


MALFORMED: list[dict[str, Any]] = [
    {"library": "/home/alice/venv/lib/libopenblas.so"},  # a full path
    {"num_threads": "2"},
    {"num_threads": -1},
    {"extra": {"nested": 1}},
]


def test_a_malformed_record_is_refused_by_the_schema(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="run1", step=1)
    original = m.path.read_bytes()
    for edit in MALFORMED:
        m.path.write_bytes(original)
        environment = thaw(m.predicate["environment"])
        environment["threadpools"][0].update(edit)
        resign(m.path, key, environment)
        with pytest.raises(ManifestError, match="schema violation at predicate/environment"):
            read_manifest(m.path)
