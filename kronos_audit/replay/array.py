"""Which task of a job array a replayed step is: from the share its manifest signs.

A task of a Slurm job array (``ka.Run(..., task=ka.ArrayTask.from_slurm())``) learns its
share from its environment (``SLURM_ARRAY_TASK_ID``, ``KAUDIT_ARRAY_TASKS``), and every
manifest of it signs that share (``batches.share``). A replay gives the program exactly the
signed task, never the replaying machine's own (its ``SLURM_*`` would make the program
another task, or no task: :data:`~kronos_audit.supervise.protocol.ARRAY_ENV`). The share is
checked first against what else the manifest and its verified parent sign: a share that is
not its run's task, whose size is not the batches the step counts, or that the parent signs
otherwise, is refused before anything runs.
"""

from __future__ import annotations

from kronos_audit.errors import ReplayError, Stage
from kronos_audit.statement.campaign import TASK_SUFFIX, task_of
from kronos_audit.statement.manifest import Manifest
from kronos_audit.statement.predicate import Share


def _share(m: Manifest) -> Share | None:
    batches = m.record.batches
    return None if batches is None else batches.share


def _words(share: Share | None) -> str:
    if share is None:
        return "no share of a job array"
    return f"the share of task {share.task} of an array of {share.tasks} ({share.of} batches)"


def array_task(m: Manifest, parent: Manifest | None) -> tuple[int, int] | None:
    """``(task, tasks)`` of the job array's task whose step ``m`` is, as its share signs it;
    None when ``m`` signs no share. ReplayError (stage ``verify``), one line, when the share
    is not one of its array's tasks, is not its run's task (``CAMPAIGN.task-K``), holds
    another count of batches than the step's ``batches.total``, or is not the share its
    verified ``parent`` signs."""
    share = _share(m)
    before = None if parent is None else _share(parent)

    def refuse(why: str) -> ReplayError:
        return ReplayError(
            f"the manifest signs {_words(share)}, {why}", path=m.path, stage=Stage.VERIFY
        )

    if share is None:
        if before is not None:
            raise refuse(f"but its parent signs {_words(before)}")
        return None
    if not share.task < share.tasks:
        raise refuse("a task the array does not have (tasks are numbered from 0)")
    campaign, suffix, _ = m.run.rpartition(TASK_SUFFIX)
    if not suffix or task_of(m.run, campaign) != share.task:
        own = f"{campaign or m.run}{TASK_SUFFIX}{share.task}"
        raise refuse(f"but its run {m.run!r} is not that task's ({own})")
    batches = m.record.batches
    assert batches is not None
    if batches.total != share.size():
        raise refuse(f"which holds {share.size()} batches, but the step counts {batches.total}")
    if before is not None and (before.task, before.tasks, before.of) != (
        share.task,
        share.tasks,
        share.of,
    ):
        raise refuse(f"but its parent signs {_words(before)}")
    return share.task, share.tasks


__all__ = ["array_task"]
