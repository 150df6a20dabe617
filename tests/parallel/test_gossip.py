"""gnnpar.parallel.gossip: work pool, topologies, the claim protocol (one in-process store), and the
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

from gnnpar.parallel.gossip import (
    AnyPeer,
    Bipartite,
    Exchange,
    GossipTimeoutError,
    Pairing,
    ShardedPool,
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


def test_pools_across_shards_hand_every_subgraph_once_per_epoch_own_host_first():
    store = dist.HashStore()
    parts = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]  # host h's subgraphs (global ids)
    hosts = [0, 0, 1, 2]  # two ranks on host 0
    pools = [ShardedPool(store, "pool", parts, h, epochs=3, seed=7) for h in hosts]
    assert pools[0].total == 27
    rng = random.Random(1)
    taken: dict[int, list[int]] = {0: [], 1: [], 2: []}
    positions, last_epoch = [], [0] * 4
    host_of = {p: h for h, ps in enumerate(parts) for p in ps}
    stolen = 0
    while True:
        r = rng.choice([0, 0, 0, 1, 2, 3])  # rank 0 three times as fast: it steals
        item = pools[r].take()
        if item is None:
            if all(p.take() is None for p in pools):
                break
            continue
        pos, epoch, idx = item
        assert epoch >= last_epoch[r]  # a rank's epochs never go back
        last_epoch[r] = epoch
        if host_of[idx] != hosts[r]:  # another host's: only once its own pool is empty
            stolen += 1
            assert sum(host_of[i] == hosts[r] for i in taken[epoch]) == len(parts[hosts[r]])
        positions.append(pos)
        taken[epoch].append(idx)
    assert sorted(positions) == list(range(27))
    assert {e: sorted(v) for e, v in taken.items()} == {e: list(range(9)) for e in range(3)}
    assert stolen > 0  # the fast rank 0 took from hosts 1 and 2
    assert ShardedPool(store, "p", parts, 1, 1, 7).order(0, 2) == pools[3].order(0, 2)


def test_pools_across_shards_resumed_from_an_epochs_end_hand_out_the_rest_exactly_once():
    """A checkpoint between epochs, as the loop takes it: every rank has taken until the pool
    gave it an item of a later epoch, which it holds; then every rank's state is read from the
    same store. Ranks restored onto a fresh store (the resumed attempt's) hand out exactly the
    positions the uninterrupted pool had not, and every subgraph of every epoch is taken once
    across the two attempts, the held items included."""
    parts = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    hosts = [0, 0, 1, 2]
    store = dist.HashStore()
    pools = [ShardedPool(store, "pool", parts, h, epochs=4, seed=7) for h in hosts]
    rng = random.Random(2)
    taken: list[tuple[int, int]] = []
    held: dict[int, tuple[int, int, int]] = {}
    while len(held) < len(pools):  # epochs 0 and 1, then each rank's first item of epoch 2
        r = rng.choice([r for r in range(4) if r not in held])
        pos, epoch, idx = pools[r].take()
        if epoch >= 2:
            held[r] = (pos, epoch, idx)
        else:
            taken.append((epoch, idx))
    states = [p.state() for p in pools]
    assert all(s["counters"] and len(s["counters"]) <= 2 for s in states)  # epoch 2 (3 unseen)
    fresh = dist.HashStore()
    again = [ShardedPool(fresh, "pool", parts, h, epochs=4, seed=7) for h in hosts]
    for p, s in zip(again, states, strict=True):
        p.load_state(s, lead=False)
    assert again[0].handed_out() == pools[0].handed_out()
    taken += [(e, i) for _, e, i in held.values()]
    while True:  # the resumed attempt
        live = [r for r in range(4) if again[r] is not None]
        if not live:
            break
        r = rng.choice(live)
        item = again[r].take()
        if item is None:
            again[r] = None
            continue
        taken.append(item[1:])
    assert sorted(taken) == [(e, i) for e in range(4) for i in range(9)]


# ------------------------------------------------------------------------------------- topology
def test_any_peer_picks_everyone_but_itself():
    assert AnyPeer(2, 4).candidates() == [0, 1, 3]
    assert AnyPeer(0, 1).candidates() == [] and not AnyPeer(0, 1).initiates


def test_bipartite_active_ranks_pick_only_passive_ones():
    assert [Bipartite(r, 4).candidates() for r in range(4)] == [[2, 3], [2, 3], [], []]
    assert [Bipartite(r, 4).pickable for r in range(4)] == [False, False, True, True]
    assert [Bipartite(r, 3).candidates() for r in range(3)] == [[1, 2], [], []]


# ------------------------------------------------------------------------------------- protocol
def _ranks(world: int, topo=AnyPeer, timeout: float = 60.0) -> list[Pairing]:
    store = dist.HashStore()
    ranks = [Pairing(store, "g", topo(r, world), random.Random(r), timeout) for r in range(world)]
    for p in ranks:
        p.open()
    return ranks


def test_a_pick_is_served_by_the_partner_at_its_step_boundary():
    a, b = _ranks(2)
    assert a.at_boundary(want=True) is None  # picks b, and keeps training
    pick = a.pending
    assert pick is not None and pick.initiated and pick.partner == 1
    assert a.at_boundary(want=True) is None  # b has not arrived yet: a keeps training
    served = b.at_boundary(want=False)  # b reaches its step boundary and waits for a...
    assert served == Exchange(0, pick.xid, initiated=False)
    assert a.at_boundary(want=True) == pick  # ...and a finds it ready
    b.finish(served)
    a.finish(pick)
    assert a.pending is None and b.at_boundary(want=False) is None


def test_a_pick_that_is_never_answered_is_a_timeout_error_naming_the_partner():
    a, b = _ranks(2, timeout=0.05)
    a.at_boundary(want=True)
    time.sleep(0.1)  # b never reaches a step boundary (in a real run: b crashed or stalled)
    with pytest.raises(GossipTimeoutError, match="partner rank 1 never reached exchange 0.0"):
        a.at_boundary(want=True)
    with pytest.raises(GossipTimeoutError, match="partner rank 1"):
        a.retire()


def test_a_picker_is_not_picked_and_does_not_pick_twice():
    a, b, c = _ranks(3)
    a.at_boundary(want=True)
    first = a.pending
    assert a.at_boundary(want=True) is None and a.pending == first  # one pick at a time
    other = c if first.partner == 1 else b
    assert other.at_boundary(want=True) is None
    assert other.pending is None  # a is busy, a's pick is claimed: nobody left to pick


def test_a_picked_rank_serves_the_claim_instead_of_picking():
    a, b = _ranks(2)
    a.at_boundary(want=True)
    x = b.at_boundary(want=True)  # b is due too, but a already picked b
    assert x is not None and (x.partner, x.xid, x.initiated) == (0, a.pending.xid, False)
    assert b.pending is None


def test_retire_first_completes_the_own_pick_then_serves_claims_then_refuses_new_ones():
    a, b = _ranks(2)
    a.at_boundary(want=True)
    pending = b.retire()  # b's pool is empty: it serves a's claim first
    assert pending is not None and pending.xid == a.pending.xid and not pending.initiated
    assert a.retire() == a.pending  # b is ready now
    b.finish(pending)
    a.finish(a.pending)
    assert b.retire() is None  # done
    assert a.at_boundary(want=True) is None and a.pending is None  # nobody left to pick
    assert a.retire() is None


def test_random_schedules_never_pair_a_rank_with_itself_or_two_partners_and_all_retire():
    """Ranks act in a random order; a pick goes only to a training rank nobody else picked, a
    rank never has two exchanges open, and retiring completes every open exchange."""
    world = 5
    ranks = _ranks(world)
    rng = random.Random(1)
    inside: dict[int, tuple[int, str]] = {}  # rank -> (partner, xid) of the exchange it is in
    done: set[int] = set()
    met = []

    def enter(me: int, x) -> None:
        assert x.partner != me and me not in inside
        inside[me] = (x.partner, x.xid)
        if inside.get(x.partner) == (me, x.xid):  # both sides are in: the exchange happens
            del inside[me], inside[x.partner]
            met.append(x.xid)
            ranks[me].finish(x)
            ranks[x.partner].finish(Exchange(me, x.xid, not x.initiated))

    for _ in range(4000):
        me = rng.randrange(world)
        if me in inside:  # blocked in an exchange until the partner arrives
            continue
        before = {r.rank: r.pending for r in ranks}
        x = ranks[me].at_boundary(want=rng.random() < 0.7)
        if x is not None:
            enter(me, x)
        new = ranks[me].pending
        if new is not None and before[me] is None:  # a fresh pick: its target is free
            assert new.partner != me and new.partner not in inside
            assert all(p is None or p.partner != new.partner for r, p in before.items())
            assert before[new.partner] is None  # never pick a rank that has a pick open

    def partner_ready(me: int) -> bool:
        pick = ranks[me].pending
        return pick is None or ranks[me].store.get(ranks[me].key(pick.partner)).startswith(b"r")

    for _ in range(3 * world):  # the pool runs dry: everybody cleans up, in random orders
        for me in rng.sample(range(world), world):
            if me in done or me in inside or not partner_ready(me):  # (retire would wait)
                continue
            x = ranks[me].retire()
            if x is not None:
                enter(me, x)
            else:
                done.add(me)
    assert not inside and done == set(range(world))
    assert len(met) > 100 and len(set(met)) == len(met)  # many exchanges, each exactly once
    assert all(r.at_boundary(want=True) is None and r.pending is None for r in ranks)


# --------------------------------------------------------------------------------------- mixing
def _mixing_rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    try:
        a = torch.full((2, 3), float(rank + 1))
        b = torch.arange(4.0) * (rank + 1)
        exchange_average([a, b], 1 - rank, timeout_s=20.0)
        q.put((rank, (a.tolist(), b.tolist())))
        if rank == 1:  # rank 1 then never answers the second exchange
            time.sleep(6)
            return
        t0 = time.perf_counter()
        try:
            exchange_average([a], 1, timeout_s=2.0, what="exchange 0.1")
            q.put(("second", "completed"))
        except GossipTimeoutError as e:
            q.put(("second", (str(e), time.perf_counter() - t0)))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_exchange_average_gives_both_the_exact_mean_and_a_silent_partner_times_out():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_mixing_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=60) for _ in range(3))
    for p in procs:
        p.join(timeout=30)
    mean_a, mean_b = [[1.5] * 3] * 2, [0.0, 1.5, 3.0, 4.5]
    assert out[0] == out[1] == (mean_a, mean_b)
    message, waited = out["second"]
    assert "partner rank 1 did not complete exchange 0.1" in message and "--timeout" in message
    assert waited < 6  # gave up at the timeout, not when the partner woke up
