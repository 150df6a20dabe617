"""A sampled batch is let go before the next one is made: neither the sampled source's epoch
generator nor the training loop keeps the last step's batch while its successor is gathered
(on synthetic-reddit a batch's features are ~480 MB: held, they were in memory twice)."""

from __future__ import annotations

import gc
import weakref

import torch

from gnnpar.training.sources import SampledSource


class _Data:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def to(self, device):  # noqa: ANN001, ANN201
        return self


class _Batch:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def to_data(self) -> _Data:
        return _Data(self.x)


def test_the_sources_epoch_keeps_no_batch_while_the_next_is_made():
    alive: list[weakref.ref] = []

    def make() -> _Batch:  # the loader's batch; no frame of the fake keeps it
        gc.collect()
        assert all(r() is None for r in alive), "the last batch is still held"
        x = torch.zeros(8)
        alive.append(weakref.ref(x))
        return _Batch(x)

    def batches():
        for _ in range(4):
            yield make()

    src = SampledSource.__new__(SampledSource)
    src._it, src.position, src.steps, src.on_disk = batches(), 0, 4, False
    src.features, src.device = None, torch.device("cpu")
    it = src.epoch(0)
    seen = 0
    while True:  # as the training loop takes its batches (gnnpar.training.loop)
        batch = None
        batch = next(it, StopIteration)
        if batch is StopIteration:
            break
        seen += 1
    assert seen == 4
