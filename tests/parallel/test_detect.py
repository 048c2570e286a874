"""detect(): an explicit communicator wins; else the launcher's environment decides; a
missing mpi4py is one clear line. (Under the real launchers: tests/parallel/test_comm.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.parallel import Comm, SingleProcess, detect, launcher
from kronos_audit.parallel.comm import MPI_VARIABLES, TORCHRUN_VARIABLES
from tests.runtime.test_faults import HANG_GUARD

TORCHRUN_ENV = {
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "single"),
        # Open MPI's mpiexec (5.x sets both its own variables and PMIx's)
        ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0"}, "mpi"),
        ({"PMI_SIZE": "4", "PMI_RANK": "2"}, "mpi"),  # MPICH's Hydra, srun --mpi=pmi2
        ({"PMIX_RANK": "1"}, "mpi"),  # srun --mpi=pmix
        (TORCHRUN_ENV, "torch"),
        ({"TORCHELASTIC_RUN_ID": "job-7"}, "torch"),
        # torchrun started by srun (one per node): its workers inherit srun's PMI variables
        # too, but it is torchrun that made them ranks
        ({**TORCHRUN_ENV, "PMI_RANK": "0", "PMI_SIZE": "2"}, "torch"),
        # torch's env:// variables set by some other launcher, or by hand
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node1"}, "torch"),
        # a lone RANK (many tools set one) is no launcher; nor are empty values
        ({"RANK": "3"}, "single"),
        ({"OMPI_COMM_WORLD_RANK": "", "TORCHELASTIC_RUN_ID": ""}, "single"),
    ],
)
def test_the_launcher_is_read_from_the_environment(environ: dict[str, str], expected: str) -> None:
    assert launcher(environ) == expected


def test_without_a_launcher_detect_gives_a_single_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (*MPI_VARIABLES, *TORCHRUN_VARIABLES, "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    comm = detect()
    assert isinstance(comm, SingleProcess)
    assert isinstance(comm, Comm)
    assert (comm.rank, comm.size, comm.name) == (0, 1, "single")
    assert comm.bcast("x") == "x"
    assert comm.gather({"a": 1}) == [{"a": 1}]
    assert comm.allgather(3) == [3]
    assert comm.any(True) is True
    assert comm.any(False) is False
    assert (comm.min(-4), comm.max(9)) == (-4, 9)
    assert comm.start_max([1, -2]).wait() == [1, -2]
    with pytest.raises(UsageError, match="root 1 is not a rank"):
        comm.bcast("x", root=1)
    with pytest.raises(UsageError, match="must be an integer, not str"):
        comm.max("7")  # type: ignore[arg-type]


def test_an_explicit_comm_wins_over_the_environment() -> None:
    mine = SingleProcess()
    assert detect(mine, environ={"OMPI_COMM_WORLD_RANK": "0"}) is mine


@pytest.mark.parametrize("bad", ["COMM_WORLD", 3, object()])
def test_anything_else_as_comm_is_refused(bad: object) -> None:
    with pytest.raises(UsageError, match=r"comm= must be a kronos_audit\.parallel\.Comm"):
        detect(bad)


def test_a_torch_process_group_is_wrapped_and_stays_the_programs(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    from kronos_audit.parallel.torchdist import TorchComm

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        comm = detect(dist.group.WORLD)
        assert isinstance(comm, TorchComm)
        assert (comm.rank, comm.size, comm.name) == (0, 1, "torch.distributed")
        assert comm.allgather({"k": [1]}) == [{"k": [1]}]
        assert comm.any(True) is True
        # the program initialized the group: closing our wrapper leaves it alone
        assert comm.created is False
        comm.close()
        assert dist.is_initialized()
        assert TorchComm().created is False
    finally:
        dist.destroy_process_group()


def test_torch_without_a_group_or_torchrun_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch.distributed")
    from kronos_audit.parallel.torchdist import TorchComm

    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError) as caught:
        TorchComm()
    assert str(caught.value) == (
        "torch.distributed is not initialized and torchrun's environment is incomplete "
        "(WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set): start the program with torchrun, "
        "or initialize the process group yourself"
    )


def test_an_mpi_launch_without_mpi4py_names_the_extra(tmp_path: Path) -> None:
    # A package named mpi4py that cannot be imported, ahead of the real one on the path.
    hidden = tmp_path / "hide" / "mpi4py"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named mpi4py')\n")
    env = {k: v for k, v in os.environ.items() if k not in MPI_VARIABLES}
    env |= {
        "PYTHONPATH": str(hidden.parent),
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_RANK": "0",
    }
    code = (
        "from kronos_audit.errors import UsageError\n"
        "from kronos_audit.parallel import detect\n"
        "try:\n"
        "    detect()\n"
        "except UsageError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=HANG_GUARD,
    )
    assert done.stdout == (
        "this program runs under an MPI launcher (OMPI_COMM_WORLD_SIZE is set), but mpi4py "
        "cannot be imported (No module named mpi4py): install kronos-audit[mpi], or pass "
        "comm= to choose another communicator\n"
    )
