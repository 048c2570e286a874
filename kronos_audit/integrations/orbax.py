"""kaudit beside Orbax: a post-finalization callback that signs each step directory an
async ``CheckpointManager`` commits, and a check of a step before it is restored.

::

    import orbax.checkpoint as ocp
    from kronos_audit.integrations.orbax import signing_callback, verified_step

    sign = signing_callback("jax-run", root)
    options = ocp.CheckpointManagerOptions(
        async_options=ocp.AsyncOptions(post_finalization_callback=sign)
    )
    manager = ocp.CheckpointManager(root, options=options)
    ...
    manager.wait_until_finished()
    sign()  # the last step, now committed
    manager.restore(step, args=...)  # after verified_step(root, step)

Orbax's tree is left as Orbax wrote it: each ``<root>/<step>/`` is signed from outside,
after Orbax has committed it (renamed its temporary directory into place), as one directory
step whose manifest sits beside it, ``<root>/<step>.kaudit.json``. Orbax calls the callback
with no arguments on its finalization thread, before it renames the step into place, so
the callback signs every committed step of ``root`` that is not signed yet, oldest first,
each chained to the one before, and is called once more at the end for the last step; an
error on Orbax's thread is Orbax's to re-raise at the next ``save`` or
``wait_until_finished``.

Orbax's rotation (``max_to_keep``) is signed pruning when the callback is given the same
``max_to_keep``: the run's steps that Orbax deleted, older than the newest ``max_to_keep``,
are listed in the retention record (``pruned``) of the next step the callback signs (the
final call signs the last step, after Orbax's last deletion); their manifests stay, and
verify as pruned.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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

MAX_STEP_DIGITS = 18


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """Orbax's committed step directories in ``root`` (named by the step's digits alone:
    a step still being written has a temporary name), by step."""
    if not root.is_dir():
        return []
    return sorted(
        (int(p.name), p)
        for p in root.iterdir()
        if p.name.isascii()
        and p.name.isdigit()
        and len(p.name) <= MAX_STEP_DIGITS
        and p.is_dir()
        and not p.is_symlink()
    )


class StepSigner:
    """Signs each committed, unsigned step directory of ``root`` as a step of run ``run``,
    oldest first, each chained to the one before: Orbax's ``post_finalization_callback``.

    Orbax calls it on its finalization thread *before* it renames the step it finalized
    into place, so each call signs the steps committed before that one: call it once more
    after ``manager.wait_until_finished()`` (or ``close()``) to sign the last one.
    ``max_to_keep``, Orbax's own, makes its deletions signed pruning (see the module)."""

    def __init__(
        self,
        run: str,
        root: Path,
        *,
        seeds: Sequence[int] = (),
        attributes: Mapping[str, Any] | None = None,
        key: str | None = None,
        max_to_keep: int | None = None,
    ) -> None:
        if not run:
            raise UsageError("the run id must not be empty")
        self.max_to_keep = max_to_keep
        self.run, self.root = run, root
        self.seeds, self.attributes, self.key = tuple(seeds), attributes, key
        self._lock = threading.Lock()  # Orbax's thread and the program's final call

    def __call__(self) -> None:
        with self._lock:
            for step, path in committed_steps(self.root):
                manifest = manifest_path_for(path)
                if manifest.exists():
                    continue
                rotated = rotated_out(
                    self.root, self.run, step, self.max_to_keep, lambda p: p.name.isdigit()
                )
                snapshot(
                    path,
                    run=self.run,
                    step=step,
                    seeds=self.seeds,
                    parent=previous_manifest(self.root, self.run, step, skip=manifest),
                    key=self.key,
                    attributes=self.attributes,
                    pruned=[r.entry for r in rotated],
                )
                for removed in rotated:
                    drop_tracking(removed)


def signing_callback(
    run: str,
    directory: str | Path,
    *,
    seeds: Sequence[int] = (),
    attributes: Mapping[str, Any] | None = None,
    key: str | None = None,
    max_to_keep: int | None = None,
) -> StepSigner:
    """A ``post_finalization_callback`` for Orbax's ``AsyncOptions`` that signs the
    manager's committed steps in ``directory`` (see :class:`StepSigner`; call it once more
    after ``wait_until_finished``). ``seeds``, ``attributes`` and ``key`` are those of
    :func:`kronos_audit.snapshot`; ``max_to_keep`` is the manager's own (its deletions are
    then signed pruning)."""
    return StepSigner(
        run, Path(directory), seeds=seeds, attributes=attributes, key=key, max_to_keep=max_to_keep
    )


def verified_step(
    directory: str | Path,
    step: int,
    *,
    trust: TrustOptions | None = None,
    copy_to: str | Path | None = None,
) -> Path:
    """``<directory>/<step>/`` once its manifest verified (a trusted signature, every file,
    the chain), to hand to ``manager.restore(step)``; TamperedData naming what changed
    otherwise, UsageError when it is not signed. With ``copy_to``, the step is verified as
    it is copied to ``copy_to/<step>/`` (which must not exist yet), each file read once,
    and the copy is returned: restore it with a manager over ``copy_to``, and Orbax reads
    exactly the bytes that were checked."""
    path = Path(directory) / str(step)
    if copy_to is None:
        verified_manifest(path, trust)
        return path
    return verified_copy(verified_signature(path, trust), Path(copy_to) / str(step))
