"""Two hosts on one machine: two network namespaces joined by a veth pair (``gnnpar advise
--validate --hosts 2`` measures on them; the two-host tests use them too, tests/e2e/netns.py).

Host A and host B are network namespaces (``ip netns``) with one veth pair between them and
their own loopback; nothing else connects them. Each pair has its own /30. Both namespaces share
the machine's hostname (as cloned VMs and containers often do), its processes and its disk: a
run gives each host an ``--out`` of its own so that no folder is shared.

``net.ipv4.tcp_retries2`` is set to 7 in each namespace, as the README recommends for hosts
that must notice a peer that never comes back: the kernel then gives up on a TCP connection
whose data go unacknowledged for ~51 s (the default 15: ~15 min), which bounds how long
torchrun's agent on a host that does not hold the rendezvous waits on it, and still lets
connections live through an outage of up to ~25 s (retransmissions at 0.2, 0.6, ... 25.4 s).

:meth:`Hosts.shape` gives the link a rate and a one-way delay with tc's ``netem``. Kernels built
without ``CONFIG_NET_SCH_NETEM`` lack it; there :func:`shaped_hosts` joins the hosts by an
*emulated* link instead (``make_hosts(..., link="emulated")``): a TUN device in each namespace,
and a process (:mod:`gnnpar.runtime.wire`) that carries each packet from one to the other when a
cable of that rate and delay would deliver it. A veth link without netem can only be limited in
rate (tc's token bucket, ``tbf``), which :meth:`Hosts.shape` then does, saying that it added no
delay. Needs root and ``ip`` (iproute2); otherwise :class:`NetnsUnavailable` says why.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "gnnpar-t"  # namespaces gnnpar-t<pid>-<x>, veth ends gt<x><pid>
TCP_RETRIES2 = 7
MTU_EMULATED = 65000  # gnnpar.runtime.wire.MTU: the most the emulated link carries
WIRE_PACKETS_S = 10_000  # packets a second each way the link process is given at most


def emulated_mtu(rate_bit_s: float) -> int:
    """The emulated devices' MTU for a link of ``rate_bit_s``: Ethernet's 1,500 bytes where the
    link process keeps up with that many packets (up to ~120 Mbit/s), larger packets on faster
    links (12,500 bytes at 1 Gbit/s), at most 65,000.

    Large packets are not harmless: each is serialised whole onto a direction's first-in,
    first-out wire, so the acknowledgements that ride back on the other direction's data wait
    behind one. Measured (``benchmarks/comm/gloo_over_shaped_link.py --mtu``; 100 Mbit/s, 5 ms), a two-rank
    ``isend`` + ``irecv`` exchange of 0.79 MB took 137 ms with 65,000- and 9,000-byte packets,
    its two directions one after the other, and 77 ms with 1,500 (ideal 73 ms): a real
    Ethernet link's."""
    return int(min(MTU_EMULATED, max(1500, rate_bit_s / 8 / WIRE_PACKETS_S)))


class NetnsUnavailable(Exception):
    """Two network namespaces cannot be made here; the message says why."""


