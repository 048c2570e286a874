"""What one ``run.checkpoint()`` call does: the step decided on every rank together,
saved (the state flattened, the RNGs and the ledger beside it, handed to the background
writer), and the run stopped there on a preemption or at a replay's step.

:class:`~kronos_audit.runtime.run.Run` holds one :class:`Saver` and hands it every step
its loops offer: the step loop's (:meth:`~kronos_audit.runtime.run.Run.checkpoint`) and a
campaign's (:class:`~kronos_audit.runtime.campaigns.batches.Batches`, which is given
:meth:`Saver.offer` as its way in). The saver keeps what the steps share: the writer, the
last step saved and when, the loop's final step, the supervisor's progress line, and what
every checkpoint carries beside the state (the run's generator and ledger).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kronos_audit.checkpoint.codec import tree
from kronos_audit.checkpoint.hdf5 import require_mapping
from kronos_audit.errors import CheckpointError, ExitCode, StepAlreadyExists, UsageError
from kronos_audit.parallel.layout import Layout, Replicated
from kronos_audit.runtime import rng
from kronos_audit.runtime.background import BackgroundWriter, StepMeta
from kronos_audit.runtime.campaigns.batches import Batches
from kronos_audit.runtime.campaigns.ledger import Ledger
from kronos_audit.runtime.policy import SaveContext, SavePolicy
from kronos_audit.runtime.preemption import PreemptionGuard
from kronos_audit.runtime.ranks import LoopAgreement
from kronos_audit.runtime.restore import Resumed
from kronos_audit.runtime.steps.interface import Publisher
from kronos_audit.runtime.steps.layouts import expand_layout
from kronos_audit.statement.predicate import RngRecord
from kronos_audit.supervise.protocol import Progress

if TYPE_CHECKING:
    from kronos_audit.runtime.levels.auto import AutoSchedule

Flat = tuple[dict[str, np.ndarray[Any, Any]], dict[str, Layout]]
"""A state made ready to store: its arrays by name, and each one's layout over the ranks."""


class PreemptedWithoutCheckpoint(UserWarning):
    """A preemption signal ended the run at a step its save policy did not checkpoint
    (``Never()``, or a policy with ``on_preemption=False``): the work since the last
    checkpoint is lost, and a restart resumes from that one (or from the start)."""


