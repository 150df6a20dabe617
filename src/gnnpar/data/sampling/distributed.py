"""Neighbour sampling across shards: each host maps only its shard of a sharded prepared folder
(:mod:`gnnpar.data.shards`), samples its own nodes' neighbours for every rank, and serves its
nodes' feature rows.

Ids are the sharded folder's (renumbered: shard h owns the contiguous range
``[bounds[h], bounds[h+1])``); the random stream of a node's neighbour draw is keyed by (the
hop's seed, the node's *original* id) in the compiled kernel, so a node's owner draws for it
exactly what one process over the unsharded graph draws. Per hop of a batch:

1. the requester splits the frontier by owner (stable: each owner's nodes stay in frontier
   order) and sends each owner its nodes plus the hop's seed (drawn from the requester's batch
   generator, as :meth:`NeighborSampler._kernel_sample` draws it);
2. each owner draws them with the kernel (``gnnpar_draw_hop``: rows of its shard's CSR, keys from
   its ``orig_ids.npy``) and answers, per node, the count and the sampled sources (global ids);
3. the requester puts the answers back in frontier order and relabels them with its node-mark
   array (``gnnpar_relabel``), as the kernel's second pass does over one graph.

So the batch (``n_id`` in sharded ids, edges in local ids) is the unsharded batch with its ids
renumbered, and an L-layer model sees the same tensors. Then the batch's feature rows come the
same way from their owners (one request and one answer per step); the seeds' labels are local:
every rank holds the (small) list of training nodes and their labels, gathered once.

Every exchange is an ``all_to_all_single`` over the whole group (gloo on CPU), preceded by an
exchange of the split sizes (one int64 per peer), but the feature rows' answer, whose sizes the
asker knows (how many rows it asked each owner for): 4 collectives per hop, 3 for the
features; every rank takes part in every exchange, even
with nothing to ask, and every rank runs the same number of steps (the sampled strategy's
equal-steps plan), so no rank waits on a collective another never enters. A training run
gives the exchange a gloo group of its own (``Exchange(..., group)``), so that the next batch
can be made on a thread while the model trains without its collectives interleaving with the
gradient all-reduce of the default group. The collectives run
under the process group's timeout (``--timeout``); a rank that stops answering is named by the
run's heartbeat watch (gnnpar.runtime.dist.peer_failure). Where a host runs several ranks, each
answers for its host's shard: requester r asks, on every host, the rank of the same place among
that host's ranks (itself on its own host), so the work of answering is spread.

``bytes_sent``: the payload this rank sent to other ranks (requests, answers, split sizes; what
it sends itself is not counted), for result.json's ``exchange_bytes_per_step``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gnnpar.data.sampling import kernel
from gnnpar.data.sampling.sampler import SampledBatch, _ranges
from gnnpar.errors import UsageError


@dataclass
class ShardGraph:
    """This host's shard, memory-mapped: its in-edge CSR (rows: its nodes ``first .. end-1``;
    sources: global ids), original ids, features and labels, and every shard's range."""

    rowptr: torch.Tensor  # int64 [n_h + 1]
    col: torch.Tensor  # int32 / int64 [E_h], global ids
    orig_ids: torch.Tensor  # int64 [n_h]
    x: torch.Tensor  # [n_h, F] as stored (float32, float16 or bfloat16)
    y: torch.Tensor  # [n_h] or [n_h, C]
    train: torch.Tensor  # int64, global ids of the shard's training nodes, ascending
    splits: dict  # "train", "val", "test": global ids of the shard's nodes in each, ascending
    first: int
    end: int
    bounds: torch.Tensor  # int64 [H + 1]: shard h owns [bounds[h], bounds[h+1])
    directed: bool = False  # the graph's (an undirected one's CSR holds both ways of an edge)

    def split(self, name: str) -> torch.Tensor:
        return self.splits[name]

    @property
    def num_nodes(self) -> int:  # of the whole graph
        return int(self.bounds[-1])

    @classmethod
    def open(cls, folder: str | Path, host: int) -> ShardGraph:
        from gnnpar.data import prepared, shards

        top = Path(folder).expanduser().absolute()
        m = prepared.read_manifest(top)
        recs = shards.check_top(top, m)
        s = shards.Shard(top, recs[host], host)

        def t(name: str) -> torch.Tensor:
            return prepared.mapped_tensor(np.asarray(s.array(name)))

        x = t("features")
        if m["feature_dtype"] == "bf16":
            x = x.view(torch.bfloat16)
        bounds = torch.tensor([r["nodes"][0] for r in recs] + [int(m["num_nodes"])])
        splits = {name: t(name) for name in ("train", "val", "test")}
        return cls(
            t("indptr"), t("indices"), t("orig_ids"), x, t("labels"), splits["train"], splits,
            s.first, s.end, bounds, bool(m.get("directed", False)),
        )  # fmt: skip


