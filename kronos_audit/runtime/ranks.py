"""A job's ranks, as a run sees them: each rank's seed, a communicator for the writer's
thread, and one verdict every rank reaches together.

A collective must be reached by every rank whatever happened on it, or the others hang:
so a rank's problem is said in one bounded line (:func:`one_line_reason`) and gathered
(:func:`raise_if_any_failed`), and every rank raises, or goes on, together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kronos_audit.errors import CheckpointError, Error, UsageError, one_line
from kronos_audit.parallel.comm import Comm, SingleProcess
from kronos_audit.runtime.rng import derived_seed


@dataclass(frozen=True)
class LoopVote:
    """One rank's word at a step of the loop, heard by every rank (``run.checkpoint``)."""

    step: int
    """The step the rank offered."""
    preempted: bool
    """A preemption signal reached the rank."""
    save: bool | None
    """Rank 0's policy's verdict (None on the other ranks, and when it could not ask)."""
    failure: str | None
    """Why the rank cannot go on (a background write failed, the state cannot be
    stored), in one line; None when it can."""
    policy_failure: str | None
    """Rank 0: why its save policy could not decide; None when it did."""
    levels: tuple[str, ...] | None = None
    """Rank 0: the levels beside the durable one its policy chose for this step (None:
    the levels' own ``every`` decides)."""


@dataclass(frozen=True)
class Decision:
    """What every rank heard at one call of the loop, alike."""

    save: bool
    """Checkpoint this step (rank 0's policy's verdict)."""
    stop: bool
    """Stop at this step: a preemption request reached rank 0's policy."""
    levels: tuple[str, ...] | None = None
    """The levels beside the durable one rank 0's policy chose (None: as they say)."""
    error: BaseException | None = None
    """What every rank raises here instead, together (None: the loop goes on): this
    rank's own failure or rank 0's own policy failure as it is, the first failed rank's
    reason, or ranks out of step."""


class LoopAgreement:
    """The loop's decisions on every rank, one collective a call of ``run.checkpoint``:
    rank 0 decides with its policy (time-based ones would decide differently on each
    rank), and every rank hears its verdict, every rank's step and every rank's
    preemption request together. Rank 0 decides knowing only its own request; a request
    from another rank reaches its policy at the next call, so every rank stops there, one
    step later, alike. On one rank the collective is a call."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self.stop_next = False
        """Some rank was asked to stop: every rank stops at the next call."""

    def decide(
        self,
        step: int,
        preempted: bool,
        failure: BaseException | None,
        ask: Callable[[bool], bool | tuple[bool, tuple[str, ...]]],
        *,
        batches: bool,
    ) -> Decision:
        """All ranks: the decision at ``step``. ``preempted``: a signal reached this rank;
        ``failure``: why this rank cannot go on (told to every rank); ``ask(stop)``: rank
        0's policy's verdict (``stop``: a preemption request it knows of); ``batches``: in
        a ``run.batches`` loop (what ranks out of step are told). ``ask`` may also return
        ``(save, levels)``: the levels beside the durable one, told to every rank too."""
        save: bool | None = None
        levels: tuple[str, ...] | None = None
        policy_failure: BaseException | None = None
        if self.comm.rank == 0 and failure is None:
            try:
                said = ask(preempted or self.stop_next)
                save, levels = said if isinstance(said, tuple) else (said, None)
            except Exception as e:  # every rank must hear rank 0, whatever happened
                policy_failure = e
        vote = LoopVote(
            step=int(step),
            preempted=bool(preempted),
            save=save,
            failure=None if failure is None else one_line_reason(failure),
            policy_failure=None if policy_failure is None else one_line_reason(policy_failure),
            levels=levels,
        )
        votes: list[LoopVote] = self.comm.allgather(vote)
        error = _disagreement(votes, step, failure, policy_failure, batches=batches)
        if error is not None:
            return Decision(save=False, stop=False, error=error)
        verdict = votes[0]
        stop = verdict.preempted or self.stop_next
        if any(v.preempted for v in votes):
            self.stop_next = True  # a later call stops every rank, if this one did not
        return Decision(save=bool(verdict.save), stop=stop, levels=verdict.levels)


def _disagreement(
    votes: list[LoopVote],
    step: int,
    failure: BaseException | None,
    policy_failure: BaseException | None,
    *,
    batches: bool,
) -> BaseException | None:
    """What every rank raises when ``votes`` do not let the loop go on at ``step`` (see
    :attr:`Decision.error`), or None."""
    failed = [v for v in votes if v.failure is not None]
    if failed:
        if failure is not None:
            return failure
        return CheckpointError(
            f"rank {votes.index(failed[0])} failed at step {step}: {failed[0].failure}"
        )
    steps = sorted({v.step for v in votes})
    if len(steps) > 1:
        must = (
            "every rank must record each batch run.batches gives it and call "
            "run.checkpoint once after each"
            if batches
            else "every rank must offer the same steps"
        )
        return UsageError(
            f"ranks are out of step: they offered steps {steps[0]} to {steps[-1]} to "
            f"run.checkpoint ({must})"
        )
    if votes[0].policy_failure is not None:
        if policy_failure is not None:
            return policy_failure  # rank 0's own, as it is
        return UsageError(f"rank 0's save policy failed: {votes[0].policy_failure}")
    return None


_RANK_STREAM = 0x72616E6B  # "rank": a spawn key no other derived seed of the run uses


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s generators: the run seed itself on rank 0 (so a run on
    one rank is the single-process run), an independent stream derived from (seed, rank)
    on the others."""
    return seed if rank == 0 else derived_seed(seed, (_RANK_STREAM, rank), bits=63)


