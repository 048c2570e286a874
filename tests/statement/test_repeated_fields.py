"""A run's manifests repeat predicate fields (the environment lock above all): a field
whose JSON text was read, validated and frozen before is taken as it was, not read again
(kronos_audit.statement.manifest, kronos_audit._internal.strictjson.loads_reusing). What a
manifest reads as is still exactly what the strict reader reads, and what that refuses is
refused, in its words, whatever text a hostile writer puts around a known one."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from kronos_audit._internal import strictjson
from kronos_audit._internal.frozen import thaw
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement import manifest as manifests
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import MAX_DEPTH, Manifest, load_json, parse_manifest
from kronos_audit.statement.schemas import validate

WHERE = Path("m.kaudit.json")


@pytest.fixture
def signed(project: Project, key: SigningKey, checkpoint: Path) -> tuple[Manifest, str]:
    """A real manifest, read once (so its repeated fields' texts are known), and its
    payload's text."""
    (m,) = snapshot(checkpoint, run="r", step=1, attributes={"note": "x"})
    first = parse_manifest(m.path.read_bytes(), m.path)
    return first, first.envelope.payload.decode()


def read(payload: str, key: SigningKey) -> Manifest:
    return parse_manifest(encode_envelope(sign_envelope(payload.encode(), key)), WHERE)


def strictly(payload: str) -> Any:
    """What the strict reader, then the schema, make of ``payload``: its statement, or
    the ManifestError's message."""
    try:
        statement = load_json(payload.encode(), WHERE, "payload")
        validate(statement, WHERE)
    except ManifestError as e:
        return str(e)
    return statement


def as_json(value: Any) -> str:
    """``value`` as JSON, which tells 0 from 0.0 (equality does not)."""
    return json.dumps(value, sort_keys=True)


def test_a_field_read_again_is_the_very_value_the_strict_reader_reads(
    signed: tuple[Manifest, str], key: SigningKey
) -> None:
    first, payload = signed
    assert manifests._TEXTS["environment"][0] in payload  # known by its text now
    again = read(payload, key)
    environment = again.statement["predicate"]["environment"]
    assert environment is first.statement["predicate"]["environment"]  # taken, not read
    assert as_json(thaw(again.statement)) == as_json(strictly(payload))
    known = manifests._TEXTS["environment"][0]
    spaced = payload.replace(f'"environment":{known}', f'"environment" :\n\t{known} \r\n')
    assert spaced != payload
    again = read(spaced, key)
    assert again.statement["predicate"]["environment"] is environment
    assert as_json(thaw(again.statement)) == as_json(strictly(spaced))
    indented = json.dumps(json.loads(payload), indent=1)  # no text known: all read
    assert as_json(thaw(read(indented, key).statement)) == as_json(strictly(indented))


def test_text_around_a_known_one_is_read_as_the_strict_reader_reads_it(
    signed: tuple[Manifest, str], key: SigningKey
) -> None:
    _, payload = signed
    environment = manifests._TEXTS["environment"][0]
    count = '"restart_count":0'
    payload = payload.replace('"predicate":{', '"predicate":{' + count + ",")
    read(payload, key)
    assert manifests._TEXTS["restart_count"][0] == "0"
    variants = {
        # A known text that is only the start of the value there.
        "longer number": payload.replace(count, count + ".5"),
        "exponent": payload.replace(count, count + "e0"),
        # The known environment twice: a duplicate key, whichever copy is known.
        "duplicate": payload.replace(
            '"environment":', f'"environment":{environment},"environment":'
        ),
        # Nesting past the bound beside it, in a field no manifest had before.
        "deep": payload.replace(
            '"attributes":{', '"attributes":{"x":' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + ","
        ),
        "trailing": payload + "x",
    }
    refused = 0
    for name, text in variants.items():
        expected = strictly(text)
        if not isinstance(expected, str):  # 0e0 is an integer to the schema
            assert as_json(thaw(read(text, key).statement)) == as_json(expected), name
            continue
        refused += 1
        with pytest.raises(ManifestError) as info:
            read(text, key)
        assert str(info.value) == expected, name
    assert refused == len(variants) - 1


def test_any_text_is_read_as_loads_reads_it_or_left_to_loads(signed: tuple[Manifest, str]) -> None:
    """Texts cut, doubled and spaced at random from a real payload: what
    :func:`loads_reusing` reads (when it does not leave the text to :func:`loads`) is what
    :func:`loads` reads, each known text recognised where the payload has it."""
    _, payload = signed
    known = {name: texts[0] for name, texts in manifests._TEXTS.items() if texts}
    values = {name: strictjson.loads(text) for name, text in known.items()}

    def reuse(name: str, text: str, at: int) -> tuple[Any, int] | None:
        k = known.get(name)
        return (values[name], at + len(k)) if k is not None and text.startswith(k, at) else None

    pieces = ["", " ", "\n", ",", ":", '"', "{", "}", "[", "]", "0", "1", "-", "e", "\\"]
    rng = random.Random(40)
    read = agree = 0
    for _ in range(1500):
        text = payload
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text) + 1)
            j = min(len(text), i + rng.choice([0, 0, 1, 2, 5]))
            text = text[:i] + rng.choice([*pieces, text[i:j] * 2]) + text[j:]
        got = strictjson.loads_reusing(text, "predicate", reuse)
        try:
            want: Any = strictjson.loads(text)
        except strictjson.Refused:
            want = None
        if got is not None:
            read += 1
            agree += as_json(got[0]) == as_json(want)
            for name, value_text in got[1].items():  # the text a value was read from
                assert json.loads(value_text) == want["predicate"][name]
    assert agree == read > 100
