"""A manifest's predicate as a typed record: what the manifest says about its checkpoint.

The predicate is JSON, defined by ``schemas/manifest-v1.schema.json``. It is parsed into a
:class:`Predicate` once, when a manifest is read and its statement has passed the schema
(:func:`kronos_audit.statement.manifest.parse_manifest`), so code reads ``m.record.git.commit``
rather than reaching into a mapping by key. :meth:`Predicate.from_json_obj` trusts the
schema: given a predicate the schema refuses, it may raise anything.

Two parts stay mappings on purpose: ``attributes`` is the user's own data (JSON values,
untyped by nature), and the sections of the environment lock are open-ended (a lock may
carry fields this version does not know, and a replay's drift report compares them all).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, NewType

from kronos_audit._internal.frozen import thaw
from kronos_audit.checkpoint.directory import FileEntry, ItemDigest
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.ledger import LedgerChunk

Sha256 = NewType("Sha256", str)
"""Lower-case hex sha256."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _sha256(value: Any) -> Sha256 | None:
    return None if value is None else Sha256(str(value))


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """``value`` read-only: as it is when it already is (a manifest's frozen statement)."""
    return value if isinstance(value, MappingProxyType) else MappingProxyType(dict(value))


@dataclass(frozen=True)
class GitRecord:
    """Where the code that ran came from, as the manifest records it."""

    commit: str
    """The HEAD commit (40 hex digits, or 64 in a SHA-256 repository)."""
    branch: str | None
    """The checked-out branch; None when HEAD was detached."""
    dirty: bool
    """Tracked files differed from the commit."""
    patch_sha256: Sha256 | None
    """sha256 of the uncommitted patch (kept under ``.kaudit/patches``) when dirty."""
    remote: str | None
    """URL of the ``origin`` remote (or the first one), credentials stripped."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> GitRecord:
        return cls(
            commit=str(obj["commit"]),
            branch=None if obj["branch"] is None else str(obj["branch"]),
            dirty=bool(obj["dirty"]),
            patch_sha256=_sha256(obj["patch_sha256"]),
            remote=None if obj["remote"] is None else str(obj["remote"]),
        )

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "branch": self.branch,
            "dirty": self.dirty,
            "patch_sha256": self.patch_sha256,
            "remote": self.remote,
        }


ENVIRONMENT_SECTIONS = ("python", "platform", "cpu", "blas", "variables", "packages")
"""The sections of an environment lock, in the order a drift report takes them."""


class _Entry:
    """A read-only attribute that is one entry of one section of an environment lock."""

    def __init__(self, section: str, key: str) -> None:
        self.section, self.key = section, key

    def __get__(self, lock: EnvironmentLock, owner: type | None = None) -> str:
        return str(getattr(lock, self.section)[self.key])


@dataclass(frozen=True)
class EnvironmentLock:
    """The environment a checkpoint was written in: what a replay compares its own with.

    Each section is a read-only mapping, since the schema leaves them open: a lock may
    hold fields this version does not name, and the drift report
    (:mod:`kronos_audit.replay.environment`) compares every one. The fields the schema
    requires are also typed properties.
    """

    python: Mapping[str, Any]
    """The interpreter: ``version`` and ``implementation``; kaudit also records
    ``executable``."""
    platform: Mapping[str, str]
    """``system`` and ``machine``; kaudit also records ``release`` and ``libc``."""
    cpu: Mapping[str, Any]
    """``model``; kaudit also records ``count`` (an integer)."""
    blas: Mapping[str, str]
    """The BLAS numpy uses: ``name`` and ``version``, and what else numpy reports."""
    variables: Mapping[str, str]
    """The numeric environment variables that were set (``OMP_NUM_THREADS``, ...)."""
    packages: Mapping[str, str]
    """Installed distributions and their versions."""
    digest: Sha256
    """sha256 over the canonical JSON of the rest of the lock: equal locks, equal digests."""
    frameworks: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _EMPTY)
    """The frameworks the program had imported, by module name (``torch``, ``jax``), each
    a record of its versions and numeric settings; empty when it imported none (and in
    locks written before frameworks were recorded)."""
    threadpools: tuple[Mapping[str, Any], ...] | None = None
    """The BLAS and OpenMP libraries the process had loaded, each with ``user_api``,
    ``internal_api``, ``version``, ``num_threads`` and ``library`` (a file name), as
    threadpoolctl reports them; None in locks written before they were recorded."""

    # one entry of a section, as text: ``lock.cpu_model`` is ``str(lock.cpu["model"])``
    python_version = _Entry("python", "version")
    python_implementation = _Entry("python", "implementation")
    system = _Entry("platform", "system")
    machine = _Entry("platform", "machine")
    cpu_model = _Entry("cpu", "model")
    blas_name = _Entry("blas", "name")
    blas_version = _Entry("blas", "version")

    def sections(self) -> dict[str, Mapping[str, Any]]:
        """Each section by name, in :data:`ENVIRONMENT_SECTIONS` order."""
        return {
            "python": self.python,
            "platform": self.platform,
            "cpu": self.cpu,
            "blas": self.blas,
            "variables": self.variables,
            "packages": self.packages,
        }

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> EnvironmentLock:
        return cls(
            python=_read_only(obj["python"]),
            platform=_read_only(obj["platform"]),
            cpu=_read_only(obj["cpu"]),
            blas=_read_only(obj["blas"]),
            variables=_read_only(obj["variables"]),
            packages=_read_only(obj["packages"]),
            digest=Sha256(str(obj["digest"])),
            frameworks=_read_only(
                {str(k): _read_only(v) for k, v in (obj.get("frameworks") or {}).items()}
            ),
            threadpools=(
                None
                if obj.get("threadpools") is None
                else tuple(_read_only(pool) for pool in obj["threadpools"])
            ),
        )

    def to_json_obj(self) -> dict[str, Any]:
        """The lock as :func:`kronos_audit.provenance.environment` gives one."""
        obj = {name: thaw(section) for name, section in self.sections().items()}
        if self.threadpools is not None:  # as the lock had it: the digest is over the lock
            obj["threadpools"] = thaw(self.threadpools)
        if self.frameworks:  # absent, not empty, when none: the digest is over the lock
            obj["frameworks"] = thaw(self.frameworks)
        return {**obj, "digest": self.digest}


@dataclass(frozen=True)
class RngRecord:
    """Where the checkpoint holds the state of one random number generator."""

    dataset: str
    """The HDF5 dataset holding its state, e.g. ``/rng/numpy``."""
    bit_generator: str | None
    """numpy's bit generator (``PCG64``, ...), when it is one."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> RngRecord:
        bit_generator = obj.get("bit_generator")
        return cls(str(obj["dataset"]), None if bit_generator is None else str(bit_generator))

    def to_json_obj(self) -> dict[str, Any]:
        if self.bit_generator is None:
            return {"dataset": self.dataset}
        return {"dataset": self.dataset, "bit_generator": self.bit_generator}


