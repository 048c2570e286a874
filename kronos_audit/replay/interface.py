"""What a replay yields: frozen values, each with the JSON form that
``schemas/replay-v1.schema.json`` defines.

The reference is always the recorded run: a replayed dataset passes when it is IDENTICAL
to the recorded one (bitwise: same dtype, shape and canonical sha256) or, when a tolerance
applies, WITHIN_TOLERANCE of the recorded data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.compare import (
    DatasetComparison,
    PolicySource,
    Tolerance,
    TolerancePolicy,
    Verdict,
)
from kronos_audit.compare.interface import PerDataset
from kronos_audit.provenance.dispatch import DISPATCH_VARIABLES
from kronos_audit.statement.attestation import ManifestRef, Outcome
from kronos_audit.statement.manifest import Sha256

FORMAT = "kronos-audit/replay/v1"
SCHEMA_NAME = "replay-v1.schema.json"
"""The JSON Schema, in ``schemas/``, that :meth:`ReplayResult.to_json_obj` satisfies."""


class EnvMode(enum.StrEnum):
    """What a replay does when this machine's environment differs from the recorded lock."""

    STRICT = "strict"
    """Refuse to run on any drift (exit 2, listing it)."""
    WARN = "warn"
    """Report the drift and run."""
    IGNORE = "ignore"
    """Run without showing it; the result still records it."""


class Basis(enum.StrEnum):
    """What a replay compares the checkpoint it produced against."""

    HASHES = "hashes"
    """Bitwise, against the recorded dataset hashes: the recorded data need not be here."""
    DATA = "data"
    """Dataset by dataset against the recorded checkpoint's data, with the tolerances
    asked for: the recorded data is fetched (and verified) once the command has run."""

    @classmethod
    def for_policy(cls, policy: TolerancePolicy) -> Basis:
        """HASHES for the empty (bitwise) policy, DATA for any tolerance."""
        return cls.HASHES if policy == TolerancePolicy() else cls.DATA


class ComparedBy(enum.StrEnum):
    """What a replay compared of the checkpoint it produced."""

    DATASETS = "datasets"
    """Dataset by dataset: an HDF5 file's datasets, the tensors of a safetensors, npz or
    npy file, a sharded step's arrays; by the digests the manifest signs, or with a
    tolerance by the recorded data."""
    TENSORS = "tensors"
    """A pickle's tensors (``torch.save``, Lightning), after a weights-only ``torch.load``
    of the signed recorded bytes and of the produced ones: their bytes differ, as those
    of two pickles of equal tensors may (memo order, a path kept in a callback's state)."""
    FILE = "file"
    """The file digest alone: a file with no tensors kaudit reads, a pickle whose bytes
    are the recorded ones, or a pickle compared without torch installed."""


@dataclass(frozen=True)
class Difference:
    """One way this machine's environment differs from the recorded lock."""

    section: str
    """``python``, ``platform``, ``cpu``, ``blas``, ``variables``, ``packages`` or
    ``frameworks``."""
    name: str
    """The field, variable or package, e.g. ``version``, ``OMP_NUM_THREADS``, ``numpy``."""
    recorded: str | None
    """Its recorded value; None when it was absent at record time (added since)."""
    current: str | None
    """Its value here; None when it is absent now (removed since)."""
    drift: bool
    """Counts as drift: it can change what the code computes. False for differences
    that are only noted (see :mod:`kronos_audit.replay.environment`)."""

    @property
    def change(self) -> str:
        """``added``, ``removed`` or ``changed``."""
        if self.recorded is None:
            return "added"
        if self.current is None:
            return "removed"
        return "changed"

    def __str__(self) -> str:
        what = (
            self.name
            if self.section in ("packages", "variables")
            else f"{self.section} {self.name}"
        )
        if self.recorded is None:
            return f"{what} {self.current} added"
        if self.current is None:
            return f"{what} {self.recorded} removed"
        return f"{what} {self.recorded} -> {self.current}"

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "name": self.name,
            "change": self.change,
            "recorded": self.recorded,
            "current": self.current,
            "drift": self.drift,
        }


