"""The batch scheduler a run is under, as its manifests record it.

Under Slurm every checkpoint's manifest says which job wrote it and how often Slurm had
requeued that job (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``), so a chain that spans
requeues shows where each segment ran. Read from the environment Slurm gives the job;
a variable that is absent or not of the form Slurm writes is left out rather than
failing the checkpoint (the manifest schema admits only well-formed values).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from kronos_audit.statement.predicate import SchedulerRecord

_ID_MAX = 2**32 - 1  # Slurm's job and task ids are 32-bit
# Hostlists ("node[01-04],gpu1") and partition names are printable ASCII without spaces;
# anything else (a control character, say) is not from Slurm and is not recorded.
_TOKEN = re.compile(r"[!-~]+")


def _id(environ: Mapping[str, str], var: str) -> int | None:
    value = environ.get(var, "")
    if not (value.isascii() and value.isdigit()) or int(value) > _ID_MAX:
        return None
    return int(value)


def _token(environ: Mapping[str, str], var: str, limit: int) -> str | None:
    value = environ.get(var, "")
    return value if len(value) <= limit and _TOKEN.fullmatch(value) else None


def scheduler_record(environ: Mapping[str, str] | None = None) -> SchedulerRecord | None:
    """The Slurm job this process runs in (``environ``: default ``os.environ``), or None
    outside Slurm."""
    env = os.environ if environ is None else environ
    job_id = _id(env, "SLURM_JOB_ID")
    if job_id is None:
        return None
    # Slurm sets SLURM_RESTART_COUNT only once it has requeued the job.
    return SchedulerRecord(
        name="slurm",
        job_id=job_id,
        restart_count=_id(env, "SLURM_RESTART_COUNT") or 0,
        array_job_id=_id(env, "SLURM_ARRAY_JOB_ID"),
        array_task_id=_id(env, "SLURM_ARRAY_TASK_ID"),
        # SLURM_NODELIST is the older name of SLURM_JOB_NODELIST.
        nodelist=_token(env, "SLURM_JOB_NODELIST", 4096) or _token(env, "SLURM_NODELIST", 4096),
        partition=_token(env, "SLURM_JOB_PARTITION", 256),
    )


__all__ = ["scheduler_record"]
