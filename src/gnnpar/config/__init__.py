"""One dataclass tree for every setting of a run, loaded from TOML and command-line flags.

The TOML file (``--config FILE.toml``) uses the same keys as the flags, flat, with either dashes
or underscores (``sync-every = 20`` or ``sync_every = 20``). Flags win over the file; settings
left unset get model- and dataset-specific defaults in :func:`resolve` (the study presets of
:mod:`gnnpar.models.presets`, e.g. study 001's GAT uses Adam lr 0.005 and weight decay 5e-4).
Values are converted to the types of the dataclass fields (:func:`coerce`). :func:`validate`
checks every value once and raises :class:`gnnpar.UsageError` with a message that says what was
wrong and what to do; the CLI turns that into exit status 2. A setting the user gave that the
chosen strategy, model or dataset would not read is such an error too (:data:`USED_BY`).

Checks that belong to one strategy (e.g. allreduce needs ``--partitions``) live with the
strategy and are run by the training entry point: this module imports neither the strategies
nor, at import time, torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnnpar import UsageError
from gnnpar.models.presets import STUDY_DEFAULTS, study_defaults

MODELS = tuple(STUDY_DEFAULTS)  # gcn, gat, gat3, sage, vig (models/__init__.py builds them)
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
DATASET_KINDS = ("graph", "image")
PRECISIONS = ("fp32", "bf16")  # --precision; gnnpar.training.precision applies it


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


@dataclass
class StrategyConfig:
    name: str = "sequential"
    workers: int = 1
    sync_every: int = 1
    average: str | None = None  # None: resolve() picks what trains best (default_average)
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
    "recompute": ("model", "recompute"),
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
    "tensorboard": ("run", "tensorboard"),
    "eval-every": ("run", "eval_every"),
    "max-steps": ("run", "max_steps"),
    "threads": ("run", "threads"),
    "checkpoint-every": ("run", "checkpoint_every"),
    "checkpoint-every-steps": ("run", "checkpoint_every_steps"),
    "resume": ("run", "resume"),
    "max-restarts": ("run", "max_restarts"),
    "precision": ("run", "precision"),
}

SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "strategy": StrategyConfig,
    "optim": OptimConfig,
    "run": RunConfig,
}
# flag / TOML key -> the type of its dataclass field (int, float | None, list[int] | None, ...)
FIELD_TYPES: dict[str, Any] = {
    key: typing.get_type_hints(SECTIONS[section])[name] for key, (section, name) in KEYS.items()
}


# ---------------------------------------------------------------- which runs read which setting
@dataclass(frozen=True)
class Use:
    """Runs that read a setting: every listed strategy x model x dataset kind (all by default).

    ``generated``: only datasets gnnpar generates (synthetic-*); ``needs``: only when that other
    setting is set too (``--partitioner`` means nothing without ``--partitions``).
    """

    strategies: tuple[str, ...] = STRATEGY_NAMES
    models: tuple[str, ...] = MODELS
    kinds: tuple[str, ...] = DATASET_KINDS
    generated: bool = False
    needs: str | None = None


CLUSTER_GCN = ("sequential", "allreduce", "gossip", "gossip-bipartite")  # --partitions N
AVERAGING = ("allreduce", "gossip", "gossip-bipartite")  # --sync-every K --average MODE
STRAGGLERS = ("allreduce", "gossip", "gossip-bipartite", "sampled")  # gnnpar.training.straggler
PIPELINES = ("pipeline", "hybrid")

# A setting the user gives must be read by the run, or it is an error (exit 2) saying who reads
# it: a silently ignored flag makes a run look like it measured something it did not. Settings
# not listed here (dataset, model, strategy, workers, hidden, lr, epochs, seed, threads, ...) are
# read by every run. Several Use entries: read by any of them. Taken from what each strategy
# reads (src/gnnpar/strategies/): sequential partitions graphs only (its image loop ignores
# --partitions) and uses --batch-size for images only; allreduce and gossip train Cluster-GCN
# subgraphs of graphs; pipeline and hybrid plan graph micro-batches (--microbatch) but cut
# image batches evenly; sampled never averages periodically (DDP) but emulates stragglers.
USED_BY: dict[str, tuple[Use, ...]] = {
    "scale": (Use(generated=True),),
    "partitions": (Use(CLUSTER_GCN, kinds=("graph",)),),
    "partitioner": (Use(CLUSTER_GCN, kinds=("graph",), needs="partitions"),),
    "heads": (Use(models=("gat", "gat3")),),
    "recompute": (Use(models=("vig",), kinds=("image",)),),
    "sync-every": (Use(AVERAGING),),
    "average": (Use(AVERAGING),),
    "slowdown": (Use(STRAGGLERS),),
    "jitter": (Use(STRAGGLERS),),
    "stages": (Use(PIPELINES),),
    "chunks": (Use(PIPELINES),),
    "balance": (Use(PIPELINES),),
    "schedule": (Use(PIPELINES),),
    "microbatch": (Use(PIPELINES, kinds=("graph",)),),
    "replicas": (Use(("hybrid",)),),
    "fanouts": (Use(("sampled",)),),
    "loader-workers": (Use(("sampled",)),),
    "batch-size": (
        Use(("sampled",)),
        Use(("sequential", "pipeline", "hybrid"), kinds=("image",)),
    ),
    # gossip ranks reach no common step, only epoch ends (they take from a shared pool)
    "checkpoint-every-steps": (Use(("sequential", "allreduce", "pipeline", "hybrid", "sampled")),),
}
COMMON_KEYS = tuple(k for k in KEYS if k not in USED_BY)


def describe_use(use: Use) -> str:
    """'--strategy pipeline, hybrid with a graph dataset', for help texts and messages."""
    parts = []
    if use.strategies != STRATEGY_NAMES:
        parts.append(f"--strategy {', '.join(use.strategies)}")
    if use.models != MODELS:
        parts.append(f"--model {', '.join(use.models)}")
    if use.kinds != DATASET_KINDS:
        kinds = " or ".join(_a(k) for k in use.kinds)
        parts.append(f"with {kinds} dataset" if parts else f"{kinds} datasets")
    if use.generated:
        parts.append("with a synthetic-* dataset" if parts else "synthetic-* datasets")
    text = " ".join(parts) or "every run"
    if use.needs:
        text += f", together with --{use.needs}"
    return text


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def describe_uses(key: str) -> str:
    """Who reads ``key``: 'every run', or e.g. '--strategy sampled'."""
    uses = USED_BY.get(key)
    if uses is None:
        return "every run"
    return ", and by ".join(describe_use(u) for u in uses)


def _field(cfg: Config, key: str) -> tuple[Any, str]:
    section, name = KEYS[key]
    return getattr(cfg, section), name


def _missed(use: Use, cfg: Config, kind: str, generated: bool) -> list[tuple[str, str]]:
    """What of this run ``use`` does not cover, as (what, the user's choice); [] = it is read."""
    out = []
    if cfg.strategy.name not in use.strategies:
        out.append(("strategy", f"--strategy {cfg.strategy.name}"))
    if cfg.model.name not in use.models:
        out.append(("model", f"--model {cfg.model.name}"))
    if kind not in use.kinds:
        out.append(("dataset", f"--dataset {cfg.data.dataset} ({_a(kind)} dataset)"))
    elif use.generated and not generated:
        out.append(("dataset", f"--dataset {cfg.data.dataset} (not generated)"))
    if use.needs and getattr(*_field(cfg, use.needs)) is None:
        out.append(("needs", f"--{use.needs}"))
    return out


def check_used(cfg: Config, given: Mapping[str, str]) -> None:
    """Every setting in ``given`` (key -> where it was given) is read by this run, or UsageError.

    Needs a known --dataset, --model and --strategy (validate() checks those first).
    """
    from gnnpar.data.datasets import dataset_kind  # local: config must not import torch at load

    kind, generated = dataset_kind(cfg.data.dataset)  # a user's own graph: a graph, not generated
    for key, source in given.items():
        uses = USED_BY.get(key, ())
        missed = [_missed(u, cfg, kind, generated) for u in uses]
        if not uses or not all(missed):
            continue
        # the closest use; on a tie, one that keeps the user's strategy (blame the dataset)
        closest = min(missed, key=lambda m: (len(m), any(w == "strategy" for w, _ in m)))
        raise UsageError(_unused_message(key, source, closest))


def _unused_message(key: str, source: str, missed: list[tuple[str, str]]) -> str:
    where = "" if source == "the command line" else f" (set in {source})"
    choices = [(what, choice) for what, choice in missed if what != "needs"]
    if not choices:  # only the other setting is missing
        need = missed[0][1]
        return (
            f"--{key}{where} is only read together with {need}; without it the run would "
            f"ignore --{key}. Drop it, or also give {need}."
        )
    what = " and ".join(w for w, _ in choices)
    return (
        f"--{key}{where} is used by {describe_uses(key)} only; "
        f"{' with '.join(c for _, c in choices)} would ignore it. "
        f"Drop it, or choose a {what} that {'uses' if len(choices) == 1 else 'use'} it."
    )


# ---------------------------------------------------------------- parsing and type coercion
INT64 = (-(2**63), 2**63 - 1)
# Bounds of validate() beyond "positive" (absurd values that would overflow or never end)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 7 * 24 * 3600.0
MAX_SLOWDOWN = 1000.0  # --slowdown factors and --jitter: a 1000x slower step is a stall already
FLOAT32_MAX = 3.4028234663852886e38
MAX_WIDTH = 2**24  # --hidden x --heads: features per node
MAX_LAYERS = 10_000


def _show(value: Any) -> str:
    """repr() of a user's value, cut short (a 5000-digit number must not fill the screen)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's str() digit limit
        return "a number of more than 4300 digits"
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"


def _int(value: Any, what: str, message: str | None = None) -> int:
    """An integer within 64 bits from an int, an integral float or a string; else UsageError
    (``message``, if given, for a value that is no integer at all)."""
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            n = INT64[1] + 1  # digits beyond what Python converts (4300): far beyond 64 bits
        else:
            raise UsageError(
                message or f"'{what}' must be an integer, got {_show(value)}."
            ) from None
    if not INT64[0] <= n <= INT64[1]:
        raise UsageError(
            f"'{what}' must fit in 64 bits (between -2**63 and 2**63-1), got {_show(value)}."
        )
    return n


def _float(value: Any, what: str, message: str | None = None) -> float:
    """A finite float from a number or a string; nan and inf are UsageErrors too."""
    try:
        if isinstance(value, bool):
            raise ValueError
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(message or f"'{what}' must be a number, got {_show(value)}.") from None
    except OverflowError:  # an int too large for a float
        x = math.inf
    if not math.isfinite(x):
        raise UsageError(message or f"'{what}' must be a finite number, got {_show(value)}.")
    return x


def _items(text: str, what: str, example: str) -> list[str]:
    """'a,b' -> ['a', 'b']; an empty entry ('10,,10', a trailing comma) is an error, not
    skipped: the user meant a value there, and dropping it would shift every one after it."""
    items = str(text).replace(" ", "").split(",")
    if str(text).strip() and any(not t for t in items):
        raise UsageError(
            f"--{what} {_show(text)} has an empty entry between commas; give a value for "
            f"each, e.g. {example}."
        )
    return [t for t in items if t]


def parse_int_list(text: str | list, what: str) -> list[int]:
    """'25,10,10' -> [25, 10, 10]; a TOML list passes through. -1 is allowed (full fan-out)."""
    items = text if isinstance(text, list) else _items(text, what, "4,4")
    message = f"--{what} expects comma-separated integers such as 4,4, got {_show(text)}."
    return [_int(t, what, message) for t in items]


def parse_slowdown(text: str | dict, what: str = "slowdown") -> dict[int, float]:
    """'1=3' or '1=3,2=1.5' -> {1: 3.0, 2: 1.5}; a TOML table {1 = 3} passes through."""
    if isinstance(text, dict):
        items = [f"{k}={v}" for k, v in text.items()]
    else:
        items = _items(text, what, "1=3,2=1.5")
    out: dict[int, float] = {}
    for item in items:
        rank, sep, factor = item.partition("=")
        message = (
            f"--{what} expects RANK=FACTOR[,RANK=FACTOR] with finite factors, e.g. 1=3, "
            f"got {_show(item)}."
        )
        if not sep:
            raise UsageError(message)
        r = _int(rank, what, message)
        if r in out:
            raise UsageError(f"--{what} names rank {r} twice; give each rank one factor.")
        out[r] = _float(factor, what, message)
    return out


def coerce(key: str, value: Any) -> Any:
    """``value`` (a string from the command line, or a TOML value) as the type of ``key``'s field.

    The type comes from the dataclass field (:data:`FIELD_TYPES`): ``int``, ``float``, ``str``,
    ``bool``, ``X | None``, ``list[int]`` (``4,4`` or a TOML list) and ``dict[int, float]``
    (``1=3,2=1.5`` or a TOML table).
    """
    if value is None:
        return None
    kind = FIELD_TYPES[key]
    if isinstance(kind, types.UnionType):  # X | None: a given value is an X
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    origin = typing.get_origin(kind)
    if origin is list:
        return parse_int_list(value, key)
    if origin is dict:
        return parse_slowdown(value, key)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"'{key}' must be true or false, got {_show(value)}.")
    if kind is int:
        return _int(value, key)
    if kind is float:
        return _float(value, key)
    if kind is str:
        if isinstance(value, (list, dict, bool)):
            raise UsageError(f"'{key}' must be a string, got {_show(value)}.")
        return str(value)
    raise TypeError(f"no coercion for {key}: {kind}")  # a new field type: teach coerce()


def apply(
    cfg: Config, settings: dict[str, Any], source: str, given: dict[str, str] | None = None
) -> None:
    """Set flag-named keys on cfg; unknown keys are an error that names the source.

    ``given`` collects key -> source of every setting applied (the user's choices, as opposed to
    defaults that :func:`resolve` fills in later).
    """
    for raw_key, value in settings.items():
        key = raw_key.replace("_", "-")
        if key not in KEYS:
            close = [k for k in KEYS if k.startswith(key[:3])]
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise UsageError(
                f"Unknown setting '{raw_key}' in {source}.{hint} "
                f"Known settings: {', '.join(sorted(KEYS))}."
            )
        sub, name = _field(cfg, key)
        setattr(sub, name, coerce(key, value))
        if given is not None:
            given[key] = source


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not str(path).strip():
        raise UsageError("--config was given an empty path. Pass the path to a TOML file.")
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "is not a file" if p.exists() else "does not exist"
        raise UsageError(f"Config file '{p}' {what}. Pass --config with a path to a TOML file.")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"Config file {p} is not valid TOML: {e}.") from None
    # Accept sections that match the dataclass tree as well ([strategy] sync-every = 20); inside
    # one, field names work too ([model] name = "gcn", since a top-level model key would clash).
    by_field = {(section, name): key for key, (section, name) in KEYS.items()}
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and k in SECTIONS:
            flat.update({by_field.get((k, f.replace("-", "_")), f): x for f, x in v.items()})
        else:
            flat[k] = v
    return flat


def build_config(file: str | None, flags: dict[str, Any]) -> Config:
    """TOML file first, then flags that were given (None: not given); then resolve and validate.

    A setting given in the file or as a flag that this run would not read is a UsageError.
    """
    cfg = Config()
    given: dict[str, str] = {}
    if file is not None:  # --config '' is a mistake, not "no file"
        apply(cfg, load_toml(file), f"config file {file}", given)
    apply(cfg, {k: v for k, v in flags.items() if v is not None}, "the command line", given)
    resolve(cfg)
    validate(cfg, given)
    return cfg


def default_data_root() -> Path:
    env = os.environ.get("GNNPAR_DATA")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "gnnpar"


def check_data_root(root: str | os.PathLike, given: bool) -> None:
    """A data root that is a file, or lies inside one, is a UsageError (it could never hold
    datasets or the cache); one that does not exist yet is fine (the cache creates it).
    ``given``: it came from --data-root, else from $GNNPAR_DATA or $XDG_CACHE_HOME."""
    path = Path(root)
    where = "--data-root" if given else "The data root ($GNNPAR_DATA or $XDG_CACHE_HOME/gnnpar)"
    for p in (path, *path.parents):
        try:
            if not p.exists():
                continue
            if p.is_dir():
                return
        except OSError as e:  # a name too long, a permission denied on a parent
            raise UsageError(f"{where} {path} cannot be used ({e.strerror or e}).") from None
        what = "is a file" if p == path else f"lies inside {p}, which is a file"
        raise UsageError(f"{where} {path} {what}; give a folder for datasets and the cache.")


def default_average(strategy: str, sync_every: int) -> str | None:
    """What a run averages when the user does not say.

    Parameters wherever the ranks' models can drift apart: averaging gradients never pulls two
    models back together, so gossip ranks (always out of step) and allreduce ranks between
    K > 1 averagings drift; measured on synthetic-amazon, gradient-averaging gossip lost 12
    points at K = 1 while parameter averaging stayed within 0.4 points of DDP (BENCHMARKS.md).
    allreduce at K = 1 averages gradients: synchronous data parallelism, DDP's maths.
    """
    if strategy in ("gossip", "gossip-bipartite"):
        return "params"
    if strategy == "allreduce":
        return "params" if sync_every > 1 else "grads"
    return None


def resolve(cfg: Config) -> None:
    """Fill settings left unset with the defaults of the study the model comes from."""
    m, o, r, s, d = cfg.model, cfg.optim, cfg.run, cfg.strategy, cfg.data
    if d.data_root is None:
        d.data_root = str(default_data_root())
    defaults = study_defaults(m.name, d.dataset, s.name)
    if m.hidden is None:
        m.hidden = defaults["hidden"]
    if m.layers is None:
        m.layers = defaults["layers"]
    if m.heads is None:
        m.heads = defaults["heads"]
    if m.dropout is None:
        m.dropout = defaults["dropout"]
    if o.optimizer is None:
        o.optimizer = "adam"
    if o.lr is None:
        o.lr = defaults["lr"]
    if o.weight_decay is None:
        o.weight_decay = defaults["weight_decay"]
    if r.epochs is None:
        r.epochs = defaults["epochs"]
    if s.average is None:
        s.average = default_average(s.name, s.sync_every)
    if s.fanouts is None and s.name == "sampled":
        s.fanouts = [25, 10, 10][: m.layers] + [10] * max(0, m.layers - 3)
    if s.batch_size is None:
        s.batch_size = 32 if m.name == "vig" else 1024


def validate(cfg: Config, given: Mapping[str, str] | None = None) -> None:
    """Every check that needs no data and no strategy. Data-dependent checks live next to the
    data, strategy-specific ones with the strategy. ``given`` (key -> where it was given): the
    settings the user chose, each of which this run must read (:func:`check_used`)."""
    d, m, s, o, r = cfg.data, cfg.model, cfg.strategy, cfg.optim, cfg.run

    def bad(msg: str) -> None:
        raise UsageError(msg)

    def one_of(value: str, allowed: tuple[str, ...], flag: str) -> None:
        if value not in allowed:
            bad(f"Unknown {flag} '{value}'. Choose one of: {', '.join(allowed)}.")

    from gnnpar.data.datasets import dataset_kind  # local: config must not import torch at load

    # a registered name, or the user's own graph (.pt file, OGB folder, module:function) that
    # exists; else "Unknown --dataset" or "no such file"
    kind, _ = dataset_kind(d.dataset)
    one_of(m.name, MODELS, "--model")
    one_of(s.name, STRATEGY_NAMES, "--strategy")
    image = kind == "image"
    if image and m.name != "vig":
        bad(f"Dataset '{d.dataset}' holds images; only --model vig trains on it.")
    if not image and m.name == "vig":
        bad(f"--model vig needs an image dataset (cifar10, synthetic-cifar10), not '{d.dataset}'.")
    check_used(cfg, given or {})
    check_data_root(d.data_root, "data-root" in (given or {}))
    for key, kind in FIELD_TYPES.items():  # also for a Config built in Python, not parsed
        sub, name = _field(cfg, key)
        value = getattr(sub, name)
        if kind in (float, float | None) and value is not None and not math.isfinite(value):
            bad(f"--{key} must be a finite number, got {value}.")
    one_of(d.partitioner, PARTITIONERS, "--partitioner")
    if s.average is not None:
        one_of(s.average, AVERAGE_MODES, "--average (what is averaged)")
    one_of(s.microbatch, MICROBATCH_MODES, "--microbatch")
    one_of(s.schedule, SCHEDULES, "--schedule")
    one_of(o.optimizer, OPTIMIZERS, "--optimizer")
    if r.precision == "fp16":
        bad(
            "--precision fp16 is not supported: fp16 needs loss scaling, which gnnpar does not "
            "do. Use --precision bf16 (same range as fp32, no scaling needed) or fp32."
        )
    one_of(r.precision, PRECISIONS, "--precision")
    if not 0 < d.scale <= 1:
        bad(f"--scale must be in (0, 1], got {d.scale}.")
    if d.partitions is not None and d.partitions < 1:
        bad(f"--partitions must be at least 1, got {d.partitions}.")
    for name, v in (("--hidden", m.hidden), ("--layers", m.layers), ("--heads", m.heads)):
        if v < 1:
            bad(f"{name} must be at least 1, got {v}.")
    if m.hidden * m.heads > MAX_WIDTH:
        # beyond this the run needs terabytes anyway (footprint.check_memory says how much for
        # widths below it); the bound keeps that estimate's tensor sizes within 64 bits
        width = (
            f"--hidden {m.hidden} x --heads {m.heads}" if m.heads > 1 else f"--hidden {m.hidden}"
        )
        bad(
            f"{width} is {m.hidden * m.heads:,} features per node, more than {MAX_WIDTH:,} "
            f"(64 MiB per node): no machine holds such a model. Use a smaller width."
        )
    if m.layers > MAX_LAYERS:
        bad(
            f"--layers {m.layers} is more than {MAX_LAYERS:,} (the deepest GNNs published have "
            "about 1,000). Use fewer layers."
        )
    if not 0 <= m.dropout < 1:
        bad(f"--dropout must be in [0, 1), got {m.dropout}.")
    if s.workers < 1:
        bad(f"--workers must be at least 1, got {s.workers}.")
    if s.sync_every < 1:
        bad(f"--sync-every must be at least 1 (average every K steps), got {s.sync_every}.")
    for rank, factor in s.slowdown.items():
        if rank < 0 or not 1 <= factor <= MAX_SLOWDOWN:
            bad(
                f"--slowdown {rank}={factor:g}: ranks are >= 0 and factors >= 1 and at most "
                f"{MAX_SLOWDOWN:g} (3 = three times slower)."
            )
    if s.jitter < 0:
        bad(f"--jitter must be >= 0, got {s.jitter}.")
    if s.jitter > MAX_SLOWDOWN:
        bad(
            f"--jitter must be at most {MAX_SLOWDOWN:g} (pauses of up to that many steps), "
            f"got {s.jitter:g}."
        )
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
    if not MIN_TIMEOUT_S <= s.timeout_s <= MAX_TIMEOUT_S:
        # shorter: a heartbeat (every timeout/20 s) could not arrive in time, and the launcher's
        # rendezvous counts whole seconds; longer than a week is no timeout but a hang
        bad(
            f"--timeout must be between {MIN_TIMEOUT_S:g} and {MAX_TIMEOUT_S:g} seconds "
            f"(one week), got {s.timeout_s:g}."
        )
    if o.lr <= 0:
        bad(f"--lr must be positive, got {o.lr}.")
    if o.weight_decay < 0:
        bad(f"--weight-decay must be >= 0, got {o.weight_decay}.")
    for flag, v, usual in (("--lr", o.lr, "0.01"), ("--weight-decay", o.weight_decay, "5e-4")):
        if v > FLOAT32_MAX:  # the optimizer multiplies float32 tensors by it
            bad(
                f"{flag} {v:g} does not fit in float32 (the parameters' type, at most "
                f"{FLOAT32_MAX:.4g}); usual values are near {usual}."
            )
    if r.epochs < 1:
        bad(f"--epochs must be at least 1, got {r.epochs}.")
    if not 0 <= r.seed < 2**32:
        # per-rank and per-epoch seeds are derived from it (seed * 1_000_003 + ...) and must
        # stay within the 64 bits torch's generators take
        bad(f"--seed must be between 0 and {2**32 - 1}, got {r.seed}.")
    if r.eval_every < 0:
        bad(f"--eval-every must be >= 0, got {r.eval_every}.")
    if r.max_steps is not None and r.max_steps < 1:
        bad(f"--max-steps must be at least 1, got {r.max_steps}.")
    if r.threads is not None and r.threads < 1:
        bad(f"--threads must be at least 1, got {r.threads}.")
    cores = os.cpu_count() or 1
    # more threads or loader processes than cores only slow a run down, and torch cannot even
    # start a million threads (it crashes); each machine checks against its own cores
    if r.threads is not None and r.threads > cores:
        bad(
            f"--threads {r.threads} is more than the {cores} cores of this machine; use at most {cores}."
        )
    if s.loader_workers > cores:
        bad(
            f"--loader-workers {s.loader_workers} is more than the {cores} cores of this "
            f"machine; use at most {cores} (0 loads in the training process)."
        )
    for flag, v in (
        ("--checkpoint-every", r.checkpoint_every),
        ("--checkpoint-every-steps", r.checkpoint_every_steps),
        ("--max-restarts", r.max_restarts),
    ):
        if v < 0:
            bad(f"{flag} must be >= 0, got {v}.")
    if r.resume and not r.out:
        bad("--resume continues the run in --out: pass --out RUN_DIR (the folder to continue).")
