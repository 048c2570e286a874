"""Replay one segment of a run and compare what it produces with what was recorded.

The steps (docs/replay.md tells them to an auditor):

1. read the manifest; fetch its parent's checkpoint from the DVC remote if it is not here;
   verify the manifest, its chain and the parent checkpoint (a replay of unverified
   history proves nothing);
2. compare this machine's environment with the recorded lock (``EnvMode.STRICT`` refuses
   to run on drift);
3. materialise the code: a detached git worktree at the recorded commit, the recorded
   patch re-applied;
4. run the recorded command there with the instruction "resume from this checkpoint, stop
   at step N, write into this directory", as environment variables (``KAUDIT_RESUME_FROM``,
   ``KAUDIT_STOP_AT``, ``KAUDIT_OUT``, ``KAUDIT_SEED``) and as placeholders in its argv
   (``{resume_from}``, ``{stop_at}``, ``{out}``, ``{seed}``), each a whole argument or an
   option's value, never spliced into a string. The checkpoint it resumes from is a copy
   of the verified parent in a fresh directory: the command sees neither the run directory
   nor the recorded data it will be compared with;
5. compare the checkpoint it wrote with the recorded one: bitwise against the recorded
   dataset hashes, or, with tolerances, against the recorded data, fetched (and verified)
   only now that the command has finished.

Anything that stops a replay raises :class:`ReplayError` (or another
:class:`kronos_audit.errors.Error`); a replay that ran returns a :class:`ReplayResult`,
reproduced or not. The worktree and the temporary output are removed afterwards unless
``keep_workdir``.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, digest_file
from kronos_audit.compare import Comparison, TolerancePolicy, Verdict, compare_files
from kronos_audit.errors import CheckpointError, Error, ReplayError
from kronos_audit.manifest import Manifest, Sha256, manifest_path_for, read_manifest
from kronos_audit.project import Project, find_project
from kronos_audit.provenance import patch_path
from kronos_audit.replay.environment import environment_report
from kronos_audit.replay.interface import (
    DatasetReplay,
    EnvironmentReport,
    EnvMode,
    ManifestRef,
    ReplayResult,
    Timings,
)
from kronos_audit.runtime.protocol import (
    OUT_ENV,
    PROGRESS_ENV,
    RESUME_FROM_ENV,
    SEED_ENV,
    STOP_AT_ENV,
)
from kronos_audit.snapshot import utc_now
from kronos_audit.trust import TrustOptions, load_keyring
from kronos_audit.verify import Verifier, VerifyResult

PYTHON_NAMES = frozenset({"python", "python3"})
"""A recorded argv starting with one of these runs with this interpreter (sys.executable)."""
PLACEHOLDERS = ("{resume_from}", "{stop_at}", "{out}", "{seed}")
_OPTION_VALUE = re.compile(r"(--?[A-Za-z0-9][A-Za-z0-9_.-]*)=(\{[a-z_]+\})")
"""``--name={placeholder}``: an option, ``=``, a placeholder at the end, nothing else."""
SHOWN_CONTEXT = 40
"""Characters of a refused argument shown on each side of its placeholder."""
STDERR_TAIL_LINES = 3
_STEP_FILE = re.compile(r"^step-(\d+)\.h5$")


def checkpoint_name(step: int) -> str:
    """The name a replayed checkpoint of ``step`` has in ``{out}``: ``step-<N:08d>.h5``."""
    return f"step-{step:08d}.h5"


def _tool() -> str:
    try:
        return f"kronos-audit {importlib.metadata.version('kronos-audit')}"
    except importlib.metadata.PackageNotFoundError:
        return "kronos-audit (not installed)"


def _ref(project: Project, manifest: Manifest) -> ManifestRef:
    return ManifestRef(
        path=project.relative(manifest.path),
        sha256=manifest.digest,
        run=manifest.run,
        step=manifest.step,
        checkpoint=manifest.subject_name,
        checkpoint_sha256=manifest.subject_sha256,
    )


# -- 1. verification -----------------------------------------------------------------------


def _fetch(verifier: Verifier, manifest: Manifest, what: str) -> bool:
    """Make the checkpoint of ``manifest`` present, fetching it from the DVC remote if it
    is not here (only once the manifest's signature and place hold, only the object its
    signed md5 names, checked before it becomes visible); return whether it was fetched."""
    checkpoint = manifest.checkpoint_path
    if checkpoint.exists():
        return False
    try:
        verifier.fetch_data(manifest)
    except Error as e:
        raise ReplayError(
            f"the {what} is not here and could not be fetched: {e.message}",
            path=checkpoint,
            stage="data",
        ) from None
    return True


def _require(result: VerifyResult, what: str) -> None:
    if not result.ok:
        failed = result.failures[0]
        raise ReplayError(
            f"{what} does not verify ({failed.name}: {failed.detail}); "
            "a replay of unverified history proves nothing",
            path=result.manifest,
            stage="verify",
        )


# -- 3. the code ---------------------------------------------------------------------------


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


@contextmanager
def worktree(root: Path, commit: str, dest: Path, *, keep: bool = False) -> Iterator[Path]:
    """A detached git worktree of ``root`` at ``commit`` in ``dest``; removed on exit
    unless ``keep``."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise ReplayError(
            f"commit {commit} is not in this repository: fetch it (git fetch) or replay "
            "in a clone that has it",
            path=root,
            stage="code",
        )
    added = _git(root, "worktree", "add", "--detach", str(dest), commit)
    if added.returncode != 0:
        raise ReplayError(
            f"cannot check out commit {commit[:12]} into a worktree: {_first_line(added.stderr)}",
            path=root,
            stage="code",
        )
    try:
        yield dest
    finally:
        if not keep and _git(root, "worktree", "remove", "--force", str(dest)).returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            _git(root, "worktree", "prune")


