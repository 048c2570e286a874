"""The list of ledger chunks a replayed program leaves is its output, and may be hostile:
read bounded, never through a link, and anything but a list of well-formed chunks in
order is one ReplayError line (exit 2), not a comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.errors import ReplayError, Stage
from kronos_audit.replay.ledger import LEDGER_FILE_LIMIT, replayed_chunks
from kronos_audit.supervise.protocol import LEDGER_FILE

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
