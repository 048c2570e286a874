"""Campaign certificates as an outside verifier reads them: the file, its name, its schema.

A campaign certificate is a DSSE envelope, signed like a manifest, whose payload is an
in-toto Statement v1. A run's own campaign (``run.map_batches``) is certified in the
second version (``schemas/campaign-v2.schema.json``), a Slurm job array's in the third
(``campaign-v3``); certificates of the first version, ``campaign-v1``, which listed every
batch in the statement, are still read:

- ``subject``: in the second version, the manifest of each part's last checkpoint (its
  file's sha256), named relative to the repository root: a campaign of one run has one.
  In the third, the two index files of the records (the batches' and the parts'), named
  relative to the repository root: the artifacts through which the statement names
  every part and every batch, two whatever the array's size;
- ``predicateType``: :data:`PREDICATE_TYPE` or :data:`PREDICATE_TYPE_V3`;
- ``predicate``: the campaign (its name, ``n``, the seed and how each batch's generator
  derives from it), its parts (listed in the second version; in the third, the Merkle
  root over one line a part, :mod:`kronos_audit.statement.parts`, and their count), the
  code commit and the environment lock's digest, the Merkle root over every batch's
  record in index order (its result's digest, its worker and attempt:
  :mod:`kronos_audit.statement.records`, the records themselves stored beside the
  certificate in ``NAME.records/``), and the digest of the tally (:data:`TALLY_RULE`).

It is written beside the parts' run directories as ``NAME.campaign.json``
(:func:`certificate_path`). This module reads it; :mod:`kronos_audit.runtime.campaigns.certify`
writes it and :mod:`kronos_audit.verification.campaign` verifies it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.hashing import array_digest, canonical_dtype, vlen_kind
from kronos_audit.checkpoint.hdf5 import unflatten
from kronos_audit.checkpoint.layout import CERTIFICATE_SUFFIX
from kronos_audit.errors import ManifestError
from kronos_audit.statement.dsse import Envelope
from kronos_audit.statement.manifest import (
    STATEMENT_TYPE,
    Sha256,
    SignedStatement,
    load_json,
    parse_signed_envelope,
    read_signed_file,
)
from kronos_audit.statement.parts import PART_RULE
from kronos_audit.statement.records import PER_CHUNK, RECORDS_SUFFIX, RULE
from kronos_audit.statement.schemas import validate
from kronos_audit.supervise.protocol import TASKS_ENV

PREDICATE_TYPE = "https://kronos-audit.dev/campaign/v2"
"""What a certificate is written as: its records committed to by a Merkle root."""
PREDICATE_TYPE_V1 = "https://kronos-audit.dev/campaign/v1"
"""The first version, read still: every batch listed in the statement."""
PREDICATE_TYPE_V3 = "https://kronos-audit.dev/campaign/v3"
"""What a job array's certificate is written as: its parts committed to by a Merkle root
too, so that its size does not grow with the tasks."""
TASK_SUFFIX = ".task-"
"""Between a campaign's name and a task's number in a job-array task's run id."""
SCHEMA_NAME = "campaign-v2.schema.json"
SCHEMAS = {
    PREDICATE_TYPE: SCHEMA_NAME,
    PREDICATE_TYPE_V1: "campaign-v1.schema.json",
    PREDICATE_TYPE_V3: "campaign-v3.schema.json",
}
SEED_DERIVATION = "numpy.random.default_rng(numpy.random.SeedSequence(seed, spawn_key=(index,)))"
"""How batch ``index``'s generator derives from the run seed (and from nothing else)."""
MAX_BATCHES = 10_000_000
"""Most batches a certificate records (the schema's bound on ``n``): its records' index is
then 5 MB, each record read through a chunk of 256."""
MAX_BATCHES_V1 = 200_000
"""Most batches a first-version certificate lists (its schema's bound)."""
WHAT = "campaign certificate"
TALLY_RULE = "field-wise sum of the results in index order"
"""What the certified tally is: ``a + b`` field by field, folded from batch 0 up."""


def certificate_path(root: Path, campaign: str) -> Path:
    """Where campaign ``campaign``'s certificate is, ``root`` holding its run directories."""
    return root / f"{campaign}{CERTIFICATE_SUFFIX}"


def _fields(result: Any) -> list[tuple[str, np.ndarray[Any, Any]]]:
    if isinstance(result, Mapping):
        out: list[tuple[str, np.ndarray[Any, Any]]] = []
        for key in sorted(result, key=str):
            out += [(f"/{key}{sub}", a) for sub, a in _fields(result[key])]
        return out
    return [("", np.asarray(result))]


