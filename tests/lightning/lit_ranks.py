"""Real Lightning ``Trainer`` runs on 2 gloo ranks, for tests/lightning/test_lightning_ranks.py.

    python tests/lightning/lit_ranks.py OUT

Lightning's DDP launcher starts rank 1 by running this script again (LOCAL_RANK=1); both ranks
run the scenarios below in order and write what they saw to ``OUT/<scenario>-rank<R>.pt``. One
pair of processes for every scenario: Lightning is slow to import.

The model is gnnpar's own study-002 GraphSAGE (``gnnpar.models.build_model``, 2 x 16 here) with
gnnpar's optimiser and seed loss, so that the runs can be compared with ``gnnpar train`` and with
a one-process reference (the test recomputes them from the batches saved here).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lit_ranks_config import DATA, config

from gnnpar.errors import UsageError
from gnnpar.lightning import (
    GossipStrategy,
    GraphDataModule,
    PeriodicAverageStrategy,
    RunRecord,
    Slowdown,
)
from gnnpar.models import build_model
from gnnpar.training.losses import seed_loss
from gnnpar.training.optim import build_optimizer
from gnnpar.training.seeding import seed_everything


class GnnparSage(pl.LightningModule):
    """gnnpar's model, optimiser and loss as a LightningModule; records every step."""

    def __init__(self, dropout: float, in_dim: int, classes: int) -> None:
        super().__init__()
        cfg = config(dropout)
        seed_everything(cfg.run.seed)  # as gnnpar train, before the model's initialisation
        self.model = build_model(cfg.model, in_dim, classes, False)
        self.cfg = cfg
        self.initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        # gnnpar train's loader draws its base seed from the global generator once, after the
        # model's initialisation; GraphDataModule's loaders draw from their own generators
        torch.empty((), dtype=torch.int64).random_()
        self.steps: list[dict] = []
        self.saves: list[dict] = []  # this rank's state as each checkpoint wrote it
        self.resumed_from: dict | None = None  # this rank's state when a resumed fit starts

    def _state(self) -> dict:
        strategy = self.trainer.strategy
        opt = self.trainer.optimizers[0].state_dict()["state"]
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "adam": {k: v["exp_avg"].clone() for k, v in opt.items()},
            "exchanges": getattr(strategy, "exchanges", 0),
            "global_step": self.trainer.global_step,
        }

    def on_save_checkpoint(self, checkpoint) -> None:
        self.saves.append({**self._state(), "trained": len(self.steps)})

    def on_train_start(self) -> None:
        if self.trainer.ckpt_path is not None:
            self.resumed_from = self._state()

    def training_step(self, batch, batch_idx):
        bs = batch.batch_size
        seeds, y_all = batch.n_id[:bs].clone(), batch.y
        batch.y = batch.y[:bs]  # gnnpar's seed loss takes the seeds' labels
        loss = seed_loss(self.model, batch, multilabel=False)
        self.steps.append(
            {
                "epoch": self.current_epoch,
                "seeds": seeds,
                "loss": float(loss.detach()),
                "batch": {
                    "n_id": batch.n_id.clone(),
                    "edge_index": batch.edge_index.clone(),
                    "y": y_all.clone(),
                    "bs": bs,
                    "nodes": batch.num_sampled_nodes,
                    "edges": batch.num_sampled_edges,
                },
            }
        )
        return loss

    def validation_step(self, batch, batch_idx):
        out = self.model(batch.x, batch.edge_index)[: batch.batch_size]
        acc = (out.argmax(-1) == batch.y[: batch.batch_size]).float().mean()
        self.log("val_acc", acc, batch_size=batch.batch_size, sync_dist=True)

    def configure_optimizers(self):
        return build_optimizer(self.cfg, self.model.parameters())


def trainer(out: Path, strategy="ddp", epochs: int = 2, **kwargs) -> pl.Trainer:
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=str(out),
        **kwargs,
    )


