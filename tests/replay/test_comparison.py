"""A replay's comparison by digests (kronos_audit.replay.comparison): its verdicts and words,
the same differences ``kaudit verify`` finds, and the typed values a replay reports
(Basis, Stage) keeping the strings its JSON and messages always had."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint import layout
from kronos_audit.checkpoint.hashing import DatasetDigest, array_digest, digest_file
from kronos_audit.compare import TolerancePolicy, Verdict
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay import Basis, checkpoint_name
from kronos_audit.replay.comparison import compare_digests, compare_output
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.verification.steps import compare_datasets
from tests.helpers import write_checkpoint


def digests(**arrays: np.ndarray[Any, Any]) -> tuple[DatasetDigest, ...]:
    return tuple(array_digest("/" + name, a) for name, a in arrays.items())


X = np.arange(6.0)
RECORDED = digests(u=X, v=X, w=X, gone=X, lost=X)
REPLAYED = digests(w=X + 1, v=X.reshape(3, 2), u=X.copy(), new=X.astype(np.float32))


def test_each_dataset_gets_a_verdict_and_words_sorted_by_path() -> None:
    results = compare_digests(RECORDED, REPLAYED)
    assert [(r.path, r.verdict) for r in results] == [
        ("/gone", Verdict.ONLY_IN_A),
        ("/lost", Verdict.ONLY_IN_A),
        ("/new", Verdict.ONLY_IN_B),
        ("/u", Verdict.IDENTICAL),
        ("/v", Verdict.NOT_COMPARABLE),
        ("/w", Verdict.DIFFERENT),
    ]
    by_path = {r.path: r for r in results}
    assert by_path["/gone"].detail == "recorded, but not produced"
    assert by_path["/gone"].replayed is None
    assert by_path["/new"].detail == "produced, but not recorded"
    assert by_path["/new"].recorded is None
    assert by_path["/u"].detail is None
    assert by_path["/u"].recorded == RECORDED[0]
    assert by_path["/u"].replayed == REPLAYED[2]
    assert by_path["/v"].detail == "replayed <f8[3, 2], recorded <f8[6]"
    w_rec, w_rep = RECORDED[2].sha256, REPLAYED[0].sha256
    assert by_path["/w"].detail == (
        f"content hash {w_rep[:16]}... differs from the recorded {w_rec[:16]}..."
    )
    assert all(r.comparison is None for r in results)  # the hashes alone decided


def test_a_null_dataspace_is_named_as_such() -> None:
    null = DatasetDigest("/n", "<f8", None, "0" * 64)
    (r,) = compare_digests((null,), (DatasetDigest("/n", "<f8", (0,), "0" * 64),))
    assert r.verdict is Verdict.NOT_COMPARABLE
    assert r.detail == "replayed <f8[0], recorded <f8[null]"


def test_replay_and_verify_find_the_same_differences() -> None:
    failed_in_replay = {r.path for r in compare_digests(RECORDED, REPLAYED) if not r.ok}
    checks = compare_datasets(RECORDED, REPLAYED)
    assert {c.name.removeprefix("dataset ") for c in checks} == failed_in_replay
    assert not any(c.ok for c in checks)
    assert all(r.ok for r in compare_digests(RECORDED, RECORDED))
    assert compare_datasets(RECORDED, RECORDED)[0].ok


def test_basis_follows_the_policy_and_keeps_its_json_value() -> None:
    assert Basis.for_policy(TolerancePolicy()) is Basis.HASHES
    assert Basis.for_policy(TolerancePolicy.from_options(rtol=1e-12)) is Basis.DATA
    assert Basis.for_policy(TolerancePolicy.from_options(tol=["x:exact"])) is Basis.DATA
    assert json.dumps([Basis.HASHES.value, Basis.DATA.value]) == '["hashes", "data"]'


def test_stages_keep_the_values_messages_and_json_show() -> None:
    assert [s.value for s in Stage] == [
        "verify",
        "environment",
        "code",
        "data",
        "run",
        "output",
        "compare",
    ]
    with pytest.raises(ReplayError) as info:
        raise ReplayError("refused", path="m.json", stage=Stage.RUN)
    assert info.value.stage is Stage.RUN
    stage: str = info.value.stage  # a StrEnum: equal to the string it names
    assert stage == "run"
    assert f"{info.value.stage}: {info.value}" == "run: m.json: refused"


def test_a_checkpoint_has_one_name_for_a_run_and_a_replay() -> None:
    assert checkpoint_name is layout.checkpoint_name
    assert checkpoint_name(42) == "step-00000042.h5"


def test_a_tolerance_replay_compares_the_recorded_file_only_as_its_signed_bytes(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    """Recorded data read for a tolerance comparison is opened once and checked against
    the signed size and sha256 first: a file renamed over the verified checkpoint (here,
    a copy of what the replay produced, which would compare equal) is refused."""
    recorded = write_checkpoint(project.root / "checkpoints" / "r" / "step-00000001.h5", 1)
    (m,) = snapshot(recorded, run="r", step=1, key=key)
    produced = shutil.copyfile(recorded, tmp_path / "step-00000001.h5")
    with h5py.File(produced, "r+") as f:
        f["fields/u"][0, 0] += 1.0
    produced_digests = digest_file(produced)
    policy = TolerancePolicy()
    results = compare_output(m, produced, produced_digests, policy, Basis.DATA)
    assert [r.path for r in results if not r.ok] == ["/fields/u"]
    swapped = recorded.with_name("swapped")
    shutil.copyfile(produced, swapped)
    os.replace(swapped, recorded)
    with pytest.raises(CheckpointError, match="changed after it was verified"):
        compare_output(m, produced, produced_digests, policy, Basis.DATA)
