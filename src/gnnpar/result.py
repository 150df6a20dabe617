"""What a run leaves in ``<out>/``: ``result.json`` (its one schema, and the one function that
writes it) and ``model.pt`` (the final model, rebuildable).

result.json
-----------
:func:`build_result` turns the loop's :class:`~gnnpar.training.loop.Outcome` (with the run's
config, dataset and world size) into the dict, and :func:`write_result` writes it. Every key is
declared below with what it means, grouped by what provides its value, in the order written:

* :data:`CONTRACT`: the keys every result.json has (docs/CONTRACTS.md; :data:`REQUIRED_KEYS`);
* :data:`LOOP`: the loop's measurements, every run (per-rank lists: one entry per rank);
* :data:`RANK_INFO`: per-rank lists from a source's or sync policy's ``rank_info()``;
* the strategy's own settings and measurements (``Plan.extra``), declared in its spec
  (:attr:`gnnpar.strategies.spec.StrategySpec.result_keys`, beside the rest of the strategy);
* :data:`FINAL_MODEL`: how the final model was chosen (``Final``: allreduce, gossip);
* :data:`EVALUATION`: how a graph's final scores were computed (``Final.evaluation``);
* :data:`CHECKPOINT`: checkpoints and restarts (runs with a checkpointer).

A key that no group declares is refused (a programming error): add it here first, or, for a
strategy's own key, to its spec's ``result_keys``.

model.pt
--------
The file is one ``torch.save``d dict of plain values and tensors (so :func:`load_model` reads it
with ``weights_only=True``, :mod:`gnnpar.data.safe_load`: loading a model file runs no code from it;
one naming any function or class is refused)::

    format        "gnnpar-model-1"
    state_dict    the final model's weights (gossip/allreduce: the chosen final model;
                  pipeline/hybrid: every stage joined back into one model)
    model         the resolved model settings (name, hidden, layers, heads, dropout)
    in_dim, num_classes, multilabel
    config        every resolved setting of the run (``run.precision``: the arithmetic its
                  scores were computed in; ``gnnpar predict`` uses it, weights are fp32 always)
    dataset       name and, for user graphs, their content fingerprint
    final_model, scores, versions
    user_model    only for a user's model (``--model pyg:NAME`` / ``module:function``,
                  ``gnnpar.fit(model=...)``): ``{target, call, kwargs, class, parameters}``;
                  ``state_dict`` is then the user's module's own (its layout, not gnnpar's
                  blocks), and :func:`build_from` rebuilds it by importing ``target`` and
                  calling it (:func:`gnnpar.models.user.rebuild`): the file names the user's
                  code, which must be importable where it is loaded (a class defined in a
                  script's ``__main__`` is not, elsewhere). Loading such a file runs that code,
                  as importing the model would; targets from Python's standard library or torch
                  itself are refused, and a class is called only if it is an ``nn.Module``.

Rebuilt, the model is called the PyG way: ``model(x, edge_index)`` gives logits for every node
(ViG: ``model(images)``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gnnpar.config.schema import ModelConfig
from gnnpar.data import safe_load
from gnnpar.errors import UsageError
from gnnpar.models.presets import USER_KINDS, model_kind
from gnnpar.runtime import resources
from gnnpar.strategies import registry
from gnnpar.training.metrics import score_name, summarize

if TYPE_CHECKING:
    from gnnpar.config.schema import Config
    from gnnpar.training.loop import Outcome

# ------------------------------------------------------------------------------ result.json
CONTRACT: dict[str, str] = {
    "dataset": "--dataset as given (a name, or a user graph's path / module:function)",
    "model": "--model",
    "strategy": "--strategy",
    "workers": "number of ranks (world size)",
    "epochs": "--epochs",
    "seed": "--seed",
    "config": "every resolved setting (Config.to_dict)",
    "train_time_s": "wall time of training only: the longest rank's summed epoch time "
    "(no data loading, partitioning, set-up or final evaluation)",
    "partition_time_s": "time to partition (or plan micro-batches); 0 where nothing is",
    "step_time_s": "summarize() of the step times (lock-step ranks: each step's slowest rank)",
    "test_step_time_s": "summarize() of every evaluation step's time (mid-run and final)",
    "score_name": '"accuracy" (single-label) or "micro_f1" (multi-label)',
    "test_score": "the final model's test score",
    "val_score": "the final model's validation score",
    "per_worker_batches": "batches each rank trained (pipelines: micro-batches)",
    "loss_curve": 'training loss: per epoch (mean over every rank), per step ("step"), or '
    '{"replica<R>": per step} (Plan.curve)',
    "versions": "torch, torch_geometric, gnnpar, python",
    "machine": "cpu_count, accelerator (name or null), device (where the ranks trained: cuda or "
    "cpu; a host with fewer GPUs than ranks trains on its CPUs), platform, hostname",
}
LOOP: dict[str, str] = {
    "dataset_info": "the dataset's own description (user graphs: fingerprint, source)",
    "train_score": "the final model's score on the training nodes (null where not computed)",
    "per_worker_train_s": "per rank: summed epoch wall time",
    "per_worker_wait_s": "per rank: seconds blocked on other ranks in the sync policy",
    "per_worker_exchanges": "per rank: averagings (all-reduce or gossip) taken part in",
    "per_worker_delay_s": "per rank: seconds slept as an emulated straggler (--slowdown, --jitter)",
    "time_breakdown_s": "per rank: {data_wait, compute, sync} seconds summed over the steps",
    "data_wait_share": "data_wait over the sum of every rank's breakdown (0 when empty)",
    "rank_train_time_s": "per rank: summed epoch wall time (as per_worker_train_s)",
    "max_rank_train_time_s": "the longest rank's training time (study 002's headline)",
    "peak_rss_bytes": "per rank: peak resident memory of the process",
    "first_batch_wait_s": "per rank: part of data_wait, the first batch (cannot be prefetched)",
    "cuda_peak_bytes": "per rank: peak CUDA allocation (only on CUDA)",
    "step_times_s": "every step's time, in order (the first includes warm-up)",
    "per_worker_step_time_s": "per rank: summarize() of its own step times",
    "framework": "a run trained by another framework's loop on gnnpar's parts: {name, version, "
    "strategy} (gnnpar.lightning.RunRecord; absent from gnnpar train's runs)",
}
RANK_INFO: dict[str, str] = {
    "pool_log": "gossip (PoolSource), per rank: [epoch, subgraph] in the order taken",
    "exchange_log": "gossip (GossipSync), per rank: [step, partner, exchange id, initiated]",
    "fetched_subgraphs": "gossip across shards (gnnpar.parallel.fetch), per rank: subgraphs "
    "of other hosts' pools it trained, fetched from their hosts",
    "fetched_bytes": "gossip across shards, per rank: the bytes of those subgraphs received",
    "served_subgraphs": "gossip across shards, per rank: its host's subgraphs it sent to others",
    "loader_start_time_s": "sampled (SampledSource), per rank: seconds to start the loader",
    "exchange_bytes_per_step": "sampled across shards (ShardSampledSource), per rank: bytes "
    "sent to other ranks per training step (sampling requests and answers, feature rows, split "
    "sizes; gnnpar.data.sampling.distributed)",
    "exchange_needed_bytes_per_step": "sampled across shards, per rank: the least those steps "
    "needed: ids asked of other hosts, the sampled sources and float32 feature rows answered",
    "exchange_wait_s_per_step": "sampled across shards, per rank: seconds a training step spent "
    "in each kind of collective ({kind: s}; the split sizes apart)",
    "exchange_collectives_per_step": "sampled across shards, per rank: collectives a training "
    "step ran, by kind",
    "exchange_ahead": "sampled across shards, per rank: whether batch i+1 was made (its "
    "sampling and feature exchanges) on a thread while the model trained on batch i",
    "batch_make_s_per_step": "sampled across shards, per rank: seconds making a batch took "
    "(sampling, exchanges, feature rows; on the thread where made ahead)",
    "remote_rows_cached": "sampled across shards, per rank: other hosts' feature rows held "
    "(--feature-cache: the most sampled ones, fetched once before training)",
    "feature_cache": "sampled from a prepared folder (SampledSource), per rank: the feature "
    "cache's bytes; rows_gathered, cache_hits, hit_rate (rows served by the cache / rows "
    "gathered; 0 without a cache), bytes_read (feature rows read from the folder x their stored "
    "bytes: what the page cache or the disk served), bytes_read_per_step, steps; and per_epoch",
}
FINAL_MODEL: dict[str, str] = {
    "final_model": '"rank0" (every rank holds it), "average" or "best-local:rank<N>"',
    "candidates": "both candidates' val_score/test_score (and the best local model's rank)",
    "local_scores": "per rank: its own model's {val, test}",
    "per_worker_divergence": "per rank: ||its model - average|| / ||average||",
}
EVALUATION: dict[str, str] = {
    "eval_mode": 'how the final scores of a graph were computed: "layerwise" (exact '
    'full-graph inference) or "sampled" (the scored nodes in mini-batches through training\'s '
    "neighbour sampler); --eval-mode, auto's choice",
    "eval_fanouts": "sampled evaluation: the fan-outs (training's)",
    "eval_batch_size": "sampled evaluation: scored nodes per batch (training's --batch-size); "
    "it scores val and test only (train_score null)",
}
USER_MODEL: dict[str, str] = {
    "user_model": "a user's model (--model pyg:NAME / module:function, gnnpar.fit(model=...)): "
    "how it was built, {target, call, kwargs} (gnnpar.models.user), its class and parameters",
}
CHECKPOINT: dict[str, str] = {
    "checkpoints_written": "checkpoints this attempt wrote",
    "checkpoint_time_s": "summarize() of the seconds each took to write",
    "restarts": "restarts of the ranks before this attempt (--max-restarts, torchrun)",
    "resumed_from": "the checkpoint this attempt continued from (only when resumed)",
    "lost_time_s": "from that checkpoint's writing to its restoring (only when resumed)",
    "storage": "which host holds which file (STORAGE): no file system need be shared",
}
# result.json's "storage": where a multi-host run leaves its files, each host in its own --out
STORAGE = {
    "result.json, model.pt, metrics.jsonl": "global rank 0's host only",
    "checkpoints": "each rank's host: its own part, <out>/checkpoints/*/rank<R>.pt + rank<R>.json;"
    " resuming needs only those (gnnpar.training.checkpoint)",
}
REQUIRED_KEYS = tuple(CONTRACT)
KEYS: dict[str, str] = {
    **CONTRACT,
    **LOOP,
    **RANK_INFO,
    **FINAL_MODEL,
    **EVALUATION,
    **USER_MODEL,
    **CHECKPOINT,
}


def build_result(
    cfg: Config, o: Outcome, ds, world_size: int, device: torch.device | str = "cpu"
) -> dict[str, Any]:
    """result.json of a run, the same on every rank. Raises for a key no group declares.

    Why one function: it is the file's one literal of result.json, key by key in the order a
    reader finds them (docs/CONTRACTS.md lists the same); split, the order would be spread
    across helpers."""
    ranks = o.ranks
    result: dict[str, Any] = {
        "dataset": cfg.data.dataset,
        "model": cfg.model.name,
        "strategy": cfg.strategy.name,
        "workers": world_size,
        "epochs": cfg.run.epochs,
        "seed": cfg.run.seed,
        "config": cfg.to_dict(),
        "train_time_s": o.train_time_s,
        "partition_time_s": o.partition_time_s,
        "step_time_s": summarize(o.step_times),
        "test_step_time_s": summarize(o.test_step_times),
        "score_name": score_name(ds.multilabel),
        "test_score": o.scores["test"],
        "val_score": o.scores["val"],
        "per_worker_batches": o.per_worker_batches,
        "loss_curve": o.loss_curve,
        "versions": versions(),
        "machine": machine(device),
    }
    # LOOP
    breakdown = [
        {"data_wait": r.data_wait_s, "compute": r.compute_s, "sync": r.sync_wait_s} for r in ranks
    ]
    total = sum(sum(b.values()) for b in breakdown)
    train_s = [r.train_s for r in ranks]
    result |= {
        "dataset_info": getattr(ds, "info", {}),
        "train_score": o.scores.get("train"),
        "per_worker_train_s": train_s,
        "per_worker_wait_s": [r.sync_wait_s for r in ranks],
        "per_worker_exchanges": [r.exchanges for r in ranks],
        "per_worker_delay_s": [r.delay_s for r in ranks],
        "time_breakdown_s": breakdown,
        "data_wait_share": sum(b["data_wait"] for b in breakdown) / total if total else 0.0,
        "rank_train_time_s": train_s,
        "max_rank_train_time_s": max(train_s),
        "peak_rss_bytes": [r.peak_rss_bytes for r in ranks],
        "first_batch_wait_s": [r.first_batch_wait_s for r in ranks],
    }
    if ranks[0].cuda_peak_bytes is not None:
        result["cuda_peak_bytes"] = [r.cuda_peak_bytes for r in ranks]
    result["step_times_s"] = o.step_times
    result["per_worker_step_time_s"] = [summarize(r.step_times) for r in ranks]
    # RANK_INFO
    result |= {key: [r.info[key] for r in ranks] for key in ranks[0].info}
    # the strategy's own keys, declared in its spec (StrategySpec.result_keys)
    own = registry.get(cfg.strategy.name).result_keys
    _check(o.strategy, own, "Plan.extra")
    result |= o.strategy
    # FINAL_MODEL
    if o.final_model is not None:
        result["final_model"] = o.final_model
    if o.choice is not None:
        result["candidates"] = o.choice.candidates
        result["local_scores"] = [
            {"val": s["val"], "test": s["test"]} for s in o.choice.local_scores
        ]
        result["per_worker_divergence"] = o.choice.divergence
    # EVALUATION
    result |= o.evaluation
    # USER_MODEL
    if model_kind(cfg.model.name) in USER_KINDS:
        result["user_model"] = user_model_info(cfg, o.model, ds)
    # CHECKPOINT
    c = o.checkpoints
    if c is not None:
        result["checkpoints_written"] = len(c.save_times)
        result["checkpoint_time_s"] = summarize(c.save_times)
        result["restarts"] = c.restarts
        result["storage"] = STORAGE
        if c.resumed_from is not None:
            result["resumed_from"] = c.resumed_from
            result["lost_time_s"] = c.lost_time_s
    _check(result, {**KEYS, **own}, "result.json")
    return result


def user_model_info(cfg: Config, model: nn.Module, ds) -> dict[str, Any]:
    """A user's model, as model.pt and result.json record it: its recipe, class, parameters."""
    from gnnpar.models import user

    rec = user.recipe(
        cfg.model, int(ds.num_features), int(ds.num_classes), getattr(ds, "data", None)
    )
    module = user.user_module(model)
    cls = type(module)
    return {
        **rec,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "parameters": sum(p.numel() for p in module.parameters()),
    }


