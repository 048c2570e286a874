"""Every in-toto Statement kaudit signs is one to the in-toto project's own bindings
(``in-toto-attestation``): checkpoint manifests and sharded step manifests, as a real run
and rank 0 write them, and the replay attestation ``kaudit replay --attest`` writes. Each
envelope's payload is parsed into the bindings' protobuf Statement (an unknown field is
refused) and validated, with each subject's ResourceDescriptor.

Revocations are DSSE envelopes too, but not in-toto Statements: their payloadType is
kaudit's own, so an in-toto consumer never takes one for an attestation. No other kind of
statement is signed (a campaign has no certificate of its own yet).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from kronos_audit.checkpoint.layout import checkpoint_path_for
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.revocation import REVOCATION_PAYLOAD_TYPE
from tests.checkpoint.test_shards import sharded_step
from tests.helpers import run_cli
from tests.replay import recorded

# The fixtures over the repository recorded once for the session (tests/replay/recorded.py).
heat = recorded.heat
key = recorded.key
project = recorded.project
repo = recorded.repo

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
# The in-toto spec's DigestSet: these algorithms' values are lower-case hex of this length.
# The Python bindings do not check it (their Go counterpart does), so it is checked here.
HEX_DIGESTS = {"sha256": 64, "sha512": 128, "sha1": 40, "md5": 32}


@pytest.fixture
def attested(heat: Path) -> Path:
    """The heat run (steps 10, 20, 30) with step 20 replayed and attested; its directory."""
    assert (heat / "step-00000020.h5.replay.json").is_file()
    return heat


def in_toto(payload: bytes) -> Statement:
    """``payload`` as the bindings read it: parsed into their protobuf Statement, then
    validated, the Statement and each of its subjects; raises what they raise."""
    pb = json_format.Parse(payload.decode("utf-8"), statement_pb2.Statement())
    statement = Statement.copy_from_pb(pb)
    statement.validate()
    for subject in pb.subject:
        ResourceDescriptor.copy_from_pb(subject).validate()
        for algorithm, value in subject.digest.items():
            if algorithm in HEX_DIGESTS:
                assert re.fullmatch(f"[0-9a-f]{{{HEX_DIGESTS[algorithm]}}}", value), subject
    return statement


def envelope_statement(path: Path) -> Statement:
    """The in-toto Statement of the DSSE envelope in the file at ``path``."""
    envelope = json.loads(path.read_bytes())
    assert envelope["payloadType"] == IN_TOTO_PAYLOAD_TYPE
    return in_toto(base64.b64decode(envelope["payload"], validate=True))


def subjects(statement: Statement) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, dict(s.digest)) for s in statement.pb.subject]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_runs_checkpoint_manifests_are_in_toto_statements(attested: Path, repo: Path) -> None:
    manifests = sorted(attested.glob("step-*.h5.kaudit.json"))
    assert len(manifests) == 3
    for path in manifests:
        statement = envelope_statement(path)
        assert statement.pb.predicate_type == "https://kronos-audit.dev/checkpoint-manifest/v1"
        ((name, digest),) = subjects(statement)
        checkpoint = checkpoint_path_for(path)
        assert name == checkpoint.relative_to(repo).as_posix()
        assert digest["sha256"] == sha256(checkpoint)
        assert set(digest) == {"sha256", "md5"}  # md5: DVC's address of the same bytes
        assert statement.pb.predicate["step"] == int(path.name[5:13])


def test_a_sharded_step_manifest_is_an_in_toto_statement(project: Project, key: SigningKey) -> None:
    manifest = sharded_step(project, key, 5, 2)
    statement = envelope_statement(manifest.path)
    ((name, digest),) = subjects(statement)
    index = checkpoint_path_for(manifest.path)  # the shard index the step manifest signs
    assert name == index.relative_to(project.root).as_posix()
    assert digest["sha256"] == sha256(index)
    assert statement.pb.predicate["shards"]["count"] == 2


def test_a_replay_attestation_is_an_in_toto_statement(attested: Path, repo: Path) -> None:
    statement = envelope_statement(attested / "step-00000020.h5.replay.json")
    assert statement.pb.predicate_type == "https://kronos-audit.dev/replay/v1"
    target = attested / "step-00000020.h5.kaudit.json"
    assert subjects(statement) == [
        (target.relative_to(repo).as_posix(), {"sha256": sha256(target)}),
        (
            checkpoint_path_for(target).relative_to(repo).as_posix(),
            {"sha256": sha256(checkpoint_path_for(target))},
        ),
    ]
    assert statement.pb.predicate["outcome"] == "REPRODUCED"


def test_a_revocation_is_no_in_toto_statement_and_says_so(
    project: Project, key: SigningKey
) -> None:
    done = run_cli("keys", "revoke", key.key_id[:12], "--reason", "lost", cwd=project.root)
    assert done.exit_code == 0, done.output
    path = project.root / ".kaudit" / "revocations" / f"{key.key_id}.json"
    envelope = json.loads(path.read_bytes())
    # DSSE's payloadType says how to read the payload: kaudit's own, never in-toto's
    assert envelope["payloadType"] == REVOCATION_PAYLOAD_TYPE != IN_TOTO_PAYLOAD_TYPE
    with pytest.raises(json_format.ParseError):  # and read as one all the same, it is none
        in_toto(base64.b64decode(envelope["payload"]))


def _no_digest(s: dict[str, Any]) -> None:
    del s["subject"][0]["digest"]


def _empty_digest(s: dict[str, Any]) -> None:
    s["subject"][0]["digest"] = {}


def _upper_case_digest(s: dict[str, Any]) -> None:
    s["subject"][0]["digest"]["sha256"] = s["subject"][0]["digest"]["sha256"].upper()


def _wrong_type(s: dict[str, Any]) -> None:
    s["_type"] = "https://in-toto.io/Statement/v0.1"


def _no_subject(s: dict[str, Any]) -> None:
    s["subject"] = []


def _unknown_field(s: dict[str, Any]) -> None:
    s["subjects"] = s.pop("subject")


@pytest.mark.parametrize(
    "spoil",
    [_no_digest, _empty_digest, _upper_case_digest, _wrong_type, _no_subject, _unknown_field],
)
def test_the_check_refuses_what_the_spec_refuses(attested: Path, spoil: Any) -> None:
    """The check above can fail: a manifest's statement, spoiled as a writer could spoil
    it, is refused."""
    envelope = json.loads((attested / "step-00000010.h5.kaudit.json").read_bytes())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    in_toto(json.dumps(statement).encode())  # as written, it passes
    spoiled = copy.deepcopy(statement)
    spoil(spoiled)
    with pytest.raises((json_format.ParseError, ValueError, AssertionError)):
        in_toto(json.dumps(spoiled).encode())
