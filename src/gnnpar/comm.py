"""Collective helpers shared by the data-parallel strategies (timed, flat-buffer, gather-to-rank-0).

Every helper is a thin layer over torch.distributed: one flat buffer per collective (one call
instead of one per parameter), the seconds spent blocked in it added to a :class:`WaitClock`
(what ``per_worker_wait_s`` reports), and a single-process fallback so strategies run unchanged
with one rank. Timeouts are the process group's (``--timeout``): a peer that never arrives turns
into an error, not a hang.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclass
class WaitClock:
    """Seconds a rank spent blocked in collectives, and how many it took part in."""

    seconds: float = 0.0
    calls: int = 0

    def all_reduce(self, tensor: torch.Tensor, op: Any = None) -> torch.Tensor:
        """In-place all-reduce (SUM by default) of ``tensor``, timed; a no-op on one rank."""
        if active():
            t0 = time.perf_counter()
            dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM)
            self.seconds += time.perf_counter() - t0
        self.calls += 1
        return tensor

    def barrier(self) -> None:
        if active():
            t0 = time.perf_counter()
            dist.barrier()
            self.seconds += time.perf_counter() - t0


def flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients in one flat buffer (zeros where a parameter has no gradient)."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def set_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


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


def broadcast_parameters(module: torch.nn.Module, src: int = 0) -> None:
    """Make every rank start from rank ``src``'s parameters and buffers (one flat broadcast)."""
    if not active():
        return
    tensors = [t for t in list(module.parameters()) + list(module.buffers())]
    if not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    dist.broadcast(flat, src)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n


def average_parameters(params: Iterable[torch.nn.Parameter], clock: WaitClock) -> None:
    """Replace parameters by their mean over all ranks (torch's model-averaging utility)."""
    from torch.distributed.algorithms.model_averaging import utils as averaging

    if active():
        t0 = time.perf_counter()
        averaging.average_parameters(iter(list(params)), dist.group.WORLD)
        clock.seconds += time.perf_counter() - t0
    clock.calls += 1


def relative_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all tensors together: how far a rank's model is from another
    (e.g. from the average of all ranks' models: 0 when the ranks agree)."""
    diff = sum(
        float((x.detach().double() - y.detach().double()).pow(2).sum()) for x, y in zip(a, b)
    )
    norm = sum(float(y.detach().double().pow(2).sum()) for y in b)
    return (diff / norm) ** 0.5 if norm > 0 else 0.0


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


class PeerTimeoutError(RuntimeError):
    """Another rank did not reach a point this rank waits for within --timeout."""


def default_store():
    """The process group's key-value store (TCPStore across machines); a private one alone."""
    return dist.distributed_c10d._get_default_store() if active() else dist.HashStore()


def wait_for_key(store, key: str, timeout_s: float, what: str) -> None:
    """Wait until another rank sets ``key`` in ``store``; after ``timeout_s`` a clear error."""
    import datetime

    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:  # "Wait timeout" / "Socket Timeout" / "Connection reset"
        cause = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise PeerTimeoutError(
            f"{what} did not happen within --timeout {timeout_s:g} s ({cause}): that rank "
            "crashed, stalled, or needs longer than the timeout allows; check its log, or "
            "raise --timeout."
        ) from None


def gather_to_all(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (pickled; small objects only)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def max_over_ranks(value: float) -> float:
    if not active():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)
