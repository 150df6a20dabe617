"""What crash safety costs: checkpoint time against step time, and what a restart loses.

    python -m benchmarks.robustness.checkpoint_cost --scale 1 --epochs 3 --reps 2

Runs `gnnpar train --dataset synthetic-reddit --model sage --strategy allreduce --workers 2
--partitions 40` with `--checkpoint-every 1` and without, alternating, `--reps` times each, and
reports per run: the median time one checkpoint took (result.json ``checkpoint_time_s``), the
median step time, and the checkpoint time per epoch as a share of the epoch's train time; then
one run with `--max-restarts 1` in which rank 1 is SIGKILLed after `--kill-after` steps (read
from metrics.jsonl): its wall time against the uninterrupted run's, and ``lost_time_s``.
Writes ``--json`` (default benchmarks/results/checkpoint_cost_scale<scale>.json).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import ROOT, rank_pids, wait_for_steps


def train(args: list[str], out: Path) -> tuple[dict, float]:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "gnnpar", "train", *args, "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=harness.module_env(), stdout=subprocess.DEVNULL)
    return json.loads((out / "result.json").read_text()), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--kill-after", type=int, default=30, help="steps before rank 1 is killed")
    p.add_argument("--out", default="bench-out/checkpoint_cost")
    p.add_argument("--json", default=None, help="the summary (default: benchmarks/results/...)")
    a = p.parse_args(argv)
    if a.smoke:  # the killed and restarted run alone, on a tiny graph; no warm-up
        a.scale, a.epochs, a.reps, a.kill_after = 0.005, 2, 0, 25  # after the first checkpoint
        a.out = tempfile.mkdtemp(prefix="gnnpar-ckpt-")
        a.json = str(Path(a.out) / "checkpoint_cost.json")
    harness.print_header(1)
    base = ["--dataset", "synthetic-reddit", "--scale", f"{a.scale:g}", "--model", "sage"]
    base += ["--strategy", "allreduce", "--workers", "2", "--partitions", "40", "--threads", "1"]
    base += ["--epochs", str(a.epochs), "--timeout", "600"]
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)  # nothing of an earlier run (its checkpoints!)
    if not a.smoke:
        train([*base, "--epochs", "1"], out / "warmup")  # builds the dataset and partition caches
    rows = []
    for rep in range(a.reps):
        for ckpt in (False, True) if rep % 2 == 0 else (True, False):
            flags = ["--checkpoint-every", "1"] if ckpt else []
            r, wall = train([*base, *flags], out / f"r{rep}-{int(ckpt)}")
            epoch_s = r["train_time_s"] / a.epochs
            per = r.get("checkpoint_time_s", {}).get("median", 0.0)
            rows.append({
                "checkpoint": ckpt, "rep": rep, "wall_s": wall, "train_s": r["train_time_s"],
                "step_median_s": r["step_time_s"]["median"], "checkpoint_median_s": per,
                "checkpoints": r.get("checkpoints_written", 0),
                "checkpoint_share_of_epoch": per / epoch_s if ckpt else 0.0,
            })  # fmt: skip
            print(rows[-1], flush=True)
    # a restart: rank 1 killed after --kill-after steps, resumed from the newest checkpoint
    kill_out = out / "killed"
    cmd = [sys.executable, "-m", "gnnpar", "train", *base, "--checkpoint-every", "1"]
    cmd += ["--max-restarts", "1", "--quiet", "--out", str(kill_out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=harness.module_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_for_steps(kill_out / "metrics.jsonl", a.kill_after, proc, deadline_s=3600)
    os.kill(rank_pids(proc.pid, 2)[1], signal.SIGKILL)
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, err.decode()[-2000:]
    r = json.loads((kill_out / "result.json").read_text())

    def median(key: str, checkpointed: bool = True) -> float | None:
        xs = [x[key] for x in rows if x["checkpoint"] or not checkpointed]
        return statistics.median(xs) if xs else None  # None: --reps 0

    plain = median("wall_s")
    restart = {"wall_s": wall, "uninterrupted_wall_s": plain, "lost_time_s": r.get("lost_time_s"),
               "restarts": r["restarts"], "resumed_from": r.get("resumed_from")}  # fmt: skip
    print(restart)
    summary = {
        "scale": a.scale, "epochs": a.epochs, "runs": rows, "restart": restart,
        "checkpoint_median_s": median("checkpoint_median_s"),
        "share_median": median("checkpoint_share_of_epoch"),
        "step_median_s": median("step_median_s", checkpointed=False),
        "machine": harness.machine(1),
    }  # fmt: skip
    path = a.json or harness.RESULTS / f"checkpoint_cost_scale{a.scale:g}.json"
    harness.write_json(path, summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
