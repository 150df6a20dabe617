"""Collectives shared by the strategies: timed, one flat buffer each, and a one-rank fallback.

Every helper is a thin layer over torch.distributed: one flat buffer per collective (one call
instead of one per parameter, flattened with ``torch.nn.utils.parameters_to_vector``), the
seconds spent blocked in it added to a :class:`WaitClock` (what ``per_worker_wait_s`` reports),
and a single-process fallback so that strategies run unchanged on one rank. Timeouts are the
process group's (``--timeout``): a peer that never arrives becomes an error, not a hang.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector


def active(group: dist.ProcessGroup | None = None) -> bool:
    """True when collectives on ``group`` (default: the world) involve more than this rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


# the tag of the pair exchange's messages, apart from other point-to-point traffic (pipelines)
PAIR_TAG = 0x676E70


# the largest tensor two ranks on different hosts swap rather than ring-reduce (about twice a
# link's bytes in flight: 125 KB at 100 Mbit/s, 5 ms and at 1 Gbit/s, 1 ms; all_reduce_sum)
PAIR_ACROSS_HOSTS_MAX_BYTES = 128 * 1024


def ranks_share_host(world_size: int) -> bool:
    """Whether every rank of a world of ``world_size`` runs on this host, as its launcher says:
    ``LOCAL_WORLD_SIZE`` (torchrun's, or SLURM's through :mod:`gnnpar.runtime.slurm`) is the
    world's size; unset, gnnpar's own launcher started them all here (read as
    :func:`gnnpar.runtime.dist.setup` reads it, which refuses a value that is not a number)."""
    raw = os.environ.get("LOCAL_WORLD_SIZE")
    if raw is None:
        return True
    try:
        return int(raw) >= world_size
    except ValueError:
        return False


def pair_exchange_pays(nbytes: int, one_host: bool) -> bool:
    """Whether two ranks swap a tensor of ``nbytes`` (:func:`all_reduce_sum`) rather than take
    gloo's ring: always on ``one_host``, up to :data:`PAIR_ACROSS_HOSTS_MAX_BYTES` across hosts.
    The rule of the code and of ``gnnpar advise``'s simulation (``Cluster.allreduce_s``)."""
    return one_host or nbytes <= PAIR_ACROSS_HOSTS_MAX_BYTES


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """In-place SUM over ``group`` (``dist.all_reduce``).

    Two ranks on gloo with a CPU tensor swap their tensors (one ``isend``/``irecv`` pair, in
    one ``batch_isend_irecv``) and each adds the other's: one round trip, where gloo's ring
    all-reduce takes several. On one 2-vCPU host, 99K floats (a study-003 GCN's gradient):
    0.73 ms a call against gloo's 1.18 ms (``benchmarks/comm/pair_allreduce_vs_gloo.py``, BENCHMARKS.md).
    Each element is one addition of the two ranks' values, as in gloo's ring for two ranks;
    both ranks hold the same floats, since ``a + b == b + a``.

    Between two hosts only tensors up to :data:`PAIR_ACROSS_HOSTS_MAX_BYTES` are swapped so.
    The rank that arrives second finds the first's receive posted and sends at once, and its
    own "ready to receive" follows its data down the same TCP stream, so a large exchange runs
    its two directions one after the other. Measured with 20 ms of compute between calls
    (``benchmarks/comm/gloo_over_shaped_link.py --compute-ms 20``): 0.79 MB over 100 Mbit/s, 5 ms took 142 ms
    against gloo's ring's 87 ms, and 13.4 against 11.3 ms at 1 Gbit/s, 1 ms; 92 KB took 20.2
    against 28.7 ms (5 ms) and 4.8 against 5.4 ms (1 ms). Other sizes, backends and devices:
    ``dist.all_reduce``. Timeouts are the process group's either way.
    """
    flat = tensor if tensor.is_contiguous() else tensor.contiguous()
    if (
        dist.get_world_size(group) != 2
        or tensor.device.type != "cpu"
        or dist.get_backend(group) != "gloo"
        or not pair_exchange_pays(
            flat.numel() * flat.element_size(), ranks_share_host(dist.get_world_size())
        )
    ):
        dist.all_reduce(flat, group=group)
    else:
        me = dist.get_rank(group)
        peer = dist.get_global_rank(group, 1 - me) if group is not None else 1 - me
        other = torch.empty_like(flat)
        ops = [
            dist.P2POp(dist.isend, flat, peer, group=group, tag=PAIR_TAG),
            dist.P2POp(dist.irecv, other, peer, group=group, tag=PAIR_TAG),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        flat.add_(other)
    if flat is not tensor:  # gloo reduces a contiguous copy: the result goes back into tensor
        tensor.copy_(flat)


@dataclass
class WaitClock:
    """Seconds a rank spent blocked in collectives, and how many it took part in."""

    seconds: float = 0.0
    calls: int = 0

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        """In-place SUM all-reduce of ``tensor`` over ``group``, timed; a no-op on one rank."""
        if active(group):
            t0 = time.perf_counter()
            all_reduce_sum(tensor, group)
            self.seconds += time.perf_counter() - t0
        self.calls += 1

    def barrier(self) -> None:
        if active():
            t0 = time.perf_counter()
            dist.barrier()
            self.seconds += time.perf_counter() - t0


def barrier() -> None:
    if active():
        dist.barrier()


def flat_grads(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients in one flat buffer (zeros where a parameter has no gradient)."""
    return parameters_to_vector(
        p.grad if p.grad is not None else torch.zeros_like(p) for p in params
    )


def set_grads(params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Give each parameter its slice of ``flat`` as its gradient (copies)."""
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad = g.view_as(p).clone()


def average_gradients(params: list[torch.nn.Parameter], contributes: bool, clock: WaitClock) -> int:
    """Replace each rank's gradients by the mean over the ranks that computed one this step.

    A rank without a batch this step (the last step of an uneven split) passes
    ``contributes=False``: it sends zeros and is not counted, so the result is the gradient of
    the mean of the contributing ranks' mean losses. Returns how many ranks contributed.
    """
    device = params[0].device
    flat = (
        flat_grads(params)
        if contributes
        else torch.zeros(sum(p.numel() for p in params), device=device)
    )
    buf = torch.cat([flat, torch.ones(1, device=device) * float(contributes)])
    clock.all_reduce(buf)
    count = int(round(float(buf[-1])))
    if count > 0:
        set_grads(params, buf[:-1] / count)
    return count


def sum_gradients(
    params: list[torch.nn.Parameter], group: dist.ProcessGroup | None, clock: WaitClock
) -> None:
    """Sum each gradient over ``group`` (hybrid: the same stage of every pipeline copy)."""
    if not params or not active(group):
        return
    flat = flat_grads(params)
    clock.all_reduce(flat, group)
    set_grads(params, flat)


def broadcast_parameters(module: torch.nn.Module, src: int = 0) -> None:
    """Make every rank start from rank ``src``'s parameters and buffers (one flat broadcast)."""
    tensors = list(module.parameters()) + list(module.buffers())
    if not active() or not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    dist.broadcast(flat, src)
    with torch.no_grad():
        for t, v in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(v.view_as(t).to(t.dtype))


def all_gather_flat(flat: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's same-shaped 1-D tensor, on every rank (one all_gather)."""
    if not active():
        return [flat]
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s (small, picklable) object on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src)
    return box[0]


def gather_to_all(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (pickled; small objects only)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
