"""ViG (study 000): parameter counts, the dynamic kNN graph, max-relative convolution, layout."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import MessagePassing

from gnnpar.config.schema import Config
from gnnpar.configure import resolve
from gnnpar.models import build_model
from gnnpar.models.vig import MRConv, ViGBlock, knn_graph, max_relative


def vig_config(**overrides):
    cfg = Config()
    cfg.data.dataset = "synthetic-cifar10"
    cfg.model.name = "vig"
    for k, v in overrides.items():
        setattr(cfg.model, k, v)
    resolve(cfg)
    return cfg.model


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_counts_match_study_000_within_5_percent():
    model = build_model(vig_config(), in_dim=3, num_classes=10)
    assert len(model.blocks) == 8
    per_block = count(model.blocks[0])
    c = 107
    assert per_block == 12 * c * c + 8 * c == 138_244  # the formula in the vig docstring
    assert abs(per_block - 138_258) / 138_258 < 0.05
    assert all(count(b) == per_block for b in model.blocks)
    assert abs(count(model) - 1_120_410) / 1_120_410 < 0.05
    assert count(model) == 1_119_016


class MaxRelativeReference(MessagePassing):
    """The textbook PyG formulation: messages x_j - x_i, max aggregation."""

    def __init__(self) -> None:
        super().__init__(aggr="max")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return x_j - x_i


def test_max_relative_equals_pyg_message_passing_values_and_gradients():
    torch.manual_seed(0)
    b, n, c, k = 3, 7, 5, 3
    h = torch.randn(b, n, c, requires_grad=True)
    idx = knn_graph(h, k)
    ours = max_relative(h, idx)
    src = (idx + (torch.arange(b) * n).view(b, 1, 1)).reshape(-1)
    dst = torch.arange(b * n).repeat_interleave(k)
    h_ref = h.detach().clone().requires_grad_(True)
    ref = MaxRelativeReference()(h_ref.reshape(b * n, c), torch.stack([src, dst])).view(b, n, c)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    weights = torch.randn(b, n, c)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad)


def test_max_relative_equals_gather_and_amax_and_has_exact_gradients():
    torch.manual_seed(2)
    h = torch.randn(2, 12, 4, dtype=torch.double, requires_grad=True)
    idx = knn_graph(h, 4)  # distinct neighbours: no ties, so the gradient is unique
    offset = (torch.arange(2) * 12).view(2, 1, 1)
    gathered = h.reshape(24, 4)[(idx + offset).reshape(-1)].view(2, 12, 4, 4)
    torch.testing.assert_close(max_relative(h, idx), gathered.amax(2) - h, rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda t: max_relative(t, idx), (h,))


def test_max_relative_by_hand():
    # One image, 3 nodes with 2 channels; node 0's neighbours are itself and node 2, etc.
    h = torch.tensor([[[0.0, 4.0], [1.0, 1.0], [3.0, 0.0]]])
    idx = torch.tensor([[[0, 2], [1, 0], [2, 1]]])
    expected = torch.tensor([[[3.0, 0.0], [0.0, 3.0], [0.0, 1.0]]])
    torch.testing.assert_close(max_relative(h, idx), expected)


def test_knn_graph_equals_per_image_cdist_reference():
    torch.manual_seed(1)
    h = torch.randn(4, 30, 6)
    idx = knn_graph(h, 9)
    assert idx.shape == (4, 30, 9)
    for img in range(4):  # reference: one image at a time, Euclidean distance of unit vectors
        hn = torch.nn.functional.normalize(h[img], dim=-1)
        ref = torch.cdist(hn, hn).topk(9, largest=False).indices
        assert torch.equal(idx[img].sort(-1).values, ref.sort(-1).values)
    assert torch.equal(idx[..., 0], torch.arange(30).expand(4, 30))  # each node is its own nearest


def test_mrconv_is_linear_over_node_and_max_relative_features():
    torch.manual_seed(0)
    conv = MRConv(4)
    h, idx = torch.randn(2, 5, 4), torch.randint(0, 5, (2, 5, 3))
    expected = conv.lin(torch.cat([h, max_relative(h, idx)], -1))
    torch.testing.assert_close(conv(h, idx), expected)
    assert count(conv) == 2 * 4 * 4 + 4


def test_block_layouts_and_images_are_independent_in_a_batch():
    torch.manual_seed(0)
    block = ViGBlock(8).eval()
    x = torch.randn(3, 16, 8)  # [B, N, C] with N = 4 x 4 pixels
    out = block(x)
    assert out.shape == (3, 16, 8)
    as_image = x.transpose(1, 2).reshape(3, 8, 4, 4)  # the same activations as [B, C, H, W]
    torch.testing.assert_close(block(as_image), out)
    # The kNN graph is per image: an image's output does not depend on its batch mates.
    torch.testing.assert_close(block(x[1:2]), out[1:2], rtol=1e-5, atol=1e-6)


def test_graph_is_dynamic_from_the_blocks_own_features():
    """The graph follows fc_in's output: changing fc_in changes which neighbours are used."""
    torch.manual_seed(0)
    block = ViGBlock(6, k=2)
    x = torch.randn(1, 12, 6)
    h = block.fc_in(x)
    before = knn_graph(h, 2)
    with torch.no_grad():
        block.fc_in.weight.copy_(torch.randn(6, 6))
    after = knn_graph(block.fc_in(x), 2)
    assert not torch.equal(before, after)


