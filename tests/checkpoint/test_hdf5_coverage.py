"""What is hashed is what a reader reads, by every name a reader can use.

Each test builds a real HDF5 file with h5py (links, aliases, external storage, virtual
datasets, hand-made HDF5 types through the low-level API) and checks that the per-dataset
digests either cover what h5py reads by each name, or that the file is refused with one
line naming the HDF5 path.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint import hashing, links
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, array_digest, digest_file
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import dvc_file_for
from tests.helpers import KAUDIT, assert_bad_input, run_cli, write_checkpoint


def by_path(digests: FileDigests) -> dict[str, DatasetDigest]:
    assert digests.datasets is not None
    return {d.path: d for d in digests.datasets}


def refused(path: Path, *mentions: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        digest_file(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    for m in mentions:
        assert m in message, message
    assert info.value.exit_code == 2
    return info.value


def write_raw(f: h5py.File, name: str, file_type: Any, raw: np.ndarray[Any, Any]) -> None:
    """A contiguous dataset of HDF5 type ``file_type`` whose stored bytes are ``raw``'s bytes,
    written without any conversion (the memory type is the file type)."""
    space = h5py.h5s.create_simple(raw.shape)
    dset = h5py.h5d.create(f.id, name.encode(), file_type, space)
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(raw), mtype=file_type)


def stored_bytes(path: Path, name: str) -> bytes:
    with h5py.File(path, "r") as f:
        dset = f[name]
        offset, size = dset.id.get_offset(), dset.id.get_storage_size()
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)


# -- names: aliases and soft links -----------------------------------------------------------


def test_every_hard_link_alias_gets_its_own_entry(tmp_path: Path) -> None:
    path = tmp_path / "alias.h5"
    data = np.arange(12.0).reshape(3, 4)
    with h5py.File(path, "w") as f:
        f["fields/u"] = data
        f["restart/u"] = f["fields/u"]  # the same object under a second name
    got = by_path(digest_file(path))
    assert sorted(got) == ["/fields/u", "/restart/u"]
    assert got["/restart/u"].sha256 == got["/fields/u"].sha256 == array_digest("/", data).sha256
    assert got["/restart/u"].dtype == "<f8"
    assert got["/restart/u"].shape == (3, 4)


def test_re_pointing_an_alias_changes_the_recorded_set(tmp_path: Path) -> None:
    u, v = np.arange(12.0), np.arange(12.0) * -1
    same, moved = tmp_path / "same.h5", tmp_path / "moved.h5"
    for path, target in ((same, "u"), (moved, "v")):
        with h5py.File(path, "w") as f:
            f["u"], f["v"] = u, v
            f["latest"] = f[target]  # a hard link: same dtype and shape either way
    a, b = digest_file(same), digest_file(moved)
    assert a.datasets != b.datasets
    assert by_path(a)["/latest"].sha256 == by_path(a)["/u"].sha256
    assert by_path(b)["/latest"].sha256 == by_path(b)["/v"].sha256


def test_an_alias_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "alias.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.arange(10)
        for name in ("b", "c", "g/d"):
            f[name] = f["a"]
    hashed: list[str] = []
    dataset_digest = hashing._dataset_digest

    def spy(dset: h5py.Dataset, view: memoryview | None, known: Any = None) -> DatasetDigest:
        hashed.append(dset.name)
        return dataset_digest(dset, view, known)

    monkeypatch.setattr(hashing, "_dataset_digest", spy)
    assert sorted(by_path(digest_file(path))) == ["/a", "/b", "/c", "/g/d"]
    assert len(hashed) == 1


def test_a_soft_link_to_a_dataset_is_covered_under_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "soft.h5"
    data = np.arange(5, dtype=np.int32)
    with h5py.File(path, "w") as f:
        f["fields/u"] = data
        f["latest"] = h5py.SoftLink("/fields/u")
        f["fields/same"] = h5py.SoftLink("u")  # relative: resolved in its own group
        f["fields/chain"] = h5py.SoftLink("/latest")  # a soft link to a soft link
    got = by_path(digest_file(path))
    assert sorted(got) == ["/fields/chain", "/fields/same", "/fields/u", "/latest"]
    want = array_digest("/", data)
    for name, d in got.items():
        assert (d.dtype, d.shape, d.sha256) == (want.dtype, want.shape, want.sha256), name


def test_re_pointing_a_soft_link_changes_the_recorded_set(tmp_path: Path) -> None:
    digests = []
    for target in ("/u", "/v"):
        path = tmp_path / f"{target[1:]}.h5"
        with h5py.File(path, "w") as f:
            f["u"], f["v"] = np.zeros(4), np.ones(4)
            f["latest"] = h5py.SoftLink(target)
        digests.append(by_path(digest_file(path)))
    assert digests[0]["/latest"] != digests[1]["/latest"]
    assert digests[0]["/u"] == digests[1]["/u"]


def test_a_soft_link_to_a_group_covers_everything_below_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "group.h5"
    with h5py.File(path, "w") as f:
        f["step100/fields/u"] = np.arange(3.0)
        f["step100/weights"] = np.arange(4)
        f["step100/fields/alias"] = h5py.SoftLink("u")
        f["latest"] = h5py.SoftLink("/step100")
        f["also"] = f["step100"]  # the group under a second hard link
    got = by_path(digest_file(path))
    below = ["/fields/alias", "/fields/u", "/weights"]
    assert sorted(got) == sorted(p + b for p in ("/step100", "/latest", "/also") for b in below)
    for prefix in ("/latest", "/also"):
        for b in below:
            assert got[prefix + b].sha256 == got["/step100" + b].sha256


def test_a_committed_datatype_is_not_data(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f["mytype"] = np.dtype("<f4")
        f["x"] = np.arange(3.0)
    assert sorted(by_path(digest_file(path))) == ["/x"]


# -- names that cannot be covered --------------------------------------------------------------


@pytest.mark.parametrize("target", ["/nothing", "missing", "/x/below"])
def test_a_dangling_soft_link_is_refused(tmp_path: Path, target: str) -> None:
    path = tmp_path / "dangling.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
        f["g/link"] = h5py.SoftLink(target)
    e = refused(path, "/g/link", "dangling soft link", target)
    assert e.dataset == "/g/link"


def test_soft_links_in_a_loop_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.h5"
    with h5py.File(path, "w") as f:
        f["a"] = h5py.SoftLink("/b")
        f["b"] = h5py.SoftLink("/a")
    refused(path, "/a", "more than 16 soft links to follow")


def test_soft_links_that_multiply_the_work_are_bounded(tmp_path: Path) -> None:
    # s01 -> s02/s02/s02, s02 -> s03/s03/s03, ... (never more than 15 deep): resolving s01
    # would take 3**14 steps. HDF5 counts every soft link followed for one name, and so
    # does the walk, which gives up at once.
    path = tmp_path / "fan.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("g")
        g["x"] = np.arange(3)
        for i in range(1, 16):
            g[f"s{i:02d}"] = h5py.SoftLink("/".join([f"s{i + 1:02d}"] * 3) if i < 15 else ".")
    refused(path, "/g/s01", "more than 16 soft links to follow")
    with h5py.File(path, "r") as f, pytest.raises(RuntimeError, match="too many links"):
        f["g/s01"]  # a reader cannot read it either


def test_groups_nested_too_deep_are_refused_not_recursed_into(tmp_path: Path) -> None:
    path = tmp_path / "deep.h5"
    with h5py.File(path, "w") as f:
        f["/".join(["g"] * (links.MAX_DEPTH + 5)) + "/x"] = np.arange(2)
        f["shallow"] = np.arange(2)
    refused(path, f"groups nested more than {links.MAX_DEPTH} deep")
    with h5py.File(path, "w") as f:
        f["/".join(["g"] * (links.MAX_DEPTH - 1)) + "/x"] = np.arange(2)
    assert len(by_path(digest_file(path))) == 1


@pytest.mark.parametrize("kind", ["hard", "soft", "root"])
def test_a_group_that_contains_itself_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "cycle.h5"
    with h5py.File(path, "w") as f:
        f["g/x"] = np.arange(3)
        if kind == "hard":
            f["g/sub/up"] = f["g"]
        elif kind == "soft":
            f["g/sub/up"] = h5py.SoftLink("/g")
        else:
            f["g/sub/up"] = h5py.SoftLink("/")
    refused(path, "/g/sub/up", "endless names")


def test_names_that_multiply_without_end_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each level links the next group twice: 2**30 names from 60 links, no loop.
    path = tmp_path / "fan.h5"
    with h5py.File(path, "w") as f:
        below = f.create_group("level30")
        below["x"] = np.arange(2)
        for level in range(29, -1, -1):
            g = f.create_group(f"level{level}")
            g["a"], g["b"] = below, below
            below = g
    monkeypatch.setattr(links, "MAX_NAMES", 10_000)
    refused(path, "more than 10,000 names")


def test_an_external_link_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    path = tmp_path / "ext.h5"
    with h5py.File(path, "w") as f:
        f["own"] = np.arange(3)
        f["fields/u"] = h5py.ExternalLink("other.h5", "/x")
    e = refused(
        path,
        "/fields/u",
        "external link to other.h5:/x",
        "a reader would read another file, which the manifest cannot cover",
    )
    assert e.dataset == "/fields/u"


def test_a_soft_link_through_an_external_link_is_refused(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.arange(3)
    path = tmp_path / "via.h5"
    with h5py.File(path, "w") as f:
        f["ext"] = h5py.ExternalLink("other.h5", "/")
        f["a"] = h5py.SoftLink("/ext/x")
    # Links are walked in name order: /a is met first, and refused by what it passes through.
    refused(path, "/a", "external link to other.h5:/")


def test_an_external_link_to_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "trap.h5"
    os.mkfifo(fifo)  # opening it for reading would block for ever
    path = tmp_path / "ext.h5"
    with h5py.File(path, "w") as f:
        f["x"] = h5py.ExternalLink(str(fifo), "/x")
    refused(path, "/x", "external link")


def test_external_raw_storage_is_refused(tmp_path: Path) -> None:
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.arange(10, dtype="<f8").tobytes())
    path = tmp_path / "external.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("fields/u", (10,), "<f8", external=[(str(raw), 0, 80)])
        assert f["fields/u"][3] == 3.0  # a reader really reads raw.bin
    refused(path, "/fields/u", "raw data stored outside the file", "raw.bin")


def test_a_virtual_dataset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "virtual.h5"
    with h5py.File(path, "w") as f:
        f["src"] = np.arange(4.0)
        layout = h5py.VirtualLayout(shape=(4,), dtype="<f8")
        layout[:] = h5py.VirtualSource(".", "src", shape=(4,))
        f.create_virtual_dataset("view", layout)
    refused(path, "/view", "a virtual dataset")


@pytest.mark.parametrize("kind", ["object", "region", "in-compound"])
def test_references_are_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "refs.h5"
    with h5py.File(path, "w") as f:
        target = f.create_dataset("data", data=np.arange(10))
        if kind == "object":
            f["refs"] = np.array([target.ref], dtype=h5py.ref_dtype)
        elif kind == "region":
            f["refs"] = np.array([target.regionref[2:5]], dtype=h5py.regionref_dtype)
        else:
            rec = np.dtype([("n", "<i4"), ("r", h5py.ref_dtype)])
            f["refs"] = np.array([(1, target.ref)], dtype=rec)
    refused(path, "/refs", "references")


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "ckpt.h5"
    os.mkfifo(fifo)
    refused(fifo, "not a regular file")


# -- types: same stored bytes, other values ----------------------------------------------------


def test_same_bytes_read_as_other_integers_never_share_a_hash(tmp_path: Path) -> None:
    raw = np.array([0x01020304, 0x7FFFFF00, -1, 256, 12345678], dtype="<i4")
    path = tmp_path / "ints.h5"
    odd = h5py.h5t.STD_I32LE.copy()
    odd.set_precision(16)
    odd.set_offset(8)
    with h5py.File(path, "w") as f:
        write_raw(f, "standard", h5py.h5t.STD_I32LE.copy(), raw)
        write_raw(f, "narrow", odd, raw)
    assert stored_bytes(path, "/standard") == stored_bytes(path, "/narrow") == raw.tobytes()
    with h5py.File(path, "r") as f:
        standard, narrow = f["standard"][()], f["narrow"][()]
    assert standard.dtype == narrow.dtype
    assert not np.array_equal(standard, narrow)
    got = by_path(digest_file(path))
    assert got["/standard"].sha256 != got["/narrow"].sha256
    assert got["/standard"] == array_digest("/standard", standard)
    assert got["/narrow"] == array_digest("/narrow", narrow)


def make_odd_types(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """Datasets whose HDF5 types differ from h5py's standard ones; returns the raw data."""
    as_u4 = np.array([0x3FC00000, 0x40490FDB, 0xFFFFFFFF, 0x00000001], dtype="<u4")
    types: dict[str, tuple[Any, np.ndarray[Any, Any]]] = {}
    t = h5py.h5t.STD_U32LE.copy()
    t.set_precision(24)
    t.set_pad(h5py.h5t.PAD_ONE, h5py.h5t.PAD_ONE)
    types["padded"] = (t, as_u4)
    t = h5py.h5t.STD_I32LE.copy()
    t.set_precision(12)
    t.set_offset(4)
    types["offset"] = (t, as_u4.view("<i4"))
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_ebias(120)
    types["ebias"] = (t, as_u4.view("<f4"))
    t = h5py.h5t.IEEE_F64LE.copy()
    t.set_ebias(1020)
    types["ebias64"] = (t, np.array([1.5, -2.25, 1e300, 0.0]))
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(31, 24, 7, 0, 24)  # sign, exponent at 24 (7 bits), mantissa in 0..23
    types["fields"] = (t, as_u4.view("<f4"))
    with h5py.File(path, "w") as f:
        for name, (file_type, raw) in types.items():
            write_raw(f, name, file_type, raw)
    return {name: raw for name, (_, raw) in types.items()}


