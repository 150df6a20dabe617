"""gnnpar.lightning under real Lightning ``Trainer`` runs with 2 gloo processes (slow lane).

One pair of rank processes runs every scenario (tests/lightning/lit_ranks.py: Lightning is slow
to import); the tests read what each rank saw. The model is gnnpar's study-002 GraphSAGE (2 x 16)
with gnnpar's Adam and seed loss on Cora, batch 16, fan-outs 5,5: 70 training nodes per rank,
5 steps per epoch, 2 epochs.

Tolerances: none is needed. Lightning's DDP computes what ``gnnpar train --strategy sampled``
computes, bit for bit (the same batches, the same DDP all-reduce, the same Adam; Lightning zeroes
the gradients before the step's forward where gnnpar's loop does too). The one order of operations
that differs is where a DataLoader draws its base seed from torch's global generator (which also
seeds dropout masks): gnnpar's one loader pass draws once, after the model's initialisation;
Lightning builds an iterator per epoch. GraphDataModule's loaders draw from a generator of their
own, and the test module makes gnnpar's one draw itself (lit_ranks.py). The one-rank reference
of the DDP-equality test sums the two ranks' losses in one backward, where DDP averages two
backwards' gradients: that differs in the last bits, hence its 1e-6.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT, run_cli

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("lit_ranks.py")
STEPS, EPOCHS, TRAIN = 5, 2, 140


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lightning-ranks")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=str(out),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


def load(out: Path, name: str, rank: int) -> dict:
    return torch.load(out / f"{name}-rank{rank}.pt", weights_only=False)


def seeds_by_epoch(run: dict) -> dict[int, list[torch.Tensor]]:
    by: dict[int, list[torch.Tensor]] = {}
    for s in run["steps"]:
        by.setdefault(s["epoch"], []).append(s["seeds"])
    return by


def test_every_training_node_once_per_epoch_across_the_ranks(runs):
    ranks = [seeds_by_epoch(load(runs, "plain", r)) for r in (0, 1)]
    firsts = []
    for epoch in range(EPOCHS):
        mine = [torch.cat(r[epoch]) for r in ranks]
        assert [len(r[epoch]) for r in ranks] == [STEPS, STEPS]  # the same steps on every rank
        both = torch.cat(mine)
        assert both.numel() == TRAIN and both.unique().numel() == TRAIN  # none twice, none left
        firsts.append(mine[0][:16])
    assert not torch.equal(firsts[0], firsts[1])  # set_epoch: a new seeded shuffle per epoch


def _reference_final(run0: dict, run1: dict) -> dict[str, torch.Tensor]:
    """One process, one model: each step's loss is the mean over the joined batch of both ranks
    (equal halves: the mean of the two ranks' means), one backward, Adam."""
    from lit_ranks_config import config
    from torch_geometric.data import Data

    from gnnpar.data.datasets import load_dataset
    from gnnpar.models import build_model
    from gnnpar.training.losses import seed_loss
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.seeding import seed_everything

    cfg = config(0.0)
    ds = load_dataset("cora", cfg.data.data_root)
    seed_everything(0)
    model = build_model(cfg.model, ds.num_features, ds.num_classes, False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, run0["initial"][k])  # the same initial weights
    opt = build_optimizer(cfg, model.parameters())

    def batch(b: dict) -> Data:
        return Data(
            x=ds.data.x[b["n_id"]],
            edge_index=b["edge_index"],
            y=b["y"][: b["bs"]],
            n_id=b["n_id"],
            batch_size=b["bs"],
            num_sampled_nodes=b["nodes"],
            num_sampled_edges=b["edges"],
        )

    for s0, s1 in zip(run0["steps"], run1["steps"], strict=True):
        assert s0["batch"]["bs"] == s1["batch"]["bs"]
        opt.zero_grad()
        loss = 0.5 * (seed_loss(model, batch(s0["batch"]), False))
        loss = loss + 0.5 * seed_loss(model, batch(s1["batch"]), False)
        loss.backward()
        opt.step()
    return model.state_dict()


def test_ddp_equals_one_rank_on_the_joined_batch(runs):
    run0, run1 = load(runs, "plain", 0), load(runs, "plain", 1)
    ref = _reference_final(run0, run1)
    for k, v in ref.items():
        assert torch.equal(run0["final"][k], run1["final"][k])  # DDP keeps the ranks equal
        torch.testing.assert_close(run0["final"][k], v, rtol=0, atol=1e-6)
    assert not torch.equal(run0["final"][k], run0["initial"][k])  # it trained


def test_resume_mid_epoch_equals_the_uninterrupted_run(runs):
    for rank in (0, 1):
        plain, resumed = load(runs, "plain", rank), load(runs, "resumed", rank)
        # the checkpoint was written after step 3 of epoch 0: the rest of epoch 0, then epoch 1
        assert [s["epoch"] for s in resumed["steps"]] == [0, 0] + [1] * STEPS
        for a, b in zip(plain["steps"][3:], resumed["steps"], strict=True):
            assert torch.equal(a["seeds"], b["seeds"]) and a["loss"] == b["loss"]
        for k, v in plain["final"].items():
            assert torch.equal(v, resumed["final"][k])


def test_loader_workers_give_the_same_run_and_resume_mid_epoch(runs):
    """One forkserver loader worker per rank (batches handed to the loop by a thread that takes
    them ahead): the same batches, losses and weights as sampling in the training process, and
    a checkpoint written while the worker and the thread were ahead of the loop resumes the rest
    of the epoch exactly."""
    for rank in (0, 1):
        plain, workers = load(runs, "plain", rank), load(runs, "workers", rank)
        resumed = load(runs, "workers-resumed", rank)
        assert len(workers["steps"]) == EPOCHS * STEPS
        for a, b in zip(plain["steps"], workers["steps"], strict=True):
            assert torch.equal(a["seeds"], b["seeds"]) and a["loss"] == b["loss"]
        assert [s["epoch"] for s in resumed["steps"]] == [0, 0] + [1] * STEPS
        for a, b in zip(plain["steps"][3:], resumed["steps"], strict=True):
            assert torch.equal(a["seeds"], b["seeds"]) and a["loss"] == b["loss"]
        for k, v in plain["final"].items():
            assert torch.equal(v, workers["final"][k]) and torch.equal(v, resumed["final"][k])


def test_step_checkpoints_under_gossip_are_refused_on_every_rank(runs):
    for rank in (0, 1):
        refused = load(runs, "refused", rank)
        assert refused["steps"] == 0
        assert refused["message"].startswith(
            "ModelCheckpoint(every_n_train_steps=2) cannot run under GossipStrategy"
        )


def test_periodic_average_strategy(runs):
    for rank in (0, 1):  # gradients averaged every step: DDP's maths, bit for bit here
        ddp, grads = load(runs, "plain", rank), load(runs, "grads1", rank)
        assert [s["loss"] for s in grads["steps"]] == [s["loss"] for s in ddp["steps"]]
        for k, v in ddp["final"].items():
            assert torch.equal(grads["final"][k], v)
    # parameters every 2 steps: 10 steps, 5 averagings, the last one after the last step
    p0, p1 = load(runs, "params2", 0), load(runs, "params2", 1)
    assert p0["exchanges"] == p1["exchanges"] == 5
    for k, v in p0["final"].items():
        assert torch.equal(v, p1["final"][k])
    assert p0["steps"][1]["loss"] != load(runs, "plain", 0)["steps"][1]["loss"]  # local steps


def test_periodic_average_resumed_mid_epoch_equals_the_uninterrupted_run(runs):
    """Parameters averaged every 2 steps, resumed from the checkpoint after step 3: between
    averagings the ranks' models differ, and each rank resumes with its own."""
    at3 = [load(runs, "params2", r)["saves"][2] for r in (0, 1)]
    assert at3[0]["global_step"] == 3
    assert any(not torch.equal(v, at3[1]["model"][k]) for k, v in at3[0]["model"].items())
    for rank in (0, 1):
        plain, resumed = load(runs, "params2", rank), load(runs, "params2-resumed", rank)
        start = resumed["resumed_from"]
        for part in ("model", "adam"):
            assert all(torch.equal(v, start[part][k]) for k, v in at3[rank][part].items())
        assert [s["epoch"] for s in resumed["steps"]] == [0, 0] + [1] * STEPS
        for a, b in zip(plain["steps"][3:], resumed["steps"], strict=True):
            assert torch.equal(a["seeds"], b["seeds"]) and a["loss"] == b["loss"]
        for k, v in plain["final"].items():
            assert torch.equal(v, resumed["final"][k])
        assert resumed["exchanges"] == plain["exchanges"] == 5  # the averaging step went on


def test_gossip_resumed_mid_epoch_trains_every_batch_once_from_each_ranks_own_state(runs):
    """Gossip ranks are never in step and take what they are fast enough to take, so two runs
    never train the same batches on the same rank: what a resumed run must equal is the
    uninterrupted run's state at the checkpoint (each rank's own model, optimiser, step and
    exchange count) and its work (every batch of every epoch once, across the interruption)."""
    runs_ = [load(runs, "gossip", r) for r in (0, 1)]
    resumed = [load(runs, "gossip-resumed", r) for r in (0, 1)]
    saved, index = runs_[0]["saved"], resumed[0]["index"]
    positions = [int(f.rsplit("=", 1)[1].removesuffix(".ckpt")) for f in saved]
    size = -(-TRAIN // 16)
    # checkpoint_every=4: one checkpoint each time the pool passed the next multiple of 4
    nexts = [4] + [4 * (p // 4 + 1) for p in positions[:-1]]
    assert all(p >= m for p, m in zip(positions, nexts, strict=True))
    assert size < positions[index] < 2 * size - 1  # written in the middle of epoch 1
    for rank in (0, 1):
        at, start = runs_[rank]["saves"][index], resumed[rank]["resumed_from"]
        for part in ("model", "adam"):
            assert all(torch.equal(v, start[part][k]) for k, v in at[part].items())
        assert (start["global_step"], start["exchanges"]) == (at["global_step"], at["exchanges"])
        assert resumed[rank]["exchanges"] > at["exchanges"]  # and the exchanges went on
    for epoch in range(3):
        seeds = []
        for rank in (0, 1):
            before = runs_[rank]["steps"][: runs_[rank]["saves"][index]["trained"]]
            seeds += [s["seeds"] for s in before + resumed[rank]["steps"] if s["epoch"] == epoch]
        seeds = torch.cat(seeds)
        assert seeds.numel() == TRAIN and seeds.unique().numel() == TRAIN


def test_gossip_strategy_pool_gives_every_batch_once_per_epoch(runs):
    result = json.loads((runs / "gossip-run" / "result.json").read_text())
    size = -(-TRAIN // 16)  # the pool's batches per epoch: every training node once
    log = result["pool_log"]
    for epoch in range(3):
        taken = sorted(i for rank in log for e, i in rank if e == epoch)
        assert taken == list(range(size))
    for rank in (0, 1):  # each rank trained what it took, in the epochs it took them
        run = load(runs, "gossip", rank)
        assert len(run["steps"]) == len(log[rank]) == result["per_worker_batches"][rank]
        assert [s["epoch"] for s in run["steps"]] == [e for e, _ in log[rank]]
        assert run["exchanges"] >= 1
    assert result["per_worker_delay_s"][0] == 0.0 < result["per_worker_delay_s"][1]
    final0, final1 = load(runs, "gossip", 0)["final"], load(runs, "gossip", 1)["final"]
    assert all(torch.equal(v, final1[k]) for k, v in final0.items())  # final="average"
    assert result["strategy"] == "gossip" and result["slowdown"] == {"1": 3.0}
    assert result["framework"]["name"] == "lightning"
    # the gossip exchanges pair the two ranks: every exchange is logged on both sides
    ids = [sorted(x[2] for x in rank) for rank in result["exchange_log"]]
    assert ids[0] == ids[1] and len(ids[0]) == result["per_worker_exchanges"][0]


def test_same_loss_curve_as_gnnpar_train(runs, tmp_path):
    from lit_ranks_config import FLAGS

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    proc = run_cli("train", *flags, "--dropout", "0.5", "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    gnnpar_run = json.loads((tmp_path / "result.json").read_text())
    lightning_run = json.loads((runs / "ddp-run" / "result.json").read_text())
    assert lightning_run["loss_curve"] == gnnpar_run["loss_curve"]  # bit for bit
    # gnnpar's per-step records (rank 0) against rank 0's steps under Lightning
    steps = [
        json.loads(line)["loss"]
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "step"
    ]
    assert steps == [s["loss"] for s in load(runs, "ddp", 0)["steps"]]
    for key in ("dataset", "workers", "seed", "per_worker_batches", "score_name"):
        assert lightning_run[key] == gnnpar_run[key]
    assert lightning_run["strategy"] == "sampled"
    # every key a gnnpar run's result.json has, and `gnnpar advise --validate`'s reader takes it
    from gnnpar.advise.validate import _measured
    from gnnpar.result import CONTRACT

    assert set(CONTRACT) <= set(lightning_run)
    case = _measured({"predicted_epoch_s": 1.0}, [str(runs / "ddp-run")], 0, "")
    assert "failed" not in case and case["measured_epoch_s"] > 0
