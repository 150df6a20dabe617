"""parallel/collectives.py in this process: with no process group and with a one-rank gloo group
(on a FileStore) every helper is its one-rank fallback (the strategies run unchanged on one
rank), the gradient helpers' arithmetic, and the wait clock's counts. (The helpers with real
peers run in the multi-process tests: tests/strategies/test_allreduce.py and friends.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gnnpar.parallel import collectives as c


@pytest.fixture(params=["no group", "one-rank gloo group"])
def group(request, tmp_path):
    """No process group, or a world of one over gloo on a FileStore in tmp_path."""
    if request.param == "no group":
        assert not dist.is_initialized()
        yield None
        return
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    lin(torch.randn(4, 3)).sum().backward()
    return list(lin.parameters())


def test_one_rank_is_not_active_and_every_helper_falls_back(group):
    assert not c.active()
    obj = {"rank": 0, "sizes": [1, 2]}
    assert c.broadcast_object(obj) is obj
    assert c.gather_to_all(obj) == [obj]
    flat = torch.arange(4.0)
    (only,) = c.all_gather_flat(flat)
    assert only is flat
    c.barrier()  # returns at once
    module = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in module.parameters()]
    c.broadcast_parameters(module)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_the_wait_clock_counts_calls_but_no_waiting_on_one_rank(group):
    clock = c.WaitClock()
    t = torch.ones(3)
    clock.all_reduce(t)
    clock.all_reduce(t)
    clock.barrier()
    assert clock.calls == 2 and clock.seconds == 0.0
    assert torch.equal(t, torch.ones(3))  # a sum over one rank


def test_flat_grads_and_set_grads_round_trip_with_zeros_for_missing_gradients():
    params = _params()
    params[1].grad = None
    flat = c.flat_grads(params)
    assert flat.shape == (sum(p.numel() for p in params),)
    assert torch.equal(flat[params[0].numel() :], torch.zeros(params[1].numel()))
    c.set_grads(params, flat * 2)
    assert torch.equal(params[0].grad, flat[: params[0].numel()].view(2, 3) * 2)
    assert torch.equal(params[1].grad, torch.zeros(2))
    flat[0] = 99.0  # set_grads copied
    assert params[0].grad.view(-1)[0] != 99.0


def test_average_gradients_on_one_rank_keeps_a_contributed_gradient(group):
    params = _params()
    want = [p.grad.clone() for p in params]
    clock = c.WaitClock()
    assert c.average_gradients(params, True, clock) == 1
    assert all(torch.equal(p.grad, w) for p, w in zip(params, want))
    # a rank without a batch: nobody contributed, the gradients are left alone
    assert c.average_gradients(params, False, clock) == 0
    assert all(torch.equal(p.grad, w) for p, w in zip(params, want))
    assert clock.calls == 2


def test_sum_gradients_without_peers_or_parameters_is_a_no_op(group):
    params = _params()
    want = [p.grad.clone() for p in params]
    clock = c.WaitClock()
    c.sum_gradients(params, None, clock)
    c.sum_gradients([], None, clock)
    assert all(torch.equal(p.grad, w) for p, w in zip(params, want))
    assert clock.calls == 0
