"""Ed25519 keys, the trust store and DSSE envelopes (kronos_audit.keys.keyfile)."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib import dsse
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from kronos_audit.errors import ManifestError, SigningKeyError
from kronos_audit.keys.home import generate_key, held_keys, key_dir, select_key
from kronos_audit.keys.keyfile import load_public_key
from kronos_audit.keys.store import TrustStore, verify_envelope
from kronos_audit.statement.dsse import (
    PAYLOAD_TYPE,
    Envelope,
    Signature,
    key_id,
    pae,
    parse_envelope,
    sign_envelope,
)


def raw_public(private_key: Ed25519PrivateKey) -> bytes:
    return private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def test_pae_matches_the_dsse_specification_test_vector() -> None:
    assert (
        pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_pae_counts_bytes_not_characters() -> None:
    assert pae("t/\u00e9", "\u00e9".encode()) == b"DSSEv1 4 t/\xc3\xa9 2 \xc3\xa9"


def test_pae_agrees_with_securesystemslib() -> None:
    payload = b'{"a": 1}'
    theirs = dsse.Envelope(payload, PAYLOAD_TYPE, {}).pae()
    assert pae(PAYLOAD_TYPE, payload) == theirs


def test_key_id_is_the_sha256_of_the_raw_public_key() -> None:
    private_key = Ed25519PrivateKey.generate()
    assert key_id(private_key.public_key()) == hashlib.sha256(raw_public(private_key)).hexdigest()


def test_generate_key_writes_a_0600_private_key_in_kaudit_home(kaudit_home: Path) -> None:
    k = generate_key("alice")
    private_path = kaudit_home / "keys" / "alice.key"
    assert key_dir() == kaudit_home / "keys"
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    loaded = serialization.load_pem_private_key(private_path.read_bytes(), password=None)
    assert isinstance(loaded, Ed25519PrivateKey)
    assert k.key_id == hashlib.sha256(raw_public(loaded)).hexdigest()
    assert key_id(load_public_key(kaudit_home / "keys" / "alice.pub")) == k.key_id
    assert [(e.name, e.key_id) for e in held_keys()] == [("alice", k.key_id)]
    assert not list((kaudit_home / "keys").glob(".kaudit-tmp-*"))


def test_generate_key_refuses_to_replace_an_existing_key(kaudit_home: Path) -> None:
    first = generate_key("alice")
    before = (kaudit_home / "keys" / "alice.key").read_bytes()
    with pytest.raises(SigningKeyError, match="exists already") as info:
        generate_key("alice")
    assert info.value.exit_code == 2
    assert info.value.path == kaudit_home / "keys" / "alice.key"
    assert (kaudit_home / "keys" / "alice.key").read_bytes() == before
    assert select_key("alice").key_id == first.key_id


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "x" * 65, "sp ace"])
def test_generate_key_rejects_unsafe_names(name: str, kaudit_home: Path) -> None:
    with pytest.raises(SigningKeyError, match="invalid key name"):
        generate_key(name)
    assert not list(kaudit_home.rglob("*.key"))


def test_select_key_with_no_key_held_says_how_to_make_one() -> None:
    with pytest.raises(SigningKeyError, match="kaudit keys generate"):
        select_key()


def test_select_key_picks_the_only_key_held() -> None:
    k = generate_key("only")
    assert select_key().key_id == k.key_id


def test_select_key_with_several_keys_names_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    a = generate_key("alice")
    b = generate_key("bob")
    with pytest.raises(SigningKeyError, match="several signing keys") as info:
        select_key()
    assert "alice" in str(info.value)
    assert "bob" in str(info.value)
    assert select_key("bob").key_id == b.key_id
    monkeypatch.setenv("KAUDIT_KEY", "alice")
    assert select_key().key_id == a.key_id
    # An explicit name wins over the environment.
    assert select_key("bob").key_id == b.key_id


def test_select_key_naming_a_key_not_held_lists_the_held_ones() -> None:
    generate_key("alice")
    with pytest.raises(SigningKeyError, match=r"no signing key named 'carol'.*alice"):
        select_key("carol")


def test_select_key_reports_a_corrupt_private_key(kaudit_home: Path) -> None:
    generate_key("alice")
    (kaudit_home / "keys" / "alice.key").write_text("not a key\n")
    with pytest.raises(SigningKeyError, match="not a PEM private key"):
        select_key("alice")


def test_load_public_key_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match="cannot read public key") as info:
        load_public_key(tmp_path / "missing.pub")
    assert info.value.path == tmp_path / "missing.pub"
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("hello\n")
    with pytest.raises(SigningKeyError, match="not a PEM public key"):
        load_public_key(garbage)


def test_trust_store_adds_once_and_refuses_name_clashes(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "trusted")
    assert store.entries() == {}
    k1 = Ed25519PrivateKey.generate().public_key()
    k2 = Ed25519PrivateKey.generate().public_key()
    entry = store.add(k1, "alice")
    assert entry.path == tmp_path / "trusted" / "alice.pub"
    assert store.add(k1, "alias") == entry  # trusting twice is a no-op
    assert not (tmp_path / "trusted" / "alias.pub").exists()
    with pytest.raises(SigningKeyError, match="another key is trusted under this name"):
        store.add(k2, "alice")
    # A fresh store reads what was written.
    assert set(TrustStore(tmp_path / "trusted").entries()) == {key_id(k1)}


def test_signed_envelope_verifies_under_the_trusted_key(tmp_path: Path) -> None:
    k = generate_key("alice")
    store = TrustStore(tmp_path / "trusted")
    store.add(k.private_key.public_key(), "alice")
    envelope = sign_envelope(b"payload", k)
    assert envelope.signatures[0].keyid == k.key_id
    check = verify_envelope(envelope, store)
    assert check.ok
    assert check.signers == (k.key_id,)


def test_untrusted_key_is_rejected_and_named(tmp_path: Path) -> None:
    trusted = generate_key("alice")
    stranger = generate_key("mallory")
    store = TrustStore(tmp_path / "trusted")
    store.add(trusted.private_key.public_key(), "alice")
    check = verify_envelope(sign_envelope(b"payload", stranger), store)
    assert not check.ok
    assert "does not trust" in check.detail
    assert stranger.key_id[:16] in check.detail


def test_changed_payload_or_payload_type_breaks_the_signature(tmp_path: Path) -> None:
    k = generate_key("alice")
    store = TrustStore(tmp_path / "trusted")
    store.add(k.private_key.public_key(), "alice")
    envelope = sign_envelope(b"payload", k)
    for forged in (
        Envelope(envelope.payload_type, b"payloaD", envelope.signatures),
        Envelope("text/plain", envelope.payload, envelope.signatures),
    ):
        check = verify_envelope(forged, store)
        assert not check.ok
        assert "does not match" in check.detail


def test_keyid_is_only_a_hint(tmp_path: Path) -> None:
    k = generate_key("alice")
    store = TrustStore(tmp_path / "trusted")
    store.add(k.private_key.public_key(), "alice")
    sig = sign_envelope(b"payload", k).signatures[0]
    for hint in ("", "0" * 64):
        envelope = Envelope(PAYLOAD_TYPE, b"payload", (Signature(hint, sig.sig),))
        assert verify_envelope(envelope, store).signers == (k.key_id,)


def test_envelope_without_signatures_fails(tmp_path: Path) -> None:
    check = verify_envelope(Envelope(PAYLOAD_TYPE, b"x", ()), TrustStore(tmp_path))
    assert not check.ok
    assert "no signature" in check.detail


def test_envelope_round_trips_through_json() -> None:
    k = generate_key("alice")
    envelope = sign_envelope(b'{"hello": "world"}', k)
    assert parse_envelope(json.loads(json.dumps(envelope.to_json_obj()))) == envelope


def test_parse_envelope_accepts_url_safe_base64() -> None:
    payload = b"\xfb\xff\xfe"  # standard base64 "+//+", URL-safe "-__-"
    obj = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.urlsafe_b64encode(payload).decode(),
        "signatures": [{"sig": base64.urlsafe_b64encode(b"\xfb\xff").decode()}],
    }
    envelope = parse_envelope(obj)
    assert envelope.payload == payload
    assert envelope.signatures == (Signature("", b"\xfb\xff"),)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "top level is not an object"),
        ({"payload": "", "signatures": []}, "no 'payloadType'"),
        ({"payloadType": PAYLOAD_TYPE, "signatures": []}, "no 'payload'"),
        ({"payloadType": PAYLOAD_TYPE, "payload": ""}, "no 'signatures'"),
        ({"payloadType": 1, "payload": "", "signatures": []}, "payloadType is not a string"),
        ({"payloadType": "t", "payload": "", "signatures": {}}, "signatures is not a list"),
        ({"payloadType": "t", "payload": "", "signatures": [{}]}, r"signatures\[0\] has no"),
        ({"payloadType": "t", "payload": "@@", "signatures": []}, "payload is not base64"),
        ({"payloadType": "t", "payload": 5, "signatures": []}, "payload is not a string"),
        (
            {"payloadType": "t", "payload": "", "signatures": [{"sig": "", "keyid": 3}]},
            r"signatures\[0\]\.keyid",
        ),
    ],
)
def test_parse_envelope_rejects_what_is_not_one(obj: object, message: str) -> None:
    with pytest.raises(ManifestError, match=message) as info:
        parse_envelope(obj, Path("m.kaudit.json"))
    assert info.value.exit_code == 2
    assert str(info.value).startswith("m.kaudit.json: ")


def test_securesystemslib_verifies_a_kaudit_envelope_and_rejects_a_forgery() -> None:
    k = generate_key("alice")
    obj = sign_envelope(b'{"x": 1}', k).to_json_obj()
    public = SSlibKey.from_crypto(k.private_key.public_key(), keyid=k.key_id)
    accepted = dsse.Envelope.from_dict(json.loads(json.dumps(obj))).verify([public], 1)
    assert set(accepted) == {k.key_id}
    forged = json.loads(json.dumps(obj))
    forged["payload"] = base64.b64encode(b'{"x": 2}').decode()
    with pytest.raises(VerificationError):
        dsse.Envelope.from_dict(forged).verify([public], 1)
