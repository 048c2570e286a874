"""Sharded steps (kronos_audit.checkpoint.shards, sign_sharded_step, the sharded path of
verify): one signed step manifest over a shard index, every shard checked by rank, one
rank's restore reading only its own line and shard, hostile indexes refused in one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    TREE_NAME,
    shard_name,
    shard_path,
    step_directory,
)
from kronos_audit.checkpoint.location import Location
from kronos_audit.checkpoint.shards import (
    LINE_WIDTH,
    NoProof,
    ShardRecord,
    encode_index,
    merkle_root,
    parse_index,
    proven_line,
    read_index,
    write_index,
)
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.signing.sign import sign_checkpoint, sign_sharded_step
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import Manifest, build_statement, read_manifest
from kronos_audit.storage.tracking import track
from kronos_audit.verification.batch import verify
from kronos_audit.verification.verifier import Verifier
from tests.helpers import run_cli, write_checkpoint

LAYOUT = {"u": {"shape": [12, 4], "dtype": "float64", "block": 0}, "t": {"replicated": True}}


def write_shards(directory: Path, step: int, count: int) -> list[ShardRecord]:
    """Each rank's part of a step, as the ranks would write it: rank r holds the r-th block
    of a global array, hashed while written; the records rank 0 gathers."""
    directory.mkdir(parents=True, exist_ok=True)
    blocks = np.array_split(np.arange(48.0).reshape(12, 4) + step, count, axis=0)
    return [
        ShardRecord.of(
            rank,
            count,
            write_and_digest(
                shard_path(directory, rank, count),
                {"/u": blocks[rank], "/t": np.array(float(step))},
                md5=True,
            ),
        )
        for rank in range(count)
    ]


def sharded_step(
    project: Project,
    key: SigningKey,
    step: int,
    count: int = 3,
    *,
    parent: Path | Manifest | None = None,
    run_dir: Path | None = None,
) -> Manifest:
    """Step ``step`` of run ``heat`` written by ``count`` ranks and signed by rank 0."""
    directory = step_directory(run_dir or project.root / "checkpoints" / "heat", step)
    records = write_shards(directory, step, count)
    return sign_sharded_step(
        directory,
        records,
        project=project,
        key=key,
        run="heat",
        step=step,
        layout=LAYOUT,
        parent=parent,
        seeds=[7],
        command=["mpiexec", "-n", str(count), "python", "heat.py"],
    )


@pytest.fixture
def step(project: Project, key: SigningKey) -> Manifest:
    """Step 5 of a 3-rank run, whose parent is step 4, also sharded."""
    return sharded_step(project, key, 5, parent=sharded_step(project, key, 4))


def failures(manifest: Path) -> list[str]:
    """``check: detail`` of each check of ``manifest`` that fails."""
    (result,) = verify(manifest, fetch=False)
    return [f"{c.name}: {c.detail}" for c in result.failures]


def _project_of(path: Path) -> Project:
    return find_project(path)


def test_a_sharded_step_is_one_small_manifest_over_its_index(step: Manifest) -> None:
    directory = step.path.parent
    assert step.path == directory / (INDEX_NAME + ".kaudit.json")
    assert directory.name == "step-00000005"
    assert sorted(p.name for p in directory.iterdir()) == [
        INDEX_NAME,
        INDEX_NAME + ".kaudit.json",
        TREE_NAME,
        *(shard_name(r, 3) for r in range(3)),
    ]
    index = (directory / INDEX_NAME).read_bytes()
    assert len(index) == 3 * LINE_WIDTH
    assert step.subject_name == "checkpoints/heat/step-00000005/index.jsonl"
    assert step.subject_sha256 == hashlib.sha256(index).hexdigest()
    assert step.subject_md5 == hashlib.md5(index).hexdigest()
    shards = step.record.shards
    assert shards is not None
    assert (shards.count, shards.root) == (3, merkle_root(index, 3))
    assert shards.to_json_obj()["layout"] == LAYOUT
    assert step.record.datasets is None
    assert step.record.seeds == (7,)
    records = parse_index(index, 3)
    for record in records:  # each line is the shard's own digest, as the file has it
        digests = digest_file(directory / record.name)
        assert (record.sha256, record.size) == (digests.sha256, digests.size)
    assert shards.bytes == sum(r.size for r in records)
    assert step.record.parent is not None  # step 4's manifest


def test_a_sharded_step_verifies_with_its_chain(step: Manifest) -> None:
    (result,) = verify(step.path)
    assert result.ok, result.failures
    assert [c.name for c in result.checks] == [
        "signature",
        "place",
        "file digest",
        "shard index",
        "shards",
        "parent link",
    ]
    assert result.checks[4].detail.startswith("all 3 shards match (size and sha256")
    assert "chain of 2 manifests" in result.checks[-1].detail
    cli = run_cli("verify", str(step.path.parents[1]))
    assert cli.exit_code == 0, cli.output
    assert "2 manifest(s): 2 ok; data checked for 2" in cli.stdout


def test_single_and_sharded_steps_chain_alike(project: Project, key: SigningKey) -> None:
    run_dir = project.root / "checkpoints" / "heat"
    single = write_checkpoint(run_dir / "step-00000001.h5", seed=1)
    first = sign_checkpoint(
        single, digest_file(single), project=project, key=key, run="heat", step=1
    )
    second = sharded_step(project, key, 2, parent=first)
    third = sign_checkpoint(
        write_checkpoint(run_dir / "step-00000003.h5", seed=3),
        digest_file(run_dir / "step-00000003.h5"),
        project=project,
        key=key,
        run="heat",
        step=3,
        parent=second,
    )
    (result,) = verify(third.path)
    assert result.ok, result.failures
    assert "chain of 3 manifests back to step 1" in result.checks[-1].detail
    cli = run_cli("verify", str(run_dir))
    assert cli.exit_code == 0, cli.output
    assert "3 manifest(s): 3 ok; data checked for 3" in cli.stdout
    # A sharded link that is altered breaks the chain of whatever comes after it.
    second.path.write_bytes(second.path.read_bytes().replace(b'"payload"', b'"payload" '))
    (result,) = verify(third.path)
    assert [c.name for c in result.failures] == ["parent link"]


def test_a_missing_shard_fails_naming_its_rank(step: Manifest) -> None:
    shard_path(step.path.parent, 2, 3).unlink()
    assert failures(step.path) == ["shards: shard of rank 2 of 3: missing"]
    cli = run_cli("verify", str(step.path))
    assert cli.exit_code == 1
    assert "shards: shard of rank 2 of 3: missing" in cli.stdout


def test_a_corrupt_shard_fails_naming_its_rank(step: Manifest) -> None:
    shard = shard_path(step.path.parent, 1, 3)
    data = bytearray(shard.read_bytes())
    data[-9] ^= 0xFF  # same size, other bytes
    shard.write_bytes(bytes(data))
    (problem,) = failures(step.path)
    assert problem.startswith("shards: shard of rank 1 of 3: sha256 mismatch")
    shard.write_bytes(bytes(data) + b"more")
    (problem,) = failures(step.path)
    assert problem.startswith("shards: shard of rank 1 of 3: is ")
    assert "bytes, the index records" in problem
    (result,) = verify(step.path)
    assert result.data_corrupt


def test_every_bad_shard_is_named_and_none_is_opened_as_a_fifo(step: Manifest) -> None:
    directory = step.path.parent
    shard_path(directory, 0, 3).unlink()
    shard_path(directory, 2, 3).unlink()
    os.mkfifo(shard_path(directory, 2, 3))  # would block a plain open() forever
    assert failures(step.path) == [
        "shards: shard of rank 0 of 3: missing",
        "shards: shard of rank 2 of 3: is a FIFO, not a regular file",
    ]


def test_a_tampered_index_fails_its_digest_and_no_shard_is_read(step: Manifest) -> None:
    index = step.path.parent / INDEX_NAME
    data = index.read_bytes()
    # Rank 1's line pointed at rank 0's shard: a well-formed index, not the signed one.
    line0, line1 = data[:LINE_WIDTH], data[LINE_WIDTH : 2 * LINE_WIDTH]
    forged = json.loads(line1)
    forged["sha256"] = "0" * 64
    text = canonical_json(forged)
    index.write_bytes(line0 + text + b" " * (LINE_WIDTH - 1 - len(text)) + b"\n" + data[512:])
    shard_path(step.path.parent, 1, 3).unlink()  # would fail "shards" if it were looked at
    (problem,) = failures(step.path)
    assert problem.startswith("file digest: shard index sha256 ")
    assert "differs from the recorded" in problem
    index.write_bytes(data + data[:LINE_WIDTH])  # a line more than the signed count
    (problem,) = failures(step.path)
    assert problem.startswith("file digest: shard index")


def test_a_step_is_bound_to_its_step_and_run_directory(
    project: Project, key: SigningKey, step: Manifest
) -> None:
    run_dir = step.path.parents[1]
    moved = project.root / "elsewhere" / "heat"
    shutil.copytree(run_dir, moved)
    (result,) = verify(moved / "step-00000005" / (INDEX_NAME + ".kaudit.json"))
    assert result.ok, result.failures  # the run directory moved as a whole
    renamed = shutil.copytree(run_dir / "step-00000005", run_dir / "step-00000009")
    (problem, *_) = failures(renamed / (INDEX_NAME + ".kaudit.json"))
    assert problem.startswith("place: the step directory is step-00000009")
    other = shutil.copytree(run_dir, project.root / "checkpoints" / "wave")
    (problem, *_) = failures(other / "step-00000005" / (INDEX_NAME + ".kaudit.json"))
    assert problem.startswith("place: the step is in checkpoints/wave/step-00000005")


def test_one_rank_reads_only_its_own_line_and_shard(step: Manifest) -> None:
    directory = step.path.parent
    verifier = Verifier(_project_of(step.path))
    shard_path(directory, 0, 3).unlink()
    shard_path(directory, 2, 3).unlink()
    os.mkfifo(shard_path(directory, 2, 3))
    # Another rank's line altered: the whole index no longer hashes to the signed digest,
    # and rank 1 does not notice because it never hashes the whole index.
    index = directory / INDEX_NAME
    data = bytearray(index.read_bytes())
    data[2 * LINE_WIDTH + 10] ^= 0x01
    index.write_bytes(bytes(data))
    result = verifier.verify_rank(step.path, 1)
    assert result.ok, result.failures
    assert [c.name for c in result.checks] == [
        "signature",
        "place",
        "shard index",
        "shards",
        "parent link",
    ]
    assert result.checks[2].detail == "line 2 of 3 proven against the Merkle root"
    assert result.checks[3].detail == "shard of rank 1 of 3: size and sha256 match"
    assert result.checkpoint == shard_path(directory, 1, 3)
    assert result.data is Location.LOCAL  # its own shard, as the rank found it
    # The same step, verified whole, fails on everything rank 1 did not read.
    whole = verifier.verify(step.path)
    assert [c.name for c in whole.failures] == ["file digest"]
    assert whole.data is Location.CORRUPT
    assert not verifier.verify_rank(step.path, 2).ok  # its own line is the altered one


def test_one_rank_finds_its_own_shard_corrupt(step: Manifest) -> None:
    shard = shard_path(step.path.parent, 2, 3)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    verifier = Verifier(_project_of(step.path))
    result = verifier.verify_rank(step.path, 2)
    assert [c.detail[:38] for c in result.failures] == ["shard of rank 2 of 3: sha256 mismatch "]
    assert result.data is Location.CORRUPT
    other = verifier.verify_rank(step.path, 0)
    assert other.ok
    assert other.data is Location.LOCAL
    with pytest.raises(UsageError, match="no rank 3 in a step of 3 shards"):
        verifier.verify_rank(step.path, 3)


def test_without_a_usable_tree_a_rank_hashes_the_whole_index(step: Manifest) -> None:
    directory = step.path.parent
    verifier = Verifier(_project_of(step.path))
    tree = directory / TREE_NAME
    nodes = bytearray(tree.read_bytes())
    nodes[0] ^= 0x01  # rank 0's leaf, a sibling in rank 1's proof: not the signer's
    tree.write_bytes(bytes(nodes))
    result = verifier.verify_rank(step.path, 1)
    assert result.ok, result.failures
    assert [c.name for c in result.checks][2] == "file digest"  # the fallback, whole
    tree.unlink()
    assert verifier.verify_rank(step.path, 1).ok
    index = directory / INDEX_NAME
    data = bytearray(index.read_bytes())
    data[LINE_WIDTH + 30] ^= 0x01  # and now its own line too
    index.write_bytes(bytes(data))
    result = verifier.verify_rank(step.path, 1)
    assert [c.name for c in result.failures] == ["file digest"]


def test_an_unsigned_step_is_never_read_by_a_rank(
    project: Project, key: SigningKey, step: Manifest
) -> None:
    from tests.helpers import untrusted_key

    directory = step.path.parent
    records = parse_index((directory / INDEX_NAME).read_bytes(), 3)
    forged = sign_sharded_step(
        directory, records, project=project, key=untrusted_key("mallory"), run="heat", step=5
    )
    shard_path(directory, 1, 3).unlink()
    result = Verifier(project).verify_rank(forged.path, 1)
    assert [c.name for c in result.failures] == ["signature", "shards"]
    assert result.failures[1].skipped
    # Verified whole, the step's shards are not read either: only a FIFO would tell.
    os.mkfifo(shard_path(directory, 1, 3))
    whole = Verifier(project).verify(forged.path)
    assert [c.name for c in whole.failures] == ["signature", "shards"]
    assert whole.failures[1].detail == "not read: the step manifest does not verify"
    assert [c.name for c in whole.checks] == ["signature", "place", "shards", "parent link"]


# -- hostile indexes ------------------------------------------------------------------


def _record(index: int = 0, count: int = 2, **change: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "md5": "a" * 32,
        "name": shard_name(index, count),
        "rank": index,
        "sha256": "b" * 64,
        "size": 10,
    }
    obj.update(change)
    return obj


def _line(obj: dict[str, Any] | bytes) -> bytes:
    text = obj if isinstance(obj, bytes) else canonical_json(obj)
    return text + b" " * max(0, LINE_WIDTH - 1 - len(text)) + b"\n"


HOSTILE: dict[str, tuple[bytes, str]] = {
    "path traversal": (
        _line(_record(0, name="../../../etc/passwd")) + _line(_record(1)),
        "line 1: names '../../../etc/passwd', not 'rank-000000-of-000002.h5'",
    ),
    "absolute path": (
        _line(_record(0, name="/etc/passwd")) + _line(_record(1)),
        "line 1: names '/etc/passwd'",
    ),
    "another step's shard": (
        _line(_record(0)) + _line(_record(1, name=shard_name(1, 3))),
        "line 2: names 'rank-000001-of-000003.h5'",
    ),
    "duplicate rank": (
        _line(_record(0)) + _line(_record(0)),
        "line 2: holds rank 0 where rank 1 belongs",
    ),
    "ranks out of order": (
        _line(_record(1)) + _line(_record(0)),
        "line 1: holds rank 1 where rank 0 belongs",
    ),
    "rank as a bool": (
        _line(_record(0, rank=False)) + _line(_record(1)),
        "line 1: holds rank False",
    ),
    "huge line": (
        canonical_json(_record(0, pad="x" * 4000)) + b"\n" + _line(_record(1)),
        "shard index is 4,",
    ),
    "a line too many": (
        _line(_record(0)) + _line(_record(1)) + _line(_record(1)),
        "shard index is 768 bytes; 2 shards take 512",
    ),
    "a line too few": (_line(_record(0)), "shard index is 256 bytes; 2 shards take 512"),
    "no newline": (_line(_record(0))[:-1] + b" " + _line(_record(1)), "line 1: not 256 bytes"),
    "not JSON": (_line(b"{not json") + _line(_record(1)), "line 1: not JSON"),
    "not UTF-8": (_line(b'{"\xff"}') + _line(_record(1)), "line 1: not JSON"),
    "a key more": (_line(_record(0, x=1)) + _line(_record(1)), "line 1: not a record of"),
    "a duplicate key": (
        _line(canonical_json(_record(0))[:-1] + b',"size":11}') + _line(_record(1)),
        "line 1: not in canonical form",
    ),
    "spaces inside": (
        _line(json.dumps(_record(0), sort_keys=True).encode()) + _line(_record(1)),
        "line 1: not in canonical form",
    ),
    "upper-case digest": (
        _line(_record(0, sha256="B" * 64)) + _line(_record(1)),
        "line 1: sha256 is not 64 lower-case hex digits",
    ),
    "short md5": (
        _line(_record(0, md5="a" * 31)) + _line(_record(1)),
        "line 1: md5 is not 32 lower-case hex digits",
    ),
    "negative size": (
        _line(_record(0, size=-1)) + _line(_record(1)),
        "line 1: size is not a non-negative integer",
    ),
    "float size": (
        _line(_record(0, size=10.0)) + _line(_record(1)),
        "line 1: size is not a non-negative integer",
    ),
    "name not text": (_line(_record(0, name=7)) + _line(_record(1)), "line 1: name is not text"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_index_is_refused_in_one_line(case: str) -> None:
    data, expected = HOSTILE[case]
    with pytest.raises(CheckpointError) as caught:
        parse_index(data, 2)
    message = caught.value.message
    assert expected in message, message
    assert "\n" not in message
    assert len(message) < 200


def test_the_well_formed_index_of_the_hostile_cases_parses() -> None:
    records = parse_index(_line(_record(0)) + _line(_record(1)), 2)
    assert [r.name for r in records] == [shard_name(0, 2), shard_name(1, 2)]
    assert encode_index(records) == _line(_record(0)) + _line(_record(1))


def test_an_index_is_read_bounded_and_never_from_a_fifo(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(10 * 1024**3)  # sparse: reading it whole would take a while
    with pytest.raises(CheckpointError, match="shard index"):
        read_index(big, 2)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="FIFO"):
        read_index(fifo, 2)


def test_a_hostile_index_signed_by_a_trusted_key_fails_one_check(
    project: Project, key: SigningKey, step: Manifest
) -> None:
    """Even the signer's own index is parsed strictly: a name that climbs out of the step
    directory is refused before any shard is opened."""
    directory = step.path.parent
    data = _line(_record(0, 2, name="../../../../etc/passwd")) + _line(_record(1, 2))
    (directory / INDEX_NAME).write_bytes(data)
    predicate = json.loads(json.dumps(step.statement["predicate"], default=dict))
    predicate["shards"] = {"count": 2, "bytes": 20, "root": merkle_root(data, 2), "layout": {}}
    predicate["size"] = len(data)
    statement = build_statement(
        subject_name=step.subject_name,
        sha256=hashlib.sha256(data).hexdigest(),
        predicate=predicate,
    )
    step.path.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    assert failures(step.path) == [
        "shard index: shard index, line 1: names '../../../../etc/passwd', "
        "not 'rank-000000-of-000002.h5'"
    ]


# -- signing --------------------------------------------------------------------------


def test_signing_refuses_an_incomplete_or_misnamed_set(project: Project, key: SigningKey) -> None:
    directory = step_directory(project.root / "checkpoints" / "heat", 3)
    records = write_shards(directory, 3, 3)

    def sign(shards: Sequence[ShardRecord], where: Path = directory) -> Manifest:
        return sign_sharded_step(where, shards, project=project, key=key, run="heat", step=3)

    with pytest.raises(UsageError, match="line 2: holds rank 0 where rank 1 belongs"):
        sign([records[0], records[0], records[2]])
    with pytest.raises(UsageError, match=r"line 1: names 'rank-000000-of-000003\.h5', not"):
        sign([records[0], records[2]])  # a rank missing: the others are named for 3
    with pytest.raises(UsageError, match="line 1: names"):
        sign([ShardRecord(0, "../x.h5", "b" * 64, "a" * 32, 1), *records[1:]])
    with pytest.raises(UsageError, match="named step-00000003"):
        sign(records, project.root / "checkpoints" / "heat" / "step-3-copy")
    with pytest.raises(UsageError, match="1 to 1,000,000 shards"):
        sign([])
    assert not (directory / INDEX_NAME).exists()
    assert sign(records).step == 3


def test_the_step_manifest_does_not_grow_with_the_rank_count(
    project: Project, key: SigningKey
) -> None:
    """The records of 300 ranks are fabricated (signing reads no shard): the manifest of
    300 shards is the size of the one of 3, give or take the digits of two counts."""
    sizes = {}
    for count in (3, 300):
        directory = step_directory(project.root / "checkpoints" / f"n{count}", 1)
        directory.mkdir(parents=True)
        records = [
            ShardRecord(
                r,
                shard_name(r, count),
                hashlib.sha256(b"%d" % r).hexdigest(),
                hashlib.md5(b"%d" % r).hexdigest(),
                4096,
            )
            for r in range(count)
        ]
        m = sign_sharded_step(
            directory, records, project=project, key=key, run=f"n{count}", step=1, layout=LAYOUT
        )
        sizes[count] = m.path.stat().st_size
        assert (directory / INDEX_NAME).stat().st_size == count * LINE_WIDTH
    assert abs(sizes[300] - sizes[3]) <= 16, sizes


# -- fetching and --jobs ----------------------------------------------------------------


def test_missing_shards_are_fetched_by_their_signed_md5(step: Manifest) -> None:
    project = _project_of(step.path)
    directory = step.path.parent
    records = parse_index((directory / INDEX_NAME).read_bytes(), 3)
    for record in records:
        track(project, directory / record.name, record.md5, record.size, owned=True)
    shard_path(directory, 0, 3).unlink()
    shard_path(directory, 2, 3).unlink()
    result = Verifier(project, fetch=True).verify(step.path)
    assert result.ok, result.failures
    assert result.fetched
    assert digest_file(shard_path(directory, 2, 3)).sha256 == records[2].sha256
    shard_path(directory, 1, 3).unlink()
    rank = Verifier(project, fetch=True).verify_rank(step.path, 1)
    assert rank.ok, rank.failures
    assert rank.fetched


def test_jobs_give_the_same_answers(step: Manifest) -> None:
    run_dir = step.path.parents[1]
    shard_path(step.path.parent, 0, 3).unlink()
    shard = shard_path(step.path.parent, 2, 3)
    shard.write_bytes(shard.read_bytes()[::-1])
    outputs = {}
    for jobs in ("1", "2", "3", None):  # None: the default, the cores this process may use
        how = [] if jobs is None else ["--jobs", jobs]
        human = run_cli("verify", "--no-fetch", *how, str(run_dir))
        as_json = run_cli("verify", "--no-fetch", "--json", *how, str(run_dir))
        assert human.exit_code == as_json.exit_code == 1, human.output
        outputs[jobs] = (human.stdout, as_json.stdout)
    assert outputs["1"] == outputs["2"] == outputs["3"] == outputs[None]
    text, _ = outputs["2"]
    assert "shards: shard of rank 0 of 3: missing" in text
    assert "shards: shard of rank 2 of 3: sha256 mismatch" in text
    bad = run_cli("verify", "--jobs", "0", str(run_dir))
    assert bad.exit_code == 2


def test_a_program_without_a_main_guard_verifies_on_many_threads(step: Manifest) -> None:
    # The shards are hashed on threads, not in a process pool: a program read from stdin
    # (no file a spawned process could import, no `if __name__ == "__main__":`) verifies.
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from kronos_audit.project.repository import find_project\n"
        "from kronos_audit.verification.verifier import Verifier\n"
        "path = Path(sys.argv[1])\n"
        "result = Verifier(find_project(path), jobs=3).verify(path)\n"
        "print(result.ok, [c.name for c in result.failures])\n"
    )
    done = subprocess.run(
        [sys.executable, "-", str(step.path)],
        input=program,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True []", done.stdout + done.stderr


def test_a_missing_index_is_bad_input(step: Manifest) -> None:
    (step.path.parent / INDEX_NAME).unlink()
    result = run_cli("verify", "--no-fetch", str(step.path))
    assert result.exit_code == 2
    assert "shard index not found" in result.output


def test_reading_a_step_manifest_back(step: Manifest) -> None:
    again = read_manifest(step.path)
    assert again.record == step.record
    assert again.record.to_json_obj()["shards"]["count"] == 3


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13])
def test_every_rank_proves_its_line_and_only_its_line(tmp_path: Path, count: int) -> None:
    records = [
        ShardRecord(r, shard_name(r, count), f"{r:064x}", f"{r:032x}", r) for r in range(count)
    ]
    _, data, root = write_index(tmp_path, records)
    assert root == merkle_root(data, count)
    for rank in range(count):
        assert proven_line(tmp_path, rank, count, root) == records[rank]
    with pytest.raises(NoProof):  # another root: nothing proves against it
        proven_line(tmp_path, 0, count, "0" * 64)
    if count > 1:
        # A line swapped for another rank's (tree unchanged) proves nothing either.
        swapped = data[LINE_WIDTH : 2 * LINE_WIDTH] + data[LINE_WIDTH:]
        (tmp_path / INDEX_NAME).write_bytes(swapped)
        with pytest.raises(NoProof):
            proven_line(tmp_path, 0, count, root)


def test_show_tells_a_sharded_step_by_its_shards(step: Manifest) -> None:
    shown = run_cli("show", str(step.path))
    assert shown.exit_code == 0, shown.output
    assert "shards       3 ranks," in shown.stdout
    assert '"block": 0' in shown.stdout  # the recorded layout
    assert "a sharded step" in shown.stdout
    assert "not HDF5" not in shown.stdout