def test_a_non_standard_type_hashes_as_the_values_h5py_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "odd.h5"
    raws = make_odd_types(path)
    read_through_h5py: set[str] = set()
    blocks = hashing._blocks

    def spy(dset: h5py.Dataset) -> Any:
        read_through_h5py.add(dset.name)
        return blocks(dset)

    monkeypatch.setattr(hashing, "_blocks", spy)
    got = by_path(digest_file(path))
    assert read_through_h5py == {f"/{n}" for n in raws}
    with h5py.File(path, "r") as f:
        for name, raw in raws.items():
            values = f[name][()]
            assert got[f"/{name}"] == array_digest(f"/{name}", values), name
            # Had the stored bytes been hashed, the digest would be raw's.
            assert got[f"/{name}"].sha256 != hashlib.sha256(raw.tobytes()).hexdigest(), name


def test_standard_types_still_hash_the_mapped_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "std.h5"
    arrays = {
        dt: np.arange(24).astype(dt)
        for dt in ("<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "|i1", "<u8", "|u1", "|b1", "<c16")
    }
    with h5py.File(path, "w") as f:
        for dt, a in arrays.items():
            f[dt.replace("|", "")] = a
    monkeypatch.setattr(hashing, "_blocks", lambda dset: pytest.fail(f"{dset.name} read"))
    got = digest_file(path).datasets
    assert got is not None
    assert len(got) == len(arrays)


def test_enum_names_are_part_of_the_dtype(tmp_path: Path) -> None:
    path = tmp_path / "enum.h5"
    codes = np.array([0, 1, 1, 0], dtype="i1")
    with h5py.File(path, "w") as f:
        f["ok"] = codes.astype(h5py.enum_dtype({"OK": 0, "FAIL": 1}, basetype="i1"))
        f["swapped"] = codes.astype(h5py.enum_dtype({"OK": 1, "FAIL": 0}, basetype="i1"))
        rec = np.dtype([("state", h5py.enum_dtype({"ON": 1, "OFF": 0}, basetype="i1"))])
        f["record"] = np.zeros(2, dtype=rec)
        f["flags"] = codes.astype(bool)  # h5py's own bool enum stays a plain bool
    got = by_path(digest_file(path))
    assert got["/ok"].sha256 == got["/swapped"].sha256  # the same codes...
    assert got["/ok"].dtype == "|i1 enum {'OK': 0, 'FAIL': 1}"  # ...named otherwise
    assert got["/swapped"].dtype == "|i1 enum {'FAIL': 0, 'OK': 1}"
    assert "enum {'OFF': 0, 'ON': 1}" in got["/record"].dtype
    assert got["/flags"].dtype == "|b1"
    with h5py.File(path, "r") as f:
        for name in ("/ok", "/swapped", "/record"):
            assert got[name] == array_digest(name, f[name][()])


# -- through the CLI: snapshot refuses, verify fails, show lists every name -------------------


def snapshot_args(ckpt: Path) -> list[str]:
    return ["snapshot", str(ckpt), "--run", "r", "--step", "1"]


def nothing_written(ckpt: Path) -> None:
    assert not manifest_path_for(ckpt).exists()
    assert not dvc_file_for(ckpt).exists()
    assert not (ckpt.parent / ".gitignore").exists()


def write_uncoverable(ckpt: Path, kind: str) -> str:
    """A checkpoint holding one thing the digests cannot cover; returns its HDF5 path."""
    write_checkpoint(ckpt, seed=1)
    raw = ckpt.parent / "raw.bin"
    raw.write_bytes(np.arange(4, dtype="<f8").tobytes())
    with h5py.File(ckpt, "a") as f:
        if kind == "external link":
            f["fields/w"] = h5py.ExternalLink("other.h5", "/w")
        elif kind == "external storage":
            f.create_dataset("fields/w", (4,), "<f8", external=[(str(raw), 0, 32)])
        elif kind == "virtual":
            layout = h5py.VirtualLayout(shape=(4,), dtype="<f8")
            layout[:] = h5py.VirtualSource(".", "fields/u", shape=(64, 64))[0, :4]
            f.create_virtual_dataset("fields/w", layout)
        else:
            f["fields/w"] = h5py.SoftLink("/fields/gone")
    return "/fields/w"


KINDS = {
    "external link": "external link to other.h5:/w",
    "external storage": "raw data stored outside the file",
    "virtual": "a virtual dataset",
    "dangling soft link": "dangling soft link to /fields/gone",
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_snapshot_refuses_what_it_cannot_cover(
    project: Project, key: SigningKey, kind: str
) -> None:
    ckpt = project.root / "ck" / "s.h5"
    where = write_uncoverable(ckpt, kind)
    line = assert_bad_input(run_cli(*snapshot_args(ckpt)), str(ckpt), where, KINDS[kind])
    assert "Traceback" not in line
    nothing_written(ckpt)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_verify_fails_a_checkpoint_that_became_uncoverable(
    project: Project, key: SigningKey, kind: str
) -> None:
    ckpt = project.root / "ck" / "s.h5"
    write_checkpoint(ckpt, seed=1)
    assert run_cli(*snapshot_args(ckpt)).exit_code == 0
    assert run_cli("verify", str(manifest_path_for(ckpt))).exit_code == 0
    where = write_uncoverable(ckpt, kind)
    result = run_cli("verify", str(manifest_path_for(ckpt)))
    assert result.exit_code == 1, result.output
    # The file digest fails first (the bytes changed); when verify goes on to the datasets,
    # the refusal is its reason, never a traceback or exit 2.
    assert "file digest" in result.output or (
        where in result.output and KINDS[kind] in result.output
    )
    assert "Traceback" not in result.output


def test_show_lists_a_soft_link_and_a_hard_alias(project: Project, key: SigningKey) -> None:
    ckpt = write_checkpoint(project.root / "ck" / "s.h5", seed=1)
    with h5py.File(ckpt, "a") as f:
        f["latest"] = h5py.SoftLink("/fields/u")
        f["restart/v"] = f["fields/v"]
    assert run_cli(*snapshot_args(ckpt)).exit_code == 0
    result = run_cli("show", "--json", str(manifest_path_for(ckpt)))
    assert result.exit_code == 0, result.output
    datasets = {d["path"]: d for d in json.loads(result.stdout)["predicate"]["datasets"]}
    assert datasets["/latest"]["sha256"] == datasets["/fields/u"]["sha256"]
    assert datasets["/restart/v"]["sha256"] == datasets["/fields/v"]["sha256"]
    assert run_cli("verify", str(manifest_path_for(ckpt))).exit_code == 0
    # Re-pointing the soft link at other data of the same dtype and shape is caught.
    with h5py.File(ckpt, "a") as f:
        f["other"] = f["fields/u"][()] + 1
        del f["latest"]
        f["latest"] = h5py.SoftLink("/other")
    assert run_cli("verify", str(manifest_path_for(ckpt))).exit_code == 1
    now = by_path(digest_file(ckpt))
    changed = {p for p, d in datasets.items() if now[p].sha256 != d["sha256"]}
    assert changed == {"/latest"}


def test_snapshot_of_an_external_link_to_a_fifo_never_hangs(
    project: Project, key: SigningKey
) -> None:
    ckpt = project.root / "ck" / "s.h5"
    write_checkpoint(ckpt, seed=1)
    os.mkfifo(ckpt.parent / "trap.h5")
    with h5py.File(ckpt, "a") as f:
        f["fields/w"] = h5py.ExternalLink("trap.h5", "/w")
    done = subprocess.run(
        [*KAUDIT, *snapshot_args(ckpt)],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "/fields/w" in done.stderr
    nothing_written(ckpt)
