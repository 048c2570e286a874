"""Run by torchrun (gloo, every rank on this machine), in a kaudit project: one DCP save
through the signing writer with a tensor sharded across the ranks (a DTensor,
``Shard(0)``), a replicated one and a Python value, signed by the coordinator as step 3 of
run "r"."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from kronos_audit.integrations.dcp import SignedWriter

FULL = torch.arange(64, dtype=torch.float32).reshape(8, 8)
"""The sharded tensor's global value: rows 0-3 on rank 0, 4-7 on rank 1."""


def main(directory: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = {
        "w": distribute_tensor(FULL, mesh, [Shard(0)]),
        "b": torch.full((4,), 2.0),
        "step": 3,
    }
    save(state, storage_writer=SignedWriter(directory, run="r", step=3))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
