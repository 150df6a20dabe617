"""From the settings a user gave to a checked run: study defaults, who reads what, validation.

:func:`build_config` is the whole way: the TOML file, then the flags (:mod:`gnnpar.config.parse`),
then :func:`resolve` fills what is left unset with model- and dataset-specific defaults (the
study presets of :mod:`gnnpar.models.presets`, e.g. study 001's GAT uses Adam lr 0.005 and weight
decay 5e-4) and the strategy's own (its spec's ``defaults``), then :func:`validate` checks every
value once and raises :class:`gnnpar.UsageError` with a message that says what was wrong and
what to do; the CLI turns that into exit status 2.

A setting the user gave that the chosen strategy, model or dataset would not read is such an
error too (:func:`check_used`): a silently ignored flag makes a run look like it measured
something it did not. Which runs read a setting (:func:`used_by`) comes from the strategies'
specs for the settings only strategies decide on, and from :data:`MODEL_AND_DATA_USES` for the
others. Checks that belong to one strategy (e.g. allreduce needs ``--partitions``) are its
spec's ``check``, run with the run's parallel degrees by :func:`gnnpar.run.prepare`.

It stands above the strategies it consults (their specs) and the settings' schema and parser
below them (:mod:`gnnpar.config`). Nothing here imports torch: the strategies' specs and the
dataset names are torch-free.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gnnpar.config.parse import (
    FIELD_TYPES,
    KEYS,
    apply,
    check_data_root,
    default_data_root,
    load_toml,
    locate,
)
from gnnpar.config.schema import (
    AVERAGE_MODES,
    DATASET_KINDS,
    EVAL_MODES,
    MICROBATCH_MODES,
    OPTIMIZERS,
    PARTITIONERS,
    PRECISIONS,
    SCHEDULES,
    SEED_DEALS,
    Config,
)
from gnnpar.data.registry import DATASETS, kind_of, unknown_dataset
from gnnpar.errors import UsageError
from gnnpar.models.presets import (
    STUDY_DEFAULTS,
    USER_KINDS,
    USER_MODEL_FORMS,
    model_kind,
    study_defaults,
)
from gnnpar.strategies import registry
from gnnpar.targets import check_findable

MODELS = tuple(STUDY_DEFAULTS)  # gcn, gat, gat3, sage, vig (models/__init__.py builds them)
MODEL_KINDS = MODELS + USER_KINDS
BUILT_IN_AND_PYG = MODELS + ("pyg", "pyg:GAT")

# Bounds of validate() beyond "positive" (absurd values that would overflow or never end)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 7 * 24 * 3600.0
MAX_SLOWDOWN = 1000.0  # --slowdown factors and --jitter: a 1000x slower step is a stall already
FLOAT32_MAX = 3.4028234663852886e38
MAX_WIDTH = 2**24  # --hidden x --heads: features per node
MAX_LAYERS = 10_000


# ---------------------------------------------------------------- which runs read which setting
@dataclass(frozen=True)
class Use:
    """Runs that read a setting: every listed strategy x model x dataset kind (all by default).

    ``strategies``: None for every strategy; ``generated``: only datasets gnnpar generates
    (synthetic-*); ``needs``: only when that other setting is set too (``--partitioner`` means
    nothing without ``--partitions``).
    """

    strategies: tuple[str, ...] | None = None
    models: tuple[str, ...] = MODEL_KINDS
    kinds: tuple[str, ...] = DATASET_KINDS
    generated: bool = False
    needs: str | None = None


# Settings whose readers the strategies decide on: each spec's ``reads`` says which of them it
# reads (for which dataset kinds); a run of a strategy that does not declare one ignores it.
STRATEGY_KEYS = (
    "partitions",
    "partitioner",
    "sync-every",
    "average",
    "slowdown",
    "jitter",
    "stages",
    "chunks",
    "balance",
    "microbatch",
    "replicas",
    "schedule",
    "fanouts",
    "batch-size",
    "loader-workers",
    "feature-cache",
    "seeds",
    "checkpoint-every-steps",
    "eval-mode",
)
NEEDS = {"partitioner": "partitions"}  # read only together with that other setting

# Settings that some models or datasets read, whatever the strategy
MODEL_AND_DATA_USES: dict[str, tuple[Use, ...]] = {
    "scale": (Use(generated=True),),
    "heads": (Use(models=("gat", "gat3", "pyg:GAT")),),
    "recompute": (Use(models=("vig",), kinds=("image",)),),
    # a factory gets --model-args only; pyg:NAME maps these onto its own arguments
    "hidden": (Use(models=BUILT_IN_AND_PYG),),
    "layers": (Use(models=BUILT_IN_AND_PYG),),
    "dropout": (Use(models=BUILT_IN_AND_PYG),),
    "model-args": (Use(models=USER_KINDS),),
}
# where a pipeline cuts a user's model, and its receptive field (exact micro-batches): read for a
# user's model on a graph by the strategies with pipeline stages (their specs read --stages)
CUT_KEYS = ("split-at", "hops")


def used_by() -> dict[str, tuple[Use, ...]]:
    """Settings that not every run reads -> the runs that read them (any of the Uses).

    Settings not listed (dataset, model, strategy, workers, hidden, lr, epochs, seed, threads,
    ...) are read by every run. For :data:`STRATEGY_KEYS`, the registered strategies' specs say
    who reads them: one Use per set of dataset kinds, the widest first.
    """
    uses = dict(MODEL_AND_DATA_USES)
    specs = registry.specs()
    staged = tuple(spec.name for spec in specs if "stages" in spec.reads)
    for key in CUT_KEYS:
        uses[key] = (Use(staged, models=USER_KINDS, kinds=("graph",)),)
    for key in STRATEGY_KEYS:
        readers: dict[tuple[str, ...], list[str]] = {}
        for spec in specs:
            if key in spec.reads:
                readers.setdefault(spec.reads[key], []).append(spec.name)
        widest_first = sorted(readers.items(), key=lambda item: -len(item[0]))
        uses[key] = tuple(
            Use(tuple(names), kinds=kinds, needs=NEEDS.get(key)) for kinds, names in widest_first
        )
    return uses


def common_keys() -> tuple[str, ...]:
    """The settings every run reads."""
    uses = used_by()
    return tuple(k for k in KEYS if k not in uses)


def describe_use(use: Use) -> str:
    """'--strategy pipeline, hybrid with a graph dataset', for help texts and messages."""
    parts = []
    if use.strategies is not None and set(use.strategies) != set(registry.names()):
        parts.append(f"--strategy {', '.join(use.strategies)}")
    if use.models != MODEL_KINDS:
        parts.append(f"--model {_models(use.models)}")
    if use.kinds != DATASET_KINDS:
        kinds = " or ".join(_a(k) for k in use.kinds)
        parts.append(f"with {kinds} dataset" if parts else f"{kinds} datasets")
    if use.generated:
        parts.append("with a synthetic-* dataset" if parts else "synthetic-* datasets")
    text = " ".join(parts) or "every run"
    if use.needs:
        text += f", together with --{use.needs}"
    return text


def _models(kinds: tuple[str, ...]) -> str:
    """'gat, gat3, pyg:GAT' / 'pyg:NAME, module:function' for a Use's model kinds."""
    shown = {"pyg": "pyg:NAME", "factory": "module:function"}
    names = [shown.get(k, k) for k in kinds if not (k == "pyg:GAT" and "pyg" in kinds)]
    return ", ".join(names)


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def describe_uses(key: str, uses: Mapping[str, tuple[Use, ...]] | None = None) -> str:
    """Who reads ``key``: 'every run', or e.g. '--strategy sampled' (``uses``: :func:`used_by`,
    when the caller has it already)."""
    key_uses = (used_by() if uses is None else uses).get(key)
    if key_uses is None:
        return "every run"
    return ", and by ".join(describe_use(u) for u in key_uses)


