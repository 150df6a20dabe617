"""Which feature rows a neighbour-sampled batch reaches: the expected visits of every node per
batch, computed from the CSR alone (no sampling run), for the feature cache to hold the rows
with the most (:func:`gnnpar.data.prepared.hot_rows`, and the remote-row cache across shards,
:meth:`gnnpar.data.sampling.distributed.ShardSampler.cache_hot_rows`).

The sampler (:mod:`gnnpar.data.sampling.sampler`) draws, at hop ``k`` with fan-out ``f_k``, for
each frontier node ``t`` a uniform subset of ``min(f_k, deg(t))`` of its in-neighbours (CSR row
``t``: the sources), without replacement, so each in-neighbour ``u`` is drawn with probability
``min(1, f_k / deg(t))`` (1 for ``f_k = -1``). A batch's seeds are ``batch`` of the ``|train|``
training nodes, so::

    v_0[t]     = min(batch, |train|) / |train|          (t a training node, else 0)
    s_k[t]     = v_k[t] * min(1, f_k / deg(t))             (what t sends along each in-edge)
    v_{k+1}[u] = sum over edges u -> t of s_k[t]
                 - s_{k-1}[u] * sum over edges u -> t of min(1, f_k / deg(t))   (see below)
    score[u]   = v_0[u] + v_1[u] + ... + v_L[u]         (L = len(fanouts))

``score`` is an upper estimate of the expected number of times a batch gathers ``u``'s row (the
sampler expands only the nodes first reached at a hop, and gathers each node once): on graphs
where ~1% of nodes are training nodes (papers100M) it follows the training nodes' 1-3 hop
neighbourhoods, which a degree ranking ignores. Cf. the pre-sampling of GNNLab (Yang et al.,
EuroSys'22) and the static cache of PaGraph (Lin et al., SoCC'20), which measure or rank by
degree instead of computing the expectation.

Bounded memory and exact: one pass over ``indices`` per hop, a block of rows at a time (O(nodes)
floats, never an array over the edges). Visits are counted in fixed point (units of
``2**-s`` visits, ``s`` chosen so the largest possible score stays below ``2**52``): every
contribution is rounded down to whole units per target node, so every sum is of integers held
exactly in float64, and the scores are bit for bit the same for any block size, any order, and
summed across shards.

On an undirected graph the walk above goes straight back: a seed's neighbour draws the seed
again at the next hop, which the sampler neither gathers nor expands twice. Counted, it ranks
the training nodes' small neighbourhoods far too high (on synthetic-papers100m 0.02, a cache
so ranked served fewer rows than one of the highest degrees); the non-backtracking walk's
correction (subtracting, per hop, what came back along the edge it went out on) fixes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

CHUNK_EDGES = 8 << 20  # edges of one block: ~100 MB of temporaries (ids, weights, a mask)


def visit_unit(batch_size: int, fanouts: list[int], max_degree: int) -> float:
    """Units per visit: the largest power of two that keeps the largest possible score (every
    hop's total mass, ``batch`` times the product of the fan-outs so far, summed) below 2**52,
    so sums of whole units are exact in float64."""
    mass, bound = float(batch_size), float(batch_size)
    for f in fanouts:
        mass *= max(1, max_degree if f < 0 else min(f, max(1, max_degree)))
        bound += mass
    return 2.0 ** min(40, 52 - math.ceil(math.log2(max(2.0, bound))))


def _draw_share(deg: np.ndarray, fanout: int) -> np.ndarray:
    """Probability that a node of in-degree ``deg`` draws a given in-neighbour at fan-out
    ``fanout`` (without replacement)."""
    if fanout < 0:
        return np.ones(deg.shape)
    return fanout / np.maximum(deg, max(fanout, 1)).astype(np.float64)


def expected_visits(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds: np.ndarray,
    fanouts: list[int],
    batch_size: int,
    num_nodes: int | None = None,
    first: int = 0,
    reduce: Callable[[np.ndarray], np.ndarray] | None = None,
    max_degree: int | None = None,
    symmetric: bool = False,
    chunk_edges: int = CHUNK_EDGES,
    compiled: bool = True,
) -> np.ndarray:
    """Every node's expected visits per batch (the module's ``score``), float64 [num_nodes], in
    units of :func:`visit_unit` (only the ranking matters).

    ``indptr``/``indices``: in-edge CSR rows ``first .. first + len(indptr) - 2`` (the whole
    graph, or a shard's rows with global source ids); ``seeds``: every training node of the
    graph (global ids, on every shard). ``symmetric``: the CSR holds every edge both ways (an
    undirected graph), so the walk's way straight back is known and left out (see
    :func:`_propagate`). ``reduce``: sums an array over the shards (an all-reduce; every shard
    calls it the same number of times, and ``max_degree`` must be the whole graph's).
    ``compiled``: each hop in the sampler's compiled kernel where it is built (one pass over
    the rows, ~30x faster than numpy's blocks at papers100M's scale; the same bits). Memory:
    five float64 arrays of ``num_nodes`` and, in numpy, a block's temporaries."""
    n = int(num_nodes if num_nodes is not None else len(indptr) - 1)
    rows = len(indptr) - 1
    ptr = np.asarray(indptr)
    if max_degree is None:
        max_degree = int(np.diff(np.asarray(ptr, dtype=np.int64)).max()) if rows else 0
    unit = visit_unit(batch_size, fanouts, max_degree)
    v = np.zeros(n, dtype=np.float64)
    seeds = np.asarray(seeds, dtype=np.int64)
    if len(seeds):
        v[seeds] = math.floor(unit * min(batch_size, len(seeds)) / len(seeds))
    score = v.copy()
    # block boundaries: rows where the edge count crosses a multiple of chunk_edges
    edges = int(ptr[-1] - ptr[0]) if rows else 0
    marks = np.arange(int(ptr[0]), int(ptr[0]) + edges, max(1, chunk_edges), dtype=np.int64)
    cut = np.unique(np.concatenate([np.searchsorted(ptr, marks, "right") - 1, [0, rows]]))
    blocks = list(zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True))
    sent = None  # per edge, what each of this shard's nodes sent its in-neighbours last hop
    for fanout in fanouts:
        back = sent is not None and symmetric
        hop = _compiled_hop if compiled and _kernel_takes(ptr, indices) else _propagate
        nxt, went, share = hop(ptr, indices, v, first, fanout, blocks, n, back)
        if back:  # v_{k+1}[u] -= sent[u] * sum of its neighbours' draw shares
            share = reduce(share) if reduce is not None else share
            own = slice(first, first + rows)
            nxt[own] -= np.floor(sent[own] * (share[own] / SHARE_UNIT))
            del share
        nxt = reduce(nxt) if reduce is not None else nxt
        np.maximum(nxt, 0, out=nxt)
        sent = went
        score += nxt
        v = nxt
    return score


