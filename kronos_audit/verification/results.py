"""What a verification yields: one :class:`Check` per step made, in a :class:`VerifyResult`.

A check has one of four states (:class:`CheckStatus`): made and held, made and failed, not
made because it need not be (data a signed retention record prunes, data not asked for),
or not made though it had to be (the data of a manifest whose signature does not hold is
never fetched). The detail says, in words, what was found or why it was not made.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit.checkpoint.location import Location

# Named in fields only: a worker checking a long run's files makes Checks, never results.
if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustedKey
    from kronos_audit.statement.campaign import Certificate
    from kronos_audit.statement.manifest import Manifest


class CheckName(enum.StrEnum):
    """What a check checks. Its value is the name printed and in JSON (``check``); a
    dataset's check is named after its dataset too: ``dataset /fields/u``."""

    SIGNATURE = "signature"
    """A key the verifier's anchors accept signed it."""
    PLACE = "place"
    """The checkpoint is under the name and in the run directory it was signed for."""
    FILE_DIGEST = "file digest"
    """The checkpoint's bytes are the ones the manifest signs (sha256)."""
    DATASETS = "datasets"
    """Every dataset hash matches (or, for a file that is not HDF5, there are none)."""
    DATASET = "dataset"
    """One dataset differs from its recorded hash (:attr:`Check.dataset` names it)."""
    PARENT_LINK = "parent link"
    """The chain back to its first manifest exists, matches and is signed."""
    MANIFEST = "manifest"
    """An attestation is bound to the signed manifest beside it."""
    OUTCOME = "outcome"
    """An attestation records a reproduced outcome."""
    SHARD_INDEX = "shard index"
    """A sharded step's index is well formed and its lines give the signed Merkle root."""
    BATCHES = "batches"
    """A campaign certificate's batches are every batch of the campaign exactly once, each
    with the result, worker and attempt its run's ledger and chain hold."""
    TALLY = "tally"
    """A campaign certificate's tally is the one summed again from the ledgers."""
    SHARDS = "shards"
    """Every shard of a sharded step (or the one a rank restores) has its recorded size
    and sha256; a failed one names the rank (``shard of rank 2 of 3: missing``)."""
    FILES = "files"
    """Every file of a directory step is there with its recorded size and sha256, and no
    other is; a failed one names one file (``added: extra.bin``, ``missing: .metadata``,
    ``changed: __0_0.distcp``, ``link.bin: is a symbolic link``)."""
    LEDGER = "ledger"
    """Every chunk of the Monte Carlo ledger a step's manifest names is in the run's
    ``ledger/`` directory with its signed size and sha256 (a failed one names the chunk)."""


class CheckStatus(enum.Enum):
    """How a check came out: two that were made, two that were not."""

    PASSED = "passed"
    """Made, and it held."""
    FAILED = "failed"
    """Made, and it did not hold."""
    SKIPPED = "skipped"
    """Not made, and it need not be (the detail says why: data pruned by a signed
    retention record, data not asked for). Passes, but the data counts as not checked."""
    UNVERIFIED = "unverified"
    """Not made, though it had to be (the detail says why: its manifest does not verify,
    or the newest checkpoint's data is pruned). Fails, and counts as not checked."""

    @property
    def ok(self) -> bool:
        """It does not make the result fail."""
        return self in (CheckStatus.PASSED, CheckStatus.SKIPPED)

    @property
    def made(self) -> bool:
        """The check ran (passed or failed); False for the two that were not made."""
        return self in (CheckStatus.PASSED, CheckStatus.FAILED)


class StatementKind(enum.StrEnum):
    """What was verified."""

    MANIFEST = "manifest"
    """A checkpoint's manifest, ``CKPT.kaudit.json``."""
    ATTESTATION = "attestation"
    """A replay attestation, ``CKPT.replay.json``."""
    CAMPAIGN = "campaign"
    """A campaign certificate, ``NAME.campaign.json``."""