def dataset_kind(name: str) -> tuple[str, bool]:
    """(kind, generated) of ``--dataset name`` without loading it: ("graph" | "image", whether
    gnnpar generates it). Checks that a user's file or folder exists (or that the module of
    ``module:function`` can be found); UsageError for those and for unknown names."""
    if name in DATASETS:
        return kind_of(name), DATASETS[name].generated
    from gnnpar.data import prepared  # numpy only

    if prepared.is_prepared(name) and not prepared.is_sharded(name):
        prepared.open_prepared(name)  # damaged or of another version: said before any rank
        return "graph", False  # checked without importing torch (gnnpar train's start-up)
    from gnnpar.data import user  # only for a name that is no dataset of gnnpar's (torch)

    if user.is_user_source(name):
        user.check_source(name)
        from gnnpar.data import prepared

        if prepared.is_sharded(name):  # a shard missing or damaged: named before any rank
            from gnnpar.data import shards

            shards.check_folder(name)
        elif prepared.is_prepared(name):  # damaged or of another version: said before any rank
            prepared.open_prepared(name)
        return "graph", False  # a user's own graph: a graph, not generated
    raise UsageError(unknown_dataset(name, "--dataset", user.FORMS))


def _missed(use: Use, cfg: Config, kind: str, generated: bool) -> list[tuple[str, str]]:
    """What of this run ``use`` does not cover, as (what, the user's choice); [] = it is read."""
    out = []
    if use.strategies is not None and cfg.strategy.name not in use.strategies:
        out.append(("strategy", f"--strategy {cfg.strategy.name}"))
    if model_kind(cfg.model.name) not in use.models:
        out.append(("model", f"--model {cfg.model.name}"))
    if kind not in use.kinds:
        out.append(("dataset", f"--dataset {cfg.data.dataset} ({_a(kind)} dataset)"))
    elif use.generated and not generated:
        out.append(("dataset", f"--dataset {cfg.data.dataset} (not generated)"))
    if use.needs and getattr(*locate(cfg, use.needs)) is None:
        out.append(("needs", f"--{use.needs}"))
    return out