def apply_patch(project: Project, digest: str, tree: Path) -> None:
    """Re-apply the recorded uncommitted patch (content-addressed in .kaudit/patches)."""
    path = patch_path(project.root, digest)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ReplayError(
            f"the recorded tree was dirty and its patch {digest[:16]}... is missing "
            "(commit .kaudit/patches/ with the manifests)",
            path=path,
            stage="code",
        ) from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ReplayError(
            "the patch does not match its recorded sha256: altered", path=path, stage="code"
        )
    if not data:
        return
    applied = _git(tree, "apply", "--whitespace=nowarn", str(path.resolve()))
    if applied.returncode != 0:
        raise ReplayError(
            f"the recorded patch does not apply to its commit: {_first_line(applied.stderr)}",
            path=path,
            stage="code",
        )


# -- 4. the command ------------------------------------------------------------------------


PARENT_DIR = "parent"
"""The directory in the work directory that holds the copy of the parent handed over."""
_COPY_CHUNK = 1 << 30
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})


def hand_over(parent: Manifest, dest: Path) -> Path:
    """Copy the verified parent checkpoint and its manifest (``Run`` reads the step there)
    into ``dest``, a new directory, keeping their names; return the checkpoint's copy.

    The command resumes from this copy, never from the repository: beside the parent in the
    run directory lies the recorded checkpoint the replay compares with, and a command that
    wrote to its input would alter verified history. The copy is a new file (the kernel may
    share blocks, a reflink, but never a hard or symbolic link), and the sha256 of what is
    handed over must be the signed one, so a file swapped during the copy is caught.
    """
    checkpoint = dest / parent.checkpoint_path.name
    try:
        dest.mkdir(mode=0o700)
        _copy(parent.checkpoint_path, checkpoint)
        with open(checkpoint, "rb") as f:
            copied = hashlib.file_digest(f, "sha256").hexdigest()
        data = read_regular(parent.path, MANIFEST_LIMIT)
        _write_new(manifest_path_for(checkpoint), data)
    except UnsafeFile as e:
        raise ReplayError(
            f"cannot copy the parent manifest for the command: {e.reason}",
            path=parent.path,
            stage="data",
        ) from None
    except OSError as e:
        raise ReplayError(
            f"cannot copy the parent checkpoint for the command: {e.strerror or e}",
            path=parent.checkpoint_path,
            stage="data",
        ) from None
    if copied != parent.subject_sha256:
        raise ReplayError(
            f"the parent checkpoint changed after it was verified: its copy's sha256 "
            f"{copied[:16]}... is not the signed {parent.subject_sha256[:16]}...",
            path=parent.checkpoint_path,
            stage="data",
        )
    if hashlib.sha256(data).hexdigest() != parent.digest:
        raise ReplayError(
            "the parent manifest changed after it was verified",
            path=parent.path,
            stage="data",
        )
    return checkpoint