def test_vig_model_on_tiny_images():
    torch.manual_seed(0)
    model = build_model(vig_config(hidden=8, layers=2), in_dim=3, num_classes=10)
    images = torch.randn(4, 3, 8, 8)
    out = model(images)
    assert out.shape == (4, 10)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(4))
    h = model.stem(images)
    assert h.shape == (4, 64, 8)  # pixels are the nodes
    for block in model.blocks:
        h = block(h)
        assert h.shape == (4, 64, 8)
    torch.testing.assert_close(model.head(h), out)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("k", [1, 9])
def test_knn_graph_with_fewer_nodes_than_k(k):
    h = torch.randn(2, 4, 3)
    assert knn_graph(h, k).shape == (2, 4, min(k, 4))


# ----------------------------------------------------------- memory-lean kNN and recomputation
@torch.no_grad()
def knn_graph_unchunked(h: torch.Tensor, k: int) -> torch.Tensor:
    """The implementation before issue 13, kept as the reference: one [B, N, N] score tensor."""
    hn = torch.nn.functional.normalize(h, dim=-1)
    return torch.bmm(hn, hn.transpose(1, 2)).topk(min(k, h.size(1)), dim=-1).indices


def block_forward_unchunked(block: ViGBlock, x: torch.Tensor) -> torch.Tensor:
    """ViGBlock.forward as it was before issue 13 (unchunked kNN, no recomputation)."""
    h = block.fc_in(x)
    h = torch.nn.functional.gelu(block.graph_conv(h, knn_graph_unchunked(h, block.k)))
    y = block.fc_out(h) + x
    return block.ffn2(torch.nn.functional.gelu(block.ffn1(y))) + y


