"""The one training loop every strategy runs through. Read it top to bottom.

A strategy (``strategies/*.py``) does not loop. It builds a :class:`Plan`: the model and its
optimizer, a *source* of this rank's batches (:mod:`gnnpar.training.sources`), a *step* (forward and
backward of one batch, or one pipeline schedule), and a *sync policy* that acts between steps
(:mod:`gnnpar.training.sync`). What the loop calls on a source and a sync policy is declared in
:mod:`gnnpar.training.protocols` (every member; the base classes supply the defaults), and it
calls them directly. :func:`train` then runs, on every rank::

    for epoch in range(epochs):
        sync.start_epoch()                         # lock-step ranks: a common start
        for batch in source.epoch(epoch):          # None: this rank sits this step out
            optimizer.zero_grad()
            loss = step(batch)                     # forward + backward (pipelines: schedule.step)
            straggler.after_step(compute time)     # --slowdown / --jitter (waits excluded)
            if sync.after_backward(has_batch):     # all-reduce or gossip of gradients
                optimizer.step()
            sync.after_step(has_batch)             # averaging or gossip of parameters
        sync.end_epoch()                           # lock-step ranks: wait for every rank
        every --eval-every epochs: plan.evaluate()
    sync.finish()                                  # gossip: serve the last claims
    source.close()                                 # e.g. stop the loader's workers
    plan.finish()                                  # final scores (and final-model choice)

and gathers what every rank did into one :class:`Outcome`, which
:func:`gnnpar.result.build_result` turns into result.json. Checkpoints (``--checkpoint-every``)
are written between steps or epochs and, on resume, restored before the first. Timing: a step is
from asking the source for a batch to the end of its sync; ``data_wait`` is the first part,
``sync`` what the policy spent blocked on other ranks, ``compute`` the rest (straggler delays
included). ``train_time_s`` is the longest rank's summed epoch wall time (evaluation,
partitioning and set-up excluded). ``step``, ``evaluate`` and ``finish`` run under
``--precision`` (:func:`gnnpar.training.precision.autocast` for the plan's device; fp32: no context at
all), so the scores in result.json are those of the run's arithmetic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gnnpar.config.schema import Config
from gnnpar.parallel import collectives
from gnnpar.runtime.allocator import release_free_memory
from gnnpar.training.checkpoint import Checkpointer, CheckpointStats, Resumed
from gnnpar.training.final_model import FinalChoice
from gnnpar.training.metrics import peak_memory
from gnnpar.training.precision import autocast
from gnnpar.training.progress import MetricsLog, Progress, epoch_line
from gnnpar.training.protocols import Source, Sync
from gnnpar.training.straggler import Straggler
from gnnpar.training.sync import NoSync


@dataclass
class Final:
    """What :attr:`Plan.finish` returns: the final model's scores, and how it was chosen."""

    scores: dict[str, float | None]  # val, test (and train where known)
    eval_times: list[float]
    # where ranks end with different models: both candidates scored, the better kept
    choice: FinalChoice | None = None
    # which model is final: "rank0" (every rank holds it), or the choice's name
    final_model: str | None = None
    # how a graph's final evaluation ran (EvalChoice.record(): eval_mode, eval_fanouts, ...)
    evaluation: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.choice is not None:
            self.final_model = self.choice.name


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
    # the strategy's settings and measurements for result.json; every key is declared in its
    # spec's result_keys (an undeclared one fails the run's result)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankStats:
    """What one rank did over the run, gathered from every rank (the per-worker lists)."""

    train_s: float  # summed epoch wall time
    data_wait_s: float  # asking the source for batches
    compute_s: float  # the rest of the steps (straggler delays included)
    sync_wait_s: float  # blocked on other ranks in the sync policy
    exchanges: int  # averagings taken part in
    delay_s: float  # slept as an emulated straggler
    first_batch_wait_s: float  # part of data_wait_s: the first batch (not prefetched)
    step_times: list[float]  # every step, in order
    batches: int  # batches trained (pipelines: micro-batches)
    peak_rss_bytes: int
    cuda_peak_bytes: int | None  # None: not on CUDA
    info: dict[str, Any]  # Source.rank_info() | Sync.rank_info() (gnnpar.result.RANK_INFO)


