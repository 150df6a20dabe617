"""One training run, top to bottom: config -> checks -> ranks -> dataset -> plan -> loop -> result.

    gnnpar train --dataset cora --model gat                          # 1 process
    gnnpar train --dataset cora --model gat --strategy allreduce \\
        --partitions 8 --workers 2                                   # 2 local ranks
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:29500 \\
        -m gnnpar train --strategy gossip ...                        # 2 machines

:func:`prepare` builds the run's :class:`~gnnpar.parallel.parallel_dims.ParallelDims` from the
strategy's spec (:mod:`gnnpar.strategies.registry`) and runs its checks once, before any process
starts; every rank is handed those degrees. ``--workers N`` (when not already under
torchrun) then starts N local ranks through torch's elastic launcher; each runs
:func:`run_rank`, which is also what torchrun's ranks run: the strategy builds its
:class:`~gnnpar.training.loop.Plan` and :func:`gnnpar.training.loop.train` trains it.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gnnpar.config.schema import Config
from gnnpar.data.datasets import load_dataset
from gnnpar.data.prepared import is_sharded
from gnnpar.data.shards import load_shard_host
from gnnpar.errors import UsageError
from gnnpar.models.presets import is_user_model
from gnnpar.parallel import collectives
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.result import build_result, save_model, write_result
from gnnpar.runtime import dist, launch, shard_hosts, slurm
from gnnpar.runtime.footprint import check_memory
from gnnpar.runtime.heartbeat import Heartbeat
from gnnpar.strategies import registry
from gnnpar.training.checkpoint import Checkpointer, checkpoint_folders
from gnnpar.training.checkpoint import clear as clear_checkpoints
from gnnpar.training.loop import Outcome, train


def prepare(cfg: Config) -> ParallelDims:
    """The run's parallel degrees, and every check of the strategy that needs no data: once,
    before any rank starts (each rank of torchrun runs it for itself, before joining the group).
    """
    spec = registry.get(cfg.strategy.name)
    dims = spec.parallel_dims(cfg, dist.env_world_size())
    spec.check(cfg, dims)
    if is_user_model(cfg.model.name):  # its module imports and its factory or class exists
        from gnnpar.models.user import resolve_target

        resolve_target(cfg.model.name)
    if cfg.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UsageError(
            "--tensorboard needs the tensorboard package, which is not installed: "
            "pip install tensorboard (or gnnpar[tensorboard]), or drop --tensorboard."
        )
    return dims


def default_out(cfg: Config) -> str:
    """``runs/<YYYYmmdd-HHMMSS>-<dataset>-<model>-<strategy>``."""
    dataset = Path(cfg.data.dataset.rstrip("/")).stem.replace(":", "-") or "data"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model = cfg.model.name.replace(":", "-")  # pyg:GIN, mymodels:build
    return str(Path("runs") / f"{stamp}-{dataset}-{model}-{cfg.strategy.name}")


_CREATED: list[Path] = []  # the folders check_out made in this process, outermost first


def check_out(out: str) -> None:
    """The output folder can be created and written, before any training starts.

    The folders it creates for that are remembered: a command that then fails before writing
    anything into them removes them again (:func:`discard_unused_out`), so a failed run leaves
    no empty folder behind."""
    path = Path(out)
    try:
        missing = [p for p in (path, *path.parents) if not p.exists() and not p.is_symlink()]
        if path.exists() and not path.is_dir():
            raise UsageError(f"--out {out} is a file; give a folder (it will hold result.json).")
        path.mkdir(parents=True, exist_ok=True)
        _CREATED.extend(reversed(missing))
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        discard_unused_out()
        raise UsageError(
            f"--out {out} cannot be written ({e.strerror or e}); choose a writable folder."
        ) from None


def discard_unused_out(keep: bool = False) -> list[Path]:
    """Remove the folders :func:`check_out` created that are still empty, innermost first (a
    folder that holds anything stays, and so do the folders around it); ``keep``: remove none,
    only forget them (the command succeeded). Returns what was removed."""
    removed = []
    while _CREATED:
        folder = _CREATED.pop()
        if keep:
            continue
        try:
            folder.rmdir()  # only an empty folder: never anything a run wrote
        except OSError:
            continue
        removed.append(folder)
    return removed


def run(cfg: Config) -> dict[str, Any] | None:
    """Entry point of ``gnnpar train``: launch local ranks if asked, else train in this process.

    Without ``--out`` the run goes to :func:`default_out`; the folder is checked first. A task
    started by ``srun`` takes its rank from SLURM first (:func:`gnnpar.runtime.slurm.adopt`)."""
    slurm.adopt()
    dims = prepare(cfg)
    if cfg.run.out is None and not dist.launched_by_torchrun():
        cfg.run.out = default_out(cfg)
    if cfg.run.out is not None:
        check_out(cfg.run.out)
    if cfg.run.resume and not checkpoint_folders(cfg.run.out):
        raise UsageError(
            f"--resume: {cfg.run.out}/checkpoints/ holds no complete checkpoint to continue "
            "from (was the run started with --checkpoint-every N?)."
        )
    if not dist.launched_by_torchrun() and not cfg.run.resume:
        clear_old_checkpoints(cfg)  # one agent (or none): its restarts resume from them
    if dims.world > 1 and not dist.launched_by_torchrun():
        launch.check_ranks(dims.world)
        outputs = launch.launch(
            _rank_main,
            (cfg.to_dict(), dims),
            dims.world,
            cfg.strategy.timeout_s,
            cfg.run.threads,
            cfg.run.max_restarts,
            warm=RANK_MODULES,
        )
        return outputs.get(0)
    return run_rank(cfg, dims, direct=True)


def clear_old_checkpoints(cfg: Config) -> None:
    """A fresh run's --out must not hold an earlier run's checkpoints: a restart would resume
    from them."""
    if cfg.run.out and clear_checkpoints(cfg.run.out):
        print(f"gnnpar: removed the earlier run's checkpoints in {cfg.run.out}/checkpoints/")


RANK_MODULES = launch.TRAIN_RANK_MODULES  # imported by the fork server, before any rank


def _rank_main(cfg_dict: dict[str, Any], dims: ParallelDims, log_dir: str) -> dict[str, Any] | None:
    """What every local rank runs (module level so that ``spawn`` can pickle it)."""
    # An exception propagates to torch's @record wrapper, which writes "<Type>: <message>" and
    # the traceback into the agent's per-rank error file, where the launcher reads it back; a
    # collective that failed because of a peer is told in gnnpar's words (run_rank).
    return run_rank(Config.from_dict(cfg_dict), dims)


def set_threads(cfg: Config, local_world: int) -> None:
    threads = cfg.run.threads or max(1, (os.cpu_count() or 1) // max(local_world, 1))
    torch.set_num_threads(threads)


def run_rank(cfg: Config, dims: ParallelDims, direct: bool = False) -> dict[str, Any] | None:
    """One rank of the run (``dims``: :func:`prepare`'s): join the group, load the data, train,
    write result.json and model.pt (rank 0). ``direct``: not a rank of gnnpar's launcher (one
    process alone, or a rank of torchrun or srun): without --out, use rank 0's
    :func:`default_out`; under torchrun a first attempt clears the earlier run's checkpoints
    once the ranks agree that it is one."""
    ctx = dist.setup(cfg.strategy.timeout_s)
    beats = None
    if ctx.heartbeat_store is not None:  # a stalled peer is named within --timeout
        beats = Heartbeat(ctx.heartbeat_store, ctx.rank, ctx.world_size, cfg.strategy.timeout_s)
        beats.start()
    try:
        if cfg.run.out is None and direct:  # each rank of torchrun would stamp its own
            cfg.run.out = collectives.broadcast_object(default_out(cfg))
            if ctx.is_main:
                check_out(cfg.run.out)
        if direct and dist.launched_by_torchrun() and not cfg.run.resume and ctx.restarts == 0:
            # each host's agent counts only its own ranks' failures: a host restarted for
            # another's would otherwise take its attempt for a fresh run and lose its parts
            clear_old_checkpoints(cfg)
            collectives.barrier()  # no rank writes a checkpoint before every rank has cleared
        set_threads(cfg, ctx.local_world_size)
        d = cfg.data
        across = False
        if ctx.is_distributed and is_sharded(d.dataset):  # every host's shard, before any step
            across = shard_hosts.agree(
                ctx.store, ctx.rank, ctx.world_size, d.dataset, cfg.strategy.timeout_s,
                across=registry.get(cfg.strategy.name).across_shards,
            )  # fmt: skip
        if across:  # each host holds only its shard: the sampled strategy trains across them
            ds = load_shard_host(d.dataset, shard_hosts.host_index())
        else:
            ds = load_dataset(d.dataset, d.data_root, d.scale, cfg.run.seed, cfg.strategy.timeout_s)
        outcome = train_rank(cfg, ds, ctx, dims)
        result = build_result(cfg, outcome, ds, ctx.world_size, ctx.device)
        if ctx.is_main and cfg.run.out:
            out = Path(cfg.run.out)
            save_model(out / "model.pt", outcome.model, cfg, ds, result)
            write_result(result, out)
        return result if ctx.is_main else None
    except RuntimeError as e:  # a collective failed because of a peer: who and why, in our words
        message = dist.peer_failure(e)  # (here, while the heartbeat watch's view still holds)
        if message is None or isinstance(e, dist.CollectiveFailedError):
            raise
        raise dist.CollectiveFailedError(message) from e
    finally:
        if beats is not None:
            beats.stop()
        dist.teardown()


def train_rank(cfg: Config, ds, ctx: dist.DistContext, dims: ParallelDims) -> Outcome:
    """The strategy's plan for this rank, trained by the one loop."""
    # before the model is allocated; may turn --recompute on for a ViG batch that fits only so
    spec = registry.get(cfg.strategy.name)
    mem = spec.memory(ds.kind)
    check_memory(
        cfg,
        ds,
        ctx.local_world_size,
        ctx.device,
        announce=ctx.is_main,
        stages=dims.stages,
        step_rows=mem.step_rows,
        batch_sized=mem.batch_sized,
    )
    plan = spec.build(cfg, ds, ctx, dims)
    plan.device = plan.device or ctx.device
    return train(cfg, plan, checkpointer(cfg, ctx))


def checkpointer(cfg: Config, ctx: dist.DistContext) -> Checkpointer | None:
    """The run's checkpoints: written with --checkpoint-every(-steps), read back with --resume
    and on every restart of the elastic agent (--max-restarts, or torchrun's)."""
    r = cfg.run
    if not r.out or not (r.checkpoint_every or r.checkpoint_every_steps or r.resume):
        return None
    every, steps = r.checkpoint_every, r.checkpoint_every_steps
    ckpt = Checkpointer(r.out, ctx.rank, ctx.world_size, every, steps, r.resume or ctx.restarts > 0)
    ckpt.restarts = ctx.restarts
    ckpt.config = cfg.to_dict()
    ckpt.explicit = r.resume
    return ckpt
