"""The two-phase commit, phase by phase, on three thread ranks: a scripted step whose
pieces are real files fails at one phase on one rank, and every rank must hear the same
verdict, naming that rank, while nothing of the step is left under its names; a rank that
never answers ends the step, past the commit's deadline, on the others."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.steps.commit import NotCommitted, Vote, commit
from kronos_audit.runtime.steps.deadline import Deadline, NoAnswer, commit_deadline
from tests.threadranks import ThreadRanks, on_ranks

SIZE = 3


class Scripted:
    """One rank's piece of a step: a file written under a temporary name, placed under
    its own, and a manifest rank 0 writes over every piece; ``fails`` names the phase
    and the rank where it goes wrong."""

    def __init__(self, directory: Path, rank: int, fails: tuple[str, int] | None) -> None:
        self.directory = directory
        self.rank = rank
        self.fails = fails
        self.calls: list[str] = []
        self.temporary = directory / f".writing-{rank}"
        self.piece = directory / f"piece-{rank}"

    def _phase(self, name: str) -> None:
        self.calls.append(name)
        if self.fails == (name, self.rank):
            raise RuntimeError(f"{name} failed here")

    def write(self) -> Path:
        self._phase("write")
        self.temporary.write_text(str(self.rank))
        return self.temporary

    def refusal(self) -> str | None:
        self.calls.append("refusal")
        return "another writer signed meanwhile" if self.fails == ("refusal", 0) else None

    def place(self, written: Path) -> str:
        self._phase("place")
        written.rename(self.piece)
        return self.piece.name

    def exchange(self, comm: Comm, vote: Vote) -> Vote:
        self.calls.append("exchange")
        return vote

    def sign(self, votes: Sequence[Vote]) -> None:
        self._phase("sign")
        names = [v.record for v in votes]
        assert names == [f"piece-{r}" for r in range(SIZE)]
        (self.directory / "manifest").write_text(" ".join(names))

    def withdraw(self) -> None:
        self.calls.append("withdraw")
        self.piece.unlink(missing_ok=True)

    def discard(self) -> None:
        self.calls.append("discard")
        self.temporary.unlink(missing_ok=True)

    def missing(self) -> list[int]:
        names = {p.name for p in self.directory.iterdir()}
        return [r for r in range(SIZE) if not {f".writing-{r}", f"piece-{r}"} & names]


def run(directory: Path, fails: tuple[str, int] | None) -> list[tuple[str | None, bool, list[str]]]:
    """What each rank saw: the verdict (None: committed), whether it was its own failure,
    and the phases it went through."""

    def rank(comm: ThreadRanks) -> tuple[str | None, bool, list[str]]:
        step = Scripted(directory, comm.rank, fails)
        try:
            commit(comm, step)
        except NotCommitted as e:
            return e.reason, e.own is not None, step.calls
        return None, False, step.calls

    return on_ranks(SIZE, rank)


def test_a_step_every_rank_wrote_is_committed_and_nothing_else_is_left(tmp_path: Path) -> None:
    seen = run(tmp_path, None)
    assert [s[:2] for s in seen] == [(None, False)] * SIZE
    assert seen[0][2] == ["write", "refusal", "place", "discard", "exchange", "sign"]
    assert seen[1][2] == seen[2][2] == ["write", "place", "discard", "exchange"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["manifest", *(f"piece-{r}" for r in range(SIZE))]


BEFORE = ["write", "refusal", "discard", "exchange", "withdraw"]
TABLE = [
    # phase, rank: the verdict every rank hears; the phases the failing rank went through
    ("write", 0, "rank 0: write failed here", BEFORE),
    ("write", 1, "rank 1: write failed here", ["write", "discard", "exchange", "withdraw"]),
    ("write", 2, "rank 2: write failed here", ["write", "discard", "exchange", "withdraw"]),
    ("refusal", 0, "rank 0: another writer signed meanwhile", BEFORE),
    ("place", 0, "rank 0: place failed here", ["write", "refusal", "place", *BEFORE[2:]]),
    ("place", 1, "rank 1: place failed here", ["write", "place", *BEFORE[2:]]),
    ("place", 2, "rank 2: place failed here", ["write", "place", *BEFORE[2:]]),
    (
        "sign",
        0,
        "sign failed here",
        ["write", "refusal", "place", "discard", "exchange", "sign", "withdraw"],
    ),
]


@pytest.mark.parametrize(
    ("phase", "failing", "verdict", "went"), TABLE, ids=[f"{p}-rank{r}" for p, r, *_ in TABLE]
)
def test_a_failure_at_any_phase_on_any_rank_commits_nothing_on_every_rank(
    tmp_path: Path, phase: str, failing: int, verdict: str, went: list[str]
) -> None:
    seen = run(tmp_path, (phase, failing))
    # Every rank hears the one verdict, in one line; only the failing rank's is its own
    # (a refusal is nobody's failure: rank 0 only said no).
    assert [reason for reason, _, _ in seen] == [verdict] * SIZE
    own = [mine for _, mine, _ in seen]
    assert own == [r == failing and phase != "refusal" for r in range(SIZE)]
    assert seen[failing][2] == went
    # Every rank took back what it placed; only rank 0 was asked to sign.
    assert all(calls[-1] == "withdraw" for _, _, calls in seen)
    assert all("sign" not in calls for _, _, calls in seen[1:])
    # Nothing stands under the step's names, and no temporary is left.
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_rank_that_never_answers_ends_the_step_on_the_others_naming_it(tmp_path: Path) -> None:
    finished = threading.Semaphore(0)  # released once by each rank that commits

    def rank(comm: ThreadRanks) -> str | None:
        if comm.rank == 2:  # stuck: never reaches the commit
            finished.acquire()
            finished.acquire()
            comm._meeting.barrier.abort()  # lets the others' waiting collectives go
            return None
        step = Scripted(tmp_path, comm.rank, None)
        timed = Deadline(comm, 0.5)  # a deadline is the feature here, not a test's limit
        timed.step, timed.missing = 7, step.missing
        try:
            with pytest.raises(NotCommitted) as ended:
                commit(timed, step)
            # Nothing collective is tried again on a communicator left in a collective.
            with pytest.raises(NoAnswer, match=r"^rank 2 never answered"):
                timed.barrier()
        finally:
            finished.release()
        return ended.value.reason

    seen = on_ranks(SIZE, rank)
    assert seen[:2] == ["rank 2 never answered within 0.5 s (step 7, bcast)"] * 2
    # Nothing under the step's names; each temporary stays for the run's next open,
    # a sign to the ranks still waiting that its rank answered.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".writing-0", ".writing-1"]


def test_the_commit_deadline_is_configurable_and_a_bad_one_refused_in_one_line() -> None:
    assert commit_deadline({}) == 1800.0
    assert commit_deadline({"KAUDIT_COMMIT_DEADLINE": "90"}) == 90.0
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(UsageError, match="give a positive number of seconds"):
            commit_deadline({"KAUDIT_COMMIT_DEADLINE": bad})
