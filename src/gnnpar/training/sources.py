"""Sources: what one rank trains on, epoch by epoch (the loop asks ``source.epoch(e)``).

===========================  ================================================  ==============
source                       batches                                           strategy
===========================  ================================================  ==============
:class:`ShuffledBatches`     the full graph, or every Cluster-GCN subgraph     sequential
                             in a seeded order
:class:`DealtPartitions`     this rank's share of the subgraphs, dealt once    allreduce
:class:`PoolSource`          the next subgraph of the shared work pool         gossip
:class:`ImageBatches`        seeded image mini-batches                         sequential
:class:`SampledSource`      neighbour-sampled batches over a shared graph     sampled
:mod:`.pipeline_batches`     pipeline micro-batches                            pipeline
===========================  ================================================  ==============

Every source is a :class:`~gnnpar.training.protocols.BaseSource` (the protocol the loop calls:
:mod:`gnnpar.training.protocols`). A source yields ``None`` for a step at which this rank has no
batch but must still take part in the step's collective (the uneven last step of a static
split). ``position`` counts the steps done, by every rank where the source knows it (the work
pool), for the progress bar.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch_geometric.data import Data

from gnnpar.config.schema import Config
from gnnpar.csr import mark_rows
from gnnpar.data import cache_writer
from gnnpar.data.cache_writer import STEP_BATCHES, batch_feature_bytes, shm_file
from gnnpar.data.sampling.loader import (
    Ahead,
    GatherAfterRelease,
    SampledBatches,
    build_loader,
    save_shared_graph,
    shard_plan,
)
from gnnpar.data.sampling.sampler import CSRGraph
from gnnpar.parallel import collectives
from gnnpar.parallel.gossip import ShardedPool, WorkPool
from gnnpar.runtime.dist import DistContext
from gnnpar.training.protocols import BaseSource


def image_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches in a seeded random order (seed None: in order, for evaluation)."""
    n = x.size(0)
    if seed is None:
        order = torch.arange(n)
    else:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    for i in range(0, n, batch_size):
        idx = order[i : i + batch_size]
        yield x[idx], y[idx]


