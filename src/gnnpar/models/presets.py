"""Study defaults of each model: the settings a run gets when the user does not choose them.

Plain data and one function, imported by :func:`gnnpar.configure.resolve`; nothing here
imports torch, so reading the defaults (``gnnpar train --help``, config checks) stays cheap.

    >>> study_defaults("gat", "cora")["lr"]
    0.005
"""

from __future__ import annotations

from typing import Any

from gnnpar.targets import TARGET

# Used for any setting a model's table does not name (and for names that validate() rejects).
FALLBACK: dict[str, Any] = dict(
    hidden=64, layers=2, heads=1, dropout=0.5, lr=0.01, weight_decay=0.0, epochs=100
)

STUDY_DEFAULTS: dict[str, dict[str, Any]] = {
    # Kipf & Welling: 16 hidden, dropout 0.5, lr 0.01, wd 5e-4, 200 epochs
    "gcn": dict(hidden=16, layers=2, heads=1, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200),
    # study 001: GAT 8x8, dropout 0.6, Adam lr 0.005, wd 5e-4, 300 epochs
    "gat": dict(hidden=8, layers=2, heads=8, dropout=0.6, lr=0.005, weight_decay=5e-4, epochs=300),
    # study 002: 3 layers x 16, 1 head, dropout 0.6, Adam lr 5e-3, wd 5e-4
    "gat3": dict(hidden=16, layers=3, heads=1, dropout=0.6, lr=5e-3, weight_decay=5e-4, epochs=20),
    # study 002: 3 x 256 dropout 0.5; study 003: 2 hidden layers (3 convs) 128/512, lr 1e-2
    "sage": dict(hidden=256, layers=3, heads=1, dropout=0.5, lr=5e-3, weight_decay=5e-4, epochs=20),
    # study 000: 8 ViG blocks of C = 107 channels (138K parameters each, see models/vig.py);
    # the study trains with Adam (accuracy was not its focus)
    "vig": dict(hidden=107, layers=8, heads=1, dropout=0.0, lr=1e-3, weight_decay=0.0, epochs=1),
}

# Study 003 table 3.3 (Cluster-GCN on Reddit / Amazon): replaces the above for sage (except
# under --strategy sampled, which follows study 002's table 1) and gcn (3 layers) on these.
BIG_DATASETS = ("reddit", "amazon", "synthetic-reddit", "synthetic-amazon")
AMAZON_DATASETS = ("amazon", "synthetic-amazon")
STUDY003_REDDIT: dict[str, Any] = dict(
    hidden=128, dropout=0.2, lr=1e-2, weight_decay=0.0, epochs=30
)
STUDY003_AMAZON: dict[str, Any] = dict(
    hidden=512, dropout=0.1, lr=1e-2, weight_decay=0.0, epochs=30
)


def study_defaults(model: str, dataset: str, sampled: bool = False) -> dict[str, Any]:
    """hidden, layers, heads, dropout, lr, weight_decay, epochs for this model on this dataset;
    ``sampled``: the strategy trains on neighbour-sampled batches (study 002's GraphSAGE keeps
    its own settings on the large graphs, where full-graph GraphSAGE takes study 003's)."""
    out = {**FALLBACK, **STUDY_DEFAULTS.get(model, {})}
    if dataset in BIG_DATASETS:
        study003 = STUDY003_AMAZON if dataset in AMAZON_DATASETS else STUDY003_REDDIT
        if model == "sage" and not sampled:
            out.update(study003)
        if model == "gcn":
            out.update(study003, layers=3)
    return out


# A user's model (gnnpar.models.user), by kind: "pyg" (--model pyg:NAME; "pyg:GAT" on its own,
# the one that reads --heads) and "factory" (--model module:function, or module:Class).
USER_KINDS = ("pyg", "pyg:GAT", "factory")
USER_MODEL_FORMS = "pyg:NAME (a model of torch_geometric.nn.models) or module:function"


def model_kind(name: str) -> str | None:
    """The kind of ``--model name`` that decides which settings it reads: a built-in name,
    "pyg" / "pyg:GAT", "factory"; None for a name of no known form."""
    if name in STUDY_DEFAULTS:
        return name
    if name.startswith("pyg:"):
        return "pyg:GAT" if name == "pyg:GAT" else "pyg" if name[4:].isidentifier() else None
    return "factory" if TARGET.match(name) else None


def is_user_model(name: str) -> bool:
    return model_kind(name) in USER_KINDS
