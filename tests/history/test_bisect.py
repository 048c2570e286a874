"""Bisecting two real runs (kronos_audit.history.bisect): the planted divergence found exactly, in
about log2(steps) comparisons; tolerances; different cadences; chains that do not verify;
data fetched from a DVC remote; data pruned by retention."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.compare import TolerancePolicy, Verdict
from kronos_audit.errors import BisectError, ManifestError
from kronos_audit.history.bisect import Decision, bisect, first_true, read_chain
from kronos_audit.keys.home import generate_key, select_key, user_trust_dir
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.storage import Storage, configure_remote
from tests.helpers import discard, recorded_project, signed_items

PERTURBATION = 1e-13
PLANTED = 23


def solver(
    project: Project,
    run_id: str,
    *,
    steps: int = 40,
    every: int = 1,
    perturb_from: int | None = None,
    **kw: object,
) -> Path:
    """A small deterministic solver, checkpointed by ka.Run; returns its run directory.

    From step ``perturb_from`` on, PERTURBATION is added to /fields/v after each step, as
    a different environment's rounding would. The update contracts, so the difference
    stays near 1e-13 (relative) instead of growing: rtol=1e-9 absorbs it everywhere.
    At the first perturbed step only /fields/v differs; /fields/u follows a step later.
    """
    root = project.root / "checkpoints"
    with ka.Run(run_id, root=root, seed=7, every=ka.EverySteps(every), **kw) as run:  # type: ignore[arg-type]
        u = run.rng.random((16, 16)) + 1
        v = run.rng.random((16, 16)) + 1
        t = 0.0
        for step in run.steps(steps):
            noise = run.rng.random((16, 16))
            u, v = 0.5 * u + 0.25 * np.roll(v, 1, axis=0) + 0.25 * noise, 0.5 * v + 0.5 * u
            if perturb_from is not None and step >= perturb_from:
                v = v + PERTURBATION
            t += 0.1
            run.checkpoint(step, {"fields": {"u": u, "v": v}, "t": t})
    return root / run_id


def manifest(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}.h5.kaudit.json"


def planted(project: Project) -> tuple[Path, Path]:
    """Run A, and run B perturbed from step PLANTED on: 40 steps, each checkpointed."""
    return solver(project, "env-a"), solver(project, "env-b", perturb_from=PLANTED)


@pytest.fixture
def project(
    request: pytest.FixtureRequest,
    project: Project,
    tmp_path_factory: pytest.TempPathFactory,
    repo_templates: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """conftest's ``project``; for a test that asks for ``runs``, its own copy of one in
    which the two planted runs were recorded once for the whole session (real runs, the
    same as :func:`planted` makes, but 80 signed checkpoints once, not once a test), with
    KAUDIT_HOME the key directory of the key that signed them."""
    if "runs" not in request.fixturenames:
        return project
    shutil.rmtree(project.root)

    def record(root: Path) -> None:
        planted(find_project(root))

    return find_project(
        recorded_project(
            "bisect-planted", tmp_path_factory, repo_templates, record, project.root, monkeypatch
        )
    )


@pytest.fixture
def key(request: pytest.FixtureRequest, project: Project) -> SigningKey:
    """conftest's ``key``: a key held by the user and trusted by ``project``; for a test
    that asks for ``runs``, the one that signed them (the user's, trusted by the copy)."""
    if "runs" in request.fixturenames:
        return select_key("tester")
    k = generate_key("tester")
    project.trust_store().add(k.private_key.public_key(), "tester")
    return k


@pytest.fixture
def runs(project: Project, key: SigningKey) -> tuple[Path, Path]:
    """:func:`planted`'s two runs, in this test's own ``project``: run A, and run B
    perturbed by 1e-13 in /fields/v from step 23 on (40 steps, each checkpointed)."""
    return project.root / "checkpoints" / "env-a", project.root / "checkpoints" / "env-b"


def max_comparisons(n: int) -> int:
    return math.ceil(math.log2(n)) + 2


def rewrite_payload(path: Path, change: object) -> None:
    """Change the predicate of a manifest, keeping its old signature."""
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    change(statement["predicate"])  # type: ignore[operator]
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope, indent=2))


