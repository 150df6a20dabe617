"""Two hosts on one machine for the tests: gnnpar.runtime.netns (network namespaces joined by a
veth pair; fixtures in tests/e2e/conftest.py), skipped where namespaces cannot be made.

Needs root and ``ip``; skipped with the reason otherwise, and a failure instead of a skip when
``GNNPAR_REQUIRE_NETNS=1`` (CI sets it: there the machine can).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from gnnpar.runtime import netns
from gnnpar.runtime.netns import TCP_RETRIES2, Hosts, NetnsUnavailable, ip

__all__ = ["TCP_RETRIES2", "Hosts", "ip", "make_hosts", "unavailable"]


def unavailable(reason: str) -> None:
    if os.environ.get("GNNPAR_REQUIRE_NETNS") == "1":
        pytest.fail(f"GNNPAR_REQUIRE_NETNS=1 but two network namespaces cannot be made: {reason}")
    pytest.skip(f"two-host test needs network namespaces: {reason}")


@contextlib.contextmanager
def make_hosts(a: str, b: str, addr_a: str, addr_b: str) -> Iterator[Hosts]:
    """gnnpar.runtime.netns.make_hosts, skipped (or failed under GNNPAR_REQUIRE_NETNS=1) where
    namespaces cannot be made."""
    try:
        with netns.make_hosts(a, b, addr_a, addr_b) as h:
            yield h
    except NetnsUnavailable as e:
        unavailable(str(e))
