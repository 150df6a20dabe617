"""gnnpar's data loading as a ``LightningDataModule``: :class:`GraphDataModule`.

    dm = GraphDataModule(dataset="cora", batch_size=256, fanouts=[25, 10], loader_workers=2)
    dm.setup()                       # Trainer.fit calls it on every rank
    dm.num_features, dm.num_classes  # for the model
    for batch in dm.train_dataloader():
        out = model(batch.x, batch.edge_index)[: batch.batch_size]
        loss = F.cross_entropy(out, batch.y[: batch.batch_size])

Settings are ``gnnpar train``'s flag names (dashes or underscores), parsed and checked by gnnpar's
own config code, so a misspelt or out-of-range one gives the same message as on the command line.
The data module reads the data settings only (:data:`DATA_KEYS`); the model, optimiser and run
settings belong to the ``LightningModule`` and the ``Trainer``.

Batches
-------
Neighbour-sampled (the default; ``fanouts``, ``batch_size``, ``loader_workers``): gnnpar's
sampler (:mod:`gnnpar.data.sampling`, its compiled kernel), each batch a PyG ``Data`` laid out as
PyG's ``NeighborLoader`` yields it: ``n_id`` (global ids, the ``batch_size`` seed nodes first),
``x`` and ``y`` of every node of ``n_id``, ``edge_index`` local to the batch (source -> target),
``num_sampled_nodes``/``num_sampled_edges`` per hop. The loss is taken on ``out[:batch_size]``.

Cluster-GCN (``partitions=N``, ``partitioner``): one induced subgraph per batch (gnnpar's
partitioning and its cache), relabelled so that the split's nodes come first, with
``batch_size`` their number: the same ``out[:batch_size]`` loss works for both kinds. Subgraphs
that hold no node of the split are left out of that split's loader.

Ranks
-----
Under Lightning's DDP every rank trains its own block of each epoch's seeded shuffle of the
training nodes, exactly as ``gnnpar train --strategy sampled`` does
(:func:`gnnpar.data.sampling.loader.epoch_seeds`): each training node at most once per epoch
across the ranks, the ``num_train % ranks`` left at the end of that epoch's shuffle (fewer than
the ranks, a different few each epoch) skipped so that every rank runs the same number of
steps; batch ``i`` is made from ``(seed, epoch, rank, step)`` alone, so the batches are the
same for any number of loader workers and in a resumed run. The epoch is the one Lightning
passes to the sampler's ``set_epoch``. Cluster-GCN: each epoch's seeded shuffle of the
subgraphs dealt round-robin, ``partitions // ranks`` per rank. Validation and test loaders
cover every node of their split once across the ranks, in the same number of batches on every
rank. Under :class:`~gnnpar.lightning.strategies.GossipStrategy` the training batches come from
gnnpar's shared work pool instead: every batch of the epoch once, taken by whichever rank is
free, so a faster rank trains more of them.

The graph is written once per machine to shared memory (``/dev/shm``, unlinked at once) and
mapped by every rank and loader worker (:func:`gnnpar.training.sources.share_graph`). On Linux
the loader workers are forks of the training process made by its main thread, as PyG's are
(:func:`worker_start` says why that is safe here); elsewhere, or with
``GNNPAR_LOADER_START=forkserver``, they start from a fork server that has no threads, and a new
training stream then makes its first batches in the training process until its workers' loader
has started (``ResumableLoader._head``: the same batches). Workers exit with their rank, and a
batch that does not come within ``timeout`` seconds is an error, not a hang
(:mod:`gnnpar.data.sampling.loader`).

Resuming
--------
The training loader is stateful (``state_dict``/``load_state_dict``, which Lightning keeps in
its checkpoints): resumed from a checkpoint written in the middle of an epoch, it yields the
rest of that epoch's batches, the same ones the uninterrupted run trains.
"""

from __future__ import annotations

import collections
import copy
import math
import multiprocessing as mp
import multiprocessing.forkserver
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from gnnpar import omp
from gnnpar.config.parse import apply
from gnnpar.config.schema import Config
from gnnpar.configure import dataset_kind, resolve, validate
from gnnpar.errors import UsageError
from gnnpar.lightning.batches import (
    EvalBatches,
    PartBatches,
    PoolBatches,
    eval_batches,
    parts_with,
    seeded_perm,
)

# the settings of `gnnpar train` that the data module reads (flag names)
DATA_KEYS = (
    "dataset",
    "data-root",
    "scale",
    "partitions",
    "partitioner",
    "fanouts",
    "batch-size",
    "loader-workers",
    "seed",
    "timeout",
    "max-steps",
)
SAMPLED_ONLY = ("fanouts", "batch-size", "loader-workers")
WHERE = "GraphDataModule(...)"
SPLITS = ("train", "val", "test")


