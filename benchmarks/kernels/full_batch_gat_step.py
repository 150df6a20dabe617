"""Study 001's full-batch GAT step (Cora, CiteSeer), timed and profiled per op (issue 21).

gat: dropout 0.6 -> GATConv(8 heads x 8) -> ELU -> dropout 0.6 -> GATConv(classes, 8 heads
averaged), Adam 5e-3, weight decay 5e-4: what the sequential strategy runs per step (forward on
the whole graph, NLL on the training rows, backward, Adam). Prints the median step over
``--reps`` steps after ``--warmup``; with ``--profile`` torch.profiler's table over ``--reps``
steps (self CPU time per op, calls per step).

    python -m benchmarks.kernels.full_batch_gat_step --dataset cora --threads 2 [--profile]

Run it alone on the machine (``flock`` the benchmark lock).
"""

from __future__ import annotations

import statistics
import time

try:  # first, as for the CLI: gnnpar's OpenMP settings apply only before torch loads
    import gnnpar  # noqa: F401
except ImportError as e:
    raise SystemExit(f"full_batch_gat_step: gnnpar is not importable ({e})") from None

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import gnnpar.models.gat as gat  # noqa: E402
from benchmarks import harness  # noqa: E402
from gnnpar.config.schema import ModelConfig  # noqa: E402
from gnnpar.data.datasets import load_dataset  # noqa: E402
from gnnpar.models import build_model  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=100, threads=1, data_root=True)
    p.add_argument("--dataset", default="cora")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--rows", type=int, default=40, help="rows of the profile table")
    p.add_argument("--torch-softmax", action="store_true", help="no fused edge softmax")
    args = harness.start(
        p, argv, {"reps": 3, "warmup": 1}, header=False
    )  # printed with the figures
    gat.FUSED_SOFTMAX = not args.torch_softmax
    root = args.data_root or str(harness.smoke_root())
    ds = load_dataset(args.dataset, root)
    d = ds.data
    torch.manual_seed(0)
    mcfg = ModelConfig(name="gat", hidden=8, layers=2, heads=8, dropout=0.6)
    model = build_model(mcfg, d.num_features, ds.num_classes, False).train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    x, edge_index, y, train = d.x, d.edge_index, d.y, d.train_mask

    def step() -> None:
        loss = F.nll_loss(model(x, edge_index)[train], y[train])
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    harness.print_header(args.threads)
    print(
        f"{args.dataset} gat step: median {step_s * 1e3:.2f} ms (min {min(times) * 1e3:.2f}, "
        f"max {max(times) * 1e3:.2f}) over {args.reps}"
    )
    if args.profile:
        from torch.profiler import profile

        with profile() as prof:
            for _ in range(args.reps):
                step()
        print(f"profile over {args.reps} steps (divide counts and totals by it)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
