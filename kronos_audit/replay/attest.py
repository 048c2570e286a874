"""Writing replay attestations: a replay result, signed, beside the manifest it replays.

The format (and reading it back) is :mod:`kronos_audit.statement.attestation`, below
both replay and verification: an attestation is verified with
:meth:`kronos_audit.verification.verifier.Verifier.verify_attestation`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import probe_writable, write_atomic
from kronos_audit.compare import Settings
from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.replay.interface import ReplayResult
from kronos_audit.statement.attestation import (
    PREDICATE_TYPE,
    SCHEMA_NAME,
    Attestation,
    attestation_of,
)
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import STATEMENT_TYPE
from kronos_audit.statement.schemas import validate


def build_statement(result: ReplayResult) -> dict[str, Any]:
    """The in-toto Statement an attestation of ``result`` signs."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": result.manifest.path, "digest": {"sha256": result.manifest.sha256}},
            {
                "name": result.manifest.checkpoint,
                "digest": {"sha256": result.manifest.checkpoint_sha256},
            },
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": result.to_json_obj(),
    }


def check_attestation_writable(path: Path) -> None:
    """Raise ManifestError, as :func:`write_attestation` would, when the attestation
    cannot be written at ``path`` (a read-only directory): checked before the replay,
    which may take long, so that it is not run for nothing."""
    try:
        probe_writable(path)
    except OSError as e:
        raise ManifestError(f"cannot write the attestation: {e.strerror or e}", path=path) from None


def write_attestation(result: ReplayResult, key: SigningKey, path: Path) -> Attestation:
    """Sign ``result`` with ``key`` and write the attestation atomically to ``path``.

    A signed verdict depends only on signed or given settings: a result whose tolerances
    were read from the work tree's ``.kaudit/config.toml`` (which any commit can change)
    is refused with UsageError; give the tolerances, or read them at a trust ref."""
    if result.policy_source.settings is Settings.WORK_TREE:
        raise UsageError(
            "an attestation's tolerances come from the command line or from [compare] at a "
            f"trust ref, not from the work tree's {result.policy_source.config}: give them "
            "(--rtol, --atol, --ulp, --tol) or --trust-ref REF",
            path=path,
        )
    statement = build_statement(result)
    validate(statement, schema_name=SCHEMA_NAME, what="attestation")
    envelope = sign_envelope(canonical_json(statement), key)
    try:
        write_atomic(path, encode_envelope(envelope))
    except OSError as e:
        raise ManifestError(f"cannot write the attestation: {e.strerror or e}", path=path) from None
    return attestation_of(path, envelope, statement)
