"""Feature-cache hit rate of a prepared folder: rows ranked by degree against rows ranked by
expected visits per batch (gnnpar.data.visits), caches of the same size, over real sampled
batches (the training sampler, no training), and the time each ranking takes.

Both rankings are computed in turn (harness.alternate, the order reversed every other
repetition; the median kept); then ``--batches`` batches are sampled as a run samples them
(the training nodes shuffled with a seeded generator, ``--batch-size`` seeds a batch, the
compiled sampler at ``--fanouts``) and every batch's rows (``n_id``) are looked up in both
caches: the share served by each (rows served / rows gathered) and the rows each leaves to be
read per batch. Two references: a presampled cache (GNNLab's, Yang et al. EuroSys'22: the rows
most gathered by ``--presample`` other batches, timed too) and the oracle (the counted batches'
own most gathered rows, chosen after them: no static cache of that size does better on them).
Beside them, the **look-ahead** bound: a cache of the same size whose rows are replaced between
batches knowing every later batch (Belady's rule: after each batch keep the rows needed soonest,
drop those never needed again; filled before the first batch as the static caches are), the
best any cache refilled between batches can do on them, which Ginex's superbatch caching
approaches within its window. The CPU busy share of both cores over the run (/proc/stat) is
printed with the load average (no feature rows are read: the folder's CSR alone, through its
map).

    python -m benchmarks.memory.cache_hit_rate --folder /work/data/shared/papers100m-0.1 \\
        --cache 725M --batches 50
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of all cores, from /proc/stat (0s where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return v[3] + v[4], sum(v)  # idle + iowait


def lookahead_hits(batches: list[np.ndarray], n: int, k: int) -> int:
    """Rows of ``batches`` (each batch's distinct node ids) that a cache of ``k`` rows serves when
    its rows are replaced between batches with every later batch known: after batch t it holds
    the ``k`` rows (of those it held and batch t's) whose next use comes soonest, none that is
    never used again (Belady's rule; optimal for a cache that may also leave a row out). Starts
    empty."""
    never = len(batches)
    nxt: list[np.ndarray] = []  # per batch: the batch that next needs each of its rows
    last = np.full(n, never, dtype=np.int64)
    for t in range(len(batches) - 1, -1, -1):
        ids = batches[t]
        nxt.append(last[ids])
        last[ids] = t
    nxt.reverse()
    # filled before the first batch, as the static caches are: the rows first needed soonest
    first = np.flatnonzero(last < never)
    if first.size > k:
        first = first[np.argpartition(last[first], k - 1)[:k]] if k else first[:0]
    held, held_next = first.astype(np.int64), last[first]
    in_cache, mark = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    in_cache[held] = True
    hits = 0
    for t, ids in enumerate(batches):
        hits += int(in_cache[ids].sum())
        mark[ids] = True
        keep = ~mark[held]  # held rows this batch did not touch keep their next use
        mark[ids] = False
        rows = np.concatenate([held[keep], ids])
        when = np.concatenate([held_next[keep], nxt[t]])
        live = when < never
        rows, when = rows[live], when[live]
        if rows.size > k:
            pick = np.argpartition(when, k - 1)[:k] if k else np.empty(0, np.int64)
            rows, when = rows[pick], when[pick]
        in_cache[held] = False
        in_cache[rows] = True
        held, held_next = rows, when
    return hits


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, reps=3, out=True)
    ap.add_argument("--folder", type=Path, help="a gnnpar prepared folder")
    ap.add_argument("--cache", default="0.15", help="cache size: bytes (725M) or a fraction")
    ap.add_argument("--batches", type=int, default=50, help="sampled batches to count")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--presample", type=int, default=50, help="batches of the presampled cache")
    ap.add_argument("--seed", type=int, default=0)
    a = harness.start(ap, argv, smoke={"reps": 1, "batches": 3, "batch_size": 16, "presample": 3})
    import torch

    from gnnpar.data.prepared import cache_rows, hot_rows, open_prepared
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
    from gnnpar.data.visits import top_rows

    fanouts = [int(f) for f in a.fanouts.split(",")]
    idle0, total0 = cpu_times()
    load = [harness.load_average()[0]]
    with tempfile.TemporaryDirectory(prefix="gnnpar-hit-") as tmp:
        if a.smoke:
            a.folder = harness.smoke_prepared(Path(tmp) / "graph")
        if a.folder is None:
            ap.error("--folder is required (a gnnpar prepared folder)")
        try:
            p = open_prepared(a.folder)
            k = cache_rows(p, a.cache, None)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        n, row = p.num_nodes, int(p.manifest["num_features"]) * p.array("features").itemsize
        print(f"{a.folder}: {n:,} nodes, {p.array('indices').size:,} edges, "
              f"{len(p.array('train')):,} training; cache {k:,} rows ({k * row / 2**20:.0f} MiB, "
              f"{k / n:.1%} of rows); fan-outs {a.fanouts}, batch {a.batch_size}")  # fmt: skip
        got: dict[str, np.ndarray] = {}

        def ranking(name: str, fan: list[int] | None):
            def run() -> None:
                got[name] = hot_rows(p, k, fan, a.batch_size if fan else None)

            return run

        times = harness.alternate(
            {"degree": ranking("degree", None), "visits": ranking("visits", fanouts)},
            a.reps, warmup=0,
        )  # fmt: skip
        load.append(harness.load_average()[0])
        csr = CSRGraph(p.tensor("indptr"), p.tensor("indices"))
        sampler = NeighborSampler(csr, fanouts)
        train = p.tensor("train").long()

        def sampled(count: int, seed: int):
            """``count`` batches as a run draws them: the training nodes shuffled per epoch."""
            gen = torch.Generator().manual_seed(seed)
            order = train[torch.randperm(train.numel(), generator=gen)]
            at = 0
            for _ in range(count):
                if at + a.batch_size > train.numel() and at:  # a new epoch's order
                    order, at = train[torch.randperm(train.numel(), generator=gen)], 0
                seeds = order[at : at + a.batch_size]
                at += a.batch_size
                yield sampler.sample(seeds, gen).n_id

        # a presampled cache (as GNNLab builds one): the rows most gathered by other batches
        t0 = time.perf_counter()
        counts = torch.zeros(n, dtype=torch.long)
        for n_id in sampled(a.presample, a.seed + 1):
            counts += torch.bincount(n_id, minlength=n)
        got["presampled"] = top_rows(counts.numpy(), k)
        presample_s = time.perf_counter() - t0
        held = {}
        for name, rows in got.items():
            mask = torch.zeros(n, dtype=torch.bool)
            mask[torch.from_numpy(rows)] = True
            held[name] = mask
        gathered, hits = 0, {name: 0 for name in held}
        counts.zero_()  # rows gathered per node: the oracle's
        kept: list[np.ndarray] = []  # every batch's rows, for the look-ahead bound
        t0 = time.perf_counter()
        for n_id in sampled(a.batches, a.seed):
            gathered += n_id.numel()
            counts += torch.bincount(n_id, minlength=n)
            kept.append(n_id.numpy().astype(np.int64))
            for name, mask in held.items():
                hits[name] += int(mask[n_id].sum())
        sample_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ahead_hits = lookahead_hits(kept, n, k)
        ahead_s = time.perf_counter() - t0
        del kept
        # the best any cache of k rows could have done on these batches (chosen after them)
        oracle = int(torch.topk(counts, k).values.sum()) if k else 0
        reached = int((counts > 0).sum())
        load.append(harness.load_average()[0])
    idle1, total1 = cpu_times()
    busy = 1 - (idle1 - idle0) / max(1, total1 - total0)
    res = {"cache_rows": k, "cache_bytes": k * row, "batches": a.batches,
           "rows_per_batch": gathered / max(1, a.batches), "sample_s": sample_s,
           "cpu_busy": busy, "load_1min": load, "oracle_hit_rate": oracle / max(1, gathered),
           "nodes_reached": reached,
           "lookahead": {"hit_rate": ahead_hits / max(1, gathered),
                         "missed_rows_per_batch": (gathered - ahead_hits) / max(1, a.batches),
                         "compute_s": ahead_s}}  # fmt: skip
    for name in held:
        rate = hits[name] / max(1, gathered)
        missed = (gathered - hits[name]) / max(1, a.batches)
        sec = harness.median_ms(times[name]) / 1e3 if name in times else presample_s
        res[name] = {"hit_rate": rate, "missed_rows_per_batch": missed, "ranking_s": sec}
        how = f"median of {len(times[name])}" if name in times else f"{a.presample} batches"
        print(f"{name:>10}: hit rate {rate:.3f}, {missed:,.0f} rows missed a batch, "
              f"ranking {sec:.2f} s ({how})")  # fmt: skip
    print(
        f" oracle: hit rate {res['oracle_hit_rate']:.3f} (the batches' own most gathered "
        f"{k:,} rows, chosen after them); {reached / n:.1%} of nodes reached at all"
    )
    la = res["lookahead"]
    print(f" look-ahead: hit rate {la['hit_rate']:.3f}, {la['missed_rows_per_batch']:,.0f} rows "
          f"missed a batch (Belady's rule between batches, every later batch known)")  # fmt: skip
    print(f"{a.batches} batches, {res['rows_per_batch']:,.0f} rows each, sampled in "
          f"{sample_s:.1f} s; CPU busy {busy:.0%} of both cores; load (1 min) "
          + " / ".join(f"{x:.1f}" for x in load))  # fmt: skip
    if a.out:
        harness.write_json(a.out, {"machine": harness.machine(), **res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
