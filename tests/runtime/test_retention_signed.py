"""Signed retention: data is accepted as pruned only on a signed record
in a later manifest of the same run; verify says how many checkpoints had their data
checked, and a run whose newest checkpoint's data was never checked is not ok. Real runs
(ka.Run with keep=), real DVC cache, the real CLI.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    RunDirectory,
    shard_name,
    shard_path,
    step_directory,
)
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.retention import sharded_steps_with_data
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.storage import cache_object_path, cache_settings, read_dvc_file
from tests.helpers import run_cli, untrusted_key
from tests.runtime.test_retention import RANKS, sharded_run
from tests.threadranks import ThreadRanks, on_ranks

STEPS = 6


def run(project: Project, *, keep: int | None) -> Path:
    """A real run of STEPS checkpoints (one per step); returns its directory."""
    root = project.root / "checkpoints"
    with ka.Run("ret", root=root, seed=7, every=ka.EverySteps(1), keep=keep) as r:
        state = r.restore() or {"u": r.rng.random((16, 16))}
        for step in r.steps(STEPS):
            state = {"u": 0.5 * state["u"] + r.rng.random((16, 16))}
            r.checkpoint(step, state)
    return root / "ret"


def ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}.h5"


def manifest(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}.h5.kaudit.json"


def delete_data(project: Project, run_dir: Path, step: int) -> None:
    """Delete a checkpoint's data and DVC's cache object of it: nothing can fetch it back."""
    md5 = ka.read_manifest(manifest(run_dir, step)).subject_md5
    assert md5 is not None
    ckpt(run_dir, step).unlink(missing_ok=True)
    cache_object_path(cache_settings(project)[0], md5).unlink(missing_ok=True)


def verify_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("verify", "--json", *args)
    doc: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, doc


def file_digest(result: dict[str, Any]) -> dict[str, Any]:
    checks: list[dict[str, Any]] = [c for c in result["checks"] if c["check"] == "file digest"]
    (check,) = checks
    return check


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_that_pruned_verifies_and_says_what_was_checked(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, keep=2)
    assert sorted(p.name for p in run_dir.glob("step-*.h5")) == [
        "step-00000005.h5",
        "step-00000006.h5",
    ]
    digests = {s: sha256(manifest(run_dir, s)) for s in range(1, STEPS + 1)}

    human = run_cli("verify", str(run_dir))
    assert human.exit_code == 0, human.output
    last = human.stdout.strip().splitlines()[-1]
    assert "6 manifest(s): 6 ok" in last
    assert "data checked for 2" in last
    assert "not checked for 4 (pruned)" in last

    code, doc = verify_json(str(run_dir))
    assert code == 0
    assert doc["summary"]["data_checked"] == 2
    assert doc["summary"]["data_not_checked"] == 4
    by_step = {r["step"]: r for r in doc["results"]}
    for step in (1, 2, 3, 4):
        check = file_digest(by_step[step])
        assert check["skipped"]
        assert check["ok"]
        # Each pruned checkpoint names the manifest that recorded its pruning (2 later).
        assert manifest(run_dir, step + 2).name in check["detail"], check
        assert not by_step[step]["data_checked"]
    for step in (5, 6):
        assert by_step[step]["data_checked"]
        assert not file_digest(by_step[step])["skipped"]

    # The record is in what the owner's key signed.
    newest = ka.read_manifest(manifest(run_dir, STEPS))
    assert [dict(e) for e in newest.predicate["pruned"]] == [{"step": 4, "manifest": digests[4]}]
    third = ka.read_manifest(manifest(run_dir, 3))
    assert [dict(e) for e in third.predicate["pruned"]] == [{"step": 1, "manifest": digests[1]}]
    assert "pruned" not in ka.read_manifest(manifest(run_dir, 2)).predicate


def test_an_unsigned_pruned_list_does_not_excuse_deleted_data(
    project: Project, key: SigningKey
) -> None:
    """The old mechanism: a `.kaudit-pruned` file anyone can write. It proves nothing."""
    run_dir = run(project, keep=None)
    delete_data(project, run_dir, 3)
    (run_dir / ".kaudit-pruned").write_text("step-00000003.h5\n")

    offline = run_cli("verify", "--no-fetch", str(run_dir))
    assert offline.exit_code == 2, offline.output
    (line,) = offline.stderr.splitlines()
    assert line.startswith(f"kaudit: error: {ckpt(run_dir, 3)}: ")
    assert "not found" in line
    assert "no signed retention record" in line

    fetching = run_cli("verify", str(run_dir))  # nothing holds it: not in cache, no remote
    assert fetching.exit_code == 2, fetching.output
    assert str(ckpt(run_dir, 3)) in fetching.stderr
    assert not ckpt(run_dir, 3).exists()

    code, doc = verify_json("--no-fetch", str(run_dir))
    assert code == 2
    assert doc["ok"] is False
    assert [e["path"] for e in doc["errors"]] == [str(ckpt(run_dir, 3))]
    assert all(file_digest(r)["skipped"] is False for r in doc["results"])


def test_the_newest_checkpoints_data_deleted_is_not_ok(project: Project, key: SigningKey) -> None:
    run_dir = run(project, keep=2)
    delete_data(project, run_dir, STEPS)
    for args in (("--no-fetch",), ()):
        result = run_cli("verify", *args, str(run_dir))
        assert result.exit_code == 2, result.output
        assert str(ckpt(run_dir, STEPS)) in result.stderr
        code, doc = verify_json(*args, str(run_dir))
        assert code == 2
        assert doc["ok"] is False
        assert doc["summary"]["data_checked"] == 1


def test_one_pruned_manifest_verified_alone_is_its_runs_newest_and_fails(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, keep=2)
    alone = manifest(run_dir, 2)
    human = run_cli("verify", str(alone))
    assert human.exit_code == 1, human.output
    assert "its data was never checked" in human.stdout
    code, doc = verify_json(str(alone))
    assert code == 1
    (result,) = doc["results"]
    assert {c["check"] for c in result["checks"] if not c["ok"]} == {"file digest"}
    assert doc["summary"]["data_checked"] == 0
    # With a later manifest whose data is checked, the same pruned one is fine.
    code, doc = verify_json(str(alone), str(manifest(run_dir, STEPS)))
    assert code == 0, doc


def forge_pruning(path: Path, entry: dict[str, Any]) -> None:
    """Add ``entry`` to the manifest's ``pruned`` list, re-encoding the payload and keeping
    the old signature (which then no longer matches)."""
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"].setdefault("pruned", []).append(entry)
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope, indent=2))


def test_a_forged_pruning_record_is_not_a_pruning_record(project: Project, key: SigningKey) -> None:
    run_dir = run(project, keep=None)
    victim = manifest(run_dir, 3)
    forge_pruning(manifest(run_dir, STEPS), {"step": 3, "manifest": sha256(victim)})
    delete_data(project, run_dir, 3)

    code, doc = verify_json("--no-fetch", str(run_dir))
    assert code == 2
    assert [e["path"] for e in doc["errors"]] == [str(ckpt(run_dir, 3))]
    assert "no signed retention record" in doc["errors"][0]["error"]
    forger = next(r for r in doc["results"] if r["step"] == STEPS)
    assert not next(c for c in forger["checks"] if c["check"] == "signature")["ok"]
    assert all(not file_digest(r)["skipped"] for r in doc["results"])  # none taken as pruned
    assert run_cli("verify", str(run_dir)).exit_code == 2  # nothing to fetch it from

    # Forged onto a manifest whose data is gone as well: still not pruned, still refused.
    forge_pruning(manifest(run_dir, 4), {"step": 3, "manifest": sha256(victim)})
    code, doc = verify_json("--no-fetch", str(victim))
    assert code == 2
    assert "no signed retention record" in doc["errors"][0]["error"]


def test_a_pruning_record_signed_by_an_unanchored_key_does_not_count_under_an_anchor(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    """An adversary who adds their own key to the repository's trust store and signs a
    pruning record: an auditor who brings the owner's key (--trusted-key) is not fooled."""
    run_dir = run(project, keep=None)
    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    evil = untrusted_key("evil")
    project.trust_store().add(evil.private_key.public_key(), "evil")

    victim = manifest(run_dir, 3)
    newest = manifest(run_dir, STEPS)
    statement = json.loads(ka.read_manifest(newest).envelope.payload)
    statement["predicate"]["pruned"] = [{"step": 3, "manifest": sha256(victim)}]
    newest.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), evil)))
    delete_data(project, run_dir, 3)

    result = run_cli("verify", "--no-fetch", "--trusted-key", str(owner), str(run_dir))
    assert result.exit_code == 2, result.output
    assert "no signed retention record" in result.stderr
    result = run_cli("verify", "--no-fetch", "--require-anchor", str(run_dir))
    assert result.exit_code == 2, result.output
    assert "no signed retention record" in result.stderr

    # The repository's store is taken at its word only when the verifier allows it.
    result = run_cli("verify", "--no-fetch", "--allow-unanchored", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "unanchored" in result.stdout
    assert "signed by unanchored keys" in result.stdout.strip().splitlines()[-1]


def test_a_pruning_record_of_another_run_does_not_count(project: Project, key: SigningKey) -> None:
    """A signed record prunes only checkpoints of its own run: an owner-signed manifest of
    another run, copied beside, naming this run's manifest, does not excuse missing data."""
    run_dir = run(project, keep=None)
    root = project.root / "checkpoints"
    with ka.Run("other", root=root, seed=7, every=ka.EverySteps(1)) as r:
        for s in r.steps(STEPS + 1):
            r.checkpoint(s, {"u": r.rng.random(4)})
    intruder = root / "other" / f"step-{STEPS + 1:08d}.h5.kaudit.json"
    victim = manifest(run_dir, 3)
    statement = json.loads(ka.read_manifest(intruder).envelope.payload)
    statement["predicate"]["pruned"] = [{"step": 3, "manifest": sha256(victim)}]
    (run_dir / intruder.name).write_bytes(
        encode_envelope(sign_envelope(canonical_json(statement), key))
    )
    delete_data(project, run_dir, 3)
    code, doc = verify_json("--no-fetch", str(victim))
    assert code == 2
    assert "no signed retention record" in doc["errors"][0]["error"]


# -- sharded steps: a run on several ranks ---------------------------------------------------

SHARDED_STEPS = 8
KEPT = (4, 7, 8)  # keep=2, keep_every=4: 4 for ever, 7 and 8 the newest
PRUNED = (1, 2, 3, 5, 6)  # each by the manifest two steps later


def sharded(project: Project, *, keep: int | None, keep_every: int | None = None) -> Path:
    return sharded_run(project, range(1, SHARDED_STEPS + 1), keep=keep, keep_every=keep_every)


def step_manifest(run_dir: Path, step: int) -> Path:
    return RunDirectory(run_dir).step_manifest(step)


def pruner_name(step: int) -> str:
    return f"step-{step:08d}/{STEP_MANIFEST}"


def delete_step_data(project: Project, run_dir: Path, step: int, *names: str) -> None:
    """Delete these files of a sharded step (all of its data when none are named) and
    DVC's cache objects of them: nothing can fetch them back."""
    directory = step_directory(run_dir, step)
    cache_dir = cache_settings(project)[0]
    for dvc_file in sorted(directory.glob("*.dvc")):
        data = dvc_file.with_suffix("")
        if names and data.name not in names:
            continue
        entry = read_dvc_file(dvc_file)
        assert entry is not None
        cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)
        data.unlink()
        dvc_file.unlink()


