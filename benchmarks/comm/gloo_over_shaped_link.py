"""gloo's collectives between two hosts over a link of a given rate and one-way delay.

Two network namespaces (gnnpar.runtime.netns; root and iproute2) joined by a veth pair (no
delay) or by the link emulated in user space (gnnpar.runtime.wire; a delay), one rank in each;
the ranks time ``barrier``, ``all_reduce`` of 4 B-4 MB, a ``send`` + ``recv`` round trip and an
``isend`` + ``irecv`` exchange (gossip's), median of 25-30 each, and rank 0 prints them. It
calibrates what ``gnnpar advise`` charges for a message between hosts
(``GLOO_LATENCIES_PER_MESSAGE`` in gnnpar/advise/simulate.py).

    python -m benchmarks.comm.gloo_over_shaped_link --rate 1gbit --delay 1ms [--veth]
    python -m benchmarks.comm.gloo_over_shaped_link --rate 100mbit --delay 5ms --mtu 1500 --sizes 197673

``--mtu``: the emulated devices' MTU instead of the one gnnpar picks for the rate
(``netns.emulated_mtu``: Ethernet's 1,500 up to ~120 Mbit/s); ``--sizes``: tensor sizes in floats;
``--compute-ms``: that much work (128 x 128 products, one thread) before each timed call, as a
training step computes between its all-reduces.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchmarks import harness

SIZES = (1, 1024, 23063, 262144, 1 << 20)  # floats: 4 B, 4 KB, Cora gcn's 92 KB, 1 MB, 4 MB


def rank_main(
    rank: int, addr: str, port: int, sizes=SIZES, compute_s: float = 0.0, calls: int = 0
) -> None:
    """One rank's timings; ``calls``: timed calls of each (0: 30, and 25 per size)."""
    import torch
    import torch.distributed as dist

    from gnnpar.parallel.collectives import all_reduce_sum

    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
    harness.set_threads(1)
    a = torch.randn(128, 128)

    def median_ms(fn, n: int = 30) -> float:
        n = calls or n
        fn()
        times = []
        for _ in range(n):
            dist.barrier()
            if compute_s:  # a training step's compute between the calls: the link idles
                until = time.perf_counter() + compute_s
                while time.perf_counter() < until:
                    torch.mm(a, a)
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    out = {"barrier": median_ms(dist.barrier)}
    for n in sizes:
        x, y = torch.ones(n), torch.empty(n)
        out[f"all_reduce {n * 4} B"] = median_ms(lambda x=x: dist.all_reduce(x))

        def round_trip(x=x):
            if rank == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            else:
                dist.recv(x, 0)
                dist.send(x, 0)

        def exchange(x=x, y=y):
            a, b = dist.isend(x, 1 - rank), dist.irecv(y, 1 - rank)
            a.wait()
            b.wait()

        def pair_sum(x=x):  # gnnpar's two-rank all-reduce: batch_isend_irecv, then add
            all_reduce_sum(x)

        out[f"send+recv round trip {n * 4} B"] = median_ms(round_trip, 25)
        out[f"isend+irecv exchange {n * 4} B"] = median_ms(exchange, 25)
        out[f"gnnpar all_reduce_sum {n * 4} B"] = median_ms(pair_sum, 25)
    if rank == 0:
        for k, v in out.items():
            print(f"{k}: {v:.2f} ms", flush=True)
    dist.destroy_process_group()


def parse_rate(text: str) -> float:
    from gnnpar.advise.command import parse_network

    return parse_network(f"{text},0us").bandwidth_Bps * 8


def parse_delay(text: str) -> float:
    from gnnpar.advise.command import parse_network

    return parse_network(f"1gbit,{text}").latency_s


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="1ms")
    ap.add_argument("--veth", action="store_true", help="a veth pair (tc tbf: no delay)")
    ap.add_argument("--mtu", type=int, default=None, help="the emulated devices' MTU (bytes)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="floats, comma-separated")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="work before each call")
    ap.add_argument("--calls", type=int, default=0, help="timed calls of each (0: 25-30)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29990, help=argparse.SUPPRESS)
    args = harness.start(ap, argv, {"sizes": "1,1024", "calls": 3}, header=False)
    if args.rank is not None:
        sizes = [int(n) for n in args.sizes.split(",")]
        rank_main(args.rank, args.addr, args.port, sizes, args.compute_ms / 1e3, args.calls)
        return 0
    from gnnpar.runtime import netns

    harness.print_header(1)
    try:
        return links(args, netns)
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), args.smoke)


def links(args, netns) -> int:
    """Two hosts joined by the link asked for, one rank in each; rank 0 prints."""
    rate, delay = parse_rate(args.rate), parse_delay(args.delay)
    link = "veth" if args.veth else "emulated"
    with netns.make_hosts("k", "l", "10.213.0.29", "10.213.0.30", link=link) as h:
        why = h.shape(rate, delay)
        if args.mtu:
            for ns, dev in ((h.a, h.if_a), (h.b, h.if_b)):
                subprocess.run(
                    ["ip", "-n", ns, "link", "set", dev, "mtu", str(args.mtu)], check=True
                )
        mtu = f", MTU {args.mtu or netns.emulated_mtu(rate)}" if link == "emulated" else ""
        print(
            f"link: {link}, {rate / 1e6:g} Mbit/s, {delay * 1e3:g} ms{mtu}"
            f"{f' ({why})' if why else ''}"
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        env["PYTHONPATH"] = harness.module_env()["PYTHONPATH"]
        procs = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    __spec__.name,
                    "--rank",
                    str(r),
                    "--addr",
                    h.addr_a,
                    "--port",
                    str(args.port),
                    "--sizes",
                    args.sizes,
                    "--compute-ms",
                    str(args.compute_ms),
                    "--calls",
                    str(args.calls),
                ],
                env={**env, "GLOO_SOCKET_IFNAME": dev},
                cwd=harness.ROOT,
            )  # fmt: skip
            for r, (ns, dev) in enumerate(((h.a, h.if_a), (h.b, h.if_b)))
        ]
        codes = [p.wait(timeout=600) for p in procs]
    return max(codes, key=abs)


if __name__ == "__main__":
    sys.exit(main())