@dataclass(frozen=True)
class Ran:
    """Batches one worker ran that a checkpoint was the first to record."""

    worker: str
    """Where they ran: a Dask worker's address, or ``host:pid`` of the process."""
    batches: tuple[tuple[int, int], ...]
    """Their indices, as ranges ``(first, last)``, both included, in increasing order."""

    def indices(self) -> Iterator[int]:
        for first, last in self.batches:
            yield from range(first, last + 1)

    def to_json_obj(self) -> dict[str, Any]:
        return {"worker": self.worker, "batches": [list(r) for r in self.batches]}

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> Ran:
        return cls(str(obj["worker"]), tuple((int(a), int(b)) for a, b in obj["batches"]))


@dataclass(frozen=True)
class Share:
    """The part of a campaign one task of a job array does: the batches ``i`` of
    ``range(of)`` with ``i % tasks == task``."""

    task: int
    tasks: int
    of: int
    """The campaign's batches, all tasks together."""
    script: str | None = None
    """The batch script the array runs (as Slurm recorded it), for resubmitting tasks."""

    def size(self) -> int:
        """How many batches the share holds."""
        return len(range(self.task, self.of, self.tasks))

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"task": self.task, "tasks": self.tasks, "of": self.of}
        if self.script is not None:
            obj["script"] = self.script
        return obj

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> Share:
        script = None if obj.get("script") is None else str(obj["script"])
        return cls(int(obj["task"]), int(obj["tasks"]), int(obj["of"]), script)


