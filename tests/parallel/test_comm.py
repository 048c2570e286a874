"""Every Comm method on real ranks: 3 under mpiexec, 2 under torchrun (gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel.launch import mpiexec, run, torchrun

pytestmark = pytest.mark.slow

# Each rank exercises everything and writes what it got as JSON; the test checks every rank's.
COMMON = """
import json
from pathlib import Path

from kronos_audit.errors import UsageError
from kronos_audit.parallel import PreemptionVote, detect

c = detect()
r = c.rank
out = {"rank": r, "name": c.name, "type": type(c).__name__, "size": c.size}
c.barrier()
out["bcast"] = c.bcast({"from": r, "items": [1, "x", None]}, root=1)
out["gather0"] = c.gather({"r": r}, root=0)
out["gather_last"] = c.gather(r * 10, root=c.size - 1)
out["allgather"] = c.allgather(f"rank-{r}")
out["shift"] = c.shift_left({"from": r, "bytes": bytes(r + 1).hex()})
# a ring each way (a rank's partner on the next node, and back), a large object each
out["ring"] = c.sendrecv([r, len(bytes(1 << 20))], (r + 1) % c.size, (r - 1) % c.size)
out["ring_back"] = c.sendrecv(r, (r - 1) % c.size, (r + 1) % c.size)
out["any_none"] = c.any(False)
out["any_last"] = c.any(r == c.size - 1)
out["min"] = c.min(10 - r)
out["max"] = c.max(2**62 if r == 1 else -(2**62))
out["start_max"] = c.start_max([r, -r, 7]).wait()
for name, call in [
    ("bad_root", lambda: c.bcast(1, root=c.size)),
    ("bad_value", lambda: c.max(2**63)),
    ("bad_values", lambda: c.start_max([])),
]:
    try:
        call()
    except UsageError as e:
        out[name] = str(e)
# a rank that offers another step than the others: every rank learns it, none hangs
try:
    PreemptionVote(c, deferred=False).poll(5 if r != 1 else 6, False)
except UsageError as e:
    out["out_of_step"] = str(e)
"""

MPI_PROGRAM = (
    COMMON
    + """
from mpi4py import MPI
from kronos_audit.parallel.mpi import MPIComm

# a sub-communicator of the program's: even and odd world ranks, in reverse order
sub = detect(MPI.COMM_WORLD.Split(color=r % 2, key=-r))
out["sub"] = {
    "type": type(sub).__name__,
    "rank": sub.rank,
    "size": sub.size,
    "allgather": sub.allgather(r),
    "gather0": sub.gather(r, root=0),
    "min": sub.min(r),
}
out["world"] = MPIComm().allgather(r)
try:
    MPIComm("COMM_WORLD")
except UsageError as e:
    out["not_a_comm"] = str(e)
Path(f"out.{r}.json").write_text(json.dumps(out))
"""
)

TORCH_PROGRAM = (
    COMMON
    + """
import torch.distributed as dist
from kronos_audit.parallel.torchdist import TorchComm

out["created"] = c.created
# a group of the program's holding world rank 1 only: its rank 0 is world rank 1
group = dist.new_group(ranks=[1])
if r == 1:
    sub = detect(group)
    out["sub"] = {
        "type": type(sub).__name__,
        "rank": sub.rank,
        "size": sub.size,
        "gather0": sub.gather("g", root=0),
        "bcast": sub.bcast("b", root=0),
        "any": sub.any(True),
    }
else:
    try:
        detect(group)
    except UsageError as e:
        out["not_member"] = str(e)
try:
    TorchComm(group="WORLD")
except UsageError as e:
    out["not_a_group"] = str(e)
c.barrier()
c.close()
out["initialized_after_close"] = dist.is_initialized()
Path(f"out.{r}.json").write_text(json.dumps(out))
"""
)


def check_common(docs: list[dict[str, object]], size: int, name: str, kind: str) -> None:
    for r, doc in enumerate(docs):
        assert doc["name"] == name
        assert doc["type"] == kind
        assert doc["size"] == size
        assert doc["bcast"] == {"from": 1, "items": [1, "x", None]}
        assert doc["gather0"] == ([{"r": i} for i in range(size)] if r == 0 else None)
        assert doc["gather_last"] == ([10 * i for i in range(size)] if r == size - 1 else None)
        assert doc["allgather"] == [f"rank-{i}" for i in range(size)]
        right = None if r == size - 1 else {"from": r + 1, "bytes": bytes(r + 2).hex()}
        assert doc["shift"] == right
        assert doc["ring"] == [(r - 1) % size, 1 << 20]
        assert doc["ring_back"] == (r + 1) % size
        assert doc["any_none"] is False
        assert doc["any_last"] is True
        assert doc["min"] == 10 - (size - 1)
        assert doc["max"] == 2**62
        assert doc["start_max"] == [size - 1, 0, 7]
        assert doc["bad_root"] == f"root {size} is not a rank of this communicator (size {size})"
        assert doc["bad_value"] == f"value {2**63} does not fit in 64 bits"
        assert doc["bad_values"] == "values must not be empty"
        assert "ranks are out of step" in str(doc["out_of_step"])
        assert "from 5 to 6" in str(doc["out_of_step"])


def test_every_method_on_three_mpi_ranks(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(MPI_PROGRAM, encoding="utf-8")
    docs = run(mpiexec(3, "prog.py"), tmp_path, 3)
    check_common(docs, 3, "mpi", "MPIComm")
    evens = {"type": "MPIComm", "size": 2, "allgather": [2, 0], "gather0": [2, 0], "min": 0}
    assert docs[0]["sub"] == {**evens, "rank": 1, "gather0": None}
    assert docs[2]["sub"] == {**evens, "rank": 0}
    assert docs[1]["sub"] == {
        "type": "MPIComm",
        "rank": 0,
        "size": 1,
        "allgather": [1],
        "gather0": [1],
        "min": 1,
    }
    assert all(doc["world"] == [0, 1, 2] for doc in docs)
    assert all(
        doc["not_a_comm"] == "MPIComm needs an mpi4py intracommunicator (MPI.COMM_WORLD or "
        "one split from it), not str"
        for doc in docs
    )


def test_every_method_on_two_torchrun_ranks(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(TORCH_PROGRAM, encoding="utf-8")
    docs = run(torchrun(2, "prog.py"), tmp_path, 2)
    check_common(docs, 2, "torch.distributed", "TorchComm")
    for doc in docs:
        # detect() initialized the default group from torchrun's environment, and its
        # close() destroyed it
        assert doc["created"] is True
        assert doc["initialized_after_close"] is False
    assert all(
        doc["not_a_group"] == "TorchComm needs a torch.distributed ProcessGroup, not str"
        for doc in docs
    )
    assert docs[0]["not_member"] == "this process is not a member of the process group given"
    assert docs[1]["sub"] == {
        "type": "TorchComm",
        "rank": 0,
        "size": 1,
        "gather0": ["g"],
        "bcast": "b",
        "any": True,
    }
