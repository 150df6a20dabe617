"""Cluster-GCN across shards on two hosts, each holding only its shard, over a shaped link;
against one host with two ranks over the folder holding both shards (the same parts, dealt the
same way).

Two network namespaces (gnnpar.runtime.netns; root and iproute2) joined by a link of ``--rate``
and one-way ``--delay``, as in shard_sampled_two_hosts.py. Host h gets a folder of its own
holding the sharded folder's ``manifest.json`` and ``shard-<h>/`` only and runs one rank of
``gnnpar train --strategy S`` for S in ``--strategies`` (allreduce: every host trains its own
shard's parts; gossip: a rank that empties its host's pool fetches the other host's subgraphs
from it). Repetitions alternate the two sides. Reported, medians: the training time per epoch
of each side, whether allreduce's loss curves are equal (bit for bit), and for gossip the
subgraphs and bytes each rank fetched from the other host (result.json's ``fetched_subgraphs``,
``fetched_bytes``).

    python -m benchmarks.comm.shard_cluster_two_hosts --sharded /work/data/x/reddit-2 \\
        --work /work/data/x/bench --rate 1gbit --delay 1ms --partitions 40 --reps 3

``--smoke``: cora in two shards, two hosts on localhost without namespaces, one epoch.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.comm.shard_sampled_two_hosts import host_env, host_folders


def train_args(args, strategy: str, dataset: Path, out: Path) -> list[str]:  # noqa: ANN001
    a = [sys.executable, "-m", "gnnpar", "train", "--dataset", str(dataset), "--model", "gcn"]
    a += ["--layers", "2", "--hidden", str(args.hidden), "--strategy", strategy]
    a += ["--partitions", str(args.partitions), "--partitioner", args.partitioner]
    a += ["--epochs", str(args.epochs), "--threads", "1", "--seed", "3", "--quiet"]
    # no evaluation between epochs: one host's rank 1 would wait for rank 0's inside its epoch
    a += ["--timeout", "300", "--eval-every", "0", "--out", str(out)]
    if strategy != "allreduce" and args.slowdown:
        a += ["--slowdown", args.slowdown]
    return a


def run_hosts(args, strategy: str, folders: list[Path], work: Path, hosts=None) -> dict:  # noqa: ANN001
    """One rank per host (in its namespace where given); rank 0's result.json."""
    port = 29500 + os.getpid() % 200
    outs = [work / f"run-{strategy}-{h}" for h in range(len(folders))]
    procs = []
    for h, g in enumerate(folders):
        shutil.rmtree(outs[h], ignore_errors=True)
        argv = train_args(args, strategy, g, outs[h])
        if hosts is not None:
            ns, dev = ((hosts.a, hosts.if_a), (hosts.b, hosts.if_b))[h]
            argv = ["ip", "netns", "exec", ns, *argv]
            env = host_env(h, len(folders), hosts.addr_a, port, dev)
        else:
            env = host_env(h, len(folders), "127.0.0.1", port, None)
        log = open(work / f"host-{h}.log", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(argv, env=env, cwd=work, stdout=log, stderr=log), log))
    codes = []
    for p, log in procs:
        codes.append(p.wait(timeout=3600))
        log.close()
    if any(codes):
        tail = (work / f"host-{codes.index(next(c for c in codes if c))}.log").read_text()
        raise RuntimeError(f"a host failed: exit {codes}\n{tail[-3000:]}")
    return json.loads((outs[0] / "result.json").read_text())


