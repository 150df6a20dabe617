"""gnnpar.gossip: work pool, topologies, the claim protocol (one in-process store), and the
point-to-point averaging between two real gloo processes."""

from __future__ import annotations

import datetime
import os
import random
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gnnpar.gossip import (
    AnyPeer,
    Bipartite,
    GossipTimeoutError,
    Pairing,
    WorkPool,
    exchange_average,
)


# ----------------------------------------------------------------------------------------- pool
def test_pool_hands_every_subgraph_once_per_epoch_to_interleaved_takers():
    store = dist.HashStore()
    pools = [WorkPool(store, "pool", size=5, epochs=3, seed=7) for _ in range(3)]
    rng = random.Random(0)
    taken: dict[int, list[int]] = {0: [], 1: [], 2: []}
    positions = []
    while True:
        item = pools[rng.randrange(3)].take()  # ranks of random speeds
        if item is None:
            break
        pos, epoch, idx = item
        positions.append(pos)
        taken[epoch].append(idx)
    assert positions == list(range(15))
    assert {e: sorted(v) for e, v in taken.items()} == {e: [0, 1, 2, 3, 4] for e in range(3)}
    assert all(p.take() is None for p in pools)  # empty stays empty


def test_pool_order_is_shared_and_differs_between_epochs():
    a = WorkPool(dist.HashStore(), "p", size=20, epochs=2, seed=3)
    b = WorkPool(dist.HashStore(), "p", size=20, epochs=2, seed=3)
    assert a.order(0) == b.order(0) and a.order(1) == b.order(1)
    assert a.order(0) != a.order(1)


# ------------------------------------------------------------------------------------- topology
def test_any_peer_picks_everyone_but_itself():
    assert AnyPeer(2, 4).candidates() == [0, 1, 3]
    assert AnyPeer(0, 1).candidates() == [] and not AnyPeer(0, 1).initiates


def test_bipartite_active_ranks_pick_only_passive_ones():
    assert [Bipartite(r, 4).candidates() for r in range(4)] == [[2, 3], [2, 3], [], []]
    assert [Bipartite(r, 4).pickable for r in range(4)] == [False, False, True, True]
    assert [Bipartite(r, 3).candidates() for r in range(3)] == [[1, 2], [], []]


# ------------------------------------------------------------------------------------- protocol
def _ranks(world: int, topo=AnyPeer) -> list[Pairing]:
    store = dist.HashStore()
    ranks = [Pairing(store, "g", topo(r, world), random.Random(r)) for r in range(world)]
    for p in ranks:
        p.open()
    return ranks


def test_claim_is_seen_by_the_partner_and_blocks_third_parties():
    a, b, c = _ranks(3)
    x = a.initiate()
    assert x is not None and x.initiated and x.partner in (1, 2)
    partner = [a, b, c][x.partner]
    third = c if partner is b else b
    got = partner.poll()
    assert got is not None and (got.partner, got.xid, got.initiated) == (0, x.xid, False)
    # neither the claimer (busy) nor the claimed rank can be picked by the third rank now
    assert third.initiate() is None
    assert third.poll() is None
    partner.finish()
    a.finish()
    assert partner.poll() is None


def test_a_rank_already_claimed_serves_that_claim_instead_of_picking():
    a, b = _ranks(2)
    x = a.initiate()
    y = b.initiate()  # b wanted to pick, but a already picked b
    assert x.partner == 1 and y is not None and (y.partner, y.xid, y.initiated) == (0, x.xid, False)


def test_retire_serves_pending_claims_then_refuses_new_ones():
    a, b = _ranks(2)
    x = a.initiate()
    pending = b.retire()
    assert pending is not None and pending.xid == x.xid
    b.finish()
    a.finish()
    assert b.retire() is None  # done
    assert a.initiate() is None  # nobody left to pick: a keeps training alone
    assert a.retire() is None


def test_random_schedules_never_pair_a_rank_with_itself_or_two_partners_and_all_retire():
    """Ranks act in a random order; every claim must be on a training rank nobody else claimed,
    a waiting rank is never claimed (no wait cycle), and retiring serves every open claim."""
    world = 5
    ranks = _ranks(world)
    rng = random.Random(1)
    waiting: dict[int, tuple[int, str]] = {}  # claimer -> (partner, xid)

    def serve(me: int, x) -> None:
        assert waiting.pop(x.partner) == (me, x.xid)  # exactly the claim the claimer made
        ranks[me].finish()
        ranks[x.partner].finish()

    for _ in range(3000):
        me = rng.randrange(world)
        if me in waiting:  # a waiting rank does nothing until its partner serves it
            continue
        x = ranks[me].poll() or (ranks[me].initiate() if rng.random() < 0.7 else None)
        if x is None:
            continue
        assert x.partner != me
        if not x.initiated:
            serve(me, x)
            continue
        assert x.partner not in waiting  # never claim a waiting rank
        assert all(p != x.partner for p, _ in waiting.values())  # nor one already claimed
        waiting[me] = (x.partner, x.xid)
    retired: set[int] = set()
    for _ in range(world):  # the pool runs dry: everybody cleans up, in random orders
        for me in rng.sample(range(world), world):
            if me in retired or me in waiting:  # a waiting rank first gets served
                continue
            while (x := ranks[me].retire()) is not None:
                serve(me, x)
            retired.add(me)
    assert not waiting and retired == set(range(world))
    assert all(r.initiate() is None for r in ranks)  # done ranks cannot be claimed


def test_bipartite_passive_ranks_never_claim():
    a0, a1, p2, p3 = _ranks(4, Bipartite)
    assert p2.initiate() is None
    x, y = a0.initiate(), a1.initiate()
    assert {x.partner, y.partner} == {2, 3}
    assert a0.poll() is None  # active ranks are never picked


# --------------------------------------------------------------------------------------- mixing
def _mixing_rank(rank: int, port: int, stall: bool, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    try:
        a = torch.full((2, 3), float(rank + 1))
        b = torch.arange(4.0) * (rank + 1)
        if stall and rank == 1:
            time.sleep(6)  # never answers the exchange
            q.put((rank, "stalled"))
            return
        t0 = time.perf_counter()
        try:
            exchange_average([a, b], 1 - rank, timeout_s=2.0 if stall else 20.0)
            q.put((rank, (a.tolist(), b.tolist())))
        except GossipTimeoutError as e:
            q.put((rank, ("timeout", str(e), time.perf_counter() - t0)))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_pair(stall: bool) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_mixing_rank, args=(r, port, stall, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return out


@pytest.mark.timeout(90)
def test_exchange_average_gives_both_ranks_the_exact_mean():
    out = _run_pair(stall=False)
    mean_a, mean_b = [[1.5] * 3] * 2, [0.0, 1.5, 3.0, 4.5]
    assert out[0] == out[1] == (mean_a, mean_b)


@pytest.mark.timeout(90)
def test_a_partner_that_never_answers_is_a_timeout_error_naming_it():
    out = _run_pair(stall=True)
    kind, message, waited = out[0]
    assert kind == "timeout" and "partner rank 1" in message and "--timeout" in message
    assert waited < 6  # gave up at the timeout, not when the partner woke up
