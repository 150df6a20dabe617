"""Refuse a run whose model cannot fit in memory, before anything is allocated.

``--hidden 2000000`` would otherwise end in the kernel's OOM killer (or a swap storm) minutes
into a run, with no message. :func:`check_memory` runs in every rank once the dataset is loaded,
before the strategy builds its model, and raises :class:`gnnpar.UsageError` (exit 2) naming the
estimate and what is available, both in GiB.

The estimate is a *lower bound* of what the ranks on this machine (or GPU) hold at once:

- model state, exact: parameters x 4 bytes x (weights + gradients + the optimizer's slots: Adam
  keeps 2 per parameter, SGD without momentum none). The parameter count comes from building the
  model on PyTorch's ``meta`` device, which records shapes and allocates nothing, so it follows
  the model code instead of a formula that could drift from it.
- activations, partly: each hidden block's output (``--hidden`` x ``--heads`` floats per row, kept
  for the backward pass) for the rows of one training step, i.e. every node of a full-batch graph,
  ``nodes / --partitions`` for a Cluster-GCN step, ``--batch-size`` seed nodes for a sampled step
  (their sampled neighbours not counted); and each hidden block's messages, one vector of the
  same width per edge (PyG's message passing gathers them, and keeps them for the backward
  pass): every edge of a full-batch graph, one per seed and first-hop fan-out for a sampled step,
  none counted for a Cluster-GCN step (its edges are known only after partitioning).
- ViG is an estimate rather than a bound (:func:`vig_activation_bytes`: what each block saves
  for its backward pass, counted from the code, plus a measured allowance for the backward's
  gradients and glibc's heap; within 30% of the measured peak). A ViG batch that does not fit
  but would with ``--recompute`` gets it, with one line saying so (study 000's 1000 images: ~52
  GiB without, ~7 GiB with); one that fits in neither is refused with both figures.

Measured (2026-11-22, CI box, load ~5): ``--model gcn --hidden 20000`` on Cora, estimate 1.4 GiB,
peak RSS 3.2 GiB (0.35 GiB of it the bare process): the real need is about twice the bound.
``--hidden 200000`` is estimated at 14.2 GiB (6.3 GiB before messages were counted, when such a
run passed the check and was killed by the kernel's OOM killer).
- copies: one per model replica on this machine (``LOCAL_WORLD_SIZE / --stages``).

Before ``--workers N`` local ranks are started, :func:`gnnpar.runtime.launch.check_ranks`
refuses N whose bare processes alone exceed the available memory (:func:`available_bytes`).

Left out, so the real need is higher: layer inputs and messages, attention coefficients,
sampled neighbourhoods, the dataset itself, and the ~0.3 GiB that Python, torch and PyG take
per process. A refused run cannot fit; a run that passes may still run out of memory. The
figure compared against is the kernel's ``MemAvailable`` (/proc/meminfo), or the headroom under
the memory cgroup's limit where that is smaller (a container's, SLURM's ``--mem``:
:mod:`gnnpar.runtime.resources`; the refusal then names the limit), or, on a GPU, the free
device memory; where none can be read the check is skipped.
"""

from __future__ import annotations

import sys

import torch

from gnnpar.config.schema import Config
from gnnpar.errors import UsageError
from gnnpar.runtime.resources import MemoryBudget, available_memory

FLOAT_BYTES = 4
GIB = 2**30
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


def estimate_bytes(cfg: Config, ds, replicas: int, recompute: bool | None = None) -> dict[str, int]:
    """Bytes of ``state`` (weights, gradients, optimizer) and ``activations`` for ``replicas``
    copies of the model (lower bounds, ViG's an estimate; see the module docstring for what is
    counted). ``recompute``: ViG's, if not ``cfg.model.recompute``."""
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
        if s.name == "sampled":
            rows = min(s.batch_size, nodes)
            edges = rows * max(1, (s.fanouts or [1])[0])  # the seeds' first hop
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


def memory_budget(device: torch.device) -> MemoryBudget | None:
    """What the run may still allocate on ``device``, and where the figure comes from: free GPU
    memory; on the host the smaller of the kernel's MemAvailable and the memory cgroup's
    headroom (:func:`gnnpar.runtime.resources.available_memory`: a container's or SLURM's
    limit, v1 or v2); None if unknown."""
    if device.type == "cuda":
        return MemoryBudget(int(torch.cuda.mem_get_info(device)[0]), None)
    return available_memory()


def available_bytes(device: torch.device) -> int | None:
    """Free memory the run can use (:func:`memory_budget`), in bytes; None if unknown. The one
    figure every footprint check, cache size and prediction of the run's memory reads."""
    budget = memory_budget(device)
    return None if budget is None else budget.free


def where_available(budget: MemoryBudget, device: torch.device) -> str:
    """Words for what a refused run was compared against: ``this GPU has 3.1 GiB available``,
    ``this machine has 20.1 GiB available`` or ``the memory cgroup's limit of 3.0 GiB leaves
    2.7 GiB available``."""
    if budget.limit is not None:
        return f"{budget.limit.words()} leaves {budget.free / GIB:.1f} GiB available"
    where = "this GPU" if device.type == "cuda" else "this machine"
    return f"{where} has {budget.free / GIB:.1f} GiB available"


def check_memory(
    cfg: Config, ds, local_world: int, device: torch.device, announce: bool = True
) -> None:
    """UsageError when the estimate of :func:`estimate_bytes` exceeds the free memory. A ViG run
    that would fit only with ``--recompute`` gets it (``cfg.model.recompute`` set; one line on
    stderr where ``announce``)."""
    budget = memory_budget(device)
    if budget is None:
        return
    free = budget.free
    stages = cfg.strategy.stages if cfg.strategy.name in ("pipeline", "hybrid") else 1
    replicas = 1 if device.type == "cuda" else max(1, local_world // stages)
    need = estimate_bytes(cfg, ds, replicas)
    total = sum(need.values())
    if total <= free:
        return
    m = cfg.model
    total_lean = None
    if m.name == "vig" and not m.recompute:
        # a run that fits is better than one refused: re-materialise the blocks' activations
        total_lean = sum(estimate_bytes(cfg, ds, replicas, recompute=True).values())
        if total_lean <= free:
            m.recompute = True
            if announce:
                print(
                    f"gnnpar: --batch-size {cfg.strategy.batch_size} of ViG needs ~"
                    f"{total / GIB:.1f} GiB of activations and state, {free / GIB:.1f} GiB are "
                    f"available: --recompute is on (~{total_lean / GIB:.1f} GiB, about "
                    "one more forward pass of compute)",
                    file=sys.stderr,
                    flush=True,
                )
            return
    copies = f" for {replicas} local ranks" if replicas > 1 else ""
    raise UsageError(
        f"--model {m.name} --hidden {m.hidden} --layers {m.layers}"
        + (f" --heads {m.heads}" if m.name.startswith("gat") else "")
        + f" on '{ds.name}' needs at least {total / GIB:.1f} GiB{copies} (model state "
        f"{need['state'] / GIB:.1f} GiB, activations {need['activations'] / GIB:.1f} GiB), but "
        f"{where_available(budget, device)}. Use a smaller --hidden or --layers"
        + (", more --partitions" if cfg.data.partitions else "")
        + (", a smaller --batch-size" if cfg.strategy.name == "sampled" or m.name == "vig" else "")
        + (" or fewer --workers." if replicas > 1 else ".")
        + (
            f" Even with --recompute it needs {total_lean / GIB:.1f} GiB."
            if total_lean is not None
            else ""
        )
    )
