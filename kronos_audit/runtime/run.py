"""The run loop: restore, step, checkpoint; survive faults and preemption.

::

    with ka.Run("heat-2d", root="checkpoints", seed=1234, every=ka.EverySteps(50)) as run:
        state = run.restore()                 # newest valid checkpoint's state, or None
        if state is None:
            state = init(run.rng)
        for step in run.steps(10_000):
            state = advance(state, run.rng)
            run.checkpoint(step, state)       # writes only when the policy says so

Checkpoints go to ``<root>/<run>/step-<N:08d>.h5``, each with a signed manifest chained to
the previous one. The checkpoint holds the state, the RNG states (``/rng/numpy`` for
``run.rng``, ``/rng/python`` for Python's ``random``, which the run seeds) and the Monte
Carlo ledger (``/ledger``); these names are reserved at the top of the state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sys
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_dir
from kronos_audit.checkpoint.state import State, flatten, read_group, text_array
from kronos_audit.checkpoint.writer import BackgroundWriter, Job, write_and_digest, write_hdf5
from kronos_audit.errors import CheckpointError, Error, UsageError
from kronos_audit.manifest import Manifest, manifest_path_for, read_manifest
from kronos_audit.project import Project, find_project
from kronos_audit.provenance import GitState, git_state
from kronos_audit.runtime.batches import LEDGER_GROUP, Ledger, batch_rng
from kronos_audit.runtime.policy import EverySeconds, Never, SaveContext, SavePolicy
from kronos_audit.runtime.preemption import PreemptionGuard
from kronos_audit.runtime.protocol import (
    PREEMPTED_EXIT,
    Progress,
    ReplayInstruction,
    checkpoint_name,
    restart_count,
)
from kronos_audit.signing import SigningKey, select_key
from kronos_audit.snapshot import sign_checkpoint
from kronos_audit.storage import (
    Storage,
    cache_object_path,
    cache_settings,
    dvc_file_for,
    read_dvc_file,
    track,
)
from kronos_audit.trust import Anchor, TrustOptions, load_keyring
from kronos_audit.verify import Verifier

log = logging.getLogger("kronos_audit.runtime")

RNG_GROUP = "rng"
RESERVED = (RNG_GROUP, LEDGER_GROUP)


class CheckpointSkipped(UserWarning):
    """restore() passed over a checkpoint that is not valid (and says why)."""


def _step_of(path: Path) -> int | None:
    stem = path.name.removesuffix(".h5")
    if path.suffix != ".h5" or not stem.startswith("step-") or not stem[5:].isdigit():
        return None
    return int(stem[5:])


class Run:
    """One logical job: a chain of checkpoints in ``<root>/<run_id>/``.

    Use as a context manager: leaving the block waits for pending writes and raises any
    background failure.
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
        asynchronous: bool = True,
        key: str | SigningKey | None = None,
        preempt_exit: int = PREEMPTED_EXIT,
        attributes: Mapping[str, Any] | None = None,
        push: bool = False,
        allow_secret_files: bool = False,
    ) -> None:
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise UsageError(f"run id {run_id!r}: use a non-empty name without '/'")
        if keep is not None and keep < 1:
            raise UsageError(f"keep={keep}: keep at least the newest checkpoint")
        if keep_every is not None and keep_every < 1:
            raise UsageError(f"keep_every={keep_every}: must be a positive number of steps")
        try:
            self.replay = ReplayInstruction.from_env()
            """Set when a replay runs this program (``kaudit replay``): see docs/replay.md."""
        except ValueError as e:
            raise UsageError(str(e)) from None
        if self.replay is not None:
            every = Never()  # only the step the replay compares is written
            if seed is None:
                seed = self.replay.seed
        self.run_id = run_id
        self.directory = self.replay.out if self.replay is not None else Path(root) / run_id
        self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
        self.policy: SavePolicy = every if every is not None else EverySeconds(600)
        self.keep = keep
        self.keep_every = keep_every
        self.asynchronous = asynchronous
        self.preempt_exit = preempt_exit
        self.attributes = dict(attributes or {})
        self.push = push
        self.allow_secret_files = allow_secret_files
        """Record an uncommitted diff even when it carries a file that looks like a secret
        (``.env``, ``*.pem``, ``id_*`` ...); by default such a diff is refused."""
        self.push_failures: list[str] = []
        """Background pushes that failed (the checkpoints stay safe locally)."""
        self._storage: Storage | None = None
        self._key_arg = key
        self.rng = np.random.default_rng(self.seed)
        self.ledger = Ledger()
        self.step: int | None = None
        """The step of the state in hand: the restored one, then the last checkpointed."""
        self._project: Project | None = None
        self._key: SigningKey | None = None
        self._git: GitState | None = None
        self._writer: BackgroundWriter | None = None
        self._guard = PreemptionGuard()
        self._progress: Progress | None = None
        self._restored = False
        self._restored_state: State | None = None
        self._parent: Manifest | None = None
        self._last_saved_step: int | None = None
        self._last_time = time.monotonic()
        self._final: int | None = None
        self._batches_total: int | None = None
        self._prepared = False
        self.restored_from: Path | None = None
        """The checkpoint restore() took, if any."""

    # -- context -------------------------------------------------------------------------

    def __enter__(self) -> Run:
        if self.replay is None:  # a replay writes one unsigned checkpoint, for comparison
            self._project = find_project(self.directory).require_initialized()
            self._key = (
                self._key_arg
                if isinstance(self._key_arg, SigningKey)
                else select_key(self._key_arg)
            )
            # The code this process runs is what it loaded now, whatever the checkout
            # becomes. Read before anything is written: a refused diff leaves nothing.
            self._git = git_state(self._project.root, allow_secret_files=self.allow_secret_files)
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(TEMP_PREFIX + "*"):
            leftover.unlink(missing_ok=True)  # a crash mid-write; never a valid checkpoint
        random.seed(self.seed)
        self._writer = BackgroundWriter(self._commit, asynchronous=self.asynchronous)
        self._guard.install()
        self._progress = Progress.from_env()
        self._last_time = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._guard.uninstall()
        if self._progress is not None:
            self._progress.close()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            if exc is None:
                writer.close()  # raises a background failure
            else:
                try:
                    writer.close()  # finish what was handed over; the body's error wins
                except Exception as background:
                    exc.add_note(f"kaudit: a background checkpoint write also failed: {background}")

    def _require_open(self) -> BackgroundWriter:
        if self._writer is None:
            raise UsageError("use the Run inside a `with` block")
        return self._writer

    # -- restore -------------------------------------------------------------------------

    def restore(self) -> State | None:
        """The newest valid checkpoint's state (RNG states and ledger restored), or None.

        Checkpoints whose manifest is missing, unsigned (or signed by a key no anchor
        holds: only this run's own key or an anchored one counts), out of its place, or
        does not match the data are skipped with a :class:`CheckpointSkipped` warning.
        """
        self._require_open()
        if self._restored:
            return self._restored_state
        self._restored = True
        if self.replay is not None:
            if self.replay.resume_from is not None:
                self._load(self.replay.resume_from, self._resume_step(self.replay.resume_from))
            if self._progress is not None:
                self._progress.started(self.step)
            return self._restored_state
        assert self._project is not None
        assert self._key is not None
        # Resuming certifies: the next checkpoint is signed with this run's key as the
        # continuation of the one restored. So only an anchored signer counts, or this
        # run's own key; a key only the work tree's trust store vouches for does not.
        keyring = load_keyring(self._project.root, TrustOptions(require_anchor=True))
        keyring.add(
            self._key.private_key.public_key(),
            self._key.name,
            Anchor.USER,
            "the key this run signs with",
        )
        verifier = Verifier(self._project, keyring)
        candidates = sorted(
            (s, p) for p in self.directory.glob("step-*.h5") if (s := _step_of(p)) is not None
        )
        for step, path in reversed(candidates):
            reason = self._invalid(verifier, path)
            if reason is not None:
                warnings.warn(f"{path}: skipped: {reason}", CheckpointSkipped, stacklevel=2)
                continue
            self._load(path, step)
            break
        if self._progress is not None:
            self._progress.started(self.step)
        return self._restored_state

    @staticmethod
    def _resume_step(path: Path) -> int:
        """The step of the checkpoint a replay resumes from."""
        manifest = manifest_path_for(path)
        if manifest.exists():
            return read_manifest(manifest).step
        step = _step_of(path)
        if step is None:
            raise UsageError(
                "the checkpoint to resume from has neither a manifest beside it nor a "
                "step-<N>.h5 name",
                path=path,
            )
        return step

    def _invalid(self, verifier: Verifier, path: Path) -> str | None:
        manifest_path = manifest_path_for(path)
        if not manifest_path.exists():
            return "no manifest (unsigned, or the write was interrupted)"
        try:
            result = verifier.verify(manifest_path)
        except Error as e:
            return str(e)
        if not result.ok:
            return "; ".join(f"{c.name}: {c.detail}" for c in result.failures)
        if result.run != self.run_id:
            return f"belongs to run {result.run!r}"
        if result.step != _step_of(path):
            return f"its manifest signs step {result.step}, not the step its name says"
        return None

    def _load(self, path: Path, step: int) -> None:
        try:
            state = read_group(path)
        except CheckpointError as e:
            raise CheckpointError(f"verified but unreadable: {e.message}", path=path) from None
        rng = state.pop(RNG_GROUP, {})
        if "numpy" in rng:
            self.rng.bit_generator.state = json.loads(rng["numpy"])
        if "python" in rng:
            version, internal, gauss = json.loads(rng["python"])
            random.setstate((version, tuple(internal), gauss))
        self.ledger = Ledger.from_state(state.pop(LEDGER_GROUP, {}))
        self.step = step
        self._last_saved_step = step
        if self.replay is None:
            self._parent = read_manifest(manifest_path_for(path))
        self._restored_state = state
        self.restored_from = path

    # -- the loop ------------------------------------------------------------------------

    def steps(self, n: int) -> Iterator[int]:
        """The steps after the restored one, up to and including ``n``."""
        self.restore()
        if self.replay is not None:
            n = min(n, self.replay.stop_at)
        self._final = n
        start = 1 if self.step is None else self.step + 1
        yield from range(start, n + 1)

    def batches(self, n: int) -> Iterator[tuple[int, np.random.Generator]]:
        """``(i, rng_i)`` for the batches in ``range(n)`` not yet in the ledger."""
        self.restore()
        self._batches_total = n
        if self.replay is not None:
            # A replay redoes the batches after its parent's, in index order, up to the count
            # it stops at; a run that finished batches out of order replays only if that
            # order was the index order.
            self._batches_total = min(n, self.replay.stop_at)
        for i in range(n):
            if len(self.ledger) >= self._batches_total:
                return
            if i not in self.ledger:
                yield i, batch_rng(self.seed, i)

    def record(self, index: int, result: Any) -> None:
        """Put batch ``index``'s result into the ledger carried by every checkpoint."""
        self.ledger.record(index, result)

    def checkpoint(self, step: int, state: Mapping[str, Any]) -> bool:
        """Offer the state after ``step``; write it if the policy (or a preemption, or the
        last step) says so. Returns whether a checkpoint was taken. On a preemption signal
        it waits until the checkpoint is durable and exits with ``preempt_exit``.
        """
        writer = self._require_open()
        writer.raise_pending()
        if self._batches_total is not None:
            step = len(self.ledger)  # batches finish in any order; their count only grows
            final = step >= self._batches_total
        else:
            final = self._final is not None and step >= self._final
        if self._progress is not None:
            self._progress.reached(step)
        preempted = self._guard.requested
        if not self._prepared:
            self._prepared = True
            writer.prepare(self._flatten(state))
        now = time.monotonic()
        ctx = SaveContext(
            step=step,
            now=now,
            last_step=self._last_saved_step,
            last_time=self._last_time,
            stall=writer.stats.mean_stall,
            write_time=writer.stats.mean_write,
            preempted=preempted,
        )
        save = (
            final or preempted or self.policy.should_save(ctx)
        ) and step != self._last_saved_step
        if save:
            self._save(writer, step, state)
        if self.replay is not None and final:
            writer.flush()
            raise SystemExit(0)  # the replay's instruction: write step N there, then exit
        if preempted:
            writer.flush()
            raise SystemExit(self.preempt_exit)
        return save

    def _flatten(self, state: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
        clash = [k for k in RESERVED if k in state]
        if clash:
            raise UsageError(f"state key {clash[0]!r} is reserved for kaudit's own records")
        return flatten(state)

    def _save(self, writer: BackgroundWriter, step: int, state: Mapping[str, Any]) -> None:
        py_version, py_internal, py_gauss = random.getstate()
        extra = {
            f"/{RNG_GROUP}/numpy": text_array(json.dumps(self.rng.bit_generator.state)),
            f"/{RNG_GROUP}/python": text_array(
                json.dumps([py_version, list(py_internal), py_gauss])
            ),
            **self.ledger.to_flat(),
        }
        meta: dict[str, Any] = {
            "rng": {
                "numpy": {
                    "dataset": f"/{RNG_GROUP}/numpy",
                    "bit_generator": self.rng.bit_generator.state["bit_generator"],
                },
                "python": {"dataset": f"/{RNG_GROUP}/python"},
            },
        }
        if self._batches_total is not None:
            meta["batches"] = {"total": self._batches_total, "done": len(self.ledger)}
        writer.submit(step, self._flatten(state), extra, meta)
        self._last_saved_step = step
        self._last_time = time.monotonic()
        self.step = step

    def wait(self) -> None:
        """Block until every checkpoint handed over is durable; raise a background failure."""
        self._require_open().flush()

    @property
    def stats(self) -> Any:
        """Stall and write-time statistics of this process's checkpoints."""
        return self._require_open().stats

    # -- background ----------------------------------------------------------------------

    def _commit(self, job: Job) -> None:
        """Write, hash, publish and sign one checkpoint (on the background thread)."""
        final = self.directory / checkpoint_name(job.step)
        tmp = self.directory / f"{TEMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            self._publish(job, tmp, final)
        except (OSError, RuntimeError, CheckpointError) as e:  # h5py: some as RuntimeError
            if isinstance(e, CheckpointError):
                reason = e.message
            elif isinstance(e, OSError) and e.strerror:
                reason = e.strerror
            else:
                reason = str(e).splitlines()[0]
            raise CheckpointError(
                f"writing the checkpoint of step {job.step} failed: {reason}", path=final
            ) from e
        finally:
            tmp.unlink(missing_ok=True)  # gone already when published

    def _publish(self, job: Job, tmp: Path, final: Path) -> None:
        if self.replay is not None:  # for comparison only: not signed, not tracked
            write_hdf5(tmp, {**job.staged, **job.extra})
            os.replace(tmp, final)
            fsync_dir(self.directory)
            return
        assert self._project is not None
        assert self._key is not None
        digests = write_and_digest(tmp, {**job.staged, **job.extra}, md5=True)
        assert digests.md5 is not None
        os.replace(tmp, final)
        fsync_dir(self.directory)
        track(
            self._project, final, digests.md5, digests.size, owned=True, ignore_pattern="/step-*.h5"
        )
        extra: dict[str, Any] = {**job.meta, "restart_count": restart_count()}
        doomed = self._doomed(job.step)
        if doomed:
            # Retention is signed: the manifest that prunes names what it prunes, so a
            # verifier can tell data deleted on purpose from data deleted by anyone.
            extra["pruned"] = [{"step": s, "manifest": digest} for s, digest in doomed]
        self._parent = sign_checkpoint(
            final,
            digests,
            project=self._project,
            key=self._key,
            run=self.run_id,
            step=job.step,
            seeds=[self.seed],
            parent=self._parent,
            command=["python", *sys.argv],
            cwd=Path.cwd(),
            attributes=self.attributes,
            extra=extra,
            git=self._git,
        )
        self._prune([s for s, _ in doomed])
        if self.push:
            self._push(final)

    def _push(self, checkpoint: Path) -> None:
        """Push on the background thread. A failure does not stop the run: the checkpoint
        is safe locally, `kaudit status` shows it as not pushed, `kaudit push` completes it."""
        assert self._project is not None
        if self._storage is None:
            self._storage = Storage(self._project)
        try:
            self._storage.push([checkpoint])
        except Error as e:
            self.push_failures.append(str(e))
            log.warning(
                "push of %s failed (kept locally; `kaudit push` completes it): %s",
                checkpoint.name,
                e,
            )

    def _doomed(self, newest: int) -> list[tuple[int, str]]:
        """The checkpoints retention deletes once ``newest`` is signed: (step, sha256 of
        its manifest). A data file without a manifest (an interrupted write) is left alone."""
        if self.keep is None:
            return []
        steps = sorted(
            s for p in self.directory.glob("step-*.h5") if (s := _step_of(p)) is not None
        )
        keep = set(steps[-self.keep :]) | {newest}
        if self.keep_every:
            keep |= {s for s in steps if s % self.keep_every == 0}
        doomed = []
        for s in steps:
            if s in keep:
                continue
            try:
                data = manifest_path_for(self.directory / checkpoint_name(s)).read_bytes()
            except OSError:
                continue
            doomed.append((s, hashlib.sha256(data).hexdigest()))
        return doomed

    def _prune(self, doomed: list[int]) -> None:
        """Delete the data of ``doomed`` (their manifests stay, so the chain verifies)."""
        if not doomed:
            return
        assert self._project is not None
        cache_dir, _ = cache_settings(self._project)
        present = {s for p in self.directory.glob("step-*.h5") if (s := _step_of(p)) is not None}
        # Two steps can hold identical bytes (one md5, one cache object): keep an object
        # that a checkpoint still here points at.
        kept_md5s = {
            e[0]
            for s in present - set(doomed)
            if (e := read_dvc_file(dvc_file_for(self.directory / checkpoint_name(s))))
        }
        for s in doomed:
            path = self.directory / checkpoint_name(s)
            entry = read_dvc_file(dvc_file_for(path))
            path.unlink(missing_ok=True)
            if entry is not None and entry[0] not in kept_md5s:
                # Free the space for real: the cache holds the same bytes.
                cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)