def data_config(dataset: Any, settings: dict[str, Any]) -> Config:
    """The data settings as gnnpar's checked ``Config``: parsed by :func:`gnnpar.config.parse.
    apply` (an unknown or mistyped key is the command line's message) and checked by
    :func:`gnnpar.configure.validate` as the run of the matching ``gnnpar train``
    (``--strategy sampled``, or ``allreduce`` with ``partitions``) would be."""
    if isinstance(dataset, Path):
        dataset = str(dataset)
    if not isinstance(dataset, str):
        raise UsageError(
            f"{WHERE}: dataset must be a name gnnpar reads (see `gnnpar datasets`), a .pt file, "
            f"an OGB folder or 'module:function', got {type(dataset).__name__}."
        )
    cfg, given = Config(), {}
    given_settings = {k: v for k, v in settings.items() if v is not None}  # None: not given
    apply(cfg, {"dataset": dataset, **given_settings}, WHERE, given)
    other = [k for k in given if k not in DATA_KEYS]
    if other:
        raise UsageError(
            f"{WHERE}: '{other[0]}' is a setting of `gnnpar train` that does not choose the "
            "data: set it in your LightningModule or Trainer. The data module reads: "
            f"{', '.join(k.replace('-', '_') for k in DATA_KEYS)}."
        )
    kind, _ = dataset_kind(cfg.data.dataset)
    if kind != "graph":
        raise UsageError(f"{WHERE}: dataset '{cfg.data.dataset}' holds images, not a graph.")
    if cfg.data.partitions is not None:
        mixed = [k for k in SAMPLED_ONLY if k in given]
        if mixed:
            raise UsageError(
                f"{WHERE}: partitions={cfg.data.partitions} gives Cluster-GCN batches (one "
                f"subgraph each); {', '.join(k.replace('-', '_') for k in mixed)} set "
                "neighbour-sampled batches. Drop one or the other."
            )
        cfg.strategy.name = "allreduce"
    else:
        cfg.strategy.name = "sampled"
    cfg.model.name = "sage"  # the study-002 model whose defaults the sampled run takes
    resolve(cfg)
    validate(cfg, given)
    return cfg


def _ranks(trainer: pl.Trainer | None) -> SimpleNamespace:
    if trainer is not None:
        return SimpleNamespace(
            rank=trainer.global_rank, world_size=trainer.world_size, local_rank=trainer.local_rank
        )
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        local = int(os.environ.get("LOCAL_RANK", rank))
        return SimpleNamespace(rank=rank, world_size=dist.get_world_size(), local_rank=local)
    return SimpleNamespace(rank=0, world_size=1, local_rank=0)


# ------------------------------------------------------------------------------ samplers
class EpochSampler(DistributedSampler):
    """Batch indices ``epoch * steps + [done, steps)`` of this rank's plan for the epoch set by
    ``set_epoch`` (a ``DistributedSampler``, so Lightning leaves it in place). ``done`` is 0 but
    in an epoch resumed midway (:meth:`resume`). Read when iteration begins, not before."""

    def __init__(self, steps: int, rank: int, world_size: int, seed: int) -> None:
        # no super().__init__: the plan is gnnpar's, not a split of a sized dataset
        self.steps, self.rank, self.num_replicas, self.seed = steps, rank, world_size, seed
        self.epoch, self.shuffle, self.drop_last = 0, True, True
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, done: int) -> None:
        if done >= self.steps:  # saved at the end of that epoch: the next one begins
            epoch, done = epoch + 1, 0
        self.epoch, self._resume = epoch, (epoch, done)

    def __iter__(self) -> Iterator[int]:
        done = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            done = self._resume[1]
        self._resume = None
        base = self.epoch * self.steps
        yield from range(base + done, base + self.steps)

    def __len__(self) -> int:
        return self.steps


class FixedSampler(EpochSampler):
    """Evaluation: the same batches ``0 .. steps-1`` every epoch."""

    def __iter__(self) -> Iterator[int]:
        yield from range(self.steps)


