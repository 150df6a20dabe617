"""How GraphDataModule's loader workers start (slow lane: they are processes): forks of the
training process by default on Linux, or a fork server's (``GNNPAR_LOADER_START=forkserver``);
either way, and with no workers at all, the same batches in the same order, across an epoch's
end and from a mid-epoch resume."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="gnnpar.lightning needs the lightning extra")

from gnnpar.lightning import GraphDataModule, data  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux only"),
]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _workers_parents(workers: int) -> set[int]:
    """The parents of this process's loader workers, once they run (a fork server's start
    later: the stream's first batches are made here meanwhile)."""
    deadline = time.monotonic() + 60
    while workers and not multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {_parent(p.pid) for p in multiprocessing.active_children()}


def _epochs(workers: int) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], set[int]]:
    """Three epochs' batches (seeds and features) with a validation pass in the middle of
    epoch 1, epoch 1 resumed after its second batch, and the parents of the loader workers."""
    dm = GraphDataModule(dataset="cora", batch_size=32, fanouts=[4, 3], loader_workers=workers)
    dm.setup()
    loader = dm.train_dataloader()
    seen = []
    for epoch in (0, 1, 2):
        loader.sampler.set_epoch(epoch)
        batches = iter(loader)
        seen.append([torch.cat([b.n_id, b.x.sum(1)]) for b in itertools.islice(batches, 2)])
        if epoch == 1:  # a validation pass midway: its workers start beside the stream's
            seen.append([torch.cat([b.n_id, b.x.sum(1)]) for b in dm.val_dataloader()])
        seen[-1 - (epoch == 1)] += [torch.cat([b.n_id, b.x.sum(1)]) for b in batches]
    parents = _workers_parents(workers)
    state = {**loader.state_dict(), "epoch": 1, "done": 2}
    loader.close()
    fresh = dm.train_dataloader()
    fresh.load_state_dict(state)
    fresh.sampler.set_epoch(1)
    rest = [torch.cat([b.n_id, b.x.sum(1)]) for b in fresh]
    fresh.close()
    return seen, rest, parents


def test_forked_or_fork_server_workers_give_the_batches_of_no_workers(monkeypatch):
    monkeypatch.delenv(data.LOADER_START, raising=False)
    plain, plain_rest, _ = _epochs(0)
    forked, forked_rest, parents = _epochs(1)
    assert parents == {os.getpid()}  # the workers are this process's forks
    monkeypatch.setenv(data.LOADER_START, "forkserver")
    served, served_rest, parents = _epochs(1)
    assert parents and os.getpid() not in parents  # the fork server's children
    for run, rest in ((forked, forked_rest), (served, served_rest)):
        for a, b in zip(plain, run, strict=True):
            assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        assert len(rest) == len(plain[1]) - 2 and len(plain) == 4  # 3 epochs, 1 validation
        assert all(torch.equal(x, y) for x, y in zip(plain[1][2:], rest, strict=True))
