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
(1 - p_i) c / (H - 1). It depends on how a step's seeds are dealt (``--seeds``,
:func:`seed_deal`):

* ``global`` (the default): seeds regardless of their owner (the batches equal one host's over
  the unsharded graph), so p_0 = 1 / H, which is that recurrence's fixed point: every hop's
  remote share is (H - 1) / H, whatever the cut.
* ``local`` (DistDGL's ``node_split``): a host's ranks take its own training nodes first, so
  p_0 = 1 but for the seeds a host with fewer training nodes than its ranks' share borrows
  (:func:`borrowed_share`), and the cut matters. Not the folder's global cut: the cut seen
  from a host's own seeds, hop by hop (``c_i``, :func:`hop_cuts`), which the profile measures
  on a few batches of each host's own training nodes sampled over the sharded folder
  (``sampled[B]["local"]``: :mod:`gnnpar.advise.profile.seed_deals`); METIS keeps a seed's
  neighbourhood more local than its share of cut edges says. A profile without that record
  takes the folder's cut for every hop.

The cut for H hosts is the prepared folder's, scaled as a random partition's grows, (H - 1) / H,
where H differs from the shards it was prepared with (each hop's cut alike).

By symmetry a rank answers as many bytes as it asks for, so what it sends per step (result.json's
``exchange_bytes_per_step``) is its requests plus the answers of the same size. Cached remote
rows (``--feature-cache``) are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ID_BYTES = 8  # int64 ids, counts, sources, seeds and split sizes
ROUNDS_PER_EXCHANGE = 4  # split sizes and request, split sizes and answer


SEED_DEALS = ("global", "local")  # --seeds (gnnpar.config.schema.SEED_DEALS)


def scaled_cut(cut: float, made: int, hosts: int) -> float:
    """A cut measured on ``made`` shards, for ``hosts``: scaled as a random partition's cut,
    (H - 1) / H, grows."""
    if hosts < 2:
        return 0.0
    if made == hosts or made < 2:
        return float(cut)
    return min(1.0, float(cut) * ((hosts - 1) / hosts) / ((made - 1) / made))


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
    return scaled_cut(cut, made, hosts)


def remote_shares(
    hops: int, hosts: int, cut: float | Sequence[float], local_first: float | None = None
) -> list:
    """Per hop 0..hops (seeds first), the expected share of its nodes owned by another host;
    ``cut``: one share for every hop, or hop i's (``hops`` of them: the edges from hop i's
    nodes to hop i+1's); ``local_first``: the seeds' share on the asking host (None: 1 / H,
    seeds dealt regardless of their owner)."""
    if hosts < 2:
        return [0.0] * (hops + 1)
    cuts = [float(cut)] * hops if isinstance(cut, (int, float)) else [float(c) for c in cut]
    p = 1.0 / hosts if local_first is None else local_first
    out = [1.0 - p]
    for c in cuts[:hops]:
        p = p * (1.0 - c) + (1.0 - p) * c / (hosts - 1)
        out.append(1.0 - p)
    return out


def hop_cuts(shares: Sequence[float], hosts: int) -> list[float]:
    """Each hop's cut ``c_i`` that turns measured remote shares ``r_i`` (hop 0..hops, on
    ``hosts`` shards) into ``r_{i+1}`` through :func:`remote_shares`'s recurrence:
    ``c_i = (p_i - p_{i+1}) / (p_i - (1 - p_i) / (H - 1))``, ``p = 1 - r``. Where ``p_i`` is the
    fixed point already (1 / H: nothing left to tell), a random partition's (H - 1) / H."""
    out = []
    for a, b in zip(shares, shares[1:]):
        p, q = 1.0 - a, 1.0 - b
        den = p - (1.0 - p) / (hosts - 1)
        c = (p - q) / den if den > 1e-9 else (hosts - 1) / hosts
        out.append(min(1.0, max(0.0, c)))
    return out


def borrowed_share(train_per_shard: Sequence[int], hosts: int, ranks_per_host: int) -> float:
    """``--seeds local``: the share of the hosts' seeds that are other hosts' training nodes
    (a host with fewer training nodes than its ranks' share, ``ranks x per_rank`` of
    :func:`~gnnpar.data.sampling.loader.shard_plan`, borrows the rest: :func:`~gnnpar.data.
    sampling.distributed.local_epoch_seeds`), over all hosts; 0 where ``train_per_shard`` is
    not of ``hosts`` shards (another host count: taken as balanced)."""
    if len(train_per_shard) != hosts or hosts < 2:
        return 0.0
    quota = ranks_per_host * (sum(train_per_shard) // (hosts * ranks_per_host))
    if quota <= 0:
        return 0.0
    return sum(max(0, quota - int(n)) for n in train_per_shard) / (hosts * quota)


def seed_deal(
    batch: dict[str, Any], shards: dict[str, Any], hosts: int, ranks_per_host: int, seeds: str
) -> tuple[list[float], list[float], list[float]]:
    """A step under ``--seeds`` ``seeds`` on ``hosts`` hosts: (each hop's remote share, its
    new nodes, its sampled edges) from the profile's ``batch`` (``sampled[B]``) and the sharded
    folder's record ``shards``. ``global``: the profile's batches, (H - 1) / H remote at every
    hop. ``local``: the batches of a host's own seeds and their measured shares (each hop's cut
    scaled to ``hosts``; the borrowed seeds remote), where the profile measured them; their
    frontier scaled to the profile's seeds per batch."""
    if seeds not in SEED_DEALS:
        raise ValueError(f"--seeds {seeds!r}: one of {', '.join(SEED_DEALS)}")
    nodes, edges = list(batch["nodes_per_hop"]), list(batch["edges_per_hop"])
    hops = len(edges)
    if seeds == "global" or hosts < 2:
        return remote_shares(hops, hosts, cut_share(shards, hosts)), nodes, edges
    first = 1.0 - borrowed_share(shards.get("train_per_shard") or [], hosts, ranks_per_host)
    local = batch.get("local")
    if not local:  # a profile from before: the folder's cut for every hop
        return remote_shares(hops, hosts, cut_share(shards, hosts), first), nodes, edges
    made = int(local["hosts"])
    cuts = [scaled_cut(c, made, hosts) for c in hop_cuts(local["remote_per_hop"], made)]
    shares = remote_shares(hops, hosts, cuts, first)
    # as many seeds per step as the profile's batches (a rank's short last batch among them)
    f = nodes[0] / max(float(local["nodes_per_hop"][0]), 1e-9)
    return shares, [n * f for n in local["nodes_per_hop"]], [e * f for e in local["edges_per_hop"]]


@dataclass
class Traffic:
    """One rank's exchange per step: ``bytes_sent`` (requests, answers, split sizes) and
    ``rounds``: the bytes each message round sends to the other ranks, in order."""

    bytes_sent: float
    rounds: list[float]
    remote_shares: list[float] = field(default_factory=list)  # per hop, seeds first


def traffic(
    nodes_per_hop: list[float],
    edges_per_hop: list[float],
    row_bytes: int,
    hosts: int,
    ranks_per_host: int,
    cut: float,
    shares: Sequence[float] | None = None,
) -> Traffic:
    """A step's exchange for a batch with ``nodes_per_hop`` new nodes per hop (seeds first:
    one entry more than the hops) and ``edges_per_hop`` sampled edges per hop, feature rows of
    ``row_bytes`` (float32), on ``hosts`` hosts of ``ranks_per_host`` ranks; ``shares``: each
    hop's remote share (None: the seeds dealt regardless of their owner, :func:`seed_deal`)."""
    hops = len(edges_per_hop)
    world = hosts * ranks_per_host
    if hosts < 2:
        return Traffic(0.0, [])
    share = list(shares) if shares is not None else remote_shares(hops, hosts, cut)
    sizes = ID_BYTES * (world - 1)  # one split size per peer
    rounds: list[float] = []
    for i in range(hops):
        ask = ID_BYTES * (share[i] * nodes_per_hop[i] + (world - 1))  # ids and the hop's seed
        answer = ID_BYTES * share[i] * (nodes_per_hop[i] + edges_per_hop[i])  # counts, sources
        rounds += [sizes, ask, sizes, answer]
    n_id = sum(nodes_per_hop)
    remote = sum(s * n for s, n in zip(share, nodes_per_hop, strict=True)) / max(n_id, 1e-9)
    rounds += [sizes, ID_BYTES * remote * n_id, row_bytes * remote * n_id]
    return Traffic(sum(rounds), rounds, share)


def exchange_s(cluster, t: Traffic) -> float:  # noqa: ANN001 (simulate.Cluster)
    """Seconds a step spends in its exchanges: each round a message to a rank on another host
    (the ranks send to every peer at once; the bytes share the host's link)."""
    if cluster.hosts < 2 or not t.rounds:
        return 0.0
    other = cluster.ranks_per_host  # the first rank of the second host
    return sum(cluster.p2p_s(0, other, b) for b in t.rounds)


def step_traffic(prof, batch_key: str, cluster, seeds: str = "global") -> Traffic:  # noqa: ANN001
    """The profile's batch ``batch_key`` (its frontier sizes) as a step across
    ``cluster.hosts`` shards, its seeds dealt as ``--seeds`` ``seeds`` (:func:`seed_deal`)."""
    shards = prof.shards
    hosts, per_host = cluster.hosts, cluster.ranks_per_host
    shares, nodes, edges = seed_deal(prof.sampled[batch_key], shards, hosts, per_host, seeds)
    return traffic(
        nodes,
        edges,
        int(shards.get("row_bytes", 0)),
        hosts,
        per_host,
        cut_share(shards, hosts),
        shares,
    )


def run_bytes(t: Traffic, steps: int, epochs: int, world: int) -> float:
    """What every rank's exchanges send over a run of ``epochs`` x ``steps`` steps: advice's
    network column for a sampled run across shards carries it beside the gradients' all-reduce
    (the requests, answers and split sizes to peers on the same host included: a bound)."""
    return t.bytes_sent * steps * epochs * world
