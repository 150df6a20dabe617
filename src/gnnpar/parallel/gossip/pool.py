"""The shared work pool of GossipGCN (study 003 section 4.3.2): every subgraph once per epoch.

The study keeps a multiprocessing queue ``[perm_0, perm_1, ..., perm_{e-1}]`` of subgraph indices
(each index once per epoch, ``e`` epochs back to back) and every worker pops the next index when
it is free, so fast workers train more subgraphs. A queue in one process's memory does not reach
other machines, so here the queue is virtual: the order of every epoch is a permutation that all
ranks compute from the same seed, and the only shared state is one counter in the process
group's TCP store. ``store.add(key, 1)`` is atomic, so each queue position is handed to exactly
one rank: nothing lost, nothing twice, whatever the ranks' speeds.
"""

from __future__ import annotations

import torch


class WorkPool:
    """``take()`` -> (position, epoch, subgraph index), or None once all ``epochs * size`` positions
    are handed out."""

    def __init__(self, store, key: str, size: int, epochs: int, seed: int) -> None:
        self.store, self.key = store, key
        self.size, self.epochs, self.seed = size, epochs, seed
        self._orders: dict[int, list[int]] = {}

    @property
    def total(self) -> int:
        return self.size * self.epochs

    def order(self, epoch: int) -> list[int]:
        """The epoch's order: a permutation every rank derives from (seed, epoch) alone."""
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders[epoch] = torch.randperm(self.size, generator=g).tolist()
        return self._orders[epoch]

    def take(self) -> tuple[int, int, int] | None:
        pos = self.store.add(self.key, 1) - 1  # atomic: the value before our increment is ours
        if pos >= self.total:
            return None
        epoch, offset = divmod(pos, self.size)
        return pos, epoch, self.order(epoch)[offset]

    def restore(self, counter: int) -> None:
        """A resumed run: the positions below ``counter`` were handed out before (its store is
        fresh, so the counter is raised from 0)."""
        self.store.add(self.key, counter - self.store.add(self.key, 0))

    def handed_out(self) -> int:
        """How many positions were taken so far (for the progress display; add 0 reads)."""
        return min(self.store.add(self.key, 0), self.total)

    def state(self) -> dict:
        """At a checkpoint (no rank takes meanwhile): the one counter."""
        return {"counter": self.handed_out()}

    def load_state(self, state: dict, lead: bool) -> None:
        """On resume, before any rank takes: the ``lead`` rank alone raises the counter (a
        relative add: two ranks doing it would count twice)."""
        if lead:
            self.restore(state["counter"])


class ShardedPool:
    """The work pool across shards: one pool per host (its shard's parts, each epoch in an
    order every rank derives from (seed, epoch, host)), one counter per (epoch, host) in the
    store. A rank takes from its own host's pool first, where its subgraphs are local, then
    from the other hosts' pools in turn (fetching what it takes: gnnpar.parallel.fetch). Each
    counter's ``add`` is atomic, so every position of every pool, and so every subgraph, is
    handed out exactly once per epoch; a rank moves to epoch e + 1 only once every pool of epoch
    e is empty, as the one pool's epochs follow each other. ``take()`` -> (position, epoch,
    global part id) or None, as :meth:`WorkPool.take`."""

    def __init__(self, store, key: str, parts: list[list[int]], host: int, epochs: int, seed: int):
        self.store, self.key, self.parts, self.host = store, key, parts, host
        self.epochs, self.seed = epochs, seed
        self.size = sum(len(p) for p in parts)
        self._orders: dict[tuple[int, int], list[int]] = {}
        self._epoch, self._empty = 0, set()  # the epoch this rank takes from; its empty pools
        n = len(parts)
        self._visit = [(host + i) % n for i in range(n)]  # own pool first

    @property
    def total(self) -> int:
        return self.size * self.epochs

    def order(self, epoch: int, h: int) -> list[int]:
        if (epoch, h) not in self._orders:
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1009 + h)
            perm = torch.randperm(len(self.parts[h]), generator=g).tolist()
            self._orders[(epoch, h)] = [self.parts[h][i] for i in perm]
        return self._orders[(epoch, h)]

    def take(self) -> tuple[int, int, int] | None:
        while self._epoch < self.epochs:
            for h in self._visit:
                if h in self._empty:
                    continue
                pos = self.store.add(f"{self.key}/{self._epoch}/{h}", 1) - 1
                if pos < len(self.parts[h]):
                    handed = self.store.add(f"{self.key}/handed", 1) - 1
                    return handed, self._epoch, self.order(self._epoch, h)[pos]
                self._empty.add(h)
            self._epoch, self._empty = self._epoch + 1, set()
        return None

    def handed_out(self) -> int:
        return min(self.store.add(f"{self.key}/handed", 0), self.total)

    def state(self) -> dict:
        """At a checkpoint, taken once every rank has stopped taking (the loop's barrier): where
        this rank takes next (its epoch, the pools of it it found empty) and the counters of
        every pool from its epoch on. Earlier epochs' pools are empty (a rank leaves an epoch
        only once it found every pool of it empty); the first epoch whose counters are all 0
        ends the list (no rank reached it, so none reached a later one)."""
        counters: list[list[int]] = []
        for e in range(self._epoch, self.epochs):
            row = [self.store.add(f"{self.key}/{e}/{h}", 0) for h in range(len(self.parts))]
            if not any(row):
                break
            counters.append(row)
        handed = self.store.add(f"{self.key}/handed", 0)
        return {"epoch": self._epoch, "empty": sorted(self._empty), "counters": counters,
                "handed": handed}  # fmt: skip

    def load_state(self, state: dict, lead: bool) -> None:
        """On resume, before any rank takes (the loop's barrier after loading): every rank
        restores its place and sets the counters it will read, from its epoch on, to what they
        were. Every rank's state was read from the same final store, so where two ranks set
        the same counter they set the same value (a ``set``, not an add: nothing counts
        twice); ``lead`` is not needed."""
        self._epoch, self._empty = state["epoch"], set(state["empty"])
        for e, row in enumerate(state["counters"], start=self._epoch):
            for h, n in enumerate(row):
                self.store.set(f"{self.key}/{e}/{h}", str(n))
        self.store.set(f"{self.key}/handed", str(state["handed"]))
