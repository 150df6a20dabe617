"""Shared test helpers: run the CLI in a subprocess, tiny hand-built graphs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str, timeout: float = 240, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m gnnpar ARGS` in a fresh process; returns the completed process (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gnnpar", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


@pytest.fixture
def cli():
    return run_cli


def tiny_graph() -> Data:
    """6 nodes, two triangles joined by one edge (2-3), symmetric; 2 classes; 4 features."""
    src = [0, 1, 1, 2, 0, 2, 2, 3, 3, 4, 4, 5, 3, 5]
    dst = [1, 0, 2, 1, 2, 0, 3, 2, 4, 3, 5, 4, 5, 3]
    x = torch.arange(24, dtype=torch.float).view(6, 4) / 24
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    train = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.bool)
    val = torch.tensor([0, 1, 0, 0, 0, 0], dtype=torch.bool)
    test = torch.tensor([0, 0, 0, 0, 1, 0], dtype=torch.bool)
    return Data(
        x=x,
        edge_index=torch.tensor([src, dst]),
        y=y,
        train_mask=train,
        val_mask=val,
        test_mask=test,
    )


@pytest.fixture
def graph6() -> Data:
    return tiny_graph()