def result_digest(result: Any) -> Sha256:
    """sha256 of a batch result (an array, a number, or a dict of them): over each field's
    path and canonical dataset digest (dtype, shape, little-endian bytes), in path order;
    so equal exactly when the results are bitwise equal, dtypes and shapes included."""
    h = hashlib.sha256()
    for path, array in _fields(result):
        d = array_digest(path, array)
        h.update(f"{d.path}\0{d.dtype}\0{d.shape}\0{d.sha256}\n".encode())
    return Sha256(h.hexdigest())


def row_digests(
    first: Any, columns: Mapping[str, np.ndarray[Any, Any]], count: int
) -> list[Sha256]:
    """:func:`result_digest` of each of ``count`` results stacked by field: ``columns``
    maps each field's path (``""`` for a result that is one array) to its results along
    the first axis, and ``first`` is the first result, which gives the fields' order. The
    same digests, hashed row by row without rebuilding each result."""
    order = [path for path, _ in _fields(first)]
    heads: list[tuple[bytes, np.ndarray[Any, Any]]] = []
    for path in order:
        column = np.asarray(columns[path])
        sample = array_digest(path, column[0])
        if vlen_kind(column.dtype) is not None:
            return [result_digest(_row(first, columns, k)) for k in range(count)]
        flat = np.ascontiguousarray(column, dtype=canonical_dtype(column.dtype))
        rows = flat.reshape(count, -1).view(np.uint8).reshape(count, -1)
        heads.append((f"{sample.path}\0{sample.dtype}\0{sample.shape}\0".encode(), rows))
    out: list[Sha256] = []
    sha = hashlib.sha256
    for k in range(count):
        h = sha()
        for head, rows in heads:
            h.update(head + sha(rows[k].data).hexdigest().encode() + b"\n")
        out.append(Sha256(h.hexdigest()))
    return out


def _row(first: Any, columns: Mapping[str, np.ndarray[Any, Any]], k: int) -> Any:
    if isinstance(first, Mapping):
        return unflatten({p: columns[p][k] for p in columns})
    return columns[""][k]


def tally(results: Iterable[Any]) -> Any:
    """:data:`TALLY_RULE`: the results (in index order) summed field by field, in their
    dtypes, as ``run.ledger.reduce(lambda a, b: a + b)`` sums arrays and numbers."""
    acc: Any = None
    with np.errstate(over="ignore"):  # integers wrap as numpy adds them: the rule is exact
        for r in results:
            acc = r if acc is None else _add(acc, r)
    return acc


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping):
        return {k: _add(a[k], b[k]) for k in a}
    return np.add(a, b)


@dataclass(frozen=True)
class CampaignBatch:
    """One batch, as the certificate records it."""

    index: int
    result: Sha256
    """:func:`result_digest` of its result."""
    worker: str
    """Where it ran (empty when the checkpoints did not record it)."""
    attempt: int
    """The job's restart count plus one when the checkpoint that first recorded it was
    written."""
    part: int
    """The part whose ledger holds it."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "result": self.result,
            "worker": self.worker,
            "attempt": self.attempt,
            "part": self.part,
        }


@dataclass(frozen=True)
class CampaignPart:
    """One run of the campaign, by its last checkpoint."""

    run: str
    step: int
    manifest: str
    """Its last checkpoint's manifest, relative to the repository root (POSIX)."""
    sha256: Sha256
    """sha256 of that manifest file."""
    task: int | None = None
    """Its Slurm array task, for a job array's campaign."""
    tasks: int | None = None
    """The array's task count."""


@dataclass(frozen=True)
class Commitment:
    """What a certificate signs of its records (:mod:`kronos_audit.statement.records`)."""

    root: str
    """The Merkle root over every batch's record, in index order (hex)."""
    index: Sha256
    """sha256 of the records' index file (the chunks' digests and roots)."""


@dataclass(frozen=True)
class PartsCommitment:
    """What a certificate of the third version signs of its parts
    (:mod:`kronos_audit.statement.parts`)."""

    root: str
    """The Merkle root over every part's line, in part order (hex)."""
    index: Sha256
    """sha256 of the parts' index file."""
    count: int
    """How many parts there are."""
    records_at: str
    """The records' directory (``NAME.records``), relative to the repository root (POSIX),
    where the statement's subjects name the two index files."""

    def subjects(self, batches: Commitment) -> list[dict[str, Any]]:
        """The statement's subjects: the batches' index file, then the parts'."""
        return [
            {"name": f"{self.records_at}/{sha}", "digest": {"sha256": sha}}
            for sha in (batches.index, self.index)
        ]


