"""A long run verified on every core: a checkpoint's content checked by a worker process
ahead of the verifier is checked as fully as one checked in the verifier. A step tampered
with anywhere in the run is named, for what was done to it, whichever way it was checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.layout import checkpoint_name
from kronos_audit.errors import Error
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.verification.batch import verify_each
from kronos_audit.verification.content import Ahead, SignedFile, check_file
from kronos_audit.verification.results import VerifyResult
from tests.helpers import untrusted_key

STEPS = 60
CHANGED_BYTES, FORGED_SIGNATURE, CUT_LINK = 17, 33, 48
"""The steps tampered with: anywhere but the ends."""


def _manifest(run: Path, step: int) -> Path:
    return run / f"{checkpoint_name(step)}.kaudit.json"


def _failed(results: list[VerifyResult | Error]) -> dict[int, set[str]]:
    """Each failed step's failed checks, by name."""
    out: dict[int, set[str]] = {}
    for r in results:
        assert isinstance(r, VerifyResult), r
        if not r.ok:
            out[r.step] = {c.name for c in r.failures}
    return out


def test_a_tampered_step_anywhere_in_a_long_run_is_named_by_the_workers_too(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("long", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as run:
        state = {"w": np.zeros(64)}
        for step in run.steps(STEPS):
            state["w"][0] = step
            run.checkpoint(step, state)
    directory = root / "long"

    # Its bytes: one value of /w changed in place, at the extent its manifest signs.
    changed = read_manifest(_manifest(directory, CHANGED_BYTES))
    (w,) = [d for d in changed.datasets or () if d.path == "/w"]
    assert w.extent is not None
    checkpoint = changed.checkpoint_path
    checkpoint.chmod(0o644)
    data = bytearray(checkpoint.read_bytes())
    data[w.extent[0] + 8] ^= 0x40
    checkpoint.write_bytes(bytes(data))
    # Its signature: the same statement, signed by a key nobody trusts.
    forged = _manifest(directory, FORGED_SIGNATURE)
    payload = read_manifest(forged).envelope.payload
    forged.write_bytes(encode_envelope(sign_envelope(payload, untrusted_key("mallory"))))
    # Its link: signed by the trusted key, but naming a parent that is none of the run's.
    cut = _manifest(directory, CUT_LINK)
    statement = json.loads(read_manifest(cut).envelope.payload)
    statement["predicate"]["parent"] = "0" * 64
    cut.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))

    expected = {
        CHANGED_BYTES: {"file digest", "dataset /w"},
        FORGED_SIGNATURE: {"signature"},
        FORGED_SIGNATURE + 1: {"parent link"},  # its parent's bytes are not the ones linked
        CUT_LINK: {"parent link"},
        CUT_LINK + 1: {"parent link"},
    }
    # Every later step's chain passes through the tampered ones.
    for step in range(CHANGED_BYTES + 1, STEPS + 1):
        expected.setdefault(step, set())
    for step in range(FORGED_SIGNATURE + 1, STEPS + 1):
        expected[step].add("parent link")
    expected = {s: c for s, c in expected.items() if c}

    by_workers = list(verify_each([directory], ahead=1, standing=project.root))
    in_process = list(verify_each([directory], ahead=0, standing=project.root))
    assert len(by_workers) == len(in_process) == STEPS
    assert _failed(by_workers) == expected
    assert _failed(in_process) == expected
    # The same checks, word for word, whoever made them.
    for a, b in zip(by_workers, in_process, strict=True):
        assert isinstance(a, VerifyResult)
        assert isinstance(b, VerifyResult)
        assert a.checks == b.checks


@pytest.mark.parametrize("ahead", [1, 0])
def test_a_checkpoint_gone_is_the_verifiers_error_either_way(
    project: Project, key: SigningKey, ahead: int
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("short", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"w": np.full(4, float(step))})
    gone = read_manifest(_manifest(root / "short", 2)).checkpoint_path
    gone.unlink()
    results = list(verify_each([root / "short"], ahead=ahead, fetch=False, standing=project.root))
    (error,) = [r for r in results if isinstance(r, Error)]
    assert error.exit_code == 2
    assert "not found" in str(error)


def test_files_no_worker_took_yet_are_checked_by_the_verifier_as_a_worker_would(
    project: Project, key: SigningKey
) -> None:
    """A verifier that would wait for a worker checks the files waiting for one itself:
    the chunk furthest ahead while a worker has the one it needs. Every answer is the
    check :func:`check_file` makes, whoever made it, and a file changed is named."""
    root = project.root / "checkpoints"
    with ka.Run("pairs", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as run:
        for step in run.steps(8):
            run.checkpoint(step, {"w": np.full(4, float(step))})
    files = [SignedFile.of(read_manifest(_manifest(root / "pairs", s))) for s in range(1, 9)]
    files[6].path.chmod(0o644)
    files[6].path.write_bytes(files[6].path.read_bytes()[:-1] + b"\x01")  # the 7th's last byte
    ahead = Ahead(1)
    try:
        for i in range(0, 8, 2):  # four chunks: a worker takes two, two wait here
            ahead.submit(files[i : i + 2])
        made = [ahead.take(f) for f in files]  # at once: the worker is still starting
    finally:
        ahead.close()
    assert made == [check_file(f) for f in files]
    # The last chunk at least was taken from the back while the worker started; the
    # worker had the first (given it as soon as it was submitted).
    assert 2 <= ahead.checked_here < 8
    assert [all(c.ok for c in checks or ()) for checks in made] == [True] * 6 + [False, True]
