"""Bytes of memory per node and per edge of sampled GraphSAGE training, gnnpar against DGL, one
rank, on the same prepared graph held in memory.

    python -m benchmarks.memory.bytes_per_node_edge --folder FOLDER [--steps 20] [--reps 2]
        [--fanouts 15,10,5] [--batch-size 1024] [--hidden 256]

``FOLDER``: a gnnpar prepared folder (``gnnpar prepare --dataset synthetic-reddit --out F``).
Sides, alternating, each a fresh process:

* gnnpar: ``gnnpar train --dataset FOLDER --strategy sampled --model sage --loader-workers 0``
  for ``--steps`` steps (the folder mapped: its pages are memory the run holds, in RSS);
* DGL: ``_dgl_memory_side.py``, DGL's GraphSAGE example on the folder's arrays loaded into
  memory (``dgl.graph(("csc", ...))``, ``g.ndata``), ``num_workers=0``.

Each side's peak RSS (``VmHWM``, read once ``--steps`` steps have trained; the run is then
stopped: the final evaluation is not measured) less its interpreter's RSS after its imports
(measured in a process of its own: python, torch and the library) is the memory the graph and
the training take; divided by the graph's nodes and by its edges, it is bytes per node and per
edge (one graph: the same memory on either scale, not a split between them). Printed per
repetition and as medians, with gnnpar over DGL.
``--smoke``: a 20,000-node random graph prepared in a temporary folder, 3 steps, gnnpar only
where DGL's interpreter is missing.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

HERE = Path(__file__).resolve().parent
BASE_GNNPAR = (
    "import json, torch, torch_geometric, gnnpar.cli, gnnpar.strategies.sampled\n"
    "from benchmarks.memory._dgl_memory_side import status\n"
    "print(json.dumps({'base_rss_bytes': status('VmRSS')}))"
)
BASE_DGL = (
    "import json, sys, numpy, torch, dgl, dgl.nn\n"
    f"sys.path.insert(0, {str(HERE)!r})\n"
    "from _dgl_memory_side import status\n"
    "print(json.dumps({'base_rss_bytes': status('VmRSS')}))"
)


def _status(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def gnnpar_side(a, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "gnnpar", "train", "--dataset", str(a.folder), "--strategy",
        "sampled", "--model", "sage", "--hidden", str(a.hidden), "--fanouts", a.fanouts,
        "--batch-size", str(a.batch_size), "--epochs", "1", "--max-steps", str(a.steps + 1),
        "--loader-workers", "0", "--threads", str(a.threads), "--eval-every", "0",
        "--quiet", "--out", str(out), "--timeout", "1800",
    ]  # fmt: skip
    if a.feature_cache is not None:
        cmd += ["--feature-cache", a.feature_cache]
    proc = subprocess.Popen(cmd, env=harness.module_env(), stderr=subprocess.PIPE)
    try:
        harness.wait_for_steps(out / "metrics.jsonl", a.steps, proc, a.timeout)
        figures = {
            "peak_rss_bytes": _status(proc.pid, "VmHWM"),
            "rss_anon_bytes": _status(proc.pid, "RssAnon"),
            "rss_file_bytes": _status(proc.pid, "RssFile"),
            "steps": a.steps,
        }
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return figures


def dgl_side(a) -> dict:
    cmd = [harness.PEERS["dgl"], str(HERE / "_dgl_memory_side.py"), str(a.folder), a.fanouts,
           str(a.batch_size), str(a.steps), str(a.threads), str(a.hidden)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if done.returncode != 0:
        raise SystemExit(f"DGL's side failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def base_rss(python: str, code: str) -> int:
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600,
                          env=harness.module_env())  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{python}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["base_rss_bytes"]


def _smoke_folder(tmp: Path) -> Path:
    from benchmarks.memory.advise_from_disk import _smoke_folder as make

    return make(tmp)


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, reps=2, threads=1, out=True)
    p.add_argument("--folder", type=Path, default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument(
        "--feature-cache", default=None, help="gnnpar's --feature-cache (default: its own)"
    )
    p.add_argument("--sides", default="gnnpar,dgl", help="which sides to run")
    a = harness.start(p, argv, smoke={"reps": 1, "steps": 3, "batch_size": 256, "hidden": 32})
    have_dgl = (
        os.path.exists(harness.PEERS["dgl"])
        and subprocess.run(
            [harness.PEERS["dgl"], "-c", "import dgl"], capture_output=True
        ).returncode
        == 0
    )
    if not have_dgl and not a.smoke and "dgl" in a.sides.split(","):
        print(f"error: DGL's interpreter {harness.PEERS['dgl']} cannot import dgl", file=sys.stderr)
        return 2
    have_dgl = have_dgl and "dgl" in a.sides.split(",")
    sides = ["gnnpar", "dgl"] if have_dgl else ["gnnpar"]
    with tempfile.TemporaryDirectory(prefix="gnnpar-bytes-") as tmp:
        tmp = Path(tmp)
        if a.folder is None:
            if not a.smoke:
                p.error("--folder is required (a prepared folder)")
            a.folder = _smoke_folder(tmp)
        m = json.loads((Path(a.folder) / "manifest.json").read_text())
        n, e = int(m["num_nodes"]), int(m["num_edges"])
        print(f"{m['name']}: {n:,} nodes, {e:,} edges, {m['num_features']} features "
              f"({m['feature_dtype']}); batch {a.batch_size}, fan-outs {a.fanouts}, hidden "
              f"{a.hidden}, {a.steps} steps")  # fmt: skip
        base = {"gnnpar": base_rss(sys.executable, BASE_GNNPAR)}
        if have_dgl:
            base["dgl"] = base_rss(harness.PEERS["dgl"], BASE_DGL)
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for rep in range(a.reps):
            for side in harness.rotation(sides, rep):
                t0 = time.perf_counter()
                r = gnnpar_side(a, tmp / f"run-{rep}") if side == "gnnpar" else dgl_side(a)
                r["base_rss_bytes"] = base[side]
                held = r["peak_rss_bytes"] - base[side]
                r |= {"held_bytes": held, "bytes_per_node": held / n, "bytes_per_edge": held / e}
                r["load"] = harness.load_average()[0]
                r["wall_s"] = time.perf_counter() - t0
                runs[side].append(r)
                print(f"  rep {rep} {side}: {json.dumps(r)}", flush=True)
    med = {
        s: {k: statistics.median(r[k] for r in runs[s]) for k in
            ("peak_rss_bytes", "held_bytes", "bytes_per_node", "bytes_per_edge")}
        for s in sides
    }  # fmt: skip
    for s in sides:
        print(f"{s}: peak RSS {med[s]['peak_rss_bytes'] / 2**30:.2f} GiB, held beyond its "
              f"imports {med[s]['held_bytes'] / 2**30:.2f} GiB = {med[s]['bytes_per_node']:.0f} "
              f"B/node = {med[s]['bytes_per_edge']:.1f} B/edge")  # fmt: skip
    if have_dgl:
        ratio = med["gnnpar"]["held_bytes"] / med["dgl"]["held_bytes"]
        print(f"gnnpar / DGL (held beyond imports): {ratio:.2f}")
    if a.out:
        harness.write_json(a.out, {"machine": harness.machine(a.threads), "nodes": n,
                                   "edges": e, "base": base, "runs": runs, "median": med})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
