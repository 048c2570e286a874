"""A job array's campaign, read back from its tasks' runs.

Task ``K`` of campaign ``NAME`` is the run ``ROOT/NAME.task-K`` (see
:mod:`kronos_audit.runtime.campaigns.array`). Each task is read at its last checkpoint as a verifier
reads a campaign's part (:func:`~kronos_audit.verification.campaign.read_part`: the
manifest verified, the ledger from the verified bytes); the array's size, the campaign's
number of batches and the batch script come from the shares those manifests sign. What
``kaudit campaign`` shows, resubmits and certifies is this, never a file's word alone.

A task's last checkpoint is the newest one whose manifest's signature and place hold: a
file that only has a manifest's name (empty, unsigned, signed by a key no anchor holds,
copied from another step or run) decides nothing. It is named as ignored, and the task is
judged by the signed manifests below it, so one stray file can neither hide a finished
task's batches nor keep a resubmitted task from counting.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.layout import RunDirectory
from kronos_audit.errors import Error
from kronos_audit.statement.campaign import TASK_SUFFIX, TASKS_ENV, task_of
from kronos_audit.statement.predicate import Share
from kronos_audit.verification.campaign import CampaignRefused, Part, read_part
from kronos_audit.verification.chain import place_check
from kronos_audit.verification.verifier import Verifier


class NoSuchCampaign(CampaignRefused):
    """No run directory under the root is a task of the campaign named."""


@dataclass(frozen=True)
class TaskState:
    """One task of the array, as its checkpoints say."""

    task: int
    run: str
    part: Part | None
    """Its last checkpoint, verified (None: it has none, or it does not verify)."""
    problem: str | None = None
    """Why its last checkpoint could not be taken (None: it has none, or it was)."""
    ignored: tuple[str, ...] = ()
    """Manifests newer than its last checkpoint that decide nothing, each as ``PATH: why``
    (not a manifest, or its signature or place does not hold), newest first."""

    @property
    def share(self) -> Share | None:
        batches = None if self.part is None else self.part.manifest.record.batches
        return None if batches is None else batches.share

    @property
    def done(self) -> int:
        return 0 if self.part is None else len(self.part.ledger)

    def missing(self, n: int, tasks: int) -> list[int]:
        """The batches of its share of ``n`` its checkpoints do not hold."""
        have = {} if self.part is None else self.part.ledger
        return [i for i in range(self.task, n, tasks) if i not in have]


@dataclass(frozen=True)
class ArrayCampaign:
    """Every task of campaign :attr:`campaign`'s array, in task order."""

    campaign: str
    tasks: int
    n: int
    script: str | None
    """The batch script the tasks' manifests name (None: they do not)."""
    states: tuple[TaskState, ...]
    strays: tuple[str, ...]
    """Run directories named as tasks of the campaign that are not of this array."""

    @property
    def incomplete(self) -> list[TaskState]:
        """The tasks with batches still to do (or whose checkpoints do not verify)."""
        return [s for s in self.states if s.missing(self.n, self.tasks)]

    @property
    def done(self) -> int:
        return sum(s.done for s in self.states)

    def share(self, task: int) -> int:
        """How many batches task ``task``'s share holds."""
        return len(range(task, self.n, self.tasks))

    def parts(self) -> list[Part]:
        """The parts a certificate signs: the tasks that hold batches."""
        return [s.part for s in self.states if s.part is not None and s.part.ledger]

    def resubmit(self, script: str | None = None) -> str | None:
        """The ``sbatch`` line that runs the incomplete tasks again, with ``script``
        (default: the one the manifests name); None when none is incomplete."""
        todo = [s.task for s in self.incomplete]
        if not todo:
            return None
        name = script or self.script or "SCRIPT"
        return (
            f"sbatch --array={array_spec(todo)} --export=ALL,{TASKS_ENV}={self.tasks} "
            f"{shlex.quote(name)}"
        )