def test_a_sharded_run_that_pruned_verifies_and_every_command_says_pruned(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run_dir = sharded(project, keep=2, keep_every=4)
    assert sharded_steps_with_data(run_dir) == list(KEPT)
    for step in PRUNED:  # the manifest alone is left: git sees nothing else of it
        assert [p.name for p in step_directory(run_dir, step).iterdir()] == [STEP_MANIFEST]
    for step in PRUNED:
        pruner = ka.read_manifest(step_manifest(run_dir, step + 2))
        assert [dict(e) for e in pruner.predicate["pruned"]] == [
            {"step": step, "manifest": sha256(step_manifest(run_dir, step))}
        ]

    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    trust = ("--trusted-key", str(owner))
    human = run_cli("verify", *trust, str(run_dir))
    assert human.exit_code == 0, human.output
    last = human.stdout.strip().splitlines()[-1]
    assert f"{SHARDED_STEPS} manifest(s): {SHARDED_STEPS} ok" in last
    assert f"data checked for {len(KEPT)}" in last
    assert f"not checked for {len(PRUNED)} (pruned)" in last
    code, doc = verify_json("--no-fetch", *trust, str(run_dir))
    assert code == 0, doc
    by_step = {r["step"]: r for r in doc["results"]}
    for step in PRUNED:  # as a single file's: the same status, the same words
        check = file_digest(by_step[step])
        assert (check["ok"], check["skipped"]) == (True, True)
        assert check["detail"] == (
            f"data pruned by retention (signed record in {pruner_name(step + 2)}): not checked"
        )
        assert not by_step[step]["data_checked"]
        assert by_step[step]["data"] == "pruned"
    for step in KEPT:
        assert by_step[step]["data_checked"]
        assert by_step[step]["data"] == "local"
        assert [c["check"] for c in by_step[step]["checks"] if c["check"] == "shards"]

    logged = json.loads(run_cli("log", str(run_dir), "--json", *trust).stdout)
    (one,) = logged["runs"]
    assert one["data"] == {"local": len(KEPT), "pruned": len(PRUNED)}
    status = run_cli("status", str(run_dir), "--local-only", "--json", *trust)
    assert status.exit_code == 0, status.output
    doc = json.loads(status.stdout)
    assert {c["step"]: c["location"] for c in doc["checkpoints"]} == {
        **dict.fromkeys(PRUNED, "pruned"),
        **dict.fromkeys(KEPT, "local"),
    }
    # One pruned step, named by its directory: pruned too.
    one_step = run_cli("status", str(step_directory(run_dir, 2)), "--local-only", *trust)
    assert one_step.exit_code == 0, one_step.output
    assert "pruned" in one_step.stdout


def test_a_pruned_sharded_step_verified_alone_is_its_runs_newest_and_fails(
    project: Project, key: SigningKey
) -> None:
    run_dir = sharded(project, keep=2)
    alone = step_manifest(run_dir, 2)
    code, doc = verify_json(str(alone))
    assert code == 1
    (result,) = doc["results"]
    assert "its data was never checked" in file_digest(result)["detail"]
    code, doc = verify_json(str(alone), str(step_manifest(run_dir, SHARDED_STEPS)))
    assert code == 0, doc


def test_a_sharded_steps_data_deleted_without_a_record_fails_verify(
    project: Project, key: SigningKey
) -> None:
    run_dir = sharded(project, keep=None)
    # One shard gone (and DVC's copy of it): the step fails, naming the rank.
    delete_step_data(project, run_dir, 3, shard_name(1, RANKS))
    for args in (("--no-fetch",), ()):
        code, doc = verify_json(*args, str(run_dir))
        assert code == 1, doc
        (failed,) = [r for r in doc["results"] if not r["ok"]]
        assert failed["step"] == 3
        assert [c["detail"] for c in failed["checks"] if not c["ok"]] == [
            f"shard of rank 1 of {RANKS}: missing"
        ]
    # All of a step's data gone, as a prune deletes it, but no signed record says so.
    delete_step_data(project, run_dir, 5)
    assert [p.name for p in step_directory(run_dir, 5).iterdir()] == [
        ".gitignore",
        STEP_MANIFEST,
    ]
    result = run_cli("verify", "--no-fetch", str(run_dir))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line == (
        f"kaudit: error: {step_directory(run_dir, 5) / INDEX_NAME}: shard index not found "
        "(no signed retention record prunes it)"
    )
    code, doc = verify_json("--no-fetch", str(run_dir))
    assert code == 2
    assert [e["path"] for e in doc["errors"]] == [str(step_directory(run_dir, 5) / INDEX_NAME)]
    assert all(not file_digest(r)["skipped"] for r in doc["results"])  # none taken as pruned


def test_a_forged_pruning_record_in_a_step_manifest_does_not_excuse_deleted_data(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run_dir = sharded(project, keep=None)
    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    evil = untrusted_key("evil")
    project.trust_store().add(evil.private_key.public_key(), "evil")
    newest = step_manifest(run_dir, SHARDED_STEPS)
    statement = json.loads(ka.read_manifest(newest).envelope.payload)
    statement["predicate"]["pruned"] = [{"step": 2, "manifest": sha256(step_manifest(run_dir, 2))}]
    newest.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), evil)))
    delete_step_data(project, run_dir, 2)
    result = run_cli("verify", "--no-fetch", "--trusted-key", str(owner), str(run_dir))
    assert result.exit_code == 2, result.output
    assert "no signed retention record prunes it" in result.stderr
    assert str(step_directory(run_dir, 2)) in result.stderr


