"""The link emulated in user space (gnnpar.runtime.wire): its timing model by hand, its two
directions carrying datagrams when due, and (slow, needs root) two namespaces joined by it
with the rate and delay asked."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from gnnpar.runtime.wire import Direction, Shape


def test_packets_are_serialised_in_turn_then_delayed():
    """8 Mbit/s (1 byte per us), 2 ms: a 1000-byte packet at t=0 leaves the wire at 1 ms and
    arrives at 3 ms; one that comes at 0.5 ms waits for the wire (2 ms, arrives 4 ms); one at
    10 ms finds it idle (arrives 10 + 0.5 + 2 ms)."""
    way = Direction(-1, -1, Shape(8e6, 0.002))
    assert way.due(1000, 0.0) == pytest.approx(0.003)
    assert way.due(1000, 0.0005) == pytest.approx(0.004)
    assert way.due(500, 0.010) == pytest.approx(0.0125)


def test_a_packet_behind_more_than_the_limit_is_dropped():
    way = Direction(-1, -1, Shape(8e6, 0.0, limit_bytes=2500))
    assert [way.due(1000, 0.0) is None for _ in range(4)] == [False, False, False, True]
    assert way.due(1000, 0.003) is not None  # the queue drained: 1000 bytes wait, not 3000


def test_shape_refuses_a_rate_or_delay_that_is_not_a_link():
    for rate, delay in ((0, 0.001), (-1, 0.001), (1e6, -1), (float("nan"), 0.001)):
        with pytest.raises(ValueError):
            Shape(rate, delay)


def test_datagrams_arrive_in_order_no_earlier_than_due():
    """Both loops over a datagram socket pair (a TUN device keeps packets whole as well): 20
    packets of 10 kB at 80 Mbit/s and 5 ms delay each arrive after their own serialisation and
    the delay, in the order sent, unchanged."""
    a_in, a_out = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b_in, b_out = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    way = Direction(a_out.fileno(), b_in.fileno(), Shape(80e6, 0.005))
    way.start()
    got: list[tuple[float, bytes]] = []

    def receive():
        for _ in range(20):
            pkt = b_out.recv(20000)
            got.append((time.monotonic(), pkt))

    t = threading.Thread(target=receive)
    t.start()
    t0 = time.monotonic()
    sent = [bytes([i]) * 10_000 for i in range(20)]
    for pkt in sent:
        a_in.send(pkt)
    t.join(timeout=10)
    assert [p for _, p in got] == sent
    for i, (at, _) in enumerate(got):  # packet i is due after (i + 1) x 1 ms + 5 ms
        assert at - t0 >= (i + 1) * 0.001 + 0.005 - 1e-4, (i, at - t0)
    for _ in range(1000):  # the writer counts a packet just after the receiver has it
        if way.carried[0] == 20:
            break
        time.sleep(0.001)
    assert way.carried == [20, 200_000] and way.dropped == [0, 0]
    for s in (a_in, a_out, b_in, b_out):
        s.close()


def test_emulated_links_carry_ethernet_frames_where_the_link_process_keeps_up():
    """1,500 bytes (Ethernet's) up to ~120 Mbit/s, so that a two-way transfer's
    acknowledgements are not held behind huge packets; larger on faster links, so that the
    link process carries at most ~10,000 packets a second each way; never over 65,000."""
    from gnnpar.runtime.netns import MTU_EMULATED, WIRE_PACKETS_S, emulated_mtu

    assert emulated_mtu(1e6) == emulated_mtu(100e6) == 1500
    assert emulated_mtu(1e9) == 12_500 == 1e9 / 8 / WIRE_PACKETS_S
    assert emulated_mtu(100e9) == MTU_EMULATED == 65_000


@pytest.mark.slow
def test_two_namespaces_over_the_emulated_link_see_its_delay_and_rate():
    """make_hosts(link="emulated") shaped to 100 Mbit/s and 5 ms: a round trip of one byte takes
    >= 10 ms, 1 MB one way and one byte back >= 80 ms + 10 ms and not much more; the link
    taken down carries nothing; the namespaces and the link's process are gone afterwards; the
    link's process runs under the real-time FIFO policy."""
    import subprocess
    import sys

    from gnnpar.runtime import netns
    from tests.e2e.netns import unavailable

    if os.geteuid() != 0:
        unavailable("root is needed")
    client = """
import socket, sys, time
c = socket.create_connection(("10.213.0.18", 5001), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def ask(n):
    t = time.perf_counter(); c.sendall(b"x" * (n - 1) + b"!"); c.recv(1)
    return time.perf_counter() - t
rtt = min(ask(1) for _ in range(5))
bulk = min(ask(1_000_000) for _ in range(3))
print(rtt, bulk)
"""
    server = """
import socket
s = socket.socket(); s.bind(("10.213.0.18", 5001)); s.listen(1); c, _ = s.accept()
while True:
    d = c.recv(1 << 20)
    if not d: break
    if d.endswith(b"!"): c.sendall(b"k")
"""
    try:
        with netns.make_hosts("e", "f", "10.213.0.17", "10.213.0.18", link="emulated") as h:
            assert h.kind == "emulated"
            h.shape(100e6, 0.005)
            wire = h.wire
            # as root every thread of the link's process is real-time (FIFO): its packets never
            # wait for a core behind the machine's other work, as a cable's never do
            for tid in os.listdir(f"/proc/{wire.pid}/task"):
                assert os.sched_getscheduler(int(tid)) == os.SCHED_FIFO, tid
            for ns, dev in ((h.a, h.if_a), (h.b, h.if_b)):  # Ethernet's frames at 100 Mbit/s
                shown = netns.ip("-n", ns, "link", "show", dev).stdout
                assert " mtu 1500 " in shown, shown
            ns_exec = ["ip", "netns", "exec"]
            srv = subprocess.Popen([*ns_exec, h.b, sys.executable, "-c", server])
            try:
                for _ in range(50):  # until the server listens
                    done = subprocess.run(
                        [*ns_exec, h.a, sys.executable, "-c", client],
                        capture_output=True, text=True, timeout=60,
                    )  # fmt: skip
                    if done.returncode == 0 or "refused" not in done.stderr:
                        break
                    time.sleep(0.1)
                assert done.returncode == 0, done.stderr
                rtt, bulk = map(float, done.stdout.split())
                assert 0.010 <= rtt < 0.016, rtt
                assert 0.090 <= bulk < 0.130, bulk  # 8 Mbit at 100 Mbit/s + 2 x 5 ms
                stats = h.wire_stats()
                assert stats["a->b"]["carried"][1] >= 3_000_000, stats
                h.link(False)
                cut = subprocess.run(
                    [*ns_exec, h.a, sys.executable, "-c", client.replace("10)", "1)")],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert cut.returncode != 0
            finally:
                srv.kill()
                srv.wait()
    except netns.NetnsUnavailable as e:
        unavailable(str(e))
    assert wire is not None and wire.poll() is not None
    assert not [n for n in netns.namespaces_left() if n[-2:] in ("-e", "-f")]
