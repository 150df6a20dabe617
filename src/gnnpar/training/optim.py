"""The optimizer of a run, from ``--optimizer --lr --weight-decay`` (study defaults: config)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from gnnpar.config.schema import Config


def build_optimizer(cfg: Config, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
