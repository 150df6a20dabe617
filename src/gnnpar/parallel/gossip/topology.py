"""Who may pick whom as a gossip partner.

``AnyPeer`` is GossipGCN's topology (study 003 algorithm 6): every rank may pick any other rank.
``Bipartite`` is study 003 algorithm 5 (after Jin et al. 2016): the ranks are split into an
active half, which picks partners, and a passive half, which is only ever picked. Because an
active rank only waits on passive ranks and a passive rank never waits on anybody, a cycle of
waits cannot form even without the claim protocol; the price is fewer choices of partner.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int

    @property
    def initiates(self) -> bool:
        """Does this rank start exchanges (pick partners)?"""
        return bool(self.candidates())

    @property
    def pickable(self) -> bool:
        """Can other ranks pick this rank (so it must check for claims every step)?"""
        raise NotImplementedError

    @property
    def others(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    def candidates(self) -> list[int]:
        raise NotImplementedError


class AnyPeer(Topology):
    name = "any"

    @property
    def pickable(self) -> bool:
        return self.world_size > 1

    def candidates(self) -> list[int]:
        return self.others


class Bipartite(Topology):
    """Ranks ``0 .. p//2 - 1`` are active, the rest passive (an odd rank count leaves one more
    passive rank than active ones)."""

    name = "bipartite"

    @property
    def active(self) -> list[int]:
        return list(range(self.world_size // 2))

    @property
    def passive(self) -> list[int]:
        return list(range(self.world_size // 2, self.world_size))

    @property
    def pickable(self) -> bool:
        return self.rank in self.passive

    def candidates(self) -> list[int]:
        return self.passive if self.rank in self.active else []
