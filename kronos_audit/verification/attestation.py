"""Verifying a replay attestation ``CKPT.replay.json`` against the manifest beside it.

The steps (docs/security.md, "The steps of a verification"): (A1) the attestation's
signature, by a key the keyring accepts, at the time the replay finished; (A2) its
binding: it names the exact sha256 of the manifest beside it and of that manifest's
checkpoint, and that manifest passes (1) signature and (2) place; (A3) it records a
reproduced outcome. The decisions are :mod:`kronos_audit.verification.steps`'; this
module reads the two files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import ATTESTATION_SUFFIX, MANIFEST_SUFFIX, checkpoint_path_for
from kronos_audit.statement.attestation import read_attestation
from kronos_audit.statement.manifest import parse_manifest
from kronos_audit.verification import steps
from kronos_audit.verification.chain import ChainReader, place_check
from kronos_audit.verification.results import Check, CheckName, StatementKind, VerifyResult


def verify_attestation(reader: ChainReader, path: Path | str) -> VerifyResult:
    """Every check of the attestation at ``path``, with ``reader``'s keyring and project."""
    attestation = read_attestation(path)
    path = attestation.path
    manifest_path = path.with_name(path.name[: -len(ATTESTATION_SUFFIX)] + MANIFEST_SUFFIX)
    replay = attestation.replay
    # (A1) signature
    signed = reader.keys.check(attestation.envelope, replay.replayed_at)
    checks = [steps.signature_check(signed)]
    run, step = replay.manifest.run, replay.manifest.step
    # (A2) binding to the manifest beside it
    try:
        data = read_regular(manifest_path, MANIFEST_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        checks.append(
            Check.failed(
                CheckName.MANIFEST, f"the manifest beside it, {manifest_path.name}: {e.reason}"
            )
        )
    else:
        digest = hashlib.sha256(data).hexdigest()
        if digest != attestation.manifest_sha256:
            # Bytes that are not the attested manifest are not parsed.
            checks.append(steps.binding(attestation, manifest_path.name, digest, None, None, None))
        else:
            manifest = parse_manifest(data, manifest_path)
            checks.append(
                steps.binding(
                    attestation,
                    manifest_path.name,
                    digest,
                    manifest,
                    reader.signature(manifest),
                    place_check(reader.project, manifest),
                )
            )
            run, step = manifest.run, manifest.step
    # (A3) outcome
    checks.append(steps.outcome(attestation))
    return VerifyResult(
        path,
        checkpoint_path_for(manifest_path),
        run,
        step,
        tuple(checks),
        signer=signed.signer,
        kind=StatementKind.ATTESTATION,
        comparison=tuple(replay.comparison.lines()),
    )
