"""The one training loop every strategy runs through. Read it top to bottom.

A strategy (``strategies/*.py``) does not loop. It builds a :class:`Plan`: the model and its
optimizer, a *source* of this rank's batches (:mod:`gnnpar.training.sources`), a *step* (forward and
backward of one batch, or one pipeline schedule), and a *sync policy* that acts between steps
(:mod:`gnnpar.training.sync`). :func:`train` then runs, on every rank::

    for epoch in range(epochs):
        sync.start_epoch()                         # lock-step ranks: a common start
        for batch in source.epoch(epoch):          # None: this rank sits this step out
            optimizer.zero_grad()
            loss = step(batch)                     # forward + backward (pipelines: schedule.step)
            straggler.after_step(compute time)     # --slowdown / --jitter
            if sync.after_backward(has_batch):     # all-reduce or gossip of gradients
                optimizer.step()
            sync.after_step(has_batch)             # averaging or gossip of parameters
        sync.end_epoch()                           # lock-step ranks: wait for every rank
        every --eval-every epochs: plan.evaluate()
    sync.finish()                                  # gossip: serve the last claims
    plan.finish()                                  # final scores (and final-model choice)

and gathers what every rank did into one :class:`Outcome` (result.json). Timing: a step is
from asking the source for a batch to the end of its sync; ``data_wait`` is the first part,
``sync`` what the policy spent blocked on other ranks, ``compute`` the rest (straggler delays
included). ``train_time_s`` is the longest rank's summed epoch wall time (evaluation,
partitioning and set-up excluded). ``step``, ``evaluate`` and ``finish`` run under
``--precision`` (:func:`gnnpar.training.precision.autocast` for the plan's device; fp32: no context at
all), so the scores in result.json are those of the run's arithmetic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gnnpar.config.schema import Config
from gnnpar.parallel import collectives
from gnnpar.runtime.allocator import release_free_memory
from gnnpar.training.checkpoint import Checkpointer, Resumed
from gnnpar.training.metrics import MetricsLog, Progress, epoch_line, peak_memory, summarize
from gnnpar.training.precision import autocast
from gnnpar.training.straggler import Straggler
from gnnpar.training.sync import NoSync, Sync


class Source(Protocol):
    """What a rank trains on: ``epoch(e)`` yields its batches (None: no batch at this step)."""

    total_steps: int  # for the progress display
    position: int  # steps done so far (by every rank, where the source knows)

    def epoch(self, epoch: int) -> Iterator[Any]: ...


@dataclass
class Final:
    """What :attr:`Plan.finish` returns: the final model's scores."""

    scores: dict[str, float | None]  # val, test (and train where known)
    eval_times: list[float]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """What a strategy plugs into the loop."""

    name: str
    model: torch.nn.Module  # the whole model (evaluation, saving)
    optimizer: torch.optim.Optimizer
    source: Source
    step: Callable[[Any], torch.Tensor | float | None]  # forward+backward; the loss where seen
    finish: Callable[[], Final]
    sync: Sync = field(default_factory=NoSync)
    straggler: Straggler = field(default_factory=Straggler)
    evaluate: Callable[[], tuple[dict | None, list[float]]] | None = None  # mid-run
    curve: str = "epoch"  # loss_curve: "epoch" (mean over every rank), "step", "replica-step"
    lockstep: bool = True  # ranks step together: a step's time is the slowest rank's
    reporter: bool = True  # this rank shows the progress bar
    replica: int = 0
    device: torch.device | None = None  # for the accelerator's peak memory
    batches_per_step: int = 1  # per_worker_batches unit (pipelines: micro-batches)
    partition_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # strategy-specific result.json keys


@dataclass
class Outcome:
    train_time_s: float
    step_times: list[float]
    test_step_times: list[float]
    loss_curve: list[float] | dict[str, list[float]]
    per_worker_batches: list[int]
    val_score: float
    test_score: float
    partition_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    model: torch.nn.Module | None = None


@dataclass
class RankLog:
    """What one rank did; gathered from every rank at the end."""

    replica: int
    epochs: int
    loss_sum: list[float] = field(default_factory=list)  # per epoch
    loss_count: list[int] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    batches: int = 0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    first_wait_s: float = 0.0
    train_s: float = 0.0

    def __post_init__(self) -> None:
        self.loss_sum = [0.0] * self.epochs
        self.loss_count = [0] * self.epochs

    def restore(self, saved: dict[str, Any]) -> None:
        """A checkpoint's log; a resumed run may train more epochs than the one it continues."""
        for key, value in saved.items():
            setattr(self, key, value)
        grow = max(0, self.epochs - len(self.loss_sum))
        self.loss_sum += [0.0] * grow
        self.loss_count += [0] * grow

    def record(self, epoch: int, loss: float | None, has_batch: bool, wait: float, compute: float):
        """One step: its loss (None where not seen), data wait, and compute without sync."""
        if not self.step_times:
            self.first_wait_s = wait
        self.step_times.append(wait + compute)
        self.data_wait_s += wait
        self.compute_s += compute
        self.batches += has_batch
        if loss is not None:
            self.loss_sum[epoch] += loss
            self.loss_count[epoch] += 1
            self.step_losses.append(loss)


