"""One chain per run across machines: two clones of one repository run the same run id
with ``push=True`` against one DVC remote (a local directory; and over SSH), interleaved.
The later pusher fails in one line naming both steps and both writers, the remote keeps
the first chain's manifests as they were, and ``kaudit status`` / ``kaudit verify`` say
which steps are not pushed and report a remote chain with two children of one step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import ChainForked, StorageError
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project, find_project
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage import Storage
from kronos_audit.storage.remote_chain import push_manifest
from kronos_audit.storage.runs import RunFiles
from tests.helpers import git, run_cli
from tests.sshd import SSHRemote
from tests.threadranks import ThreadRanks, on_ranks, thread_run

pytestmark = pytest.mark.slow

HANG_GUARD = 120.0  # seconds; only stops a broken test from hanging CI, never a timing claim
RUN = "heat"

# Checkpoints every HEAT_EVERY steps up to argv[1], pushing each; at HEAT_WAIT_AT it
# waits, its checkpoints pushed, until the file HEAT_GO appears (the test interleaves the
# two clones with it). Prints what each failed push said, one line each.
PROGRAM = textwrap.dedent(
    """\
    import os, sys, time
    import kronos_audit as ka

    every = int(os.environ.get("HEAT_EVERY", "1"))
    wait_at = int(os.environ.get("HEAT_WAIT_AT", "0"))
    with ka.Run("heat", root="checkpoints", seed=7, every=ka.EverySteps(every), push=True) as run:
        state = run.restore() or {"u": run.rng.random((8, 8))}
        print("resumed", run.step, flush=True)
        for step in run.steps(int(sys.argv[1])):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((8, 8))}
            run.checkpoint(step, state)
            if step == wait_at:
                run.latest_step()  # durable, and pushed: pushing is part of the write
                print("waiting", step, flush=True)
                while not os.path.exists(os.environ["HEAT_GO"]):
                    time.sleep(0.05)
    for failure in run.push_failures:
        print("push failed:", failure, flush=True)
    """
)


def name(step: int) -> str:
    return f"step-{step:08d}.h5.kaudit.json"


class Clone:
    """One clone of the project (a machine), running the program as a real process."""

    def __init__(self, project: Project, path: Path) -> None:
        git(path.parent, "clone", "-q", str(project.root), str(path))
        self.path = path
        self.proc: subprocess.Popen[str] | None = None
        self.go = path.parent / f"{path.name}.go"

    @property
    def run_dir(self) -> Path:
        return self.path / "checkpoints" / RUN

    def manifest(self, step: int) -> Manifest:
        return ka.read_manifest(self.run_dir / name(step))

    def start(self, steps: int, *, wait_at: int = 0, every: int = 1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "heat_job.py", str(steps)],
            cwd=self.path,
            env={
                **os.environ,
                "HEAT_WAIT_AT": str(wait_at),
                "HEAT_EVERY": str(every),
                "HEAT_GO": str(self.go),
            },
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_for(self, line: str) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        deadline = time.monotonic() + HANG_GUARD
        got = ""
        while got != line + "\n" and time.monotonic() < deadline:
            got = self.proc.stdout.readline()
            if not got and self.proc.poll() is not None:
                break
        assert got == line + "\n", self.proc.stderr.read() if self.proc.stderr else ""

    def finish(self) -> str:
        assert self.proc is not None
        self.go.touch()
        try:
            stdout, stderr = self.proc.communicate(timeout=HANG_GUARD)
        finally:
            self.proc.kill()
        assert self.proc.returncode == 0, stderr
        return stdout


def remote_manifests(files: RunFiles) -> dict[str, bytes]:
    from kronos_audit.storage.remote_chain import read_remote_chain

    chain = read_remote_chain(files)
    return {m.name: files.get(m.name, 1 << 20) for m in chain.manifests}


def status_of(clone: Clone) -> dict[int, str]:
    result = run_cli("status", str(clone.run_dir), "--json", cwd=clone.path)
    assert result.exit_code == 0, result.output
    return {c["step"]: c["location"] for c in json.loads(result.output)["checkpoints"]}


def two_writers(
    project: Project, tmp_path: Path, configure: Callable[[Path], None] | None = None
) -> tuple[Clone, Clone, str]:
    """Clone A runs steps 1-4 and waits; clone B, another machine, resumes from A's
    step 4 out of the remote and runs 5-8, pushing them; then A goes on to 5-8."""
    (project.root / "heat_job.py").write_text(PROGRAM)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "heat job")
    a, b = Clone(project, tmp_path / "node-a"), Clone(project, tmp_path / "node-b")
    if configure is not None:
        configure(a.path)
        configure(b.path)
    a.start(8, wait_at=4)
    a.wait_for("waiting 4")
    b.start(8)
    out_b = b.finish()
    assert "resumed 4" in out_b
    assert "push failed" not in out_b, out_b
    out_a = a.finish()
    return a, b, out_a


def check_refused(a: Clone, b: Clone, out_a: str) -> None:
    """A's pushes of 5-8 failed, each in one line naming both chains' steps and writers."""
    failures = [line for line in out_a.splitlines() if line.startswith("push failed:")]
    assert len(failures) == 4, out_a  # steps 5, 6, 7 and 8 each retried step 5 first
    first = failures[0]
    a5, b5 = a.manifest(5), b.manifest(5)
    assert a5.record.writer is not None
    assert b5.record.writer is not None
    assert a5.record.writer.started != b5.record.writer.started
    assert a5.record.writer.pid != b5.record.writer.pid
    assert "step 5 of run 'heat' not pushed" in first
    assert b5.record.writer.describe() in first  # the other chain's writer
    assert a5.record.writer.describe() in first  # and this one's
    assert first.count("over step 4") == 2  # both steps, each over its parent


def test_the_later_pusher_fails_naming_both_and_the_remote_keeps_the_first_chain(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    a, b, out_a = two_writers(project, tmp_path)
    check_refused(a, b, out_a)

    files = RunFiles(Storage(find_project(b.path)), RUN)
    there = remote_manifests(files)
    # The first chain's manifests, byte for byte: A's 1-4, B's 5-8; none of A's 5-8.
    assert sorted(there) == [name(s) for s in range(1, 9)]
    for step in range(1, 9):
        assert there[name(step)] == (b.run_dir / name(step)).read_bytes()
    for step in range(5, 9):
        assert there[name(step)] != (a.run_dir / name(step)).read_bytes()

    # A's status: its own 5-8 are not in the remote (their data went, another chain's
    # manifests hold those steps); B's are all pushed.
    assert status_of(a) == dict.fromkeys(range(1, 5), "pushed") | dict.fromkeys(
        range(5, 9), "local"
    )
    # B's: the data of the step it resumed from and after here, the rest in the remote.
    assert status_of(b) == dict.fromkeys(range(1, 4), "remote-only") | dict.fromkeys(
        range(4, 9), "pushed"
    )

    shown = run_cli("show", str(a.run_dir / name(5)), cwd=a.path)
    writer = a.manifest(5).record.writer
    assert writer is not None
    assert writer.describe() in " ".join(shown.output.split())

    # `kaudit push` of A's forked local chain: refused, one line, nothing replaced.
    result = run_cli("push", str(a.run_dir), cwd=a.path)
    assert result.exit_code == 1, result.output
    assert "step 5 of run 'heat' not pushed: the DVC remote holds another chain" in result.output
    assert result.output.count("not pushed: its chain's step 5 was refused") == 3  # 6, 7, 8
    assert remote_manifests(files) == there

    # A started again goes on from its own step 8: its 9 and 10 are refused too, not put
    # over B's chain.
    a.go.unlink()
    a.start(10)
    out = a.finish()
    failures = [line for line in out.splitlines() if line.startswith("push failed:")]
    assert len(failures) == 2, out
    assert "step 9 of run 'heat' not pushed" in failures[0]
    assert b.manifest(8).record.writer.describe() in failures[0]  # type: ignore[union-attr]
    assert remote_manifests(files) == there


def test_a_fork_in_the_remote_is_reported_by_status_and_verify(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    # B checkpoints every 2 steps: its step 6 is a child of A's step 4, as A's 5 would be.
    (project.root / "heat_job.py").write_text(PROGRAM)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "heat job")
    a, b = Clone(project, tmp_path / "node-a"), Clone(project, tmp_path / "node-b")
    a.start(6, wait_at=4)
    a.wait_for("waiting 4")
    b.start(8, every=2)
    assert "push failed" not in b.finish()
    out_a = a.finish()
    failures = [line for line in out_a.splitlines() if line.startswith("push failed:")]
    assert failures, out_a
    assert "step 5 of run 'heat' not pushed" in failures[0]
    assert b.manifest(6).record.writer.describe() in failures[0]  # type: ignore[union-attr]
    files = RunFiles(Storage(find_project(a.path)), RUN)
    assert sorted(remote_manifests(files)) == [name(s) for s in (1, 2, 3, 4, 6, 8)]

    # A remote where the check could not hold (a remote without create-only writes, or an
    # older kaudit): A's step 5 is there beside B's 6, both children of step 4.
    files.put(name(5), (a.run_dir / name(5)).read_bytes())
    for clone in (a, b):
        status = run_cli("status", str(clone.run_dir), cwd=clone.path)
        assert status.exit_code == 1, status.output
        assert "run 'heat' forks in the DVC remote: step 4 has 2 children there" in status.output
        # A's data is all here: told the remote, verify reads it; B's fetches anyway.
        told = ["--remote", "storage"] if clone is a else []
        verify = run_cli("verify", str(clone.run_dir), *told, cwd=clone.path)
        assert verify.exit_code == 1, verify.output
        assert "forks in the DVC remote: step 4 has 2 children" in verify.output
    writer = a.manifest(5).record.writer
    assert writer is not None
    assert writer.describe() in " ".join(status.output.split())


def test_two_writers_over_ssh(
    project: Project,
    key: SigningKey,
    ssh_remote: SSHRemote,
    ssh_remote_dir: str,
    tmp_path: Path,
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "ssh remote")

    def configure(path: Path) -> None:
        ssh_remote.configure_dvc(path, "storage", ssh_remote_dir)  # the key file: local

    a, b, out_a = two_writers(project, tmp_path, configure)
    check_refused(a, b, out_a)
    runs = ssh_remote.local_path(ssh_remote_dir) / "kaudit" / "runs" / RUN
    for step in range(1, 9):
        assert (runs / name(step)).read_bytes() == (b.run_dir / name(step)).read_bytes()


def heat_in_process(root: Path, stop: int, *, every: int = 1, push: bool = True) -> list[str]:
    """Steps up to ``stop`` of the run in this process, resuming if it can; the push
    failures it reports."""
    with ka.Run(RUN, root=root, seed=5, every=ka.EverySteps(every), push=push) as run:
        state = run.restore() or {"u": run.rng.random((8, 8))}
        for step in run.steps(stop):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((8, 8))}
            run.checkpoint(step, state)
    return list(run.push_failures)


class Racing(RunFiles):
    """The run's remote directory as a second writer races this one: right before this
    one writes, the other's manifest lands (as on a remote where the look and the write
    cannot be one operation)."""

    def __init__(self, storage: Storage, other: tuple[str, bytes]) -> None:
        super().__init__(storage, RUN)
        self.other = other

    def put_new(self, name: str, data: bytes) -> bool:
        self.put(*self.other)
        return super().put_new(name, data)


def test_a_sibling_that_lands_while_pushing_takes_the_push_back(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    heat_in_process(project.root / "checkpoints", 4)
    clone = tmp_path / "node-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    heat_in_process(project.root / "checkpoints", 5, push=False)  # A: 5 over its 4
    heat_in_process(clone / "checkpoints", 6, every=2)  # B: 6 over A's 4, from the remote
    b6 = clone / "checkpoints" / RUN / name(6)
    a5 = project.root / "checkpoints" / RUN / name(5)
    there = remote / "kaudit" / "runs" / RUN
    (there / name(6)).unlink()  # not landed yet: it does while A pushes
    assert ka.read_manifest(b6).parent == ka.read_manifest(a5).parent

    storage = Storage(project)
    with pytest.raises(ChainForked, match=r"step 5 of run 'heat' not pushed") as raised:
        push_manifest(Racing(storage, (name(6), b6.read_bytes())), a5)
    assert "its step 6" in raised.value.message
    assert "over step 4" in raised.value.message
    assert sorted(p.name for p in there.iterdir()) == [name(s) for s in (1, 2, 3, 4, 6)]
    assert (there / name(6)).read_bytes() == b6.read_bytes()  # the other's, untouched


def test_sharded_steps_of_two_writers_on_two_ranks_each(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    go_on = threading.Event()

    def writer(root: Path, wait_at: int = 0) -> Callable[[ThreadRanks], list[str]]:
        def ranks(comm: ThreadRanks) -> list[str]:
            with thread_run(root, RUN, comm, push=True) as run:
                state = run.restore()
                u = np.asarray(state["u"]) if state else np.arange(8.0).reshape(2, 4)
                for step in run.steps(6):
                    u = u + 1
                    run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
                    if step == wait_at:  # pushed (synchronous): B's turn
                        assert go_on.wait(HANG_GUARD)
            return list(run.push_failures)

        return ranks

    clone = tmp_path / "node-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    a_failures: list[list[str]] = []
    a = threading.Thread(target=lambda: a_failures.extend(on_ranks(2, writer(project.root, 4))))
    a.start()
    try:
        there = remote / "kaudit" / "runs" / RUN
        deadline = time.monotonic() + HANG_GUARD
        while not (there / "step-00000004.index.jsonl.kaudit.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert on_ranks(2, writer(clone)) == [[], []]  # B: resumed from A's 4 in the remote
    finally:
        go_on.set()
        a.join(HANG_GUARD)
    failures = a_failures[0]  # rank 0's: it pushes the manifests
    assert failures
    assert "step 5 of run 'heat' not pushed: the DVC remote holds another chain" in failures[0]

    def step_manifest(repo: Path, step: int) -> Path:
        return repo / "checkpoints" / RUN / f"step-{step:08d}" / "index.jsonl.kaudit.json"

    b5 = ka.read_manifest(step_manifest(clone, 5)).record.writer
    assert b5 is not None
    assert b5.describe() in failures[0]
    names = [f"step-{s:08d}.index.jsonl.kaudit.json" for s in range(1, 7)]
    assert sorted(p.name for p in there.iterdir()) == names
    for step in (5, 6):
        assert (there / names[step - 1]).read_bytes() == step_manifest(clone, step).read_bytes()


def test_a_remote_step_restore_passed_over_is_replaced_by_the_steps_done_again(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    """Not another chain: a manifest whose data the remote lost is passed over by the
    restore elsewhere, and the step done again there replaces it in the remote."""
    assert heat_in_process(project.root / "checkpoints", 4) == []
    lost = ka.read_manifest(project.root / "checkpoints" / RUN / name(4)).subject_md5
    assert lost is not None
    (remote / "files" / "md5" / lost[:2] / lost[2:]).unlink()
    clone = tmp_path / "node-b"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    with pytest.warns(ka.CheckpointSkipped, match="data not fetched"):
        assert heat_in_process(clone / "checkpoints", 6) == []
    there = remote / "kaudit" / "runs" / RUN
    for step in range(4, 7):
        mine = clone / "checkpoints" / RUN / name(step)
        assert (there / name(step)).read_bytes() == mine.read_bytes()
    assert (
        ka.read_manifest(there / name(4)).digest
        != ka.read_manifest(project.root / "checkpoints" / RUN / name(4)).digest
    )


def test_a_step_whose_parent_is_not_pushed_yet_is_not_called_a_fork(
    project: Project, key: SigningKey, remote: Path
) -> None:
    assert heat_in_process(project.root / "checkpoints", 3, push=False) == []
    here = project.root / "checkpoints" / RUN
    files = RunFiles(Storage(project), RUN)
    push_manifest(files, here / name(1))
    with pytest.raises(StorageError, match="its parent is not in the DVC remote yet") as raised:
        push_manifest(files, here / name(3))
    assert not isinstance(raised.value, ChainForked)
    push_manifest(files, here / name(2))
    push_manifest(files, here / name(3))
    there = remote / "kaudit" / "runs" / RUN
    assert sorted(p.name for p in there.iterdir()) == [name(s) for s in (1, 2, 3)]


def test_a_fresh_machine_does_not_replace_another_chain_it_passed_over(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    """A remote an older kaudit left forked (A's 1-4, B's 5-8, A's 9-10 over A's own 8): a
    fresh machine resumes from B's 8, passing A's 9-10 over as another chain's, and its
    own 9-10 are refused, not written over A's."""
    a = project.root / "checkpoints"
    assert heat_in_process(a, 4) == []
    b = tmp_path / "node-b"
    git(tmp_path, "clone", "-q", str(project.root), str(b))
    assert heat_in_process(b / "checkpoints", 8) == []  # from A's 4 in the remote
    assert heat_in_process(a, 10, push=False) == []  # A's own 5-10, over its own 4
    files = RunFiles(Storage(project), RUN)
    for step in (9, 10):
        files.put(name(step), (a / RUN / name(step)).read_bytes())  # as an older kaudit did

    c = tmp_path / "node-c"
    git(tmp_path, "clone", "-q", str(project.root), str(c))
    with pytest.warns(ka.CheckpointSkipped, match="is not the one its child signs"):
        failures = heat_in_process(c / "checkpoints", 10)
    assert failures
    assert "step 9 of run 'heat' not pushed: the DVC remote holds another chain" in failures[0]
    there = remote / "kaudit" / "runs" / RUN
    for step in (9, 10):
        assert (there / name(step)).read_bytes() == (a / RUN / name(step)).read_bytes()
    assert ka.read_manifest(c / "checkpoints" / RUN / name(9)).parent == (
        ka.read_manifest(b / "checkpoints" / RUN / name(8)).digest
    )


