"""DGL's blocks made into the hop-ordered batch PyG's NeighborLoader gives
(``benchmarks/frameworks/_dgl_hops.py``, the ``dgl`` side of lightning_loaders.py): the layout
the data module's batches are held to (tests/lightning/test_data_module.py), each hop's edges the
blocks' first samples, and the trimmed PyG model giving the seeds the outputs of running the
blocks where DGL's samples are nested.

The blocks are made here as DGL's ``NeighborSampler`` makes them (from the seeds outwards, every
destination node sampled anew in each block, a block's source nodes its destination nodes first
and then the nodes new to it, every block's local ids indexing block 0's source nodes), in plain
torch: DGL is not a dependency (it runs in its own interpreter, on another torch)."""

from __future__ import annotations

import pytest
import torch
from benchmarks.frameworks._dgl_hops import blocks_to_hops
from torch_geometric.data import Data

from helpers import assert_trimming_exact, tiny_graph


def dgl_blocks(edge_index, num_nodes, seeds, fanouts, gen):
    """``(input_nodes, edges, num_dst)`` as DGL's NeighborSampler(fanouts) gives them (fan-outs
    listed from the input layer), sampling in-edges without replacement."""
    src, dst = edge_index
    order = torch.argsort(dst, stable=True)
    src, dst = src[order], dst[order]
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    nodes = seeds.tolist()
    blocks = []
    for fanout in reversed(fanouts):
        num_dst, local = len(nodes), {n: i for i, n in enumerate(nodes)}
        us, vs = [], []
        for v_local, v in enumerate(nodes[:num_dst]):
            nbrs = src[ptr[v] : ptr[v + 1]]
            if nbrs.numel() > fanout:
                nbrs = nbrs[torch.randperm(nbrs.numel(), generator=gen)[:fanout]]
            for u in nbrs.tolist():
                if u not in local:
                    local[u] = len(nodes)
                    nodes.append(u)
                us.append(local[u])
                vs.append(v_local)
        blocks.append(((torch.tensor(us, dtype=torch.long), torch.tensor(vs)), num_dst))
    blocks.reverse()
    return torch.tensor(nodes), [e for e, _ in blocks], [n for _, n in blocks]


def hop_batch(x, y, input_nodes, edges, num_dst) -> Data:
    keep, edge_index, nodes, hops = blocks_to_hops(input_nodes.numel(), edges, num_dst)
    n_id = input_nodes[keep]
    return Data(
        x=x[n_id],
        y=y[n_id],
        edge_index=edge_index,
        n_id=n_id,
        num_sampled_nodes=nodes,
        num_sampled_edges=hops,
        batch_size=num_dst[-1],
    )


