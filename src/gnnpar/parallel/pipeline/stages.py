"""Cutting a BlockModel into pipeline stages for torch.distributed.pipelining (GPipe, 1F1B).

Study 000 puts ViG blocks 0-3 on stage 0 and 4-7 plus the readout on stage 1; study 001 cuts a
GAT with torchgpipe's ``balance``. Here:

* :func:`profile_blocks` and :func:`split_by_cost` are torchgpipe's balance-by-time: time each
  block's forward + backward on a real micro-batch, then cut the block list into contiguous
  groups that minimise the slowest stage (exhaustive over the cut points; models have at most a
  few dozen blocks).
* :class:`StageModule` is blocks ``[lo, hi)`` with the stem on the first stage and the head
  (readout) on the last. Graph micro-batches carry no graph: each stage looks up micro-batch
  ``mb``'s ``edge_index`` in the plan every rank computed (data/microbatch.py), so only
  activations cross stage boundaries.
* :func:`build_stage` gives ``PipelineStage`` static input/output shapes and dtypes: its
  runtime shape inference hangs on gloo in torch 2.13. Under ``--precision bf16`` the dtypes
  are those a probe forward under the run's autocast produced at each cut (bfloat16 after a
  linear layer: half the bytes on the wire; gloo sends bfloat16), and each stage casts its
  output to the declared dtype, the last one to fp32 for the loss. ScheduleGPipe sends and receives with plain
  ``isend``/``irecv`` (homogeneous batches skip ``batch_isend_irecv``); Schedule1F1B mixes sends
  and receives in one ``batch_isend_irecv``, which on gloo (no coalescing) is a loop of plain
  ``isend``/``irecv`` since pytorch#152938 fixed the lost-work hang of pytorch#132644.
* :func:`summed_loss` sums the loss over a micro-batch's rows and divides by the number of
  targets in the *whole* step, so the sum over micro-batches (and over replicas) is the
  full-batch mean loss and gradient; the schedules then run with ``scale_grads=False``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from gnnpar.data.microbatch import IGNORE
from gnnpar.models.base import BlockModel


def gpipe_bound(stages: int, chunks: int) -> float:
    """GPipe's best speed-up over one process: S*M/(M+S-1) (the fill/drain bubble)."""
    return stages * chunks / (chunks + stages - 1)


def bounds(balance: Sequence[int]) -> list[tuple[int, int]]:
    """[2, 3] -> [(0, 2), (2, 5)]: the block range of each stage."""
    ends = list(itertools.accumulate(balance))
    return [(e - b, e) for b, e in zip(balance, ends)]


def split_by_cost(costs: Sequence[float], stages: int) -> list[int]:
    """Blocks per stage (contiguous) minimising the costliest stage; ties: the most even split."""
    n = len(costs)
    best: tuple[float, float, list[int]] | None = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        loads = [sum(costs[a:b]) for a, b in itertools.pairwise(edges)]
        key = (max(loads), max(loads) - min(loads))
        if best is None or key < best[:2]:
            best = (*key, [b - a for a, b in itertools.pairwise(edges)])
    assert best is not None
    return best[2]


def profile_blocks(
    model: BlockModel,
    x: torch.Tensor,
    edge_index: torch.Tensor | None,
    repeats: int = 3,
) -> list[float]:
    """Forward+backward seconds of each block on one micro-batch (stem and head folded into the
    first and last block, where they run): the minimum over repeats, since other processes on
    a shared machine can only add time, never remove it."""
    samples: list[list[float]] = [[] for _ in model.blocks]
    for _ in range(repeats):
        t0 = time.perf_counter()
        h = model.stem(x)
        stem_s = time.perf_counter() - t0
        for i, block in enumerate(model.blocks):
            inp = h.detach().requires_grad_(h.is_floating_point())
            t0 = time.perf_counter()
            out = block(inp, edge_index)
            if i == len(model.blocks) - 1:
                out = model.head(out)
            out.backward(torch.ones_like(out))
            samples[i].append(time.perf_counter() - t0 + (stem_s if i == 0 else 0.0))
            h = out.detach()
    model.zero_grad(set_to_none=True)
    return [min(s) for s in samples]


class StageModule(nn.Module):
    """Blocks [lo, hi) of a BlockModel; stem on the first stage, head on the last.

    ``graphs[mb]`` is micro-batch ``mb``'s edge_index (None for image models, whose blocks build
    their own graphs). The schedule passes ``mb`` as a one-element tensor keyword argument, so
    every stage knows which micro-batch it is running without receiving the graph.
    """

    def __init__(
        self,
        model: BlockModel,
        lo: int,
        hi: int,
        first: bool,
        last: bool,
        graphs: list[torch.Tensor] | None,
        out_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.stem = model.stem if first else nn.Identity()
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.head = model.head if last else nn.Identity()
        self.graphs = graphs
        self.out_dtype = out_dtype  # what PipelineStage was told this stage sends

    def forward(self, x: torch.Tensor, mb: torch.Tensor) -> torch.Tensor:
        edge_index = None if self.graphs is None else self.graphs[int(mb[0])]
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, edge_index)
        return self.head(x).to(self.out_dtype)  # fp32 runs: the same tensor


