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