def _copy(src: Path, dst: Path) -> None:
    """A new read-only file ``dst`` holding the bytes of the regular file ``src``."""
    fin = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO cannot block
    try:
        if not stat.S_ISREG(os.fstat(fin).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _copy_bytes(fin, fout)
            os.fchmod(fout, 0o400)  # an input, not a scratch file
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _copy_bytes(fin: int, fout: int) -> None:
    try:  # in the kernel: no round trip through user memory, and a reflink where it can
        while os.copy_file_range(fin, fout, _COPY_CHUNK) > 0:
            pass
        return
    except OSError as e:
        if e.errno not in _NO_KERNEL_COPY:
            raise
    os.lseek(fin, 0, os.SEEK_SET)
    os.lseek(fout, 0, os.SEEK_SET)
    os.ftruncate(fout, 0)
    with open(fin, "rb", closefd=False) as r, open(fout, "wb", closefd=False) as w:
        shutil.copyfileobj(r, w, 8 * 1024 * 1024)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    with open(fd, "wb") as f:
        f.write(data)


@dataclass(frozen=True)
class Instruction:
    """What the replayed command is told, as environment variables and placeholders."""

    resume_from: Path | None
    """The parent checkpoint (absolute); None: from the start."""
    stop_at: int
    """The step to stop at and write."""
    out: Path
    """Where to write it."""
    seed: int | None
    """The first recorded seed."""

    def placeholders(self) -> dict[str, str]:
        return {
            "{resume_from}": "" if self.resume_from is None else str(self.resume_from),
            "{stop_at}": str(self.stop_at),
            "{out}": str(self.out),
            "{seed}": "" if self.seed is None else str(self.seed),
        }

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        env.pop(PROGRESS_ENV, None)  # a supervisor's progress file is not the replay's
        env[RESUME_FROM_ENV] = "" if self.resume_from is None else str(self.resume_from)
        env[STOP_AT_ENV] = str(self.stop_at)
        env[OUT_ENV] = str(self.out)
        if self.seed is None:
            env.pop(SEED_ENV, None)
        else:
            env[SEED_ENV] = str(self.seed)
        return env


def _shown(arg: str, at: int) -> str:
    """An argument quoted on one line (a script given to ``sh -c`` may span many lines),
    cut to the text around position ``at`` when long."""
    start, end = max(0, at - SHOWN_CONTEXT), min(len(arg), at + SHOWN_CONTEXT)
    return ("..." if start else "") + repr(arg[start:end]) + ("..." if end < len(arg) else "")


def check_placeholders(recorded: Sequence[str], *, path: Path | None = None) -> None:
    """Refuse a recorded argv with a placeholder inside a larger argument.

    A placeholder is substituted only as a whole argument (``{out}``) or as the value of an
    option (``--out={out}``): a value spliced into a string that a shell parses (``sh -c
    "... {resume_from} ..."``) would be parsed as shell code, and a parent checkpoint in a
    directory named ``x;rm -rf ~;`` would run it. The argv is signed, so it cannot be
    repaired here; it is refused before anything runs (``ReplayError``, stage ``run``).
    """
    for i, arg in enumerate(recorded):
        if arg in PLACEHOLDERS or _option_placeholder(arg) is not None:
            continue
        inside = sorted((arg.find(name), name) for name in PLACEHOLDERS if name in arg)
        if inside:
            at, name = inside[0]
            raise ReplayError(
                f"argument {i} of the recorded command, {_shown(arg, at)}, has {name} inside "
                "it: placeholders must be whole arguments ({out}) or an option's value "
                "(--out={out}), never spliced into a string; a shell command reads the "
                'environment variables instead, quoted ("$KAUDIT_RESUME_FROM"), which the '
                "shell does not parse again",
                path=path,
                stage="run",
            )


def _option_placeholder(arg: str) -> tuple[str, str] | None:
    """``("--name", "{placeholder}")`` for an argument ``--name={placeholder}``, else None."""
    match = _OPTION_VALUE.fullmatch(arg)
    if match is None or match.group(2) not in PLACEHOLDERS:
        return None
    return match.group(1), match.group(2)


def command_line(
    recorded: Sequence[str],
    instruction: Instruction,
    *,
    repo_root: Path,
    tree: Path,
    manifest: Path | None = None,
) -> list[str]:
    """The argv to run: ``python`` resolved to this interpreter, absolute paths into the
    recorded repository moved into the worktree, then the placeholders substituted, each
    as a whole argument or an option's value (see :func:`check_placeholders`, which
    refuses any other use; ``manifest`` is named in that error)."""
    check_placeholders(recorded, path=manifest)
    values = instruction.placeholders()
    argv = []
    for arg in recorded:
        option = _option_placeholder(arg)
        if arg in values:
            arg = values[arg]
        elif option is not None:
            arg = f"{option[0]}={values[option[1]]}"
        else:
            p = Path(arg)
            if p.is_absolute() and p.is_relative_to(repo_root):
                arg = str(tree / p.relative_to(repo_root))
        argv.append(arg)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    return argv


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_TAIL_LINES:])


