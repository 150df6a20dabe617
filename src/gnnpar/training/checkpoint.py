"""Checkpoints of a training run, and resuming from the newest one every rank holds intact.

``--checkpoint-every N`` (epochs) or ``--checkpoint-every-steps N`` writes
``<out>/checkpoints/epoch-EEEEEE-step-SSSSSSSS/``; ``--resume`` (or a restart by the elastic
agent, ``--max-restarts``) continues from the newest checkpoint whose every part is intact. What
a checkpoint holds, per rank: the model, the optimizer state, every random generator (torch,
CUDA, numpy, python: dropout and anything else drawn), and the loop's own state — where it is,
the metrics so far, the source's position (a generator's state, the gossip work pool's counter
and the subgraph a rank had taken but not trained; across shards every host's pool's counters
and the epoch the rank takes from), the sync policy's counters (steps since the
last averaging, gossip exchange counts and ids), the straggler's generator. With it, a
deterministic run resumed from a checkpoint ends bit-for-bit where the uninterrupted run ends.

Format: one part per rank, self-contained and verifiable on its own, so that no file system needs
to be shared between hosts (issue 23): in the checkpoint's folder, rank R writes

* ``rank<R>.pt``: one ``torch.save``d dict — ``format``, ``model`` and ``optim`` (the
  rank's own state dicts, :func:`~torch.distributed.checkpoint.state_dict.get_state_dict`: the
  ranks hold *different* state — gossip and allreduce with K > 1 keep one model per rank,
  pipelines one stage per rank, Adam's moments are per rank) and ``loop`` (the loop's state
  above, with the generators' under ``rng``);
* ``rank<R>.json``, its manifest, written last: ``format``, ``rank``, ``world``, ``epoch``,
  ``step``, ``time``, the run's ``config``, and the part's file with its size and SHA-256.

Each file is written to a hidden temporary name, fsynced and renamed into place, the manifest
only after the part (an old manifest is removed first), so a part without its manifest, or whose
bytes do not match it, is incomplete or damaged, never mistaken for whole. On one machine all
parts sit in one folder, as with a shared file system; on hosts with their own ``--out`` each
host's folder holds its own ranks' parts, and that is enough.

Which checkpoint to resume from is decided collectively (:meth:`Checkpointer.load`): every rank
verifies its own parts (manifest, size, checksum; :func:`verify_part`) and the ranks exchange what
they hold (``all_gather_object`` once the process group is up); the newest checkpoint intact on
every rank is taken (:func:`agree`), and newer ones are reported with the rank that lacks them
(a host that failed while it was written, a damaged file). If one rank's part then fails to load,
every rank goes on to the one before, together. When no checkpoint is intact on every rank:
``--resume`` and an elastic restart stop with a UsageError (exit 2) naming the folder, rather
than train afresh over it — except after a restart when no rank holds a damaged part and some
rank holds none at all (the first checkpoint was being written when a rank failed): the run then
starts from the beginning, as the uninterrupted run did.

The last ``KEEP`` checkpoints are kept; each rank removes its own parts of older ones once every
rank has written the newest (the save's last barrier), so the newest common one is never lost.

Loading runs no code from the files (:mod:`gnnpar.data.safe_load`): the manifest is JSON, and
the part is read with ``weights_only=True`` (tensors and plain values; numpy arrays allowed,
which checkpoints before numpy's state was kept as a list held), only after its checksum matched.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from gnnpar.config.schema import Config
from gnnpar.data import safe_load
from gnnpar.errors import UsageError
from gnnpar.parallel.collectives import barrier, gather_to_all
from gnnpar.runtime import resources
from gnnpar.runtime.heartbeat import local_address, machine_id

KEEP = 2
FORMAT = "gnnpar-checkpoint-part-1"
NAME = re.compile(r"epoch-(\d{6,})-step-(\d{8,})")
MISSING = "missing"  # a rank's report for a checkpoint of which it holds no part


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
        self.explicit = False  # --resume asked for it (not only a restart of the agent)
        self.config: dict = {}  # the run's settings, checked against a checkpoint's
        self.saved: list[float] = []  # seconds each save took (result.json)
        self.resumed_at = 0.0
        self.restarts = 0  # the agents' restart count that all ranks agreed on (result.json)

    def stats(self, resumed: Resumed | None) -> CheckpointStats:
        """Checkpoints written and their cost, restarts, time lost (for result.json)."""
        if resumed is None:
            return CheckpointStats(list(self.saved), self.restarts)
        # from the checkpoint's writing to this attempt's restoring it: the work done after
        # it and lost, finding the failure, restarting the ranks and setting them up again
        lost = max(0.0, self.resumed_at - resumed.saved_at)
        return CheckpointStats(list(self.saved), self.restarts, str(resumed.path), lost)

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
        """Collective: every rank writes its own part; returns the checkpoint's folder.
        ``loop()`` gives the loop's state, taken once every rank has arrived (a gossip rank's
        work pool position is only final then)."""
        t0 = time.perf_counter()
        folder = self.folder / f"epoch-{epoch:06d}-step-{step:08d}"
        barrier()
        msd, osd = get_state_dict(model, optimizer)
        part = {"format": FORMAT, "model": msd, "optim": osd}
        part["loop"] = {**loop(), "rng": rng_state()}
        meta = {"epoch": epoch, "step": step, "world": self.world, "time": time.time()}
        write_part(folder, self.rank, part, {**meta, "config": config})
        barrier()  # every rank holds this one now: older ones may go
        for old in checkpoint_folders(self.folder.parent, parts_only=False)[:-KEEP]:
            remove_part(old, self.rank)
        self.saved.append(time.perf_counter() - t0)
        return folder

    # ---------------------------------------------------------------------------------- load
    def load(self, model, optimizer, warn: Callable[[str], None]) -> Resumed | None:
        """Restore the newest checkpoint intact on every rank (collective); None when no rank
        holds any. Newer ones, incomplete or damaged on some rank, are reported; UsageError when
        none can be resumed from (see the module's docstring for the one exception)."""
        manifests: dict[str, dict[str, Any]] = {}
        mine: dict[str, tuple[str | None, str | None]] = {}
        for path in checkpoint_folders(self.folder.parent):
            manifest, mine[path.name] = self._check(path)
            if manifest is not None:
                manifests[path.name] = manifest
        me = {"host": socket.gethostname(), "addr": local_address(), "machine": machine_id()}
        reports = gather_to_all({**me, "parts": mine})
        # hosts may share a name (clones, containers): the address tells them apart in messages
        hosts = [r["host"] + (f" at {r['addr']}" if r["addr"] else "") for r in reports]
        machines = {(r["host"], r["machine"]) for r in reports}
        everyone = [r["parts"] for r in reports]  # per rank: {name: (why, refusal)}
        tried: dict[str, str] = {}  # name -> what is wrong with it, in the order reported
        while True:
            name, skipped = agree([{n: p[0] for n, p in parts.items()} for parts in everyone])
            for old, rank, why in skipped:
                if old not in tried:
                    tried[old] = self._describe(rank, hosts, why)
                    warn(f"checkpoint {self.folder / old} {tried[old]}; trying the one before")
            if name is None:
                break
            path = self.folder / name
            refusal = next((p[name][1] for p in everyone if p[name][1]), None)
            if refusal:
                raise UsageError(f"checkpoint {path} {refusal}")
            loop, why = self._read(path, model, optimizer)
            if loop is not None:
                m = manifests[name]
                self.resumed_at = time.time()
                return Resumed(m["epoch"], m["step"], loop, path, m["time"])
            for parts in everyone:  # not loadable on some rank: every rank skips it alike
                parts[name] = (why, None)
        if not tried:
            return None  # no rank holds any part: nothing was checkpointed yet
        damaged = any(p[0] not in (None, MISSING) for parts in everyone for p in parts.values())
        if not self.explicit and not damaged and any(not parts for parts in everyone):
            warn(
                "no checkpoint is complete on every rank (a rank failed while the first one "
                "was written): training from the beginning"
            )
            return None
        listed = [f"{name} {why}" for name, why in tried.items()]
        found = "; ".join(listed[:3]) + (f"; and {len(listed) - 3} more" if listed[3:] else "")
        where = f"{self.folder}" + (" on every host" if len(machines) > 1 else "")
        raise UsageError(
            f"no checkpoint in {self.folder} can be resumed from ({found}). To start the "
            f"run afresh, delete {where} (a run without --resume removes it too)."
        )

    def _check(self, path: Path) -> tuple[dict[str, Any] | None, tuple[str | None, str | None]]:
        """This rank's part of one checkpoint: its manifest (None when not intact), and ``(why
        it is not intact or None, why this run may not resume from it or None)``."""
        manifest, why = verify_part(path, self.rank)
        if manifest is None:
            return None, (why, None)
        different = config_differences(manifest["config"], self.config)
        if different:
            return manifest, (
                None,
                f"was written by a different run ({'; '.join(different)}). "
                "Resume with the same settings, or use another --out.",
            )
        if manifest["world"] != self.world:
            return manifest, (
                None,
                f"was written by {manifest['world']} ranks; this run has {self.world}. "
                "Resume with the same number of ranks.",
            )
        return manifest, (None, None)

    def _describe(self, rank: int, hosts: list[str], why: str) -> str:
        """What is wrong with a checkpoint, and on which rank (when there are several)."""
        if self.world == 1:
            return why if why != MISSING else "is incomplete (it has no part of rank 0)"
        where = f"rank {rank} (host {hosts[rank]})"
        if why == MISSING:
            return (
                f"is incomplete: {where} holds no part of it (that rank failed while it was "
                "written, or its host's --out does not have it)"
            )
        return f"{why} on {where}"

    def _read(self, path: Path, model, optimizer) -> tuple[dict[str, Any] | None, str]:
        """Load this rank's part into the model, the optimizer and the generators (collective);
        ``(loop state, "")``, or ``(None, why)`` when it does not load on every rank."""
        part, why = read_part(path, self.rank)
        failed = [w for w in gather_to_all(why) if w is not None]
        if failed:
            return None, failed[0]
        set_state_dict(
            model, optimizer, model_state_dict=part["model"], optim_state_dict=part["optim"]
        )
        loop = part["loop"]
        set_rng_state(loop.pop("rng"))
        return loop, ""


def agree(reports: list[dict[str, str | None]]) -> tuple[str | None, list[tuple[str, int, str]]]:
    """The checkpoint to resume from, given each rank's report ``{name: None if its part is
    intact, else why not}`` (a rank holding no part of a checkpoint has no entry for it): the
    newest name intact on every rank, and ``(name, rank, why)`` for each newer one skipped
    (the first rank without it intact; ``why`` :data:`MISSING` for a rank without a part).
    Every rank computes the same from the same reports."""
    names = sorted({n for r in reports for n in r}, key=_order, reverse=True)
    skipped = []
    for name in names:
        bad = [(rank, r.get(name, MISSING)) for rank, r in enumerate(reports)]
        bad = [(rank, why) for rank, why in bad if why is not None]
        if not bad:
            return name, skipped
        skipped.append((name, *bad[0]))
    return None, skipped


def _order(name: str) -> tuple[int, int, str]:
    m = NAME.fullmatch(name)
    return (int(m[1]), int(m[2]), name) if m else (-1, -1, name)


# ---------------------------------------------------------------------------------- parts
def part_files(rank: int) -> tuple[str, str]:
    """The part's file and its manifest's name, for ``rank``."""
    return f"rank{rank}.pt", f"rank{rank}.json"


def write_part(folder: Path, rank: int, part: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write ``rank``'s part into ``folder`` (made if needed): the part, then its manifest
    (``meta`` plus format, rank and the part's size and SHA-256), each atomically."""
    data_name, manifest_name = part_files(rank)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / manifest_name).unlink(missing_ok=True)  # never an old manifest over a new part
    buf = io.BytesIO()
    torch.save(part, buf)
    data = buf.getvalue()
    try:
        _write_atomic(folder / data_name, data)
    except UsageError:  # a full disk: no empty folder of a checkpoint that never was
        with contextlib.suppress(OSError):
            folder.rmdir()
        raise
    manifest = {"format": FORMAT, "rank": rank, **meta}
    manifest["file"] = {"name": data_name, "bytes": len(data), "sha256": _sha256(data)}
    _write_atomic(folder / manifest_name, json.dumps(manifest, indent=1, default=str).encode())
    _fsync_dir(folder)


def verify_part(folder: Path, rank: int) -> tuple[dict[str, Any] | None, str]:
    """``rank``'s part of the checkpoint in ``folder``, checked on its own: ``(manifest, "")``
    when the manifest is gnnpar's, names this rank and this folder's epoch and step, and the
    part's file has the size and SHA-256 it records; else ``(None, why)``, or ``(None,
    MISSING)`` when the rank has neither file there."""
    data_name, manifest_name = part_files(rank)
    try:
        raw = (folder / manifest_name).read_bytes()
    except FileNotFoundError:
        return None, MISSING if not (folder / data_name).exists() else (
            f"is incomplete (its {data_name} has no {manifest_name}: the rank failed while "
            "writing it)"
        )
    except OSError as e:
        return None, f"has an unreadable {manifest_name} ({e.strerror or type(e).__name__})"
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):  # JSONDecodeError is a ValueError
        return None, f"has an unreadable {manifest_name} (not UTF-8 JSON)"
    foreign = None, f"has a {manifest_name} that is not a gnnpar checkpoint's"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return foreign
    file = manifest.get("file")
    if not (
        all(type(manifest.get(k)) is int for k in ("rank", "epoch", "step", "world"))
        and type(manifest.get("time")) in (int, float)
        and isinstance(manifest.get("config"), dict)
        and all(isinstance(v, dict) for v in manifest["config"].values())
        and isinstance(file, dict)
        and file.get("name") == data_name
        and type(file.get("bytes")) is int
        and isinstance(file.get("sha256"), str)
    ):
        return foreign
    m = NAME.fullmatch(folder.name)
    if (
        manifest["rank"] != rank
        or not m
        or (int(m[1]), int(m[2]))
        != (
            manifest["epoch"],
            manifest["step"],
        )
    ):
        return None, f"has a {manifest_name} of another checkpoint or rank"
    try:
        data = (folder / data_name).read_bytes()
    except OSError as e:
        return None, f"is damaged (its {data_name}: {e.strerror or type(e).__name__})"
    if len(data) != file["bytes"]:
        return None, (
            f"is damaged (its {data_name} has {len(data)} bytes, its manifest says {file['bytes']})"
        )
    if _sha256(data) != file["sha256"]:
        return None, f"is damaged (its {data_name} does not match its manifest's SHA-256)"
    return manifest, ""


LOOP_KEYS = ("log", "eval_times", "source", "sync", "straggler", "rng")


def read_part(folder: Path, rank: int) -> tuple[dict[str, Any] | None, str | None]:
    """``rank``'s part, read with weights_only=True (tensors and plain values; numpy arrays
    allowed too): ``(part, None)`` or ``(None, why)``."""
    path = folder / part_files(rank)[0]
    try:
        part = safe_load.torch_load(path, safe_load.torch_pairs(safe_load.numpy_arrays()))
    except safe_load.Refused as e:
        return None, f"is not loaded: {e.why(f'its {path.name}')}"
    except Exception as e:
        return None, f"is damaged ({type(e).__name__} in its {path.name})"
    if not (
        isinstance(part, dict)
        and part.get("format") == FORMAT
        and all(isinstance(part.get(k), dict) for k in ("model", "optim", "loop"))
        and all(k in part["loop"] for k in LOOP_KEYS)
    ):
        return None, f"is damaged (its {path.name} is not a gnnpar checkpoint's part)"
    return part, None


def remove_part(folder: Path, rank: int) -> None:
    """``rank``'s files in ``folder``; the folder too once it is empty (the last rank's)."""
    for name in part_files(rank):
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # another rank's part is still there (one folder shared by several)
        pass


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


def checkpoint_folders(out: str | Path, parts_only: bool = True) -> list[Path]:
    """The checkpoint folders in ``<out>/checkpoints/``, oldest first: those holding at least
    one rank's manifest (``parts_only``), or every one named like a checkpoint."""
    folder = Path(out) / "checkpoints"
    try:
        found = [p for p in folder.iterdir() if p.is_dir() and NAME.fullmatch(p.name)]
    except OSError:  # no folder, not a folder, or not readable: no checkpoint
        return []
    if parts_only:
        found = [p for p in found if any(p.glob("rank*.json"))]
    return sorted(found, key=lambda p: _order(p.name))


def clear(out: str) -> Path | None:
    """A fresh run's --out must not hold an earlier run's checkpoints (a restart would resume
    from them): remove them. Returns the folder removed, if any."""
    folder = Path(out) / "checkpoints"
    if not folder.exists():
        return None
    shutil.rmtree(folder, ignore_errors=True)  # under torchrun every rank may try at once
    return folder


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file, fsynced, then renamed. A disk without room
    for it ends in one message naming the path and the bytes needed and free (exit 2), with
    the temporary file removed: the checkpoints written before stay as they were."""
    tmp = path.with_name(f".{path.name}.tmp")
    with resources.writing(path, len(data)):
        resources.check_space(path, len(data))
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