class Exchange:
    """Who answers for which node, and the all_to_all with split sizes every request uses."""

    def __init__(self, bounds: torch.Tensor, host: int, group=None) -> None:  # noqa: ANN001
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        every = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
        dist.all_gather(every, torch.tensor([host], dtype=torch.long), group=group)
        hosts = torch.cat(every)
        n_hosts = bounds.numel() - 1
        ranks_of = [[r for r in range(self.world) if int(hosts[r]) == h] for h in range(n_hosts)]
        lacking = [h for h in range(n_hosts) if not ranks_of[h]]
        if lacking:
            raise UsageError(
                f"no rank runs on host {lacking[0]}: a graph of {n_hosts} shards trains across "
                f"shards on {n_hosts} hosts, host h (its node rank) holding shard-<h>/."
            )
        place = self.place = ranks_of[host].index(self.rank)
        self.answerer = torch.tensor([r[place % len(r)] for r in ranks_of], dtype=torch.long)
        self.bounds = bounds
        self.bytes_sent = 0
        # the least this rank's steps could have moved: the ids it asked other hosts for, the
        # sampled sources and feature rows they answered (and it answered them)
        self.bytes_needed = 0
        self.host_of_rank = hosts
        self.host = host
        # seconds spent in each kind of collective (the rank's share of the exchange: waiting
        # for the peers to enter it, and the transfer), and how many ran
        self.wait_s: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def owner_rank(self, ids: torch.Tensor) -> torch.Tensor:
        host = torch.searchsorted(self.bounds[1:], ids, right=True)
        return self.answerer[host]

    def all_to_all(
        self, send: torch.Tensor, counts: torch.Tensor, what: str = "other"
    ) -> tuple[torch.Tensor, list]:
        """``send`` (rows grouped by destination rank, ``counts[r]`` rows for rank r) to every
        rank; (the rows received, grouped by source rank; how many from each). Two
        collectives: the split sizes, then the rows. ``what``: the :attr:`wait_s` entry their
        time goes to."""
        t0 = time.perf_counter()
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        self.bytes_sent += 8 * (self.world - 1)
        self._took(what + ":sizes", t0)
        rc = recv_counts.tolist()
        return self.all_to_all_known(send, counts.tolist(), rc, what), rc

    def all_to_all_known(self, send: torch.Tensor, sc: list, rc: list, what: str) -> torch.Tensor:
        """:meth:`all_to_all` where this rank knows how many rows each rank sends it (``rc``;
        ``sc``: how many it sends each): one collective, no split sizes exchanged."""
        t0 = time.perf_counter()
        out = torch.empty((sum(rc), *send.shape[1:]), dtype=send.dtype)
        dist.all_to_all_single(out, send, rc, sc, group=self.group)
        row = send[0].numel() * send.element_size() if send.numel() else 0
        self.bytes_sent += (sum(sc) - sc[self.rank]) * row
        self._took(what, t0)
        return out

    def _took(self, what: str, t0: float) -> None:
        """Add the time since ``t0`` to ``wait_s[what]`` and count the collective."""
        self.wait_s[what] = self.wait_s.get(what, 0.0) + time.perf_counter() - t0
        self.calls[what] = self.calls.get(what, 0) + 1

    def ask(
        self, ids: torch.Tensor, extra: torch.Tensor | None = None, what: str = "ask"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
        """Send every id to its owner's answering rank (stably: each owner's ids in their
        order here). ``extra``: one int64 per destination rank, sent with its ids (the hop's
        seed). (order of ids as sent, counts per destination, the ids received grouped by
        source, how many from each). The extra values received come first in each group."""
        dest = self.owner_rank(ids)
        order = torch.argsort(dest, stable=True)
        counts = torch.bincount(dest, minlength=self.world)
        send = ids[order]
        if extra is not None:  # [extra_r, ids for r...] per destination r
            begin = torch.cumsum(counts, 0) - counts
            at = begin + torch.arange(self.world)  # where extra_r goes in the message
            msg = torch.empty(send.numel() + self.world, dtype=torch.long)
            keep = torch.ones(msg.numel(), dtype=torch.bool)
            keep[at] = False
            msg[at] = extra
            msg[keep] = send
            got, rc = self.all_to_all(msg, counts + 1, what)
            return order, counts, got, rc
        got, rc = self.all_to_all(send, counts, what)
        return order, counts, got, rc


class ShardSampler:
    """The sampled mini-batches of one rank over the shards of every host (see the module
    docstring): :meth:`sample` gives the :class:`SampledBatch` one process would sample over
    the unsharded graph with the same generator, its ids the sharded folder's."""

    def __init__(
        self, graph: ShardGraph, ex: Exchange, fanouts: list[int], replace: bool = False
    ) -> None:
        lib = kernel.load()
        if lib is None:
            raise UsageError(
                f"training across shards needs the compiled sampler kernel ({kernel.where()}): "
                f"{kernel.HINT}"
            )
        self.lib, self.g, self.ex = lib, graph, ex
        self.fanouts, self.replace = list(fanouts), replace
        self.rowptr = graph.rowptr.long().contiguous()
        self.col = graph.col.contiguous()
        if self.col.dtype not in (torch.int32, torch.int64):
            self.col = self.col.long()
        self.col32 = int(self.col.dtype == torch.int32)
        self.keys = graph.orig_ids.long().contiguous()
        self.table = torch.empty(lib.gnnpar_table_size(max(max(fanouts, default=1), 1)))
        self.table = self.table.long()
        # the node-mark array over the whole graph's ids (int64 per node, as one host's)
        self.local = torch.full((graph.num_nodes,), -1, dtype=torch.long)
        # feature rows per peer in one exchange round (None: one round); set by the run from
        # the memory it may use, the same on every rank (:func:`exchange_block_rows`)
        self.block_rows: int | None = None

    def _answer(self, got: torch.Tensor, rc: list, fanout: int) -> tuple[torch.Tensor, list]:
        """The owner's half: for each source rank's [seed, ids...], the counts and sampled
        sources of its ids; (the answers, grouped by source rank, and their sizes)."""
        parts, sizes, at = [], [], 0
        for c in rc:
            seed, ids = int(got[at]), got[at + 1 : at + c]
            at += c
            n = ids.numel()
            rows = (ids - self.g.first).contiguous()
            keys = self.keys[rows].contiguous()
            if n == 0:
                parts.append(torch.empty(0, dtype=torch.long))
                sizes.append(0)
                continue
            deg = self.rowptr[rows + 1] - self.rowptr[rows]
            cap = int(deg.sum()) if fanout < 0 else n * fanout
            tgt = torch.empty(cap, dtype=torch.long)
            nbr = torch.empty(cap, dtype=torch.long)
            e = self.lib.gnnpar_draw_hop(
                self.rowptr.data_ptr(), self.col.data_ptr(), self.col32, rows.data_ptr(),
                keys.data_ptr(), n, fanout, int(self.replace), seed,
                tgt.data_ptr(), nbr.data_ptr(), self.table.data_ptr(),
            )  # fmt: skip
            counts = torch.bincount(tgt[:e], minlength=n)
            parts.append(torch.cat([counts, nbr[:e]]))
            sizes.append(n + e)
        return torch.cat(parts), sizes

    def _hop(self, frontier: torch.Tensor, fanout: int, seed: int) -> torch.Tensor:
        """The sampled sources of ``frontier``'s nodes, node after node in frontier order
        (global ids), and the count of each node's."""
        ex = self.ex
        seeds = torch.full((ex.world,), seed, dtype=torch.long)
        order, counts, got, rc = ex.ask(frontier, seeds, "hop ask")
        answers, sizes = self._answer(got, rc, fanout)
        back, _ = ex.all_to_all(answers, torch.tensor(sizes, dtype=torch.long), "hop answer")
        # back: per destination rank r (in rank order), [counts of its ids, their sources]
        n_per = counts.tolist()
        cnt_parts, nbr_parts, at = [], [], 0
        for r in range(ex.world):
            k = n_per[r]
            c = back[at : at + k]
            e = int(c.sum()) if k else 0
            cnt_parts.append(c)
            nbr_parts.append(back[at + k : at + k + e])
            at += k + e
        remote = [r for r in range(ex.world) if int(ex.host_of_rank[r]) != ex.host]
        ex.bytes_needed += 8 * sum(n_per[r] for r in remote)  # the ids asked for
        ex.bytes_needed += 8 * sum(int(nbr_parts[r].numel()) for r in remote)  # their sources
        cnt_sent = torch.cat(cnt_parts)  # in the order sent (frontier[order])
        nbr_sent = torch.cat(nbr_parts)
        cnt = torch.empty_like(cnt_sent)
        cnt[order] = cnt_sent
        start_sent = torch.cumsum(cnt_sent, 0) - cnt_sent
        pos_of = torch.empty_like(order)
        pos_of[order] = torch.arange(order.numel())
        nbr = nbr_sent[_ranges(start_sent[pos_of], cnt)]
        return nbr, cnt

    def sample(self, seeds: torch.Tensor, gen: torch.Generator) -> SampledBatch:
        local = self.local
        k = seeds.numel()
        n_ids = [seeds.long()]
        local[seeds] = torch.arange(k)
        total, frontier = k, seeds.long()
        rows, cols = [], []
        num_nodes, num_edges = [k], []
        try:
            for fanout in self.fanouts:
                seed = int(torch.empty((), dtype=torch.long).random_(generator=gen))
                nbr, cnt = self._hop(frontier.contiguous(), fanout, seed)
                e = nbr.numel()
                row = torch.empty(e, dtype=torch.long)
                new = torch.empty(e, dtype=torch.long)
                nn = self.lib.gnnpar_relabel(
                    nbr.data_ptr(), e, local.data_ptr(), total, row.data_ptr(), new.data_ptr()
                )
                begin = total - frontier.numel()
                col = begin + torch.repeat_interleave(torch.arange(frontier.numel()), cnt)
                rows.append(row)
                cols.append(col)
                frontier = new[:nn].clone()
                n_ids.append(frontier)
                num_nodes.append(nn)
                num_edges.append(e)
                total += nn
        finally:
            n_id = torch.cat(n_ids)
            local[n_id] = -1
        if rows:
            edge_index = torch.stack([torch.cat(rows), torch.cat(cols)])
        else:
            edge_index = torch.empty(2, 0, dtype=torch.long)
        return SampledBatch(n_id, edge_index, k, num_nodes, num_edges)

    def cache_hot_rows(
        self, k: int, seeds: torch.Tensor | None = None, batch_size: int | None = None
    ) -> int:
        """Hold the feature rows of the ``k`` remote nodes that sampling reaches most, fetched
        once from their owners: :meth:`features` then asks the owners only for the others.
        With the training nodes (``seeds``, every one, global ids) and ``batch_size``: the most
        expected visits per batch at this sampler's fan-outs (gnnpar.data.visits, each host
        propagating over its shard's rows, one all-reduce per hop: the same scores as one
        process over the unsharded graph); without: the most frequent sources of the whole
        graph's in-edges, counted by each host over its shard and summed. Ties by id. Every
        rank calls it (an exchange). The rows held."""
        g, ex = self.g, self.ex
        n = g.num_nodes
        first_of_host = ex.place == 0  # one count per host
        remote = int(n - (g.end - g.first))
        k = max(0, min(k, remote))
        if seeds is not None and batch_size and seeds.numel():  # collectives: every rank
            from gnnpar.data.visits import expected_visits, top_rows

            rowptr = self.rowptr.numpy() if first_of_host else self.rowptr.numpy()[:1]
            deg = torch.diff(self.rowptr).max() if self.rowptr.numel() > 1 else torch.tensor(0)
            most = deg.long().view(1)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=ex.group)

            def reduce(part: np.ndarray) -> np.ndarray:
                t = torch.from_numpy(part)
                dist.all_reduce(t, group=ex.group)  # sums of whole units: exact, any order
                return t.numpy()

            score = expected_visits(
                rowptr, self.col.numpy(), seeds.numpy(), self.fanouts, batch_size, n,
                g.first, reduce, int(most), not g.directed,
            )  # fmt: skip
            score[g.first : g.end] = -1  # its own rows are read from its shard
            hot = torch.from_numpy(top_rows(score, k))
            del score
        else:
            hot = self._most_sourced(k, first_of_host)
        rows = self.features(hot)
        self.slot = torch.full((n,), -1, dtype=torch.int32)
        self.slot[hot] = torch.arange(k, dtype=torch.int32)
        self.cached, self.cache_hits = rows, 0
        return k

    def _most_sourced(self, k: int, first_of_host: bool) -> torch.Tensor:
        """The ``k`` remote nodes with the most in-edges' sources over the whole graph (each
        host counts its shard's; summed), ties by id, ascending."""
        g, ex = self.g, self.ex
        n = g.num_nodes
        counts = torch.zeros(n, dtype=torch.long)
        if first_of_host and k > 0:
            step = 1 << 20  # 8 MiB of int64 ids at a time, no bincount of n per chunk
            ones = torch.ones(step, dtype=torch.long)
            for i in range(0, self.col.numel(), step):
                chunk = self.col[i : i + step].long()
                counts.index_add_(0, chunk, ones[: chunk.numel()])
        dist.all_reduce(counts, group=ex.group)
        counts[g.first : g.end] = -1  # its own rows are read from its shard
        # most reached first, ties by id: one key per node (count, then the lower id), so the
        # k largest keys are those nodes whatever topk's order (no sort of n keys and indices)
        counts.mul_(n).add_(n - 1).sub_(torch.arange(n))
        order = torch.topk(counts, k, sorted=False).indices if k else counts[:0]
        return torch.sort(order).values

    def features(self, n_id: torch.Tensor) -> torch.Tensor:
        """``x[n_id]`` as float32, every row from its owner (one request and one answer); the
        rows of :meth:`cache_hot_rows` from the cache instead."""
        if getattr(self, "cached", None) is not None and self.cached.size(0):
            slot = self.slot[n_id]
            hit = slot >= 0
            self.cache_hits += int(hit.sum())
            out = torch.empty((n_id.numel(), self.g.x.size(1)), dtype=torch.float32)
            out[hit] = self.cached[slot[hit].long()]
            out[~hit] = self._fetch(n_id[~hit])
            return out
        return self._fetch(n_id)

    def _fetch(self, n_id: torch.Tensor) -> torch.Tensor:
        """``x[n_id]`` as float32 from the owners: the ids asked in ascending order (each owner
        reads its mapped rows front to back), the rows answered in rounds of at most
        ``block_rows`` per peer (the exchange buffers stay within the memory the run may use;
        every rank runs the same rounds, the most any pair needs), each written in place."""
        ex, width = self.ex, self.g.x.size(1)
        perm = torch.argsort(n_id)
        order, counts, got, rc = ex.ask(n_id[perm], what="features ask")
        pos = perm[order]  # where the k-th id sent sits in n_id
        rows = got - self.g.first
        sc = counts.tolist()
        s_at = [sum(sc[:r]) for r in range(ex.world)]
        r_at = [sum(rc[:r]) for r in range(ex.world)]
        most = max(sc + rc)
        per, rounds = most, 1
        if self.block_rows is not None:  # agreed by every rank (setup): so is the round count
            per = self.block_rows
            n = torch.tensor([-(-most // per)], dtype=torch.long)
            dist.all_reduce(n, op=dist.ReduceOp.MAX, group=ex.group)
            ex.bytes_sent += 8 * (ex.world - 1)
            rounds = int(n)
        out = torch.empty((n_id.numel(), width), dtype=torch.float32)
        for j in range(rounds):
            lo = j * per
            take = [rows[r_at[r] + lo : r_at[r] + min(rc[r], lo + per)] for r in range(ex.world)]
            answer = torch.index_select(self.g.x, 0, torch.cat(take)).float()
            at = [
                torch.arange(s_at[r] + lo, s_at[r] + max(lo, min(sc[r], lo + per)))
                for r in range(ex.world)
            ]
            # this rank asked for them: it knows how many rows each peer answers (no sizes)
            sizes = [t.numel() for t in take]
            back = ex.all_to_all_known(answer, sizes, [a.numel() for a in at], "features answer")
            del answer
            out[pos[torch.cat(at)]] = back
            del back
        remote = self.ex.owner_rank(n_id)
        remote = int((self.ex.host_of_rank[remote] != self.ex.host).sum())
        self.ex.bytes_needed += remote * (8 + 4 * width)  # ids asked, rows answered
        return out


def exchange_block_rows(row_bytes: int, free: int | None, group=None) -> int | None:  # noqa: ANN001
    """Feature rows per peer in one round of :meth:`ShardSampler._fetch`: a round's buffers (the
    rows this rank answers and the rows it receives, a block per peer each) within a sixteenth
    of ``free``, the memory this rank's run may use (None: unbounded), and the least of every
    rank's (an all_reduce: every rank runs the same rounds). None: one round, whatever its
    size (no rank is bounded)."""
    world = dist.get_world_size(group)
    unbounded = 1 << 62
    mine = unbounded if free is None else max(256, free // 16 // (2 * world * row_bytes))
    least = torch.tensor([mine], dtype=torch.long)
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=group)
    return None if int(least) >= unbounded else int(least)


def gather_train(graph: ShardGraph, group=None) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """Every training node of the graph (global ids, in the order of their ORIGINAL ids, as one
    host lists them) and their labels, on every rank: each host contributes its shard's
    (every rank of a host sends the same; one copy per host is kept)."""
    rows = graph.train - graph.first
    orig = graph.orig_ids[rows].long()
    labels = graph.y[rows]
    lab = labels.reshape(labels.size(0), -1).long()
    mine = torch.cat([graph.train.view(-1, 1), orig.view(-1, 1), lab], 1)
    world = dist.get_world_size(group)
    size = torch.tensor([mine.size(0)], dtype=torch.long)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    most = max(int(s) for s in sizes)
    pad = torch.zeros((most, mine.size(1)), dtype=torch.long)
    pad[: mine.size(0)] = mine
    every = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(every, pad, group=group)
    allrows = torch.cat([e[: int(s)] for e, s in zip(every, sizes, strict=True)])
    # one row per training node, in ascending original id (a host's ranks send the same rows):
    # sorted by original id, the first of each run of equal ids (no array over every node)
    srt = torch.sort(allrows[:, 1], stable=True)
    first = torch.ones(srt.values.numel(), dtype=torch.bool)
    first[1:] = srt.values[1:] != srt.values[:-1]
    table = allrows[srt.indices[first]]
    y = table[:, 2:].to(graph.y.dtype)
    y = y.view(-1) if graph.y.dim() == 1 else y
    return table[:, 0].contiguous(), y


def local_epoch_seeds(
    train_idx: torch.Tensor,
    bounds: torch.Tensor,
    host_of_rank: torch.Tensor,
    seed: int,
    epoch: int,
    rank: int,
    batch_size: int,
) -> list[torch.Tensor]:
    """This rank's seed batches for ``epoch`` under ``--seeds local``: its host's own training
    nodes first, as DistDGL's ``node_split(force_even=True)`` deals them.

    Every rank gets the ``per_rank`` nodes and the steps of :func:`~gnnpar.data.sampling.loader.
    shard_plan` (the same on every rank, as with the global deal). Each host's training nodes
    are shuffled (a generator of (seed, epoch, host)) and its ranks keep up to ``ranks x
    per_rank`` of them; what a host has beyond that goes to one pool, shuffled (seed, epoch),
    from which the hosts with fewer nodes than their ranks' share take what they lack, in host
    order. The ``num_train % world_size`` (< world_size) nodes left in the pool are not trained
    that epoch (a different few each epoch, as with the global deal); every other training node
    is the seed of exactly one rank once per epoch. A host's block (its own nodes, then the
    borrowed ones) is shuffled once more so the borrowed nodes spread over its batches, then
    cut among its ranks by their place. ``train_idx``: every training node (global sharded ids,
    the same order on every rank); ``bounds``: the shards' id ranges; ``host_of_rank``: each
    rank's host."""
    from gnnpar.data.sampling.loader import _mix, shard_plan

    world = host_of_rank.numel()
    per_rank, steps = shard_plan(train_idx.numel(), world, batch_size)
    owner = torch.searchsorted(bounds[1:], train_idx, right=True)
    n_hosts = bounds.numel() - 1
    ranks_of = [(host_of_rank == h).nonzero().view(-1).tolist() for h in range(n_hosts)]
    kept, spare = [], []
    for h in range(n_hosts):
        mine = train_idx[owner == h]
        gen = torch.Generator().manual_seed(_mix(seed, epoch, h, _LOCAL))
        mine = mine[torch.randperm(mine.numel(), generator=gen)]
        quota = len(ranks_of[h]) * per_rank
        kept.append(mine[:quota])
        spare.append(mine[quota:])
    pool = torch.cat(spare)
    pool = pool[
        torch.randperm(
            pool.numel(), generator=torch.Generator().manual_seed(_mix(seed, epoch, _LOCAL))
        )
    ]
    host = int(host_of_rank[rank])
    taken = sum(len(ranks_of[h]) * per_rank - kept[h].numel() for h in range(host))
    lack = len(ranks_of[host]) * per_rank - kept[host].numel()
    block = torch.cat([kept[host], pool[taken : taken + lack]])
    gen = torch.Generator().manual_seed(_mix(seed, epoch, host, _LOCAL + 1))
    block = block[torch.randperm(block.numel(), generator=gen)]
    place = ranks_of[host].index(rank)
    mine = block[place * per_rank : (place + 1) * per_rank]
    return [mine[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


# mixed into the local deal's generators, so its shuffles are not the global deal's
_LOCAL = 0x10CA1


class ShardBatches(torch.utils.data.Dataset):
    """Mini-batch ``i`` of a run across shards: epoch ``i // steps``, step ``i % steps`` of this
    rank, the seeds and generator of :class:`gnnpar.data.sampling.loader.SampledBatches` (the
    same batches, ids renumbered). Sampled in the rank's own process (its collectives): no
    loader workers; the training source makes the next one on a thread
    (:class:`gnnpar.training.sources.ShardSampledSource`). ``make_s``: the seconds spent making
    batches (sampling, exchanges, feature rows), wherever they were made."""

    def __init__(
        self,
        sampler: ShardSampler,
        train_idx: torch.Tensor,
        train_y: torch.Tensor,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        steps: int,
        seeds: str = "global",
    ) -> None:
        self.sampler, self.train_idx, self.batch_size = sampler, train_idx, batch_size
        self.local = seeds == "local"
        self.rank, self.world_size, self.seed, self.steps = rank, world_size, seed, steps
        # a seed's label by binary search over the training nodes (not an array over every node)
        by_id = torch.argsort(train_idx)
        self.train_ids, self.train_y = train_idx[by_id], train_y[by_id]
        self._epoch: tuple[int, list[torch.Tensor]] | None = None
        self.make_s = 0.0

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> SampledBatch:
        from gnnpar.data.sampling.loader import step_seeds

        t0 = time.perf_counter()
        if self.local:
            seeds, gen = self._local_seeds(i)
        else:
            seeds, gen = step_seeds(self, i)
        b = self.sampler.sample(seeds, gen)
        b.x = self.sampler.features(b.n_id)
        b.y = self.train_y[torch.searchsorted(self.train_ids, seeds)]
        self.make_s += time.perf_counter() - t0
        return b

    def _local_seeds(self, i: int) -> tuple[torch.Tensor, torch.Generator]:
        """Batch ``i``'s seeds under ``--seeds local`` (:func:`local_epoch_seeds`) and the
        generator of its draws: the global deal's, from (seed, epoch, rank, step)."""
        from gnnpar.data.sampling.loader import _mix

        epoch, step = divmod(int(i), self.steps)
        if self._epoch is None or self._epoch[0] != epoch:
            ex = self.sampler.ex
            seeds = local_epoch_seeds(
                self.train_idx, ex.bounds, ex.host_of_rank, self.seed, epoch, self.rank,
                self.batch_size,
            )  # fmt: skip
            self._epoch = (epoch, seeds)
        return self._epoch[1][step], torch.Generator().manual_seed(
            _mix(self.seed, epoch, self.rank, step)
        )


@torch.no_grad()
def evaluate_across(
    logits: Callable[[SampledBatch], torch.Tensor],
    sampler: ShardSampler,
    batch_size: int,
    multilabel: bool,
) -> dict[str, float | None]:
    """The model's scores on the val and test nodes of every shard, each host scoring its own
    shard's nodes (its ranks a share each: every ``share``-th, from its place among them), in
    batches of ``batch_size`` in ascending id, over neighbourhoods sampled with the training's
    ``sampler`` (its fan-outs: a batch of the size a training step has, whatever the degrees;
    its node-mark array and exchange rounds, so evaluation adds no array over every node; with
    the owners, as in training; batch i's generator seeded with i), so the scores are those of
    sampled inference: the same batches one host samples over the unsharded graph for those
    seeds. ``logits(batch)``: the model's outputs for a batch's seeds (the sampled strategy
    runs the model on the batch's trimmed layers, as one host's sampled evaluation does).
    (Exact full neighbourhoods were tried: on a power-law graph a hub's in-neighbours alone can
    outgrow a host's memory.) ``train``: None, not computed (the training nodes are often most
    of the labelled ones). The counts behind each score are summed over the group
    (all_reduce), so every rank returns the same scores. Every rank runs the same number of
    batches (the most any rank needs; empty ones where it has none left), so each enters
    every exchange."""
    graph, ex = sampler.g, sampler.ex
    host_ranks = [r for r in range(ex.world) if int(ex.host_of_rank[r]) == ex.host]
    place, share = host_ranks.index(ex.rank), len(host_ranks)
    splits = ("val", "test")
    ids, tags = [], []
    for t, name in enumerate(splits):
        mine = graph.split(name)[place::share]
        ids.append(mine)
        tags.append(torch.full((mine.numel(),), t, dtype=torch.long))
    ids_all, tag_all = torch.cat(ids), torch.cat(tags)
    steps = torch.tensor([-(-ids_all.numel() // batch_size)], dtype=torch.long)
    dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=ex.group)
    counts = torch.zeros(len(splits), 3, dtype=torch.float64)  # correct|tp, total|fp, 0|fn
    for i in range(int(steps)):
        seeds = ids_all[i * batch_size : (i + 1) * batch_size]
        tag = tag_all[i * batch_size : (i + 1) * batch_size]
        b = sampler.sample(seeds, torch.Generator().manual_seed(i))
        b.x = sampler.features(b.n_id)
        if seeds.numel() == 0:
            continue
        out = logits(b)[: seeds.numel()]
        del b
        y = graph.y[seeds - graph.first]
        for t in range(len(splits)):
            m = tag == t
            if not bool(m.any()):
                continue
            if multilabel:
                pred, truth = out[m] > 0, y[m] > 0.5
                counts[t, 0] += float((pred & truth).sum())
                counts[t, 1] += float((pred & ~truth).sum())
                counts[t, 2] += float((~pred & truth).sum())
            else:
                counts[t, 0] += float((out[m].argmax(dim=-1) == y[m]).sum())
                counts[t, 1] += float(m.sum())
    dist.all_reduce(counts, group=ex.group)
    scores = {}
    for t, name in enumerate(splits):
        a, b, c = (float(v) for v in counts[t])
        if multilabel:
            denom = 2 * a + b + c
            scores[name] = 2 * a / denom if denom else 1.0
        else:
            scores[name] = a / b if b else 0.0
    scores["train"] = None
    return scores
