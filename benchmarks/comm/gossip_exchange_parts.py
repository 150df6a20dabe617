"""What one gossip exchange between two hosts consists of, timed on both sides of the link.

Two network namespaces (gnnpar.runtime.netns; root and iproute2) joined by the link emulated in
user space (gnnpar.runtime.wire) of ``--rate`` and one-way ``--delay``; rank 0 in host A beside
the TCPStore, rank 1 in host B, every store call of rank 1 across the link (as ``gnnpar advise
--validate --hosts 2`` places them). Both ranks run gossip's own protocol
(:class:`gnnpar.parallel.gossip.protocol.Pairing`, the work pool's ``add``, the boundary of
:class:`gnnpar.training.gossip_sync.GossipSync` with ``K = 1``) around a step of
``--step-ms`` (rank 0) and ``--far-step-ms`` (rank 1), and each timestamps, with the clock both
namespaces share, every exchange's parts: entering it, the partner's bytes received, its own
send completed, leaving. Then, for comparison, exchanges after a barrier with both sides posting
at once, and with rank 0 posting ``--late-ms`` after rank 1 (the order of a gossip exchange:
the claimed rank waits ready). The steps are a fixed piece of work that took ``--step-ms``
alone; rank 0 also times it alone (rank 1 asleep in a store wait) before and after the gossip. Prints per phase the medians of each part, and the TCP state of
the ranks' connection (``ss -tin``: congestion window, round-trip time), and per rank the
median take from the pool, step and boundary (the pairing's store calls, its exchanges left
out); and the CPU time and packets of the link's own process (it shares the machine's cores:
a cable would not).

    python -m benchmarks.comm.gossip_exchange_parts --rate 100mbit --delay 5ms
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness


def calibrated_work(seconds: float):
    """A fixed piece of work (128 x 128 products, one thread) that took ``seconds`` here just
    now, alone: timed inside gossip, how much the exchanges' machinery around it stretches it."""
    import torch

    a = torch.randn(128, 128)
    for _ in range(20):
        torch.mm(a, a)
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(100):
            torch.mm(a, a)
        t.append((time.perf_counter() - t0) / 100)
    n = max(1, round(seconds / min(t)))

    def work() -> None:
        for _ in range(n):
            torch.mm(a, a)

    return work


def exchange(mine, partner: int) -> dict:
    """mixing.exchange_average's calls, each timestamped (time.monotonic: one clock for both
    namespaces)."""
    import torch.distributed as dist

    theirs = mine.clone()
    t = {"enter": time.monotonic()}
    sent = dist.isend(mine, partner)
    got = dist.irecv(theirs, partner)
    got.wait(timeout=datetime.timedelta(seconds=60))
    t["recv"] = time.monotonic()
    sent.wait(timeout=datetime.timedelta(seconds=60))
    t["sent"] = time.monotonic()
    mine.add_(theirs).mul_(0.5)
    t["exit"] = time.monotonic()
    return t


