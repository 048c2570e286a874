"""Run by torchrun (gloo, every rank on this machine): one DCP save through the signing
writer with a tensor sharded across the ranks (a DTensor, ``Shard(0)``), a replicated one
and a Python value. The coordinator writes the digests it signs to ``digests.json`` beside
the step, for the test to load the step on one rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from kronos_audit.integrations._dcp_digests import SaveDigests
from kronos_audit.integrations.dcp import SignedWriter

FULL = torch.arange(64, dtype=torch.float32).reshape(8, 8)
"""The sharded tensor's global value: rows 0-3 on rank 0, 4-7 on rank 1."""


class KeptWriter(SignedWriter):
    def publish(self, digests: SaveDigests) -> None:
        Path(f"{self.directory}.digests.json").write_text(json.dumps(digests.to_json()))


def main(directory: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = {
        "w": distribute_tensor(FULL, mesh, [Shard(0)]),
        "b": torch.full((4,), 2.0),
        "step": 3,
    }
    save(state, storage_writer=KeptWriter(directory, run="r", step=3))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
