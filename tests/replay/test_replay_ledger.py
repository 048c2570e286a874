"""The list of ledger chunks a replayed program leaves is its output, and may be hostile:
read bounded, never through a link, and anything but a list of well-formed chunks in
order is one ReplayError line (exit 2), not a comparison. The replay tells the program
where the recorded step's own chunk starts (or that it keeps its ledger in its file), so
step N's chunk is the one the run wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.errors import ReplayError, Stage
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay.ledger import LEDGER_FILE_LIMIT, ledger_from, replayed_chunks
from kronos_audit.runtime.steps.publisher import SignedPublisher
from kronos_audit.statement.manifest import Manifest
from kronos_audit.supervise.protocol import (
    LEDGER_ENV,
    LEDGER_FILE,
    LEDGER_IN_FILE,
    OUT_ENV,
    STOP_AT_ENV,
    ReplayInstruction,
)

SHA = "ab" * 32
MD5 = "cd" * 16


def chunk(first: int, count: int, sha256: str = SHA) -> dict[str, Any]:
    return {"sha256": sha256, "md5": MD5, "size": 100, "first": first, "count": count}


def listed(out: Path, doc: Any) -> Path:
    path = out / LEDGER_FILE
    path.write_text(json.dumps(doc))
    return path


def test_a_list_of_chunks_in_order_is_read_and_none_when_there_is_no_list(
    tmp_path: Path,
) -> None:
    assert replayed_chunks(tmp_path) is None
    listed(tmp_path, {"ledger": [chunk(0, 3), chunk(3, 2, "ef" * 32)]})
    chunks = replayed_chunks(tmp_path)
    assert chunks is not None
    assert [(c.first, c.count) for c in chunks] == [(0, 3), (3, 2)]


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"ledger": [chunk(0, 3), chunk(3, 2)]}, "names chunk abababababababab... twice"),
        ({"ledger": [chunk(0, 3), chunk(4, 2, "ef" * 32)]}, "out of order"),
        ({"ledger": [{**chunk(0, 3), "size": -1}]}, "is not a list of the ledger's chunks"),
        ({"ledger": [{**chunk(0, 3), "sha256": "../../x"}]}, "is not a list"),
        ({"ledger": [{**chunk(0, 3), "extra": 1}]}, "is not a list"),
        ({"ledger": [chunk(0, 1, f"{i:064x}") for i in range(1025)]}, "is not a list"),
        ({"ledger": {}}, "is not a list"),
        ([], "is not a list"),
    ],
)
def test_a_list_that_is_not_one_is_bad_output(tmp_path: Path, doc: Any, says: str) -> None:
    path = listed(tmp_path, doc)
    with pytest.raises(ReplayError) as refused:
        replayed_chunks(tmp_path)
    assert says in refused.value.message
    assert refused.value.stage is Stage.OUTPUT
    assert refused.value.path == path


def test_a_list_too_large_or_a_link_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILE
    path.write_bytes(b" " * (LEDGER_FILE_LIMIT + 1))
    with pytest.raises(ReplayError, match="bytes"):
        replayed_chunks(tmp_path)
    path.unlink()
    (tmp_path / "elsewhere").mkdir()
    path.symlink_to(listed(tmp_path / "elsewhere", {"ledger": [chunk(0, 3)]}))
    with pytest.raises(ReplayError, match="link"):
        replayed_chunks(tmp_path)


def test_the_replay_tells_the_program_where_the_recorded_step_keeps_its_ledger(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    def campaign(run_id: str, n: int) -> list[Manifest]:
        root = project.root / "checkpoints"
        with ka.Run(run_id, root=root, seed=3, every=ka.EverySteps(2)) as run:
            run.map_batches(lambda rng: rng.random(2), n)
        return [ka.read_manifest(root / run_id / f"step-{s:08d}.h5.kaudit.json") for s in (2, 4, 6)]

    with monkeypatch.context() as m:
        m.setattr("kronos_audit.checkpoint.ledger.CHUNKS_LIMIT", 2)
        two, four, six = campaign("chunked", 6)
    assert [(c.first, c.count) for c in six.record.ledger] == [(0, 6)]  # written whole again
    assert ledger_from(two, None) == 0
    assert ledger_from(four, two) == 2  # its own chunk, after its parent's
    assert ledger_from(six, four) == 0  # the whole ledger, from row 0
    assert ledger_from(four, four) == 4  # no chunk of its own
    with monkeypatch.context() as m:  # as a step kept its ledger before chunks
        m.setattr(SignedPublisher, "ledger_in_chunks", False)
        _, in_file, _ = campaign("in-file", 6)
    assert ledger_from(in_file, None) == LEDGER_IN_FILE

    for told in (0, 4, LEDGER_IN_FILE, None):
        instruction = ReplayInstruction(None, 6, project.root, None, ledger_from=told)
        monkeypatch.setattr(os, "environ", instruction.environ({}))
        assert ReplayInstruction.from_env() == instruction
    for garbage in ("chunks:", "chunks:-1", "chunks:٣", "4", "files"):
        monkeypatch.setattr(os, "environ", {STOP_AT_ENV: "6", OUT_ENV: "x", LEDGER_ENV: garbage})
        found = ReplayInstruction.from_env()
        assert found is not None
        assert found.ledger_from is None
