"""Two gloo ranks on one host, the pair all-reduce's exchange (``collectives.all_reduce_sum``)
between imbalanced steps, as training calls it: the send posted first (gnnpar's order) against
the receive posted first (issue 21).

Each call follows a busy step of 4 ms on one rank and 5 ms on the other (alternating), so one
rank waits, as in a real K = 1 run. Per repetition, ``--calls`` calls are timed as one on each
side, sides alternating per repetition; the figure is the time per call beyond the mean step
(4.5 ms; so 0.5 ms of it is the imbalance itself), median of ``--reps``, and the median of
per-repetition ratios. 99K floats (a study-003 GCN's gradients). One thread per rank.

    python -m benchmarks.comm.pair_exchange_order [--reps 7] [--calls 200]

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

STEP_S, MORE_S = 0.004, 0.001


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def exchange(flat: torch.Tensor, other: torch.Tensor, peer: int, recv_first: bool) -> None:
    ops = [dist.P2POp(dist.isend, flat, peer), dist.P2POp(dist.irecv, other, peer)]
    if recv_first:
        ops.reverse()
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    flat.add_(other)


def _rank(rank: int, port: int, reps: int, calls: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    harness.set_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t, other = torch.randn(99_001), torch.empty(99_001)
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for recv_first in times:  # warm-up
            for _ in range(10):
                exchange(t, other, 1 - rank, recv_first)
                t.normal_()
        for rep in range(reps):
            for recv_first in (False, True) if rep % 2 == 0 else (True, False):
                dist.barrier()
                t0 = time.perf_counter()
                for i in range(calls):
                    busy(STEP_S + MORE_S * ((i + rank) % 2))
                    exchange(t, other, 1 - rank, recv_first)
                    t.mul_(0.5)  # values stay finite
                times[recv_first].append((time.perf_counter() - t0) / calls - STEP_S - MORE_S / 2)
        if rank == 0:
            send, recv = (statistics.median(times[k]) * 1e3 for k in (False, True))
            ratio = statistics.median(a / b for a, b in zip(times[False], times[True]))
            print(
                f"per call beyond the mean step: send first {send:.3f} ms, receive first "
                f"{recv:.3f} ms; send-first / receive-first {ratio:.2f}; load {harness.load_average()}"
            )
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__, reps=7)
    ap.add_argument("--calls", type=int, default=200)
    a = harness.start(ap, argv, {"reps": 2, "calls": 3}, rank_threads=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, a.reps, a.calls), nprocs=2)


if __name__ == "__main__":
    main()
