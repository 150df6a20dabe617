"""Process-group set-up: from torchrun's (or the local launcher's) environment, or one process.

Backend: NCCL when CUDA is present, gloo otherwise. A rank joins the group described by the
environment torch's elastic agent sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``);
``gnnpar train --workers N`` starts N local ranks through the same agent (:mod:`gnnpar.runtime.launch`).

The key-value store is made here, explicitly, and handed to whoever needs it
(:attr:`DistContext.store`: the gossip work pool and pairing, the final-model choice): under the
elastic agent it is a client of the agent's own TCPStore (``TORCHELASTIC_USE_AGENT_STORE``), as
``init_process_group("env://")`` would make it; otherwise rank 0 hosts it.

Restarts: the agent's TCPStore outlives an attempt, so there gnnpar's keys live under a prefix
that includes the agent's restart count, and a restarted attempt never reads the keys of the
attempt before it. That count is each agent's own, though: an agent whose ranks were restarted
because *another* host's failed does not count it, so across hosts the counts can differ.
``gnnpar torchrun`` therefore asks torchrun for a new store every attempt
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: rank 0 hosts it), whose keys need no prefix; and
whether this attempt is a restart (resume from a checkpoint, keep the checkpoints) is agreed by
all ranks (:attr:`DistContext.restarts`, the largest count), never decided by one alone.

Two machines (see README "Two hosts"): torchrun on each, ``--local-addr`` naming the address the
other host reaches this one at, and ``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME``) the interface
that carries it. A rank that cannot reach the store gets a message naming those settings
(:class:`StoreUnreachableError`).

SLURM: tasks started by ``srun`` take their rank from SLURM's variables, which
:func:`gnnpar.runtime.slurm.adopt` writes as torchrun's once, at the start of a run
(:func:`gnnpar.run.run`), so that everything here sees one kind of launch.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gnnpar.errors import RankFailedError, UsageError
from gnnpar.runtime import slurm


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
    restarts: int = 0  # the agents' largest restart count: > 0 means this attempt resumes

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Started as one rank of many by torchrun (or by srun, once
    :func:`gnnpar.runtime.slurm.adopt` has written SLURM's ranks as torchrun's variables)."""
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


def pick_device(local_rank: int, local_world: int = 1) -> torch.device:
    """One GPU per rank (``cuda:<local rank>``), or the CPU.

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a host with fewer GPUs than
    ranks trains on its CPUs with gloo, every rank alike (each decides from the same two counts;
    each host's local rank 0 says so once). ``CUDA_VISIBLE_DEVICES=`` picks the CPU on any host."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= local_world >= 1:
        return torch.device("cuda", local_rank)
    if gpus and local_rank == 0:
        print(
            f"gnnpar: {local_world} ranks on this host and {gpus} GPU{'s' * (gpus > 1)}: NCCL "
            "needs a GPU of its own for each rank, so every rank trains on the CPU (gloo). "
            f"Start at most {gpus} rank{'s' * (gpus > 1)} per host to train on the GPUs.",
            file=sys.stderr,
            flush=True,
        )
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
    agent = _agent_store()
    master = rank == 0 and not agent and not client
    if agent:  # the agent made the store before starting any rank: it answers now, or never
        _probe(rank, world, addr, port, timeout)
    try:
        return dist.TCPStore(addr, port, world, is_master=master, timeout=timeout)
    except dist.DistError as e:  # DistNetworkError (no connection), DistStoreError (no clients)
        if master and "EADDRINUSE" in str(e):  # bad input, not a failed rank: exit 2
            raise UsageError(
                f"MASTER_PORT={port} is already in use on this machine (another run or program "
                "listens there); choose a free port."
            ) from None
        message = _unreachable(rank, world, addr, port, master, timeout, e)
        raise StoreUnreachableError(message) from None


def setup(timeout_s: float = 120.0) -> DistContext:
    """Join the process group described by the environment, or return a single-rank context."""
    world = env_world_size()
    if world is None or world == 1:
        return DistContext(device=pick_device(0), restarts=restart_count())
    rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    device = pick_device(local_rank, local_world)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    base = _make_store(rank, world, timeout)
    # the agent's store holds earlier attempts' keys; a store of this attempt's own holds none
    attempt = restart_count() if _agent_store() else 0
    if not dist.is_initialized():
        try:
            dist.init_process_group(
                backend=backend,
                store=dist.PrefixStore(f"pg/{attempt}", base),
                rank=rank,
                world_size=world,
                timeout=timeout,
            )
        except RuntimeError as e:  # store reached, ranks not all connected (gloo: RuntimeError)
            what = (
                f"rank {rank} of {world} reached the store but the {backend} process group did "
                f"not form within {timeout_s:g} s ({_first_line(e)}): a rank did not join, or "
                "the ranks advertise addresses the others cannot reach"
            )
            raise StoreUnreachableError(f"{what}. {_network_hint(rank, world)}") from None
    store = dist.PrefixStore(f"gnnpar/{attempt}", base)
    # the heartbeat's own connection gives up on one call sooner, so that a store gone silent
    # (its host, or the network to it, down) is reported by the heartbeat within --timeout
    beat_timeout = datetime.timedelta(seconds=max(0.4 * timeout_s, 0.5))
    beats = dist.PrefixStore(
        f"gnnpar/{attempt}", _make_store(rank, world, beat_timeout, client=True)
    )
    restarts = _agreed_restarts(store, rank, world, timeout_s)
    return DistContext(
        rank, world, local_rank, local_world, backend, device, store, beats, restarts
    )


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _agreed_restarts(store: dist.Store, rank: int, world: int, timeout_s: float) -> int:
    """The largest restart count of any rank's agent: every rank's, so that all ranks resume
    (or all start afresh) even when only one host's agent counted the restart."""
    from gnnpar.runtime.store import wait_for_key

    store.set(f"restarts/{rank}", str(restart_count()))
    counts = []
    for r in range(world):
        wait_for_key(store, f"restarts/{r}", timeout_s, f"rank {r}'s joining the run")
        counts.append(int(store.get(f"restarts/{r}")))
    return max(counts)


