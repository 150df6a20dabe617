"""Sync policies (training/sync.py) and emulated stragglers (training/straggler.py), in one
process: when the optimizer steps, when an averaging is due, what a checkpoint keeps."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from gnnpar.training.straggler import Straggler
from gnnpar.training.sync import DDPHooks, GradAllReduce, LockStep, NoSync, ParamAverage


def params_with_grads(values=(1.0, 2.0)) -> list[torch.nn.Parameter]:
    ps = [torch.nn.Parameter(torch.zeros(2)) for _ in values]
    for p, v in zip(ps, values):
        p.grad = torch.full((2,), v)
    return ps


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo group (torch's averager wants a group, even of one)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_no_sync_steps_where_there_was_a_batch_and_keeps_its_counters():
    s = NoSync()
    assert s.after_backward(True) and not s.after_backward(False)
    assert s.wait_s == 0.0 and s.exchanges == 0 and s.status() == "" and s.rank_info() == {}
    s.clock.seconds, s.clock.calls, s.exchanges = 1.5, 3, 2
    t = NoSync()
    t.load_state(s.state())
    assert (t.wait_s, t.clock.calls, t.exchanges) == (1.5, 3, 2)


def test_lock_step_without_a_group_does_not_wait():
    s = LockStep()
    s.start_epoch()
    s.end_epoch()
    assert s.wait_s == 0.0 and s.status() == "waited 0.0s"


def test_grad_all_reduce_every_k_steps_counts_across_epochs():
    """K = 3: steps 3 and 6 average; a rank without a batch steps only when averaging (with
    the others' mean). One rank: the mean of its own gradient is that gradient."""
    ps = params_with_grads()
    s = GradAllReduce(ps, every=3)
    stepped = [s.after_backward(b) for b in (True, True, True, True, False, False)]
    assert stepped == [True, True, True, True, False, True]
    assert s.exchanges == 2 and s.count == 6
    assert torch.equal(ps[0].grad, torch.full((2,), 1.0))  # nobody contributed at step 6: kept
    t = GradAllReduce(params_with_grads(), every=3)
    t.load_state(s.state())
    assert t.count == 6 and t.exchanges == 2
    assert [t.after_backward(True) for _ in range(3)] == [True] * 3 and t.exchanges == 3


def test_param_average_every_k_steps(one_rank_group):
    ps = params_with_grads()
    s = ParamAverage(ps, every=2)
    for _ in range(5):
        assert s.after_backward(True)
        s.after_step(True)
    assert s.exchanges == 2 and s.count == 5
    t = ParamAverage(ps, every=2)
    t.load_state(s.state())
    assert (t.count, t.exchanges, t.averager.step) == (5, 2, s.averager.step)


def test_ddp_hooks_time_what_backward_did_not_hide():
    s = DDPHooks()
    s.last_call, s.last_done = 10.0, 10.25
    assert s.after_backward(True) and s.wait_s == pytest.approx(0.25)
    assert not s.after_backward(False) and s.wait_s == pytest.approx(0.25)  # no hook: adds 0


def test_straggler_sleeps_factor_minus_one_times_the_step():
    assert Straggler().factor == 1.0
    s = Straggler(factor=3.0)
    t0 = time.perf_counter()
    s.after_step(0.01)
    assert s.delay_s == pytest.approx(0.02) and time.perf_counter() - t0 >= 0.02
    idle = Straggler.for_rank({1: 2.0}, 0.0, seed=0, rank=0)
    idle.after_step(0.01)
    assert idle.delay_s == 0.0


def test_jitter_is_seeded_and_resumes_from_its_state():
    """Transient pauses drawn from a generator seeded per rank: the same sequence on a rerun,
    and a restored state continues it."""

    def delays(s: Straggler, n: int) -> list[float]:
        out = []
        for _ in range(n):
            before = s.delay_s
            s.after_step(1e-4)
            out.append(s.delay_s - before)
        return out

    a, b = Straggler(jitter=2.0, seed=5), Straggler(jitter=2.0, seed=5)
    first = delays(a, 60)
    assert first == delays(b, 60) and any(d > 0 for d in first)
    saved = a.state()
    rest = delays(a, 30)
    c = Straggler(jitter=2.0, seed=99)
    c.load_state(saved)
    assert delays(c, 30) == rest and c.delay_s == a.delay_s


def test_param_average_averages_every_parameter_also_on_a_rank_without_gradients(one_rank_group):
    """A rank that has not trained yet (3 subgraphs dealt to 2 ranks: one rank's second step has
    none) holds no gradients; torch's averager then averaged nothing and failed in torch.cat.
    Every parameter is averaged, on the averager's own schedule (K = 2: steps 2 and 4)."""
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    assert all(p.grad is None for p in ps)
    s = ParamAverage(ps, every=2)
    for has_batch in (False, False, True, False):
        s.after_step(has_batch)
    assert s.exchanges == 2 and s.count == 4 and s.averager.step == 4
    assert all(torch.equal(p.data, torch.ones(3)) for p in ps)  # one rank: the mean is itself
