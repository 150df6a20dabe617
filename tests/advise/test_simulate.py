"""The simulator reproduces hand-computed schedules exactly (times chosen as binary fractions,
so that every sum below is exact in floating point)."""

from __future__ import annotations

import pytest

from gnnpar.advise import simulate as sim
from gnnpar.advise.events import Rendezvous, Sim, Swap
from gnnpar.parallel.collectives import PAIR_ACROSS_HOSTS_MAX_BYTES
from gnnpar.training import straggler as straggler_module
from gnnpar.training.straggler import Straggler

INF = float("inf")
FREE = sim.Link(0.0, INF)  # costs nothing


def one_host(ranks: int, ring=FREE, p2p=FREE) -> sim.Cluster:
    return sim.Cluster(1, ranks, ring, p2p)


def test_engine_rendezvous_releases_everyone_after_the_last_plus_the_cost():
    s = Sim()
    meet = Rendezvous(s, 2, cost=0.5)
    seen = []

    def proc(name, t):
        yield s.delay(t)
        yield meet.arrive()
        seen.append((name, s.now))

    s.start(proc("a", 1.0))
    s.start(proc("b", 3.0))
    s.run()
    assert seen == [("a", 3.5), ("b", 3.5)]


def test_engine_swap_releases_each_side_when_its_own_part_is_done():
    """Each side resumes at the time the protocol gives it from both arrivals; the first, which
    waited, ``late`` after that."""
    s = Sim()
    swap = Swap(s, lambda first, second: (second + 1.0, second + 2.0), late=0.25)
    seen = []

    def proc(name, t):
        yield s.delay(t)
        yield swap.arrive()
        seen.append((name, s.now))

    s.start(proc("a", 1.0))
    s.start(proc("b", 3.0))
    s.run()
    assert seen == [("a", 4.25), ("b", 5.0)]


def test_ring_allreduce_cost_inside_a_host_and_across_hosts():
    ring = sim.Link(0.125, 1024.0)
    # 2 ranks on gloo's ring (DDP, torch's model averager): 2 steps of 256 / 2 bytes
    assert one_host(2, ring).allreduce_s(256, pairs=False) == 2 * (0.125 + 128 / 1024)
    # gnnpar's own 2-rank all-reduce is one exchange of the whole 256 bytes, at the
    # point-to-point link's cost (collectives.all_reduce_sum)
    pair = one_host(2, ring, p2p=sim.Link(0.0625, 512.0))
    assert pair.allreduce_s(256) == 0.0625 + 256 / 512
    net = sim.Link(0.25, 64.0)
    apart = sim.Cluster(2, 1, ring, sim.Link(0.0625, 512.0), net)  # across: latency twice
    assert apart.allreduce_s(256) == 0.0625 + 2 * 0.25 + 256 / 64
    # across hosts a tensor over PAIR_ACROSS_HOSTS_MAX_BYTES takes gloo's ring (its two
    # directions would run one after the other in an exchange): 2 steps of half of it, each
    # paying the host-to-host latency 3 times (GLOO_LATENCIES_PER_MESSAGE)
    big = PAIR_ACROSS_HOSTS_MAX_BYTES + 2
    assert apart.allreduce_s(big) == apart.allreduce_s(big, pairs=False)
    assert apart.allreduce_s(big) == 2 * (0.125 + 3 * 0.25 + big / 2 / 64)
    inside = sim.Cluster(1, 2, ring, sim.Link(0.0625, 512.0))  # one host: always swapped
    assert inside.allreduce_s(big) == 0.0625 + big / 512
    # 2 hosts x 2 ranks: 6 steps of 64 bytes, each as slow as the host-to-host edge, whose
    # latency gloo pays 3 times per message (GLOO_LATENCIES_PER_MESSAGE, measured)
    net = sim.Link(0.25, 64.0)
    c = sim.Cluster(2, 2, ring, ring, net)
    assert sim.GLOO_LATENCIES_PER_MESSAGE == 3.0
    assert c.allreduce_s(256) == 6 * (0.125 + 3 * 0.25 + 64 / 64)
    # a barrier: 6 empty messages, each paying the latency once
    assert c.barrier_s() == 6 * (0.125 + 0.25) and one_host(2, ring).barrier_s() == 2 * 0.125
    moved, between = c.allreduce_bytes(256)
    assert (moved, between) == (6 * 64 * 4, 6 * 64 * 2)  # 2 of the 4 ring edges cross
    # a point-to-point message across hosts pays the latency twice (GLOO_P2P_LATENCIES)
    assert sim.GLOO_P2P_LATENCIES == 2.0
    assert c.p2p_s(0, 1, 64) == 0.125 + 64 / 1024 and c.p2p_s(1, 2, 64) == 0.625 + 1.0


