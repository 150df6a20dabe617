"""``--precision bf16`` against fp32: the time of one training step, per workload, on this machine.

Each workload's step is what the loop runs for it (gnnpar's model, loss and Adam; forward, loss
and backward under :func:`gnnpar.training.precision.autocast`, as :mod:`gnnpar.training.loop` enters it), on
data built once: nothing is loaded or sampled inside the timed step.

* ``cora-gat``: study 001's GAT, a full-batch step on Cora (the CSR input projection stays
  fp32; the attention and message passing are elementwise/scatter work autocast leaves fp32).
* ``reddit-sage-sampled``: study 002's GraphSAGE (3 x 256), one neighbour-sampled batch of
  ``--batch-size`` seeds with fan-outs 25,10,10 from synthetic-reddit at ``--scale``.
* ``vig-small``: study 000's ViG blocks (C = 107) on synthetic-cifar10, ``--vig-layers`` blocks,
  a batch of ``--vig-batch`` images.
* ``matmul-1024``: one 1024 x 1024 product (no autograd): whether this CPU multiplies bfloat16
  faster than fp32 at all (oneDNN uses AVX512-BF16 / AMX where the CPU has them).

fp32 and bf16 steps alternate (which goes first alternates too), each on its own copy of the
model, so both see the same machine load; ``--reps`` timed pairs after ``--warmup`` untimed ones.
Reported: the median step of each side and the median of the per-pair ratios bf16 / fp32
(< 1: bf16 is faster), wall time and this thread's CPU time (robust to other jobs on a shared
machine when ``--threads 1``), plus the CPU's bf16-related flags and the load average.

    python -m benchmarks.kernels.bf16_vs_fp32_step                    # every workload, 1 thread
    python -m benchmarks.kernels.bf16_vs_fp32_step --workloads cora-gat --reps 50 --threads 2
    python -m benchmarks.kernels.bf16_vs_fp32_step --out runs/bf16_vs_fp32.json
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import gnnpar
from benchmarks import harness
from gnnpar.configure import build_config
from gnnpar.data.datasets import load_dataset
from gnnpar.models import build_model
from gnnpar.training.losses import graph_loss, image_loss, seed_loss
from gnnpar.training.optim import build_optimizer
from gnnpar.training.precision import autocast

PRECISIONS = ("fp32", "bf16")
CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx512_vnni", "avx2")


def cpu_flags() -> dict:
    """The CPU model and which of the bf16-relevant instruction sets it reports."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": harness.cpu_model(), "flags": []}
    model = harness.cpu_model()
    flags = set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())
    return {
        "model": model,
        "flags": [f for f in CPU_FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def training_step(cfg, model_cfg, in_dim, classes, multilabel, loss: Callable) -> Callable:
    """A fresh model and optimizer (same seed for both precisions) and its step function."""
    torch.manual_seed(0)
    model = build_model(model_cfg, in_dim, classes, multilabel)
    opt = build_optimizer(cfg, model.parameters())

    def step(precision: str) -> None:
        opt.zero_grad(set_to_none=True)
        with autocast(precision, "cpu"):
            value = loss(model)
            value.backward()
        opt.step()

    return step


def cora_gat(args) -> dict[str, Callable]:
    cfg = build_config(None, {"dataset": "cora", "model": "gat", "quiet": True})
    ds = load_dataset("cora", cfg.data.data_root)
    return {
        p: training_step(
            cfg,
            cfg.model,
            ds.num_features,
            ds.num_classes,
            ds.multilabel,
            lambda m: graph_loss(m, ds.data, ds.multilabel),
        )
        for p in PRECISIONS
    }


def reddit_sage_sampled(args) -> dict[str, Callable]:
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler

    flags = {"dataset": "synthetic-reddit", "scale": args.scale, "model": "sage"}
    cfg = build_config(None, {**flags, "strategy": "sampled", "quiet": True})
    ds = load_dataset("synthetic-reddit", cfg.data.data_root, args.scale, 0)
    d = ds.data
    sampler = NeighborSampler(CSRGraph.from_edge_index(d.edge_index, ds.num_nodes), [25, 10, 10])
    train = d.train_mask.nonzero().view(-1)
    gen = torch.Generator().manual_seed(0)
    seeds = train[torch.randperm(train.numel(), generator=gen)[: args.batch_size]]
    b = sampler.sample(seeds, gen)
    b.x, b.y = d.x[b.n_id], d.y[seeds]
    batch = b.to_data()
    return {
        p: training_step(
            cfg,
            cfg.model,
            ds.num_features,
            ds.num_classes,
            ds.multilabel,
            lambda m: seed_loss(m, batch, ds.multilabel),
        )
        for p in PRECISIONS
    }


def vig_small(args) -> dict[str, Callable]:
    flags = {"dataset": "synthetic-cifar10", "scale": 0.02, "model": "vig"}
    cfg = build_config(None, {**flags, "layers": args.vig_layers, "quiet": True})
    ds = load_dataset("synthetic-cifar10", cfg.data.data_root, 0.02, 0)
    xy = (ds.train_x[: args.vig_batch], ds.train_y[: args.vig_batch])
    return {
        p: training_step(
            cfg,
            cfg.model,
            ds.num_features,
            ds.num_classes,
            ds.multilabel,
            lambda m: image_loss(m, xy, "cpu"),
        )
        for p in PRECISIONS
    }


def matmul(args) -> dict[str, Callable]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)

    def step(precision: str) -> None:
        with torch.no_grad(), autocast(precision, "cpu"):
            torch.mm(a, b)

    return {p: step for p in PRECISIONS}


WORKLOADS = {
    "cora-gat": cora_gat,
    "reddit-sage-sampled": reddit_sage_sampled,
    "vig-small": vig_small,
    "matmul-1024": matmul,
}


def measure(steps: dict[str, Callable], reps: int, warmup: int) -> dict:
    wall: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    cpu: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for i in range(warmup + reps):
        order = PRECISIONS if i % 2 == 0 else PRECISIONS[::-1]
        for p in order:
            t0, c0 = time.perf_counter(), time.thread_time()
            steps[p](p)
            if i >= warmup:
                wall[p].append(time.perf_counter() - t0)
                cpu[p].append(time.thread_time() - c0)
    out: dict = {}
    for name, times in (("wall", wall), ("cpu", cpu)):
        ratios = [b / f for f, b in zip(times["fp32"], times["bf16"]) if f > 0]
        out[name] = {
            "fp32_ms": statistics.median(times["fp32"]) * 1e3,
            "bf16_ms": statistics.median(times["bf16"]) * 1e3,
            "ratio_bf16_over_fp32": statistics.median(ratios),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=20, threads=1, out=True)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--scale", type=float, default=0.01, help="synthetic-reddit scale")
    p.add_argument("--batch-size", type=int, default=1024, help="sampled seeds per batch")
    p.add_argument("--vig-layers", type=int, default=2)
    p.add_argument("--vig-batch", type=int, default=8)
    smoke = {"reps": 1, "warmup": 1, "scale": 0.005, "batch_size": 64}
    args = harness.start(p, argv, {**smoke, "vig_layers": 1, "vig_batch": 2})
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {**harness.machine(args.threads), **cpu_flags()},
        "versions": {"torch": torch.__version__, "gnnpar": gnnpar.__version__},
        "threads": args.threads,
        "reps": args.reps,
        "load_before": harness.load_average(),
        "workloads": {},
    }
    print(json.dumps(report["machine"]), flush=True)
    for name in args.workloads.split(","):
        steps = WORKLOADS[name](args)
        r = measure(steps, args.reps, args.warmup)
        r["load_after"] = harness.load_average()[0]
        report["workloads"][name] = r
        w, c = r["wall"], r["cpu"]
        print(
            f"{name:20s} fp32 {w['fp32_ms']:8.1f} ms  bf16 {w['bf16_ms']:8.1f} ms  "
            f"bf16/fp32 wall {w['ratio_bf16_over_fp32']:.2f}  cpu {c['ratio_bf16_over_fp32']:.2f}"
            f"  (load {r['load_after']:.1f})",
            flush=True,
        )
    if args.out:
        harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
