"""kaudit inside the Hugging Face Trainer: a callback that signs each ``checkpoint-N/`` the
Trainer saves as a step of a run, and the newest checkpoint that verifies, to resume from.

::

    from transformers import Trainer
    from kronos_audit.integrations.hf import KauditCallback, verified_last_checkpoint

    trainer = Trainer(model=model, args=args, callbacks=[KauditCallback(run="gpt-tiny")], ...)
    trainer.train(resume_from_checkpoint=verified_last_checkpoint(args.output_dir))

The Trainer writes ``checkpoint-N/`` as it always does; :class:`KauditCallback`'s
``on_save`` (after the Trainer wrote it) signs the directory as step N of the run, its
manifest beside it (``checkpoint-N.kaudit.json``, never inside the Trainer's tree), chained
to the run's previous checkpoint there. The Trainer loads a checkpoint before any callback
runs, so a resume is verified by :func:`verified_last_checkpoint`, called before
``train``.

The Trainer's rotation (``save_total_limit``) is signed pruning: it deletes old
``checkpoint-N/`` directories before ``on_save``, and the run's checkpoints that are gone by
then, and that the limit would have deleted (older than the newest ``save_total_limit``
steps), are listed in the new step's retention record (``pruned``); their manifests stay,
and verify as pruned. A checkpoint deleted otherwise (by hand, or within the limit) is not
recorded: it fails verification as missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import UsageError
from kronos_audit.integrations._common import (
    previous_manifest,
    verified_copy,
    verified_manifest,
    verified_signature,
)
from kronos_audit.integrations._rotation import drop_tracking, rotated_out
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.signing.snapshot import snapshot

CHECKPOINT = re.compile(r"checkpoint-([0-9]{1,18})")
"""The Trainer's name of a checkpoint directory (``PREFIX_CHECKPOINT_DIR``-``N``)."""


class KauditCallback(TrainerCallback):
    """Signs every checkpoint the Trainer saves as a step of run ``run``.

    ``seeds`` defaults to the Trainer's ``args.seed``; ``attributes`` and ``key`` are those
    of :func:`kronos_audit.snapshot`. Only the main process signs (once the Trainer has
    written the directory); a checkpoint saved again under the same step gets a new
    manifest in place of the old one.
    """

    def __init__(
        self,
        run: str,
        *,
        seeds: Sequence[int] | None = None,
        attributes: Mapping[str, Any] | None = None,
        key: str | None = None,
    ) -> None:
        if not run:
            raise UsageError("the run id must not be empty")
        self.run = run
        self.seeds = None if seeds is None else tuple(seeds)
        self.attributes = dict(attributes or {})
        self.key = key

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero:
            return
        step = state.global_step
        if args.output_dir is None:
            raise UsageError("the Trainer's arguments name no output_dir to sign in")
        directory = Path(args.output_dir) / f"checkpoint-{step}"
        if not directory.is_dir():
            raise UsageError(
                "the Trainer said it saved here, but there is no directory", path=directory
            )
        manifest = manifest_path_for(directory)
        rotated = rotated_out(
            directory.parent,
            self.run,
            step,
            args.save_total_limit,
            lambda p: CHECKPOINT.fullmatch(p.name) is not None,
        )
        snapshot(
            directory,
            run=self.run,
            step=step,
            seeds=self.seeds if self.seeds is not None else (args.seed,),
            parent=previous_manifest(directory.parent, self.run, step, skip=manifest),
            key=self.key,
            attributes=self.attributes or None,
            force=manifest.exists(),
            pruned=[r.entry for r in rotated],
        )
        for removed in rotated:
            drop_tracking(removed)


def verified_last_checkpoint(
    output_dir: str | Path,
    *,
    trust: TrustOptions | None = None,
    copy_to: str | Path | None = None,
) -> str | None:
    """The newest signed ``checkpoint-N/`` in ``output_dir`` once it verified, for
    ``trainer.train(resume_from_checkpoint=...)``; None when there is none.

    A newer directory with no manifest beside it (a save killed before it was signed) is
    passed over. A signed one that does not verify raises
    :class:`~kronos_audit.errors.TamperedData` naming what changed: it is never passed over
    in silence for an older one. With ``copy_to``, the checkpoint is verified as it is
    copied to ``copy_to/checkpoint-N/`` (which must not exist yet), each file read once,
    and the copy's path is returned: the Trainer then reads exactly the bytes that were
    checked, whatever happens to ``output_dir`` meanwhile.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := CHECKPOINT.fullmatch(p.name)) and p.is_dir() and not p.is_symlink()
    )
    for _, directory in reversed(found):
        if not manifest_path_for(directory).exists():
            continue
        if copy_to is None:
            verified_manifest(directory, trust)
            return str(directory)
        manifest = verified_signature(directory, trust)
        return str(verified_copy(manifest, Path(copy_to) / directory.name))
    return None