@dataclass
class Hosts:
    a: str  # namespace names
    b: str
    if_a: str  # veth ends
    if_b: str
    addr_a: str
    addr_b: str
    wire: subprocess.Popen | None = None  # the emulated link's process (link="emulated")

    @property
    def kind(self) -> str:
        return "veth" if self.wire is None else "emulated"

    def placements(self) -> list[tuple[str, str, str]]:
        """(namespace, interface, address) of host A, then host B."""
        return [(self.a, self.if_a, self.addr_a), (self.b, self.if_b, self.addr_b)]

    def link(self, up: bool) -> None:
        """Take the link between the hosts down (as a pulled cable or a failed switch) or up."""
        proc = ip("-n", self.a, "link", "set", self.if_a, "up" if up else "down")
        if proc.returncode != 0:
            raise RuntimeError(f"ip link set {self.if_a}: {proc.stderr.strip()}")

    def shape(self, rate_bit_s: float, delay_s: float) -> str | None:
        """Each direction of the link limited to ``rate_bit_s`` and delayed by ``delay_s``;
        None, or why the delay could not be added (a veth link on a kernel without netem: the
        rate is then still limited, by tbf)."""
        if self.wire is not None:
            self._ask(f"shape {float(rate_bit_s)!r} {float(delay_s)!r}")
            mtu = str(emulated_mtu(rate_bit_s))
            for ns, dev in ((self.a, self.if_a), (self.b, self.if_b)):
                proc = ip("-n", ns, "link", "set", dev, "mtu", mtu)
                if proc.returncode != 0:
                    raise NetnsUnavailable(f"ip link set {dev} mtu {mtu}: {proc.stderr.strip()}")
            return None
        rate = f"{max(int(rate_bit_s), 8000)}bit"
        netem = ("netem", "rate", rate, "delay", f"{max(int(delay_s * 1e6), 0)}us")
        # a bucket of 1 ms at the rate (at least 10 frames): a larger one lets a message of its
        # size through at the veth's own speed (tbf cuts larger GSO packets into frames)
        burst = f"{max(int(rate_bit_s / 8 * 0.001), 15000)}b"
        tbf = ("tbf", "rate", rate, "burst", burst, "latency", "50ms")
        why = None
        for ns, dev in ((self.a, self.if_a), (self.b, self.if_b)):
            proc = tc(ns, "qdisc", "replace", "dev", dev, "root", *netem)
            if proc.returncode == 0:
                continue
            why = f"tc netem: {proc.stderr.strip()} (the kernel lacks CONFIG_NET_SCH_NETEM?)"
            proc = tc(ns, "qdisc", "replace", "dev", dev, "root", *tbf)
            if proc.returncode != 0:
                raise NetnsUnavailable(f"tc cannot shape {dev}: {proc.stderr.strip()}")
        return why

    def _ask(self, command: str) -> str:
        w = self.wire
        assert w is not None and w.stdin is not None and w.stdout is not None
        try:
            w.stdin.write(command + "\n")
            w.stdin.flush()
            answer = w.stdout.readline().strip()
        except (BrokenPipeError, OSError) as e:
            answer = f"error {e}"
        if not answer or answer.startswith("error"):
            raise NetnsUnavailable(f"the emulated link's process: {answer or 'it ended'}")
        return answer

    def wire_stats(self) -> dict:
        """Packets and bytes the emulated link carried and dropped, per direction."""
        import json

        return json.loads(self._ask("stats")) if self.wire is not None else {}


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def tc(ns: str, *args: str) -> subprocess.CompletedProcess:
    return ip("netns", "exec", ns, "tc", *args)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _kill_namespace_processes(ns: str) -> None:
    for pid in ip("netns", "pids", ns).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _remove(ns: str) -> None:
    _kill_namespace_processes(ns)
    ip("netns", "delete", ns)  # deletes its end of the veth, and so the pair


def _may_make_hosts() -> None:
    """Namespace hosts can be made here (``ip`` installed, root), and none of a dead run is left."""
    if shutil.which("ip") is None:
        raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
    if os.geteuid() != 0:
        raise NetnsUnavailable("not root (ip netns add needs CAP_SYS_ADMIN)")
    _clean_stale()


def _clean_stale() -> None:
    """Namespaces and veth ends left by an earlier run that was killed before its teardown."""
    for line in ip("netns", "list").stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)-[a-z])\b", line)
        if m and not _pid_alive(int(m[2])):
            _remove(m[1])
    for m in re.finditer(r"^\d+: (gt[a-z](\d+))[@:]", ip("-o", "link", "show").stdout, re.M):
        if not _pid_alive(int(m[2])):
            ip("link", "delete", m[1])


def namespaces_left() -> list[str]:
    """This process's namespaces that still exist (none after :func:`make_hosts` ends)."""
    mine = f"{PREFIX}{os.getpid()}-"
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if mine in line]


