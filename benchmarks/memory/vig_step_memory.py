"""ViG (study 000): peak memory of one training step, by batch size, kNN chunking and recompute.

Each measurement is a fresh process (``--child``) that builds the study's model (8 blocks,
C = 107), takes one synthetic-cifar10-shaped mini-batch (3 x 32 x 32 images, 10 classes) and
runs one training step: forward, NLL loss, backward, Adam step. With ``--chunks M`` the step
accumulates the gradients of M equal micro-batches (each loss scaled by its share of the batch),
as a GPipe stage does; with M = 1 it is the whole batch at once, as the sequential strategy.
The child reports its peak resident set (VmHWM of /proc/self/status, the kernel's high-water
mark, so short-lived peaks count) and the step's wall time.

Variants: ``unchunked`` = the kNN scores of the whole batch at once (the implementation before
issue 13: ``KNN_CHUNK_BYTES`` set beyond any batch); ``chunked`` = today's default;
``recompute`` = chunked plus ``--recompute`` (each block keeps only its input for backward).

Sizes too big for the machine are not run: ``--max-gib`` skips any run whose peak, predicted
by a straight line through the runs already made for that variant, would exceed it (the
prediction is printed instead).

Run: ``python -m benchmarks.memory.vig_step_memory [--batches 10,20,40] [--variants unchunked,chunked,
recompute] [--chunks 1] [--max-gib 12] [--out bench-out/vig_memory.json]``
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

GIB = 1 << 30


def child(batch: int, chunks: int, variant: str, threads: int) -> None:
    import torch
    import torch.nn.functional as F

    import gnnpar.models.vig as vig
    from gnnpar.config.schema import Config
    from gnnpar.configure import resolve
    from gnnpar.models import build_model

    harness.set_threads(threads)
    if variant == "unchunked":
        vig.KNN_CHUNK_BYTES = 1 << 62
    cfg = Config()
    cfg.data.dataset, cfg.model.name = "synthetic-cifar10", "vig"
    resolve(cfg)
    cfg.model.recompute = variant == "recompute"
    torch.manual_seed(0)
    model = build_model(cfg.model, in_dim=3, num_classes=10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    base = rss_hwm()
    t0 = time.perf_counter()
    for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):
        loss = F.nll_loss(model(xs), ys, reduction="sum") / batch
        loss.backward()
    opt.step()
    wall = time.perf_counter() - t0
    print(json.dumps({"peak_bytes": rss_hwm(), "before_step_bytes": base, "step_s": wall}))


def rss_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def predict(points: list[tuple[int, int]], batch: int) -> float | None:
    """Peak bytes at ``batch`` on the line through the two largest measured batches."""
    if len(points) < 2:
        return None
    (b0, p0), (b1, p1) = sorted(points)[-2:]
    return p1 + (p1 - p0) / (b1 - b0) * (batch - b1)


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--batches", default="10,20,40")
    ap.add_argument("--variants", default="unchunked,chunked,recompute")
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-gib", type=float, default=12.0)
    ap.add_argument("--out", default="bench-out/vig_memory.json")
    ap.add_argument("--child", nargs=3, metavar=("BATCH", "CHUNKS", "VARIANT"))
    a = ap.parse_args(argv)
    if a.child:
        child(int(a.child[0]), int(a.child[1]), a.child[2], a.threads)
        return
    if a.smoke:  # one tiny batch of today's default, its own process as always
        a.batches, a.variants = "2", "chunked"
        a.out = str(Path(tempfile.mkdtemp(prefix="gnnpar-vig-")) / "vig_step_memory.json")
    harness.print_header(a.threads)
    rows = []
    for variant in a.variants.split(","):
        points: list[tuple[int, int]] = []
        for batch in sorted(int(b) for b in a.batches.split(",")):
            guess = predict(points, batch)
            row = {"variant": variant, "batch": batch, "chunks": a.chunks}
            if guess is not None and guess > a.max_gib * GIB:
                row["predicted_peak_gib"] = guess / GIB
                print(f"{variant:10s} batch {batch:5d}: predicted {guess / GIB:.2f} GiB, not run")
                rows.append(row)
                continue
            cmd = [sys.executable, "-m", __spec__.name, "--threads", str(a.threads), "--child"]
            cmd += [str(batch), str(a.chunks), variant]
            done = subprocess.run(
                cmd, check=True, capture_output=True, text=True, env=harness.module_env(),
                cwd=harness.ROOT,
            )  # fmt: skip
            res = json.loads(done.stdout.strip().splitlines()[-1])
            points.append((batch, res["peak_bytes"]))
            row.update(peak_gib=res["peak_bytes"] / GIB, step_s=res["step_s"])
            row["load_1min"] = harness.load_average()[0]
            rows.append(row)
            print(
                f"{variant:10s} batch {batch:5d}: peak {res['peak_bytes'] / GIB:.3f} GiB, "
                f"step {res['step_s']:.1f} s, load {row['load_1min']}",
                flush=True,
            )
        if len(points) >= 2:
            (b0, p0), (b1, p1) = sorted(points)[-2:]
            slope = (p1 - p0) / (b1 - b0)
            print(
                f"{variant:10s} {slope / 2**20:.2f} MiB per image; "
                f"batch 1000 on that line: {(p1 + slope * (1000 - b1)) / GIB:.2f} GiB"
            )
    harness.write_json(a.out, {"machine": harness.machine(a.threads), "rows": rows})


if __name__ == "__main__":
    main()
