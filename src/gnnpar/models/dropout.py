"""Dropout for gnnpar's models on the CPU: ``F.dropout``'s distribution, with cheaper masks.

Each element is kept with probability 1 - p and then scaled by 1 / (1 - p), independently, as
``F.dropout`` does; what differs is how the coin is thrown. A CPU epoch of study 002's gat3
spent 42% of its time in ``torch.rand`` drawing the masks (one mt19937 draw and a float per
element; ``bernoulli_``, which ``F.dropout`` uses, costs 3.8x that; BENCHMARKS.md, issue 21).
Here element i's uniform variate is a 40-bit number built from a counter-based hash of
(seed, i) (splitmix64: one 64-bit hash gives 8 elements their first byte; the rare element
whose byte equals the threshold's gets 32 more bits): dropped with probability
``round(p * 2**40) / 2**40``, closer to p than ``torch.rand``'s 24-bit floats.

* The seed is 64 bits drawn from torch's default generator, so ``torch.manual_seed``, a run's
  ``--seed``, ``fork_rng`` and a checkpoint's saved RNG state govern the masks as before.
* A mask is a function of (seed, i) only: the same for any number of threads and on every
  machine (integer arithmetic). The compiled kernel (``gat_kernel.c``, with GAT's edge softmax)
  computes it, fused with the product for float32; without a compiler the same hashes are
  computed with torch's int64 operations (:func:`keep_mask_torch`; the same masks, slower).
* On other devices: ``F.dropout``.

The forward keeps a one-byte mask for the backward (a float mask took four). Forward and
backward of gat3's first-layer input (23,194 x 602, p 0.6, one thread): 51 ms, against 117 ms
with a ``torch.rand`` mask and 268 ms with ``F.dropout`` (``benchmarks/kernels/dropout_masks.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gnnpar.models import gat_kernel

#: the variate's bits: P(drop) = round(p * 2**P_BITS) / 2**P_BITS
P_BITS = 40
GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment (the golden ratio in 64 bits)
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
# below this many elements, one thread: a parallel region costs more than it saves
PARALLEL_MIN = 1 << 16


def _signed(v: int) -> int:
    """A uint64 as the int64 with the same bits (torch has no uint64 arithmetic)."""
    v &= _MASK64
    return v - (1 << 64) if v >> 63 else v


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function on int64 tensors (products wrap modulo 2**64, as in C)."""
    z = (z ^ _srl(z, 30)) * _signed(_M1)
    z = (z ^ _srl(z, 27)) * _signed(_M2)
    return z ^ _srl(z, 31)


def threshold(p: float) -> int:
    """``round(p * 2**40)``: an element is dropped when its 40-bit variate is below it."""
    return round(p * (1 << P_BITS))


def draw_seed() -> int:
    """64 bits from torch's default CPU generator, as an unsigned integer."""
    lo, hi = torch.randint(0, 1 << 32, (2,), dtype=torch.int64).tolist()
    return (hi << 32) | lo


