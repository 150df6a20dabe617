"""gnnpar's averaging strategies as Lightning strategies, on Lightning's ``DDPStrategy``.

    trainer = L.Trainer(strategy=PeriodicAverageStrategy(sync_every=4), devices=2, ...)
    trainer = L.Trainer(strategy=GossipStrategy(sync_every=1), devices=2, max_epochs=5, ...)

Both keep what ``DDPStrategy`` does (process launch, process group, device placement, broadcast
of the initial weights, checkpoint I/O, ``reduce``/``barrier``) but do not wrap the model in
``DistributedDataParallel``: between averagings every rank steps on its own gradients, and the
averaging is one of gnnpar's sync policies, the same objects ``gnnpar train`` runs:

- :class:`PeriodicAverageStrategy` (``--strategy allreduce``): every ``sync_every`` steps the
  gradients are replaced by their mean over the ranks before the optimizer steps
  (``average="grads"``, :class:`gnnpar.training.sync.GradAllReduce`; K = 1 is DDP's maths), or
  the parameters are averaged after it (``average="params"``, local SGD:
  :class:`gnnpar.training.sync.ParamAverage`, torch's ``PeriodicModelAverager``).
- :class:`GossipStrategy` (``--strategy gossip``): every ``sync_every`` steps a rank averages
  with one random free partner (:mod:`gnnpar.parallel.gossip`: the claim protocol checked by its
  SPIN model, exchanges bounded by ``timeout`` that name the partner that stopped answering).
  With :class:`~gnnpar.lightning.data.GraphDataModule` the batches come from gnnpar's work pool:
  every batch of an epoch once, taken by whichever rank is free, so a straggler holds nobody
  up. Before any collective Lightning runs (checkpoints, ``sync_dist`` logging, the end) a rank
  finishes its pending exchange and serves the claims on it (gnnpar's quiescence), so a rank
  waiting in a collective is never picked; it is available again at its next training batch.

Lightning's order of operations: the gradient policy runs in ``post_backward`` (inside the
optimizer's closure, after backward, before ``optimizer.step``) and the parameter policies
after ``optimizer.step``, where gnnpar's loop calls them.

Checkpoints. Between averagings the ranks' models differ, so one rank's state (what Lightning
keeps) cannot resume the others. Both strategies put every rank's own model, optimiser, loop
progress and averaging state (the policy's step counter, gossip's exchange and claim counters)
into Lightning's checkpoint file, under ``"gnnpar_ranks"``, and each rank takes its own back on
``Trainer.fit(ckpt_path=...)`` (after the strategy's setup, so that the broadcast of rank 0's
initial weights does not overwrite it). With :class:`PeriodicAverageStrategy` the ranks are in
step and ``ModelCheckpoint(every_n_train_steps=N)`` works as under DDP: a run resumed from a
checkpoint written mid-epoch trains what the uninterrupted run trains, to the bit. Gossip ranks
never share a step count (each trains what it takes from the pool), so a ``ModelCheckpoint``
that counts steps (or time) would ask the ranks to save at different moments: ``Trainer.fit``
refuses it with one message; ``GossipStrategy(checkpoint_every=N)`` saves instead each time
the work pool has handed out another ``N`` batches, every rank at its next batch boundary (an
agreement through the run's store decides, before any other collective, whether that
checkpoint comes first). The file also holds the
pool's position and each rank's batches taken but not yet trained (loader workers and
Lightning fetch ahead), which the resumed rank trains first: across the interruption every
batch of every epoch is trained once, each rank resumes with its own model, optimiser and
gossip counters, and the exchanges go on from there.
"""

from __future__ import annotations

import datetime
import itertools
import os
import random
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from gnnpar.config.schema import AVERAGE_MODES
from gnnpar.errors import UsageError

RANKS_KEY, RANKS_FORMAT = "gnnpar_ranks", "gnnpar-ranks-1"


