"""A layer's reused blocks (models/reused.py): a step's tensor goes into the block the last
step's went into once nothing reads that one, never over a tensor still read; GraphSAGE's
trimmed first layer gives the same outputs and gradients with them as without."""

from __future__ import annotations

import copy
import pickle

import torch

from gnnpar.models import sage
from gnnpar.models.hops import HopGraph
from gnnpar.models.reused import ReusedRows
from tests.models.test_hops import model_of, sampled_batch


def test_a_free_block_is_reused_and_a_block_in_use_is_left_alone():
    rows = ReusedRows()
    a = rows.take(100, 8)
    where = a.data_ptr()
    del a
    b = rows.take(98, 8)  # a little smaller: the same block
    assert b.data_ptr() == where
    b.fill_(1.0)
    kept = b[:10]  # a view still read (as autograd keeps one): the block is not free
    del b
    c = rows.take(100, 8)
    assert c.data_ptr() != where
    c.fill_(2.0)
    assert bool((kept == 1.0).all())
    del c, kept
    assert rows.take(100, 8).data_ptr() == where


def test_a_larger_tensor_gets_a_larger_block_and_release_drops_it():
    rows = ReusedRows()
    rows.take(10, 4)
    small = rows.held_bytes
    t = rows.take(1000, 4)
    assert t.shape == (1000, 4) and rows.held_bytes >= 1000 * 4 * 4 > small
    del t
    rows.release()
    assert rows.held_bytes == 0


def test_copies_of_a_block_holder_start_empty():
    rows = ReusedRows()
    rows.take(64, 4)
    assert copy.deepcopy(rows).held_bytes == 0
    assert pickle.loads(pickle.dumps(rows)).held_bytes == 0


def _steps(model, x, b, steps: int = 3):
    """Seed outputs and parameter gradients of ``steps`` training steps on the same batch."""
    out = []
    for _ in range(steps):
        model.zero_grad()
        hops = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
        y = model(x, hops)[: b.batch_size]
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        out.append((y.detach(), [p.grad.clone() for p in model.parameters()]))
    return out


def test_sage_steps_in_reused_blocks_equal_steps_without_them(monkeypatch):
    x, b = sampled_batch("kernel", seeds=32)
    monkeypatch.setattr(sage, "REUSE_MIN_BYTES", 1 << 60)  # never reused
    plain = _steps(model_of("sage", x.size(1), 16, 0.0), x, b)
    monkeypatch.setattr(sage, "REUSE_MIN_BYTES", 0)  # every step's tensors reused
    model = model_of("sage", x.size(1), 16, 0.0)
    reused = _steps(model, x, b)
    first = model.blocks[0]
    assert first._reused["x_dst"].held_bytes > 0 and first._reused["agg"].held_bytes > 0
    for (y0, g0), (y1, g1) in zip(plain, reused):
        assert torch.equal(y0, y1)
        assert all(torch.equal(a, c) for a, c in zip(g0, g1))
    model.eval()  # evaluation holds none of them
    assert first._reused["x_dst"].held_bytes == 0 and first._reused["agg"].held_bytes == 0