def test_a_rank_that_waited_at_an_allreduce_resumes_late():
    """``wake_s`` (measured in a real two-rank run): at an all-reduce, a rank that arrived
    before the last resumes that much after it; the last does not. Ranks that take turns being
    last pay it every step; a persistent straggler hides it. Barriers do not pay it."""
    c = sim.Cluster(1, 2, sim.Link(0.125, INF), sim.Link(0.25, INF), wake_s=0.5)
    assert c.allreduce_s(256) == 0.25  # the exchange itself is unchanged
    # turns: rank 0 steps 1, 2; rank 1 steps 2, 1. Step 1 ends at 2 + 0.25 (rank 1), 2.75
    # (rank 0 waited); step 2: rank 0 arrives at 4.75, rank 1 at 3.25 and waits: 5.0 for rank
    # 0, 5.5 for rank 1; the barrier (2 x 0.125, nobody late) at 5.75
    r = sim.lockstep(c, [[[1.0, 2.0]], [[2.0, 1.0]]], every=1, sync_bytes=256)
    assert r.epoch_s == [5.75]
    # rank 0: 1 s and 0.5 late at step 1, 0.5 s at the barrier; rank 1: 1.5 s and 0.5 late
    assert r.wait_s == [1.0 + 0.5 + 0.5, 1.5 + 0.5]
    # a straggler: rank 1 is always last, rank 0's late wake-up is hidden behind rank 1's next
    # step, except the last step's, which the epoch's barrier waits for: 2 x 2.25 + 0.5 + 0.25
    r = sim.lockstep(c, [[[1.0, 1.0]], [[2.0, 2.0]]], every=1, sync_bytes=256)
    assert r.epoch_s == [2 * 2.25 + 0.5 + 0.25]
    # equal steps: one of the two waited (the first to arrive), and then the other: each step
    # pays it, as real ranks with equal work do (one of them always waits)
    r = sim.lockstep(c, [[[1.0, 1.0]], [[1.0, 1.0]]], every=1, sync_bytes=256)
    assert r.epoch_s == [2 * (1.0 + 0.25 + 0.5) + 0.25] and r.wait_s == [1.0, 1.0]
    # gossip, as test_gossip_claim_ready_exchange_with_k1: rank 1, claimed, turns ready at 1
    # and waits for rank 0's boundary (2); rank 0 is out of the exchange at 2.25, rank 1 only at
    # 2.75. So rank 0 takes the last subgraph, and cannot claim rank 1 again (still inside the
    # exchange): one exchange, 3 batches against 1, done at 3.25
    c = sim.Cluster(1, 2, FREE, sim.Link(0.25, INF), wake_s=0.5)
    r = sim.gossip(c, [1.0] * 4, epochs=1, every=1, sync_bytes=16, seed=0, poll_s=0.25)
    assert [(t, a, b) for t, a, b in r.log] == [(2.25, 0, 1)]
    assert r.batches == [3, 1] and r.train_time_s == 3.25


def test_sampled_ranks_pay_the_late_wake_up_at_ddps_allreduce():
    """Two ranks, 2 steps of 1 s, rank 1 at half speed: rank 0 waits at each all-reduce and
    resumes 0.5 s late, hidden by rank 1's slow second step, but not at the epoch's end (4.5).
    Equal ranks take turns waiting: each step pays it (rank 0 at the first, rank 1 at the
    second: 1 + 0.5 + 1 + 0.5)."""
    for wake, epoch, waits in ((0.0, 4.0, [2.0, 0.0]), (0.5, 4.5, [2.5, 0.0])):
        c = sim.Cluster(1, 2, FREE, FREE, wake_s=wake)
        r = sim.sampled(c, 2, 1, 1.0, 0.0, 0, 0, speed=[1.0, 2.0])
        assert r.epoch_s == [epoch] and r.wait_s == waits
    assert sim.sampled(c, 2, 1, 1.0, 0.0, 0, 0).epoch_s == [3.0]


