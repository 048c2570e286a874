"""The DCP integration with the real torch.distributed.checkpoint, in this process (one
rank, no process group): what the writer hashes as DCP writes, and what the reader refuses
before DCP unpickles or loads it."""

from __future__ import annotations

import hashlib
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import kronos_audit as ka  # noqa: E402
from kronos_audit.errors import CheckpointError, UsageError  # noqa: E402
from kronos_audit.integrations._dcp_digests import (  # noqa: E402
    SaveDigests,
    load_metadata,
)
from kronos_audit.integrations.dcp import SignedWriter, VerifiedReader  # noqa: E402
from kronos_audit.keys.keyfile import SigningKey  # noqa: E402
from kronos_audit.project.repository import Project  # noqa: E402
from kronos_audit.statement.manifest import read_manifest  # noqa: E402


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


def save(directory: Path, step: int, **options: Any) -> SaveDigests:
    """``state()`` saved into ``directory`` through the signing writer, signed as ``step``
    of run "r"; what the coordinator hashed."""
    writer = SignedWriter(directory, run="r", step=step, **options)
    single(dcp.save, state(), storage_writer=writer)
    assert writer.digests is not None
    return writer.digests


@pytest.fixture
def root(project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the steps go, in a kaudit project whose user holds a trusted key."""
    monkeypatch.chdir(project.root)
    return project.root / "ckpt"


@pytest.fixture
def saved(root: Path) -> tuple[Path, SaveDigests]:
    directory = root / "step-1"
    return directory, save(directory, 1)


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
    single(dcp.load, loaded, storage_reader=VerifiedReader(saved[0]))
    assert_restored(loaded)


def test_a_changed_tensor_byte_fails_the_load_naming_the_tensor(
    saved: tuple[Path, SaveDigests],
) -> None:
    directory, digests = saved
    (item,) = [i for i in digests.items if i.fqn == "model.w"]
    path = directory / item.file
    data = bytearray(path.read_bytes())
    data[item.offset + item.length - 40] ^= 0x01  # inside the tensor's bytes
    path.write_bytes(bytes(data))
    loaded = blank()
    with pytest.raises(dcp.api.CheckpointException) as failed:
        single(dcp.load, loaded, storage_reader=VerifiedReader(directory))
    assert "tensor model.w in __0_0.distcp differs from its signed digest" in str(failed.value)
    assert torch.equal(loaded["model"]["w"], torch.zeros(4, 6))  # nothing of it was loaded


class Planted:
    """Unpickling this creates the file it names: proof that bytes were unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_swapped_metadata_is_refused_before_it_is_unpickled(
    saved: tuple[Path, SaveDigests], tmp_path: Path
) -> None:
    directory, _ = saved
    marker = tmp_path / "unpickled"
    (directory / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(dcp.api.CheckpointException) as failed:
        single(dcp.load, blank(), storage_reader=VerifiedReader(directory))
    assert ".metadata: differs from its signed digest: not unpickled" in str(failed.value)
    assert not marker.exists()


def test_metadata_that_names_anything_but_dcp_classes_is_never_called(tmp_path: Path) -> None:
    # even bytes whose digest held (a signer's own mistake) unpickle DCP's classes alone
    marker = tmp_path / "unpickled"
    with pytest.raises(CheckpointError, match=r"names pathlib\.Path\.touch|names pathlib"):
        load_metadata(pickle.dumps(Planted(marker)), tmp_path / ".metadata")
    assert not marker.exists()


def test_a_signed_item_past_its_file_end_is_refused_as_the_manifest_is_read() -> None:
    from kronos_audit.checkpoint.directory import FileEntry, ItemDigest, entry_problem

    item = ItemDigest("model.w", (0, 0), 4000, 200, "0" * 64)
    entry = FileEntry("__0_0.distcp", 4100, "0" * 64, "0" * 32, items=(item,))
    assert entry_problem(entry) == "'__0_0.distcp': item 'model.w' ends past the file's end"
    assert item.label == "tensor model.w"


def test_a_save_into_a_signed_step_or_a_foreign_directory_is_refused(tmp_path: Path) -> None:
    signed = tmp_path / "step-2"
    signed.mkdir()
    (tmp_path / "step-2.kaudit.json").write_text("{}")
    with pytest.raises(dcp.api.CheckpointException, match="already signed"):
        single(dcp.save, state(), storage_writer=SignedWriter(signed, run="r", step=2))
    foreign = tmp_path / "step-3"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(dcp.api.CheckpointException, match="not a file DCP writes"):
        single(dcp.save, state(), storage_writer=SignedWriter(foreign, run="r", step=3))
    assert (foreign / "notes.txt").read_text() == "mine"
    unsigned = tmp_path / "step-9"  # a whole save nobody signed: someone's checkpoint
    single(dcp.save, state(), storage_writer=dcp.FileSystemWriter(unsigned))
    before = {p.name: p.read_bytes() for p in unsigned.iterdir()}
    with pytest.raises(dcp.api.CheckpointException, match="whole DCP save that was never signed"):
        single(dcp.save, state(), storage_writer=SignedWriter(unsigned, run="r", step=9))
    assert {p.name: p.read_bytes() for p in unsigned.iterdir()} == before


def test_an_unfinished_save_is_replaced_whole_and_steps_chain(
    saved: tuple[Path, SaveDigests], root: Path
) -> None:
    # what a save killed mid-way leaves: DCP's names, partly written
    directory = root / "step-4"
    directory.mkdir()
    (directory / "__0_0.distcp").write_bytes(b"half")
    (directory / "__1_0.distcp").write_bytes(b"a rank of a larger world")
    (directory / ".metadata.tmp").write_bytes(b"")
    save(directory, 4)
    assert sorted(p.name for p in directory.iterdir()) == [".metadata", "__0_0.distcp"]
    loaded = blank()
    single(dcp.load, loaded, storage_reader=VerifiedReader(directory))
    assert_restored(loaded)
    first, second = (read_manifest(root / f"step-{n}.kaudit.json") for n in (1, 4))
    assert (second.run, second.step, second.parent) == ("r", 4, first.digest)
    (result,) = ka.verify(second.path)  # kaudit's own verify: every file, and the chain
    assert result.ok, result.failures


def test_the_signed_step_records_each_item_and_the_tensors_by_name(
    saved: tuple[Path, SaveDigests],
) -> None:
    directory, digests = saved
    manifest = read_manifest(directory.with_name("step-1.kaudit.json"))
    record = manifest.record.directory
    assert record is not None
    (data,) = [f for f in record.files if f.path == "__0_0.distcp"]
    assert data.items is not None
    assert {(i.name, i.sha256) for i in data.items} == {(i.fqn, i.sha256) for i in digests.items}
    assert manifest.record.format == "dcp"
    assert {d.path for d in manifest.datasets or ()} >= {"/model.w", "/model.b"}


def test_a_step_signed_without_item_digests_is_not_loaded_item_by_item(root: Path) -> None:
    directory = root / "step-8"
    single(dcp.save, state(), storage_writer=dcp.FileSystemWriter(directory))
    with pytest.raises(dcp.api.CheckpointException, match=r"is not signed: no step-8\.kaudit"):
        single(dcp.load, blank(), storage_reader=VerifiedReader(directory))
    ka.snapshot(directory, run="r", step=8)
    with pytest.raises(dcp.api.CheckpointException, match="records no DCP item digests"):
        single(dcp.load, blank(), storage_reader=VerifiedReader(directory))


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
            storage_writer=SignedWriter(tmp_path / "s", run="r", step=1),
            use_collectives=False,
        )


def test_items_written_on_several_threads_are_each_hashed(root: Path) -> None:
    directory = root / "step-5"
    digests = save(directory, 5, thread_count=2)
    assert {f.name for f in digests.files} == {".metadata", "__0_0.distcp", "__0_1.distcp"}
    loaded = blank()
    single(dcp.load, loaded, storage_reader=VerifiedReader(directory))
    assert_restored(loaded)


@pytest.mark.slow  # torchrun and two ranks, each importing torch and DTensor
def test_a_step_saved_on_two_ranks_loads_verified_on_one(root: Path) -> None:
    from tests.helpers import run_cli
    from tests.integrations import dcp_ranks
    from tests.parallel.launch import launched, torchrun

    directory = root / "step-3"
    done = launched(torchrun(2, dcp_ranks.__file__, str(directory)), root.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = read_manifest(root / "step-3.kaudit.json")
    assert manifest.record.directory is not None
    files = {f.path: f for f in manifest.record.directory.files}
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    chunks = {(f.path, i.chunk) for f in files.values() for i in f.items or () if i.name == "w"}
    # one chunk a rank, each hashed by the rank that wrote it
    assert chunks == {("__0_0.distcp", (0, 0)), ("__1_0.distcp", (4, 0))}
    loaded = {"w": torch.zeros(8, 8), "b": torch.zeros(4), "step": 0}
    single(dcp.load, loaded, storage_reader=VerifiedReader(directory))
    assert torch.equal(loaded["w"], dcp_ranks.FULL)
    assert torch.equal(loaded["b"], torch.full((4,), 2.0))
    assert loaded["step"] == 3
    # the same state saved on one rank: the two steps agree tensor by tensor, whatever
    # their files (.metadata's bytes differ from save to save)
    alone = root / "step-30"
    single(dcp.save, loaded, storage_writer=SignedWriter(alone, run="one", step=30))
    compared = run_cli("diff", str(root / "step-3.kaudit.json"), str(root / "step-30.kaudit.json"))
    assert compared.exit_code == 0, compared.output
    # rank 1's chunk changed: the load on one rank names it
    (item,) = [i for i in files["__1_0.distcp"].items or () if i.name == "w"]
    path = directory / "__1_0.distcp"
    data = bytearray(path.read_bytes())
    data[item.offset + item.length - 40] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(dcp.api.CheckpointException) as failed:
        single(dcp.load, loaded, storage_reader=VerifiedReader(directory))
    assert "tensor w (chunk at [4, 0]) in __1_0.distcp differs" in str(failed.value)


def test_an_async_save_signs_the_state_as_it_was_staged(root: Path, tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        saved = state()
        pending = dcp.async_save(
            saved, storage_writer=SignedWriter(root / "step-6", run="r", step=6)
        )
        saved["model"]["w"].add_(1.0)  # the loop goes on while the save is written
        pending.result()
        loaded = blank()
        dcp.load(loaded, storage_reader=VerifiedReader(root / "step-6"))
    finally:
        dist.destroy_process_group()
    assert_restored(loaded)


@pytest.mark.slow  # one fresh process importing torch, killed with SIGKILL; a push, a clone
def test_a_killed_run_resumes_verified_and_its_steps_verify_in_a_fresh_clone(
    root: Path, project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    from examples.dcp_train import run as example
    from kronos_audit.storage import configure_remote
    from tests.helpers import pushed_and_cloned

    argv = ["--steps", "12", "--every", "4", "--root", "ckpt"]
    crashed = subprocess.run(
        [sys.executable, "-W", "ignore", example.__file__, *argv, "--crash-at", "6"],
        cwd=project.root,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert sorted(p.name for p in root.glob("*.kaudit.json")) == ["step-4.kaudit.json"]
    with warnings.catch_warnings():  # DCP's note that it runs in one process
        warnings.simplefilter("ignore", UserWarning)
        resumed = example.main(argv)
        uninterrupted = example.main([*argv[:-1], "ckpt-uninterrupted"])
    assert resumed["resumed_from"] == 4
    assert resumed["weights"] == uninterrupted["weights"]  # bitwise: model, optimizer, generator
    newest = read_manifest(root / "step-12.kaudit.json")
    assert newest.parent == read_manifest(root / "step-8.kaudit.json").digest

    configure_remote(project, str(tmp_path / "remote"))
    clone = pushed_and_cloned(project.root, tmp_path, "ckpt")
    monkeypatch.chdir(clone)
    (result,) = ka.verify(clone / "ckpt" / "step-12.kaudit.json")  # fetched, then checked
    assert result.ok, result.failures
    loaded = {"step": 0}
    single(dcp.load, loaded, storage_reader=VerifiedReader(clone / "ckpt" / "step-12"))
    assert loaded["step"] == 12
