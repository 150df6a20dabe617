"""Gossip as a sync policy of the training loop: pair up and average at step boundaries.

:class:`GossipSync` is what :mod:`gnnpar.strategies.gossip` plugs into :func:`gnnpar.training.loop.train`:
at every step boundary it asks the pairing protocol (:mod:`~gnnpar.parallel.gossip.protocol`) whether an
exchange is due and performs it (:mod:`~gnnpar.parallel.gossip.mixing`); at the end it runs the study's
clean-up, serving the claims still pending, before the rank retires.
"""

from __future__ import annotations

import time

import torch

from gnnpar.parallel.gossip.mixing import exchange_average
from gnnpar.parallel.gossip.protocol import Exchange, Pairing
from gnnpar.training.sync import NoSync


class GossipSync(NoSync):
    """Pairwise gossip at step boundaries: after backward (gradients) or after the optimizer
    step (parameters). A rank picks one step early, since the exchange happens at a later
    boundary (protocol.py), so that exchanges land every K steps."""

    def __init__(self, pairing: Pairing, params, average: str, every: int, timeout_s: float):
        super().__init__()
        self.pairing, self.params, self.average = pairing, params, average
        self.every, self.timeout_s = every, timeout_s
        self.since = 0  # steps since this rank last averaged (as claimer or claimed)
        self.log: list[list] = []  # [step, partner, xid, initiated]
        self.steps = 0
        self.t_step, self.waited = time.perf_counter(), 0.0

    def tensors(self) -> list[torch.Tensor]:
        if self.average == "params":
            return [p.data for p in self.params]
        for p in self.params:  # a rank that never trained (or an unused parameter) sends zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.params]

    def serve(self, x: Exchange) -> None:
        self.clock.seconds += exchange_average(
            self.tensors(), x.partner, self.timeout_s, f"exchange {x.xid}"
        )
        self.exchanges += 1
        self.log.append([self.steps, x.partner, x.xid, x.initiated])
        self.pairing.finish(x)

    def boundary(self) -> None:
        x = self.pairing.at_boundary(want=self.since >= self.every - 1)
        while x is not None:
            self.serve(x)
            self.since = 0
            # the picker may line up its next pick at once when K = 1 (it never waits)
            x = self.pairing.at_boundary(want=self.every == 1) if x.initiated else None

    def serve_pending(self) -> None:
        """Between steps, while this rank waits on others (a subgraph fetched across shards,
        gnnpar.parallel.fetch): the exchange a partner may be blocked in with us (our pick,
        ready; or a claim on us), so that it never waits for us while we wait for it. No new
        pick. Averaged gradients are those of the last step (already applied)."""
        x = self.pairing.at_boundary(want=False)
        if x is not None:
            self.serve(x)
            self.since = 0

    def after_backward(self, has_batch: bool) -> bool:
        self.steps += 1
        self.since += 1
        if self.average == "grads":
            self.boundary()
        return has_batch

    def after_step(self, has_batch: bool) -> None:
        if self.average == "params":
            self.boundary()
        # publish this rank's step time without its waits (what a partner would wait for)
        now, waited = time.perf_counter(), self.clock.seconds
        self.pairing.record_step(now - self.t_step - (waited - self.waited))
        self.t_step, self.waited = now, waited

    def start_epoch(self) -> None:
        self.t_step, self.waited = time.perf_counter(), self.clock.seconds

    def finish(self) -> None:
        """Clean-up (study lines 45-54): finish our pick, serve claims on us, then retire."""
        self.pause()
        self.clock.barrier()  # the fast ranks' idle time at the end counts as waiting

    def pause(self) -> None:
        """Retire as at the end: complete our pick, serve every claim made on us, and leave
        ``done`` so nobody claims us while we sit in a barrier (a checkpoint's, or the end)."""
        while True:
            t = time.perf_counter()
            x = self.pairing.retire()
            self.clock.seconds += time.perf_counter() - t
            if x is None:
                break
            self.serve(x)

    def unpause(self) -> None:
        """After a checkpoint: available again (the barrier saw every rank retired)."""
        self.pairing.open()

    def status(self) -> str:
        return f"exch {self.exchanges} wait {self.clock.seconds:.1f}s"

    def rank_info(self) -> dict:
        return {"exchange_log": self.log}

    def state(self) -> dict:
        mine = {"since": self.since, "log": self.log, "steps": self.steps}
        return {**super().state(), **mine, "pairing": self.pairing.state()}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.since, self.log, self.steps = state["since"], state["log"], state["steps"]
        self.pairing.load_state(state["pairing"])
