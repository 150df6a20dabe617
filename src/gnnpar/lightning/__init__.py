"""gnnpar inside PyTorch Lightning: keep your ``LightningModule`` and ``Trainer.fit``, take
gnnpar's data loading, averaging strategies and run records.

    from gnnpar.lightning import GraphDataModule, GossipStrategy, PeriodicAverageStrategy
    dm = GraphDataModule(dataset="cora", batch_size=256, fanouts=[25, 10])
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=3)
    trainer.fit(MyModule(), datamodule=dm)

- :class:`GraphDataModule` (:mod:`gnnpar.lightning.data`): any graph gnnpar reads, as
  neighbour-sampled (gnnpar's sampler and its compiled kernel) or Cluster-GCN mini-batches,
  PyG ``Data`` batches shaped as PyG's ``NeighborLoader`` yields them; one shared-memory graph
  for every rank and loader worker; epoch-exact under Lightning's DDP; resumable mid-epoch.
- :class:`PeriodicAverageStrategy`, :class:`GossipStrategy` (:mod:`gnnpar.lightning.strategies`):
  periodic all-reduce (gradients or parameters, every K steps) and gossip averaging with a
  random free partner over gnnpar's work pool, on Lightning's DDP strategy.
- :class:`RunRecord` and :class:`Slowdown` (:mod:`gnnpar.lightning.callbacks`): gnnpar's
  ``metrics.jsonl``/``result.json`` for a Lightning run, and ``--slowdown``'s emulated straggler.

Lightning is an optional extra: ``pip install "gnnpar[lightning]"``.
"""

import importlib
import importlib.util


def _lightning_installed() -> bool:
    try:
        return importlib.util.find_spec("lightning") is not None
    except (ImportError, ValueError):
        return False


if not _lightning_installed():  # one line, what to do
    raise ImportError(
        'gnnpar.lightning needs PyTorch Lightning, which is not installed: pip install "gnnpar[lightning]"'
    )

# Lightning itself is imported with the first class used: loader workers unpickle
# gnnpar.lightning.batches, which needs only torch and gnnpar's sampler.
_WHERE = {
    "GossipStrategy": "strategies",
    "PeriodicAverageStrategy": "strategies",
    "GraphDataModule": "data",
    "RunRecord": "callbacks",
    "Slowdown": "callbacks",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"gnnpar.lightning.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'gnnpar.lightning' has no attribute {name!r}")
