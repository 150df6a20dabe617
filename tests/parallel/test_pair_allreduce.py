"""``collectives.all_reduce_sum`` with real gloo ranks (processes, no mocks): two ranks swap
their tensors and add, which gives the floats of ``dist.all_reduce`` on both ranks; a group of
two inside a larger world exchanges with the right global rank; other sizes are gloo's, and so
are large tensors of two ranks on different hosts."""

from __future__ import annotations

import datetime
import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gnnpar.parallel import collectives as c


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(6, 10, generator=g) * 1e3
    return [
        torch.randn(99_001, generator=g),  # a GCN's gradient and its count
        torch.randn(1, generator=g),
        wide[:, ::3],  # not contiguous
        torch.tensor([0.0, -0.0, 1e-38, 3.4e38, -3.4e38]) * (1 + seed),  # signs, ends of range
    ]


def _rank(rank: int, world: int, port: int, out_dir: str, local_world: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if local_world is not None:  # as torchrun sets it: ranks on hosts of their own
        os.environ["LOCAL_WORLD_SIZE"] = local_world
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    result: dict = {}
    try:
        pair = dist.new_group([0, world - 1])  # every rank creates every group
        groups = {"world": None} if world == 2 else {"pair": pair, "world": None}
        for name, group in groups.items():
            if group is not None and rank not in (0, world - 1):
                continue
            mine = _tensors(seed=rank)
            gloo = [t.contiguous().clone() for t in mine]  # gloo wants contiguous tensors
            for t in gloo:
                dist.all_reduce(t, group=group)
            for t in mine:
                c.all_reduce_sum(t, group)
            result[name] = {
                "same_as_gloo": all(torch.equal(a, b) for a, b in zip(mine, gloo)),
                "sums": [t.reshape(-1)[:5].tolist() for t in mine],
                "contiguous_kept": not mine[2].is_contiguous(),
            }
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_swap_on_one_host_and_only_small_tensors_across_hosts(monkeypatch):
    """Unset, gnnpar's own launcher started every rank here; torchrun and SLURM say how many
    share the host. A value that is not a number (refused earlier by ``dist.setup``): apart."""
    small, large = c.PAIR_ACROSS_HOSTS_MAX_BYTES, c.PAIR_ACROSS_HOSTS_MAX_BYTES + 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert c.ranks_share_host(2)
    for value, shared in (("2", True), ("4", True), ("1", False), ("x", False)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
        assert c.ranks_share_host(2) is shared, value
    assert c.pair_exchange_pays(small, False) and not c.pair_exchange_pays(large, False)
    assert c.pair_exchange_pays(small, True) and c.pair_exchange_pays(large, True)


@pytest.mark.slow
@pytest.mark.parametrize("world, local_world", [(2, None), (3, None), (2, "1")])
def test_pair_exchange_equals_gloos_all_reduce_on_every_rank(tmp_path, world, local_world):
    args = (world, _free_port(), str(tmp_path), local_world)
    mp.spawn(_rank, args=args, nprocs=world, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for name in got[0]:
        ranks = [r for r in range(world) if name in got[r]]
        assert all(got[r][name]["same_as_gloo"] for r in ranks), name
        assert all(got[r][name]["contiguous_kept"] for r in ranks), name
        assert all(got[r][name]["sums"] == got[ranks[0]][name]["sums"] for r in ranks), name
        members = [0, world - 1] if name == "pair" else list(range(world))
        total = [sum(_tensors(r)[i].reshape(-1)[:5] for r in members) for i in range(4)]
        for a, b in zip(got[0][name]["sums"], total):
            assert torch.allclose(torch.tensor(a), b, rtol=1e-6), name
    if world == 3:  # the pair {0, 2}: rank 1 takes no part
        assert "pair" in got[0] and "pair" in got[2] and "pair" not in got[1]
