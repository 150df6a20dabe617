"""Namespace hosts on one switch (gnnpar.runtime.netns.switched_hosts): every host reaches every
other through the switch, each port carries the token bucket asked, and nothing is left after
the block (slow, needs root and iproute2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5003)); s.listen(4); print("ready", flush=True)
for _ in range(int(sys.argv[2])):
    c, (peer, _) = s.accept(); c.sendall(peer.encode()); c.close()
"""
ASK = """
import socket, sys
c = socket.create_connection((sys.argv[1], 5003), timeout=10); print(c.recv(64).decode())
"""


def test_a_switch_takes_one_to_eight_hosts():
    from gnnpar.runtime import netns

    for n in (0, 9):
        with pytest.raises(ValueError, match="1 to 8"), netns.switched_hosts(n):
            pass


@pytest.mark.slow
def test_three_hosts_on_one_switch_reach_each_other_and_are_removed_afterwards():
    """Hosts 0 and 1 each connect to host 2, which sees each at its own address; every host's
    interface and the switch's ports carry tbf at the rate asked; the namespaces are gone."""
    from gnnpar.runtime import netns
    from tests.e2e.netns import unavailable

    if os.geteuid() != 0:
        unavailable("root is needed")
    try:
        with netns.switched_hosts(3, subnet="10.214.9", rate_bit_s=100e6) as h:
            assert h.addrs == ["10.214.9.1", "10.214.9.2", "10.214.9.3"]
            run = ["ip", "netns", "exec"]
            server = subprocess.Popen(
                [*run, h.names[2], sys.executable, "-c", ECHO, h.addrs[2], "2"],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert server.stdout is not None and server.stdout.readline().strip() == "ready"
                seen = [
                    subprocess.run(
                        [*run, ns, sys.executable, "-c", ASK, h.addrs[2]],
                        capture_output=True, text=True, timeout=60, check=True,
                    ).stdout.strip()
                    for ns in h.names[:2]
                ]  # fmt: skip
                assert seen == h.addrs[:2]
            finally:
                server.kill()
                server.wait()
            for ns, dev in zip(h.names, h.ifs, strict=True):
                shown = netns.tc(ns, "qdisc", "show", "dev", dev).stdout
                assert "tbf" in shown and "100Mbit" in shown, shown
            shown = netns.tc(h.switch, "qdisc", "show").stdout
            assert shown.count("tbf") == 3, shown
            names = [*h.names, h.switch]
    except netns.NetnsUnavailable as e:
        unavailable(str(e))
    left = netns.ip("netns", "list").stdout
    assert not any(n in left for n in names), left
