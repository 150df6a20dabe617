"""check_ranks: refuse --workers N whose bare processes cannot start in the available memory,
counted as the start method makes them (spawned: whole interpreters; forked: one server)."""

from __future__ import annotations

import pytest

from gnnpar import UsageError, footprint


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_check_ranks_counts_processes_as_they_are_started(monkeypatch, method):
    monkeypatch.setenv("GNNPAR_START_METHOD", method)
    base, forked = footprint.RANK_BASELINE_BYTES, footprint.FORKED_RANK_BYTES
    need = {"forkserver": base + 8 * forked, "spawn": 8 * base}[method]
    monkeypatch.setattr(footprint, "available_bytes", lambda device: need)
    footprint.check_ranks(8)  # exactly enough
    monkeypatch.setattr(footprint, "available_bytes", lambda device: need - 1)
    with pytest.raises(UsageError, match="--workers 8 starts .* GiB available"):
        footprint.check_ranks(8)
    monkeypatch.setattr(footprint, "available_bytes", lambda device: None)  # unknown: no check
    footprint.check_ranks(10**6)
