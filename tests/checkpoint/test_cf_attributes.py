"""NetCDF/CF attributes (kronos_audit.checkpoint.formats.cf): the attributes that change
what a reader computes are hashed with their variable, so verify names a variable whose
scale_factor changed, and diff compares packed variables as xarray reads them."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from kronos_audit.checkpoint.formats import tensors_of_file
from kronos_audit.checkpoint.formats.cf import unpack
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.verification.batch import verify
from tests.helpers import run_cli

PACKED = np.array([1, 2, -999, 4], dtype=np.int16)


def _netcdf(path: Path, scale: float = 0.5) -> Path:
    with h5py.File(path, "w") as f:
        t = f.create_dataset("t", data=PACKED)
        t.attrs["scale_factor"] = np.float32(scale)
        t.attrs["add_offset"] = np.float32(270.0)
        t.attrs["_FillValue"] = np.int16(-999)
        t.attrs["units"] = "K"
        f["x"] = np.arange(4.0)
    return path


def test_unpacking_is_xarrays() -> None:
    values = unpack(PACKED, {"scale_factor": 0.5, "add_offset": 270.0, "_FillValue": -999})
    np.testing.assert_array_equal(values, [270.5, 271.0, np.nan, 272.0])


def test_the_cf_attributes_are_hashed_with_their_variable(tmp_path: Path) -> None:
    _, digests = tensors_of_file(_netcdf(tmp_path / "a.nc"))
    by_path = {d.path: d for d in digests or ()}
    assert [a.path for a in by_path["/t"].attributes or ()] == sorted(
        ["scale_factor", "add_offset", "_FillValue", "units"]
    )
    assert by_path["/x"].attributes == ()


def test_verify_names_the_variable_whose_scale_factor_changed(
    project: Project, key: SigningKey
) -> None:
    path = _netcdf(project.root / "ocean.nc")
    (m,) = snapshot(path, run="r", step=0)
    assert m.record.format == "hdf5"
    (result,) = verify(m.path)
    assert result.ok
    path.unlink()
    _netcdf(path, scale=1.0)
    (result,) = verify(m.path)
    named = [(c.dataset, c.detail) for c in result.checks if not c.ok and c.dataset]
    assert [n for n, _ in named] == ["/t"]
    assert "scale_factor" in named[0][1]


def test_diff_compares_the_unpacked_values_and_says_so(tmp_path: Path) -> None:
    a, b = _netcdf(tmp_path / "a.nc"), _netcdf(tmp_path / "b.nc", scale=1.0)
    same = run_cli("diff", str(a), str(a), "--rtol", "1e-6")
    assert same.exit_code == 0, same.output
    assert "compared unpacked" in same.stdout
    differ = run_cli("diff", str(a), str(b), "--rtol", "1e-6", "--json")
    assert differ.exit_code == 1
    assert '"/t"' in differ.stdout
    assert "compared unpacked" in differ.stdout
