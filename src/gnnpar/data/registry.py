"""The datasets gnnpar knows by name, as plain facts: what each holds and where it comes from.

Read before anything is loaded (the config checks, ``gnnpar train --help``), so nothing here
imports torch or a reader. How each dataset is loaded, its size and its files are
:data:`gnnpar.data.datasets.REGISTRY`'s, which is built over these names.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCES = ("bundled", "user files", "generated")


@dataclass(frozen=True)
class Named:
    """A dataset gnnpar knows by name."""

    kind: str  # "graph" or "image" (DATASET_KINDS): which models train on it
    source: str  # "bundled" (inside the package), "user files" (under data_root), "generated"

    @property
    def generated(self) -> bool:
        """gnnpar generates it, so --scale (shrink nodes and edges, or images) applies."""
        return self.source == "generated"


DATASETS: dict[str, Named] = {
    "cora": Named("graph", "bundled"),
    "citeseer": Named("graph", "bundled"),
    "karate": Named("graph", "bundled"),
    "pubmed": Named("graph", "user files"),
    "reddit": Named("graph", "user files"),
    "amazon": Named("graph", "user files"),
    "ogbn-arxiv": Named("graph", "user files"),
    "ogbn-products": Named("graph", "user files"),
    "cifar10": Named("image", "user files"),
    "synthetic-reddit": Named("graph", "generated"),
    "synthetic-amazon": Named("graph", "generated"),
    "synthetic-papers100m": Named("graph", "generated"),
    "synthetic-cifar10": Named("image", "generated"),
}


def kind_of(name: str) -> str:
    """ "image" or "graph": what ``--dataset name`` holds, asked before it is loaded (once it
    is, ``ds.kind`` says the same). A name gnnpar does not know is the user's own graph."""
    return DATASETS[name].kind if name in DATASETS else "graph"


def unknown_dataset(name: str, flag: str, user_forms: str) -> str:
    """The message for a --dataset that is neither a known name nor the user's own graph
    (``user_forms``: what else --dataset accepts, :data:`gnnpar.data.user.FORMS`)."""
    return (
        f"Unknown {flag} '{name}'. Choose one of: {', '.join(DATASETS)}; or give your own graph: "
        f"{user_forms} (see `gnnpar datasets`)."
    )
