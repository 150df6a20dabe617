"""How much memory a run's model needs, counted from the model code: what
:func:`gnnpar.runtime.footprint.check_memory` compares against the free memory before anything is
allocated, and what ``gnnpar advise`` predicts per rank.

The estimate is a *lower bound* of what one copy of the model holds in one training step
(:func:`estimate_bytes`, times the copies asked for):

- model state, exact: parameters x 4 bytes x (weights + gradients + the optimizer's slots: Adam
  keeps 2 per parameter, SGD without momentum none). The parameter count comes from building the
  model on PyTorch's ``meta`` device, which records shapes and allocates nothing, so it follows
  the model code instead of a formula that could drift from it.
- activations, partly: each hidden block's output (``--hidden`` x ``--heads`` floats per row, kept
  for the backward pass) for the rows of one training step, i.e. every node of a full-batch graph,
  ``nodes / --partitions`` for a Cluster-GCN step, or what the strategy declares of its step
  (``StrategySpec.step_rows``: sampled, ``--batch-size`` seed nodes, their sampled neighbours
  not counted); and each hidden block's messages, one vector of the same width per edge (PyG's
  message passing gathers them, and keeps them for the backward pass): every edge of a
  full-batch graph, the strategy's count (sampled: one per seed and first-hop fan-out), none
  counted for a Cluster-GCN step (its edges are known only after partitioning).
- ViG is an estimate rather than a bound (:func:`vig_activation_bytes`: what each block saves
  for its backward pass, counted from the code, plus a measured allowance for the backward's
  gradients and glibc's heap; within 30% of the measured peak). A ViG batch that does not fit
  but would with ``--recompute`` gets it, with one line saying so (study 000's 1000 images: ~52
  GiB without, ~7 GiB with); one that fits in neither is refused with both figures.

Measured (2026-11-22, CI box, load ~5): ``--model gcn --hidden 20000`` on Cora, estimate 1.4 GiB,
peak RSS 3.2 GiB (0.35 GiB of it the bare process): the real need is about twice the bound.
``--hidden 200000`` is estimated at 14.2 GiB (6.3 GiB before messages were counted, when such a
run passed the check and was killed by the kernel's OOM killer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gnnpar.config.schema import Config

FLOAT_BYTES = 4
OPTIMIZER_SLOTS = {"adam": 2, "sgd": 0}  # per-parameter state tensors (SGD: no momentum here)


def parameter_count(
    cfg: Config, in_dim: int, num_classes: int, multilabel: bool, graph=None
) -> int:
    """The exact number of parameters of the run's model, built on the meta device (a user's
    model on the CPU, with the global generators left as they were: its factory may create
    tensors the meta device cannot hold, such as PNA's degree histogram)."""
    from gnnpar.models import BUILDERS, build_model

    if cfg.model.name not in BUILDERS:
        with torch.random.fork_rng(devices=[]):
            model = build_model(cfg.model, in_dim, num_classes, multilabel, graph, check=False)
        return sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        model = build_model(cfg.model, in_dim, num_classes, multilabel)
    return sum(p.numel() for p in model.parameters())