@dataclass
class Outcome:
    """What :func:`train` returns, the same on every rank; :func:`gnnpar.result.build_result`
    turns it into result.json."""

    train_time_s: float  # the longest rank's summed epoch wall time
    step_times: list[float]  # lock-step ranks: each step's slowest rank; else rank 0's
    test_step_times: list[float]  # every evaluation step (mid-run and final)
    loss_curve: list[float] | dict[str, list[float]]
    scores: dict[str, float | None]  # the final model's val, test (and train where known)
    ranks: list[RankStats]
    partition_time_s: float = 0.0
    final_model: str | None = None  # Final.final_model
    choice: FinalChoice | None = None  # Final.choice
    evaluation: dict[str, Any] = field(default_factory=dict)  # Final.evaluation
    checkpoints: CheckpointStats | None = None  # None: no checkpointer
    strategy: dict[str, Any] = field(default_factory=dict)  # Plan.extra
    model: torch.nn.Module | None = None

    @property
    def val_score(self) -> float:
        return self.scores["val"]

    @property
    def test_score(self) -> float:
        return self.scores["test"]

    @property
    def per_worker_batches(self) -> list[int]:
        return [r.batches for r in self.ranks]


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
    the run resumes, first restores the newest good checkpoint and continues where it was.

    Why one function: it is the one loop of every strategy, read top to bottom as a run goes
    (resume, epochs, batches, step, sync, checkpoints, evaluation), its counters and timers
    shared by every phase."""
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
                "source": source.state(),
                "sync": sync.state(),
                "straggler": plan.straggler.state(),
            }

        source.pause()  # across shards: serve the subgraphs others fetch until all arrive
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
                # the last step's batch is let go before the next one is made: held, a sampled
                # batch's features were in memory twice while its successor was gathered
                batch = None
                batch = next(batches, StopIteration)
                if batch is StopIteration:
                    break
                t1, waited = time.perf_counter(), sync.wait_s
                has_batch = batch is not None
                opt.zero_grad(set_to_none=True)
                with precision():
                    loss = plan.step(batch) if has_batch else None
                if has_batch:  # its compute: not what it waited for others inside the step
                    plan.straggler.after_step(
                        max(0.0, time.perf_counter() - t1 - sync.waited_in_step_s())
                    )
                if sync.after_backward(has_batch):
                    opt.step()
                sync.after_step(has_batch)
                loss = None if loss is None else float(loss)  # waits for an accelerator
                t2 = time.perf_counter()
                step += 1
                log.record(epoch, loss, has_batch, t1 - t0, t2 - t1 - (sync.wait_s - waited))
                metrics.step(epoch, len(log.step_times), loss, t2 - t0)
                info = _running_loss(log, epoch)  # as the epoch's line will show it
                bar.update(source.position - shown, f"{info} {sync.status()}".strip())
                shown = source.position
                if ckpt is not None and ckpt.due_step(len(log.step_times)):
                    save(epoch, step, time.perf_counter() - t_epoch)
            sync.end_epoch()
            log.train_s += time.perf_counter() - t_epoch
            bar.update(source.position - shown)  # e.g. gossip's pool, emptied by the others
            shown = source.position
            scores = None
            last = epoch + 1 == r.epochs
            if plan.evaluate and r.eval_every and (epoch + 1) % r.eval_every == 0 and not last:
                release_free_memory()  # the steps' freed heap, before the full-graph forward
                with precision():
                    scores, times = plan.evaluate()
                eval_times += times
                if scores is not None:
                    bar.update(0, f"{_running_loss(log, epoch)} val {scores['val']:.3f}")
            record = metrics.epoch(epoch, log, scores, plan.device, source.epoch_info(epoch))
            if not last:  # the last epoch's line waits for the final model's val and test
                bar.log(epoch_line(record, r.epochs))
            if ckpt is not None and ckpt.due_epoch(epoch + 1) and not last:
                save(epoch + 1, 0)
        t_end = time.perf_counter()
        sync.finish()
        log.train_s += time.perf_counter() - t_end
        source.close()  # e.g. the loader's workers, before the final evaluation
        release_free_memory()  # rank 0 evaluates now, and the others wait for it
        with precision():
            final = plan.finish()
        if first_epoch < r.epochs:  # this process trained the last epoch: its line, scored
            scored = {k: final.scores.get(k) for k in ("val", "test")}
            bar.log(epoch_line({**record, **scored}, r.epochs))
        metrics.final(final.scores, log.train_s)
    outcome = _outcome(plan, log, eval_times + final.eval_times, final)
    if ckpt is not None:
        outcome.checkpoints = ckpt.stats(resumed)
    return outcome


def _running_loss(log: RankLog, epoch: int) -> str:
    """``epoch 3 loss 0.4123``: the mean loss of this rank's steps of the epoch so far, which at
    the epoch's end is the loss its line shows (:meth:`MetricsLog.epoch`)."""
    count = log.loss_count[epoch]
    loss = f" loss {log.loss_sum[epoch] / count:.4f}" if count else ""
    return f"epoch {epoch + 1}{loss}"