def _start_wire(h: Hosts) -> subprocess.Popen:
    """The emulated link's process, its two TUN devices created (still in this namespace)."""
    from gnnpar.runtime import wire as wire_module

    # the module as a script (it needs only the standard library), isolated from the environment
    wire = subprocess.Popen(
        [sys.executable, "-I", wire_module.__file__, h.if_a, h.if_b],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wire.stdout is not None and wire.stderr is not None
    if wire.stdout.readline().strip() != "ready":
        wire.kill()
        why = wire.stderr.read().strip().splitlines()
        raise NetnsUnavailable(f"the emulated link could not start: {why[-1] if why else '?'}")
    return wire


def _stop_wire(wire: subprocess.Popen | None) -> None:
    if wire is None:
        return
    with contextlib.suppress(OSError):
        assert wire.stdin is not None
        wire.stdin.close()  # it ends when its stdin closes
    try:
        wire.wait(timeout=5)
    except subprocess.TimeoutExpired:
        wire.kill()
        wire.wait(timeout=5)
    for f in (wire.stdout, wire.stderr):
        if f is not None:
            f.close()


@contextlib.contextmanager
def make_hosts(a: str, b: str, addr_a: str, addr_b: str, link: str = "veth") -> Iterator[Hosts]:
    """Hosts ``a`` and ``b`` (one letter each) at ``addr_a`` and ``addr_b`` (one /30); removed
    again (with every process inside them) when the block ends, also on an exception or Ctrl-C.

    ``link``: ``"veth"`` (a veth pair, shaped by tc) or ``"emulated"`` (TUN devices joined by
    :mod:`gnnpar.runtime.wire`, for kernels without netem; unshaped until :meth:`Hosts.shape`)."""
    if link not in ("veth", "emulated"):
        raise ValueError(f"link {link!r}: 'veth' or 'emulated'")
    _may_make_hosts()
    pid = os.getpid()
    h = Hosts(
        f"{PREFIX}{pid}-{a}", f"{PREFIX}{pid}-{b}", f"gt{a}{pid}", f"gt{b}{pid}", addr_a, addr_b
    )
    if link == "veth":
        join = [("link", "add", h.if_a, "type", "veth", "peer", "name", h.if_b)]
        addrs = [
            ("-n", h.a, "addr", "add", f"{addr_a}/30", "dev", h.if_a),
            ("-n", h.b, "addr", "add", f"{addr_b}/30", "dev", h.if_b),
        ]
    else:  # TUN devices are point to point: each end names its peer
        join = []
        addrs = [
            ("-n", h.a, "addr", "add", addr_a, "peer", addr_b, "dev", h.if_a),
            ("-n", h.b, "addr", "add", addr_b, "peer", addr_a, "dev", h.if_b),
            *[("-n", ns, "link", "set", dev, "mtu", str(MTU_EMULATED))
              for ns, dev in ((h.a, h.if_a), (h.b, h.if_b))],
        ]  # fmt: skip
    steps = [
        ("netns", "add", h.a),
        ("netns", "add", h.b),
        *join,
        ("link", "set", h.if_a, "netns", h.a),
        ("link", "set", h.if_b, "netns", h.b),
        *addrs,
        *[("-n", ns, "link", "set", dev, "up") for ns, dev in ((h.a, "lo"), (h.b, "lo"))],
        ("-n", h.a, "link", "set", h.if_a, "up"),
        ("-n", h.b, "link", "set", h.if_b, "up"),
        *[("netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_retries2={TCP_RETRIES2}")
          for ns in (h.a, h.b)],
    ]  # fmt: skip
    try:
        if link == "emulated":
            h.wire = _start_wire(h)
        for step in steps:
            proc = ip(*step)
            if proc.returncode != 0:
                raise NetnsUnavailable(f"`ip {' '.join(step)}` failed: {proc.stderr.strip()}")
        yield h
    finally:
        for ns in (h.a, h.b):
            _remove(ns)
        _stop_wire(h.wire)
        ip("link", "delete", h.if_a)  # only there if setup stopped before moving it


@contextlib.contextmanager
def shaped_hosts(
    a: str, b: str, addr_a: str, addr_b: str, rate_bit_s: float, delay_s: float
) -> Iterator[tuple[Hosts, str]]:
    """Hosts joined by a link of ``rate_bit_s`` and one-way ``delay_s``, and how it is made: a
    veth pair shaped by tc netem, or, where the kernel has no netem and a delay is asked, the
    emulated link (:mod:`gnnpar.runtime.wire`); without a delay a veth limited by tbf."""
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(make_hosts(a, b, addr_a, addr_b))
        why = h.shape(rate_bit_s, delay_s)
        how = "tc netem on a veth pair"
        if why is not None and delay_s > 0:
            stack.close()
            h = stack.enter_context(make_hosts(a, b, addr_a, addr_b, link="emulated"))
            h.shape(rate_bit_s, delay_s)
            how = f"emulated in user space (gnnpar.runtime.wire; no netem here: {why})"
        elif why is not None:
            how = "tc tbf on a veth pair (rate only; no delay was asked)"
        yield h, how


@dataclass
class SwitchedHosts:
    """Hosts on one switch: :func:`switched_hosts`."""

    names: list[str]  # the hosts' namespaces
    ifs: list[str]  # each host's one interface
    addrs: list[str]
    switch: str  # the switch's namespace (a Linux bridge)

    def placements(self) -> list[tuple[str, str, str]]:
        """(namespace, interface, address) of each host."""
        return list(zip(self.names, self.ifs, self.addrs, strict=True))


HOST_LETTERS = "klmnopqr"  # host namespaces gnnpar-t<pid>-<letter>, their veth ends gt<letter><pid>
PORT_LETTERS = "abcdefgh"  # the switch's ends of the same veth pairs


@contextlib.contextmanager
def switched_hosts(
    n: int, subnet: str = "10.214.0", rate_bit_s: float | None = None
) -> Iterator[SwitchedHosts]:
    """``n`` hosts (at most 8) at ``subnet``.1 ... ``subnet``.n (one /24), each a network
    namespace with one veth to a Linux bridge in a namespace of its own (the switch); removed
    again, with every process inside, when the block ends.

    ``rate_bit_s``: each host's port limited to it in both directions by tc's token bucket
    (``tbf``; as :meth:`Hosts.shape` does on a kernel without netem), so that every host has a
    link of its own to the switch, as on a switched network. No delay is added: netem is what
    adds one, and the emulated link (:mod:`gnnpar.runtime.wire`) joins two hosts, not a switch.
    """
    if not 1 <= n <= len(HOST_LETTERS):
        raise ValueError(f"{n} hosts: 1 to {len(HOST_LETTERS)}")
    _may_make_hosts()
    pid = os.getpid()
    h = SwitchedHosts(
        names=[f"{PREFIX}{pid}-{x}" for x in HOST_LETTERS[:n]],
        ifs=[f"gt{x}{pid}" for x in HOST_LETTERS[:n]],
        addrs=[f"{subnet}.{i + 1}" for i in range(n)],
        switch=f"{PREFIX}{pid}-w",
    )
    ports = [f"gt{x}{pid}" for x in PORT_LETTERS[:n]]
    bridge = f"gtw{pid}"
    steps: list[tuple[str, ...]] = [
        ("netns", "add", h.switch),
        ("-n", h.switch, "link", "add", bridge, "type", "bridge"),
        ("-n", h.switch, "link", "set", bridge, "up"),
    ]
    for ns, dev, addr, port in zip(h.names, h.ifs, h.addrs, ports, strict=True):
        steps += [
            ("netns", "add", ns),
            ("link", "add", dev, "type", "veth", "peer", "name", port),
            ("link", "set", dev, "netns", ns),
            ("link", "set", port, "netns", h.switch),
            ("-n", h.switch, "link", "set", port, "master", bridge),
            ("-n", h.switch, "link", "set", port, "up"),
            ("-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
            ("-n", ns, "link", "set", "lo", "up"),
            ("-n", ns, "link", "set", dev, "up"),
            ("netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_retries2={TCP_RETRIES2}"),
        ]
    try:
        for step in steps:
            proc = ip(*step)
            if proc.returncode != 0:
                raise NetnsUnavailable(f"`ip {' '.join(step)}` failed: {proc.stderr.strip()}")
        if rate_bit_s is not None:
            rate = f"{max(int(rate_bit_s), 8000)}bit"
            burst = f"{max(int(rate_bit_s / 8 * 0.001), 15000)}b"  # as Hosts.shape's
            for ns, dev in [*zip(h.names, h.ifs), *((h.switch, p) for p in ports)]:
                proc = tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                          "burst", burst, "latency", "50ms")  # fmt: skip
                if proc.returncode != 0:
                    raise NetnsUnavailable(f"tc cannot shape {dev}: {proc.stderr.strip()}")
        yield h
    finally:
        for ns in [*h.names, h.switch]:
            _remove(ns)
        for dev in h.ifs:  # only there if setup stopped before moving it
            ip("link", "delete", dev)
