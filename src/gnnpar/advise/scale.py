"""A profile of a scaled-down stand-in mapped onto a larger graph of the same shape (issue 22:
papers100M-sized predictions from a profile taken on ``synthetic-papers100m --scale 0.01``).

What transfers, and why. A step's cost depends on the step's work, not on the graph around it:

* Cluster-GCN: a step trains one part (its nodes and intra-part edges). With parts of the same
  size (``partitions = target nodes / stand-in part nodes``, :func:`target_partitions`) a
  target part costs what a stand-in part costs; the epoch has more of them. The target's parts
  are the stand-in's, repeated (:func:`scale_profile`: target part ``i`` costs stand-in part
  ``i mod P``), so the spread of part costs is kept. Assumed, not measured: that the target's
  parts keep as many intra-part edges per node as the stand-in's (true of a graph whose
  communities are at least a part large at both sizes; see BENCHMARKS.md for how it holds
  between two stand-in sizes).
* Sampled: a step makes and trains one neighbour-sampled batch. Its work (sampled nodes and
  edges) does depend on the graph's size, through collisions: on a small graph a batch's
  fan-outs land on nodes the batch already holds, so it has fewer distinct nodes than the same
  batch on a big one. :func:`measure_work` counts a batch's nodes and edges per hop with
  gnnpar's own sampler on stand-ins of two or more sizes, :func:`extrapolate_work` carries the
  counts to the target's size, and :func:`scale_profile` multiplies the per-step times by the
  ratio of work (``work_ratio``: one factor for the training step, one for making the batch,
  chosen by the caller from the work's parts). The number of steps comes from the target's
  training nodes (``Profile.num_train``) through the simulation's own
  :func:`~gnnpar.data.sampling.loader.shard_plan`.

Memory per host (:func:`host_memory`): what gnnpar's design puts on each host, with
:func:`gnnpar.models.memory.estimate_bytes` for each rank's model state and activations,
computed for the target graph's shape (:func:`model_memory`, on a dataset of meta tensors: no
memory is allocated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gnnpar.advise.profile import Profile
from gnnpar.strategies import registry
from gnnpar.strategies.spec import SIM_GOSSIP, SIM_LOCKSTEP, SIM_SAMPLED

FLOAT_BYTES = 4
INDEX_BYTES = 8  # int64: edge_index, CSR, labels, node ids
MASK_BYTES = 1  # a bool per node per split mask


@dataclass(frozen=True)
class GraphShape:
    """A graph's size as far as memory and step counts are concerned."""

    name: str
    num_nodes: int
    num_edges: int  # edge_index columns
    num_features: int
    num_classes: int
    num_train: int


# OGB's ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 directed citations (counted here as
# edge_index columns, as gnnpar's synthetic-papers100m does), 128 float features, 172 classes,
# 1,207,179 training nodes.
PAPERS100M = GraphShape("papers100M", 111_059_956, 1_615_685_872, 128, 172, 1_207_179)


def target_partitions(source_nodes: int, source_partitions: int, target_nodes: int) -> int:
    """The target's partition count whose parts hold as many nodes as the stand-in's."""
    return max(1, round(target_nodes * source_partitions / source_nodes))


# ------------------------------------------------------------------ sampled batches' work
@dataclass
class HopWork:
    """Mean sampled work of one batch: nodes added per hop (hop 0: the seeds) and edges sampled
    per hop (hop k >= 1)."""

    nodes: list[float]
    edges: list[float]

    @property
    def total_nodes(self) -> float:
        return sum(self.nodes)

    @property
    def total_edges(self) -> float:
        return sum(self.edges)


def measure_work(ds, fanouts: list[int], batch_size: int, batches: int = 8, seed: int = 0):
    """Mean :class:`HopWork` of ``batches`` batches of ``batch_size`` training nodes of ``ds``,
    sampled with gnnpar's own :class:`~gnnpar.data.sampling.sampler.NeighborSampler` (seeds
    drawn as a sampled run's first epoch draws them)."""
    import torch

    from gnnpar.data.sampling.loader import epoch_seeds
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler

    csr = CSRGraph.from_edge_index(ds.data.edge_index, ds.num_nodes)
    sampler = NeighborSampler(csr, fanouts)
    train = ds.data.train_mask.nonzero().view(-1)
    seeds = epoch_seeds(train, seed, 0, 0, 1, batch_size)
    seeds = [s for s in seeds if s.numel() == batch_size][:batches]
    if not seeds:
        raise ValueError(f"{ds.name}: fewer than {batch_size} training nodes")
    nodes = [0.0] * (len(fanouts) + 1)
    edges = [0.0] * len(fanouts)
    for i, s in enumerate(seeds):
        b = sampler.sample(s, torch.Generator().manual_seed(seed * 1_000_003 + i))
        nodes = [a + n / len(seeds) for a, n in zip(nodes, b.num_sampled_nodes)]
        edges = [a + e / len(seeds) for a, e in zip(edges, b.num_sampled_edges)]
    return HopWork(nodes, edges)