def _check(sync_every: int, average: str, timeout: float) -> None:
    if not isinstance(sync_every, int) or sync_every < 1:
        raise UsageError(
            f"sync_every must be at least 1 (average every K steps), got {sync_every}."
        )
    if average not in AVERAGE_MODES:
        raise UsageError(f"Unknown average '{average}'. Choose one of: {', '.join(AVERAGE_MODES)}.")
    if not 0 < timeout <= 7 * 24 * 3600:
        raise UsageError(f"timeout must be positive seconds (at most a week), got {timeout}.")


class _LocalSteps(DDPStrategy):
    """DDPStrategy whose ranks step on their own gradients; ``self.sync`` (a gnnpar sync policy)
    averages between steps."""

    def __init__(
        self, sync_every: int = 1, average: str = "params", timeout: float = 120.0, **kwargs: Any
    ) -> None:
        _check(sync_every, average, timeout)
        kwargs.setdefault("timeout", datetime.timedelta(seconds=timeout))
        super().__init__(**kwargs)
        self.sync_every, self.average, self.timeout_s = sync_every, average, float(timeout)
        self.sync = None  # the policy, from setup() on
        self._resumed: dict[str, Any] | None = None  # the checkpoint's per-rank part, on resume

    def configure_ddp(self) -> None:
        """No DistributedDataParallel: the same initial weights on every rank (rank 0's, as the
        DDP wrapper would broadcast them), then local steps."""
        if dist.is_initialized():
            with torch.no_grad():
                for t in itertools.chain(self.model.parameters(), self.model.buffers()):
                    dist.broadcast(t.data, 0)

    def setup(self, trainer) -> None:
        self._resumed = None  # load_checkpoint (after setup) sets it when this fit resumes
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            params = [p for p in self.lightning_module.parameters() if p.requires_grad]
            self.sync = self._make_sync(params)

    def _make_sync(self, params):  # pragma: no cover - each subclass has its own
        raise NotImplementedError

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        if self.sync is not None:
            self.sync.after_backward(True)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.sync is not None:
            self.sync.after_step(True)
        return out

    # -------------------------------------------------------------- checkpoints
    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Restore after ``setup``: its broadcast of rank 0's initial weights would otherwise
        overwrite each rank's own restored model."""
        return True

    def _rank_state(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """This rank's part of a checkpoint: what differs between the ranks."""
        return {
            "state_dict": checkpoint.get("state_dict"),
            "optimizer_states": checkpoint.get("optimizer_states"),
            "loops": checkpoint.get("loops"),
            "sync": None if self.sync is None else self.sync.state(),
        }

    def _shared_state(self, ranks: list[dict[str, Any]]) -> dict[str, Any]:
        """What the file holds once for all ranks (rank 0, after gathering ``ranks``)."""
        return {}

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None
    ) -> None:
        """Every rank's own state into rank 0's file (every rank calls this: Lightning's
        ``Trainer.save_checkpoint`` does, between two barriers)."""
        mine = self._rank_state(checkpoint)
        if dist.is_initialized() and self.world_size > 1:
            ranks: list[Any] | None = [None] * self.world_size if self.is_global_zero else None
            dist.gather_object(mine, ranks, dst=0)
        else:
            ranks = [mine]
        if self.is_global_zero:
            shared = self._shared_state(ranks)
            saved = {"format": RANKS_FORMAT, "world_size": self.world_size, "ranks": ranks}
            checkpoint = {**checkpoint, RANKS_KEY: {**saved, **shared}}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's checkpoint with this rank's own model, optimiser and loop state in place
        of rank 0's; the averaging state goes back to the policy."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.pop(RANKS_KEY, None)
        self._resumed = None
        if saved is None:  # e.g. written by Lightning's DDP: rank 0's state for every rank
            return checkpoint
        if not isinstance(saved, dict) or saved.get("format") != RANKS_FORMAT:
            raise UsageError(f"{checkpoint_path}: its per-rank state is not gnnpar's.")
        if saved["world_size"] != self.world_size:
            raise UsageError(
                f"{checkpoint_path} was written by {saved['world_size']} ranks, each with its "
                f"own model; this run has {self.world_size}. Resume with the same devices."
            )
        mine = saved["ranks"][self.global_rank]
        for key in ("state_dict", "optimizer_states", "loops"):
            if mine.get(key) is not None:
                checkpoint[key] = mine[key]
        if self.sync is not None and mine.get("sync") is not None:
            self.sync.load_state(mine["sync"])
        self._resumed = saved
        return checkpoint

    @property
    def wait_s(self) -> float:
        """Seconds this rank spent blocked on other ranks in averaging."""
        return 0.0 if self.sync is None else self.sync.wait_s

    @property
    def exchanges(self) -> int:
        return 0 if self.sync is None else self.sync.exchanges


