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

from kronos_audit.statement.manifest import (
    Sha256,
    SignedStatement,
    parse_statement,
    read_signed_file,
)
from kronos_audit.statement.schemas import validate

if TYPE_CHECKING:
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
    return Attestation(
        path, envelope, statement, AttestedReplay.from_json_obj(statement["predicate"])
    )


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