def ss(peer: str) -> str:
    """Each TCP connection to ``peer``: its congestion control, round-trip time, congestion
    window and bytes sent (``ss -tin``)."""
    out = subprocess.run(["ss", "-tin", "dst", peer], capture_output=True, text=True).stdout
    keep = ("rtt:", "cwnd:", "bytes_sent:")
    conns = []
    for line in out.splitlines()[1:]:
        if "cwnd" in line:
            fields = line.split()
            conns.append(" ".join(fields[:1] + [f for f in fields if f.startswith(keep)]))
    return " | ".join(conns)


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    from gnnpar.parallel.gossip.protocol import Pairing
    from gnnpar.parallel.gossip.topology import AnyPeer

    torch.set_num_threads(1)
    rank = args.rank
    store = dist.TCPStore(args.addr, args.port + 1, 2, rank == 0, timeout=datetime.timedelta(60))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=2)
    peer = args.peer
    mine = torch.ones(args.floats)
    pairing = Pairing(store, "g", AnyPeer(rank, 2), random.Random(rank), 60.0)
    pairing.open()
    dist.barrier()
    step_s = (args.step_ms if rank == 0 else args.far_step_ms) / 1e3
    work = calibrated_work(step_s)
    alone = [solo(store, "solo0", work, rank, args.solo_steps)]
    dist.barrier()
    log, marks, steps = [], [], 0
    total = args.positions
    while True:
        t_take = time.monotonic()
        if store.add("pool", 1) - 1 >= total:  # the pool's take
            break
        t0 = time.perf_counter()
        t_step = time.monotonic()
        work()
        steps += 1
        tb = time.monotonic()
        x = pairing.at_boundary(want=True)
        waited = 0.0
        while x is not None:
            t = exchange(mine, x.partner)
            t.update(xid=x.xid, initiated=x.initiated)
            log.append(t)
            waited += t["exit"] - t["enter"]
            pairing.finish(x)
            x = pairing.at_boundary(want=True) if x.initiated else None
        # [take's start, step's start, boundary's start, boundary's end, in exchanges]
        marks.append([t_take, t_step, tb, time.monotonic(), waited])
        pairing.record_step(time.perf_counter() - t0 - waited)
    while (x := pairing.retire()) is not None:
        t = exchange(mine, x.partner)
        t.update(xid=x.xid, initiated=x.initiated, retire=True)
        log.append(t)
        pairing.finish(x)
    tcp_gossip = ss(peer)
    dist.barrier()
    alone.append(solo(store, "solo1", work, rank, args.solo_steps))
    dist.barrier()
    phases = {}
    for name, late in (("at once", 0.0), ("rank 0 late", args.late_ms / 1e3)):
        rows = []
        for _ in range(args.calls):
            dist.barrier()
            work()
            if rank == 0 and late:
                time.sleep(late)
            rows.append(exchange(mine, 1 - rank))
        phases[name] = rows
    out = {"rank": rank, "steps": steps, "gossip": log, "boundaries": marks, "phases": phases}
    out["alone"] = alone
    out["tcp_after_gossip"], out["tcp_end"] = tcp_gossip, ss(peer)
    Path(args.log).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def solo(store, key: str, work, rank: int, steps: int) -> list[float]:
    """Rank 0's steps while rank 1 sleeps in a store wait (nothing crosses the link, nobody
    polls): their times."""
    times = []
    if rank == 0:
        for _ in range(steps):
            t0 = time.monotonic()
            work()
            times.append(time.monotonic() - t0)
        store.set(key, b"1")
    else:
        store.wait([key], datetime.timedelta(seconds=300))
    return times


def cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def med(xs) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def report(a: dict, b: dict) -> dict:
    """Match both sides' exchanges by id; medians in ms, relative to the later side's entry."""
    out = {}
    bx = {t["xid"]: t for t in b["gossip"]}
    pairs = [(t, bx[t["xid"]]) for t in a["gossip"] if t["xid"] in bx and not t.get("retire")]
    phases = {"gossip K=1": pairs}
    for name in a["phases"]:
        phases[name] = list(zip(a["phases"][name], b["phases"][name], strict=True))
    for name, rows in phases.items():
        if not rows:
            continue
        r = {
            "n": len(rows),
            "rank 0 entered after rank 1": med([x["enter"] - y["enter"] for x, y in rows]),
            "rank 0 in exchange": med([x["exit"] - x["enter"] for x, _ in rows]),
            "rank 1 in exchange": med([y["exit"] - y["enter"] for _, y in rows]),
            "rank 0 got rank 1's bytes (from the later entry)": med(
                [x["recv"] - max(x["enter"], y["enter"]) for x, y in rows]
            ),
            "rank 1 got rank 0's bytes (from the later entry)": med(
                [y["recv"] - max(x["enter"], y["enter"]) for x, y in rows]
            ),
            "rank 0 send done (from its entry)": med([x["sent"] - x["enter"] for x, _ in rows]),
            "rank 1 send done (from its entry)": med([y["sent"] - y["enter"] for _, y in rows]),
        }
        if name.startswith("gossip"):
            ia = [t["enter"] for t, _ in rows]
            r["rank 0 between exchanges"] = med([q - p for p, q in zip(ia, ia[1:])])
            r["claimer rank 0"] = sum(t["initiated"] for t, _ in rows)
        out[name] = r
    for r, side in enumerate((a, b)):
        m = side["boundaries"]
        out[f"rank {r} per step"] = {
            "take (the pool's add)": med([q[1] - q[0] for q in m]),
            "step": med([q[2] - q[1] for q in m]),
            "boundary without its exchanges": med([q[3] - q[2] - q[4] for q in m]),
            "steps with an exchange": sum(q[4] > 0 for q in m),
            "step mean": statistics.mean(q[2] - q[1] for q in m) * 1e3,
        }
    before, after = a["alone"]
    out["rank 0's steps alone (rank 1 asleep)"] = {
        "before: median": med(before), "before: mean": statistics.mean(before) * 1e3,
        "after: median": med(after), "after: mean": statistics.mean(after) * 1e3,
    }  # fmt: skip
    out["steps"] = [a["steps"], b["steps"]]
    out["tcp (rank 0's side) after gossip"] = a["tcp_after_gossip"]
    out["tcp (rank 0's side) at the end"] = a["tcp_end"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--delay", default="5ms")
    ap.add_argument("--floats", type=int, default=23063, help="exchanged floats (Cora gcn's)")
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--far-step-ms", type=float, default=1.3)
    ap.add_argument("--positions", type=int, default=1600, help="the pool's size")
    ap.add_argument("--late-ms", type=float, default=10.0)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--solo-steps", type=int, default=400, help="rank 0's steps alone")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--keep", type=Path, help="also copy both ranks' raw logs into this folder")
    for hidden in ("--rank", "--addr", "--peer", "--log"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29980, help=argparse.SUPPRESS)
    args = harness.start(ap, argv, {"positions": 60, "calls": 4, "solo_steps": 10}, header=False)
    if args.rank is not None:
        args.rank = int(args.rank)
        rank_main(args)
        return 0
    from benchmarks.comm.gloo_over_shaped_link import parse_delay, parse_rate
    from gnnpar.runtime import netns

    harness.print_header(1)
    try:
        return run(args, netns, parse_rate(args.rate), parse_delay(args.delay))
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), args.smoke)


def run(args, netns, rate: float, delay: float) -> int:
    import tempfile

    with (
        tempfile.TemporaryDirectory() as tmp,
        netns.make_hosts("m", "n", "10.213.0.33", "10.213.0.34", link="emulated") as h,
    ):
        h.shape(rate, delay)
        print(f"link: emulated, {rate / 1e6:g} Mbit/s, {delay * 1e3:g} ms one way")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = harness.module_env()["PYTHONPATH"]
        logs = [Path(tmp) / f"rank{r}.json" for r in (0, 1)]
        hosts = ((h.a, h.if_a, h.addr_b), (h.b, h.if_b, h.addr_a))
        procs = []
        for r, (ns, dev, peer) in enumerate(hosts):
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", __spec__.name]
            for k in ("rate", "delay", "floats", "step_ms", "far_step_ms", "positions",
                      "late_ms", "calls", "solo_steps", "port"):  # fmt: skip
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            cmd += ["--rank", str(r), "--addr", h.addr_a, "--peer", peer, "--log", str(logs[r])]
            procs.append(
                subprocess.Popen(cmd, env={**env, "GLOO_SOCKET_IFNAME": dev}, cwd=harness.ROOT)
            )
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            return max(codes, key=abs)
        wire = {"cpu_s": cpu_s(h.wire.pid), **h.wire_stats()}
        a, b = (json.loads(p.read_text()) for p in logs)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for p in logs:
                (args.keep / p.name).write_text(p.read_text())
    figures = report(a, b)
    figures["the link's process over the whole run"] = wire
    for name, r in figures.items():
        if isinstance(r, dict):
            print(f"\n{name}:")
            for k, v in r.items():
                print(f"  {k}: {v:.2f}" if isinstance(v, float) else f"  {k}: {v}")
        else:
            print(f"{name}: {r}")
    print(f"load average after: {harness.load_average()}")
    if args.json:
        harness.write_json(args.json, {"machine": harness.machine(1), "figures": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
