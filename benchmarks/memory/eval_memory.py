"""Memory: a sampled GraphSAGE run's final evaluation, with and without a memory limit (issue 41).

Runs ``gnnpar train`` (sampled GraphSAGE 3 x 256, fan-outs 15-10-5, batch 1024, 3 steps, then
the final full-graph evaluation) on ``synthetic-papers100m --scale 0.02`` (2.2M nodes, 32M
columns, 128 features) as a fresh process, the dataset's cache built first by a warm-up run that
is not measured, and records per side:

* peak RSS of the run's process (``ru_maxrss`` of the child: the kernel's high-water mark,
  which counts the memory-mapped dataset's resident pages too);
* for a side inside a memory cgroup (``--limit``, v1 or v2, made for the run and removed
  after; needs root), the cgroup's own peak where the kernel keeps one (v1
  ``memory.max_usage_in_bytes``; v2 ``memory.peak``, Linux 5.19+), page cache included;
* the exit status, the last line on stderr, the wall time, the evaluation's seconds (the
  epoch line's train time subtracted from the wall time is not taken: result.json's scores and
  ``train_time_s`` are recorded instead) and the scores.

Sides alternate over ``--reps`` rounds (``nolimit``, ``limit``); figures are the medians.
``--src PATH`` (repeatable) runs that tree's ``src`` instead of this one's (e.g. the main
checkout's, for the figures before a change); ``--sides limit`` runs only the limited side.

``--folder PATH`` trains from a prepared folder (``gnnpar prepare``) instead of the generated
dataset (no warm-up: nothing to build); ``--epochs``, ``--steps 0`` (whole epochs),
``--threads``, ``--loader-workers``, ``--eval-mode`` and ``--wait`` (gnnpar's ``--timeout``:
a batch read through a small page cache on a loaded machine can take minutes) are passed on, and each side records
how the final evaluation ran (result.json's ``eval_mode``, ``eval_fanouts``; the line that
says why) and its seconds (the final evaluation's, from ``test_step_time_s``); the folder's
pages are dropped from the page cache before each side. Each side also records its loss curve
(every step's loss from metrics.jsonl), each epoch's seconds and the load before and after it;
the report says whether every side's curve is the same bit for bit (``loss_curves_equal``).

    .venv/bin/python -m benchmarks.memory.eval_memory                      # 3 GiB cgroup
    .venv/bin/python -m benchmarks.memory.eval_memory --limit 1.5G --reps 3
    .venv/bin/python -m benchmarks.memory.eval_memory --folder /data/papers100m-0.1 \
        --sides limit --limit 3G --epochs 2 --steps 0 --threads 2 --loader-workers 1
    .venv/bin/python -m benchmarks.memory.eval_memory --smoke   # seconds, 22k nodes, no limit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from benchmarks import harness  # noqa: E402
from gnnpar.advise.profile.disk import drop_pages  # noqa: E402
from gnnpar.runtime import resources  # noqa: E402


def train_args(a: argparse.Namespace, out: Path) -> list[str]:
    data = ["--dataset", a.folder] if a.folder else [
        "--dataset", a.dataset, "--scale", str(a.scale), "--data-root", a.data_root,
    ]  # fmt: skip
    more = ["--max-steps", str(a.steps)] if a.steps > 0 else []
    if a.threads:
        more += ["--threads", str(a.threads)]
    if a.loader_workers:
        more += ["--loader-workers", str(a.loader_workers)]
    if a.eval_mode:
        more += ["--eval-mode", a.eval_mode]
    if a.wait:
        more += ["--timeout", str(a.wait)]
    return [
        "train", *data,
        "--strategy", "sampled", "--model", "sage", "--hidden", "256", "--layers", "3",
        "--fanouts", a.fanouts, "--batch-size", str(a.batch_size), "--epochs", str(a.epochs),
        *more, "--out", str(out),
    ]  # fmt: skip


# runs its arguments as a child and writes the child's peak RSS (KiB) to $GNNPAR_BENCH_PEAK
WRAP = (
    "import os, resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "open(os.environ['GNNPAR_BENCH_PEAK'], 'w').write(str(peak))\n"
    "sys.exit(code)\n"
)


def run_side(a: argparse.Namespace, src: str, limit: int | None, out: Path) -> dict:
    """One ``gnnpar train`` in a fresh process (inside a new memory cgroup when ``limit``)."""
    out.mkdir(parents=True, exist_ok=True)
    peak_file = out.parent / f"{out.name}.peak"
    argv = [sys.executable, "-c", WRAP, sys.executable, "-m", "gnnpar", *train_args(a, out)]
    env = {**os.environ, "PYTHONPATH": src, "PYTHONUNBUFFERED": "1"}
    env["GNNPAR_BENCH_PEAK"] = str(peak_file)
    env.pop("GNNPAR_MEMORY_LIMIT", None)
    if a.folder:  # every side starts from a cold page cache (the limit's side reads from disk)
        for array in sorted(Path(a.folder).glob("*.npy")):
            drop_pages(array)
    load_before = list(harness.load_average())
    t0 = time.perf_counter()
    peak_cgroup = None
    if limit is None:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=a.timeout)
    else:
        with resources.memory_cgroup(limit) as folder:
            p = subprocess.run(
                resources.in_cgroup(folder, argv),
                capture_output=True, text=True, env=env, timeout=a.timeout,
            )  # fmt: skip
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                try:
                    peak_cgroup = int((folder / name).read_text())
                    break
                except (OSError, ValueError):
                    continue
    wall = time.perf_counter() - t0
    load_after = list(harness.load_average())
    peak = int(peak_file.read_text()) * 1024 if peak_file.exists() else None
    result = out / "result.json"
    r = json.loads(result.read_text()) if result.exists() else {}
    err = [line for line in p.stderr.replace("\r", "\n").splitlines() if line.strip()]
    said = [
        line
        for line in (p.stdout + p.stderr).replace("\r", "\n").splitlines()
        if line.startswith("gnnpar: final evaluation")
    ]
    return {
        "exit": p.returncode,
        "wall_s": round(wall, 2),
        "peak_rss_bytes": peak,  # the run's process (ru_maxrss, by the wrapper)
        "cgroup_peak_bytes": peak_cgroup,
        "train_time_s": r.get("train_time_s"),
        "eval_mode": r.get("eval_mode"),
        "eval_fanouts": r.get("eval_fanouts"),
        "eval_time_s": r.get("test_step_time_s", {}).get("max"),  # the final evaluation
        "eval_line": said[-1] if said else None,
        "steps_per_epoch": r.get("steps_per_epoch"),
        "train_score": r.get("train_score"),
        "val_score": r.get("val_score"),
        "test_score": r.get("test_score"),
        "last_stderr": err[-1][:300] if err else "",
        "load_before": load_before,
        "load_after": load_after,
        **curve(out / "metrics.jsonl"),
    }


def curve(metrics: Path) -> dict:
    """The run's loss curve (every step's loss, as metrics.jsonl wrote it) and each epoch's
    seconds (``train_s`` is cumulative: the differences), from ``metrics``."""
    losses, train_s, cache = [], [], None
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a killed run's last line
            if rec.get("event") == "step":
                losses.append(rec["loss"])
            elif rec.get("event") == "epoch":
                train_s.append(rec["train_s"])
                cache = rec.get("feature_cache", cache)
    epochs = [round(b - a, 2) for a, b in zip([0.0, *train_s], train_s)]
    return {"steps": len(losses), "losses": losses, "epoch_s": epochs, "feature_cache": cache}


def same_curves(sides: dict[str, list[dict]]) -> bool | None:
    """Whether every run that trained wrote the same loss curve, bit for bit (None: fewer
    than two did)."""
    curves = [r["losses"] for v in sides.values() for r in v if r.get("losses")]
    return None if len(curves) < 2 else all(c == curves[0] for c in curves)


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--dataset", default="synthetic-papers100m")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--data-root", default=str(Path.home() / ".cache" / "gnnpar"))
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3, help="steps per epoch (0: whole epochs)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--folder", default=None, help="train from this prepared folder")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--loader-workers", type=int, default=0)
    ap.add_argument("--eval-mode", default=None, help="auto, layerwise or sampled (default: auto)")
    ap.add_argument("--limit", default="3G", help="the cgroup's limit (bytes, K/M/G)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument(
        "--src", action="append", default=[], help="a tree's src to run (default: this one's)"
    )
    ap.add_argument("--sides", default="nolimit,limit", help="which of nolimit, limit to run")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a side may take")
    ap.add_argument("--wait", type=float, default=None, help="gnnpar train's --timeout")
    ap.add_argument("--no-warm", action="store_true", help="the dataset's cache exists: no warm-up")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args(argv)
    if a.smoke:
        a.dataset, a.scale, a.steps, a.batch_size = "synthetic-papers100m", 0.0002, 1, 64
        a.fanouts, a.limit, a.no_warm, a.sides = "2,2,2", "1G", True, "nolimit"
        if "--data-root" not in (argv if argv is not None else sys.argv):
            a.data_root = str(harness.smoke_root())
    limit = resources.parse_bytes(a.limit)
    srcs = a.src or [str(ROOT / "src")]
    wanted = a.sides.split(",")
    with tempfile.TemporaryDirectory(prefix="gnnpar-evalmem-") as tmp:
        if not a.no_warm and not a.folder:
            run_side(a, srcs[0], None, Path(tmp) / "warm")  # builds the dataset's cache
        sides: dict[str, list[dict]] = {}
        for rep in range(a.reps):
            for src in srcs:
                for name, lim in (("nolimit", None), ("limit", limit)):
                    if name not in wanted:
                        continue
                    key = f"{src}:{name}"
                    try:
                        name_ = f"{srcs.index(src)}-{name}-{rep}"  # a folder inside tmp
                        r = run_side(a, src, lim, Path(tmp) / name_)
                    except resources.CgroupUnavailable as e:
                        r = {"skipped": f"no cgroup: {e}"}
                    sides.setdefault(key, []).append(r)
                    print(key, json.dumps(r), flush=True)
    report = {
        "what": "sampled sage 3x256 then final evaluation: peak RSS, exit, in and out of a cgroup",
        "machine": harness.machine(),
        "dataset": a.folder or a.dataset,
        "scale": None if a.folder else a.scale,
        "command": train_args(a, Path("OUT")),
        "limit_bytes": limit,
        "srcs": srcs,
        "sides": sides,
        "median_peak_rss_gib": {
            k: round(statistics.median(x["peak_rss_bytes"] for x in v) / 2**30, 2)
            for k, v in sides.items()
            if all(x.get("peak_rss_bytes") for x in v)
        },
        "loss_curves_equal": same_curves(sides),
    }
    if a.json:
        harness.write_json(a.json, report)
    print(
        json.dumps(report["median_peak_rss_gib"]), "loss curves equal:", report["loss_curves_equal"]
    )
    ran = [r for v in sides.values() for r in v if "skipped" not in r]
    return 0 if not a.smoke or all(r["exit"] == 0 for r in ran) else 1


if __name__ == "__main__":
    main()
