"""The training loop on its own: a fake plan (a tiny model, a fake source and sync policy) in one
process, no process group. A rank without a batch, the time breakdown, a resume midway that
ends bit for bit where the uninterrupted run ends, evaluation every N epochs, and the parts'
protocols (every source and sync policy derives from the base that supplies the defaults)."""

from __future__ import annotations

import inspect
import json
import math
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from gnnpar.config.schema import Config
from gnnpar.result import KEYS, REQUIRED_KEYS, build_result
from gnnpar.training import loop as loop_module
from gnnpar.training import sources, sync
from gnnpar.training.checkpoint import Checkpointer
from gnnpar.training.loop import Final, Plan, train
from gnnpar.training.losses import LocalStep, loss_fn
from gnnpar.training.protocols import BaseSource, Source, Sync
from gnnpar.training.sources import Resumable
from gnnpar.training.straggler import Straggler
from gnnpar.training.sync import NoSync


class Crash(Exception):
    """A rank that dies midway (raised by the fake source)."""


class Batches(Resumable):
    """``steps`` batches of (x, y) per epoch, made from (epoch) alone, so a resumed epoch can be
    replayed. ``gaps``: (epoch, step) pairs at which this rank has no batch (None); ``empty``:
    epochs in which it gets nothing at all; ``crash_at``: die before the batch at that position;
    ``wait_s``: time to make a batch (the data wait)."""

    def __init__(self, epochs, steps=4, gaps=(), empty=(), crash_at=None, wait_s=0.0, drop=()):
        self.steps, self.total_steps, self.position = steps, epochs * steps, 0
        self.gaps, self.empty, self.drop = set(gaps), set(empty), set(drop)
        self.crash_at, self.wait_s = crash_at, wait_s
        self.started: list[int] = []  # the epochs asked for

    def epoch(self, epoch):
        self.started.append(epoch)
        return self._counted(self._make(epoch))

    def _make(self, epoch):
        if epoch in self.empty:
            return
        g = torch.Generator().manual_seed(1000 + epoch)
        for i in range(self.steps):
            x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
            if (epoch, i) in self.drop:  # not even a step (the reference for ``gaps``)
                continue
            if self.crash_at is not None and self.position == self.crash_at:
                raise Crash
            time.sleep(self.wait_s)
            yield None if (epoch, i) in self.gaps else (x, y)


class Recorder(NoSync):
    """A sync policy that records what the loop told it, and waits ``wait_s`` per step."""

    def __init__(self, wait_s: float = 0.0) -> None:
        super().__init__()
        self.wait, self.calls, self.epochs = wait_s, [], 0

    def start_epoch(self) -> None:
        self.epochs += 1

    def after_backward(self, has_batch: bool) -> bool:
        self.calls.append(has_batch)
        time.sleep(self.wait)
        self.clock.seconds += self.wait
        self.exchanges += 1
        return has_batch


def config(out, epochs=3, eval_every=0) -> Config:
    cfg = Config()
    cfg.data.dataset, cfg.model.name, cfg.strategy.name = "fake", "mlp", "sequential"
    cfg.run.epochs, cfg.run.out, cfg.run.quiet, cfg.run.eval_every = (
        epochs,
        str(out),
        True,
        eval_every,
    )
    return cfg


def make_plan(source, sync=None, evaluate=None, step_s=0.0, init_seed=0) -> Plan:
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)  # its moments move weights without grads

    def loss(net, batch):
        time.sleep(step_s)
        x, y = batch
        return loss_fn(net(x), y, False)

    def finish() -> Final:
        return Final({"val": 0.5, "test": 0.25, "train": None}, [0.001])

    return Plan(
        "fake",
        model,
        opt,
        source,
        LocalStep(model, loss),
        finish,
        sync=sync or NoSync(),
        evaluate=evaluate,
    )