def array_spec(tasks: Sequence[int]) -> str:
    """Task numbers as ``sbatch --array`` takes them: ``0-2,5,7-9``."""
    spans: list[list[int]] = []
    for t in sorted(tasks):
        if spans and spans[-1][1] == t - 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def read_array(verifier: Verifier, root: Path, campaign: str) -> ArrayCampaign:
    """Campaign ``campaign``'s tasks under ``root``, each read at its last checkpoint.
    CampaignRefused (one line) when no task of it is there, when none has a checkpoint
    that verifies (nothing then says how large the array is), or when the tasks' signed
    shares are not of one array."""
    found: dict[int, Path] = {}
    if root.is_dir():
        for entry in root.iterdir():
            task = task_of(entry.name, campaign)
            if task is not None and entry.is_dir() and not entry.is_symlink():
                found[task] = entry
    if not found:
        raise NoSuchCampaign(
            f"campaign {campaign!r}: no array task of it in {root} ({campaign}{TASK_SUFFIX}K)"
        )
    read: dict[int, TaskState] = {}
    for task, directory in sorted(found.items()):
        read[task] = _read_task(verifier, task, directory)
    shares = {(s.share.tasks, s.share.of) for s in read.values() if s.share is not None}
    if not shares:
        problems = "; ".join(f"task {s.task}: {s.problem}" for s in read.values() if s.problem)
        raise CampaignRefused(
            f"campaign {campaign!r}: no task has a checkpoint that verifies"
            + (f" ({problems})" if problems else "")
        )
    if len(shares) != 1:
        raise CampaignRefused(
            f"campaign {campaign!r}: its tasks sign shares of different arrays "
            f"({', '.join(f'{t} tasks of {n}' for t, n in sorted(shares))})"
        )
    ((tasks, n),) = shares
    states = []
    for task in range(tasks):
        state = read.get(task)
        if state is None:
            state = TaskState(task, f"{campaign}{TASK_SUFFIX}{task}", None)
        elif state.share is not None and state.share.task != task:
            state = TaskState(task, state.run, None, f"signs the share of task {state.share.task}")
        states.append(state)
    scripts = [s.share.script for s in states if s.share is not None and s.share.script]
    return ArrayCampaign(
        campaign,
        tasks,
        n,
        scripts[0] if scripts else None,
        tuple(states),
        tuple(read[t].run for t in sorted(read) if t >= tasks),
    )


def _read_task(verifier: Verifier, task: int, directory: Path) -> TaskState:
    """Task ``task`` at its newest checkpoint whose manifest's signature and place hold;
    every newer file named as a manifest is ignored, and said so."""
    run = RunDirectory(directory)
    found = sorted(run.canonical_manifests() + run.step_manifests(), reverse=True)
    ignored: list[str] = []
    for _, path in found:
        why = _undecided(verifier, path)
        if why is not None:
            ignored.append(f"{verifier.project.relative(path)}: {why}")
            continue
        try:
            part = read_part(verifier, path)
        except (CampaignRefused, Error) as e:
            return TaskState(task, directory.name, None, str(e), tuple(ignored))
        batches = part.manifest.record.batches
        if batches is None or batches.share is None:
            return TaskState(
                task,
                directory.name,
                None,
                "its checkpoints are not an array task's",
                tuple(ignored),
            )
        return TaskState(task, directory.name, part, ignored=tuple(ignored))
    return TaskState(task, directory.name, None, ignored=tuple(ignored))


def _undecided(verifier: Verifier, path: Path) -> str | None:
    """Why the manifest at ``path`` cannot decide its task's state (it is not a manifest,
    or its signature or place does not hold), or None when it can: only the manifest
    itself is read, nothing it names."""
    try:
        manifest = verifier.cache.read(path)
    except Error as e:
        return e.message
    signed = verifier.signature(manifest)
    if not signed.ok:
        return f"signature: {signed.detail}"
    place = place_check(verifier.project, manifest)
    if not place.ok:
        return f"place: {place.detail}"
    return None


__all__ = ["ArrayCampaign", "NoSuchCampaign", "TaskState", "array_spec", "read_array"]