class PeriodicAverageStrategy(_LocalSteps):
    """Average over all ranks every ``sync_every`` steps: the gradients before the optimizer
    step (``average="grads"``) or the parameters after it (``average="params"``, local SGD with
    torch's ``PeriodicModelAverager``). ``timeout``: seconds any collective may wait."""

    def __init__(
        self, sync_every: int = 1, average: str = "grads", timeout: float = 120.0, **kwargs: Any
    ) -> None:
        super().__init__(sync_every, average, timeout, **kwargs)

    def _make_sync(self, params):
        from gnnpar.training.sync import GradAllReduce, ParamAverage

        cls = GradAllReduce if self.average == "grads" else ParamAverage
        return cls(params, self.sync_every)


class GossipStrategy(_LocalSteps):
    """Gossip averaging with one random free partner every ``sync_every`` steps (gnnpar's
    :mod:`~gnnpar.parallel.gossip`), parameters by default (ranks out of step would let
    averaged gradients drift). ``timeout``: seconds an exchange or a claim may wait before the
    run ends with an error naming the partner. ``seed``: the partner choice's generator.
    ``final``: ``"average"`` (at the end of ``fit`` every rank takes the ranks' average model)
    or ``"local"`` (each rank keeps its own; the checkpoints hold every rank's).
    ``checkpoint_every``: save a checkpoint each time the work pool has handed out another
    that many batches (mid-epoch; see the module docstring), into ``checkpoint_dir`` (default
    ``<default_root_dir>/checkpoints``) as ``pool=<position>.ckpt``; resume with
    ``Trainer.fit(..., ckpt_path=...)``."""

    def __init__(
        self,
        sync_every: int = 1,
        average: str = "params",
        timeout: float = 120.0,
        seed: int = 0,
        final: str = "average",
        checkpoint_every: int | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sync_every, average, timeout, **kwargs)
        if final not in ("average", "local"):
            raise UsageError(f"final must be 'average' or 'local', got {final!r}.")
        if checkpoint_every is not None and (
            not isinstance(checkpoint_every, int) or checkpoint_every < 1
        ):
            raise UsageError(
                "checkpoint_every must be at least 1 (batches of the work pool between "
                f"checkpoints), got {checkpoint_every!r}."
            )
        self.seed, self.final = seed, final
        self.checkpoint_every, self.checkpoint_dir = checkpoint_every, checkpoint_dir
        self.store = None
        self.pools = 0
        self.pool = None  # the current fit's work pool and this rank's sampler of it
        self.sampler = None
        self.saved: list[str] = []  # the pool checkpoints this fit wrote
        self._paused = False
        self._finished = False
        self._round = 0  # the agreement's round (module docstring), the same on every rank
        self._saving = False
        self._started = 0  # training batches started in this fit
        self._next_mark: int | None = None
        self._pool_counter: int | None = None  # during a pool checkpoint: the pool's position

    # -------------------------------------------------------------- set-up
    def _make_store(self) -> dist.Store:
        """A key-value store of this run's own (the gossip claims and the work pool's counter):
        rank 0 serves it on a free port that every rank learns through the process group."""
        timeout = datetime.timedelta(seconds=self.timeout_s)
        host = self.cluster_environment.main_address
        if self.global_rank == 0:
            store = dist.TCPStore(host, 0, None, True, timeout, wait_for_workers=False)
            port = [store.port]
        else:
            port = [None]
        dist.broadcast_object_list(port, 0)
        if self.global_rank != 0:
            store = dist.TCPStore(host, port[0], None, False, timeout)
        return dist.PrefixStore("gnnpar-lightning", store)

    def _make_sync(self, params):
        from gnnpar.parallel.gossip import AnyPeer, Pairing
        from gnnpar.training.gossip_sync import GossipSync

        self.store = self._make_store() if dist.is_initialized() else dist.HashStore()
        rank, world = self.global_rank, self.world_size
        rng = random.Random(self.seed * 7919 + rank)
        pairing = Pairing(self.store, "gossip", AnyPeer(rank, world), rng, self.timeout_s)
        pairing.open()
        if dist.is_initialized():
            dist.barrier()  # every rank's state key exists before anybody claims
        return GossipSync(pairing, params, self.average, self.sync_every, self.timeout_s)

    def setup_environment(self) -> None:
        """Refuse what cannot run out of step (:func:`_refuse_step_checkpoints`) before any
        process group exists, then Lightning's set-up."""
        try:
            trainer = self.lightning_module.trainer
        except (AttributeError, RuntimeError):  # no module attached: nothing to check
            trainer = None
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            _refuse_step_checkpoints(trainer.callbacks)
        super().setup_environment()

    def setup(self, trainer) -> None:
        super().setup(trainer)
        self._paused = self._finished = self._saving = False
        self._round = self._started = 0
        self._next_mark, self.pool, self.sampler, self.saved = None, None, None, []
        _unlock_batches(trainer)
        if self.checkpoint_every is not None and not any(
            isinstance(c, _PoolCheckpoints) for c in trainer.callbacks
        ):
            trainer.callbacks.append(_PoolCheckpoints(self))

    def work_pool(self, size: int, epochs: int, seed: int, start_epoch: int = 0):
        """gnnpar's shared work pool of ``size`` items per epoch (each once per epoch, to
        whichever rank takes it). A run resumed at ``start_epoch`` starts the pool there. Every
        rank calls this, in the same order (the data module's ``train_dataloader``)."""
        from gnnpar.parallel.gossip import WorkPool

        if self.store is None:
            raise RuntimeError("GossipStrategy.work_pool() before the strategy's setup()")
        self.pools += 1
        pool = WorkPool(self.store, f"pool/{self.pools}", size, epochs, seed)
        counter = start_epoch * size
        if self._resumed is not None and "pool" in self._resumed:
            saved = self._resumed["pool"]
            if (saved["size"], saved["epochs"], saved["seed"]) != (size, epochs, seed):
                raise UsageError(
                    f"The checkpoint's work pool had {saved['size']} batches per epoch, "
                    f"{saved['epochs']} epochs and seed {saved['seed']}; this run's has {size}, "
                    f"{epochs} and {seed}: resume with the same data settings and max_epochs."
                )
            counter = saved["counter"]
        if counter and self.global_rank == 0:
            pool.restore(counter)
        if self.checkpoint_every is not None:
            every = self.checkpoint_every
            self._next_mark = (counter // every + 1) * every
        self.pool = pool
        if dist.is_initialized():
            dist.barrier()
        return pool

    def pending_items(self) -> list[list[int]]:
        """On a resume: the batches ``[epoch, item]`` this rank had taken from the pool but not
        trained when the checkpoint was written (its sampler gives them first)."""
        if self._resumed is None or "pool" not in self._resumed:
            return []
        return [list(x) for x in self._resumed["pool"]["pending"][self.global_rank]]

    # -------------------------------------------------------------- pool checkpoints
    def _want_checkpoint(self) -> bool:
        if self._next_mark is None or self.sampler is None or self.pool is None:
            return False
        return self._next_mark < self.pool.total and self.sampler.seen >= self._next_mark

    def _round_key(self) -> str:
        return f"checkpoint/{self.pools}/{self._round}"

    def _checkpoint_round(self, before_collective: bool) -> None:
        """The agreement (module docstring). At a batch's end: join a checkpoint another
        rank asked for in this round, or ask for one when the pool passed the next mark. Before
        any other collective: close the round (no checkpoint before that collective), or join
        the checkpoint already asked for and then close the next round."""
        if self.checkpoint_every is None or self.store is None or self._saving:
            return
        if self._finished or self.pool is None:
            return
        while True:
            key = self._round_key()
            if before_collective:
                got = self.store.compare_set(key, "", "closed")
            elif self._want_checkpoint():
                got = self.store.compare_set(key, "", "save")
            elif self.store.check([key]):
                got = self.store.get(key)
            else:
                return
            if got == b"save":
                self._save_pool_checkpoint()
                if before_collective:
                    continue
                return
            if before_collective:  # closed: every rank comes to this collective, then round+1
                self._round += 1
            return

    def _save_pool_checkpoint(self) -> None:
        trainer = self.lightning_module.trainer
        self._saving = True
        try:
            self._quiesce()
            if dist.is_initialized():
                dist.barrier()  # every rank here: nobody takes from the pool until the end
            counter = self.pool.handed_out()
            folder = self.checkpoint_dir or os.path.join(trainer.default_root_dir, "checkpoints")
            path = os.path.join(os.fspath(folder), f"pool={counter}.ckpt")
            self._pool_counter = counter  # what save_checkpoint writes with every rank's part
            trainer.save_checkpoint(path)
            self.saved.append(path)
            every = self.checkpoint_every
            self._next_mark = (counter // every + 1) * every
            self._round += 1
        finally:
            self._saving = False
            self._pool_counter = None

    def _rank_state(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        state = super()._rank_state(checkpoint)
        if self.sampler is not None and self._pool_counter is not None:
            state["pending"] = self.sampler.untrained(self._started)
        return state

    def _shared_state(self, ranks: list[dict[str, Any]]) -> dict[str, Any]:
        pending = [r.pop("pending", None) for r in ranks]
        pool, counter = self.pool, self._pool_counter
        if pool is None or counter is None:  # an epoch-end checkpoint: the pool restarts there
            return {}
        keys = {"counter": counter, "size": pool.size, "epochs": pool.epochs, "seed": pool.seed}
        return {"pool": {**keys, "pending": pending}}

    # -------------------------------------------------------------- out of step
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self.sync is None or self._finished:
            return
        if self._paused:
            self.sync.unpause()
            self._paused = False
        if batch_idx == 0:
            self.sync.start_epoch()
        self._started += 1

    def _quiesce(self) -> None:
        """Before a collective: settle the checkpoint round, then finish our pick and serve the
        claims on us (gnnpar's pause)."""
        self._checkpoint_round(before_collective=True)
        if self.sync is not None and not self._paused and not self._finished:
            self.sync.pause()
            self._paused = True

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._quiesce()
        super().barrier(*args, **kwargs)

    def broadcast(self, obj, src: int = 0):
        self._quiesce()
        return super().broadcast(obj, src)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        self._quiesce()
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def all_gather(self, tensor, group=None, sync_grads: bool = False):
        self._quiesce()
        return super().all_gather(tensor, group=group, sync_grads=sync_grads)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        self._quiesce()
        return super().reduce_boolean_decision(decision, all=all)

    def on_train_end(self) -> None:
        """The study's clean-up (finish our pick, serve the claims left, wait for every rank),
        then, with ``final="average"``, every rank's model becomes the ranks' average (gnnpar's
        "average" candidate), so that testing and saving see one model."""
        if self.sync is not None and not self._finished:
            self._checkpoint_round(before_collective=True)
            self._paused = False
            self.sync.finish()
            self._finished = True
            if self.final == "average" and dist.is_initialized():
                from torch.distributed.algorithms.model_averaging.utils import average_parameters

                with torch.no_grad():
                    average_parameters(iter(self.sync.params), dist.group.WORLD)
        super().on_train_end()

    @property
    def exchange_log(self) -> list:
        return [] if self.sync is None else self.sync.log


def _refuse_step_checkpoints(callbacks: list) -> None:
    """A ``ModelCheckpoint`` that saves every N training steps or every T seconds cannot run
    under :class:`GossipStrategy`: the ranks train different numbers of batches at different
    paces, so it would ask one rank to save (a collective: every rank writes its part) while the
    others train on, a hang until the timeout. Refused with one message that names the way that
    works (``checkpoint_every``, or checkpoints at epoch ends). ``ModelCheckpoint`` keeps the two
    settings in attributes only (no public accessor in Lightning 2.2-2.6): they are read here, and
    tests/lightning/test_data_module.py checks that they exist in the Lightning installed."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    for cb in callbacks:
        if not isinstance(cb, ModelCheckpoint):
            continue
        steps = getattr(cb, "_every_n_train_steps", 0) or 0
        interval = getattr(cb, "_train_time_interval", None)
        if steps < 1 and interval is None:
            continue
        what = f"every_n_train_steps={steps}" if steps >= 1 else f"train_time_interval={interval}"
        raise UsageError(
            f"ModelCheckpoint({what}) cannot run under GossipStrategy: its ranks train different "
            "numbers of batches, so a checkpoint by steps or time would ask them to save at "
            "different moments. Save mid-epoch with GossipStrategy(checkpoint_every=N) (every N "
            "batches of the work pool), or at epoch ends with ModelCheckpoint(every_n_epochs=...)."
        )


class _PoolCheckpoints(Callback):
    """GossipStrategy's batch boundary for its pool checkpoints: the end of a training batch,
    where ``ModelCheckpoint(every_n_train_steps)`` saves too (the loop state Lightning's
    mid-epoch resume expects). Not the end of a rank's last batch of an epoch: resumed from
    there, Lightning (2.6) counts the epoch as done but keeps its "last batch" flag, and the
    next epoch ends before its first batch where the loader has no length (the pool's); the
    rank answers at its next boundary instead (the next epoch's first batch, or a
    collective)."""

    def __init__(self, strategy: GossipStrategy) -> None:
        self.strategy = strategy

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.strategy is not self.strategy:
            return
        if not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self.strategy._checkpoint_round(before_collective=False)


# Lightning releases whose training loop GossipStrategy has been checked against (pyproject's
# `lightning` extra pins the same range)
LIGHTNING_CHECKED = ((2, 2), (2, 7))


def _unlock_batches(trainer) -> None:
    """Let the ranks run their training batches out of step: Lightning's one per-batch collective
    is replaced by each rank's own SIGTERM check.

    Why: from Lightning 2.5.2 on (its pull request #20825), ``_TrainingEpochLoop.advance``
    broadcasts a SIGTERM flag from rank 0 before every training batch, on the default process
    group, whenever ``torch.distributed.is_initialized() and trainer.world_size > 1``. That
    holds every rank to rank 0's pace and, once the work pool gives the ranks different numbers
    of batches (its point), pairs one rank's broadcast with another's next collective: a hang.

    Why a private name: Lightning offers no public way around that broadcast. It runs before
    any hook of the batch (``on_train_batch_start`` of callbacks, modules and strategies comes
    after it), no ``Trainer`` setting turns it off (2.6.x; an open upstream proposal,
    pull request #21640, would only space it out), and its two conditions are the run's world
    itself: a strategy reporting ``world_size == 1`` would break the samplers, logging and
    checkpoints, and a run without a default process group of all ranks would need every
    collective of the strategy and of gnnpar's gossip transport rebuilt on a hand-made group.
    So the loop's method is replaced on this trainer's loop instance only, and only in the
    Lightning releases checked (:data:`LIGHTNING_CHECKED`, pinned by the ``lightning`` extra):
    outside them the strategy stops with a message instead of risking a hang. Lightning still
    checks SIGTERM on every rank after each batch (``trainer.received_sigterm``), so a rank
    that receives one stops there; the check below stops it before its next batch as well."""
    import lightning

    version = tuple(int(p) for p in lightning.__version__.split(".")[:2] if p.isdigit())
    low, high = LIGHTNING_CHECKED
    if not low <= version < high:
        raise UsageError(
            f"GossipStrategy needs Lightning {low[0]}.{low[1]} to before {high[0]}.{high[1]} "
            f"(installed: {lightning.__version__}): its ranks run their batches out of step, "
            "which newer releases are not checked for. Install a release in that range: "
            f'pip install "lightning>={low[0]}.{low[1]},<{high[0]}.{high[1]}".'
        )
    loop = trainer.fit_loop.epoch_loop
    if hasattr(type(loop), "_broadcast_sigterm_tensor"):  # 2.5.2 on; absent before
        loop._broadcast_sigterm_tensor = _own_sigterm(trainer)


def _own_sigterm(trainer):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    def check() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    return check