def weights(plan: Plan) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in plan.model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def result_of(cfg, outcome) -> dict:
    return build_result(cfg, outcome, SimpleNamespace(multilabel=False, info={}), 1)


# ----------------------------------------------------------------------- a rank without a batch
def test_a_step_without_a_batch_changes_nothing_but_is_a_step(tmp_path):
    """None: no forward, no optimizer step (Adam would move the weights even with zero
    gradients), but the step happens (the sync policy sees it, it is timed)."""
    gaps = [(0, 1), (2, 3)]
    recorder = Recorder()
    gapped = make_plan(Batches(3, gaps=gaps), recorder)
    out = train(config(tmp_path / "a"), gapped)
    reference = make_plan(Batches(3, drop=gaps))
    ref = train(config(tmp_path / "b"), reference)
    assert same(weights(gapped), weights(reference))
    assert out.loss_curve == ref.loss_curve
    assert out.per_worker_batches == [10] and len(out.step_times) == 12
    assert recorder.calls == [(e, i) not in gaps for e in range(3) for i in range(4)]
    assert recorder.epochs == 3


def test_an_epoch_without_any_batch(tmp_path):
    """A rank that gets nothing in an epoch (the work pool emptied by the others, or only
    None steps): its epoch's loss is NaN when no rank saw a loss, and training goes on."""
    plan = make_plan(Batches(3, empty=[1], gaps=[(2, i) for i in range(4)]))
    out = train(config(tmp_path), plan)
    assert not math.isnan(out.loss_curve[0])
    assert math.isnan(out.loss_curve[1]) and math.isnan(out.loss_curve[2])
    assert out.per_worker_batches == [4] and len(out.step_times) == 8
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["loss"] is None for r in epochs] == [False, True, True]


# ---------------------------------------------------------------------------- time breakdown
def test_time_breakdown_adds_up(tmp_path):
    """data_wait (making a batch), compute (the step) and sync (the policy's waits) are each
    seen, none negative, and together no longer than the training's wall time."""
    recorder = Recorder(wait_s=0.004)
    plan = make_plan(Batches(2, steps=3, wait_s=0.003), recorder, step_s=0.005)
    t0 = time.perf_counter()
    out = train(config(tmp_path, epochs=2), plan)
    wall = time.perf_counter() - t0
    r = result_of(config(tmp_path, epochs=2), out)
    (b,) = r["time_breakdown_s"]
    assert set(b) == {"data_wait", "compute", "sync"}
    assert b["data_wait"] >= 6 * 0.003 and b["compute"] >= 6 * 0.005
    assert b["sync"] == pytest.approx(6 * 0.004) and r["per_worker_wait_s"] == [b["sync"]]
    assert min(b.values()) >= 0 and r["per_worker_exchanges"] == [6]
    assert sum(b.values()) <= r["train_time_s"] <= wall
    assert r["max_rank_train_time_s"] == r["train_time_s"] == r["per_worker_train_s"][0]
    assert 0 < r["data_wait_share"] < 1
    assert r["data_wait_share"] == pytest.approx(b["data_wait"] / sum(b.values()))
    # a step's time is its data wait and compute; the policy's waits are apart
    assert sum(r["step_times_s"]) == pytest.approx(b["data_wait"] + b["compute"])
    assert r["step_time_s"]["count"] == 6 and len(r["first_batch_wait_s"]) == 1
    assert r["first_batch_wait_s"][0] >= 0.003


