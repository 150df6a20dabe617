"""Where a sampled step across two hosts goes, with the next batch made in line or on a thread.

Two network namespaces joined by a link of ``--rate`` and one-way ``--delay``
(:func:`gnnpar.runtime.netns.shaped_hosts`), one rank of ``gnnpar train --strategy sampled`` on
each, over a folder holding only the manifest and its ``shard-<h>/`` (as
:mod:`benchmarks.comm.shard_sampled_two_hosts` runs them; no cgroup). Two sides, alternating
(order reversed every other repetition), ``--reps`` times:

* ``inline``: ``GNNPAR_BATCH_AHEAD=0``: batch i+1 is sampled and its feature rows fetched after
  batch i's step, in the training thread (the way it was before batches were made ahead);
* ``ahead``: batch i+1 (its sampling and feature exchanges, on a gloo group of their own) is
  made on a thread while the model trains on batch i.

Per side: the epoch time (training time over the epochs), and per step, from each rank's
result.json: ``data_wait`` (what the training thread waited for its batch), ``compute``
(forward, backward, optimizer), ``sync`` (the gradient all-reduce backward did not hide), the
time making a batch took (``batch_make_s_per_step``, wherever made) and in it each kind of
exchange (``exchange_wait_s_per_step``: sample exchange = ``hop ask``/``hop answer``, feature
exchange = ``features ask``/``features answer``, split sizes included). Also: whether the two
sides' loss curves are equal (bit for bit: the same batches), the load average, and the CPU busy
share over each run (1 - idle/total of /proc/stat, every core).

    python -m benchmarks.comm.shard_sampled_ahead --sharded /work/data/p0.02-s2-metis \\
        --work /work/data/ahead --rate 1gbit --delay 1ms --fanouts 15,10 --hidden 256 \\
        --batch-size 512 --epochs 2 --reps 2 --out ahead.json

``--smoke``: cora in two shards, two hosts on localhost (no namespaces), two steps per side.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.comm.shard_sampled_two_hosts import add_run_flags, host_folders, run_hosts

SIDES = {"inline": "0", "ahead": "1"}  # GNNPAR_BATCH_AHEAD


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of every core, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)  # idle + iowait


def run_side(args, folders, work: Path, hosts, ahead: str) -> dict:  # noqa: ANN001
    os.environ["GNNPAR_BATCH_AHEAD"] = ahead
    load0, (idle0, total0) = harness.load_average()[0], cpu_times()
    try:
        r, _, took = run_hosts(args, folders, work, hosts)
    finally:
        del os.environ["GNNPAR_BATCH_AHEAD"]
    idle1, total1 = cpu_times()
    steps = r["steps_per_epoch"] * len(r["loss_curve"])
    per_rank = []
    for k, tb in enumerate(r["time_breakdown_s"]):
        waits = r["exchange_wait_s_per_step"][k]
        per_rank.append(
            {
                "data_wait": tb["data_wait"] / steps,
                "compute": tb["compute"] / steps,
                "sync": tb["sync"] / steps,
                "make": r["batch_make_s_per_step"][k],
                "sample_exchange": sum(v for n, v in waits.items() if n.startswith("hop")),
                "feature_exchange": sum(v for n, v in waits.items() if n.startswith("features")),
            }
        )
    return {
        "epoch_s": r["train_time_s"] / len(r["loss_curve"]),
        "wall_s": took,
        "ahead": r["exchange_ahead"],
        "loss_curve": r["loss_curve"],
        "steps": steps,
        "per_step_s": per_rank,
        "bytes_per_step": r["exchange_bytes_per_step"],
        "load": [load0, harness.load_average()[0]],
        "cpu_busy": 1 - (idle1 - idle0) / max(1, total1 - total0),
    }


def line(name: str, s: dict) -> str:
    p = s["per_step_s"]
    mean = {k: statistics.mean(r[k] for r in p) for k in p[0]}
    parts = " ".join(f"{k} {v:.3f}" for k, v in mean.items())
    return (
        f"{name}: epoch {s['epoch_s']:.2f} s, per step (mean of ranks, s): {parts}; "
        f"load {s['load'][0]:.1f}-{s['load'][1]:.1f}, CPU busy {s['cpu_busy']:.2f}"
    )


def measure(args, folders, work: Path, hosts) -> dict:  # noqa: ANN001
    runs: dict[str, list[dict]] = {n: [] for n in SIDES}
    for rep in range(args.reps):
        names = list(SIDES) if rep % 2 == 0 else list(SIDES)[::-1]
        for name in names:
            s = run_side(args, folders, work, hosts, SIDES[name])
            runs[name].append(s)
            print(f"rep {rep} {line(name, s)}", flush=True)
    epochs = {n: [s["epoch_s"] for s in runs[n]] for n in SIDES}
    same = all(s["loss_curve"] == runs["inline"][0]["loss_curve"] for v in runs.values() for s in v)
    ratio = harness.median_ratio(epochs["ahead"], epochs["inline"])
    print(
        f"median epoch: inline {statistics.median(epochs['inline']):.2f} s, ahead "
        f"{statistics.median(epochs['ahead']):.2f} s; ahead / inline {ratio:.3f} (median of "
        f"per-repetition ratios); loss curves equal: {same}"
    )
    return {"runs": runs, "ahead_over_inline": ratio, "loss_curves_equal": same}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, reps=2, out=True)
    ap.add_argument("--sharded", type=Path, help="a prepared folder in 2 shards")
    add_run_flags(ap, "15,10", 512)
    args = harness.start(ap, argv, rank_threads=1)
    if args.smoke:
        return smoke(args)
    from benchmarks.comm.gloo_over_shaped_link import parse_delay, parse_rate
    from gnnpar.runtime import netns

    args.work.mkdir(parents=True, exist_ok=True)
    folders = host_folders(args.sharded, args.work)
    rate, delay = parse_rate(args.rate), parse_delay(args.delay)
    try:
        with netns.shaped_hosts("s", "t", "10.213.0.51", "10.213.0.52", rate, delay) as (h, how):
            print(f"link: {rate / 1e6:g} Mbit/s, {delay * 1e3:g} ms one way ({how})", flush=True)
            got = measure(args, folders, args.work, h)
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), False)
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "link": {"rate_bit_s": rate, "delay_s": delay, "how": how},
                "settings": vars(args) | {"sharded": str(args.sharded), "work": str(args.work)},
                **got,
            },
        )
    return 0 if got["loss_curves_equal"] else 1


def smoke(args) -> int:  # noqa: ANN001
    """Cora in two shards, two hosts on localhost (no namespaces), two steps per side."""
    import tempfile

    from gnnpar.data.prepare_command import run_prepare

    args.fanouts, args.hidden, args.batch_size, args.epochs, args.max_steps = "5,5", 16, 64, 1, 2
    args.reps = 1
    with tempfile.TemporaryDirectory(prefix="gnnpar-ahead-smoke-") as tmp:
        work = Path(tmp)
        root = str(harness.smoke_root())
        run_prepare("cora", str(work / "s"), None, None, None, root, None, True,
                    shards="2", partitioner="random")  # fmt: skip
        got = measure(args, host_folders(work / "s", work), work, None)
    return 0 if got["loss_curves_equal"] else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(code)