class PoolSampler(DistributedSampler):
    """Gossip: the next item of gnnpar's shared work pool (:class:`gnnpar.parallel.gossip.
    WorkPool`) whenever this rank asks, until the pool moves on to the next epoch. An item of a
    later epoch is kept for that epoch. No length: a rank trains what it takes. A rank holds at
    most ``loader_workers + 1`` items it has taken but not trained yet (Lightning fetches one
    batch ahead, each loader worker makes one), which the others wait for at an epoch's end:
    epochs of many more batches than that keep the pool's balance. ``pending``: on a resume,
    the items ``[epoch, item]`` this rank had taken but not trained, given first."""

    def __init__(self, pool, rank: int, world_size: int, pending=()) -> None:
        self.pool, self.rank, self.num_replicas = pool, rank, world_size
        self.epoch, self.shuffle, self.drop_last = 0, True, False
        self.taken: list[list[int]] = []  # [epoch, item] in the order given to the loader
        self.pending = [(None, int(e), int(i)) for e, i in pending]
        self.seen = 0  # the pool's positions handed out, as far as this rank has seen
        self._next: tuple[int | None, int, int] | None = None
        self._empty = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _take(self) -> tuple[int | None, int, int] | None:
        if self.pending:
            return self.pending.pop(0)
        if self._empty:
            return None
        item = self.pool.take()
        if item is None:
            self._empty = True
            self.seen = max(self.seen, self.pool.total)
        else:
            self.seen = max(self.seen, item[0] + 1)
        return item

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        while True:
            item = self._next if self._next is not None else self._take()
            self._next = None
            if item is None:
                return
            _, e, idx = item
            if e > epoch:  # the pool moved on: this belongs to our next epoch
                self._next = item
                return
            self.taken.append([e, idx])
            yield e * self.pool.size + idx

    def untrained(self, started: int) -> list[list[int]]:
        """The items taken but not trained once ``started`` batches of this fit have begun:
        given to the loader after those, held for the next epoch, or still pending."""
        held = [] if self._next is None else [list(self._next[1:])]
        return self.taken[started:] + held + [[e, i] for _, e, i in self.pending]

    def __len__(self) -> int:
        raise TypeError("a rank's share of the work pool has no length: it trains what it takes")


