"""The comparison an attestation records, read back: attestations written before it was
recorded still read, and say that where their policy came from is not recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.statement.attestation import read_attestation

CORPUS = Path(__file__).resolve().parents[2] / "corpus"


@pytest.mark.parametrize(
    "name", ["v1/heat/step-00000040.h5.replay.json", "v2/heat-v2/step-00000040.h5.replay.json"]
)
def test_an_attestation_from_before_the_record_reads_and_says_so(name: str) -> None:
    comparison = read_attestation(CORPUS / name).replay.comparison
    assert comparison.source is None
    assert comparison.datasets is None
    assert comparison.bitwise
    assert comparison.lines() == ["exact (bitwise) (where it came from is not recorded)"]