def extrapolate_work(measured: list[tuple[int, HopWork]]) -> Callable[[int], HopWork]:
    """The :class:`HopWork` of the same batch on a graph of any size, from batches measured on
    two or more sizes (``(nodes, work)``) of one graph family. A hop's draws per frontier node
    (``r_k``: the graph's degrees, which do not change with its size) are the largest graph's;
    the share of a hop's draws that are new nodes, ``u_k``, follows
    ``u_k(N) = u_k(inf) - a_k N^-g``, clipped to [0, 1]: ``u_k(inf)`` keeps the collisions a
    graph of any size has (a node drawing back the neighbour it was reached from), the other
    term fades as the graph grows. With two sizes ``g = 1`` (random collisions' first-order
    term); with more, the ``g`` in [0.1, 2] (steps of 0.01) of least squared error over every
    hop and size, ``u_k(inf)`` and ``a_k`` fitted by least squares for each ``g``."""
    if len(measured) < 2 or len({n for n, _ in measured}) < len(measured):
        raise ValueError("extrapolate_work needs two or more distinct graph sizes")
    measured = sorted(measured, key=lambda m: m[0])
    largest = measured[-1][1]
    hops = len(largest.edges)
    ratios = [largest.edges[k] / largest.nodes[k] if largest.nodes[k] else 0.0 for k in range(hops)]
    sizes = [float(n) for n, _ in measured]
    shares = [
        [w.nodes[k + 1] / w.edges[k] if w.edges[k] else 1.0 for _, w in measured]
        for k in range(hops)
    ]

    def fit(g: float) -> tuple[float, list[tuple[float, float]]]:
        xs = [n**-g for n in sizes]
        mx = sum(xs) / len(xs)
        sxx = sum((x - mx) ** 2 for x in xs)
        err, lines = 0.0, []
        for ys in shares:
            my = sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            lines.append((my - slope * mx, -slope))  # (u(inf), a): u = u(inf) - a x
            err += sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys))
        return err, lines

    g = 1.0
    if len(measured) > 2:
        g = min((i / 100 for i in range(10, 201)), key=lambda c: fit(c)[0])
    lines = fit(g)[1]
    batch = largest.nodes[0]

    def work(num_nodes: int) -> HopWork:
        nodes, edges = [batch], []
        for r, (u, a) in zip(ratios, lines):
            e = r * nodes[-1]
            edges.append(e)
            nodes.append(e * min(1.0, max(0.0, u - a * num_nodes**-g)))
        return HopWork(nodes, edges)

    work.exponent = g  # type: ignore[attr-defined]
    return work


# ------------------------------------------------------------------ the profile, mapped
def scale_profile(
    prof: Profile,
    target: GraphShape,
    partitions: dict[int, int] | None = None,
    work_ratio: dict[int, tuple[float, float]] | None = None,
) -> Profile:
    """``prof`` (taken on a stand-in) as the profile of ``target``: its training nodes, each
    stand-in partition count ``P`` of ``partitions`` as the target's ``partitions[P]`` parts
    of the same size (part ``i`` costs stand-in part ``i mod P``; its memory estimate kept,
    which depends on the part's size only), and each sampled batch size ``B``'s training step
    and batch making multiplied by ``work_ratio[B] = (step factor, making factor)`` (1 where
    not given). Everything else (model, gloo, loop overhead, loader start) is the stand-in's."""
    partitions = partitions or {}
    work_ratio = work_ratio or {}
    parts: dict[str, list[float]] = {}
    first: dict[str, list[float]] = {}
    memory = {k: dict(v) for k, v in prof.memory.items() if not k.startswith("parts")}
    for p, q in partitions.items():
        steps = prof.parts_step_s[str(p)]
        parts[str(q)] = [steps[i % len(steps)] for i in range(q)]
        if str(p) in prof.parts_first_s:
            extra = prof.parts_first_s[str(p)]
            first[str(q)] = [extra[i % len(extra)] for i in range(q)]
        if f"parts{p}" in prof.memory:
            memory[f"parts{q}"] = dict(prof.memory[f"parts{p}"])
    sampled = {}
    for b, costs in prof.sampled.items():
        step, making = work_ratio.get(int(b), (1.0, 1.0))
        sampled[b] = {
            **costs,
            "compute_s": costs["compute_s"] * step,
            "sample_s": costs["sample_s"] * making,
            "main_sample_s": costs["main_sample_s"] * making,
        }
    return replace(
        prof,
        dataset=target.name,
        num_nodes=target.num_nodes,
        num_train=target.num_train,
        full_step_s=None,  # a full-graph step of the target was not measured
        parts_step_s=parts,
        parts_first_s=first,
        sampled=sampled,
        pipeline={},
        memory=memory,
    )


# ------------------------------------------------------------------ memory per host
def meta_dataset(shape: GraphShape):
    """An object with what :func:`~gnnpar.models.memory.estimate_bytes` reads of a graph
    dataset, its edge_index a meta tensor (shape only, no memory)."""
    from types import SimpleNamespace

    import torch

    edge_index = torch.empty(2, shape.num_edges, dtype=torch.long, device="meta")
    return SimpleNamespace(
        kind="graph",
        name=shape.name,
        num_nodes=shape.num_nodes,
        num_features=shape.num_features,
        num_classes=shape.num_classes,
        multilabel=False,
        data=SimpleNamespace(edge_index=edge_index),
    )


