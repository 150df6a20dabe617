"""Lightning callbacks: gnnpar's run record (:class:`RunRecord`) and emulated stragglers
(:class:`Slowdown`).

    trainer = L.Trainer(..., callbacks=[Slowdown({1: 3.0}), RunRecord("runs/sage-gossip")])

:class:`RunRecord` writes what ``gnnpar train`` leaves in its ``--out`` folder, so that the
bench report and ``gnnpar advise --validate``'s readers take a Lightning run too:
``metrics.jsonl`` as the run goes (:class:`gnnpar.training.progress.MetricsLog`: a record per
step and per epoch, ``final`` after ``Trainer.test``) and ``result.json`` at the end of
``fit`` (every key declared in :mod:`gnnpar.result`; the scores from Lightning's logged
metrics ``val_metric``/``test_metric``; ``test_score`` filled in by a later ``Trainer.test``).
Times: a step is from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward,
optimizer, averaging), the data wait is from the end of one step to the start of the next
(Lightning fetching the batch), ``sync`` the averaging's wait where the strategy reports it
(gnnpar's strategies) and 0 under Lightning's own DDP, whose all-reduce hides in backward.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from gnnpar.errors import UsageError

# ``gnnpar train``'s name for what each Lightning strategy does (result.json's "strategy")
_GNNPAR_NAMES = {
    "GossipStrategy": "gossip",
    "PeriodicAverageStrategy": "allreduce",
}


def _wait_s(trainer: pl.Trainer) -> float:
    return float(getattr(trainer.strategy, "wait_s", 0.0))


class Slowdown(Callback):
    """``gnnpar train --slowdown``/``--jitter`` under Lightning: rank R's steps take
    ``slowdown[R]`` times as long (after a step of t seconds, not counting the time blocked on
    other ranks in averaging, the rank sleeps (F-1) t), plus with probability 0.1 a pause of up
    to ``jitter`` steps (gnnpar's :class:`~gnnpar.training.straggler.Straggler`, the same
    draws). ``slowdown``: ``{rank: factor}`` or ``"1=3,2=1.5"``."""

    def __init__(self, slowdown: dict[int, float] | str, jitter: float = 0.0, seed: int = 0):
        from gnnpar.config.parse import parse_slowdown
        from gnnpar.configure import MAX_SLOWDOWN

        self.slowdown = parse_slowdown(slowdown, "slowdown")
        for rank, factor in self.slowdown.items():
            if rank < 0 or not 1 <= factor <= MAX_SLOWDOWN:
                raise UsageError(
                    f"Slowdown {rank}={factor:g}: ranks are >= 0 and factors >= 1 and at most "
                    f"{MAX_SLOWDOWN:g} (3 = three times slower)."
                )
        if not 0 <= jitter <= MAX_SLOWDOWN:
            raise UsageError(f"jitter must be between 0 and {MAX_SLOWDOWN:g}, got {jitter}.")
        self.jitter, self.seed = float(jitter), seed
        self.straggler = None
        self._t0 = self._w0 = 0.0

    @property
    def delay_s(self) -> float:
        return 0.0 if self.straggler is None else self.straggler.delay_s

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from gnnpar.training.straggler import Straggler

        self.straggler = Straggler.for_rank(
            self.slowdown, self.jitter, self.seed, trainer.global_rank
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0, self._w0 = time.perf_counter(), _wait_s(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.straggler is not None:
            step = time.perf_counter() - self._t0 - (_wait_s(trainer) - self._w0)
            self.straggler.after_step(max(0.0, step))


class RunRecord(Callback):
    """gnnpar's ``metrics.jsonl`` and ``result.json`` for a Lightning run, in ``out`` (global
    rank 0 writes them; every rank measures). ``val_metric``/``test_metric``: the names under
    which the ``LightningModule`` logs its validation and test scores (accuracy, or micro-F1
    for a multi-label graph); ``model``: the name result.json gives the model (the module's
    class by default)."""

    def __init__(
        self,
        out: str | os.PathLike,
        val_metric: str = "val_acc",
        test_metric: str = "test_acc",
        model: str | None = None,
    ) -> None:
        self.out = Path(out)
        self.val_metric, self.test_metric, self.model_name = val_metric, test_metric, model
        self.metrics_log = None
        self.result: dict[str, Any] | None = None
        self._reset()

    def _reset(self) -> None:
        self.step_times: list[float] = []
        self.data_wait = self.compute = self.train_s = 0.0
        self.first_wait: float | None = None
        self.loss_sum: dict[int, float] = {}
        self.loss_count: dict[int, int] = {}
        self.test_times: list[float] = []
        self._t_last = self._t_batch = self._t_epoch = 0.0
        self._w_batch = 0.0
        self.sync_s = 0.0

    # -------------------------------------------------------------- set-up
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from gnnpar.training.progress import MetricsLog

        self._reset()
        if trainer.global_rank == 0:
            try:  # before any training: a folder that cannot be written is said now
                self.out.mkdir(parents=True, exist_ok=True)
                probe = self.out / ".gnnpar-write-test"
                probe.write_text("")
                probe.unlink()
            except OSError as e:
                raise UsageError(f"RunRecord: cannot write to {self.out}: {e.strerror}.") from None
            self.metrics_log = MetricsLog(str(self.out)).__enter__()

    # -------------------------------------------------------------- training
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._t_epoch = self._t_last = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        wait = now - self._t_last
        self.data_wait += wait
        if self.first_wait is None:
            self.first_wait = wait
        self._t_batch, self._w_batch = now, _wait_s(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        step = now - self._t_batch
        sync = _wait_s(trainer) - self._w_batch
        self.sync_s += sync
        self.compute += step - sync
        self.step_times.append(step)
        self._t_last = now
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        value = float(loss) if torch.is_tensor(loss) else None
        epoch = trainer.current_epoch
        if value is not None:
            self.loss_sum[epoch] = self.loss_sum.get(epoch, 0.0) + value
            self.loss_count[epoch] = self.loss_count.get(epoch, 0) + 1
        if self.metrics_log is not None:
            self.metrics_log.step(epoch, trainer.global_step, value, step)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        from gnnpar.training.metrics import peak_memory

        epoch = trainer.current_epoch
        self.train_s += time.perf_counter() - self._t_epoch
        if self.metrics_log is not None:
            count = self.loss_count.get(epoch, 0)
            record = {"event": "epoch", "epoch": epoch, "train_s": self.train_s}
            record["loss"] = self.loss_sum[epoch] / count if count else None
            val = _metric(trainer, self.val_metric)
            if val is not None:
                record["val"] = val
            record.update(peak_memory(trainer.strategy.root_device))
            self.metrics_log.write(record)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._t_batch = time.perf_counter()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.test_times.append(time.perf_counter() - self._t_batch)

    # -------------------------------------------------------------- the record
    def _mine(self, trainer: pl.Trainer) -> dict[str, Any]:
        from gnnpar.training.metrics import peak_memory

        strategy = trainer.strategy
        slow = next((c for c in trainer.callbacks if isinstance(c, Slowdown)), None)
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        return {
            "train_s": self.train_s,
            "step_times": self.step_times,
            "data_wait": self.data_wait,
            "compute": self.compute,
            "sync": self.sync_s,
            "first_wait": self.first_wait or 0.0,
            "loss_sum": self.loss_sum,
            "loss_count": self.loss_count,
            "exchanges": int(getattr(strategy, "exchanges", 0)),
            "delay_s": 0.0 if slow is None else slow.delay_s,
            "peak_rss": peak_memory(strategy.root_device)["peak_rss_bytes"],
            "pool_log": getattr(sampler, "taken", None),
            "exchange_log": getattr(strategy, "exchange_log", None),
        }

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every rank's measurements to rank 0 (after the strategy's own end: gossip has
        retired), which writes result.json."""
        mine = self._mine(trainer)
        if dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            ranks: list[Any] = [None] * trainer.world_size
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        if trainer.global_rank == 0:
            self.result = self._build(trainer, pl_module, ranks)
            self._write()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from gnnpar.training.metrics import summarize

        if trainer.global_rank != 0:
            return
        test, val = _metric(trainer, self.test_metric), _metric(trainer, self.val_metric)
        if self.result is not None:
            self.result["test_score"] = test
            self.result["test_step_time_s"] = summarize(self.test_times)
            self._write()
        if self.metrics_log is None and self.out.is_dir():  # a test after fit: append to the curve
            from gnnpar.training.progress import MetricsLog

            self.metrics_log = MetricsLog(str(self.out), append=True).__enter__()
        if self.metrics_log is not None:
            self.metrics_log.final({"val": val, "test": test}, self.train_s)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.metrics_log is not None and stage != "fit":
            self.metrics_log.__exit__(None, None, None)
            self.metrics_log = None

    def _build(self, trainer, pl_module, ranks: list[dict]) -> dict[str, Any]:
        """result.json's content from a Lightning run: the config the trainer ran, the ranks'
        records gathered (steps, loss curve, time breakdown), the scores.

        Why one function: it fills result.json's keys in the order :mod:`gnnpar.result` declares
        them, each from the trainer or the gathered records, like ``result.build_result`` for
        gnnpar's own runs."""
        from gnnpar import result as res
        from gnnpar.config.schema import Config
        from gnnpar.lightning.data import GraphDataModule
        from gnnpar.training.metrics import score_name, summarize

        dm = trainer.datamodule
        strategy = trainer.strategy
        kind = type(strategy).__name__
        if isinstance(dm, GraphDataModule):
            cfg = Config.from_dict(dm.cfg.to_dict())
            dataset, multilabel = dm.dataset_name, bool(dm.multilabel)
            partition_s, info = dm.partition_time_s, getattr(dm.ds, "info", {})
        else:
            cfg, dataset, multilabel, partition_s, info = Config(), "unknown", False, 0.0, {}
        name = _GNNPAR_NAMES.get(kind, cfg.strategy.name if kind == "DDPStrategy" else kind)
        cfg.strategy.name = name
        cfg.strategy.workers = trainer.world_size
        cfg.model.name = self.model_name or type(pl_module).__name__
        cfg.run.epochs = trainer.current_epoch
        slow = next((c for c in trainer.callbacks if isinstance(c, Slowdown)), None)
        if slow is not None:
            cfg.strategy.slowdown, cfg.strategy.jitter = dict(slow.slowdown), slow.jitter
        if hasattr(strategy, "sync_every"):
            cfg.strategy.sync_every, cfg.strategy.average = strategy.sync_every, strategy.average
        counts = {len(r["step_times"]) for r in ranks}
        if len(counts) == 1:  # lock step: each step's slowest rank
            steps = [max(ts) for ts in zip(*(r["step_times"] for r in ranks))]
        else:
            steps = [t for r in ranks for t in r["step_times"]]
        curve = []
        for e in sorted({e for r in ranks for e in r["loss_count"]}):
            n = sum(r["loss_count"].get(e, 0) for r in ranks)
            curve.append(sum(r["loss_sum"].get(e, 0.0) for r in ranks) / n if n else None)
        breakdown = [
            {"data_wait": r["data_wait"], "compute": r["compute"], "sync": r["sync"]} for r in ranks
        ]
        total = sum(sum(b.values()) for b in breakdown)
        train_s = [r["train_s"] for r in ranks]
        result: dict[str, Any] = {
            "dataset": dataset,
            "model": cfg.model.name,
            "strategy": name,
            "workers": trainer.world_size,
            "epochs": trainer.current_epoch,
            "seed": cfg.run.seed,
            "config": cfg.to_dict(),
            "train_time_s": max(train_s),
            "partition_time_s": partition_s,
            "step_time_s": summarize(steps),
            "test_step_time_s": summarize(self.test_times),
            "score_name": score_name(multilabel),
            "test_score": _metric(trainer, self.test_metric),
            "val_score": _metric(trainer, self.val_metric),
            "per_worker_batches": [len(r["step_times"]) for r in ranks],
            "loss_curve": curve,
            "versions": res.versions(),
            "machine": res.machine(strategy.root_device),
            "framework": {
                "name": "lightning",
                "version": pl.__version__,
                "strategy": f"{type(strategy).__module__}.{kind}",
            },
            "dataset_info": info,
            "train_score": None,
            "per_worker_train_s": train_s,
            "per_worker_wait_s": [r["sync"] for r in ranks],
            "per_worker_exchanges": [r["exchanges"] for r in ranks],
            "per_worker_delay_s": [r["delay_s"] for r in ranks],
            "time_breakdown_s": breakdown,
            "data_wait_share": sum(b["data_wait"] for b in breakdown) / total if total else 0.0,
            "rank_train_time_s": train_s,
            "max_rank_train_time_s": max(train_s),
            "peak_rss_bytes": [r["peak_rss"] for r in ranks],
            "first_batch_wait_s": [r["first_wait"] for r in ranks],
            "step_times_s": steps,
            "per_worker_step_time_s": [summarize(r["step_times"]) for r in ranks],
        }
        for key in ("pool_log", "exchange_log"):
            if ranks[0][key] is not None:
                result[key] = [r[key] for r in ranks]
        if hasattr(strategy, "sync_every"):
            result["sync_every"], result["average"] = strategy.sync_every, strategy.average
        if slow is not None:
            result["slowdown"] = {str(k): v for k, v in slow.slowdown.items()}
            result["jitter"] = slow.jitter
        if isinstance(dm, GraphDataModule) and dm.sampled:
            result["loader_workers"] = dm.cfg.strategy.loader_workers
            result["graph_setup_time_s"] = dm.setup_s
        if isinstance(dm, GraphDataModule) and not dm.sampled:
            result["partitions"] = dm.cfg.data.partitions
            result["partitioner"] = dm.cfg.data.partitioner
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if getattr(sampler, "steps", None) is not None:
            result["steps_per_epoch"] = sampler.steps
        # gnnpar's keys and those the strategies declare on their specs (a Lightning strategy
        # may train on sampled batches: the sampled spec declares loader_workers and the like)
        from gnnpar.strategies import registry

        declared = set(res.KEYS).union(*(s.result_keys for s in registry.specs()))
        unknown = [k for k in result if k not in declared]
        if unknown:  # a programming error: declare them in gnnpar.result or a spec first
            raise RuntimeError(f"result.json has keys gnnpar.result does not declare: {unknown}")
        return result

    def _write(self) -> None:
        from gnnpar.result import write_result

        write_result(self.result, self.out)

    def state_dict(self) -> dict[str, Any]:
        return {"out": str(self.out)}


def _metric(trainer: pl.Trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name)
    if value is None:
        return None
    value = float(value)
    return value if value == value else None  # NaN: not a score
