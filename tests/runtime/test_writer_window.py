"""The writer lays a checkpoint out, hashes it and writes its arrays through the one
descriptor that created its temporary file: another writer of the run directory who
renames a file of their own over the temporary name in the meantime gets nothing of it
signed. The rename is made at the moment the window opens (once HDF5 has laid the file
out), with a real file, by a real rename. HDF5 reaches the file through
``/proc/self/fd/N`` where Linux has it, through the descriptor itself (h5py's file-object
driver) where not: both are tried."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint import hdf5, writer
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli

RUN = "heat"


@pytest.mark.parametrize("through", ["/proc/self/fd", "file object"])
def test_a_file_renamed_over_the_temporary_one_is_never_signed(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    if through == "file object":  # as where /proc is not mounted: h5py's file-object driver
        monkeypatch.setattr(hdf5, "_proc_fd", lambda fd: None)
    laid_out = hdf5.lay_out_named
    swapped: list[Path] = []
    before: dict[Path, bytes] = {}

    def then_theirs(*args: Any) -> Any:
        """HDF5 has laid the file out; now the other writer acts: a copy of it, with an
        attribute of their own, renamed over the temporary name."""
        raw = laid_out(*args)
        (path,) = [a for a in args if isinstance(a, Path)]
        theirs = path.with_name("theirs.h5")
        shutil.copyfile(path, theirs)
        with h5py.File(theirs, "r+") as f:
            f.attrs["approved_by"] = "mallory"
        kept = path.with_name("kept.h5")  # their own link to it, to see what it holds after
        os.link(theirs, kept)
        before[kept] = kept.read_bytes()
        os.replace(theirs, path)
        swapped.append(path)
        return raw

    monkeypatch.setattr(writer, "lay_out_named", then_theirs)
    root = project.root / "checkpoints"
    state = {"u": np.arange(64 * 1024, dtype=np.float64), "n": np.int64(7)}
    refused = pytest.raises(ka.CheckpointError, match="renamed over it while it was written")
    with refused, ka.Run(RUN, root=root, seed=3, every=ka.EverySteps(1)) as run:
        for step in run.steps(1):
            run.checkpoint(step, state)
    assert swapped
    # Their file was neither read into a digest nor written: the arrays went to the file
    # the writer created, through its descriptor.
    ((kept, theirs),) = before.items()
    assert kept.read_bytes() == theirs

    # Nothing signs their file: no manifest, or none that verifies over it.
    run_dir = root / RUN
    for manifest in run_dir.glob("*.kaudit.json"):
        result = run_cli("verify", str(manifest), cwd=project.root)
        assert result.exit_code == 0, result.output
        with h5py.File(ka.read_manifest(manifest).checkpoint_path) as f:
            assert "approved_by" not in f.attrs
    assert not list(run_dir.glob("*.kaudit.json"))