@dataclass(frozen=True)
class CampaignRecord:
    """The predicate of a certificate, typed."""

    campaign: str
    n: int
    seed: int
    parts: tuple[CampaignPart, ...]
    commit: str
    dirty: bool
    environment: Sha256
    batches: tuple[CampaignBatch, ...]
    tally: Sha256
    created: str
    tool: str
    seed_derivation: str = SEED_DERIVATION
    records: Commitment | None = None
    """The commitment to ``batches`` a certificate of the current version signs (they are
    then in ``NAME.records/``, and in the statement only for a first-version one)."""
    part_records: PartsCommitment | None = None
    """The commitment to ``parts`` a certificate of the third version signs (they are then
    in ``NAME.records/`` too, and ``parts`` is empty until they are read and verified)."""

    @property
    def part_count(self) -> int:
        """How many parts the certificate certifies."""
        return len(self.parts) if self.part_records is None else self.part_records.count

    def to_json_obj(self) -> dict[str, Any]:
        listed: list[dict[str, Any]] = []
        for p in self.parts:
            part: dict[str, Any] = {"run": p.run, "step": p.step}
            if p.task is not None:
                part.update(task=p.task, tasks=p.tasks)
            listed.append(part)
        parts: list[dict[str, Any]] | dict[str, Any] = listed
        if self.part_records is not None:
            parts = {
                "rule": PART_RULE,
                "root": self.part_records.root,
                "per_chunk": PER_CHUNK,
                "index": self.part_records.index,
                "count": self.part_records.count,
            }
        return {
            "campaign": self.campaign,
            "n": self.n,
            "seed": self.seed,
            "seed_derivation": self.seed_derivation,
            "parts": parts,
            "code": {"commit": self.commit, "dirty": self.dirty},
            "environment": self.environment,
            **(
                {"batches": [b.to_json_obj() for b in self.batches]}
                if self.records is None
                else {
                    "records": {
                        "rule": RULE,
                        "root": self.records.root,
                        "per_chunk": PER_CHUNK,
                        "index": self.records.index,
                    }
                }
            ),
            "tally": {"rule": TALLY_RULE, "sha256": self.tally},
            "created": self.created,
            "tool": self.tool,
        }

    @property
    def predicate_type(self) -> str:
        if self.records is None:
            return PREDICATE_TYPE_V1
        return PREDICATE_TYPE if self.part_records is None else PREDICATE_TYPE_V3

    @classmethod
    def from_statement(cls, statement: Mapping[str, Any]) -> CampaignRecord:
        """The record of a schema-valid statement."""
        p = statement["predicate"]
        subjects = statement["subject"]
        if isinstance(p["parts"], Mapping):
            return _from_v3(statement)
        if len(subjects) != len(p["parts"]):
            raise ValueError(f"{len(subjects)} subjects for {len(p['parts'])} parts")
        parts = tuple(
            CampaignPart(
                run=str(part["run"]),
                step=int(part["step"]),
                manifest=str(subject["name"]),
                sha256=Sha256(str(subject["digest"]["sha256"])),
                task=None if part.get("task") is None else int(part["task"]),
                tasks=None if part.get("tasks") is None else int(part["tasks"]),
            )
            for part, subject in zip(p["parts"], subjects, strict=True)
        )
        return cls(
            campaign=str(p["campaign"]),
            n=int(p["n"]),
            seed=int(p["seed"]),
            seed_derivation=str(p["seed_derivation"]),
            parts=parts,
            commit=str(p["code"]["commit"]),
            dirty=bool(p["code"]["dirty"]),
            environment=Sha256(str(p["environment"])),
            batches=tuple(
                CampaignBatch(
                    int(b["index"]),
                    Sha256(str(b["result"])),
                    str(b["worker"]),
                    int(b["attempt"]),
                    int(b["part"]),
                )
                for b in p.get("batches", ())
            ),
            records=(
                None
                if "records" not in p
                else Commitment(str(p["records"]["root"]), Sha256(str(p["records"]["index"])))
            ),
            tally=Sha256(str(p["tally"]["sha256"])),
            created=str(p["created"]),
            tool=str(p["tool"]),
        )


def _from_v3(statement: Mapping[str, Any]) -> CampaignRecord:
    """The record of a schema-valid statement of the third version: its parts not listed,
    its subjects the records' two index files, in the directory they name."""
    p = statement["predicate"]
    batches = Commitment(str(p["records"]["root"]), Sha256(str(p["records"]["index"])))
    names = [str(s["name"]) for s in statement["subject"]]
    records_at = names[0].rpartition("/")[0]
    parts = PartsCommitment(
        str(p["parts"]["root"]),
        Sha256(str(p["parts"]["index"])),
        int(p["parts"]["count"]),
        records_at,
    )
    if (
        parts.subjects(batches) != statement["subject"]
        or PurePosixPath(records_at).name != f"{p['campaign']}{RECORDS_SUFFIX}"
    ):
        raise ValueError(
            f"its subjects are not its records' two index files in {p['campaign']}{RECORDS_SUFFIX}/"
        )
    if parts.count > int(p["n"]):
        raise ValueError(f"{parts.count:,} parts for {p['n']:,} batches")
    return CampaignRecord(
        campaign=str(p["campaign"]),
        n=int(p["n"]),
        seed=int(p["seed"]),
        seed_derivation=str(p["seed_derivation"]),
        parts=(),
        commit=str(p["code"]["commit"]),
        dirty=bool(p["code"]["dirty"]),
        environment=Sha256(str(p["environment"])),
        batches=(),
        records=batches,
        part_records=parts,
        tally=Sha256(str(p["tally"]["sha256"])),
        created=str(p["created"]),
        tool=str(p["tool"]),
    )