def check_model_name(name: str) -> None:
    """A built-in model, ``pyg:NAME`` or ``module:function`` whose module can be found; else
    UsageError. (That NAME is one of PyG's models, and the function a model factory, is checked
    before any rank starts: gnnpar.models.user.check_user_model.)"""
    kind = model_kind(name)
    if kind is None:
        raise UsageError(
            f"Unknown --model '{name}'. Choose one of: {', '.join(MODELS)}, or your own: "
            f"{USER_MODEL_FORMS} (a factory f(in_dim, num_classes, **model_args) -> nn.Module)."
        )
    if kind == "factory":  # its module can be found (imported before any rank starts: run.py)
        check_findable("--model", name)


def check_used(cfg: Config, given: Mapping[str, str]) -> None:
    """Every setting in ``given`` (key -> where it was given) is read by this run, or UsageError.

    Needs a known --dataset, --model and --strategy (validate() checks those first).
    """
    kind, generated = dataset_kind(cfg.data.dataset)
    all_uses = used_by()
    for key, source in given.items():
        uses = all_uses.get(key)
        if uses is None:
            continue
        missed = [_missed(u, cfg, kind, generated) for u in uses]
        if not all(missed):
            continue
        if not missed:  # a strategy setting that no registered strategy reads
            raise UsageError(f"--{key} is read by no --strategy; drop it.")
        # the closest use; on a tie, one that keeps the user's strategy (blame the dataset)
        closest = min(missed, key=lambda m: (len(m), any(w == "strategy" for w, _ in m)))
        raise UsageError(_unused_message(key, source, closest, all_uses))


def _unused_message(
    key: str, source: str, missed: list[tuple[str, str]], uses: Mapping[str, tuple[Use, ...]]
) -> str:
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
        f"--{key}{where} is used by {describe_uses(key, uses)} only; "
        f"{' with '.join(c for _, c in choices)} would ignore it. "
        f"Drop it, or choose a {what} that {'uses' if len(choices) == 1 else 'use'} it."
    )


def resolve(cfg: Config) -> None:
    """Fill settings left unset with the defaults of the study the model comes from, and the
    strategy's own."""
    m, o, r, s, d = cfg.model, cfg.optim, cfg.run, cfg.strategy, cfg.data
    if d.data_root is None:
        d.data_root = str(default_data_root())
    spec = registry.get(s.name) if s.name in registry.names() else None  # else validate() says
    # a strategy that samples neighbours reads --fanouts (its spec says so)
    defaults = study_defaults(m.name, d.dataset, spec is not None and "fanouts" in spec.reads)
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
    if spec is not None:
        spec.defaults(cfg)  # e.g. what it averages, sampled's fan-outs
    if s.batch_size is None:
        s.batch_size = 32 if m.name == "vig" else 1024


def validate(cfg: Config, given: Mapping[str, str] | None = None) -> None:
    """Every check that needs no data and no parallel degrees. Data-dependent checks live next
    to the data, strategy-specific ones in the strategy's spec (``check``). ``given`` (key -> where it was given): the
    settings the user chose, each of which this run must read (:func:`check_used`). The checks
    run in this order (the first that fails is the message): names and where settings apply,
    choices, the model's sizes, the strategy's settings, the optimizer's and the run's."""
    _check_names(cfg, given or {})
    _check_choices(cfg)
    _check_model(cfg.model)
    _check_strategy(cfg.strategy)
    _check_run(cfg)


def _bad(msg: str) -> None:
    raise UsageError(msg)


