"""A subgraph fetched from the host that holds it, over the process group (gloo point to point;
no torch RPC): the mechanism that lets a gossip rank train a subgraph from another host's pool
(:class:`gnnpar.parallel.gossip.pool.ShardedPool`) when each host holds only its shard.

The ranks run out of step, so the owner cannot post a matching receive in advance; requests go
through the run's key-value store and the owner answers at its next *service point*:

1. the requester takes ticket ``i = add("<prefix>/<server>/n", 1) - 1`` and writes
   ``"<prefix>/<server>/<i>" = "<its rank>:<part>"``. The server is one rank of the owning host,
   chosen by the requester's place among its own host's ranks (as sampling across shards picks
   its answerer), so serving is spread over the owner's ranks;
2. the server, at a service point, reads its tickets in order, writes the payload's size to
   ``"<prefix>/<server>/<i>/size"`` and starts sending the payload (the subgraph's tensors,
   serialized with ``torch.save``; read back with ``weights_only=True``) with ``dist.isend``
   under :data:`FETCH_TAG`, and goes on: a blocking send would wait for the requester's receive
   while the requester, between its polls, may be in a gossip exchange with the server (a
   deadlock seen with 40 subgraphs and a slowed rank);
3. the requester, polling the store for the size, receives the payload with ``dist.recv`` and
   writes ``"<prefix>/<server>/<i>/got"``; the server waits for that send (done by then) and
   drops its buffer at its next service point.

Service points: before a rank takes its own next subgraph, while it waits for a fetch of its
own, after its work is done until every rank's is (:meth:`SubgraphFetch.drain`), and before a
checkpoint until every rank has come to it (:meth:`SubgraphFetch.pause`), so no rank leaves for
a collective (the end's barrier, a checkpoint's) while another may still need a subgraph it
serves.
While waiting, a rank also runs ``idle`` (gossip: serve the exchange a partner may be blocked
in, with us), so two ranks never wait on each other: a fetch waits only for a server that is
training (it serves after its step), fetching (it serves while waiting), or draining (it serves
until every rank is done). ``bytes_fetched`` / ``fetches``: what this rank received.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch_geometric.data import Data

FETCH_TAG = 0x676366  # apart from the gossip exchange's and the pipelines' messages
KEYS = ("x", "y", "train_mask", "val_mask", "test_mask", "edge_index", "n_id")


class FetchTimeoutError(RuntimeError):
    """The rank serving a subgraph did not answer within --timeout."""


def pack(batch: Data) -> torch.Tensor:
    """A subgraph as bytes (its tensors copied: a view would carry its whole storage)."""
    buf = io.BytesIO()
    torch.save({k: batch[k].clone() for k in KEYS if k in batch}, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def unpack(payload: torch.Tensor) -> Data:
    tensors = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
    out = Data(**tensors)
    out.num_nodes = int(tensors["x"].size(0))
    return out


class SubgraphFetch:
    """``fetch[p]``: subgraph ``p``, this host's own (``own``) or fetched from the rank that
    ``server_of(p)`` names. See the module docstring for the protocol."""

    def __init__(
        self,
        store,  # noqa: ANN001
        prefix: str,
        rank: int,
        world: int,
        own: Mapping[int, Data],
        server_of: Callable[[int], int],
        timeout_s: float,
        poll_s: float = 0.0005,
    ) -> None:
        self.store, self.prefix, self.rank, self.world = store, prefix, rank, world
        self.own, self.server_of, self.timeout_s, self.poll_s = own, server_of, timeout_s, poll_s
        self.idle: Callable[[], None] = lambda: None
        self.served = 0  # tickets answered
        self.pauses = 0  # checkpoints met (pause): each meets on a key of its own
        self._sending: dict[int, tuple] = {}  # ticket: (the isend's work, its buffer)
        self.fetches = self.bytes_fetched = 0

    def __getitem__(self, p: int) -> Data:
        self.serve()
        if p in self.own:
            return self.own[p]
        return self.fetch(p)

    def _key(self, server: int, *rest: object) -> str:
        return "/".join([self.prefix, str(server), *map(str, rest)])

    def serve(self) -> int:
        """Answer every request made of this rank so far (sends started, not waited for);
        release the sends their requesters have received. How many were answered."""
        got = [t for t in self._sending if self.store.check([self._key(self.rank, t, "got")])]
        for ticket in got:
            self._sending.pop(ticket)[0].wait()  # received: complete
        n = self.store.add(self._key(self.rank, "n"), 0)
        done = 0
        while self.served < n:
            who, part = (
                int(v) for v in self.store.get(self._key(self.rank, self.served)).split(b":")
            )
            payload = pack(self.own[part])
            self.store.set(self._key(self.rank, self.served, "size"), str(payload.numel()))
            self._sending[self.served] = (dist.isend(payload, who, tag=FETCH_TAG), payload)
            self.served += 1
            done += 1
        return done

    def fetch(self, p: int) -> Data:
        server = self.server_of(p)
        ticket = self.store.add(self._key(server, "n"), 1) - 1
        self.store.set(self._key(server, ticket), f"{self.rank}:{p}")
        size_key = self._key(server, ticket, "size")
        self._wait(lambda: self.store.check([size_key]), f"rank {server} to send subgraph {p}")
        payload = torch.empty(int(self.store.get(size_key)), dtype=torch.uint8)
        dist.recv(payload, server, tag=FETCH_TAG)
        self.store.set(self._key(server, ticket, "got"), "1")
        self.fetches += 1
        self.bytes_fetched += payload.numel()
        return unpack(payload)

    def drain(self) -> None:
        """This rank needs no more subgraphs: serve the others until none does."""
        self._meet(f"{self.prefix}/done", "every rank to finish its work")

    def pause(self) -> None:
        """Before a checkpoint's barrier (every rank between two epochs, each having taken at
        most the first subgraph of its next, not fetched yet): serve the others until every
        rank has come here, so that none sits in the barrier while another still waits for a
        subgraph it serves. Afterwards no fetch is outstanding: nothing of the protocol is in a
        checkpoint, and a resumed attempt starts with a fresh store and fresh tickets."""
        self.pauses += 1
        self._meet(f"{self.prefix}/pause/{self.pauses}", "every rank to reach the checkpoint")

    def _meet(self, key: str, what: str) -> None:
        """Arrive at ``key`` and serve until every rank has: a rank arrives only once its own
        fetches are received, so then every request was answered and every send completes."""
        self.store.add(key, 1)
        self._wait(lambda: self.store.add(key, 0) >= self.world, what)
        self.serve()  # a request made before its maker arrived
        for work, _ in self._sending.values():  # every requester has received (it arrived)
            work.wait()
        self._sending.clear()

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        t0 = time.monotonic()
        while not ready():
            self.serve()
            self.idle()
            if time.monotonic() - t0 > self.timeout_s:
                raise FetchTimeoutError(
                    f"rank {self.rank} waited more than --timeout {self.timeout_s:g} s for "
                    f"{what}: that rank crashed or stalled; check its log, or raise --timeout."
                )
            time.sleep(self.poll_s)

    def rank_info(self) -> dict:
        return {
            "fetched_subgraphs": self.fetches,
            "fetched_bytes": self.bytes_fetched,
            "served_subgraphs": self.served,
        }
