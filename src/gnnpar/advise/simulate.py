"""Discrete-event simulation of every strategy, with the semantics gnnpar's code has.

Inputs are seconds and bytes (from a profile, :mod:`gnnpar.advise.profile`, or a test's hand
numbers); nothing here imports torch. The engine is :mod:`gnnpar.advise.events` (why not SimPy:
see there). Each function mirrors one strategy's loop, source and sync policy:

* :func:`lockstep` (sequential, allreduce): ranks run their own steps and meet in a ring
  all-reduce every ``K`` steps (a counter across epochs: :class:`~gnnpar.training.sync.GradAllReduce`,
  :class:`~gnnpar.training.sync.ParamAverage`); every epoch ends at a barrier (``LockStep.end_epoch``)
  and starts at an untimed one (evaluation is not training time). A rank with no batch at a step
  (the uneven last step of a static split) computes nothing but joins the collective.
* :func:`gossip`: the work pool (a shared counter: whoever is free takes the next position,
  :class:`~gnnpar.parallel.gossip.pool.WorkPool`) and the claim protocol of
  :mod:`gnnpar.parallel.gossip.protocol`, rule by rule: at each step boundary a rank with a pending
  pick exchanges if its partner is ``ready``; a claimed rank turns ``ready`` and waits for its
  claimer's next boundary; a rank due to average (``since >= K - 1``) picks a uniformly random
  ``avail`` partner among those whose published step time is not under 80% of its own, with the
  same ``random.Random(seed * 7919 + rank)`` the code shuffles with; the published step time is
  the code's moving average, written every 4th step; each store call acts on the store half
  a round trip after it was made, and only the calls that wait for an answer cost the rank
  time (a ``set`` does not: :meth:`_GossipRun.put`; a ``get`` is two round trips, ``add`` and
  ``compare_set`` one: :meth:`_GossipRun.call`); with ``K = 1`` the claimer picks again at
  once after its exchange. An exchange between hosts follows gloo's protocol from both sides'
  entry times (:meth:`Cluster.exchange_done`): a rank that comes in a latency or more after
  its partner, as a claimer that found its partner ready does, is in it for two messages. Out of work, a rank finishes its pick (polling every 1 ms, as
  ``Pairing.retire``), serves claims made on it, retires, and waits at the final barrier.
* :func:`pipeline` (pipeline, hybrid): each stage runs torch's op order (ScheduleGPipe: every
  forward, then every backward; Schedule1F1B: ``min(M, S - s)`` warm-up forwards, then one
  backward / one forward, then the remaining backwards); a forward waits for its input
  activation from the stage before, a backward for the gradient from the stage after, posting
  its receive when it reaches that operation (as the schedules do). Inside a host a message
  arrives one measured point-to-point cost after it was sent; between hosts it follows gloo's
  rendezvous (:meth:`Cluster.p2p_delivery`: the bytes leave once the receive is posted and the
  notification has crossed, one message after another on a pair's connection). Hybrid: after
  its schedule each stage all-reduces its gradients with the same stage of the other copies.
  No epoch barrier (``NoSync``): a stage starts the next step as soon as its inputs come.
* :func:`sampled`: DDP over neighbour-sampled batches. Each rank's DataLoader has ``W`` workers,
  batch ``i`` made by worker ``i mod W`` (one thread), ``2 W`` batches dispatched at the start
  and one more each time the rank takes a batch (``prefetch_factor=2``), delivered in order;
  ``W = 0`` samples in the rank itself. The gradient all-reduce is counted in full after
  backward (DDP overlaps part of it with backward: an upper bound on the sync).

Stragglers: every strategy that reads ``--slowdown``/``--jitter`` draws each step's pause from
:meth:`gnnpar.training.straggler.Straggler.pause_s` of the rank's own ``Straggler`` (same seed),
so the simulated pauses are the emulation's, to the bit; drawn, as the loop draws them, on the
share of a step that is its forward and backward (``Stragglers.slowed_share``). The emulation
sleeps, and the step after a pause runs on a cold core: ``Stragglers.after_pause`` times as long
(measured by the profile), its own pause drawn on the slower step. Ties (two things at the same
instant) run in the order they were scheduled.

Networks: :class:`Cluster` holds the measured cost of one message inside a host (gloo on this
machine: ``p2p`` for a point-to-point message, ``ring_step`` for one step of a ring all-reduce)
and the link between hosts (``--network``); a message between hosts pays both in series
(latencies add, the slower bandwidth wins). A ring all-reduce of ``N`` bytes over ``p`` ranks is
``2 (p - 1)`` steps of ``N / p`` bytes, each as slow as the slowest link of the ring (ranks in
host order, so one ring edge leaves each host and no link is shared).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gnnpar.advise.events import Event, Rendezvous, Sim, Swap
from gnnpar.parallel.collectives import pair_exchange_pays
from gnnpar.training.straggler import Straggler


# ---------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float

    def send_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps

    def then(self, other: Link) -> Link:
        """Two hops in series: latencies add, the slower bandwidth wins."""
        return Link(self.latency_s + other.latency_s, min(self.bandwidth_Bps, other.bandwidth_Bps))


# gloo between hosts, measured between two network namespaces over the emulated link
# (benchmarks/comm/gloo_over_shaped_link.py, 2 ranks, 2026-11-26, benchmarks/HISTORY.md "Two hosts over a 1 ms and a 5 ms
# link"): a ring all-reduce of 4 KB-1 MB pays the link's one-way latency 2-4 times per ring
# message over 0.2-1 ms links (it varies with the TCP connections' state) and ~2.3 times over a
# 5 ms one (its unbound buffers wait for the receiver's ready notification, and TCP's
# acknowledgements pace the chunks); 3 is taken. A barrier pays it once per message.
GLOO_LATENCIES_PER_MESSAGE = 3.0
# A point-to-point message (gossip's exchange, a pipeline's activations) between: a 92 KB
# isend + irecv exchange took 3.86 ms over 1 Gbit/s with 1 ms (1.74 ms for one latency and the
# bytes) and 17.87 ms over 100 Mbit/s with 5 ms (12.4 ms); 2 is taken. That is gloo's protocol
# when both sides post at once (the receiver's "ready" notification crosses, then the bytes): a
# pipeline, whose receives are posted when the schedule reaches them, gets the protocol itself
# (Cluster.p2p_delivery), and so does gossip's exchange, whose sides never post at once
# (Cluster.exchange_done).
GLOO_P2P_LATENCIES = 2.0
# torch's TCPStore.get is two round trips to the store: it waits for the key to exist (a WAIT
# request, answered at once when it does), then sends the GET (timed across the emulated
# 100 Mbit/s, 5 ms link: get 25.0 ms, add 11.9 ms, compare_set 10.6 ms, set 0.06 ms)
GET_TRIPS = 2


@dataclass(frozen=True)
class Cluster:
    hosts: int
    ranks_per_host: int
    ring_step: Link  # one ring all-reduce step inside a host (measured)
    p2p: Link  # one point-to-point message inside a host (measured)
    network: Link | None = None  # between hosts (--network)
    # a rank that waited at an all-reduce for a later one resumes this much after the others:
    # blocked in gloo's wait it slept, and is woken late (1.3-2.1 ms on a 2-vCPU AMD EPYC VM,
    # against ~0.2 ms for the whole exchange back to back). The last to arrive does not pay it,
    # so a persistent straggler hides it and ranks that take turns being last pay it every
    # step. Measured in a real two-rank run here (the profile's ``wake_s``). Charged at every
    # all-reduce (gnnpar's, DDP's, torch's averager's, a hybrid's copies') and gossip exchange
    # (the rank that turned ready waits in gloo's wait for its claimer), not at a barrier (an
    # epoch's end) nor a pipeline's message (calibrated on a real two-rank step of its own)
    wake_s: float = 0.0

    @property
    def world(self) -> int:
        return self.hosts * self.ranks_per_host

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def _link(self, a: int, b: int, inside: Link, latencies: float = 1.0) -> Link:
        """The path of one message from rank ``a`` to ``b``: ``inside`` within a host; between
        hosts also the network, whose one-way latency the message pays ``latencies`` times."""
        if self.host(a) == self.host(b):
            return inside
        if self.network is None:
            raise ValueError(f"ranks {a} and {b} are on different hosts, but no network is given")
        net = self.network
        return inside.then(Link(net.latency_s * latencies, net.bandwidth_Bps))

    def crosses(self, a: int, b: int) -> bool:
        return self.host(a) != self.host(b)

    def p2p_s(self, a: int, b: int, nbytes: float) -> float:
        return self._link(a, b, self.p2p, GLOO_P2P_LATENCIES).send_s(nbytes)

    def p2p_delivery(
        self, a: int, b: int, nbytes: float, sent_s: float, posted_s: float, free_s: float
    ) -> tuple[float, float]:
        """A message from ``a`` to ``b`` sent at ``sent_s`` into a receive posted at
        ``posted_s``, on a connection that is free from ``free_s`` (messages between the same
        pair are one TCP stream, so their bytes go one after the other): ``(arrival,
        connection free again)``. Between hosts this is gloo's protocol: the bytes leave only once
        the receiver's "receive ready" notification has reached the sender (``Pair::send`` sends
        at once only into a remote pending receive), so a receive posted late costs a latency
        before the bytes' own, and one posted early costs nothing. Inside a host the measured
        point-to-point cost is used as it is (``p2p_s``)."""
        if not self.crosses(a, b):
            return sent_s + self.p2p_s(a, b, nbytes), free_s
        net = self.network
        path = self.p2p.then(Link(net.latency_s, net.bandwidth_Bps))
        start = max(sent_s, posted_s + net.latency_s, free_s)
        done = start + nbytes / path.bandwidth_Bps
        return done + path.latency_s, done

    def exchange_done(
        self, first: int, second: int, nbytes: float, first_s: float, second_s: float
    ) -> tuple[float, float]:
        """A two-rank exchange (``isend`` + ``irecv`` of ``nbytes`` each way, gossip's
        ``mixing.exchange_average``) that rank ``first`` entered at ``first_s`` and rank
        ``second`` at ``second_s >= first_s``: when each side is done, ``(first's, second's)``.

        Inside a host both are done one measured exchange (``p2p_s``) after the second came in.
        Between hosts this is gloo's protocol (``Pair::send`` writes the bytes at once only into
        a receive the peer has announced; every ``recv`` announces itself with a "receive
        ready" notification; a pair's messages are one TCP stream each way, in order). Where
        the first's notification has crossed by the time the second comes in (it came in a
        latency or more earlier, as a gossip rank that turned ``ready`` has: its key's new
        value reaches the store, its partner reads it there, then enters), the second's bytes
        leave at once and its own notification leaves behind them on the same stream: the
        first has them one transfer and a latency later and only then sends its own, which
        take a transfer and a latency more. The second is in the exchange twice one message's
        time, not once: measured across the emulated 100 Mbit/s, 5 ms link, 92 KB each way, the
        later side 25.9 ms (medians of 40; both sides at once: 20.0 and 18.5 ms;
        ``benchmarks/comm/gossip_exchange_parts.py``). Where both come in within a latency,
        each side's notification crosses while the other's bytes wait for it: each is done
        two latencies and a transfer after it came in (``GLOO_P2P_LATENCIES``)."""
        if not self.crosses(first, second):
            done = second_s + self.p2p_s(first, second, nbytes)
            return done, done
        net = self.network
        path = self.p2p.then(Link(net.latency_s, net.bandwidth_Bps))
        message = path.send_s(nbytes)
        if second_s - first_s >= path.latency_s:  # the first's "receive ready" is there
            return second_s + message, second_s + 2 * message
        both = path.latency_s + message
        return first_s + both, second_s + both

    def ring(self, ranks: Sequence[int] | None) -> list[int]:
        return list(range(self.world)) if ranks is None else sorted(ranks)

    def allreduce_s(
        self, nbytes: float, ranks: Sequence[int] | None = None, pairs: bool = True
    ) -> float:
        """One all-reduce of ``nbytes`` per rank: gloo's ring, 2 (p - 1) steps of ``nbytes / p``,
        each as slow as the ring's slowest edge; but two ranks with ``pairs`` (gnnpar's own
        all-reduce, ``collectives.all_reduce_sum``, not DDP's or torch's model averager) swap
        their tensors in one point-to-point exchange (``p2p_s``): on one host always, across
        hosts up to ``PAIR_ACROSS_HOSTS_MAX_BYTES`` (``collectives.pair_exchange_pays``). A rank that
        waited for the others pays ``wake_s`` on top (the simulations' rendezvous)."""
        ring = self.ring(ranks)
        p = len(ring)
        if p < 2:
            return 0.0
        if p == 2 and pairs and pair_exchange_pays(nbytes, not self.crosses(ring[0], ring[1])):
            return self.p2p_s(ring[0], ring[1], nbytes)
        step = max(
            self._link(
                ring[i], ring[(i + 1) % p], self.ring_step, GLOO_LATENCIES_PER_MESSAGE
            ).send_s(nbytes / p)
            for i in range(p)
        )
        return 2 * (p - 1) * step

    def barrier_s(self, ranks: Sequence[int] | None = None) -> float:
        """One gloo barrier: a ring of empty messages, each paying the latency once."""
        ring = self.ring(ranks)
        p = len(ring)
        if p < 2:
            return 0.0
        hop = max(
            self._link(ring[i], ring[(i + 1) % p], self.ring_step).latency_s for i in range(p)
        )
        return 2 * (p - 1) * hop

    def allreduce_bytes(self, nbytes: float, ranks: Sequence[int] | None = None) -> tuple:
        """(bytes sent by all ranks, bytes crossing between hosts) of one ring all-reduce."""
        ring = self.ring(ranks)
        p = len(ring)
        if p < 2:
            return 0.0, 0.0
        per_edge = 2 * (p - 1) * nbytes / p
        crossing = sum(self.crosses(ring[i], ring[(i + 1) % p]) for i in range(p))
        return per_edge * p, per_edge * crossing


@dataclass(frozen=True)
class Stragglers:
    """``--slowdown`` and ``--jitter`` of the run (the seed is the run's ``--seed``).
    ``slowed_share``: the share of every step that the emulation slows: the loop draws a
    straggler's pause on the step's forward and backward (waits excluded), not on the
    optimizer step and the loop's bookkeeping that follow them."""

    slowdown: dict[int, float] = field(default_factory=dict)
    jitter: float = 0.0
    seed: int = 0
    slowed_share: float = 1.0
    # a step right after the rank's own pause takes this many times the step given to the
    # simulation, whatever the rank's co-run ``speed`` (the emulation sleeps, and the thread
    # resumes on a cold core: measured in a real straggled run, the profile's ``after_pause``);
    # the pause that follows it is drawn on the slower step, as the loop times the step it
    # pauses for (None: as any other step)
    after_pause: float | None = None

    def for_rank(self, rank: int) -> Straggler:
        return Straggler.for_rank(self.slowdown, self.jitter, self.seed, rank)

    def pause_s(self, straggler: Straggler, step_s: float) -> float:
        """``straggler``'s pause after a step of ``step_s`` seconds (all of it simulated)."""
        return straggler.pause_s(step_s * self.slowed_share)

    def resumed(self, step_s: float, paused: bool, speed: float = 1.0) -> float:
        """A step of ``step_s`` seconds (``speed`` times that as the rank runs in step with the
        others) as the rank runs it, ``paused`` before it or not."""
        return step_s * (self.after_pause if paused and self.after_pause is not None else speed)


NONE = Stragglers()


@dataclass
class SimResult:
    epoch_s: list[float]  # each epoch's training time (the longest rank's)
    train_time_s: float  # result.json's train_time_s: the longest rank's summed epochs
    batches: list[int]  # per rank
    busy_s: list[float]  # per rank: compute, straggler pauses included
    wait_s: list[float]  # per rank: blocked on others or on data
    exchanges: int  # collectives, or pairwise exchanges
    bytes_moved: float  # between ranks, whole run
    bytes_between_hosts: float  # the part of it that crosses hosts
    log: list = field(default_factory=list)  # gossip: (time, claimer, partner); pool: takes
    compute_s: list[float] = field(default_factory=list)  # gossip, sampled: per rank, steps alone

    @property
    def mean_epoch_s(self) -> float:
        return self.train_time_s / max(len(self.epoch_s), 1)


class _Keyed(dict):
    """Events / rendezvous created on first use by whichever process gets there first."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key):
        self[key] = value = self.make(key)
        return value


def _run(sim: Sim, procs: list, what: str) -> None:
    sim.run()
    stuck = [i for i, p in enumerate(procs) if not p.triggered]
    if stuck:  # a modelling error, never a property of the user's run
        raise RuntimeError(f"simulated {what}: ranks {stuck} never finished (deadlock)")


# ---------------------------------------------------------------- lock-step ranks
def lockstep(
    cluster: Cluster,
    compute: Sequence[Sequence[Sequence[float | None]]],
    every: int,
    sync_bytes: float,
    stragglers: Stragglers = NONE,
    pairs: bool = True,
) -> SimResult:
    """``compute[rank][epoch][step]``: seconds of that step's forward, backward and optimizer
    step (None: no batch). Every rank has the same number of steps per epoch. ``pairs``: the
    all-reduce is gnnpar's (gradients; two ranks exchange, see ``Cluster.allreduce_s``), not
    torch's model averager (parameters)."""
    world = cluster.world
    if len(compute) != world:
        raise ValueError(f"compute has {len(compute)} ranks, the cluster {world}")
    epochs = len(compute[0])
    sim = Sim()
    cost = cluster.allreduce_s(sync_bytes, pairs=pairs)
    # an epoch ends at a barrier (gnnpar's LockStep.end_epoch); its start is not timed
    costs = {"sync": cost, "end": cluster.barrier_s(), "start": 0.0}
    late = {"sync": cluster.wake_s, "end": 0.0, "start": 0.0}
    meet = _Keyed(lambda key: Rendezvous(sim, world, costs[key[0]], late[key[0]]))
    ends = [[0.0] * epochs for _ in range(world)]
    busy, wait, batches = [0.0] * world, [0.0] * world, [0] * world
    count = [0]

    def rank(r: int):
        straggler = stragglers.for_rank(r)
        n, paused = 0, False
        for e in range(epochs):
            t = sim.now
            yield meet["start", e].arrive()
            wait[r] += sim.now - t
            for c in compute[r][e]:
                if c is not None:
                    c = stragglers.resumed(c, paused)
                    pause = stragglers.pause_s(straggler, c)
                    paused = pause > 0
                    c += pause
                    busy[r] += c
                    batches[r] += 1
                    yield sim.delay(c)
                n += 1
                if n % every == 0:
                    t = sim.now
                    yield meet["sync", n].arrive()
                    wait[r] += sim.now - t - cost
            t = sim.now
            yield meet["end", e].arrive()
            wait[r] += sim.now - t - costs["end"]
            ends[r][e] = sim.now
        if r == 0:
            count[0] = n // every

    procs = [sim.start(rank(r)) for r in range(world)]
    _run(sim, procs, "lock-step training")
    starts = [0.0] + ends[0][:-1]
    epoch_s = [ends[0][e] - starts[e] for e in range(epochs)]
    moved, between = cluster.allreduce_bytes(sync_bytes)
    n = count[0] if world > 1 else 0
    return SimResult(epoch_s, sum(epoch_s), batches, busy, wait, n, moved * n, between * n)


# ---------------------------------------------------------------- gossip with a work pool
@dataclass(frozen=True)
class _Exchange:
    partner: int
    xid: str
    initiated: bool


def gossip(
    cluster: Cluster,
    position_s: Sequence[float],
    epochs: int,
    every: int,
    sync_bytes: float,
    seed: int,
    stragglers: Stragglers = NONE,
    bipartite: bool = False,
    poll_s: float = 0.001,
    slack: float = 0.8,
    step_overhead_s: Sequence[float] | None = None,
    store_rtt_s: Sequence[float] | None = None,
    position_part: Sequence[int] | None = None,
    first_extra_s: Sequence[float] | None = None,
    speed: Sequence[float] | None = None,
) -> SimResult:
    """``position_s[i]``: seconds of the step that trains the subgraph at pool position ``i``
    (``epochs * parts`` positions; the order is the pool's, :meth:`WorkPool.order`).
    ``step_overhead_s[rank]``: the store round trips of every step (taking from the pool),
    not slowed by the straggler (they come before its timed step). ``store_rtt_s[rank]``: one
    round trip to the store; the pairing protocol (parallel/gossip/protocol.py) pays it per
    store call that waits for an answer (twice for a ``get``), at a step boundary, as the real
    one does: a look at its own key (or at its pick's partner's), a pick's compare-and-sets
    and its look at each candidate's speed. Its sets (the answer to a claim, the release after an exchange, the
    published speed) cost it nothing: torch's ``TCPStore.set`` does not wait for the store.
    Every call acts on the store half a round trip after the rank made it: a rank far from
    the store is seen ready, released or claimed that much later.
    ``position_part[i]``: the subgraph at pool position ``i``; ``first_extra_s[part]``: what a
    rank's first step on that subgraph costs beyond ``position_s`` (each rank derives what its
    model keeps from a subgraph the first time it takes it). ``speed[rank]``: how much longer
    that rank's steps take than ``position_s`` says (the cores it shares; 1 by default).
    ``compute_s`` of the result: each rank's steps, without pauses and store calls."""
    world = cluster.world
    run = _GossipRun(
        cluster,
        position_s,
        every,
        sync_bytes,
        seed,
        stragglers,
        bipartite,
        poll_s,
        slack,
        list(step_overhead_s or [0.0] * world),
        list(store_rtt_s or [0.0] * world),
        position_part,
        first_extra_s,
        list(speed or [1.0] * world),
    )
    procs = [run.sim.start(run.rank(r)) for r in range(world)]
    _run(run.sim, procs, "gossip")
    train = run.sim.now
    return SimResult(
        [train / epochs] * epochs,
        train,
        run.batches,
        run.busy,
        run.wait,
        len(run.log),
        run.moved[0],
        run.moved[1],
        run.log,
        run.compute,
    )


class _GossipRun:
    """The state of one :func:`gossip` simulation and its ranks' phases: the pairing
    protocol's store calls (:meth:`pick`, :meth:`serve_claim`, :meth:`at_boundary`), an
    exchange (:meth:`serve`), a rank's steps (:meth:`train`) and its clean-up before it
    retires (:meth:`retire`)."""

    def __init__(
        self,
        cluster: Cluster,
        position_s: Sequence[float],
        every: int,
        sync_bytes: float,
        seed: int,
        stragglers: Stragglers,
        bipartite: bool,
        poll_s: float,
        slack: float,
        overhead: list[float],
        rtt: list[float],
        position_part: Sequence[int] | None,
        first_extra_s: Sequence[float] | None,
        speed: list[float],
    ) -> None:
        world = cluster.world
        self.cluster, self.world, self.position_s = cluster, world, position_s
        self.every, self.sync_bytes, self.stragglers = every, sync_bytes, stragglers
        self.poll_s, self.slack, self.overhead, self.rtt = poll_s, slack, overhead, rtt
        self.position_part, self.first_extra_s, self.speed = position_part, first_extra_s, speed
        self.seen: list[set[int]] = [set() for _ in range(world)]  # subgraphs each has trained
        self.total = len(position_s)
        self.sim = Sim()
        self.state: list = ["avail"] * world
        self.pending: list[_Exchange | None] = [None] * world
        self.step_avg, self.published, self.steps = [0.0] * world, [0.0] * world, [0] * world
        self.claims = [0] * world
        self.rngs = [random.Random(seed * 7919 + r) for r in range(world)]
        self.active = list(range(world // 2)) if bipartite else list(range(world))
        self.passive = list(range(world // 2, world)) if bipartite else list(range(world))
        self.meet = _Keyed(lambda xid: Swap(self.sim, self._swap_done(xid), cluster.wake_s))
        self.sides: dict[str, list[int]] = {}  # xid -> its ranks, in the order they came in
        self.final = Rendezvous(self.sim, world)
        self.counter = [0]
        self.busy, self.wait, self.batches = [0.0] * world, [0.0] * world, [0] * world
        self.compute = [0.0] * world
        self.log: list = []
        self.moved = [0.0, 0.0]

    def candidates(self, r: int) -> list[int]:
        if r not in self.active:
            return []
        return [c for c in self.passive if c != r]

    def pickable(self, r: int) -> bool:
        return self.world > 1 and r in self.passive

    def not_faster(self, r: int, theirs: float) -> bool:
        """Whether a candidate whose published step time is ``theirs`` is not much faster."""
        return theirs == 0.0 or self.step_avg[r] == 0.0 or theirs >= self.slack * self.step_avg[r]

    def call(self, r: int, op, busy: bool = True, trips: int = 1):
        """One store call of rank ``r`` that waits for its answer: ``compare_set`` and ``add``
        are one request and its answer (``trips=1``); a ``get`` is two (``trips=2``): torch's
        ``TCPStore.get`` first waits for the key to exist (a WAIT request and its answer), then
        sends the GET (timed across the emulated 5 ms link: add 11.9 ms, compare_set 10.6 ms,
        get 25.0 ms). The last request reaches the store half a round trip after it is sent,
        ``op`` runs there (on the store's state at that instant), and the answer is back half a
        round trip later. Returns ``op``'s result. ``busy``: the round trips count as the rank's
        work (a rank polling for its partner in its clean-up waits instead)."""
        rtt = self.rtt[r]
        if busy:
            self.busy[r] += trips * rtt
        if rtt > 0:
            yield self.sim.delay((trips - 0.5) * rtt)
        out = op()
        if rtt > 0:
            yield self.sim.delay(rtt / 2)
        return out

    def put(self, r: int, op) -> None:
        """A store ``set`` of rank ``r``: torch's ``TCPStore.set`` sends the request and returns
        without an answer (the rank goes on at once), and ``op`` takes effect when the request
        reaches the store, half a round trip later (after every earlier call of the rank: one
        TCP stream)."""
        half = self.rtt[r] / 2
        if half > 0:
            self.sim.at(self.sim.now + half, op)
        else:
            op()

    def _cas(self, key: int, old, new) -> bool:
        if self.state[key] == old:
            self.state[key] = new
            return True
        return False

    def _retire_at_store(self, r: int):
        """``compare_set(own key, avail, done)`` at the store: the value it found."""
        found = self.state[r]
        self._cas(r, "avail", "done")
        return found

    def _set_state(self, r: int, value) -> None:
        self.state[r] = value

    def pick(self, r: int):
        """The claimer's pick (``Pairing._pick``): its own key available -> busy, a look at each
        candidate's published speed, then available -> claim on the candidates in random order
        until one succeeds; its own key back to available where nobody was claimed (a set).
        Its calls reach the store as one step, half a round trip after the rank sent the first
        (the model checker's steps are atomic too): two picks that overlap resolve to one
        claim, as they do in a real run, whose timings never repeat exactly, where two exactly
        equal simulated ranks would fail each other's claims at every boundary. The rank waits
        a round trip per call (two per get), and takes the exchange as its own once the last
        answer is back. Where it claimed nobody, its key stays ``busy`` (nobody can claim it)
        until the set that makes it available again, sent after the last answer, reaches the
        store: across a 5 ms link a pick that finds nobody (a get of its own key's claim, a
        compare-and-set, a get of the candidate's speed) holds it busy for three round trips."""
        calls, claimed, released = [1], [], []

        def at_store() -> None:
            if not self._cas(r, "avail", "busy"):
                return  # claimed meanwhile: served at its next boundary
            cands = self.candidates(r)
            calls[0] += GET_TRIPS * len(cands)  # each candidate's published speed: a get
            order = [c for c in cands if self.not_faster(r, self.published[c])]
            self.rngs[r].shuffle(order)
            xid = f"{r}.{self.claims[r]}"
            for c in order:
                calls[0] += 1
                if self._cas(c, "avail", ("claim", r, xid)):
                    self.claims[r] += 1
                    claimed.append(_Exchange(c, xid, True))
                    return
            released.append(True)  # nobody available: its key back to available (a set)

        yield from self.call(r, at_store)
        more = (calls[0] - 1) * self.rtt[r]
        if more > 0:
            self.busy[r] += more
            yield self.sim.delay(more)
        if claimed:
            self.pending[r] = claimed[0]
        elif released:  # sent once the last answer is back: the key was busy until it lands
            self.put(r, lambda: self._set_state(r, "avail"))

    def serve_claim(self, r: int, value) -> _Exchange | None:
        """``value``, what rank ``r`` read of its own key: a claim is answered by setting the
        key ready (``Pairing._serve``)."""
        if not (isinstance(value, tuple) and value[0] == "claim"):
            return None
        ready = ("ready", value[1], value[2])
        self.put(r, lambda: self._set_state(r, ready))
        return _Exchange(value[1], value[2], False)

    def at_boundary(self, r: int, want: bool, busy: bool = True):
        """``Pairing.at_boundary``: the exchange to perform now, or None."""
        x = self.pending[r]
        if x is not None:  # a look at the partner's key
            ready = ("ready", r, x.xid)
            seen = yield from self.call(r, lambda: self.state[x.partner] == ready, busy, GET_TRIPS)
            return x if seen else None
        if self.pickable(r):  # a look at its own key
            value = yield from self.call(r, lambda: self.state[r], busy, GET_TRIPS)
            served = self.serve_claim(r, value)
            if served is not None:
                return served
        if want and self.candidates(r):
            yield from self.pick(r)
        return None

    def _swap_done(self, xid: str):
        """When each side of exchange ``xid`` is done (``Cluster.exchange_done``: between
        hosts, who came in first matters)."""

        def done(first_s: float, second_s: float) -> tuple[float, float]:
            first, second = self.sides[xid]
            return self.cluster.exchange_done(first, second, self.sync_bytes, first_s, second_s)

        return done

    def serve(self, r: int, x: _Exchange):
        sim = self.sim
        t = sim.now
        self.sides.setdefault(x.xid, []).append(r)
        yield self.meet[x.xid].arrive()
        self.wait[r] += sim.now - t
        if x.initiated:
            self.pending[r] = None
            self.log.append((sim.now, r, x.partner))
            self.moved[0] += 2 * self.sync_bytes
            self.moved[1] += 2 * self.sync_bytes * self.cluster.crosses(r, x.partner)
        self.put(r, lambda: self._set_state(r, "avail"))  # its key back to available

    def record_step(self, r: int, seconds: float) -> None:
        steps, step_avg = self.steps, self.step_avg
        step_avg[r] = seconds if steps[r] == 0 else 0.8 * step_avg[r] + 0.2 * seconds
        if steps[r] % 4 == 0:  # a store set: the rank does not wait for it
            avg = step_avg[r]
            self.put(r, lambda: self.published.__setitem__(r, avg))
        steps[r] += 1

    def rank(self, r: int):
        yield from self.train(r)
        yield from self.retire(r)
        t = self.sim.now
        yield self.final.arrive()
        self.wait[r] += self.sim.now - t

    def train(self, r: int):
        """Rank ``r`` takes subgraphs from the pool until it is empty, pairing at the steps'
        boundaries."""
        stragglers, every = self.stragglers, self.every
        straggler = stragglers.for_rank(r)
        since, paused = 0, False
        while self.counter[0] < self.total:
            pos = self.counter[0]
            self.counter[0] += 1
            c = self.position_s[pos]
            if self.position_part is not None and self.first_extra_s is not None:
                part = self.position_part[pos]
                if part not in self.seen[r]:
                    self.seen[r].add(part)
                    c += self.first_extra_s[part]
            c = stragglers.resumed(c, paused, self.speed[r])
            self.compute[r] += c
            pause = stragglers.pause_s(straggler, c)
            paused = pause > 0
            c += pause + self.overhead[r]
            self.busy[r] += c
            self.batches[r] += 1
            yield self.sim.delay(c)
            since += 1
            x = yield from self.at_boundary(r, since >= every - 1)
            while x is not None:
                yield from self.serve(r, x)
                since = 0
                x = (yield from self.at_boundary(r, every == 1)) if x.initiated else None
            self.record_step(r, c)

    def retire(self, r: int):
        """Rank ``r``'s clean-up (``Pairing.retire``): its pick first (a look at the partner's
        key every ``poll_s``), then claims on it, then it retires (available -> done)."""
        sim = self.sim
        while True:
            x = self.pending[r]
            if x is not None:
                t = sim.now
                while (yield from self.at_boundary(r, False, busy=False)) is None:
                    yield sim.delay(self.poll_s)
                self.wait[r] += sim.now - t
                yield from self.serve(r, x)
                continue
            # compare-and-set of its own key, available -> done: the value it found
            found = yield from self.call(r, lambda: self._retire_at_store(r))
            if found == "avail":
                break
            x = self.serve_claim(r, found)
            if x is None:
                raise RuntimeError(f"simulated rank {r} retiring in state {found!r}")
            yield from self.serve(r, x)


def schedule_ops(schedule: str, stage: int, stages: int, chunks: int) -> list[tuple[str, int]]:
    """The order in which one stage runs its forwards ("F", m) and backwards ("B", m)."""
    if schedule == "gpipe":
        return [("F", m) for m in range(chunks)] + [("B", m) for m in range(chunks)]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}")
    warmup = min(chunks, stages - stage)
    ops = [("F", m) for m in range(warmup)]
    f, b = warmup, 0
    while True:
        ops.append(("B", b))
        b += 1
        if f == chunks:
            break
        ops.append(("F", f))
        f += 1
    ops += [("B", m) for m in range(b, chunks)]
    return ops


def pipeline(
    cluster: Cluster,
    fwd: Sequence[Sequence[float]],
    bwd: Sequence[Sequence[float]],
    act_bytes: Sequence[float],
    steps: int,
    schedule: str = "gpipe",
    opt_s: Sequence[float] | None = None,
    replicas: int = 1,
    grad_bytes: Sequence[float] | None = None,
    steps_per_epoch: int = 1,
    first_step_extra_s: float = 0.0,
) -> SimResult:
    """``fwd[s][m]``, ``bwd[s][m]``: seconds of micro-batch ``m`` on stage ``s`` (each copy
    runs the same); ``act_bytes[s]``: one micro-batch's activation from stage ``s`` to ``s + 1``
    (its gradient goes back with the same size); ``steps``: pipeline steps in the run;
    ``steps_per_epoch``: how many of them make an epoch (graphs: one; ViG: one per mini-batch),
    which only groups the steps' end times into epoch times (no barrier between epochs);
    ``opt_s[s]``: the optimizer step of stage ``s``; ``grad_bytes[s]``: the gradients stage
    ``s`` all-reduces over the copies; ``first_step_extra_s``: what the run's first step takes
    beyond the others (torch.distributed.pipelining's set-up on first use), charged once
    before the first stage's first forward, so every stage waits for it. Rank
    ``replica * S + s`` holds stage ``s`` of copy ``replica``."""
    S = len(fwd)
    world = replicas * S
    if world != cluster.world:
        raise ValueError(f"{replicas} copies x {S} stages need {world} ranks, not {cluster.world}")
    if steps_per_epoch < 1 or steps % steps_per_epoch:
        raise ValueError(f"{steps} steps are not whole epochs of {steps_per_epoch} steps")
    run = _PipelineRun(
        cluster, fwd, bwd, act_bytes, steps, schedule, opt_s or [0.0] * S, replicas, grad_bytes
    )
    procs = [
        run.sim.start(run.stage(q, s, first_step_extra_s))
        for q in range(replicas)
        for s in range(S)
    ]
    _run(run.sim, procs, "pipeline")
    return run.result(steps_per_epoch)


class _PipelineRun:
    """The state of one :func:`pipeline` simulation: the point-to-point messages between stages
    (:meth:`send`, :meth:`receive`, delivered by :meth:`deliver` once both sides are in), one
    stage's schedule (:meth:`stage`) and the result (:meth:`result`)."""

    def __init__(
        self,
        cluster: Cluster,
        fwd: Sequence[Sequence[float]],
        bwd: Sequence[Sequence[float]],
        act_bytes: Sequence[float],
        steps: int,
        schedule: str,
        opt_s: Sequence[float],
        replicas: int,
        grad_bytes: Sequence[float] | None,
    ) -> None:
        self.cluster, self.fwd, self.bwd, self.act_bytes = cluster, fwd, bwd, act_bytes
        self.steps, self.schedule, self.opt_s = steps, schedule, opt_s
        self.replicas, self.grad_bytes = replicas, grad_bytes
        self.S, self.M = len(fwd), len(fwd[0])
        S, world = self.S, replicas * self.S
        self.world = world
        self.sim = sim = Sim()
        self.arrive = _Keyed(lambda key: Event(sim))  # ("F"|"B", copy, step, stage, m)
        self.dp = _Keyed(
            lambda key: Rendezvous(
                sim,
                replicas,
                cluster.allreduce_s(grad_bytes[key[1]], [q * S + key[1] for q in range(replicas)]),
                cluster.wake_s,
            )
        )
        self.ends = [[0.0] * steps for _ in range(world)]
        self.busy, self.wait = [0.0] * world, [0.0] * world
        self.moved = [0.0, 0.0]
        self.sent: dict[tuple, tuple] = {}  # message -> (sent at, sender, receiver, bytes)
        self.posted: dict[tuple, float] = {}  # message -> when its receiver posted the receive
        self.free: dict[tuple[int, int], float] = {}  # (sender, receiver) -> connection free from

    def deliver(self, key: tuple) -> None:
        """Schedule a message's arrival once it is both sent and its receive posted."""
        if key not in self.sent or key not in self.posted:
            return
        t, a, b, nbytes = self.sent.pop(key)
        at, self.free[a, b] = self.cluster.p2p_delivery(
            a, b, nbytes, t, self.posted.pop(key), self.free.get((a, b), 0)
        )
        self.arrive[key].succeed(delay=at - self.sim.now)

    def send(self, kind: str, q: int, i: int, src: int, dst: int, m: int, nbytes: float) -> None:
        a, b = q * self.S + src, q * self.S + dst
        key = (kind, q, i, dst, m)
        self.sent[key] = (self.sim.now, a, b, nbytes)
        self.deliver(key)
        self.moved[0] += nbytes
        self.moved[1] += nbytes * self.cluster.crosses(a, b)

    def receive(self, kind: str, q: int, i: int, s: int, m: int) -> Event:
        key = (kind, q, i, s, m)
        self.posted[key] = self.sim.now
        self.deliver(key)
        return self.arrive[key]

    def stage(self, q: int, s: int, first_step_extra_s: float):
        """Stage ``s`` of copy ``q``: its schedule's operations, step after step, each step
        ended by the copies' gradient all-reduce (hybrid) and the optimizer step."""
        sim, S, r = self.sim, self.S, q * self.S + s
        busy, wait = self.busy, self.wait
        ops = schedule_ops(self.schedule, s, S, self.M)
        if s == 0 and first_step_extra_s > 0:
            busy[r] += first_step_extra_s
            yield sim.delay(first_step_extra_s)
        for i in range(self.steps):
            for kind, m in ops:
                t = sim.now
                if kind == "F" and s > 0:
                    yield self.receive("F", q, i, s, m)
                if kind == "B" and s < S - 1:
                    yield self.receive("B", q, i, s, m)
                wait[r] += sim.now - t
                c = self.fwd[s][m] if kind == "F" else self.bwd[s][m]
                busy[r] += c
                yield sim.delay(c)
                if kind == "F" and s < S - 1:
                    self.send("F", q, i, s, s + 1, m, self.act_bytes[s])
                if kind == "B" and s > 0:
                    self.send("B", q, i, s, s - 1, m, self.act_bytes[s - 1])
            if self.replicas > 1:
                t = sim.now
                yield self.dp["dp", s, i].arrive()
                wait[r] += sim.now - t
            yield sim.delay(self.opt_s[s])
            busy[r] += self.opt_s[s]
            self.ends[r][i] = sim.now

    def result(self, steps_per_epoch: int) -> SimResult:
        """The run's figures: the copies' gradient bytes added to the activations moved, the
        steps' end times grouped into epochs."""
        S, steps, world, moved = self.S, self.steps, self.world, self.moved
        n = 0
        if self.replicas > 1:
            for s in range(S):
                group = [q * S + s for q in range(self.replicas)]
                a, b = self.cluster.allreduce_bytes(self.grad_bytes[s], group)
                moved[0] += a * steps
                moved[1] += b * steps
                n += steps
        last = [max(self.ends[r][i] for r in range(world)) for i in range(steps)]
        last = last[steps_per_epoch - 1 :: steps_per_epoch]  # where each epoch ends
        epoch_s = [last[0]] + [last[e] - last[e - 1] for e in range(1, len(last))]
        batches = [steps * self.M] * world
        return SimResult(epoch_s, max(last), batches, self.busy, self.wait, n, moved[0], moved[1])


# ---------------------------------------------------------------- sampled DDP
def sampled(
    cluster: Cluster,
    steps_per_epoch: int,
    epochs: int,
    compute_s: float | Sequence[float],
    sample_s: float | Sequence[float],
    loader_workers: int,
    grad_bytes: float,
    stragglers: Stragglers = NONE,
    prefetch: int = 2,
    start_s: float = 0.0,
    speed: Sequence[float] | None = None,
) -> SimResult:
    """``compute_s``: forward, backward and optimizer step of one batch; ``sample_s``: making
    one batch (sampling and feature gather) in one thread; either a number or one value per
    step of the run (``steps_per_epoch * epochs``). ``start_s``: what each batch maker (a
    loader worker, or the rank itself with ``W = 0``) spends before its first batch (starting
    the worker, mapping the graph, building the sampler); training time, since the loop's
    first batch waits for it. ``speed``: per rank, a factor on its steps and batch making (1).
    As in the loop, DDP's all-reduce ends the backward, and a straggler pauses after it (the
    other ranks go on to their next batch meanwhile). ``compute_s`` of the result: each rank's
    steps and, with ``W = 0``, its own batch making, without pauses."""
    world, total = cluster.world, steps_per_epoch * epochs
    speed = list(speed) if speed is not None else [1.0] * world

    def per_step(v):
        return [float(v)] * total if isinstance(v, int | float) else list(v)

    run = _SampledRun(
        cluster, steps_per_epoch, epochs, per_step(compute_s), per_step(sample_s),
        loader_workers, grad_bytes, stragglers, prefetch, start_s, speed,
    )  # fmt: skip
    procs = [run.sim.start(run.rank(r)) for r in range(world)]
    _run(run.sim, procs, "sampled training")
    return run.result()


class _SampledRun:
    """The state of one :func:`sampled` simulation: a rank's loader workers (:meth:`loader`), the
    rank's steps (:meth:`rank`) and the result (:meth:`result`)."""

    def __init__(
        self,
        cluster: Cluster,
        steps_per_epoch: int,
        epochs: int,
        comp: list[float],
        samp: list[float],
        loader_workers: int,
        grad_bytes: float,
        stragglers: Stragglers,
        prefetch: int,
        start_s: float,
        speed: list[float],
    ) -> None:
        world = cluster.world
        self.cluster, self.world, self.steps_per_epoch, self.epochs = (
            cluster, world, steps_per_epoch, epochs,
        )  # fmt: skip
        self.total, self.W = steps_per_epoch * epochs, loader_workers
        self.comp, self.samp, self.grad_bytes, self.stragglers = comp, samp, grad_bytes, stragglers
        self.prefetch, self.start_s, self.speed = prefetch, start_s, speed
        self.sim = sim = Sim()
        # DDP's all-reduce, gloo's
        self.cost = cost = cluster.allreduce_s(grad_bytes, pairs=False) if world > 1 else 0.0
        self.meet = _Keyed(lambda key: Rendezvous(sim, world, cost, cluster.wake_s))
        self.ends = [[0.0] * epochs for _ in range(world)]
        self.busy, self.wait, self.compute = [0.0] * world, [0.0] * world, [0.0] * world

    def loader(self, r: int, w: int, dispatched: _Keyed, ready: _Keyed):
        """Worker ``w`` of rank ``r``'s DataLoader: batches ``w``, ``w + W``, ... once each
        is dispatched."""
        sim = self.sim
        yield sim.delay(self.start_s)
        for i in range(w, self.total, self.W):
            yield dispatched[r, i]
            yield sim.delay(self.samp[i] * self.speed[r])
            ready[r, i].succeed()

    def rank(self, r: int):
        """Rank ``r``'s steps: take (or make) a batch, compute, meet the others at DDP's
        all-reduce, pause if a straggler."""
        sim, W, total, prefetch = self.sim, self.W, self.total, self.prefetch
        stragglers, speed, compute, busy, wait = (
            self.stragglers, self.speed, self.compute, self.busy, self.wait,
        )  # fmt: skip
        straggler = stragglers.for_rank(r)
        paused = False
        dispatched = _Keyed(lambda key: Event(sim))
        ready = _Keyed(lambda key: Event(sim))
        if W:
            for i in range(min(total, prefetch * W)):
                dispatched[r, i].succeed()
            for w in range(W):
                sim.start(self.loader(r, w, dispatched, ready))
        for i in range(total):
            t = sim.now
            if W:
                yield ready[r, i]
                if i + prefetch * W < total:
                    dispatched[r, i + prefetch * W].succeed()
            else:  # the rank makes its batch: after a pause, cold too
                made = stragglers.resumed(self.samp[i], paused, speed[r])
                compute[r] += made
                yield sim.delay(made + (self.start_s if i == 0 else 0.0))
            wait[r] += sim.now - t
            c = stragglers.resumed(self.comp[i], paused, speed[r])
            compute[r] += c
            busy[r] += c
            yield sim.delay(c)
            if self.world > 1:
                t = sim.now
                yield self.meet[i].arrive()
                wait[r] += sim.now - t - self.cost
            pause = stragglers.pause_s(straggler, c)
            paused = pause > 0
            busy[r] += pause
            yield sim.delay(pause)
            if (i + 1) % self.steps_per_epoch == 0:
                self.ends[r][(i + 1) // self.steps_per_epoch - 1] = sim.now

    def result(self) -> SimResult:
        world, epochs, total = self.world, self.epochs, self.total
        last = [max(self.ends[r][e] for r in range(world)) for e in range(epochs)]
        epoch_s = [last[0]] + [last[e] - last[e - 1] for e in range(1, epochs)]
        moved, between = self.cluster.allreduce_bytes(self.grad_bytes)
        n = total if world > 1 else 0
        return SimResult(
            epoch_s, max(last), [total] * world, self.busy, self.wait, n, moved * n,
            between * n, [], self.compute,
        )  # fmt: skip
