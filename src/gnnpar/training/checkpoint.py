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
and the one before it is tried; when none loads (every one damaged, truncated, or not gnnpar's),
``--resume`` and an elastic restart stop with a UsageError (exit 2) naming the folder, rather
than train afresh over it.

Loading runs no code from the files (:mod:`gnnpar.data.safe_load`): ``gnnpar.json`` is JSON; DCP
reads ``.metadata`` with plain ``pickle``, so it is first unpickled with an allowlist of DCP's
own metadata classes (:func:`metadata_allowed`), and a checkpoint whose ``.metadata`` names
anything else is not loaded; tensors DCP reads with ``weights_only=True``; the loop blob is
tensors and plain values (numpy's generator state as a list), read with ``weights_only=True``.
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
from gnnpar.config.schema import Config
from gnnpar.data import safe_load
from gnnpar.parallel.collectives import barrier, gather_to_all
from gnnpar.runtime.dist import restart_count

KEEP = 2
MARKER = "gnnpar.json"


def rng_state() -> dict[str, Any]:
    """Every global generator's state, as tensors and plain values (loadable with
    weights_only=True: numpy's key array is kept as a list of ints)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, key.tolist(), pos, has_gauss, gauss),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
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


@dataclass
class CheckpointStats:
    """This rank's checkpointing over the run (:meth:`Checkpointer.stats`)."""

    save_times: list[float]  # seconds each checkpoint took to write
    restarts: int  # restarts of the elastic agent before this attempt
    resumed_from: str | None = None  # the checkpoint this attempt continued from
    lost_time_s: float | None = None  # from that checkpoint's writing to its restoring


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

    def stats(self, resumed: Resumed | None) -> CheckpointStats:
        """Checkpoints written and their cost, restarts, time lost (for result.json)."""
        if resumed is None:
            return CheckpointStats(list(self.saved), restart_count())
        # from the checkpoint's writing to this attempt's restoring it: the work done after
        # it and lost, finding the failure, restarting the ranks and setting them up again
        lost = max(0.0, self.resumed_at - resumed.saved_at)
        return CheckpointStats(list(self.saved), restart_count(), str(resumed.path), lost)

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
        """Restore the newest checkpoint that loads (collective); None when there is none. A
        checkpoint that does not load (damaged, truncated, not a gnnpar checkpoint, or naming
        code to run) is reported and the one before it tried; UsageError when none loads."""
        tried: list[str] = []
        for path in reversed(self.valid_folders()):
            marker, why = read_marker(path)
            if marker is None:
                warn(f"checkpoint {path} {why}; trying the one before")
                tried.append(f"{path.name} {why}")
                continue
            different = config_differences(marker["config"], self.config)
            if different:
                raise UsageError(
                    f"checkpoint {path} was written by a different run ({'; '.join(different)}). "
                    "Resume with the same settings, or use another --out."
                )
            if marker["world"] != self.world:
                raise UsageError(
                    f"checkpoint {path} was written by {marker['world']} ranks; this run "
                    f"has {self.world}. Resume with the same number of ranks."
                )
            loop, why = self._read(path, model, optimizer)
            if loop is None:
                warn(f"checkpoint {path} {why}; trying the one before")
                tried.append(f"{path.name} {why}")
                continue
            self.resumed_at = time.time()
            return Resumed(marker["epoch"], marker["step"], loop, path, marker["time"])
        if tried:
            found = "; ".join(tried[:3]) + (f"; and {len(tried) - 3} more" if tried[3:] else "")
            raise UsageError(
                f"no checkpoint in {self.folder} can be resumed from ({found}). To start the "
                f"run afresh, delete {self.folder} (a run without --resume removes it too)."
            )
        return None

    def _read(self, path: Path, model, optimizer) -> tuple[dict[str, Any] | None, str]:
        """Load one checkpoint into the model, the optimizer and the generators (collective);
        ``(loop state, "")``, or ``(None, why)`` when it does not load on every rank."""
        why = check_metadata(path)  # DCP itself unpickles .metadata with no allowlist
        if why is not None:
            return None, why
        msd, osd = get_state_dict(model, optimizer)
        blob = io.BytesIO()
        state = {f"rank{self.rank}": {"model": msd, "optim": osd, "loop": blob}}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                dcp.load(state, checkpoint_id=path)
        except (Exception, CheckpointException) as e:  # a damaged part: every rank alike
            return None, f"is damaged ({type(e).__name__})"
        mine = state[f"rank{self.rank}"]
        loop, why = read_loop(mine["loop"])
        # a rank whose own part is damaged: every rank goes on to the one before, together
        failed = [w for w in gather_to_all(why) if w is not None]
        if failed:
            return None, failed[0]
        set_state_dict(
            model, optimizer, model_state_dict=mine["model"], optim_state_dict=mine["optim"]
        )
        set_rng_state(loop.pop("rng"))
        return loop, ""


LOOP_KEYS = ("log", "eval_times", "source", "sync", "straggler", "rng")


def read_loop(blob: io.BytesIO) -> tuple[dict[str, Any] | None, str | None]:
    """A rank's loop state from its checkpoint blob, read with weights_only=True (tensors and
    plain values; checkpoints written before it held numpy's generator state as an array, so
    numpy arrays are allowed too); ``(state, None)`` or ``(None, why)``."""
    blob.seek(0)
    try:
        loop = safe_load.torch_load(blob, safe_load.torch_pairs(safe_load.numpy_arrays()))
    except safe_load.Refused as e:
        return None, f"is not loaded: {e.why('its loop state')}"
    except Exception as e:
        return None, f"is damaged ({type(e).__name__})"
    if not isinstance(loop, dict) or not all(k in loop for k in LOOP_KEYS):
        return None, "is damaged (its loop state is not a gnnpar checkpoint's)"
    return loop, None


def read_marker(path: Path) -> tuple[dict[str, Any] | None, str]:
    """A checkpoint's ``gnnpar.json``: ``(marker, "")``, or ``(None, why)`` when it is not
    readable UTF-8 JSON holding what gnnpar writes (epoch, step, world, time, config)."""
    try:
        marker = json.loads((path / MARKER).read_bytes().decode("utf-8"))
    except OSError as e:
        return None, f"has an unreadable {MARKER} ({e.strerror or type(e).__name__})"
    except (UnicodeDecodeError, ValueError):  # JSONDecodeError is a ValueError
        return None, f"has an unreadable {MARKER} (not UTF-8 JSON)"
    foreign = None, f"has a {MARKER} that is not a gnnpar checkpoint's"
    if not isinstance(marker, dict):
        return foreign
    marker["config"] = marker.get("config") or {}
    if not (
        all(type(marker.get(k)) is int for k in ("epoch", "step", "world"))
        and type(marker.get("time")) in (int, float)
        and isinstance(marker["config"], dict)
        and all(isinstance(v, dict) for v in marker["config"].values())
    ):
        return foreign
    return marker, ""


def metadata_allowed() -> dict[str, Any]:
    """What DCP's ``.metadata`` pickle names (listed from real ones with an Unpickler that logs
    ``find_class``): the classes of torch.distributed.checkpoint.metadata, the file system
    reader's ``_StorageInfo``, ``torch.Size``, torch's dtypes, the layout helper, and the
    checkpoint's path (``pathlib``). Each is built from strings and numbers; none runs code."""
    import collections
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata

    objs: list[Any] = [
        v
        for v in vars(metadata).values()
        if isinstance(v, type) and v.__module__ == metadata.__name__
    ]
    objs += [filesystem._StorageInfo, torch.Size, torch.serialization._get_layout]
    objs += [pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath]
    objs += [collections.OrderedDict, torch.device]
    allowed = safe_load.by_name(objs)
    allowed.update({str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)})
    return allowed


def check_metadata(path: Path) -> str | None:
    """None if ``path/.metadata`` unpickles with :func:`metadata_allowed` into DCP's Metadata,
    else why not. DCP's FileSystemReader reads it with plain ``pickle.load``: a file naming
    ``os.system`` would run it, so it is checked first (every rank checks the same file)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(path / ".metadata", "rb") as fh:
            meta = safe_load.pickle_load(fh, metadata_allowed())
    except safe_load.Refused as e:
        return f"is not loaded: {e.why('its .metadata')}"
    except Exception as e:
        return f"is damaged ({type(e).__name__} in .metadata)"
    if not isinstance(meta, Metadata):
        return "is damaged (its .metadata is not DCP's)"
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
    try:
        found = [p for p in folder.iterdir() if p.is_dir() and (p / MARKER).is_file()]
    except OSError:  # no folder, not a folder, or not readable: no checkpoint
        return []
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
