"""A job's ranks, as a run sees them: each rank's seed, a communicator for the writer's
thread, and one verdict every rank reaches together.

A collective must be reached by every rank whatever happened on it, or the others hang:
so a rank's problem is said in one bounded line (:func:`one_line_reason`) and gathered
(:func:`raise_if_any_failed`), and every rank raises, or goes on, together.
"""

from __future__ import annotations

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


def agreed(
    votes: list[LoopVote],
    step: int,
    failure: BaseException | None,
    policy_failure: BaseException | None,
    *,
    batches: bool,
) -> LoopVote:
    """Rank 0's vote, once every rank's ``votes`` (gathered in one collective) let the loop
    go on at ``step``; otherwise every rank raises alike: a rank's failure (this rank's own
    ``failure`` as it is), ranks out of step (``batches``: in a ``run.batches`` loop), or
    rank 0's policy failing (its own ``policy_failure`` there as it is)."""
    failed = [v for v in votes if v.failure is not None]
    if failed:
        if failure is not None:
            raise failure
        raise CheckpointError(
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
        raise UsageError(
            f"ranks are out of step: they offered steps {steps[0]} to {steps[-1]} to "
            f"run.checkpoint ({must})"
        )
    verdict = votes[0]
    if verdict.policy_failure is not None:
        if policy_failure is not None:
            raise policy_failure  # rank 0's own, as it is
        raise UsageError(f"rank 0's save policy failed: {verdict.policy_failure}")
    return verdict


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
        from kronos_audit.parallel.torchdist import TorchComm

        if isinstance(comm, TorchComm):
            import torch.distributed as dist

            ranks = dist.get_process_group_ranks(comm.group) if comm.group is not None else None
            return TorchComm(dist.new_group(ranks=ranks, backend="gloo"))
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
