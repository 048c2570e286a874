"""A job array's parts as a certificate of the third version commits to them: one line each.

A Slurm job array of ten thousand tasks has ten thousand parts (each task's run at its
last checkpoint). A certificate that named each one as a part and as an in-toto subject
grew by some 300 bytes a task; one of the third version (``campaign/v3``) signs instead
the root of an RFC 9162 Merkle tree over one canonical JSON line a part
(:func:`part_line`: its number, its run, its last step, that step's manifest and the
manifest's sha256, its task and the array's size), in part order. The lines are stored
as the batches' records are (:mod:`kronos_audit.statement.records`): in content-addressed
chunks of :data:`~kronos_audit.statement.records.PER_CHUNK` lines and an index, in the
same ``NAME.records/`` directory, so they are tracked, pushed and fetched with them.
"""

from __future__ import annotations

import json

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.statement.records import PER_CHUNK

PART_LIMIT = 8192
"""The longest a part's line may be, in bytes (a manifest's path is at most 4,096
characters, a run id at most 255)."""
PART_CHUNK_LIMIT = PER_CHUNK * (PART_LIMIT + 1)
"""The most bytes a chunk of part lines is read with."""
PART_RULE = "RFC 9162 Merkle tree of the parts' lines in part order"
MAX_PARTS = 4_000_000
"""Most parts a certificate commits to: Slurm's own bound on an array's size
(``MaxArraySize``); the parts' index is then 2 MB."""
_FIELDS = ["manifest", "part", "run", "sha256", "step", "task", "tasks"]
_HEX = frozenset("0123456789abcdef")


def part_line(
    part: int, run: str, step: int, manifest: str, sha256: str, task: int, tasks: int
) -> bytes:
    """Part ``part``'s line, as the tree's leaf holds it: canonical JSON, one line."""
    return canonical_json(
        {
            "manifest": manifest,
            "part": part,
            "run": run,
            "sha256": sha256,
            "step": step,
            "task": task,
            "tasks": tasks,
        }
    )


def parse_part_line(line: bytes) -> tuple[int, str, int, str, str, int, int]:
    """``(part, run, step, manifest, sha256, task, tasks)`` of a part's line; ValueError
    for a line that is not one (canonical JSON of exactly those fields, well typed and
    within their bounds)."""
    if len(line) > PART_LIMIT:
        raise ValueError(f"a part's line of {len(line):,} bytes, more than {PART_LIMIT:,}")
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError("a part's line that is not JSON") from None
    if not isinstance(obj, dict) or sorted(obj) != _FIELDS:
        raise ValueError("a part's line without exactly its seven fields")
    part, run, step, manifest, sha256, task, tasks = (
        obj["part"],
        obj["run"],
        obj["step"],
        obj["manifest"],
        obj["sha256"],
        obj["task"],
        obj["tasks"],
    )
    numbers = (part, step, task, tasks)
    if not all(type(v) is int and 0 <= v < 2**63 for v in numbers) or not (
        isinstance(run, str) and isinstance(manifest, str) and isinstance(sha256, str)
    ):
        raise ValueError("a part's line whose fields are not of their types")
    if not (0 < len(run) <= 255 and 0 < len(manifest) <= 4096):
        raise ValueError("a part's line whose run or manifest is empty or too long")
    if len(sha256) != 64 or not set(sha256) <= _HEX:
        raise ValueError("a part's line whose sha256 is not one")
    if part_line(part, run, step, manifest, sha256, task, tasks) != line:
        raise ValueError("a part's line that is not canonical JSON")
    return part, run, step, manifest, sha256, task, tasks


__all__ = [
    "MAX_PARTS",
    "PART_CHUNK_LIMIT",
    "PART_LIMIT",
    "PART_RULE",
    "parse_part_line",
    "part_line",
]
