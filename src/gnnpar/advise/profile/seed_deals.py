"""What a sharded folder's training looks like from each host's own seeds (``--seeds local``):
per hop of a batch, the share of its new nodes owned by another host, measured on a few batches
of each shard's own training nodes, sampled from the shards' own CSR (the global, renumbered
ids: shard h owns ``[bounds[h], bounds[h+1])``) by the sampler and fan-outs of the run.

The model of the exchange across shards (:mod:`gnnpar.advise.shard_exchange`) needs it because
the global edge cut does not say it: the sampled edges of a host's own seeds (uniform per node,
at most the fan-out each) are not a uniform draw of the graph's edges, and a partitioner that
keeps communities together (METIS) keeps a batch's neighbourhood more local than its share of
cut edges. The global deal needs no measurement: its seeds are spread over the hosts, and every
hop's remote share is (H - 1) / H.

Memory: the graph's structure only (the shards' ``indptr`` and ``indices`` in their stored
dtypes, int32 below 2^31 nodes; no feature row), one batch at a time: ~0.2 GB for
synthetic-papers100m at scale 0.02 (2.2 M nodes, 32 M edges), where the profile's whole graph
in memory takes ~5 GB. So ``gnnpar advise --profile`` measures it again for a saved profile
(:func:`gnnpar.advise.command.read_profile`): one of another sharding of the same graph, or one
taken before this record existed. Cost: ``LOCAL_BATCHES`` batches per shard per batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from gnnpar.data.sampling.loader import _mix

LOCAL_BATCHES = 3  # batches of each shard's own seeds
_STREAM = 0x5EED10CA  # the generators' own stream, apart from training's


def owners(ids: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Each (renumbered) id's shard."""
    return torch.searchsorted(bounds[1:], ids, right=True)


def local_frontiers(
    sample: Callable[[torch.Tensor, torch.Generator], Any],
    train_idx: torch.Tensor,
    bounds: torch.Tensor,
    batch_size: int,
    seed: int,
    batches: int = LOCAL_BATCHES,
) -> dict[str, Any]:
    """``batches`` batches of up to ``batch_size`` seeds drawn from each shard's own training
    nodes (``train_idx``: renumbered ids; ``bounds``: the shards' id ranges), sampled by
    ``sample(seeds, gen)`` (a :class:`~gnnpar.data.sampling.sampler.SampledBatch`: ``n_id``
    seeds first, then each hop's new nodes). Returns the shards (``hosts``), per hop (seeds
    first) the share of the new nodes owned by a shard other than their seeds'
    (``remote_per_hop``, pooled over every batch) and the batches' mean new nodes and sampled
    edges per hop (``nodes_per_hop``, ``edges_per_hop``)."""
    hosts = bounds.numel() - 1
    own = owners(train_idx, bounds)
    far: list[float] = []
    seen: list[float] = []
    nodes: list[list[float]] = []
    edges: list[list[float]] = []
    for h in range(hosts):
        mine = train_idx[own == h]
        if mine.numel() == 0:
            continue
        gen = torch.Generator().manual_seed(_mix(seed, h, _STREAM))
        for _ in range(batches):
            seeds = mine[torch.randperm(mine.numel(), generator=gen)[:batch_size]]
            b = sample(seeds, gen)
            counts = [int(n) for n in b.num_sampled_nodes]
            elsewhere = owners(b.n_id, bounds) != h
            if not far:
                far, seen = [0.0] * len(counts), [0.0] * len(counts)
            at = 0
            for i, n in enumerate(counts):
                far[i] += float(elsewhere[at : at + n].sum())
                seen[i] += n
                at += n
            nodes.append([float(n) for n in counts])
            edges.append([float(e) for e in b.num_sampled_edges])
    if not nodes:
        raise ValueError("no shard owns a training node")
    return {
        "hosts": hosts,
        "batches": len(nodes),
        "remote_per_hop": [f / max(s, 1.0) for f, s in zip(far, seen, strict=True)],
        "nodes_per_hop": [sum(h) / len(nodes) for h in zip(*nodes, strict=True)],
        "edges_per_hop": [sum(h) / len(edges) for h in zip(*edges, strict=True)],
    }