class ShuffledBatches(BaseSource):
    """Every batch once per epoch in an order drawn from one generator seeded once (at most
    ``max_steps`` of them). One batch: full-batch training, one step per epoch."""

    def __init__(self, batches: list[Data], epochs: int, seed: int, max_steps: int | None) -> None:
        self.batches = batches
        self.steps = min(len(batches), max_steps or len(batches))
        self.total_steps = epochs * self.steps
        self.position = 0
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.done = 0  # batches of the current epoch's order yielded so far

    def epoch(self, epoch: int) -> Iterator[Data]:
        if not 0 < self.done < len(self.order):  # a fresh epoch (not one resumed midway)
            self.order = torch.randperm(len(self.batches), generator=self.gen)[: self.steps]
            self.order, self.done = self.order.tolist(), 0
        while self.done < len(self.order):
            self.done += 1
            self.position += 1
            yield self.batches[self.order[self.done - 1]]

    def state(self) -> dict:
        return {
            "gen": self.gen.get_state(),
            "order": self.order,
            "done": self.done,
            "pos": self.position,
        }

    def load_state(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
        self.order, self.done, self.position = state["order"], state["done"], state["pos"]


class Resumable(BaseSource):
    """A source whose epochs are functions of (seed, epoch) alone: resuming midway skips the
    batches the checkpoint had done."""

    position = 0
    done = 0  # steps of the current epoch done
    _skip = 0  # on resume: steps of the resumed epoch to pass over (:meth:`skip`)

    def state(self) -> dict:
        return {"pos": self.position}

    def load_state(self, state: dict) -> None:
        self.position = state["pos"]

    def skip(self, steps: int) -> None:
        """The next epoch is the resumed one: pass over its first ``steps`` batches."""
        self._skip = steps

    def _counted(self, items: Iterator) -> Iterator:
        skip, self._skip, self.done = self._skip, 0, 0
        for item in items:
            self.done += 1
            if self.done > skip:
                self.position += 1
                yield item


class ImageBatches(Resumable):
    """``--batch-size`` images per step in a seeded order per epoch (seed + epoch)."""

    def __init__(self, ds, batch_size: int, epochs: int, seed: int, max_steps: int | None) -> None:
        self.ds, self.batch_size, self.seed = ds, batch_size, seed
        per_epoch = -(-ds.train_x.size(0) // batch_size)
        self.steps = min(per_epoch, max_steps or per_epoch)
        self.total_steps = epochs * self.steps
        self.position = 0

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = image_batches(
            self.ds.train_x, self.ds.train_y, self.batch_size, self.seed + epoch
        )
        return self._counted(xy for _, xy in zip(range(self.steps), batches))


def assign_parts(num_parts: int, world: int, seed: int) -> list[list[int]]:
    """Static, even split of the subgraphs: rank r owns ``perm[r::world]`` (sizes differ by <= 1)."""
    perm = torch.randperm(num_parts, generator=torch.Generator().manual_seed(seed)).tolist()
    return [perm[r::world] for r in range(world)]


def epoch_order(parts: list[int], seed: int, epoch: int, rank: int) -> list[int]:
    """The order in which a rank trains its own subgraphs in one epoch (seeded, reproducible)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 1009 + rank)
    return [parts[i] for i in torch.randperm(len(parts), generator=g).tolist()]


class DealtPartitions(Resumable):
    """Subgraphs dealt once, statically: rank r owns ``perm[r::world]`` of a seeded permutation
    and trains them in a fresh seeded order each epoch. Every rank runs ``ceil(n / world)``
    steps (at most ``max_steps``); a rank with one subgraph fewer yields None at the last."""

    def __init__(
        self, graph, rank: int, world: int, epochs: int, seed: int, max_steps, device,
        deal: tuple[list[int], int] | None = None, first: int = 0,
    ):  # fmt: skip
        """``deal``: (this rank's part ids, the steps every rank runs) where the parts are
        dealt by host (a sharded graph: gnnpar.data.shard_parts.deal_by_host); ``first``: the
        id of ``graph``'s part 0 (a host holding only its shard's parts)."""
        self.graph, self.rank, self.seed, self.device = graph, rank, seed, device
        self.first = first
        if deal is None:
            self.mine = assign_parts(graph.num_parts, world, seed)[rank]
            per = math.ceil(graph.num_parts / world)
        else:
            self.mine, per = deal
        self.steps = min(per, max_steps or per)
        self.total_steps = epochs * self.steps
        self.position = 0
        # each subgraph made once (views of the partitioned graph, no copy): the same tensors
        # every epoch, so what the model derives from them and keeps (the sparse input's CSR
        # plan, the GCN adjacency) is found again, as for the work pool's batches
        self._made: dict[int, Data] = {}

    def _batch(self, p: int) -> Data:
        if p not in self._made:
            self._made[p] = self.graph.batch(p - self.first)
        return self._made[p].to(self.device)

    def epoch(self, epoch: int) -> Iterator[Data | None]:
        order = epoch_order(self.mine, self.seed, epoch, self.rank)
        steps = self._counted(iter(range(self.steps)))
        return (self._batch(order[i]) if i < len(order) else None for i in steps)


class PoolSource(BaseSource):
    """GossipGCN's work pool (study 003 section 4.3.2): each rank takes the next subgraph
    whenever it is free, so fast ranks train more. The pool holds every subgraph once per
    epoch, epochs back to back; a rank's epoch ``e`` is what it takes while the pool hands out
    epoch ``e`` (possibly nothing, if the others emptied it meanwhile)."""

    def __init__(
        self,
        pool: WorkPool | ShardedPool,
        batches,  # noqa: ANN001
        on_empty: Callable[[], None] | None = None,
        on_pause: Callable[[], None] | None = None,
    ) -> None:
        """``batches[i]``: subgraph i (a list, or across shards a
        :class:`~gnnpar.parallel.fetch.SubgraphFetch`); ``on_empty``: run once the pool is
        empty for this rank (across shards: serve the others until every rank is done);
        ``on_pause``: run before a checkpoint's barrier (across shards: serve the others until
        every rank has reached it)."""
        self.pool, self.batches, self.on_empty, self.on_pause = pool, batches, on_empty, on_pause
        self.total_steps = pool.total
        self.position = 0
        self.taken: list[list[int]] = []  # [epoch, subgraph] in the order taken
        self._next: tuple[int, int, int] | None = None
        self._empty = False

    def epoch(self, epoch: int) -> Iterator[Data]:
        while not self._empty:
            item = self._next if self._next is not None else self.pool.take()
            self._next = None
            if item is None:
                self._empty = True
                if self.on_empty is not None:
                    self.on_empty()
                # every position is handed out (the others may be training their last ones):
                # the progress display counts the pool's work done, not this rank's last take
                self.position = self.total_steps
                return
            pos, e, idx = item
            if e > epoch:  # the pool moved on: this belongs to a later epoch of ours
                self._next = item
                return
            self.taken.append([e, idx])
            self.position = pos + 1
            yield self.batches[idx]

    def rank_info(self) -> dict:
        more = getattr(self.batches, "rank_info", None)  # across shards: what was fetched
        return {"pool_log": self.taken, **(more() if more else {})}

    def pause(self) -> None:
        if self.on_pause is not None:
            self.on_pause()

    def state(self) -> dict:
        """At a checkpoint every rank has stopped taking (the loop quiesces gossip first), so
        the pool's counters are final: positions below them were trained, but for the one each
        rank took for its next epoch and holds (``next``), which it trains first on resume."""
        return {
            "pool": self.pool.state(),
            "next": self._next,
            "empty": self._empty,
            "taken": self.taken,
            "pos": self.position,
        }

    def load_state(self, state: dict) -> None:
        """Every rank restores its own part, and the pool the (fresh) store's counters (one
        pool: rank 0 alone); the loop's barrier after loading keeps anybody from taking before
        that. A checkpoint written before the pool kept a state of its own holds ``counter``."""
        self._next, self._empty, self.taken = state["next"], state["empty"], state["taken"]
        self.position = state["pos"]
        lead = not dist.is_initialized() or dist.get_rank() == 0
        self.pool.load_state(state.get("pool") or {"counter": state["counter"]}, lead)


class SampledSource(BaseSource):
    """This rank's neighbour-sampled mini-batches: one loader pass for the whole run (so the
    workers keep prefetching across epochs), ``steps`` batches per epoch."""

    def __init__(self, cfg: Config, ds, ctx: DistContext, train_idx: torch.Tensor) -> None:
        s, r = cfg.strategy, cfg.run
        self.device = ctx.device
        t0 = time.perf_counter()
        path, self.fd = share_graph(ds, ctx)
        batch = batch_bytes(ds, s)
        cache, self.cache_fd, self.cache_bytes, self.direct = share_feature_cache(
            ds, ctx, s.feature_cache, STEP_BATCHES * batch, s.fanouts, s.batch_size
        )
        self.on_disk = bool(ds.info.get("prepared"))
        self.feature_io: dict[int, list[int]] = {}  # epoch: [rows gathered, cache hits, bytes read]
        self.graph_path, self.cache_path = path, cache
        # kept past close() for a sampled final evaluation (rank 0), until release()
        self.keep_graph = False
        self.setup_s = time.perf_counter() - t0
        self.per_rank, steps = shard_plan(train_idx.numel(), ctx.world_size, s.batch_size)
        self.steps = min(steps, r.max_steps or steps)
        batches = SampledBatches(
            path, train_idx, s.fanouts, s.batch_size, ctx.rank, ctx.world_size, r.seed, self.steps,
            cache_path=cache, direct=self.direct,
        )  # fmt: skip
        workers = s.loader_workers
        if self.on_disk and workers:
            workers, why = loader_workers_that_fit(workers, batch)
            if why and ctx.is_main:
                print(f"gnnpar: {why}", file=sys.stderr, flush=True)
        in_memory = self.on_disk and self.cache_bytes >= features_bytes(ds.info["prepared"])
        allowed = batch_ahead_allowed()
        self.ahead = made_ahead(self.on_disk, workers, in_memory, batch) if allowed else None
        batches.gather_later = self.ahead == "sampling"
        if self.on_disk and workers == 0 and allowed and self.ahead is None and ctx.is_main:
            from gnnpar.runtime.resources import size_words

            print(
                f"gnnpar: the next batch (up to {size_words(batch)} of features) is not made "
                "on a thread while the model trains: the memory the run may use holds only the "
                "step's own",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        self.batches, self.epochs, self.workers = batches, r.epochs, workers
        # what share_graph wrote, so what every batch is rows of (a prepared graph's rows are
        # read from its folder: not marked, so its features are never widened in memory)
        self.features = None if ds.info.get("prepared") else ds.data.x
        self.timeout_s = s.timeout_s
        self.rank, self.folder = ctx.rank, ds.info.get("prepared")
        self.loader = build_loader(batches, r.epochs, workers, s.timeout_s)
        self.total_steps, self.position = r.epochs * self.steps, 0
        self._it: Iterator | None = None
        self._gather: GatherAfterRelease | None = None
        self.start_s = 0.0

    def start(self) -> None:
        """Start the workers (set-up, not training). Creating the iterator draws a seed from
        torch's global generator, so it comes after the model's initialisation. From a prepared
        folder without workers, a thread makes the next batch while the model trains on this
        one (its reads overlap the step: :class:`~gnnpar.data.sampling.loader.Ahead`), where
        the memory the run may use holds that batch too (:func:`batch_ahead_fits`); where every
        feature row is in memory, its rows once this one's are freed (:func:`made_ahead`)."""
        t0 = time.perf_counter()
        self._stop_ahead()
        self._it = iter(self.loader)
        if self.ahead == "sampling":
            self._gather = GatherAfterRelease(self._it, self.batches)
            self._it = self._ahead(self._gather)
        elif self.ahead:
            self._it = self._ahead(self._it)
        self.start_s = time.perf_counter() - t0

    def _stop_ahead(self) -> None:
        if isinstance(self._it, Ahead):
            if self._gather is not None:  # a thread waiting for a batch still held: go on
                self._gather.release()
            self._it.close()

    def _ahead(self, it: Iterator) -> Ahead:
        return Ahead(it)

    def _next_batch(self):  # noqa: ANN202 (a SampledBatch)
        try:
            return next(self._it)
        except RuntimeError as e:
            if "timed out" not in str(e) or not self.on_disk:
                raise
            raise RuntimeError(
                f"rank {self.rank} waited --timeout {self.timeout_s:g} s for batch "
                f"{self.position} from its {self.workers} loader worker(s), which sample it and "
                f"read its feature rows from {self.folder}: the disk is slower than that allows "
                "(raise --timeout, or train with --loader-workers 0)"
            ) from None

    def epoch(self, epoch: int) -> Iterator:
        done = self.position - epoch * self.steps  # > 0 when resumed midway
        for _ in range(done, self.steps):
            # made in a call of its own: this generator's frame keeps no reference to a batch
            # while the next one is made (a batch's features: ~480 MB on synthetic-reddit)
            yield self._take(epoch)

    def _take(self, epoch: int):  # noqa: ANN202 (a Data)
        batch = self._next_batch()
        self.position += 1
        if self.on_disk:
            io = self.feature_io.setdefault(epoch, [0, 0, 0, 0])
            io[0] += batch.n_id.numel()
            io[1] += batch.cache_hits
            io[2] += batch.bytes_read
            io[3] += 1
        return self.mark(batch.to_data()).to(self.device)

    def mark(self, data):
        """``data`` with its features marked as the rows ``n_id`` of the graph's (what the
        loader gathered, in this process or a worker): a model that keeps a CSR plan of
        mostly-zero features gathers the batch's from the whole graph's (gnnpar.csr.mark_rows)."""
        if self.features is not None:
            mark_rows(data.x, self.features, data.n_id)
        return data

    def state(self) -> dict:
        return {"pos": self.position}

    def load_state(self, state: dict) -> None:
        """Start the loader at the checkpoint's batch: batch i of the run is made from
        (seed, epoch, rank, step) alone, so it is the batch the uninterrupted run trains."""
        self.position = state["pos"]
        self._stop_ahead()
        self._it = None
        self.loader = build_loader(
            self.batches, self.epochs, self.workers, self.timeout_s, start=self.position
        )
        with torch.random.fork_rng(devices=[]):  # the run drew its loader seed long ago
            self.start()

    def epoch_info(self, epoch: int) -> dict:
        """metrics.jsonl's epoch record: this rank's feature reads in the epoch (from a
        prepared folder; see :func:`feature_cache_info`)."""
        if not self.on_disk:
            return {}
        io = feature_cache_info(self.cache_bytes, {epoch: self.feature_io.get(epoch, [0] * 4)})
        return {"feature_cache": {k: v for k, v in io.items() if k != "per_epoch"}}

    def rank_info(self) -> dict:
        info: dict = {"loader_start_time_s": self.start_s}
        if self.on_disk:
            info["feature_cache"] = feature_cache_info(self.cache_bytes, self.feature_io)
        return info

    def close(self) -> None:
        """Stop the workers; drop the shared graph (already unlinked: freed with the last map),
        unless it is kept for a sampled final evaluation (:meth:`eval_batches`, then
        :meth:`release`)."""
        self._stop_ahead()
        self._it = self.loader = None
        if not self.keep_graph:
            self.release()

    def eval_batches(self, ids: torch.Tensor, fanouts: list[int], batch_size: int, seed: int):
        """Evaluation batches of the nodes ``ids`` over the graph (and feature cache) training
        sampled from (:class:`~gnnpar.data.sampling.loader.EvalBatches`)."""
        from gnnpar.data.sampling.loader import EvalBatches

        return EvalBatches(
            self.graph_path, ids, fanouts, batch_size, seed, self.cache_path, self.direct
        )

    def release(self) -> None:
        """Close this process's hold on the shared graph and feature cache."""
        for name in ("fd", "cache_fd"):
            if getattr(self, name) is not None:
                os.close(getattr(self, name))
                setattr(self, name, None)


