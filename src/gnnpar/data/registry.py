"""The datasets gnnpar knows by name: one table, :data:`DATASETS`, a row per dataset with every
fact that needs no loading: what it holds, where it comes from, its size, the files it is read
from and where to obtain them, and which reader or generator builds it.

Read before anything is loaded (the config checks, ``gnnpar train --help``, ``gnnpar
datasets``), so nothing here imports torch or a reader. :func:`gnnpar.data.datasets.load_dataset`
loads a row with the reader it names (:mod:`gnnpar.data.readers`, :mod:`gnnpar.data.synthetic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SOURCES = ("bundled", "user files", "generated")
BUNDLED = Path(__file__).parent / "planetoid"  # the bundled Planetoid files, inside the package

PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
REDDIT_FILES = ("reddit_data.npz", "reddit_graph.npz")
AMAZON_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
OGB_RAW = ("raw/edge.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz")
OGB_SPLIT = (("train", "train"), ("val", "valid"), ("test", "test"))  # (mask, file stem)
OGB_SPLITS = {"ogbn-arxiv": "time", "ogbn-products": "sales_ranking"}  # split/<scheme>/
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_FILES = tuple(f"{CIFAR_DIR}/data_batch_{i}" for i in range(1, 6)) + (
    f"{CIFAR_DIR}/test_batch",
)


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset gnnpar knows by name."""

    name: str
    kind: str  # "graph" or "image" (DATASET_KINDS): which models train on it
    source: (
        str  # "bundled" (inside the package or PyG), "user files" (under data_root), "generated"
    )
    size: str  # human-readable size at scale 1
    files: tuple[str, ...]  # expected under data_root/<name>/ (bundled: inside the package)
    obtain: str  # where a user gets the files
    # what builds it: "planetoid" or "karate" (bundled ones); a read_* function of
    # gnnpar.data.readers (user files); generate_graph or generate_cifar of gnnpar.data.synthetic
    reader: str

    @property
    def generated(self) -> bool:
        """gnnpar generates it, so --scale (shrink nodes and edges, or images) applies."""
        return self.source == "generated"

    def folder(self, root: Path) -> Path:
        if self.source == "bundled":
            return BUNDLED
        return Path(root) / self.name

    def missing_files(self, root: Path) -> list[str]:
        if self.source == "generated":
            return []
        folder = self.folder(root)
        return [f for f in self.files if not (folder / f).exists()]

    def available(self, root: Path) -> bool:
        return self.source != "user files" or not self.missing_files(root)


def ogb_files(name: str) -> tuple[str, ...]:
    split = OGB_SPLITS[name]
    return (*OGB_RAW, *(f"split/{split}/{stem}.csv.gz" for _, stem in OGB_SPLIT))


def _planetoid(name: str, source: str, size: str) -> DatasetSpec:
    lower = name.lower()
    raw = f"{name}/raw/" if source == "bundled" else ""
    files = tuple(f"{raw}ind.{lower}.{s}" for s in PLANETOID_FILES)
    obtain = "https://github.com/kimiyoung/planetoid (folder data/)"
    return DatasetSpec(lower, "graph", source, size, files, obtain, "planetoid")


GENERATED_GRAPH = "generated on first use (stochastic block model, gnnpar.data.synthetic)"

DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        _planetoid("Cora", "bundled", "2,708 nodes, 10,556 edges, 1,433 features, 7 classes"),
        _planetoid("CiteSeer", "bundled", "3,327 nodes, 9,104 edges, 3,703 features, 6 classes"),
        DatasetSpec(
            "karate",
            "graph",
            "bundled",
            "34 nodes, 156 edges, 34 features, 4 classes",
            (),
            "built into PyG (torch_geometric.datasets.KarateClub)",
            "karate",
        ),
        _planetoid("PubMed", "user files", "19,717 nodes, 88,648 edges, 500 features, 3 classes"),
        DatasetSpec(
            "reddit",
            "graph",
            "user files",
            "232,965 nodes, 114,615,892 edges, 602 features, 41 classes",
            REDDIT_FILES,
            "https://data.dgl.ai/dataset/reddit.zip (unzip; PyG's Reddit raw files)",
            "read_reddit",
        ),
        DatasetSpec(
            "amazon",
            "graph",
            "user files",
            "1,569,960 nodes, 264,339,468 edges, 200 features, 107 classes (multi-label)",
            AMAZON_FILES,
            "GraphSAINT's AmazonProducts folder, https://github.com/GraphSAINT/GraphSAINT "
            "(Google Drive link in its README; the files PyG's AmazonProducts downloads)",
            "read_graphsaint",
        ),
        DatasetSpec(
            "ogbn-arxiv",
            "graph",
            "user files",
            "169,343 nodes, 2,315,598 edges (symmetric), 128 features, 40 classes",
            ogb_files("ogbn-arxiv"),
            "http://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip (unzip; put its raw/ and "
            "split/ folders here)",
            "read_ogb",
        ),
        DatasetSpec(
            "ogbn-products",
            "graph",
            "user files",
            "2,449,029 nodes, 123,718,280 edges (symmetric), 100 features, 47 classes",
            ogb_files("ogbn-products"),
            "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip (unzip; put its raw/ and "
            "split/ folders here)",
            "read_ogb",
        ),
        DatasetSpec(
            "cifar10",
            "image",
            "user files",
            "60,000 3x32x32 images (45,000 train, 5,000 val, 10,000 test), 10 classes",
            CIFAR_FILES,
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (untar here: it creates "
            "cifar-10-batches-py/)",
            "read_cifar10",
        ),
        DatasetSpec(
            "synthetic-reddit",
            "graph",
            "generated",
            "232,965 nodes, 114,848,856 edges, 602 features, 41 classes (x scale)",
            (),
            GENERATED_GRAPH,
            "generate_graph",
        ),
        DatasetSpec(
            "synthetic-amazon",
            "graph",
            "generated",
            "1,598,960 nodes, 132,169,734 edges, 200 features, 107 classes multi-label (x scale)",
            (),
            GENERATED_GRAPH,
            "generate_graph",
        ),
        DatasetSpec(
            "synthetic-papers100m",
            "graph",
            "generated",
            "111,059,956 nodes, 1,615,685,872 edges, 128 features, 172 classes, 1.1% train "
            "(x scale; use a small one: 0.01 is 1.1M nodes)",
            (),
            GENERATED_GRAPH,
            "generate_graph",
        ),
        DatasetSpec(
            "synthetic-cifar10",
            "image",
            "generated",
            "60,000 3x32x32 images (45,000 train, 5,000 val, 10,000 test), 10 classes (x scale)",
            (),
            "generated on first use (class tint + oriented grating + noise, gnnpar.data.synthetic)",
            "generate_cifar",
        ),
    )
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