def _one_of(value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        _bad(f"Unknown {flag} '{value}'. Choose one of: {', '.join(allowed)}.")


def _check_names(cfg: Config, given: Mapping[str, str]) -> None:
    """The dataset, model and strategy exist and suit each other; every setting given is read
    by this run; the data root is usable; every number is finite."""
    d, m, s = cfg.data, cfg.model, cfg.strategy
    # a registered name, or the user's own graph (.pt file, OGB folder, module:function) that
    # exists; else "Unknown --dataset" or "no such file"
    kind, _ = dataset_kind(d.dataset)
    check_model_name(m.name)
    _one_of(s.name, registry.names(), "--strategy")
    image = kind == "image"
    if image and m.name != "vig":
        _bad(f"Dataset '{d.dataset}' holds images; only --model vig trains on it.")
    if m.hops is not None and not 1 <= m.hops <= MAX_LAYERS:
        _bad(f"--hops must be between 1 and {MAX_LAYERS:,} (message-passing layers), got {m.hops}.")
    if not image and m.name == "vig":
        _bad(f"--model vig needs an image dataset (cifar10, synthetic-cifar10), not '{d.dataset}'.")
    check_used(cfg, given)
    check_data_root(d.data_root, "data-root" in given)
    for key, kind in FIELD_TYPES.items():  # also for a Config built in Python, not parsed
        sub, name = locate(cfg, key)
        value = getattr(sub, name)
        if kind in (float, float | None) and value is not None and not math.isfinite(value):
            _bad(f"--{key} must be a finite number, got {value}.")


def _check_choices(cfg: Config) -> None:
    """Every setting with a fixed set of values has one of them; --scale and --partitions."""
    d, s, o, r = cfg.data, cfg.strategy, cfg.optim, cfg.run
    _one_of(d.partitioner, PARTITIONERS, "--partitioner")
    if s.average is not None:
        _one_of(s.average, AVERAGE_MODES, "--average (what is averaged)")
    _one_of(s.microbatch, MICROBATCH_MODES, "--microbatch")
    _one_of(s.schedule, SCHEDULES, "--schedule")
    _one_of(o.optimizer, OPTIMIZERS, "--optimizer")
    if r.precision == "fp16":
        _bad(
            "--precision fp16 is not supported: fp16 needs loss scaling, which gnnpar does not "
            "do. Use --precision bf16 (same range as fp32, no scaling needed) or fp32."
        )
    _one_of(r.precision, PRECISIONS, "--precision")
    _one_of(s.eval_mode, EVAL_MODES, "--eval-mode")
    _one_of(s.seeds, SEED_DEALS, "--seeds")
    if s.eval_mode == "sampled" and s.name != "sampled":
        _bad(
            f"--eval-mode sampled samples with the fan-outs of sampled training; --strategy "
            f"{s.name} has none: use --eval-mode layerwise or auto, or --strategy sampled."
        )
    if not 0 < d.scale <= 1:
        _bad(f"--scale must be in (0, 1], got {d.scale}.")
    if d.partitions is not None and d.partitions < 1:
        _bad(f"--partitions must be at least 1, got {d.partitions}.")


def _check_model(m) -> None:
    """The model's sizes: widths, depth and dropout within what any machine can hold."""
    for name, v in (("--hidden", m.hidden), ("--layers", m.layers), ("--heads", m.heads)):
        if v < 1:
            _bad(f"{name} must be at least 1, got {v}.")
    if m.hidden * m.heads > MAX_WIDTH:
        # beyond this the run needs terabytes anyway (footprint.check_memory says how much for
        # widths below it); the bound keeps that estimate's tensor sizes within 64 bits
        width = (
            f"--hidden {m.hidden} x --heads {m.heads}" if m.heads > 1 else f"--hidden {m.hidden}"
        )
        _bad(
            f"{width} is {m.hidden * m.heads:,} features per node, more than {MAX_WIDTH:,} "
            f"(64 MiB per node): no machine holds such a model. Use a smaller width."
        )
    if m.layers > MAX_LAYERS:
        _bad(
            f"--layers {m.layers} is more than {MAX_LAYERS:,} (the deepest GNNs published have "
            "about 1,000). Use fewer layers."
        )
    if not 0 <= m.dropout < 1:
        _bad(f"--dropout must be in [0, 1), got {m.dropout}.")


def _check_strategy(s) -> None:
    """The parallel settings: ranks, averaging, stragglers, pipeline shape, sampling, loaders,
    the feature cache, timeouts."""
    if s.workers < 1:
        _bad(f"--workers must be at least 1, got {s.workers}.")
    if s.sync_every < 1:
        _bad(f"--sync-every must be at least 1 (average every K steps), got {s.sync_every}.")
    for rank, factor in s.slowdown.items():
        if rank < 0 or not 1 <= factor <= MAX_SLOWDOWN:
            _bad(
                f"--slowdown {rank}={factor:g}: ranks are >= 0 and factors >= 1 and at most "
                f"{MAX_SLOWDOWN:g} (3 = three times slower)."
            )
    if s.jitter < 0:
        _bad(f"--jitter must be >= 0, got {s.jitter}.")
    if s.jitter > MAX_SLOWDOWN:
        _bad(
            f"--jitter must be at most {MAX_SLOWDOWN:g} (pauses of up to that many steps), "
            f"got {s.jitter:g}."
        )
    if s.stages < 1 or s.chunks < 1 or s.replicas < 1:
        _bad("--stages, --chunks and --replicas must each be at least 1.")
    if s.balance is not None and any(b < 1 for b in s.balance):
        _bad(f"--balance entries must each be at least 1 block, got {s.balance}.")
    if s.fanouts is not None and any(f == 0 or f < -1 for f in s.fanouts):
        _bad(f"--fanouts entries must be positive, or -1 for all neighbours, got {s.fanouts}.")
    if s.batch_size < 1:
        _bad(f"--batch-size must be at least 1, got {s.batch_size}.")
    if s.loader_workers < 0:
        _bad(f"--loader-workers must be >= 0, got {s.loader_workers}.")
    if s.feature_cache is not None:
        from gnnpar.data.prepared import parse_cache_size

        try:
            parse_cache_size(s.feature_cache)
        except ValueError as e:
            _bad(str(e))
    if s.timeout_s <= 0:
        _bad(f"--timeout must be positive seconds, got {s.timeout_s}.")
    if not MIN_TIMEOUT_S <= s.timeout_s <= MAX_TIMEOUT_S:
        # shorter: a heartbeat (every timeout/20 s) could not arrive in time, and the launcher's
        # rendezvous counts whole seconds; longer than a week is no timeout but a hang
        _bad(
            f"--timeout must be between {MIN_TIMEOUT_S:g} and {MAX_TIMEOUT_S:g} seconds "
            f"(one week), got {s.timeout_s:g}."
        )


def _check_run(cfg: Config) -> None:
    """The optimizer's numbers and the run's: epochs, seed, steps, threads and loader processes
    against this machine's cores, checkpoints, --resume."""
    s, o, r = cfg.strategy, cfg.optim, cfg.run
    if o.lr <= 0:
        _bad(f"--lr must be positive, got {o.lr}.")
    if o.weight_decay < 0:
        _bad(f"--weight-decay must be >= 0, got {o.weight_decay}.")
    for flag, v, usual in (("--lr", o.lr, "0.01"), ("--weight-decay", o.weight_decay, "5e-4")):
        if v > FLOAT32_MAX:  # the optimizer multiplies float32 tensors by it
            _bad(
                f"{flag} {v:g} does not fit in float32 (the parameters' type, at most "
                f"{FLOAT32_MAX:.4g}); usual values are near {usual}."
            )
    if r.epochs < 1:
        _bad(f"--epochs must be at least 1, got {r.epochs}.")
    if not 0 <= r.seed < 2**32:
        # per-rank and per-epoch seeds are derived from it (seed * 1_000_003 + ...) and must
        # stay within the 64 bits torch's generators take
        _bad(f"--seed must be between 0 and {2**32 - 1}, got {r.seed}.")
    if r.eval_every < 0:
        _bad(f"--eval-every must be >= 0, got {r.eval_every}.")
    if r.max_steps is not None and r.max_steps < 1:
        _bad(f"--max-steps must be at least 1, got {r.max_steps}.")
    if r.threads is not None and r.threads < 1:
        _bad(f"--threads must be at least 1, got {r.threads}.")
    cores = os.cpu_count() or 1
    # more threads or loader processes than cores only slow a run down, and torch cannot even
    # start a million threads (it crashes); each machine checks against its own cores
    if r.threads is not None and r.threads > cores:
        _bad(
            f"--threads {r.threads} is more than the {cores} cores of this machine; use at most {cores}."
        )
    if s.loader_workers > cores:
        _bad(
            f"--loader-workers {s.loader_workers} is more than the {cores} cores of this "
            f"machine; use at most {cores} (0 loads in the training process)."
        )
    for flag, v in (
        ("--checkpoint-every", r.checkpoint_every),
        ("--checkpoint-every-steps", r.checkpoint_every_steps),
        ("--max-restarts", r.max_restarts),
    ):
        if v < 0:
            _bad(f"{flag} must be >= 0, got {v}.")
    if r.resume and not r.out:
        _bad("--resume continues the run in --out: pass --out RUN_DIR (the folder to continue).")


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
