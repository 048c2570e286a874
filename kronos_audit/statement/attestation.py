"""Replay attestations as an outside verifier reads them: the file, its name, its schema.

An attestation is a DSSE envelope, signed like a manifest, whose payload is an in-toto
Statement v1 (``schemas/attestation-v1.schema.json``):

- ``subject``: the manifest replayed (its file's sha256) and the recorded checkpoint it
  signs (that file's sha256), each named relative to the repository root;
- ``predicateType``: :data:`PREDICATE_TYPE`;
- ``predicate``: the replay result (``schemas/replay-v1.schema.json``): which manifest and
  parent, the code, the command, this machine's environment lock digest and its drift,
  the tolerance policy, the per-dataset verdicts, the outcome and the timings.

It is written beside the manifest as ``CKPT.replay.json`` (see
:func:`kronos_audit.checkpoint.layout.attestation_path_for`)
and verifies with the repository's trust store like any manifest. This module reads it;
:mod:`kronos_audit.replay.attest` writes it and
:mod:`kronos_audit.verification.attestation` verifies it, so neither imports the other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.statement.manifest import (
    Sha256,
    SignedStatement,
    parse_statement,
    read_signed_file,
)
from kronos_audit.statement.schemas import validate

if TYPE_CHECKING:
    from kronos_audit.compare.policy import PolicySource, Tolerance, TolerancePolicy
    from kronos_audit.statement.dsse import Envelope

PREDICATE_TYPE = "https://kronos-audit.dev/replay/v1"
SCHEMA_NAME = "attestation-v1.schema.json"


class Outcome(enum.StrEnum):
    """The replay's verdict over all datasets."""

    REPRODUCED = "REPRODUCED"
    """Every dataset IDENTICAL: bitwise the recorded checkpoint."""
    REPRODUCED_WITHIN_TOLERANCE = "REPRODUCED_WITHIN_TOLERANCE"
    """Every dataset IDENTICAL or WITHIN_TOLERANCE, at least one only within tolerance."""
    NOT_REPRODUCED = "NOT_REPRODUCED"
    """At least one dataset DIFFERENT, NOT_COMPARABLE, or present on one side only."""

    @property
    def ok(self) -> bool:
        return self is not Outcome.NOT_REPRODUCED


@dataclass(frozen=True)
class ManifestRef:
    """A manifest the replay used, and the checkpoint it signs."""

    path: str
    """Relative to the repository root (POSIX)."""
    sha256: Sha256
    """sha256 of the manifest file: what a child's ``parent`` names."""
    run: str
    """Run id."""
    step: int
    """Step the checkpoint holds."""
    checkpoint: str
    """The checkpoint's name in the manifest's subject."""
    checkpoint_sha256: Sha256
    """The checkpoint file's signed sha256."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> ManifestRef:
        """The reference a schema-valid replay result holds (a parent's ``fetched`` aside)."""
        checkpoint = obj["checkpoint"]
        return cls(
            path=str(obj["path"]),
            sha256=Sha256(str(obj["sha256"])),
            run=str(obj["run"]),
            step=int(obj["step"]),
            checkpoint=str(checkpoint["name"]),
            checkpoint_sha256=Sha256(str(checkpoint["sha256"])),
        )

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "run": self.run,
            "step": self.step,
            "checkpoint": {"name": self.checkpoint, "sha256": self.checkpoint_sha256},
        }


def _tolerance(obj: Mapping[str, Any] | None) -> Tolerance | None:
    from kronos_audit.compare.policy import Tolerance

    if obj is None:
        return None
    ulp = obj["ulp"]
    return Tolerance(float(obj["rtol"]), float(obj["atol"]), None if ulp is None else int(ulp))


SHOWN_DATASETS = 8
"""Datasets judged with a tolerance that :meth:`AttestedComparison.lines` names one by one."""


