"""Neighbour-sampled mini-batches for data-parallel training: distributed sharding of the seed
nodes (:func:`shard_plan`, :func:`epoch_seeds`), the graph file every process maps
(:func:`save_shared_graph`), the batches as a dataset (:class:`SampledBatches`) and the
DataLoader whose worker processes make them (:func:`build_loader`), workers that end with the
training process that owns them.

    from gnnpar.data.sampling.loader import SampledBatches, build_loader, save_shared_graph
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from gnnpar import omp
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler, SampledBatch

if TYPE_CHECKING:
    from gnnpar.data.prepared import FileRows


def shard_plan(num_train: int, world_size: int, batch_size: int) -> tuple[int, int]:
    """(seed nodes per rank, steps per epoch): the same on every rank, so DDP never waits on a
    rank that has run out of batches.

    Each epoch the training nodes are shuffled and cut into ``world_size`` equal blocks of
    ``num_train // world_size`` nodes; the ``num_train % world_size`` (< world_size) nodes left at
    the end of that epoch's shuffle are dropped for that epoch only (a different few each epoch).
    A rank's block is cut into batches of ``batch_size``; the last one may be smaller, and it is
    the same size on every rank.
    """
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size and batch_size must be >= 1, got {world_size}, {batch_size}")
    per_rank = num_train // world_size
    return per_rank, -(-per_rank // batch_size)


def epoch_seeds(
    train_idx: torch.Tensor, seed: int, epoch: int, rank: int, world_size: int, batch_size: int
) -> list[torch.Tensor]:
    """This rank's seed batches for ``epoch``: one shuffle shared by all ranks (same generator
    seed), then this rank's block of it (see :func:`shard_plan`)."""
    per_rank, steps = shard_plan(train_idx.numel(), world_size, batch_size)
    gen = torch.Generator().manual_seed(_mix(seed, epoch))
    perm = train_idx[torch.randperm(train_idx.numel(), generator=gen)]
    block = perm[rank * per_rank : (rank + 1) * per_rank]
    return [block[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def _mix(*parts: int) -> int:
    """A deterministic 63-bit seed from several integers (Python's hash of ints is not mixed)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


def save_shared_graph(path: str, csr: CSRGraph, x: torch.Tensor, y: torch.Tensor) -> None:
    """Write the tensors a sampler process needs to one file that every process then maps.

    Format: ``torch.save`` of ``{"rowptr", "col", "x", "y"}``; read with
    ``torch.load(path, mmap=True)`` so the pages are shared by every rank and loader worker of
    the machine (one copy; ``/dev/shm`` keeps it in memory). Written to ``path + ".tmp"`` and
    renamed, so a reader never sees half a file.
    """
    tmp = f"{path}.tmp"
    torch.save({"rowptr": csr.rowptr, "col": csr.col, "x": x, "y": y}, tmp)
    os.replace(tmp, path)


class SampledBatches(torch.utils.data.Dataset):
    """Mini-batch ``i`` of a run: epoch ``i // steps``, step ``i % steps`` of this rank.

    What crosses into a loader worker when it starts is only this small object: the graph file's
    path and this rank's plan. Each process maps the graph itself on first use
    (:meth:`_graph`), so ``spawn``/``forkserver`` workers neither copy the graph nor inherit
    anything of the parent (threads, process group). The random numbers of batch ``i`` come from
    a generator seeded with ``(seed, epoch, rank, step)``, so a batch is the same whichever worker
    (or the main process) makes it, and the same for any ``--loader-workers``.
    """

    def __init__(
        self,
        graph_path: str,
        train_idx: torch.Tensor,
        fanouts: list[int],
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        steps: int,
        replace: bool = False,
        cache_path: str | None = None,
        direct: bool = False,
    ) -> None:
        self.graph_path = graph_path
        self.train_idx = train_idx
        self.fanouts = fanouts
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.steps = steps
        self.replace = replace
        self.cache_path = cache_path  # a prepared graph's hot feature rows (shared memory)
        self.direct = direct  # its other rows read around the page cache (FileRows)
        self.owner_pid = os.getpid()  # the training process; workers end when it is gone
        self._state: dict | None = None  # mapped graph + sampler, per process
        self._epoch: tuple[int, list[torch.Tensor]] | None = None
        # batches without their features, which the taker then gathers (:meth:`gather`): what
        # a thread makes ahead where the features are in memory (SampledSource)
        self.gather_later = False

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_state"] = None  # never pickle the graph or the mark arrays to a worker
        state["_epoch"] = None
        return state

    def _graph(self) -> dict:
        if self._state is None:
            if os.path.isdir(self.graph_path):  # a prepared folder (gnnpar.data.prepared)
                g = open_graph_folder(self.graph_path)
            else:
                g = torch.load(self.graph_path, mmap=True, weights_only=True)
            if self.cache_path is not None:
                from gnnpar.data.prepared import open_feature_cache

                g.update(open_feature_cache(self.cache_path, g["x"]))
            if g.get("on_disk"):
                from gnnpar.data.prepared import FileRows

                g["reader"] = FileRows.open(g, self.direct)  # None without the kernel
            csr = CSRGraph(g["rowptr"], g["col"])
            g["sampler"] = NeighborSampler(csr, self.fanouts, self.replace)
            self._state = g
        return self._state

    def release(self) -> None:
        """Drop this process's map of the graph and its sampler (the node-mark arrays): the
        training process made a few batches itself and leaves the rest to its workers."""
        self._state = None

    def __getitem__(self, i: int) -> SampledBatch:
        return self._batch(*step_seeds(self, i))

    def _batch(self, seeds: torch.Tensor, gen: torch.Generator) -> SampledBatch:
        """The sampled neighbourhood of ``seeds``, the seeds' labels and, unless
        ``gather_later`` (then :meth:`gather` adds them), its features."""
        g = self._graph()
        b: SampledBatch = g["sampler"].sample(seeds, gen)
        b.y = g["y"][seeds].long() if g.get("on_disk") else g["y"][seeds]
        if not self.gather_later:
            self.gather(b)
        return b

    def gather(self, b: SampledBatch) -> SampledBatch:
        """``b`` with its nodes' feature rows (``b.x``), and for a prepared graph how many the
        feature cache served and what was read from the folder."""
        g = self._graph()
        if g.get("on_disk"):
            x = g["x"]
            b.x, b.cache_hits = gather_rows_counted(
                x, b.n_id, g.get("slot"), g.get("rows"), g.get("reader")
            )
            b.rows_read = b.n_id.numel() - b.cache_hits
            b.bytes_read = b.rows_read * x.size(1) * x.element_size()
        else:
            # index_select, not x[n_id]: the same rows, ~2x faster on CPU (23K x 602: 8 vs 16 ms)
            b.x = torch.index_select(g["x"], 0, b.n_id)
        return b


# the random streams of evaluation batches: (seed, EVAL_STREAM, batch), apart from training's
# (seed, epoch, rank, step) for every epoch below 2**32
EVAL_STREAM = 0x6576616C00000000


class EvalBatches(SampledBatches):
    """Evaluation batch ``i``: the nodes ``ids[i * batch_size : (i + 1) * batch_size]`` (in the
    order given) with their neighbourhoods sampled by training's sampler and fan-outs, from the
    stream ``(seed, EVAL_STREAM, i)``: the same batches from a prepared folder as from memory,
    whichever process makes them."""

    def __init__(
        self,
        graph_path: str,
        ids: torch.Tensor,
        fanouts: list[int],
        batch_size: int,
        seed: int,
        cache_path: str | None = None,
        direct: bool = False,
    ) -> None:
        steps = -(-ids.numel() // batch_size)
        super().__init__(
            graph_path, ids, fanouts, batch_size, 0, 1, seed, steps, cache_path=cache_path,
            direct=direct,
        )  # fmt: skip

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> SampledBatch:
        i = int(i)
        seeds = self.train_idx[i * self.batch_size : (i + 1) * self.batch_size]
        return self._batch(seeds, torch.Generator().manual_seed(_mix(self.seed, EVAL_STREAM, i)))


def step_seeds(b, i: int) -> tuple[torch.Tensor, torch.Generator]:
    """Batch ``i`` of the run (``i = epoch * steps + step``) of ``b`` (a :class:`SampledBatches`,
    or a source with its ``train_idx``, ``seed``, ``rank``, ``world_size``, ``batch_size``,
    ``steps``; its ``_epoch`` caches the epoch's seed order): its seed nodes and the generator
    of its draws, from (seed, epoch, rank, step) alone."""
    epoch, step = divmod(int(i), b.steps)
    if b._epoch is None or b._epoch[0] != epoch:
        seeds = epoch_seeds(b.train_idx, b.seed, epoch, b.rank, b.world_size, b.batch_size)
        b._epoch = (epoch, seeds)
    return b._epoch[1][step], torch.Generator().manual_seed(_mix(b.seed, epoch, b.rank, step))


def open_graph_folder(folder: str) -> dict:
    """A prepared folder's CSR, features and labels, memory-mapped (checked on open: sizes and
    ends checksums, gnnpar.data.prepared), and where the features lie in their file
    (``x_file``: path, byte offset) for :class:`~gnnpar.data.prepared.FileRows`. The maps keep the kernel's read-ahead
    (``MADV_RANDOM`` on them made 10 steps at papers100m 0.1 inside 3 GiB 7.7x slower: one
    page fault at a time, BENCHMARKS.md); the feature rows a batch misses in the cache are read
    by :class:`~gnnpar.data.prepared.FileRows`, many at once, without read-ahead."""
    from gnnpar.data.prepared import open_prepared

    p = open_prepared(folder)
    x = p.array("features")
    return {
        "rowptr": p.tensor("indptr"),
        "col": p.tensor("indices"),
        "x": p.tensor("features"),
        "x_file": (str(x.filename), int(x.offset)),  # where its rows lie (FileRows)
        "y": p.tensor("labels"),
        "on_disk": True,
    }


GATHER_BYTES = 32 << 20  # fp32 bytes of rows copied into a batch at a time


def gather_rows(
    x: torch.Tensor,
    n_id: torch.Tensor,
    slot: torch.Tensor | None = None,
    cached: torch.Tensor | None = None,
    reader: FileRows | None = None,
) -> torch.Tensor:
    """``x[n_id]`` as float32: the rows held by the feature cache (``slot[v]``: the place of
    row v in ``cached``, -1 when not held) from shared memory, the others read in ascending row
    order from the file by ``reader`` (:class:`~gnnpar.data.prepared.FileRows`), or else from the memory-mapped ``x``,
    all put back in ``n_id``'s order: the same values as ``index_select(x, 0, n_id)``, bit for
    bit."""
    return gather_rows_counted(x, n_id, slot, cached, reader)[0]


def gather_rows_counted(
    x: torch.Tensor,
    n_id: torch.Tensor,
    slot: torch.Tensor | None = None,
    cached: torch.Tensor | None = None,
    reader: FileRows | None = None,
) -> tuple[torch.Tensor, int]:
    """:func:`gather_rows` and how many of ``n_id``'s rows the cache served (the others,
    ``n_id.numel()`` minus that, were read from ``x``).

    Rows are copied into the batch :data:`GATHER_BYTES` at a time, through one buffer: a batch
    of 233K x 602 fp32 rows (561 MB, synthetic-reddit's whole graph) would otherwise hold a
    second copy of itself while it is put in order."""
    f = x.size(1)
    out = torch.empty((n_id.numel(), f), dtype=torch.float32)
    step = max(1, GATHER_BYTES // max(1, f * 4))
    hits = 0
    if slot is not None and cached is not None and cached.size(0):
        s = slot[n_id]
        at = (s >= 0).nonzero().view(-1)
        hits = at.numel()
        src = s[at].long()
        for a in range(0, hits, step):
            out[at[a : a + step]] = cached[src[a : a + step]].float()
        del src
        miss = (s < 0).nonzero().view(-1)
        n_id, where = n_id[miss], miss
    else:
        where = torch.arange(n_id.numel())
    order = torch.argsort(n_id)
    ids, where = n_id[order], where[order]
    del order
    buf = torch.empty((min(step, ids.numel()), f), dtype=x.dtype) if reader is not None else None
    for a in range(0, ids.numel(), step):
        part = ids[a : a + step]
        if buf is not None:
            rows = buf[: part.numel()]
            reader.read(part, rows)
        else:
            rows = torch.index_select(x, 0, part)
        out[where[a : a + step]] = rows.float()
    return out, hits


def _worker_init(worker_id: int) -> None:
    # One thread per sampler process: W workers x R ranks on C cores must not each start C
    # OpenMP threads (oversubscription turns into minutes-long stalls that look like hangs).
    torch.set_num_threads(1)
    owner = torch.utils.data.get_worker_info().dataset.owner_pid
    threading.Thread(target=_exit_with_owner, args=(owner,), daemon=True).start()


def _exit_with_owner(pid: int, every_s: float = 1.0) -> None:
    """End this worker when the training process ``pid`` is gone.

    A forkserver worker is a child of the fork server, not of the rank, so DataLoader's own
    watchdog (is my parent alive?) does not fire when the rank is killed; and the fork server
    lives as long as its children hold its pipe. Without this, a killed rank leaves its workers
    and fork server behind for good.
    """
    while True:
        time.sleep(every_s)
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            alive = state not in ("Z", "X")  # a zombie has exited; its parent just has not reaped
        except FileNotFoundError:
            alive = False
        except OSError:  # no /proc: fall back on signal 0
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
        if not alive:
            os._exit(0)


class Ahead:
    """``it``'s items, each made by one background thread while the caller works on the one
    before: I/O (a prepared folder's feature reads) and sampling overlap the model's step without
    a loader worker process (no second interpreter, sampler and batch queue inside a memory
    limit). The items are ``it``'s, in its order (batch i is made from (seed, epoch, rank, step)
    alone, whichever thread makes it); at most one is made ahead. An error is raised where its
    item would have been.

    ``collective``: making an item runs collectives that every rank enters in the same order
    (sampling across shards, :class:`~gnnpar.data.sampling.distributed.ShardBatches`), so every
    rank must make exactly the items the others make. The first item is then made when it is
    first asked for (not at once: a run that resumes replaces the iterator before its first
    batch), and :meth:`close` waits for the item in the making instead of cancelling it (a
    cancel succeeds only where the thread had not picked it up yet, which differs between
    ranks: a rank whose peer cancelled would wait in that item's collectives)."""

    def __init__(self, it: Iterator, collective: bool = False) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._it = it
        self._collective = collective
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gnnpar-ahead")
        self._next = None if collective else self._pool.submit(next, it)
        self._started = not collective

    def __iter__(self) -> Ahead:
        return self

    def __next__(self):  # noqa: ANN204 (the wrapped iterator's item)
        if not self._started:
            self._started = True
            self._next = self._pool.submit(next, self._it)
        if self._next is None:
            raise StopIteration
        try:
            item = self._next.result()
        except StopIteration:
            self._next = None
            raise
        self._next = self._pool.submit(next, self._it)
        return item

    def settle(self) -> None:
        """Wait until the item in the making is made (kept for the next ``next``; its error, if
        any, raised there): the thread is idle, and stays so until the next item is asked for
        (e.g. while the loop writes a checkpoint)."""
        if self._next is not None:
            from concurrent.futures import wait

            wait([self._next])

    def close(self) -> None:
        """Stop the thread: the item in the making is cancelled, or, for a ``collective``
        iterator, waited for (its collectives finish on every rank) and dropped."""
        if self._next is not None:
            if self._collective:
                self.settle()
            else:
                self._next.cancel()
            self._next = None
        self._started = True  # nothing more is made
        self._pool.shutdown(wait=True)


class GatherAfterRelease:
    """``it``'s sampled batches (``batches.gather_later``) with their feature rows, each
    gathered once the batch before has let go of its own: the sampled strategy's step frees
    them before its backward (``seed_loss``'s ``free_features``), so on :class:`Ahead`'s thread
    the copy overlaps the backward, and two batches' features are never held together. A
    batch whose features are kept to the end of its step only delays the next one's gather
    (the same batches either way). :meth:`release` lets a waiting gather go on (closing)."""

    def __init__(self, it: Iterator, batches: SampledBatches) -> None:
        self._it, self._batches = it, batches
        self._freed: threading.Event | None = None

    def __iter__(self) -> GatherAfterRelease:
        return self

    def __next__(self) -> SampledBatch:
        b = next(self._it)
        if self._freed is not None:
            self._freed.wait()
        self._batches.gather(b)
        self._freed = threading.Event()
        weakref.finalize(b.x, self._freed.set)
        return b

    def release(self) -> None:
        if self._freed is not None:
            self._freed.set()


def build_loader(
    dataset: SampledBatches,
    epochs: int,
    workers: int,
    timeout_s: float,
    start_method: str = "forkserver",
    start: int = 0,
) -> torch.utils.data.DataLoader:
    """A DataLoader over batches ``0 .. epochs * steps - 1`` of ``dataset`` with ``workers``
    persistent worker processes (0: sample in the training process). One pass covers the whole
    run, so workers keep prefetching across epoch boundaries instead of idling while a new
    epoch's iterator is set up. See :mod:`gnnpar.strategies.sampled` for why ``forkserver``.
    As with ``spawn``, workers import the main module: a script that trains with loader workers
    needs the usual ``if __name__ == "__main__":`` guard (``python -m gnnpar`` has it)."""
    # batch i = epoch i // steps, step i % steps; a resumed run starts at its checkpoint's batch
    order = range(start, epochs * dataset.steps)
    if workers == 0:
        return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=order)
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # the fork server imports these once; each worker is then a cheap fork of a process
        # that has no threads, no OpenMP pool and no process group
        ctx.set_forkserver_preload(["torch", __name__])
        with omp.ranks_sleep_at_once():  # ranks may be forked from this server later
            multiprocessing.forkserver.ensure_running()
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        sampler=order,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context=ctx,
        worker_init_fn=_worker_init,
        timeout=timeout_s,  # a stuck or dead worker ends in an error, not a hang
        prefetch_factor=2,
    )
    return loader