def build_statement(record: CampaignRecord) -> dict[str, Any]:
    """The in-toto Statement a certificate of ``record`` signs."""
    if record.part_records is not None:
        assert record.records is not None
        subjects = record.part_records.subjects(record.records)
    else:
        subjects = [{"name": p.manifest, "digest": {"sha256": p.sha256}} for p in record.parts]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": record.predicate_type,
        "predicate": record.to_json_obj(),
    }


def encode_statement(record: CampaignRecord) -> bytes:
    """The payload a certificate signs: its statement's canonical JSON, schema-checked."""
    statement = build_statement(record)
    validate(statement, schema_name=SCHEMAS[record.predicate_type], what="campaign certificate")
    return canonical_json(statement)


@dataclass(frozen=True)
class Certificate(SignedStatement):
    """A certificate read from disk, its statement schema-valid."""

    record: CampaignRecord
    """The predicate, typed: parsed once, when it was read."""


def read_envelope(path: Path | str) -> Envelope:
    """The DSSE envelope of the certificate file at ``path``, its statement not yet read:
    a regular file of at most :data:`~kronos_audit._internal.safeio.MANIFEST_LIMIT` bytes,
    never through a symbolic link (as a manifest). Its signature is checked before
    :func:`parse_certificate` reads the statement: the schema check of a certificate's
    every batch is the costly part, and is only done for one a trusted key signed.
    ManifestError naming it for anything else."""
    path = Path(path)
    return parse_signed_envelope(read_signed_file(path, WHAT), path, WHAT)


def parse_certificate(path: Path | str, envelope: Envelope) -> Certificate:
    """The certificate whose envelope (:func:`read_envelope`) was read from ``path``: its
    statement decoded and schema-checked; ManifestError naming it for anything else."""
    path = Path(path)
    statement = load_json(envelope.payload, path, "payload")
    kind = statement.get("predicateType") if isinstance(statement, dict) else None
    schema = SCHEMAS.get(kind, SCHEMA_NAME) if isinstance(kind, str) else SCHEMA_NAME
    validate(statement, path, schema_name=schema, what=WHAT)
    try:
        record = CampaignRecord.from_statement(statement)
    except ValueError as e:
        raise ManifestError(f"not a {WHAT}: {e}", path=path) from None
    return Certificate(path, envelope, statement, record)


def read_certificate(path: Path | str) -> Certificate:
    """Read and schema-check a certificate (:func:`read_envelope`, then
    :func:`parse_certificate`, its signature not checked); ManifestError naming it for
    anything else. Its signature and everything it says are checked by
    :func:`kronos_audit.verification.certificate.verify_certificate` (``kaudit verify``),
    which checks the signature before the schema."""
    return parse_certificate(path, read_envelope(path))


def task_of(run_id: str, campaign: str) -> int | None:
    """The task number of run ``run_id`` when it is a task of ``campaign``, else None."""
    prefix = campaign + TASK_SUFFIX
    rest = run_id[len(prefix) :] if run_id.startswith(prefix) else ""
    if not rest.isdigit() or (len(rest) > 1 and rest[0] == "0") or len(rest) > 9:
        return None
    return int(rest)


__all__ = [
    "CERTIFICATE_SUFFIX",
    "MAX_BATCHES",
    "MAX_BATCHES_V1",
    "PREDICATE_TYPE",
    "PREDICATE_TYPE_V1",
    "PREDICATE_TYPE_V3",
    "SCHEMAS",
    "SCHEMA_NAME",
    "SEED_DERIVATION",
    "TALLY_RULE",
    "TASKS_ENV",
    "TASK_SUFFIX",
    "CampaignBatch",
    "CampaignPart",
    "CampaignRecord",
    "Certificate",
    "Commitment",
    "PartsCommitment",
    "build_statement",
    "certificate_path",
    "encode_statement",
    "parse_certificate",
    "read_certificate",
    "read_envelope",
    "result_digest",
    "row_digests",
    "tally",
    "task_of",
]
