"""Process-group set-up: from torchrun's (or the local launcher's) environment, or one process.

Backend: NCCL when CUDA is present, gloo otherwise. A rank joins the group described by the
environment torch's elastic agent sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``);
``gnnpar train --workers N`` starts N local ranks through the same agent (:mod:`gnnpar.launch`).

The key-value store is made here, explicitly, and handed to whoever needs it
(:attr:`DistContext.store`: the gossip work pool and pairing, the final-model choice): under the
elastic agent it is a client of the agent's own TCPStore (``TORCHELASTIC_USE_AGENT_STORE``), as
``init_process_group("env://")`` would make it; otherwise rank 0 hosts it. gnnpar's keys live
under a prefix that includes the agent's restart count, so a restarted attempt never reads the
keys of the attempt before it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gnnpar import RankFailedError, UsageError


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    device: torch.device = torch.device("cpu")
    store: dist.Store = field(default_factory=dist.HashStore)  # gnnpar's keys (prefixed)
    heartbeat_store: dist.Store | None = None  # the same keys over a connection of its own

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise UsageError(
                f"{name} is not set, but RANK and WORLD_SIZE are: launch with torchrun."
            )
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(
            f"Environment variable {name}={raw!r} is not an integer; it is set by torchrun "
            "(unset RANK/WORLD_SIZE to run one process)."
        ) from None


def env_world_size() -> int | None:
    """WORLD_SIZE when launched by torchrun (validated), else None."""
    if not launched_by_torchrun():
        return None
    world = _env_int("WORLD_SIZE")
    rank = _env_int("RANK")
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"RANK={rank} WORLD_SIZE={world} from the environment is inconsistent.")
    return world


def restart_count() -> int:
    """How often the elastic agent (gnnpar's launcher, or torchrun) restarted this run's ranks."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(count) if count.isdigit() else 0


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _make_store(
    rank: int, world: int, timeout: datetime.timedelta, client: bool = False
) -> dist.Store:
    addr = os.environ.get("MASTER_ADDR")
    if not addr or "MASTER_PORT" not in os.environ:
        raise UsageError(
            f"RANK={rank} WORLD_SIZE={world} are set but MASTER_ADDR/MASTER_PORT are not: "
            "launch with torchrun, or set both to the address of rank 0's machine."
        )
    port = _env_int("MASTER_PORT")
    if not 0 < port < 65536:
        raise UsageError(f"MASTER_PORT={port} is not a TCP port (1-65535).")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    master = rank == 0 and not agent and not client
    try:
        return dist.TCPStore(addr, port, world, is_master=master, timeout=timeout)
    except (dist.DistNetworkError, dist.DistStoreError) as e:
        raise _store_failure(e, rank, world, addr, port, master, timeout) from None


def _store_failure(
    e: Exception, rank: int, world: int, addr: str, port: int, master: bool, timeout
) -> Exception:
    """torch's store error as one line: a port in use is bad input (exit 2); peers that never
    came, or a rank 0 that cannot be reached, fail the run (exit 1), naming who and where."""
    secs = f"{timeout.total_seconds():g}"
    if master and "EADDRINUSE" in str(e):
        return UsageError(
            f"MASTER_PORT={port} is already in use on this machine (another run or program "
            "listens there); choose a free port."
        )
    if master:
        return RankFailedError(
            f"rank 0 waited --timeout {secs} s at {addr}:{port} for the other "
            f"{world - 1} of {world} ranks; they never came (not started, or started with "
            "another MASTER_ADDR/MASTER_PORT)."
        )
    return RankFailedError(
        f"rank {rank} could not reach rank 0's store at {addr}:{port} within --timeout {secs} "
        f"s ({type(e).__name__}); is rank 0 running, and are MASTER_ADDR/MASTER_PORT its address?"
    )


def setup(timeout_s: float = 120.0) -> DistContext:
    """Join the process group described by the environment, or return a single-rank context."""
    world = env_world_size()
    if world is None or world == 1:
        return DistContext(device=pick_device(0))
    rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    device = pick_device(local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    base = _make_store(rank, world, timeout)
    attempt = restart_count()
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(f"pg/{attempt}", base),
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
    store = dist.PrefixStore(f"gnnpar/{attempt}", base)
    beats = dist.PrefixStore(f"gnnpar/{attempt}", _make_store(rank, world, timeout, client=True))
    return DistContext(rank, world, local_rank, local_world, backend, device, store, beats)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