def test_the_planted_divergence_is_found_exactly(runs: tuple[Path, Path]) -> None:
    a, b = runs
    result = bisect(a, b)
    assert result.diverged
    assert result.first_divergent_step == PLANTED
    assert result.last_agreeing_step == PLANTED - 1
    assert result.common_steps == tuple(range(1, 41))
    # The field perturbed is the one named, and the only one at that step.
    assert [d.path for d in result.diverged_datasets] == ["/fields/v"]
    (first,) = result.diverged_datasets
    assert first.verdict is Verdict.DIFFERENT
    assert first.worst_mismatch is not None
    assert first.worst_mismatch.abs_error == pytest.approx(PERTURBATION, rel=0.01)
    # log2 of the steps, not all of them; and the boundary was compared on both sides.
    assert result.comparisons <= max_comparisons(40)
    assert not result.probe(PLANTED).agrees
    assert result.probe(PLANTED - 1).agrees
    assert len({p.step for p in result.probes}) == result.comparisons
    # Bitwise: the recorded hashes decided every step; only the step found was read.
    assert {p.decided_by for p in result.probes} == {Decision.HASHES}
    assert result.data_comparisons == 1
    assert result.probe(PLANTED).comparison is not None
    # Later steps have diverged in both fields, as the hashes show.
    assert result.probe(40).hash_differences == ("/fields/u", "/fields/v")


def test_run_directories_and_last_manifests_are_equivalent(runs: tuple[Path, Path]) -> None:
    a, b = runs
    by_dir = bisect(a, b)
    by_manifest = bisect(manifest(a, 40), manifest(b, 40))
    assert by_manifest.first_divergent_step == by_dir.first_divergent_step == PLANTED
    assert by_manifest.a.head == manifest(a, 40)
    assert by_dir.a.head == manifest(a, 40)
    assert by_dir.a.run == "env-a"
    assert by_dir.b.steps == tuple(range(1, 41))
    # An earlier manifest is the head of a shorter chain.
    short = bisect(manifest(a, 30), b)
    assert short.common_steps == tuple(range(1, 31))
    assert short.first_divergent_step == PLANTED


