"""A campaign certificate's commitment: the Merkle tree over its batch records, the records
kept beside it in content-addressed chunks, a proof of one batch, and `kaudit verify` of
all of them or of a sample. Tried as an attacker would: a chunk swapped, missing or
oversized, a record twice or missing under a trusted signature, a root no proof reaches,
a count far beyond the schema's."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.hdf5 import unflatten
from kronos_audit.project.repository import Project
from kronos_audit.runtime.campaigns.certify import write_records
from kronos_audit.statement.campaign import (
    MAX_BATCHES,
    CampaignRecord,
    encode_statement,
    read_certificate,
    result_digest,
    tally,
)
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.records import (
    PER_CHUNK,
    audit_path,
    build_records,
    leaf_hash,
    merkle_root,
    node_hash,
    records_dir,
    root_from_path,
)
from kronos_audit.verification.campaign import _Rows, _Twice
from kronos_audit.verification.records import Proof, prove, stored_batches
from tests.helpers import run_cli

N = 2_000
"""Batches of the campaigns the attacks are tried on: 8 chunks."""
SEED = 3


def trivial(rng: np.random.Generator) -> np.float64:
    return np.float64(rng.random())


def _reference_root(leaves: Sequence[bytes]) -> bytes:
    """RFC 9162's definition, recursively: split at the largest power of two below n."""
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 255, 256, 257, 600])
def test_the_tree_is_rfc9162s_and_each_batchs_proof_reaches_its_root(n: int) -> None:
    lines = [b'{"i":%d}' % i for i in range(n)]
    leaves = [leaf_hash(x) for x in lines]
    root = merkle_root(leaves)
    assert root == _reference_root(leaves)
    # Stored in chunks of PER_CHUNK, each a subtree: the chunks' roots give the same root.
    assert build_records(lines).root == root.hex()
    for i in {0, n // 2, n - 1}:
        path = audit_path(leaves, i)
        assert root_from_path(leaves[i], i, n, path) == root
        assert len(path) <= (n - 1).bit_length()
        # Not the tree's shape, or another leaf's place: not the root.
        assert root_from_path(leaves[i], i, n, [*path, root]) is None
        if n > 1:
            assert root_from_path(leaves[i], (i + 1) % n, n, path) != root
            assert root_from_path(leaf_hash(b"forged"), i, n, path) != root


def campaign(project: Project, n: int = N) -> Path:
    with ka.Run(
        "mc", root=project.root / "checkpoints", seed=SEED, every=ka.EverySteps(n // 4)
    ) as run:
        run.map_batches(trivial, n)
    return project.root / "checkpoints" / "mc.campaign.json"


def verify(cert: Path, *args: str) -> tuple[int, str]:
    result = run_cli("verify", *args, str(cert))
    return result.exit_code, result.output


def resign(cert: Path, key: ka.SigningKey, record: CampaignRecord, **change: Any) -> None:
    """What a trusted signer with a bug could sign: ``record``'s batches written beside it
    as its records, then ``change`` made to what is signed."""
    records = write_records(cert, record.campaign, record.batches)
    signed = dataclasses.replace(record, batches=(), records=records)
    if change:
        signed = dataclasses.replace(signed, records=dataclasses.replace(records, **change))
    cert.write_bytes(encode_envelope(sign_envelope(encode_statement(signed), key)))


def test_ten_thousand_batches_certify_small_and_verify_whole_or_sampled(
    project: Project, key: ka.SigningKey
) -> None:
    n = 10_000
    cert = campaign(project, n)
    assert len(cert.read_bytes()) < 4096  # the same at 10**6: nothing in it grows with n
    record = read_certificate(cert).record
    assert record.records is not None
    assert record.batches == ()
    directory = records_dir(cert, "mc")
    chunks = -(-n // PER_CHUNK)
    assert len(list(directory.iterdir())) == chunks + 1  # the chunks and their index
    for f in directory.iterdir():  # content-addressed
        assert hashlib.sha256(f.read_bytes()).hexdigest() == f.name

    # One batch's proof: its line and 14 hashes, a few hundred bytes.
    proof = prove(cert, record, 4321)
    assert proof.root() == bytes.fromhex(record.records.root)
    assert len(proof.line) + 32 * len(proof.path) < 700
    assert json.loads(proof.line)["index"] == 4321
    expected = trivial(ka.runtime.batch_rng(SEED, 4321))
    assert json.loads(proof.line)["result"] == result_digest(expected)

    code, out = verify(cert)
    assert code == 0, out
    assert f"campaign certificate, campaign mc, {n} batches;" in out, out
    code, out = verify(cert, "--sample", "40")
    assert code == 0, out
    assert f"campaign mc, {n} batches, sampled 40 of {n} batches;" in out, out
    batches = stored_batches(cert, record)
    assert [b.index for b in batches] == list(range(n))


def test_a_chunk_swapped_missing_or_oversized_fails_naming_it(
    project: Project, key: ka.SigningKey
) -> None:
    cert = campaign(project)
    record = read_certificate(cert).record
    directory = records_dir(cert, "mc")
    index = (directory / record.records.index).read_bytes()  # type: ignore[union-attr]
    first, second = (line.split()[0].decode() for line in index.splitlines()[:2])
    original = (directory / first).read_bytes()

    (directory / first).write_bytes((directory / second).read_bytes())  # swapped
    for args in [(), ("--sample", str(N))]:
        code, out = verify(cert, *args)
        assert code == 1, out
        assert f"mc.records/{first}: not the file of that sha256" in out, out
    (directory / first).unlink()  # missing
    code, out = verify(cert)
    assert (code, out.count("batches: ")) == (1, 1), out
    assert f"mc.records/{first}: not found" in out, out
    (directory / first).write_bytes(original + b"x" * 400_000)  # oversized: not read whole
    code, out = verify(cert, "--sample", str(N))
    assert code == 1, out
    assert re.search(rf"mc.records/{first}: is [\d,]+ bytes, more than the 262,400 allowed", out)
    (directory / first).write_bytes(original)
    assert verify(cert)[0] == 0
    # The directory itself a link to a copy elsewhere: not followed, whatever it holds.
    elsewhere = directory.parent.parent / "elsewhere"
    directory.rename(elsewhere)
    directory.symlink_to(elsewhere)
    code, out = verify(cert)
    assert code == 1, out
    assert "batches: mc.records: a symbolic link, not followed" in out, out


def test_a_trusted_signature_over_records_the_checkpoints_do_not_hold_fails(
    project: Project, key: ka.SigningKey
) -> None:
    cert = campaign(project)
    record = read_certificate(cert).record
    held = stored_batches(cert, record)
    for lie in ["a batch twice", "a batch missing", "a root no proof reaches"]:
        batches = list(held)
        change: dict[str, Any] = {}
        if lie == "a batch twice":
            batches[5] = dataclasses.replace(batches[4])
        elif lie == "a batch missing":
            del batches[5]
            batches.append(dataclasses.replace(batches[-1]))  # as many lines, one index twice
        else:
            change["root"] = "ab" * 32
        resign(cert, key, dataclasses.replace(record, batches=tuple(batches)), **change)
        code, out = verify(cert)
        assert code == 1, out
        code, sampled = verify(cert, "--sample", str(N))
        assert code == 1, sampled
        if lie == "a batch twice":
            assert "batches: batch 5: its index is not the one the checkpoints hold" in out, out
            assert "batch 5: the record in its place is batch 4's" in sampled, sampled
        elif lie == "a batch missing":
            assert "batches: batch 5: its index is not the one the checkpoints hold" in out, out
            assert "batch 5: the record in its place is batch 6's" in sampled, sampled
        else:
            assert "batches: the certified records' root is not the one" in out, out
            assert "batch 0: its proof does not reach the signed root" in sampled, sampled
    resign(cert, key, dataclasses.replace(record, batches=held))
    assert verify(cert)[0] == 0


def test_a_huge_count_is_refused_by_the_schema_and_bounded_below_it(
    project: Project, key: ka.SigningKey
) -> None:
    cert = campaign(project)
    envelope = json.loads(cert.read_bytes())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["n"] = MAX_BATCHES + 1
    cert.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    code, out = verify(cert)
    assert code == 2, out
    assert out.count("\n") == 1, out
    assert "mc.campaign.json" in out, out
    # Within the schema, a count the checkpoints do not hold: one line, no list of them.
    statement["predicate"]["n"] = MAX_BATCHES
    cert.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    code, out = verify(cert)
    assert code == 1, out
    assert f"campaign of {MAX_BATCHES} batches" in out.replace(",", ""), out
    code, out = verify(cert, "--sample", "5")
    assert code == 1, out
    assert "batches: sampled: mc.records/" in out, out
    assert f"an index of {-(-N // PER_CHUNK) * 130} bytes" in out.replace(",", ""), out


DOCS = Path(__file__).resolve().parents[2] / "docs" / "campaigns.md"


def test_an_auditor_checks_one_batch_by_hand_as_the_docs_say(
    project: Project, key: ka.SigningKey, capsys: pytest.CaptureFixture[str]
) -> None:
    # The page's own snippet, run: only hashlib between the proof and the signed root.
    blocks = DOCS.read_text(encoding="utf-8").split("```python\n")[1:]
    (snippet,) = [b.split("```")[0] for b in blocks if "def check_batch" in b]
    namespace: dict[str, Any] = {}
    exec(compile(snippet, str(DOCS), "exec"), namespace)
    cert = campaign(project)
    for index in (0, 17, 1024, N - 1):  # N - 1: the last leaf, carried up unpaired
        namespace["check_batch"](cert, index)
        assert f'"index":{index},' in capsys.readouterr().out
    # A proof of another batch, or a line changed, does not reach the root.
    record = read_certificate(cert).record
    proof = prove(cert, record, 17)
    reaches_root = namespace["reaches_root"]
    assert reaches_root(proof.line, 17, N, list(proof.path)).hex() == record.records.root  # type: ignore[union-attr]
    assert reaches_root(proof.line, 18, N, list(proof.path)).hex() != record.records.root  # type: ignore[union-attr]
    forged = proof.line.replace(b'"attempt":1', b'"attempt":2')
    assert reaches_root(forged, 17, N, list(proof.path)).hex() != record.records.root  # type: ignore[union-attr]
    assert isinstance(proof, Proof)


@pytest.mark.parametrize(
    "make",
    [
        lambda i: np.float64(i / 7),
        lambda i: np.arange(3, dtype=np.int8) * i,  # wraps: the tally's rule is numpy's
        lambda i: {"a-b": np.int64(i), "a": {"x": np.float32(i / 3), "y": np.bool_(i % 2)}},
    ],
)
def test_digests_and_tally_from_the_stacked_ledger_are_each_results(make: Any) -> None:
    # What a verifier reads down the checkpoint's columns is what it would row by row.
    ledger = ka.Ledger()
    for i in (5, 0, 3, 1, 4, 2, 6, 7, 8, 9, 10, 11, 120):
        ledger.record(i, make(i))
    rows = _Rows(unflatten(ledger.to_flat())["ledger"])
    assert rows.digests() == {i: result_digest(r) for i, r in ledger.items()}
    summed, expected = rows.tally(), tally(r for _, r in ledger.items())
    assert result_digest(summed) == result_digest(expected)


@pytest.mark.parametrize("index", [[0, 1, 2, 5, 9], [9, 0, 5, 2, 1]])
def test_a_ledger_read_back_finds_each_batch_and_no_other(index: list[int]) -> None:
    # Looked up by bisection, in the order the checkpoint sorted them or in any other.
    rows = _Rows({"index": np.array(index), "results": np.array(index, dtype=np.float64) / 2})
    assert list(rows) == index
    assert len(rows) == 5
    for i in index:
        assert i in rows
        assert rows[i] == i / 2
        assert rows.get(np.int64(i)) == i / 2  # type: ignore[call-overload]
    for absent in (3, -1, 10, 2**70, "1", 1.0):
        assert absent not in rows
        assert rows.get(absent) is None  # type: ignore[arg-type]
    assert rows.digests() == {i: result_digest(np.float64(i / 2)) for i in index}
    assert rows.tally() == sum(i / 2 for i in sorted(index))


@pytest.mark.parametrize(
    ("group", "refused"),
    [
        ({"index": np.array([4, 1, 4]), "results": np.zeros(3)}, _Twice),
        ({"index": np.array([0.0, 1.0]), "results": np.zeros(2)}, ValueError),
        ({"index": np.array([0, 1]), "results": np.zeros(3)}, ValueError),
    ],
)
def test_a_ledger_read_back_with_a_batch_twice_or_ill_formed_is_refused(
    group: dict[str, Any], refused: type[Exception]
) -> None:
    with pytest.raises(refused):
        _Rows(group)
