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

    def restore(self, counter: int) -> None:
        raise RuntimeError("a work pool across shards is not restored from a checkpoint")
