"""From TOML files and command-line flags to a :class:`~gnnpar.config.schema.Config`.

The TOML file (``--config FILE.toml``) uses the same keys as the flags, flat, with either dashes
or underscores (``sync-every = 20`` or ``sync_every = 20``), or sections that match the dataclass
tree (``[strategy] sync-every = 20``). :data:`KEYS` is the one table of flag / TOML key ->
(section, field), so the CLI, TOML and docs cannot drift apart. Values are converted to the
types of the dataclass fields (:func:`coerce`); a value that cannot be is a
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
from typing import Any

from gnnpar.config.schema import (
    Config,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    StrategyConfig,
)
from gnnpar.errors import UsageError

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
    "model-args": ("model", "args"),
    "split-at": ("model", "split_at"),
    "hops": ("model", "hops"),
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
    "feature-cache": ("strategy", "feature_cache"),
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


def locate(cfg: Config, key: str) -> tuple[Any, str]:
    """(section object, field name) of ``key`` in ``cfg``: ``getattr(*locate(cfg, key))``."""
    section, name = KEYS[key]
    return getattr(cfg, section), name


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
    by_field = {(section, name): key for key, (section, name) in KEYS.items()}
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