def test_two_lockstep_ranks_meet_every_k_steps():
    """K = 2, all-reduce 0.5 s. Rank 0: 1,1,1,1 s; rank 1: 2,1,2,1 s. Steps 1-2 end at 2 and 3,
    the all-reduce at 3 + 0.5; steps 3-4 end at 5.5 and 6.5, the all-reduce at 7; the epoch's
    closing barrier (2 x 0.125 s) at 7.25."""
    # an exchange of 256 bytes: 0.5 s; the barrier's ring: 2 x 0.125 s
    c = one_host(2, ring=sim.Link(0.125, 1024.0), p2p=sim.Link(0.25, 1024.0))
    r = sim.lockstep(c, [[[1.0] * 4], [[2.0, 1.0, 2.0, 1.0]]], every=2, sync_bytes=256)
    assert r.epoch_s == [7.25] and r.train_time_s == 7.25
    assert r.exchanges == 2 and r.batches == [4, 4]
    assert r.wait_s == [2.0, 0.0]  # rank 0 waits 1 s at each all-reduce
    assert r.bytes_moved == 2 * 256 * 2  # per all-reduce, each rank sends 2 x 128 bytes


def test_lockstep_epochs_end_at_a_barrier_and_a_missing_batch_only_joins():
    c = one_host(2)
    r = sim.lockstep(c, [[[1.0, 1.0], [3.0]], [[2.0, None], [1.0]]], every=100, sync_bytes=0)
    assert r.epoch_s == [2.0, 3.0] and r.train_time_s == 5.0 and r.batches == [3, 2]


def test_gpipe_bubble_and_1f1b_two_stages_two_microbatches():
    """f = 1, b = 2, 0.5 s per activation: stage 1 starts its forwards at 1.5 and 2.5, its
    backwards run 3.5-7.5; stage 0's backwards wait for the gradients at 6 and 8, ending at 10
    = (M + S - 1)(f + b) + 2 (S - 1) x 0.5, plus the optimizer step."""
    c = one_host(2, p2p=sim.Link(0.5, INF))
    fwd, bwd = [[1.0, 1.0]] * 2, [[2.0, 2.0]] * 2
    gp = sim.pipeline(c, fwd, bwd, [100.0], steps=1, opt_s=[0.25, 0.25])
    assert gp.train_time_s == 10.25 and gp.epoch_s == [10.25]
    assert gp.busy_s == [6.25, 6.25] and gp.bytes_moved == 400.0
    one = sim.pipeline(c, fwd, bwd, [100.0], steps=1, schedule="1f1b", opt_s=[0.25, 0.25])
    assert one.train_time_s == 10.25
    # two steps back to back: stage 0 starts step 2 right after its own optimizer step
    two = sim.pipeline(c, fwd, bwd, [100.0], steps=2, opt_s=[0.25, 0.25])
    assert two.epoch_s == [10.25, 10.25]


def test_a_message_between_hosts_leaves_once_its_receive_is_posted():
    """gloo's rendezvous: the bytes go once the receiver's "ready" notification (one latency,
    0.5 s) has reached the sender, one message after another on the same connection (100
    bytes: 1 s), and arrive a latency later. Posted as it is sent, that is the two latencies
    of ``p2p_s``; posted early, one; inside a host, ``p2p_s`` whenever it is posted."""
    c = sim.Cluster(2, 1, FREE, FREE, sim.Link(0.5, 100.0))
    assert c.p2p_delivery(0, 1, 100, 0.0, 0.0, 0.0) == (2.0, 1.5) == (c.p2p_s(0, 1, 100), 1.5)
    assert c.p2p_delivery(0, 1, 100, 0.0, -10.0, 0.0) == (1.5, 1.0)  # posted early
    assert c.p2p_delivery(0, 1, 100, 0.0, 4.0, 0.0) == (6.0, 5.5)  # posted late
    assert c.p2p_delivery(0, 1, 100, 0.0, -10.0, 3.0) == (4.5, 4.0)  # behind another message
    inside = one_host(2, p2p=sim.Link(0.5, 100.0))
    assert (
        inside.p2p_delivery(0, 1, 100, 1.0, 9.0, 0.0)
        == (2.5, 0.0)
        == (1 + inside.p2p_s(0, 1, 100), 0)
    )


