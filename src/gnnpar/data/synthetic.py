"""Generated stand-ins for Reddit, AmazonProducts and CIFAR-10, for machines without the files.

``synthetic-reddit`` and ``synthetic-amazon`` are degree-corrected stochastic block models
(Karrer & Newman 2011) whose blocks are the classes, with label-correlated Gaussian features. At
scale 1 they have the sizes of study 003, table 3.1:

=====================  ===========  ========  =====  =============  ============================
dataset                nodes        features  class  edge_index     split train/val/test
=====================  ===========  ========  =====  =============  ============================
synthetic-reddit       232,965      602       41 s   114,848,856    0.66 / 0.10 / 0.24
synthetic-amazon       1,598,960    200       107 m  132,169,734    0.80 / 0.10 / 0.10
synthetic-papers100m   111,059,956  128       172 s  1,615,685,872  0.01087 / 0.001128 / 0.00193
=====================  ===========  ========  =====  =============  ============================

Edge counts are ``edge_index`` columns of a symmetric graph without self-loops or duplicates, so
the count is even (table 3.1's Reddit figure, 114,848,857, is PyG's 114,615,892 edges plus one
self-loop per node; its Amazon figure is GraphSAINT's undirected count, which we use here as the
number of columns, as the table does for Reddit).

``synthetic-papers100m`` has the shape of OGB's ogbn-papers100M (Hu et al. 2020): its nodes,
feature width, classes and split sizes (1,207,179 / 125,265 / 214,338 labelled nodes; the other
98.6% are in no split, as there), and as many ``edge_index`` columns as papers100M has directed
citations (1,615,685,872: mean degree 14.5 columns per node; a symmetrised papers100M has twice
as many). Its homophily is ogbn-arxiv's edge homophily (0.65; arXiv's papers are a subset of
the same MAG citation graph) and its degrees are as heterogeneous as Amazon's. It exists to be
generated at a small ``--scale`` (0.01: 1.1M nodes, 16M columns, 12,072 training nodes) as a
stand-in that ``gnnpar advise`` profiles; at full size its prepared folder holds ~57 GB of fp32
features (28 GB in fp16) and ~7 GB of CSR, which ``gnnpar prepare`` writes in bounded memory.

How labels become learnable: a fraction ``homophily`` of the edges join two nodes of the same
block (class; for Amazon the node's primary class), the rest join nodes drawn from the whole
graph, and every feature vector is a class centroid (the mean of the centroids of all its labels
for Amazon) plus unit Gaussian noise. The centroid separation is chosen so that features alone
classify moderately well and neighbourhood averaging (what a GNN does) classifies clearly better.

**synthetic-reddit** is tuned to score like the real Reddit, at every ``--scale``: GraphSAGE
0.950 micro-F1 and raw features 0.585 in Hamilton et al. 2017 (table 1); Cluster-GCN 0.9655 in
study 003 (table 3.4). Its blocks are the posts' communities; 4.5% of the posts
(``label_noise``) carry the label of another community, which neither their features nor their
neighbours show (a post whose subreddit its text and commenters do not reveal), so no model
scores much above 0.955 however many neighbours it averages: without this, the full graph's
493 neighbours per node average the feature noise away and every model scores 1.0000. The
centroids lie 4 noise s.d. apart in 602 dimensions: knowing the centroids, features alone
classify 72% of the posts (69% of the labels); a model must estimate 41 x 602 means from the
training nodes, so features alone score less on small scales (0.2 at ``--scale 0.01``, 1,538
training nodes). Measured figures: BENCHMARKS.md, "Datasets". A limit: with 75% of
every node's neighbours in its community, the neighbour mean identifies the community without
error from a few dozen neighbours on, so models that train well all land on the ceiling (at
scale 0.1 study 002's sampled GraphSAGE and study 003's Cluster-GCN both score val 0.9549, every
relabelled post wrong and no other); gaps between strategies show only where one trains worse.

synthetic-reddit is generated chunk by chunk, and :func:`stream_reddit` writes it to a prepared
folder that way, the same arrays as the in-memory :func:`generate_reddit`'s in O(nodes) memory
(:func:`reddit_header`, then :func:`reddit_nodes` and :func:`reddit_stubs` per chunk of
``NODE_CHUNK`` node ids): every random draw comes from a ``torch.Generator`` seeded by
(seed, purpose, chunk) (``_stream_seed``), so chunk j needs only the header: O(classes) floats
(centroids) and O(nodes) integers (community, degree weight, edge count per node, the
cumulative weights by community). Normal draws are integer draws looked up in a table of normal
quantiles (``_normals``), degree weights are integers, and the rest is element-wise float32
arithmetic and integer sorting: the same tensors on every x86-64 CPU, at every ATen CPU
capability. The edges: node v draws ``stubs[v]`` neighbours (proportional to its degree weight,
the counts summing to the recipe's edge count exactly), each in its own community with
probability ``homophily`` and anywhere otherwise, drawn by degree weight; the union of all
chunks' draws is made symmetric, sorted and deduplicated (a merge over chunks), the pairs lost as
repeats or loops are drawn again (``_TOPUP`` streams, sources by weight over the whole graph),
and a random surplus is dropped, so the count is exact.

An Amazon node has its primary class and each of three related classes ``(b + k) % 107`` with
probability 0.8 (3.4 labels on average). Like the real AmazonProducts, it needs a few dozen
optimiser steps to leave the "every label off" plateau of BCE: full-batch ``sage`` scores ~0
micro-F1 after 30 epochs (30 steps), Cluster-GCN (``--partitions 20``, as study 003 trains)
scores 0.75 after 5 epochs at ``--scale 0.01``.

``--scale F`` keeps the average degree and shrinks nodes and edges by F, except where a class
block would become too small to hold that degree: the degree is capped so that on average at
most 25% of the pairs inside a block are edges (at F = 0.01, Reddit gets 2,330 nodes and average
degree ~18 instead of 493). Cost per node, and so compute per node against gradient size, stays
that of the full graph as long as it can.

``synthetic-cifar10``: 3x32x32 uint8 images of 10 classes; a class is a colour tint plus an
oriented sinusoidal grating (class-specific angle and frequency) at a random phase, under strong
pixel noise, so a convolution or a graph over pixels sees the class, a pixel-wise linear model
barely. 60,000 images at scale 1 (50,000 train incl. 5,000 val, 10,000 test).

Every generator is vectorised over nodes/edges/images and draws all its randomness from the
seed (same seed, same tensors). ``synthetic-reddit`` draws from per-chunk seeded
``torch.Generator`` streams (above), ``synthetic-cifar10`` from one, in memory.
``synthetic-amazon`` and ``synthetic-papers100m`` come from
a stream (:func:`stream_graph`, version ``sbm-stream-1``: the same model, its own draws) that
writes a prepared folder chunk by chunk in memory O(nodes) (~14 bytes a node) plus fixed
buffers, whatever the edge count and feature bytes: ``gnnpar prepare`` writes it straight to
disk, and ``--dataset synthetic-amazon`` reads the same graph back into memory, so a run from the
prepared folder and the in-memory run train the same graph. (The in-memory sampler of the
earlier ``sbm-2`` version deduplicated every edge at once: 13 GB at papers100m's scale 0.02.)

Run: ``gnnpar train --dataset synthetic-reddit --scale 0.01 --model sage --epochs 5``.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

# Bump when generation changes: cached entries with another version are regenerated.
VERSION = "sbm-3"  # sbm-3: synthetic-reddit chunked, with a ceiling (label noise)
CIFAR_VERSION = "cifar-1"


@dataclass(frozen=True)
class GraphRecipe:
    name: str
    num_nodes: int
    num_features: int
    num_classes: int
    num_edges: int  # edge_index columns at scale 1 (symmetric: twice the undirected edges)
    multilabel: bool
    split: tuple[float, float, float]
    homophily: float  # fraction of edges inside a class block
    separation: float  # distance between class centroids, in units of the noise s.d.
    degree_sigma: float  # s.d. of the log-normal degree propensities (degree heterogeneity)
    label_noise: float = 0.0  # fraction of nodes whose label is not their block (reddit only)


REDDIT = GraphRecipe(
    "synthetic-reddit",
    232_965,
    602,
    41,
    114_848_857,
    False,
    (0.66, 0.10, 0.24),
    0.75,
    4.0,
    0.6,
    0.045,
)
AMAZON = GraphRecipe(
    "synthetic-amazon", 1_598_960, 200, 107, 132_169_734, True, (0.80, 0.10, 0.10), 0.7, 6.0, 1.0
)
PAPERS100M = GraphRecipe(
    "synthetic-papers100m",
    111_059_956,
    128,
    172,
    1_615_685_872,
    False,
    (0.01087, 0.001128, 0.00193),
    0.65,
    3.0,
    1.0,
)
RECIPES = {r.name: r for r in (REDDIT, AMAZON, PAPERS100M)}

MAX_BLOCK_DENSITY = 0.25  # cap on the mean fraction of within-block pairs that are edges
AMAZON_RELATED = (1, 7, 31)  # extra labels of a node with primary class b: (b + k) % C
AMAZON_RELATED_P = 0.8  # each with this probability


def graph_size(r: GraphRecipe, scale: float) -> tuple[int, int]:
    """(nodes, undirected edges) at ``scale``: nodes x scale, average degree kept where it fits."""
    n = max(round(r.num_nodes * scale), 4 * r.num_classes)
    degree = r.num_edges / r.num_nodes
    block = n / r.num_classes
    degree = min(degree, MAX_BLOCK_DENSITY * block / r.homophily)
    return n, int(round(n * degree)) // 2


def _block_sizes(n: int, c: int, g: torch.Generator) -> torch.Tensor:
    """Mildly unequal class sizes (Dirichlet-like weights), every class non-empty, summing to n."""
    w = torch.empty(c, dtype=torch.float64).exponential_(generator=g) + 1.0
    sizes = torch.floor(w / w.sum() * (n - c)).long() + 1
    sizes[: n - int(sizes.sum())] += 1
    return sizes


def _sample_edges(
    n: int, m: int, sizes: torch.Tensor, r: GraphRecipe, g: torch.Generator
) -> torch.Tensor:
    """``m`` distinct undirected pairs (keys lo * n + hi) of a degree-corrected SBM over nodes
    0..n-1 laid out block after block (block sizes ``sizes``)."""
    theta = torch.empty(n, dtype=torch.float64).log_normal_(0.0, r.degree_sigma, generator=g)
    cdf = torch.cumsum(theta, 0)
    total = float(cdf[-1])
    ends = torch.cumsum(sizes, 0)
    block_of = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    lo_w = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[ends[:-1] - 1]])
    hi_w = cdf[ends - 1]
    keys = torch.empty(0, dtype=torch.long)
    for _ in range(50):
        need = m - keys.numel()
        if need <= 0:
            break
        k = int(need * 1.1) + 64
        # Endpoints drawn proportionally to theta by inverting the cumulative weights.
        src = torch.searchsorted(cdf, torch.rand(k, dtype=torch.float64, generator=g) * total)
        src.clamp_(max=n - 1)
        u = torch.rand(k, dtype=torch.float64, generator=g)
        inside = torch.rand(k, generator=g) < r.homophily
        b = block_of[src]
        # Inside the source's block: a weight drawn in that block's slice of the cdf.
        u = torch.where(inside, lo_w[b] + u * (hi_w[b] - lo_w[b]), u * total)
        del b, inside
        dst = torch.searchsorted(cdf, u).clamp_(max=n - 1)
        del u
        keep = src != dst
        src, dst = src[keep], dst[keep]
        new = torch.minimum(src, dst) * n + torch.maximum(src, dst)
        del src, dst, keep
        keys = torch.unique(torch.cat([keys, new]))  # sorted, duplicates gone
        del new
    if keys.numel() < m:
        raise RuntimeError(f"SBM sampling produced {keys.numel()} of {m} distinct edges")
    if keys.numel() > m:  # drop a random surplus so the count is exact
        keep = torch.randperm(keys.numel(), generator=g)[:m]
        keys = keys[keep.sort().values]
    return keys


def _split_masks(n: int, split: tuple[float, float, float], g: torch.Generator) -> dict:
    """Disjoint random train / val / test masks of ``split``'s fractions. Fractions that sum to
    1 cover every node (test takes what train and val leave); fractions that sum to less leave
    the rest of the nodes in no split (unlabelled, as most of papers100M's)."""
    perm = torch.randperm(n, generator=g)
    n_train, n_val = round(split[0] * n), round(split[1] * n)
    end = n if sum(split) > 1 - 1e-9 else min(n, n_train + n_val + round(split[2] * n))
    masks = {}
    for name, idx in (
        ("train_mask", perm[:n_train]),
        ("val_mask", perm[n_train : n_train + n_val]),
        ("test_mask", perm[n_train + n_val : end]),
    ):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[idx] = True
        masks[name] = mask
    return masks


def generate_graph(r: GraphRecipe, scale: float, seed: int) -> tuple[dict, dict[str, Any]]:
    """Tensors (x, edge_index, y, masks) and metadata of ``r`` at ``scale``, from ``seed``.
    synthetic-amazon and synthetic-papers100m come from the bounded-memory stream
    (:func:`stream_graph`, read back into memory); synthetic-reddit from its chunked generator
    (:func:`generate_reddit`)."""
    if r.name in STREAMED:
        return streamed_in_memory(r, scale, seed)
    if r.name == REDDIT.name:
        return generate_reddit(r, scale, seed)
    return generate_in_memory(r, scale, seed)


def generate_in_memory(r: GraphRecipe, scale: float, seed: int) -> tuple[dict, dict[str, Any]]:
    """The ``sbm-2`` generator, all in memory: the earlier synthetic-amazon and
    synthetic-papers100m (kept as the baseline of benchmarks/memory/prepared_format.py: it holds
    every edge key at once) and synthetic-reddit before ``sbm-3``."""
    g = torch.Generator().manual_seed(seed)
    n, m = graph_size(r, scale)
    c, f = r.num_classes, r.num_features
    sizes = _block_sizes(n, c, g)
    # Generation works on positions laid out block by block; `perm` maps a position to a node id,
    # so classes are scattered over the id range as in real data.
    perm = torch.randperm(n, generator=g)
    block = torch.repeat_interleave(torch.arange(c), sizes)
    primary = torch.empty(n, dtype=torch.long)
    primary[perm] = block
    del block

    keys = _sample_edges(n, m, sizes, r, g)
    lo, hi = perm[keys // n], perm[keys % n]
    del keys
    # Symmetric edge_index sorted by (row, col), the layout PyG's coalesce produces.
    row = torch.cat([lo, hi])
    col = torch.cat([hi, lo])
    del lo, hi
    order = torch.argsort(row * n + col)
    edge_index = torch.stack([row[order], col[order]])
    del row, col, order

    if r.multilabel:
        y = torch.zeros(n, c, dtype=torch.uint8)
        y[torch.arange(n), primary] = 1
        for k in AMAZON_RELATED:
            on = torch.rand(n, generator=g) < AMAZON_RELATED_P
            y[on.nonzero().view(-1), (primary[on] + k) % c] = 1
    else:
        y = primary

    # Centroids ~ N(0, s^2 I) with s chosen so that two centroids lie `separation` apart.
    centroids = torch.randn(c, f, generator=g) * (r.separation / math.sqrt(2 * f))
    x = torch.empty(n, f, dtype=torch.float32)
    chunk = 1 << 16  # rows per step: bounded temporaries at full size
    for i in range(0, n, chunk):
        sl = slice(i, min(i + chunk, n))
        if r.multilabel:
            yc = y[sl].float()
            mean = yc @ centroids / yc.sum(1, keepdim=True).sqrt()
        else:
            mean = centroids[y[sl]]
        x[sl] = mean + torch.randn(mean.shape, generator=g)
    tensors = {"x": x, "edge_index": edge_index, "y": y, **_split_masks(n, r.split, g)}
    meta = {
        "kind": "graph",
        "name": r.name,
        "num_classes": c,
        "multilabel": r.multilabel,
        "num_nodes": n,
        "num_edges": int(edge_index.size(1)),
        "scale": scale,
        "seed": seed,
    }
    return tensors, meta


# ------------------------------------------------------------------ synthetic-reddit (chunked)
NODE_CHUNK = 1 << 14  # nodes per generation chunk: each chunk has its own random streams
# Streams: one torch.Generator per (seed, purpose, chunk), seeded by _stream_seed.
_HEADER, _THETA, _LABEL, _FEATURES, _EDGES, _TOPUP = range(6)
_MASK64 = (1 << 64) - 1
NORMAL_LEVELS = 1 << 14  # quantisation of the normal draws (|z| <= 3.9; steps ~1.5e-4 near 0)
_THETA_BINS = 8  # degree propensity: the normal draw quantised to 1/8 s.d. (integer weights)
_THETA_CLIP = 4.0  # ... and clipped to +-4 s.d.


def _stream_seed(seed: int, purpose: int, chunk: int = 0) -> int:
    """A 63-bit seed for one stream: splitmix64 of (seed, purpose, chunk) in exact integer
    arithmetic, so every chunk's stream is independent of every other and of the chunking."""
    z = seed * 0x9E3779B97F4A7C15 + purpose * 0xBF58476D1CE4E5B9 + chunk * 0x94D049BB133111EB
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


@functools.cache
def _normal_table() -> torch.Tensor:
    """float32 [NORMAL_LEVELS]: the standard normal's quantiles at (i + 0.5) / NORMAL_LEVELS, from
    Python's float64 arithmetic (statistics.NormalDist), the same on every CPU."""
    half = NORMAL_LEVELS // 2
    inv = statistics.NormalDist().inv_cdf
    upper = torch.tensor([inv((half + i + 0.5) / NORMAL_LEVELS) for i in range(half)])
    return torch.cat([-upper.flip(0), upper]).float()


def _normals(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """float32 standard normals, quantised to NORMAL_LEVELS equally likely values: an integer
    draw and a table look-up. torch.randn is not used here: its float32 kernel takes another
    path (other bits) on CPUs without AVX2 and under ATEN_CPU_CAPABILITY=default."""
    return _normal_table()[torch.randint(0, NORMAL_LEVELS, shape, generator=g)]


def _stream(seed: int, purpose: int, chunk: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(_stream_seed(seed, purpose, chunk))


def _chunks(n: int):
    for j, a in enumerate(range(0, n, NODE_CHUNK)):
        yield j, a, min(a + NODE_CHUNK, n)


@dataclass(frozen=True)
class RedditHeader:
    """What every chunk needs: O(classes) floats and O(nodes) integers, from the header stream
    and the chunks' degree streams. ``block`` is each node's community (the SBM block whose
    centroid its features scatter around and inside which a share ``homophily`` of its edges
    fall); ``order`` lists the nodes community by community; ``cdf`` is the running sum of the
    integer degree weights in that order, so a node is drawn with probability proportional to
    its weight by one search in it."""

    n: int
    m: int
    block: torch.Tensor  # [n] long: community of each node id
    order: torch.Tensor  # [n] long: node ids sorted by community (position -> node)
    starts: torch.Tensor  # [c + 1] long: first position of each community in `order`
    weight: torch.Tensor  # [n] long: degree weight of each node id
    cdf: torch.Tensor  # [n] long: cumulative weights in `order`'s order
    stubs: torch.Tensor  # [n] long: edges each node draws (sum m)
    centroids: torch.Tensor  # [c, f] float32


def _theta_table(sigma: float) -> list[int]:
    """Integer log-normal weights, one per quantised normal draw (bins of 1/_THETA_BINS s.d.)."""
    k = int(_THETA_CLIP * _THETA_BINS)
    return [max(1, round(1024 * math.exp(sigma * (b + 0.5) / _THETA_BINS))) for b in range(-k, k)]


def reddit_weights(r: GraphRecipe, seed: int, lo: int, hi: int) -> torch.Tensor:
    """Integer degree weights of nodes lo..hi-1 (within one chunk): a quantised log-normal."""
    j = lo // NODE_CHUNK
    start = j * NODE_CHUNK
    z = _normals((hi - start,), _stream(seed, _THETA, j))[lo - start :]
    k = int(_THETA_CLIP * _THETA_BINS)
    b = torch.floor(z * _THETA_BINS).long().clamp_(-k, k - 1) + k
    return torch.tensor(_theta_table(r.degree_sigma), dtype=torch.long)[b]


def reddit_header(r: GraphRecipe, scale: float, seed: int) -> RedditHeader:
    n, m = graph_size(r, scale)
    c, f = r.num_classes, r.num_features
    g = _stream(seed, _HEADER)
    sizes = _block_sizes(n, c, g)
    perm = torch.randperm(n, generator=g)  # position (community by community) -> node id
    block = torch.empty(n, dtype=torch.long)
    block[perm] = torch.repeat_interleave(torch.arange(c), sizes)
    centroids = (_normals((c, f), g).double() * (r.separation / math.sqrt(2 * f))).float()
    weight = torch.cat([reddit_weights(r, seed, a, b) for _, a, b in _chunks(n)])
    starts = torch.zeros(c + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(sizes, 0)
    cdf = torch.cumsum(weight[perm], 0)
    # node v draws m * weight_v / total neighbours, rounded so that the counts sum to m exactly
    # (largest remainders first, ties to the lower id): integers only
    quota = weight * m  # < 2^63 here (m < 2^31, weights < 2^21)
    total = int(cdf[-1])
    stubs = quota // total
    rank = torch.sort(quota % total, descending=True, stable=True).indices
    stubs[rank[: m - int(stubs.sum())]] += 1
    return RedditHeader(n, m, block, perm, starts, weight, cdf, stubs, centroids)


def reddit_nodes(
    r: GraphRecipe, h: RedditHeader, seed: int, j: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [k, f] float32, labels [k] long) of chunk j's nodes (ids j*NODE_CHUNK ...)."""
    k = min(NODE_CHUNK, h.n - j * NODE_CHUNK)
    return torch.cat(list(reddit_features(r, h, seed, j, k))), reddit_labels(r, h, seed, j)


def reddit_labels(r: GraphRecipe, h: RedditHeader, seed: int, j: int) -> torch.Tensor:
    """Chunk j's labels: the community, or (share ``label_noise``) any other class."""
    a, b = j * NODE_CHUNK, min((j + 1) * NODE_CHUNK, h.n)
    c = r.num_classes
    z = h.block[a:b]
    g = _stream(seed, _LABEL, j)
    flip = torch.rand(b - a, generator=g) < r.label_noise
    other = (z + torch.randint(1, c, (b - a,), generator=g)) % c  # any class but the block
    return torch.where(flip, other, z)


def reddit_features(r: GraphRecipe, h: RedditHeader, seed: int, j: int, rows: int):
    """Chunk j's features, ``rows`` rows at a time (the draws are serial: any ``rows`` gives
    the same rows)."""
    a, b = j * NODE_CHUNK, min((j + 1) * NODE_CHUNK, h.n)
    g = _stream(seed, _FEATURES, j)
    for first in range(a, b, rows):
        last = min(first + rows, b)
        x = _normals((last - first, r.num_features), g)
        x += h.centroids[h.block[first:last]]
        yield x


def _draw_targets(
    r: GraphRecipe, h: RedditHeader, src: torch.Tensor, g: torch.Generator
) -> torch.Tensor:
    """One neighbour per entry of ``src``: with probability ``homophily`` a node of src's
    community, otherwise any node, either drawn proportionally to the degree weights."""
    k = src.numel()
    inside = torch.rand(k, generator=g) < r.homophily
    u = torch.rand(k, dtype=torch.float64, generator=g)
    return _targets(h, src, inside, u)


def _targets(
    h: RedditHeader, src: torch.Tensor, inside: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """:func:`_draw_targets` from its draws: ``inside`` (bool) and ``u`` (float64), one per
    entry of ``src``."""
    b = h.block[src]
    lo = torch.where(inside, h.starts[b], 0)
    hi = torch.where(inside, h.starts[b + 1], h.n)
    base = torch.where(lo > 0, h.cdf[(lo - 1).clamp(min=0)], 0)
    span = h.cdf[hi - 1] - base
    # floor(u * span) in float64: exact rounding, no reduction, the same on every CPU
    target = base + torch.minimum((u * span.double()).long(), span - 1)
    pos = torch.searchsorted(h.cdf, target, right=True)
    return h.order[pos]


def reddit_stubs(r: GraphRecipe, h: RedditHeader, seed: int, j: int) -> torch.Tensor:
    """Chunk j's edges, as keys lo * n + hi of undirected pairs: node v draws ``stubs[v]``
    neighbours (``_draw_targets``). Pairs drawn twice (here or from another chunk) and loops are
    what :func:`generate_reddit` later tops up."""
    a, b = j * NODE_CHUNK, min((j + 1) * NODE_CHUNK, h.n)
    src = torch.repeat_interleave(torch.arange(a, b), h.stubs[a:b])
    dst = _draw_targets(r, h, src, _stream(seed, _EDGES, j))
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return torch.minimum(src, dst) * h.n + torch.maximum(src, dst)


def _reddit_edges(r: GraphRecipe, h: RedditHeader, seed: int) -> torch.Tensor:
    """m distinct undirected pairs: every chunk's stubs, then top-up rounds (sources drawn by
    weight over the whole graph) for the pairs lost as repeats or loops, then a random surplus
    dropped so the count is exact."""
    n, m = h.n, h.m
    keys = torch.unique(torch.cat([reddit_stubs(r, h, seed, j) for j, _, _ in _chunks(n)]))
    total = int(h.cdf[-1])
    for i in range(1, 51):
        need = m - keys.numel()
        if need <= 0:
            break
        g = _stream(seed, _TOPUP, i)
        k = int(need * 1.1) + 64
        u = torch.rand(k, dtype=torch.float64, generator=g)
        pick = torch.minimum((u * total).long(), torch.tensor(total - 1))
        src = h.order[torch.searchsorted(h.cdf, pick, right=True)]
        dst = _draw_targets(r, h, src, g)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        keys = torch.unique(
            torch.cat([keys, torch.minimum(src, dst) * n + torch.maximum(src, dst)])
        )
    if keys.numel() < m:
        raise RuntimeError(f"SBM sampling produced {keys.numel()} of {m} distinct edges")
    if keys.numel() > m:
        keep = torch.randperm(keys.numel(), generator=_stream(seed, _TOPUP, 0))[:m]
        keys = keys[keep.sort().values]
    return keys


def generate_reddit(r: GraphRecipe, scale: float, seed: int) -> tuple[dict, dict[str, Any]]:
    h = reddit_header(r, scale, seed)
    n = h.n
    x = torch.empty(n, r.num_features, dtype=torch.float32)
    y = torch.empty(n, dtype=torch.long)
    for j, a, b in _chunks(n):
        x[a:b], y[a:b] = reddit_nodes(r, h, seed, j)
    keys = _reddit_edges(r, h, seed)
    lo, hi = keys // n, keys % n
    del keys
    row = torch.cat([lo, hi])
    col = torch.cat([hi, lo])
    del lo, hi
    order = torch.argsort(row * n + col)
    edge_index = torch.stack([row[order], col[order]])
    del row, col, order
    masks = _split_masks(n, r.split, _stream(seed, _HEADER, 1))
    tensors = {"x": x, "edge_index": edge_index, "y": y, **masks}
    meta = {
        "kind": "graph",
        "name": r.name,
        "num_classes": r.num_classes,
        "multilabel": False,
        "num_nodes": n,
        "num_edges": int(edge_index.size(1)),
        "scale": scale,
        "seed": seed,
    }
    return tensors, meta


# ------------------------------------------------------------------------------------ images
CIFAR_TRAIN, CIFAR_VAL, CIFAR_TEST = 45_000, 5_000, 10_000


def cifar_sizes(scale: float) -> tuple[int, int, int]:
    return tuple(max(round(s * scale), 20) for s in (CIFAR_TRAIN, CIFAR_VAL, CIFAR_TEST))


def _images(labels: torch.Tensor, g: torch.Generator, params: dict) -> torch.Tensor:
    """uint8 [N, 3, 32, 32]: tint + oriented grating at a random phase + noise, per class."""
    n = labels.numel()
    out = torch.empty(n, 3, 32, 32, dtype=torch.uint8)
    yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    chunk = 4096
    for i in range(0, n, chunk):
        lab = labels[i : i + chunk]
        b = lab.numel()
        ang, freq = params["angle"][lab], params["freq"][lab]
        phase = torch.rand(b, generator=g) * 2 * math.pi
        proj = xx * torch.cos(ang).view(b, 1, 1) + yy * torch.sin(ang).view(b, 1, 1)
        grating = torch.sin(2 * math.pi * freq.view(b, 1, 1) * proj / 32 + phase.view(b, 1, 1))
        img = 128.0 + 40.0 * grating.unsqueeze(1) * params["gain"][lab].view(b, 3, 1, 1)
        img = img + params["tint"][lab].view(b, 3, 1, 1)
        img = img + 60.0 * torch.randn(b, 3, 32, 32, generator=g)
        out[i : i + b] = img.round().clamp_(0, 255).to(torch.uint8)
    return out


def generate_cifar(scale: float, seed: int) -> tuple[dict, dict[str, Any]]:
    """uint8 images and long labels for train / val / test (balanced classes, shuffled)."""
    g = torch.Generator().manual_seed(seed)
    params = {
        "angle": torch.arange(10) * (math.pi / 10),  # ten distinct orientations
        "freq": torch.tensor([2.0, 3.0, 4.0, 5.0, 2.5, 3.5, 4.5, 2.0, 3.0, 4.0]),
        "gain": 0.5 + torch.rand(10, 3, generator=g),  # per-channel grating strength
        "tint": 25.0 * torch.randn(10, 3, generator=g),
    }
    tensors: dict[str, torch.Tensor] = {}
    for split, size in zip(("train", "val", "test"), cifar_sizes(scale)):
        labels = torch.arange(size) % 10
        labels = labels[torch.randperm(size, generator=g)]
        tensors[f"{split}_x"] = _images(labels, g, params)
        tensors[f"{split}_y"] = labels
    return tensors, {"kind": "image", "name": "synthetic-cifar10", "num_classes": 10}


# ------------------------------------------------------------------ the streamed generator
STREAM_VERSION = "sbm-stream-1"
STREAMED = ("synthetic-amazon", "synthetic-papers100m")  # generated by stream_graph
BATCH = 1 << 20  # candidate pairs per seeded batch (fixed: the graph never depends on memory)
ROWS = 1 << 14  # feature rows per seeded chunk
BUCKET_BYTES = 32 << 20  # mean bytes of one bucket file of pairs
MAX_BUCKETS = 256
DRAWS = 1 << 20  # draws (or keys) per block where a stream is consumed in blocks


def version_of(r: GraphRecipe) -> str:
    """The cache version of ``r``'s generator (streamed recipes have their own)."""
    return STREAM_VERSION if r.name in STREAMED else VERSION


def _rng(seed: int, *tag: int):
    import numpy as np

    return np.random.default_rng(np.random.SeedSequence([seed, *tag]))


class _Nodes:
    """Everything per node the stream keeps in memory (O(nodes): ~14 bytes a node)."""

    def __init__(self, r: GraphRecipe, n: int, seed: int) -> None:
        import numpy as np

        g = _rng(seed, 0)
        c = r.num_classes
        w = g.exponential(size=c) + 1.0
        sizes = np.floor(w / w.sum() * (n - c)).astype(np.int64) + 1
        sizes[: n - int(sizes.sum())] += 1
        # positions are laid out block by block; perm maps a position to a node id
        self.perm = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        g.shuffle(self.perm)
        self.cdf = np.cumsum(g.lognormal(0.0, r.degree_sigma, size=n))
        self.total = float(self.cdf[-1])
        self.ends = np.cumsum(sizes)
        self.lo_w = np.concatenate([[0.0], self.cdf[self.ends[:-1] - 1]])
        self.hi_w = self.cdf[self.ends - 1]
        self.primary = np.empty(n, dtype=np.int16)  # node id -> class
        self.primary[self.perm] = np.repeat(np.arange(c, dtype=np.int16), sizes)
        self.n = n

    def pairs(self, r: GraphRecipe, seed: int, batch: int, k: int):
        """Batch ``batch`` of ``k`` candidate undirected pairs, as keys lo * n + hi of node ids
        (self-loops dropped): a degree-corrected SBM draw, as :func:`_sample_edges`'s."""
        import numpy as np

        g, n = _rng(seed, 1, batch), self.n
        src = np.minimum(_search(self.cdf, g.random(k) * self.total), n - 1)
        u = g.random(k)
        inside = g.random(k) < r.homophily
        b = np.searchsorted(self.ends, src, side="right")  # the block of position src
        v = np.where(inside, self.lo_w[b] + u * (self.hi_w[b] - self.lo_w[b]), u * self.total)
        del u, inside, b
        dst = np.minimum(_search(self.cdf, v), n - 1)
        keep = src != dst
        a = self.perm[src[keep]].astype(np.int64)
        z = self.perm[dst[keep]].astype(np.int64)
        return np.minimum(a, z) * n + np.maximum(a, z)


def _search(cdf, q):
    """``np.searchsorted(cdf, q)``, the queries looked up in ascending order: the same indices,
    ~5x faster when ``cdf`` is far larger than the caches (at papers100m's full scale, 111M
    float64: 0.43 s against 2.46 s of CPU for 2**20 queries, AMD EPYC Zen 4), because nearby
    queries reuse the cache lines of the search's last steps."""
    import numpy as np

    order = np.argsort(q)
    out = np.empty(q.size, dtype=np.intp)
    out[order] = np.searchsorted(cdf, q[order])
    return out


def _distinct(keys):
    """The distinct values of ``keys``, ascending (a sort, in place: numpy's unique hashes)."""
    import numpy as np

    keys.sort()
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if keys.size else keys


def _scatter(keys, bucket, handles) -> None:
    """Append each of ``keys`` to the file of its ``bucket`` (keys keep their order within one),
    :data:`DRAWS` keys at a time (the same files, in bounded temporaries)."""
    import numpy as np

    for a in range(0, len(keys), DRAWS):
        k, b = keys[a : a + DRAWS], bucket[a : a + DRAWS]
        order = np.argsort(b, kind="stable")
        k, b = k[order], b[order]
        cuts = np.searchsorted(b, np.arange(len(handles) + 1))
        for i, h in enumerate(handles):
            if cuts[i + 1] > cuts[i]:
                k[cuts[i] : cuts[i + 1]].tofile(h)


def _write_csr(w, edge_files, n: int, per: int, e: int, say) -> None:
    """indptr.npy and indices.npy from bucket files of keys ``target * n + source`` (bucket j
    holds the targets j * per ...), each sorted in turn: sources ascending within a target.
    The files are removed as they are read."""
    import numpy as np

    from gnnpar.data import prepared

    ptr = w.array("indptr", np.int64, (n + 1,))
    idx = w.array("indices", prepared.index_dtype(n), (e,))
    ptr.write(np.zeros(1, dtype=np.int64))
    offset = 0
    for j, p in enumerate(edge_files):
        first, last = j * per, min(n, (j + 1) * per)
        if first >= last:
            p.unlink(missing_ok=True)
            continue
        keys = np.fromfile(p, dtype=np.int64) if p.exists() else np.empty(0, np.int64)
        p.unlink(missing_ok=True)
        keys.sort()
        t, s = keys // n, keys % n
        del keys
        deg = np.bincount(t - first, minlength=last - first)
        ptr.write(offset + np.cumsum(deg))
        offset += int(deg.sum())
        idx.write(s)
        say("edges (writing)", j + 1, len(edge_files))
    if offset != e:
        raise RuntimeError(f"the stream wrote {offset} edges, {e} expected")
    w.finish(ptr)
    w.finish(idx)


def stream_graph(
    r: GraphRecipe,
    scale: float,
    seed: int,
    out,
    feature_dtype: str = "fp32",
    progress=None,
):
    """Generate ``r`` at ``scale`` straight into the prepared folder ``out``, in bounded memory:
    O(nodes) numbers (:class:`_Nodes`) plus fixed buffers, whatever the edge count and the
    feature bytes. Returns the folder.

    The stream (``sbm-stream-1``; the same model as :func:`generate_graph`'s, other draws):

    1. block sizes, the position -> node permutation and the degree propensities, from
       ``seed``;
    2. candidate pairs in batches of :data:`BATCH`, batch ``b`` drawn from its own generator
       (seed, 1, b), appended by the smaller endpoint's id range to bucket files on disk; each
       bucket's distinct pairs are counted, and more batches are drawn while there are fewer
       than ``m`` (the undirected edge count of :func:`graph_size`);
    3. the surplus of distinct pairs over ``m`` is dropped, bucket by bucket (shares by largest
       remainder; which pairs, from generator (seed, 2, bucket)), so the graph has exactly
       ``2 m`` edge_index columns: symmetric, no self-loops, no duplicates;
    4. both directions of every pair go to bucket files by target; each is sorted and written as
       the in-edge CSR (sources ascending), which is also edge_index sorted by (row, col);
    5. labels and features in chunks of :data:`ROWS` nodes, chunk ``i`` from generator
       (seed, 3, i); the split from generator (seed, 5).

    Why one function: its numbered steps are passes over the same bucket files and fixed
    buffers, in the order that defines the stream (``sbm-stream-1``); apart, they would hand a
    dozen buffers, counters and file handles from one to the next.
    """
    import numpy as np

    from gnnpar.data import prepared

    n, m = graph_size(r, scale)
    c, f = r.num_classes, r.num_features
    e = 2 * m
    fdt = prepared.FEATURE_DTYPES[feature_dtype]
    label_shape = (n, c) if r.multilabel else (n,)
    label_bytes = n * c if r.multilabel else 8 * n
    n_train, n_val = round(r.split[0] * n), round(r.split[1] * n)
    end = n if sum(r.split) > 1 - 1e-9 else min(n, n_train + n_val + round(r.split[2] * n))
    split_bytes = 8 * end
    # the disk's peak: the bucket files (candidate pairs, 8 B each with ~10% surplus, turning
    # into both directions of every edge, 16 B a pair) live beside indptr only, and are gone
    # (each as its indices are written) before labels and features are; so the need is the
    # larger of the two phases, not their sum
    scratch = 8 * int(m * 1.2 + 64) + 16 * m
    ptr_bytes = prepared.array_bytes(np.int64, (n + 1,))
    final = ptr_bytes + prepared.array_bytes(prepared.index_dtype(n), (e,))
    final += prepared.array_bytes(fdt, (n, f)) + label_bytes + split_bytes
    need = max(final, ptr_bytes + scratch)
    buckets = int(min(MAX_BUCKETS, max(1, -(-16 * m // BUCKET_BYTES))))
    per = -(-n // buckets)  # node ids per bucket
    say = progress or (lambda what, done, total: None)

    with prepared.Writer(out, need) as w:
        nodes = _Nodes(r, n, seed)
        scratch_dir = w.tmp / "scratch"
        scratch_dir.mkdir()
        pair_files = [scratch_dir / f"pairs-{i}.bin" for i in range(buckets)]
        counts = np.zeros(buckets, dtype=np.int64)
        batch, drawn = 0, 0
        for _ in range(50):
            need_pairs = m - int(counts.sum())
            if need_pairs <= 0:
                break
            k_total = int(need_pairs * 1.1) + 64
            handles = [open(p, "ab") for p in pair_files]  # noqa: SIM115
            try:
                while k_total > 0:
                    k = min(BATCH, k_total)
                    keys = nodes.pairs(r, seed, batch, k)
                    batch, k_total, drawn = batch + 1, k_total - k, drawn + k
                    _scatter(keys, (keys // n) // per, handles)
                    say("edges (drawing)", min(drawn, m), m)
            finally:
                for h in handles:
                    h.close()
            for i, p in enumerate(pair_files):
                counts[i] = _distinct(np.fromfile(p, dtype=np.int64)).size if p.exists() else 0
        if int(counts.sum()) < m:
            raise RuntimeError(f"SBM sampling produced {int(counts.sum())} of {m} distinct edges")
        # which bucket drops how many of the surplus: shares by largest remainder
        surplus = int(counts.sum()) - m
        share = counts * surplus / max(1, int(counts.sum()))
        drop = np.floor(share).astype(np.int64)
        rest = surplus - int(drop.sum())
        if rest:
            drop[np.argsort(-(share - drop), kind="stable")[:rest]] += 1
        edge_files = [scratch_dir / f"edges-{i}.bin" for i in range(buckets)]
        handles = [open(p, "wb") for p in edge_files]  # noqa: SIM115
        try:
            for i, p in enumerate(pair_files):
                keys = _distinct(np.fromfile(p, dtype=np.int64)) if p.exists() else None
                p.unlink(missing_ok=True)
                if keys is None or keys.size == 0:
                    continue
                if drop[i]:
                    gone = _rng(seed, 2, i).choice(keys.size, int(drop[i]), replace=False)
                    keys = np.delete(keys, gone)
                lo, hi = keys // n, keys % n
                del keys
                for t, s in ((hi, lo), (lo, hi)):  # target t aggregates source s
                    _scatter(t * n + s, t // per, handles)
                say("edges (grouping)", i + 1, buckets)
        finally:
            for h in handles:
                h.close()
        _write_csr(w, edge_files, n, per, e, say)
        scratch_dir.rmdir()
        # labels and features, chunk by chunk
        centroids = (
            _rng(seed, 4).standard_normal((c, f)) * (r.separation / math.sqrt(2 * f))
        ).astype(np.float32)
        lab = w.array("labels", np.uint8 if r.multilabel else np.int64, label_shape)
        xs = w.array("features", fdt, (n, f))
        for i, first in enumerate(range(0, n, ROWS)):
            g = _rng(seed, 3, i)
            prim = nodes.primary[first : first + ROWS].astype(np.int64)
            rows = prim.size
            if r.multilabel:
                y = np.zeros((rows, c), dtype=np.uint8)
                y[np.arange(rows), prim] = 1
                for k in AMAZON_RELATED:
                    on = g.random(rows) < AMAZON_RELATED_P
                    y[np.nonzero(on)[0], (prim[on] + k) % c] = 1
                yc = y.astype(np.float32)
                mean = (yc @ centroids) / np.sqrt(yc.sum(1, keepdims=True))
                lab.write(y)
            else:
                mean = centroids[prim]
                lab.write(prim)
            x = mean + g.standard_normal((rows, f), dtype=np.float32)
            xs.write(prepared.features_to(x, feature_dtype))
            say("features", min(first + rows, n), n)
        w.finish(lab)
        w.finish(xs)
        perm = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        _rng(seed, 5).shuffle(perm)
        ids = {
            "train": perm[:n_train],
            "val": perm[n_train : n_train + n_val],
            "test": perm[n_train + n_val : end],
        }
        for s_name, a in ids.items():
            w.put(s_name, np.sort(a).astype(np.int64))
        del perm
        made = prepared.made_record(r.name, scale, seed, "generated", generator=STREAM_VERSION)
        manifest = prepared.base_manifest(
            r.name, n, e, f, c, r.multilabel, False, feature_dtype, "source",
            {k: len(v) for k, v in ids.items()}, made,
        )  # fmt: skip
        return w.commit(manifest)


def streamed_in_memory(r: GraphRecipe, scale: float, seed: int) -> tuple[dict, dict[str, Any]]:
    """:func:`stream_graph`'s graph as in-memory tensors (what ``--dataset NAME`` trains on):
    streamed into a temporary folder, read back, the folder removed."""
    import shutil
    import tempfile
    from pathlib import Path

    from gnnpar.data import prepared

    tmp = Path(tempfile.mkdtemp(prefix="gnnpar-stream-"))
    try:
        folder = stream_graph(r, scale, seed, tmp / "g")
        p = prepared.open_prepared(folder)
        n = p.num_nodes
        tensors = {
            "x": p.tensor("features").clone(),
            "edge_index": p.edge_index(),
            "y": p.tensor("labels").clone(),
        }
        for s in prepared.SPLITS:
            mask = torch.zeros(n, dtype=torch.bool)
            mask[p.tensor(s)] = True
            tensors[f"{s}_mask"] = mask
        del p
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = {
        "kind": "graph",
        "name": r.name,
        "num_classes": r.num_classes,
        "multilabel": r.multilabel,
        "num_nodes": n,
        "num_edges": int(tensors["edge_index"].size(1)),
        "scale": scale,
        "seed": seed,
    }
    return tensors, meta


# ------------------------------------------------------- synthetic-reddit, streamed to a folder


def _lockstep(g: torch.Generator, k: int, dtypes: tuple[torch.dtype, ...]):
    """Blocks of the draws ``torch.rand(k, dtype=d, generator=g)`` for each ``d`` of ``dtypes``
    in turn (one generator, consumed in that order), side by side: block i of every draw at
    once, from generators set to where each draw starts. CPU draws are serial, so the blocks
    are the whole draws' values, bit for bit."""
    states = [g.get_state()]
    for d in dtypes[:-1]:
        for a in range(0, k, DRAWS):
            torch.rand(min(DRAWS, k - a), dtype=d, generator=g)
        states.append(g.get_state())
    gens = []
    for st in states:
        gens.append(torch.Generator())
        gens[-1].set_state(st)
    for a in range(0, k, DRAWS):
        c = min(DRAWS, k - a)
        yield a, tuple(torch.rand(c, dtype=d, generator=q) for d, q in zip(dtypes, gens))


def _stub_keys(r: GraphRecipe, h: RedditHeader, seed: int, j: int):
    """:func:`reddit_stubs` of chunk j in blocks of at most :data:`DRAWS` draws."""
    a, b = j * NODE_CHUNK, min((j + 1) * NODE_CHUNK, h.n)
    ends = torch.cumsum(h.stubs[a:b], 0)
    k = int(ends[-1]) if b > a else 0
    for first, (fin, u) in _lockstep(_stream(seed, _EDGES, j), k, (torch.float32, torch.float64)):
        src = a + torch.searchsorted(ends, torch.arange(first, first + fin.numel()), right=True)
        dst = _targets(h, src, fin < r.homophily, u)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        yield torch.minimum(src, dst) * h.n + torch.maximum(src, dst)


def _topup_keys(r: GraphRecipe, h: RedditHeader, seed: int, i: int, k: int):
    """Top-up round i of :func:`_reddit_edges` (``k`` draws) in blocks."""
    total = int(h.cdf[-1])
    f64 = torch.float64
    for _, (pu, fin, u) in _lockstep(_stream(seed, _TOPUP, i), k, (f64, torch.float32, f64)):
        pick = torch.minimum((pu * total).long(), torch.tensor(total - 1))
        src = h.order[torch.searchsorted(h.cdf, pick, right=True)]
        dst = _targets(h, src, fin < r.homophily, u)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        yield torch.minimum(src, dst) * h.n + torch.maximum(src, dst)


def randperm_tail(k: int, m: int, seed: int, scratch) -> "np.ndarray":  # noqa: F821, UP037
    """The values ``torch.randperm(k, generator=torch.Generator().manual_seed(seed))`` holds
    at positions m..k-1, ascending, in memory O(k - m) plus a fixed buffer (the steps go to a
    file in the folder ``scratch``).

    torch's CPU randperm (n < 2^32 / 20) is Fisher-Yates from the identity: step i swaps
    positions i and i + z_i, z_i = x_i % (k - i), x_i the generator's i-th 32-bit Mersenne
    Twister output. numpy's legacy ``RandomState`` seeds MT19937 as torch does (from the low
    32 bits) and draws full-range uint32s as the raw outputs. Only steps 0..m-1 decide which
    values end in the tail. Going back from the last of them, the value at tail position p
    came from the last step t that swapped p, i.e. from position t as it was then, which came
    from the last earlier step that swapped t, and so on; where no earlier step swapped it,
    the value is the position itself."""
    import numpy as np

    if k >= 2**32 // 20:
        raise ValueError(f"randperm({k}) draws 64-bit numbers (not reproduced here)")
    rs = np.random.RandomState(seed & 0xFFFFFFFF)
    dt = np.dtype(np.int32 if k < 2**31 else np.int64)
    path = scratch / "randperm-steps.bin"
    with open(path, "wb") as fh:  # step i's other position, j_i = i + z_i
        for a in range(0, m, DRAWS):
            i = np.arange(a, min(a + DRAWS, m), dtype=np.int64)
            x = rs.randint(0, 2**32, size=i.size, dtype=np.uint32).astype(np.int64)
            (i + x % (k - i)).astype(dt).tofile(fh)
    pos = np.arange(m, k, dtype=np.int64)  # where each tail value was, going back in time
    for a in reversed(range(0, m, DRAWS)):
        i = np.arange(a, min(a + DRAWS, m), dtype=np.int64)
        j = np.fromfile(path, dtype=dt, count=i.size, offset=a * dt.itemsize).astype(np.int64)
        moved = (i != j).nonzero()[0]
        i, j = i[moved], j[moved]
        live = np.arange(pos.size)
        while live.size and i.size:
            order = np.argsort(pos[live])
            q = pos[live][order]
            at = np.minimum(np.searchsorted(q, j), q.size - 1)
            hit = (q[at] == j).nonzero()[0]
            if not hit.size:
                break
            # the last step of this block that swapped each position (steps ascend)
            by = np.argsort(j[hit], kind="stable")
            jh, th = j[hit][by], i[hit][by]
            last = np.append(jh[1:] != jh[:-1], True)
            jh, th = jh[last], th[last]
            live = live[order[np.searchsorted(q, jh)]]
            pos[live] = th  # and earlier steps of this block may have swapped th
    path.unlink()
    return np.sort(pos)


def stream_reddit(
    r: GraphRecipe, scale: float, seed: int, out, feature_dtype: str = "fp32", progress=None
):
    """synthetic-reddit (``sbm-3``) at ``scale`` straight into the prepared folder ``out``:
    the arrays :func:`generate_reddit`'s tensors prepare to, bit for bit, in memory O(nodes)
    (:class:`RedditHeader`: ~50 bytes a node) plus fixed buffers (:data:`DRAWS` draws,
    :data:`BUCKET_BYTES` of pairs, one chunk's rows), whatever the edge count and feature
    bytes. Returns the folder.

    The same draws in the same order as in memory, regrouped: every chunk's stubs, and each
    top-up round, in blocks of :data:`DRAWS` (:func:`_lockstep`); the pairs go to bucket files
    by the smaller endpoint's id range, so the buckets in turn are the sorted distinct pairs
    of the whole graph; the random surplus is the tail of the same ``randperm`` (computed
    without holding it: :func:`randperm_tail`), dropped by rank; then both directions by
    target to the CSR, as :func:`stream_graph` writes it."""
    import numpy as np

    from gnnpar.data import prepared

    h = reddit_header(r, scale, seed)
    n, m, f = h.n, h.m, r.num_features
    e = 2 * m
    fdt = prepared.FEATURE_DTYPES[feature_dtype]
    # the disk's peak, as stream_graph's: the scratch files (pairs with their surplus, the
    # randperm's steps, both directions of every edge) live beside indptr only
    ptr_bytes = prepared.array_bytes(np.int64, (n + 1,))
    final = ptr_bytes + prepared.array_bytes(prepared.index_dtype(n), (e,))
    final += prepared.array_bytes(fdt, (n, f)) + 16 * n
    need = max(final, ptr_bytes + 8 * int(m * 1.2 + 64) + 4 * m + 16 * m)
    buckets = int(min(MAX_BUCKETS, max(1, -(-16 * m // BUCKET_BYTES))))
    per = -(-n // buckets)
    say = progress or (lambda what, done, total: None)
    with prepared.Writer(out, need) as w:
        scratch = w.tmp / "scratch"
        scratch.mkdir()
        pair_files = [scratch / f"pairs-{i}.bin" for i in range(buckets)]
        _reddit_pairs(r, h, seed, pair_files, per, say)
        counts = np.array([_distinct_file(p) for p in pair_files], dtype=np.int64)
        for i in range(1, 51):
            short = m - int(counts.sum())
            if short <= 0:
                break
            with _appending(pair_files) as handles:
                for keys in _topup_keys(r, h, seed, i, int(short * 1.1) + 64):
                    keys = keys.numpy()
                    _scatter(keys, (keys // n) // per, handles)
            counts = np.array([_distinct_file(p) for p in pair_files], dtype=np.int64)
            say("edges (top-up)", i, i)
        if int(counts.sum()) < m:
            raise RuntimeError(f"SBM sampling produced {int(counts.sum())} of {m} distinct edges")
        k = int(counts.sum())
        gone = randperm_tail(k, m, _stream_seed(seed, _TOPUP, 0), scratch) if k > m else None
        edge_files = [scratch / f"edges-{i}.bin" for i in range(buckets)]
        first = 0
        with _appending(edge_files) as handles:
            for i, p in enumerate(pair_files):
                keys = np.fromfile(p, dtype=np.int64)
                p.unlink()
                if gone is not None:
                    at = gone[(gone >= first) & (gone < first + keys.size)] - first
                    first += keys.size
                    keys = np.delete(keys, at)
                for a in range(0, keys.size, DRAWS):
                    lo, hi = keys[a : a + DRAWS] // n, keys[a : a + DRAWS] % n
                    for t, s in ((hi, lo), (lo, hi)):  # target t aggregates source s
                        _scatter(t * n + s, t // per, handles)
                say("edges (grouping)", i + 1, buckets)
        _write_csr(w, edge_files, n, per, e, say)
        scratch.rmdir()
        _reddit_rows(r, h, seed, w, feature_dtype, say)
        masks = _split_masks(n, r.split, _stream(seed, _HEADER, 1))
        ids = {s: masks[f"{s}_mask"].nonzero().view(-1).numpy() for s in prepared.SPLITS}
        for s_name, a in ids.items():
            w.put(s_name, a)
        made = prepared.made_record(r.name, scale, seed, "generated", generator=VERSION)
        manifest = prepared.base_manifest(
            r.name, n, e, f, r.num_classes, False, False, feature_dtype, "source",
            {k: len(v) for k, v in ids.items()}, made,
        )  # fmt: skip
        return w.commit(manifest)


class _appending:
    """Open files for appending, closed on leaving the block."""

    def __init__(self, paths) -> None:  # noqa: ANN001
        self.paths = paths

    def __enter__(self) -> list:
        self.handles = [open(p, "ab") for p in self.paths]  # noqa: SIM115
        return self.handles

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        for fh in self.handles:
            fh.close()


def _distinct_file(path) -> int:
    """Rewrite the file of int64 keys ``path`` as its distinct keys, ascending; their count."""
    import numpy as np

    if not path.exists():
        path.touch()
        return 0
    keys = _distinct(np.fromfile(path, dtype=np.int64))
    keys.tofile(path)
    return int(keys.size)


def _reddit_pairs(r: GraphRecipe, h: RedditHeader, seed: int, files, per: int, say) -> None:
    """Every chunk's stub pairs into the bucket ``files`` (by the smaller id, ``per`` ids a
    bucket)."""
    with _appending(files) as handles:
        for j, _, b in _chunks(h.n):
            for keys in _stub_keys(r, h, seed, j):
                keys = keys.numpy()
                _scatter(keys, (keys // h.n) // per, handles)
            say("edges (drawing)", b, h.n)


def _reddit_rows(r: GraphRecipe, h: RedditHeader, seed: int, w, feature_dtype: str, say) -> None:
    """labels.npy and features.npy, chunk by chunk (features in blocks of ~16 MiB)."""
    import numpy as np

    from gnnpar.data import prepared

    n, f = h.n, r.num_features
    lab = w.array("labels", np.int64, (n,))
    xs = w.array("features", prepared.FEATURE_DTYPES[feature_dtype], (n, f))
    rows = max(1, (16 << 20) // (4 * f))
    for j, _, b in _chunks(n):
        lab.write(reddit_labels(r, h, seed, j).numpy())
        for x in reddit_features(r, h, seed, j, rows):
            xs.write(prepared.features_to(x.numpy(), feature_dtype))
        say("features", b, n)
    w.finish(lab)
    w.finish(xs)
