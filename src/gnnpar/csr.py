"""Compressed sparse rows: the one helper torch CSRs in gnnpar are built with (data/partition.py
builds its CSRs with scipy's compiled kernels instead: they sort less).

A leaf beside the packages, not inside one, because layers at every height use it: the models
(GAT's sparse inputs), the data (the neighbour sampler's graph) and training (evaluation), and a
model must not import the data layer above it. It imports torch only."""

from __future__ import annotations

import weakref

import torch


def indptr(rows: torch.Tensor, size: int) -> torch.Tensor:
    """Row offsets of a row-sorted entry list: entries of row ``i`` are ``ptr[i]:ptr[i + 1]``.

    ``rows`` holds each entry's row in ``[0, size)`` (sorted or not: only the counts matter).
    """
    ptr = torch.zeros(size + 1, dtype=torch.long, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=size), 0, out=ptr[1:])
    return ptr


# ------------------------------------------------------------------- rows gathered from a matrix
# id(sub) -> (weak reference to sub, sub's version, whole, whole's version, index)
_origins: dict[int, tuple[weakref.ref, int, torch.Tensor, int, torch.Tensor]] = {}


def mark_rows(sub: torch.Tensor, whole: torch.Tensor, index: torch.Tensor) -> None:
    """Record that ``sub`` holds the rows ``index`` of ``whole`` (``sub == whole[index]``), for
    as long as ``sub`` lives and neither is changed in place (:func:`rows_origin`).

    A neighbour-sampled batch's features are such rows, a new tensor every step: a model that
    derives something costly from its input and from the whole matrix alike (GAT's and GCN's
    CSR plan of bag-of-words features, ``models/gat.py``) then gathers the batch's part of the
    whole matrix's, made once, instead of examining every element of the batch again."""
    key = id(sub)

    def forget(ref: weakref.ref) -> None:  # sub died: drop its entry (and whole, index) now
        entry = _origins.get(key)
        if entry is not None and entry[0] is ref:
            del _origins[key]

    _origins[key] = (weakref.ref(sub, forget), sub._version, whole, whole._version, index)


def rows_origin(sub: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(whole, index)`` when :func:`mark_rows` recorded ``sub == whole[index]`` and neither
    tensor was changed since; otherwise None."""
    entry = _origins.get(id(sub))
    if entry is None or entry[0]() is not sub or entry[1] != sub._version:
        return None
    whole, index = entry[2], entry[4]
    return (whole, index) if whole._version == entry[3] else None
