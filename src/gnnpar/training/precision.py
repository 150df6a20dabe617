"""``--precision``: the arithmetic of a run's forward passes (``fp32``, default, or ``bf16``).

``bf16`` is mixed precision with fp32 master weights: the parameters, their gradients, the
optimizer state, gradient all-reduce, parameter averaging, gossip and checkpoints all stay fp32;
only the forward pass runs under ``torch.autocast(device_type=<the run's device>,
dtype=torch.bfloat16)``, which computes matrix products (linear layers, GATConv/GCNConv
projections, ViG's similarity ``bmm``) in bfloat16 and keeps reductions and losses in fp32
(autocast's op lists). Autograd runs each backward op in the dtype its forward used, so a
parameter's gradient comes back in fp32 through the cast autocast inserted. No loss scaling:
bfloat16 has fp32's exponent range (loss scaling is an fp16 remedy).

Written once: the loop (:mod:`gnnpar.training.loop`) enters :func:`autocast` around every training step
(forward, loss and backward: pipelines cannot split a schedule step, torchtitan does the same),
every evaluation and the final scoring, so the val/test scores in result.json are those of the
run's arithmetic. A backward pass inside autocast gives the same gradients, bit for bit, as one
after it (tests/training/test_precision.py checks gcn, gat, sage and vig). ``gnnpar predict`` uses the precision recorded in model.pt's config and
reproduces ``test_score``; ``gnnpar.load`` returns the plain fp32 module (wrap calls in
:func:`autocast` to get the run's numbers). Losses are computed from fp32 logits
(:func:`gnnpar.training.losses.loss_fn`, the pipeline's loss). Between pipeline stages activations travel
in the dtype the stage produced under autocast (bfloat16 after a linear layer: half the bytes;
gloo sends and receives bfloat16, checked with torch 2.13).

bfloat16 is fast only where the hardware multiplies it natively: GPUs since Ampere, CPUs with
AMX or AVX512-BF16. Elsewhere the casts cost more than the products save
(benchmarks/kernels/bf16_vs_fp32_step.py measures it).
"""

from __future__ import annotations

import contextlib

import torch

from gnnpar.config.schema import PRECISIONS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
assert set(DTYPES) == set(PRECISIONS)


def autocast(
    precision: str, device: torch.device | str | None
) -> contextlib.AbstractContextManager:
    """The context a forward pass of a ``precision`` run on ``device`` runs in.

    fp32: nothing (the plain fp32 arithmetic, bit for bit as without the flag). bf16: autocast
    for the device's type (``cpu``, ``cuda``), so the same code runs on either."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}; gnnpar.configure lets none through")
    kind = torch.device(device if device is not None else "cpu").type
    return torch.autocast(device_type=kind, dtype=DTYPES[precision])