class JudgedOn(enum.StrEnum):
    """Whose environment a replay's drift report compares with the recorded lock."""

    PROGRAM = "program"
    """The lock the replayed program recorded itself: what it actually ran with (its
    threads, its frameworks' settings, the kernels its libraries chose)."""
    REPLAYER = "replayer"
    """The replaying process's, with the variables the command is given: the replayed
    program recorded none (it is not a Python program using kaudit's API)."""


_THREAD_VARIABLES = frozenset(
    {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS"}
)


def _kind(d: Difference) -> str:
    """What a drift is about: ``dispatch`` (the CPU's kernels), ``threads``, ``packages``,
    or ``environment`` (the rest)."""
    name = d.name
    if d.section == "cpu":
        return "threads" if name == "count" else "dispatch"
    if d.section == "variables":
        if name in _THREAD_VARIABLES:
            return "threads"
        return "dispatch" if name in DISPATCH_VARIABLES else "environment"
    if d.section == "threadpools":
        return "threads" if name.endswith(".num_threads") else "dispatch"
    if d.section == "frameworks":
        if name.endswith(".num_threads"):
            return "threads"
        return "dispatch" if name.endswith(".cpu_capability") else "environment"
    return "packages" if d.section == "packages" else "environment"


_WAYS_OUT = {
    "dispatch": "replay on a matching CPU, record with a portable dispatch (kaudit run --portable)",
    "threads": "replay with the recorded thread counts",
    "packages": "install the recorded packages",
    "environment": "replay in the recorded environment",
}
_CHANGED = {
    "dispatch": "the CPU dispatch changed",
    "threads": "the thread counts changed",
    "packages": "the packages changed",
    "environment": "the environment changed",
}


@dataclass(frozen=True)
class EnvironmentReport:
    """This machine's environment against the recorded lock."""

    mode: EnvMode
    """What the replay was told to do about drift."""
    recorded_digest: Sha256
    """The recorded lock's digest."""
    current_digest: Sha256
    """The digest of this machine's lock (same fields, same canonical JSON)."""
    differences: tuple[Difference, ...]
    """Every difference, drift or note, by section then name."""
    judged_on: JudgedOn = JudgedOn.REPLAYER
    """Whose lock was compared with the recorded one."""
    kernels: tuple[str, str] = ("", "")
    """The CPU kernels of each side in words, recorded then compared (``AVX512 on Intel(R)
    Xeon(R)``: torch's capability, else the ISA level, on the CPU's model)."""

    def cause(self) -> str | None:
        """The drift that can explain different bits, in one clause with the ways out
        (``the CPU dispatch changed (AVX512 on Intel Xeon -> AVX2 on AMD EPYC): replay on a
        matching CPU, ...``); None without drift."""
        by_kind: dict[str, list[Difference]] = {}
        for d in self.drift:
            by_kind.setdefault(_kind(d), []).append(d)
        if not by_kind:
            return None
        kinds = [k for k in _CHANGED if k in by_kind]
        parts = []
        for kind in kinds:
            found = by_kind[kind]
            a, b = self.kernels
            if kind == "dispatch" and a != b:
                what = f"{a} -> {b}"
            else:
                what = "; ".join(str(d) for d in found[:2])
                if len(found) > 2:
                    what += f"; {len(found) - 2} more"
            parts.append(f"{_CHANGED[kind]} ({what})")
        ways = [_WAYS_OUT[k] for k in kinds]
        return " and ".join(parts) + ": " + ", ".join(ways) + ", or compare with a tolerance"

    @property
    def drift(self) -> tuple[Difference, ...]:
        """The differences that can change what the code computes."""
        return tuple(d for d in self.differences if d.drift)

    @property
    def notes(self) -> tuple[Difference, ...]:
        """The differences recorded but not counted as drift (e.g. the interpreter's path)."""
        return tuple(d for d in self.differences if not d.drift)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "recorded_digest": self.recorded_digest,
            "current_digest": self.current_digest,
            "judged_on": self.judged_on.value,
            "drift": [d.to_json_obj() for d in self.drift],
            "notes": [d.to_json_obj() for d in self.notes],
        }


