"""The settings shared by tests/lightning/lit_ranks.py (the rank processes) and the tests that
read its runs: the `gnnpar train` flags they are compared with, and the data module's.

tests/lightning/ has no ``__init__.py`` on purpose: with tests/ on ``sys.path`` (pyproject's
``pythonpath``), a package named ``lightning`` there would shadow PyTorch Lightning itself.
"""

from __future__ import annotations

from gnnpar.configure import build_config

FLAGS = {
    "dataset": "cora",
    "model": "sage",
    "strategy": "sampled",
    "workers": 2,
    "layers": 2,
    "hidden": 16,
    "fanouts": "5,5",
    "batch_size": 16,
    "epochs": 2,
    "seed": 0,
}
DATA = {"batch_size": 16, "fanouts": [5, 5], "seed": 0}


def config(dropout: float):
    return build_config(None, {**FLAGS, "dropout": dropout})
