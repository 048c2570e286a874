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
   ``KAUDIT_STOP_AT``, ``KAUDIT_OUT``, ``KAUDIT_SEED``; a job array task's step also gets
   the task its manifest signs, :mod:`~kronos_audit.replay.array`) and as placeholders in
   its argv (``{resume_from}``, ``{stop_at}``, ``{out}``, ``{seed}``), each a whole
   argument or an option's value, never spliced into a string. The checkpoint it resumes
   from is a copy of the verified parent in a fresh directory: the command sees neither the
   run directory nor the recorded data it will be compared with;
5. compare the checkpoint it wrote with the recorded one: bitwise against the recorded
   dataset hashes, or, with tolerances, against the recorded data, fetched (and verified)
   only now that the command has finished; and a campaign's chunk of its ledger that step
   N wrote beside it, bitwise by its sha256 (:mod:`~kronos_audit.replay.ledger`).

Each step has its module: :mod:`~kronos_audit.replay.verification` (1),
:mod:`~kronos_audit.replay.environment` (2), :mod:`~kronos_audit.replay.worktree` (3),
:mod:`~kronos_audit.replay.handover`, :mod:`~kronos_audit.replay.array`,
:mod:`~kronos_audit.replay.command` and :mod:`~kronos_audit.replay.launch` (4),
:mod:`~kronos_audit.replay.produced` (5); this one runs them in order, the same for a
checkpoint in one file as for a sharded step on N ranks (:mod:`~kronos_audit.replay.sharded`):
a file is a world of one, started with no launcher.

Anything that stops a replay raises :class:`ReplayError` (or another
:class:`kronos_audit.errors.Error`); a replay that ran returns a :class:`ReplayResult`,
reproduced or not. The worktree and the temporary output are removed afterwards unless
``keep_workdir``.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from kronos_audit import __version__
from kronos_audit._internal import strictjson
from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.compare import PolicySource, TolerancePolicy
from kronos_audit.errors import ReplayError, Stage
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.project.repository import Project, find_project
from kronos_audit.project.settings import compare_settings
from kronos_audit.provenance.dispatch import replay_pins
from kronos_audit.replay.array import array_task
from kronos_audit.replay.command import Instruction, check_placeholders, command_line, run_command
from kronos_audit.replay.environment import environment_report
from kronos_audit.replay.handover import PARENT_DIR, hand_over, hand_over_step
from kronos_audit.replay.interface import Basis, EnvironmentReport, EnvMode, ReplayResult, Timings
from kronos_audit.replay.launch import launch, launcher_defaults, launcher_name, ranks_for
from kronos_audit.replay.ledger import compare_ledger, ledger_from
from kronos_audit.replay.produced import Produced, by_signed_digests
from kronos_audit.replay.verification import Verified, fetch_recorded_data, verify_history
from kronos_audit.replay.worktree import apply_patch, recorded_cwd, working_directory, worktree
from kronos_audit.signing.predicate import utc_now
from kronos_audit.statement.attestation import ManifestRef
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.statement.predicate import EnvironmentLock
from kronos_audit.supervise.protocol import ENVIRONMENT_FILE
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


def _pins(m: Manifest) -> dict[str, str | None]:
    """What the command is given of the recorded CPU dispatch (a portable run's pins)."""
    try:
        return replay_pins(m.record.environment.variables)
    except ValueError as e:
        raise ReplayError(str(e), path=m.path, stage=Stage.ENVIRONMENT) from None


