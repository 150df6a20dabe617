"""Helpers shared by the tests (``from helpers import ...``; tests/ is on sys.path through
pyproject.toml's ``pythonpath``): run the CLI in a subprocess, tiny hand-built graphs. Finding a
run's ranks and waiting for its steps (:func:`rank_pids`, :func:`wait_for_steps`) have one home,
the benchmark harness, which the benchmarks use too (they never import from tests/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from benchmarks.harness import rank_pids, wait_for_steps  # noqa: F401 (the tests import them here)
from torch_geometric.data import Data

ROOT = Path(__file__).resolve().parents[1]

# The arithmetic of the pinned loss curves (tests/e2e/test_same_seed_same_loss.py), the same on every
# x86-64 CPU: float32 reductions take other paths by instruction set (an AVX-512 CPU's ViG loss
# differs from an AVX2 CPU's in the 7th digit), so the curve runs use the lowest level of each
# library that dispatches by CPU: ATen's vectorised kernels ("default": no AVX), MKL's BLAS
# (conditional numerical reproducibility, SSE2 code paths) and oneDNN's convolutions and matmuls
# (SSE4.1). Every x86-64 CPU since 2008 takes these paths. The variables are read when torch
# first computes, so they must be in a process's environment from its start.
PINNED_ARITHMETIC = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
}
# The arithmetic of an AVX2 CPU without AVX-512 (ATen, MKL and oneDNN each told to go no
# higher; a CPU without AVX2 computes at its own highest level): the pinned curves' test checks
# these paths against the pinned curves to rounding too, whatever CPU runs the suite.
AVX2_ARITHMETIC = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


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


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """`python -m gnnpar ARGS` started in the background (text pipes), for fault injection."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "gnnpar", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=ROOT,
    )


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


def assert_trimming_exact(data, x: torch.Tensor) -> None:
    """A SAGE of one layer per hop of ``data`` (a sampled batch as PyG's NeighborLoader gives
    it), run as PyG's examples/hierarchical_sampling.py runs it (``trim_to_layer`` before each
    layer) and over the whole subgraph: equal seed outputs, equal gradients of the parameters
    and of the input features ``x`` (train mode, no dropout)."""
    from torch_geometric.nn import SAGEConv
    from torch_geometric.utils import trim_to_layer

    torch.manual_seed(0)
    dims = [x.size(1)] + [16] * (len(data.num_sampled_edges) - 1) + [5]
    convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))
    results = []
    for trim in (False, True):
        convs.zero_grad()
        h, edge_index = x.clone().requires_grad_(), data.edge_index
        xin = h
        for i, conv in enumerate(convs):
            if trim:
                h, edge_index, _ = trim_to_layer(
                    i, data.num_sampled_nodes, data.num_sampled_edges, h, edge_index
                )
            h = conv(h, edge_index)
            h = h.relu() if i < len(convs) - 1 else h
        out = h[: data.batch_size]
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in convs.parameters()], xin.grad))
        if trim:  # the last layer ran on the seeds and hop 1 only
            assert h.size(0) == sum(data.num_sampled_nodes[:2]) < x.size(0)
    (full, g_full, x_full), (trimmed, g_trim, x_trim) = results
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-6)
    for a, b in zip(g_trim, g_full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x_trim, x_full, rtol=1e-5, atol=1e-6)