class Saver:
    """A run's way from an offered step to a checkpoint handed to its writer, on every
    rank. :meth:`open` gives it the writer; every other method but :meth:`resumed` is
    called by all ranks with the same steps."""

    def __init__(
        self,
        publisher: Publisher,
        policy: SavePolicy,
        agreement: LoopAgreement,
        guard: PreemptionGuard,
        *,
        run_id: str,
        rank: int,
        generator: np.random.Generator,
        asynchronous: bool,
        preempt_exit: int,
        levels_due: Callable[[int], tuple[str, ...]] | None = None,
        schedule: AutoSchedule | None = None,
    ) -> None:
        self.publisher = publisher
        self._levels_due = levels_due
        self.schedule = schedule
        """With an ``Auto.for_levels`` policy: rank 0's choice of levels at each step."""
        self.policy = policy
        self._agreement = agreement
        self._guard = guard
        self._run_id = run_id
        self._rank = rank
        self._asynchronous = asynchronous
        self._preempt_exit = preempt_exit
        self.rng = generator
        """The run's generator: its state goes into every checkpoint."""
        self.ledger = Ledger()
        """The Monte Carlo ledger every checkpoint carries."""
        self.campaign: Batches | None = None
        """``run.batches(n)``'s attempt, on this rank (None: the step loop's steps)."""
        self.writer: BackgroundWriter | None = None
        self.progress: Progress | None = None
        self.last_saved: int | None = None
        """The newest step this run holds: the last handed to the writer, or the one
        restored."""
        self.final: int | None = None
        """The step loop's last step, once :meth:`~kronos_audit.runtime.run.Run.steps`
        knows it."""
        self.agreed_exit = False
        """Whether every rank leaves together (an error raised on all, a preemption, a
        replay's step): no rank is left waiting in a collective."""
        self._restored: Resumed | None = None
        self._last_time = time.monotonic()
        self._prepared = False

    def open(self, writer: BackgroundWriter, progress: Progress | None) -> None:
        """Take the run's writer and the supervisor's progress line (rank 0's only)."""
        self.writer, self.progress = writer, progress
        self._last_time = time.monotonic()

    def require_open(self) -> BackgroundWriter:
        """The writer; UsageError outside the run's ``with`` block."""
        if self.writer is None:
            raise UsageError("use the Run inside a `with` block")
        return self.writer

    def resumed(self, resumed: Resumed | None) -> None:
        """The run resumed from ``resumed`` (None: from the start): its generator, its
        ledger and its step are the run's now."""
        if resumed is not None:
            self._restored = resumed
            self.rng, self.ledger = resumed.rng, resumed.ledger
            self.last_saved = resumed.step
        if self.progress is not None:
            self.progress.started(self.last_saved)

    def loop_starts(self) -> None:
        """A loop of steps or batches begins."""
        # A time-based policy counts the loop's work, from here: set-up before the loop
        # (restore, data loading, compiling) is done again on any restart whatever was
        # saved, and a first save due at the first step would find the staging memory
        # still being prepared.
        if self.require_open().stats.checkpoints == 0:
            self._last_time = time.monotonic()
            if self.schedule is not None:
                self.schedule.last_time = self.schedule.clock()

    # -- one step ----------------------------------------------------------------------

    def offer(
        self,
        step: int,
        final: bool,
        state: Mapping[str, Any],
        layout: Mapping[str, Layout] | None,
        stale: Callable[[int], BaseException | None] | None = None,
    ) -> bool:
        """One call of :meth:`~kronos_audit.runtime.run.Run.checkpoint`, at ``step``
        (``final``: the loop's last), on every rank: decided together, saved, stopped on
        preemption. ``stale`` says why a step may not be taken (the step loop's:
        :meth:`stale`; a campaign's count of batches done may be offered again, and is
        simply not saved twice)."""
        writer = self.require_open()
        # A failure here (a background write that failed, a state that cannot be stored)
        # is told to every rank at the collective below and raised on all of them
        # together: raised on one rank alone, it would leave the others waiting in that
        # collective for ever.
        failure: BaseException | None = None
        try:
            require_mapping(state)
            writer.raise_pending()
        except Exception as e:
            failure = e
        if failure is None and stale is not None:
            failure = stale(step)
        if self.progress is not None:
            self.progress.reached(step)
        preempted = self._guard.requested
        flat = None
        if not self._prepared and failure is None:
            try:
                flat = self.flatten(state, layout)
                writer.prepare(flat[0])
                self._prepared = True
            except Exception as e:
                failure = e
        save, preempted, chosen = self._decide_together(writer, step, preempted, final, failure)
        # The levels beside the durable one: rank 0's policy's choice, or by the step
        # alone (their own every): the same on every rank.
        if chosen is not None:
            levels = chosen
        else:
            levels = () if self._levels_due is None else self._levels_due(step)
        if self.schedule is not None:
            self.schedule.chosen((save, levels))
        if save or levels:
            flat = flat if flat is not None else self.flatten(state, layout)
            self.save(step, *flat, levels=levels, durable=save)
        if final and self.publisher.exits_after_final:
            writer.flush()
            self.agreed_exit = True  # every rank of a replay leaves here, at step N
            raise SystemExit(ExitCode.OK)  # the replay's instruction: write step N there, then exit
        if preempted:
            if step != self.last_saved:
                last = "the start" if self.last_saved is None else f"step {self.last_saved}"
                warnings.warn(
                    f"preempted at step {step}, which the save policy {self.policy!r} did "
                    f"not checkpoint: exiting with status {self._preempt_exit}, and a "
                    f"restart resumes from {last}",
                    PreemptedWithoutCheckpoint,
                    stacklevel=2,
                )
            writer.flush()
            self.agreed_exit = True  # every rank leaves here, at this step
            raise SystemExit(self._preempt_exit)
        return save

    def stale(self, step: int) -> StepAlreadyExists | None:
        """The error for ``step`` if it is not after the newest step this run holds (the
        last one handed to the writer, or the one restored); None when it is after it.
        The same on every rank, which offer the same steps: each raises it together, at
        the collective that decides the step."""
        newest = self.last_saved
        if newest is None or step > newest:
            return None
        restored = self._restored
        held = (
            f"restored from {restored.where}"
            if restored is not None and newest == restored.step
            else "its newest checkpoint"
        )
        return StepAlreadyExists(
            f"run.checkpoint(step={step}): run {self._run_id!r} already holds step {newest} "
            f"({held}); each step must come after it (run.steps(n) gives the steps after "
            "the restored one)",
            path=self.publisher.directory,
            step=step,
            newest=newest,
        )

    def _decide(
        self, writer: BackgroundWriter, step: int, preempted: bool, final: bool
    ) -> bool | tuple[bool, tuple[str, ...]]:
        ctx = SaveContext(
            step=step,
            now=time.monotonic(),
            last_step=self.last_saved,
            last_time=self._last_time,
            stall=writer.stats.mean_stall,
            write_time=writer.stats.mean_write,
            preempted=preempted,
            final=final,
        )
        # Never the same step twice: in a batches loop a round may offer the count of
        # batches done again (elsewhere a step not after the newest is refused before).
        if self.schedule is not None:
            return (False, ()) if step == self.last_saved else self.schedule.choose(ctx)
        return step != self.last_saved and self.policy.should_save(ctx)

    def _decide_together(
        self,
        writer: BackgroundWriter,
        step: int,
        preempted: bool,
        final: bool,
        failure: BaseException | None = None,
    ) -> tuple[bool, bool, tuple[str, ...] | None]:
        """``(save, stop, levels)``, the same on every rank, in one collective
        (:meth:`~kronos_audit.runtime.ranks.LoopAgreement.decide`): rank 0's policy
        decides; a failure on any rank is raised on every rank, together."""
        decision = self._agreement.decide(
            step,
            preempted,
            failure,
            lambda stop: self._decide(writer, step, stop, final),
            batches=self.campaign is not None,
        )
        if decision.error is not None:
            self.agreed_exit = True  # every rank raises here, together
            raise decision.error
        return decision.save, decision.stop, decision.levels

    def flatten(self, state: Mapping[str, Any], layout: Mapping[str, Layout] | None = None) -> Flat:
        """``state`` as this rank stores it, and the layout of each of its arrays."""
        # The codec refuses the reserved keys (rng, ledger, kaudit) and what cannot be
        # stored; tensors and arrays are not copied here (the writer's staging copies).
        flat = tree.encode(state)
        layouts = expand_layout(layout, flat)
        if self._rank > 0:
            # Replicated arrays are stored once, in rank 0's shard.
            flat = {n: a for n, a in flat.items() if not isinstance(layouts.get(n), Replicated)}
        return flat, layouts

    def save(
        self,
        step: int,
        flat: Mapping[str, np.ndarray[Any, Any]],
        layouts: Mapping[str, Layout],
        *,
        levels: tuple[str, ...] = (),
        durable: bool = True,
    ) -> None:
        """Hand step ``step`` to the writer, with the RNGs and the ledger beside it: to
        the durable level (``durable``) and to ``levels`` beside it, staged once."""
        writer = self.require_open()
        batches = None if self.campaign is None else self.campaign.saving()
        generators, record = rng.capture(self.rng)
        # A publisher that keeps the ledger in chunks beside its steps writes only the
        # rows since its last chunk; the others hold it whole in every step.
        chunked = self.publisher.ledger_in_chunks
        extra = generators if chunked else {**generators, **self.ledger.to_flat()}
        meta = StepMeta(
            rng={n: RngRecord.from_json_obj(r) for n, r in record.items()},
            layout=dict(layouts),  # a step of one file is the one rank's: none needed
            batches=batches,
            ledger=self.ledger.rows() if chunked and len(self.ledger) else None,
            levels=levels,
            durable=durable,
            level_extra=self.ledger.to_flat() if chunked and levels else {},
        )
        # Asynchronously, every rank hands the step over whatever failed meanwhile in the
        # background (that is told to all at the next collective): a rank that did not
        # would leave the others' commit of this step waiting for its vote. A synchronous
        # commit's failure is every rank's (the commit is agreed), so it is raised at once.
        try:
            writer.submit(step, flat, extra, meta, raise_pending=not self._asynchronous)
        except CheckpointError:
            self.agreed_exit = not self._asynchronous  # the commit's verdict, every rank's
            raise
        if durable:  # the policy's intervals count the durable level's steps
            self.last_saved = step
            self._last_time = time.monotonic()

    def save_received(self) -> None:
        """Checkpoint the ledger as it stands now, whatever the policy, and wait until it
        is durable (a campaign that stopped keeps every result that arrived)."""
        writer = self.require_open()
        step = len(self.ledger)
        if step != self.last_saved:
            self.save(step, *self.flatten({}, None))
        writer.flush()
