"""``gnnpar prepare --shards H`` with each partitioner: seconds, CPU seconds, peak RSS, edge cut
and balance, over one prepared ``synthetic-papers100m`` folder.

The source folder is prepared once (untimed); then, for each ``--partitioners`` entry, a fresh
process runs ``gnnpar prepare --dataset SOURCE --shards H --partitioner P`` (its peak RSS is
the kernel's ``ru_maxrss`` of that process tree), and the folder's manifest gives the edge cut
(edges whose ends lie in different shards, share of all edges) and the balance (largest shard
over the mean). ``--repeats`` rounds, partitioners alternating within each round; medians.

Run: ``python benchmarks/memory/shard_partitioners.py [--smoke] [--out FILE.json]``
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
WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(json.dumps({'rc': p.returncode, 'seconds': time.perf_counter() - t0,\n"
    "    'cpu_s': ru.ru_utime + ru.ru_stime, 'peak_gib': ru.ru_maxrss / 2**20,\n"
    "    'err': p.stderr[-2000:]}))\n"
)


def measured(cmd: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run(
        [sys.executable, "-c", WRAPPER, *cmd], env=env, capture_output=True, text=True
    )
    r = json.loads(p.stdout)
    if r["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r['rc']}): {r['err']}")
    return r


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "load_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    ap.add_argument("--scale", type=float, default=0.005)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--partitioners", default="random,stream,metis")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tmp", default=None, help="where the folders go (default: a temp dir)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    a = ap.parse_args()
    if a.smoke:
        a.scale, a.shards, a.repeats = 0.0002, 2, 1
    tmp = Path(tempfile.mkdtemp(prefix="shard-bench-", dir=a.tmp))
    gnnpar = [sys.executable, "-m", "gnnpar", "prepare", "--quiet"]
    try:
        source = tmp / "source"
        measured([*gnnpar, "--dataset", "synthetic-papers100m", "--scale", str(a.scale),
                  "--out", str(source)])  # fmt: skip
        m = json.loads((source / "manifest.json").read_text())
        runs: dict[str, list[dict]] = {p: [] for p in a.partitioners.split(",")}
        for i in range(a.repeats):
            for p in runs:
                out = tmp / f"{p}-{i}"
                r = measured([*gnnpar, "--dataset", str(source), "--shards", str(a.shards),
                              "--partitioner", p, "--out", str(out)])  # fmt: skip
                rec = json.loads((out / "manifest.json").read_text())["partition"]
                runs[p].append({**r, "partition": rec})
                print(f"{p}: {r['seconds']:.1f} s, cpu {r['cpu_s']:.1f} s, peak "
                      f"{r['peak_gib']:.2f} GiB, cut {rec['edge_cut_share']:.3f}, balance "
                      f"{rec['balance']:.3f}", file=sys.stderr)  # fmt: skip
                shutil.rmtree(out)
        result = {
            "what": "gnnpar prepare --shards H --partitioner P over a prepared folder",
            "machine": machine(),
            "graph": {
                "dataset": "synthetic-papers100m",
                "scale": a.scale,
                "nodes": m["num_nodes"],
                "edges": m["num_edges"],
            },  # fmt: skip
            "shards": a.shards,
            "partitioners": {
                p: {
                    "median_seconds": statistics.median(r["seconds"] for r in rs),
                    "median_cpu_s": statistics.median(r["cpu_s"] for r in rs),
                    "max_peak_gib": max(r["peak_gib"] for r in rs),
                    "edge_cut_share": rs[0]["partition"]["edge_cut_share"],
                    "balance": rs[0]["partition"]["balance"],
                    "runs": [{k: r[k] for k in ("seconds", "cpu_s", "peak_gib")} for r in rs],
                }
                for p, rs in runs.items()
            },
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