SHARE_UNIT = 2.0**24  # draw probabilities in whole units of 2**-24: exact sums


def _kernel_takes(ptr: np.ndarray, indices: np.ndarray):  # noqa: ANN202
    """The compiled kernel where it is built and takes these arrays (contiguous int64 row
    starts, int32 or int64 sources), else None."""
    from gnnpar.data.sampling import kernel

    lib = kernel.load()
    if lib is None or not hasattr(lib, "gnnpar_visit_hop"):
        return None
    ok_ptr = ptr.dtype == np.int64 and ptr.flags.c_contiguous
    ok_idx = indices.dtype in (np.int32, np.int64) and indices.flags.c_contiguous
    return lib if ok_ptr and ok_idx else None


def _compiled_hop(
    ptr: np.ndarray,
    indices: np.ndarray,
    v: np.ndarray,
    first: int,
    fanout: int,
    blocks: list[tuple[int, int]],
    n: int,
    back: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`_propagate` in the compiled kernel (``gnnpar_visit_hop``): one pass over the rows,
    no block temporaries, the same bits."""
    lib = _kernel_takes(ptr, indices)
    rows = len(ptr) - 1
    nxt = np.zeros(n, dtype=np.float64)
    went = np.zeros(n, dtype=np.float64)
    share = np.zeros(n, dtype=np.float64) if back else None
    here = np.ascontiguousarray(v[first : first + rows])
    out = went[first : first + rows]
    lib.gnnpar_visit_hop(
        ptr.ctypes.data, indices.ctypes.data, int(indices.dtype == np.int32), rows,
        here.ctypes.data, fanout, SHARE_UNIT, nxt.ctypes.data, out.ctypes.data,
        share.ctypes.data if share is not None else None,
    )  # fmt: skip
    return nxt, went, share


def _propagate(
    ptr: np.ndarray,
    indices: np.ndarray,
    v: np.ndarray,
    first: int,
    fanout: int,
    blocks: list[tuple[int, int]],
    n: int,
    back: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One hop over this shard's rows, a block at a time: ``nxt[u]``, the mass its targets send
    ``u`` (each target ``t`` sends ``floor(v[t] * min(1, f / deg t))`` along each in-edge);
    ``went[t]``, that per-edge mass (global length, this shard's rows set); and with ``back``,
    ``share[u]``, the sum over the targets ``t`` that draw ``u`` of their draw probability (in
    :data:`SHARE_UNIT`). On a symmetric CSR, what ``u`` sent ``t`` at the hop before comes back
    to ``u`` with ``t``'s draw probability: the sampler never gathers or expands a node twice,
    so that way back (``went[u] * share[u]``, the non-backtracking walk's correction) is no
    visit. Without it a training node's few neighbours score as if visited again and again."""
    nxt = np.zeros(n, dtype=np.float64)
    went = np.zeros(n, dtype=np.float64)
    share = np.zeros(n, dtype=np.float64) if back else None
    for a, b in blocks:
        bounds = np.asarray(ptr[a : b + 1], dtype=np.int64)
        deg = np.diff(bounds)
        w = v[first + a : first + b]
        live = w > 0
        if share is None and not live.any():
            continue
        p = _draw_share(deg, fanout)
        w = np.floor(w * p)  # whole units per target: exact sums
        went[first + a : first + b] = w
        ids = np.asarray(indices[bounds[0] : bounds[-1]])
        if share is not None:
            np.add.at(share, ids, np.repeat(np.floor(p * SHARE_UNIT), deg))
        live = w > 0
        if live.mean() < 0.5:  # a sparse frontier: only the edges of its nodes
            ids = ids[np.repeat(live, deg)]
            w, deg = w[live], deg[live]
        np.add.at(nxt, ids, np.repeat(w, deg))
        del ids
    return nxt, went, share


def top_rows(score: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` nodes of highest ``score``, ties to the lower id, in ascending id order: O(n),
    the same nodes whatever the order ``np.partition`` leaves them in."""
    n = len(score)
    k = max(0, min(int(k), n))
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if k == n:
        return np.arange(n, dtype=np.int64)
    kth = np.partition(score, n - k)[n - k]  # the k-th largest value
    above = np.flatnonzero(score > kth)
    ties = np.flatnonzero(score == kth)[: k - len(above)]  # the lowest ids of the ties
    return np.sort(np.concatenate([above, ties])).astype(np.int64)
