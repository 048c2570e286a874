"""A job array's certificate of the third version: its parts (each task's run at its last
checkpoint) are lines stored with the batches' records, under a Merkle root it signs, so
it stays a few KB however many tasks there are. `kaudit verify` reads every part from
there, or with `--sample` only those the sampled batches need, each proven to the root.
Tried as an attacker would: a part's stored chunk swapped, missing, oversized or a link;
parts swapped, missing, duplicated or naming a run outside the repository or through a
link, under the trusted key's signature; an index whose count disagrees with the root; a
proof of the wrong index; counts beyond the schema's."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.runtime.campaigns.certify import write_parts
from kronos_audit.statement.campaign import (
    PREDICATE_TYPE_V3,
    CampaignPart,
    CampaignRecord,
    PartsCommitment,
    encode_statement,
    read_certificate,
)
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import Sha256
from kronos_audit.statement.parts import MAX_PARTS, PART_CHUNK_LIMIT, part_line
from kronos_audit.statement.records import build_records, leaf_hash, records_dir
from kronos_audit.verification.certificate import verify_certificate
from kronos_audit.verification.parts import StoredParts, stored_parts
from kronos_audit.verification.records import Chunks, RecordsFailed, read_index
from kronos_audit.verification.results import CheckName, VerifyResult
from kronos_audit.verification.verifier import Verifier
from tests.conftest import isolate
from tests.helpers import run_cli

SEED = 7
TASKS = 3
N = 6  # two batches a task
PUB = ".kaudit/trusted-keys/tester.pub"


def batch(rng: np.random.Generator) -> np.float64:
    return np.float64(rng.random())


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, repo_templates: tuple[Path, Path]
) -> tuple[Path, SigningKey]:
    """An array of three tasks, run and certified once for the module (each test works on
    a copy): the repository and the key that signed."""
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path_factory.mktemp)
        root = tmp_path_factory.mktemp("array") / "repo"
        shutil.copytree(repo_templates[1], root, symlinks=True)
        key = generate_key("tester")
        find_project(root).trust_store().add(key.private_key.public_key(), "tester")
        for k in range(TASKS):
            env = {"SLURM_ARRAY_TASK_ID": str(k), "SLURM_ARRAY_TASK_COUNT": str(TASKS)}
            task = ka.ArrayTask.from_slurm(env)
            with ka.Run("mc", root=root / "checkpoints", seed=SEED, task=task) as run:
                run.map_batches(batch, N)
        certified = run_cli("campaign", "mc", "--certify", cwd=root)
        assert certified.exit_code == 0, certified.output
    return root, key


@pytest.fixture
def here(built: tuple[Path, SigningKey], tmp_path: Path) -> Project:
    """This test's copy of the certified array."""
    root = tmp_path / "repo"
    shutil.copytree(built[0], root, symlinks=True)
    return find_project(root)


def cert_of(project: Project) -> Path:
    return project.root / "checkpoints" / "mc.campaign.json"


def verified(project: Project, sample: int | None = None) -> VerifyResult:
    trust = TrustOptions(trusted_keys=(project.root / PUB,))
    verifier = Verifier(project, load_keyring(project.root, trust))
    return verify_certificate(verifier, cert_of(project), sample=sample)


def failed(result: VerifyResult) -> list[str]:
    return [f"{c.name}: {c.detail}" for c in result.failures]


def cli_verify(project: Project, *args: str) -> tuple[int, str]:
    result = run_cli("verify", "--trusted-key", PUB, *args, str(cert_of(project)), cwd=project.root)
    return result.exit_code, result.output


def part_files(project: Project) -> tuple[Path, list[Path]]:
    """The parts' index file and its chunks' files."""
    record = read_certificate(cert_of(project)).record
    assert record.part_records is not None
    directory = records_dir(cert_of(project), "mc")
    index = read_index(directory, record.part_records.index, record.part_records.count)
    return directory / record.part_records.index, [directory / sha for sha, _ in index]


def resign(
    project: Project, key: SigningKey, parts: Sequence[CampaignPart], count: int | None = None
) -> None:
    """What a trusted signer with a bug (or a stolen key) could sign: ``parts`` written as
    the array's part records (and ``count`` in place of theirs, when given)."""
    cert = cert_of(project)
    record = read_certificate(cert).record
    written = write_parts(cert, "mc", parts, project.root)
    if count is not None:
        written = dataclasses.replace(written, count=count)
    lied = dataclasses.replace(record, part_records=written)
    cert.write_bytes(encode_envelope(sign_envelope(encode_statement(lied), key)))