def find_output(out: Path, step: int) -> Path:
    """The checkpoint the command wrote: ``{out}/step-<N:08d>.h5``, else the one file in
    ``{out}`` (names starting with ``.`` are ignored), unless that one is another step's."""
    expected = out / checkpoint_name(step)
    if expected.is_file():
        return expected
    files = sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ReplayError(
            f"the command exited 0 but wrote no checkpoint (expected {expected.name} in "
            f"the {{out}} directory)",
            stage="output",
        )
    if len(files) > 1:
        names = ", ".join(p.name for p in files[:5])
        raise ReplayError(
            f"the command wrote {len(files)} files ({names}) but no {expected.name}: "
            "cannot tell which is the checkpoint",
            stage="output",
        )
    match = _STEP_FILE.match(files[0].name)
    if match and int(match.group(1)) != step:
        raise ReplayError(
            f"the command stopped at step {int(match.group(1))}, not at step {step} "
            "(does its own step count end before it?)",
            stage="output",
        )
    return files[0]


# -- 5. comparison -------------------------------------------------------------------------


def _shape(d: DatasetDigest) -> str:
    return f"{d.dtype}{list(d.shape) if d.shape is not None else '[null]'}"


def compare_digests(
    recorded: Sequence[DatasetDigest], replayed: Sequence[DatasetDigest]
) -> list[DatasetReplay]:
    """Bitwise, by the canonical hashes alone: no recorded data needed."""
    want = {d.path: d for d in recorded}
    got = {d.path: d for d in replayed}
    results = []
    for path in sorted(set(want) | set(got)):
        a, b = want.get(path), got.get(path)
        if b is None:
            results.append(
                DatasetReplay(path, Verdict.ONLY_IN_A, a, None, "recorded, but not produced")
            )
        elif a is None:
            results.append(
                DatasetReplay(path, Verdict.ONLY_IN_B, None, b, "produced, but not recorded")
            )
        elif (a.dtype, a.shape) != (b.dtype, b.shape):
            results.append(
                DatasetReplay(
                    path,
                    Verdict.NOT_COMPARABLE,
                    a,
                    b,
                    f"replayed {_shape(b)}, recorded {_shape(a)}",
                )
            )
        elif a.sha256 != b.sha256:
            results.append(
                DatasetReplay(
                    path,
                    Verdict.DIFFERENT,
                    a,
                    b,
                    f"content hash {b.sha256[:16]}... differs from the recorded {a.sha256[:16]}...",
                )
            )
        else:
            results.append(DatasetReplay(path, Verdict.IDENTICAL, a, b))
    return results