def test_a_restore_passes_over_pruned_steps_to_the_newest_kept_one_that_verifies(
    project: Project, key: SigningKey
) -> None:
    run_dir = sharded(project, keep=2, keep_every=4)
    # The two newest kept steps each lose a shard: step 4 (kept for ever) is what is left.
    shard_path(step_directory(run_dir, 8), 1, RANKS).unlink()
    shard_path(step_directory(run_dir, 7), 2, RANKS).unlink()

    def restart(comm: ThreadRanks) -> tuple[int | None, Any]:
        with ka.Run("r", root=project.root / "checkpoints", comm=comm, asynchronous=False) as r:
            r.restore()
            return r.step, r.restored_from

    with pytest.warns(CheckpointSkipped) as caught:
        restored = on_ranks(RANKS, restart)
    assert restored == [(4, step_directory(run_dir, 4))] * RANKS
    said = sorted(str(w.message).removeprefix(str(run_dir) + "/") for w in caught)
    # Steps 5 and 6, pruned by a signed record, are not candidates at all: only the two
    # kept steps that lost a shard are passed over, each by the rank that lost it.
    assert [w.split(": ")[0:2] for w in said] == [
        ["step-00000007", "skipped (rank 2)"],
        ["step-00000008", "skipped (rank 1)"],
    ]
    assert sharded_steps_with_data(run_dir) == [4, 7, 8]