def shard_structure(folder: str) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The sharded ``folder``'s whole in-edge CSR in renumbered ids (each shard's rows in
    turn: its ``indices`` are global ids already), the shards' id ranges (``bounds``) and the
    training nodes (renumbered)."""
    from gnnpar.data.sampling.sampler import CSRGraph
    from gnnpar.data.shards import open_shards

    shards = open_shards(folder)
    ptrs, cols, train, at = [np.zeros(1, dtype=np.int64)], [], [], 0
    for s in shards:
        ptr = np.asarray(s.array("indptr"), dtype=np.int64)
        ptrs.append(ptr[1:] + at)
        at += int(ptr[-1])
        cols.append(np.asarray(s.array("indices")))
        train.append(np.asarray(s.array("train"), dtype=np.int64))
    bounds = torch.tensor([s.first for s in shards] + [shards[-1].end], dtype=torch.long)
    csr = CSRGraph(torch.from_numpy(np.concatenate(ptrs)), torch.from_numpy(np.concatenate(cols)))
    return csr, bounds, torch.from_numpy(np.concatenate(train))


def shard_record(
    folder: str, fanouts: list[int], batch_sizes: Iterable[int], seed: int
) -> tuple[list[int], dict[str, dict[str, Any]]]:
    """The sharded ``folder``'s training nodes per shard (``--seeds local`` borrows what a host
    lacks) and, per batch size, :func:`local_frontiers` with ``fanouts``."""
    from gnnpar.data.sampling.sampler import NeighborSampler

    csr, bounds, train = shard_structure(folder)
    per_shard = torch.bincount(owners(train, bounds), minlength=bounds.numel() - 1).tolist()
    sampler = NeighborSampler(csr, list(fanouts))
    local = {
        str(bs): local_frontiers(sampler.sample, train, bounds, int(bs), seed)
        for bs in sorted({int(b) for b in batch_sizes})
    }
    return per_shard, local


def shards_of_folder(folder: str) -> dict[str, Any]:
    """The profile's ``shards`` record (as :func:`gnnpar.advise.profile._shards` makes it from
    the loaded dataset) from the sharded ``folder``'s manifest alone."""
    from pathlib import Path

    from gnnpar.data.prepared import read_manifest

    m = read_manifest(Path(folder).expanduser())
    cut = (m.get("partition") or {}).get("edge_cut_share")
    return {"hosts": len(m["shards"]), "edge_cut_share": cut, "row_bytes": 4 * m["num_features"]}


def add_shard_record(prof, folder: str) -> None:  # noqa: ANN001 (core.Profile)
    """Into the profile of a sharded ``folder``: its training nodes per shard
    (``shards["train_per_shard"]``) and, for each sampled batch size it measured, the batches
    of each host's own seeds (``sampled[B]["local"]``), at that size's fan-outs."""
    sizes: dict[tuple[int, ...], list[int]] = {}
    for key, b in prof.sampled.items():
        sizes.setdefault(tuple(b["fanouts"]), []).append(int(key))
    for fanouts, batch_sizes in sizes.items():
        per_shard, local = shard_record(folder, list(fanouts), batch_sizes, prof.seed)
        prof.shards["train_per_shard"] = per_shard
        for key, rec in local.items():
            prof.sampled[key]["local"] = rec


def lacks_shard_record(prof) -> bool:  # noqa: ANN001 (core.Profile)
    """A sharded profile without what :func:`add_shard_record` adds (taken before it)."""
    return bool(prof.shards) and (
        "train_per_shard" not in prof.shards or any("local" not in b for b in prof.sampled.values())
    )
