"""Time and peak memory of generating the synthetic graphs, and of loading them from the cache.

Each measurement runs in a fresh process (so its peak RSS, ``ru_maxrss``, is its own) against a
temporary data root that is deleted afterwards (``--keep`` keeps it). At scale 1 the graphs have
the sizes of study 003 table 3.1; generating both needs about 10 GB free disk and RAM.

Run: ``python -m benchmarks.memory.synthetic_data_generation [--scale 1] [--datasets synthetic-reddit,...]``
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

CHILD = r"""
import json, resource, sys, time
from gnnpar.data.datasets import load_dataset
name, root, scale = sys.argv[1], sys.argv[2], float(sys.argv[3])
t0 = time.perf_counter()
ds = load_dataset(name, root, scale, 0)
x = ds.data.x if ds.kind == "graph" else ds.train_x
touched = float(x[:: max(x.size(0) // 1000, 1)].sum())  # read a little, as training would
ru = resource.getrusage(resource.RUSAGE_SELF)
status = open("/proc/self/status").read()
now = {k: int(status.split(k + ":")[1].split()[0]) / 2**20 for k in ("RssAnon", "RssFile")}
print(json.dumps({
    "seconds": time.perf_counter() - t0,
    "cpu_seconds": ru.ru_utime + ru.ru_stime,
    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    "rss_anon_gib": now["RssAnon"],
    "rss_file_gib": now["RssFile"],
    "nodes": ds.num_nodes if ds.kind == "graph" else int(ds.train_x.size(0)),
    "edges": int(ds.data.edge_index.size(1)) if ds.kind == "graph" else 0,
}))
"""


def measure(name: str, root: Path, scale: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(root), str(scale)],
        capture_output=True,
        text=True,
        check=True,
        env=harness.module_env(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--datasets", default="synthetic-reddit,synthetic-amazon")
    p.add_argument("--keep", action="store_true", help="keep the temporary data root")
    args = p.parse_args(argv)
    if args.smoke:
        args.scale, args.datasets = 0.002, "synthetic-reddit"
    harness.print_header()
    root = Path(tempfile.mkdtemp(prefix="gnnpar-datagen-"))
    try:
        for name in args.datasets.split(","):
            gen = measure(name, root, args.scale)
            load = gen if args.smoke else measure(name, root, args.scale)  # smoke: one process
            size = sum(f.stat().st_size for f in (root / "cache").rglob("*") if name in str(f))
            print(
                f"{name} scale {args.scale:g}: {gen['nodes']:,} nodes, {gen['edges']:,} edges; "
                f"generate {gen['seconds']:.1f} s wall ({gen['cpu_seconds']:.1f} s CPU), peak RSS {gen['peak_rss_gib']:.2f} GiB; "
                f"load from cache {load['seconds']:.2f} s, peak RSS {load['peak_rss_gib']:.2f} GiB "
                f"(after load: {load['rss_anon_gib']:.2f} GiB private, "
                f"{load['rss_file_gib']:.2f} GiB file-backed); "
                f"cache {size / 2**30:.2f} GiB on disk",
                flush=True,
            )
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
