"""``--seeds local`` (gnnpar.data.sampling.distributed.local_epoch_seeds): each host's ranks
draw their batches from its own shard's training nodes, every training node once per epoch
across all ranks (but the ``num_train % ranks`` left over), equal steps on every rank, as
DistDGL's ``node_split(force_even=True)`` deals them. Pure arithmetic: no process group."""

from __future__ import annotations

import pytest
import torch

from gnnpar.data.sampling.distributed import local_epoch_seeds
from gnnpar.data.sampling.loader import shard_plan

BOUNDS = torch.tensor([0, 100, 230])  # host 0 owns ids 0-99, host 1 ids 100-229


def _deal(train_idx, hosts, epoch, seed=5, batch=7):  # noqa: ANN001, ANN202
    host_of_rank = torch.tensor(hosts)
    return [
        local_epoch_seeds(train_idx, BOUNDS, host_of_rank, seed, epoch, r, batch)
        for r in range(len(hosts))
    ]


def _host(ids: torch.Tensor) -> torch.Tensor:
    return torch.searchsorted(BOUNDS[1:], ids, right=True)


@pytest.mark.parametrize("hosts", [[0, 1], [0, 0, 1, 1], [1, 0, 1, 0]])
def test_balanced_shards_give_every_rank_only_its_hosts_training_nodes(hosts):
    # 40 training nodes on each host: each host's ranks need exactly its own
    train_idx = torch.cat([torch.arange(10, 50), torch.arange(150, 190)])
    per_rank, steps = shard_plan(train_idx.numel(), len(hosts), 7)
    for epoch in range(3):
        dealt = _deal(train_idx, hosts, epoch)
        for r, batches in enumerate(dealt):
            assert len(batches) == steps  # the same steps on every rank
            seeds = torch.cat(batches)
            assert seeds.numel() == per_rank
            assert (_host(seeds) == hosts[r]).all(), (r, epoch)
        every = torch.cat([torch.cat(b) for b in dealt])
        assert torch.equal(every.sort().values, train_idx.sort().values)  # each node once


def test_a_host_short_of_training_nodes_borrows_the_other_hosts_and_the_remainder_is_dropped():
    # host 0 has 11 training nodes, host 1 has 60: 71 = 2 x 35 + 1, so host 0's rank keeps its
    # 11 and takes 24 of host 1's, host 1's rank keeps 35, and one node rests each epoch
    train_idx = torch.cat([torch.arange(0, 99, 9), torch.arange(120, 180)])
    n = train_idx.numel()
    assert n == 71
    rested = []
    for epoch in range(4):
        dealt = _deal(train_idx, [0, 1], epoch)
        mine = [torch.cat(b) for b in dealt]
        assert [m.numel() for m in mine] == [35, 35]
        assert len(dealt[0]) == len(dealt[1]) == shard_plan(n, 2, 7)[1]
        assert int((_host(mine[0]) == 0).sum()) == 11  # all of its own, then borrowed
        assert (_host(mine[1]) == 1).all()
        every = torch.cat(mine)
        assert every.unique().numel() == every.numel() == n - 1  # no node twice
        rest = set(train_idx.tolist()) - set(every.tolist())
        assert len(rest) == 1 and _host(torch.tensor(list(rest))).item() == 1
        rested.append(rest.pop())
    assert len(set(rested)) > 1  # a different node rests in different epochs


def test_the_deal_is_fixed_by_seed_and_epoch():
    train_idx = torch.cat([torch.arange(0, 60), torch.arange(100, 160)])
    a, b = _deal(train_idx, [0, 1], 1), _deal(train_idx, [0, 1], 1)
    assert all(torch.equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    other_epoch = _deal(train_idx, [0, 1], 2)
    other_seed = _deal(train_idx, [0, 1], 1, seed=6)
    assert not torch.equal(torch.cat(a[0]), torch.cat(other_epoch[0]))  # reshuffled per epoch
    assert not torch.equal(torch.cat(a[0]), torch.cat(other_seed[0]))
