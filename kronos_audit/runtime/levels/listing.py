"""Which steps of a run the memory and partner levels hold, as their directories show.

``kaudit status --level-dir /dev/shm/heat/node{node}`` lists them beside the durable
steps. A level's steps are in node-local RAM: only those of the directories this machine
sees are listed, and only while they exist (a job's RAM directories usually go with the
job). Nothing is verified (a restore verifies what it takes).
"""

from __future__ import annotations

import glob
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.layout import STEP_MANIFEST, parse_name, step_directory
from kronos_audit.errors import Error
from kronos_audit.runtime.levels.store import (
    LEVEL_KEY,
    MEMORY,
    PARTNER,
    PARTNERS,
    level_steps,
    read_file,
)

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


def span(seconds: float) -> str:
    """Seconds as a reader takes them in: ``0.05s``, ``46s``, ``3.8min``, ``3.4h``."""
    value, unit = (
        (seconds, "s")
        if seconds < 120
        else (seconds / 60, "min")
        if seconds < 7200
        else (seconds / 3600, "h")
    )
    return f"{value:.2g}{unit}" if value < 10 else f"{value:.0f}{unit}"


def plan_text(seconds: Mapping[str, float]) -> str:
    """Each level's interval in a few words: ``memory every 46s, durable every 3.4h``."""
    ordered = sorted(seconds.items(), key=lambda item: item[1])  # the cheapest level first
    return ", ".join(f"{name} every {span(s)}" for name, s in ordered)


def planned(directories: Iterable[Path], run: str) -> tuple[int, dict[str, float]] | None:
    """The plan ``Auto.for_levels`` recorded in the newest memory step of ``run`` in
    ``directories`` that has one, with that step: each level's seconds between its steps.
    None without one. Read as status reads, unverified: a value that is not a map of
    level names to positive seconds is no plan."""
    newest: tuple[int, Path] | None = None
    for d in directories:
        for step in level_steps(d / run):
            if newest is None or step > newest[0]:
                newest = (step, step_directory(d / run, step) / STEP_MANIFEST)
    if newest is None:
        return None
    from kronos_audit.statement.manifest import parse_manifest

    try:
        manifest = parse_manifest(read_file(newest[1], 1 << 24), newest[1])
        raw = manifest.record.attributes[LEVEL_KEY]["plan"]
    except (Error, KeyError, TypeError, ValueError):
        return None
    plan = dict(raw.items()) if isinstance(raw, Mapping) else {}
    ok = all(
        isinstance(k, str) and isinstance(v, int | float) and math.isfinite(v) and v > 0
        for k, v in plan.items()
    )
    return (newest[0], {str(k): float(v) for k, v in plan.items()}) if ok and plan else None


__all__ = ["Held", "expand", "held_steps", "plan_text", "planned", "span"]