@dataclass(frozen=True)
class DatasetReplay:
    """One dataset of the replayed checkpoint against the recorded one."""

    path: str
    """Absolute HDF5 path, e.g. ``/fields/u``."""
    verdict: Verdict
    """IDENTICAL, WITHIN_TOLERANCE, DIFFERENT, NOT_COMPARABLE, ONLY_IN_A (missing from
    the replay) or ONLY_IN_B (only in the replay)."""
    recorded: DatasetDigest | None
    """Its recorded identity (dtype, shape, canonical sha256); None when only in the replay."""
    replayed: DatasetDigest | None
    """The replay's; None when the replay did not produce it."""
    detail: str | None = None
    """Why it failed, in words."""
    comparison: DatasetComparison | None = None
    """The element-by-element comparison against the recorded data, when it was made: with
    a tolerance always; bitwise only to explain a difference, when the recorded data is here."""

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def tolerance(self, basis: Basis) -> tuple[Tolerance | None, str]:
        """The tolerance this dataset was judged with (None: bitwise), and the rule that
        gave it."""
        if basis is Basis.HASHES:
            return None, "bitwise (the recorded hashes)"
        if self.comparison is None:
            return None, "not compared"
        return self.comparison.tolerance, self.comparison.rule

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "verdict": self.verdict.value,
            "ok": self.ok,
            "recorded": None if self.recorded is None else self.recorded.to_json_obj(),
            "replayed": None if self.replayed is None else self.replayed.to_json_obj(),
            "detail": self.detail,
            "comparison": None if self.comparison is None else self.comparison.to_json_obj(),
        }


