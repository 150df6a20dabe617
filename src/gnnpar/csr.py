"""Compressed sparse rows: the one helper torch CSRs in gnnpar are built with (data/partition.py
builds its CSRs with scipy's compiled kernels instead: they sort less).

A leaf beside the packages, not inside one, because layers at every height use it: the models
(GAT's sparse inputs), the data (the neighbour sampler's graph) and training (evaluation), and a
model must not import the data layer above it. It imports torch only."""

from __future__ import annotations

import torch


def indptr(rows: torch.Tensor, size: int) -> torch.Tensor:
    """Row offsets of a row-sorted entry list: entries of row ``i`` are ``ptr[i]:ptr[i + 1]``.

    ``rows`` holds each entry's row in ``[0, size)`` (sorted or not: only the counts matter).
    """
    ptr = torch.zeros(size + 1, dtype=torch.long, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=size), 0, out=ptr[1:])
    return ptr