def test_a_child_no_trusted_signer_made_forks_nothing(
    project: Project, key: SigningKey, mallory: SigningKey, remote: Path, tmp_path: Path
) -> None:
    """Whoever can write to the remote can drop a signed-looking first step of the run
    there (the attacker's own key): status and verify count only trusted signers' links."""
    assert heat_in_process(project.root / "checkpoints", 4) == []
    other = tmp_path / "attacker"
    git(tmp_path, "clone", "-q", str(project.root), str(other))
    with ka.Run(RUN, root=other / "checkpoints", seed=5, key=mallory) as run:
        for step in run.steps(5):
            if step == 5:
                run.checkpoint(step, {"u": np.zeros(4)})
    planted = ka.read_manifest(other / "checkpoints" / RUN / name(5))
    assert planted.parent is None  # a second first step of the run
    RunFiles(Storage(project), RUN).put(name(5), planted.path.read_bytes())

    here = str(project.root / "checkpoints" / RUN)
    status = run_cli("status", here)
    assert status.exit_code == 0, status.output
    assert "FORK" not in status.output
    verify = run_cli("verify", here, "--remote", "storage")
    assert verify.exit_code == 0, verify.output
    assert "FORK" not in verify.output
    # Trusted, the same file is a fork: two first steps.
    (tmp_path / "mallory.pub").write_bytes(public_pem(mallory.private_key.public_key()))
    status = run_cli("status", here, "--trusted-key", str(tmp_path / "mallory.pub"))
    assert status.exit_code == 1, status.output
    assert "run 'heat' forks in the DVC remote: 2 first steps there" in status.output