@dataclass(frozen=True)
class Timings:
    """Wall time of each phase, in seconds."""

    verify: float
    """Fetching missing data and verifying the manifest, its parent and the chain."""
    environment: float
    """Reading this machine's environment and comparing it with the lock."""
    code: float
    """Materialising the code: worktree at the commit, patch applied."""
    command: float
    """Running the recorded command, interpreter start included."""
    compare: float
    """Hashing or comparing the produced checkpoint."""
    total: float
    """Everything, cleanup included."""

    def to_json_obj(self) -> dict[str, float]:
        # every phase is a field, and its JSON key is the field's name
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ReplayResult(PerDataset[DatasetReplay]):
    """A segment replayed and compared with its recorded checkpoint."""

    manifest: ManifestRef
    """The manifest of the checkpoint replayed."""
    parent: ManifestRef | None
    """The manifest of the checkpoint the replay resumed from; None: from the start."""
    parent_fetched: bool
    """The parent checkpoint was not here and was pulled from the DVC remote."""
    commit: str
    """The git commit the code was taken from."""
    patch_sha256: Sha256 | None
    """The uncommitted patch re-applied on top of it, if the recorded tree was dirty."""
    command: tuple[str, ...]
    """The recorded argv."""
    executed: tuple[str, ...]
    """The argv run: interpreter resolved, placeholders substituted."""
    cwd: str
    """Where it ran, relative to the repository root."""
    seed: int | None
    """``KAUDIT_SEED``: the first recorded seed, if any."""
    environment: EnvironmentReport
    """This machine against the recorded environment lock."""
    policy: TolerancePolicy
    """The tolerances asked for; the empty policy is bitwise."""
    basis: Basis
    """HASHES (bitwise against the recorded dataset hashes, no recorded data needed) or
    DATA (dataset by dataset against the recorded checkpoint's data)."""
    produced: str
    """Name of the checkpoint file the command produced (a directory's ends in ``/``)."""
    produced_sha256: Sha256
    """Its sha256 (an unsigned file: its bytes may differ where its data does not); of a
    directory step or a sharded step, the sha256 of its file or shard index."""
    produced_size: int
    """Its size in bytes (of a directory or a sharded step, of all its files)."""
    datasets: tuple[DatasetReplay, ...]
    """One per dataset (or tensor) path in either checkpoint, sorted by path. Empty when
    the file digest decides (:attr:`compared_by` FILE)."""
    file_identical: bool
    """The produced file's sha256 equals the recorded one."""
    timings: Timings
    """Wall time of each phase."""
    replayed_at: str
    """RFC 3339 UTC time the replay finished."""
    tool: str
    """``kronos-audit X.Y.Z``: what replayed it."""
    workdir: Path | None = None
    """The work directory (worktree ``src/``, output ``out/``, command logs), when kept."""
    ranks: int | None = None
    """The ranks a step of a multi-rank run was replayed on; None for a checkpoint in one
    file."""
    launcher: str | None = None
    """What started those ranks (``mpiexec`` or ``torchrun``, as the step manifest records
    its run's were); None for a checkpoint in one file, and for a step one process wrote
    and replayed without a launcher. Shown, not in the JSON form: the executed command
    line says it there."""
    uncompared: tuple[str, ...] = ()
    """Datasets that could not be compared, in words (a multi-rank step replayed on another
    rank count: each rank's own generators and ledger); not counted in the outcome."""
    policy_source: PolicySource = field(default_factory=PolicySource)
    """Where :attr:`policy` came from: given, read at a trust ref, or the work tree's
    config (never for a signed result)."""
    compared_by: ComparedBy = ComparedBy.DATASETS
    """What was compared: datasets (or tensors) by their digests or data, a pickle's
    tensors after a weights-only load, or the file digest alone."""
    notes: tuple[str, ...] = ()
    """How the comparison was made, where it is not dataset by dataset in one format, in
    words (across formats; a pickle compared by its tensors, or by its bytes alone and
    why)."""

    def tolerances_json(self) -> dict[str, Any]:
        """The comparison made, as an attestation records it: where the policy came from,
        and each dataset's tolerance (null: bitwise) and the rule that gave it."""
        rows = []
        for d in self.datasets:
            tolerance, rule = d.tolerance(self.basis)
            rows.append(
                {
                    "path": d.path,
                    "tolerance": None if tolerance is None else tolerance.to_json_obj(),
                    "rule": rule,
                }
            )
        return {"source": self.policy_source.to_json_obj(), "datasets": rows}

    @property
    def outcome(self) -> Outcome:
        if not self.datasets:
            return Outcome.REPRODUCED if self.file_identical else Outcome.NOT_REPRODUCED
        if not all(d.ok for d in self.datasets):
            return Outcome.NOT_REPRODUCED
        if all(d.verdict is Verdict.IDENTICAL for d in self.datasets):
            return Outcome.REPRODUCED
        return Outcome.REPRODUCED_WITHIN_TOLERANCE

    @property
    def ok(self) -> bool:
        return self.outcome.ok

    @property
    def cause(self) -> str | None:
        """Why a segment that was NOT REPRODUCED may have computed other bits, in one line:
        what differs, the drift that can explain it and the ways out (None when it
        reproduced, or nothing drifted)."""
        if self.ok:
            return None
        why = self.environment.cause()
        if why is None:
            return None
        n = len(self.failures)
        what = (
            f"{n} dataset{'s differ' if n != 1 else ' differs'}"
            if self.datasets
            else "the file digest differs"
        )
        return f"{what}; {why}"

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "outcome": self.outcome.value,
            "ok": self.ok,
            "cause": self.cause,
            "manifest": self.manifest.to_json_obj(),
            "parent": None
            if self.parent is None
            else {**self.parent.to_json_obj(), "fetched": self.parent_fetched},
            "code": {"commit": self.commit, "patch_sha256": self.patch_sha256},
            "command": {
                "recorded": list(self.command),
                "executed": list(self.executed),
                "cwd": self.cwd,
                "seed": self.seed,
            },
            "environment": self.environment.to_json_obj(),
            "policy": self.policy.to_json_obj(),
            "tolerances": self.tolerances_json(),
            "basis": self.basis.value,
            "produced": {
                "name": self.produced,
                "sha256": self.produced_sha256,
                "size": self.produced_size,
                "file_identical": self.file_identical,
                "compared_by": self.compared_by.value,
            },
            "counts": {v.value: n for v, n in self.counts().items()},
            "datasets": [d.to_json_obj() for d in self.datasets],
            "timings": self.timings.to_json_obj(),
            "replayed_at": self.replayed_at,
            "tool": self.tool,
            "workdir": None if self.workdir is None else str(self.workdir),
            **({"ranks": self.ranks} if self.ranks is not None else {}),
            **({"uncompared": list(self.uncompared)} if self.uncompared else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
        }