def test_an_exchange_between_hosts_depends_on_who_came_in_first():
    """gloo's protocol for an isend + irecv exchange over a 0.5 s link carrying 100 bytes a
    second (100 bytes: a message is 1.5 s). Entered at once, each side's "receive ready"
    crosses (0.5 s) and the other's bytes follow: both done at 2 (``p2p_s``). Entered 1 s apart
    (more than a latency), the first's notification is already there: the second's bytes
    leave at once and reach the first at 2.5; the second's own notification left behind them
    on the same stream, so the first's bytes leave at 2.5 and arrive at 4: the second is in
    the exchange 3 s, two messages. Entered 0.25 s apart, each is done 2 s after it came in.
    Inside a host: the measured exchange from the second's entry, for both."""
    c = sim.Cluster(2, 1, FREE, FREE, sim.Link(0.5, 100.0))
    assert c.exchange_done(0, 1, 100, 0.0, 0.0) == (2.0, 2.0) == (c.p2p_s(0, 1, 100),) * 2
    assert c.exchange_done(1, 0, 100, 0.0, 1.0) == (2.5, 4.0)
    assert c.exchange_done(0, 1, 100, 0.0, 0.25) == (2.0, 2.25)
    inside = one_host(2, p2p=sim.Link(0.5, 100.0))
    assert inside.exchange_done(0, 1, 100, 0.0, 1.0) == (2.5, 2.5)


def test_gossip_claimer_beside_the_store_waits_two_messages_in_an_exchange_across_hosts():
    """Rank 0 (beside the store) claims rank 1 (another host, store round trip 0.5 s) at 1;
    1 s steps, 4 subgraphs, K = 1, only rank 0 picks; the link: 0.25 s one way, 100 bytes a
    second, 25 bytes exchanged (a message: 0.5 s). Rank 1 reads the claim with a get (answer
    at 2), sets itself ready (lands at 2.25) and enters the exchange at 2; rank 0 finds it
    ready at its boundary at 3, a second after rank 1 came in: rank 1 is done at 3.5, rank 0
    at 4 (two messages, not the 0.75 s of both entering at once). Rank 1's release lands at
    3.75, and so, just after it, does its retirement (a compare-and-set, answered at 4): rank
    0's pick at 4 finds it done, and both end at 4."""
    c = sim.Cluster(2, 1, FREE, FREE, sim.Link(0.25, 100.0))
    r = sim.gossip(c, [1.0] * 4, 1, 1, 25, 0, bipartite=True, poll_s=0.25,
                   store_rtt_s=[0.0, 0.5])  # fmt: skip
    assert r.train_time_s == 4.0 and r.log == [(4.0, 0, 1)] and r.batches == [3, 1]
    assert r.wait_s == [1.0, 1.5]


def test_gpipe_across_two_hosts_waits_for_each_receive_to_be_posted():
    """The GPipe case above over a 0.5 s link carrying 100 bytes a second (1 s per activation).
    Stage 1 posts its first receive at 0: F0, sent at 1, arrives at 2.5 and runs to 3.5; only
    then does stage 1 post F1's receive, so F1 (sent at 2) leaves at 3.5 + 0.5 and arrives at
    5.5; F1 6.5, B0 8.5, B1 10.5. Stage 0 posted B0's receive at 2: it leaves at 8.5 and arrives
    at 10 (B0 to 12); B1's receive, posted at 12, brings it at 12.5 + 1 + 0.5 = 14: end 16.
    Charging every message two latencies after its send, as inside a host, ends at 13."""
    c = sim.Cluster(2, 1, FREE, FREE, sim.Link(0.5, 100.0))
    fwd, bwd = [[1.0, 1.0]] * 2, [[2.0, 2.0]] * 2
    r = sim.pipeline(c, fwd, bwd, [100.0], steps=1)
    assert r.train_time_s == 16.0 and r.busy_s == [6.0, 6.0] and r.wait_s == [10.0, 4.5]
    assert r.bytes_moved == r.bytes_between_hosts == 400.0


def test_gossip_ranks_steps_take_their_own_speed():
    """Four 1 s subgraphs, no averaging; rank 1's steps take 3x (its cores shared): rank 0
    trains three of them (0-1, 1-2, 2-3), rank 1 one (0-3); each computed for 3 s."""
    c = one_host(2)
    r = sim.gossip(c, [1.0] * 4, 1, 100, 0, 0, speed=[1.0, 3.0])
    assert r.train_time_s == 3.0 and r.batches == [3, 1] and r.compute_s == [3.0, 3.0]