@dataclass(frozen=True)
class Batches:
    """Monte Carlo progress when the checkpoint was written."""

    total: int
    """Batches this run does: the campaign's, or its task's share of them."""
    done: int
    """Batches recorded in this checkpoint's ledger."""
    ran: tuple[Ran, ...] = ()
    """The batches this checkpoint was the first of its chain to record, by the worker
    that ran them (empty in manifests written before workers were recorded)."""
    share: Share | None = None
    """The run is one task of a job array, doing this share of the campaign."""

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"total": self.total, "done": self.done}
        if self.ran:
            obj["ran"] = [r.to_json_obj() for r in self.ran]
        if self.share is not None:
            obj["share"] = self.share.to_json_obj()
        return obj

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> Batches:
        ran = tuple(Ran.from_json_obj(r) for r in obj.get("ran") or ())
        share = Share.from_json_obj(obj["share"]) if obj.get("share") is not None else None
        return cls(int(obj["total"]), int(obj["done"]), ran, share)


@dataclass(frozen=True)
class SchedulerRecord:
    """The batch job that wrote the checkpoint (Slurm, from its ``SLURM_*`` environment)."""

    name: str
    """The scheduler: ``"slurm"``."""
    job_id: int
    """The job's id (``SLURM_JOB_ID``): the same across its requeues."""
    restart_count: int
    """How often the scheduler had requeued the job (``SLURM_RESTART_COUNT``; 0 at first)."""
    array_job_id: int | None = None
    """The array's job id when the job is one task of an array (``SLURM_ARRAY_JOB_ID``)."""
    array_task_id: int | None = None
    """Its task id in that array (``SLURM_ARRAY_TASK_ID``)."""
    nodelist: str | None = None
    """The nodes the job ran on, in Slurm's hostlist form (``SLURM_JOB_NODELIST``)."""
    partition: str | None = None
    """The partition it ran in (``SLURM_JOB_PARTITION``)."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> SchedulerRecord:
        def optional(key: str, kind: type[int] | type[str]) -> Any:
            return None if obj.get(key) is None else kind(obj[key])

        return cls(
            name=str(obj["name"]),
            job_id=int(obj["job_id"]),
            restart_count=int(obj["restart_count"]),
            array_job_id=optional("array_job_id", int),
            array_task_id=optional("array_task_id", int),
            nodelist=optional("nodelist", str),
            partition=optional("partition", str),
        )

    def to_json_obj(self) -> dict[str, Any]:
        """As a manifest holds it: the fields that are not None."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class WriterRecord:
    """The process that signed a checkpoint: on two machines writing one run (a job
    requeued elsewhere while its old allocation still runs), what tells their chains apart.
    """

    host: str
    """Its host name."""
    pid: int
    """Its process id there."""
    started: str
    """When its run started (its ``ka.Run`` was made), UTC, RFC 3339."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> WriterRecord:
        return cls(host=str(obj["host"]), pid=int(obj["pid"]), started=str(obj["started"]))

    def to_json_obj(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "started": self.started}

    def describe(self) -> str:
        """``host h (pid p), run started t``."""
        return f"host {self.host} (pid {self.pid}), run started {self.started}"


@dataclass(frozen=True)
class PrunedEntry:
    """A checkpoint of the same run whose data retention deleted when this one was written
    (signed here, so a verifier can tell data deleted on purpose from data deleted by
    anyone)."""

    step: int
    """Its step."""
    manifest: Sha256
    """sha256 of its manifest's bytes (the manifest stays)."""

    def to_json_obj(self) -> dict[str, Any]:
        return {"step": self.step, "manifest": self.manifest}


