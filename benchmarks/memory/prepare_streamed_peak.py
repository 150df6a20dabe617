"""Peak RSS and time of ``gnnpar prepare`` of a generated graph: the chunked stream against the
in-memory generator prepared as other graphs are (``generate_graph`` then
``prepared.write_graph``: what ``prepare`` did for synthetic-reddit before it streamed).

Every side runs in a fresh process; its peak is that process's ``ru_maxrss``. The sides
alternate (harness.rotation) for ``--reps`` rounds; medians are printed. ``imports`` is the peak
of a process that only imports gnnpar's generators and torch: what every side pays before its
first array. The in-memory side is skipped, with the reason, where the machine has less memory
available than it needs (``--mem-gib-per-scale``, 8 GiB at synthetic-reddit's scale 1).

Run: ``python -m benchmarks.memory.prepare_streamed_peak [--smoke] [--datasets synthetic-reddit]
[--scales 0.25,1] [--sides stream,in-memory] [--reps 1] [--tmp DIR] [--out FILE.json]``
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

CHILD = r"""
import json, resource, sys, time
side, name, scale, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
from gnnpar.data import prepared, synthetic
import torch
if side == "stream":
    from gnnpar.data.prepare_command import run_prepare
    run_prepare(name, out, str(scale), "0", None, None, None, quiet=True)
elif side == "in-memory":
    t, meta = synthetic.generate_graph(synthetic.RECIPES[name], scale, 0)
    made = prepared.made_record(name, scale, 0, "generated", generator=synthetic.VERSION)
    prepared.write_graph(t, meta, out, "fp32", made)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "peak_rss_gib": ru.ru_maxrss / 2**20}))
"""


def run_side(side: str, name: str, scale: float, tmp: Path) -> dict:
    out = tmp / f"{side}-{name}-{scale:g}"
    p = subprocess.run(
        [sys.executable, "-c", CHILD, side, name, str(scale), str(out)],
        env=harness.module_env(),
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        raise RuntimeError(f"{side} {name} {scale}: exit {p.returncode}: {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if out.exists():
        m = json.loads((out / "manifest.json").read_text())
        r["edges"] = m["num_edges"]
        r["sha256"] = {k: v["sha256"][:16] for k, v in m["arrays"].items()}
        shutil.rmtree(out)
    return r


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, reps=1, out=True)
    p.add_argument("--datasets", default="synthetic-reddit")
    p.add_argument("--scales", default="0.25,1")
    p.add_argument("--sides", default="stream,in-memory")
    p.add_argument("--mem-gib-per-scale", type=float, default=8.0)
    p.add_argument("--tmp", default=None, help="where the folders go (default: a temp dir)")
    args = harness.start(p, argv, smoke={"scales": "0.002", "reps": 1})
    tmp = Path(tempfile.mkdtemp(prefix="gnnpar-prepare-peak-", dir=args.tmp))
    report: dict = {"machine": harness.machine(), "runs": []}
    try:
        imports = run_side("imports", "synthetic-reddit", 1.0, tmp)
        print(f"imports only: peak {imports['peak_rss_gib']:.3f} GiB", flush=True)
        report["imports"] = imports
        for name in args.datasets.split(","):
            for scale in (float(s) for s in args.scales.split(",")):
                sides = args.sides.split(",")
                need = args.mem_gib_per_scale * scale + 1
                if "in-memory" in sides and available_gib() < need:
                    print(f"{name} {scale:g}: in-memory side skipped ({available_gib():.1f} GiB "
                          f"available, ~{need:.0f} needed)", flush=True)  # fmt: skip
                    sides.remove("in-memory")
                got: dict[str, list] = {s: [] for s in sides}
                for rep in range(args.reps):
                    for side in harness.rotation(sides, rep):
                        got[side].append(run_side(side, name, scale, tmp))
                hashes = {
                    json.dumps(r["sha256"], sort_keys=True) for rs in got.values() for r in rs
                }
                row = {"dataset": name, "scale": scale, "same_arrays": len(hashes) == 1}
                for side, rs in got.items():
                    for k in ("peak_rss_gib", "seconds", "cpu_s"):
                        row[f"{side}_{k}"] = statistics.median(r[k] for r in rs)
                    row["edges"] = rs[0]["edges"]
                print(json.dumps(row), flush=True)
                report["runs"].append(row)
                if not row["same_arrays"]:
                    raise SystemExit(f"{name} {scale:g}: the sides wrote different arrays")
        report["load_at_end"] = list(harness.load_average())
        if args.out:
            harness.write_json(args.out, report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0  # the report is printed line by line and written to --out


if __name__ == "__main__":
    sys.exit(main())
