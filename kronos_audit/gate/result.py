"""What a gate found: one case per manifest verified and per segment replayed."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit.gate.config import GateConfig
from kronos_audit.keys.anchors import PinnedRef

FORMAT = "kronos-audit/gate/v1"


class CaseKind(enum.StrEnum):
    """What a case checked."""

    VERIFY = "verify"
    """A manifest (or replay attestation) verified: signature, place, digests, chain."""
    REPLAY = "replay"
    """A segment replayed and compared with its recorded checkpoint."""


class CaseStatus(enum.StrEnum):
    """How a case ended."""

    PASSED = "passed"
    FAILED = "failed"
    """The check ran and did not hold."""
    ERROR = "error"
    """The check could not be made (bad input, a segment that cannot be replayed)."""


@dataclass(frozen=True)
class Case:
    """One check of the gate."""

    kind: CaseKind
    """Verify or replay."""
    name: str
    """The manifest, relative to the repository root."""
    run: str
    """Its run id ("" when the manifest could not be read)."""
    step: int | None
    """Its step, when known."""
    status: CaseStatus
    """Passed, failed or error."""
    message: str
    """One line: what held, or what failed and where."""
    details: tuple[str, ...] = ()
    """Every failed check (or dataset), one line each."""
    seconds: float = 0.0
    """Time the check took."""
    comparison: tuple[str, ...] = ()
    """For a replay attestation verified, the comparison it records: its tolerances and
    where they came from, then each dataset judged with a tolerance."""

    @property
    def ok(self) -> bool:
        return self.status is CaseStatus.PASSED

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "name": self.name,
            "run": self.run,
            "step": self.step,
            "status": self.status.value,
            "ok": self.ok,
            "message": self.message,
            "details": list(self.details),
            "seconds": round(self.seconds, 6),
            **({"comparison": list(self.comparison)} if self.comparison else {}),
        }


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict and every case behind it."""

    config: GateConfig
    """The configuration it ran with (and where it was read)."""
    trust_ref: str | None
    """``--trust-ref``: the ref the trust store and the configuration were read at."""
    cases: tuple[Case, ...]
    """Verifications first, then replays, each in path order."""
    problems: tuple[str, ...] = ()
    """What was skipped reading the trust anchors."""
    manifests: tuple[Path, ...] = ()
    """Every manifest and attestation the gate covered."""
    seconds: float = 0.0
    """Time the whole gate took."""
    trust_anchor: PinnedRef | None = None
    """``trust_ref`` resolved: the one full ref and the commit everything was read at."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    @property
    def failures(self) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if not c.ok)

    def of_kind(self, kind: CaseKind) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.kind is kind)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per kind: how many passed, failed, errored."""
        return {
            kind.value: {
                status.value: sum(1 for c in self.of_kind(kind) if c.status is status)
                for status in CaseStatus
            }
            for kind in CaseKind
        }

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "ok": self.ok,
            "verdict": "PASSED" if self.ok else "FAILED",
            "trust_ref": self.trust_ref,
            "trust_ref_resolved": (
                self.trust_anchor.to_json_obj() if self.trust_anchor is not None else None
            ),
            "config": self.config.to_json_obj(),
            "counts": self.counts(),
            "failures": [c.to_json_obj() for c in self.failures],
            "cases": [c.to_json_obj() for c in self.cases],
            "problems": list(self.problems),
            "seconds": round(self.seconds, 3),
        }