# ------------------------------------------------------------------------ emulated stragglers
class WaitsInsideTheStep(NoSync):
    """As DDP: part of each step is spent blocked on the other ranks inside backward."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: list[float] = []

    def wait(self) -> None:
        t0 = time.perf_counter()
        time.sleep(0.02)
        self.inside.append(time.perf_counter() - t0)

    def waited_in_step_s(self) -> float:
        return self.inside[-1]

    def after_backward(self, has_batch: bool) -> bool:
        self.clock.seconds += self.inside[-1]
        return has_batch


class SeenSteps(Straggler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def after_step(self, step_s: float) -> None:
        self.seen.append(step_s)


def test_a_stragglers_pause_is_drawn_on_its_compute_not_on_its_waits(tmp_path):
    """A sampled rank's DDP all-reduce waits for the other rank inside backward; a straggler's
    pause multiplied that wait too, so with every rank slowed each pause grew on the others'
    (a 10x straggler pair: a 58 s step after 0.4 s ones). The straggler is given the step less
    the wait: never more than the step's compute as the time breakdown counts it."""
    sync = WaitsInsideTheStep()
    plan = make_plan(Batches(2, steps=3), sync, step_s=0.005)
    inner = plan.step.loss

    def loss(net, batch):
        out = inner(net, batch)
        sync.wait()
        return out

    plan.step.loss = loss
    plan.straggler = SeenSteps()
    out = train(config(tmp_path, epochs=2), plan)
    seen = plan.straggler.seen
    assert len(seen) == len(out.step_times) == len(sync.inside) == 6
    assert all(0.005 <= s <= t for s, t in zip(seen, out.step_times, strict=True))