@torch.no_grad()
def boundary_shapes(
    model: BlockModel,
    x: torch.Tensor,
    edge_index: torch.Tensor | None,
    balance: Sequence[int],
) -> list[tuple[torch.Size, torch.dtype]]:
    """(shape, dtype) of the stage inputs and the final output for one micro-batch:
    len(balance)+1. Dtypes as computed in the caller's precision (autocast), but the final
    output is fp32 (the loss and the scores read it)."""
    was_training = model.training
    model.eval()
    shapes = [(x.shape, x.dtype)]
    h = model.stem(x)
    for lo, hi in bounds(balance):
        for block in model.blocks[lo:hi]:
            h = block(h, edge_index)
        shapes.append((h.shape, h.dtype))
    shapes[-1] = (model.head(h).shape, torch.float32)
    model.train(was_training)
    return shapes


def build_stage(
    module: StageModule,
    index: int,
    num_stages: int,
    inputs: tuple[torch.Size, torch.dtype],
    outputs: tuple[torch.Size, torch.dtype],
    device: torch.device,
    group: dist.ProcessGroup | None,
) -> PipelineStage:
    """A PipelineStage with static shapes and dtypes (no runtime inference, which hangs on
    gloo); ``module.out_dtype`` must be ``outputs``' dtype."""
    x = torch.zeros(inputs[0], dtype=inputs[1], device=device, requires_grad=index > 0)
    y = torch.zeros(outputs[0], dtype=outputs[1], device=device, requires_grad=True)
    return PipelineStage(
        module, index, num_stages, device, input_args=(x,), output_args=(y,), group=group
    )


def make_schedule(
    stage: PipelineStage, chunks: int, loss: Callable | None, schedule: str = "gpipe"
) -> ScheduleGPipe | Schedule1F1B:
    cls = Schedule1F1B if schedule == "1f1b" and loss is not None else ScheduleGPipe
    return cls(stage, chunks, loss_fn=loss, scale_grads=False)


def summed_loss(denominator: float, multilabel: bool) -> Callable:
    """Loss of one micro-batch: summed over its rows, divided by the whole step's target count.

    Single-label targets use IGNORE (-100) on rows without loss. Multi-label targets carry a
    last column of row weights (1 = counted); BCE is averaged over classes as in the mean loss.
    """

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not multilabel:
            return F.cross_entropy(out, target, ignore_index=IGNORE, reduction="sum") / denominator
        weight = target[:, -1:]
        bce = F.binary_cross_entropy_with_logits(out, target[:, :-1], reduction="none")
        return (bce * weight).sum() / (denominator * out.size(1))

    return loss


def run_schedule(
    schedule: ScheduleGPipe | Schedule1F1B,
    first: bool,
    last: bool,
    chunks: int,
    x: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    losses: list | None = None,
) -> torch.Tensor | None:
    """One pipeline step: the first stage feeds ``x``, the last gets ``target`` (and returns the
    merged output), every stage gets the micro-batch index."""
    kwargs: dict = {"mb": torch.arange(chunks)}
    if last and target is not None:
        kwargs.update(target=target, losses=losses)
    args = (x,) if first else ()
    return schedule.step(*args, **kwargs)


# Rank 0 times the blocks on at most this many images of a micro-batch while the other ranks
# wait (within --timeout): 3 timed passes of a 200-image ViG micro-batch take minutes at 1 thread.
PROFILE_IMAGES = 16


def choose_balance(cfg, model: BlockModel, job) -> tuple[list[int], list[float] | None]:
    """--balance, or rank 0 profiles each block on a real micro-batch (of images: at most
    :data:`PROFILE_IMAGES` of it) and tells the rest."""
    if cfg.strategy.balance is not None:
        return list(cfg.strategy.balance), None
    box: list = [None, None]
    if dist.get_rank() == 0:
        x0, ei0 = job.probe()  # one micro-batch (the shape a stage sends)
        if ei0 is None:  # images: a block's time grows alike with the images for every block
            x0 = x0[:PROFILE_IMAGES]
        times = profile_blocks(model, x0, ei0)
        box = [split_by_cost(times, cfg.strategy.stages), times]
    dist.broadcast_object_list(box, src=0)
    return box[0], box[1]
