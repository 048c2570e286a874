"""Which segments the gate replays: a reproducible sample from a seed, always including
the newest checkpoint of each run."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.layout import STEP_MANIFEST


@dataclass(frozen=True, order=True)
class Segment:
    """A checkpoint whose producing segment may be replayed."""

    run: str
    """Run id."""
    step: int
    """Its step."""
    manifest: Path
    """Its manifest."""


def run_directory(manifest: Path) -> Path:
    """The run directory of a checkpoint's manifest, or of a sharded step's (which is in
    its step's own directory, ``step-N/index.jsonl.kaudit.json``)."""
    return manifest.parent.parent if manifest.name == STEP_MANIFEST else manifest.parent


def _rng(seed: int, run: str) -> random.Random:
    # one stream per run, so adding a run does not change another run's sample
    digest = hashlib.sha256(f"{seed}\0{run}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def sample(segments: Iterable[Segment], per_run: int, seed: int) -> tuple[Segment, ...]:
    """Up to ``per_run`` segments of each run: its newest, then others drawn from
    ``seed``; the same input and seed give the same sample. Sorted by run and step."""
    by_run: dict[tuple[str, str], list[Segment]] = {}
    for s in segments:  # a run is its id in its directory
        by_run.setdefault((s.run, run_directory(s.manifest).as_posix()), []).append(s)
    chosen: list[Segment] = []
    if per_run <= 0:
        return ()
    for run in sorted(by_run):
        ordered: Sequence[Segment] = sorted(by_run[run])
        newest, older = ordered[-1], list(ordered[:-1])
        picked = _rng(seed, "\0".join(run)).sample(older, min(per_run - 1, len(older)))
        chosen += [newest, *picked]
    return tuple(sorted(chosen))
