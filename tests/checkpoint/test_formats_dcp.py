"""torch DCP directories (kronos_audit.checkpoint.formats.dcp): tensors by global name,
read without torch.load and without unpickling anything but DCP's own metadata classes;
one state saved on one rank and on two (gloo) has one digest per tensor."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kronos_audit.checkpoint.formats import Format, tensors_of_directory
from kronos_audit.checkpoint.formats.dcp import read_metadata
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.errors import CheckpointError
from tests.helpers import run_cli

# Two gloo ranks spawned once per module (torch's start-up in each): tens of seconds.
pytestmark = pytest.mark.slow


def _state() -> dict[str, Any]:
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(4, 3),
        "b": torch.ones(4, dtype=torch.bfloat16),
        "step": 7,
    }


def _save_sharded(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed.checkpoint as dcp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    state = {
        k: distribute_tensor(v, mesh, [Shard(0)]) if isinstance(v, torch.Tensor) else v
        for k, v in _state().items()
    }
    dcp.save(state, checkpoint_id=out)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def saves(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    # DCP imported here, not with the module: every pytest worker collects it, one runs it
    import torch.distributed.checkpoint as dcp

    root = tmp_path_factory.mktemp("dcp")
    with warnings.catch_warnings():  # "assuming ... a single process": it is one
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(_state(), checkpoint_id=str(root / "one"), no_dist=True)  # type: ignore[attr-defined]
    spawn = mp.spawn  # type: ignore[attr-defined]
    spawn(_save_sharded, args=(2, _free_port(), str(root / "two")), nprocs=2)  # type: ignore[no-untyped-call]
    return root / "one", root / "two"


def test_one_rank_and_two_give_the_same_digests_by_global_name(saves: tuple[Path, Path]) -> None:
    one, two = saves
    assert sorted(p.name for p in two.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    found_one, found_two = tensors_of_directory(one), tensors_of_directory(two)
    assert found_one is not None
    assert found_one == found_two
    fmt, digests = found_one
    by_path = {d.path: d for d in digests}
    assert fmt is Format.DCP
    assert sorted(by_path) == ["/b", "/step", "/w"]
    assert by_path["/w"] == array_digest("/w", _state()["w"].numpy())
    assert by_path["/b"].dtype == "bfloat16"
    assert by_path["/step"].dtype == "pickle"  # its pickle stream's digest; never unpickled


def test_diff_of_two_saves_compares_tensor_by_tensor(saves: tuple[Path, Path]) -> None:
    one, two = saves
    result = run_cli("diff", str(one), str(two), "--rtol", "1e-6")
    assert result.exit_code == 0, result.output


def test_a_metadata_pickle_naming_another_global_is_refused_and_never_run(
    saves: tuple[Path, Path], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.system, (f"touch {marker}",))

    data = pickle.dumps(Evil())
    with pytest.raises(CheckpointError, match="system is not allowed"):
        read_metadata(data, tmp_path / ".metadata")
    hostile = tmp_path / "hostile"
    shutil.copytree(saves[0], hostile)
    (hostile / ".metadata").write_bytes(data)
    assert tensors_of_directory(hostile) is None  # its first global is not DCP's: not DCP
    # One that starts as DCP's pickle does, then names another global, is refused.
    from torch.distributed.checkpoint.metadata import Metadata

    (hostile / ".metadata").write_bytes(pickle.dumps((Metadata, Evil())))
    with pytest.raises(CheckpointError, match="system is not allowed"):
        tensors_of_directory(hostile)
    assert not marker.exists()


def test_a_chunk_outside_its_file_is_refused(saves: tuple[Path, Path], tmp_path: Path) -> None:
    short = tmp_path / "short"
    shutil.copytree(saves[1], short)
    data = (short / "__1_0.distcp").read_bytes()
    (short / "__1_0.distcp").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="lies outside"):
        tensors_of_directory(short)
    assert tensors_of_directory(tmp_path) is None  # no .metadata: not DCP
