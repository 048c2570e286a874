"""`kaudit replay` on real programs: the examples, a program that cannot reproduce, a
summation order switched by the environment, shell scripts, drift, a fresh clone with a
DVC remote, a dirty tree, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.ledger import chunk_path, write_chunk
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay import SCHEMA_NAME
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.statement.schemas import validate
from kronos_audit.storage import Storage, configure_remote
from tests.helpers import discard, git, run_cli
from tests.replay import recorded
from tests.replay.helpers import bad_input, commit_all, manifest, record, resign, worktrees

pytestmark = pytest.mark.slow

# The fixtures over the repository recorded once for the session (tests/replay/recorded.py).
heat = recorded.heat
key = recorded.key
repo = recorded.repo


def replay_json(*args: str, exit_code: int = 0, cwd: Path | None = None) -> dict[str, Any]:
    result = run_cli("replay", *args, "--json", cwd=cwd)
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    return doc


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {d["path"]: d["verdict"] for d in doc["datasets"]}


def test_a_segment_with_a_parent_reproduces_bitwise(
    heat: Path, repo: Path, replay_tmp: Path
) -> None:
    result = run_cli("replay", str(manifest(heat, 20)))
    assert result.exit_code == 0, result.output
    assert "resumed from step 10" in result.stdout
    assert "no drift" in result.stdout
    assert "REPRODUCED: 7 datasets: 7 identical" in result.stdout
    doc = replay_json(str(manifest(heat, 20)))
    assert doc["outcome"] == "REPRODUCED"
    assert doc["basis"] == "hashes"
    assert set(verdicts(doc).values()) == {"IDENTICAL"}
    assert set(verdicts(doc)) == {
        "/fields/u",
        "/iterations",
        "/kaudit/tree",
        "/rng/numpy",
        "/rng/numpy_global",
        "/rng/python",
        "/time",
    }
    assert doc["parent"]["step"] == 10
    assert doc["parent"]["fetched"] is False
    assert doc["command"]["recorded"][:2] == ["python", "run.py"]
    assert doc["command"]["executed"][0] == sys.executable
    assert doc["command"]["cwd"] == "heat"
    assert doc["code"]["patch_sha256"] is None
    # Nothing is left behind: no worktree, no work directory, the run's directory as it was.
    assert worktrees(repo) == [str(repo)]
    assert list(replay_tmp.iterdir()) == []
    assert sorted(p.name for p in heat.glob("step-*.h5")) == [
        f"step-{s:08d}.h5" for s in (10, 20, 30)
    ]


def test_the_first_checkpoint_replays_from_the_start(heat: Path) -> None:
    doc = replay_json(str(manifest(heat, 10)))
    assert doc["parent"] is None
    assert doc["command"]["seed"] == 1234
    assert doc["outcome"] == "REPRODUCED"
    assert set(verdicts(doc).values()) == {"IDENTICAL"}


@pytest.mark.parametrize(
    ("name", "args", "step", "first"),
    [
        ("montecarlo", ["--batches", "6", "--samples", "2000", "--run-id", "pi"], 4, 1),
        ("train", ["--steps", "40", "--every", "20", "--run-id", "train"], 40, 20),
    ],
)
def test_the_other_examples_reproduce(
    repo: Path, name: str, args: list[str], step: int, first: int
) -> None:
    record(repo, name, "run.py", *args)
    run_dir = repo / name / "checkpoints" / args[args.index("--run-id") + 1]
    for s in (first, step):
        doc = replay_json(str(manifest(run_dir, s)))
        assert doc["outcome"] == "REPRODUCED", doc["datasets"]
    if name == "montecarlo":
        # The campaign's ledger is in chunks beside its steps: the replay of step 4 hands
        # over its parent's chunks (one a batch), which the replayed program restores,
        # and the chunk step 4 wrote is compared with the one the replay wrote, bitwise.
        assert len(ka.read_manifest(manifest(run_dir, step)).record.ledger) == step
        assert verdicts(doc)["/ledger"] == "IDENTICAL"


def test_a_result_changed_and_signed_again_is_caught_by_the_replay_of_its_step(
    repo: Path, key: SigningKey
) -> None:
    # Someone holding the run's key changes batch 3's result in the chunk step 4 wrote
    # and signs step 4 again over it: kaudit verify holds, the replay of step 4 does not.
    args = ["--batches", "6", "--samples", "2000", "--run-id", "forged"]
    record(repo, "montecarlo", "run.py", *args)
    run_dir = repo / "montecarlo" / "checkpoints" / "forged"
    own = ka.read_manifest(manifest(run_dir, 4)).record.ledger[-1]
    flat: dict[str, Any] = {}
    with h5py.File(chunk_path(run_dir, own.sha256)) as f:
        f.visititems(
            lambda n, o: flat.update({f"/{n}": o[()]}) if isinstance(o, h5py.Dataset) else None
        )
    assert list(flat["/ledger/index"]) == [3]
    flat["/ledger/results/hits"] = flat["/ledger/results/hits"] + 1
    forged = write_chunk(run_dir, flat)

    def forge(predicate: dict[str, Any]) -> None:
        predicate["ledger"][-1].update(sha256=forged.sha256, md5=forged.md5, size=forged.size)

    resign(manifest(run_dir, 4), key, forge)
    verified = run_cli("verify", str(manifest(run_dir, 4)))
    assert verified.exit_code == 0, verified.output
    doc = replay_json(str(manifest(run_dir, 4)), exit_code=1)
    assert doc["outcome"] == "NOT_REPRODUCED"
    (ledger,) = [d for d in doc["datasets"] if d["path"] == "/ledger"]
    assert ledger["verdict"] == "DIFFERENT"
    assert ledger["recorded"]["sha256"] == forged.sha256
    assert ledger["replayed"]["sha256"] == own.sha256  # the bytes step 4 wrote at first
    assert ledger["detail"].endswith(": /ledger/results/hits differs"), ledger["detail"]
    assert {d["verdict"] for d in doc["datasets"] if d["path"] != "/ledger"} == {"IDENTICAL"}


def test_a_run_without_a_seed_in_its_code_replays_with_the_recorded_seed(repo: Path) -> None:
    record(repo, "programs", "seedless.py", "10")
    run_dir = repo / "programs" / "checkpoints" / "seedless"
    doc = replay_json(str(manifest(run_dir, 5)))  # from the start: only KAUDIT_SEED helps
    assert doc["command"]["seed"] is not None
    assert doc["outcome"] == "REPRODUCED"
    assert replay_json(str(manifest(run_dir, 10)))["outcome"] == "REPRODUCED"


def test_a_non_deterministic_program_is_not_reproduced_and_the_dataset_named(
    repo: Path,
) -> None:
    record(repo, "programs", "noisy.py", "10")
    target = manifest(repo / "programs" / "checkpoints" / "noisy", 10)
    result = run_cli("replay", str(target))
    assert result.exit_code == 1, result.output
    assert "NOT REPRODUCED" in result.stdout
    assert "/noise" in result.stdout.splitlines()[-1]  # named in the verdict line
    assert "first [" in result.stdout  # where it differs: the recorded data is here
    doc = replay_json(str(target), exit_code=1)
    assert doc["outcome"] == "NOT_REPRODUCED"
    assert verdicts(doc)["/noise"] == "DIFFERENT"
    assert verdicts(doc)["/u"] == "IDENTICAL"
    noise = next(d for d in doc["datasets"] if d["path"] == "/noise")
    assert noise["comparison"]["mismatches"] > 0


def test_a_summation_order_differs_bitwise_and_agrees_within_tolerance(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(repo, "programs", "order.py", "10", env={"KAUDIT_TEST_ORDER": "forward"})
    target = str(manifest(repo / "programs" / "checkpoints" / "order", 10))
    assert replay_json(target)["outcome"] == "REPRODUCED"  # same order: bitwise
    monkeypatch.setenv("KAUDIT_TEST_ORDER", "reverse")
    bitwise = replay_json(target, exit_code=1)
    assert verdicts(bitwise) == {
        "/kaudit/tree": "IDENTICAL",
        "/rng/numpy": "IDENTICAL",
        "/rng/numpy_global": "IDENTICAL",
        "/rng/python": "IDENTICAL",
        "/terms": "IDENTICAL",
        "/total": "DIFFERENT",
    }
    total = next(d for d in bitwise["datasets"] if d["path"] == "/total")
    assert 0 < total["comparison"]["max_rel_error"] < 1e-9
    within = replay_json(target, "--rtol", "1e-9")
    assert within["outcome"] == "REPRODUCED_WITHIN_TOLERANCE"
    assert within["basis"] == "data"
    assert verdicts(within)["/total"] == "WITHIN_TOLERANCE"
    shown = run_cli("replay", target, "--rtol", "1e-9")
    assert shown.exit_code == 0, shown.output
    assert "REPRODUCED WITHIN TOLERANCE" in shown.stdout
    # A pattern rule works as in kaudit diff: exact for total, so it fails again.
    assert (
        replay_json(target, "--rtol", "1e-9", "--tol", "total:exact", exit_code=1)["outcome"]
        == "NOT_REPRODUCED"
    )


def test_a_shell_script_replays_through_the_placeholders(repo: Path) -> None:
    out = "checkpoints/solver"
    command = "bash solver.sh {resume_from} {stop_at} {out}"
    cwd = repo / "programs"
    subprocess.run(["bash", "solver.sh", "", "5", out], cwd=cwd, check=True)
    first = run_cli(
        "snapshot", f"{out}/step-00000005.h5", "--run", "solver", "--step", "5",
        "--command", command, cwd=cwd,
    )  # fmt: skip
    assert first.exit_code == 0, first.output
    subprocess.run(["bash", "solver.sh", f"{out}/step-00000005.h5", "10", out], cwd=cwd, check=True)
    second = run_cli(
        "snapshot", f"{out}/step-00000010.h5", "--run", "solver", "--step", "10",
        "--parent", f"{out}/step-00000005.h5.kaudit.json", "--command", command, cwd=cwd,
    )  # fmt: skip
    assert second.exit_code == 0, second.output
    run_dir = cwd / out
    from_start = replay_json(str(manifest(run_dir, 5)))
    assert from_start["command"]["executed"][:3] == ["bash", "solver.sh", ""]
    assert from_start["outcome"] == "REPRODUCED"
    resumed = replay_json(str(manifest(run_dir, 10)))
    handed = Path(resumed["command"]["executed"][2])  # a copy of the parent, not the run's
    assert handed.name == "step-00000005.h5"
    assert handed.parent.name == "parent"
    assert not handed.is_relative_to(repo)
    assert resumed["command"]["executed"][3] == "10"
    assert resumed["outcome"] == "REPRODUCED"
    assert verdicts(resumed) == {"/step": "IDENTICAL", "/u": "IDENTICAL"}


def test_an_executable_writing_one_file_of_its_own_name_replays(repo: Path) -> None:
    cwd = repo / "programs"
    subprocess.run(["./solve", "7", "rec"], cwd=cwd, check=True)
    made = run_cli(
        "snapshot", "rec/result.h5", "--run", "solve", "--step", "7",
        "--command", "./solve {stop_at} {out}", cwd=cwd,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    doc = replay_json(str(cwd / "rec" / "result.h5.kaudit.json"))
    assert doc["produced"]["name"] == "result.h5"
    assert verdicts(doc) == {"/v": "IDENTICAL"}


def test_a_checkpoint_that_is_not_hdf5_is_judged_by_its_file_digest(repo: Path) -> None:
    cwd = repo / "programs"
    (cwd / "rec").mkdir()
    (cwd / "rec" / "count.txt").write_text("7\n")
    command = """sh -c 'echo "$KAUDIT_STOP_AT" > "$KAUDIT_OUT/count.txt"'"""
    made = run_cli(
        "snapshot", "rec/count.txt", "--run", "c", "--step", "7", "--command", command, cwd=cwd
    )
    assert made.exit_code == 0, made.output
    target = str(cwd / "rec" / "count.txt.kaudit.json")
    doc = replay_json(target)
    assert doc["datasets"] == []
    assert doc["produced"]["file_identical"] is True
    assert doc["outcome"] == "REPRODUCED"
    bad_input(run_cli("replay", target, "--rtol", "1e-9"), "not HDF5")


def test_environment_drift_is_reported_and_refused_when_strict(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(repo, "heat", "run.py", "--steps", "10", "--every", "10", "--n", "16",
           env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    target = str(manifest(repo / "heat" / "checkpoints" / "heat", 10))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    warned = run_cli("replay", target)
    assert warned.exit_code == 0, warned.output
    # judged on what the replayed program ran with: the variable, and the thread count
    # its BLAS took from it
    assert "drift from the recorded lock, 2 differences (as the replayed program ran)" in (
        warned.stdout
    )
    assert "OMP_NUM_THREADS 1 -> 2" in warned.stdout
    doc = replay_json(target)
    assert doc["environment"]["judged_on"] == "program"
    assert doc["environment"]["drift"] == [
        {
            "section": "variables",
            "name": "OMP_NUM_THREADS",
            "change": "changed",
            "recorded": "1",
            "current": "2",
            "drift": True,
        },
        {
            "section": "threadpools",
            "name": "openblas.num_threads",
            "change": "changed",
            "recorded": "1",
            "current": "2",
            "drift": True,
        },
    ]
    assert doc["environment"]["recorded_digest"] != doc["environment"]["current_digest"]
    refused = run_cli("replay", target, "--env", "strict")
    bad_input(refused, "strict", "OMP_NUM_THREADS 1 -> 2")
    quiet = run_cli("replay", target, "--env", "ignore")
    assert quiet.exit_code == 0, quiet.output
    assert "OMP_NUM_THREADS" not in quiet.stdout
    assert replay_json(target, "--env", "ignore")["environment"]["drift"][0]["name"] == (
        "OMP_NUM_THREADS"
    )
    monkeypatch.delenv("OMP_NUM_THREADS")
    removed = replay_json(target)["environment"]["drift"]
    assert next((d["name"], d["change"]) for d in removed) == ("OMP_NUM_THREADS", "removed")


def test_a_changed_package_in_the_recorded_lock_is_drift(heat: Path, key: SigningKey) -> None:
    def older_numpy(p: dict[str, Any]) -> None:
        p["environment"]["packages"]["numpy"] = "1.0.0"
        p["environment"]["packages"]["retired-package"] = "0.1"

    target = resign(manifest(heat, 10), key, older_numpy)
    doc = replay_json(str(target))
    drift = {d["name"]: (d["change"], d["recorded"]) for d in doc["environment"]["drift"]}
    assert drift == {"numpy": ("changed", "1.0.0"), "retired-package": ("removed", "0.1")}
    bad_input(run_cli("replay", str(target), "--env", "strict"), "numpy 1.0.0 -> ")


def test_a_fresh_clone_fetches_the_parent_from_the_dvc_remote(
    heat: Path, repo: Path, tmp_path: Path
) -> None:
    configure_remote(Project(repo), str(tmp_path / "remote"))
    assert run_cli("push", str(heat)).exit_code == 0
    commit_all(repo)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    run_dir = clone / "heat" / "checkpoints" / "heat"
    assert not (run_dir / "step-00000010.h5").exists()
    doc = replay_json(str(manifest(run_dir, 20)))
    assert doc["outcome"] == "REPRODUCED"
    assert doc["parent"]["fetched"] is True
    assert (run_dir / "step-00000010.h5").exists()  # fetched for the resume, and verified
    assert not (run_dir / "step-00000020.h5").exists()  # bitwise needs only the hashes
    within = replay_json(str(manifest(run_dir, 20)), "--rtol", "1e-12")  # needs the data
    assert within["outcome"] == "REPRODUCED"
    assert (run_dir / "step-00000020.h5").exists()
    assert worktrees(clone) == [str(clone)]


def test_a_dirty_tree_at_record_time_is_replayed_with_its_patch(repo: Path) -> None:
    run_py = repo / "heat" / "run.py"
    original = run_py.read_text()
    run_py.write_text(original.replace("alpha=0.2", "alpha=0.1"))  # uncommitted
    record(repo, "heat", "run.py", "--steps", "20", "--every", "10", "--n", "16")
    run_py.write_text(original)  # the checkout no longer holds what ran
    target = manifest(repo / "heat" / "checkpoints" / "heat", 20)
    doc = replay_json(str(target))
    assert doc["code"]["patch_sha256"] is not None
    assert doc["outcome"] == "REPRODUCED"
    assert git(repo, "status", "--porcelain", "heat/run.py") == ""
    patch = repo / ".kaudit" / "patches" / f"{doc['code']['patch_sha256']}.patch"
    patch.write_bytes(patch.read_bytes().replace(b"alpha=0.1", b"alpha=0.3"))
    bad_input(run_cli("replay", str(target)), "altered")
    patch.unlink()
    bad_input(run_cli("replay", str(target)), "patch", "missing")


def test_a_dirty_runs_patch_travels_through_the_dvc_remote(repo: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    configure_remote(Project(repo), str(remote))
    commit_all(repo, "remote")
    run_py = repo / "heat" / "run.py"
    original = run_py.read_text()
    run_py.write_text(original.replace("alpha=0.2", "alpha=0.1"))  # uncommitted
    ran = subprocess.run(
        [sys.executable, "run.py", "--steps", "20", "--every", "10", "--n", "16"],
        cwd=repo / "heat",
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    run_py.write_text(original)
    run_dir = repo / "heat" / "checkpoints" / "heat"
    digest = read_manifest(manifest(run_dir, 20)).record.git.patch_sha256
    assert digest is not None
    name = f".kaudit/patches/{digest}.patch"
    # Said once, naming the file a replay elsewhere needs.
    assert [line for line in ran.stderr.splitlines() if name in line] == [
        f"run 'heat': uncommitted changes recorded as {name}: commit it with the "
        "manifests, or `kaudit push` them to the DVC remote, for a replay elsewhere"
    ]
    assert run_cli("push", str(run_dir)).exit_code == 0
    pushed = remote / "kaudit" / "runs" / "heat" / f"{digest}.patch"
    assert pushed.read_bytes() == (repo / name).read_bytes()  # the signed bytes
    (repo / name).unlink()  # never committed: a fresh clone lacks it
    commit_all(repo)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    assert not (clone / name).exists()
    target = str(manifest(clone / "heat" / "checkpoints" / "heat", 20))
    doc = replay_json(target)
    assert doc["code"]["patch_sha256"] == digest
    assert doc["outcome"] == "REPRODUCED"
    pushed.write_bytes(pushed.read_bytes().replace(b"alpha=0.1", b"alpha=0.3"))
    bad_input(run_cli("replay", target), "altered", "in the DVC remote")
    assert worktrees(clone) == [str(clone)]


def test_push_refuses_an_altered_patch(repo: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    configure_remote(Project(repo), str(remote))
    commit_all(repo, "remote")
    run_py = repo / "heat" / "run.py"
    run_py.write_text(run_py.read_text().replace("alpha=0.2", "alpha=0.1"))
    record(repo, "heat", "run.py", "--steps", "10", "--every", "10", "--n", "16")
    run_dir = repo / "heat" / "checkpoints" / "heat"
    digest = read_manifest(manifest(run_dir, 10)).record.git.patch_sha256
    patch = repo / ".kaudit" / "patches" / f"{digest}.patch"
    patch.write_bytes(patch.read_bytes() + b"\n")
    bad_input(run_cli("push", str(run_dir)), "altered", "not sent")
    assert not (remote / "kaudit" / "runs" / "heat" / f"{digest}.patch").exists()


def test_keep_workdir_keeps_the_worktree_and_the_output(heat: Path, repo: Path) -> None:
    result = run_cli("replay", str(manifest(heat, 20)), "--keep-workdir")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("work directory kept: ")]
    workdir = Path(line.removeprefix("work directory kept: ").split(" (")[0])
    try:
        assert (workdir / "src" / "heat" / "run.py").exists()
        assert (workdir / "out" / "step-00000020.h5").exists()
        assert (workdir / "stderr.log").exists()
        assert str(workdir / "src") in worktrees(repo)
    finally:
        git(repo, "worktree", "remove", "--force", str(workdir / "src"))


# -- could not replay: exit 2, one line ------------------------------------------------------


def test_a_malformed_manifest_is_one_line(repo: Path) -> None:
    bad = repo / "bad.h5.kaudit.json"
    bad.write_text("{not json")
    bad_input(run_cli("replay", str(bad)), "bad.h5.kaudit.json", "not valid JSON")
    bad_input(run_cli("replay", str(repo / "absent.h5.kaudit.json")), "not found")


def test_an_unknown_commit_is_one_line(heat: Path, key: SigningKey, repo: Path) -> None:
    def elsewhere(p: dict[str, Any]) -> None:
        p["git"]["commit"] = "0123456789abcdef" * 2 + "01234567"

    target = resign(manifest(heat, 20), key, elsewhere)
    bad_input(run_cli("replay", str(target)), "commit 0123456789abcdef", "not in this repository")
    assert worktrees(repo) == [str(repo)]


def test_a_manifest_that_does_not_verify_is_not_replayed(heat: Path, repo: Path) -> None:
    target = manifest(heat, 20)
    good = target.read_text()
    obj = json.loads(good)
    obj["signatures"][0]["sig"] = obj["signatures"][0]["sig"][:-8] + "AAAAAAA="
    target.write_text(json.dumps(obj))
    bad_input(run_cli("replay", str(target)), "does not verify", "signature")
    target.write_text(good)
    ckpt = heat / "step-00000010.h5"
    os.chmod(ckpt, 0o644)
    with h5py.File(ckpt, "r+") as f:
        f["fields/u"][0, 0] += 1.0
    bad_input(run_cli("replay", str(manifest(heat, 20))), "parent manifest does not verify")
    manifest(heat, 10).unlink()
    bad_input(
        run_cli("replay", str(manifest(heat, 20))),
        "parent manifest heat/checkpoints/heat/step-00000010.h5.kaudit.json is missing",
    )


def test_parent_data_missing_from_every_remote_is_one_line(
    heat: Path, repo: Path, tmp_path: Path
) -> None:
    discard(Storage(Project(repo)), heat / "step-00000010.h5")  # never pushed, now gone
    bad_input(run_cli("replay", str(manifest(heat, 20))), "step-00000010.h5", "no DVC remote")
    configure_remote(Project(repo), str(tmp_path / "empty-remote"))
    bad_input(
        run_cli("replay", str(manifest(heat, 20))),
        "parent checkpoint is not here and could not be fetched",
    )


def test_recorded_data_missing_everywhere_refuses_a_tolerance_replay(
    heat: Path, repo: Path
) -> None:
    discard(Storage(Project(repo)), heat / "step-00000020.h5")
    assert replay_json(str(manifest(heat, 20)))["outcome"] == "REPRODUCED"  # hashes suffice
    bad_input(
        run_cli("replay", str(manifest(heat, 20)), "--rtol", "1e-9"),
        "recorded checkpoint",
        "tolerance",
    )


def test_a_failing_command_shows_the_tail_of_its_stderr(
    heat: Path, key: SigningKey, repo: Path
) -> None:
    def broken(p: dict[str, Any]) -> None:
        p["command"] = [
            "python",
            "-c",
            "import sys; print('boom: the mesh is gone', file=sys.stderr); sys.exit(3)",
        ]

    target = resign(manifest(heat, 20), key, broken)
    bad_input(run_cli("replay", str(target)), "exited with status 3", "boom: the mesh is gone")
    assert worktrees(repo) == [str(repo)]


def test_a_command_that_writes_nothing_could_not_replay(heat: Path, key: SigningKey) -> None:
    target = resign(manifest(heat, 20), key, lambda p: p.update(command=["true"]))
    bad_input(run_cli("replay", str(target)), "wrote no checkpoint", "step-00000020.h5")


def test_a_manifest_without_a_command_cannot_be_replayed(repo: Path) -> None:
    path = repo / "data" / "x.h5"
    path.parent.mkdir()
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    assert run_cli("snapshot", str(path), "--run", "x", "--step", "1").exit_code == 0
    bad_input(run_cli("replay", str(path) + ".kaudit.json"), "no command")


def test_bad_options_are_one_line(heat: Path) -> None:
    bad_input(run_cli("replay", str(manifest(heat, 20)), "--rtol", "x"), "--rtol")
    bad_input(run_cli("replay", str(manifest(heat, 20)), "--key", "k"), "--attest")


def test_the_installed_kaudit_replays(heat: Path, repo: Path) -> None:
    kaudit = Path(sys.executable).parent / "kaudit"
    done = subprocess.run(
        [str(kaudit), "replay", str(manifest(heat, 20))],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "REPRODUCED" in done.stdout
