"""Does a 2-stage GPipe step split the compute? Wall and CPU time per step, pipeline vs sequential.

A diagnostic for shared machines, where wall-time speed-ups are dominated by waiting for a CPU:
8 residual Linear(512) blocks, 5 micro-batches of 400 rows, ScheduleGPipe over gloo with static
shapes (as gnnpar's pipeline strategy builds it), one thread per process. Each repetition times
one pipeline step on both ranks, then (rank 0) one sequential step of the same 8 blocks on the
whole batch in the same process. If the stages overlap, rank 0's CPU seconds per pipeline step
are about half of the sequential step's; the wall-time speed-up approaches the GPipe bound
2*5/6 = 1.67 only when both ranks get a core of their own.

Run: ``python -m benchmarks.comm.pipeline_stage_overlap [--reps 8]`` (it spawns its two ranks).
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from benchmarks import harness


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, reps=8)
    ap.add_argument("--chunks", type=int, default=5, help="micro-batches")
    ap.add_argument("--rows", type=int, default=400, help="rows per micro-batch")
    a = harness.start(ap, argv, {"reps": 2, "chunks": 2, "rows": 8}, rank_threads=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, a.reps, a.chunks, a.rows), nprocs=2, join=True)
    return 0


def rank_main(rank: int, port: int, reps: int, chunks: int, rows: int) -> None:
    harness.set_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timeout)
    torch.manual_seed(0)
    full = nn.Sequential(*[Block() for _ in range(8)])
    part = full[:4] if rank == 0 else full[4:]
    x_in = torch.zeros(rows, 512, requires_grad=rank > 0)
    x_out = torch.zeros(rows, 512, requires_grad=True)
    stage = PipelineStage(
        part, rank, 2, torch.device("cpu"), input_args=(x_in,), output_args=(x_out,)
    )
    sched = ScheduleGPipe(stage, chunks, loss_fn=lambda o, t: o.sum(), scale_grads=False)
    x = torch.randn(chunks * rows, 512)
    out = []
    for _ in range(reps):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=x, losses=[])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if rank == 0:
            t0, c0 = time.perf_counter(), time.process_time()
            full(x).sum().backward()
            out.append((wall, cpu, time.perf_counter() - t0, time.process_time() - c0))
        dist.barrier()
    if rank == 0:
        med = [statistics.median(o[i] for o in out) for i in range(4)]
        print(f"pipeline step: wall {med[0]:.3f} s, rank-0 CPU {med[1]:.3f} s")
        print(f"sequential step: wall {med[2]:.3f} s, CPU {med[3]:.3f} s")
        print(
            f"wall speed-up {med[2] / med[0]:.2f} (bound {2 * chunks / (chunks + 1):.2f}); "
            f"rank-0 CPU share of sequential {med[1] / med[3]:.2f} (ideal 0.50)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
