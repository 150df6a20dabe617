"""Graph micro-batches for pipeline parallelism (GPipe over a GNN; studies 000 and 001).

A GPipe pipeline splits each mini-batch into ``M`` micro-batches that flow through the stages one
after another. Splitting the rows of a node-feature tensor is not enough for a GNN: a node's
output depends on its L-hop neighbourhood. Two ways to cut, both planned here once, before
training, identically on every rank (so only activations ever cross a stage boundary):

``index`` (study 001, section 7.3): contiguous node-index chunks and the subgraph they induce,
which is what torchgpipe did to the authors' (node ids, features) tuple. Edges between chunks
are lost, so accuracy falls as the chunk count grows (their figure 4).

``exact``: the target nodes (e.g. the training nodes) are split into ``M`` disjoint sets and
each micro-batch is a set plus its full L-hop computation subgraph (k-hop in-neighbourhood,
induced edges), so every target's output equals the full-graph output, and the sum of the
micro-batch losses (each CE summed over its targets and divided by the *total* number of
targets) equals the full-batch mean loss, gradients included. Halo nodes are computed more than
once; seeding the sets from METIS parts keeps that overhead small (reported as
``halo_overhead``: nodes computed / nodes in the graph).

torch.distributed.pipelining needs static shapes, so every micro-batch is padded to a common node
count ``size`` with isolated zero-feature nodes: no edge touches them, so no real node's result
can change (GCN degrees, GAT attention softmax and SAGE means only read a node's in-edges), and
the loss never counts them.

    plan = build_plan(data.edge_index, data.num_nodes, train_nodes, chunks=4, hops=2)
    x_all = plan.features(data.x)            # [M * size, F]: what stage 0 splits into chunks
    y_all = plan.targets(data.y)             # [M * size]: -100 where no loss is taken
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch_geometric.utils import k_hop_subgraph, subgraph

from gnnpar.data.partition import metis_partition
from gnnpar.errors import UsageError

IGNORE = (
    -100
)  # label of a row that takes no loss (padding, halo, non-target); F.cross_entropy default


@dataclass
class MicroBatch:
    nodes: torch.Tensor  # global ids of every node computed in this micro-batch (real rows)
    edge_index: torch.Tensor  # local ids in [0, len(nodes)); padding rows have no edges
    out_pos: torch.Tensor  # local rows whose outputs count (targets of this micro-batch)
    out_nodes: torch.Tensor  # their global ids (nodes[out_pos])


@dataclass
class MicroBatchPlan:
    batches: list[MicroBatch]
    size: int  # rows per micro-batch after padding
    num_nodes: int  # nodes in the whole graph
    mode: str  # "exact" or "index"
    hops: int

    @property
    def chunks(self) -> int:
        return len(self.batches)

    @property
    def nodes_computed(self) -> int:
        return sum(int(b.nodes.numel()) for b in self.batches)

    @property
    def halo_overhead(self) -> float:
        """Real nodes computed per pass / nodes in the graph (1.0: each node exactly once)."""
        return self.nodes_computed / max(self.num_nodes, 1)

    @property
    def padded_overhead(self) -> float:
        """Rows computed per pass including padding / nodes in the graph."""
        return self.chunks * self.size / max(self.num_nodes, 1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """[M * size, F]: micro-batch i's node features in rows i*size.., zero padding after."""
        out = x.new_zeros((self.chunks * self.size, *x.shape[1:]))
        for i, b in enumerate(self.batches):
            out[i * self.size : i * self.size + b.nodes.numel()] = x[b.nodes]
        return out

    def targets(self, y: torch.Tensor) -> torch.Tensor:
        """Labels laid out like :meth:`features`; rows that take no loss hold IGNORE.

        Multi-label ``y`` [N, C] gets one extra column: 1.0 on rows that take loss, else 0.0.
        """
        if y.dim() == 1:
            out = torch.full((self.chunks * self.size,), IGNORE, dtype=torch.long)
            for i, b in enumerate(self.batches):
                out[i * self.size + b.out_pos] = y[b.out_nodes]
            return out
        out = torch.zeros((self.chunks * self.size, y.size(1) + 1), dtype=torch.float)
        for i, b in enumerate(self.batches):
            rows = i * self.size + b.out_pos
            out[rows, :-1] = y[b.out_nodes].float()
            out[rows, -1] = 1.0
        return out

    def edge_indices(self) -> list[torch.Tensor]:
        return [b.edge_index for b in self.batches]

    def gather(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Merged pipeline output [M * size, C] -> (global node ids, their output rows)."""
        ids = torch.cat([b.out_nodes for b in self.batches])
        rows = torch.cat([i * self.size + b.out_pos for i, b in enumerate(self.batches)])
        return ids, out[rows]

    def summary(self) -> dict:
        return {
            "mode": self.mode,
            "chunks": self.chunks,
            "hops": self.hops,
            "padded_size": self.size,
            "nodes_per_chunk": [int(b.nodes.numel()) for b in self.batches],
            "targets_per_chunk": [int(b.out_nodes.numel()) for b in self.batches],
            "nodes_computed": self.nodes_computed,
            "halo_overhead": self.halo_overhead,
            "padded_overhead": self.padded_overhead,
        }


def metis_order(edge_index: torch.Tensor, num_nodes: int, parts: int, seed: int) -> torch.Tensor:
    """METIS part id of every node (:func:`gnnpar.data.partition.metis_partition`)."""
    if parts <= 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    return metis_partition(edge_index, num_nodes, parts, seed).long()


def split_targets(
    targets: torch.Tensor, chunks: int, edge_index: torch.Tensor, num_nodes: int, seed: int
) -> list[torch.Tensor]:
    """``chunks`` disjoint, equal-sized (+-1) target sets, each mostly inside one METIS part.

    Targets are ordered by (METIS part, node id) and cut into even pieces, so each piece keeps
    the locality of its part (small halo) while the piece sizes stay balanced even when the
    parts hold different numbers of targets.
    """
    part = metis_order(edge_index, num_nodes, chunks, seed)
    t = targets.sort().values
    order = torch.argsort(part[t] * num_nodes + t)
    return [piece.sort().values for piece in torch.tensor_split(t[order], chunks)]


def build_plan(
    edge_index: torch.Tensor,
    num_nodes: int,
    targets: torch.Tensor,
    chunks: int,
    hops: int,
    mode: str = "exact",
    seed: int = 0,
    what: str = "target nodes",
) -> MicroBatchPlan:
    """Plan ``chunks`` micro-batches whose outputs cover ``targets`` (global node ids).

    ``hops`` is the receptive field in edges: the number of message-passing layers (one more for
    GCN, whose symmetric normalisation also reads the in-degree of each message's source).
    """
    targets = torch.as_tensor(targets, dtype=torch.long).unique()
    if mode == "exact":
        if chunks > targets.numel():
            raise UsageError(
                f"--chunks {chunks} is more than the {targets.numel()} {what} to split into "
                f"micro-batches; use --chunks {targets.numel()} or fewer."
            )
        batches = []
        for tset in split_targets(targets, chunks, edge_index, num_nodes, seed):
            nodes, ei, mapping, _ = k_hop_subgraph(
                tset, hops, edge_index, relabel_nodes=True, num_nodes=num_nodes
            )
            batches.append(MicroBatch(nodes, ei, mapping, tset))
    elif mode == "index":
        if chunks > num_nodes:
            raise UsageError(
                f"--chunks {chunks} is more than the {num_nodes} nodes of the graph; "
                f"use --chunks {num_nodes} or fewer."
            )
        is_target = torch.zeros(num_nodes, dtype=torch.bool)
        is_target[targets] = True
        batches = []
        for nodes in torch.tensor_split(torch.arange(num_nodes), chunks):
            ei, _ = subgraph(nodes, edge_index, relabel_nodes=True, num_nodes=num_nodes)
            pos = is_target[nodes].nonzero().view(-1)
            batches.append(MicroBatch(nodes, ei, pos, nodes[pos]))
    else:
        raise UsageError(f"Unknown --microbatch '{mode}'. Choose one of: exact, index.")
    size = max(int(b.nodes.numel()) for b in batches)
    return MicroBatchPlan(batches, size, num_nodes, mode, hops)


def receptive_hops(model_name: str, layers: int) -> int:
    """Edges a node's output depends on: one per layer, plus one for GCN's degree normalisation."""
    return layers + 1 if model_name == "gcn" else layers
