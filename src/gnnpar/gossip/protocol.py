"""How two ranks agree to exchange: a claim protocol on the process group's key-value store.

Study 003 algorithm 6 keeps two shared arrays behind locks, ``available_workers`` and
``gossip_partner``. Here each rank ``r`` owns one store key, ``state/r``, whose value is

* ``avail``: training, and may be picked (the study's "in available_workers, partner -1");
* ``busy``: this rank is itself looking for a partner or exchanging: nobody may pick it;
* ``claim:A:X``: rank A picked this rank for exchange X; A is waiting for it;
* ``done``: out of work and retired (the study's clean-up step): nobody may pick it any more.

Every change of another rank's state is one atomic ``compare_set`` (compare-and-swap) on the
store, so the two arrays and their locks collapse into one atomic step per claim:

* a rank that wants to exchange first turns its own ``avail`` into ``busy``; if that fails
  somebody has claimed it already, and it serves that claim instead (the study's "partner
  already waiting for it", line 30);
* then it tries ``avail -> claim:me:X`` on the candidates of its topology in random order (a
  uniformly random available partner, line 23) and, on success, waits for the partner;
* every rank that can be picked reads its own key once per training step, at the same point of
  the step where it would itself exchange, and serves a claim it finds there; so a claimer waits
  for at most one step of its partner, not for the partner's next averaging point as in the
  study (which, with a 3x straggler, makes the fast rank idle for up to K slow steps);
* a rank whose work pool is empty retires with ``avail -> done``; if that fails, a claim is
  pending: it serves it with its last gradients or parameters (the study's clean-up, lines
  45-54) and tries again.

Deadlock freedom (study lemma 1). Rank A waits for rank B only while ``state/B == claim:A:X``,
which A set itself from ``avail``. While B is ``avail`` it is not waiting for anybody: a rank
waits only when ``busy`` (its claim succeeded) and nobody can claim a ``busy`` rank. Only B moves
its state away from ``claim:A:X``, and only after serving A. So the wait-for graph has edges
``A -> B`` only from a waiting rank to a training (non-waiting) one: a waiting rank has no
incoming edge, a path has length one, and no cycle (the necessary condition for deadlock) can
form. The store operations themselves are single atomic requests, so there is no lock order to
get wrong. Nobody can be paired with itself (the candidates exclude the rank) or with two
partners at once (a claimed state is no longer ``avail``, so a second claim fails).

Termination (study lemma 2). A claimed rank B is training (finite: the pool is finite) and reads
its key at the end of every step, or it is in its clean-up loop, which serves every claim before
``avail -> done`` can succeed. Either way B serves A after at most one of its steps; after
``done`` no new claim can succeed, so the clean-up loop ends once the claims made before it are
served (each rank makes at most one claim at a time, so there are at most ``p - 1``). If B
crashes or stalls, A's exchange times out (``--timeout``) with an error naming B, so a fault
ends the run instead of hanging it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gnnpar.gossip.topology import Topology

AVAIL, BUSY, DONE = b"avail", b"busy", b"done"


@dataclass(frozen=True)
class Exchange:
    partner: int
    xid: str  # "<claimer rank>.<claimer's counter>": the same on both sides of an exchange
    initiated: bool  # True on the claimer's side


def _parse_claim(value: bytes) -> tuple[int, str] | None:
    if not value.startswith(b"claim:"):
        return None
    _, rank, xid = value.decode().split(":")
    return int(rank), xid


class Pairing:
    """This rank's side of the claim protocol (see the module docstring for the proof)."""

    def __init__(self, store, prefix: str, topology: Topology, rng: random.Random) -> None:
        self.store, self.prefix, self.topology, self.rng = store, prefix, topology, rng
        self.rank = topology.rank
        self._claims = 0

    def key(self, rank: int) -> str:
        return f"{self.prefix}/state/{rank}"

    def open(self) -> None:
        """Mark this rank available; every rank must call this before anybody claims (barrier)."""
        self.store.set(self.key(self.rank), AVAIL)

    def poll(self) -> Exchange | None:
        """A claim on this rank waiting to be served, if any (one store read)."""
        if not self.topology.pickable:
            return None
        return self._as_claim(self.store.get(self.key(self.rank)))

    def initiate(self) -> Exchange | None:
        """Pick a random available partner, or take the claim already made on this rank."""
        me = self.key(self.rank)
        now = self.store.compare_set(me, AVAIL, BUSY)
        if now != BUSY:
            return self._as_claim(now)
        order = list(self.topology.candidates())
        self.rng.shuffle(order)
        for cand in order:
            xid = f"{self.rank}.{self._claims}"
            claim = f"claim:{self.rank}:{xid}".encode()
            if self.store.compare_set(self.key(cand), AVAIL, claim) == claim:
                self._claims += 1
                return Exchange(cand, xid, initiated=True)
        self.store.set(me, AVAIL)  # nobody available: keep training, try again next step
        return None

    def finish(self) -> None:
        """After an exchange (either side): available again. Only the owner leaves busy/claim."""
        self.store.set(self.key(self.rank), AVAIL)

    def retire(self) -> Exchange | None:
        """Out of work: become ``done``, or return the claim that must be served first."""
        now = self.store.compare_set(self.key(self.rank), AVAIL, DONE)
        if now == DONE:
            return None
        claim = self._as_claim(now)
        if claim is None:  # a programming error: only the owner sets busy, and it reset it
            raise RuntimeError(f"rank {self.rank} retiring in unexpected gossip state {now!r}")
        return claim

    def _as_claim(self, value: bytes) -> Exchange | None:
        parsed = _parse_claim(value)
        return None if parsed is None else Exchange(parsed[0], parsed[1], initiated=False)
