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

Each step has its module: :mod:`~kronos_audit.replay.verification` (1),
:mod:`~kronos_audit.replay.environment` (2), :mod:`~kronos_audit.replay.worktree` (3),
:mod:`~kronos_audit.replay.handover` and :mod:`~kronos_audit.replay.command` (4),
:mod:`~kronos_audit.replay.comparison` (5); this one runs them in order.

Anything that stops a replay raises :class:`ReplayError` (or another
:class:`kronos_audit.errors.Error`); a replay that ran returns a :class:`ReplayResult`,
reproduced or not. The worktree and the temporary output are removed afterwards unless
``keep_workdir``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from kronos_audit import __version__
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.layout import INDEX_NAME
from kronos_audit.compare import TolerancePolicy
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.project.repository import Project, find_project
from kronos_audit.replay.command import (
    Instruction,
    check_placeholders,
    command_line,
    find_output,
    run_command,
)
from kronos_audit.replay.comparison import compare_output
from kronos_audit.replay.environment import environment_report
from kronos_audit.replay.handover import PARENT_DIR, hand_over
from kronos_audit.replay.interface import (
    Basis,
    EnvironmentReport,
    EnvMode,
    ReplayResult,
    Timings,
)
from kronos_audit.replay.sharded import (
    compare_by_digests,
    compare_steps,
    digests_recorded,
    find_step_output,
    hand_over_step,
    is_sharded,
    launch,
    launcher_defaults,
    launcher_name,
    ranks_for,
)
from kronos_audit.replay.verification import (
    Verified,
    fetch_recorded_data,
    recorded_here,
    verify_history,
)
from kronos_audit.replay.worktree import apply_patch, recorded_cwd, working_directory, worktree
from kronos_audit.signing.predicate import utc_now
from kronos_audit.statement.attestation import ManifestRef
from kronos_audit.statement.manifest import Manifest, Sha256, read_manifest
from kronos_audit.verification.verifier import Verifier

TOOL = f"kronos-audit {__version__}"
"""What a replay record names as the tool that made it."""


def _ref(project: Project, manifest: Manifest) -> ManifestRef:
    return ManifestRef(
        path=project.relative(manifest.path),
        sha256=manifest.digest,
        run=manifest.run,
        step=manifest.step,
        checkpoint=manifest.subject_name,
        checkpoint_sha256=manifest.subject_sha256,
    )


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


def _environment(m: Manifest, env: EnvMode, ranks: int | None) -> EnvironmentReport:
    report = environment_report(
        m.record.environment, env, launcher_defaults=launcher_defaults(m, ranks)
    )
    if env is EnvMode.STRICT and report.drift:
        n = len(report.drift)
        raise ReplayError(
            f"the environment drifted from the recorded lock ({n} "
            f"difference{'s' if n != 1 else ''}, refused by strict mode): "
            + "; ".join(str(d) for d in report.drift),
            path=m.path,
            stage=Stage.ENVIRONMENT,
        )
    return report


