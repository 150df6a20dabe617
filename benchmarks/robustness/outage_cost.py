"""What a network outage between two hosts costs (issue 23): time lost against the
uninterrupted run, and where it goes.

    python -m benchmarks.robustness.outage_cost --reps 3        # as root: makes two namespaces

Two hosts x 1 rank (two network namespaces joined by a veth pair, gnnpar.runtime.netns; each host
its own --out), ``torchrun --nnodes 2 --max-restarts 2``, allreduce on synthetic-reddit with
``--timeout T --checkpoint-every 1``. Per repetition, alternating which goes first: the
uninterrupted run, and the same run with the link down for 3 x T once ``--down-after`` epochs
are done. Events are read from the hosts' logs as they appear (polled every 50 ms): each host's
``gnnpar: error:`` line (the outage noticed), the link back up, ``gnnpar: resuming from``
(ranks restarted, rendezvous done, checkpoint agreed on and loaded), the end. Each timed run
holds /tmp/gnnpar-bench.lock; the load average is recorded before and after.
Writes ``--json`` (default benchmarks/results/outage_cost_<date>.json).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import ROOT
from gnnpar.runtime import netns
from gnnpar.runtime.netns import Hosts


def load() -> float:
    return harness.load_average()[0]


def start_pair(h: Hosts, out: Path, name: str, port: int, args: list[str]) -> list:
    procs = []
    for ns, ifname, addr, conf in (
        (h.a, h.if_a, h.addr_a, "is_host=true,join_timeout=120"),
        (h.b, h.if_b, h.addr_b, "join_timeout=120"),
    ):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run"]
        cmd += ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"{h.addr_a}:{port}", "--rdzv-id", name, "--rdzv-conf", conf]
        cmd += ["--local-addr", addr, "--max-restarts", "2", "-m", "gnnpar", "train", *args]
        cmd += ["--out", str(out / ns[-1])]
        env = {**harness.module_env(), "GLOO_SOCKET_IFNAME": ifname, "PYTHONUNBUFFERED": "1"}
        log = (out / f"{ns[-1]}.log").open("w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
    return procs


LOCK = "/tmp/gnnpar-bench.lock"


def one_run(
    h: Hosts, out: Path, port: int, args: list[str], outage_s: float, after: int,
    lock: str | None = LOCK,
) -> dict:  # fmt: skip
    """Wall time and events (seconds from the launch) of one two-host run."""
    out.mkdir(parents=True)
    ev: dict[str, float] = {}
    names = [h.a[-1], h.b[-1]]  # each host's --out and log are named by its letter
    logs = [out / f"{x}.log" for x in names]
    with harness.bench_lock(lock):  # one timed run at a time on a shared machine
        try:
            before = load()
            t0 = time.monotonic()
            procs = start_pair(h, out, out.name, port, args)
            while any(p.poll() is None for p in procs):
                now = time.monotonic() - t0
                texts = [log.read_text() if log.exists() else "" for log in logs]
                for host, text in zip(names, texts):
                    if f"detect_{host}" not in ev and "gnnpar: error:" in text:
                        ev[f"detect_{host}"] = now
                if "resumed" not in ev and any("gnnpar: resuming from" in t for t in texts):
                    ev["resumed"] = now
                epochs = max(
                    (out / x / "metrics.jsonl").read_text().count('"event": "epoch"')
                    if (out / x / "metrics.jsonl").exists()
                    else 0
                    for x in names
                )
                if outage_s and "down" not in ev and epochs >= after:
                    h.link(False)
                    ev["down"] = now
                if "down" in ev and "up" not in ev and now - ev["down"] >= outage_s:
                    h.link(True)
                    ev["up"] = now
                time.sleep(0.05)
            ev["end"] = time.monotonic() - t0
            after_load = load()
        finally:
            h.link(True)
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], (codes, [log.read_text()[-3000:] for log in logs])
    result = json.loads(next(out.glob("*/result.json")).read_text())
    return {
        "events_s": {k: round(v, 2) for k, v in ev.items()},
        "wall_s": round(ev["end"], 2),
        "load_before": before,
        "load_after": after_load,
        "restarts": result.get("restarts"),
        "lost_time_s": result.get("lost_time_s"),
        "train_s": result["train_time_s"],
    }


def measure(h: Hosts, a, args: list[str], out: Path) -> dict[str, list[dict]]:
    """Each repetition's runs, alternating which goes first (``--smoke``: one uninterrupted)."""
    runs: dict[str, list[dict]] = {"uninterrupted": [], "outage": []}
    port = 29450
    for rep in range(a.reps):
        order = ["uninterrupted", "outage"] if rep % 2 == 0 else ["outage", "uninterrupted"]
        for side in ["uninterrupted"] if a.smoke else order:
            port += 1
            outage = 3 * a.timeout if side == "outage" else 0
            lock = None if a.smoke else LOCK  # a smoke run times nothing
            r = one_run(h, out / f"{side}-{rep}", port, args, outage, a.down_after, lock)
            runs[side].append(r)
            print(side, rep, json.dumps(r), flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=5)
    p.add_argument("--scale", type=float, default=0.02)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--down-after", type=int, default=10, help="epochs done before the outage")
    p.add_argument("--out", default="bench-out/outage_cost")
    p.add_argument("--json", default=None, help="the summary (default: benchmarks/results/...)")
    a = p.parse_args(argv)
    if a.smoke:  # one short uninterrupted two-host run (an outage costs 3 x --timeout more)
        a.reps, a.timeout, a.scale, a.epochs = 1, 30, 0.005, 2
        a.out = tempfile.mkdtemp(prefix="gnnpar-outage-")
        a.json = str(Path(a.out) / "outage_cost.json")
    harness.print_header(1)
    args = ["--dataset", "synthetic-reddit", "--scale", f"{a.scale:g}", "--model", "sage"]
    args += ["--strategy", "allreduce", "--partitions", "8", "--epochs", str(a.epochs)]
    args += ["--threads", "1", "--seed", "5", "--quiet", "--eval-every", "0"]
    args += ["--timeout", f"{a.timeout:g}", "--checkpoint-every", "1"]
    out = Path(a.out) / time.strftime("%Y%m%d-%H%M%S")
    try:
        with netns.make_hosts("e", "f", "10.213.0.9", "10.213.0.10") as h:
            runs = measure(h, a, args, out)
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), a.smoke)
    if a.smoke:
        print(json.dumps(runs), flush=True)
        return 0
    med = {s: statistics.median(r["wall_s"] for r in rs) for s, rs in runs.items()}
    phases = {
        "detection_s": [max(r["events_s"][f"detect_{x}"] for x in "ef") - r["events_s"]["down"]
                        for r in runs["outage"]],
        "link_down_after_detection_s": [r["events_s"]["up"] - max(r["events_s"][f"detect_{x}"]
                                        for x in "ef") for r in runs["outage"]],
        "up_to_resumed_s": [r["events_s"]["resumed"] - r["events_s"]["up"] for r in runs["outage"]],
        "resumed_to_end_s": [r["events_s"]["end"] - r["events_s"]["resumed"]
                             for r in runs["outage"]],
    }  # fmt: skip
    summary = {
        "machine": harness.machine(1),
        "args": args,
        "outage_s": 3 * a.timeout,
        "median_wall_s": med,
        "lost_s": round(med["outage"] - med["uninterrupted"], 2),
        "median_phases_s": {k: round(statistics.median(v), 2) for k, v in phases.items()},
        "median_lost_time_s": statistics.median(r["lost_time_s"] for r in runs["outage"]),
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    path = a.json or harness.RESULTS / f"outage_cost_{time.strftime('%Y-%m-%d')}.json"
    harness.write_json(path, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
