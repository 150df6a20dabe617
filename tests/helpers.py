"""Helpers shared by the tests (``from helpers import ...``; tests/ is on sys.path through
pyproject.toml's ``pythonpath``): run the CLI in a subprocess, tiny hand-built graphs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
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


def rank_pids(launcher_pid: int, ranks: int, deadline_s: float = 30) -> list[int]:
    """The pids of the local ranks that ``gnnpar train --workers N`` (process ``launcher_pid``)
    started, in rank order: the children of its fork server (gnnpar's default), or its own
    children when spawned (not multiprocessing's resource tracker), which torch's agent starts
    one after the other in local-rank order (their environment is set after start, so it
    cannot tell)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        procs = {}  # pid: (parent, start time, cmdline)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            procs[int(entry.name)] = (int(stat[1]), int(stat[19]), cmdline)
        mine = [p for p, (parent, _, _) in procs.items() if parent == launcher_pid]
        servers = {p for p in mine if b"forkserver" in procs[p][2]}
        children = [
            (start, p)
            for p, (parent, start, cmdline) in procs.items()
            if parent in servers
            or (parent == launcher_pid and p not in servers and b"resource_tracker" not in cmdline)
        ]
        if len(children) >= ranks:
            return [pid for _, pid in sorted(children)[:ranks]]
        time.sleep(0.05)
    raise AssertionError(f"process {launcher_pid} did not start {ranks} ranks")


def wait_for_steps(metrics: Path, steps: int, proc: subprocess.Popen, deadline_s: float) -> None:
    """Until metrics.jsonl holds ``steps`` step records (the run is training)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()[1][-2000:]}")
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            if sum('"event": "step"' in line for line in lines) >= steps:
                return
        time.sleep(0.05)
    raise AssertionError(f"no {steps} steps in {metrics} within {deadline_s} s")


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
