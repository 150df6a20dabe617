"""Sync policies: what happens between training steps, each a small class the loop calls.

=======================  ==========================================================  =========
policy                   what                                                        strategy
=======================  ==========================================================  =========
:class:`NoSync`          nothing (one process, or DDP's own hooks do it)             sequential
:class:`GradAllReduce`   mean of the gradients over the ranks every K steps          allreduce
:class:`ParamAverage`    mean of the parameters every K steps (torch's averager)     allreduce
:class:`GossipSync`       pairwise gossip every K steps (:mod:`.gossip_sync`)         gossip
:class:`DDPHooks`        DDP's bucketed all-reduce inside backward, timed            sampled
:class:`ReplicaGradSum`  sum of a stage's gradients over the pipeline copies         hybrid
=======================  ==========================================================  =========

The loop calls, per step, ``after_backward(has_batch)`` (returns whether the optimizer steps)
and ``after_step(has_batch)``; per epoch ``start_epoch()`` and ``end_epoch()``; once at the
end ``finish()``; around a checkpoint ``pause()``/``unpause()`` (the whole protocol:
:class:`gnnpar.training.protocols.Sync`). ``wait_s`` is the time the policy spent blocked on
other ranks (``per_worker_wait_s``), ``exchanges`` how many averagings this rank took part in.
Every policy derives from :class:`NoSync`, which supplies a default for each member.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from gnnpar.parallel import collectives
from gnnpar.parallel.collectives import WaitClock


class NoSync:
    """Nothing between steps; the base class of every policy (the defaults of the protocol)."""

    def __init__(self) -> None:
        self.clock = WaitClock()
        self.exchanges = 0

    @property
    def wait_s(self) -> float:
        return self.clock.seconds

    def start_epoch(self) -> None:
        pass

    def waited_in_step_s(self) -> float:
        """Of the step just computed, the seconds spent blocked on other ranks inside it (DDP's
        all-reduce in backward), which an emulated straggler's pause must not multiply."""
        return 0.0

    def after_backward(self, has_batch: bool) -> bool:
        return has_batch

    def after_step(self, has_batch: bool) -> None:
        pass

    def end_epoch(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def pause(self) -> None:
        """Before a checkpoint's barrier: nothing may still wait on another rank."""

    def unpause(self) -> None:
        """After the checkpoint."""

    def status(self) -> str:
        return ""

    def rank_info(self) -> dict:
        return {}

    def state(self) -> dict:
        """What a checkpoint keeps (counters; subclasses add theirs)."""
        return {
            "wait_s": self.clock.seconds,
            "calls": self.clock.calls,
            "exchanges": self.exchanges,
        }

    def load_state(self, state: dict) -> None:
        self.clock.seconds, self.clock.calls = state["wait_s"], state["calls"]
        self.exchanges = state["exchanges"]


class LockStep(NoSync):
    """Ranks that run the same steps: a common, untimed start per epoch, and the epoch ends
    when every rank is done (that wait counts as waiting: the study's synchronisation barrier)."""

    def start_epoch(self) -> None:
        if collectives.active():
            dist.barrier()

    def end_epoch(self) -> None:
        self.clock.barrier()

    def status(self) -> str:
        return f"waited {self.clock.seconds:.1f}s"


class GradAllReduce(LockStep):
    """Every ``every`` steps (a counter across epochs) the gradients are replaced by their mean
    over the ranks that had a batch (study 003 algorithms 3 and 4; K = 1 is DDP's maths). Steps
    in between update with local gradients. A rank without a batch still joins the collective
    and steps with the mean."""

    def __init__(self, params: list[torch.nn.Parameter], every: int) -> None:
        super().__init__()
        self.params, self.every, self.count = params, every, 0

    def state(self) -> dict:
        return {**super().state(), "count": self.count}  # steps since the start: K's phase

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.count = state["count"]

    def after_backward(self, has_batch: bool) -> bool:
        self.count += 1
        due = self.count % self.every == 0
        if due:
            collectives.average_gradients(self.params, has_batch, self.clock)
            self.exchanges += 1
        return has_batch or due


class ParamAverage(LockStep):
    """Local SGD: every rank steps on its own gradients, and every ``every`` steps the
    parameters are averaged with torch's ``PeriodicModelAverager`` (the first averaging after
    ``every`` local steps). With plain SGD and K = 1 this equals :class:`GradAllReduce`."""

    def __init__(self, params: list[torch.nn.Parameter], every: int) -> None:
        super().__init__()
        self.params, self.every, self.count = params, every, 0
        with warnings.catch_warnings():  # period 1 "use DDP instead": K = 1 is deliberate
            warnings.simplefilter("ignore", UserWarning)
            self.averager = PeriodicModelAverager(period=every, warmup_steps=every - 1)

    def state(self) -> dict:
        return {**super().state(), "count": self.count, "averager_step": self.averager.step}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.count, self.averager.step = state["count"], state["averager_step"]

    def after_step(self, has_batch: bool) -> None:
        """Average on the averager's own schedule (its ``step``, ``warmup_steps`` and
        ``period``), over every parameter. ``PeriodicModelAverager.average_parameters`` leaves
        out the parameters whose ``grad`` is None: a rank that held no subgraph yet (an uneven
        split, e.g. 3 subgraphs on 2 ranks) then offered an empty list (``torch.cat`` failed),
        and one whose model left some parameters unused would all-reduce a buffer of another
        size than its peers'. Every rank holds every parameter, so all of them are averaged."""
        self.count += 1
        t0 = time.perf_counter()
        a = self.averager
        if a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0:
            average_parameters(iter(self.params), a.process_group)
        a.step += 1
        if self.count % self.every == 0:
            self.clock.seconds += time.perf_counter() - t0
            self.exchanges += 1


class DDPHooks(NoSync):
    """DistributedDataParallel averages gradients inside backward; this times the part of it
    that backward did not hide: from the moment the last bucket is handed to the all-reduce to
    the moment the last all-reduce completes (it includes waiting for a slower rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.last_call = self.last_done = 0.0

    # No annotations on the arguments: DDP compares them with dist.GradBucket at run time, and
    # postponed annotations (strings) fail that check.
    def hook(self, state, bucket):  # noqa: ANN001
        """DDP comm hook: the default all-reduce (average), timed."""
        self.last_call = time.perf_counter()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.last_done = time.perf_counter()
            return fut.value()

        return allreduce_hook(None, bucket).then(done)

    def waited_in_step_s(self) -> float:
        return max(0.0, self.last_done - self.last_call)

    def after_backward(self, has_batch: bool) -> bool:
        self.clock.seconds += self.waited_in_step_s()
        self.last_call = self.last_done = 0.0  # a step without a hook adds 0
        return has_batch


class ReplicaGradSum(NoSync):
    """Hybrid: after each pipeline step, a stage's gradients are summed over the copies of the
    pipeline (the losses are already scaled by the global batch, so the sum is its gradient)."""

    def __init__(self, params: list[torch.nn.Parameter], group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.params, self.group = params, group

    def after_backward(self, has_batch: bool) -> bool:
        collectives.sum_gradients(self.params, self.group, self.clock)
        return has_batch
