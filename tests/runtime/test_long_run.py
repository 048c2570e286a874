"""A long run's bookkeeping: a commit lists nothing of its run directory and reads as many
manifests at the 6th step as at the 3rd (retention included, on one rank and on two), and
a restore reads the manifests its writer's chain memo does not vouch for, not the chain
back to step 1. Flatness is shown structurally, by counting listings and reads on a real
run, never by timing; the benchmark (bench/bench_long_run.py) times thousands of steps."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal import safeio
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.keys.revocation import write_revocation
from kronos_audit.project.repository import Project
from kronos_audit.statement import manifest as manifest_module
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.verification import chain as chain_module
from tests.helpers import run_cli
from tests.threadranks import ThreadRanks, on_ranks, thread_run


class Spy:
    """Each directory listed (``os.scandir``, ``os.listdir``) and each manifest read, on
    this thread, while :attr:`on`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.listed: list[str] = []
        self.read: list[str] = []
        self._thread = threading.get_ident()
        scandir, listdir, read = os.scandir, os.listdir, safeio.read_regular_stat

        def note(where: list[str], path: Any) -> None:
            if self.on and threading.get_ident() == self._thread:
                where.append(os.fspath(path))

        def spy_scandir(path: Any = ".") -> Any:
            note(self.listed, path)
            return scandir(path)

        def spy_listdir(path: Any = ".") -> list[str]:
            note(self.listed, path)
            return listdir(path)

        def spy_read(path: Any, limit: int, **kw: Any) -> Any:
            if str(path).endswith(".kaudit.json"):
                note(self.read, path)
            return read(path, limit, **kw)

        monkeypatch.setattr(os, "scandir", spy_scandir)
        monkeypatch.setattr(os, "listdir", spy_listdir)
        monkeypatch.setattr(safeio, "read_regular_stat", spy_read)
        monkeypatch.setattr(manifest_module, "read_regular_stat", spy_read)

    def during(self, fn: Callable[[], object]) -> tuple[list[str], list[str]]:
        """What ``fn`` listed and read."""
        self.listed, self.read, self.on = [], [], True
        try:
            fn()
        finally:
            self.on = False
        return self.listed, self.read


def state(step: int) -> dict[str, np.ndarray]:
    return {"x": np.full(8, float(step))}


def under(paths: list[str], directory: Path) -> list[str]:
    return [p for p in paths if Path(p) == directory or directory in Path(p).parents]