def test_an_arrays_certificate_names_its_parts_through_its_records_and_verifies(
    here: Project,
) -> None:
    cert = cert_of(here)
    read = read_certificate(cert)
    record = read.record
    assert read.statement["predicateType"] == PREDICATE_TYPE_V3
    assert record.parts == ()  # not in the statement: in the records
    assert record.part_records is not None
    assert record.records is not None
    assert [s["name"] for s in read.statement["subject"]] == [
        f"checkpoints/mc.records/{record.records.index}",
        f"checkpoints/mc.records/{record.part_records.index}",
    ]
    assert cert.stat().st_size < 4096
    parts = stored_parts(cert, record)
    assert [(p.run, p.task, p.tasks) for p in parts] == [
        (f"mc.task-{k}", k, TASKS) for k in range(TASKS)
    ]
    whole = verified(here)
    assert whole.ok, failed(whole)
    assert whole.check(CheckName.MANIFEST).detail.startswith("3 part(s)")  # type: ignore[union-attr]
    assert whole.certificate is not None
    assert whole.certificate.record.parts == parts  # what the report shows
    sampled = verified(here, sample=1)
    assert sampled.ok, failed(sampled)
    assert sampled.check(CheckName.MANIFEST).detail.startswith("1 of 3 part(s)")  # type: ignore[union-attr]


@pytest.mark.parametrize("attack", ["swapped", "missing", "oversized", "a link"])
def test_a_stored_part_chunk_that_is_not_the_signed_one_fails_naming_its_file(
    here: Project, attack: str
) -> None:
    _, (chunk,) = part_files(here)
    data = chunk.read_bytes()
    if attack == "swapped":
        first, second, third = data.splitlines(keepends=True)
        chunk.write_bytes(second + first + third)
    elif attack == "missing":
        chunk.unlink()
    elif attack == "oversized":
        chunk.write_bytes(data + b" " * PART_CHUNK_LIMIT)
    else:
        elsewhere = here.root / "elsewhere"
        elsewhere.write_bytes(data)
        chunk.unlink()
        chunk.symlink_to(elsewhere)
    why = {
        "swapped": "not the file of that sha256",
        "missing": "not found",
        "oversized": "more than",
        "a link": "symbolic link",
    }[attack]
    for sample in (None, 1):
        (failure,) = failed(verified(here, sample))
        assert failure.startswith(f"manifest: mc.records/{chunk.name}: "), failure
        assert why in failure, failure
    code, output = cli_verify(here)
    assert code == 1, output
    assert f"mc.records/{chunk.name}" in output


def test_a_parts_index_whose_count_disagrees_with_the_signed_root_fails(
    here: Project, built: tuple[Path, SigningKey]
) -> None:
    cert = cert_of(here)
    parts = stored_parts(cert, read_certificate(cert).record)
    resign(here, built[1], parts, count=TASKS + 1)  # the same lines: one more signed
    _, (chunk,) = part_files(here)
    for sample in (None, 1):
        (failure,) = failed(verified(here, sample))
        assert failure == f"manifest: mc.records/{chunk.name}: 3 records, not the 4 of chunk 0"


@pytest.mark.parametrize(
    "lie", ["swapped", "missing", "duplicated", "outside the repository", "oversized"]
)
def test_parts_signed_by_the_trusted_key_that_are_not_the_tasks_fail(
    here: Project, built: tuple[Path, SigningKey], lie: str
) -> None:
    cert = cert_of(here)
    parts = list(stored_parts(cert, read_certificate(cert).record))
    if lie == "swapped":
        parts[0], parts[1] = parts[1], parts[0]
    elif lie == "missing":
        del parts[2]
    elif lie == "duplicated":
        parts[2] = parts[1]
    elif lie == "outside the repository":
        parts[1] = dataclasses.replace(parts[1], manifest="../../../etc/passwd")
    else:
        parts[1] = dataclasses.replace(parts[1], manifest="checkpoints/" + "x" * 5000)
    resign(here, built[1], parts)
    expected = {
        "swapped": "batches: batch 0: its part is not the one the checkpoints hold",
        "missing": "batches: campaign 'mc' is not complete: 2 of 6 batches missing (the first: 2)",
        "duplicated": "mc.task-1/step-00000002.h5.kaudit.json: task 1 is not one task of the array",
        "outside the repository": (
            "manifest: part 1 (mc.task-1): its manifest ../../../etc/passwd is not a path "
            "inside the repository"
        ),
        "oversized": "manifest: part 1: a part's line whose run or manifest is empty or too long",
    }[lie]
    (failure,) = failed(verified(here))
    assert failure == expected or (lie == "duplicated" and failure.endswith(expected)), failure
    code, output = cli_verify(here)
    assert code == 1, output
    assert output.count("FAIL") == 1, output


