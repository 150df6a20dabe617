"""What making the next sampled batch on a thread costs and saves: the whole batch, or its sampling.

    python -m benchmarks.memory.made_ahead --folder FOLDER --steps 10 --reps 2
    python -m benchmarks.memory.made_ahead --smoke

Sides, each a fresh process, in turn (rotated every repetition), the same batches
(``SampledBatches`` of a prepared folder, batch i from (seed, epoch, rank, step)) and the same
GraphSAGE 3 x 256 step (``seed_loss``, Adam) as the sampled strategy's, one rank, no loader
worker:

* ``batch``: a thread makes batch i+1 whole (sampled, its feature rows gathered) while the
  model trains on batch i (``loader.Ahead``, what a prepared folder's run did for every graph);
* ``sampling``: the thread samples batch i+1 and gathers its rows only once batch i has let go
  of its own (before its backward: ``GatherAfterRelease``, what a run does where every feature
  row is in memory).

The rows come from the folder's memory-mapped features (``--warm``, default: read once first so
they are in the page cache: a copy from memory, as from the feature cache). Per side: seconds
per step (median over the steps after the first), the run's time, and its peak RSS (``VmHWM``)
beyond the RSS before the first batch (the interpreter, the graph's maps, the model).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness

SIDES = ("batch", "sampling")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) << 10
    return 0


def side(folder: str, mode: str, steps: int, fanouts: str, batch_size: int, threads: int) -> dict:
    """One side's run in this process."""
    import numpy as np
    import torch

    from gnnpar.config.schema import ModelConfig
    from gnnpar.data.sampling.loader import Ahead, GatherAfterRelease, SampledBatches
    from gnnpar.models import build_model
    from gnnpar.runtime.allocator import reuse_large_blocks
    from gnnpar.training.losses import seed_loss

    torch.set_num_threads(threads)
    reuse_large_blocks(512 << 20)  # the run's heap (no memory limit)
    torch.manual_seed(0)
    fan = [int(f) for f in fanouts.split(",")]
    train = torch.from_numpy(np.load(os.path.join(folder, "train.npy"))).long()
    batches = SampledBatches(folder, train, fan, batch_size, 0, 1, 0, 10**6)
    g = batches._graph()
    model = build_model(
        ModelConfig(name="sage", hidden=256, layers=len(fan), dropout=0.5),
        g["x"].size(1),
        int(g["y"].max()) + 1,
    )
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    batches.gather_later = mode == "sampling"
    base = _status("VmRSS")
    made = (batches[i] for i in range(steps))
    it = Ahead(GatherAfterRelease(made, batches) if batches.gather_later else made)
    times, losses = [], []
    t_run = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        b = next(it)
        data = b.to_data()
        del b
        opt.zero_grad(set_to_none=True)
        loss = seed_loss(model, data, False, free_features=True)
        loss.backward()
        opt.step()
        del data
        losses.append(float(loss.detach()))
        times.append(time.perf_counter() - t0)
    run_s = time.perf_counter() - t_run
    it.close()
    use = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "side": mode,
        "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "run_s": run_s,
        # the process's CPU seconds (both threads; the graph's opening included): on a loaded
        # machine a side with two runnable threads also gets a larger share of the CPUs
        "cpu_s": use.ru_utime + use.ru_stime,
        "peak_beyond_start_bytes": _status("VmHWM") - base,
        "losses": losses,
    }


def _warm(folder: str) -> None:
    with open(os.path.join(folder, "features.npy"), "rb") as f:
        while f.read(64 << 20):
            pass


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, reps=2, threads=1, out=True)
    p.add_argument("--folder", default=None, help="a prepared folder")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--side", choices=SIDES, default=None, help=argparse_hidden())
    a = harness.start(
        p, argv, smoke={"reps": 1, "steps": 3, "batch_size": 64}, header=not _is_side(argv)
    )
    if a.side is not None:  # a side's process
        print(json.dumps(side(a.folder, a.side, a.steps, a.fanouts, a.batch_size, a.threads)))
        return 0
    if a.folder is None:
        if not a.smoke:
            p.error("--folder is required (a prepared folder)")
        from benchmarks.memory.sampled_step_memory import _smoke_folder

        a.folder = _smoke_folder(str(harness.smoke_root()))
    _warm(a.folder)
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    busy = _cpu_times()
    for rep in range(a.reps):
        for s in harness.rotation(SIDES, rep):
            cmd = [sys.executable, "-m", "benchmarks.memory.made_ahead", "--folder", a.folder,
                   "--side", s, "--steps", str(a.steps), "--batch-size", str(a.batch_size),
                   "--fanouts", a.fanouts, "--threads", str(a.threads)]  # fmt: skip
            load = harness.load_average()[0]
            done = subprocess.run(cmd, capture_output=True, text=True, env=harness.module_env())
            if done.returncode != 0:
                raise SystemExit(f"side {s} failed: {done.stderr[-2000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1]) | {"rep": rep, "load": load}
            runs[s].append(r)
            print(f"  rep {rep} {s}: {r['step_s']:.2f} s/step, run {r['run_s']:.1f} s, "
                  f"CPU {r['cpu_s']:.1f} s, peak "
                  f"{r['peak_beyond_start_bytes'] / 2**30:.2f} GiB beyond its start, "
                  f"load {load:.1f}", flush=True)  # fmt: skip
    cpu = _cpu_busy(busy, _cpu_times())
    assert runs["batch"][0]["losses"] == runs["sampling"][0]["losses"], "the batches differ"
    med = {
        s: {k: statistics.median(r[k] for r in runs[s])
            for k in ("step_s", "run_s", "peak_beyond_start_bytes")}
        for s in SIDES
    }  # fmt: skip
    ratio = harness.median_ratio(
        [r["run_s"] for r in runs["sampling"]], [r["run_s"] for r in runs["batch"]]
    )
    for s in SIDES:
        print(f"{s}: {med[s]['step_s']:.2f} s/step, run {med[s]['run_s']:.1f} s, peak "
              f"{med[s]['peak_beyond_start_bytes'] / 2**30:.2f} GiB beyond its start")  # fmt: skip
    print(f"sampling / batch run time: {ratio:.3f}; CPU busy over the runs: {cpu:.0%}")
    if a.out:
        harness.write_json(a.out, {"machine": harness.machine(a.threads), "runs": runs,
                                   "median": med, "ratio": ratio, "cpu_busy": cpu})  # fmt: skip
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def _is_side(argv: list[str] | None) -> bool:
    return "--side" in (sys.argv[1:] if argv is None else argv)


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def _cpu_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    idle, total = after[0] - before[0], after[1] - before[1]
    return 1 - idle / total if total else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
