"""DGL's sampled blocks as the hop-ordered batch PyG's ``NeighborLoader`` gives (the layout
``torch_geometric.utils.trim_to_layer`` reads), so that one PyG ``LightningModule`` can be fed by
DGL's ``DataLoader`` too (``benchmarks/frameworks/lightning_loaders.py``, side ``dgl``).

Plain torch on the blocks' sizes and edges, so that it is tested without DGL
(``tests/benchmark_scripts/test_dgl_hops.py``). DGL's layout, input layer first: block ``j``'s
destination nodes are the first ``num_dst[j]`` of its source nodes, its source nodes are block
``j - 1``'s destination nodes, and every block's local ids index DGL's ``input_nodes`` (block
0's source nodes), which list the seeds first, then the nodes new at hop 1, hop 2, ... PyG's
layout, seeds first: ``n_id`` in that same order, ``num_sampled_nodes`` = [seeds, new at hop 1,
...], and ``edge_index`` hop by hop (``num_sampled_edges``), hop ``k``'s edges going into the
nodes new at hop ``k - 1``.

One difference the conversion has to settle: DGL samples every destination node's neighbours
anew in each block (the seeds get a fresh sample in every block), where PyG's layout holds one
sample per node, reused by every later layer (``trim_to_layer`` keeps a prefix of the edges).
Hop ``k`` therefore takes block ``L - k``'s edges into the nodes new at hop ``k - 1`` (each
node's first sample, the one made with its hop's fan-out, as NeighborLoader samples it) and
leaves out the re-samples. Walking out from the seeds, an edge counts where the earlier hops
reached its target; nodes that only left-out edges reached are left out, so every node of the
batch reaches the seeds, as in NeighborLoader's. (A node DGL placed at hop ``k`` through a
re-sample, and reached here only by a hop-``k + 1`` edge, keeps its place without in-edges: with
up to four layers only its features are read.) Where DGL's samples are nested (a fan-out at
least every degree, so every block takes all of a node's in-edges), the trimmed model gives
the seeds exactly the outputs of running the blocks.
"""

from __future__ import annotations

import torch


def blocks_to_hops(
    num_input: int, edges: list[tuple[torch.Tensor, torch.Tensor]], num_dst: list[int]
) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """``(keep, edge_index, num_sampled_nodes, num_sampled_edges)`` of DGL's blocks.

    ``num_input``: the number of DGL's ``input_nodes``; ``edges[j]``: block ``j``'s (source,
    destination) local ids (``block.edges()``), input layer first; ``num_dst[j]``: its
    destination count. ``keep``: the positions in ``input_nodes`` that the batch keeps, in order
    (``n_id = input_nodes[keep]``, ``x = block 0's source features[keep]``); ``edge_index`` in
    the kept nodes' ids, the seeds' edges first."""
    layers = len(edges)
    if len(num_dst) != layers:
        raise ValueError(f"{layers} blocks of edges but {len(num_dst)} destination counts")
    # hop k's edges: block L - k's edges into the nodes new at hop k - 1, local ids
    # [first, end) with first = the next block's destination count (0 for the seeds)
    hops, first = [], 0
    for j in reversed(range(layers)):
        src, dst = edges[j]
        into_new = dst >= first
        hops.append((src[into_new], dst[into_new], first, num_dst[j]))
        first = num_dst[j]
    # walk from the seeds: a hop's edge counts where its target was reached; its source is then
    # reached (a node reached through left-out re-samples only is left out)
    reached = torch.zeros(num_input, dtype=torch.bool)
    reached[: num_dst[-1]] = True
    kept_edges = []
    for src, dst, _, _ in hops:
        live = reached[dst]
        src, dst = src[live], dst[live]
        reached[src] = True
        kept_edges.append((src, dst))
    new_id = torch.cumsum(reached, 0) - 1
    keep = reached.nonzero().view(-1)
    bounds = [0, num_dst[-1]] + [num_dst[j] for j in reversed(range(layers - 1))] + [num_input]
    num_nodes = [int(reached[a:b].sum()) for a, b in zip(bounds, bounds[1:])]
    edge_index = torch.cat([torch.stack([new_id[s], new_id[d]]) for s, d in kept_edges], 1).long()
    return keep, edge_index, num_nodes, [int(s.numel()) for s, _ in kept_edges]
