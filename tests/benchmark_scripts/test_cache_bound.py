"""The look-ahead bound of ``benchmarks/memory/cache_hit_rate.py`` (BENCHMARKS.md, "the feature
cache"): the rows a cache of ``k`` rows serves when it is refilled between batches knowing every
later batch. Checked against every schedule of cache contents on small cases (any subset of at
most ``k`` rows before the first batch; after each batch, any subset of what it held and that
batch's rows), and against the static caches it must never fall below."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from benchmarks.memory.cache_hit_rate import lookahead_hits


def _best_schedule(batches: list[np.ndarray], n: int, k: int) -> int:
    states = [frozenset(c) for r in range(k + 1) for c in itertools.combinations(range(n), r)]
    rows = [set(b.tolist()) for b in batches]
    best = {s: len(rows[0] & s) for s in states}
    for t in range(1, len(batches)):
        step: dict[frozenset, int] = {}
        for s, v in best.items():
            pool = s | rows[t - 1]
            for s2 in states:
                if s2 <= pool:
                    step[s2] = max(step.get(s2, -1), v + len(rows[t] & s2))
        best = step
    return max(best.values())


@pytest.mark.parametrize("seed", range(4))
def test_the_bound_is_the_best_schedule_of_cache_contents(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n, k, t = 6, int(rng.integers(0, 4)), int(rng.integers(1, 5))
        batches = [np.unique(rng.choice(n, size=int(rng.integers(1, 4)), replace=False))
                   for _ in range(t)]  # fmt: skip
        batches = [b.astype(np.int64) for b in batches]
        assert lookahead_hits(batches, n, k) == _best_schedule(batches, n, k)


def test_the_bound_is_never_below_the_best_static_cache():
    rng = np.random.default_rng(7)
    n, k = 200, 30
    weights = 1.0 / np.arange(1, n + 1)  # a few rows far hotter than the rest
    batches = [np.unique(rng.choice(n, size=40, p=weights / weights.sum())) for _ in range(25)]
    counts = np.bincount(np.concatenate(batches), minlength=n)
    static = int(np.sort(counts)[::-1][:k].sum())
    assert lookahead_hits(batches, n, k) >= static
    assert lookahead_hits(batches, n, 0) == 0
    assert lookahead_hits(batches, n, n) == sum(b.size for b in batches)