def train(cfg: Config, plan: Plan, ckpt: Checkpointer | None = None) -> Outcome:
    """Train ``plan`` for ``cfg.run.epochs`` epochs on this rank (collective across ranks).

    With ``ckpt``: checkpoints every ``--checkpoint-every`` epochs / ``-steps`` steps, and, when
    the run resumes, first restores the newest good checkpoint and continues where it was."""
    r = cfg.run
    source, sync, opt = plan.source, plan.sync, plan.optimizer

    def precision():  # --precision: autocast (bf16) or nothing (fp32)
        return autocast(r.precision, plan.device)

    log = RankLog(plan.replica, r.epochs)
    eval_times: list[float] = []
    first_epoch = first_step = 0
    resumed = _resume(cfg, plan, ckpt) if ckpt is not None and ckpt.resume else None
    if resumed is not None:
        log.restore({**resumed.loop["log"], "epochs": r.epochs})
        eval_times, first_epoch, first_step = (
            resumed.loop["eval_times"],
            resumed.epoch,
            resumed.step,
        )

    def save(epoch: int, step: int, partial_s: float = 0.0) -> None:
        def state() -> dict:
            return {
                "log": {**vars(log), "train_s": log.train_s + partial_s},
                "eval_times": eval_times,
                "source": _state(source),
                "sync": sync.state(),
                "straggler": (plan.straggler.rng.getstate(), plan.straggler.delay_s),
            }

        sync.pause()  # gossip: finish pending exchanges, accept no more, before the barrier
        ckpt.save(plan.model, opt, epoch, step, state, cfg.to_dict())
        sync.unpause()

    metrics = MetricsLog(r.out if plan.reporter else None, r.tensorboard, append=resumed)
    shown = source.position
    with Progress(source.total_steps, plan.name, plan.reporter and not r.quiet) as bar, metrics:
        bar.update(shown)
        for epoch in range(first_epoch, r.epochs):
            sync.start_epoch()
            t_epoch = time.perf_counter()
            batches = source.epoch(epoch)
            step = first_step if epoch == first_epoch else 0
            while True:
                t0 = time.perf_counter()
                batch = next(batches, StopIteration)
                if batch is StopIteration:
                    break
                t1, waited = time.perf_counter(), sync.wait_s
                has_batch = batch is not None
                opt.zero_grad(set_to_none=True)
                with precision():
                    loss = plan.step(batch) if has_batch else None
                if has_batch:
                    plan.straggler.after_step(time.perf_counter() - t1)
                if sync.after_backward(has_batch):
                    opt.step()
                sync.after_step(has_batch)
                loss = None if loss is None else float(loss)  # waits for an accelerator
                t2 = time.perf_counter()
                step += 1
                log.record(epoch, loss, has_batch, t1 - t0, t2 - t1 - (sync.wait_s - waited))
                metrics.step(epoch, len(log.step_times), loss, t2 - t0)
                info = f"epoch {epoch + 1} loss {loss:.4f}" if loss is not None else ""
                bar.update(source.position - shown, f"{info} {sync.status()}".strip())
                shown = source.position
                if ckpt is not None and ckpt.due_step(len(log.step_times)):
                    save(epoch, step, time.perf_counter() - t_epoch)
            sync.end_epoch()
            log.train_s += time.perf_counter() - t_epoch
            scores = None
            last = epoch + 1 == r.epochs
            if plan.evaluate and r.eval_every and (epoch + 1) % r.eval_every == 0 and not last:
                release_free_memory()  # the steps' freed heap, before the full-graph forward
                with precision():
                    scores, times = plan.evaluate()
                eval_times += times
                if scores is not None:
                    bar.update(0, f"epoch {epoch + 1} val {scores['val']:.3f}")
            bar.log(epoch_line(metrics.epoch(epoch, log, scores, plan.device), r.epochs))
            if ckpt is not None and ckpt.due_epoch(epoch + 1) and not last:
                save(epoch + 1, 0)
        t_end = time.perf_counter()
        sync.finish()
        log.train_s += time.perf_counter() - t_end
        release_free_memory()  # rank 0 evaluates now, and the others wait for it
        with precision():
            final = plan.finish()
        metrics.final(final.scores, log.train_s)
    outcome = _outcome(plan, log, eval_times + final.eval_times, final)
    if ckpt is not None:
        outcome.extra.update(ckpt.report(resumed))
    return outcome


def _state(part: Any) -> Any:
    return part.state() if hasattr(part, "state") else None


