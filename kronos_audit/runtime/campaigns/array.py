"""One task of a job array: a run that does its share of a campaign's batches.

A Slurm job array (``sbatch --array=0-7 job.sbatch``) starts the same program once a
task; ``ka.Run("pi", task=ka.ArrayTask.from_slurm(), seed=2024)`` makes each task its own
run, ``pi.task-K`` beside the others, doing the batches ``i`` with ``i % tasks == K``
into a ledger of its own. The share is signed in every manifest of the task
(``batches.share``); ``kaudit campaign pi`` reads the tasks back, says which batches are
missing and the ``sbatch`` line that resubmits their tasks, merges the ledgers
(:func:`campaign_ledger`) and signs the certificate.

A resubmission of some tasks (``sbatch --array=3,5``) gives them ``SLURM_ARRAY_TASK_COUNT``
2: the array's size comes from ``KAUDIT_ARRAY_TASKS`` when it is set, which the printed
line exports.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.errors import CampaignError, UsageError
from kronos_audit.runtime.campaigns.ledger import Ledger
from kronos_audit.statement.campaign import TASK_SUFFIX, TASKS_ENV
from kronos_audit.statement.predicate import Share

MAX_TASKS = 4_000_000
"""Slurm's own bound on an array's size (``MaxArraySize``), and the schema's."""


