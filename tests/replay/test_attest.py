"""`kaudit replay --attest`: a signed in-toto attestation of the result that verifies with
the repository's trust store, by kaudit and by securesystemslib's own DSSE code."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path

import pytest
from securesystemslib import dsse
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from kronos_audit.keys.home import user_trust_dir
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.keys.store import TrustStore, verify_envelope
from kronos_audit.project.repository import Project
from kronos_audit.replay import PREDICATE_TYPE, SCHEMA_NAME, Outcome, read_attestation
from kronos_audit.statement.attestation import SCHEMA_NAME as ATTESTATION_SCHEMA
from kronos_audit.statement.dsse import parse_envelope
from kronos_audit.statement.schemas import validate
from tests.helpers import run_cli, untrusted_key
from tests.replay.helpers import bad_input, manifest, record

pytestmark = pytest.mark.slow


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_attest_writes_an_attestation_that_verifies(
    heat: Path, repo: Path, key: SigningKey
) -> None:
    target = manifest(heat, 20)
    result = run_cli("replay", str(target), "--attest")
    assert result.exit_code == 0, result.output
    path = heat / "step-00000020.h5.replay.json"
    assert f"attestation: {path}" in result.stdout

    attestation = read_attestation(path)
    statement = attestation.statement
    validate(dict(statement), schema_name=ATTESTATION_SCHEMA, what="attestation")
    validate(dict(statement["predicate"]), schema_name=SCHEMA_NAME, what="predicate")
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE
    assert statement["subject"] == [
        {
            "name": "heat/checkpoints/heat/step-00000020.h5.kaudit.json",
            "digest": {"sha256": sha256(target)},
        },
        {
            "name": "heat/checkpoints/heat/step-00000020.h5",
            "digest": {"sha256": sha256(heat / "step-00000020.h5")},
        },
    ]
    predicate = attestation.predicate
    assert attestation.outcome == "REPRODUCED"
    assert predicate["manifest"]["sha256"] == sha256(target)
    assert predicate["parent"]["sha256"] == sha256(manifest(heat, 10))
    assert predicate["environment"]["mode"] == "warn"
    assert predicate["policy"] == {"default": None, "rules": []}
    assert {d["verdict"] for d in predicate["datasets"]} == {"IDENTICAL"}
    assert predicate["timings"]["command"] > 0
    # ... and typed, what a verifier reads of it
    replay = attestation.replay
    assert replay.outcome is Outcome.REPRODUCED
    assert replay.manifest.sha256 == sha256(target) == attestation.manifest_sha256
    assert replay.manifest.checkpoint_sha256 == attestation.checkpoint_sha256
    assert (replay.manifest.run, replay.manifest.step) == ("heat", 20)
    assert replay.parent is not None
    assert (replay.parent.sha256, replay.parent.step) == (sha256(manifest(heat, 10)), 10)
    assert replay.replayed_at == predicate["replayed_at"]
    assert replay.commit == predicate["code"]["commit"]

    # kaudit's verifier, with the repository's trust store
    trust = Project(repo).trust_store()
    check = verify_envelope(attestation.envelope, trust)
    assert check.ok, check.detail
    assert check.signers == (key.key_id,)
    obj = json.loads(path.read_text())
    assert verify_envelope(parse_envelope(obj), trust).ok

    # securesystemslib's independent DSSE implementation, given only the public key
    public = SSlibKey.from_crypto(key.private_key.public_key(), keyid=key.key_id)
    # (from_dict rewrites the signatures of the dict it is given: hand it copies)
    assert set(dsse.Envelope.from_dict(copy.deepcopy(obj)).verify([public], 1)) == {key.key_id}
    forged = copy.deepcopy(obj)
    payload = json.loads(base64.b64decode(obj["payload"]))
    payload["predicate"]["outcome"] = "NOT_REPRODUCED"
    forged["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    with pytest.raises(VerificationError):
        dsse.Envelope.from_dict(copy.deepcopy(forged)).verify([public], 1)
    assert not verify_envelope(parse_envelope(forged), trust).ok


def test_a_replay_that_fails_is_attested_too(repo: Path) -> None:
    record(repo, "programs", "noisy.py", "5")
    target = manifest(repo / "programs" / "checkpoints" / "noisy", 5)
    result = run_cli("replay", str(target), "--attest", "--json")
    assert result.exit_code == 1, result.output
    json.loads(result.stdout)  # stdout stays pure JSON
    attestation = read_attestation(target.parent / "step-00000005.h5.replay.json")
    assert attestation.outcome == "NOT_REPRODUCED"
    assert attestation.replay.outcome is Outcome.NOT_REPRODUCED
    assert attestation.replay.parent is None  # replayed from the start
    noise = next(d for d in attestation.predicate["datasets"] if d["path"] == "/noise")
    assert noise["verdict"] == "DIFFERENT"


def test_attest_signs_with_the_key_named(heat: Path, repo: Path, key: SigningKey) -> None:
    auditor = untrusted_key("auditor")  # held, but not trusted by the repository
    bad_input(run_cli("replay", str(manifest(heat, 10)), "--attest"), "several signing keys")
    result = run_cli("replay", str(manifest(heat, 10)), "--attest", "--key", "auditor")
    assert result.exit_code == 0, result.output
    attestation = read_attestation(heat / "step-00000010.h5.replay.json")
    repo_trust = Project(repo).trust_store()
    assert not verify_envelope(attestation.envelope, repo_trust).ok  # the repo does not trust it
    mine = TrustStore(repo.parent / "auditor-trust")
    mine.add(auditor.private_key.public_key(), "auditor")
    assert verify_envelope(attestation.envelope, mine).signers == (auditor.key_id,)
    # kaudit verify: refused until the verifier anchors the auditor's key itself
    path = str(heat / "step-00000010.h5.replay.json")
    assert run_cli("verify", path).exit_code == 1
    pem = repo.parent / "auditor.pub"
    pem.write_bytes(public_pem(auditor.private_key.public_key()))
    anchored = run_cli("verify", "--trusted-key", str(pem), path)
    assert anchored.exit_code == 0, anchored.output


def test_a_missing_key_stops_before_the_replay(heat: Path, repo: Path) -> None:
    bad_input(
        run_cli("replay", str(manifest(heat, 10)), "--attest", "--key", "nobody"),
        "no signing key named 'nobody'",
    )
    assert not (heat / "step-00000010.h5.replay.json").exists()


def test_reading_something_that_is_not_an_attestation(tmp_path: Path) -> None:
    from kronos_audit.errors import ManifestError

    path = tmp_path / "x.replay.json"
    path.write_text("[]")
    with pytest.raises(ManifestError, match="not a DSSE envelope"):
        read_attestation(path)
    with pytest.raises(ManifestError, match="not found"):
        read_attestation(tmp_path / "absent.replay.json")


def test_an_attestation_requires_an_anchored_history(
    heat: Path, repo: Path, key: SigningKey, tmp_path: Path
) -> None:
    # Only the repository's own store vouches for the run's key: verify says "unanchored",
    # and an attestation, which certifies, refuses to be made on that word alone.
    for p in user_trust_dir().iterdir():
        p.unlink()
    target = manifest(heat, 10)
    refused = run_cli("replay", str(target), "--attest")
    bad_input(refused, "unanchored")
    assert not (heat / "step-00000010.h5.replay.json").exists()
    # Handed the owner's key out of band, the auditor can attest.
    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    accepted = run_cli("replay", str(target), "--attest", "--trusted-key", str(owner))
    assert accepted.exit_code == 0, accepted.output
    assert (heat / "step-00000010.h5.replay.json").is_file()
    # A replay without --attest runs on the repository's word only when the verifier says so.
    assert run_cli("replay", str(target)).exit_code != 0
    assert run_cli("replay", str(target), "--allow-unanchored").exit_code == 0