def _from_comparison(
    comparison: Comparison,
    recorded: Sequence[DatasetDigest],
    replayed: Sequence[DatasetDigest],
) -> list[DatasetReplay]:
    want = {d.path: d for d in recorded}
    got = {d.path: d for d in replayed}
    return [
        DatasetReplay(
            c.path,
            c.verdict,
            want.get(c.path),
            got.get(c.path),
            c.reason if not c.ok else None,
            c,
        )
        for c in comparison.datasets
    ]


def _explain(results: list[DatasetReplay], recorded: Path, produced: Path) -> list[DatasetReplay]:
    """Attach an exact element-by-element comparison to the datasets that differ, when the
    recorded data is here: where, and by how much."""
    try:
        comparison = compare_files(recorded, produced, TolerancePolicy())
    except CheckpointError:
        return results  # the hashes have spoken; the details are a courtesy
    by_path = {c.path: c for c in comparison.datasets}
    out = []
    for r in results:
        c = by_path.get(r.path)
        if not r.ok and c is not None and r.verdict in (Verdict.DIFFERENT, Verdict.NOT_COMPARABLE):
            r = DatasetReplay(r.path, r.verdict, r.recorded, r.replayed, r.detail, c)
        out.append(r)
    return out


# -- the whole -----------------------------------------------------------------------------


