"""Seeds: one call for every generator a run draws from before training starts."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Python, numpy and torch's global generators (model initialisation, dropout)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_rank_dropout(seed: int, rank: int) -> None:
    """Distinct dropout masks per rank after a shared initialisation (data-parallel copies)."""
    torch.manual_seed(seed + 1000 * (rank + 1))