def ring_graph(n=40, extra=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    ring = torch.arange(n)
    src = torch.cat([ring, (ring + 1) % n, torch.randint(0, n, (extra,), generator=g)])
    dst = torch.cat([(ring + 1) % n, ring, torch.randint(0, n, (extra,), generator=g)])
    keep = src != dst
    ei = torch.stack([src[keep], dst[keep]])
    return torch.unique(ei, dim=1)  # no parallel edges: a node's neighbours are a set


def test_re_samples_are_left_out_with_the_nodes_only_they_reach():
    """Seed 0; block 1 (the seeds'): 0 <- 1, 2; block 0 (input layer) samples the seed anew,
    0 <- 3, and its hop-1 nodes, 1 <- 2, 2 <- 4. Hop 1 is 0 <- 1, 2; hop 2 is 1 <- 2, 2 <- 4
    (into the nodes new at hop 1); 0 <- 3 is a re-sample and 3, which only it reaches, goes."""
    input_nodes = torch.tensor([10, 11, 12, 13, 14])  # seed, hop 1 (11, 12), new in block 0
    block1 = (torch.tensor([1, 2]), torch.tensor([0, 0]))
    block0 = (torch.tensor([3, 2, 4]), torch.tensor([0, 1, 2]))
    keep, edge_index, nodes, edges = blocks_to_hops(5, [block0, block1], [3, 1])
    assert input_nodes[keep].tolist() == [10, 11, 12, 14]
    assert (nodes, edges) == ([1, 2, 1], [2, 2])
    assert edge_index.tolist() == [[1, 2, 2, 3], [0, 0, 1, 2]]


def test_blocks_of_the_tiny_graph_in_neighbor_loader_layout():
    """The layout the data module's batches are held to: seeds first, each node once, sizes
    summing, hop k's edges into the nodes new at hop k - 1 (the ones trim_to_layer keeps), every
    edge an edge of the graph, the seeds' in-degree at most the seeds' fan-out; and hop k's edges
    are exactly block L - k's edges into those nodes (each node's first sample)."""
    data = tiny_graph()
    seeds = torch.tensor([0, 5])
    gen = torch.Generator().manual_seed(0)
    input_nodes, edges, num_dst = dgl_blocks(data.edge_index, 6, seeds, [2, 1], gen)
    b = hop_batch(data.x, data.y, input_nodes, edges, num_dst)
    assert b.n_id[:2].tolist() == [0, 5] and b.n_id.unique().numel() == b.n_id.numel()
    assert sum(b.num_sampled_nodes) == b.n_id.numel() and b.num_sampled_nodes[0] == 2
    assert sum(b.num_sampled_edges) == b.edge_index.size(1)
    graph_edges = set(map(tuple, data.edge_index.t().tolist()))
    src, dst = b.n_id[b.edge_index]
    assert all((int(s), int(d)) in graph_edges for s, d in zip(src, dst))
    assert int(torch.bincount(b.edge_index[1])[:2].max()) <= 1
    check_hops_are_first_samples(b, input_nodes, edges, num_dst)


def check_hops_are_first_samples(b, input_nodes, edges, num_dst):
    """Hop k's edges are block L - k's edges into the nodes new at hop k - 1 that the earlier
    hops reached (the seeds, then the sources of the earlier hops' edges), all of them."""
    reached = set(b.n_id[: b.batch_size].tolist())
    begin, e0 = 0, 0
    for k in range(len(edges)):
        end, e1 = begin + b.num_sampled_nodes[k], e0 + b.num_sampled_edges[k]
        tgt = b.edge_index[1, e0:e1]
        assert bool(((tgt >= begin) & (tgt < end)).all()), f"hop {k + 1} targets"
        assert all(s < end + b.num_sampled_nodes[k + 1] for s in b.edge_index[0, e0:e1].tolist())
        (bs, bd), first = edges[-k - 1], (num_dst[-k] if k else 0)
        block = {
            (int(input_nodes[s]), int(input_nodes[d]))
            for s, d in zip(bs, bd)
            if d >= first and int(input_nodes[d]) in reached
        }
        got = list(zip(b.n_id[b.edge_index[0, e0:e1]].tolist(), b.n_id[tgt].tolist()))
        assert len(got) == len(set(got)) and set(got) == block, f"hop {k + 1}"
        reached |= {s for s, _ in got}
        begin, e0 = end, e1
    # every node but the seeds is the source of an edge: it reaches the seeds
    assert set(b.edge_index[0].tolist()) >= set(range(b.batch_size, b.n_id.numel()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_re_sampled_blocks_keep_first_samples_and_trimming_stays_exact(seed):
    """Fan-outs below the degrees (DGL re-samples each node in every block): the batch is each
    node's first sample, in NeighborLoader's layout; trim_to_layer then gives the seeds the
    outputs and gradients of the model on the whole batch."""
    ei = ring_graph(seed=seed)
    x, y = torch.randn(40, 6, generator=torch.Generator().manual_seed(seed)), torch.arange(40) % 3
    gen = torch.Generator().manual_seed(seed)
    input_nodes, edges, num_dst = dgl_blocks(ei, 40, torch.tensor([3, 17, 29]), [2, 2, 3], gen)
    b = hop_batch(x, y, input_nodes, edges, num_dst)
    assert len(b.num_sampled_nodes) == 4 and len(b.num_sampled_edges) == 3
    check_hops_are_first_samples(b, input_nodes, edges, num_dst)
    assert_trimming_exact(b, b.x)


def test_with_nested_samples_the_trimmed_model_gives_the_seeds_the_blocks_outputs():
    """Fan-outs above every degree: every block takes all of a node's in-edges, so DGL's samples
    are nested and nothing is left out; PyG's SAGE with trim_to_layer on the batch gives the
    seeds the outputs of running each layer on its block (DGL's computation)."""
    from torch_geometric.nn import SAGEConv
    from torch_geometric.utils import trim_to_layer

    ei = ring_graph(seed=4)
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(4)
    input_nodes, edges, num_dst = dgl_blocks(ei, 40, torch.tensor([0, 9, 21]), [50, 50], gen)
    b = hop_batch(x, torch.zeros(40, dtype=torch.long), input_nodes, edges, num_dst)
    assert b.n_id.tolist() == input_nodes.tolist()  # nothing left out
    torch.manual_seed(0)
    convs = torch.nn.ModuleList([SAGEConv(5, 8), SAGEConv(8, 4)])
    h = x[input_nodes]
    for i, (conv, (src, dst), n_dst) in enumerate(zip(convs, edges, num_dst)):
        block = torch.stack([src, dst])
        h = conv((h, h[:n_dst]), block, size=(h.size(0), n_dst))
        h = h.relu() if i < len(convs) - 1 else h
    g, edge_index = b.x, b.edge_index
    for i, conv in enumerate(convs):
        g, edge_index, _ = trim_to_layer(i, b.num_sampled_nodes, b.num_sampled_edges, g, edge_index)
        g = conv(g, edge_index)
        g = g.relu() if i < len(convs) - 1 else g
    torch.testing.assert_close(g[: b.batch_size], h, rtol=1e-5, atol=1e-6)


def test_blocks_and_counts_must_agree():
    with pytest.raises(ValueError, match="2 blocks of edges but 1 destination counts"):
        blocks_to_hops(3, [(torch.tensor([1]), torch.tensor([0]))] * 2, [1])
