"""kaudit inside Lightning: a ``CheckpointIO`` plugin that signs each checkpoint Lightning
saves as a step of a run, and verifies a checkpoint before Lightning loads it.

::

    import lightning as L
    from kronos_audit.integrations.lightning import SignedCheckpointIO

    trainer = L.Trainer(plugins=[SignedCheckpointIO(run="mnist")], ...)
    trainer.fit(model, ckpt_path="checkpoints/epoch=0-step=100.ckpt")  # verified first

Lightning's ``.ckpt`` is a ``torch.save`` pickle and is written as Lightning writes it; its
manifest sits beside it (``epoch=0-step=100.ckpt.kaudit.json``), signed with the run, the
checkpoint's ``global_step`` as the step, the run's previous step beside it as the parent,
and kaudit's environment lock and git state. A pickle has no per-tensor digests: verify
names the file, and says that a verified pickle is not a safe one. Loading verifies the
manifest (signature by a trusted key, data, chain), then reads the file once and gives
Lightning those very bytes.

Lightning's rotation (``save_top_k``) is signed pruning: when Lightning removes a checkpoint
of the run, the newest step beside it (the one just saved) is signed again with the removed
step in its retention record (``pruned``) before the file goes; its manifest stays, and
verifies as pruned. A removal with no later step to record it (one step saved under two
names) is recorded by the next save.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _load as lightning_load

from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import UsageError
from kronos_audit.integrations._common import previous_manifest, read_verified, verified_manifest
from kronos_audit.integrations._rotation import (
    Removed,
    drop_tracking,
    run_manifests,
    signed_of,
    with_digest,
)
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.storage.tracking import dvc_file_for


class SignedCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` that signs every save and verifies every load.

    ``run`` names the run; ``seeds``, ``attributes`` and ``key`` are those of
    :func:`kronos_audit.snapshot`; ``trust`` the anchors a load verifies with (default: the
    user's trust store). A checkpoint Lightning saves again under the same name (``last.ckpt``)
    gets a new manifest in place of the old one.
    """

    def __init__(
        self,
        run: str,
        *,
        seeds: Sequence[int] = (),
        attributes: Mapping[str, Any] | None = None,
        key: str | None = None,
        trust: TrustOptions | None = None,
    ) -> None:
        super().__init__()
        if not run:
            raise UsageError("the run id must not be empty")
        self.run = run
        self.seeds = tuple(seeds)
        self.attributes = dict(attributes or {})
        self.key = key
        self.trust = trust
        self._pending: list[Removed] = []

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | Path,
        storage_options: Any | None = None,
    ) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        step = checkpoint.get("global_step")
        if type(step) is not int or step < 0:
            raise UsageError("the checkpoint holds no global_step to sign it as", path=target)
        manifest = manifest_path_for(target)
        again = manifest.exists()
        parent = previous_manifest(target.parent, self.run, step, skip=manifest)
        pending = [r for r in self._pending if r.manifest.step < step]
        snapshot(
            target,
            run=self.run,
            step=step,
            seeds=self.seeds,
            parent=parent,
            key=self.key,
            attributes=self.attributes or None,
            force=again,
            pruned=[r.entry for r in pending],
        )
        for removed in pending:
            self._pending.remove(removed)
            drop_tracking(removed, self.trust)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete a checkpoint Lightning rotates out, its removal signed first: the run's
        newest step beside it is signed again with this one in its ``pruned`` record (or,
        with none later, the next save records it); then the file, its ``.dvc`` file, its
        git-ignore entry and the cache objects its verified manifest signs go. A file that
        is not one of the run's signed steps is deleted as Lightning deletes it."""
        target = Path(path)
        removed = signed_of(target, self.run)
        if removed is None or not target.exists():
            super().remove_checkpoint(path)
            return
        newest = max(
            (
                m
                for m in run_manifests(target.parent, self.run)
                if m.step > removed.manifest.step
                and m.checkpoint_path.is_file()
                and not m.checkpoint_path.is_symlink()
            ),
            key=lambda m: (m.step, m.path.stat().st_mtime_ns),
            default=None,
        )
        if newest is None:
            self._pending.append(removed)  # its tracking stays until a save signs it
            super().remove_checkpoint(path)
            return
        parent = None if newest.parent is None else with_digest(target.parent, newest.parent)
        if newest.parent is not None and parent is None:
            self._pending.append(removed)  # its parent is not beside it to sign it again
            super().remove_checkpoint(path)
            return
        snapshot(
            newest.checkpoint_path,
            run=self.run,
            step=newest.step,
            seeds=self.seeds,
            parent=parent,
            key=self.key,
            attributes=self.attributes or None,
            force=True,
            pruned=[*newest.record.pruned, removed.entry],
        )
        dvc_file_for(target).unlink(missing_ok=True)  # before its data: see retention
        super().remove_checkpoint(path)
        drop_tracking(removed, self.trust)

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Callable[..., Any] | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        target = Path(path)
        data = read_verified(target, verified_manifest(target, self.trust))
        loaded: dict[str, Any] = lightning_load(
            io.BytesIO(data), map_location=map_location, weights_only=weights_only
        )
        return loaded
