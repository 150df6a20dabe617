"""Dropout's forward and backward on the CPU: ``F.dropout`` (``bernoulli_``), the mask from
``torch.rand`` (gnnpar's dropout until 2026-11-27) and gnnpar's hashed masks
(``gnnpar.models.dropout``), on the shapes study 002's models drop (issue 21).

Per shape and side (the heap reusing large blocks, as the sampled strategy sets it): the median over ``--reps`` timings of forward + backward of ``dropout(x)``
with ``x`` requiring a gradient, sides alternating within each repetition, one thread unless
``--threads``; the ratio of each side to gnnpar's is the median of per-repetition ratios.

    python -m benchmarks.kernels.dropout_masks [--reps 15] [--threads 1]

Run it alone on the machine (``flock`` the benchmark lock).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks import harness
from gnnpar.models import gat_kernel
from gnnpar.models.dropout import dropout as hashed
from gnnpar.runtime.allocator import reuse_large_blocks

# (what, rows, columns, p): gat3's and sage's first-layer input (23,194 sampled nodes x 602
# features, synthetic-reddit 0.1, 25-10-10, 1024 seeds), sage's hidden output (22,920 x 256),
# the attention dropout of gat3's first layer (~245K edges x 1 head)
SHAPES = [
    ("input features, p 0.6", 23_194, 602, 0.6),
    ("sage hidden rows, p 0.5", 22_920, 256, 0.5),
    ("attention weights, p 0.6", 244_556, 1, 0.6),
]


def rand_mask(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """gnnpar's dropout before 2026-11-27: a float mask from torch.rand, scaled."""
    return x * torch.rand_like(x).ge_(p).mul_(1.0 / (1.0 - p))


SIDES = {"F.dropout": lambda x, p, t: F.dropout(x, p, t), "torch.rand": rand_mask, "gnnpar": hashed}


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__, reps=15, threads=1)
    args = harness.start(ap, argv, {"reps": 2})
    shapes = SHAPES
    if args.smoke:  # the shapes a hundredth as tall
        shapes = [(what, max(rows // 100, 1), cols, p) for what, rows, cols, p in SHAPES]
    # as the sampled strategy trains: freed blocks are reused, not mapped and zero-filled again
    reused = reuse_large_blocks()
    print(f"compiled kernel: {gat_kernel.available()}; large blocks reused: {reused}")
    print(
        "| shape | F.dropout ms | torch.rand ms | gnnpar ms | F.dropout / gnnpar | torch.rand / gnnpar |"
    )
    print("|---|---|---|---|---|---|")
    for what, rows, cols, p in shapes:
        x = torch.randn(rows, cols, requires_grad=True)
        g = torch.randn(rows, cols)
        # warm-up (allocator, page faults), then the sides alternating
        calls = {
            name: (lambda fn=fn, x=x, g=g, p=p: fn(x, p, True).backward(g))
            for name, fn in SIDES.items()
        }
        times = harness.alternate(calls, args.reps, after=lambda x=x: setattr(x, "grad", None))
        med = {k: harness.median_ms(v) for k, v in times.items()}
        ratio = {
            k: harness.median_ratio(times[k], times["gnnpar"]) for k in ("F.dropout", "torch.rand")
        }
        print(
            f"| {what} ({rows} x {cols}) | {med['F.dropout']:.1f} | {med['torch.rand']:.1f} | "
            f"{med['gnnpar']:.1f} | {ratio['F.dropout']:.2f} | {ratio['torch.rand']:.2f} |"
        )
    print(f"load after {harness.load_average()}")


if __name__ == "__main__":
    main()
