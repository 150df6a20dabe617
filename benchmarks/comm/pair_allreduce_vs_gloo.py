"""Two gloo ranks on one host: ``dist.all_reduce`` (gloo's ring) against gnnpar's
``collectives.all_reduce_sum`` (one ``isend``/``irecv`` exchange, then an add), issue 21.

Per size: ``--calls`` back-to-back calls timed as one, ``--reps`` times, sides alternating
within each repetition (a barrier before each timing); the median per call, and the median of
per-repetition ratios (gloo / gnnpar). Rank 0 prints. One thread per rank, as the strategies
run. The sizes: 1K floats, a study-003 GCN's gradient (99K floats), 1M floats.

    python -m benchmarks.comm.pair_allreduce_vs_gloo [--reps 7] [--calls 100]

Run it alone on the machine (``flock`` the benchmark lock).
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks import harness
from gnnpar.parallel.collectives import all_reduce_sum

SIZES = [1_000, 99_001, 1_000_000]


def _rank(rank: int, port: int, reps: int, calls: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    harness.set_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    sides = {"gloo all_reduce": dist.all_reduce, "gnnpar exchange": all_reduce_sum}
    try:
        if rank == 0:
            print(f"load before {harness.load_average()}")
            print("| floats | gloo all_reduce ms | gnnpar exchange ms | gloo / gnnpar |")
            print("|---|---|---|---|")
        for n in SIZES:
            fresh = torch.randn(n)
            t = fresh.clone()
            times: dict[str, list[float]] = {name: [] for name in sides}
            for fn in sides.values():  # warm-up: connections, buffers
                for _ in range(10):
                    fn(t)
                t.copy_(fresh)
            for rep in range(reps):
                for name in list(sides) if rep % 2 == 0 else list(reversed(sides)):
                    t.copy_(fresh)  # each call doubles the values: 100 calls stay finite
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        sides[name](t)
                    times[name].append((time.perf_counter() - t0) / calls)
            if rank == 0:
                g, p = (statistics.median(times[k]) * 1e3 for k in sides)
                ratio = statistics.median(a / b for a, b in zip(*times.values(), strict=True))
                print(f"| {n:,} | {g:.3f} | {p:.3f} | {ratio:.2f} |")
        if rank == 0:
            print(f"load after {harness.load_average()}")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__, reps=7)
    ap.add_argument("--calls", type=int, default=100)
    args = harness.start(ap, argv, {"reps": 2, "calls": 3}, rank_threads=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, args.reps, args.calls), nprocs=2, join=True)


if __name__ == "__main__":
    main()
