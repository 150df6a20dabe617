"""How close gnnpar's sampled GraphSAGE step is to the floor of its arithmetic (issue 21).

Study 002's sage (3 x 256, mean, dropout 0.5, Adam 5e-3), fan-outs 25-10-10, 1024 seeds per
batch, synthetic-reddit at ``--scale``, one thread. It samples real batches with gnnpar's
sampler, counts the dense products a trimmed batch needs (layer 1: ``lin_l`` and ``lin_r`` over
the nodes within 2 hops, forward and weight gradients, no input gradient; layer 2: the same
plus the input gradients, over the nodes within 1 hop; layer 3 is negligible), times this
machine's sgemm on exactly those shapes (median of 7, after 3 warm-ups), and so gives the time
the products alone take: the floor, since every framework computes them (DGL's SAGEConv does
the same four first-layer products, projecting its sources first). Then it times gnnpar's
training step (median of 8, after 2) and, with ``--profile``, prints torch.profiler's table of
3 steps.

    python -m benchmarks.kernels.sampled_sage_floor --scale 0.1 [--profile]

Run it alone on the machine (``flock`` the benchmark lock): sgemm under load is ~2x slower.
"""

from __future__ import annotations

import statistics

import torch
from torch.nn import functional as F

from benchmarks import harness
from gnnpar.config.schema import ModelConfig
from gnnpar.data.datasets import load_dataset
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from gnnpar.models import build_model
from gnnpar.models.hops import HopGraph
from gnnpar.runtime.allocator import reuse_large_blocks

FANOUTS = [25, 10, 10]
SEEDS = 1024


REPS = {"gemm": (7, 3), "step": (8, 2)}  # (timed, warm-up); --smoke: (2, 1)


def median_time(fn, reps: int, warm: int) -> float:
    return statistics.median(harness.alternate({"fn": fn}, reps, warmup=warm)["fn"])


def gemm_s(m: int, k: int, n: int, weight_grad: bool) -> float:
    """Seconds for one [m, k] x [k, n] product (or the weight gradient [k, m] x [m, n])."""
    a = torch.randn(m, k)
    b = torch.randn(m, n) if weight_grad else torch.randn(k, n)
    return median_time((lambda: a.t() @ b) if weight_grad else (lambda: a @ b), *REPS["gemm"])


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, threads=1, data_root=True)
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--profile", action="store_true")
    args = harness.start(p, argv, {"scale": 0.01}, header=False)  # printed with the figures
    if args.smoke:
        REPS.update(gemm=(2, 1), step=(2, 1))
    reuse_large_blocks()  # as the sampled strategy does
    root = args.data_root or str(harness.smoke_root())
    ds = load_dataset("synthetic-reddit", root, args.scale, 0)
    d = ds.data
    sampler = NeighborSampler(CSRGraph.from_edge_index(d.edge_index, d.num_nodes), FANOUTS)
    train = d.train_mask.nonzero().view(-1)
    batches = -(-train.numel() // SEEDS)
    gen = torch.Generator().manual_seed(1)
    perm = train[torch.randperm(train.numel(), generator=gen)]

    # The products of a typical (median-sized) batch.
    sizes = []
    for i in range(min(5, batches - 1)):  # full batches only (a small graph has few)
        b = sampler.sample(perm[i * SEEDS : (i + 1) * SEEDS], gen)
        n = list(b.num_sampled_nodes)
        sizes.append((n[0] + n[1] + n[2], n[0] + n[1]))  # within 2 hops, within 1 hop
    within2, within1 = sorted(sizes)[len(sizes) // 2]
    f_in, hid = d.num_features, 256
    shapes = [  # (m, k, n, weight_grad, count)
        (within2, f_in, hid, False, 2),  # layer 1 forward: lin_l(mean x), lin_r(x_dst)
        (within2, f_in, hid, True, 2),  # layer 1 weight gradients
        (within1, hid, hid, False, 4),  # layer 2 forward (2) and input gradients (2)
        (within1, hid, hid, True, 2),  # layer 2 weight gradients
    ]
    floor_s, flops = 0.0, 0.0
    harness.print_header(1)
    for m, k, n, wg, count in shapes:
        t = gemm_s(m, k, n, wg)
        floor_s += count * t
        flops += count * 2 * m * k * n
        kind = "A^T B" if wg else "A B"
        print(
            f"  {count} x {kind} {m} x {k} x {n}: {t * 1e3:.1f} ms, {2 * m * k * n / t / 1e9:.1f} GFLOP/s"
        )

    torch.manual_seed(0)
    mcfg = ModelConfig(name="sage", hidden=hid, layers=3, heads=1, dropout=0.5)
    model = build_model(mcfg, f_in, ds.num_classes, False).train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    cursor = [0]

    def step() -> None:
        i = cursor[0] % (batches - 1)
        cursor[0] += 1
        b = sampler.sample(perm[i * SEEDS : (i + 1) * SEEDS], gen)
        x = d.x[b.n_id]
        graph = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        loss = F.cross_entropy(model(x, graph)[:SEEDS], d.y[b.n_id[:SEEDS]])
        opt.zero_grad()
        loss.backward()
        opt.step()

    step_s = median_time(step, *REPS["step"])
    print(
        f"batch: {within2} nodes within 2 hops, {within1} within 1; products {flops / 1e9:.1f} "
        f"GFLOP\nfloor (products alone): {floor_s:.3f} s per batch, {floor_s * batches:.2f} s "
        f"per {batches}-batch epoch\ngnnpar step (sample, gather, forward, backward, Adam): "
        f"{step_s:.3f} s = {step_s / floor_s:.2f}x the floor, {step_s * batches:.2f} s per epoch"
    )
    if args.profile:
        from torch.profiler import profile

        with profile() as prof:
            for _ in range(3):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))


if __name__ == "__main__":
    main()