@dataclass(frozen=True)
class ArrayTask:
    """Task ``task`` of ``tasks``: it does the batches ``i`` with ``i % tasks == task``."""

    task: int
    tasks: int
    script: str | None = None
    """The batch script the array runs (:meth:`from_slurm` asks Slurm), which ``kaudit
    campaign`` names in the line that resubmits missing tasks."""

    def __post_init__(self) -> None:
        for name in ("task", "tasks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"ArrayTask: {name} must be an int, got {value!r}")
        if not 0 < self.tasks <= MAX_TASKS or not 0 <= self.task < self.tasks:
            raise UsageError(
                f"ArrayTask: task {self.task} of {self.tasks}: a task is numbered from 0 "
                f"to tasks - 1, and an array has 1 to {MAX_TASKS} tasks"
            )

    @classmethod
    def from_slurm(cls, env: Mapping[str, str] | None = None) -> ArrayTask | None:
        """This Slurm array task (``SLURM_ARRAY_TASK_ID``; the array's size from
        ``KAUDIT_ARRAY_TASKS``, else ``SLURM_ARRAY_TASK_COUNT``), or None outside a job
        array: the same program then runs the whole campaign as one run."""
        env = os.environ if env is None else env
        task = _number(env, "SLURM_ARRAY_TASK_ID")
        if task is None:
            return None
        tasks = _number(env, TASKS_ENV)
        if tasks is None:
            tasks = _number(env, "SLURM_ARRAY_TASK_COUNT")
        if tasks is None:
            raise UsageError(
                "SLURM_ARRAY_TASK_ID is set but neither KAUDIT_ARRAY_TASKS nor "
                "SLURM_ARRAY_TASK_COUNT says how many tasks the array has"
            )
        if task >= tasks:
            raise UsageError(
                f"array task {task} of {tasks}: a campaign's tasks are numbered 0 to "
                f"{tasks - 1} (sbatch --array=0-{tasks - 1}); resubmitting some of them, "
                f"export {TASKS_ENV}=<the whole array's size>"
            )
        return cls(task, tasks, _batch_script(env))

    def run_id(self, campaign: str) -> str:
        """The task's own run: ``CAMPAIGN.task-K``."""
        return f"{campaign}{TASK_SUFFIX}{self.task}"

    def share(self, n: int) -> Share:
        """Its share of a campaign of ``n`` batches."""
        return Share(self.task, self.tasks, n, self.script)

    def holds(self, index: int) -> bool:
        """Batch ``index`` is in this task's share."""
        return int(index) % self.tasks == self.task


def task_run_id(campaign: str, task: object, seed: int | None) -> str:
    """The run id of array task ``task`` of ``campaign`` (``campaign`` itself for None).
    UsageError when ``task`` is not an :class:`ArrayTask`, or when no ``seed`` is given:
    the tasks would each draw a seed of their own, and the campaign would be no one seed's."""
    if task is None:
        return campaign
    if not isinstance(task, ArrayTask):
        raise UsageError(f"task must be a ka.ArrayTask, got {type(task).__name__}")
    if seed is None:
        raise UsageError(
            f"campaign {campaign!r}: an array task needs seed=, the same in every task"
        )
    return task.run_id(campaign)


def batch_share(task: ArrayTask | None, n: int, ledger: Iterable[int]) -> range:
    """The batches of ``range(n)`` a run does: all, or task ``task``'s share. UsageError
    when the restored ``ledger`` holds a batch outside it (the task's checkpoints were
    written as a task of an array of another size)."""
    if task is None:
        return range(n)
    for index in ledger:
        if not task.holds(index) or index >= n:
            raise UsageError(
                f"array task {task.task} of {task.tasks}: its checkpoints hold batch {index}, "
                f"which is not in its share of {n}: they were written for another array "
                f"size or campaign (set {TASKS_ENV} to the size it was started with)"
            )
    return range(task.task, n, task.tasks)


def campaign_ledger(
    campaign: str,
    root: str | Path = "checkpoints",
    *,
    trusted_keys: Sequence[str | Path] = (),
) -> Ledger:
    """The ledger of job-array campaign ``campaign``: every task's ledger under ``root``,
    read from its last checkpoint once that verifies (as ``kaudit verify`` does, with the
    project's trust store and ``trusted_keys``), merged. Its :meth:`~Ledger.reduce` folds
    in batch-index order, bitwise a serial run's tally. CampaignError, one line, while a
    batch is missing (with the ``sbatch`` line that runs its task again) or when the
    tasks' checkpoints are not one campaign's."""
    from kronos_audit.keys.anchors import TrustOptions, load_keyring
    from kronos_audit.project.repository import find_project
    from kronos_audit.verification.array import read_array
    from kronos_audit.verification.campaign import CampaignRefused, campaign_record
    from kronos_audit.verification.verifier import Verifier

    where = Path(root)
    project = find_project(where if where.is_dir() else Path.cwd())
    options = TrustOptions(trusted_keys=tuple(Path(k) for k in trusted_keys))
    verifier = Verifier(project, load_keyring(project.root, options))
    try:
        array = read_array(verifier, where, campaign)
    except CampaignRefused as e:
        raise CampaignError(str(e)) from None
    if array.incomplete:
        missing = sum(len(s.missing(array.n, array.tasks)) for s in array.incomplete)
        raise CampaignError(
            f"campaign {campaign!r}: {missing} of {array.n} batches missing, in "
            f"{len(array.incomplete)} task(s); run them again: {array.resubmit()}"
        )
    try:  # every batch in exactly one task, each in the share its manifests sign
        campaign_record(
            campaign, array.parts(), array.n, project_root=project.root, created="", tool=""
        )
    except CampaignRefused as e:
        raise CampaignError(str(e)) from None
    ledger = Ledger()
    for part in array.parts():
        for index, result in part.ledger.items():
            ledger.record(index, result, part.origins[index][0])
    ledger.take_new()
    return ledger


_COMMAND = re.compile(r" Command=(.+?) WorkDir=| Command=(\S+)")


def _batch_script(env: Mapping[str, str]) -> str | None:
    """The batch script of this Slurm job, as ``scontrol show job`` gives it (once, when
    the task starts); None when Slurm does not say, in time or at all."""
    job = env.get("SLURM_JOB_ID", "")
    scontrol = shutil.which("scontrol")
    if not job.isdigit() or scontrol is None:
        return None
    try:
        shown = subprocess.run(
            [scontrol, "show", "job", "--oneliner", job],
            capture_output=True,
            text=True,
            timeout=10,
            env={**env},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _COMMAND.search(" " + shown.stdout.strip())
    script = next((g for g in found.groups() if g), None) if found else None
    if script is None or not 0 < len(script) <= 4096 or not script.isprintable():
        return None
    return None if script == "(null)" else script


def _number(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or len(value) > 9:
        raise UsageError(f"{name}={value[:40]!r}: not a task number")
    return int(value)


__all__ = [
    "MAX_TASKS",
    "ArrayTask",
    "batch_share",
    "campaign_ledger",
    "task_run_id",
]
