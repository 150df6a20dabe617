"""Training from disk inside a memory limit: gnnpar against PyG+ (Ginex's baseline) and DGL GraphBolt.

One epoch of neighbour-sampled GraphSAGE (3 x 256, mean, dropout 0.5, Adam 5e-3) on the same
prepared arrays (``gnnpar prepare``'s folder: CSR, fp32 features, labels, splits), each side a
fresh process inside its own memory cgroup of ``--limit`` (made for the run and removed after;
v1's memory controller, else v2; needs root), the same fan-outs, batch size, torch threads and
loader workers:

* ``gnnpar``: ``gnnpar train --dataset FOLDER --strategy sampled --model sage ...`` (its feature
  cache sized from the cgroup's limit by default);
* ``gnnpar-nolimit``: the same without a cgroup (the issue's "<= 1.5x its own epoch" reference);
* ``pyg``: PyG+ (PyG ``NeighborLoader`` over ``np.memmap`` features, layer trimming),
  ``_disk_sides.py`` in ``harness.PEERS["pyg"]``;
* ``graphbolt``: DGL 2.1 GraphBolt over an ``OnDiskDataset`` (features ``in_memory: false``),
  ``_disk_sides.py`` in ``harness.PEERS["dgl"]``.
* ``pyg-w0``, ``graphbolt-w0``: the same peers sampling in the training process (no loader
  worker: one process less inside the limit).

``--max-steps N`` ends every side's epoch after N steps (gnnpar's ``--max-steps``; the peers
break out of their loop): for graphs whose full epoch takes longer than the time at hand.

What the peers read beside the prepared folder is made once under ``--peer-dir`` (not timed):
``edges.npy`` (int64 [2, E]: the prepared CSR's sources and targets, sorted by target; PyG maps
it as its ``edge_index``) and ``gb/``, an ``OnDiskDataset`` folder: ``metadata.yaml`` (numpy
edges, the features ``in_memory: false``, the training split) and what GraphBolt's own
preprocessing would make of it in ``gb/preprocessed/`` (its ``FusedCSCSamplingGraph`` built from
the prepared CSR with ``gb.fused_csc_sampling_graph``, ids in int32 as its preprocessing casts
them), the feature file a symlink to the prepared features.npy, not a copy. GraphBolt loads it
with ``force_preprocess=False``, as its ``BuiltinDataset`` does (else it hashes every file of the
folder on every load).

Timed per side: **end to end** (process start to the end of the epoch: imports, opening the
graph, gnnpar's cache, the epoch) and the **epoch alone** (gnnpar: metrics.jsonl's ``train_s``;
the peers: their training loop's wall time). gnnpar is stopped once its epoch record is written
(its final full-graph evaluation is no part of the epoch). Before every run the arrays' pages are
dropped from the page cache (``posix_fadvise(DONTNEED)`` on each file, ``--warm`` keeps them),
so every side reads from the disk. Per repetition the sides run in turn, rotated each
repetition; medians over repetitions and the median of per-repetition ratios. A side that does
not finish within ``--timeout`` (default 15 min) is recorded as such. The cgroup's peak usage
(page cache included), the most anonymous memory and page cache it held, the pages it read in
and its major faults (its ``memory.stat``, sampled every 0.5 s), and the load average are
recorded with every run. ``--side-limit SIDE=LIMIT`` gives one side another limit: a side that
cannot run inside ``--limit`` is measured at the smallest limit where it runs, beside the rest.

    python -m benchmarks.memory.disk_vs_peers --folder /work/data/papers100m-0.02 \\
        --fanouts 10,5,5 --batch-size 512 --limit 1.5G --reps 3
    python -m benchmarks.memory.disk_vs_peers --folder /work/data/papers100m-0.1 \\
        --fanouts 15,10,5 --batch-size 1024 --limit 3G --reps 1
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness

HERE = Path(__file__).resolve().parent
SIDES = ("gnnpar", "pyg", "graphbolt", "gnnpar-nolimit", "pyg-w0", "graphbolt-w0")
PEER_OF = {"pyg": "pyg", "graphbolt": "dgl", "pyg-w0": "pyg", "graphbolt-w0": "dgl"}
CHUNK = 1 << 24  # edges per chunk when writing edges.npy


# ------------------------------------------------------------------- what the peers read
def make_peer_dir(folder: Path, peer: Path, dgl_python: str | None) -> None:
    """edges.npy and the GraphBolt folder beside ``folder``'s arrays (once; see the module)."""
    import yaml

    from gnnpar.data.prepared import open_prepared

    p = open_prepared(folder)
    n, e = p.num_nodes, int(p.manifest["num_edges"])
    peer.mkdir(parents=True, exist_ok=True)
    edges = peer / "edges.npy"
    if not edges.exists():
        ptr, idx = p.array("indptr"), p.array("indices")
        tmp = peer / "edges.npy.tmp"
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(2, e))
        for lo in range(0, e, CHUNK):  # targets of edges lo..hi: where they fall in indptr
            hi = min(e, lo + CHUNK)
            out[0, lo:hi] = idx[lo:hi]
            first, last = np.searchsorted(ptr, [lo, hi - 1], side="right") - 1
            deg = np.diff(np.clip(ptr[first : last + 2], lo, hi))
            out[1, lo:hi] = np.repeat(np.arange(first, last + 1, dtype=np.int64), deg)
        out.flush()
        del out
        os.replace(tmp, edges)
    gb = peer / "gb"
    pre = gb / "preprocessed"
    done = pre / "metadata.yaml"
    if done.exists() or dgl_python is None:
        return
    pre.mkdir(parents=True, exist_ok=True)
    for name, target in (("features.npy", folder / "features.npy"), ("edges.npy", edges)):
        for link in (gb / name, pre / name):
            if not link.exists():
                link.symlink_to(target.resolve())
    train = p.array("train")
    labels = np.asarray(p.array("labels"))[np.asarray(train)]
    for where in (gb, pre):
        np.save(where / "train.npy", np.asarray(train, dtype=np.int32 if where == pre else None))
        np.save(where / "train_labels.npy", labels.astype(np.int64))
    feat = {"domain": "node", "name": "feat", "format": "numpy", "in_memory": False}
    task = {"name": "node_classification", "num_classes": int(p.manifest["num_classes"])}

    def train_set(prefix: str) -> list:
        return [
            {
                "data": [
                    {"name": "seed_nodes", "format": "numpy", "path": f"{prefix}train.npy"},
                    {"name": "labels", "format": "numpy", "path": f"{prefix}train_labels.npy"},
                ]
            }
        ]

    raw = {
        "dataset_name": f"{p.manifest['name']}-{folder.name}",
        "graph": {"nodes": [{"num": n}], "edges": [{"format": "numpy", "path": "edges.npy"}]},
        "feature_data": [{**feat, "path": "features.npy"}],
        "tasks": [{**task, "train_set": train_set("")}],
    }
    (gb / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    graph = pre / "fused_csc_sampling_graph.pt"
    code = (
        "import sys, numpy as np, torch, dgl.graphbolt as gb\n"
        "ptr = torch.from_numpy(np.load(sys.argv[1], mmap_mode='r').astype(np.int32))\n"
        "idx = torch.from_numpy(np.load(sys.argv[2]).astype(np.int32, copy=False))\n"
        "torch.save(gb.fused_csc_sampling_graph(ptr, idx), sys.argv[3])\n"
    )
    if e > np.iinfo(np.int32).max:
        code = code.replace("mmap_mode='r').astype(np.int32)", "mmap_mode='r').copy()")
    subprocess.run(
        [dgl_python, "-c", code, str(folder / "indptr.npy"), str(folder / "indices.npy"),
         str(graph)], check=True, timeout=3600,
    )  # fmt: skip
    processed = {
        "dataset_name": raw["dataset_name"],
        "include_original_edge_id": False,
        "graph_topology": {
            "type": "FusedCSCSamplingGraph",
            "path": "preprocessed/fused_csc_sampling_graph.pt",
        },
        "feature_data": [{**feat, "path": "preprocessed/features.npy"}],
        "tasks": [{**task, "train_set": train_set("preprocessed/")}],
    }
    tmp = pre / "metadata.yaml.tmp"
    tmp.write_text(yaml.safe_dump(processed, sort_keys=False))
    os.replace(tmp, done)


def drop_pages(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (clean pages only; others' files untouched)."""
    from gnnpar.advise.profile.disk import drop_pages as drop

    for path in paths:
        drop(path)


# ---------------------------------------------------------------------------- one run
def _argv(a, side: str, out: Path) -> list[str]:
    if side.startswith("gnnpar"):
        return [
            sys.executable, "-m", "gnnpar", "train", "--dataset", str(a.folder),
            "--strategy", "sampled", "--model", "sage", "--hidden", "256", "--layers",
            str(len(a.fanouts.split(","))), "--dropout", "0.5", "--fanouts", a.fanouts,
            "--batch-size", str(a.batch_size), "--epochs", "1", "--threads", str(a.threads),
            "--loader-workers", str(a.workers), "--seed", str(a.seed), "--quiet",
            "--timeout", str(a.timeout), "--out", str(out), *a.gnnpar_args,
            *(["--max-steps", str(a.max_steps)] if a.max_steps else []),
        ]  # fmt: skip
    workers = 0 if side.endswith("-w0") else a.workers
    return [
        harness.PEERS[PEER_OF[side]], str(HERE / "_disk_sides.py"), side.removesuffix("-w0"),
        str(a.folder), str(a.peer_dir), a.fanouts, str(a.batch_size), str(workers),
        str(a.threads), str(a.seed), str(a.max_steps),
    ]  # fmt: skip


def _cgroup_figures(folder: Path | None) -> dict:
    if folder is None:
        return {}
    got: dict = {}
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        with contextlib.suppress(OSError, ValueError):
            got["cgroup_peak_bytes"] = int((folder / name).read_text())
            break
    for name in ("memory.oom_control", "memory.events"):
        with contextlib.suppress(OSError):
            for line in (folder / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    got["oom_kills"] = int(v)
    return got


class _StatSampler:
    """The cgroup's ``memory.stat`` every 0.5 s while a run lasts: the most anonymous memory
    (v1 ``rss``, v2 ``anon``) and page cache (``cache`` / ``file``) it held, the bytes of pages
    charged to it (v1 ``pgpgin``: file pages read in and anonymous pages alike) and its major
    faults (``pgmajfault``): whether a side's own memory or its page cache fills the limit, and
    how much the kernel re-reads when it does."""

    def __init__(self, folder: Path | None) -> None:
        import threading

        self.folder, self.got = folder, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        if folder is not None:
            self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            st = {}
            for line in (self.folder / "memory.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                st[k] = int(v)
            for key, names in (("cgroup_anon_max_bytes", ("rss", "anon")),
                               ("cgroup_cache_max_bytes", ("cache", "file"))):  # fmt: skip
                v = next((st[n] for n in names if n in st), None)
                if v is not None:
                    self.got[key] = max(v, self.got.get(key, 0))
            if "pgpgin" in st:
                self.got["cgroup_read_in_bytes"] = st["pgpgin"] * 4096
            if "pgmajfault" in st:
                self.got["cgroup_pgmajfault"] = st["pgmajfault"]

    def _run(self) -> None:
        while not self.done.wait(0.5):
            self._read()

    def stop(self) -> dict:
        if self.folder is not None:
            self.done.set()
            self.thread.join()
            self._read()
        return self.got


def _stop(proc: subprocess.Popen) -> None:
    """End the run's whole process group (a gnnpar run's fork server and loader workers too)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_side(a, side: str, limit: int | None, out: Path) -> dict:
    """One run of ``side`` in a fresh process (inside a new memory cgroup when ``limit``)."""
    from gnnpar.runtime import resources

    out.mkdir(parents=True, exist_ok=True)
    env = {**harness.module_env(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(a.threads)}
    env.pop("GNNPAR_MEMORY_LIMIT", None)
    argv = _argv(a, side, out)
    if not a.warm:
        drop_pages(a.arrays)
    load = list(harness.load_average())
    with contextlib.ExitStack() as stack:
        folder = None
        if limit is not None:
            folder = stack.enter_context(resources.memory_cgroup(limit))
            argv = resources.in_cgroup(folder, argv)
        log = open(out / "stderr.txt", "w")
        stack.callback(log.close)
        t_start = time.time()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True
        )
        sampler = _StatSampler(folder)
        r = _watch(a, side, proc, out, t_start)
        r.update(sampler.stop())
        r.update(_cgroup_figures(folder))
        _stop(proc)
    r["exit"] = proc.returncode if "exit" not in r else r["exit"]
    r["limit_bytes"] = limit
    r["load_before"] = load
    r["load_after"] = list(harness.load_average())
    if "e2e_s" not in r:
        text = (out / "stderr.txt").read_text(errors="replace").strip().splitlines()
        tail = [x for x in text if not x.startswith("step ")]  # not the peers' progress lines
        r["last_stderr"] = tail[-1][:300] if tail else ""
    return r


def _watch(a, side: str, proc: subprocess.Popen, out: Path, t_start: float) -> dict:
    """Wait for the epoch's end: a peer's JSON line; gnnpar's epoch record in metrics.jsonl."""
    deadline = t_start + a.timeout
    if not side.startswith("gnnpar"):
        try:
            stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            return {"timed_out": True, "timeout_s": a.timeout, **_peer_progress(out)}
        lines = [x for x in stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not lines:
            return {"exit": proc.returncode}
        got = json.loads(lines[-1])
        return {
            "e2e_s": got["epoch_end_unix"] - t_start,
            "epoch_s": got["epoch_s"],
            "setup_s": got["setup_s"],
            "steps": got["steps"],
            "loss": got["loss"],
            "peak_rss_bytes": got["peak_rss_bytes"],
            "exit": 0,
        }
    metrics = out / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists():
            for line in metrics.read_text().splitlines():
                if line.endswith("}") and '"event": "epoch"' in line:
                    now = time.time()
                    rec = json.loads(line)
                    steps = _steps_recorded(metrics)
                    return {
                        "e2e_s": now - t_start,
                        "epoch_s": rec["train_s"],
                        "steps": steps,
                        "loss": rec.get("loss"),
                        "peak_rss_bytes": rec.get("peak_rss_bytes"),
                        "feature_cache": rec.get("feature_cache"),
                        "exit": 0,
                    }
        if proc.poll() is not None:
            return {"exit": proc.returncode}
        time.sleep(0.05)
    steps = _steps_recorded(metrics) if metrics.exists() else 0
    return {"timed_out": True, "timeout_s": a.timeout, "steps_done": steps}


def _steps_recorded(metrics: Path) -> int:
    """The step records in gnnpar's metrics.jsonl."""
    return sum('"event": "step"' in x for x in metrics.read_text().splitlines())


def _peer_progress(out: Path) -> dict:
    """How far a peer that did not finish got: its last ``step K SECONDS`` line on stderr."""
    last = None
    for line in (out / "stderr.txt").read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "step" and parts[1].isdigit():
            last = parts
    if last is None:
        return {"steps_done": 0}
    return {"steps_done": int(last[1]), "steps_done_s": float(last[2])}


# ------------------------------------------------------------------------------ the script
def summary(runs: dict[str, list[dict]]) -> dict:
    def med(side: str, key: str) -> float | None:
        xs = [r[key] for r in runs.get(side, []) if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    out: dict = {"median": {}, "ratios": {}}
    for side, rs in runs.items():
        keys = ("e2e_s", "epoch_s", "cgroup_peak_bytes", "cgroup_anon_max_bytes", "peak_rss_bytes")
        out["median"][side] = {k: med(side, k) for k in keys}
        out["median"][side]["finished"] = f"{sum('e2e_s' in r for r in rs)}/{len(rs)}"
    for peer in ("pyg", "graphbolt", "gnnpar-nolimit", "pyg-w0", "graphbolt-w0"):
        for key in ("e2e_s", "epoch_s"):
            pairs = [
                (g[key], p[key])
                for g, p in zip(runs.get("gnnpar", []), runs.get(peer, []), strict=False)
                if g.get(key) and p.get(key)
            ]
            if pairs:
                ratio = harness.median_ratio([g for g, _ in pairs], [p for _, p in pairs])
                out["ratios"][f"gnnpar/{peer} {key}"] = ratio
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--folder", type=Path, help="a gnnpar prepared folder (fp32 features)")
    ap.add_argument("--peer-dir", type=Path, default=None, help="where the peers' files go")
    ap.add_argument("--fanouts", default="10,5,5")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--limit", default="1.5G", help="the cgroup's limit (bytes, K/M/G)")
    ap.add_argument(
        "--side-limit", action="append", default=[], metavar="SIDE=LIMIT",
        help="this side's cgroup limit instead of --limit (e.g. graphbolt-w0=2G)",
    )  # fmt: skip
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="loader worker processes, every side")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, every side")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900, help="seconds a side may take")
    ap.add_argument("--max-steps", type=int, default=0, help="end the epoch after N steps")
    ap.add_argument("--warm", action="store_true", help="keep the arrays in the page cache")
    ap.add_argument("--gnnpar-args", default="", help="more flags for gnnpar train")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args(argv)
    a.gnnpar_args = a.gnnpar_args.split()
    from gnnpar.runtime import resources

    with contextlib.ExitStack() as stack:
        if a.smoke:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gnnpar-dvp-")))
            a.folder = harness.smoke_prepared(root / "graph")
            a.peer_dir, a.reps, a.fanouts, a.batch_size = root / "peer", 1, "2,2", 64
            a.sides = ",".join(s for s in a.sides.split(",") if s != "gnnpar-nolimit")
            a.max_steps = 2
        if a.folder is None:
            ap.error("--folder is required (a gnnpar prepared folder)")
        a.folder = a.folder.resolve()
        a.peer_dir = (a.peer_dir or a.folder.parent / "disk-bench" / a.folder.name).resolve()
        limit = resources.parse_bytes(a.limit)
        side_limit: dict[str, int] = {}
        for item in a.side_limit:
            side, _, text = item.partition("=")
            if side not in SIDES or side == "gnnpar-nolimit":
                ap.error(f"--side-limit: {side!r} is not a side with a limit")
            try:
                side_limit[side] = resources.parse_bytes(text)
            except ValueError:
                ap.error(f"--side-limit: {text!r} is not a size (bytes, K/M/G)")
        wanted = [s for s in a.sides.split(",") if s]
        sides = []
        for s in wanted:
            if s in PEER_OF and not Path(harness.PEERS[PEER_OF[s]]).exists():
                print(f"skipped {s}: no interpreter {harness.PEERS[PEER_OF[s]]}")
            elif s not in SIDES:
                ap.error(f"--sides: {s} is not one of {', '.join(SIDES)}")
            else:
                sides.append(s)
        dgl = harness.PEERS["dgl"] if {"graphbolt", "graphbolt-w0"} & set(sides) else None
        if {"pyg", "pyg-w0"} & set(sides) or dgl:  # what the peers read, -w0 sides included
            make_peer_dir(a.folder, a.peer_dir, dgl)
        a.arrays = [a.folder / f for f in ("features.npy", "indices.npy", "indptr.npy")]
        a.arrays += [a.peer_dir / "edges.npy", a.peer_dir / "gb/preprocessed/train.npy"]
        a.arrays += [a.peer_dir / "gb/preprocessed/fused_csc_sampling_graph.pt"]
        print(harness.header(a.threads), flush=True)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gnnpar-dvp-runs-")))
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        cgroups = True
        for rep in range(a.reps):
            for side in harness.rotation(sides, rep):
                lim = None if side == "gnnpar-nolimit" else side_limit.get(side, limit)
                try:
                    r = run_side(a, side, lim if cgroups else None, work / f"{side}-{rep}")
                except resources.CgroupUnavailable as e:
                    if not a.smoke:
                        print(f"error: no memory cgroup can be made here: {e}", file=sys.stderr)
                        return 2
                    print(f"smoke: no cgroup ({e}); runs without a limit")
                    cgroups = False
                    r = run_side(a, side, None, work / f"{side}-{rep}")
                r["rep"] = rep
                runs[side].append(r)
                print(side, json.dumps(r), flush=True)
    report = {
        "what": "one epoch of sampled GraphSAGE 3x256 from disk inside a memory cgroup: "
        "end to end (process start to epoch end) and the epoch alone",
        "machine": harness.machine(a.threads),
        "folder": str(a.folder),
        "fanouts": a.fanouts,
        "batch_size": a.batch_size,
        "limit_bytes": limit,
        "side_limit_bytes": side_limit,
        "workers": a.workers,
        "threads": a.threads,
        "max_steps": a.max_steps,
        "cold": not a.warm,
        "runs": runs,
        **summary(runs),
    }
    print(json.dumps({"median": report["median"], "ratios": report["ratios"]}, indent=1))
    if a.json:
        harness.write_json(a.json, report)
    failed = [r for rs in runs.values() for r in rs if "e2e_s" not in r]
    return 1 if a.smoke and failed else 0


if __name__ == "__main__":
    sys.exit(main())
