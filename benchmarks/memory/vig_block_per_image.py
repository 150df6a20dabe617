"""Is a ViG block's time proportional to its images? (``gnnpar advise`` scales per image.)

``gnnpar advise --model vig`` times each block on at most 16 images and scales per image
(:func:`gnnpar.advise.profile.profile_images`). This times one block of study 000's model
(C = 107, k = 9, 32 x 32 images) forward + backward on several image counts, the counts
alternating within each repetition, and prints the median seconds per image of each count and
its ratio to the smallest count's.

    python -m benchmarks.memory.vig_block_per_image --images 16,50,100,200 --reps 3 --threads 2
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks import harness
from gnnpar.models.vig import ViGBlock


def block_s(block: ViGBlock, x: torch.Tensor) -> float:
    inp = x.detach().requires_grad_(True)
    t0 = time.perf_counter()
    out = block(inp)
    out.backward(torch.ones_like(out))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--images", default="16,50,100,200")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=107)
    args = ap.parse_args(argv)
    if args.smoke:
        args.images, args.reps, args.hidden = "1,2", 1, 8
    harness.set_threads(args.threads)
    harness.print_header(args.threads)
    torch.manual_seed(0)
    counts = [int(n) for n in args.images.split(",")]
    block = ViGBlock(args.hidden)
    xs = {n: torch.randn(n, 32 * 32, args.hidden) for n in counts}
    for n in counts:  # warm-up
        block_s(block, xs[n])
    per_image: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(args.reps):
        for n in counts if r % 2 == 0 else reversed(counts):
            per_image[n].append(block_s(block, xs[n]) / n)
    base = statistics.median(per_image[counts[0]])
    print(f"one ViG block (C = {args.hidden}), forward + backward, {args.threads} thread(s)")
    print("| images | s per image (median) | all repetitions | against the first |")
    print("|---|---|---|---|")
    for n in counts:
        med = statistics.median(per_image[n])
        reps = ", ".join(f"{t:.4f}" for t in per_image[n])
        print(f"| {n} | {med:.4f} | {reps} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
