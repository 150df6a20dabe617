"""Refuse a run whose model cannot fit in memory, before anything is allocated.

``--hidden 2000000`` would otherwise end in the kernel's OOM killer (or a swap storm) minutes
into a run, with no message. :func:`check_memory` runs in every rank once the dataset is loaded,
before the strategy builds its model, and raises :class:`gnnpar.UsageError` (exit 2) naming the
estimate and what is available, both in GiB.

The estimate (:func:`gnnpar.models.memory.estimate_bytes`, next to the models it counts: model
state exactly, activations partly, ViG's estimated) is a *lower bound* of what the ranks on this
machine (or GPU) hold at once, one copy per model replica on this machine (``LOCAL_WORLD_SIZE /
--stages``).

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
from collections.abc import Callable
from typing import Any

import torch

from gnnpar.config.schema import Config
from gnnpar.data import cache_writer
from gnnpar.errors import UsageError
from gnnpar.models.memory import estimate_bytes
from gnnpar.runtime.resources import MemoryBudget, available_memory

GIB = 2**30


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
    cfg: Config,
    ds,
    local_world: int,
    device: torch.device,
    announce: bool = True,
    *,
    stages: int = 1,
    step_rows: Callable[[Config, Any], tuple[int, int]] | None = None,
    batch_sized: bool = False,
) -> None:
    """UsageError when the estimate of :func:`estimate_bytes` exceeds the free memory. A ViG run
    that would fit only with ``--recompute`` gets it (``cfg.model.recompute`` set; one line on
    stderr where ``announce``). The strategy's facts (``StrategySpec.memory``): ``stages`` of a
    pipeline (the machine's ranks hold ``local_world / stages`` copies), ``step_rows`` (see
    :func:`estimate_bytes`), ``batch_sized`` (a refusal suggests a smaller --batch-size)."""
    budget = memory_budget(device)
    if budget is None:
        return
    free = budget.free
    early = cache_writer.started()
    if early is not None and device.type != "cuda":  # the feature cache, written before this
        free += early.held_bytes()  # check where gnnpar train started it early, is sized after it
    replicas = 1 if device.type == "cuda" else max(1, local_world // stages)
    need = estimate_bytes(cfg, ds, replicas, step_rows=step_rows)
    total = sum(need.values())
    if total <= free:
        return
    m = cfg.model
    total_lean = None
    if m.name == "vig" and not m.recompute:
        # a run that fits is better than one refused: re-materialise the blocks' activations
        total_lean = sum(
            estimate_bytes(cfg, ds, replicas, recompute=True, step_rows=step_rows).values()
        )
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
        + (", a smaller --batch-size" if batch_sized or m.name == "vig" else "")
        + (" or fewer --workers." if replicas > 1 else ".")
        + (
            f" Even with --recompute it needs {total_lean / GIB:.1f} GiB."
            if total_lean is not None
            else ""
        )
    )
