"""Checkpoints of a training run, and resuming from the newest good one.

``--checkpoint-every N`` (epochs) or ``--checkpoint-every-steps N`` writes
``<out>/checkpoints/epoch-EEEEEE-step-SSSSSSSS/``; ``--resume`` (or a restart by the elastic
agent, ``--max-restarts``) continues from the newest one that loads. What a checkpoint holds,
per rank: the model, the optimizer state, every random generator (torch, CUDA, numpy, python:
dropout and anything else drawn), and the loop's own state — where it is, the metrics so far,
the source's position (a generator's state, the gossip work pool's counter and the subgraph a
rank had taken but not trained), the sync policy's counters (steps since the last averaging,
gossip exchange counts and ids), the straggler's generator. With it, a deterministic run
resumed from a checkpoint ends bit-for-bit where the uninterrupted run ends.

Format: torch.distributed.checkpoint (DCP), because the ranks hold *different* state — gossip
and allreduce with K > 1 keep one model per rank under the same parameter names, pipelines one
stage per rank, and Adam's moments are per rank — and DCP writes every rank's part in parallel
into one checkpoint with one metadata file, and reads it back collectively (a damaged part fails
the load on every rank alike). Each rank's state lives under ``rank<R>/`` so that DCP does not
take two ranks' equal names for one replicated tensor. Non-tensor state goes into one
``io.BytesIO`` blob per rank. A single process uses the same format (DCP without a group).

Atomicity: each checkpoint is written into a hidden temporary folder and renamed into place by
rank 0 once every rank has written (DCP fsyncs its files); ``gnnpar.json`` in it says what it is.
The last ``KEEP`` checkpoints are kept. On resume a checkpoint that fails to load is reported
and the one before it is tried.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from gnnpar import UsageError
from gnnpar.collectives import barrier
from gnnpar.config import Config
from gnnpar.dist import restart_count

KEEP = 2
MARKER = "gnnpar.json"


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Resumed:
    """What :meth:`Checkpointer.load` found: where to continue, and the loop's own state."""

    epoch: int  # the epoch to continue in
    step: int  # steps of that epoch already done
    loop: dict[str, Any]  # RankLog, source, sync, straggler, eval times
    path: Path
    saved_at: float  # time.time() when it was written


