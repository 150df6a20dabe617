"""The feature cache's ranking (gnnpar.data.visits): every node's expected visits per sampled
batch, computed from the CSR, is the exact expectation of the draws for one hop, ranks nodes as
real sampled batches reach them, and is bit for bit the same for any block size and summed
across shards."""

from __future__ import annotations

import itertools
import threading
from fractions import Fraction

import numpy as np
import pytest
import torch

from gnnpar.data.sampling.kernel import kernel_available
from gnnpar.data.visits import expected_visits, top_rows, visit_unit


def _csr(edges: list[tuple[int, int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """In-edge CSR of ``source -> target`` edges: row t lists t's sources."""
    src = np.array([s for s, _ in edges], dtype=np.int64)
    dst = np.array([t for _, t in edges], dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int32)


def _skewed_graph(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """An undirected graph with a few very high degree nodes (Zipf endpoints)."""
    rng = np.random.default_rng(seed)
    a = np.minimum(rng.zipf(1.6, m) - 1, n - 1)
    b = rng.integers(0, n, m)
    keep = a != b
    pairs = set(zip(a[keep].tolist(), b[keep].tolist(), strict=True))
    pairs |= {(y, x) for x, y in pairs}
    return _csr(sorted(pairs), n)


def test_one_hop_is_the_exact_expected_count_of_draws():
    """Enumerating every equally likely seed set and every neighbour subset the sampler may
    draw (without replacement): a node's expected count as a seed plus as a drawn neighbour
    is its score, for fan-outs below, at and above the degrees and -1 (all)."""
    n = 7
    edges = [(1, 0), (2, 0), (3, 0), (4, 0), (0, 1), (5, 1), (6, 2), (3, 2), (4, 2), (0, 3)]
    indptr, indices = _csr(edges, n)
    train, batch = [0, 1, 2, 3], 3
    for fanout in (1, 2, 3, 5, -1):
        want = [Fraction(0)] * n
        seed_sets = list(itertools.combinations(train, batch))
        for seeds in seed_sets:
            p_set = Fraction(1, len(seed_sets))
            for t in seeds:
                want[t] += p_set
                nbrs = indices[indptr[t] : indptr[t + 1]].tolist()
                take = len(nbrs) if fanout < 0 else min(fanout, len(nbrs))
                subsets = list(itertools.combinations(nbrs, take))
                for sub in subsets:
                    for u in sub:
                        want[u] += p_set / len(subsets)
        score = expected_visits(indptr, indices, np.array(train), [fanout], batch)
        unit = visit_unit(batch, [fanout], int(np.diff(indptr).max()))
        assert np.allclose(score / unit, [float(w) for w in want], rtol=0, atol=1e-9), fanout


def test_the_walk_straight_back_is_not_a_visit():
    """A star's centre, the only seed, reaches its leaves at hop 1 and nothing new at hop 2
    (each leaf can only draw the centre, already in the batch): every node is visited once per
    batch. Counting the way back would give the centre one more visit per leaf (a directed
    CSR, where no way back is known, keeps them)."""
    leaves = 5
    edges = [(c, 0) for c in range(1, leaves + 1)] + [(0, c) for c in range(1, leaves + 1)]
    indptr, indices = _csr(edges, leaves + 1)
    for fanouts in ([-1, -1], [leaves, 1]):
        unit = visit_unit(1, fanouts, leaves)
        score = expected_visits(indptr, indices, np.array([0]), fanouts, 1, symmetric=True)
        assert (score / unit).tolist() == [1.0] * (leaves + 1)
        walk = expected_visits(indptr, indices, np.array([0]), fanouts, 1, symmetric=False)
        assert (walk / unit).tolist() == [1.0 + leaves] + [1.0] * leaves


def test_sampled_batches_rank_nodes_like_the_estimate():
    """Over 400 real sampled batches (the training sampler, fan-outs 5-5, 40 training nodes of
    3000), the nodes the estimate ranks highest are those the batches gather most: a cache of
    its top 10% serves nearly what the batches' own most-gathered 10% would, and clearly more
    than the 10% of highest degree."""
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler

    n, batch, fanouts = 3000, 16, [5, 5]
    indptr, indices = _skewed_graph(n, 12000, 0)
    train = np.sort(np.random.default_rng(1).choice(n, 40, replace=False))
    score = expected_visits(indptr, indices, train, fanouts, batch, symmetric=True)
    sampler = NeighborSampler(
        CSRGraph(torch.from_numpy(indptr), torch.from_numpy(indices)), fanouts
    )
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(n, dtype=torch.long)
    for _ in range(400):
        seeds = torch.from_numpy(train)[torch.randperm(len(train), generator=gen)[:batch]]
        counts += torch.bincount(sampler.sample(seeds, gen).n_id, minlength=n)
    counts = counts.numpy()
    k = n // 10

    def served(rows: np.ndarray) -> float:
        return counts[rows].sum() / counts.sum()

    by_visits = served(top_rows(score, k))
    by_degree = served(top_rows(np.diff(indptr), k))
    best = served(top_rows(counts, k))
    assert by_visits >= 0.95 * best
    assert by_visits > by_degree + 0.1
    assert (score[counts > 0] > 0).all()  # nothing a batch reached is estimated unreachable


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("fanouts", [[5, 5], [3, -1, 2], [15, 10, 5]])
def test_any_block_size_gives_the_same_scores_bit_for_bit(fanouts, symmetric):
    """Counted in whole units, the sums do not depend on how the edges are cut into blocks
    (one edge at a time, odd sizes, one block)."""
    indptr, indices = _skewed_graph(1500, 6000, 2)
    train = np.arange(0, 1500, 37)
    whole = expected_visits(indptr, indices, train, fanouts, 8, symmetric=symmetric)
    for chunk in (1, 7, 100, 10**9):
        got = expected_visits(
            indptr, indices, train, fanouts, 8, symmetric=symmetric, chunk_edges=chunk,
            compiled=False,
        )  # fmt: skip
        assert np.array_equal(got, whole), chunk
        assert np.array_equal(top_rows(got, 150), top_rows(whole, 150))


@pytest.mark.skipif(not kernel_available(), reason="the compiled sampler kernel is not built")
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_compiled_hop_gives_numpys_bits(dtype):
    """The kernel's one pass over the rows (gnnpar_visit_hop) and numpy's blocks: the same
    scores to the bit, int32 and int64 sources, with and without the way back, fan-outs
    below and above the degrees and -1."""
    indptr, indices = _skewed_graph(2500, 10000, 4)
    indices = indices.astype(dtype)
    train = np.arange(3, 2500, 41)
    for symmetric in (False, True):
        for fanouts in ([15, 10, 5], [2, -1], [0, 3]):
            args = (indptr, indices, train, fanouts, 64)
            c = expected_visits(*args, symmetric=symmetric, compiled=True)
            py = expected_visits(*args, symmetric=symmetric, compiled=False, chunk_edges=999)
            assert np.array_equal(c, py), (symmetric, fanouts)


def test_shards_summed_each_hop_give_the_unsharded_scores():
    """Three shards, each propagating over its own rows and summing every hop's contributions
    with the others (as an all-reduce does): the one-graph scores, bit for bit."""
    n = 2000
    indptr, indices = _skewed_graph(n, 8000, 3)
    train, fanouts, batch = np.arange(5, n, 23), [10, 5, 5], 32
    want = expected_visits(indptr, indices, train, fanouts, batch, symmetric=True)
    bounds = [0, 700, 1300, n]
    most = int(np.diff(indptr).max())
    parts: list = [None] * 3
    summed: list = [None]
    barrier = threading.Barrier(3)
    results: list = [None] * 3

    def reduce_of(h: int):
        def reduce(part: np.ndarray) -> np.ndarray:
            parts[h] = part
            if barrier.wait() == 0:
                summed[0] = parts[2] + parts[0] + parts[1]  # any order: whole units
            barrier.wait()
            out = summed[0].copy()
            barrier.wait()
            return out

        return reduce

    def shard(h: int) -> None:
        a, b = bounds[h], bounds[h + 1]
        ptr = indptr[a : b + 1]
        rows = indices[ptr[0] : ptr[-1]]
        results[h] = expected_visits(
            ptr - ptr[0], rows, train, fanouts, batch, n, a, reduce_of(h), most, True
        )

    threads = [threading.Thread(target=shard, args=(h,)) for h in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for got in results:
        assert np.array_equal(got, want)


def test_top_rows_breaks_ties_by_the_lower_id():
    score = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0])
    assert top_rows(score, 3).tolist() == [1, 2, 3]  # 3, 3, then the first of the 2s
    assert top_rows(score, 4).tolist() == [1, 2, 3, 4]
    assert top_rows(score, 0).tolist() == []
    assert top_rows(score, 99).tolist() == list(range(7))
    flat = np.zeros(10)
    assert top_rows(flat, 4).tolist() == [0, 1, 2, 3]
