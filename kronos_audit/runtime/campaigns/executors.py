"""The engines a campaign's batches run on: any object with
:class:`concurrent.futures.Executor`'s ``submit`` (a ``ProcessPoolExecutor``, Dask's
``client.get_executor()``, ``mpi4py.futures.MPIPoolExecutor``, Ray through
:class:`RayExecutor`), or none (this process).

kronos-audit distributes nothing itself. :func:`received` hands the engine the batches
not yet in the run's ledger in groups of consecutive ones, one call a group
(:mod:`~kronos_audit.runtime.campaigns.calls`: the user's function, the run seed, the
indices), its size chosen from what is left and the engine's worker slots
(:func:`slots`), or given (``per_call``). The call rebuilds each batch's own generator
on the worker (:func:`~kronos_audit.runtime.campaigns.ledger.batch_rng`: a function of
the seed and the index only) and calls ``fn(rng, **kwargs)``. Results are recorded as
they arrive, batch by batch, in any order, and each is offered to the run's checkpoint
policy (:meth:`~kronos_audit.runtime.campaigns.batches.Batches.map`); the tally, folded
from the ledger in index order, is bitwise a serial run's however the work was scheduled.

When the engine breaks (a ``BrokenProcessPool`` after a worker was killed) or a batch
raises, no new batch is submitted; every result that arrived is recorded and
checkpointed, and :class:`~kronos_audit.errors.CampaignError` says in one line what
stopped it and how many batches are safe. Run again (``kaudit run`` does), only the
missing batches run.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from kronos_audit.errors import one_line
from kronos_audit.runtime.campaigns.calls import GroupCall, GroupResult, Indices, groups
from kronos_audit.runtime.campaigns.ledger import batch_rng

POLL = 0.05
"""Seconds between two looks at a Dask campaign's futures: what finished meanwhile is
fetched in one ``gather`` (one round trip to the client's event loop a look, not a
result), and recorded at most this late."""
IN_FLIGHT = 256
"""Calls submitted and not yet received, at most: enough to keep any pool busy, few
enough that a campaign of a million batches does not hold a million futures."""

Received = Iterator[tuple[int, Any, str | None]]
"""``(index, result, worker)`` of each batch, as they arrive."""


class Submitter(Protocol):
    """What :meth:`~kronos_audit.runtime.run.Run.map_batches` needs of an executor:
    ``submit``, returning a future."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]: ...


def _results(
    todo: Iterator[Indices], call: GroupCall, executor: Submitter, stop: list[BaseException]
) -> Received:
    """Each batch of ``todo``'s groups as the engine finishes its call, at most
    :data:`IN_FLIGHT` calls submitted ahead. On the first failure nothing more is
    submitted, what is in flight is waited for, its results are still given, and the
    failure is put in ``stop``."""
    pending: dict[cf.Future[GroupResult], Indices] = {}

    def fill() -> None:
        while not stop and len(pending) < IN_FLIGHT:
            group = next(todo, None)
            if group is None:
                return
            try:
                pending[executor.submit(call, group)] = group
            except Exception as e:  # an executor already broken refuses to submit
                stop.append(e)

    fill()
    while pending:
        done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
        for future in sorted(done, key=lambda f: pending[f].values[0]):
            group = pending.pop(future)
            error = future.exception()
            if error is None:
                yield from _unpacked(group, future.result(), stop)
            elif not stop:
                stop.append(_named(group, error))
        fill()


def _unpacked(group: Indices, value: GroupResult, stop: list[BaseException]) -> Received:
    """The batches of one call's :data:`~kronos_audit.runtime.campaigns.calls.GroupResult`;
    the batch that raised, if one did, put in ``stop``."""
    results, worker, failed = value
    for index, result in zip(group.values, results, strict=False):
        yield index, result, worker
    if failed is not None and not stop:
        stop.append(BatchFailed(*failed))


