"""What one rank of a sampled run across shards exchanges per step, and how long that takes on
the cluster described: from the profile's frontier sizes (the nodes and sampled edges of each
hop of a batch over the unsharded graph) and the sharded folder's edge cut.

The run (:mod:`gnnpar.data.sampling.distributed`) sends, per hop, the frontier's nodes owned
elsewhere to their owners (ids and the hop's seed) and gets back each node's count and sampled
sources; then, once per step, the batch's feature rows owned elsewhere (ids out, float32 rows
back). Every exchange is an ``all_to_all`` preceded by one of the split sizes, but the feature
rows' answer (the asker knows how many rows it asked each owner for): 4 message rounds per hop
and 3 for the features.

Which share of a hop's nodes is owned elsewhere. With H hosts, a node of hop i+1 is reached by
an edge from a node of hop i; the edge stays on its source's host with probability 1 - c (c:
the edge cut's share of the edges) and crosses to one of the H - 1 others otherwise, so the
chance that a hop's node is on the asking rank's host follows p_{i+1} = p_i (1 - c) +
(1 - p_i) c / (H - 1). gnnpar deals a step's seeds regardless of their owner (the batches
equal one host's over the unsharded graph), so p_0 = 1 / H, which is that recurrence's fixed
point: every hop's remote share is (H - 1) / H, whatever the cut. (Seeds dealt to their owners,
p_0 = 1, would make the cut matter: :func:`remote_shares` takes p_0.) The cut for H hosts is
the prepared folder's, scaled as a random partition's grows, (H - 1) / H, where H differs from
the shards it was prepared with.

By symmetry a rank answers as many bytes as it asks for, so what it sends per step (result.json's
``exchange_bytes_per_step``) is its requests plus the answers of the same size. Cached remote
rows (``--feature-cache``) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ID_BYTES = 8  # int64 ids, counts, sources, seeds and split sizes
ROUNDS_PER_EXCHANGE = 4  # split sizes and request, split sizes and answer


def cut_share(shards: dict[str, Any], hosts: int) -> float:
    """The edge cut's share of the edges for ``hosts`` shards: the prepared folder's
    (``shards``: the profile's record of it) where the counts agree, else scaled as a random
    partition's cut, (H - 1) / H; a random partition's where the folder is not sharded."""
    if hosts < 2:
        return 0.0
    random = (hosts - 1) / hosts
    made, cut = int(shards.get("hosts", 0) or 0), shards.get("edge_cut_share")
    if made < 2 or cut is None:
        return random
    if made == hosts:
        return float(cut)
    return min(1.0, float(cut) * random / ((made - 1) / made))


def remote_shares(hops: int, hosts: int, cut: float, local_first: float | None = None) -> list:
    """Per hop 0..hops (seeds first), the expected share of its nodes owned by another host."""
    if hosts < 2:
        return [0.0] * (hops + 1)
    p = 1.0 / hosts if local_first is None else local_first
    out = []
    for _ in range(hops + 1):
        out.append(1.0 - p)
        p = p * (1.0 - cut) + (1.0 - p) * cut / (hosts - 1)
    return out


@dataclass
class Traffic:
    """One rank's exchange per step: ``bytes_sent`` (requests, answers, split sizes) and
    ``rounds``: the bytes each message round sends to the other ranks, in order."""

    bytes_sent: float
    rounds: list[float]


def traffic(
    nodes_per_hop: list[float],
    edges_per_hop: list[float],
    row_bytes: int,
    hosts: int,
    ranks_per_host: int,
    cut: float,
) -> Traffic:
    """A step's exchange for a batch with ``nodes_per_hop`` new nodes per hop (seeds first:
    one entry more than the hops) and ``edges_per_hop`` sampled edges per hop, feature rows of
    ``row_bytes`` (float32), on ``hosts`` hosts of ``ranks_per_host`` ranks."""
    hops = len(edges_per_hop)
    world = hosts * ranks_per_host
    if hosts < 2:
        return Traffic(0.0, [])
    share = remote_shares(hops, hosts, cut)
    sizes = ID_BYTES * (world - 1)  # one split size per peer
    rounds: list[float] = []
    for i in range(hops):
        ask = ID_BYTES * (share[i] * nodes_per_hop[i] + (world - 1))  # ids and the hop's seed
        answer = ID_BYTES * share[i] * (nodes_per_hop[i] + edges_per_hop[i])  # counts, sources
        rounds += [sizes, ask, sizes, answer]
    n_id = sum(nodes_per_hop)
    remote = sum(s * n for s, n in zip(share, nodes_per_hop, strict=True)) / max(n_id, 1e-9)
    rounds += [sizes, ID_BYTES * remote * n_id, row_bytes * remote * n_id]
    return Traffic(sum(rounds), rounds)


def exchange_s(cluster, t: Traffic) -> float:  # noqa: ANN001 (simulate.Cluster)
    """Seconds a step spends in its exchanges: each round a message to a rank on another host
    (the ranks send to every peer at once; the bytes share the host's link)."""
    if cluster.hosts < 2 or not t.rounds:
        return 0.0
    other = cluster.ranks_per_host  # the first rank of the second host
    return sum(cluster.p2p_s(0, other, b) for b in t.rounds)


def step_traffic(prof, batch_key: str, cluster) -> Traffic:  # noqa: ANN001
    """The profile's batch ``batch_key`` (its frontier sizes) as a step across
    ``cluster.hosts`` shards."""
    b = prof.sampled[batch_key]
    shards = prof.shards
    return traffic(
        b["nodes_per_hop"],
        b["edges_per_hop"],
        int(shards.get("row_bytes", 0)),
        cluster.hosts,
        cluster.ranks_per_host,
        cut_share(shards, cluster.hosts),
    )


def run_bytes(t: Traffic, steps: int, epochs: int, world: int) -> float:
    """What every rank's exchanges send over a run of ``epochs`` x ``steps`` steps: advice's
    network column for a sampled run across shards carries it beside the gradients' all-reduce
    (the requests, answers and split sizes to peers on the same host included: a bound)."""
    return t.bytes_sent * steps * epochs * world