def test_pipeline_steps_group_into_epochs_without_a_barrier():
    """ViG: an epoch is several pipeline steps (one per mini-batch). Two steps of the GPipe
    case above (10.25 s each, back to back) make one epoch of 20.5 s; four steps two epochs.
    A stage starts the next step without waiting for the others' epoch to end: with stage 1
    slower (b = 3 there), stage 0's next forwards overlap stage 1's optimizer step."""
    c = one_host(2, p2p=sim.Link(0.5, INF))
    fwd, bwd = [[1.0, 1.0]] * 2, [[2.0, 2.0]] * 2
    steps = [sim.pipeline(c, fwd, bwd, [100.0], 4, opt_s=[0.25, 0.25])]
    steps.append(sim.pipeline(c, fwd, bwd, [100.0], 4, opt_s=[0.25, 0.25], steps_per_epoch=2))
    assert steps[0].epoch_s == [10.25] * 4
    assert steps[1].epoch_s == [20.5, 20.5] and steps[1].train_time_s == 41.0
    assert steps[1].batches == [8, 8] and steps[1].bytes_moved == 4 * 400.0
    # stage 1: b = 3; step 1: stage 1's backwards 3.5-9.5, stage 0's 7-9 and 10-12 (+0.25);
    # stage 1 ends at 9.5 + 2 (opt) = 11.5, stage 0 at 12.25. Step 2 starts on stage 0 at
    # 12.25: forwards to 14.25, at stage 1 from 13.75 (free since 11.5): the same 12.25 again.
    slow = sim.pipeline(
        c, fwd, [[2.0, 2.0], [3.0, 3.0]], [100.0], 2, opt_s=[0.25, 2.0], steps_per_epoch=2
    )
    assert slow.epoch_s == [24.5]
    with pytest.raises(ValueError, match="whole epochs"):
        sim.pipeline(c, fwd, bwd, [100.0], 3, steps_per_epoch=2)


def test_schedule_orders_are_torchs():
    assert sim.schedule_ops("gpipe", 0, 2, 3) == [("F", 0), ("F", 1), ("F", 2)] + [
        ("B", 0),
        ("B", 1),
        ("B", 2),
    ]
    # torch's Schedule1F1B: stage s warms up with min(M, S - s) forwards
    assert sim.schedule_ops("1f1b", 1, 2, 3) == [
        ("F", 0),
        ("B", 0),
        ("F", 1),
        ("B", 1),
        ("F", 2),
        ("B", 2),
    ]
    assert sim.schedule_ops("1f1b", 0, 2, 3) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("B", 2),
    ]


def test_hybrid_copies_allreduce_each_stage_after_their_schedules():
    c = sim.Cluster(1, 4, sim.Link(0.125, INF), sim.Link(0.0, INF))
    fwd, bwd = [[1.0]] * 2, [[1.0]] * 2
    r = sim.pipeline(c, fwd, bwd, [0.0], steps=1, replicas=2, grad_bytes=[8.0, 8.0])
    # one copy: F 0-1, 1-2, B 2-3, 3-4; then each stage's 2-copy all-reduce, an exchange
    # over the free point-to-point link: the ring's latency is not paid
    assert r.train_time_s == 4.0 and r.exchanges == 2
    c = sim.Cluster(1, 4, sim.Link(0.0, INF), sim.Link(0.25, INF))
    r = sim.pipeline(c, fwd, bwd, [0.0], steps=1, replicas=2, grad_bytes=[8.0, 8.0])
    # the activations and gradients cross 2 x 0.25 s (F 0-1, 1.25-2.25, B 2.25-3.25, 3.5-4.5),
    # then one exchange of 0.25 s
    assert r.train_time_s == 4.75 and r.exchanges == 2


def test_pool_drained_by_one_fast_and_one_slow_rank():
    """6 subgraphs of 1 s, rank 1 slowed 2.5x, no averaging due (K = 100). Rank 0 takes at 0, 1,
    2, 3 and finds the pool empty at 4; rank 1 takes at 0 and 2.5 and ends at 5."""
    c = one_host(2)
    slow = sim.Stragglers({1: 2.5})
    r = sim.gossip(c, [1.0] * 6, epochs=1, every=100, sync_bytes=0, seed=0, stragglers=slow)
    assert r.train_time_s == 5.0 and r.batches == [4, 2] and r.exchanges == 0
    assert r.busy_s == [4.0, 5.0] and r.wait_s == [1.0, 0.0]  # rank 0 at the final barrier


