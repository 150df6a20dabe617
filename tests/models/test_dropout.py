"""The models' dropout (models/dropout.py, masks in gat_kernel.c): F.dropout's distribution,
masks from a counter-based hash of (seed, element).

Proved here: the compiled kernel, the torch fallback and a plain-Python reading of the rule in
the module's docstring give the same masks bit for bit (tails of fewer than 8 elements and the
elements whose first byte ties with the threshold included); the masks do not depend on the
number of threads; ``dropout`` is ``(x * scale) * keep`` with the gradient ``scale * keep``,
fused (float32) or not (float64), and ``factors`` draws the same mask; the seed comes from
torch's default generator; the drop rate is p and neighbouring elements are independent.
"""

from __future__ import annotations

import pytest
import torch

from gnnpar.models import dropout as d
from gnnpar.models import gat_kernel

M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _python_keep(n: int, seed: int, p: float) -> list[bool]:
    """The rule as the docstring states it, in Python integers: element i's 40-bit variate is
    byte i % 8 of splitmix64(seed + (i // 8 + 1) * GAMMA), then the low 32 bits of
    splitmix64(~seed + (i + 1) * GAMMA); dropped when it is below round(p * 2**40)."""
    p40 = round(p * 2**40)
    keep = []
    for i in range(n):
        byte = (_splitmix64((seed + (i // 8 + 1) * d.GAMMA) & M64) >> (8 * (i % 8))) & 0xFF
        low = _splitmix64((~seed + (i + 1) * d.GAMMA) & M64) & 0xFFFFFFFF
        keep.append((byte << 32 | low) >= p40)
    return keep


needs_kernel = pytest.mark.skipif(not gat_kernel.available(), reason="gat_kernel.c not built")


@pytest.mark.parametrize("p", [0.01, 0.5, 0.6, 0.99])
def test_the_torch_fallback_follows_the_rule_as_written(p):
    seed = 0xDEADBEEF12345678
    n = 8 * 300 + 5  # a tail of 5
    assert d.keep_mask_torch(n, seed, d.threshold(p)).tolist() == _python_keep(n, seed, p)


def test_ties_with_the_threshold_are_settled_by_the_next_32_bits():
    # p = 153.5 / 256: an element whose first byte is 153 is kept iff its next 32 bits >= 2**31
    p, seed, n = 153.5 / 256, 7, 40_000
    first = [
        (_splitmix64((seed + (i // 8 + 1) * d.GAMMA) & M64) >> (8 * (i % 8))) & 0xFF
        for i in range(n)
    ]
    ties = [i for i, b in enumerate(first) if b == 153]
    assert 100 < len(ties) < 250  # ~n / 256
    keep = d.keep_mask_torch(n, seed, d.threshold(p))
    assert keep.tolist() == _python_keep(n, seed, p)
    assert 0.3 < keep[ties].float().mean() < 0.7  # a fair coin, not all one way


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 2047, 2049, 100_003])
@pytest.mark.parametrize("p", [0.1, 0.6, 0.9, 153.5 / 256])  # the last: ties in most chunks
def test_the_kernel_draws_the_fallbacks_masks_bit_for_bit(n, p):
    seed, p40 = 0x0123456789ABCDEF, d.threshold(p)
    want = d.keep_mask_torch(n, seed, p40)
    assert torch.equal(d.keep_mask(n, seed, p40).bool(), want)
    scale = 1 / (1 - p)
    factors = torch.empty(n)
    gat_kernel.load().gnnpar_dropout(None, factors.data_ptr(), None, n, seed, p40, scale, 1)
    assert torch.equal(factors, torch.full((n,), scale) * want)


@needs_kernel
@pytest.mark.parametrize("p40", [0, 1, (1 << 40) - 1, 1 << 40])
def test_the_kernel_agrees_with_the_fallback_at_the_ends_of_the_threshold(p40):
    """P(drop) = p40 / 2**40 from 0 (nothing dropped) to 1 (everything: t = 256 > any byte)."""
    n, seed = 10_000, 99
    want = d.keep_mask_torch(n, seed, p40)
    assert torch.equal(d.keep_mask(n, seed, p40).bool(), want)
    x, out = torch.randn(n), torch.empty(n)
    gat_kernel.load().gnnpar_dropout(x.data_ptr(), out.data_ptr(), None, n, seed, p40, 2.0, 1)
    assert torch.equal(out, (x * 2.0) * want)
    if p40 == 0:
        assert bool(want.all())
    if p40 == 1 << 40:
        assert not bool(want.any())


@needs_kernel
def test_masks_do_not_depend_on_the_number_of_threads():
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            torch.manual_seed(5)
            outs.append(d.dropout(torch.ones(4 * d.PARALLEL_MIN + 3), 0.6, True))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad", [False, True])
def test_dropout_is_x_times_scale_times_the_mask_with_its_gradient(dtype, grad):
    x = torch.randn(300, 7, dtype=dtype, requires_grad=grad)
    torch.manual_seed(4)
    out = d.dropout(x, 0.6, True)
    torch.manual_seed(4)
    keep = d.keep_mask_torch(x.numel(), d.draw_seed(), d.threshold(0.6)).view(x.shape)
    scale = 1 / 0.4
    assert torch.equal(out.detach(), (x.detach() * scale) * keep)
    if grad:
        g = torch.randn_like(x)
        out.backward(g)
        assert torch.equal(x.grad, (g * scale) * keep)


def test_factors_draw_the_mask_dropout_draws():
    a = torch.rand(64, 8)
    torch.manual_seed(9)
    out = d.dropout(a, 0.3, True)
    torch.manual_seed(9)
    assert torch.equal(out, a * d.factors(a.shape, 0.3))
    torch.manual_seed(9)
    f64 = d.factors(a.shape, 0.3, torch.float64)
    assert f64.dtype == torch.float64 and torch.equal(f64 != 0, out != 0)


def test_the_seed_is_torchs_generator_so_manual_seed_and_rng_state_govern_it():
    x = torch.ones(1000)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a, b = d.dropout(x, 0.5, True), d.dropout(x, 0.5, True)
    assert not torch.equal(a, b)  # a new seed each call
    torch.set_rng_state(state)
    assert torch.equal(d.dropout(x, 0.5, True), a)


def test_eval_and_p_zero_return_x_itself():
    x = torch.randn(5)
    assert d.dropout(x, 0.6, False) is x and d.dropout(x, 0.0, True) is x


@pytest.mark.parametrize("p", [0.2, 0.6])
def test_the_drop_rate_is_p_at_every_byte_position_and_neighbours_are_independent(p):
    n = 2_000_000
    keep = d.keep_mask(n, d.draw_seed(), d.threshold(p)).bool().view(-1, 8)
    sigma = (p * (1 - p) / (n // 8)) ** 0.5
    for j in range(8):  # each byte of a hash, on its own
        assert abs(1 - keep[:, j].float().mean().item() - p) < 6 * sigma, j
    k = keep.reshape(-1)
    both = (k[:-1] & k[1:]).float().mean().item()  # within a block and across blocks
    assert abs(both - (1 - p) ** 2) < 6 * (((1 - p) ** 2 * (1 - (1 - p) ** 2)) / n) ** 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.5, 0.0])
def test_relu_dropout_over_its_input_equals_relu_then_dropout_with_their_gradient(dtype, p):
    """The in-place, fused ReLU and dropout of a layer's output (sage): the values and the
    gradient of ``dropout(relu(h))``, and no tensor of the output's size besides ``h``."""
    w = torch.randn(7, 7, dtype=dtype, requires_grad=True)
    x = torch.randn(300, 7, dtype=dtype)
    g = torch.randn(300, 7, dtype=dtype)

    torch.manual_seed(4)
    ref = d.dropout(torch.relu(x @ w), p, True)
    ref.backward(g)
    ref_grad, w.grad = w.grad, None

    torch.manual_seed(4)
    h = x @ w
    out = d.relu_dropout(h, p, True)
    if dtype == torch.float32 and p and gat_kernel.available():
        assert out.data_ptr() == h.data_ptr()  # written over h
    assert torch.equal(out.detach(), ref.detach())
    out.backward(g)
    assert torch.equal(w.grad, ref_grad)


def test_relu_dropout_in_eval_is_relu():
    h = torch.randn(40, 3)
    want = torch.relu(h)
    assert torch.equal(d.relu_dropout(h, 0.5, False), want)
