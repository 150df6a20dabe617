"""From TOML files and command-line flags to a :class:`~gnnpar.config.schema.Config`.

The TOML file (``--config FILE.toml``) uses the same keys as the flags, flat, with either dashes
or underscores (``sync-every = 20`` or ``sync_every = 20``), or sections that match the dataclass
tree (``[strategy] sync-every = 20``). :data:`KEYS` is the one table of flag / TOML key ->
(section, field, help), so the CLI, its help, TOML and docs cannot drift apart. Values are
converted to the types of the dataclass fields (:func:`coerce`); a value that cannot be is a
:class:`gnnpar.UsageError` with a message that says what was wrong and what to do. Where data
lives by default (:func:`default_data_root`) is here too: every command needs it.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, NamedTuple

from gnnpar.config.schema import (
    Config,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    StrategyConfig,
)
from gnnpar.errors import UsageError


class Key(NamedTuple):
    """A flag / TOML key: the :class:`~gnnpar.config.schema.Config` field it sets (section and
    name) and what it means (its help; ``gnnpar train --help`` adds who reads it)."""

    section: str
    name: str
    help: str


# flag / TOML key -> Key: the one table of the settings a user can give
KEYS: dict[str, Key] = {
    "dataset": Key("data", "dataset", "dataset name (see `gnnpar datasets`)"),
    "data-root": Key(
        "data", "data_root", "folder holding datasets placed by the user and the cache"
    ),
    "scale": Key(
        "data", "scale", "shrink a generated dataset's nodes and edges by this factor in (0, 1]"
    ),
    "partitions": Key("data", "partitions", "Cluster-GCN: number of subgraph mini-batches"),
    "partitioner": Key("data", "partitioner", "random or metis"),
    "model": Key(
        "model",
        "name",
        "gcn, gat, gat3, sage, vig; or your own: pyg:NAME (a model of "
        "torch_geometric.nn.models, e.g. pyg:GIN, pyg:GAT; --hidden, --layers, "
        "--dropout, --heads fill its arguments) or module:function (a factory "
        "f(in_dim, num_classes, **model_args) -> nn.Module, imported from the "
        "current folder; module:Class is called with **model_args). It returns "
        "logits per node; gnnpar applies the loss",
    ),
    "hidden": Key(
        "model", "hidden", "hidden width (vig: channels); default: the model's study preset"
    ),
    "layers": Key("model", "layers", "layers (vig: blocks); default: the model's study preset"),
    "heads": Key("model", "heads", "attention heads; default: the model's study preset"),
    "dropout": Key("model", "dropout", "dropout probability; default: the model's study preset"),
    "recompute": Key(
        "model",
        "recompute",
        "keep only each block's input for the backward pass and recompute the "
        "rest (GPipe's re-materialisation; same gradients, ~1/3 more compute, "
        "far less memory)",
    ),
    "model-args": Key(
        "model",
        "args",
        "a user model's keyword arguments as a JSON object, e.g. '{\"hidden\": "
        "64}' (TOML: a [model-args] table); they win over --hidden etc.",
    ),
    "split-at": Key(
        "model", "split_at", "submodules where pipelines cut a user model, e.g. convs.1,convs.2"
    ),
    "hops": Key(
        "model",
        "hops",
        "a user model's receptive field in hops, where gnnpar cannot count its "
        "message-passing layers (exact micro-batches)",
    ),
    "strategy": Key(
        "strategy",
        "name",
        "how the run is parallelised: a registered strategy (--help lists each with its line)",
    ),
    "workers": Key(
        "strategy", "workers", "number of local ranks to start (ignored under torchrun)"
    ),
    "sync-every": Key("strategy", "sync_every", "average every K steps"),
    "average": Key(
        "strategy",
        "average",
        "grads or params (default: params, except allreduce with --sync-every 1: grads)",
    ),
    "slowdown": Key("strategy", "slowdown", "RANK=FACTOR[,RANK=FACTOR]: persistent stragglers"),
    "jitter": Key("strategy", "jitter", "random transient delays (fraction of a step)"),
    "stages": Key("strategy", "stages", "pipeline stages"),
    "chunks": Key("strategy", "chunks", "micro-batches per mini-batch"),
    "balance": Key("strategy", "balance", "blocks per stage, e.g. 4,4"),
    "microbatch": Key("strategy", "microbatch", "exact or index (graph micro-batches)"),
    "replicas": Key("strategy", "replicas", "pipeline copies (hybrid)"),
    "schedule": Key("strategy", "schedule", "gpipe or 1f1b"),
    "fanouts": Key("strategy", "fanouts", "neighbours sampled per layer, e.g. 25,10,10 (-1: all)"),
    "batch-size": Key("strategy", "batch_size", "mini-batch size per rank (seed nodes or images)"),
    "feature-cache": Key(
        "strategy",
        "feature_cache",
        "a prepared graph's hottest feature rows (most expected visits per batch from the "
        "training nodes at --fanouts) kept in shared memory for every "
        "local rank and loader worker: bytes (512M, 2G) or a fraction of the features (0.25); "
        "default: a quarter of the memory the run may use (an in-memory graph's features are all "
        "shared already)",
    ),
    "loader-workers": Key("strategy", "loader_workers", "DataLoader worker processes per rank"),
    "timeout": Key(
        "strategy", "timeout_s", "seconds any wait on another process may take before the run fails"
    ),
    "optimizer": Key("optim", "optimizer", "adam (default) or sgd"),
    "lr": Key("optim", "lr", "learning rate; default: the model's study preset"),
    "weight-decay": Key("optim", "weight_decay", "weight decay; default: the model's study preset"),
    "epochs": Key("run", "epochs", "training epochs; default: the model's study preset"),
    "seed": Key("run", "seed", "random seed (0 to 2**32-1)"),
    "out": Key("run", "out", "output folder for result.json"),
    "quiet": Key("run", "quiet", "no progress display"),
    "tensorboard": Key(
        "run", "tensorboard", "also write TensorBoard event files to <out>/tensorboard/"
    ),
    "eval-every": Key("run", "eval_every", "evaluate every N epochs (0: only at the end)"),
    "eval-mode": Key(
        "strategy",
        "eval_mode",
        "how a graph's final scores are computed: layerwise (exact full-graph inference, "
        "hidden states spilled to disk where they do not fit), sampled (the scored nodes in "
        "mini-batches through the training sampler and fan-outs; --strategy sampled), or auto "
        "(default: layerwise where its hidden states fit the memory the run may use, else "
        "sampled; it says which and why)",
    ),
    "seeds": Key(
        "strategy",
        "seeds",
        "sampled training across shards: global (default: each epoch's seeds dealt as one host "
        "over the unsharded graph deals them, so the batches are that host's) or local (each "
        "host's ranks draw their batches from its own shard's training nodes, fewer nodes "
        "fetched from other hosts; other batches, so another loss curve)",
    ),
    "max-steps": Key("run", "max_steps", "at most this many training steps per epoch"),
    "threads": Key("run", "threads", "torch threads per process"),
    "checkpoint-every": Key(
        "run",
        "checkpoint_every",
        "write a checkpoint every N epochs to <out>/checkpoints/ (last 2 kept)",
    ),
    "checkpoint-every-steps": Key(
        "run", "checkpoint_every_steps", "write a checkpoint every N training steps"
    ),
    "resume": Key("run", "resume", "continue the run in --out from its newest good checkpoint"),
    "max-restarts": Key(
        "run",
        "max_restarts",
        "restart the ranks up to N times when one fails; they resume from the newest checkpoint",
    ),
    "precision": Key(
        "run",
        "precision",
        "fp32 (default) or bf16: forward passes under torch.autocast in "
        "bfloat16, weights, gradients and optimizer state in fp32",
    ),
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
    key: typing.get_type_hints(SECTIONS[section])[name] for key, (section, name, _) in KEYS.items()
}


def locate(cfg: Config, key: str) -> tuple[Any, str]:
    """(section object, field name) of ``key`` in ``cfg``: ``getattr(*locate(cfg, key))``."""
    return getattr(cfg, KEYS[key].section), KEYS[key].name


# ---------------------------------------------------------------- type coercion
INT64 = (-(2**63), 2**63 - 1)


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


NAME_PATH = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")  # a submodule's name: convs.1, encoder.layer


def parse_name_list(text: str | list, what: str) -> list[str]:
    """'convs.1,convs.2' -> ['convs.1', 'convs.2'] (submodule names, as model.named_modules()
    gives them); a TOML list of strings passes through."""
    items = text if isinstance(text, list) else _items(text, what, "convs.1,convs.2")
    for t in items:
        if not isinstance(t, str) or not NAME_PATH.match(t):
            raise UsageError(
                f"--{what} expects comma-separated submodule names such as convs.1,convs.2 "
                f"(as model.named_modules() names them), got {_show(t)}."
            )
    if len(set(items)) != len(items):
        raise UsageError(f"--{what} names a submodule twice: {','.join(items)}.")
    return list(items)


def parse_model_args(value: str | dict, what: str = "model-args") -> dict[str, Any]:
    """--model-args: a JSON object ('{"hidden": 64, "v2": true}') or a TOML table, whose keys
    are keyword-argument names and whose values are plain data (numbers, strings, booleans,
    null, lists and objects of them): they go into model.pt and result.json as written."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise UsageError(
                f"--{what} must be a JSON object such as '{{\"hidden\": 64}}', got "
                f"{_show(value)} ({e.msg} at character {e.pos})."
            ) from None
    if not isinstance(value, dict):
        raise UsageError(
            f"--{what} must be a JSON object (or a TOML table) of keyword arguments, "
            f"got {_show(value)}."
        )
    for k in value:
        if not isinstance(k, str) or not k.isidentifier():
            raise UsageError(f"--{what}: {_show(k)} is not a keyword-argument name.")
    try:  # plain data only, exactly as JSON keeps it (no NaN, no datetimes from TOML)
        plain = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        raise UsageError(
            f"--{what} holds a value JSON cannot keep (a date, NaN or infinity): "
            f"{_show(value)}. Use numbers, strings, booleans, lists and tables."
        ) from None
    return plain


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
        if typing.get_args(kind) == (str,):
            return parse_name_list(value, key)
        return parse_int_list(value, key)
    if origin is dict:
        if typing.get_args(kind)[0] is str:
            return parse_model_args(value, key)
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
    defaults that :func:`gnnpar.configure.resolve` fills in later).
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
        sub, name = locate(cfg, key)
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
    by_field = {(k.section, k.name): key for key, k in KEYS.items()}
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and k in SECTIONS:
            flat.update({by_field.get((k, f.replace("-", "_")), f): x for f, x in v.items()})
        else:
            flat[k] = v
    return flat


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