def test_gossip_claim_ready_exchange_with_k1():
    """Two equal ranks (1 s steps), K = 1, exchanges of 0.25 s, 4 subgraphs. At 1 rank 0 claims
    rank 1, which turns ready and waits; rank 0 finds it ready at its next boundary (2): the
    exchange ends at 2.25, and rank 0 claims rank 1 again at once. Rank 1 trains until 3.25,
    rank 0 (out of work, polling every 0.25 s) finds it ready at 3.25: second exchange, ends 3.5.
    """
    c = one_host(2, p2p=sim.Link(0.25, INF))
    r = sim.gossip(c, [1.0] * 4, epochs=1, every=1, sync_bytes=16, seed=0, poll_s=0.25)
    assert r.train_time_s == 3.5 and r.exchanges == 2 and r.batches == [2, 2]
    assert [(t, a, b) for t, a, b in r.log] == [(2.25, 0, 1), (3.5, 0, 1)]
    assert r.bytes_moved == 2 * 2 * 16


def test_gossip_slow_rank_is_never_picked_by_faster_ranks_only_picks_them():
    """The speed filter: once step times are published, the 3x slower rank 1 finds rank 0's steps
    under 80% of its own and never picks it; rank 0 may pick rank 1."""
    c = one_host(2, p2p=sim.Link(0.0, INF))
    r = sim.gossip(c, [1.0] * 40, 1, 1, 0, 0, stragglers=sim.Stragglers({1: 3.0}))
    assert all(a == 0 for _, a, _ in r.log[1:])  # the first pick precedes any published time
    assert sum(r.batches) == 40 and r.batches[0] > 2 * r.batches[1]


def test_sampled_loader_workers_feed_the_rank():
    """sample 2 s, compute 1 s, 3 steps. W = 0: 3 x 3 s. W = 1 (2 batches prefetched): batches
    ready at 2, 4, 6 (the third dispatched when the first is taken): ends at 7. W = 2: at 5."""
    c = one_host(1)
    times = [sim.sampled(c, 3, 1, 1.0, 2.0, w, 0).train_time_s for w in (0, 1, 2)]
    assert times == [9.0, 7.0, 5.0]
    # a worker that needs 1 s to start delivers at 3, 5, 7; the rank itself pays it once
    started = [sim.sampled(c, 3, 1, 1.0, 2.0, w, 0, start_s=1.0).train_time_s for w in (0, 1)]
    assert started == [10.0, 8.0]
    two_epochs = sim.sampled(c, 2, 2, 1.0, 2.0, 1, 0)
    # batch 3 (of epoch 2) is made 4-6, while epoch 1 trains: the loader runs across epochs
    assert two_epochs.epoch_s == [5.0, 4.0]


def test_sampled_ranks_meet_in_ddps_allreduce_every_step():
    c = one_host(2, ring=sim.Link(0.125, INF))
    r = sim.sampled(c, 2, 1, 1.0, 0.0, 0, 8, stragglers=sim.Stragglers({1: 2.0}))
    assert r.train_time_s == 2 * (2.0 + 0.25) and r.exchanges == 2


def test_simulated_straggler_pauses_are_the_emulations(monkeypatch):
    """The pauses the simulation adds are exactly what Straggler.after_step sleeps."""
    slept = []
    monkeypatch.setattr(straggler_module.time, "sleep", slept.append)
    real = Straggler.for_rank({0: 1.5}, 0.5, 7, 0)
    steps = [0.5, 0.25, 1.0] * 20
    for t in steps:
        real.after_step(t)
    r = sim.lockstep(one_host(1), [[steps]], 1, 0, sim.Stragglers({0: 1.5}, 0.5, 7))
    assert r.busy_s[0] == sum(t + p for t, p in zip(steps, slept))
    assert len(slept) == len(steps) and any(p > 0.5 * t for p, t in zip(slept, steps))