def _resume(cfg: Config, plan: Plan, ckpt: Checkpointer) -> Resumed | None:
    """Restore the newest good checkpoint into the plan's parts (model, optimizer and random
    generators: :meth:`Checkpointer.load`; source, sync and straggler here)."""
    warn = print if plan.reporter else (lambda _: None)
    resumed = ckpt.load(plan.model, plan.optimizer, lambda m: warn(f"gnnpar: {m}"))
    if resumed is None:
        return None
    loop = resumed.loop
    plan.source.load_state(loop["source"])
    plan.source.skip(resumed.step)  # epochs made from (seed, epoch): pass over what was done
    plan.sync.load_state(loop["sync"])
    plan.straggler.load_state(loop["straggler"])
    warn(f"gnnpar: resuming from {resumed.path} (epoch {resumed.epoch + 1}, step {resumed.step})")
    collectives.barrier()  # e.g. the work pool's counter is restored before anybody takes
    return resumed


def _outcome(plan: Plan, log: RankLog, eval_times: list[float], final: Final) -> Outcome:
    """Every rank's log gathered into one :class:`Outcome` (identical on every rank)."""
    peak = peak_memory(plan.device)
    mine = RankStats(
        train_s=log.train_s,
        data_wait_s=log.data_wait_s,
        compute_s=log.compute_s,
        sync_wait_s=plan.sync.wait_s,
        exchanges=plan.sync.exchanges,
        delay_s=plan.straggler.delay_s,
        first_batch_wait_s=log.first_wait_s,
        step_times=log.step_times,
        batches=log.batches * plan.batches_per_step,
        peak_rss_bytes=peak["peak_rss_bytes"],
        cuda_peak_bytes=peak.get("cuda_peak_bytes"),
        info={**plan.source.rank_info(), **plan.sync.rank_info()},
    )
    everyone = collectives.gather_to_all({"stats": mine, "log": vars(log)})
    logs = [e["log"] for e in everyone]
    ranks = [e["stats"] for e in everyone]
    return Outcome(
        train_time_s=max(r.train_s for r in ranks),
        step_times=_step_times(plan, logs),
        test_step_times=eval_times,
        loss_curve=_loss_curve(plan, logs),
        scores=final.scores,
        ranks=ranks,
        partition_time_s=plan.partition_time_s,
        final_model=final.final_model,
        choice=final.choice,
        evaluation=final.evaluation,
        strategy=plan.extra,
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