def test_a_commit_lists_nothing_of_its_run_and_reads_as_much_at_any_length(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project.root / "checkpoints"
    run_dir = root / "flat"
    spy = Spy(monkeypatch)
    per_step: dict[int, tuple[list[str], list[str]]] = {}
    with ka.Run("flat", root=root, seed=1, every=ka.EverySteps(1), keep=2, asynchronous=False) as r:
        for step in r.steps(6):
            per_step[step] = spy.during(partial(r.checkpoint, step, state(step)))
    # Retention ran: the data of steps 1-4 went, by the signed records of 3-6.
    assert sorted(p.name for p in run_dir.glob("step-*.h5")) == [
        "step-00000005.h5",
        "step-00000006.h5",
    ]
    for step in range(2, 7):  # the first commit lists the steps with data, once
        listed, _ = per_step[step]
        assert under(listed, run_dir) == [], (step, listed)
    reads = [len(per_step[step][1]) for step in range(3, 7)]
    assert len(set(reads)) == 1, reads  # as many manifests read at step 6 as at step 3


def test_a_sharded_commit_on_two_ranks_lists_only_its_own_step(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    run_dir = project.root / "checkpoints" / "ranks"
    seen: dict[int, tuple[list[str], list[str]]] = {}

    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, "ranks", comm, keep=2) as r:
            for step in r.steps(5):
                if comm.rank == 0:  # the spy follows rank 0's thread
                    spy._thread = threading.get_ident()
                    seen[step] = spy.during(partial(r.checkpoint, step, state(step)))
                else:
                    r.checkpoint(step, state(step))

    on_ranks(2, program)
    for step in range(2, 6):
        listed, _ = seen[step]
        # The step's own directory (its shards' DVC files, as retention records them) and
        # the one it prunes: never the run's directory, nor any other step's.
        mine = {str(run_dir / f"step-{s:08d}") for s in (step, step - 2)}
        assert set(under(listed, run_dir)) <= mine, listed
    assert len({len(seen[step][1]) for step in range(3, 6)}) == 1


def manifests_parsed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every manifest parsed from now on (by the chain reader)."""
    parsed: list[Path] = []
    parse = manifest_module.parse_manifest

    def spy(data: bytes, path: Path) -> Any:
        parsed.append(path)
        return parse(data, path)

    monkeypatch.setattr(chain_module, "parse_manifest", spy)
    return parsed


def restored(root: Path, run_id: str = "memo") -> tuple[int | None, list[str]]:
    """A fresh Run's restore: the step it took and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ka.Run(run_id, root=root, seed=1) as r:
            r.restore()
    return r.step, [str(w.message) for w in caught]


@pytest.fixture
def run_of(project: Project, key: SigningKey) -> Callable[[int], Path]:
    """``run_of(n)``: a run of ``n`` checkpoints (its root), its writer's memo made."""

    def make(n: int) -> Path:
        root = project.root / "checkpoints"
        with ka.Run("memo", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as r:
            for step in r.steps(n):
                r.checkpoint(step, state(step))
        return root

    return make


def test_a_restore_parses_only_the_newest_manifest_however_long_the_chain(
    run_of: Callable[[int], Path], monkeypatch: pytest.MonkeyPatch, kaudit_home: Path
) -> None:
    root = run_of(7)
    parsed = manifests_parsed(monkeypatch)
    assert restored(root) == (7, [])
    assert [p.name for p in parsed] == ["step-00000007.h5.kaudit.json"]
    # Without the memo (a restore on another machine) the chain is verified in full once,
    # and remembered for the next restore.
    memos = list((kaudit_home / "chains").iterdir())
    assert len(memos) == 1
    memos[0].unlink()
    parsed.clear()
    assert restored(root) == (7, [])
    assert len(parsed) == 7
    parsed.clear()
    assert restored(root) == (7, [])
    assert len(parsed) == 1


def without_memo(root: Path, kaudit_home: Path) -> tuple[int | None, list[str]]:
    """What a restore says with no memo at all: the verdict a full check gives."""
    for memo in (kaudit_home / "chains").iterdir():
        memo.unlink()
    return restored(root)


@pytest.mark.parametrize(
    "tamper", ["remove", "replace", "same bytes again", "memo forged", "memo cut"]
)
def test_the_memo_changes_no_verdict_of_a_restore(
    run_of: Callable[[int], Path], kaudit_home: Path, tamper: str
) -> None:
    root = run_of(5)
    run_dir = root / "memo"
    middle = run_dir / "step-00000003.h5.kaudit.json"
    (memo,) = (kaudit_home / "chains").iterdir()
    if tamper == "remove":  # a middle step's manifest deleted
        middle.unlink()
    elif tamper == "replace":  # another signed manifest of the run renamed over it
        other = run_dir / "other.tmp"
        other.write_bytes((run_dir / "step-00000002.h5.kaudit.json").read_bytes())
        other.replace(middle)
    elif tamper == "same bytes again":  # a new file with the very same bytes
        data = middle.read_bytes()
        other = run_dir / "other.tmp"
        other.write_bytes(data)
        other.replace(middle)
    elif tamper == "memo forged":  # one line of the memo changed: its MAC no longer holds
        lines = memo.read_text().splitlines(keepends=True)
        lines[1] = lines[1].replace("\t2\t", "\t9\t", 1)
        memo.write_text("".join(lines))
    elif tamper == "memo cut":  # a write cut short
        memo.write_bytes(memo.read_bytes()[:-7])
    with_memo = restored(root)
    assert with_memo == without_memo(root, kaudit_home)
    if tamper in ("remove", "replace"):
        assert with_memo[0] == 2, with_memo  # steps 3-5 skipped, as before
        assert with_memo[1], with_memo
    else:
        assert with_memo == (5, [])


def test_a_manifest_rewritten_in_place_is_left_to_verify(
    run_of: Callable[[int], Path], project: Project
) -> None:
    # The same file, other bytes: a restore the memo answers does not read it (docs/
    # security.md, "What a restore checks"); kaudit verify, which checks every chain in
    # full, names it.
    root = run_of(4)
    middle = root / "memo" / "step-00000002.h5.kaudit.json"
    flipped = bytearray(middle.read_bytes())
    flipped[-2] ^= 1
    with open(middle, "r+b") as f:
        f.write(bytes(flipped))
    assert restored(root) == (4, [])
    outcome = run_cli("verify", str(root / "memo"), cwd=project.root)
    assert outcome.exit_code != 0, outcome.output
    assert "step-00000002.h5.kaudit.json" in outcome.output


def test_a_key_revoked_since_the_memo_counts_as_in_a_full_check(
    run_of: Callable[[int], Path], kaudit_home: Path, key: SigningKey, project: Project
) -> None:
    root = run_of(4)
    # Revoked from step 3's signing on: steps 3 and 4 fail, 2 does not.
    third = read_manifest(root / "memo" / "step-00000003.h5.kaudit.json").record.created
    write_revocation(project.root, key.key_id, "lost laptop", key, at=third)
    with_memo = restored(root)
    assert with_memo[0] == 2, with_memo
    assert with_memo == without_memo(root, kaudit_home)


def test_verify_never_reads_a_memo(
    run_of: Callable[[int], Path], monkeypatch: pytest.MonkeyPatch, project: Project
) -> None:
    root = run_of(4)
    parsed = manifests_parsed(monkeypatch)
    results = ka.verify(root / "memo")
    assert all(r.ok for r in results)
    assert len(set(parsed)) == 4