def run_whole(args, strategy: str, whole: Path, work: Path) -> dict:  # noqa: ANN001
    out = work / f"run-{strategy}-whole"
    shutil.rmtree(out, ignore_errors=True)
    argv = train_args(args, strategy, whole, out) + ["--workers", "2"]
    proc = subprocess.run(argv, env=harness.module_env(), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the one-host run failed: {proc.stderr[-3000:]}")
    return json.loads((out / "result.json").read_text())


def epoch_s(r: dict) -> float:
    return r["train_time_s"] / max(1, len(r["loss_curve"]))


def measure(args, folders, whole, work, hosts=None) -> dict:  # noqa: ANN001
    """Per strategy: both sides, ``--reps`` times alternating; medians and the last results."""
    out = {}
    for strategy in args.strategies.split(","):
        times = {"two_hosts": [], "one_host": []}
        for _ in range(args.reps):
            a = run_hosts(args, strategy, folders, work, hosts)
            w = run_whole(args, strategy, whole, work)
            times["two_hosts"].append(epoch_s(a))
            times["one_host"].append(epoch_s(w))
        rec = {
            "epoch_s": {k: statistics.median(v) for k, v in times.items()},
            "epoch_s_all": times,
            "loss_curve_two_hosts": a["loss_curve"],
            "loss_curve_one_host": w["loss_curve"],
            "loss_curves_equal": a["loss_curve"] == w["loss_curve"],
            "val_score_two_hosts": a["val_score"],
            "eval_mode_two_hosts": a.get("eval_mode"),
        }
        for key in ("fetched_subgraphs", "fetched_bytes", "served_subgraphs"):
            if key in a:
                rec[key] = a[key]
        out[strategy] = rec
        line = f"{strategy}: epoch two hosts {rec['epoch_s']['two_hosts']:.2f} s, "
        line += f"one host {rec['epoch_s']['one_host']:.2f} s"
        if strategy == "allreduce":
            line += f"; loss curves equal: {rec['loss_curves_equal']}"
        if "fetched_bytes" in rec:
            line += f"; fetched subgraphs {rec['fetched_subgraphs']}, bytes {rec['fetched_bytes']}"
        print(line, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, reps=3, out=True)
    ap.add_argument("--sharded", type=Path, help="a graph prepared with --shards 2")
    ap.add_argument("--work", type=Path, help="where the hosts' folders and runs go")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="1ms")
    ap.add_argument("--strategies", default="allreduce,gossip")
    ap.add_argument("--partitions", type=int, default=40)
    ap.add_argument("--partitioner", default="metis")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--slowdown", default="", help="gossip's --slowdown, e.g. 1=2")
    args = ap.parse_args(argv)
    harness.print_header(1)
    if args.smoke:
        return smoke(args)
    from benchmarks.comm.gloo_over_shaped_link import parse_delay, parse_rate
    from gnnpar.runtime import netns

    args.work.mkdir(parents=True, exist_ok=True)
    folders = host_folders(args.sharded, args.work)
    rate, delay = parse_rate(args.rate), parse_delay(args.delay)
    t0 = time.perf_counter()
    try:
        with netns.shaped_hosts("u", "v", "10.213.0.51", "10.213.0.52", rate, delay) as (h, how):
            print(f"link: {rate / 1e6:g} Mbit/s, {delay * 1e3:g} ms one way ({how})")
            got = measure(args, folders, args.sharded, args.work, h)
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), False)
    print(f"{time.perf_counter() - t0:.0f} s in all; load average {os.getloadavg()}")
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "link": {"rate_bit_s": rate, "delay_s": delay, "how": how},
                "graph": str(args.sharded),
                "settings": vars(args) | {"sharded": str(args.sharded), "work": str(args.work)},
                "load_average_end": os.getloadavg(),
                "strategies": got,
            },
        )
    return 0 if got.get("allreduce", {}).get("loss_curves_equal", True) else 1


def smoke(args) -> int:  # noqa: ANN001
    """Cora in two shards, two hosts on localhost (no namespaces), one epoch of each."""
    import tempfile

    from gnnpar.data.prepare_command import run_prepare

    args.hidden, args.epochs, args.partitions, args.reps = 16, 1, 4, 1
    with tempfile.TemporaryDirectory(prefix="gnnpar-shard-gcn-smoke-") as tmp:
        work = Path(tmp)
        run_prepare("cora", str(work / "s"), None, None, None, str(harness.smoke_root()), None,
                    True, shards="2", partitioner="random")  # fmt: skip
        got = measure(args, host_folders(work / "s", work), work / "s", work)
        assert got["allreduce"]["loss_curves_equal"], got
    return 0


if __name__ == "__main__":
    sys.exit(main())
