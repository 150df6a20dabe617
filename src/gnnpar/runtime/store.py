"""Bounded waits on the key-value store that a run's ranks share (:attr:`DistContext.store`)."""

from __future__ import annotations

import datetime

import torch.distributed as dist


class PeerTimeoutError(RuntimeError):
    """Another rank did not reach a point this rank waits for within --timeout."""


def wait_for_key(store: dist.Store, key: str, timeout_s: float, what: str) -> None:
    """Wait until another rank sets ``key`` in ``store``; after ``timeout_s`` a clear error."""
    try:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:  # "Wait timeout" / "Socket Timeout" / "Connection reset"
        cause = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise PeerTimeoutError(
            f"{what} did not happen within --timeout {timeout_s:g} s ({cause}): that rank "
            "crashed, stalled, or needs longer than the timeout allows; check its log, or "
            "raise --timeout."
        ) from None
