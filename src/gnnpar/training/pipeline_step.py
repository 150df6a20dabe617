"""The pipeline's step: one ``schedule.step`` of this rank's stage (torch.distributed.pipelining).

:class:`PipelineStep` builds this rank's stage twice, with the training micro-batch shapes
(GPipe or 1F1B with the loss and backward) and with the evaluation shapes (forward-only GPipe),
both sharing the parameters; static shapes throughout (see :mod:`gnnpar.parallel.pipeline.stages`).
The loop runs each step and evaluation under ``--precision`` (:mod:`gnnpar.training.precision`); the
stage boundaries carry the dtypes that precision produces there.
"""

from __future__ import annotations

import time

import torch

from gnnpar.config.schema import Config
from gnnpar.parallel.pipeline.stages import (
    StageModule,
    boundary_shapes,
    bounds,
    build_stage,
    make_schedule,
    run_schedule,
    summed_loss,
)
from gnnpar.training.pipeline_batches import Batch, StagePlace
from gnnpar.training.precision import autocast


class PipelineStep:
    """This rank's stage, once with the training shapes (schedule with loss and backward) and
    once with the evaluation shapes (forward-only GPipe), sharing the parameters. Called with a
    step's :class:`~gnnpar.training.pipeline_batches.Batch`, it runs one ``schedule.step``: the loop's
    one pipeline branch. Returns the copy's own mean loss on the last stage, else None."""

    def __init__(
        self, cfg: Config, model, job, mesh: StagePlace, balance: list[int], device
    ) -> None:
        S, M, idx = mesh.stages, cfg.strategy.chunks, mesh.stage
        self.first, self.last, self.M, self.model = idx == 0, idx == S - 1, M, model
        lo, hi = bounds(balance)[idx]
        loss = summed_loss(job.denominator, job.ds.multilabel)
        self.boundary_dtypes: list[str] = []  # what crosses each cut in training (result.json)
        self.train_sched, self.train_mod = self._stage(
            model, job, mesh, balance, lo, hi, job.train_graphs, False, device, loss, cfg
        )
        self.eval_sched, _ = self._stage(
            model, job, mesh, balance, lo, hi, job.eval_graphs, True, device, None, cfg
        )

    def _stage(self, model, job, mesh, balance, lo, hi, graphs, for_eval, device, loss, cfg):
        x0, ei0 = job.probe(for_eval)
        with autocast(cfg.run.precision, device):  # the dtypes the stages will send
            shapes = boundary_shapes(model, x0, ei0, balance)
        if not for_eval:
            self.boundary_dtypes = [str(dtype).removeprefix("torch.") for _, dtype in shapes[1:-1]]
        idx = mesh.stage
        module = StageModule(model, lo, hi, self.first, self.last, graphs, shapes[idx + 1][1])
        stage = build_stage(
            module,
            idx,
            mesh.stages,
            shapes[idx],
            shapes[idx + 1],
            device,
            mesh.pipe_group,
        )
        return make_schedule(stage, self.M, loss, cfg.strategy.schedule), module

    def stage_state(self) -> dict[str, torch.Tensor]:
        """This stage's entries of the whole model's state dict (its blocks, stem or head)."""
        mine = {id(t) for t in (*self.train_mod.parameters(), *self.train_mod.buffers())}
        state = self.model.state_dict(keep_vars=True)
        return {k: v.detach().clone() for k, v in state.items() if id(v) in mine}

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.train_mod.parameters() if p.requires_grad]

    def __call__(self, batch: Batch) -> float | None:
        losses = self.micro_losses(batch)
        return sum(float(v.detach()) for v in losses) * batch.own_scale if self.last else None

    def micro_losses(self, batch: Batch) -> list:
        """One schedule step; the micro-batches' losses (last stage), gradients accumulated."""
        losses: list = []
        run_schedule(self.train_sched, self.first, self.last, self.M, batch.x, batch.target, losses)
        return losses

    @torch.no_grad()
    def evaluate(self, job) -> tuple[object, list[float]]:
        """Forward every evaluation batch through the pipeline; the last stage collects."""
        self.model.eval()
        job.start_collect()
        times = []
        for timed, x, context in job.eval_batches():
            t0 = time.perf_counter()
            out = run_schedule(self.eval_sched, self.first, self.last, self.M, x)
            if timed:
                times.append(time.perf_counter() - t0)
            if self.last:
                job.collect(out, context)
        self.model.train()
        return (job.payload() if self.last else None), times
