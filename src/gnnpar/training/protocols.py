"""What the loop (:mod:`gnnpar.training.loop`) calls on a plan's parts: every method, declared.

:class:`Source` (batches, epoch by epoch) and :class:`Sync` (what happens between steps) are
the two protocols a strategy implements; the loop calls each of their members directly and
probes for nothing. The defaults live in two small base classes that every part derives from:
:class:`BaseSource` here (no state, nothing to report, nothing to close) and
:class:`gnnpar.training.sync.NoSync` (nothing between steps). A part overrides what it has.

=================  ===========================================================================
``Source``         the loop calls
=================  ===========================================================================
``total_steps``    once, for the progress bar
``position``       after every step: steps done so far (by every rank, where the source knows)
``epoch(e)``       per epoch: this rank's batches; None for a step it sits out (the uneven
                   last step of a static split: it still takes part in the step's collective)
``pause()``        before a checkpoint's barrier: stop anything another rank may wait on
                   (a subgraph served across shards), as ``Sync.pause``, which follows it
``state()``        at a checkpoint: what resuming needs (plain values and tensors)
``load_state(s)``  on resume, with what ``state()`` gave (None where it gave None)
``skip(steps)``    on resume, after ``load_state``: ``steps`` of the resumed epoch were done
``epoch_info(e)``  after epoch ``e``: values for its metrics.jsonl record (the reporting rank's)
``rank_info()``    at the end: per-rank result.json values (:data:`gnnpar.result.RANK_INFO`)
``close()``        at the end of training, before the final evaluation: stop workers
=================  ===========================================================================

=====================  =======================================================================
``Sync``               the loop calls
=====================  =======================================================================
``start_epoch()``      before an epoch's first batch
``waited_in_step_s()`` after a step's forward and backward: what of it was spent blocked on
                       other ranks (DDP's all-reduce in backward); a straggler's pause is
                       drawn on the rest
``after_backward(b)``  after a step's backward (``b``: this rank had a batch); True: the
                       optimizer steps
``after_step(b)``      after the optimizer step
``end_epoch()``        after an epoch's last step
``finish()``           once, after the last epoch (gossip: serve the last claims)
``pause()``            before a checkpoint's barrier: nothing may still wait on another rank
``unpause()``          after the checkpoint
``status()``           after every step: the progress bar's text
``wait_s``             seconds blocked on other ranks so far (the ``sync`` of the time breakdown)
``exchanges``          averagings this rank took part in (``per_worker_exchanges``)
``state()``            at a checkpoint; ``load_state(s)`` on resume
``rank_info()``        at the end: per-rank result.json values (:data:`gnnpar.result.RANK_INFO`)
=====================  =======================================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Source(Protocol):
    """What a rank trains on (table above)."""

    total_steps: int
    position: int

    def epoch(self, epoch: int) -> Iterator[Any]: ...

    def pause(self) -> None: ...

    def state(self) -> Any: ...

    def load_state(self, state: Any) -> None: ...

    def skip(self, steps: int) -> None: ...

    def epoch_info(self, epoch: int) -> dict[str, Any]: ...

    def rank_info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class BaseSource:
    """The defaults of :class:`Source`: nothing to save, report or close; resuming midway an
    epoch is the subclass's business (it knows whether its epochs can be replayed)."""

    total_steps: int = 0
    position: int = 0

    def epoch(self, epoch: int) -> Iterator[Any]:
        raise NotImplementedError

    def pause(self) -> None:
        pass

    def state(self) -> Any:
        return None

    def load_state(self, state: Any) -> None:
        pass

    def skip(self, steps: int) -> None:
        pass

    def epoch_info(self, epoch: int) -> dict[str, Any]:
        return {}

    def rank_info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


@runtime_checkable
class Sync(Protocol):
    """A sync policy (table above); :class:`gnnpar.training.sync.NoSync` is the base class."""

    @property
    def wait_s(self) -> float: ...

    exchanges: int

    def start_epoch(self) -> None: ...

    def waited_in_step_s(self) -> float: ...

    def after_backward(self, has_batch: bool) -> bool: ...

    def after_step(self, has_batch: bool) -> None: ...

    def end_epoch(self) -> None: ...

    def finish(self) -> None: ...

    def pause(self) -> None: ...

    def unpause(self) -> None: ...

    def status(self) -> str: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...

    def rank_info(self) -> dict[str, Any]: ...