def _call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class RayExecutor:
    """Ray as a campaign's engine: ``run.map_batches(fn, n, executor=ka.RayExecutor())``
    in a program that has called ``ray.init()``. Each call (a group of batches) is one
    Ray task (``ray.remote``, with ``options`` such as ``num_cpus=1``), its result given
    back as a :class:`concurrent.futures.Future` (``ObjectRef.future()``).

    A task whose worker process died is run again by Ray (its ``max_retries``, 3 unless
    ``options`` say otherwise); its batches draw the same numbers, and the ledger keeps
    each once. A batch that raises stops the campaign as on any engine."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        """Ray's task options (``ray.remote(**options)``)."""
        self._remote: Any = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        if self._remote is None:
            import ray  # the ray extra, in a program that runs on Ray

            self._remote = ray.remote(**self.options)(_call) if self.options else ray.remote(_call)
        future: cf.Future[Any] = self._remote.remote(fn, *args, **kwargs).future()
        return future

    def slots(self) -> int:
        """The tasks the Ray cluster runs at once: its CPUs over a task's ``num_cpus``."""
        try:
            import ray

            cpus = float(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
        except Exception:  # Ray missing or not started: the first submit will say so
            return os.cpu_count() or 1
        per_task = self.options.get("num_cpus", 1)
        per_task = per_task if isinstance(per_task, int | float) and per_task > 0 else 1
        return max(1, int(cpus // per_task))


def dask_client(executor: object) -> tuple[Any, Mapping[str, Any]] | None:
    """The ``distributed.Client`` behind ``executor`` (the client itself, or its
    ``get_executor()``) and the keyword arguments that executor submits with; None for
    any other executor. Never imports Dask: a program that uses it has."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    if isinstance(executor, distributed.Client):
        return executor, {}
    wrapped = getattr(executor, "_client", None)
    if isinstance(executor, distributed.cfexecutor.ClientExecutor) and isinstance(
        wrapped, distributed.Client
    ):
        return wrapped, dict(getattr(executor, "_kwargs", {}))
    return None


def _dask_results(
    todo: Iterator[Indices],
    call: GroupCall,
    client: Any,
    options: Mapping[str, Any],
    stop: list[BaseException],
) -> Received:
    """As :func:`_results`, on a Dask client directly: the calls go out in windows of
    up to :data:`IN_FLIGHT` through one ``client.map`` each (one message a window, not one
    a call as ``submit`` sends), topped up when half have come back; the results are
    received as they complete, those finished together in one ``gather``."""
    pending: dict[Any, Indices] = {}

    def fill() -> None:
        if stop or len(pending) > IN_FLIGHT // 2:
            return
        window = list(itertools.islice(todo, IN_FLIGHT - len(pending)))
        if not window:
            return
        try:
            futures = client.map(call, window, pure=False, **options)
        except Exception as e:  # a client that is closed refuses to submit
            stop.append(e)
            return
        pending.update(zip(futures, window, strict=True))

    fill()
    while pending:
        # A future's state is kept by the client's event loop: reading it costs nothing.
        # Fetching a result does (a round trip to that loop, a few ms of client CPU): the
        # results that finished since the last look come in one gather.
        time.sleep(POLL)
        done = [f for f in pending if f.done()]
        finished = [f for f in done if f.status == "finished"]
        try:
            values = client.gather(finished) if finished else []
        except Exception as e:  # the scheduler, or the workers holding them, went away
            values = None
            if not stop:
                stop.append(_dask_engine_failure(client, e))
        for future, value in zip(finished, values, strict=True) if values is not None else ():
            yield from _unpacked(pending.pop(future), value, stop)
        for future in done:
            if future not in pending:
                continue
            group = pending.pop(future)
            if not stop:
                stop.append(_dask_failure(client, group, future))
        fill()


def _dask_failure(client: Any, group: Indices, future: Any) -> BaseException:
    """Why the future of ``group``'s call ended without a result: the call's own error
    when it raised on a worker; else (Dask cancelled it) the engine's failure, never a
    batch's."""
    if future.status == "error":
        try:
            error = future.exception()
        except BaseException as e:  # the client went away while asking
            error = e
        return _named(group, error or RuntimeError(f"Dask ended it {future.status}"))
    reason = str(future.status)
    if reason == "cancelled":  # done, so asking does not wait
        try:
            future.result()
        except BaseException as e:  # it raises why: Dask's reason, where it gives one
            reason = str(getattr(e, "reason", None) or reason)
    return _dask_engine_failure(client, None, reason=reason, group=group)


def _dask_engine_failure(
    client: Any,
    error: BaseException | None,
    *,
    reason: str | None = None,
    group: Indices | None = None,
) -> BaseException:
    """The engine's failure, never a batch's: results that could not be fetched (``error``:
    the scheduler or the workers holding them gone), or a call's future that Dask
    cancelled (``group``, Dask's ``reason``)."""
    why = reason or (describe(error) if error is not None else "unknown")
    status = str(getattr(client, "status", "unknown"))
    if group is not None and status == "running" and why != "scheduler-connection-lost":
        return EngineLost(f"Dask cancelled {_which(group)} ({why}), which did not fail itself")
    return EngineLost(f"the Dask engine was lost (client {status}; Dask: {why}); no batch failed")


def _serial(
    fn: Callable[..., Any],
    seed: int,
    todo: Sequence[int],
    kwargs: Mapping[str, Any],
    stop: list[BaseException] | None,
) -> Received:
    """``(index, result, None)`` of each batch, in this process, until one raises: put in
    ``stop``, or raised as it is without one (on several ranks, where a checkpoint is
    every rank's and one rank alone cannot take it: the launcher ends the job, and the
    restart runs what no checkpoint holds)."""
    for index in todo:
        try:
            result = fn(batch_rng(seed, index), **kwargs)
        except Exception as e:  # the batch's failure: what came before is kept
            if stop is None:
                raise
            stop.append(BatchFailed(index, e))
            return
        yield index, result, None


class BatchFailed(Exception):
    """A batch raised (or the call of a group, outside its batches): the message names
    it and its error."""

    def __init__(self, index: int, error: BaseException, *, group: Indices | None = None) -> None:
        where = f"batch {index}" if group is None else _which(group)
        super().__init__(f"{where}: {describe(error)}")
        self.index = index


class EngineLost(Exception):
    """The engine (not a batch) failed: its message says how."""


def _named(group: Indices, error: BaseException) -> BaseException:
    """The failure of ``group``'s call as a whole (its batches' own errors come back in
    its result): the engine's, or the call's, naming the batches it held."""
    if isinstance(error, cf.BrokenExecutor):
        return error  # the engine's failure, not the batch's
    # Ray wraps a task's own error (RayTaskError, whose message is Ray's coloured header
    # line): the failure is the error it carries.
    cause = getattr(error, "cause", None) if type(error).__module__.startswith("ray.") else None
    error = cause if isinstance(cause, BaseException) else error
    return BatchFailed(group.values[0], error, group=group)


def _which(group: Indices) -> str:
    first, last = group.values[0], group.values[-1]
    return f"batch {first}" if len(group) == 1 else f"the call of batches {first} to {last}"


def describe(error: BaseException) -> str:
    name = type(error).__name__
    return f"{name}: {one_line(error).rstrip('.')}" if str(error).strip() else name


def slots(executor: object) -> int:
    """The batches ``executor`` runs at once, as far as it says: a Dask cluster's worker
    threads, a Ray cluster's CPUs over a task's, a pool's ``max_workers``; else this
    machine's CPUs."""
    dask = dask_client(executor)
    if dask is not None:
        try:
            threads = sum(dask[0].nthreads().values())
        except Exception:  # a client not connected yet: the CPUs' count below
            threads = 0
        if threads > 0:
            return int(threads)
    if isinstance(executor, RayExecutor):
        return executor.slots()
    workers = getattr(executor, "_max_workers", None)
    if isinstance(workers, int) and workers > 0:
        return workers
    return os.cpu_count() or 1


def received(
    fn: Callable[..., Any],
    seed: int,
    todo: Sequence[int],
    kwargs: Mapping[str, Any],
    executor: Submitter | None,
    stop: list[BaseException] | None,
    per_call: int | None = None,
) -> Received:
    """``(index, result, worker)`` of each batch of ``todo`` as ``executor`` finishes it
    (None: in this process, in index order; a Dask client or its ``get_executor()``:
    through ``client.map``), ``per_call`` batches a call (None: chosen from the count and
    the engine's :func:`slots`, :func:`~kronos_audit.runtime.campaigns.calls.groups`). A
    failure ends what is submitted and is put in ``stop`` (without one, in this process, a
    batch's error is raised as it is)."""
    if executor is None or stop is None:
        return _serial(fn, seed, todo, kwargs, stop)
    call = GroupCall(fn, seed, kwargs, os.getpid())
    calls = groups(todo, slots(executor), per_call)
    dask = dask_client(executor)
    if dask is not None:
        return _dask_results(calls, call, *dask, stop)
    return _results(calls, call, executor, stop)


__all__ = [
    "IN_FLIGHT",
    "BatchFailed",
    "EngineLost",
    "RayExecutor",
    "Submitter",
    "dask_client",
    "describe",
    "received",
    "slots",
]