# ------------------------------------------------------------------------------ loaders
class HandOff:
    """The batches of a DataLoader with workers, taken from them by a thread of the training
    process while the model trains, and made into PyG ``Data`` there too (``convert``): the loop
    finds the next batch ready in a queue of ``depth``.

    Why: each batch a worker sends costs the training process a few milliseconds of CPU
    (unpickling, receiving and mapping the shared-memory file of every tensor, the ``Data``), and
    a loop that asks for it when it is due also waits for the worker's side of that exchange to
    be scheduled. On 2 cores at load 10-27 that wait was 16-49 ms a batch (median), against 2-3
    ms from this queue (the profile in BENCHMARKS.md). torch's ``pin_memory`` thread and DGL's
    prefetching iterator take batches the same way. The thread holds at most one batch besides
    the ``depth`` queued ones (the workers' ``prefetch_factor`` batches come on top).

    An error of the loader (a worker's, or its ``timeout``) is raised in the loop at the batch
    it stopped; :meth:`close` stops the thread at its next batch, which lets the DataLoader's
    workers end.

    The loop does not pay for freeing a batch either: the hand-off keeps a reference to the last
    :data:`KEEP` batches it handed out and lets go of the oldest on a thread of its own
    (``gnnpar-release``) when it hands out a new one. By then the loop has trained that batch
    and dropped it (Lightning's fetcher holds the batch it trains and the one it fetched ahead),
    so the last reference is this one, and unmapping the batch's shared-memory tensors happens
    off the loop: at synthetic-reddit 0.1 (a 56 MB batch from a worker) that was 14-20 ms of
    every ``next`` (BENCHMARKS.md). A batch the user still holds is freed where the user lets
    go of it, as before; none is kept longer than :data:`KEEP` hand-outs."""

    KEEP = 2  # batches handed out whose last reference may be this one's

    def __init__(self, batches: Iterator[Any], convert: Callable[[Any], Any], depth: int = 1):
        self._queue: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._lent: collections.deque = collections.deque()
        self._freed: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(batches, convert), name="gnnpar-hand-off", daemon=True
        )
        self._thread.start()
        self._releaser = threading.Thread(
            target=self._release, args=(self._freed,), name="gnnpar-release", daemon=True
        )
        self._releaser.start()

    @staticmethod
    def _release(freed: queue.SimpleQueue) -> None:
        while True:  # each batch's last reference, if it is this one, dropped here
            item = freed.get()
            if item is None:
                return
            del item

    def _run(self, batches: Iterator[Any], convert: Callable[[Any], Any]) -> None:
        try:
            for item in batches:
                if not self._put((True, convert(item))):
                    return
            self._put((False, None))
        except BaseException as e:  # noqa: BLE001 - raised again in the loop (__next__)
            self._put((False, e))

    def _put(self, entry: tuple[bool, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> HandOff:
        return self

    def __next__(self) -> Any:
        if self._stop.is_set():
            raise StopIteration
        ok, value = self._queue.get()
        if ok:
            self._lent.append(value)
            if len(self._lent) > self.KEEP:
                self._freed.put(self._lent.popleft())
            return value
        self._stop.set()
        self._let_go()
        if value is None:
            raise StopIteration
        raise value

    def _let_go(self) -> None:
        """The stream has ended: every batch still kept goes, then the release thread ends."""
        if self._releaser is None:
            return
        while self._lent:
            self._freed.put(self._lent.popleft())
        self._freed.put(None)
        self._releaser = None

    def close(self) -> None:
        self._stop.set()
        self._let_go()
        while True:  # a thread waiting to put sees the stop within 0.5 s; drop what it queued
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return


class GraphLoader(DataLoader):
    """A DataLoader whose items become PyG ``Data`` batches in the training process."""

    def __init__(self, dataset, sampler, convert: Callable[[Any], Any], **kwargs: Any) -> None:
        # the iterator's base seed from a generator of its own: a new epoch's iterator leaves
        # the global generator (the model's dropout masks) as it was
        kwargs.setdefault("generator", torch.Generator().manual_seed(0))
        super().__init__(dataset, batch_size=None, sampler=sampler, **kwargs)
        self.convert = convert
        self.yielded = 0  # batches of the current epoch handed out

    def _start(self) -> int:
        sampler = self.sampler
        if isinstance(sampler, EpochSampler) and sampler._resume is not None:
            if sampler._resume[0] == sampler.epoch:
                return sampler._resume[1]
        return 0

    def __iter__(self) -> Iterator[Any]:
        self.yielded = self._start()
        for item in super().__iter__():
            self.yielded += 1
            yield self.convert(item)


class ResumableLoader(GraphLoader):
    """The training loader: ``state_dict`` is (epoch, batches trained in it), which Lightning
    saves in its checkpoints and gives back through ``load_state_dict`` before iterating.

    One stream of batches for the whole run, not one per epoch: batch ``epoch * steps + step``
    depends on nothing else, so the loader workers go on to the next epoch's first batches
    while the model trains on this epoch's last ones, as ``gnnpar train``'s one loader pass
    does. With a DataLoader per epoch (Lightning's ``iter`` at every epoch start) each epoch
    would begin with the loop waiting for a whole batch to be sampled. The stream is made
    again only where an epoch does not begin where it stopped (a resume, a different
    ``set_epoch``); it ends at ``end`` (the run's last batch, when the Trainer's
    ``max_epochs`` is known). With loader workers, a thread of the training process takes each
    batch from them ahead of the loop (:class:`HandOff`)."""

    trainer: pl.Trainer | None = None

    def __init__(
        self, dataset, sampler, convert, end: int | None = None, head: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(dataset, sampler, convert, **kwargs)
        self.head = head  # may make a new stream's first batches here: see _head
        # the stream's iterator draws its base seed from the loader's own generator too
        kwargs = {**kwargs, "generator": self.generator}
        self._stream_kwargs = {k: v for k, v in kwargs.items() if k != "persistent_workers"}
        self._end = end
        self._stream: Iterator[Any] | None = None
        self._stream_at = -1  # the index of the stream's next batch

    def __iter__(self) -> Iterator[Any]:
        """The epoch's batches. A stream that does not begin where the sampler will begin is
        made now, as a DataLoader starts its workers when ``iter`` is called (Lightning calls
        it for the first epoch while it sets up the fit, before ``on_train_epoch_start``), not
        at the first batch; the sampler itself is read at the first batch (a ``set_epoch`` in
        between that moves it makes the stream again there)."""
        self.yielded = self._start()
        first = self.yielded + self.sampler.epoch * self.sampler.steps
        if self._end is None or first < self._end:
            self._open(first)
        return self._batches()

    def _open(self, first: int) -> None:
        """Make the stream begin at batch ``first`` unless it is there already."""
        if self._stream is not None and self._stream_at == first:
            return
        self.close()  # ends the old stream's workers
        end = self._end if self._end is not None and self._end > first else 2**62
        kw = self._stream_kwargs
        workers = kw.get("num_workers", 0) > 0
        forked = workers and kw["multiprocessing_context"].get_start_method() == "fork"
        if forked and self._head() and end - first > 1:
            # the workers forked now, by this thread (the loop's, between steps: see
            # worker_start); batch `first` made here meanwhile, on the hand-off thread
            loader = DataLoader(self.dataset, batch_size=None, sampler=range(first + 1, end), **kw)
            rest = iter(loader)
            here = copy.deepcopy(self.dataset)
            self._stream = HandOff(first_here(here, first, rest), self.convert)
        elif workers and self._head() and not forked:
            claims = Claims(first, end)
            loader = DataLoader(self.dataset, batch_size=None, sampler=claims.for_loader(), **kw)
            # the head from a copy: starting a worker pickles the dataset, which moves its
            # tensors' storage into shared memory in place, under the feet of a reader
            here = copy.deepcopy(self.dataset)
            self._stream = HandOff(made_here(here, claims, loader.__iter__), self.convert)
        else:  # taken from the workers, or sampled in this process when the loop asks
            loader = DataLoader(self.dataset, batch_size=None, sampler=range(first, end), **kw)
            self._stream = (
                HandOff(iter(loader), self.convert) if workers else map(self.convert, loader)
            )
        self._stream_at = first

    def _batches(self) -> Iterator[Any]:
        indices = list(iter(self.sampler))  # consecutive: this epoch's batches still to train
        if not indices:
            return
        self._open(indices[0])
        for _ in indices:
            yield self._take()  # this frame keeps no reference to a batch it handed out

    def _take(self) -> Any:
        batch = next(self._stream)
        self._stream_at += 1
        self.yielded += 1
        return batch

    def _head(self) -> bool:
        """Whether a new stream's first batches are made in the training process: where the
        data module allows it (``head``: workers, a graph of at most :data:`HEAD_MAX_NODES`
        nodes). With forked workers (:func:`worker_start`), the first batch, made on the
        hand-off thread while the workers (forked first) start and make the next ones
        (:func:`first_here`); with a fork server's, one at a time as the loop takes them, until
        the workers' loader has started (:class:`Claims`).

        Why: a worker's first batch waits for the worker to start (a fork server's: for the
        server's import of torch too, begun when the data module was made: 5-8 s on 2 loaded
        cores, ~1 s on a quiet machine), to map the graph, make its sampler and sample. Even
        with the server ready, rank 0 of 2 waited 0.40 s for a worker's first batch where PyG's
        ranks waited 0.13-0.24 s (load 9). Batch ``i`` is the same in any process, so the
        stream's batches do not change."""
        return self.head

    def close(self) -> None:
        """End the stream (its workers and hand-off thread)."""
        if isinstance(self._stream, HandOff):
            self._stream.close()
        self._stream = None

    def _trained(self) -> int:
        """Batches of the epoch trained: Lightning's count where a Trainer runs (the loader has
        handed out more: Lightning fetches one ahead, workers prefetch), else those yielded."""
        if self.trainer is not None:
            return int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        return self.yielded

    def state_dict(self) -> dict[str, Any]:
        s = self.sampler
        return {
            "format": "gnnpar-loader-1",
            "epoch": s.epoch,
            "done": self._trained(),
            "steps": s.steps,
            "world_size": s.num_replicas,
            "seed": s.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s = self.sampler
        if state.get("format") != "gnnpar-loader-1":
            raise UsageError("The checkpoint's data loader state is not a GraphDataModule's.")
        theirs = (state["steps"], state["world_size"], state["seed"])
        if theirs != (s.steps, s.num_replicas, s.seed):
            raise UsageError(
                f"The checkpoint was written by a run of {state['world_size']} ranks, "
                f"{state['steps']} steps per epoch and seed {state['seed']}; this one has "
                f"{s.num_replicas}, {s.steps} and {s.seed}: its batches would differ. Resume "
                "with the same devices, batch_size, max_steps and seed."
            )
        s.resume(int(state["epoch"]), int(state["done"]))


class Claims:
    """The batch indices ``first .. end - 1`` of a new stream, claimed in order: by the training
    process (:func:`made_here`) until the workers' loader takes its first one, then all by the
    loader (:meth:`for_loader`, its sampler: a DataLoader takes its first indices once its
    workers have started)."""

    def __init__(self, first: int, end: int) -> None:
        self.next, self.end = first, end
        self.loader_began = False
        self._lock = threading.Lock()

    def claim_here(self) -> int | None:
        """The next index for this process, or None once the loader has begun (or none is left)."""
        with self._lock:
            if self.loader_began or self.next >= self.end:
                return None
            self.next += 1
            return self.next - 1

    def for_loader(self) -> Iterator[int]:
        with self._lock:
            self.loader_began = True
            first = self.next
        yield from range(first, self.end)


def made_here(dataset, claims: Claims, start: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """``dataset[i]`` made in this process for each index it claims, then the items of the
    iterator ``start()`` returns (a DataLoader's over ``claims.for_loader()``), started on a
    thread of its own meanwhile: starting a worker waits for the fork server to answer. This
    process's sampler is dropped once its part is made (:meth:`~gnnpar.data.sampling.loader.
    SampledBatches.release`)."""
    started: dict[str, Any] = {}

    def begin() -> None:
        try:
            started["it"] = start()
        except BaseException as e:  # noqa: BLE001 - raised again where the batches are taken
            started["error"] = e

    thread = threading.Thread(target=begin, name="gnnpar-loader-start", daemon=True)
    thread.start()
    try:
        while (i := claims.claim_here()) is not None:
            yield dataset[i]
    finally:
        dataset.release()
    thread.join()
    if "error" in started:
        raise started["error"]
    yield from started["it"]


def first_here(dataset, first: int, rest: Iterator[Any]) -> Iterator[Any]:
    """``dataset[first]`` made in this process, then the items of ``rest`` (the forked workers'
    loader, already started over the indices after ``first``); this process's sampler is
    dropped once its batch is made."""
    try:
        yield dataset[first]
    finally:
        dataset.release()
    yield from rest


# Graphs up to this many nodes may have a new stream's first batches made in the training
# process (ResumableLoader._head): its sampler's node-mark arrays, 16-24 bytes a node, are this
# process's to hold meanwhile (~400 MB at this size).
HEAD_MAX_NODES = 1 << 24


def start_fork_server() -> Any:
    """The fork server that loader workers are forked from where they are not forks of the
    training process (:func:`worker_start`; ``gnnpar train``'s, :func:`gnnpar.data.sampling.
    loader.build_loader`: it imports torch and the sampler once, and holds no process group),
    started if it is not running yet; returns its multiprocessing context.

    :class:`GraphDataModule` starts it when it is made, not when the first loader iterates: the
    server's import of torch (5-8 s on 2 loaded cores) then runs while the model and the
    ``Trainer`` are set up instead of inside the first batch's wait."""
    from gnnpar.data.sampling import loader

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", loader.__name__])
    with omp.ranks_sleep_at_once():
        multiprocessing.forkserver.ensure_running()
    return ctx


LOADER_START = "GNNPAR_LOADER_START"


def worker_start() -> str:
    """How the data module's loader workers start: ``fork`` (forks of the training process, as
    PyG's and torch's default loaders start theirs on Linux) or ``forkserver`` (forks of
    :func:`start_fork_server`'s server). ``fork`` where the platform is Linux, the caller is the
    main thread (Lightning makes and iterates its loaders there) and ``GNNPAR_LOADER_START``
    does not ask for ``forkserver``.

    Why fork: under Lightning's DDP the second rank is started by ``Trainer.fit``, and its fork
    server imports torch (~1.3 s of CPU) while the first epoch runs; on 2 cores shared by 2
    ranks that made gnnpar's first epoch 0.5-0.6 s longer than PyG's on a quiet machine, with
    equal waits for batches (BENCHMARKS.md). A fork of the training process imports nothing.

    Why it is safe here (the hazards of forking a rank, :mod:`gnnpar.strategies.sampled`): the
    fork is made by the main thread, between steps (the stream's start, Lightning's ``iter``,
    or an evaluation loader's), not by one of gnnpar's threads while the loop runs. A worker
    runs torch's DataLoader worker loop over gnnpar's sampler and nothing else, so the locks
    other threads may hold at that moment are ones it never takes: the process group's
    threads' (a worker calls no collective and never reaches the store), torch's OpenMP pool
    (idle between parallel regions; a worker runs with one thread, ``_worker_init``, so it never
    enters the inherited pool), the previous stream's hand-off thread (stopped; it can only be
    waiting on that stream's queues). What a worker does take is made safe by fork itself:
    glibc's malloc locks (its fork handlers), Python's runtime and ``logging`` locks, torch's
    shared-memory cache lock (re-made after a fork), and the CUDA context, which a worker never
    uses (its batches are CPU tensors). Memory: the graph is in shared memory (mapped, not
    copied); the rest of the training process is shared copy-on-write, as PyG's workers share
    it. ``GNNPAR_LOADER_START=forkserver`` keeps the fork server (a user thread of their own
    that holds a lock the sampler takes: none of the above)."""
    asked = os.environ.get(LOADER_START, "")
    if asked not in ("", "fork", "forkserver"):
        raise UsageError(
            f"{LOADER_START}={asked!r}: use fork (the default on Linux) or forkserver, or leave "
            "it unset."
        )
    if asked == "forkserver" or not sys.platform.startswith("linux"):
        return "forkserver"
    if threading.current_thread() is not threading.main_thread():
        return "forkserver"
    return "fork"


def _worker_kwargs(workers: int, timeout_s: float) -> dict[str, Any]:
    """What ``gnnpar train``'s loader gives its workers (:func:`gnnpar.data.sampling.loader.
    build_loader`): workers started as :func:`worker_start` says, one thread each, exit with
    the training process, a bounded wait for every batch."""
    if workers == 0:
        return {}
    from gnnpar.data.sampling import loader

    ctx = mp.get_context("fork") if worker_start() == "fork" else start_fork_server()
    return {
        "num_workers": workers,
        "persistent_workers": True,
        "multiprocessing_context": ctx,
        "worker_init_fn": loader._worker_init,
        "timeout": timeout_s,
        "prefetch_factor": 2,
    }


# ------------------------------------------------------------------------------ data module
class GraphDataModule(pl.LightningDataModule):
    """gnnpar's graphs and mini-batches for ``Trainer.fit`` (see the module docstring).

    ``dataset``: what ``gnnpar train --dataset`` takes (a name from ``gnnpar datasets``, a
    ``.pt`` file, an OGB folder, ``module:function``). ``settings``: ``gnnpar train``'s data
    flags by name (:data:`DATA_KEYS`, dashes or underscores): ``fanouts``, ``batch_size``,
    ``loader_workers``, ``partitions``, ``partitioner``, ``scale``, ``seed``, ``timeout``,
    ``max_steps``, ``data_root``.
    """

    def __init__(self, dataset: Any = "cora", **settings: Any) -> None:
        super().__init__()
        self.cfg = data_config(dataset, settings)
        # not in a process multiprocessing started (a loader worker importing the user's
        # script, which makes a data module too): workers never start loader workers
        workers = self.sampled and self.cfg.strategy.loader_workers > 0
        if workers and mp.parent_process() is None and worker_start() == "forkserver":
            start_fork_server()
        self.dataset_name = self.cfg.data.dataset
        self.ds = None  # the loaded gnnpar GraphDataset (loaded once per process)
        self.setup_s = 0.0  # loading, partitioning and sharing the graph
        self.partition_time_s = 0.0
        self._graph_path: str | None = None
        self._fd: int | None = None
        self._parts = None
        self._ranks_at_setup: SimpleNamespace | None = None
        self._train_loader: ResumableLoader | None = None  # the last one made, to close

    @property
    def sampled(self) -> bool:
        return self.cfg.data.partitions is None

    def load(self):
        """The graph (gnnpar's ``GraphDataset``), loaded on first use in this process through
        gnnpar's loader and cache (``gnnpar train --dataset``'s)."""
        if self.ds is None:
            from gnnpar.data.datasets import load_dataset

            d, r, s = self.cfg.data, self.cfg.run, self.cfg.strategy
            ds = load_dataset(d.dataset, d.data_root, d.scale, r.seed, s.timeout_s)
            if ds.kind != "graph":  # a module:function may return images
                raise UsageError(f"{WHERE}: dataset '{d.dataset}' holds images, not a graph.")
            self.ds = ds
        return self.ds

    @property
    def num_features(self) -> int:
        """Input features per node (loads the graph if needed: usable before ``setup``)."""
        return self.load().num_features

    @property
    def num_classes(self) -> int:
        return self.load().num_classes

    @property
    def multilabel(self) -> bool:
        return self.load().multilabel

    # -------------------------------------------------------------- setup
    def setup(self, stage: str | None = None) -> None:
        """Load the graph, then share it (neighbour sampling: one shared-memory file per
        machine, written by its local rank 0) or partition it (Cluster-GCN). ``Trainer.fit``
        calls it on every rank once the process group exists."""
        ranks = _ranks(getattr(self, "trainer", None))
        if self._ranks_at_setup is not None and vars(ranks) == vars(self._ranks_at_setup):
            return
        t0 = time.perf_counter()
        ds = self.load()
        self.close()
        if self.sampled:
            from gnnpar.training.sources import share_graph

            self._graph_path, self._fd = share_graph(ds, ranks)
        elif self._parts is None:
            from gnnpar.data.partition import load_partitions

            self._parts, self.partition_time_s, _ = load_partitions(self.cfg, ds)
        self._ranks_at_setup = ranks
        self.setup_s = time.perf_counter() - t0

    def close(self) -> None:
        """Drop this process's hold on the shared graph (the file is unlinked already)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _need_setup(self) -> SimpleNamespace:
        ranks = _ranks(getattr(self, "trainer", None))
        if self._ranks_at_setup is None or vars(ranks) != vars(self._ranks_at_setup):
            self.setup()  # not run yet, or for other ranks (Trainer.fit calls it)
        return ranks

    def split_index(self, split: str) -> torch.Tensor:
        return self.ds.data[f"{split}_mask"].nonzero().view(-1)

    def _convert(self):
        from gnnpar.csr import mark_rows

        features, labels = self.ds.data.x, self.ds.data.y

        def convert(b):  # a SampledBatch -> the PyG Data NeighborLoader gives
            data = b.to_data()
            data.y = labels[b.n_id]
            mark_rows(data.x, features, data.n_id)  # gnnpar's models reuse the graph's CSR plan
            return data

        return convert

    def _trainer_strategy(self):
        trainer = getattr(self, "trainer", None)
        return None if trainer is None else trainer.strategy

    # -------------------------------------------------------------- loaders
    def train_dataloader(self) -> GraphLoader:
        ranks = self._need_setup()
        from gnnpar.lightning.strategies import GossipStrategy

        strategy = self._trainer_strategy()
        if isinstance(strategy, GossipStrategy):
            return self._pool_loader(strategy, ranks)
        s, r = self.cfg.strategy, self.cfg.run
        head = False  # a new stream's first batches made here while its workers start
        if self.sampled:
            from gnnpar.data.sampling.loader import SampledBatches, shard_plan

            train_idx = self.split_index("train")
            if train_idx.numel() < ranks.world_size:
                raise UsageError(
                    f"Dataset '{self.dataset_name}' has {train_idx.numel()} training nodes, "
                    f"fewer than the {ranks.world_size} ranks: every rank needs at least one."
                )
            _, steps = shard_plan(train_idx.numel(), ranks.world_size, s.batch_size)
            steps = min(steps, r.max_steps or steps)
            dataset = SampledBatches(
                self._graph_path,
                train_idx,
                s.fanouts,
                s.batch_size,
                ranks.rank,
                ranks.world_size,
                r.seed,
                steps,
            )
            kwargs, convert = _worker_kwargs(s.loader_workers, s.timeout_s), self._convert()
            head = bool(kwargs) and self.ds.num_nodes <= HEAD_MAX_NODES
        else:
            parts = self._parts_with("train")
            if len(parts) < ranks.world_size:
                raise UsageError(
                    f"{len(parts)} of the {self.cfg.data.partitions} subgraphs hold training "
                    f"nodes, fewer than the {ranks.world_size} ranks: use more partitions."
                )
            steps = len(parts) // ranks.world_size
            steps = min(steps, r.max_steps or steps)
            rank, world, seed = ranks.rank, ranks.world_size, r.seed

            def plan(epoch: int, step: int) -> int:
                order = seeded_perm(len(parts), seed, epoch, 0xC1)
                return parts[int(order[rank + step * world])]

            dataset = PartBatches(self._parts, plan, steps, "train")
            kwargs, convert = {}, _identity
        trainer = getattr(self, "trainer", None)
        epochs = None if trainer is None else trainer.max_epochs
        end = steps * epochs if epochs is not None and epochs > 0 else None
        sampler = EpochSampler(steps, ranks.rank, ranks.world_size, r.seed)
        loader = ResumableLoader(dataset, sampler, convert, end, head, **kwargs)
        loader.trainer = trainer
        self._close_train_loader()
        self._train_loader = loader
        return loader

    def _close_train_loader(self) -> None:
        if self._train_loader is not None:
            self._train_loader.close()
            self._train_loader = None

    def _parts_with(self, split: str) -> list[int]:
        return parts_with(self._parts, f"{split}_mask")

    def _pool_loader(self, strategy, ranks: SimpleNamespace) -> GraphLoader:
        s, r = self.cfg.strategy, self.cfg.run
        epochs = self.trainer.max_epochs
        if epochs is None or epochs < 0:
            raise UsageError("GossipStrategy's work pool needs Trainer(max_epochs=N).")
        if self.sampled:
            train_idx = self.split_index("train")
            size = math.ceil(train_idx.numel() / s.batch_size)
            dataset = PoolBatches(
                self._graph_path, train_idx, s.fanouts, s.batch_size, r.seed, size
            )
            kwargs, convert = _worker_kwargs(s.loader_workers, s.timeout_s), self._convert()
            if kwargs:  # each worker makes one batch ahead: taken, not yet trained, items
                kwargs["prefetch_factor"] = 1
        else:
            parts = self._parts_with("train")
            size = len(parts)
            dataset = PartBatches(self._parts, lambda e, j: parts[j], size, "train")
            kwargs, convert = {}, _identity
        pool = strategy.work_pool(size, epochs, r.seed, start_epoch=self.trainer.current_epoch)
        sampler = PoolSampler(pool, ranks.rank, ranks.world_size, strategy.pending_items())
        # Lightning starts iterating before its set_epoch (its fetcher fetches one ahead): a
        # resumed run's first epoch is the one it resumes in, not 0
        sampler.set_epoch(self.trainer.current_epoch)
        strategy.sampler = sampler  # for its checkpoints: what this rank took, not trained
        return GraphLoader(dataset, sampler, convert, **kwargs)

    def _eval_loader(self, split: str) -> GraphLoader:
        ranks = self._need_setup()
        s, r = self.cfg.strategy, self.cfg.run
        tag = SPLITS.index(split) + 0xE0
        if self.sampled:
            seeds = eval_batches(
                self.split_index(split), ranks.rank, ranks.world_size, s.batch_size
            )
            dataset = EvalBatches(self._graph_path, seeds, s.fanouts, r.seed, tag, ranks.rank)
            steps = len(seeds)
            kwargs, convert = _worker_kwargs(s.loader_workers, s.timeout_s), self._convert()
        else:
            mine = self._parts_with(split)[ranks.rank :: ranks.world_size]
            dataset = PartBatches(self._parts, lambda e, j: mine[j], len(mine), split)
            steps, kwargs, convert = len(mine), {}, _identity
        sampler = FixedSampler(steps, ranks.rank, ranks.world_size, r.seed)
        return GraphLoader(dataset, sampler, convert, **kwargs)

    def val_dataloader(self) -> GraphLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> GraphLoader:
        return self._eval_loader("test")

    def teardown(self, stage: str | None = None) -> None:
        """End the training loader's stream (workers, hand-off thread) after a fit; the shared
        graph stays for later fit/validate/test calls (:meth:`close` drops it)."""
        if stage in (None, "fit"):
            self._close_train_loader()


def _identity(x):
    return x