def test_a_part_reached_through_a_link_is_not_read(here: Project, tmp_path: Path) -> None:
    run_dir = here.root / "checkpoints" / "mc.task-1"
    # The run's directory a link out of the repository, then a link to a copy inside it.
    outside = tmp_path / "outside" / "mc.task-1"
    shutil.copytree(run_dir, outside)
    shutil.rmtree(run_dir)
    run_dir.symlink_to(outside)
    (failure,) = failed(verified(here))
    assert failure.startswith("manifest: part 1 (mc.task-1): its manifest checkpoints/mc.task-1/")
    assert failure.endswith("is not a path inside the repository"), failure
    run_dir.unlink()
    inside = here.root / "checkpoints" / "moved" / "mc.task-1"
    shutil.copytree(outside, inside)
    run_dir.symlink_to(inside)
    (failure,) = failed(verified(here))
    assert failure.endswith("is not beside the certificate"), failure
    # The manifest file itself a link to the genuine bytes.
    run_dir.unlink()
    shutil.copytree(inside, run_dir)
    (manifest,) = sorted(run_dir.glob("step-*.kaudit.json"))[-1:]
    genuine = here.root / "genuine.json"
    genuine.write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(genuine)
    (failure,) = failed(verified(here, sample=N))
    assert failure.startswith("manifest: part 1 (mc.task-1): checkpoints/mc.task-1/step-")
    assert "symbolic link" in failure, failure


