"""Vision GNN (Han et al., "Vision GNN: An Image is Worth Graph of Nodes", NeurIPS 2022) as study
000 uses it on CIFAR-10: every pixel is a node (no patches: 32 x 32 = 1024 nodes per image).

    stem     per-pixel Linear(3 -> C): [B, 3, H, W] -> [B, H*W, C]
    8 x ViG block
      Grapher  Y = GELU(MRConv(X W_in, kNN(X W_in))) W_out + X
      FFN      Z = GELU(Y W_1) W_2 + Y                      (hidden 4C)
    head     mean over nodes -> Linear(C, C) -> GELU -> Linear(C, 10) -> log-softmax

MRConv is the max-relative graph convolution of ViG: ``W [h_i || max_{j in N(i)} (h_j - h_i)]``
with ``N(i)`` the k = 9 nearest neighbours of node i in feature space. The graph is dynamic: each
block rebuilds it from its own features, per image, for the whole batch at once (one batched
matrix product and a top-k; no loop over images).

Parameter count (the study gives 138,258 per block and 1,120,410 in all, not the widths). Without
normalisation layers a block holds ``W_in`` C^2+C, MRConv 2C^2+C, ``W_out`` C^2+C, FFN 4C^2+4C and
4C^2+C, i.e. 12C^2 + 8C; C = 107 gives 138,244 per block (study: 138,258). With the stem
(3C+C = 428) and the readout (C^2+C + 10C+10 = 12,636) the model has 1,119,016 (study: 1,120,410).
There is no BatchNorm (ViG's reference code has it): batch statistics would make a GPipe
micro-batch see a different normalisation than its whole mini-batch, and study 000 relies on
pipelined training computing the same gradients as the sequential model.

Layout between blocks: ``[B, N, C]`` float (N = H*W), a plain dense tensor with a static shape
for a given batch size, which is what a pipeline sends from stage to stage. A block also accepts
``[B, C, H, W]``. ``edge_index`` is ignored: the graph comes from the features.

    gnnpar train --dataset synthetic-cifar10 --model vig --batch-size 32 --max-steps 20
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gnnpar.models.base import BlockModel, output_head

K_NEIGHBOURS = 9


def as_nodes(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, H*W, C]``; ``[B, N, C]`` passes through."""
    if x.dim() == 4:
        return x.flatten(2).transpose(1, 2).contiguous()
    if x.dim() != 3:
        raise ValueError(f"ViG expects [B, N, C] or [B, C, H, W] activations, got {tuple(x.shape)}")
    return x


KNN_CHUNK_BYTES = 64 << 20  # similarity scores held at once by knn_graph (16 CIFAR images)


