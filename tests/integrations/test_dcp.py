"""The DCP integration with the real torch.distributed.checkpoint, in this process (one
rank, no process group): what the writer hashes as DCP writes, and what the reader refuses
before DCP unpickles or loads it."""

from __future__ import annotations

import hashlib
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from kronos_audit.errors import CheckpointError, UsageError  # noqa: E402
from kronos_audit.integrations._dcp_digests import (  # noqa: E402
    SaveDigests,
    load_metadata,
    parse_save_digests,
)
from kronos_audit.integrations.dcp import SignedWriter, VerifiedReader  # noqa: E402


class KeptWriter(SignedWriter):
    """A SignedWriter whose coordinator keeps the digests it would sign."""

    kept: SaveDigests | None = None

    def publish(self, digests: SaveDigests) -> None:
        self.kept = digests


def single(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn`` (dcp.save or dcp.load) in this one process, without DCP's warning that it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        return fn(*args, no_dist=True, **kwargs)


def state() -> dict[str, Any]:
    return {
        "model": {
            "w": torch.arange(24, dtype=torch.float32).reshape(4, 6),
            "b": torch.full((3,), 0.5, dtype=torch.bfloat16),
        },
        "step": 7,
        "note": "hello",
    }


def blank() -> dict[str, Any]:
    return {
        "model": {"w": torch.zeros(4, 6), "b": torch.zeros(3, dtype=torch.bfloat16)},
        "step": 0,
        "note": "",
    }


def assert_restored(loaded: dict[str, Any]) -> None:
    want = state()
    assert torch.equal(loaded["model"]["w"], want["model"]["w"])
    assert torch.equal(loaded["model"]["b"], want["model"]["b"])
    assert (loaded["step"], loaded["note"]) == (7, "hello")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SaveDigests]:
    """A step saved through the signing writer (read-only: tests that change it copy it)."""
    directory = tmp_path_factory.mktemp("dcp") / "step-1"
    writer = KeptWriter(directory, run="r", step=1)
    single(dcp.save, state(), storage_writer=writer)
    assert writer.kept is not None
    return directory, writer.kept


@pytest.fixture
def copy(saved: tuple[Path, SaveDigests], tmp_path: Path) -> tuple[Path, SaveDigests]:
    directory, digests = saved
    target = tmp_path / directory.name
    target.mkdir()
    for f in directory.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    return target, digests


def test_the_writer_hashes_every_file_and_item_as_dcp_writes_them(
    saved: tuple[Path, SaveDigests],
) -> None:
    directory, digests = saved
    assert sorted(p.name for p in directory.iterdir()) == [f.name for f in digests.files]
    for f in digests.files:
        data = (directory / f.name).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert f.md5 == hashlib.md5(data).hexdigest()
    by_name = {i.fqn: i for i in digests.items}
    assert set(by_name) == {"model.w", "model.b", "step", "note"}
    for item in digests.items:
        data = (directory / item.file).read_bytes()[item.offset : item.offset + item.length]
        assert hashlib.sha256(data).hexdigest() == item.sha256, item
    assert by_name["model.w"].label == "tensor model.w"
    assert by_name["step"].label == "object step"


def test_plain_dcp_loads_what_the_signing_writer_wrote(saved: tuple[Path, SaveDigests]) -> None:
    loaded = blank()
    single(dcp.load, loaded, storage_reader=dcp.FileSystemReader(saved[0]))
    assert_restored(loaded)


def test_the_verified_reader_loads_an_untouched_step(saved: tuple[Path, SaveDigests]) -> None:
    loaded = blank()
    single(dcp.load, loaded, storage_reader=VerifiedReader(saved[0], digests=saved[1]))
    assert_restored(loaded)


def test_a_changed_tensor_byte_fails_the_load_naming_the_tensor(
    copy: tuple[Path, SaveDigests],
) -> None:
    directory, digests = copy
    (item,) = [i for i in digests.items if i.fqn == "model.w"]
    path = directory / item.file
    data = bytearray(path.read_bytes())
    data[item.offset + item.length - 40] ^= 0x01  # inside the tensor's bytes
    path.write_bytes(bytes(data))
    loaded = blank()
    with pytest.raises(dcp.api.CheckpointException) as failed:
        single(dcp.load, loaded, storage_reader=VerifiedReader(directory, digests=digests))
    assert "tensor model.w in __0_0.distcp differs from its signed digest" in str(failed.value)
    assert torch.equal(loaded["model"]["w"], torch.zeros(4, 6))  # nothing of it was loaded


