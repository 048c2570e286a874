"""The reference corpus (corpus/README.md): signed runs that an earlier version of
kronos-audit wrote, which this one must still verify, restore and replay. On a fresh clone
of this repository, with nothing but what is committed, the data fetched from the DVC
remote that ships inside it: `kaudit gate` (its [gate] from the committed config, its
trust from the git objects of the commit checked out) verifies every manifest, attestation
and certificate and replays the newest segment of each run; then every run is restored
with `ka.Run`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from tests.helpers import KAUDIT, git
from tests.parallel.launch import launcher_env

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = sorted(p.name for p in (ROOT / "corpus").glob("v*") if p.is_dir())
RUNS = {"heat": 40, "heat-mpi": 40, "torch-train": 20, "pi": 8}
"""Each run of corpus/v1 and its newest step."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of this repository's committed state, as CI has it."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the corpus is tested from its repository")
    if not git(ROOT, "ls-files", "corpus/v1"):
        pytest.fail("corpus/v1 is not committed", pytrace=False)
    where = tmp_path_factory.mktemp("corpus") / "kronos-audit"
    git(ROOT.parent, "clone", "-q", "--no-hardlinks", str(ROOT), str(where))
    return where


def test_the_repository_trusts_the_corpus_key_alone() -> None:
    """What the repository's own trust store holds is the corpus key: a key a test made
    (`kaudit keys generate` run here) must never be committed beside it."""
    trusted = git(ROOT, "ls-files", ".kaudit/trusted-keys").split()
    assert trusted == [".kaudit/trusted-keys/kronos-audit-corpus.pub"]


def test_every_version_of_the_corpus_is_gated() -> None:
    gated = (ROOT / ".kaudit" / "config.toml").read_text()
    assert VERSIONS, "no corpus version"
    for version in VERSIONS:
        assert f'"corpus/{version}/*"' in gated, f"corpus/{version} is not in [gate] runs"


def test_the_gate_verifies_and_replays_the_corpus_from_a_fresh_clone(clone: Path) -> None:
    newest = clone / "corpus" / "v1" / "heat" / "step-00000040.h5"
    assert not newest.exists()  # the bytes are not committed: the gate fetches them
    head = git(clone, "rev-parse", "HEAD").strip()  # the commit checked out, in full
    gate = subprocess.run(
        [*KAUDIT, "gate", "--trust-ref", head, "--json"],
        cwd=clone,
        capture_output=True,
        text=True,
        env=launcher_env(),  # the MPI run's replay runs mpiexec, as root in CI containers
    )
    assert gate.returncode == 0, gate.stdout[-4000:] + gate.stderr[-4000:]
    doc = json.loads(gate.stdout)
    assert doc["verdict"] == "PASSED", doc["failures"]
    assert newest.exists()  # fetched from corpus/remote, inside the clone
    cases = doc["cases"]
    replays = sorted(c["run"] for c in cases if c["kind"] == "replay")
    assert replays == sorted(RUNS), cases
    verified = {c["name"] for c in cases if c["kind"] != "replay"}
    for name in ("heat-mpi/step-00000040", "heat/step-00000040.h5.replay.json", "pi.campaign.json"):
        assert any(name in v for v in verified), (name, verified)
    assert all(c["ok"] for c in cases), [c for c in cases if not c["ok"]]


def test_every_run_of_the_corpus_restores(clone: Path) -> None:
    # A run restores with the key it would sign with: the user's own, whoever signed before.
    made = subprocess.run(
        [*KAUDIT, "keys", "generate", "-q"], cwd=clone, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    trusted = subprocess.run(
        [*KAUDIT, "keys", "trust", "--user", ".kaudit/trusted-keys/kronos-audit-corpus.pub"],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert trusted.returncode == 0, trusted.stderr
    pulled = subprocess.run(
        [*KAUDIT, "pull", "corpus/v1"], cwd=clone, capture_output=True, text=True
    )
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    for run, step in RUNS.items():
        with ka.Run(run, root=clone / "corpus" / "v1", seed=0) as r:
            state = r.restore()
            assert r.step == step, run
            assert state is not None, run
            if run == "heat-mpi":  # two ranks' blocks, re-cut for this one process
                assert np.asarray(state["fields"]["u"]).shape == (16, 16)
            if run == "pi":
                assert r.ledger.indices() == list(range(8))