class _Clock:
    """Wall time of each phase, one lap after the other."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.laps[phase] = now - self.last
        self.last = now

    def timings(self) -> Timings:
        return Timings(**self.laps, total=time.perf_counter() - self.started)


@dataclass(frozen=True)
class _Verified:
    """A manifest whose history verified, and what the replay needs of it."""

    manifest: Manifest
    project: Project
    parent: Manifest | None
    parent_fetched: bool
    verifier: Verifier


def _verify(project: Project, m: Manifest, basis: str, trust: TrustOptions | None) -> _Verified:
    """Fetch what is missing and verify; raise ReplayError unless all holds. The parent's
    checkpoint is needed to resume from; the recorded one only to compare data."""
    verifier = Verifier(project, load_keyring(project.root, trust))
    signature = verifier.signature(m)
    if not signature.ok:  # before anything is fetched for it
        raise ReplayError(
            f"the manifest does not verify (signature: {signature.detail}); "
            "a replay of unverified history proves nothing",
            path=m.path,
            stage="verify",
        )
    parent: Manifest | None = None
    parent_fetched = False
    if m.parent is not None:
        parent_path = verifier.locate_parent(m)  # the file whose sha256 is the recorded link
        if parent_path is None:
            name = m.predicate["parent_manifest"] or "(not recorded)"
            raise ReplayError(
                f"its parent manifest {name} is missing or altered: no manifest here has "
                f"the recorded digest {m.parent}",
                path=m.path,
                stage="verify",
            )
        parent = read_manifest(parent_path)
        parent_fetched = _fetch(verifier, parent, "parent checkpoint")
        checked = verifier.verify(parent.path)
        _require(checked, "the parent manifest")
    # A tolerance's recorded data is fetched and read only after the command has run
    # (_recorded_data): the command must not find the answer it is compared with.
    if basis == "hashes" and (m.checkpoint_path.exists() or verifier.pruned_by(m) is not None):
        checked = verifier.verify(m.path)
    else:
        checked = verifier.verify(m.path, data=False)
    _require(checked, "the manifest")
    return _Verified(m, project, parent, parent_fetched, verifier)


def _recorded_data(verifier: Verifier, m: Manifest) -> None:
    """For a tolerance, once the command has finished: the recorded checkpoint, fetched
    from the DVC remote when it is not here, and verified before it is compared with."""
    _fetch(verifier, m, "recorded checkpoint (a tolerance compares data)")
    checked = verifier.verify(m.path)
    _require(checked, "the manifest")


def _environment(m: Manifest, env: EnvMode) -> EnvironmentReport:
    report = environment_report(m.predicate["environment"], env)
    if env is EnvMode.STRICT and report.drift:
        n = len(report.drift)
        raise ReplayError(
            f"the environment drifted from the recorded lock ({n} "
            f"difference{'s' if n != 1 else ''}, refused by strict mode): "
            + "; ".join(str(d) for d in report.drift),
            path=m.path,
            stage="environment",
        )
    return report


def replay(
    manifest: Path | str,
    *,
    policy: TolerancePolicy | None = None,
    env: EnvMode = EnvMode.WARN,
    keep_workdir: bool = False,
    trust: TrustOptions | None = None,
) -> ReplayResult:
    """Replay the segment that produced ``manifest``'s checkpoint and compare.

    ``trust`` gives the anchors whose signers the history must verify under (see
    :mod:`kronos_audit.trust`; an attestation requires an anchored history).

    ``policy`` None takes the tolerances from ``[compare]`` in the repository's
    ``.kaudit/config.toml`` (bitwise when there is none). The empty policy compares
    bitwise against the recorded dataset hashes, so the recorded checkpoint need not be
    here; any tolerance compares against the recorded data, fetched from the DVC remote
    when it is not here. Raises :class:`ReplayError` (exit 2) when the segment cannot be
    replayed; returns the result, reproduced or not, otherwise.
    """
    clock = _Clock()
    m = read_manifest(Path(manifest).absolute())
    project = find_project(m.path).require_initialized()
    if not m.predicate["command"]:
        raise ReplayError(
            "the manifest records no command to re-run (kaudit snapshot --command ...)",
            path=m.path,
            stage="verify",
        )
    if policy is None:
        policy = TolerancePolicy.from_config(project)
    basis = "hashes" if policy == TolerancePolicy() else "data"
    verified = _verify(project, m, basis, trust)
    check_placeholders(m.predicate["command"], path=m.path)  # before anything runs
    clock.lap("verify")
    report = _environment(m, env)
    clock.lap("environment")
    workdir = Path(tempfile.mkdtemp(prefix="kaudit-replay-"))
    try:
        return _run_and_compare(verified, report, policy, basis, workdir, keep_workdir, clock)
    except ReplayError as e:
        if keep_workdir:
            e.message += f" (work directory kept: {workdir})"
        raise
    finally:
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _run_and_compare(
    verified: _Verified,
    report: EnvironmentReport,
    policy: TolerancePolicy,
    basis: str,
    workdir: Path,
    keep: bool,
    clock: _Clock,
) -> ReplayResult:
    m, project, parent = verified.manifest, verified.project, verified.parent
    git = m.predicate["git"]
    commit = str(git["commit"])
    patch = git["patch_sha256"]
    cwd = str(m.predicate["cwd"])
    if Path(cwd).is_absolute() or ".." in Path(cwd).parts:
        raise ReplayError(
            f"the recorded working directory {cwd} is outside the repository",
            path=m.path,
            stage="code",
        )
    seeds = m.predicate["seeds"]
    instruction = Instruction(
        resume_from=None if parent is None else hand_over(parent, workdir / PARENT_DIR),
        stop_at=m.step,
        out=workdir / "out",
        seed=int(seeds[0]) if seeds else None,
    )
    with worktree(project.root, commit, workdir / "src", keep=keep) as tree:
        if patch is not None:
            apply_patch(project, str(patch), tree)
        clock.lap("code")
        run_dir = _working_directory(tree, cwd, commit, m)
        argv = command_line(
            list(m.predicate["command"]),
            instruction,
            repo_root=project.root,
            tree=tree,
            manifest=m.path,
        )
        _run(argv, run_dir, instruction, workdir, m)
        clock.lap("command")
        if basis == "data":
            _recorded_data(verified.verifier, m)
        produced = find_output(instruction.out, m.step)
        try:
            digests = digest_file(produced)
        except CheckpointError as e:
            raise ReplayError(
                f"the checkpoint the command wrote is unreadable: {e.message}",
                path=produced,
                stage="output",
            ) from None
        datasets = _compare(m, produced, digests, policy, basis)
        clock.lap("compare")
    return ReplayResult(
        manifest=_ref(project, m),
        parent=None if parent is None else _ref(project, parent),
        parent_fetched=verified.parent_fetched,
        commit=commit,
        patch_sha256=None if patch is None else Sha256(str(patch)),
        command=tuple(m.predicate["command"]),
        executed=tuple(argv),
        cwd=cwd,
        seed=instruction.seed,
        environment=report,
        policy=policy,
        basis=basis,
        produced=produced.name,
        produced_sha256=Sha256(digests.sha256),
        produced_size=digests.size,
        datasets=tuple(datasets),
        file_identical=digests.sha256 == m.subject_sha256,
        timings=clock.timings(),
        replayed_at=utc_now(),
        tool=_tool(),
        workdir=workdir if keep else None,
    )


def _working_directory(tree: Path, cwd: str, commit: str, m: Manifest) -> Path:
    """The recorded working directory in the worktree, resolved: a symbolic link in the
    recorded tree that leads out of it is refused, since the command would run (and write)
    wherever the link points."""
    run_dir = (tree / cwd).resolve()
    if not run_dir.is_relative_to(tree.resolve()):
        raise ReplayError(
            f"the recorded working directory {cwd} leads outside the worktree of commit "
            f"{commit[:12]} (through a symbolic link)",
            path=m.path,
            stage="code",
        )
    if not run_dir.is_dir():
        raise ReplayError(
            f"the recorded working directory {cwd} is not in commit {commit[:12]}",
            path=m.path,
            stage="code",
        )
    return run_dir


def _run(
    argv: list[str], run_dir: Path, instruction: Instruction, workdir: Path, m: Manifest
) -> None:
    """Run the command; its output goes to ``stdout.log`` and ``stderr.log`` in ``workdir``."""
    instruction.out.mkdir()
    stderr_log = workdir / "stderr.log"
    try:
        with open(workdir / "stdout.log", "wb") as so, open(stderr_log, "wb") as se:
            status = subprocess.run(
                argv,
                cwd=run_dir,
                env=instruction.environ(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=so,
                stderr=se,
            ).returncode
    except OSError as e:
        raise ReplayError(
            f"cannot run the recorded command {argv[0]!r}: {e.strerror or e}",
            path=m.path,
            stage="run",
        ) from None
    if status == 0:
        return
    how = f"exited with status {status}"
    if status < 0:
        try:
            how = f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            how = f"was killed by signal {-status}"
    tail = _tail(stderr_log)
    raise ReplayError(
        f"could not replay: the command {how}"
        + (f"; its stderr ends: {tail}" if tail else " and wrote nothing to stderr"),
        path=m.path,
        stage="run",
    )


def _compare(
    m: Manifest, produced: Path, digests: FileDigests, policy: TolerancePolicy, basis: str
) -> list[DatasetReplay]:
    recorded = m.datasets
    if recorded is None:
        if basis == "data":
            raise ReplayError(
                "the recorded checkpoint is not HDF5: only a bitwise replay (its file "
                "digest) is possible, without tolerances",
                path=m.path,
                stage="compare",
            )
        return []  # the file digest decides
    replayed = digests.datasets
    if replayed is None:
        return [
            DatasetReplay(d.path, Verdict.ONLY_IN_A, d, None, "the replay's output is not HDF5")
            for d in recorded
        ]
    if basis == "data":
        comparison = compare_files(m.checkpoint_path, produced, policy)
        return _from_comparison(comparison, recorded, replayed)
    results = compare_digests(recorded, replayed)
    if any(not r.ok for r in results) and m.checkpoint_path.exists():
        results = _explain(results, m.checkpoint_path, produced)
    return results