def _check(keys, declared: dict[str, str], what: str) -> None:
    unknown = [k for k in keys if k not in declared]
    if unknown:  # a programming error, not user input
        raise RuntimeError(f"{what} has keys that gnnpar.result does not declare: {unknown}")


def versions() -> dict[str, str]:
    import torch_geometric

    from gnnpar._version import __version__

    return {
        "torch": str(torch.__version__),
        "torch_geometric": torch_geometric.__version__,
        "gnnpar": __version__,
        "python": platform.python_version(),
    }


def machine(device: torch.device | str = "cpu") -> dict[str, Any]:
    accel = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu_count": os.cpu_count(),
        "accelerator": accel,
        "device": torch.device(device).type,  # where the ranks trained: "cuda" or "cpu"
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


def write_result(result: dict[str, Any], out_dir: str | os.PathLike) -> Path:
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:  # a programming error, not user input
        raise RuntimeError(f"result.json is missing required keys: {missing}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    tmp = path.with_suffix(".json.tmp")
    text = json.dumps(result, indent=2, sort_keys=False, default=_jsonable)
    with resources.writing(path, len(text.encode())):  # a full disk: one message, exit 2
        try:
            tmp.write_text(text)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


def _jsonable(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


# --------------------------------------------------------------------------------- model.pt

FORMAT = "gnnpar-model-1"


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary name, fsync, rename: a reader sees the old file or the new."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with resources.writing(path, _tensor_bytes(obj)):  # a full disk: one message, exit 2
            with open(tmp, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (dicts, lists, tuples): what torch.save writes,
    less its few KiB of pickled structure."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def save_model(path: Path, model: nn.Module, cfg, ds, result: dict[str, Any]) -> Path:
    user = model_kind(cfg.model.name) in USER_KINDS
    if user:  # the user's module in its own layout (no gnnpar wrapper): rebuilt from its recipe
        from gnnpar.models.user import user_module

        model_info = user_model_info(cfg, model, ds)
        model = user_module(model)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    # plain JSON-able values only, so that the file loads with weights_only=True
    meta = json.loads(
        json.dumps(
            {
                "model": dataclasses.asdict(cfg.model),
                "in_dim": int(ds.num_features),
                "num_classes": int(ds.num_classes),
                "multilabel": bool(ds.multilabel),
                "config": cfg.to_dict(),
                "dataset": {"name": ds.name, **getattr(ds, "info", {})},
                "final_model": result.get("final_model"),
                "scores": {k: result.get(f"{k}_score") for k in ("val", "test")},
                "versions": result.get("versions"),
                **({"user_model": model_info} if user else {}),
            },
            default=str,
        )
    )
    atomic_save({"format": FORMAT, "state_dict": state, **meta}, path)
    return path


def read_model_file(run: str | os.PathLike) -> dict[str, Any]:
    """The dict in ``RUN/model.pt`` (or a model.pt path), checked; UsageError if unusable."""
    path = Path(run)
    if path.is_dir():
        path = path / "model.pt"
    if not path.is_file():
        raise UsageError(
            f"No model file at {path}: give the folder of a finished run (it holds model.pt)."
        )
    try:
        payload = safe_load.torch_load(path)  # weights_only: tensors and plain values
    except safe_load.Refused as e:
        raise UsageError(
            f"{path} is not a gnnpar model file: {e.why()}, and gnnpar reads model files "
            "without running code from them. Use the model.pt a gnnpar run wrote."
        ) from None
    except Exception as e:  # zip/pickle/EOF errors of a damaged file
        raise UsageError(
            f"{path} is not a readable gnnpar model file ({type(e).__name__})."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UsageError(f"{path} is not a gnnpar model file (format {FORMAT} expected).")
    wrong = [key for key, kind in FIELDS.items() if not isinstance(payload.get(key), kind)]
    if wrong:
        raise UsageError(f"{path} is a damaged gnnpar model file (its {', '.join(wrong)}).")
    payload["path"] = str(path)
    return payload


FIELDS = {"state_dict": dict, "model": dict, "config": dict, "in_dim": int, "num_classes": int}


def build_from(payload: dict[str, Any]) -> nn.Module:
    """The model described by a model file's dict, with its weights, in eval mode on CPU."""
    from gnnpar.models import build_model

    try:
        if isinstance(payload.get("user_model"), dict):  # a user's model: its own module back
            from gnnpar.models.user import rebuild

            return rebuild(payload).eval()
        mcfg = ModelConfig(**payload["model"])
        model = build_model(mcfg, payload["in_dim"], payload["num_classes"], payload["multilabel"])
        model.load_state_dict(payload["state_dict"])
    except UsageError:
        raise
    except Exception as e:  # settings or weights that do not fit together: not what gnnpar wrote
        where = payload.get("path", "the model file")
        raise UsageError(
            f"{where}: its model cannot be rebuilt ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''})."
        ) from None
    return model.eval()


def load_model(run: str | os.PathLike) -> nn.Module:
    """``gnnpar.load(RUN_DIR)``: the run's final model, ready to call as ``model(x, edge_index)``."""
    return build_from(read_model_file(run))
