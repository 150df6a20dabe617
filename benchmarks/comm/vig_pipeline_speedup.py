"""ViG: 2-stage GPipe speed-up over sequential, against the bubble bound S*M/(M+S-1).

The target of issue 4: with 2 stages and 5 micro-batches on 2 cores, the pipeline reaches at
least 0.85 of the GPipe bound (2*5/6 = 1.67) against a sequential run with the same threads per
process (1). Sequential and pipeline runs alternate (A B A B ...) so that slow drifts of a shared
machine's load hit both alike; each run's step time is its median mini-batch (the first,
warm-up step included in the count but not dominating it); the reported speed-up is the median
over repetitions of sequential / pipeline.

Study 000's size (issue 13): ``--batch-size 1000 --recompute`` (both sides re-materialise each
block's activations in the backward pass; without it the sequential process would need ~53 GB).
``--scale`` sets the synthetic-cifar10 size (0.02: 900 training images, too few for a batch of
1000, where the pipeline stops with a usage error: use ``--scale 0.025``, 1125 training images).

Run: ``python -m benchmarks.comm.vig_pipeline_speedup [--reps 3] [--batch-size 20] [--steps 4]
[--hidden 107] [--chunks 5] [--recompute] [--scale 0.02] [--out bench-out/pipeline_speedup]``
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks import harness
from gnnpar.bench.report import run_config
from gnnpar.parallel.pipeline.stages import gpipe_bound


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__, reps=3)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=107)
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--out", default="bench-out/pipeline_speedup")
    # --smoke: one step each side, a narrow model
    smoke = {"reps": 1, "batch_size": 4, "steps": 1, "hidden": 8, "chunks": 2}
    a = harness.start(ap, argv, smoke, rank_threads=1)
    if a.smoke:
        a.out = tempfile.mkdtemp(prefix="gnnpar-pipe-")
    out = Path(a.out)
    base = {
        "dataset": "synthetic-cifar10",
        "scale": a.scale,  # 0.02: 1000 training images; only a few steps are run anyway
        "model": "vig",
        "hidden": a.hidden,
        "batch-size": a.batch_size,
        "max-steps": a.steps,
        "epochs": 1,
        "threads": 1,
        "seed": 0,
        "timeout": 1800,  # a wait on the other stage's 200-image micro-batch can take minutes
        **({"recompute": True} if a.recompute else {}),
    }
    pipe = {**base, "strategy": "pipeline", "stages": a.stages, "chunks": a.chunks}
    pipe["workers"] = a.stages
    reps = []
    for i in range(a.reps):
        seq = run_config({**base, "strategy": "sequential"}, out, f"seq{i}")
        par = run_config(pipe, out, f"pipe{i}")
        s, p = seq["step_time_s"]["median"], par["step_time_s"]["median"]
        reps.append({"sequential_s": s, "pipeline_s": p, "speedup": s / p})
        load = harness.load_average()[0]
        reps[-1]["load_1min_after"] = load
        print(
            f"rep {i}: sequential {s:.3f} s, pipeline {p:.3f} s, speed-up {s / p:.3f}, load {load}"
        )
    bound = gpipe_bound(a.stages, a.chunks)
    speedup = statistics.median(r["speedup"] for r in reps)
    summary = {
        "machine": harness.machine(1),
        "config": vars(a),
        "reps": reps,
        "median_speedup": speedup,
        "gpipe_bound": bound,
        "fraction_of_bound": speedup / bound,
        "balance": par["balance"],
    }
    harness.write_json(out / "summary.json", summary)
    print(f"median speed-up {speedup:.3f} = {speedup / bound:.3f} of the GPipe bound {bound:.3f}")


if __name__ == "__main__":
    main()
