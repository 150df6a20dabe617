"""Process-group set-up: from torchrun's environment, or a single local process.

Backend: NCCL when CUDA is present, gloo otherwise. A run started by ``torchrun`` (RANK and
WORLD_SIZE in the environment) joins that group; ``gnnpar train --workers N`` starts N local ranks
through torch's elastic launcher (see :func:`launch`).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def setup(timeout_s: float = 120.0) -> DistContext:
    """Join the process group described by the environment, or return a single-rank context."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        ctx = DistContext(device=pick_device(0))
        return ctx
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = pick_device(local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(rank, world, local_rank, local_world, backend, device)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