@dataclass(frozen=True)
class AttestedComparison:
    """The comparison an attestation records: the tolerances its verdict was reached with,
    each dataset's, and where they came from."""

    policy: TolerancePolicy
    """The tolerances asked for; the empty policy is bitwise."""
    basis: str
    """``hashes`` (bitwise against the recorded hashes) or ``data``."""
    source: PolicySource | None
    """Where the policy came from; None in an attestation written before it was recorded."""
    datasets: tuple[tuple[str, Tolerance | None, str], ...] | None
    """Each dataset's path, tolerance (None: bitwise) and the rule that gave it; None in
    an attestation written before they were recorded."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> AttestedComparison:
        """The comparison a schema-valid replay result records."""
        # Imported here, when an attestation is read: verifying a manifest needs none of
        # the comparison package.
        from kronos_audit.compare.policy import (
            PolicySource,
            ToleranceError,
            TolerancePolicy,
            ToleranceRule,
        )

        policy = obj["policy"]
        try:
            parsed = TolerancePolicy(
                tuple(
                    ToleranceRule(str(r["pattern"]), _tolerance(r["tolerance"]), str(r["origin"]))
                    for r in policy["rules"]
                ),
                _tolerance(policy["default"]),
            )
        except ToleranceError as e:
            raise ValueError(f"the recorded policy: {e.message}") from None
        recorded = obj.get("tolerances")
        if recorded is None:
            return cls(parsed, str(obj["basis"]), None, None)
        return cls(
            parsed,
            str(obj["basis"]),
            PolicySource.from_json_obj(recorded["source"]),
            tuple(
                (str(d["path"]), _tolerance(d["tolerance"]), str(d["rule"]))
                for d in recorded["datasets"]
            ),
        )

    @property
    def bitwise(self) -> bool:
        """No tolerance applied to any dataset."""
        return self.policy.default is None and all(r.tolerance is None for r in self.policy.rules)

    def summary(self) -> str:
        """The policy and where it came from, in one line."""
        from kronos_audit.compare.policy import policy_text

        if self.source is None:
            return f"{policy_text(self.policy)} (where it came from is not recorded)"
        return f"{policy_text(self.policy)} ({self.source.describe()})"

    def lines(self) -> list[str]:
        """The summary, then each dataset judged with a tolerance and the rule that gave
        it (at most :data:`SHOWN_DATASETS`, then how many more)."""
        out = [self.summary()]
        if self.source is not None and self.source.settings == "work-tree":  # a Settings
            out[0] += ": the work tree's config, which any commit can change"
        loose = [d for d in self.datasets or () if d[1] is not None]
        out += [f"{path}: {tol.spec} ({rule})" for path, tol, rule in loose[:SHOWN_DATASETS] if tol]
        if len(loose) > SHOWN_DATASETS:
            out.append(f"{len(loose) - SHOWN_DATASETS} more datasets judged with a tolerance")
        return out


@dataclass(frozen=True)
class AttestedReplay:
    """What an attestation's predicate (a replay result) says, typed: the parts read back.
    The rest (drift, policy, per-dataset verdicts, timings) stays in
    :attr:`Attestation.predicate`, the document as signed."""

    manifest: ManifestRef
    """The manifest replayed."""
    parent: ManifestRef | None
    """The manifest the replay resumed from; None: replayed from the start."""
    parent_fetched: bool
    """The parent checkpoint was fetched from the DVC remote for the replay."""
    outcome: Outcome
    """The verdict over all datasets."""
    commit: str
    """The commit the code was materialised at."""
    patch_sha256: Sha256 | None
    """The recorded patch re-applied, if any."""
    replayed_at: str
    """RFC 3339 UTC time the replay finished: the time its signature is judged at."""
    tool: str
    """``kronos-audit X.Y.Z``: what replayed it."""
    comparison: AttestedComparison
    """The tolerances the verdict was reached with, and where they came from."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> AttestedReplay:
        """The record of a schema-valid replay result (``schemas/replay-v1.schema.json``)."""
        parent = obj["parent"]
        code = obj["code"]
        patch = code["patch_sha256"]
        return cls(
            manifest=ManifestRef.from_json_obj(obj["manifest"]),
            parent=None if parent is None else ManifestRef.from_json_obj(parent),
            parent_fetched=parent is not None and bool(parent["fetched"]),
            outcome=Outcome(obj["outcome"]),
            commit=str(code["commit"]),
            patch_sha256=None if patch is None else Sha256(str(patch)),
            replayed_at=str(obj["replayed_at"]),
            tool=str(obj["tool"]),
            comparison=AttestedComparison.from_json_obj(obj),
        )


@dataclass(frozen=True)
class Attestation(SignedStatement):
    """An attestation read from or written to disk, its statement schema-valid."""

    replay: AttestedReplay
    """The predicate, typed (what is read back of it): parsed once, when it was read."""

    @property
    def outcome(self) -> Outcome:
        return self.replay.outcome

    @property
    def manifest_sha256(self) -> Sha256:
        """The first subject: the sha256 of the manifest it attests."""
        return Sha256(str(self.statement["subject"][0]["digest"]["sha256"]))

    @property
    def checkpoint_sha256(self) -> Sha256:
        """The second subject: the sha256 of the checkpoint that manifest signs."""
        return Sha256(str(self.statement["subject"][1]["digest"]["sha256"]))


def attestation_of(path: Path, envelope: Envelope, statement: Any) -> Attestation:
    """The attestation at ``path`` of a schema-valid ``statement`` in ``envelope``."""
    try:
        replay = AttestedReplay.from_json_obj(statement["predicate"])
    except (ValueError, UsageError) as e:  # a ToleranceError is a UsageError
        raise ManifestError(f"not an attestation: {e}", path=path) from None
    return Attestation(path, envelope, statement, replay)


def read_attestation(path: Path | str) -> Attestation:
    """Read and schema-check an attestation. Its signature, its binding to the manifest
    beside it and the signer's anchors and revocations are checked by
    :meth:`kronos_audit.verification.verifier.Verifier.verify_attestation` (``kaudit verify``):
    there is no second, partial way."""
    path = Path(path)
    envelope, statement = parse_statement(
        read_signed_file(path, "attestation"), path, "attestation"
    )
    validate(statement, path, schema_name=SCHEMA_NAME, what="attestation")
    return attestation_of(path, envelope, statement)