def test_a_sample_reads_only_the_parts_it_needs(
    here: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Task 2's manifest is not the certified one: the whole verification says so; a sample
    # that draws only task 0's and 1's batches never reads it.
    (manifest,) = sorted((here.root / "checkpoints" / "mc.task-2").glob("*.kaudit.json"))[-1:]
    manifest.write_bytes(manifest.read_bytes() + b" ")
    (failure,) = failed(verified(here))
    assert failure.startswith("manifest: part 2 (mc.task-2): "), failure
    assert failure.endswith("not the certified manifest (its sha256 differs)")

    class Drawn(random.Random):
        def sample(self, population: Sequence[int], k: int, **_: Any) -> list[int]:  # type: ignore[override]
            return [0, 1, 3][:k]  # tasks 0, 1 and 0 again

    monkeypatch.setattr("kronos_audit.verification.records.random.SystemRandom", Drawn)
    sampled = verified(here, sample=3)
    assert sampled.ok, failed(sampled)
    assert sampled.check(CheckName.MANIFEST).detail.startswith("2 of 3 part(s)")  # type: ignore[union-attr]


def _stored(directory: Path, lines: list[bytes], count: int | None = None) -> CampaignRecord:
    """A record whose parts are ``lines``, written to ``directory`` (``NAME.records``) as a
    certificate's are; ``count`` signed in place of theirs."""
    stored = build_records(lines)
    directory.mkdir(parents=True, exist_ok=True)
    for chunk in stored.chunks:
        (directory / chunk.sha256).write_bytes(chunk.data)
    (directory / stored.index_sha256).write_bytes(stored.index)
    committed = PartsCommitment(
        stored.root,
        Sha256(stored.index_sha256),
        len(lines) if count is None else count,
        "mc.records",
    )
    return dataclasses.replace(_a_record(), part_records=committed)


def _a_record() -> CampaignRecord:
    return CampaignRecord(
        campaign="mc",
        n=10_000,
        seed=1,
        parts=(),
        commit="0" * 40,
        dirty=False,
        environment=Sha256("0" * 64),
        batches=(),
        tally=Sha256("0" * 64),
        created="",
        tool="",
    )


def _line(k: int, number: int | None = None) -> bytes:
    run = f"mc.task-{k}"
    return part_line(
        k if number is None else number,
        run,
        1,
        f"{run}/step-00000001.h5.kaudit.json",
        "a" * 64,
        k,
        600,
    )


def test_each_part_of_hundreds_is_proven_on_its_own_and_only_at_its_index(tmp_path: Path) -> None:
    cert = tmp_path / "mc.campaign.json"
    directory = records_dir(cert, "mc")
    lines = [_line(k) for k in range(600)]  # three chunks
    stored = StoredParts(cert, _stored(directory, lines))
    assert [p.run for p in stored.every()] == [f"mc.task-{k}" for k in range(600)]
    assert stored.proven(599).task == 599
    # A proof of one index does not reach the root from another's place.
    index = read_index(directory, build_records(lines).index_sha256, 600)
    chunks = Chunks(directory, index, 600, PART_CHUNK_LIMIT)
    proof = chunks.proof(300)
    assert proof.root() == chunks.root
    assert dataclasses.replace(proof, index=301).root() != chunks.root
    assert leaf_hash(proof.line) != leaf_hash(lines[301])
    with pytest.raises(RecordsFailed, match="part 600: not one of the certificate's 600"):
        stored.proven(600)
    # A line in another's place (its own number kept) is refused where it is, proven or read.
    shutil.rmtree(directory)
    moved = [_line(k) for k in range(600)]
    moved[300] = _line(300, number=301)
    stored = StoredParts(cert, _stored(directory, moved))
    with pytest.raises(RecordsFailed, match=r"^part 300: the line in its place is part 301's$"):
        stored.proven(300)
    with pytest.raises(RecordsFailed, match=r"^part 300: the line in its place is part 301's$"):
        stored.every()
    # An index whose signed count is another size's is refused by its size, naming it.
    shutil.rmtree(directory)
    with pytest.raises(
        RecordsFailed, match=r"^mc.records/[0-9a-f]{64}: is 390 bytes, more than the 130"
    ):
        StoredParts(cert, _stored(directory, lines, count=200))


def test_counts_beyond_the_schemas_are_bad_input_naming_the_certificate(
    here: Project, built: tuple[Path, SigningKey]
) -> None:
    cert = cert_of(here)
    statement: dict[str, Any] = json.loads(
        base64.b64decode(json.loads(cert.read_bytes())["payload"])
    )
    for field, value in (("count", MAX_PARTS + 1), ("count", N + 1)):
        lied = json.loads(json.dumps(statement))
        lied["predicate"]["parts"][field] = value
        cert.write_bytes(encode_envelope(sign_envelope(canonical_json(lied), built[1])))
        code, output = cli_verify(here)
        assert code == 2, output
        assert output.count("\n") == 1, output
        assert "mc.campaign.json" in output, output
    lied = json.loads(json.dumps(statement))
    lied["subject"].append(lied["subject"][0])
    cert.write_bytes(encode_envelope(sign_envelope(canonical_json(lied), built[1])))
    code, output = cli_verify(here)
    assert code == 2, output
    assert "mc.campaign.json" in output, output


DOCS = Path(__file__).resolve().parents[2] / "docs" / "campaigns.md"


def test_an_auditor_checks_one_task_by_hand_as_the_docs_say(
    here: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    # The page's own snippets, run: the batch's `reaches_root`, then `check_part`.
    blocks = DOCS.read_text(encoding="utf-8").split("```python\n")[1:]
    namespace: dict[str, Any] = {}
    for name in ("def check_batch", "def check_part"):
        (snippet,) = [b.split("```")[0] for b in blocks if name in b]
        exec(compile(snippet, str(DOCS), "exec"), namespace)
    cert = cert_of(here)
    for part in range(TASKS):
        namespace["check_part"](cert, part, here.root)
        assert f'"part":{part},' in capsys.readouterr().out
    # Part 0's proof offered as part 1's: it does not reach the root from part 1's place.
    proof = StoredParts(cert, read_certificate(cert).record).proof(0)
    namespace["prove_part"] = lambda *_: proof
    with pytest.raises(AssertionError, match="part 1 is not in the certificate"):
        namespace["check_part"](cert, 1, here.root)
