"""The reference corpus (corpus/README.md): signed runs that an earlier version of
kronos-audit wrote, which this one must still verify, restore and replay. On a fresh clone
of this repository, with nothing but what is committed, the data fetched from the DVC
remote that ships inside it: `kaudit gate` (its [gate] from the committed config, its
trust from the git objects of the commit checked out) verifies every manifest, attestation
and certificate and replays the newest segment of each run; then every run is restored
with `ka.Run`."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import load_public_key
from kronos_audit.statement.dsse import key_id
from tests.helpers import KAUDIT, git
from tests.parallel.launch import launcher_env

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = sorted(p.name for p in (ROOT / "corpus").glob("v*") if p.is_dir())
RUNS = {"heat": 40, "heat-mpi": 40, "torch-train": 20, "pi": 8}
"""Each run of every corpus version and its newest step."""
ARRAY_TASKS = ("corpus/arrays/pi-array.task-0", "corpus/arrays/pi-array.task-1")
"""The job array's tasks (corpus/arrays), each a run the gate replays too."""


def run_id(version: str, run: str) -> str:
    """The run's id in a corpus version: from v2 on it ends in the version (``heat-v2``),
    since a DVC remote keeps one chain per run id."""
    return run if version == "v1" else f"{run}-{version}"


CORPUS_KEYS = {
    "kronos-audit-corpus": "e8eac2bd99b6ab51e74d463c20c7c07de72b323c0376404864cd7176259e543a",
    "kronos-audit-corpus-2": "ff0b8e079ed1a68c16d185947c799bcbc48129758651264cf7c496380113bc5e",
    "kronos-audit-corpus-4": "e7e2db72722d119c0eabd8893ebec390ebe60d1b58c021ee84d4da87bcad280a",
}
"""The corpus keys by name and key id, pinned here, outside the corpus and its trust store:
a change that re-keys the store and re-signs a version does not pass the gate's test."""
TOLERATED = {"corpus/v1/torch-train"}
"""Runs the committed [gate] judges with a tolerance (recorded before kaudit pinned the
CPU's dispatch); every other run must replay bitwise, on any x86-64-v3 CPU."""

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


def test_the_repository_trusts_the_corpus_keys_alone() -> None:
    """What the repository's own trust store holds is the corpus keys, each the key pinned
    here: a key a test made (`kaudit keys generate` run here) must never be committed
    beside them, and a store re-keyed in a change is caught."""
    trusted = git(ROOT, "ls-files", ".kaudit/trusted-keys").split()
    assert trusted == sorted(f".kaudit/trusted-keys/{name}.pub" for name in CORPUS_KEYS)
    for name, pinned in CORPUS_KEYS.items():
        public = load_public_key(ROOT / ".kaudit" / "trusted-keys" / f"{name}.pub")
        assert key_id(public) == pinned, name


def test_every_version_of_the_corpus_is_gated() -> None:
    gated = (ROOT / ".kaudit" / "config.toml").read_text()
    assert VERSIONS, "no corpus version"
    for version in [*VERSIONS, "arrays"]:
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
    replays = {_run_of(c["name"]): c for c in cases if c["kind"] == "replay"}
    expected = sorted(
        [*(f"corpus/{v}/{run_id(v, r)}" for v in VERSIONS for r in RUNS), *ARRAY_TASKS]
    )
    assert sorted(replays) == expected, cases
    for run, case in replays.items():
        if run in TOLERATED:  # judged with the committed tolerance, and says why
            assert "judged with a tolerance: corpus/v1/torch-train" in case["message"], case
        else:  # bitwise, whatever CPU this is
            assert case["message"].startswith("REPRODUCED: "), case
            assert "tolerance" not in case["message"], case
    verified = {c["name"] for c in cases if c["kind"] != "replay"}
    for v in VERSIONS:
        for name in (
            f"{run_id(v, 'heat-mpi')}/step-00000040",
            f"{run_id(v, 'heat')}/step-00000040.h5.replay.json",
            f"{run_id(v, 'pi')}.campaign.json",
        ):
            assert any(f"corpus/{v}/{name}" in c for c in verified), (name, verified)
    assert any(ARRAY in c for c in verified), verified  # the array's certificate, whole
    assert all(c["ok"] for c in cases), [c for c in cases if not c["ok"]]
    assert doc["config"]["tolerances"][0]["pattern"] == "corpus/v1/torch-train"


ARRAY = "corpus/arrays/pi-array.campaign.json"
"""A job array's certificate of the third version (campaign/v3) and its two tasks."""


def test_an_arrays_certificate_of_the_third_version_verifies_sampled_from_a_fresh_clone(
    clone: Path,
) -> None:
    """The gate verifies it whole and replays its tasks; here a sample of it, with the trust
    store of the commit checked out, its records and the tasks' checkpoints the sample needs
    fetched from the corpus remote."""
    head = git(clone, "rev-parse", "HEAD").strip()
    records = clone / "corpus" / "arrays" / "pi-array.records"
    done = subprocess.run(
        [*KAUDIT, "verify", "--trust-ref", head, "--json", "--sample", "2", ARRAY],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (result,) = json.loads(done.stdout)["results"]
    manifest = next(c["detail"] for c in result["checks"] if c["check"] == "manifest")
    assert re.match(r"[12] of 2 part\(s\), those the sample needs", manifest), manifest
    statement = json.loads(base64.b64decode(json.loads((clone / ARRAY).read_text())["payload"]))
    assert statement["predicateType"] == "https://kronos-audit.dev/campaign/v3"
    assert len(list(records.iterdir())) == 4  # the batches' and the parts' index and chunk


def _run_of(manifest: str) -> str:
    """``corpus/v2/heat-v2`` of ``corpus/v2/heat-v2/step-00000040.h5.kaudit.json`` (or of
    a sharded step's ``corpus/v2/heat-mpi-v2/step-00000040/index.jsonl.kaudit.json``)."""
    return "/".join(Path(manifest).parts[:3])


def test_every_run_of_the_corpus_restores(clone: Path) -> None:
    # A run restores with the key it would sign with: the user's own, whoever signed before.
    made = subprocess.run(
        [*KAUDIT, "keys", "generate", "-q"], cwd=clone, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    for name in CORPUS_KEYS:
        trusted = subprocess.run(
            [*KAUDIT, "keys", "trust", "--user", f".kaudit/trusted-keys/{name}.pub"],
            cwd=clone,
            capture_output=True,
            text=True,
        )
        assert trusted.returncode == 0, trusted.stderr
    pulled = subprocess.run(
        [*KAUDIT, "pull", *(f"corpus/{v}" for v in VERSIONS)],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    for version, (name, step) in ((v, r) for v in VERSIONS for r in RUNS.items()):
        run = run_id(version, name)
        with ka.Run(run, root=clone / "corpus" / version, seed=0) as r:
            state = r.restore()
            assert r.step == step, run
            assert state is not None, run
            if name == "heat-mpi":  # two ranks' blocks, re-cut for this one process
                assert np.asarray(state["fields"]["u"]).shape == (16, 16)
            if name == "pi":
                assert r.ledger.indices() == list(range(8))
