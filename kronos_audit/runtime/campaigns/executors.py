"""The engines a campaign's batches run on: any object with
:class:`concurrent.futures.Executor`'s ``submit`` (a ``ProcessPoolExecutor``, Dask's
``client.get_executor()``, ``mpi4py.futures.MPIPoolExecutor``, Ray through
:class:`RayExecutor`), or none (this process).

kronos-audit distributes nothing itself. :func:`received` hands the engine one call a
batch not yet in the run's ledger (:class:`BatchCall`: the user's function, the run
seed, the index), which rebuilds the batch's own generator on the worker
(:func:`~kronos_audit.runtime.campaigns.ledger.batch_rng`: a function of the seed and the index
only) and calls ``fn(rng, **kwargs)``. Results are recorded as they arrive, in any order,
and each is offered to the run's checkpoint policy
(:meth:`~kronos_audit.runtime.campaigns.batches.Batches.map`); the tally, folded from the ledger in
index order, is bitwise a serial run's however the work was scheduled.

When the engine breaks (a ``BrokenProcessPool`` after a worker was killed) or a batch
raises, no new batch is submitted; every result that arrived is recorded and
checkpointed, and :class:`~kronos_audit.errors.CampaignError` says in one line what
stopped it and how many batches are safe. Run again (``kaudit run`` does), only the
missing batches run.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kronos_audit.errors import one_line
from kronos_audit.runtime.campaigns.ledger import batch_rng, this_worker

POLL = 0.05
"""Seconds between two looks at a Dask campaign's futures: what finished meanwhile is
fetched in one ``gather`` (one round trip to the client's event loop a look, not a
result), and recorded at most this late."""
IN_FLIGHT = 256
"""Batches submitted and not yet received, at most: enough to keep any pool busy, few
enough that a campaign of a million batches does not hold a million futures."""


class Submitter(Protocol):
    """What :meth:`~kronos_audit.runtime.run.Run.map_batches` needs of an executor:
    ``submit``, returning a future."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]: ...


@dataclass(frozen=True)
class BatchCall:
    """One batch, as sent to a worker: picklable when ``fn`` and ``kwargs`` are."""

    fn: Callable[..., Any]
    seed: int
    index: int
    kwargs: Mapping[str, Any]

    def __call__(self) -> tuple[Any, str]:
        """The batch's result, and the worker that ran it."""
        return self.fn(batch_rng(self.seed, self.index), **self.kwargs), this_worker()


def _results(
    calls: Iterator[BatchCall], executor: Submitter, stop: list[BaseException]
) -> Iterator[tuple[int, Any, str | None]]:
    """``(index, result, worker)`` as the engine finishes them, at most :data:`IN_FLIGHT`
    submitted ahead. On the first failure nothing more is submitted, what is in flight is
    waited for, its results are still given, and the failure is put in ``stop``."""
    pending: dict[cf.Future[Any], int] = {}

    def fill() -> None:
        while not stop and len(pending) < IN_FLIGHT:
            call = next(calls, None)
            if call is None:
                return
            try:
                pending[executor.submit(call)] = call.index
            except Exception as e:  # an executor already broken refuses to submit
                stop.append(e)

    fill()
    while pending:
        done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
        for future in sorted(done, key=pending.__getitem__):
            index = pending.pop(future)
            error = future.exception()
            if error is None:
                yield index, *future.result()
            elif not stop:
                stop.append(_named(index, error))
        fill()


@dataclass(frozen=True)
class BatchRunner:
    """Batches of one campaign, as sent to a Dask worker once per ``client.map``: called
    with an index, the batch's result and the worker that ran it."""

    fn: Callable[..., Any]
    seed: int
    kwargs: Mapping[str, Any]

    def __call__(self, index: int) -> tuple[Any, str]:
        return BatchCall(self.fn, self.seed, index, self.kwargs)()


def _call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class RayExecutor:
    """Ray as a campaign's engine: ``run.map_batches(fn, n, executor=ka.RayExecutor())``
    in a program that has called ``ray.init()``. Each batch is one Ray task
    (``ray.remote``, with ``options`` such as ``num_cpus=1``), its result given back as a
    :class:`concurrent.futures.Future` (``ObjectRef.future()``).

    A task whose worker process died is run again by Ray (its ``max_retries``, 3 unless
    ``options`` say otherwise); the batch draws the same numbers, and the ledger keeps
    it once. A task that raises is the batch's failure, and stops the campaign as on any
    engine."""

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
    todo: Iterator[int],
    runner: BatchRunner,
    client: Any,
    options: Mapping[str, Any],
    stop: list[BaseException],
) -> Iterator[tuple[int, Any, str | None]]:
    """As :func:`_results`, on a Dask client directly: the batches go out in windows of
    up to :data:`IN_FLIGHT` through one ``client.map`` each (one message a window, not one
    a batch as ``submit`` sends), topped up when half have come back; the results are
    received as they complete, those finished together in one ``gather``."""
    pending: dict[Any, int] = {}

    def fill() -> None:
        if stop or len(pending) > IN_FLIGHT // 2:
            return
        window = list(itertools.islice(todo, IN_FLIGHT - len(pending)))
        if not window:
            return
        try:
            futures = client.map(runner, window, pure=False, **options)
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
            yield pending.pop(future), *value
        for future in done:
            if future not in pending:
                continue
            index = pending.pop(future)
            if not stop:
                stop.append(_dask_failure(client, index, future))
        fill()


