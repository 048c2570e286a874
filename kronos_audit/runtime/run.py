"""The run loop: restore, step, checkpoint; survive faults and preemption.

::

    with ka.Run("heat-2d", root="checkpoints", seed=1234, every=ka.EverySteps(50)) as run:
        state = run.restore()                 # newest valid checkpoint's state, or None
        if state is None:
            state = init(run.rng)
        for step in run.steps(10_000):
            state = advance(state, run.rng)
            run.checkpoint(step, state)       # writes only when the policy says so

A training program hands over its objects as they are and gets them loaded in place::

    state = {"model": model, "opt": opt, "sched": sched}   # anything with state_dict()
    with ka.Run("train", seed=0, every=ka.EverySteps(100)) as run:
        run.restore(like=state)               # loads model, opt, sched in place (if any)
        for step in run.steps(5_000):
            train_one_batch(model, opt, sched)
            run.checkpoint(step, state)

The state may hold numpy arrays, torch tensors, JAX arrays and pytrees, Python numbers,
strings, bytes, None, dicts (any hashable keys), lists, tuples, NamedTuples and objects
with ``state_dict()``/``load_state_dict()``; they come back with their types
(:mod:`kronos_audit.checkpoint.codec.tree`). ``run.restore(step=N)`` reads an older checkpoint
(verified) without moving the run; ``run.all_steps()`` and ``run.latest_step()`` list them.

Checkpoints go to ``<root>/<run>/step-<N:08d>.h5``, each with a signed manifest chained to
the previous one. The checkpoint holds the state (each array a dataset named by its keys,
``/model/fc1.weight``, and ``/kaudit/tree``, the record of its structure and types), the
RNG states (``/rng``: ``run.rng``, Python's ``random`` and numpy's global generator, which
the run seeds, and torch's when the program uses torch) and the Monte Carlo ledger
(``/ledger``); ``rng``, ``ledger`` and ``kaudit`` are reserved at the top of the state.

On several ranks (under ``mpiexec``, ``srun`` or ``torchrun``, or with ``comm=``) every rank
runs the same loop: each writes its shard of a step into ``<root>/<run>/step-<N:08d>/``,
rank 0 signs the step once every shard is durable, the save decision and a preemption are
agreed, and restore takes the newest step valid on every rank, re-cut for another rank
count where ``layout=`` says how (:mod:`kronos_audit.runtime.steps.shards`). ``run.batches(n)``
deals the batches over the ranks, each to one, and every checkpoint gathers their results
(:class:`~kronos_audit.runtime.campaigns.split.Split`).

The loop is the same under ``kaudit replay``; where the checkpoints go and what they
become is its publisher's business (:mod:`kronos_audit.runtime.steps.interface`).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from kronos_audit.checkpoint.hdf5 import State
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel import Comm, detect
from kronos_audit.parallel.layout import Layout
from kronos_audit.provenance.dispatch import pin_dispatch
from kronos_audit.runtime import rng, uncaught
from kronos_audit.runtime.background import BackgroundWriter, Job, WriterStats
from kronos_audit.runtime.campaigns.array import ArrayTask, batch_share, task_run_id
from kronos_audit.runtime.campaigns.batches import Batches
from kronos_audit.runtime.campaigns.executors import Submitter
from kronos_audit.runtime.campaigns.ledger import Ledger, batch_rng
from kronos_audit.runtime.levels.auto import check_declared, schedule_for
from kronos_audit.runtime.levels.store import levels_for
from kronos_audit.runtime.policy import EverySeconds, Remote, Retention, SavePolicy
from kronos_audit.runtime.preemption import PreemptionGuard
from kronos_audit.runtime.ranks import LoopAgreement, rank_seed
from kronos_audit.runtime.restore import Restorer
from kronos_audit.runtime.saver import Saver
from kronos_audit.runtime.steps.choose import publisher_for, run_directory
from kronos_audit.runtime.steps.interface import Publisher
from kronos_audit.supervise.protocol import PREEMPTED_EXIT, Progress, ReplayInstruction


class Run:
    """One logical job: a chain of checkpoints in ``<root>/<run_id>/``.

    Use as a context manager: leaving the block waits for pending writes and raises any
    background failure. ``every`` is the :class:`~kronos_audit.runtime.policy.SavePolicy`
    asked after each step, and only it decides (default ``EverySeconds(600)``, which also
    saves at the final step and on preemption). ``retention`` (a
    :class:`~kronos_audit.runtime.policy.Retention`, or the same as ``keep=`` and
    ``keep_every=``) says which checkpoints keep their data; ``remote`` (a
    :class:`~kronos_audit.runtime.policy.Remote`, or ``push=`` and ``local_dir=``) where
    its steps meet beside its directory. With ``allow_secret_files`` an
    uncommitted diff is recorded even when it carries a file that looks like a secret
    (``.env``, ``*.pem``, ``id_*`` ...); by default such a diff is refused. Manifests
    record ``command`` (an argv) as the command that re-runs a segment, by default
    ``python`` and ``sys.argv``; credential-looking arguments are recorded as ``***``.

    :meth:`restore` never resumes from a checkpoint older than the newest one whose
    manifest is committed in git (the data of newer steps lost here and in the remote):
    it raises :class:`~kronos_audit.errors.RollbackRefused` naming both steps, unless
    ``allow_rollback`` (or ``KAUDIT_ALLOW_ROLLBACK=1``) accepts it, which a log warning
    then says.

    ``task`` (:class:`~kronos_audit.runtime.campaigns.array.ArrayTask`, ``ArrayTask.from_slurm()``
    in a Slurm job array) makes the run one task of campaign ``run_id``: its own run
    ``RUN_ID.task-K``, doing the batches of its share (``seed`` is then required: every
    task must draw from the same one).

    ``dispatch="portable"`` pins the CPU kernels and thread counts to what every x86-64-v3
    CPU has (:mod:`kronos_audit.provenance.dispatch`), for replays bitwise on another CPU;
    libraries already loaded have chosen (a warning names them): start the program under
    ``kaudit run --portable`` for the pins to reach them too.

    ``levels`` (``[ka.MemoryLevel("/dev/shm/job/node{node}"), ka.PartnerLevel()]``) keeps
    the newest steps on cheaper levels beside the durable one, signed, and restores from
    the nearest that holds a verified step (:mod:`kronos_audit.runtime.levels.store`,
    :mod:`kronos_audit.runtime.levels.recover`).
    """

    def __init__(
        self,
        run_id: str,
        root: str | Path = "checkpoints",
        *,
        seed: int | None = None,
        every: SavePolicy | None = None,
        keep: int | None = None,
        keep_every: int | None = None,
        retention: Retention | None = None,
        asynchronous: bool = True,
        key: str | SigningKey | None = None,
        preempt_exit: int = PREEMPTED_EXIT,
        attributes: Mapping[str, Any] | None = None,
        push: bool = False,
        allow_secret_files: bool = False,
        comm: Any = None,
        command: Sequence[str] | None = None,
        allow_rollback: bool = False,
        local_dir: str | Path | None = None,
        remote: Remote | None = None,
        task: ArrayTask | None = None,
        dispatch: str = "native",
        levels: Sequence[object] | None = None,
    ) -> None:
        uncaught.install()  # a kaudit error the program lets through: one line, its status
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise UsageError(f"run id {run_id!r}: use a non-empty name without '/'")
        self.dispatch = pin_dispatch(dispatch)
        """How this run's CPU kernels are chosen: ``native`` or ``portable``."""
        self.retention = Retention.given(retention, keep, keep_every)
        """Which checkpoints keep their data (``retention=``, or ``keep``, ``keep_every``)."""
        if every is not None and not isinstance(every, SavePolicy):
            raise UsageError(
                f"every must be a save policy (ka.EverySteps(100), ka.Auto('24h') ...), "
                f"got {type(every).__name__}"
            )
        try:
            self.replay = ReplayInstruction.from_env()
            """Set when a replay runs this program (``kaudit replay``): see docs/replay.md."""
        except ValueError as e:
            raise UsageError(str(e)) from None
        if seed is None and self.replay is not None:
            seed = self.replay.seed  # the recorded seed, for a program that fixes none
        run_id = task_run_id(run_id, task, seed)
        self.task = task
        """The job-array task this run is (None: the run does the whole campaign)."""
        self._owns_comm = comm is None
        self.comm: Comm = detect(comm)
        """The ranks of the job (:func:`kronos_audit.parallel.detect`: ``comm=``, or the
        launcher's environment; one process without either)."""
        uncaught.ahead_of_torch()  # (after a process group is initialized)
        self.rank = self.comm.rank
        """This process's rank."""
        self.size = self.comm.size
        """How many ranks the job has."""
        self.run_id = run_id
        self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
        # Every rank draws from the same run seed (each its own stream of it).
        self.seed = int(self.comm.bcast(self.seed))
        push, local_dir = Remote.given(remote, push, local_dir)
        directory, self.node_local = run_directory(root, run_id, push, local_dir)
        """Each rank keeps the run's files in a directory of its own node's (``local_dir=``
        or ``KAUDIT_LOCAL_DIR``), and the DVC remote is the meeting point."""
        self.publisher: Publisher = publisher_for(
            run_id,
            directory,
            self.comm,
            self.replay,
            seed=self.seed,
            key=key,
            attributes=attributes,
            push=push,
            node_local=self.node_local,
            allow_secret_files=allow_secret_files,
            command=command,
            allow_rollback=allow_rollback,
            retention=self.retention,
        )
        """Where the checkpoints go and what they become (signed, or a replay's output)."""
        self.directory = self.publisher.directory
        self.policy: SavePolicy = self.publisher.policy(
            every if every is not None else EverySeconds(600)
        )
        """The policy the loop asks after each step (a replay's: its step only)."""
        self.asynchronous = asynchronous
        self.preempt_exit = preempt_exit
        self.levels = levels_for(levels, self.publisher, run_id, self.comm)
        check_declared(self.policy, levels)
        """The levels beside the durable one (``levels=``), or None."""
        self._guard = PreemptionGuard()
        self._restorer = Restorer(
            self.publisher,
            self._guard,
            run_id=run_id,
            rank=self.rank,
            seed=self.seed,
            preempt_exit=preempt_exit,
            levels=self.levels,
        )
        self._saver = Saver(
            self.publisher,
            self.policy,
            LoopAgreement(self.comm),
            self._guard,
            run_id=run_id,
            rank=self.rank,
            generator=np.random.default_rng(rank_seed(self.seed, self.rank)),
            asynchronous=asynchronous,
            preempt_exit=preempt_exit,
            levels_due=None if self.levels is None else self.levels.due,
            schedule=schedule_for(self.policy, self.levels),
        )

    @property
    def rng(self) -> np.random.Generator:
        """The run's generator (this rank's stream of the run seed), restored with the
        run; every checkpoint holds its state."""
        return self._saver.rng

    @property
    def ledger(self) -> Ledger:
        """The Monte Carlo ledger every checkpoint carries (restored with the run)."""
        return self._saver.ledger

    @property
    def push_failures(self) -> list[str]:
        """Background pushes that failed (the checkpoints stay safe locally)."""
        return self.publisher.push_failures

    @property
    def step(self) -> int | None:
        """The step of the state in hand: the restored one, then the last checkpointed."""
        return self._saver.last_saved

    @property
    def restored_from(self) -> Path | None:
        """The checkpoint restore() took, if any."""
        resumed = self._restorer.resumed
        return None if resumed is None else resumed.where

    # -- context -------------------------------------------------------------------------

    def __enter__(self) -> Run:
        self.publisher.threaded = self.asynchronous
        # One writer per run: the publisher holds the run's lock (rank 0's, for every
        # rank) until close(), once the last commit is through.
        self.publisher.open()
        commit: Callable[[Job], None] = self.publisher.publish
        if self.levels is not None:
            try:
                self.levels.open(self.publisher)  # type: ignore[arg-type]
            except BaseException:
                self.publisher.close(clean=True)  # raised on every rank together
                raise
            commit = self.levels.commit(commit)
        rng.seed_all(rank_seed(self.seed, self.rank))
        drain = None if self.levels is None else self.levels.drain
        writer = BackgroundWriter(commit, asynchronous=self.asynchronous, drain=drain)
        if self.levels is not None:
            self.levels.attach(writer)
        self._guard.install()
        # One voice for the supervisor: rank 0's (every rank offers the same steps).
        self._saver.open(writer, Progress.from_env() if self.rank == 0 else None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._guard.uninstall()
        saver = self._saver
        if exc is not None and not saver.agreed_exit:
            self._abort_alone(exc)
        if saver.progress is not None:
            saver.progress.close()
        if saver.writer is not None:
            writer, saver.writer = saver.writer, None
            try:
                if exc is None:
                    writer.close()  # raises a background failure
                else:
                    try:
                        writer.close()  # finish what was handed over; the body's error wins
                    except Exception as background:
                        exc.add_note(
                            f"kaudit: a background checkpoint write also failed: {background}"
                        )
            finally:
                # The last commit is through: the next writer may come.
                self.publisher.close(clean=exc is None or saver.agreed_exit)
                if self.levels is not None:
                    self.levels.close(clean=exc is None or saver.agreed_exit)
        if self._owns_comm and (exc is None or saver.agreed_exit):
            self.comm.close()  # a torch.distributed group kaudit initialized itself

    def _abort_alone(self, exc: BaseException) -> None:
        """This rank leaves on an error the others did not agree on: they may be waiting
        in a collective for it. Under MPI the job is aborted (its traceback printed first),
        as ``python -m mpi4py`` does; torchrun's agent ends a job whose worker failed."""
        if self.comm.name != "mpi" or self.comm.size == 1 or isinstance(exc, KeyboardInterrupt):
            return
        traceback.print_exception(exc)
        sys.stderr.flush()
        self.comm.comm.Abort(1)  # type: ignore[attr-defined]

    def _require_open(self) -> BackgroundWriter:
        return self._saver.require_open()

    # -- restore -------------------------------------------------------------------------

    def restore(self, step: int | None = None, *, like: Any = None) -> State | None:
        """The newest valid checkpoint's state (RNG states and ledger restored), or None.

        Checkpoints whose manifest is missing, unsigned (or signed by a key no anchor
        holds: only this run's own key or an anchored one counts), out of its place, or
        does not match the data are skipped with a :class:`CheckpointSkipped` warning.
        The run resumes after the step restored, and says so in the log (INFO, logger
        ``kronos_audit.runtime``: run, step, checkpoint); :meth:`checkpoint` then refuses
        that step and any before it. A second call returns the same state (with ``like``:
        loads it into that template again).

        ``like``, a template of the state (``{"model": model, "opt": opt}``): objects
        with ``state_dict()`` in it are loaded in place (``load_state_dict``) and returned
        themselves, tensors come back on its devices and dtypes, JAX arrays with its
        shardings and dtypes; see :func:`kronos_audit.checkpoint.codec.tree.fit`.

        ``step``: the checkpoint of that step instead, checked as the resume point is
        (CheckpointError naming the step and why if it is missing or not valid), read
        and returned; the run's position, RNGs and ledger do not change. Under
        ``kaudit replay`` only the step the replay resumes from can be read.
        """
        self._require_open()
        if step is not None:
            return self._restorer.at(step, like)
        if not self._restorer.tried:
            self._saver.resumed(self._restorer.resume(self.rng))
        return self._restorer.restored(like)

    def all_steps(self) -> list[int]:
        """The steps, sorted, whose checkpoint file and manifest are in the run's directory.

        Not verified: a listed step may still fail :meth:`restore` with ``step=``
        (use :meth:`latest_step` for the newest that verifies). Pruned checkpoints (no
        data left) are not listed.
        """
        self._require_open()
        return self._restorer.steps()  # collective: rank 0's list, on every rank

    def latest_step(self) -> int | None:
        """The step :meth:`restore` resumes from (the newest valid checkpoint, verified,
        once pending writes are durable), or None when there is none."""
        self._require_open().flush()
        return self._restorer.latest()

    # -- the loop ------------------------------------------------------------------------

    def steps(self, n: int) -> Iterator[int]:
        """The steps after the restored one, up to and including ``n``."""
        self.restore()
        final = self._saver.final = self.publisher.last_step(n)
        start = 1 if self.step is None else self.step + 1
        self._saver.loop_starts()
        yield from range(start, final + 1)

    def batches(self, n: int) -> Iterator[tuple[int, np.random.Generator]]:
        """``(i, rng_i)`` for this rank's batches of those in ``range(n)`` not yet in the
        ledger: all of them on one rank; on several, the batches still to do dealt
        round-robin over the ranks (:class:`~kronos_audit.runtime.campaigns.split.Split`),
        each batch to one rank. Record each batch's result and call :meth:`checkpoint` once
        after each: once a rank's own batches are done, its last call also makes the calls
        that keep it in step with ranks that have more, and when it returns
        :attr:`ledger` holds every rank's results."""
        campaign = self._start_campaign(n)
        for i in campaign.mine(self._idle_state()):
            yield i, batch_rng(self.seed, i)

    def _start_campaign(self, n: int) -> Batches:
        self.restore()
        self._saver.loop_starts()
        share = batch_share(self.task, n, self.ledger.indices())
        # A replay redoes the batches after its parent's, in index order, up to the count
        # it stops at; a run that finished batches out of order replays only if that
        # order was the index order.
        total = self.publisher.last_step(len(share))
        # The same on every rank: the restored ledger is the union of every rank's results.
        todo = [i for i in share if i not in self.ledger]
        todo = todo[: max(0, total - len(self.ledger))]
        campaign = self._saver.campaign = Batches(
            self.ledger,
            self.comm,
            n=n,
            total=total,
            todo=todo,
            task=self.task,
            offer=self._saver.offer,
        )
        return campaign

    def _idle_state(self) -> Mapping[str, Any]:
        """What a rank with no batch left offers: the state it restored."""
        return self._restorer.state if self._restorer.state is not None else {}

    def map_batches(
        self,
        fn: Callable[..., Any],
        n: int,
        *,
        executor: Submitter | None = None,
        per_call: int | None = None,
        **kwargs: Any,
    ) -> Ledger:
        """Call ``fn(rng, **kwargs)``, through ``executor`` (anything with an Executor's
        ``submit``; None: in this process; a Dask client or its ``get_executor()`` is
        driven through ``client.map``), for every batch of ``range(n)`` not in the run's
        ledger, ``rng`` the batch's own generator; record each result as it arrives, with
        the worker that ran it, and offer each to the run's checkpoint policy
        (:meth:`~kronos_audit.runtime.campaigns.batches.Batches.map`). Once every batch is
        recorded and checkpointed, the run signs the campaign's completeness certificate
        (:mod:`kronos_audit.runtime.campaigns.certify`). Returns the ledger.

        An executor gets consecutive batches in groups, one call a group
        (:mod:`~kronos_audit.runtime.campaigns.calls`); ``per_call`` fixes the batches a
        call (None: from the count left and the engine's workers, one a call when few
        are left). A group whose worker is lost is run again whole."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise UsageError(f"map_batches: n must be an int >= 0, got {n!r}")
        if per_call is not None and (
            isinstance(per_call, bool) or not isinstance(per_call, int) or per_call < 1
        ):
            raise UsageError(f"map_batches: per_call must be an int >= 1 or None, got {per_call!r}")
        campaign = self._start_campaign(n)
        campaign.map(
            fn,
            self.seed,
            executor,
            kwargs,
            idle_state=self._idle_state(),
            save_now=self._saver.save_received,
            certify=lambda: self._certify(n),
            per_call=per_call,
        )
        return self.ledger

    def _certify(self, n: int) -> None:
        assert self.step is not None
        self.publisher.certify(n, self.step)

    def record(self, index: int, result: Any, *, worker: str | None = None) -> None:
        """Put batch ``index``'s result into the ledger carried by every checkpoint, run by
        ``worker`` (None: this process; the manifest records it). On several ranks, only
        batches :meth:`batches` gave this rank."""
        if self.task is not None and not self.task.holds(index):
            raise UsageError(f"batch {index} is not in array task {self.task.task}'s share")
        if self._saver.campaign is not None:
            self._saver.campaign.record(index, result, worker)
        else:
            self.ledger.record(index, result, worker)

    def checkpoint(
        self,
        step: int,
        state: Mapping[str, Any],
        *,
        layout: Mapping[str, Layout] | None = None,
    ) -> bool:
        """Offer the state after ``step``; write it if the policy says so (it sees whether
        this is the final step and whether a preemption signal arrived). Returns whether a
        checkpoint was taken: False for a step the policy does not save. A step at or
        before the newest one the run holds (the last checkpointed, or the one
        :meth:`restore` resumed from) raises
        :class:`~kronos_audit.errors.StepAlreadyExists` instead: steps only grow. On a
        preemption signal it waits until the checkpoint is durable and exits with
        ``preempt_exit``; if the policy took none, it warns
        (:class:`~kronos_audit.runtime.saver.PreemptedWithoutCheckpoint`) and exits all the same.

        On several ranks every rank calls it with the same steps: rank 0's policy decides
        for all, and a signal on any rank stops every rank at the same step. ``layout``
        (``{"u": ka.Block(axis=0), "params": ka.Replicated()}``) says how keys of the state
        are spread over the ranks, so that a restart on another rank count can re-cut them
        (see :mod:`kronos_audit.runtime.steps.shards`); on one rank it is checked and unused.

        In a :meth:`batches` loop ``step`` is not used: the step is the number of batches
        done (on every rank), and the call is collective too (one per batch; see there).
        """
        saver = self._saver
        if saver.campaign is not None:
            return saver.campaign.offer(state, layout)
        final = saver.final is not None and step >= saver.final
        return saver.offer(step, final, state, layout, saver.stale)

    def wait(self) -> None:
        """Block until every checkpoint handed over is durable; raise a background failure."""
        self._require_open().flush()

    @property
    def stats(self) -> WriterStats:
        """Stall and write-time statistics of this process's checkpoints."""
        return self._require_open().stats
