"""GAT's fused edge softmax and the models' dropout masks (``gat_kernel.c``): find it, check
its version, load it with ctypes.

pip compiles ``gat_kernel.c`` when it installs gnnpar (setup.py, extension name
``gnnpar.models._gat_kernel``, with OpenMP), as it does the sampler's kernel
(:mod:`gnnpar.data.sampling.kernel`: plain C, no torch headers, any torch build). Loaded after
torch, so the library's ``libgomp.so.1`` is the one torch already loaded and both share one
thread pool. Without it (no compiler, no OpenMP) :func:`gnnpar.models.gat.attention` computes
the same values with torch operations, slower with several threads, and
:mod:`gnnpar.models.dropout` the same masks.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
from pathlib import Path

import torch

_VERSION = 6  # must equal GNNPAR_GAT_KERNEL_VERSION in gat_kernel.c
_DIR = Path(__file__).parent
_STEM = "_gat_kernel"
_lib: ctypes.CDLL | None = None
_tried = False


def _candidates() -> list[Path]:
    return [_DIR / f"{_STEM}{s}" for s in importlib.machinery.EXTENSION_SUFFIXES]


def load() -> ctypes.CDLL | None:
    """The compiled kernel, loaded on first use; None where it is not built (or stale)."""
    global _lib, _tried
    if not _tried:
        _tried = True
        for path in _candidates():
            if not path.is_file():
                continue
            try:
                lib = ctypes.CDLL(str(path))
                lib.gnnpar_gat_kernel_version.restype = ctypes.c_int64
                if lib.gnnpar_gat_kernel_version() != _VERSION:
                    continue
                i64, f32, p = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
                lib.gnnpar_gat_max_threads.restype = i64
                lib.gnnpar_softmax_logits.restype = None
                lib.gnnpar_softmax_logits.argtypes = [p, p, p, p, i64, i64, f32, p, p, i64]
                lib.gnnpar_softmax_normalise.restype = None
                lib.gnnpar_softmax_normalise.argtypes = [p, p, p, i64, i64, f32, p, p, i64]
                lib.gnnpar_softmax_backward.restype = None
                lib.gnnpar_softmax_backward.argtypes = [p, p, p, p, p, p, i64, i64, f32, p, p]
                lib.gnnpar_softmax_backward.argtypes += [i64]
                lib.gnnpar_sum_by_source.restype = None
                lib.gnnpar_sum_by_source.argtypes = [p, p, p, i64, i64, p, i64]
                lib.gnnpar_edge_products.restype = None
                lib.gnnpar_edge_products.argtypes = [p, p, p, p, i64, i64, p, i64]
                u64 = ctypes.c_uint64  # the dropout masks (models/dropout.py)
                lib.gnnpar_dropout.restype = None
                lib.gnnpar_dropout.argtypes = [p, p, p, i64, u64, u64, f32, i64]
                lib.gnnpar_dropout_backward_f32.restype = None
                lib.gnnpar_dropout_backward_f32.argtypes = [p, p, p, i64, f32, i64]
                lib.gnnpar_order_by_key.restype = None
                lib.gnnpar_order_by_key.argtypes = [p, i64, i64, p, p, p]
                lib.gnnpar_csr_mm_level.restype = i64
                lib.gnnpar_csr_mm.restype = None
                lib.gnnpar_csr_mm.argtypes = [p, p, p, p, i64, i64, p, i64, i64]
            except (OSError, AttributeError):
                continue
            _lib = lib
            break
    return _lib


def available() -> bool:
    return load() is not None


# below this many entries x heads, one thread: a parallel region costs more than it saves
PARALLEL_MIN = 4096


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def threads_for(work: int, minimum: int = PARALLEL_MIN) -> int:
    """torch's thread count for ``work`` items, or 1 below ``minimum`` of them."""
    return torch.get_num_threads() if work >= minimum else 1


def softmax_forward(a_src, a_dst, keep, crow, col, slope: float):
    """``(out, s, ex, total)``: ``out`` the attention weights (times ``keep``), the rest what
    :func:`softmax_backward` needs. float32, contiguous, int64 indices."""
    lib = load()
    n_dst, k = a_dst.shape
    e = col.numel()
    t = threads_for(e * k)
    s, d = a_src.new_empty(e, k), a_src.new_empty(e, k)
    lib.gnnpar_softmax_logits(
        _ptr(a_src), _ptr(a_dst), _ptr(crow), _ptr(col), n_dst, k, slope, _ptr(s), _ptr(d), t
    )
    ex = d.exp_()  # torch's exp: the kernel leaves it to torch (its vectorised exp is not libm's)
    total, out = a_src.new_empty(n_dst, k), a_src.new_empty(e, k)
    lib.gnnpar_softmax_normalise(
        _ptr(ex), _ptr(keep), _ptr(crow), n_dst, k, 1e-16, _ptr(total), _ptr(out), t
    )
    return out, s, ex, total


