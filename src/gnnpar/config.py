"""One dataclass tree for every setting of a run, loaded from TOML and command-line flags.

The TOML file (``--config FILE.toml``) uses the same keys as the flags, flat, with either dashes
or underscores (``sync-every = 20`` or ``sync_every = 20``). Flags win over the file; settings
left unset get model- and dataset-specific defaults in :func:`resolve` (e.g. study 001's GAT uses
Adam lr 0.005 and weight decay 5e-4; study 003's Cluster-GCN uses lr 0.01, 30 epochs).
:func:`validate` checks every value once and raises :class:`gnnpar.UsageError` with a message that
says what was wrong and what to do; the CLI turns that into exit status 2.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from gnnpar import UsageError

MODELS = ("gcn", "gat", "gat3", "sage", "vig")
STRATEGY_NAMES = (
    "sequential",
    "allreduce",
    "gossip",
    "gossip-bipartite",
    "pipeline",
    "hybrid",
    "sampled",
)
PARTITIONERS = ("random", "metis")
AVERAGE_MODES = ("grads", "params")
MICROBATCH_MODES = ("exact", "index")
SCHEDULES = ("gpipe", "1f1b")
OPTIMIZERS = ("adam", "sgd")


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


@dataclass
class StrategyConfig:
    name: str = "sequential"
    workers: int = 1
    sync_every: int = 1
    average: str = "grads"
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
    timeout_s: float = 120.0  # any wait on another process ends with an error after this


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
    eval_every: int = 1  # evaluate on val/test every N epochs (0: only at the end)
    max_steps: int | None = None  # cap on training steps per epoch (benchmarks)
    threads: int | None = None  # torch intra-op threads per process; None: cores / local ranks


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


# flag / TOML key -> (section, field). One table, so the CLI, TOML and docs cannot drift apart.
KEYS: dict[str, tuple[str, str]] = {
    "dataset": ("data", "dataset"),
    "data-root": ("data", "data_root"),
    "scale": ("data", "scale"),
    "partitions": ("data", "partitions"),
    "partitioner": ("data", "partitioner"),
    "model": ("model", "name"),
    "hidden": ("model", "hidden"),
    "layers": ("model", "layers"),
    "heads": ("model", "heads"),
    "dropout": ("model", "dropout"),
    "strategy": ("strategy", "name"),
    "workers": ("strategy", "workers"),
    "sync-every": ("strategy", "sync_every"),
    "average": ("strategy", "average"),
    "slowdown": ("strategy", "slowdown"),
    "jitter": ("strategy", "jitter"),
    "stages": ("strategy", "stages"),
    "chunks": ("strategy", "chunks"),
    "balance": ("strategy", "balance"),
    "microbatch": ("strategy", "microbatch"),
    "replicas": ("strategy", "replicas"),
    "schedule": ("strategy", "schedule"),
    "fanouts": ("strategy", "fanouts"),
    "batch-size": ("strategy", "batch_size"),
    "loader-workers": ("strategy", "loader_workers"),
    "timeout": ("strategy", "timeout_s"),
    "optimizer": ("optim", "optimizer"),
    "lr": ("optim", "lr"),
    "weight-decay": ("optim", "weight_decay"),
    "epochs": ("run", "epochs"),
    "seed": ("run", "seed"),
    "out": ("run", "out"),
    "quiet": ("run", "quiet"),
    "eval-every": ("run", "eval_every"),
    "max-steps": ("run", "max_steps"),
    "threads": ("run", "threads"),
}


def parse_int_list(text: str | list, what: str) -> list[int]:
    """'25,10,10' -> [25, 10, 10]; a TOML list passes through. -1 is allowed (full fan-out)."""
    if isinstance(text, list):
        items = text
    else:
        items = [t for t in str(text).replace(" ", "").split(",") if t]
    try:
        return [int(t) for t in items]
    except (TypeError, ValueError):
        raise UsageError(
            f"--{what} expects comma-separated integers such as 4,4, got {text!r}."
        ) from None


def parse_slowdown(text: str | dict) -> dict[int, float]:
    """'1=3' or '1=3,2=1.5' -> {1: 3.0, 2: 1.5}."""
    if isinstance(text, dict):
        items = [f"{k}={v}" for k, v in text.items()]
    else:
        items = [t for t in str(text).replace(" ", "").split(",") if t]
    out: dict[int, float] = {}
    for item in items:
        rank, sep, factor = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(rank)] = float(factor)
        except ValueError:
            raise UsageError(
                f"--slowdown expects RANK=FACTOR[,RANK=FACTOR], e.g. 1=3, got {item!r}."
            ) from None
    return out


def _coerce(key: str, value: Any, current: Any) -> Any:
    if value is None:
        return None
    if key in ("balance", "fanouts"):
        return parse_int_list(value, key)
    if key == "slowdown":
        return parse_slowdown(value)
    if key == "quiet":
        if isinstance(value, bool):
            return value
        raise UsageError(f"'quiet' must be true or false, got {value!r}.")
    types = {
        "scale": float,
        "jitter": float,
        "lr": float,
        "weight-decay": float,
        "dropout": float,
        "timeout": float,
    }
    ints = {
        "partitions",
        "hidden",
        "layers",
        "heads",
        "workers",
        "sync-every",
        "stages",
        "chunks",
        "replicas",
        "batch-size",
        "loader-workers",
        "epochs",
        "seed",
        "eval-every",
        "max-steps",
        "threads",
    }
    try:
        if key in types:
            if isinstance(value, bool):
                raise ValueError
            return types[key](value)
        if key in ints:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
    except (TypeError, ValueError):
        kind = "a number" if key in types else "an integer"
        raise UsageError(f"'{key}' must be {kind}, got {value!r}.") from None
    return str(value)


def apply(cfg: Config, settings: dict[str, Any], source: str) -> None:
    """Set flag-named keys on cfg; unknown keys are an error that names the source."""
    for raw_key, value in settings.items():
        key = raw_key.replace("_", "-")
        if key not in KEYS:
            close = [k for k in KEYS if k.startswith(key[:3])]
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise UsageError(
                f"Unknown setting '{raw_key}' in {source}.{hint} "
                f"Known settings: {', '.join(sorted(KEYS))}."
            )
        section, name = KEYS[key]
        setattr(getattr(cfg, section), name, _coerce(key, value, None))


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(
            f"Config file {p} does not exist. Pass --config with a path to a TOML file."
        )
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"Config file {p} is not valid TOML: {e}.") from None
    # Accept sections that match the dataclass tree as well ([strategy] sync-every = 20); inside
    # one, field names work too ([model] name = "gcn", since a top-level model key would clash).
    by_field = {(section, name): key for key, (section, name) in KEYS.items()}
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and k in ("data", "model", "strategy", "optim", "run"):
            flat.update({by_field.get((k, f.replace("-", "_")), f): x for f, x in v.items()})
        else:
            flat[k] = v
    return flat


def build_config(file: str | None, flags: dict[str, Any]) -> Config:
    """TOML file first, then flags that were given on the command line; then resolve and validate."""
    cfg = Config()
    if file:
        apply(cfg, load_toml(file), f"config file {file}")
    apply(cfg, {k: v for k, v in flags.items() if v is not None}, "the command line")
    resolve(cfg)
    validate(cfg)
    return cfg


def default_data_root() -> Path:
    env = os.environ.get("GNNPAR_DATA")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "gnnpar"


def resolve(cfg: Config) -> None:
    """Fill settings left unset with the defaults of the study the model comes from."""
    m, o, r, s, d = cfg.model, cfg.optim, cfg.run, cfg.strategy, cfg.data
    if d.data_root is None:
        d.data_root = str(default_data_root())
    big = d.dataset in ("reddit", "amazon", "synthetic-reddit", "synthetic-amazon")
    amazon = d.dataset in ("amazon", "synthetic-amazon")
    defaults: dict[str, dict[str, Any]] = {
        # study 001: GAT 8x8, dropout 0.6, Adam lr 0.005, wd 5e-4, 300 epochs
        "gat": dict(hidden=8, layers=2, heads=8, dropout=0.6, lr=0.005, wd=5e-4, epochs=300),
        # study 002: 3 layers x 16, 1 head, dropout 0.6, Adam lr 5e-3, wd 5e-4
        "gat3": dict(hidden=16, layers=3, heads=1, dropout=0.6, lr=5e-3, wd=5e-4, epochs=20),
        # Kipf & Welling: 16 hidden, dropout 0.5, lr 0.01, wd 5e-4, 200 epochs
        "gcn": dict(hidden=16, layers=2, heads=1, dropout=0.5, lr=0.01, wd=5e-4, epochs=200),
        # study 002: 3 x 256 dropout 0.5; study 003: 2 hidden layers (3 convs) 128/512, lr 1e-2
        "sage": dict(hidden=256, layers=3, heads=1, dropout=0.5, lr=5e-3, wd=5e-4, epochs=20),
        # study 000: 8 ViG blocks of C = 107 channels (138K parameters each, see models/vig.py);
        # the study trains with Adam (accuracy was not its focus)
        "vig": dict(hidden=107, layers=8, heads=1, dropout=0.0, lr=1e-3, wd=0.0, epochs=1),
    }.get(m.name, {})
    # study 003 table 3.3 (Cluster-GCN on Reddit / Amazon)
    study003 = dict(
        hidden=512 if amazon else 128, dropout=0.1 if amazon else 0.2, lr=1e-2, wd=0.0, epochs=30
    )
    if m.name == "sage" and big and s.name != "sampled":  # sampled: study 002's table 1
        defaults.update(study003)
    if m.name == "gcn" and big:
        defaults.update(study003, layers=3)
    if m.hidden is None:
        m.hidden = defaults.get("hidden", 64)
    if m.layers is None:
        m.layers = defaults.get("layers", 2)
    if m.heads is None:
        m.heads = defaults.get("heads", 1)
    if m.dropout is None:
        m.dropout = defaults.get("dropout", 0.5)
    if o.optimizer is None:
        o.optimizer = "adam"
    if o.lr is None:
        o.lr = defaults.get("lr", 0.01)
    if o.weight_decay is None:
        o.weight_decay = defaults.get("wd", 0.0)
    if r.epochs is None:
        r.epochs = defaults.get("epochs", 100)
    if s.fanouts is None and s.name == "sampled":
        s.fanouts = [25, 10, 10][: m.layers] + [10] * max(0, m.layers - 3)
    if s.batch_size is None:
        s.batch_size = 32 if m.name == "vig" else 1024


def validate(cfg: Config) -> None:
    """Every check that needs no data. Data-dependent checks live next to the data."""
    d, m, s, o, r = cfg.data, cfg.model, cfg.strategy, cfg.optim, cfg.run

    def bad(msg: str) -> None:
        raise UsageError(msg)

    def one_of(value: str, allowed: tuple[str, ...], flag: str) -> None:
        if value not in allowed:
            bad(f"Unknown {flag} '{value}'. Choose one of: {', '.join(allowed)}.")

    from gnnpar.data.datasets import REGISTRY  # local: config must not import torch at load

    one_of(d.dataset, tuple(REGISTRY), "--dataset")
    one_of(m.name, MODELS, "--model")
    one_of(s.name, STRATEGY_NAMES, "--strategy")
    one_of(d.partitioner, PARTITIONERS, "--partitioner")
    one_of(s.average, AVERAGE_MODES, "--average (what is averaged)")
    one_of(s.microbatch, MICROBATCH_MODES, "--microbatch")
    one_of(s.schedule, SCHEDULES, "--schedule")
    one_of(o.optimizer, OPTIMIZERS, "--optimizer")
    image = REGISTRY[d.dataset].kind == "image"
    if image and m.name != "vig":
        bad(f"Dataset '{d.dataset}' holds images; only --model vig trains on it.")
    if not image and m.name == "vig":
        bad(f"--model vig needs an image dataset (cifar10, synthetic-cifar10), not '{d.dataset}'.")
    if not 0 < d.scale <= 1:
        bad(f"--scale must be in (0, 1], got {d.scale}.")
    if d.partitions is not None and d.partitions < 1:
        bad(f"--partitions must be at least 1, got {d.partitions}.")
    for name, v in (("--hidden", m.hidden), ("--layers", m.layers), ("--heads", m.heads)):
        if v < 1:
            bad(f"{name} must be at least 1, got {v}.")
    if not 0 <= m.dropout < 1:
        bad(f"--dropout must be in [0, 1), got {m.dropout}.")
    if s.workers < 1:
        bad(f"--workers must be at least 1, got {s.workers}.")
    if s.sync_every < 1:
        bad(f"--sync-every must be at least 1 (average every K steps), got {s.sync_every}.")
    for rank, factor in s.slowdown.items():
        if rank < 0 or factor < 1:
            bad(
                f"--slowdown {rank}={factor}: ranks are >= 0 and factors >= 1 (3 = three times slower)."
            )
    if s.jitter < 0:
        bad(f"--jitter must be >= 0, got {s.jitter}.")
    if s.stages < 1 or s.chunks < 1 or s.replicas < 1:
        bad("--stages, --chunks and --replicas must each be at least 1.")
    if s.balance is not None and any(b < 1 for b in s.balance):
        bad(f"--balance entries must each be at least 1 block, got {s.balance}.")
    if s.fanouts is not None and any(f == 0 or f < -1 for f in s.fanouts):
        bad(f"--fanouts entries must be positive, or -1 for all neighbours, got {s.fanouts}.")
    if s.batch_size < 1:
        bad(f"--batch-size must be at least 1, got {s.batch_size}.")
    if s.loader_workers < 0:
        bad(f"--loader-workers must be >= 0, got {s.loader_workers}.")
    if s.timeout_s <= 0:
        bad(f"--timeout must be positive seconds, got {s.timeout_s}.")
    if o.lr <= 0:
        bad(f"--lr must be positive, got {o.lr}.")
    if o.weight_decay < 0:
        bad(f"--weight-decay must be >= 0, got {o.weight_decay}.")
    if r.epochs < 1:
        bad(f"--epochs must be at least 1, got {r.epochs}.")
    if r.eval_every < 0:
        bad(f"--eval-every must be >= 0, got {r.eval_every}.")
    if r.max_steps is not None and r.max_steps < 1:
        bad(f"--max-steps must be at least 1, got {r.max_steps}.")
    if r.threads is not None and r.threads < 1:
        bad(f"--threads must be at least 1, got {r.threads}.")
    from gnnpar.strategies import STRATEGIES

    check = getattr(STRATEGIES[s.name], "validate_config", None)
    if check is not None:
        check(cfg)