# --------------------------------------------------------------------------- resume midway
def test_resume_midway_ends_bit_for_bit_where_the_uninterrupted_run_ends(tmp_path):
    """Checkpoints every 3 steps; the rank dies before step 8 (epoch 2 of 3, step 4 of 4); a
    fresh process (other initial weights) resumes from step 6 and ends with the same weights,
    loss curve and Adam state as the run that never stopped. Dropout draws from the global
    generator, which the checkpoint restores."""
    whole = make_plan(Batches(3))
    uninterrupted = train(config(tmp_path / "whole"), whole)

    def checkpointer(cfg, resume):
        ckpt = Checkpointer(cfg.run.out, 0, 1, every=0, every_steps=3, resume=resume)
        ckpt.config = cfg.to_dict()
        return ckpt

    cfg = config(tmp_path / "crash")
    with pytest.raises(Crash):
        train(cfg, make_plan(Batches(3, crash_at=7)), checkpointer(cfg, False))
    torch.manual_seed(12345)  # whatever the new process draws before resuming
    resumed_plan = make_plan(Batches(3), init_seed=99)
    resumed = train(cfg, resumed_plan, checkpointer(cfg, True))
    assert same(weights(resumed_plan), weights(whole))
    assert resumed.loss_curve == uninterrupted.loss_curve
    for a, b in zip(whole.optimizer.state.values(), resumed_plan.optimizer.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.checkpoints.resumed_from.endswith("epoch-000001-step-00000002")
    assert resumed.per_worker_batches == uninterrupted.per_worker_batches == [12]
    assert len(resumed.step_times) == 12
    r = result_of(cfg, resumed)
    assert r["resumed_from"] == resumed.checkpoints.resumed_from and r["restarts"] == 0
    assert r["checkpoints_written"] == 2  # after steps 9 and 12 (this attempt's)
    assert r["lost_time_s"] >= 0


def test_a_source_without_state_resumes_at_the_epoch(tmp_path):
    """A BaseSource keeps no state: ``load_state(None)`` and ``skip`` are no-ops."""

    class Plain(BaseSource):
        def __init__(self, epochs):
            self.total_steps, self.position, self.batches = epochs * 2, 0, Batches(epochs, 2)
            self.started: list[int] = []

        def epoch(self, epoch):
            self.started.append(epoch)
            for b in self.batches._make(epoch):
                self.position += 1
                yield b

    cfg = config(tmp_path, epochs=2)
    ckpt = Checkpointer(cfg.run.out, 0, 1, every=1, every_steps=0, resume=False)
    ckpt.config = cfg.to_dict()
    train(cfg, make_plan(Plain(2)), ckpt)
    ckpt = Checkpointer(cfg.run.out, 0, 1, every=1, every_steps=0, resume=True)
    ckpt.config = cfg.to_dict()
    plan = make_plan(Plain(2))
    out = train(cfg, plan, ckpt)
    assert out.checkpoints.resumed_from.endswith("epoch-000001-step-00000000")
    assert plan.source.started == [1] and out.per_worker_batches == [4]


# ------------------------------------------------------------------------------- eval every N
@pytest.mark.parametrize(
    ("epochs", "every", "expected"), [(5, 2, [2, 4]), (6, 2, [2, 4]), (3, 0, [])]
)
def test_eval_every_n_epochs_but_not_the_last(tmp_path, epochs, every, expected):
    """--eval-every N: after epochs N, 2N, ... but not after the last (finish scores it)."""
    source = Batches(epochs, steps=2)
    seen: list[int] = []

    def evaluate():
        seen.append(len(source.started))
        return {"val": 0.1 * len(seen), "test": 0.0}, [0.01 * len(seen)]

    out = train(config(tmp_path, epochs, every), make_plan(source, evaluate=evaluate))
    assert seen == expected
    assert out.test_step_times == [0.01 * (i + 1) for i in range(len(expected))] + [0.001]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    vals = {r["epoch"] + 1: r["val"] for r in records if r["event"] == "epoch" and "val" in r}
    assert vals == {e: pytest.approx(0.1 * (i + 1)) for i, e in enumerate(expected)}
    assert records[-1]["event"] == "final" and records[-1]["val"] == 0.5


# -------------------------------------------------------------------------- the protocols
def test_every_source_and_sync_policy_derives_from_the_base():
    from gnnpar.training.gossip_sync import GossipSync
    from gnnpar.training.pipeline_batches import GraphMicroBatches, ImageMicroBatches

    found = [c for _, c in inspect.getmembers(sources, inspect.isclass) if "epoch" in vars(c)]
    assert {c.__name__ for c in found} >= {
        "ShuffledBatches",
        "ImageBatches",
        "DealtPartitions",
        "PoolSource",
        "SampledSource",
    }
    for cls in [*found, GraphMicroBatches, ImageMicroBatches]:
        assert issubclass(cls, BaseSource), cls
        for name in ("state", "load_state", "skip", "rank_info", "close"):
            assert callable(getattr(cls, name))
    policies = [
        c for _, c in inspect.getmembers(sync, inspect.isclass) if c.__module__ == sync.__name__
    ]
    for cls in [*policies, GossipSync]:
        assert issubclass(cls, NoSync), cls
    assert isinstance(Batches(1), Source) and isinstance(NoSync(), Sync)


def test_the_loop_probes_nothing():
    """The loop calls its parts' members directly: no hasattr/getattr (the protocols say what
    each part has)."""
    text = inspect.getsource(loop_module)
    assert "hasattr(" not in text and "getattr(" not in text


# -------------------------------------------------------------------------- result.json keys
def test_result_keys_are_declared_and_an_undeclared_one_is_refused(tmp_path):
    """A strategy's own keys are its spec's result_keys (allreduce's sync_every here); any
    other key of a plan's extra is refused."""
    from gnnpar.strategies import registry

    plan = make_plan(Batches(1, steps=2))
    plan.extra = {"sync_every": 1}
    cfg = config(tmp_path, epochs=1)
    cfg.strategy.name = "allreduce"
    out = train(cfg, plan)
    r = result_of(cfg, out)
    assert set(REQUIRED_KEYS) <= set(r)
    assert set(r) <= set(KEYS) | set(registry.get("allreduce").result_keys)
    assert list(r)[: len(REQUIRED_KEYS)] == list(REQUIRED_KEYS)
    assert r["sync_every"] == 1 and "final_model" not in r and "checkpoints_written" not in r
    out.strategy = {"not_declared": 1}
    with pytest.raises(RuntimeError, match="not_declared"):
        result_of(cfg, out)


# ---------------------------------------------------------------------- what the run shows
def test_progress_and_epoch_lines_agree_and_read_without_a_terminal(tmp_path, capsys, monkeypatch):
    """Without a terminal: plain status lines (here one per step: every_s=0), never a cut bar;
    at each epoch's last step the status shows the loss that the epoch's line then shows; the
    last epoch's line has the final model's val and test; one closing line counts the steps."""
    import functools
    import re

    from gnnpar.training.progress import Progress

    monkeypatch.setattr(loop_module, "Progress", functools.partial(Progress, every_s=0.0))
    cfg = config(tmp_path, epochs=3)
    cfg.run.quiet = False
    train(cfg, make_plan(Batches(3, steps=4)))
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "\n".join(lines)
    status = [x for x in lines if x.startswith("fake: step ")]
    epochs = [x for x in lines if x.startswith("epoch ")]
    assert len(status) == 12 and len(epochs) == 3
    assert re.match(
        r"fake: step 1/12 \(8%\), 0:00:0\d elapsed, ~0:00:\d\d left; epoch 1 ", status[0]
    )
    for e, line in enumerate(epochs, start=1):
        shown = re.search(r"loss (\d\.\d{4})", line)[1]
        before = lines[lines.index(line) - 1]  # the status after the epoch's last step
        assert before.startswith(f"fake: step {4 * e}/12 ") and f"epoch {e} loss {shown}" in before
    assert "val" not in epochs[0] and "test" not in epochs[1]
    assert re.match(r"epoch 3/3  loss \d\.\d{4}  val 0\.500  test 0\.250  ", epochs[2])
    assert re.fullmatch(r"fake: 12/12 steps in 0:00:0\d", lines[-1])
    # the losses are the epoch means the metrics record
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    means = [f"{r['loss']:.4f}" for r in records if r["event"] == "epoch"]
    assert means == [re.search(r"loss (\d\.\d{4})", x)[1] for x in epochs]


def test_plain_progress_lines_come_at_most_every_interval(capsys):
    from gnnpar.training.progress import Progress

    now = [100.0]
    with Progress(10, "run", terminal=False, every_s=30.0, clock=lambda: now[0]) as bar:
        for step in range(10):
            now[0] += 10.0  # 10 s a step: a line after steps 3, 6 and 9, then the closing one
            bar.update(1, f"epoch 1 loss 0.{step}000")
    assert capsys.readouterr().out.splitlines() == [
        "run: step 3/10 (30%), 0:00:30 elapsed, ~0:01:10 left; epoch 1 loss 0.2000",
        "run: step 6/10 (60%), 0:01:00 elapsed, ~0:00:40 left; epoch 1 loss 0.5000",
        "run: step 9/10 (90%), 0:01:30 elapsed, ~0:00:10 left; epoch 1 loss 0.8000",
        "run: 10/10 steps in 0:01:40",
    ]


def test_a_quiet_run_shows_nothing(capsys):
    from gnnpar.training.progress import Progress

    with Progress(5, "run", enabled=False, terminal=False, every_s=0.0) as bar:
        bar.update(5, "epoch 1 loss 1.0000")
        bar.log("epoch 1/1")
    assert capsys.readouterr().out == ""


def test_the_pools_count_reaches_its_total_when_the_others_took_the_last():
    """Gossip's work pool: this rank's last take was position 5 of 8; once the pool is empty
    the display counts all 8 (the other ranks trained the rest), not 6."""
    from gnnpar.training.sources import PoolSource

    class Pool:
        total = 8

        def __init__(self) -> None:
            self.items = [(1, 0, 1), (3, 0, 3), (5, 1, 1)]

        def take(self):
            return self.items.pop(0) if self.items else None

    source = PoolSource(Pool(), batches=["b0", "b1", "b2", "b3"])
    assert list(source.epoch(0)) == ["b1", "b3"] and source.position == 4
    assert list(source.epoch(1)) == ["b1"] and source.position == 8
