"""Where a run keeps its steps, and the publisher and step format it writes them with.

A run on one rank writes one checkpoint file a step (h5py opens it as it is), on several a
directory of one shard per rank; one rank continuing a run written on several writes as it
was written (sharded steps of one shard), so its chain and layouts carry on. Under
``kaudit replay`` the publisher is the replay's, in the format of the step it was handed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.policy import Retention
from kronos_audit.runtime.steps.file import FileFormat
from kronos_audit.runtime.steps.interface import Publisher
from kronos_audit.runtime.steps.layouts import has_sharded_steps
from kronos_audit.runtime.steps.publisher import SignedPublisher
from kronos_audit.runtime.steps.replay import FileReplay, ReplayPublisher, ShardsReplay
from kronos_audit.runtime.steps.shards import ShardsFormat
from kronos_audit.supervise.protocol import ReplayInstruction

LOCAL_DIR_ENV = "KAUDIT_LOCAL_DIR"
"""Set per node: the directory, on that node's own storage and inside a clone of the
project, that holds this rank's files of the run (as ``Run(local_dir=...)``)."""


def run_directory(
    root: str | Path, run_id: str, push: bool, local_dir: str | Path | None
) -> tuple[Path, bool]:
    """The run's directory, and whether it is on this node's own storage (``local_dir``,
    or :data:`LOCAL_DIR_ENV`), where the DVC remote is where the ranks' steps meet: then
    ``push`` is required."""
    local = local_dir if local_dir is not None else os.environ.get(LOCAL_DIR_ENV) or None
    if local is not None and not push:
        raise UsageError(
            f"local_dir={str(local)!r} (or {LOCAL_DIR_ENV}): with no directory shared by "
            "the ranks the DVC remote is where a step meets: pass push=True too"
        )
    return Path(local if local is not None else root) / run_id, local is not None


def publisher_for(
    run_id: str,
    directory: Path,
    comm: Comm,
    replay: ReplayInstruction | None,
    *,
    seed: int,
    key: str | SigningKey | None,
    attributes: Mapping[str, Any] | None,
    push: bool,
    node_local: bool,
    allow_secret_files: bool,
    command: Sequence[str] | None,
    allow_rollback: bool,
    retention: Retention,
) -> Publisher:
    """The publisher of the step format the run writes (all ranks): the replay's under
    ``kaudit replay``, else the signed run's, of sharded steps on several ranks, on
    node-local storage or where the run's steps already are sharded."""
    if replay is not None:
        step_format = ShardsReplay if comm.size > 1 or replay.sharded else FileReplay
        return ReplayPublisher(run_id, replay, comm, seed=seed, step_format=step_format)
    sharded = (
        comm.size > 1
        or node_local
        or has_sharded_steps(directory, run_id, key, stacklevel=3, remote=push)
    )
    return SignedPublisher(
        run_id,
        directory,
        comm,
        step_format=ShardsFormat if sharded else FileFormat,
        seed=seed,
        key=key,
        attributes=attributes or {},
        allow_secret_files=allow_secret_files,
        command=command,
        retention=retention,
        push=push,
        node_local=node_local,
        allow_rollback=allow_rollback,
    )
