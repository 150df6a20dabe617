"""What two paired ranks do: swap a flat copy of their tensors and keep the average.

Pairwise gossip (Boyd et al. 2006; study 003 section 4.3.4): ``x_i <- x_j <- (x_i + x_j) / 2``,
applied to gradients (the study's GossipGCN) or to parameters (``--average params``). The study
mimics point-to-point NCCL with a two-rank subgroup all-reduce; torch.distributed has real
point-to-point now, so each side posts one ``isend`` and one ``irecv`` (no
``batch_isend_irecv``, which is reported to hang on gloo) and waits on both with a timeout: a
partner that crashed or stalled becomes :class:`GossipTimeoutError`, never a hang.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist


class GossipTimeoutError(RuntimeError):
    """A gossip partner did not complete an exchange in time (crashed, stalled or far too slow)."""


def exchange_average(
    tensors: list[torch.Tensor], partner: int, timeout_s: float, what: str = "exchange"
) -> float:
    """Average ``tensors`` in place with the same-shaped tensors of rank ``partner``.

    Both ranks must call this for the same exchange. Returns the seconds spent (waiting for the
    partner and moving the data).
    """
    t0 = time.perf_counter()
    mine = torch.cat([t.detach().reshape(-1) for t in tensors])
    theirs = torch.empty_like(mine)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        sent = dist.isend(mine, partner)
        got = dist.irecv(theirs, partner)
        got.wait(timeout=timeout)
        sent.wait(timeout=timeout)
    except RuntimeError as e:  # gloo: "Timed out waiting", "Connection closed by peer", ...
        waited = time.perf_counter() - t0
        cause = str(e).splitlines()[0][:300]
        raise GossipTimeoutError(
            f"gossip partner rank {partner} did not complete {what} within --timeout "
            f"{timeout_s:g} s (gave up after {waited:.1f} s: {cause}). The partner crashed, "
            "stalled, or is slower than the timeout allows: check its log, or raise --timeout."
        ) from None
    mine.add_(theirs).mul_(0.5)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(mine[offset : offset + n].view_as(t))
            offset += n
    return time.perf_counter() - t0