def _dask_failure(client: Any, index: int, future: Any) -> BaseException:
    """Why batch ``index``'s future ended without a result: the batch's own error when
    it raised on a worker; else (Dask cancelled it) the engine's failure, never the
    batch's."""
    if future.status == "error":
        try:
            error = future.exception()
        except BaseException as e:  # the client went away while asking
            error = e
        return _named(index, error or RuntimeError(f"Dask ended it {future.status}"))
    reason = str(future.status)
    if reason == "cancelled":  # done, so asking does not wait
        try:
            future.result()
        except BaseException as e:  # it raises why: Dask's reason, where it gives one
            reason = str(getattr(e, "reason", None) or reason)
    return _dask_engine_failure(client, None, reason=reason, index=index)


def _dask_engine_failure(
    client: Any, error: BaseException | None, *, reason: str | None = None, index: int | None = None
) -> BaseException:
    """The engine's failure, never a batch's: results that could not be fetched (``error``:
    the scheduler or the workers holding them gone), or a batch's future that Dask
    cancelled (``index``, Dask's ``reason``)."""
    why = reason or (describe(error) if error is not None else "unknown")
    status = str(getattr(client, "status", "unknown"))
    if index is not None and status == "running" and why != "scheduler-connection-lost":
        return EngineLost(f"Dask cancelled batch {index} ({why}), which did not fail itself")
    return EngineLost(f"the Dask engine was lost (client {status}; Dask: {why}); no batch failed")


def _serial(
    calls: Iterator[BatchCall], stop: list[BaseException] | None
) -> Iterator[tuple[int, Any, str | None]]:
    """``(index, result, None)`` of each call, in this process, until one raises: put in
    ``stop``, or raised as it is without one (on several ranks, where a checkpoint is
    every rank's and one rank alone cannot take it: the launcher ends the job, and the
    restart runs what no checkpoint holds)."""
    for call in calls:
        try:
            result, _ = call()
        except Exception as e:  # the batch's failure: what came before is kept
            if stop is None:
                raise
            stop.append(BatchFailed(call.index, e))
            return
        yield call.index, result, None


class BatchFailed(Exception):
    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"batch {index}: {describe(error)}")
        self.index = index


class EngineLost(Exception):
    """The engine (not a batch) failed: its message says how."""


def _named(index: int, error: BaseException) -> BaseException:
    if isinstance(error, cf.BrokenExecutor):
        return error  # the engine's failure, not the batch's
    # Ray wraps a task's own error (RayTaskError, whose message is Ray's coloured header
    # line): the batch's failure is the error it carries.
    cause = getattr(error, "cause", None) if type(error).__module__.startswith("ray.") else None
    return BatchFailed(index, cause if isinstance(cause, BaseException) else error)


def describe(error: BaseException) -> str:
    name = type(error).__name__
    return f"{name}: {one_line(error).rstrip('.')}" if str(error).strip() else name


def received(
    fn: Callable[..., Any],
    seed: int,
    todo: Iterator[int],
    kwargs: Mapping[str, Any],
    executor: Submitter | None,
    stop: list[BaseException] | None,
) -> Iterator[tuple[int, Any, str | None]]:
    """``(index, result, worker)`` of each batch of ``todo`` as ``executor`` finishes it
    (None: in this process, in index order; a Dask client or its ``get_executor()``:
    through ``client.map``). A failure ends what is submitted and is put in ``stop``
    (without one, in this process, a batch's error is raised as it is)."""
    dask = dask_client(executor)
    if dask is not None and stop is not None:
        return _dask_results(todo, BatchRunner(fn, seed, kwargs), *dask, stop)
    calls = (BatchCall(fn, seed, i, kwargs) for i in todo)
    if executor is not None and stop is not None:
        return _results(calls, executor, stop)
    return _serial(calls, stop)


__all__ = [
    "IN_FLIGHT",
    "BatchCall",
    "BatchFailed",
    "BatchRunner",
    "EngineLost",
    "RayExecutor",
    "Submitter",
    "dask_client",
    "describe",
    "received",
]
