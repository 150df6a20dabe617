"""What every strategy returns, and the shared pieces of a training step.

A strategy is a class with

* ``validate_config(cfg)`` (static, optional): checks that need no data, run before any process
  is launched; raise :class:`gnnpar.UsageError`.
* ``run(cfg, dataset, ctx) -> Outcome``: trains on every rank; each rank returns its Outcome and
  rank 0's is written to result.json (so per-rank lists must already be gathered on rank 0).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gnnpar.config import Config


@dataclass
class Outcome:
    train_time_s: float
    step_times: list[float]
    test_step_times: list[float]
    loss_curve: list[float] | dict[str, list[float]]
    per_worker_batches: list[int]
    val_score: float
    test_score: float
    partition_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # strategy-specific result.json keys


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_optimizer(cfg: Config, params) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)


class Straggler:
    """Emulated heterogeneity (study 003's non-dedicated cluster).

    ``slowdown`` F makes a step take F times as long: after a step of t seconds we sleep (F-1)*t.
    ``jitter`` X adds, with probability 0.1 per step, a transient pause of up to X times the step.
    """

    def __init__(self, factor: float = 1.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.factor = factor
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.delay_s = 0.0

    def after_step(self, step_s: float) -> None:
        pause = (self.factor - 1.0) * step_s
        if self.jitter > 0 and self.rng.random() < 0.1:
            pause += self.rng.uniform(0, self.jitter) * step_s
        if pause > 0:
            time.sleep(pause)
            self.delay_s += pause