def test_a_stragglers_pause_leaves_out_what_the_emulation_does_not_slow():
    """The loop draws rank 1's pause (3x) on forward and backward only: of a 1 s step, 0.25 s
    (optimizer step, the loop's own work) is not slowed, so rank 1 pauses 2 x 0.75 s and a
    lock-step step takes 2.5 s, not 3 s; the same in sampled's and gossip's ranks."""
    c = one_host(2, ring=sim.Link(0.0, INF))
    strag = sim.Stragglers({1: 3.0}, slowed_share=0.75)
    steps = [[[1.0, 1.0]], [[1.0, 1.0]]]
    assert sim.lockstep(c, steps, 1, 0, strag).train_time_s == 5.0
    assert sim.lockstep(c, steps, 1, 0, sim.Stragglers({1: 3.0})).train_time_s == 6.0
    assert sim.sampled(c, 2, 1, 1.0, 0.0, 0, 0, stragglers=strag).busy_s == [2.0, 5.0]
    alone = sim.gossip(one_host(1), [1.0] * 4, 1, 100, 0, 0, stragglers=strag)
    assert alone.busy_s == [4.0]  # rank 0 is no straggler
    r = sim.gossip(c, [1.0] * 4, 1, 100, 0, 0, stragglers=strag)
    assert sorted(r.batches) == [1, 3] and r.busy_s[1] == 2.5  # 1 step of 1 + 1.5 s


def test_a_step_right_after_a_pause_runs_cold_and_its_pause_is_drawn_on_it():
    """Rank 0 2x slow, a step after a pause 1.5x as long (the profile's after_pause). Steps of
    1 s: the first 1 + 1 pause; each later one 1.5 + 1.5 pause: 2 + 3 + 3 = 8 s. Sampled
    (making 1 s, training 1 s, in the rank): 3, then 4.5 twice (the making is cold too). A
    rank that never pauses keeps its steps."""
    cold = sim.Stragglers({0: 2.0}, after_pause=1.5)
    assert sim.lockstep(one_host(1), [[[1.0, 1.0, 1.0]]], 1, 0, cold).train_time_s == 8.0
    assert sim.gossip(one_host(1), [1.0] * 3, 1, 100, 0, 0, stragglers=cold).busy_s == [8.0]
    assert sim.sampled(one_host(1), 3, 1, 1.0, 1.0, 0, 0, cold).train_time_s == 12.0
    # with a loader worker (making 0.5 s, ready in time) only the training step is the rank's
    assert sim.sampled(one_host(1), 3, 1, 1.0, 0.5, 1, 0, cold).busy_s == [8.0]
    fast = sim.Stragglers({1: 2.0}, after_pause=1.5)
    assert sim.lockstep(one_host(1), [[[1.0, 1.0, 1.0]]], 1, 0, fast).train_time_s == 3.0


def test_gossip_never_deadlocks_and_trains_every_position_once():
    for world in (2, 3, 4):
        for k in (1, 3):
            c = one_host(world, p2p=sim.Link(0.01, INF))
            times = [0.1 + 0.01 * (i % 7) for i in range(30)]
            r = sim.gossip(c, times, 3, k, 0, seed=world, stragglers=sim.Stragglers({0: 3.0}))
            assert sum(r.batches) == 30
            assert r.exchanges > 0


@pytest.mark.parametrize("bipartite", [False, True])
def test_gossip_bipartite_only_active_ranks_pick(bipartite):
    c = one_host(4, p2p=sim.Link(0.01, INF))
    r = sim.gossip(c, [0.1] * 40, 1, 1, 0, 0, bipartite=bipartite)
    pickers = {a for _, a, _ in r.log}
    assert pickers <= ({0, 1} if bipartite else {0, 1, 2, 3}) and r.exchanges > 0


def test_gossip_pays_a_store_round_trip_per_call_at_each_boundary():
    """K = 100 (no exchange wanted), 2 equal ranks of 1 s steps, store round trips of 0.125 s:
    each boundary looks at the rank's own key once (a get: 2 round trips, torch's TCPStore.get
    waits for the key, then gets it), and retiring is one compare-and-set:
    2 x (1 + 2 x 0.125) + 0.125 = 2.625 s."""
    c = one_host(2, p2p=sim.Link(0.25, INF))
    r = sim.gossip(c, [1.0] * 4, 1, 100, 16, 0, store_rtt_s=[0.125, 0.125])
    assert r.train_time_s == 2.625 and r.busy_s == [2.625, 2.625] and r.exchanges == 0