def save(out: Path, name: str, t: pl.Trainer, module: GnnparSage, **extra) -> None:
    torch.save(
        {
            "steps": module.steps,
            "initial": module.initial,
            "final": {k: v.clone() for k, v in module.model.state_dict().items()},
            "saves": module.saves,
            "resumed_from": module.resumed_from,
            **extra,
        },
        out / f"{name}-rank{t.global_rank}.pt",
    )


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dm = GraphDataModule(dataset="cora", **DATA)
    dims = (dm.num_features, dm.num_classes)

    # 1. Lightning's DDP with dropout, recorded by RunRecord (compared with gnnpar train)
    m = GnnparSage(0.5, *dims)
    t = trainer(out, callbacks=[RunRecord(out / "ddp-run", model="sage")])
    t.fit(m, datamodule=dm)
    save(out, "ddp", t, m)

    # 2. without dropout: uninterrupted, a checkpoint after every step (resume: scenario 3)
    m = GnnparSage(0.0, *dims)
    ckpt = ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=1, save_top_k=-1)
    t = trainer(out, callbacks=[ckpt], enable_checkpointing=True)
    t.fit(m, datamodule=dm)
    save(out, "plain", t, m)

    # 3. resumed from the checkpoint written after step 3 (mid epoch 0)
    m = GnnparSage(0.0, *dims)
    t = trainer(out)
    t.fit(m, datamodule=dm, ckpt_path=str(out / "ckpt" / "epoch=0-step=3.ckpt"))
    save(out, "resumed", t, m)

    # 3b. scenarios 2 and 3 with one loader worker per rank (forked workers, the hand-off
    # thread): a checkpoint after every step, then resumed from the one after step 3
    workers_dm = GraphDataModule(dataset="cora", loader_workers=1, **DATA)
    m = GnnparSage(0.0, *dims)
    ckpt = ModelCheckpoint(dirpath=out / "ckpt-workers", every_n_train_steps=1, save_top_k=-1)
    t = trainer(out, callbacks=[ckpt], enable_checkpointing=True)
    t.fit(m, datamodule=workers_dm)
    save(out, "workers", t, m)
    m = GnnparSage(0.0, *dims)
    t = trainer(out)
    t.fit(m, datamodule=workers_dm, ckpt_path=str(out / "ckpt-workers" / "epoch=0-step=3.ckpt"))
    save(out, "workers-resumed", t, m)

    # 4. gnnpar's periodic all-reduce of gradients every step (DDP's maths), and of parameters
    # every 2 steps (local SGD)
    m = GnnparSage(0.0, *dims)
    t = trainer(out, PeriodicAverageStrategy(sync_every=1, average="grads"))
    t.fit(m, datamodule=dm)
    save(out, "grads1", t, m)
    # (a checkpoint after every step), and resumed after step 3: the ranks' models differ there
    m = GnnparSage(0.0, *dims)
    ckpt = ModelCheckpoint(dirpath=out / "ckpt-params2", every_n_train_steps=1, save_top_k=-1)
    strategy = PeriodicAverageStrategy(sync_every=2, average="params")
    t = trainer(out, strategy, callbacks=[ckpt], enable_checkpointing=True)
    t.fit(m, datamodule=dm)
    save(out, "params2", t, m, exchanges=t.strategy.exchanges)
    m = GnnparSage(0.0, *dims)
    t = trainer(out, PeriodicAverageStrategy(sync_every=2, average="params"))
    t.fit(m, datamodule=dm, ckpt_path=str(out / "ckpt-params2" / "epoch=0-step=3.ckpt"))
    save(out, "params2-resumed", t, m, exchanges=t.strategy.exchanges)

    # 5. gossip over the work pool, rank 1 three times slower, recorded by RunRecord, a
    # checkpoint every 4 batches of the pool; then resumed from one written mid epoch 1
    m = GnnparSage(0.5, *dims)
    run = out / "gossip-run"
    callbacks = [Slowdown({1: 3.0}), RunRecord(run, model="sage")]
    strategy = GossipStrategy(sync_every=1, checkpoint_every=4, checkpoint_dir=out / "ckpt-gossip")
    t = trainer(out, strategy, epochs=3, callbacks=callbacks)
    t.fit(m, datamodule=dm)
    saved = t.strategy.saved
    save(out, "gossip", t, m, exchanges=t.strategy.exchanges, pool=t.strategy.pools, saved=saved)
    size = t.strategy.pool.size
    mid = [i for i, f in enumerate(saved) if size < int(f.split("=")[-1][:-5]) < 2 * size - 1]
    m = GnnparSage(0.5, *dims)
    strategy = GossipStrategy(sync_every=1, checkpoint_every=4, checkpoint_dir=out / "ckpt-g2")
    t = trainer(out, strategy, epochs=3, callbacks=[Slowdown({1: 3.0})])
    t.fit(m, datamodule=dm, ckpt_path=saved[mid[0]])
    save(out, "gossip-resumed", t, m, exchanges=t.strategy.exchanges, index=mid[0])

    # 6. ModelCheckpoint by steps under gossip: refused before the fit trains anything
    m = GnnparSage(0.0, *dims)
    ckpt = ModelCheckpoint(dirpath=out / "ckpt-refused", every_n_train_steps=2)
    t = trainer(out, GossipStrategy(), callbacks=[ckpt], enable_checkpointing=True)
    try:
        t.fit(m, datamodule=dm)
        message = None
    except UsageError as e:
        message = str(e)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.save({"message": message, "steps": len(m.steps)}, out / f"refused-rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
