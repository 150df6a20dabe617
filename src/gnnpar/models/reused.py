"""One memory block that a layer writes the same large tensor into at every training step.

A neighbour-sampled step allocates a few tensors of ~a batch's size that live from the forward
to the backward (GraphSAGE's first layer: its destination rows' features and their mean over
neighbours, [n_dst, features] each, 0.26 GB apiece on synthetic-reddit with fan-outs 15-10-5
and batch 1024). Their row counts differ a little from step to step, so in glibc's heap (where
:func:`gnnpar.runtime.allocator.reuse_large_blocks` keeps them, to spare the page faults of
fresh memory) a block freed by one step is often just too small for the next step's, which goes
on top: the heap grows and keeps its holes in memory (reddit-1: 0.66 GB of free heap at the
step's peak, beside 0.78 GB in use). :class:`ReusedRows` keeps one block per tensor instead,
outside the heap and a little larger than the largest asked for, and hands out a view of it
when nothing still reads the previous one; otherwise (a tensor still saved for a backward, as
between micro-batches of a pipeline) a fresh tensor, so a view in use is never written over.
Which memory a tensor sits in changes no value.

    rows = ReusedRows()
    t = rows.take(n, m)      # [n, m] float32: a view of the block, or a new tensor
"""

from __future__ import annotations

import mmap
import weakref

import numpy as np
import torch

# room above the rows asked for, so that the next steps' slightly larger tensors fit
HEADROOM = 1 / 16


class ReusedRows:
    """A float32 block for one tensor of a layer, reused by every step that finds it free.

    Whether the last view handed out is still in use is known from a numpy view that the
    tensor's storage holds (``torch.from_numpy``): it lives exactly as long as any tensor that
    shares that storage (views, and what autograd saved), and a weak reference tells when it
    is gone. The block is a private anonymous map (never in the heap, so it does not split the
    heap's free blocks); :meth:`release` drops it (the memory goes back once no view is left).
    Copies of a module that holds one (``copy.deepcopy``, pickling) get an empty one."""

    def __init__(self) -> None:
        self._block: np.ndarray | None = None
        self._lent: weakref.ref | None = None

    def take(self, rows: int, cols: int) -> torch.Tensor:
        """An uninitialised float32 [rows, cols] tensor."""
        need = rows * cols
        if self._lent is not None and self._lent() is not None:
            return torch.empty(rows, cols)  # the last one is still read: leave it alone
        if self._block is None or self._block.size < need:
            self._block = None  # the old map goes before the new one is made
            size = max(1, int(need * (1 + HEADROOM)))
            self._block = np.frombuffer(mmap.mmap(-1, size * 4), dtype=np.float32)
        view = self._block[:need].reshape(rows, cols)
        self._lent = weakref.ref(view)
        return torch.from_numpy(view)

    @property
    def held_bytes(self) -> int:
        return 0 if self._block is None else self._block.nbytes

    def release(self) -> None:
        self._block, self._lent = None, None

    def __deepcopy__(self, memo: dict) -> ReusedRows:
        return ReusedRows()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