@dataclass(frozen=True, init=False)
class Check:
    """One check of a manifest.

    ``Check(kind, ok, detail)`` with a bool is a check that was made (PASSED or FAILED);
    one that was not made is built by :meth:`skip` or :meth:`unverified`."""

    kind: CheckName
    """What it checks."""
    status: CheckStatus
    """How it came out."""
    detail: str
    """What was found, or why it was not made."""
    dataset: str | None = None
    """For a :attr:`CheckName.DATASET` check, the dataset's path (``/fields/u``); else None."""
    pruned: bool = False
    """Not made because a signed retention record prunes the data (``pruned``, the word
    every command uses for it)."""

    def __init__(
        self,
        kind: CheckName,
        status: CheckStatus | bool,
        detail: str,
        *,
        dataset: str | None = None,
        pruned: bool = False,
    ) -> None:
        if isinstance(status, bool):
            status = CheckStatus.PASSED if status else CheckStatus.FAILED
        kind = CheckName(kind)
        if (kind is CheckName.DATASET) != (dataset is not None):
            raise ValueError("a dataset is named by a dataset check, and only by one")
        if pruned and status.made:
            raise ValueError("a pruned check is one that was not made")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "pruned", pruned)

    @classmethod
    def passed(cls, kind: CheckName, detail: str) -> Check:
        return cls(kind, CheckStatus.PASSED, detail)

    @classmethod
    def failed(cls, kind: CheckName, detail: str, *, dataset: str | None = None) -> Check:
        return cls(kind, CheckStatus.FAILED, detail, dataset=dataset)

    @classmethod
    def skip(cls, kind: CheckName, reason: str, *, pruned: bool = False) -> Check:
        """Not made, and need not be: passes."""
        return cls(kind, CheckStatus.SKIPPED, reason, pruned=pruned)

    @classmethod
    def unverified(cls, kind: CheckName, reason: str, *, pruned: bool = False) -> Check:
        """Not made, though it had to be: fails."""
        return cls(kind, CheckStatus.UNVERIFIED, reason, pruned=pruned)

    @property
    def ok(self) -> bool:
        """Whether it held (a check not made that need not be counts as holding)."""
        return self.status.ok

    @property
    def skipped(self) -> bool:
        """Not made, for a reason the detail gives (e.g. data pruned by retention); with
        ``ok`` False it had to be made (the newest checkpoint's data, say) and could not be."""
        return not self.status.made

    @property
    def name(self) -> str:
        """``signature``, ``place``, ``file digest``, ``dataset /path``, ``datasets``,
        ``parent link``; for an attestation also ``manifest`` and ``outcome``."""
        if self.dataset is not None:
            return f"{self.kind.value} {self.dataset}"
        return self.kind.value

    def to_json_obj(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "skipped": self.skipped, "detail": self.detail}


@dataclass(frozen=True)
class VerifyResult:
    """Every check made of one manifest (or replay attestation)."""

    manifest: Path
    """The manifest (or attestation) verified."""
    checkpoint: Path
    """The checkpoint file it describes."""
    run: str
    """Run id."""
    step: int
    """Step."""
    checks: tuple[Check, ...]
    """In the order made."""
    fetched: bool = False
    """The checkpoint was fetched from the DVC remote for this verification."""
    data: Location | None = None
    """Where its data is, as this verification found it, in ``kaudit status``'s words:
    ``local`` (its bytes here, or fetched, are the signed ones), ``corrupt`` (they are not,
    or those fetched were refused), ``pruned`` (a signed retention record prunes it) or
    ``missing`` (not here, and not fetched: its manifest does not verify). None where the
    data was not looked at: not asked for, a sharded step's index not read (its manifest
    does not verify), an attestation or a campaign certificate."""
    signer: TrustedKey | None = None
    """The key whose signature was accepted (or refused as unanchored or revoked)."""
    kind: StatementKind = StatementKind.MANIFEST
    """A manifest or an attestation."""
    statement: Manifest | None = field(default=None, compare=False, repr=False)
    """The manifest exactly as parsed and checked here (None for an attestation): what a
    restore uses, never the file read again by name."""
    read: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """For a checkpoint file checked as a restore reads it (``ranks``), its datasets as
    read and checked here, when every check passed: what the restore uses, never the
    file read again."""
    certificate: Certificate | None = field(default=None, compare=False, repr=False)
    """For a campaign certificate, the one read and checked here: what a report shows."""
    comparison: tuple[str, ...] = ()
    """For an attestation, the comparison it records, in words: the tolerances, where they
    came from, then each dataset judged with a tolerance (see
    :meth:`kronos_audit.statement.attestation.AttestedComparison.lines`)."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def is_attestation(self) -> bool:
        return self.kind is StatementKind.ATTESTATION

    def check(self, kind: CheckName) -> Check | None:
        """The first check of this kind made, if any."""
        return next((c for c in self.checks if c.kind is kind), None)

    @property
    def signature_check(self) -> Check | None:
        """The signature's check: its detail names who signed and which anchor trusted them."""
        return self.check(CheckName.SIGNATURE)

    @property
    def data_checked(self) -> bool:
        """The checkpoint's bytes were hashed and compared with the signed digests."""
        return any(c.kind is CheckName.FILE_DIGEST and c.status.made for c in self.checks)

    @property
    def data_pruned(self) -> bool:
        """The checkpoint's data is gone on purpose: a signed retention record prunes it."""
        return any(c.kind is CheckName.FILE_DIGEST and c.pruned for c in self.checks)

    @property
    def data_corrupt(self) -> bool:
        """The bytes here are not the ones the manifest signs (for a sharded step: its
        index's, or a shard's)."""
        return any(
            c.kind in (CheckName.FILE_DIGEST, CheckName.SHARD_INDEX, CheckName.SHARDS)
            and c.status is CheckStatus.FAILED
            for c in self.checks
        )

    def to_json_obj(self, path: Callable[[Path], str] = str) -> dict[str, Any]:
        """As JSON, each file named by ``path`` (the CLI's: relative to the repository)."""
        return {
            "kind": self.kind.value,
            "manifest": path(self.manifest),
            "checkpoint": path(self.checkpoint),
            "run": self.run,
            "step": self.step,
            "ok": self.ok,
            "signer": None if self.signer is None else self.signer.to_json_obj(),
            "data_checked": self.data_checked,
            "data": None if self.data is None else self.data.value,
            "checks": [c.to_json_obj() for c in self.checks],
            "fetched": self.fetched,
            **({"comparison": list(self.comparison)} if self.is_attestation else {}),
        }
