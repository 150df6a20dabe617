"""A prepared folder's feature cache, written on a thread while ``gnnpar train`` imports torch.

A one-rank sampled run from a prepared folder spends its start-up importing torch and PyG (CPU
work that holds the interpreter) and writing its feature cache (mostly waiting on the disk:
:class:`~gnnpar.data.prepared.FileRows`' reads run in C, without the interpreter's lock).
Neither needs the other, so ``gnnpar train`` starts the cache (:func:`start`, decided by
``gnnpar.cli.start_cache_writer``, which may ask the layers above this one) as soon as its
flags are checked, before it imports torch, and the sampled source takes the finished file
(:func:`take`) where it would otherwise write it (``training.sources.share_feature_cache``).

    gnnpar train --dataset FOLDER --strategy sampled --model sage      # a prepared folder

What is written does not change: :func:`gnnpar.data.prepared.write_feature_cache` (its ranking,
``hot_rows`` by expected visits at the run's fan-outs and batch size, as it is) into a file in
``/dev/shm``, opened and unlinked once written, so the batches, their rows and the loss are
those of a cache written in line. Its size is the one rule
of :func:`plan` for both: ``--feature-cache``, or a share of the memory the run may use that
leaves the training step its own. Measured this early, that memory does not yet hold the
interpreter's torch and PyG, so :data:`IMPORTS_BYTES` of it is set aside for them.

Started only where one process trains and writes the cache for itself: ``--strategy sampled``,
one rank, not under torchrun or srun, a prepared folder that is not sharded. A folder that is
damaged is still named by the main thread's own check (``load_dataset``) before any training;
the thread's error, if any, is raised again where the cache is taken. A command that ends
before taking it waits for the thread and removes the file (:func:`discard`).
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from pathlib import Path

# Memory the process will hold once it has imported torch, PyG and gnnpar, and which a cache
# sized before those imports must leave to them. Measured inside a 2 GiB cgroup (papers100m
# 0.02, torch 2.13 CPU): 2,030 MiB free once the flags are checked, 1,799 MiB once the imports
# are done and the folder is open, and ~1,770 MiB where the cache used to be sized (its 464 MB
# were a quarter of that): 256 MiB keeps the size it had.
IMPORTS_BYTES = 256 << 20
# what one training step holds, in batches' feature bytes (batch_feature_bytes' bound): its
# batch, and its activations and gradients, larger still (GraphSAGE 3 x 256 on papers100m at
# scale 0.05, fan-outs 15-10-5, batch 1024, no batch made ahead: the cgroup's anonymous memory
# reached 1.52 GB, ~1.27 GB of it beside the interpreter, against a bound of 553 MB)
STEP_BATCHES = 3


def shm_file(tag: str) -> str:
    """A fresh file name in ``/dev/shm`` (the temporary folder where there is none)."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, f"gnnpar-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}.pt")


def batch_feature_bytes(num_nodes: int, num_features: int, batch: int, fanouts: list[int]) -> int:
    """The most bytes of float32 feature rows one sampled batch gathers: ``batch * prod(1 +
    fanout)`` rows, at most every node (a fan-out of -1, every neighbour, may reach them all)."""
    rows = batch
    for f in fanouts:
        rows = rows * (1 + f) if f >= 0 else num_nodes
    return min(rows, num_nodes) * num_features * 4


def plan(p, setting: str | None, free: int | None, reserve: int) -> tuple[int, int, bool]:  # noqa: ANN001
    """``(rows, bytes, direct)`` of the cache of the prepared folder ``p``: its rows
    (:func:`gnnpar.data.prepared.cache_rows` of the memory the run may use, ``free``, less
    ``reserve`` for the step), their bytes, and whether the rows outside it are read around the
    page cache: when the feature file is larger than what ``free`` leaves beside the cache (it
    could not stay in the page cache anyway, and inside a memory cgroup every page read through
    it must first be reclaimed)."""
    from gnnpar.data.prepared import cache_rows

    k = cache_rows(p, setting, free, reserve)
    x = p.array("features")
    size = k * int(p.manifest["num_features"]) * x.dtype.itemsize
    return k, size, free is not None and x.nbytes > free - size


class CacheWriter:
    """The cache of ``folder`` written on a daemon thread; :meth:`wait` gives what
    ``share_feature_cache`` gives: (the ``/proc/<pid>/fd`` path or None, the fd to close or
    None, the cache's bytes of features, direct)."""

    def __init__(
        self,
        folder: str,
        setting: str | None,
        free: int | None,
        reserve: int,
        fanouts: list[int] | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.folder, self.setting = _key(folder), setting
        self.free, self.reserve = free, reserve
        self.fanouts, self.batch_size = fanouts, batch_size  # the ranking's (hot_rows)
        self.name: str | None = None
        self.result: tuple[str | None, int | None, int, bool] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._write, name="gnnpar-feature-cache", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        from gnnpar.data.prepared import open_prepared, write_feature_cache

        try:
            p = open_prepared(self.folder)
            k, size, direct = plan(p, self.setting, self.free, self.reserve)
            path, fd = None, None
            if k > 0:
                self.name = shm_file("features")
                write_feature_cache(p, k, self.name, direct, self.fanouts, self.batch_size)
                fd = os.open(self.name, os.O_RDONLY)
                os.unlink(self.name)
                self.name = None
                path = f"/proc/{os.getpid()}/fd/{fd}"
            self.result = (path, fd, size, direct)
        except BaseException as e:  # raised again by wait(), in the caller's thread
            self.error = e

    def wait(self) -> tuple[str | None, int | None, int, bool]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def held_bytes(self) -> int:
        """What the finished cache holds in memory (its slots and rows); 0 when it failed."""
        self.thread.join()
        if self.result is None or self.result[0] is None:
            return 0
        return os.fstat(self.result[1]).st_size

    def discard(self) -> None:
        """Wait for the thread; close the cache, or remove a file it left half written."""
        self.thread.join()
        if self.result is not None and self.result[1] is not None:
            os.close(self.result[1])
        for leftover in (self.name, f"{self.name}.tmp") if self.name else ():
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


_STARTED: CacheWriter | None = None


def _key(folder: str) -> str:
    return str(Path(folder).expanduser().absolute())


def start(
    folder: str,
    setting: str | None,
    free: int | None,
    reserve: int,
    fanouts: list[int],
    batch_size: int,
) -> CacheWriter:
    """Start writing ``folder``'s cache now (``free``: the memory the run may use, the imports
    to come already set aside; ``reserve``: the step's): what ``gnnpar train`` decides where one
    process trains sampled from a prepared folder (gnnpar.cli.start_cache_writer). Imports
    neither torch nor PyG."""
    global _STARTED
    _STARTED = CacheWriter(folder, setting, free, reserve, fanouts, batch_size)
    return _STARTED


def take(folder: str, setting: str | None) -> CacheWriter | None:
    """The writer :func:`start` started for ``folder`` and ``setting``, handed over once."""
    global _STARTED
    w = _STARTED
    if w is None or w.folder != _key(folder) or w.setting != setting:
        return None
    _STARTED = None
    return w


def started() -> CacheWriter | None:
    """The writer started and not yet taken, if any."""
    return _STARTED


def discard() -> None:
    """End a writer that no source took (the command failed before its first step)."""
    global _STARTED
    w, _STARTED = _STARTED, None
    if w is not None:
        w.discard()