def joining_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank that joins a run at ``step`` with no generator of its number
    saved (a restart on more ranks): a stream of its own for that step, not the one its
    number started the run with (which would repeat that rank's draws from step 0)."""
    return derived_seed(seed, (_RANK_STREAM, rank, step), bits=63)


def dup(comm: Comm) -> Comm:
    """A communicator over the same ranks whose collectives never meet ``comm``'s
    (collective: every rank calls it at the same point). MPI: ``Comm.Dup()`` (mpi4py
    initializes MPI with ``MPI_THREAD_MULTIPLE``, so the writer thread may use it while the
    loop uses the program's); torch.distributed: a second gloo group over the same ranks.
    Another :class:`Comm` is used as it is (it must then tolerate use from two threads)."""
    if comm.size == 1:
        return SingleProcess()
    if comm.name == "mpi":
        from kronos_audit.parallel.mpi import MPIComm

        if isinstance(comm, MPIComm):
            return MPIComm(comm.comm.Dup())
    if comm.name == "torch.distributed":
        from kronos_audit.parallel.torchdist import TorchComm, timeout_seconds

        if isinstance(comm, TorchComm):
            import datetime

            import torch.distributed as dist

            ranks = dist.get_process_group_ranks(comm.group) if comm.group is not None else None
            # (new_group's own default is torch's half hour, whatever the default group's)
            wait = datetime.timedelta(seconds=timeout_seconds())
            return TorchComm(dist.new_group(ranks=ranks, backend="gloo", timeout=wait))
    return comm


def undup(comm: Comm | None, *, clean: bool) -> None:
    """Release a communicator :func:`dup` made. ``clean``: every rank is releasing it (the
    run ended without error), so a torch.distributed group is taken down together; after
    an error nothing collective is attempted (the other ranks may never come)."""
    if comm is None or comm.size == 1:
        return
    comm.close()
    if clean and comm.name == "torch.distributed":
        import torch.distributed as dist

        # A gloo group left to the interpreter's exit can abort the process
        # ("terminate called without an active exception").
        comm.barrier()
        dist.destroy_process_group(getattr(comm, "group", None))


def require_threads(comm: Comm) -> None:
    """A UsageError unless ``comm`` may be used from the writer's thread while the loop
    uses it too: MPI initialized with ``MPI_THREAD_MULTIPLE`` (mpi4py's default)."""
    if comm.name != "mpi" or comm.size == 1:
        return
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise UsageError(
            "MPI was initialized without MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level), which "
            "checkpoints written in the background need: leave mpi4py's default, or pass "
            "asynchronous=False to ka.Run"
        )


def raise_if_any_failed(comm: Comm, problem: str | None, error: type[Error]) -> None:
    """Every rank's problem (None: it had none), gathered; when any rank had one, every
    rank raises ``error`` with the first such rank's, naming that rank (a rank's own
    problem without its number). Every rank reaches this collective whatever happened on
    it, so no rank goes on, or stops, alone."""
    _raise_first(comm.allgather(problem), comm.rank, error)


def raise_if_any_raised(comm: Comm, own: BaseException | None, error: type[Error]) -> None:
    """:func:`raise_if_any_failed` for a rank's own exception ``own`` (None: it had none):
    that rank raises it as it is (its type and fields kept), every other rank ``error``
    naming the first rank that had one."""
    problems = comm.allgather(None if own is None else one_line_reason(own))
    if own is not None:
        raise own
    _raise_first(problems, comm.rank, error)


def _raise_first(problems: list[str | None], rank: int, error: type[Error]) -> None:
    bad = next(((r, p) for r, p in enumerate(problems) if p is not None), None)
    if bad is not None:
        r, p = bad
        raise error(p if r == rank else f"rank {r}: {p}")


def one_line_reason(e: BaseException) -> str:
    """One bounded line saying why (it travels to the other ranks and into their errors)."""
    if isinstance(e, Error):
        text = str(e)
    elif isinstance(e, OSError) and e.strerror:
        text = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    else:
        text = one_line(e)
    return text if len(text) <= 400 else text[:397] + "..."


__all__ = [
    "LoopVote",
    "dup",
    "joining_seed",
    "one_line_reason",
    "raise_if_any_failed",
    "raise_if_any_raised",
    "rank_seed",
    "require_threads",
    "undup",
]