def keep_mask_torch(n: int, seed: int, p40: int) -> torch.Tensor:
    """The keep flags (bool, [n]) of elements 0..n-1 as ``gat_kernel.c`` computes them."""
    t, f = p40 >> 32, p40 & 0xFFFFFFFF
    blocks = torch.arange(1, (n + 7) // 8 + 1, dtype=torch.int64)
    h = _splitmix64(blocks * _signed(GAMMA) + _signed(seed))
    shifts = torch.arange(0, 64, 8, dtype=torch.int64)
    byte = ((h.unsqueeze(1) >> shifts) & 0xFF).reshape(-1)[:n]
    keep = byte > t
    ties = (byte == t).nonzero().squeeze(1)
    if ties.numel():
        v = _splitmix64((ties + 1) * _signed(GAMMA) + _signed(~seed)) & 0xFFFFFFFF
        keep[ties] = v >= f
    return keep


def keep_mask(n: int, seed: int, p40: int) -> torch.Tensor:
    """The keep flags of elements 0..n-1 (uint8 from the kernel, bool from the fallback)."""
    lib = gat_kernel.load()
    if lib is None:
        return keep_mask_torch(n, seed, p40)
    keep = torch.empty(n, dtype=torch.uint8)
    lib.gnnpar_dropout(None, None, keep.data_ptr(), n, seed, p40, 1.0, _threads(n))
    return keep


def _threads(n: int) -> int:
    return gat_kernel.threads_for(n, PARALLEL_MIN)


def _masked(
    x: torch.Tensor, out: torch.Tensor, p40: int, scale: float, keep_mask: bool
) -> torch.Tensor | None:
    """``out = (x * scale) * keep`` by the kernel (``out`` may be ``x``: in place), the mask
    drawn from the next seed; the mask (uint8) where ``keep_mask`` (a backward needs it)."""
    keep = torch.empty(x.shape, dtype=torch.uint8) if keep_mask else None
    n = x.numel()
    gat_kernel.load().gnnpar_dropout(
        x.data_ptr(), out.data_ptr(), None if keep is None else keep.data_ptr(), n,
        draw_seed(), p40, scale, _threads(n),
    )  # fmt: skip
    return keep


def _masked_grad(grad: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """``(grad * scale) * keep`` for a float32 ``grad``, by the kernel: a new tensor."""
    grad = grad.contiguous()
    out = torch.empty_like(grad)
    n = grad.numel()
    gat_kernel.load().gnnpar_dropout_backward_f32(
        grad.data_ptr(), keep.data_ptr(), out.data_ptr(), n, scale, _threads(n)
    )
    return out


class _FusedDropout(torch.autograd.Function):
    """float32 on the CPU, with the kernel: ``(x * scale) * keep`` in one pass; the backward
    ``(grad * scale) * keep`` (the same products autograd takes for the unfused path)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p40: int, scale: float) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        keep = _masked(x, out, p40, scale, ctx.needs_input_grad[0])
        ctx.scale = scale
        ctx.save_for_backward(keep)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        if grad.dtype != torch.float32:  # e.g. under autocast
            return grad.mul(ctx.scale).mul_(keep), None, None
        return _masked_grad(grad, keep, ctx.scale), None, None


class _ReluDropoutInPlace(torch.autograd.Function):
    """``dropout(relu(x))`` written over ``x`` (float32 on the CPU, with the kernel): the same
    values as :func:`relu_dropout`'s unfused path, without its two new tensors (a ReLU output
    and a dropout output, each the size of ``x``: 2 x 90K x 256 fp32 rows of GraphSAGE's first
    layer at papers100M 0.05, fan-outs 15-10-5, batch 1024). The backward is the unfused one's:
    ``(grad * scale) * keep`` where the ReLU passed its input, 0 elsewhere; the output is
    positive exactly where both the ReLU and the mask passed an element, so it stands in for the
    ReLU's saved output (where the mask dropped an element the unfused backward gives
    ``(grad * scale) * 0``, a zero of either sign, and this one +0: equal values)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p40: int, scale: float) -> torch.Tensor:
        x.relu_()
        keep = _masked(x, x, p40, scale, ctx.needs_input_grad[0])
        ctx.mark_dirty(x)
        ctx.scale = scale
        ctx.save_for_backward(x, keep)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out, keep = ctx.saved_tensors
        return _masked_grad(grad, keep, ctx.scale).masked_fill_(out <= 0, 0.0), None, None


def relu_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``dropout(relu(x), p, training)``, written over ``x`` where it can be: ``x`` must be a
    tensor nothing else reads afterwards (a layer's fresh output, whose own backward does not
    read it, as ``addmm``'s). The same values and gradients as the unfused ops."""
    fused = (
        training
        and p != 0.0
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.is_contiguous()
        and gat_kernel.available()
    )
    if fused:
        return _ReluDropoutInPlace.apply(x, threshold(p), 1.0 / (1.0 - p))
    return dropout(torch.relu_(x), p, training)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)``'s distribution; on the CPU with the masks above."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    scale = 1.0 / (1.0 - p)
    if x.dtype == torch.float32 and gat_kernel.available():
        return _FusedDropout.apply(x, threshold(p), scale)
    keep = keep_mask(x.numel(), draw_seed(), threshold(p)).view(x.shape)
    return (x * scale) * keep


def factors(shape: tuple[int, ...], p: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dropout factors (0 or 1 / (1 - p)) of a tensor of ``shape``, drawn as :func:`dropout`
    draws its mask (``dropout(a, p, True)`` equals ``a * factors(a.shape, p)`` for the same
    generator state)."""
    n = math.prod(shape)
    scale = 1.0 / (1.0 - p)
    seed, p40 = draw_seed(), threshold(p)
    lib = gat_kernel.load()
    if dtype == torch.float32 and lib is not None:
        out = torch.empty(shape, dtype=torch.float32)
        lib.gnnpar_dropout(None, out.data_ptr(), None, n, seed, p40, scale, _threads(n))
        return out
    keep = keep_mask(n, seed, p40).view(shape)
    return torch.full(shape, scale, dtype=dtype) * keep
