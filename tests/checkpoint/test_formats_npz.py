""".npy and .npz files (kronos_audit.checkpoint.formats.npz): numpy's own files digested
as HDF5 would digest the same arrays, never unpickled, zip bombs refused."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from kronos_audit.checkpoint.formats import Format, tensors_of_file
from kronos_audit.checkpoint.formats.npz import DECODE_RATIO, DECODE_SLACK
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.errors import CheckpointError
from tests.helpers import assert_bad_input, run_cli

U = np.arange(12, dtype=np.float32).reshape(3, 4)
N = np.array([3, 1, 2], dtype=np.int16)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_members_get_the_digests_of_the_arrays(tmp_path: Path, save: object) -> None:
    path = tmp_path / "s.npz"
    save(path, u=U, n=N)  # type: ignore[operator]
    assert tensors_of_file(path) == (Format.NPZ, (array_digest("/n", N), array_digest("/u", U)))


def test_npy_in_any_order_or_byte_order_has_the_canonical_digest(tmp_path: Path) -> None:
    for name, arr in (("c", U), ("f", np.asfortranarray(U)), ("b", U.astype(">f4"))):
        np.save(tmp_path / f"{name}.npy", arr)
        fmt, digests = tensors_of_file(tmp_path / f"{name}.npy")
        assert fmt is Format.NPY
        assert digests is not None
        assert digests[0].sha256 == array_digest("/u", U).sha256


def test_an_object_array_is_refused_never_unpickled(tmp_path: Path) -> None:
    np.savez(tmp_path / "o.npz", u=U, o=np.array([{"x": 1}, None], dtype=object))
    with pytest.raises(CheckpointError, match="Python objects"):
        tensors_of_file(tmp_path / "o.npz")
    np.save(tmp_path / "o.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    assert_bad_input(
        run_cli("diff", str(tmp_path / "o.npy"), str(tmp_path / "o.npy")), "Python objects"
    )


def test_a_zip_bomb_is_refused_before_it_is_decompressed(tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, z=np.zeros(1024))
    data = bytearray(path.read_bytes())
    # The central directory declares 4 GiB for a member of a few hundred bytes.
    cd = data.index(b"PK\x01\x02")
    data[cd + 24 : cd + 28] = (0xFFFFFFF0).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert DECODE_RATIO * len(data) + DECODE_SLACK < 0xFFFFFFF0
    with pytest.raises(CheckpointError, match="zip bomb"):
        tensors_of_file(path)


def test_a_member_that_is_not_an_array_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    np.savez(path, u=U)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("notes.txt", "hello")
    with pytest.raises(CheckpointError, match=r"not an \.npy array"):
        tensors_of_file(path)


def test_diff_of_npz_files_exits_0_within_tolerance_and_1_beyond(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", u=U, n=N)
    np.savez_compressed(tmp_path / "b.npz", u=U * np.float32(1 + 1e-7), n=N)
    np.savez(tmp_path / "c.npz", u=U + 1, n=N)
    a, b, c = (str(tmp_path / f"{x}.npz") for x in "abc")
    assert run_cli("diff", a, b, "--rtol", "1e-6").exit_code == 0
    differ = run_cli("diff", a, c, "--rtol", "1e-6")
    assert differ.exit_code == 1
    assert "/u" in differ.stdout
