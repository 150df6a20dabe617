"""Evaluation: exact full-graph inference in bounded memory, and image scoring.

Every strategy scores its final model here (graphs: :func:`evaluate_graph`, the whole graph,
never its partitions; images: :func:`evaluate_images`). Choosing a final model scores several
models on one graph: an :class:`EvalGraphCache` passed along keeps the sparse adjacency built
for the first one.
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing
from torch_geometric.utils import remove_self_loops

from gnnpar.csr import indptr
from gnnpar.data.types import GraphDataset, ImageDataset
from gnnpar.training.metrics import score
from gnnpar.training.sources import image_batches

# Full-graph inference materialises one message per edge and feature (E x width floats): at
# synthetic-reddit size (115 M edges x 128) that is ~60 GB. Above this many bytes of messages,
# graph_logits takes an exact path that never holds them (see there).
MESSAGE_BYTES_LIMIT = 1 << 30


class EvalGraphCache:
    """The sparse adjacency :func:`graph_logits` built last, to score several models on one graph.

    On a large graph, building the CSR adjacency of full-graph inference is the peak of an
    evaluation (synthetic-reddit, 115 M edges: ~4.9 GiB while it is built, ~1.4 GiB kept);
    choosing a final model scores every rank's model and their average on one rank, so the
    adjacency is built once for all of them and freed with the cache.
    """

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.adj_t: torch.Tensor | None = None


@torch.no_grad()
def graph_logits(
    model: nn.Module,
    x: torch.Tensor,
    edge_index: torch.Tensor,
    limit: int = MESSAGE_BYTES_LIMIT,
    cache: EvalGraphCache | None = None,
) -> torch.Tensor:
    """The model's output for every node of a whole graph, exact, in bounded memory.

    Small graphs: one plain forward pass. Large graphs, chosen because every node must be
    scored exactly as full-graph inference would (scoring on the Cluster-GCN subgraphs would drop
    the edges between parts, and change the scores with the partitioning):

    * if every convolution fuses message passing into a sparse product (``GCNConv``,
      ``SAGEConv``), the model runs once on a sparse CSR adjacency: memory is O(E) indices plus
      O(N x width) activations, never O(E x width);
    * otherwise (``GATConv``: one attention weight per edge), layer-wise and node-chunked: each
      block runs on chunks of destination nodes together with their in-neighbours, holding
      about ``limit`` bytes of messages at a time. Exact because such a block's output at a node
      depends only on its own features and its incoming edges (attention is normalised over
      them).

    Runs in the caller's precision (the loop's autocast under ``--precision bf16``; ``gnnpar
    predict`` enters the same) and returns fp32 logits. The sparse product path runs in fp32
    even then: CPU has no bfloat16 CSR product, and fp32 there is exact on every device.
    """
    convs = [m for m in model.modules() if isinstance(m, MessagePassing)]
    # Widest feature a message can carry (SAGEConv aggregates its input before projecting).
    width = max((max(p.shape) for p in model.parameters() if p.dim() == 2), default=1)
    if edge_index.size(1) * width * 4 <= limit or not convs:
        return model(x, edge_index).float()
    n = x.size(0)
    fused = all(
        type(c).message_and_aggregate is not MessagePassing.message_and_aggregate for c in convs
    )
    if fused:
        gcn = all(isinstance(c, GCNConv) for c in convs)
        # the caller's graph (before any edit below) identifies the adjacency for the cache
        cache_key = (edge_index.data_ptr(), edge_index.size(1), edge_index._version, n, gcn)
        if cache is not None and cache.key == cache_key:
            return _fp32(model, x, cache.adj_t)
        if gcn:
            # GCNConv adds self-loops to a sparse adjacency unconditionally but only the missing
            # ones to an edge_index; dropping existing ones first makes the two agree.
            edge_index, _ = remove_self_loops(edge_index)
        # Duplicate edges become one entry holding their multiplicity: exact for GCN's weighted
        # sums, but a mean (SAGEConv) would count them once, so it takes the chunked path.
        key, counts = torch.unique(edge_index[1] * n + edge_index[0], return_counts=True)
        if gcn or key.numel() == edge_index.size(1):
            crow = indptr(key // n, n)
            with warnings.catch_warnings():  # "sparse CSR support is in beta": nothing to act on
                warnings.simplefilter("ignore", UserWarning)
                adj_t = torch.sparse_csr_tensor(crow, key % n, counts.to(x.dtype), (n, n))
            del key, counts
            if cache is not None:
                cache.key, cache.adj_t = cache_key, adj_t
            return _fp32(model, x, adj_t)  # row = destination: PyG's transposed adjacency
        del key, counts
    return _layerwise_chunked(model, x, edge_index, max(1, limit // (width * 4))).float()


def _fp32(model: nn.Module, x: torch.Tensor, adj_t: torch.Tensor) -> torch.Tensor:
    """``model(x, adj_t)`` without autocast: a bfloat16 CSR product is not implemented on CPU."""
    with torch.autocast(x.device.type, enabled=False):
        return model(x, adj_t)


def _layerwise_chunked(
    model: nn.Module, x: torch.Tensor, edge_index: torch.Tensor, edges_per_chunk: int
) -> torch.Tensor:
    n = x.size(0)
    dst_sorted, order = torch.sort(edge_index[1], stable=True)
    src_sorted = edge_index[0][order]
    ptr = indptr(dst_sorted, n)
    # Chunk boundaries: consecutive destination ranges holding about edges_per_chunk edges.
    marks = torch.arange(0, int(ptr[-1]) + 1, edges_per_chunk)
    bounds = torch.unique(torch.cat([torch.searchsorted(ptr, marks), torch.tensor([0, n])]))
    h = model.stem(x)
    for block in model.blocks:
        outs = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            src, dst = src_sorted[ptr[a] : ptr[b]], dst_sorted[ptr[a] : ptr[b]]
            nodes = torch.unique(torch.cat([torch.arange(a, b), src]))  # sorted
            local = torch.stack([torch.searchsorted(nodes, src), torch.searchsorted(nodes, dst)])
            out = block(h[nodes], local)
            outs.append(out[torch.searchsorted(nodes, torch.arange(a, b))])
        h = torch.cat(outs)
    return model.head(h)


@torch.no_grad()
def evaluate_graph(
    model: nn.Module, ds: GraphDataset, cache: EvalGraphCache | None = None
) -> tuple[dict[str, float], float]:
    """Full-graph inference (:func:`graph_logits`); scores on each split, and the seconds."""
    model.eval()
    t0 = time.perf_counter()
    data = ds.data
    device = next(model.parameters()).device  # no copy when the data is already there
    x, edge_index = data.x.to(device), data.edge_index.to(device)
    out = graph_logits(model, x, edge_index, cache=cache).to(data.y.device)
    scores = {
        split: score(out[data[f"{split}_mask"]], data.y[data[f"{split}_mask"]], ds.multilabel)
        for split in ("train", "val", "test")
    }
    model.train()
    return scores, time.perf_counter() - t0


@torch.no_grad()
def evaluate_images(
    model: nn.Module, ds: ImageDataset, batch_size: int, max_steps: int | None = None
) -> tuple[dict[str, float], list[float]]:
    """Scores on val and test in mini-batches, and the time of each test mini-batch."""
    model.eval()
    device = next(model.parameters()).device
    scores, test_times = {}, []
    for split in ("val", "test"):
        x, y = getattr(ds, f"{split}_x"), getattr(ds, f"{split}_y")
        correct, seen = 0, 0
        for step, (bx, by) in enumerate(image_batches(x, y, batch_size, None)):
            if max_steps is not None and step >= max_steps:
                break
            t0 = time.perf_counter()
            pred = model(bx.to(device)).argmax(-1).cpu()  # .cpu() waits for an accelerator
            if split == "test":
                test_times.append(time.perf_counter() - t0)
            correct += int((pred == by).sum())
            seen += by.numel()
        scores[split] = correct / max(seen, 1)
    model.train()
    return scores, test_times