class Planted:
    """Unpickling this creates the file it names: proof that bytes were unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_swapped_metadata_is_refused_before_it_is_unpickled(
    copy: tuple[Path, SaveDigests], tmp_path: Path
) -> None:
    directory, digests = copy
    marker = tmp_path / "unpickled"
    (directory / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(dcp.api.CheckpointException) as failed:
        single(dcp.load, blank(), storage_reader=VerifiedReader(directory, digests=digests))
    assert ".metadata: differs from its signed digest: not unpickled" in str(failed.value)
    assert not marker.exists()


def test_metadata_that_names_anything_but_dcp_classes_is_never_called(tmp_path: Path) -> None:
    # even bytes whose digest held (a signer's own mistake) unpickle DCP's classes alone
    marker = tmp_path / "unpickled"
    with pytest.raises(CheckpointError, match=r"names pathlib\.Path\.touch|names pathlib"):
        load_metadata(pickle.dumps(Planted(marker)), tmp_path / ".metadata")
    assert not marker.exists()


def test_the_digest_table_reads_back_and_refuses_names_out_of_the_directory(
    saved: tuple[Path, SaveDigests],
) -> None:
    digests = saved[1]
    assert parse_save_digests(json.loads(json.dumps(digests.to_json()))) == digests
    table = digests.to_json()
    table["files"][1]["name"] = "../../etc/passwd"
    with pytest.raises(CheckpointError, match="no name DCP writes"):
        parse_save_digests(table)
    table = digests.to_json()
    table["items"][0]["length"] = 10**9
    with pytest.raises(CheckpointError, match=r"ends past the end of __0_0\.distcp"):
        parse_save_digests(table)


def test_a_save_into_a_signed_step_or_a_foreign_directory_is_refused(tmp_path: Path) -> None:
    signed = tmp_path / "step-2"
    signed.mkdir()
    (tmp_path / "step-2.kaudit.json").write_text("{}")
    with pytest.raises(dcp.api.CheckpointException, match="already signed"):
        single(dcp.save, state(), storage_writer=KeptWriter(signed, run="r", step=2))
    foreign = tmp_path / "step-3"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(dcp.api.CheckpointException, match="not a file DCP writes"):
        single(dcp.save, state(), storage_writer=KeptWriter(foreign, run="r", step=3))
    assert (foreign / "notes.txt").read_text() == "mine"


def test_an_unfinished_save_is_replaced_whole(tmp_path: Path) -> None:
    # what a save killed mid-way leaves: DCP's names, partly written
    directory = tmp_path / "step-4"
    directory.mkdir()
    (directory / "__0_0.distcp").write_bytes(b"half")
    (directory / "__1_0.distcp").write_bytes(b"a rank of a larger world")
    (directory / ".metadata.tmp").write_bytes(b"")
    writer = KeptWriter(directory, run="r", step=4)
    single(dcp.save, state(), storage_writer=writer)
    assert writer.kept is not None
    assert sorted(p.name for p in directory.iterdir()) == [".metadata", "__0_0.distcp"]
    loaded = blank()
    single(dcp.load, loaded, storage_reader=VerifiedReader(directory, digests=writer.kept))
    assert_restored(loaded)


def test_a_writer_is_refused_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="run id"):
        SignedWriter(tmp_path / "s", run="", step=1)
    with pytest.raises(UsageError, match="step must be >= 0"):
        SignedWriter(tmp_path / "s", run="r", step=-1)
    # without collectives DCP calls the writer directly: the error is kaudit's own
    with pytest.raises(UsageError, match="use_collectives=True"):
        single(
            dcp.save,
            state(),
            storage_writer=KeptWriter(tmp_path / "s", run="r", step=1),
            use_collectives=False,
        )


def test_items_written_on_several_threads_are_each_hashed(tmp_path: Path) -> None:
    directory = tmp_path / "step-5"
    writer = KeptWriter(directory, run="r", step=5, thread_count=2)
    single(dcp.save, state(), storage_writer=writer)
    assert writer.kept is not None
    assert {f.name for f in writer.kept.files} == {".metadata", "__0_0.distcp", "__0_1.distcp"}
    loaded = blank()
    single(dcp.load, loaded, storage_reader=VerifiedReader(directory, digests=writer.kept))
    assert_restored(loaded)


@pytest.mark.slow  # torchrun and two ranks, each importing torch and DTensor
def test_a_step_saved_on_two_ranks_loads_verified_on_one(tmp_path: Path) -> None:
    from tests.integrations import dcp_ranks
    from tests.parallel.launch import launched, torchrun

    directory = tmp_path / "step-3"
    done = launched(torchrun(2, dcp_ranks.__file__, str(directory)), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    digests = parse_save_digests(json.loads((tmp_path / "step-3.digests.json").read_text()))
    assert [f.name for f in digests.files] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    chunks = sorted(i.chunk or () for i in digests.items if i.fqn == "w")
    assert chunks == [(0, 0), (4, 0)]  # one chunk a rank, each hashed where it was written
    loaded = {"w": torch.zeros(8, 8), "b": torch.zeros(4), "step": 0}
    single(dcp.load, loaded, storage_reader=VerifiedReader(directory, digests=digests))
    assert torch.equal(loaded["w"], dcp_ranks.FULL)
    assert torch.equal(loaded["b"], torch.full((4,), 2.0))
    assert loaded["step"] == 3
    # rank 1's chunk changed: the load on one rank names it
    (item,) = [i for i in digests.items if i.chunk == (4, 0)]
    path = directory / item.file
    data = bytearray(path.read_bytes())
    data[item.offset + item.length - 40] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(dcp.api.CheckpointException) as failed:
        single(dcp.load, loaded, storage_reader=VerifiedReader(directory, digests=digests))
    assert "tensor w (chunk at [4, 0]) in __1_0.distcp differs" in str(failed.value)


def test_an_async_save_signs_the_state_as_it_was_staged(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        writer = KeptWriter(tmp_path / "step-6", run="r", step=6)
        saved = state()
        pending = dcp.async_save(saved, storage_writer=writer)
        saved["model"]["w"].add_(1.0)  # the loop goes on while the save is written
        pending.result()
        assert writer.kept is not None
        loaded = blank()
        dcp.load(loaded, storage_reader=VerifiedReader(tmp_path / "step-6", digests=writer.kept))
    finally:
        dist.destroy_process_group()
    assert_restored(loaded)