def test_the_result_is_a_frozen_value(runs: tuple[Path, Path]) -> None:
    a, b = runs
    result = bisect(a, b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.first_divergent_step = 1  # type: ignore[misc]
    doc = result.to_json_obj()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["format"] == "kronos-audit/bisect/v1"
    assert doc["diverged_paths"] == ["/fields/v"]


def test_a_tolerance_that_absorbs_the_perturbation_finds_no_divergence(
    runs: tuple[Path, Path],
) -> None:
    a, b = runs
    result = bisect(a, b, TolerancePolicy.from_options(rtol=1e-9))
    assert not result.diverged
    assert result.first_divergent_step is None
    assert result.last_agreeing_step == 40
    assert result.diverged_datasets == ()
    (only,) = result.probes  # the last common step agrees: nothing before it can differ
    assert (only.step, only.agrees, only.decided_by) == (40, True, Decision.DATA)
    assert only.comparison is not None
    assert only.comparison.get("fields/v").verdict is Verdict.WITHIN_TOLERANCE


def test_a_tolerance_too_tight_measures_the_data_and_still_finds_it(
    runs: tuple[Path, Path],
) -> None:
    a, b = runs
    result = bisect(a, b, TolerancePolicy.from_options(rtol=1e-15))
    assert result.first_divergent_step == PLANTED
    assert result.last_agreeing_step == PLANTED - 1
    assert result.comparisons <= max_comparisons(40)
    for p in result.probes:  # equal hashes still decide without reading
        expected = Decision.HASHES if p.step < PLANTED else Decision.DATA
        assert p.decided_by is expected, p


def test_identical_runs_never_diverge(project: Project, key: SigningKey) -> None:
    result = bisect(solver(project, "one"), solver(project, "two"))
    assert not result.diverged
    assert result.last_agreeing_step == 40
    assert result.comparisons == 1
    assert result.data_comparisons == 0  # equal recorded hashes: no data read


def test_divergence_at_the_very_first_common_step(project: Project, key: SigningKey) -> None:
    result = bisect(solver(project, "a"), solver(project, "b", perturb_from=1))
    assert result.first_divergent_step == 1
    assert result.last_agreeing_step is None
    assert [d.path for d in result.diverged_datasets] == ["/fields/v"]
    assert result.comparisons <= max_comparisons(40)


def test_runs_with_different_cadences_use_only_common_steps(
    project: Project, key: SigningKey
) -> None:
    a = solver(project, "every-2", every=2)
    b = solver(project, "every-3", every=3, perturb_from=PLANTED)
    result = bisect(a, b)
    assert result.a.steps == (*range(2, 41, 2),)
    assert result.b.steps == (*range(3, 40, 3), 40)  # the last step is always saved
    assert result.common_steps == (6, 12, 18, 24, 30, 36, 40)
    assert result.first_divergent_step == 24  # the first common step after the perturbation
    assert result.last_agreeing_step == 18
    assert {p.step for p in result.probes} <= set(result.common_steps)
    assert result.comparisons <= max_comparisons(7)


def preemptible(project: Project, run_id: str, *, preempt_at: int | None = None) -> Path:
    """20 steps under ``EverySteps(5)``; with ``preempt_at``, the scheduler's preemption
    signal (SIGUSR1, sent to this process) arrives at that step, the run checkpoints it and
    exits 75, and is started again: it resumes from that checkpoint."""
    root = project.root / "checkpoints"
    for attempt in range(2):
        with (
            contextlib.suppress(SystemExit),
            ka.Run(run_id, root=root, seed=7, every=ka.EverySteps(5)) as run,
        ):
            state = run.restore()
            x = np.zeros(4) if state is None else state["x"]
            for step in run.steps(20):
                x = 0.5 * x + run.rng.random(4)
                if step == preempt_at and attempt == 0:
                    os.kill(os.getpid(), signal.SIGUSR1)
                run.checkpoint(step, {"x": x})  # exits 75 (SystemExit) on the signal
            return root / run_id
    raise AssertionError("the resumed run was preempted again")


def test_a_preempted_run_shares_every_step_with_an_uninterrupted_one(
    project: Project, key: SigningKey
) -> None:
    a = preemptible(project, "uninterrupted")
    b = preemptible(project, "preempted", preempt_at=13)
    result = bisect(a, b)
    assert result.b.steps == (5, 10, 13, 15, 20)  # 13 taken on the signal, then 15 as in A
    assert result.common_steps == result.a.steps == (5, 10, 15, 20)
    assert not result.diverged


def test_runs_with_no_common_step_are_bad_input(project: Project, key: SigningKey) -> None:
    a = solver(project, "a", steps=5, every=2)  # 2, 4, 5
    b = solver(project, "b", steps=3, every=3)  # 3
    with pytest.raises(BisectError, match="no step in common") as caught:
        bisect(a, b)
    assert caught.value.exit_code == 2
    assert "2..5" in caught.value.message


def test_a_tampered_manifest_in_a_chain_is_bad_input_naming_where(runs: tuple[Path, Path]) -> None:
    a, b = runs
    rewrite_payload(manifest(b, 10), lambda p: p.update(seeds=[666]))
    with pytest.raises(BisectError, match="run B: the chain does not verify at step 11") as e:
        bisect(a, b)
    assert e.value.path == manifest(b, 11)
    assert "was altered" in e.value.message
    assert e.value.exit_code == 2
    assert (e.value.run, e.value.step) == ("env-b", 11)


def test_a_deleted_link_is_bad_input(runs: tuple[Path, Path]) -> None:
    a, b = runs
    manifest(a, 5).unlink()
    with pytest.raises(BisectError, match="run A: the chain does not verify at step 6") as e:
        bisect(a, b)
    assert "is missing" in e.value.message


def test_an_unsigned_or_untrusted_head_is_bad_input(
    project: Project, runs: tuple[Path, Path]
) -> None:
    a, b = runs
    head = manifest(b, 40)
    envelope = json.loads(head.read_text())
    head.write_text(json.dumps({**envelope, "signatures": []}))
    with pytest.raises(BisectError, match="run B: the manifest does not verify") as e:
        bisect(a, b)
    assert e.value.path == head
    assert "no signature" in e.value.message
    for store in (project.trust_dir, user_trust_dir()):  # nobody's key trusted any more
        for pub in store.iterdir():
            pub.unlink()
    with pytest.raises(BisectError, match="run A: the manifest does not verify"):
        bisect(a, b)


def test_data_that_does_not_match_its_manifest_is_bad_input(runs: tuple[Path, Path]) -> None:
    a, b = runs
    with h5py.File(b / f"step-{PLANTED:08d}.h5", "r+") as f:
        f["fields/u"][0, 0] += 1.0  # the signed hashes still say otherwise
    with pytest.raises(BisectError, match="does not match its signed manifest") as e:
        bisect(a, b)
    assert e.value.path == manifest(b, PLANTED)
    assert "dataset /fields/u" in e.value.message


def test_not_a_manifest_and_empty_directories_are_bad_input(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    a = solver(project, "a", steps=3)
    text = tmp_path / "notes.kaudit.json"
    text.write_text("not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        bisect(a, text)
    empty = project.root / "empty"
    empty.mkdir()
    with pytest.raises(BisectError, match="no manifest"):
        bisect(empty, a)
    with pytest.raises(ManifestError, match="not found"):
        bisect(a, tmp_path / "nowhere")


def test_read_chain_walks_back_oldest_first(project: Project, key: SigningKey) -> None:
    run_dir = solver(project, "a", steps=12, every=5)
    chain = read_chain(run_dir)
    assert chain.steps == (5, 10, 12)
    assert chain.head == manifest(run_dir, 12)
    assert chain.at(10).path == manifest(run_dir, 10)
    with pytest.raises(KeyError):
        chain.at(11)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 40, 1000])
def test_first_true_finds_every_boundary_in_log2_calls(n: int) -> None:
    for boundary in range(n):
        calls: list[int] = []

        def pred(i: int, boundary: int = boundary, calls: list[int] = calls) -> bool:
            calls.append(i)
            return i >= boundary

        assert first_true(n, pred) == boundary
        assert len(calls) <= math.ceil(math.log2(n))
        assert n - 1 not in calls  # the caller has compared the last one already
        if boundary > 0:
            assert boundary - 1 in calls


def test_data_pruned_by_retention(project: Project, key: SigningKey) -> None:
    a = solver(project, "a", keep=1, keep_every=10)  # data kept at 10, 20, 30, 40 only
    b = solver(project, "b", perturb_from=PLANTED)
    assert not (a / f"step-{PLANTED:08d}.h5").exists()
    # Bitwise needs only the recorded hashes; the report says which datasets they name.
    result = bisect(a, b)
    assert result.first_divergent_step == PLANTED
    first = result.first_divergence
    assert first is not None
    assert first.comparison is None
    assert first.failures == ("/fields/v",)
    # Under a tolerance the data must be measured, and some of it is gone.
    with pytest.raises(BisectError, match="pruned by retention"):
        bisect(a, b, TolerancePolicy.from_options(rtol=1e-15))


@pytest.mark.slow
def test_data_not_here_is_fetched_from_the_dvc_remote(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    configure_remote(project, str(tmp_path / "remote"))
    a, b = planted(project)
    storage = Storage(project)
    checkpoints = sorted([*a.glob("step-*.h5"), *b.glob("step-*.h5")])
    assert len(checkpoints) == 80
    storage.push(signed_items(checkpoints))
    for c in checkpoints:
        discard(storage, c)
    assert not any(c.exists() for c in checkpoints)

    result = bisect(a, b)
    assert result.first_divergent_step == PLANTED
    assert [d.path for d in result.diverged_datasets] == ["/fields/v"]
    # Only what was read was fetched: the two checkpoints of the step found.
    here = sorted(c for c in checkpoints if c.exists())
    assert here == [a / f"step-{PLANTED:08d}.h5", b / f"step-{PLANTED:08d}.h5"]

    absorbed = bisect(a, b, TolerancePolicy.from_options(rtol=1e-9))
    assert not absorbed.diverged
    assert (a / "step-00000040.h5").exists()
    assert (b / "step-00000040.h5").exists()
    assert ka.verify(manifest(b, 40))[0].ok