class Checkpointer:
    """Writes and finds the checkpoints of one run (every rank holds one)."""

    def __init__(
        self, out: str, rank: int, world: int, every: int, every_steps: int, resume: bool
    ) -> None:
        self.folder = Path(out) / "checkpoints"
        self.rank, self.world = rank, world
        self.every, self.every_steps = every, every_steps
        self.resume = resume  # look for a checkpoint to continue from
        self.config: dict = {}  # the run's settings, checked against a checkpoint's
        self.saved: list[float] = []  # seconds each save took (result.json)
        self.resumed_at = 0.0

    def report(self, resumed: Resumed | None) -> dict[str, Any]:
        """result.json keys: checkpoints written and their cost, restarts, time lost."""
        from gnnpar.metrics import summarize

        out: dict[str, Any] = {
            "checkpoints_written": len(self.saved),
            "checkpoint_time_s": summarize(self.saved),
            "restarts": restart_count(),
        }
        if resumed is not None:
            out["resumed_from"] = str(resumed.path)
            # from the checkpoint's writing to this attempt's restoring it: the work done after
            # it and lost, finding the failure, restarting the ranks and setting them up again
            out["lost_time_s"] = max(0.0, self.resumed_at - resumed.saved_at)
        return out

    @property
    def enabled(self) -> bool:
        return bool(self.every or self.every_steps)

    def due_epoch(self, epochs_done: int) -> bool:
        return bool(self.every) and epochs_done % self.every == 0

    def due_step(self, steps_done: int) -> bool:
        return bool(self.every_steps) and steps_done % self.every_steps == 0

    # ---------------------------------------------------------------------------------- save
    def save(
        self, model, optimizer, epoch: int, step: int, loop: Callable[[], dict], config: dict
    ) -> Path:
        """Collective: every rank writes its part; returns the checkpoint's folder. ``loop()``
        gives the loop's state, taken once every rank has arrived (a gossip rank's work pool
        position is only final then)."""
        t0 = time.perf_counter()
        name = f"epoch-{epoch:06d}-step-{step:08d}"
        final = self.folder / name
        tmp = self.folder / f".tmp-{name}"
        if self.rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        barrier()
        msd, osd = get_state_dict(model, optimizer)
        blob = io.BytesIO()
        torch.save({**loop(), "rng": rng_state()}, blob)
        blob.seek(0)
        dcp.save(
            {f"rank{self.rank}": {"model": msd, "optim": osd, "loop": blob}}, checkpoint_id=tmp
        )
        if self.rank == 0:
            marker = {"epoch": epoch, "step": step, "world": self.world, "time": time.time()}
            marker["config"] = config
            (tmp / MARKER).write_text(json.dumps(marker, indent=1, default=str))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.folder)
            for old in self.valid_folders()[:-KEEP]:
                shutil.rmtree(old, ignore_errors=True)
        barrier()  # nobody trains on while the checkpoint could still be renamed
        self.saved.append(time.perf_counter() - t0)
        return final

    # ---------------------------------------------------------------------------------- load
    def valid_folders(self) -> list[Path]:
        return complete_checkpoints(self.folder.parent)

    def load(self, model, optimizer, warn: Callable[[str], None]) -> Resumed | None:
        """Restore the newest checkpoint that loads (collective); None when there is none."""
        for path in reversed(self.valid_folders()):
            try:
                marker = json.loads((path / MARKER).read_text())
            except (OSError, json.JSONDecodeError):
                warn(f"checkpoint {path} has an unreadable {MARKER}; trying the one before")
                continue
            different = config_differences(marker.get("config") or {}, self.config)
            if different:
                raise UsageError(
                    f"checkpoint {path} was written by a different run ({'; '.join(different)}). "
                    "Resume with the same settings, or use another --out."
                )
            if marker.get("world") != self.world:
                raise UsageError(
                    f"checkpoint {path} was written by {marker.get('world')} ranks; this run "
                    f"has {self.world}. Resume with the same number of ranks."
                )
            msd, osd = get_state_dict(model, optimizer)
            blob = io.BytesIO()
            state = {f"rank{self.rank}": {"model": msd, "optim": osd, "loop": blob}}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    dcp.load(state, checkpoint_id=path)
            except (Exception, CheckpointException) as e:  # a damaged part: every rank alike
                warn(f"checkpoint {path} is damaged ({type(e).__name__}); trying the one before")
                continue
            mine = state[f"rank{self.rank}"]
            set_state_dict(
                model, optimizer, model_state_dict=mine["model"], optim_state_dict=mine["optim"]
            )
            mine["loop"].seek(0)
            loop = torch.load(mine["loop"], weights_only=False)  # our own blob, just written
            set_rng_state(loop.pop("rng"))
            self.resumed_at = time.time()
            return Resumed(marker["epoch"], marker["step"], loop, path, marker["time"])
        return None


# settings a resumed run may change: how long it trains, how it checkpoints, what it shows
RESUMABLE = {
    "run": {"epochs", "out", "quiet", "resume", "max_restarts", "checkpoint_every",
            "checkpoint_every_steps", "tensorboard", "threads", "eval_every"},
    "strategy": {"timeout_s", "workers"},
    "data": {"data_root"},
}  # fmt: skip


def config_differences(saved: dict, current: dict) -> list[str]:
    """Settings (other than :data:`RESUMABLE` ones) in which two runs differ. A setting newer
    than the checkpoint (absent from its config, e.g. ``precision``) counts as its default."""
    out = []
    defaults = Config().to_dict()
    for section, values in current.items():
        for key, value in values.items():
            if key in RESUMABLE.get(section, set()):
                continue
            old = saved.get(section, {}).get(key, defaults.get(section, {}).get(key))
            if json.dumps(old, default=str) != json.dumps(value, default=str):
                out.append(f"{section}.{key}: {old!r} there, {value!r} here")
    return out


def complete_checkpoints(out: str | Path) -> list[Path]:
    """The complete checkpoints in ``<out>/checkpoints/`` (renamed into place, marker
    written), oldest first."""
    folder = Path(out) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: p.name)


def clear(out: str) -> Path | None:
    """A fresh run's --out must not hold an earlier run's checkpoints (a restart would resume
    from them): remove them. Returns the folder removed, if any."""
    folder = Path(out) / "checkpoints"
    if not folder.exists():
        return None
    shutil.rmtree(folder, ignore_errors=True)  # under torchrun every rank may try at once
    return folder


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
