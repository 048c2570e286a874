"""Which steps of a run the memory and partner levels hold, as their directories show.

``kaudit status --level-dir /dev/shm/heat/node{node}`` lists them beside the durable
steps. A level's steps are in node-local RAM: only those of the directories this machine
sees are listed, and only while they exist (a job's RAM directories usually go with the
job). Nothing is verified (a restore verifies what it takes).
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.layout import parse_name, step_directory
from kronos_audit.runtime.levels.store import MEMORY, PARTNER, PARTNERS, level_steps

MAX_DIRECTORIES = 1024
"""Level directories a template may expand to, at most."""


@dataclass(frozen=True)
class Held:
    """A step of a run on one level, over every directory given."""

    run: str
    """The run."""
    step: int
    """The step."""
    level: str
    """``memory`` (ranks' own copies) or ``partner`` (copies kept for partners)."""
    shards: int
    """How many shards of it are there, over the directories."""

    def to_json_obj(self) -> dict[str, object]:
        return {"run": self.run, "step": self.step, "level": self.level, "shards": self.shards}


def expand(templates: Sequence[str]) -> list[Path]:
    """The directories ``templates`` name: ``{node}`` in one stands for any node."""
    found: list[Path] = []
    for template in templates:
        pattern = glob.escape(template).replace(glob.escape("{node}"), "*")
        matched = sorted(glob.glob(pattern)) if "{node}" in template else [template]
        found += [Path(p) for p in matched[:MAX_DIRECTORIES] if Path(p).is_dir()]
    return found


def _shards(directory: Path) -> int:
    try:
        return sum(1 for p in directory.iterdir() if (n := parse_name(p.name)) and n.count)
    except OSError:
        return 0


def held_steps(directories: Iterable[Path], runs: Iterable[str]) -> list[Held]:
    """The steps of ``runs`` the levels in ``directories`` hold, by run, step and level."""
    counts: dict[tuple[str, int, str], int] = {}
    dirs = list(directories)
    for run in sorted(set(runs)):
        for d in dirs:
            for level, where in ((MEMORY, d / run), (PARTNER, d / PARTNERS / run)):
                for step in level_steps(where):
                    key = (run, step, level)
                    counts[key] = counts.get(key, 0) + _shards(step_directory(where, step))
    return [Held(r, s, lvl, n) for (r, s, lvl), n in sorted(counts.items())]


__all__ = ["Held", "expand", "held_steps"]
