"""open_verified / read_verified: a checkpoint opened once, refused by size before it is
read and by digest before it is parsed, and decoded only as the signed bytes, also when
the file itself is written into after it was hashed."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint import verified
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.hdf5 import read_flat
from kronos_audit.checkpoint.verified import Signed, open_verified, read_checkpoint, read_verified
from kronos_audit.errors import CheckpointError
from tests.helpers import write_checkpoint


def signed_of(path: Path) -> Signed:
    d = digest_file(path)
    return Signed(d.size, d.sha256, d.datasets)


def test_the_signed_bytes_read_as_read_flat_reads_them(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.h5", 3)
    got = read_checkpoint(path, signed_of(path))
    want = read_flat(path)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert type(got[name]) is type(value), name
        np.testing.assert_array_equal(got[name], value)


def test_another_size_is_refused_unread_and_another_digest_unparsed(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.h5", 3)
    signed = signed_of(path)
    with pytest.raises(CheckpointError, match=r"the manifest signs .*: not read"):
        open_verified(path, Signed(signed.size + 1, signed.sha256))
    with pytest.raises(CheckpointError, match="changed after it was verified"):
        open_verified(path, Signed(signed.size, "0" * 64))


def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.h5", 3)
    link = tmp_path / "link.h5"
    link.symlink_to(path)
    with pytest.raises(CheckpointError, match="symbolic link"):
        open_verified(link, signed_of(path))


def overwrite_in_place(path: Path) -> None:
    with h5py.File(path, "r+") as f:  # the same inode: not a rename
        f["fields/u"][0, 0] = 12345.0


def test_a_write_into_a_large_file_after_it_was_hashed_is_refused_when_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read through the hashed descriptor, as a checkpoint above the private-copy size is.
    monkeypatch.setattr(verified, "PRIVATE_COPY", 0)
    path = write_checkpoint(tmp_path / "c.h5", 3)
    signed = signed_of(path)
    with verified.verified(path, signed) as opened:
        overwrite_in_place(path)
        with pytest.raises(CheckpointError, match="/fields/u: what was read is not what"):
            read_verified(opened, signed)


def test_a_small_file_is_decoded_from_its_private_copy_whatever_is_written_later(
    tmp_path: Path,
) -> None:
    path = write_checkpoint(tmp_path / "c.h5", 3)
    signed = signed_of(path)
    genuine = read_flat(path)["/fields/u"]
    with verified.verified(path, signed) as opened:
        overwrite_in_place(path)
        got = read_verified(opened, signed)
    np.testing.assert_array_equal(got["/fields/u"], genuine)
