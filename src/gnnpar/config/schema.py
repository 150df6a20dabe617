"""The settings of a run as one dataclass tree, and the fixed choices some settings allow.

Plain data: nothing here reads a file, fills a default or checks a value (that is
:mod:`gnnpar.config.parse` and :mod:`gnnpar.configure`), and nothing imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

PARTITIONERS = ("random", "metis")
AVERAGE_MODES = ("grads", "params")
MICROBATCH_MODES = ("exact", "index")
SCHEDULES = ("gpipe", "1f1b")
OPTIMIZERS = ("adam", "sgd")
DATASET_KINDS = ("graph", "image")
PRECISIONS = ("fp32", "bf16")  # --precision; gnnpar.training.precision applies it
EVAL_MODES = ("auto", "layerwise", "sampled")  # --eval-mode; gnnpar.training.evaluation
SEED_DEALS = ("global", "local")  # --seeds; gnnpar.data.sampling.distributed.local_epoch_seeds


@dataclass
class DataConfig:
    dataset: str = "cora"
    data_root: str | None = None  # None: $GNNPAR_DATA or the XDG cache directory
    scale: float = 1.0  # synthetic datasets only: shrink nodes and edges by this factor
    partitions: int | None = None  # Cluster-GCN mini-batches; None = full batch
    partitioner: str = "random"


@dataclass
class ModelConfig:
    name: str = "gat"
    hidden: int | None = None  # None: the model's study default
    layers: int | None = None
    heads: int | None = None
    dropout: float | None = None
    recompute: bool = False  # vig: keep only block inputs, recompute the rest in backward
    # a user's model (--model module:function or pyg:NAME; gnnpar.models.user)
    args: dict[str, Any] = field(default_factory=dict)  # --model-args: its keyword arguments
    split_at: list[str] | None = None  # --split-at: submodule names where pipelines cut it
    hops: int | None = None  # --hops: its receptive field, where it cannot be counted
    weights: str | None = None  # gnnpar.fit(model=instance): its initial weights (a .pt file)


@dataclass
class StrategyConfig:
    name: str = "sequential"
    workers: int = 1
    sync_every: int = 1
    average: str | None = None  # None: the strategy's default (its spec's defaults(), resolve())
    slowdown: dict[int, float] = field(default_factory=dict)
    jitter: float = 0.0
    stages: int = 2
    chunks: int = 4
    balance: list[int] | None = None
    microbatch: str = "exact"
    replicas: int = 1
    schedule: str = "gpipe"
    fanouts: list[int] | None = None
    batch_size: int | None = None
    loader_workers: int = 0
    # a prepared graph's hottest feature rows kept in shared memory: bytes ("512M", "2G") or a
    # fraction of the feature array ("0.25"); None: sized from the memory the run may use
    feature_cache: str | None = None
    timeout_s: float = 120.0  # any wait on another process ends with an error after this
    eval_mode: str = "auto"  # a graph's final evaluation: auto, layerwise or sampled
    # sampled training across shards: the seeds dealt as one host deals them (global) or each
    # host's ranks given its own shard's training nodes (local)
    seeds: str = "global"


@dataclass
class OptimConfig:
    optimizer: str | None = None
    lr: float | None = None
    weight_decay: float | None = None


@dataclass
class RunConfig:
    epochs: int | None = None
    seed: int = 0
    out: str | None = None
    quiet: bool = False
    tensorboard: bool = False  # also write TensorBoard event files to <out>/tensorboard/
    eval_every: int = 1  # evaluate on val/test every N epochs (0: only at the end)
    max_steps: int | None = None  # cap on training steps per epoch (benchmarks)
    threads: int | None = None  # torch intra-op threads per process; None: cores / local ranks
    checkpoint_every: int = 0  # epochs between checkpoints (0: none)
    checkpoint_every_steps: int = 0  # steps between checkpoints (0: none)
    resume: bool = False  # continue from the newest good checkpoint in --out
    max_restarts: int = 0  # the elastic agent restarts failed ranks this often (they resume)
    precision: str = "fp32"  # bf16: forward passes under autocast, fp32 weights (precision.py)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        cfg = cls()
        for section, values in d.items():
            sub = getattr(cfg, section)
            for k, v in values.items():
                if k == "slowdown" and isinstance(v, dict):
                    v = {int(r): float(f) for r, f in v.items()}
                setattr(sub, k, v)
        return cfg
