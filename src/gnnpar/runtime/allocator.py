"""Give the memory freed by training back to the system before a rank evaluates or waits.

PyTorch allocates CPU tensors with ``malloc``. glibc serves blocks below its mmap threshold
(which rises to 32 MiB as large blocks are freed) from the heap, and keeps freed heap memory in
the process for reuse: after the training steps, a rank holds its last steps' activations'
worth of free heap (~0.15 GiB per rank of a 1M-edge user graph; BENCHMARKS.md). Before the
full-graph evaluation, and while the other ranks wait for rank 0's final one, that memory is
dead weight: :func:`release_free_memory` returns it (``malloc_trim(0)``, which gives back every
free page of the heap, not only its top). It costs a walk over the heap (milliseconds) and
changes no number. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():  # noqa: ANN202
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the heap's free pages to the system; True when there were some to return."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


@functools.cache
def _mallopt():  # noqa: ANN202
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def reuse_large_blocks(limit_bytes: int = 512 << 20) -> bool:
    """Serve blocks up to ``limit_bytes`` from the heap and keep freed heap memory for reuse.

    glibc maps every block above its mmap threshold (at most 32 MiB) freshly and unmaps it when
    freed; a neighbour-sampled step allocates several such tensors (the batch's features,
    ~56 MiB at synthetic-reddit 0.1, the first layer's aggregate and outputs), so each step
    the kernel zero-fills those pages again: ~15,000 page faults and ~0.4 s of a ~1.1 s step on
    one core (BENCHMARKS.md, issue 21). With both thresholds set, the same heap memory serves
    every step. The process keeps its step's peak until :func:`release_free_memory`, which the
    loop calls before evaluating. A user's own ``MALLOC_MMAP_THRESHOLD_`` /
    ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES`` wins; elsewhere than glibc this does
    nothing. Returns whether the thresholds were set.
    """
    import os

    if not 0 < limit_bytes < 1 << 30:  # mallopt takes an int: 2 * limit must fit
        raise ValueError(f"limit_bytes must be in (0, 1 GiB), got {limit_bytes}")
    own = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
    mallopt = _mallopt()
    if mallopt is None or any(k in os.environ for k in own):
        return False
    # the trim threshold above the mmap one, so freeing a step's blocks never shrinks the heap
    return bool(mallopt(M_MMAP_THRESHOLD, limit_bytes)) and bool(
        mallopt(M_TRIM_THRESHOLD, 2 * limit_bytes)
    )


def heap_block_limit(most: int = 512 << 20) -> int:
    """The ``limit_bytes`` of :func:`reuse_large_blocks` for a run inside a memory limit (a
    cgroup's, or ``GNNPAR_MEMORY_LIMIT``): a 32nd of what it may still use, at least 1 MiB and
    at most ``most``; ``most`` without a limit. Kept freed blocks are memory the run's other
    allocations cannot always reuse (a block's hole fits only what is no larger): in a
    0.73 GiB cgroup, 512 MiB of them grew a rank's sampled evaluation by 0.19 GB."""
    from gnnpar.runtime.resources import available_memory

    mem = available_memory()
    if mem is None or mem.limit is None:
        return most
    return max(1 << 20, min(most, mem.free // 32))
