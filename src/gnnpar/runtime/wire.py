"""A link between two hosts emulated in user space, for kernels without tc's ``netem``.

What it does is what ``tc qdisc ... netem rate R delay D`` does on each end of a cable: every
packet is serialised onto the wire at ``R`` bit/s behind the packets before it (first in, first
out) and arrives ``D`` seconds after its last bit left. Each host (a network namespace,
:mod:`gnnpar.runtime.netns`) has a TUN device instead of a veth end; this process holds both
devices' file descriptors and carries every packet from one to the other at the time the link
model says. Nothing is reordered, corrupted or duplicated. A packet that would wait more than
``limit`` bytes behind the ones being serialised is dropped, as a switch port's full buffer
drops it (the default, 8 MB or half a second at the rate, is above any burst gnnpar's
collectives send, so the link is lossless for them). Taking a host's device down (``ip link set
... down``) cuts the cable: packets to it are dropped.

The devices' MTU is Ethernet's 1,500 bytes up to ~120 Mbit/s and larger on faster links, so
that this process carries at most ~10,000 packets a second each way, not the ~80,000 that
Ethernet-sized frames would cost in Python at 1 Gbit/s (``netns.emulated_mtu``: 12,500 bytes at
1 Gbit/s, at most 65,000; TUN allows 65,535). Larger packets than Ethernet's would make a
two-way transfer wrong: an acknowledgement waits behind a whole packet of the other direction,
and a two-rank exchange of 0.79 MB at 100 Mbit/s ran its two directions one after the other
(137 ms with 65,000-byte packets, 77 ms with 1,500). With 65,000-byte packets, 33 MB carried at
1 Gbit/s took this process 0.05 s of CPU on an Intel Xeon, its start included; it uses none
while the link is idle. Each packet is delivered ~0.1 ms after it is due (a thread's
wake-up; a 1 ms link measured a 2.29 ms round trip), so delays of 1 ms and more are faithful to
~10% and shorter ones are not. Where it may (root), the process runs under the real-time FIFO
policy (:func:`realtime`): on a loaded machine its packets would otherwise wait for a core
behind the other processes, which a cable's never do.

Run by :func:`gnnpar.runtime.netns.make_hosts` (``link="emulated"``) as a script, which needs
only the standard library::

    python -I path/to/gnnpar/runtime/wire.py DEV_A DEV_B

It creates the two TUN devices, prints ``ready``, and reads commands on stdin: ``shape RATE_BIT_S
DELAY_S`` (answered ``ok``) and ``stats`` (answered with the packets and bytes carried and
dropped per direction, as JSON). It ends when stdin closes, so it never outlives its parent.
Linux only; needs CAP_NET_ADMIN (root).
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import struct
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MTU = 65000
READ_SIZE = 65536 + 64


def open_tun(name: str) -> int:
    """A new TUN device ``name`` (layer 3, no packet information header); its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Shape:
    """The link's rate and one-way delay, shared by both directions; changed while running."""

    def __init__(self, rate_bit_s: float = 1e9, delay_s: float = 0.0, limit_bytes: int = 0):
        self.lock = threading.Lock()
        self.set(rate_bit_s, delay_s, limit_bytes)

    def set(self, rate_bit_s: float, delay_s: float, limit_bytes: int = 0) -> None:
        if not rate_bit_s > 0 or not delay_s >= 0:
            raise ValueError(
                f"rate {rate_bit_s} bit/s and delay {delay_s} s: need rate > 0, delay >= 0"
            )
        with self.lock:
            self.rate_Bps = rate_bit_s / 8
            self.delay_s = delay_s
            self.limit_bytes = limit_bytes or max(8_000_000, int(0.5 * self.rate_Bps))


class Direction:
    """One direction of the cable: packets read from ``src`` are written to ``dst`` when due."""

    def __init__(self, src: int, dst: int, shape: Shape, clock=time.monotonic):
        self.src, self.dst, self.shape, self.clock = src, dst, shape, clock
        self.free_at = 0.0  # when the wire has serialised every packet queued so far
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.carried = [0, 0]  # packets, bytes
        self.dropped = [0, 0]

    def due(self, size: int, now: float) -> float | None:
        """When a packet of ``size`` bytes that arrives at ``now`` reaches the other end; None
        when the queue in front of it is over the limit (the packet is dropped)."""
        s = self.shape
        with s.lock:
            start = max(now, self.free_at)
            if (start - now) * s.rate_Bps > s.limit_bytes:
                return None
            self.free_at = start + size / s.rate_Bps
            return self.free_at + s.delay_s

    def read_loop(self) -> None:
        while True:
            try:
                pkt = os.read(self.src, READ_SIZE)
            except OSError:
                return
            if not pkt:
                return
            at = self.due(len(pkt), self.clock())
            if at is None:
                self.dropped[0] += 1
                self.dropped[1] += len(pkt)
                continue
            with self.ready:
                self.queue.append((at, pkt))
                self.ready.notify()

    def write_loop(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                at, pkt = self.queue[0]
            wait = at - self.clock()
            if wait > 0:
                time.sleep(wait)
            self.queue.popleft()
            try:
                os.write(self.dst, pkt)
            except OSError:  # the receiving device is down: the cable is cut
                self.dropped[0] += 1
                self.dropped[1] += len(pkt)
                continue
            self.carried[0] += 1
            self.carried[1] += len(pkt)

    def start(self) -> None:
        for loop in (self.read_loop, self.write_loop):
            threading.Thread(target=loop, daemon=True).start()


def realtime() -> bool:
    """Run this process (and the threads it starts after) under the real-time FIFO policy, at
    the lowest real-time priority, where allowed (root): a cable's packets are carried by the
    NIC and the kernel, never queued behind the machine's other processes, while this process
    is one of them. At normal priority, on a 2-core machine at load 14, a 92 KB message took
    10.5 ms where the link's rate says 7.4 (7.9 ms under FIFO); a whole packet's work is tens
    of microseconds, so it cannot hold a core (and the kernel's real-time throttling caps it).
    False where the policy cannot be set (the process keeps its priority)."""
    try:
        os.sched_setscheduler(
            0, os.SCHED_FIFO, os.sched_param(os.sched_get_priority_min(os.SCHED_FIFO))
        )
    except (AttributeError, OSError):
        return False
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gnnpar.runtime.wire DEV_A DEV_B", file=sys.stderr)
        return 2
    realtime()
    try:
        fa, fb = open_tun(argv[0]), open_tun(argv[1])
    except OSError as e:
        print(f"cannot create TUN devices {argv}: {e}", file=sys.stderr)
        return 1
    shape = Shape()
    ways = {"a->b": Direction(fa, fb, shape), "b->a": Direction(fb, fa, shape)}
    for way in ways.values():
        way.start()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["shape"] and len(words) == 3:
                shape.set(float(words[1]), float(words[2]))
                print("ok", flush=True)
            elif words == ["stats"]:
                stats = {k: {"carried": w.carried, "dropped": w.dropped} for k, w in ways.items()}
                print(json.dumps(stats), flush=True)
            else:
                print(f"error unknown command {line.strip()!r}", flush=True)
        except ValueError as e:
            print(f"error {e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