def estimate_bytes(
    cfg: Config,
    ds,
    replicas: int,
    recompute: bool | None = None,
    step_rows: Callable[[Config, Any], tuple[int, int]] | None = None,
) -> dict[str, int]:
    """Bytes of ``state`` (weights, gradients, optimizer) and ``activations`` for ``replicas``
    copies of the model (lower bounds, ViG's an estimate; see the module docstring for what is
    counted). ``recompute``: ViG's, if not ``cfg.model.recompute``. ``step_rows``: the
    strategy's (``StrategySpec.step_rows``): ``(cfg, ds) -> (rows, message edges)`` of one step
    of a graph; None: every node and edge, or one subgraph's nodes with --partitions."""
    m, s = cfg.model, cfg.strategy
    recompute = m.recompute if recompute is None else recompute
    graph = getattr(ds, "data", None)
    params = parameter_count(cfg, ds.num_features, ds.num_classes, ds.multilabel, graph)
    state = params * FLOAT_BYTES * (2 + OPTIMIZER_SLOTS[cfg.optim.optimizer])
    if ds.kind == "image":  # ViG, every pixel a node, every block C wide
        images = min(s.batch_size, int(ds.train_x.size(0)))
        pixels = int(ds.train_x[0, 0].numel())
        return {
            "state": replicas * state,
            "activations": replicas * vig_activation_bytes(images, pixels, m, recompute),
        }
    else:
        nodes = ds.num_nodes
        edges = 0  # messages: PyG's message passing gathers one feature vector per edge
        if step_rows is not None:
            rows, edges = step_rows(cfg, ds)
        elif cfg.data.partitions:
            rows = -(-nodes // cfg.data.partitions)  # (its edges: unknown before partitioning)
        else:
            rows = nodes
            edges = int(ds.data.edge_index.size(1))
        # per hidden block (the last one outputs classes): its output and its messages
        activations = (rows + edges) * m.hidden * m.heads * (m.layers - 1)
    return {"state": replicas * state, "activations": replicas * activations * FLOAT_BYTES}


# ViG, bytes per pixel of one training step, in units of the width C (4-byte floats). Saved for
# the backward pass per block (vig.ViGBlock._forward): the input of fc_in (C), the MRConv concat
# (2C), the GELU's input and output (2C), fc_out's sum y (C), the FFN's 4C-wide layer before and
# after its GELU (8C): 14 C, plus the winning neighbour per channel (C bytes) and the k
# neighbour indices (k int64). Measured on top of that (benchmarks/memory/vig_step_memory.py, 1 thread,
# glibc malloc, batches 8-32, C = 107): the backward's gradients of the widest layers and the
# heap glibc keeps after the forward's transients, ~30 C per pixel without recomputation; with
# --recompute, where the forward's transients of every piece pass through the heap first, ~64 C.
VIG_SAVED_FLOATS = 14
VIG_BACKWARD_FLOATS = 30
VIG_RECOMPUTE_FLOATS = 64
# and, whatever the batch, ~64 MiB more per step (the autograd graph, the optimizer's first
# state, allocator slack): the line through the measured peaks of 8-32 images crosses 0 there
VIG_STEP_BYTES = 64 << 20


def vig_activation_bytes(images: int, pixels: int, m, recompute: bool) -> int:
    """Estimated peak of one ViG training step's activations, in bytes, for ``images`` images
    of ``pixels`` pixels, ``m.layers`` blocks of width ``m.hidden`` (within 30% of the peak
    resident memory measured above the process's own, tests/runtime/test_footprint.py).

    Without ``recompute`` every block keeps its saved activations for the backward pass (~50 MB
    per CIFAR image at the study's C = 107, 8 blocks). With it, each block keeps only its input
    (C floats per pixel) and one piece of images (``vig.recompute_chunk``) at a time holds a
    block's whole activations again during the backward pass."""
    from gnnpar.models.vig import K_NEIGHBOURS, KNN_CHUNK_BYTES, RECOMPUTE_CHUNK_BYTES

    c, layers = m.hidden, m.layers
    k = min(K_NEIGHBOURS, pixels)
    saved = VIG_SAVED_FLOATS * c * FLOAT_BYTES + c + 8 * k  # one block, per pixel
    # the k-NN similarity scores of a few images at a time (vig.knn_graph), a transient
    scores = min(images, max(1, KNN_CHUNK_BYTES // (pixels * pixels * FLOAT_BYTES)))
    knn = scores * pixels * pixels * FLOAT_BYTES
    if not recompute:
        per_pixel = layers * saved + VIG_BACKWARD_FLOATS * c * FLOAT_BYTES
        return VIG_STEP_BYTES + knn + images * pixels * per_pixel
    per_image_input = pixels * c * FLOAT_BYTES
    piece = min(images, max(1, -(-RECOMPUTE_CHUNK_BYTES // per_image_input)))
    inputs = images * per_image_input * layers
    piece_bytes = piece * pixels * (saved + VIG_RECOMPUTE_FLOATS * c * FLOAT_BYTES)
    return VIG_STEP_BYTES + knn + inputs + piece_bytes
