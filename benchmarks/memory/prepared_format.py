"""Peak memory and time of ``gnnpar prepare`` (the bounded-memory stream) against the in-memory
generator it replaces, and a sampled GraphSAGE epoch from a prepared folder against the same
epoch from memory.

Every measurement runs in a fresh process; its peak RSS is the kernel's ``ru_maxrss`` of that
process tree (``os.wait4``). Figures:

- ``prepare``: ``gnnpar prepare --dataset synthetic-papers100m --scale S`` (the stream), at each
  ``--scales``: seconds, CPU seconds (user + system: the figure to compare on a shared
  machine), peak RSS, the folder's bytes;
- ``baseline``: the earlier all-in-memory generator (``synthetic.generate_in_memory``, version
  sbm-2) at ``--baseline-scale``, skipped when the machine has less memory available than it
  needs (~6 GiB per 0.01 of scale);
- ``epoch``: ``gnnpar train --strategy sampled --model sage`` (3 x 256, fan-outs 15-10-5,
  batch 1024, one rank, ``--threads``) for one epoch over ``--epoch-scale``, from the prepared
  folder and from memory (``--dataset synthetic-papers100m``, its cache built first, untimed),
  alternating sides for ``--repeats`` rounds: ``train_time_s`` from result.json (the final
  evaluation excluded) and peak RSS (evaluation included), with the median of each side and the
  ratio disk / memory. The loss curves of the two sides must be equal (checked).

Run: ``python benchmarks/memory/prepared_format.py [--smoke] [--out FILE.json]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATASET = "synthetic-papers100m"


def peak_of(cmd: list[str], env: dict | None = None) -> tuple[float, float, float, str]:
    """(seconds, CPU seconds, peak RSS in GiB, stdout) of ``cmd``, run under a wrapper process whose
    RUSAGE_CHILDREN high-water mark is that of ``cmd``'s process tree alone."""
    wrapper = (
        "import json, resource, subprocess, sys, time\n"
        "t0 = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps({'rc': p.returncode, 'seconds': time.perf_counter() - t0,\n"
        "    'cpu_s': ru.ru_utime + ru.ru_stime,\n"
        "    'peak_gib': ru.ru_maxrss / 2**20, 'out': p.stdout, 'err': p.stderr[-2000:]}))\n"
    )
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    p = subprocess.run(
        [sys.executable, "-c", wrapper, *cmd], env=full_env, capture_output=True, text=True
    )
    r = json.loads(p.stdout)
    if r["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r['rc']}): {r['err']}")
    return r["seconds"], r["cpu_s"], r["peak_gib"], r["out"]


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def folder_gib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir()) / 2**30


def prepare(tmp: Path, scale: float) -> dict:
    out = tmp / f"papers-{scale:g}"
    cmd = [sys.executable, "-m", "gnnpar", "prepare", "--dataset", DATASET]
    cmd += ["--scale", str(scale), "--out", str(out), "--quiet"]
    seconds, cpu, peak, _ = peak_of(cmd)
    m = json.loads((out / "manifest.json").read_text())
    return {
        "scale": scale,
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_rss_gib": peak,
        "folder_gib": folder_gib(out),
        "nodes": m["num_nodes"],
        "edges": m["num_edges"],
        "folder": str(out),
    }


def baseline(scale: float) -> dict:
    code = (
        "from gnnpar.data import synthetic\n"
        f"t, _ = synthetic.generate_in_memory(synthetic.PAPERS100M, {scale}, 0)\n"
        "print(t['edge_index'].size(1))\n"
    )
    seconds, cpu, peak, out = peak_of([sys.executable, "-c", code])
    return {
        "scale": scale,
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_rss_gib": peak,
        "edges": int(out),
    }