def _resume(cfg: Config, plan: Plan, ckpt: Checkpointer) -> Resumed | None:
    """Restore the newest good checkpoint into the plan's parts (model, optimizer and random
    generators: :meth:`Checkpointer.load`; source, sync and straggler here)."""
    warn = print if plan.reporter else (lambda _: None)
    resumed = ckpt.load(plan.model, plan.optimizer, lambda m: warn(f"gnnpar: {m}"))
    if resumed is None:
        return None
    loop = resumed.loop
    if loop["source"] is not None:
        plan.source.load_state(loop["source"])
    if hasattr(plan.source, "skip"):  # epochs made from (seed, epoch): pass over what was done
        plan.source.skip = resumed.step
    plan.sync.load_state(loop["sync"])
    plan.straggler.rng.setstate(loop["straggler"][0])
    plan.straggler.delay_s = loop["straggler"][1]
    warn(f"gnnpar: resuming from {resumed.path} (epoch {resumed.epoch + 1}, step {resumed.step})")
    collectives.barrier()  # e.g. the work pool's counter is restored before anybody takes
    return resumed


def _outcome(plan: Plan, log: RankLog, eval_times: list[float], final: Final) -> Outcome:
    """Every rank's log gathered into result.json's shape (identical on every rank)."""
    mine = {
        "log": vars(log),
        "wait_s": plan.sync.wait_s,
        "exchanges": plan.sync.exchanges,
        "delay_s": plan.straggler.delay_s,
        "peak": peak_memory(plan.device),
        "info": {**getattr(plan.source, "rank_info", dict)(), **plan.sync.rank_info()},
    }
    everyone = collectives.gather_to_all(mine)
    logs = [e["log"] for e in everyone]
    breakdown = [
        {"data_wait": g["data_wait_s"], "compute": g["compute_s"], "sync": e["wait_s"]}
        for g, e in zip(logs, everyone)
    ]
    total = sum(sum(b.values()) for b in breakdown)
    train_s = [g["train_s"] for g in logs]
    extra: dict[str, Any] = {
        "train_score": final.scores.get("train"),
        "per_worker_train_s": train_s,
        "per_worker_wait_s": [e["wait_s"] for e in everyone],
        "per_worker_exchanges": [e["exchanges"] for e in everyone],
        "per_worker_delay_s": [e["delay_s"] for e in everyone],
        "time_breakdown_s": breakdown,
        "data_wait_share": sum(b["data_wait"] for b in breakdown) / total if total else 0.0,
        "rank_train_time_s": train_s,
        "max_rank_train_time_s": max(train_s),
        "peak_rss_bytes": [e["peak"]["peak_rss_bytes"] for e in everyone],
        # part of data_wait: the first batch cannot be prefetched (pipeline fill)
        "first_batch_wait_s": [g["first_wait_s"] for g in logs],
    }
    if "cuda_peak_bytes" in everyone[0]["peak"]:
        extra["cuda_peak_bytes"] = [e["peak"].get("cuda_peak_bytes") for e in everyone]
    step_times = _step_times(plan, logs)
    extra["step_times_s"] = step_times  # every step, in order (the first includes warm-up)
    extra["per_worker_step_time_s"] = [summarize(g["step_times"]) for g in logs]
    for key in everyone[0]["info"]:
        extra[key] = [e["info"][key] for e in everyone]
    extra.update(plan.extra)
    extra.update(final.extra)
    return Outcome(
        train_time_s=max(train_s),
        step_times=step_times,
        test_step_times=eval_times,
        loss_curve=_loss_curve(plan, logs),
        per_worker_batches=[g["batches"] * plan.batches_per_step for g in logs],
        val_score=final.scores["val"],
        test_score=final.scores["test"],
        partition_time_s=plan.partition_time_s,
        extra=extra,
        model=plan.model,
    )


def _step_times(plan: Plan, logs: list[dict]) -> list[float]:
    """Lock-step ranks: a step lasts until its slowest rank is done. Otherwise rank 0's."""
    times = [g["step_times"] for g in logs]
    if plan.lockstep and len({len(t) for t in times}) == 1:
        return [max(t) for t in zip(*times)]
    return times[0]


def _loss_curve(plan: Plan, logs: list[dict]) -> list[float] | dict[str, list[float]]:
    """``epoch``: per epoch, the mean loss over every batch any rank trained in it. ``step``:
    the step losses of the first rank that sees losses. ``replica-step``: that, per replica."""
    seen = [g for g in logs if g["step_losses"]]
    if plan.curve == "step":
        return seen[0]["step_losses"] if seen else []
    if plan.curve == "replica-step":
        by_replica: dict[str, list[float]] = {}
        for g in seen:
            by_replica.setdefault(f"replica{g['replica']}", g["step_losses"])
        return dict(sorted(by_replica.items()))
    epochs = len(logs[0]["loss_sum"])
    curve = []
    for e in range(epochs):
        count = sum(g["loss_count"][e] for g in logs)
        curve.append(sum(g["loss_sum"][e] for g in logs) / count if count else float("nan"))
    return curve
