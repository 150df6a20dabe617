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
stand-in that ``gnnpar advise`` profiles; full size would need ~85 GB.

How labels become learnable: a fraction ``homophily`` of the edges join two nodes of the same
block (class; for Amazon the node's primary class), the rest join uniformly chosen nodes, and
every feature vector is a class centroid (the mean of the centroids of all its labels for Amazon)
plus unit Gaussian noise. The centroid separation is chosen so that features alone classify
moderately well and neighbourhood averaging (what a GNN does) classifies clearly better.
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

Every generator is vectorised over nodes/edges/images, draws all randomness from one seeded
``torch.Generator`` (same seed, same tensors), and runs in chunks small enough that the full-size
graphs fit comfortably in 24 GiB (figures in BENCHMARKS.md, "Data generation").

Run: ``gnnpar train --dataset synthetic-reddit --scale 0.01 --model sage --epochs 5``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

# Bump when generation changes: cached entries with another version are regenerated.
VERSION = "sbm-2"
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


REDDIT = GraphRecipe(
    "synthetic-reddit", 232_965, 602, 41, 114_848_857, False, (0.66, 0.10, 0.24), 0.75, 5.0, 0.6
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
    """Tensors (x, edge_index, y, masks) and metadata of ``r`` at ``scale``, from ``seed``."""
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