def model_memory(flags: dict[str, Any], shape: GraphShape) -> dict[str, int]:
    """``state`` and ``activations`` bytes of one rank of the ``gnnpar train`` run ``flags``
    on a graph of ``shape``: :func:`~gnnpar.models.memory.estimate_bytes`."""
    from gnnpar.advise.profile.memory import rank_estimate
    from gnnpar.configure import build_config

    return rank_estimate(build_config(None, flags), meta_dataset(shape))


def graph_bytes(shape: GraphShape) -> dict[str, int]:
    """A graph dataset as gnnpar holds it: float32 features, int64 edge_index and labels,
    three bool split masks."""
    n = shape.num_nodes
    return {
        "x": n * shape.num_features * FLOAT_BYTES,
        "edge_index": 2 * shape.num_edges * INDEX_BYTES,
        "y": n * INDEX_BYTES,
        "masks": 3 * n * MASK_BYTES,
    }


def host_memory(
    strategy: str,
    shape: GraphShape,
    ranks_per_host: int,
    world: int,
    rank_bytes: int,
    loader_workers: int = 0,
    intra_part_edges: int | None = None,
) -> dict[str, int]:
    """Bytes one host holds while training ``shape`` with ``strategy`` in gnnpar's design,
    by part (sum them for the host's need); ``rank_bytes``: one rank's bare process, model
    state and activations (:func:`model_memory` plus the profile's bare rank). The model is
    the one of the simulation the strategy's spec declares (``StrategySpec.advice``):

    * sampled (:func:`gnnpar.training.sources.share_graph`): local rank 0 writes the CSR
      (``rowptr``, ``col``), features and labels to ``/dev/shm`` (memory, not evictable) and
      every rank and loader worker maps it: any node may be sampled. Each sampling process
      (the rank with ``--loader-workers 0``, else each worker) keeps a node-mark array of
      ``nodes`` int64 (:class:`~gnnpar.data.sampling.sampler.NeighborSampler`). Setup peak:
      local rank 0 holds the CSR it built while the file is written (the CSR build itself,
      a stable sort of the targets, needs ``3 x edges`` int64 at once, less than that).
    * lockstep (allreduce): the partitioned graph is one memory-mapped file (nodes reordered by part,
      intra-part edges); a rank's static deal reads only its own parts' pages: ``1 / world``
      of it per rank.
    * gossip pool: any rank may take any part from the pool, so every host reads the whole
      partitioned graph over an epoch.

    Left out (not held during training): the dataset's own cache file (memory-mapped, read at
    set-up; page cache the kernel can reclaim, :func:`graph_bytes`), rank 0's final full-graph
    evaluation (:func:`evaluation_bytes`), and the one-off partitioning (METIS over the whole
    graph)."""
    n, f, e = shape.num_nodes, shape.num_features, shape.num_edges
    out: dict[str, int] = {"ranks": ranks_per_host * rank_bytes}
    advice = registry.get(strategy).advice
    simulation = advice.simulation if advice else None  # the spec's: what a rank holds
    if simulation == SIM_SAMPLED:
        shared = (n + 1) * INDEX_BYTES + e * INDEX_BYTES + n * f * FLOAT_BYTES + n * INDEX_BYTES
        samplers = ranks_per_host * max(1, loader_workers)
        out["shared graph"] = shared
        out["sampler marks"] = samplers * n * INDEX_BYTES
        out["setup extra"] = (n + 1) * INDEX_BYTES + e * INDEX_BYTES  # the CSR, while written
        return out
    if simulation in (SIM_LOCKSTEP, SIM_GOSSIP):
        if intra_part_edges is None:
            raise ValueError(f"{strategy}: give the intra-part edge count")
        per_node = f * FLOAT_BYTES + INDEX_BYTES + 3 * MASK_BYTES
        whole = n * per_node + 2 * intra_part_edges * INDEX_BYTES
        share = ranks_per_host / world if simulation == SIM_LOCKSTEP else 1.0
        out["partitioned graph"] = math.ceil(whole * min(1.0, share))
        return out
    raise ValueError(f"host_memory: no memory model for --strategy {strategy}")


def evaluation_bytes(shape: GraphShape, hidden: int) -> dict[str, int]:
    """A lower bound of what rank 0's final full-graph evaluation holds
    (:func:`gnnpar.training.evaluation.graph_logits`, the sparse-product path of GCN and
    GraphSAGE): the features, the CSR adjacency it builds (``rowptr``, ``col``) and one
    block's input and output, ``nodes x hidden`` float32 each."""
    n = shape.num_nodes
    return {
        "x": n * shape.num_features * FLOAT_BYTES,
        "adjacency": (n + 1) * INDEX_BYTES + shape.num_edges * INDEX_BYTES,
        "activations": 2 * n * hidden * FLOAT_BYTES,
    }