def test_gossip_at_k1_pays_the_pairing_protocols_store_calls():
    """K = 1: a pick is a compare-and-set of its own key, a look at the candidate's speed and
    a compare-and-set of the candidate's key; then looks at the partner's key: between 2 and 8
    round trips a step (its sets, the answer to a claim and both releases, wait for nothing).
    The exchanges land a little later, so their number may differ by one."""
    c = one_host(2, p2p=sim.Link(0.25, INF))
    free = sim.gossip(c, [1.0] * 40, 1, 1, 16, 0)
    paid = sim.gossip(c, [1.0] * 40, 1, 1, 16, 0, store_rtt_s=[0.01, 0.01])
    per_step = (sum(paid.busy_s) - sum(free.busy_s)) / 40 / 0.01
    assert 2 <= per_step <= 8 and abs(paid.exchanges - free.exchanges) <= 1
    assert free.exchanges > 10


def test_gossip_store_sets_cost_nothing_and_land_half_a_round_trip_later():
    """torch's TCPStore.set sends and returns without an answer; compare_set waits for its
    answer, get for two (it waits for the key first). Rank 0 beside the store (no round trip)
    claims rank 1, whose round trip is 0.5 s; 1 s steps, 4 subgraphs, exchanges of 0.25 s,
    K = 1, only rank 0 picks (bipartite). At 1 rank 0 claims rank 1; rank 1 looks at its key
    (the get reaches the store at 1.75, answer at 2), sets it ready (lands at 2.25: it waits
    for nothing) and waits in the exchange. Rank 0 looks at 2 (not ready yet), takes the last
    subgraph, finds it ready at 3: exchange 3-3.25. Its pick again at 3.25 finds rank 1 still
    ready (the release lands at 3.5): no claim, and rank 0 retires. Rank 1, out of work,
    retires with a compare-and-set that reaches the store at 3.5, after its release: answer
    at 3.75. Charging each set a round trip made rank 1 reach the exchange late."""
    c = one_host(2, p2p=sim.Link(0.25, INF))
    r = sim.gossip(c, [1.0] * 4, 1, 1, 16, 0, bipartite=True, poll_s=0.25,
                   store_rtt_s=[0.0, 0.5])  # fmt: skip
    assert r.train_time_s == 3.75 and r.log == [(3.25, 0, 1)] and r.batches == [3, 1]
    assert r.busy_s == [3.0, 1.0 + 2 * 0.5 + 0.5]  # rank 1: its step, a get, retiring


def test_gossip_first_step_on_a_subgraph_costs_extra_once_per_rank():
    """Each rank pays a subgraph's first-step extra the first time it takes that subgraph:
    at least once per subgraph, at most once per rank and subgraph."""
    c = one_host(2, p2p=sim.Link(0.01, INF))
    parts = [0, 1, 2, 3] * 3
    base = sim.gossip(c, [1.0] * 12, 3, 100, 16, 0)
    r = sim.gossip(c, [1.0] * 12, 3, 100, 16, 0, position_part=parts, first_extra_s=[0.5] * 4)
    extra = sum(r.busy_s) - sum(base.busy_s)
    assert 4 * 0.5 <= extra <= 2 * 4 * 0.5 and (extra / 0.5).is_integer()


def test_gossip_a_pick_that_claims_nobody_holds_its_key_busy_until_the_release_lands():
    """Rank 1 (store round trip 0.5 s) picks while rank 0 is busy: its compare-and-set of its
    own key (avail -> busy) reaches the store at 0.25, answered at 0.5; the get of rank 0's
    speed (two round trips) and the failed compare-and-set of rank 0's key end at 2.0; the
    set that releases its key is sent then and lands at 2.25. Until then nobody can claim
    rank 1 (a pick resolved in one instant left it available at once)."""
    c = one_host(2)
    run = sim._GossipRun(c, [1.0] * 4, 1, 16, 0, sim.NONE, False, 0.001, 0.8,
                         [0.0, 0.0], [0.0, 0.5], None, None, [1.0, 1.0])  # fmt: skip
    run.state[0] = "busy"
    seen = {}
    for t in (0.2, 0.3, 2.2, 2.3):
        run.sim.at(t, lambda t=t: seen.__setitem__(t, run.state[1]))
    run.sim.start(run.pick(1))
    run.sim.run()
    assert seen == {0.2: "avail", 0.3: "busy", 2.2: "busy", 2.3: "avail"}
    assert run.pending[1] is None and run.busy[1] == 4 * 0.5