def softmax_backward(grad, keep, s, ex, total, crow, t_crow, t_entry, n_src: int, slope: float):
    """``(grad_a_src, grad_a_dst)`` for :func:`softmax_forward`'s output gradient ``grad``."""
    lib = load()
    n_dst, k = total.shape
    e = s.size(0)
    t = threads_for(e * k)
    grad_s, grad_dst = s.new_empty(e, k), s.new_empty(n_dst, k)
    lib.gnnpar_softmax_backward(
        _ptr(grad),
        _ptr(keep),
        _ptr(s),
        _ptr(ex),
        _ptr(total),
        _ptr(crow),
        n_dst,
        k,
        slope,
        _ptr(grad_s),
        _ptr(grad_dst),
        t,
    )
    grad_src = s.new_empty(n_src, k)
    lib.gnnpar_sum_by_source(_ptr(grad_s), _ptr(t_crow), _ptr(t_entry), n_src, k, _ptr(grad_src), t)
    return grad_src, grad_dst


def edge_products(g, x, crow, col):
    """``g[row] * x[col]`` per entry ([E, *g.shape[1:]]): ``g`` [n_dst, ...], ``x`` [n_src, ...]
    float32 and contiguous, rows of the same size."""
    lib = load()
    e = col.numel()
    m = g[0].numel() if g.size(0) else x[0].numel()
    out = g.new_empty(e, *g.shape[1:])
    lib.gnnpar_edge_products(
        _ptr(g), _ptr(x), _ptr(crow), _ptr(col), g.size(0), m, _ptr(out), threads_for(e * m)
    )
    return out


def order_by_key(key: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ptr, order)`` of int64 ``key`` in ``[0, n)``: ``order`` the entries sorted by key,
    stably (``torch.sort(key, stable=True).indices``), ``ptr`` [n + 1] each key's offsets in
    it. By counting where the kernel is built (a sampled layer's 245K entries: ~1 ms against
    ~7 ms for torch's sort); the same indices either way. ValueError for a key outside
    ``[0, n)``."""
    from gnnpar.csr import indptr

    if key.numel():
        lo, hi = torch.aminmax(key)
        if int(lo) < 0 or int(hi) >= n:
            raise ValueError(f"order_by_key: keys in [{int(lo)}, {int(hi)}], not in [0, {n})")
    lib = load()
    if lib is None or key.dtype != torch.int64 or key.device.type != "cpu":
        small = key.to(torch.int32) if n < 2**31 else key  # int32 keys sort ~2x faster
        return indptr(key, n), torch.sort(small, stable=True).indices
    key = key.contiguous()
    ptr, order = torch.empty(n + 1, dtype=torch.int64), torch.empty_like(key)
    scratch = torch.empty(max(n, 1), dtype=torch.int64)
    lib.gnnpar_order_by_key(
        key.data_ptr(), key.numel(), n, ptr.data_ptr(), scratch.data_ptr(), order.data_ptr()
    )
    return ptr, order


# below this many entries x columns, csr_mm runs on one thread
CSR_MM_PARALLEL_MIN = 1 << 16


@functools.cache
def csr_mm_level() -> int:
    """The widest build of :func:`csr_mm` this CPU runs (2 AVX-512, 1 AVX2, 0 the x86-64
    baseline or another architecture); -1 without the kernel. Asked once per process."""
    lib = load()
    return -1 if lib is None else int(lib.gnnpar_csr_mm_level())


def csr_mm(
    a: torch.Tensor, h: torch.Tensor, level: int | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch.sparse.mm(a, h)`` for a CSR ``a`` [n, k] and a dense ``h`` [k, m].

    float32 on the CPU with the kernel: ``out[i] = sum of a[i, j] * h[j]`` over row i's entries
    in CSR order, each product rounded and added from zero in that order, which is PyG's
    message passing (gather, multiply, one-thread scatter-add) to the bit, and the same floats
    on every x86-64 CPU at every thread count (``level`` picks a build, for tests; by default
    the widest this CPU runs). MKL's product, which ``torch.sparse.mm`` calls, rounds otherwise
    and differently by CPU; it is also 1.3-3x slower on one thread at the models' widths
    (``benchmarks/kernels/csr_mm_vs_torch_sparse.py``). Anything else (other dtypes or devices, an ``h`` that
    records a gradient) is ``torch.sparse.mm``'s. ``out``: a contiguous float32 [n, m] tensor
    the kernel writes the product into instead of a new one (ignored on ``torch.sparse.mm``'s
    path); the product is returned either way."""
    lib = load()
    if (
        lib is None
        or a.layout != torch.sparse_csr
        or a.device.type != "cpu"
        or h.device.type != "cpu"
        or a.dtype != torch.float32
        or h.dtype != torch.float32
        or h.dim() != 2
        or a.dim() != 2
        or (h.requires_grad and torch.is_grad_enabled())
    ):
        return torch.sparse.mm(a, h)
    n, k = a.shape
    if h.size(0) != k:
        raise RuntimeError(f"csr_mm: a is {n} x {k} but h has {h.size(0)} rows")
    m = h.size(1)
    crow, col = a.crow_indices().long().contiguous(), a.col_indices().long().contiguous()
    val, h = a.values().contiguous(), h.contiguous()
    if out is None:
        out = h.new_empty(n, m)
    elif out.shape != (n, m) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"csr_mm: out must be a contiguous float32 {n} x {m} tensor")
    if n and m:
        top = csr_mm_level()
        level = top if level is None else level
        if not 0 <= level <= top:
            raise ValueError(f"csr_mm: level {level} not in [0, {top}] on this CPU")
        threads = threads_for(val.numel() * m, CSR_MM_PARALLEL_MIN)
        lib.gnnpar_csr_mm(
            _ptr(crow), _ptr(col), _ptr(val), _ptr(h), n, m, _ptr(out), threads, level
        )
    return out