@torch.no_grad()
def knn_graph(h: torch.Tensor, k: int, chunk_bytes: int | None = None) -> torch.Tensor:
    """Indices ``[B, N, k]`` of the k nearest neighbours of every node, within its own image.

    As in ViG, distances are between L2-normalised features; for unit vectors
    ``|a - b|^2 = 2 - 2 a.b``, so the nearest neighbours are the k largest inner products, one
    ``bmm`` instead of ``cdist`` (same ranking, ~15% cheaper here). A node is its own nearest
    neighbour, which ViG keeps: its relative feature is 0, so the max is never negative.

    Memory: the ``[B, N, N]`` scores of a whole batch are 4.3 GB at study 000's 1000 CIFAR
    images, so they are built a few images at a time (``chunk_bytes`` of scores, at least one
    image; default :data:`KNN_CHUNK_BYTES`). Nothing here needs a gradient: the indices only
    choose which features MRConv gathers, and the gather is what autograd differentiates. The
    chunks are whole images, so every row of scores is the same ``[N, C] x [C, N]`` product as
    in one batched ``bmm`` (bit for bit: the tests compare with the unchunked version, ties
    included) and ``topk`` sees the same rows.
    """
    b, n, _ = h.shape
    k = min(k, n)
    chunk_bytes = KNN_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    per_chunk = max(1, chunk_bytes // max(1, n * n * h.element_size()))
    out = torch.empty(b, n, k, dtype=torch.long, device=h.device)
    for lo in range(0, b, per_chunk):
        hn = F.normalize(h[lo : lo + per_chunk], dim=-1)
        out[lo : lo + per_chunk] = torch.bmm(hn, hn.transpose(1, 2)).topk(k, dim=-1).indices
    return out


# With --recompute, a ViG block runs on pieces of at least this many bytes of its input (whole
# images). Above glibc's largest mmap threshold (32 MiB), so that every activation of the size of
# the input or larger gets its own mapping, given back when freed: served from the heap, pieces of
# many sizes fragment it, and a 1000-image step's resident memory grew past 13 GiB (BENCHMARKS.md).
RECOMPUTE_CHUNK_BYTES = 40 << 20


def recompute_chunk(x: torch.Tensor) -> int:
    """Images per checkpointed piece of a block's input ``x`` [B, N, C]."""
    per_image = max(1, x[0].numel() * x.element_size())
    return max(1, -(-RECOMPUTE_CHUNK_BYTES // per_image))


class _NeighbourMax(torch.autograd.Function):
    """``out[i, c] = max_j h[nodes[i, j], c]``, saving only which j won (one byte per value).

    Gathering all k neighbours at once and taking ``amax`` keeps the [B*N, k, C] gather alive for
    the backward pass: 3.9 GB per block at study 000's batch of 1000 images, 31 GB for 8 blocks.
    Here the k neighbours are visited one slice at a time (k = 9 steps, each vectorised over the
    whole batch) and the backward sends each gradient to the winning neighbour. Ties go to the
    first winner (``amax`` would split them); both are valid subgradients.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
        best = h[nodes[:, 0]]
        winner = torch.zeros(best.shape, dtype=torch.uint8, device=h.device)
        for j in range(1, nodes.size(1)):
            candidate = h[nodes[:, j]]
            better = candidate > best
            best = torch.where(better, candidate, best)
            winner.masked_fill_(better, j)
        ctx.save_for_backward(nodes, winner)
        ctx.num_nodes = h.size(0)
        return best

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        nodes, winner = ctx.saved_tensors
        c = grad.size(1)
        src = nodes.gather(1, winner.long())  # [B*N, C]: the neighbour that won, per channel
        flat = (src * c + torch.arange(c, device=grad.device)).view(-1)
        out = torch.zeros(ctx.num_nodes * c, dtype=grad.dtype, device=grad.device)
        out.index_add_(0, flat, grad.reshape(-1))
        return out.view(ctx.num_nodes, c), None


def max_relative(h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``max_{j in N(i)} (h_j - h_i)`` for ``h`` [B, N, C] and neighbour indices [B, N, k].

    ``max_j (h_j - h_i) = max_j h_j - h_i`` exactly, also in floating point (subtracting h_i is
    monotone). A dense batched gather (:class:`_NeighbourMax`) rather than PyG: measured on CPU
    (B = 32, C = 107, 1 thread) a PyG ``MessagePassing(aggr="max")`` over the same B*N*k edges
    took ~950 ms forward + backward, a full gather + ``amax`` ~480 ms, this ~230 ms; the PyG
    version's scatter-max and its backward dominate. The tests check all three agree.
    """
    b, n, c = h.shape
    offset = (torch.arange(b, device=h.device) * n).view(b, 1, 1)
    nodes = (idx + offset).view(b * n, -1)
    return _NeighbourMax.apply(h.reshape(b * n, c), nodes).view(b, n, c) - h


class MRConv(nn.Module):
    """Max-relative graph convolution (ViG; Li et al., DeepGCNs): ``W [h || max_j (h_j - h)]``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(2 * channels, channels)

    def forward(self, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.cat([h, max_relative(h, idx)], dim=-1))


class ViGBlock(nn.Module):
    """Grapher (FC -> MRConv over a dynamic kNN graph -> FC, residual) then FFN (residual).

    ``recompute``: autograd keeps ~6 MB per 32 x 32 image in a block for the backward pass (the
    FFN's 4C-wide hidden layer alone 3.5 MB), 50 GB for 8 blocks at study 000's 1000 images.
    With it, only the block's input is kept (0.44 MB per image) and the block's forward runs
    again during the backward pass (``torch.utils.checkpoint``, GPipe's re-materialisation).
    The recomputed forward repeats the same deterministic kernels on the same input, so the
    gradients are bit for bit those without it (tested); it costs one more forward per block.

    A block treats every image on its own (the kNN graph is per image, the rest per node), so
    with ``recompute`` a large batch runs through the block in chunks of whole images
    (:func:`recompute_chunk`: 96 CIFAR images at C = 107), each checkpointed on its own: the
    forward's transients (the 4C-wide FFN layer, the MRConv concat) and the backward's
    recomputed activations exist for one chunk at a time, not for the whole batch, which is what
    keeps a step at study 000's 1000 images under 8 GiB (BENCHMARKS.md). Batches up to the chunk
    size run as one piece, bit for bit as before; a chunked batch's gradients equal the whole
    batch's to float rounding (the weight gradients are sums over chunks instead of one product;
    tested), as those of GPipe's micro-batches do.
    """

    def __init__(
        self, channels: int, k: int = K_NEIGHBOURS, ffn_ratio: int = 4, recompute: bool = False
    ) -> None:
        super().__init__()
        self.k = k
        self.recompute = recompute
        self.fc_in = nn.Linear(channels, channels)
        self.graph_conv = MRConv(channels)
        self.fc_out = nn.Linear(channels, channels)
        self.ffn1 = nn.Linear(channels, ffn_ratio * channels)
        self.ffn2 = nn.Linear(ffn_ratio * channels, channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor | None = None) -> torch.Tensor:
        x = as_nodes(x)
        if self.recompute and torch.is_grad_enabled():
            chunk = recompute_chunk(x)
            if x.size(0) <= chunk:
                return checkpoint(self._forward, x, use_reentrant=False)
            parts = [checkpoint(self._forward, p, use_reentrant=False) for p in x.split(chunk)]
            return torch.cat(parts)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)
        h = F.gelu(self.graph_conv(h, knn_graph(h, self.k)))
        y = self.fc_out(h) + x
        return self.ffn2(F.gelu(self.ffn1(y))) + y


class PixelStem(nn.Module):
    """Every pixel becomes a node with a C-dimensional feature: ``[B, 3, H, W] -> [B, H*W, C]``."""

    def __init__(self, in_channels: int, channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(as_nodes(x))


class Readout(nn.Module):
    """Mean over the nodes of each image, then a 2-layer MLP to the classes."""

    def __init__(self, channels: int, num_classes: int, dropout: float, multilabel: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(channels, channels)
        self.fc2 = nn.Linear(channels, num_classes)
        self.dropout = dropout
        self.out = output_head(multilabel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(as_nodes(x).mean(dim=1)))
        h = F.dropout(h, self.dropout, self.training)
        return self.out(self.fc2(h))


def build_vig(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    """``mcfg.hidden`` = C (107 by default), ``mcfg.layers`` = number of ViG blocks (8);
    ``mcfg.recompute``: re-materialise each block's activations in the backward pass."""
    c = mcfg.hidden
    return BlockModel(
        [ViGBlock(c, recompute=mcfg.recompute) for _ in range(mcfg.layers)],
        head=Readout(c, num_classes, mcfg.dropout, multilabel),
        stem=PixelStem(in_dim, c),
    )