def images_with_ties(b: int, n: int, c: int) -> torch.Tensor:
    """Random features where every node has exact duplicates and some are scaled copies, so
    many scores tie exactly (scaled copies normalise to nearly the same unit vector)."""
    torch.manual_seed(4)
    base = torch.randn(b, n // 4, c)
    return torch.cat([base, base, 2 * base, base.flip(1)], dim=1)


@pytest.mark.parametrize("chunk_images", [1, 3, 100])
def test_chunked_knn_picks_exactly_the_unchunked_neighbours_ties_included(chunk_images):
    for h in (torch.randn(7, 36, 10), images_with_ties(7, 36, 10)):
        n = h.size(1)
        idx = knn_graph(h, 9, chunk_bytes=chunk_images * n * n * 4)
        assert torch.equal(idx, knn_graph_unchunked(h, 9))
    h = images_with_ties(5, 64, 6)
    sim = torch.nn.functional.normalize(h, dim=-1)
    sim = torch.bmm(sim, sim.transpose(1, 2))
    assert (sim.topk(10, -1).values[..., 8] == sim.topk(10, -1).values[..., 9]).any()  # real ties
    assert torch.equal(knn_graph(h, 9, chunk_bytes=1), knn_graph_unchunked(h, 9))


def test_block_outputs_and_gradients_equal_the_unchunked_implementation(monkeypatch):
    """Chunked kNN (2 images per chunk) and recomputation against the pre-issue-13 forward,
    bit for bit: the neighbours are the same, so the same kernels run on the same numbers."""
    import gnnpar.models.vig as vig

    monkeypatch.setattr(vig, "KNN_CHUNK_BYTES", 2 * 64 * 64 * 4)
    for x0 in (torch.randn(5, 64, 12), images_with_ties(5, 64, 12)):
        torch.manual_seed(0)
        block = ViGBlock(12)
        grads = []
        for run in ("reference", "chunked", "recompute"):
            x = x0.clone().requires_grad_(True)
            block.recompute = run == "recompute"
            out = block_forward_unchunked(block, x) if run == "reference" else block(x)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            grads.append((out.detach(), x.grad, [p.grad.clone() for p in block.parameters()]))
            block.zero_grad(set_to_none=True)
        ref = grads[0]
        for out, gx, gp in grads[1:]:
            assert torch.equal(out, ref[0]) and torch.equal(gx, ref[1])
            assert all(torch.equal(a, b) for a, b in zip(gp, ref[2]))


def test_recompute_keeps_only_block_inputs_for_backward():
    """With --recompute a block saves its input only (besides weights), not its activations."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, requires_grad=True)
    saved = {}
    for recompute in (False, True):
        block = ViGBlock(8, recompute=recompute)
        weights = {p.data_ptr() for p in block.parameters()}
        elems = []

        def pack(t, elems=elems, weights=weights):
            if t.data_ptr() not in weights:
                elems.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
        saved[recompute] = sum(elems)
    x_bytes = x.numel() * x.element_size()
    assert saved[True] == x_bytes  # checkpoint saves the input only
    assert saved[False] > 12 * x_bytes  # ~13 activations of 1-4x the input's size


def test_vig_model_with_recompute_trains_identically():
    cfg = vig_config(hidden=8, layers=2)
    torch.manual_seed(0)
    plain = build_model(cfg, in_dim=3, num_classes=10)
    cfg.recompute = True
    lean = build_model(cfg, in_dim=3, num_classes=10)
    lean.load_state_dict(plain.state_dict())
    assert all(b.recompute for b in lean.blocks) and not any(b.recompute for b in plain.blocks)
    images, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 3, 3, 9])
    for m in (plain, lean):
        torch.nn.functional.nll_loss(m(images), y).backward()
    for a, b in zip(plain.parameters(), lean.parameters()):
        assert torch.equal(a.grad, b.grad)
    with torch.no_grad():  # evaluation does not checkpoint (nothing to save)
        assert torch.equal(lean(images), plain(images))


def test_recompute_in_chunks_of_images_matches_the_whole_batch(monkeypatch):
    """--recompute on a batch larger than recompute_chunk() checkpoints the block image
    chunk by image chunk: the same outputs and gradients as the whole batch at once, to float
    rounding (weight gradients become sums over chunks); nothing but each chunk's input is kept."""
    import gnnpar.models.vig as vig

    torch.manual_seed(0)
    x0 = torch.randn(7, 64, 12)
    block = ViGBlock(12, recompute=True)
    runs = []
    per_image = 64 * 12 * 4
    assert vig.recompute_chunk(x0) == -(-vig.RECOMPUTE_CHUNK_BYTES // per_image)
    for chunk in (100, 3):  # one piece (the code path of every batch <= the chunk), 3 + 3 + 1
        monkeypatch.setattr(vig, "RECOMPUTE_CHUNK_BYTES", chunk * per_image)
        x = x0.clone().requires_grad_(True)
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor, saved: list = saved) -> torch.Tensor:
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = block(x)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        runs.append((out.detach(), x.grad, [p.grad.clone() for p in block.parameters()], saved))
        block.zero_grad(set_to_none=True)
    (out1, gx1, gp1, _), (out3, gx3, gp3, saved3) = runs
    assert torch.allclose(out3, out1, rtol=0, atol=1e-6)
    assert torch.allclose(gx3, gx1, rtol=1e-5, atol=1e-6)
    # a weight gradient is a sum over 7 x 64 rows in float32, chunked here and whole there: its
    # rounding scales with the gradient's size (on an Intel Xeon, ffn2.weight's entries up to
    # 14.7 differed by 2.1e-5), so the absolute tolerance does too
    for a, b in zip(gp3, gp1):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(b.abs().max())))
    # what autograd keeps: the three input chunks (views of x), nothing of the activations
    weights = {p.data_ptr() for p in block.parameters()}
    # (empty tensors hold nothing: torch 2.11 with CUDA saves three per block)
    kept = [t for t in saved3 if t.data_ptr() not in weights and t.numel()]
    assert sorted(t.size(0) for t in kept) == [1, 3, 3]
    assert all(t.shape[1:] == x0.shape[1:] for t in kept)
