"""Fixtures of the two-host tests (tests/e2e/netns.py): one pair of hosts for the whole
session, and a second pair for a test that cuts its link for good while the first pair runs."""

from __future__ import annotations

import pytest

from tests.e2e.netns import make_hosts


@pytest.fixture(scope="session")
def hosts():
    with make_hosts("a", "b", "10.213.0.1", "10.213.0.2") as h:
        yield h


@pytest.fixture(scope="session")
def other_hosts():
    with make_hosts("c", "d", "10.213.0.5", "10.213.0.6") as h:
        yield h
