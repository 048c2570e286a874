"""The manifest's predicate as a typed record (kronos_audit.statement.predicate): parsed once when a
manifest is read, the same document as the one signed, and the only way the package reads
a predicate. Real snapshots and a real run (rng, restart count, batches, retention)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import h5py
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.statement.predicate import (
    Batches,
    EnvironmentLock,
    GitRecord,
    Predicate,
    PrunedEntry,
    Ran,
    RngRecord,
)
from tests.helpers import git, run_cli, write_checkpoint

PACKAGE = Path(ka.__file__).parent


def thaw(value: Any) -> Any:
    """A manifest's read-only JSON values as ``json`` builds them."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


def test_a_snapshot_reads_as_the_predicate_it_signs(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (first,) = snapshot(checkpoint, run="heat", step=1)
    child_ckpt = write_checkpoint(checkpoint.with_name("b.h5"), seed=1)
    (m,) = snapshot(
        child_ckpt,
        run="heat",
        step=2,
        seeds=[5, 6],
        parent=first.path,
        command=["python", "sim.py", "--out", "a dir"],
        attributes={"nodes": 4, "mesh": {"n": [64, 64]}},
    )
    p = m.record
    assert isinstance(p, Predicate)
    # Nothing lost or changed between the signed document and the record.
    assert p.to_json_obj() == thaw(m.predicate)
    assert (p.run, p.step, p.seeds) == ("heat", 2, (5, 6))
    assert p.parent == first.digest
    assert p.parent_manifest == project.relative(first.path)
    assert p.size == child_ckpt.stat().st_size
    assert p.command == ("python", "sim.py", "--out", "a dir")
    assert p.created.endswith("Z")
    assert p.git == GitRecord(
        commit=git(project.root, "rev-parse", "HEAD").strip(),
        branch=git(project.root, "branch", "--show-current").strip(),
        dirty=False,
        patch_sha256=None,
        remote=None,
    )
    assert p.environment.to_json_obj() == environment()
    assert p.environment.digest == environment()["digest"]
    assert p.environment.python_version == environment()["python"]["version"]
    assert p.environment.cpu_model == environment()["cpu"]["model"]
    assert p.environment.blas_name == environment()["blas"]["name"]
    with h5py.File(child_ckpt) as f:
        assert p.datasets is not None
        assert {d.path for d in p.datasets} == {
            "/" + name for name in _datasets(f) if isinstance(f[name], h5py.Dataset)
        }
    assert p.datasets == m.datasets
    assert dict(p.attributes) == {"nodes": 4, "mesh": {"n": (64, 64)}}
    # What only the runtime writes is absent from a snapshot.
    assert (p.rng, p.restart_count, p.batches, p.pruned) == ({}, None, None, ())
    # The first of its chain: no parent.
    assert (first.record.parent, first.record.parent_manifest) == (None, None)


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visit(names.append)
    return names


def test_a_file_that_is_not_hdf5_records_no_datasets(project: Project, key: SigningKey) -> None:
    blob = project.root / "model.pt"
    blob.write_bytes(b"weights" * 100)
    (m,) = snapshot(blob, run="r", step=0)
    assert m.record.datasets is None
    assert m.record.to_json_obj() == thaw(m.predicate)


def test_a_run_records_rng_restarts_batches_and_what_it_pruned(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("mc", root=root, seed=3, every=ka.EverySteps(1), keep=2) as run:
        run.restore()
        for i, rng in run.batches(4):
            run.record(i, {"sum": rng.standard_normal(8).sum()})
            run.checkpoint(i, {})
    directory = root / "mc"
    manifests = {m.step: m for m in (read_manifest(p) for p in directory.glob("*.kaudit.json"))}
    assert sorted(manifests) == [1, 2, 3, 4]
    newest = manifests[4].record
    assert newest.to_json_obj() == thaw(manifests[4].predicate)
    assert newest.rng["numpy"] == RngRecord("/rng/numpy", "PCG64")
    assert newest.rng["python"] == RngRecord("/rng/python", None)
    assert newest.restart_count == 0
    here = f"{socket.gethostname()}:{os.getpid()}"
    assert newest.batches == Batches(total=4, done=4, ran=(Ran(here, ((3, 3),)),))
    # each batch is recorded by the first checkpoint of the chain that holds it
    assert [manifests[s].record.batches.ran for s in (1, 2, 3)] == [  # type: ignore[union-attr]
        (Ran(here, ((i, i),)),) for i in range(3)
    ]
    assert newest.pruned == (PrunedEntry(2, manifests[2].digest),)
    assert manifests[3].record.pruned == (PrunedEntry(1, manifests[1].digest),)
    assert manifests[2].record.pruned == ()
    assert newest.seeds == (3,)


def test_the_record_is_frozen_and_parsed_once(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1, attributes={"label": "x"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.record.step = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.record.git.commit = "0" * 40  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.record.attributes["label"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        m.record.environment.packages["numpy"] = "0"  # type: ignore[index]
    again = read_manifest(m.path)
    assert again.record == m.record
    assert m.record is m.record  # a field, not a property parsed on each access


def test_an_environment_lock_with_fields_this_version_does_not_know_keeps_them() -> None:
    lock = {**environment(), "cpu": {"model": "m", "count": 2, "flags": "avx2 fma"}}
    parsed = EnvironmentLock.from_json_obj(lock)
    assert parsed.to_json_obj() == lock
    assert parsed.cpu["flags"] == "avx2 fma"
    assert parsed.cpu_model == "m"


# -- nothing in the package reaches into a predicate by key ---------------------------------


def keyed_predicate_reads(source: str) -> list[int]:
    """Lines of ``source`` that read a ``.predicate`` by key (``x.predicate[...]``,
    ``x.predicate.get(...)``, ``.items()`` ...) instead of the typed record."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        target = None
        if isinstance(node, ast.Subscript) or (
            isinstance(node, ast.Attribute) and node.attr in {"get", "items", "keys", "values"}
        ):
            target = node.value
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            target = node.comparators[0]
        if isinstance(target, ast.Attribute) and target.attr == "predicate":
            found.append(cast(ast.expr, node).lineno)
    return sorted(found)


def test_the_scanner_finds_keyed_reads() -> None:
    source = (
        "a = m.predicate['git']['commit']\n"
        "b = m.predicate.get('pruned')\n"
        "c = 'rng' in m.predicate\n"
        "d = m.record.git.commit\n"
        "e = statement['predicate']\n"
    )
    assert keyed_predicate_reads(source) == [1, 2, 3]


def test_the_package_reads_predicates_only_through_the_typed_record() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := keyed_predicate_reads(path.read_text(encoding="utf-8")))
    }
    assert not offenders, offenders


def test_kaudit_show_json_still_prints_the_signed_statement(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1, seeds=[7])
    result = run_cli("show", "--json", str(m.path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["predicate"] == m.record.to_json_obj()