def epoch(dataset: str, root: Path, out: Path, args, scale: float | None) -> dict:
    cmd = [sys.executable, "-m", "gnnpar", "train", "--dataset", dataset]
    cmd += ["--data-root", str(root), "--strategy", "sampled", "--model", "sage"]
    cmd += ["--hidden", "256", "--layers", "3", "--fanouts", "15,10,5", "--batch-size", "1024"]
    cmd += ["--epochs", "1", "--threads", str(args.threads), "--seed", "0", "--quiet"]
    cmd += ["--out", str(out), "--loader-workers", str(args.loader_workers)]
    if scale is not None:
        cmd += ["--scale", str(scale)]
    if args.max_steps:
        cmd += ["--max-steps", str(args.max_steps)]
    seconds, cpu, peak, _ = peak_of(cmd)
    r = json.loads((out / "result.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_s": seconds,
        "cpu_s": cpu,
        "train_time_s": r["train_time_s"],
        "peak_rss_gib": peak,
        "loss_curve": r["loss_curve"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run of every part (seconds)")
    ap.add_argument("--scales", default="0.02,0.1")
    ap.add_argument("--baseline-scale", type=float, default=0.02)
    ap.add_argument("--epoch-scale", type=float, default=0.02)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loader-workers", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="where the folders go (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.smoke:
        args.scales, args.baseline_scale, args.epoch_scale = "0.0005", 0.0005, 0.0005
        args.repeats, args.max_steps, args.threads = 1, 2, 1
    tmp = Path(tempfile.mkdtemp(prefix="gnnpar-prepared-bench-", dir=args.tmp))
    load = os.getloadavg()
    report: dict = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "load_at_start": load,
        "python": platform.python_version(),
        "prepare": [],
    }
    try:
        for s in [float(v) for v in args.scales.split(",")]:
            report["prepare"].append(prepare(tmp, s))
            print(json.dumps(report["prepare"][-1]), flush=True)
        need = 6.0 * args.baseline_scale / 0.01 + 2
        if available_gib() > need:
            report["baseline"] = baseline(args.baseline_scale)
        else:
            report["baseline"] = {
                "skipped": f"{available_gib():.1f} GiB available, ~{need:.0f} GiB needed"
            }
        print(json.dumps(report["baseline"]), flush=True)
        folder = next(
            (Path(p["folder"]) for p in report["prepare"] if p["scale"] == args.epoch_scale),
            None,
        ) or Path(prepare(tmp, args.epoch_scale)["folder"])
        root = tmp / "root"
        if not args.smoke:  # the in-memory side's cache, built once and untimed
            epoch(DATASET, root, tmp / "warm", args, args.epoch_scale)
        sides: dict[str, list] = {"memory": [], "disk": []}
        for i in range(args.repeats):
            order = ("memory", "disk") if i % 2 == 0 else ("disk", "memory")
            for side in order:
                ds, sc = (DATASET, args.epoch_scale) if side == "memory" else (str(folder), None)
                sides[side].append(epoch(ds, root, tmp / f"{side}{i}", args, sc))
                print(side, json.dumps(sides[side][-1])[:300], flush=True)
        curves = {json.dumps(r["loss_curve"]) for rs in sides.values() for r in rs}
        med = {
            side: {
                k: statistics.median(r[k] for r in rs)
                for k in ("train_time_s", "wall_s", "cpu_s", "peak_rss_gib")
            }
            for side, rs in sides.items()
        }
        report["epoch"] = {
            "scale": args.epoch_scale,
            "threads": args.threads,
            "loader_workers": args.loader_workers,
            "runs": sides,
            "median": med,
            "ratio_train_time_disk_over_memory": med["disk"]["train_time_s"]
            / med["memory"]["train_time_s"],
            "ratio_peak_rss_disk_over_memory": med["disk"]["peak_rss_gib"]
            / med["memory"]["peak_rss_gib"],
            "same_loss_curve": len(curves) == 1,
        }
        report["load_at_end"] = os.getloadavg()
        print(json.dumps({k: v for k, v in report["epoch"].items() if k != "runs"}, indent=1))
        if not report["epoch"]["same_loss_curve"]:
            raise SystemExit("the loss curves from disk and from memory differ")
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