def peer_failure(e: BaseException) -> str | None:
    """The message for a rank whose collective or store call failed because a peer went away
    (a gloo/NCCL timeout or a closed connection: torch's ``DistError``s and gloo's own
    RuntimeErrors, or a store wait that timed out); None for any other error. A rank of torchrun's prints it (the CLI) instead of a
    traceback; gnnpar's own launcher reports its ranks' failures itself."""
    from gnnpar.runtime import heartbeat
    from gnnpar.runtime.heartbeat import next_step
    from gnnpar.runtime.store import PeerTimeoutError

    if isinstance(e, PeerTimeoutError):
        return f"{str(e).rstrip('.')}.{next_step()}"
    gloo = isinstance(e, RuntimeError) and "/gloo/" in str(
        e
    )  # gloo's own errors (a timed-out recv, a closed peer) are plain
    if not isinstance(e, dist.DistError) and not gloo:
        return None
    who = f"rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE', '?')}"
    timeout_s = heartbeat.watched_timeout_s
    if timeout_s is not None and heartbeat.silence is None and "Timed out" in str(e):
        return (
            f"{who}: a collective with the other ranks timed out ({_first_line(e)}) while "
            "every other rank was still answering its heartbeat: a rank is slower than "
            f"--timeout {timeout_s:g} s allows (a long step or first step, or a --slowdown "
            "straggler), not gone. Raise --timeout."
        )
    seen = f" (by then {heartbeat.silence})" if heartbeat.silence else ""
    return (
        f"{who}: a collective or store call with the other ranks failed ({_first_line(e)}){seen}:"
        " a peer stopped answering (crashed, stalled, or its host went down), or the network "
        f"between the hosts is down.{next_step()}"
    )


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class CollectiveFailedError(RankFailedError):
    """A rank of gnnpar's launcher whose collective failed because of a peer: the message is
    :func:`peer_failure`'s (it names the rank); the launcher ranks it below a rank's own error,
    which is usually the cause (:func:`gnnpar.runtime.launch._collateral`)."""


class StoreUnreachableError(RankFailedError):
    """This rank could not reach the run's TCP store (hosting it: not every rank reached it;
    past it: the ranks could not connect to each other). Across hosts almost always an address
    or interface setting (--local-addr, GLOO_SOCKET_IFNAME); CLI exit 1, as a failed rank."""


def _probe(rank: int, world: int, addr: str, port: int, timeout: datetime.timedelta) -> None:
    """Connect to the agent's store within half of ``timeout``, or raise the message.

    TCPStore's own client retries for up to about twice its timeout, while the ranks that did
    reach the store give up on this one after ``timeout``; their agent then exits, taking the
    rendezvous with it, and this rank's agent stops it before it can say why. Half the timeout
    lets the rank that is lost report first."""
    deadline = time.monotonic() + timeout.total_seconds() / 2
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(left, 0.1)):
                return
        except OSError as e:
            if time.monotonic() + 0.2 >= deadline:
                half = datetime.timedelta(seconds=timeout.total_seconds() / 2)
                message = _unreachable(rank, world, addr, port, False, half, e)
                raise StoreUnreachableError(message) from None
            time.sleep(0.2)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0].rstrip(".") if text else type(e).__name__


def _unreachable(
    rank: int, world: int, addr: str, port: int, master: bool, timeout: datetime.timedelta,
    cause: Exception,
) -> str:  # fmt: skip
    """The one message for a store that nobody reached, naming the settings that decide it."""
    secs = f"{timeout.total_seconds():g} s"
    if master:
        what = (
            f"rank 0 hosted the store at {addr}:{port}, but within {secs} not all of the other "
            f"{world - 1} ranks connected to it ({_first_line(cause)})"
        )
    else:
        what = (
            f"rank {rank} of {world} could not reach the store at MASTER_ADDR:MASTER_PORT = "
            f"{addr}:{port} within {secs} ({_first_line(cause)})"
        )
    return f"{what}. {_network_hint(rank, world)}"


def _network_hint(rank: int, world: int) -> str:
    """The settings that decide whether ranks on several hosts find each other."""
    fix = (
        "On machines with several network interfaces (or hosts that share a hostname) pass "
        "torchrun --local-addr <this host's address on the network the hosts share> on every "
        "host, and set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME with GPUs) to that network's "
        "interface; check that the address is reachable from every host (firewall, port), that "
        "every host was started, and raise --timeout if hosts start far apart."
    )
    if slurm.adopted():
        fix += (
            f" The ranks came from SLURM (task {rank} of SLURM_NTASKS={world}): start every "
            "task with srun (one process per task); in a batch script without srun, unset "
            "SLURM_NTASKS to train with --workers N on one node."
        )
    return fix