class ShardSampledSource(SampledSource):
    """:class:`SampledSource` across shards (gnnpar.data.sampling.distributed): each host maps
    only its shard; the batches are sampled with the owners of the frontier's nodes and their
    features fetched from them, in this rank's own process (the exchanges are collectives: no
    loader workers). The same batches as one host over the unsharded graph.

    Batch i+1 (its sampling and feature exchanges) is made on a thread while the model trains
    on batch i (:class:`~gnnpar.data.sampling.loader.Ahead`), where the memory the run may use
    holds it (:func:`batch_ahead_fits`). The exchanges run on a gloo process group of their
    own, made here by every rank, so the thread's collectives never interleave with the main
    thread's on the default group (the gradient all-reduce, a checkpoint's barrier); every rank
    makes the same batches in the same order, so each enters the same exchanges. The thread is
    idle while a checkpoint is written (:meth:`pause`) and stopped, its batch in the making
    finished, before the final evaluation (which uses the same exchange) and on resume."""

    def __init__(self, cfg: Config, ds, ctx: DistContext) -> None:
        import sys

        from gnnpar.data.sampling import distributed as shard
        from gnnpar.runtime.resources import available_memory, size_words

        s, r = cfg.strategy, cfg.run
        self.device = ctx.device
        t0 = time.perf_counter()
        self.fd = self.cache_fd = None
        # features come from the owners (exchanges), not a folder's reads: no feature_cache entry
        self.on_disk, self.feature_io, self.cache_bytes = False, {}, 0
        graph = shard.ShardGraph.open(ds.info["source"], ds.info["host"])
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=s.timeout_s))
        self.exchange = shard.Exchange(graph.bounds, ds.info["host"], group)
        sampler = shard.ShardSampler(graph, self.exchange, s.fanouts)
        train_idx, train_y = shard.gather_train(graph)
        # inside a memory limit (a cgroup's, or GNNPAR_MEMORY_LIMIT) the feature exchange runs
        # in rounds whose buffers take a sixteenth of it, and the remote rows held a quarter
        mem = available_memory()
        free = mem.free if mem is not None and mem.limit is not None else None
        row = 4 * graph.x.size(1)  # a feature row as exchanged and held: float32
        sampler.block_rows = shard.exchange_block_rows(row, free)
        self.cached_rows = 0
        if s.feature_cache is not None:  # remote hot rows: bytes, or a share of all features
            from gnnpar.data.prepared import parse_cache_size

            size, fraction = parse_cache_size(s.feature_cache)
            budget = size if size is not None else int(fraction * graph.num_nodes * row)
            if free is not None and budget > free // 4:
                if ctx.is_main:
                    print(
                        f"gnnpar: --feature-cache {s.feature_cache} ({size_words(budget)} of "
                        f"remote rows) is more than a quarter of {mem.words()}: "
                        f"{size_words(free // 4)} held",
                        file=sys.stderr,
                    )
                budget = free // 4
            self.cached_rows = sampler.cache_hot_rows(budget // row, train_idx, s.batch_size)
        self.exchange.bytes_sent = self.exchange.bytes_needed = 0  # the steps' alone
        self.exchange.wait_s, self.exchange.calls = {}, {}
        self.setup_s = time.perf_counter() - t0
        if train_idx.numel() < ctx.world_size:
            from gnnpar.errors import UsageError

            raise UsageError(
                f"Dataset '{ds.name}' has {train_idx.numel()} training nodes, fewer than the "
                f"{ctx.world_size} ranks: every rank needs at least one. Use fewer ranks."
            )
        self.per_rank, steps = shard_plan(train_idx.numel(), ctx.world_size, s.batch_size)
        self.steps = min(steps, r.max_steps or steps)
        self.batches = shard.ShardBatches(
            sampler, train_idx, train_y, s.batch_size, ctx.rank, ctx.world_size, r.seed,
            self.steps, s.seeds,
        )  # fmt: skip
        self.epochs, self.workers = r.epochs, 0
        batch = batch_bytes(ds, s)
        self.ahead = batch_ahead_allowed() and batch_ahead_fits(batch)
        if not self.ahead and batch_ahead_allowed() and ctx.is_main:
            print(
                f"gnnpar: the next batch (up to {size_words(batch)} of features) is not made "
                "on a thread while the model trains: the memory the run may use holds only "
                "the step's own",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        self.features = None
        self.timeout_s = s.timeout_s
        self.loader = build_loader(self.batches, r.epochs, 0, s.timeout_s)
        self.total_steps, self.position = r.epochs * self.steps, 0
        self._it = None
        self._gather = None
        self.start_s = 0.0
        self.sampled_steps = 0
        self.train_bytes: tuple[int, int] | None = None
        self.train_waits: tuple[dict, dict] | None = None

    def _ahead(self, it: Iterator) -> Ahead:
        return Ahead(it, collective=True)

    def pause(self) -> None:
        """Before a checkpoint: the batch in the making is finished (kept), and no exchange
        runs until the loop asks for it."""
        if isinstance(self._it, Ahead):
            self._it.settle()

    def epoch(self, epoch: int) -> Iterator:
        for data in super().epoch(epoch):
            self.sampled_steps += 1
            yield data

    def rank_info(self) -> dict:
        """Remote feature rows held (``--feature-cache``). Bytes per training step this rank sent to other ranks (requests, answers, split
        sizes), the time its collectives took per step (by kind), and the least it needed (the ids it asked other hosts for, the sampled sources
        and float32 feature rows they answered), averaged over the steps trained (taken when
        the training ends, so the final evaluation's exchanges are not in it)."""
        steps = max(1, self.sampled_steps)
        sent, needed = self.train_bytes if self.train_bytes else self._bytes()
        waits, calls = self.train_waits or (self.exchange.wait_s, self.exchange.calls)
        return {
            **super().rank_info(),
            "exchange_ahead": self.ahead,
            "batch_make_s_per_step": self.batches.make_s / steps,
            "exchange_bytes_per_step": sent / steps,
            "exchange_needed_bytes_per_step": needed / steps,
            "remote_rows_cached": self.cached_rows,
            # per kind of collective of the steps: seconds per step in it, and how many a step
            "exchange_wait_s_per_step": {k: v / steps for k, v in waits.items()},
            "exchange_collectives_per_step": {k: v / steps for k, v in calls.items()},
        }

    def _bytes(self) -> tuple[int, int]:
        return self.exchange.bytes_sent, self.exchange.bytes_needed

    def close(self) -> None:
        self._stop_ahead()  # the batch in the making finished: its exchanges are counted
        self.train_bytes = self._bytes()
        self.train_waits = (dict(self.exchange.wait_s), dict(self.exchange.calls))
        super().close()


# a loader worker's interpreter and its fork server's: 148 MB of private memory each once torch
# is imported (measured, torch 2.13 CPU)
WORKER_BYTES = 300 << 20
PREFETCH = 2  # batches each worker holds made ahead (build_loader's prefetch_factor)


def batch_bytes(ds, s) -> int:
    """The most bytes of float32 feature rows one batch of ``s`` (a strategy's settings: batch
    size, fan-outs) gathers (:func:`gnnpar.data.cache_writer.batch_feature_bytes`)."""
    return batch_feature_bytes(ds.num_nodes, ds.num_features, s.batch_size, s.fanouts)


# set to 0: no batch is made on a thread while the model trains (to measure what it brings)
BATCH_AHEAD_ENV = "GNNPAR_BATCH_AHEAD"


def batch_ahead_allowed() -> bool:
    """Whether batches may be made ahead on a thread at all (:data:`BATCH_AHEAD_ENV` not 0)."""
    return os.environ.get(BATCH_AHEAD_ENV, "1").strip() != "0"


def features_bytes(folder: str) -> int:
    """The bytes of a prepared folder's feature array (in its stored dtype)."""
    from gnnpar.data.prepared import open_prepared

    return int(open_prepared(folder).array("features").nbytes)


def made_ahead(on_disk: bool, workers: int, in_memory: bool, batch: int) -> str | None:
    """What the training process makes on a thread while the model trains on the batch before
    (:class:`~gnnpar.data.sampling.loader.Ahead`), for a prepared graph's batches made without
    loader workers: ``"batch"`` (sampled and its feature rows gathered while the step runs: the
    rows' reads from the folder overlap it), ``"sampling"`` (sampled while the step runs, its
    rows gathered once the step has let go of its own batch's, before its backward:
    :class:`~gnnpar.data.sampling.loader.GatherAfterRelease`), or None (nothing: made in line).

    Where the feature cache holds every row (``in_memory``), gathering is a copy from memory,
    and a batch made whole ahead holds a second batch of features beside the step's
    (synthetic-reddit at scale 1, fan-outs 15-10-5, batch 1024: ~0.46 GB, BENCHMARKS.md
    "Memory per node and per edge"), so its rows wait for the step's to be freed. Otherwise the whole batch, where the memory the run may use holds it
    (:func:`batch_ahead_fits`); else nothing. In-memory graphs (not prepared) and loader
    workers: None. The batches are the same in every case."""
    if not on_disk or workers:
        return None
    if in_memory:
        return "sampling"
    return "batch" if batch_ahead_fits(batch) else None


def batch_ahead_fits(batch: int) -> bool:
    """Whether the training process may make the next batch on a thread while the model trains
    on this one (:class:`~gnnpar.data.sampling.loader.Ahead`): inside a memory cgroup only where
    what it leaves free (the feature cache already written) holds the step and one batch more;
    a batch made ahead that does not fit gets the run killed, where made in line it only waits.
    Without a cgroup, always. The batches are the same either way (batch i is made from (seed,
    epoch, rank, step) alone)."""
    from gnnpar.runtime.footprint import memory_budget

    budget = memory_budget(torch.device("cpu"))
    if budget is None or budget.limit is None:
        return True
    return (STEP_BATCHES + 1) * batch <= budget.free


def loader_workers_that_fit(workers: int, batch: int) -> tuple[int, str | None]:
    """How many of ``workers`` loader workers fit inside a memory cgroup's limit, and a line
    that says why when fewer: each needs :data:`WORKER_BYTES` and :data:`PREFETCH` batches of
    ``batch`` bytes, and together they may take half of what the cgroup leaves free (the feature
    cache already written); the other half is the training process's and the page cache's (the
    graph's CSR, read at every hop). Without a cgroup, ``workers`` as asked."""
    from gnnpar.runtime.footprint import memory_budget
    from gnnpar.runtime.resources import size_words

    budget = memory_budget(torch.device("cpu"))
    if budget is None or budget.limit is None:
        return workers, None
    each = WORKER_BYTES + PREFETCH * batch
    fit = min(workers, budget.free // 2 // each)
    if fit == workers:
        return workers, None
    return fit, (
        f"--loader-workers {workers} does not fit in {budget.words()}: a worker needs about "
        f"{size_words(each)} (an interpreter, {PREFETCH} batches made ahead), so "
        + (f"{fit} worker(s) make the batches" if fit else "the training process makes the "
           "batches")
    )  # fmt: skip


def feature_cache_info(cache_bytes: int, io: dict[int, list[int]]) -> dict:
    """result.json's ``feature_cache`` of one rank from its per-epoch counts ``{epoch: [rows
    gathered, rows the cache served, bytes read from the folder, steps]}``: the cache's size,
    the whole run's hit rate (rows served by the cache / rows gathered; 0 without a cache),
    bytes read per step, and the same per epoch."""

    def summary(rows: int, hits: int, read: int, steps: int) -> dict:
        return {
            "rows_gathered": rows,
            "cache_hits": hits,
            "hit_rate": hits / rows if rows else 0.0,
            "bytes_read": read,
            "bytes_read_per_step": read / steps if steps else 0.0,
            "steps": steps,
        }

    total = [sum(v[i] for v in io.values()) for i in range(4)]
    per_epoch = [{"epoch": e, **summary(*io[e])} for e in sorted(io)]
    return {"bytes": cache_bytes, **summary(*total), "per_epoch": per_epoch}


def share_feature_cache(
    ds,
    ctx: DistContext,
    setting: str | None,
    reserve: int = 0,
    fanouts: list[int] | None = None,
    batch_size: int | None = None,
) -> tuple[str | None, int | None, int, bool]:
    """A prepared graph's hottest feature rows (those a batch of ``batch_size`` seeds sampled
    at ``fanouts`` visits most, gnnpar.data.visits; the highest degrees without them), written
    once per machine by local rank 0 to shared memory (unlinked at once, reached through
    ``/proc/<pid>/fd``, as :func:`share_graph` does) and mapped by every local rank and loader
    worker. Its size: ``--feature-cache``, or a share of the memory the run may use that leaves
    ``reserve`` bytes to the training step (gnnpar.data.prepared.cache_rows). Whether the rows
    outside it are read around the page cache (``direct``): when the feature file is larger
    than what the memory the run may use leaves beside the cache (it could not stay in the page
    cache anyway, and inside a memory cgroup every page read through it must first be reclaimed).
    (path or None, the fd to close on local rank 0 or None, the cache's bytes of features,
    direct)."""
    if not ds.info.get("prepared"):
        return None, None, 0, False
    path, fd, size, direct = None, None, 0, False
    early = cache_writer.take(ds.info["prepared"], setting) if ctx.local_rank == 0 else None
    if early is not None:  # started by gnnpar train before it imported torch
        path, fd, size, direct = early.wait()
    elif ctx.local_rank == 0:
        from gnnpar.data.prepared import open_prepared, write_feature_cache
        from gnnpar.runtime.footprint import available_bytes

        p = open_prepared(ds.info["prepared"])
        k, size, direct = cache_writer.plan(
            p, setting, available_bytes(torch.device("cpu")), reserve
        )
        if k > 0:
            name = shm_file("features")
            write_feature_cache(p, k, name, direct, fanouts, batch_size)
            fd = os.open(name, os.O_RDONLY)
            os.unlink(name)
            path = f"/proc/{os.getpid()}/fd/{fd}"
    shared = collectives.gather_to_all((path, size, direct))
    path, size, direct = shared[ctx.rank - ctx.local_rank]
    return path, fd, size, direct


def share_graph(ds, ctx: DistContext) -> tuple[str, int | None]:
    """Local rank 0 writes CSR + features + labels once per machine; every rank gets a path
    (a prepared graph's folder is that path already: nothing is written).

    The file is unlinked as soon as it is written and reached through ``/proc/<pid>/fd/<fd>`` of
    local rank 0 (which keeps it open until the end of the run), so nothing is left behind in
    ``/dev/shm`` however the run ends, SIGKILL included: the memory is freed when the last
    process unmaps it. Returns (path, the fd to close on local rank 0 or None).
    """
    if ds.info.get("prepared"):  # a prepared folder: every process maps its arrays in place
        return ds.info["prepared"], None
    path, fd = None, None
    if ctx.local_rank == 0:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        name = os.path.join(folder, f"gnnpar-sampled-{os.getpid()}-{uuid.uuid4().hex[:8]}.pt")
        d = ds.data
        save_shared_graph(name, CSRGraph.from_edge_index(d.edge_index, ds.num_nodes), d.x, d.y)
        fd = os.open(name, os.O_RDONLY)
        os.unlink(name)
        path = f"/proc/{os.getpid()}/fd/{fd}"
    paths = collectives.gather_to_all(path)
    return paths[ctx.rank - ctx.local_rank], fd  # torchrun numbers a machine's ranks in a row
