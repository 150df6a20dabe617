"""dist.setup: a single process needs no process group; torchrun's environment is recognised."""

from __future__ import annotations

import torch

from gnnpar import dist


def test_single_process_context_without_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert not dist.launched_by_torchrun()
    ctx = dist.setup(5)
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
    assert ctx.backend is None
    assert not torch.distributed.is_initialized()
    dist.teardown()


def test_world_of_one_under_torchrun_needs_no_group(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert dist.launched_by_torchrun()
    ctx = dist.setup(5)
    assert ctx.world_size == 1 and not torch.distributed.is_initialized()


def test_device_falls_back_to_cpu_without_cuda():
    if not torch.cuda.is_available():
        assert dist.pick_device(3) == torch.device("cpu")
    else:
        assert dist.pick_device(0).type == "cuda"


def test_relative_distance_is_the_norm_of_the_difference_over_the_norm_of_the_reference():
    from gnnpar.final_model import relative_distance

    ref = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]  # ||ref|| = 5
    moved = [torch.tensor([3.0, 1.0]), torch.tensor([[4.0]])]  # one entry off by 1
    assert relative_distance(moved, ref) == 0.2
    assert relative_distance(ref, ref) == 0.0
    assert relative_distance(ref, [torch.zeros(2), torch.zeros(1, 1)]) == 0.0  # no reference norm


def test_waiting_for_a_key_nobody_sets_ends_in_a_clear_timeout_error():
    import time

    import pytest
    import torch.distributed as tdist

    from gnnpar.store import PeerTimeoutError, wait_for_key

    store = tdist.HashStore()
    store.set("ready", "1")
    wait_for_key(store, "ready", 1.0, "rank 0 scoring")  # set: returns at once
    t0 = time.perf_counter()
    with pytest.raises(PeerTimeoutError, match=r"rank 0 scoring rank 1's model did not happen"):
        wait_for_key(store, "never", 0.5, "rank 0 scoring rank 1's model")
    assert time.perf_counter() - t0 < 10