@dataclass(frozen=True)
class ShardSet:
    """A sharded step's shards, as its step manifest records them (the subject is the
    shard index; see :mod:`kronos_audit.checkpoint.shards`)."""

    count: int
    """Shards (ranks that wrote one): the index has exactly this many lines."""
    bytes: int
    """The shards' sizes added up."""
    root: Sha256
    """Merkle root over the index's lines: what one rank checks its own line against."""
    layout: Mapping[str, Any]
    """How the state's arrays are distributed over the ranks, as the writer declared it
    (JSON values, read-only)."""
    launcher: str | None = None
    """How the ranks were started, for a replay to start them again: ``mpi`` (mpiexec) or
    ``torch.distributed`` (torchrun); None when not recorded."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> ShardSet:
        launcher = obj.get("launcher")
        return cls(
            count=int(obj["count"]),
            bytes=int(obj["bytes"]),
            root=Sha256(str(obj["root"])),
            layout=_read_only(obj["layout"]),
            launcher=None if launcher is None else str(launcher),
        )

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "count": self.count,
            "bytes": self.bytes,
            "root": self.root,
            "layout": thaw(self.layout),
        }
        if self.launcher is not None:
            obj["launcher"] = self.launcher
        return obj


def _item(obj: Mapping[str, Any]) -> ItemDigest:
    chunk = obj["chunk"]
    return ItemDigest(
        str(obj["name"]),
        None if chunk is None else tuple(int(c) for c in chunk),
        int(obj["offset"]),
        int(obj["length"]),
        str(obj["sha256"]),
    )


@dataclass(frozen=True)
class DirectorySet:
    """A directory step's files, as its manifest records them (the subject is their index;
    see :mod:`kronos_audit.checkpoint.directory`)."""

    count: int
    """Files: the index has exactly this many lines."""
    bytes: int
    """The files' sizes added up."""
    root: Sha256
    """Merkle root over the index's lines."""
    files: tuple[FileEntry, ...]
    """Every file, in path order."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> DirectorySet:
        return cls(
            count=int(obj["count"]),
            bytes=int(obj["bytes"]),
            root=Sha256(str(obj["root"])),
            files=tuple(
                FileEntry(
                    str(f["path"]),
                    int(f["size"]),
                    str(f["sha256"]),
                    str(f["md5"]),
                    None
                    if f.get("datasets") is None
                    else tuple(
                        _dataset(d, with_attributes=f.get("format") == "hdf5")
                        for d in f["datasets"]
                    ),
                    format=None if f.get("format") is None else str(f["format"]),
                    items=None if f.get("items") is None else tuple(_item(i) for i in f["items"]),
                )
                for f in obj["files"]
            ),
        )

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "bytes": self.bytes,
            "root": self.root,
            "files": [f.to_json_obj() for f in self.files],
        }


def _dataset(obj: Mapping[str, Any], *, with_attributes: bool) -> DatasetDigest:
    shape = obj["shape"]
    extent = obj.get("extent")
    attributes = obj.get("attributes")
    return DatasetDigest(
        str(obj["path"]),
        str(obj["dtype"]),
        None if shape is None else tuple(int(n) for n in shape),
        str(obj["sha256"]),
        extent=None if extent is None else (int(extent[0]), int(extent[1])),
        # A manifest that records its format read the attributes: none recorded means
        # none there (an attribute added since is a change). One that predates them
        # says nothing of them.
        attributes=_attributes(attributes) if attributes or with_attributes else None,
    )


def _attributes(obj: Mapping[str, Any] | None) -> tuple[DatasetDigest, ...]:
    return tuple(
        DatasetDigest(
            str(name),
            str(a["dtype"]),
            None if a["shape"] is None else tuple(int(n) for n in a["shape"]),
            str(a["sha256"]),
        )
        for name, a in sorted((obj or {}).items())
    )


@dataclass(frozen=True)
class Predicate:
    """What a manifest says about its checkpoint, typed (``schemas/manifest-v1.schema.json``).

    Nothing here is verified: a manifest is read before its signature is checked, and
    anyone may have written it (see :func:`kronos_audit.verification.batch.verify`).
    """

    run: str
    """Run id."""
    step: int
    """The step (or batch index) the checkpoint holds."""
    parent: Sha256 | None
    """sha256 of the parent manifest's bytes: the chain's link. None for the first
    checkpoint of a chain."""
    parent_manifest: str | None
    """Where the parent manifest was, relative to the repository root: a locator only,
    the digest is the link."""
    created: str
    """When it was signed: an RFC 3339 UTC time such as ``2026-11-29T08:00:00.123456Z``."""
    size: int
    """The checkpoint file's size in bytes."""
    git: GitRecord
    """The code that ran."""
    environment: EnvironmentLock
    """The environment it ran in."""
    seeds: tuple[int, ...]
    """The seeds the program was given (a replay hands the first back as ``KAUDIT_SEED``)."""
    rng: Mapping[str, RngRecord]
    """Where each random number generator's state is stored, by generator (written by the
    runtime; empty for a snapshot)."""
    datasets: tuple[DatasetDigest, ...] | None
    """Every HDF5 dataset and the sha256 of its canonical bytes; None when the checkpoint
    is not HDF5 (then only its file digest covers it)."""
    attributes: Mapping[str, Any]
    """The user's attributes: JSON values, read-only."""
    command: tuple[str, ...] | None
    """The argv that re-runs the segment; None when it is not known."""
    cwd: str
    """The working directory, relative to the repository root (POSIX)."""
    restart_count: int | None
    """How often the job had been restarted when it wrote this checkpoint (written by the
    runtime; None for a snapshot)."""
    batches: Batches | None
    """Monte Carlo progress (written by a batch run; None otherwise)."""
    pruned: tuple[PrunedEntry, ...]
    """Checkpoints whose data retention deleted when this one was written (empty when it
    deleted none)."""
    shards: ShardSet | None = None
    """For a sharded step, its shards (the subject is then their index); None for a
    checkpoint in one file."""
    scheduler: SchedulerRecord | None = None
    """The batch job that wrote it (None when it ran under no scheduler)."""
    writer: WriterRecord | None = None
    """The process that signed it (None in a snapshot's, and in manifests written before
    it was recorded)."""
    format: str | None = None
    """The checkpoint's format as its reader was chosen (``hdf5``, ``safetensors``,
    ``npz``, ``npy``, ``dcp``, ``pickle``, ``bytes``;
    :class:`~kronos_audit.checkpoint.formats.Format`): what ``datasets`` were read as.
    None in manifests written before it was recorded (then HDF5 or bytes, by content)."""
    directory: DirectorySet | None = None
    """For a directory step, its files (the subject is then their index); None otherwise."""
    ledger: tuple[LedgerChunk, ...] = ()
    """The chunks that make up the run's Monte Carlo ledger, in the order they were
    written (empty: the ledger, if any, is inside the checkpoint, as before chunks)."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> Predicate:
        """The record of a schema-valid predicate. Mappings that are already read-only (a
        manifest's frozen statement) are shared, not copied: ``attributes``, the lock's
        sections."""
        datasets = obj["datasets"]
        command = obj["command"]
        batches = obj.get("batches")
        restart_count = obj.get("restart_count")
        shards = obj.get("shards")
        fmt = obj.get("format")
        return cls(
            run=str(obj["run"]),
            step=int(obj["step"]),
            parent=_sha256(obj["parent"]),
            parent_manifest=(
                None if obj["parent_manifest"] is None else str(obj["parent_manifest"])
            ),
            created=str(obj["created"]),
            size=int(obj["size"]),
            git=GitRecord.from_json_obj(obj["git"]),
            environment=EnvironmentLock.from_json_obj(obj["environment"]),
            seeds=tuple(int(s) for s in obj["seeds"]),
            rng=MappingProxyType(
                {str(k): RngRecord.from_json_obj(v) for k, v in (obj.get("rng") or {}).items()}
            ),
            datasets=None
            if datasets is None
            else tuple(_dataset(d, with_attributes=fmt == "hdf5") for d in datasets),
            attributes=_read_only(obj["attributes"]),
            command=None if command is None else tuple(str(a) for a in command),
            cwd=str(obj["cwd"]),
            restart_count=None if restart_count is None else int(restart_count),
            batches=None if batches is None else Batches.from_json_obj(batches),
            pruned=tuple(
                PrunedEntry(int(e["step"]), Sha256(str(e["manifest"])))
                for e in obj.get("pruned") or ()
            ),
            shards=None if shards is None else ShardSet.from_json_obj(shards),
            scheduler=None
            if obj.get("scheduler") is None
            else SchedulerRecord.from_json_obj(obj["scheduler"]),
            writer=None if obj.get("writer") is None else WriterRecord.from_json_obj(obj["writer"]),
            format=None if fmt is None else str(fmt),
            directory=None
            if obj.get("directory") is None
            else DirectorySet.from_json_obj(obj["directory"]),
            ledger=tuple(LedgerChunk.from_json_obj(c) for c in obj.get("ledger") or ()),
        )

    def to_json_obj(self) -> dict[str, Any]:
        """The predicate as JSON values, as :meth:`from_json_obj` read it (an optional
        field that was absent or empty is left out)."""
        obj: dict[str, Any] = {
            "run": self.run,
            "step": self.step,
            "parent": self.parent,
            "parent_manifest": self.parent_manifest,
            "created": self.created,
            "size": self.size,
            "git": self.git.to_json_obj(),
            "environment": self.environment.to_json_obj(),
            "seeds": list(self.seeds),
            "datasets": None
            if self.datasets is None
            else [d.to_json_obj(extent=True) for d in self.datasets],
            "attributes": thaw(self.attributes),
            "command": None if self.command is None else list(self.command),
            "cwd": self.cwd,
        }
        if self.rng:
            obj["rng"] = {name: r.to_json_obj() for name, r in self.rng.items()}
        if self.restart_count is not None:
            obj["restart_count"] = self.restart_count
        if self.batches is not None:
            obj["batches"] = self.batches.to_json_obj()
        if self.pruned:
            obj["pruned"] = [p.to_json_obj() for p in self.pruned]
        if self.shards is not None:
            obj["shards"] = self.shards.to_json_obj()
        if self.scheduler is not None:
            obj["scheduler"] = self.scheduler.to_json_obj()
        if self.writer is not None:
            obj["writer"] = self.writer.to_json_obj()
        if self.format is not None:
            obj["format"] = self.format
        if self.directory is not None:
            obj["directory"] = self.directory.to_json_obj()
        if self.ledger:
            obj["ledger"] = [c.to_json_obj() for c in self.ledger]
        return obj


__all__ = [
    "ENVIRONMENT_SECTIONS",
    "Batches",
    "DirectorySet",
    "EnvironmentLock",
    "GitRecord",
    "Predicate",
    "PrunedEntry",
    "Ran",
    "RngRecord",
    "SchedulerRecord",
    "Sha256",
    "ShardSet",
    "Share",
    "WriterRecord",
]