def test_sharded_steps_prune_the_single_file_steps_before_them_and_the_run_verifies(
    project: Project, key: SigningKey
) -> None:
    """A run written on one process, then on three ranks: one order of steps."""
    run_dir = run(project, keep=None)  # steps 1-6, one file each
    # 7-9 on 3 ranks: a new chain in the same directory, as the restore says.
    with pytest.warns(CheckpointSkipped, match="written by one process"):
        sharded_run(project, range(STEPS + 1, STEPS + 4), keep=2, run_id="ret")
    assert sorted(p.name for p in run_dir.glob("step-*")) == [
        *(f"step-{s:08d}.h5.kaudit.json" for s in range(1, STEPS + 1)),
        *(f"step-{s:08d}" for s in range(STEPS + 1, STEPS + 4)),
    ]  # every single-file step pruned, its manifest left
    assert sharded_steps_with_data(run_dir) == [STEPS + 2, STEPS + 3]
    code, doc = verify_json("--no-fetch", str(run_dir))
    assert code == 0, doc
    by_step = {r["step"]: r for r in doc["results"]}
    # Step 7's record pruned steps 1-5 (files), step 8's step 6 (a file), step 9's step 7.
    for step in range(1, STEPS):
        assert file_digest(by_step[step])["detail"] == (
            f"data pruned by retention (signed record in {pruner_name(STEPS + 1)}): not checked"
        )
    assert pruner_name(STEPS + 2) in file_digest(by_step[STEPS])["detail"]
    assert pruner_name(STEPS + 3) in file_digest(by_step[STEPS + 1])["detail"]
    assert doc["summary"]["data_checked"] == 2
