"""How two ranks agree to exchange: a claim protocol on the process group's key-value store.

Study 003 algorithm 6 keeps two shared arrays behind locks, ``available_workers`` and
``gossip_partner``. Here each rank ``r`` owns one store key, ``state/r``, whose value is

* ``avail``: training, and may be picked (the study's "in available_workers, partner -1");
* ``busy``: this rank has picked a partner and that exchange has not happened yet: nobody may
  pick it;
* ``claim:A:X``: rank A picked this rank for exchange X (the study's ``gossip_partner[r] = A``);
* ``ready:A:X``: this rank has reached a step boundary and is waiting inside exchange X for A;
* ``done``: out of work and retired (the study's clean-up step): nobody may pick it any more.

Only the owner of a key changes it, except for one move: a claimer turns ``avail`` into
``claim:A:X`` with one atomic ``compare_set`` (compare-and-swap) on the store. So the study's two
arrays and their locks collapse into one atomic step per claim, and there is no lock order to
get wrong. At every step boundary (after backward for ``--average grads``, after the optimizer
step for ``--average params``) a rank does one of:

1. its key says ``claim:A:X``: it sets ``ready:A:X`` and exchanges with A (the study's "partner
   already waiting for it", line 30);
2. it has picked B and B's key says ``ready:me:X``: it exchanges with B;
3. it is due to average and has picked nobody: it turns its own ``avail`` into ``busy``
   (failing means case 1 applies), tries ``avail -> claim:me:X`` on its topology's candidates
   in random order (a uniformly random available partner, line 23), and keeps training either
   way. Since the exchange then happens at a later boundary, the strategy picks one step early
   (after ``K - 1`` steps; with K = 1 again right after its own exchange completes), so that
   exchanges land every ``K`` steps.

A rank whose work pool is empty first completes the exchange it started (waiting for its
partner to become ``ready``), then retires with ``avail -> done``; if that fails, a claim is
pending and it serves it with its last gradients or parameters (the study's clean-up, lines
45-54) before trying again.

Who waits differs from the study: there the picker waits at once, until its partner reaches its
next averaging point, so with a 3x straggler and K = 1 the fast rank idles two thirds of the
time and both ranks end up training the same number of subgraphs, as under all-reduce. Here the
picker keeps training and the picked rank, when it arrives, waits for at most one step of the
picker. Ranks publish a moving average of their step time in the store, and a rank picks only
partners whose steps are not much shorter than its own (within 20%): so whoever waits, waits
for about one of its own steps at most, and a straggler is picked by the fast ranks instead of
making them wait for its slow steps. Equal ranks all pick each other; this only narrows the
random choice, so the arguments below are unchanged.

Deadlock freedom (study lemma 1). A rank waits in two situations only. (a) It is ``ready`` for
its claimer A: A is ``busy`` (its claim is pending), so A is never picked, and A is training, or
at a step boundary or in its clean-up, where it finds ``ready`` and exchanges at once; A does not
wait for anybody else. (b) It is in clean-up, waiting for its pick B to become ``ready``: B's key
says ``claim``, so B has no pending pick of its own (picking needs ``avail -> busy`` first, which
a claimed rank fails) and is not ``ready``, i.e. B is not waiting at all; it is training or
retiring, and either way reaches a step boundary or its clean-up, where case 1 applies. So every
edge of the wait-for graph leads to a rank that is not waiting: no cycle, the necessary condition
for deadlock, can form. Nobody is paired with itself (candidates exclude the rank) or with two
partners at once (a claimed or busy rank is no longer ``avail``, so a second claim fails).

Termination (study lemma 2). The pool is finite, so every rank reaches clean-up. By the above,
every wait ends within one step of the awaited rank. A ``done`` rank cannot be picked, so the
retire loop ends once the at most ``p - 1`` claims made on the rank before are served. If a
partner crashes or stalls, the exchange or the wait for ``ready`` times out (``--timeout``) with
an error naming the partner: a fault ends the run instead of hanging it.

Model check. ``protocol.pml`` (next to this file) is this protocol, the work pool and the loop's
use of them as a Promela model; ``tests/parallel/test_gossip_model.py`` has SPIN check it for 2, 3 and 4
ranks (no deadlock, every rank terminates, no rank paired with itself or with two partners at
once, every pool position trained exactly once) and check that mutated models fail. Each store
operation is one atomic step of the model. Code step -> model label:

* ``WorkPool.take`` (``store.add``), ``PoolSource.epoch`` (hold a later epoch's item) -> ``take``
* ``at_boundary`` case 2, ``_if_ready`` (one ``get`` of the partner's key) -> ``ready_poll``
* ``at_boundary`` case 1: ``get`` of our key -> ``serve_get``; ``_serve``'s ``set`` ready
  -> ``serve_ready``
* ``_pick``: ``compare_set(me, AVAIL, BUSY)`` -> ``pick_busy``; ``compare_set(cand, AVAIL,
  claim)`` over the filtered, shuffled candidates -> ``pick_claim``; ``set(me, AVAIL)`` when
  nobody was claimed -> ``pick_release``
* ``GossipSync.serve``: ``exchange_average`` -> ``exchange_send``, ``exchange_recv``;
  ``finish`` (``set(me, AVAIL)``) -> ``finish``; ``boundary``'s re-pick after our own
  exchange -> the jump back to ``at_boundary``
* ``retire``: waiting for our pick's ``ready`` -> ``retire_wait``; ``compare_set(me, AVAIL,
  DONE)`` -> ``retire_done``; serving a claim found there -> ``retire_ready``
* ``GossipSync.finish``'s barrier -> ``barrier``; a checkpoint (``-DCHECKPOINT``):
  ``GossipSync.pause`` -> ``retire``, the checkpoint's barriers -> ``barrier``,
  ``GossipSync.unpause`` (``open``) -> ``unpause``

A change to any of these steps needs the same change in the model (and a passing check).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from gnnpar.parallel.gossip.mixing import GossipTimeoutError
from gnnpar.parallel.gossip.topology import Topology

AVAIL, BUSY, DONE = b"avail", b"busy", b"done"


@dataclass(frozen=True)
class Exchange:
    partner: int
    xid: str  # "<claimer rank>.<claimer's counter>": the same on both sides of an exchange
    initiated: bool  # True on the claimer's side


def _parse(value: bytes, tag: bytes) -> tuple[int, str] | None:
    if not value.startswith(tag + b":"):
        return None
    _, rank, xid = value.decode().split(":")
    return int(rank), xid


class Pairing:
    """This rank's side of the claim protocol (see the module docstring for the proof)."""

    def __init__(
        self, store, prefix: str, topology: Topology, rng: random.Random, timeout_s: float
    ) -> None:
        self.store, self.prefix, self.topology, self.rng = store, prefix, topology, rng
        self.rank = topology.rank
        self.timeout_s = timeout_s  # a pick must be answered within this (one partner step)
        self.pending: Exchange | None = None  # our pick whose exchange has not happened yet
        self._picked_at = 0.0
        self._claims = 0
        self._step_s = 0.0  # moving average of this rank's step time, published for pickers
        self._steps = 0

    def key(self, rank: int) -> str:
        return f"{self.prefix}/state/{rank}"

    def speed_key(self, rank: int) -> str:
        return f"{self.prefix}/step_s/{rank}"

    def open(self) -> None:
        """Mark this rank available; every rank must call this before anybody claims (barrier)."""
        self.store.set(self.speed_key(self.rank), b"0")
        self.store.set(self.key(self.rank), AVAIL)

    def state(self) -> dict:
        """For a checkpoint: claim ids stay unique across a resume, the step time goes on."""
        return {"claims": self._claims, "step_s": self._step_s, "steps": self._steps}

    def load_state(self, state: dict) -> None:
        self._claims, self._step_s, self._steps = state["claims"], state["step_s"], state["steps"]

    def record_step(self, seconds: float, every: int = 4) -> None:
        """Publish this rank's typical step time (every few steps: one store write)."""
        self._step_s = seconds if self._steps == 0 else 0.8 * self._step_s + 0.2 * seconds
        if self._steps % every == 0:
            self.store.set(self.speed_key(self.rank), f"{self._step_s:.6f}".encode())
        self._steps += 1

    def at_boundary(self, want: bool) -> Exchange | None:
        """Called at every step boundary; returns the exchange to perform now, if any.

        ``want``: this rank is due to average (K steps since its last exchange).
        """
        if self.pending is not None:  # case 2: is our pick there yet?
            x = self._if_ready(self.pending)
            if x is None and time.monotonic() - self._picked_at > self.timeout_s:
                raise GossipTimeoutError(
                    f"gossip partner rank {self.pending.partner} never reached exchange "
                    f"{self.pending.xid} within --timeout {self.timeout_s:g} s: it crashed or "
                    "stalled. Check its log, or raise --timeout."
                )
            return x
        if self.topology.pickable:  # case 1: somebody picked us
            served = self._serve(self.store.get(self.key(self.rank)))
            if served is not None:
                return served
        if want and self.topology.initiates:  # case 3
            self._pick()
        return None

    def finish(self, x: Exchange) -> None:
        """After exchange ``x`` (either side): available again."""
        if x.initiated:
            self.pending = None
        self.store.set(self.key(self.rank), AVAIL)

    def retire(self, poll_s: float = 0.001) -> Exchange | None:
        """Out of work: the exchange still to do first, or None once this rank is ``done``."""
        if self.pending is not None:
            while (x := self.at_boundary(want=False)) is None:  # raises once the pick is stale
                time.sleep(poll_s)
            return x
        now = self.store.compare_set(self.key(self.rank), AVAIL, DONE)
        if now == DONE:
            return None
        served = self._serve(now)
        if served is None:  # a programming error: only the owner leaves busy/ready
            raise RuntimeError(f"rank {self.rank} retiring in unexpected gossip state {now!r}")
        return served

    def _pick(self) -> None:
        me = self.key(self.rank)
        if self.store.compare_set(me, AVAIL, BUSY) != BUSY:
            return  # claimed meanwhile: served at the next boundary (case 1)
        order = [c for c in self.topology.candidates() if self._not_faster(c)]
        self.rng.shuffle(order)
        xid = f"{self.rank}.{self._claims}"
        claim = f"claim:{self.rank}:{xid}".encode()
        for cand in order:
            if self.store.compare_set(self.key(cand), AVAIL, claim) == claim:
                self._claims += 1
                self.pending = Exchange(cand, xid, initiated=True)
                self._picked_at = time.monotonic()
                return
        self.store.set(me, AVAIL)  # nobody available: try again at the next boundary

    def _not_faster(self, rank: int, slack: float = 0.8) -> bool:
        """Pick only partners whose steps are not much shorter than ours: the picked rank waits
        for up to one step of the picker, so nobody then waits longer than about its own step."""
        theirs = float(self.store.get(self.speed_key(rank)))
        return theirs == 0.0 or self._step_s == 0.0 or theirs >= slack * self._step_s

    def _serve(self, value: bytes) -> Exchange | None:
        claim = _parse(value, b"claim")
        if claim is None:
            return None
        claimer, xid = claim
        self.store.set(self.key(self.rank), f"ready:{claimer}:{xid}".encode())
        return Exchange(claimer, xid, initiated=False)

    def _if_ready(self, x: Exchange) -> Exchange | None:
        ready = _parse(self.store.get(self.key(x.partner)), b"ready")
        return x if ready == (self.rank, x.xid) else None