def replay(
    manifest: Path | str,
    *,
    policy: TolerancePolicy | None = None,
    env: EnvMode = EnvMode.WARN,
    keep_workdir: bool = False,
    trust: TrustOptions | None = None,
    verifier: Verifier | None = None,
    ranks: int | None = None,
) -> ReplayResult:
    """Replay the segment that produced ``manifest``'s checkpoint and compare.

    ``trust`` gives the anchors whose signers the history must verify under (see
    :mod:`kronos_audit.keys.anchors`; an attestation requires an anchored history). ``verifier``,
    one made with that same trust for this repository, lends the chain links it has
    already checked.

    ``policy`` None takes the tolerances from ``[compare]`` in the repository's
    ``.kaudit/config.toml`` (bitwise when there is none). The empty policy compares
    bitwise against the recorded dataset hashes, so the recorded checkpoint need not be
    here; any tolerance compares against the recorded data, fetched from the DVC remote
    when it is not here. Raises :class:`ReplayError` (exit 2) when the segment cannot be
    replayed; returns the result, reproduced or not, otherwise.

    A step of a run on several ranks (a sharded step) is replayed on the recorded rank
    count, or on ``ranks``, launched as it was (mpiexec or torchrun: see
    :mod:`kronos_audit.replay.sharded`), and compared by the same ``policy``, dataset by
    dataset: a Block array as the global array, whatever the two rank counts.
    """
    clock = _Clock()
    m = read_manifest(Path(manifest).absolute())
    project = find_project(m.path).require_initialized()
    command = m.record.command
    if not command:
        raise ReplayError(
            "the manifest records no command to re-run (kaudit snapshot --command ...)",
            path=m.path,
            stage=Stage.VERIFY,
        )
    if policy is None:
        policy = TolerancePolicy.from_config(project)
    basis = Basis.for_policy(policy)
    if is_sharded(m):
        ranks = ranks_for(m, ranks)
        launch(m, [], ranks)  # a launch it cannot make is refused before anything runs
    elif ranks is not None:
        raise ReplayError(
            "--ranks applies to a step of a run on several ranks; this checkpoint is one file",
            path=m.path,
            stage=Stage.RUN,
        )
    verified = verify_history(project, m, basis, trust, verifier)
    check_placeholders(command, path=m.path)  # before anything runs
    clock.lap("verify")
    report = _environment(m, env, ranks)
    clock.lap("environment")
    workdir = Path(tempfile.mkdtemp(prefix="kaudit-replay-"))
    try:
        return _run_and_compare(
            verified, command, report, policy, basis, workdir, keep_workdir, clock, ranks
        )
    except ReplayError as e:
        if keep_workdir:
            e.message += f" (work directory kept: {workdir})"
        raise
    finally:
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _run_and_compare(
    verified: Verified,
    command: tuple[str, ...],
    report: EnvironmentReport,
    policy: TolerancePolicy,
    basis: Basis,
    workdir: Path,
    keep: bool,
    clock: _Clock,
    ranks: int | None = None,
) -> ReplayResult:
    m, project, parent = verified.manifest, verified.project, verified.parent
    commit, patch = m.record.git.commit, m.record.git.patch_sha256
    cwd = recorded_cwd(m)
    seeds = m.record.seeds
    sharded = ranks is not None
    give = hand_over_step if sharded else hand_over
    instruction = Instruction(
        resume_from=None if parent is None else give(parent, workdir / PARENT_DIR),
        stop_at=m.step,
        out=workdir / "out",
        seed=seeds[0] if seeds else None,
        sharded=sharded,
    )
    with worktree(project.root, commit, workdir / "src", keep=keep) as tree:
        if patch is not None:
            apply_patch(project, patch, tree, m.run)
        clock.lap("code")
        run_dir = working_directory(tree, cwd, commit, m)
        argv = command_line(
            list(command),
            instruction,
            repo_root=project.root,
            tree=tree,
            manifest=m.path,
        )
        if ranks is not None:
            argv = launch(m, argv, ranks, logs=workdir / "launcher")
        run_command(argv, run_dir, instruction, workdir, m)
        clock.lap("command")
        if ranks is not None:
            # Bitwise, a step whose manifest signs every declared dataset's digest compares
            # by them when its shards are not here. Otherwise the comparison reads the
            # recorded data, fetched if it is not here and verified again only now, after
            # the command ran (it must not find the answer, nor change it unseen).
            by_digests = basis is Basis.HASHES and _by_digests(m)
            if not by_digests:
                fetch_recorded_data(verified.verifier, m)
            return _sharded_result(
                verified,
                command,
                argv,
                cwd,
                instruction,
                report,
                policy,
                basis,
                ranks,
                clock,
                workdir if keep else None,
                by_digests,
            )
        if basis is Basis.DATA:  # only now: the command must not find the answer
            fetch_recorded_data(verified.verifier, m)
        produced = find_output(instruction.out, m.step)
        try:
            digests = digest_file(produced)
        except CheckpointError as e:
            raise ReplayError(
                f"the checkpoint the command wrote is unreadable: {e.message}",
                path=produced,
                stage=Stage.OUTPUT,
            ) from None
        datasets = compare_output(m, produced, digests, policy, basis)
        clock.lap("compare")
    return ReplayResult(
        manifest=_ref(project, m),
        parent=None if parent is None else _ref(project, parent),
        parent_fetched=verified.parent_fetched,
        commit=commit,
        patch_sha256=patch,
        command=command,
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
        tool=TOOL,
        workdir=workdir if keep else None,
    )


def _by_digests(m: Manifest) -> bool:
    """Whether a bitwise replay of sharded step ``m`` compares by the digests its manifest
    signs: it records one for every dataset it declares, and the recorded shards (or
    their index) are not all here."""
    shards = m.record.shards
    assert shards is not None
    return digests_recorded(shards.layout) and not recorded_here(m)


def _sharded_result(
    verified: Verified,
    command: tuple[str, ...],
    argv: list[str],
    cwd: str,
    instruction: Instruction,
    report: EnvironmentReport,
    policy: TolerancePolicy,
    basis: Basis,
    ranks: int,
    clock: _Clock,
    workdir: Path | None,
    by_digests: bool = False,
) -> ReplayResult:
    """The step the ranks wrote against the recorded step, by ``policy`` (bitwise by the
    data's digests for the empty one), or by the digests the step manifest signs alone."""
    m, project, parent = verified.manifest, verified.project, verified.parent
    shards = m.record.shards
    assert shards is not None
    produced = find_step_output(instruction.out, m.step, ranks)
    if by_digests:
        datasets, uncompared = compare_by_digests(shards.layout, produced)
    else:
        datasets, uncompared = compare_steps(
            m.checkpoint_path.parent,
            shards.count,
            shards.layout,
            produced,
            m.subject_sha256,
            policy if basis is Basis.DATA else None,
        )
    clock.lap("compare")
    return ReplayResult(
        manifest=_ref(project, m),
        parent=None if parent is None else _ref(project, parent),
        parent_fetched=verified.parent_fetched,
        commit=m.record.git.commit,
        patch_sha256=m.record.git.patch_sha256,
        command=command,
        executed=tuple(argv),
        cwd=cwd,
        seed=instruction.seed,
        environment=report,
        policy=policy,
        basis=basis,
        produced=f"{produced.directory.name}/{INDEX_NAME}",
        produced_sha256=Sha256(produced.index_sha256),
        produced_size=sum(r.size for r in produced.records),
        datasets=tuple(datasets),
        file_identical=produced.index_sha256 == m.subject_sha256,
        timings=clock.timings(),
        replayed_at=utc_now(),
        tool=TOOL,
        workdir=workdir,
        ranks=ranks,
        launcher=launcher_name(m),
        uncompared=tuple(uncompared),
    )