def _environment(
    m: Manifest, env: EnvMode, ranks: int | None, pins: dict[str, str | None]
) -> EnvironmentReport:
    report = environment_report(
        m.record.environment, env, launcher_defaults=launcher_defaults(m, ranks), pins=pins
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


ENVIRONMENT_FILE_LIMIT = 4 << 20
"""Bytes of the environment lock a replayed program leaves: a lock is some tens of KB."""


def _judged(m: Manifest, before: EnvironmentReport, out: Path) -> EnvironmentReport:
    """Drift judged on what the replayed program ran with: the environment lock it left
    in ``out`` (a Python program using kaudit's API does), else ``before`` (this process's,
    with what the command was given)."""
    path = out / ENVIRONMENT_FILE
    try:
        data = read_regular(path, ENVIRONMENT_FILE_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        if e.missing:
            return before
        raise ReplayError(
            f"the environment lock the replayed program left ({ENVIRONMENT_FILE}) {e.reason}",
            path=m.path,
            stage=Stage.OUTPUT,
        ) from None
    try:
        lock = EnvironmentLock.from_json_obj(strictjson.loads(data.decode("utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise ReplayError(
            f"the environment lock the replayed program left ({ENVIRONMENT_FILE}) is not one",
            path=m.path,
            stage=Stage.OUTPUT,
        ) from None
    return environment_report(m.record.environment, before.mode, lock.to_json_obj(), program=True)


def replay(
    manifest: Path | str,
    *,
    policy: TolerancePolicy | None = None,
    policy_source: PolicySource | None = None,
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
    ``.kaudit/config.toml`` (bitwise when there is none): as it is at ``trust``'s trust
    ref when there is one, else the work tree's, which the result then records (and
    which no attestation accepts). ``policy_source`` says where a ``policy`` given came
    from (None: given by the caller); the result records it. The empty policy compares
    bitwise against the recorded dataset hashes, so the recorded checkpoint need not be
    here; any tolerance compares against the recorded data, fetched from the DVC remote
    when it is not here. Raises :class:`ReplayError` (exit 2) when the segment cannot be
    replayed; returns the result, reproduced or not, otherwise.

    A step of a run on several ranks (a sharded step) is replayed on the recorded rank
    count, or on ``ranks``, launched as it was (mpiexec or torchrun: see
    :mod:`kronos_audit.replay.launch`), and compared by the same ``policy``, dataset by
    dataset: a Block array as the global array, whatever the two rank counts.
    """
    clock = _Clock()
    m = read_manifest(Path(manifest).absolute())
    # A verifier lent by the caller (the gate) stands in its repository; else the user
    # stands in the working directory's.
    standing = verifier.project.root if verifier is not None else None
    project = find_project(m.path, standing=standing).require_initialized()
    command = m.record.command
    if not command:
        raise ReplayError(
            "the manifest records no command to re-run (kaudit snapshot --command ...)",
            path=m.path,
            stage=Stage.VERIFY,
        )
    if trust is not None:
        # One resolution of --trust-ref: the tolerances and the history read one commit.
        trust = trust.pin(project.root)
    if policy is None:
        pinned = None if trust is None else trust.pinned
        policy, policy_source = compare_settings(project, pinned, work_tree=True)
    elif policy_source is None:
        policy_source = PolicySource(given=policy != TolerancePolicy())
    basis = Basis.for_policy(policy)
    if m.record.shards is not None:
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
    task = array_task(m, verified.parent)  # a share that is not its task's: refused now
    clock.lap("verify")
    pins = _pins(m)
    report = _environment(m, env, ranks, pins)
    clock.lap("environment")
    workdir = Path(tempfile.mkdtemp(prefix="kaudit-replay-"))
    try:
        result = _run_and_compare(
            verified,
            command,
            report,
            policy,
            basis,
            workdir,
            keep_workdir,
            clock,
            ranks,
            pins,
            task,
        )
        return dataclasses.replace(result, policy_source=policy_source)
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
    pins: dict[str, str | None] | None = None,
    task: tuple[int, int] | None = None,
) -> ReplayResult:
    """Hand the parent over, run the command (on ``ranks`` ranks for a sharded step; a
    checkpoint in one file is a world of one, started with no launcher; as job array task
    ``task``, the one its manifest signs), and compare what it wrote with the recorded
    checkpoint."""
    m, project, parent = verified.manifest, verified.project, verified.parent
    commit, patch = m.record.git.commit, m.record.git.patch_sha256
    cwd = recorded_cwd(m)
    seeds = m.record.seeds
    give = hand_over if ranks is None else hand_over_step
    instruction = Instruction(
        resume_from=None if parent is None else give(parent, workdir / PARENT_DIR),
        stop_at=m.step,
        out=workdir / "out",
        seed=seeds[0] if seeds else None,
        sharded=ranks is not None,
        pins=pins or {},
        ledger_from=ledger_from(m, parent),
        task=task,
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
        argv = launch(m, argv, ranks, logs=workdir / "launcher")
        run_command(argv, run_dir, instruction, workdir, m)
        report = _judged(m, report, instruction.out)
        clock.lap("command")
        # Unless the digests the manifest signs decide alone, the comparison reads the
        # recorded data, fetched if it is not here and verified again only now, after the
        # command ran (it must not find the answer, nor change it unseen).
        directory = m.checkpoint_path.name if m.record.directory is not None else None
        produced = Produced.find(instruction.out, m.step, ranks, directory)
        if produced.needs_recorded_data(m, basis):
            fetch_recorded_data(verified.verifier, m)
        compared = produced.compare(m, policy, basis, by_digests=by_signed_digests(m, basis))
        # A campaign's step N wrote a chunk of its ledger beside it: compared bitwise too.
        ledger = compare_ledger(m, instruction.out)
        if ledger:
            datasets = sorted((*compared.datasets, *ledger), key=lambda d: d.path)
            compared = dataclasses.replace(compared, datasets=tuple(datasets))
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
        produced_sha256=produced.sha256,
        produced_size=produced.size,
        datasets=compared.datasets,
        file_identical=produced.sha256 == m.subject_sha256,
        timings=clock.timings(),
        replayed_at=utc_now(),
        tool=TOOL,
        workdir=workdir if keep else None,
        ranks=ranks,
        launcher=launcher_name(m),
        uncompared=compared.uncompared,
        compared_by=compared.compared_by,
        notes=compared.notes,
    )
