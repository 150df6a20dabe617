"""The kernel's CSR x dense product (``gat_kernel.csr_mm``): PyG's message passing to the bit.

Each output is row i's products ``a[i, j] * h[j]``, each rounded, added from zero in CSR order:
what a gather, a multiply and a one-thread ``index_add_`` compute. Every build of the kernel
this CPU runs (baseline, AVX2, AVX-512) returns the same floats, at any width (the last vector
of a row overlaps the one before) and any thread count. Other dtypes go to ``torch.sparse.mm``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gnnpar.models import gat_kernel

needs_kernel = pytest.mark.skipif(not gat_kernel.available(), reason="gat kernel not built")
WIDTHS = [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 41, 64, 65, 100, 128, 130, 602]


def _csr(n: int, k: int, nnz: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, max(n, 1), (nnz,), generator=g)
    cols = torch.randint(0, max(k, 1), (nnz,), generator=g)
    cols[: nnz // 10] = cols[nnz // 10 : 2 * (nnz // 10)]  # some repeated entries
    rows[: nnz // 10] = rows[nnz // 10 : 2 * (nnz // 10)]
    order = torch.sort(rows, stable=True).indices
    crow = torch.zeros(n + 1, dtype=torch.int64)
    crow[1:] = torch.bincount(rows, minlength=n).cumsum(0)
    vals = torch.randn(nnz, generator=g, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols[order], vals, (n, k))


def _message_passing(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Gather, multiply, scatter-add in entry order (one thread): PyG's sum."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    row = torch.repeat_interleave(torch.arange(a.size(0)), crow.diff())
    out = torch.zeros(a.size(0), h.size(1), dtype=h.dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return out.index_add_(0, row, val.unsqueeze(1) * h[col])
    finally:
        torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("m", WIDTHS)
def test_every_build_equals_message_passing_bit_for_bit(m):
    a = _csr(57, 43, 600, seed=m)  # some rows empty, some with repeated entries
    h = torch.randn(43, m, generator=torch.Generator().manual_seed(1))
    want = _message_passing(a, h)
    for level in range(gat_kernel.csr_mm_level() + 1):
        got = gat_kernel.csr_mm(a, h, level)
        assert torch.equal(got, want), (m, level)
    torch.testing.assert_close(gat_kernel.csr_mm(a, h), torch.sparse.mm(a, h))


@needs_kernel
def test_threads_do_not_change_a_bit():
    a, h = _csr(3000, 2000, 60_000, seed=5), torch.randn(2000, 128)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gat_kernel.csr_mm(a, h)
        torch.set_num_threads(2)
        two = gat_kernel.csr_mm(a, h)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@needs_kernel
def test_empty_rows_matrices_and_widths():
    a = _csr(5, 4, 0, seed=0)  # no entries: zeros
    assert torch.equal(gat_kernel.csr_mm(a, torch.randn(4, 20)), torch.zeros(5, 20))
    assert gat_kernel.csr_mm(_csr(0, 4, 0, seed=0), torch.randn(4, 3)).shape == (0, 3)
    assert gat_kernel.csr_mm(_csr(5, 4, 9, seed=0), torch.randn(4, 0)).shape == (5, 0)


@needs_kernel
def test_mismatched_shapes_and_levels_are_refused():
    a = _csr(5, 4, 9, seed=0)
    with pytest.raises(RuntimeError, match="h has 3 rows"):
        gat_kernel.csr_mm(a, torch.randn(3, 8))
    with pytest.raises(ValueError, match="level"):
        gat_kernel.csr_mm(a, torch.randn(4, 8), gat_kernel.csr_mm_level() + 1)


def test_other_dtypes_and_gradients_are_torch_sparse_mm():
    a64 = _csr(30, 20, 100, seed=2, dtype=torch.float64)
    h64 = torch.randn(20, 16, dtype=torch.float64)
    assert torch.equal(gat_kernel.csr_mm(a64, h64), torch.sparse.mm(a64, h64))
    a, h = _csr(30, 20, 100, seed=2), torch.randn(20, 16, requires_grad=True)
    gat_kernel.csr_mm(a, h).sum().backward()  # torch's path records the product
    torch.testing.assert_close(h.grad, torch.sparse.mm(a.t().to_sparse_csr(), torch.ones(30, 16)))
