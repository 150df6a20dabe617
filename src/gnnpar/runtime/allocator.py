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
