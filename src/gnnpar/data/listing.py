"""`gnnpar datasets [--data-root DIR]`: every dataset, its size, where its files are expected,
whether it is available offline, and which generated variants are already cached.

Run: ``gnnpar datasets`` (or ``python -m gnnpar datasets --data-root /data``).
"""

from __future__ import annotations

from pathlib import Path

from gnnpar.config.parse import check_data_root, default_data_root
from gnnpar.data.registry import DATASETS, DatasetSpec


def _cached_variants(spec: DatasetSpec, root: Path) -> list[str]:
    """'scale<F>-seed<S>' of every complete cache entry of a generated dataset."""
    cache = root / "cache"
    if not cache.is_dir():
        return []
    prefix = f"{spec.name}-"
    return sorted(
        p.name[len(prefix) :]
        for p in cache.iterdir()
        if p.name.startswith(prefix + "scale") and (p / "meta.json").exists()
    )


def _availability(spec: DatasetSpec, root: Path) -> str:
    if spec.source == "bundled":
        return "yes (bundled)"
    if spec.source == "generated":
        cached = _cached_variants(spec, root)
        return "yes (generated on use" + (f"; cached: {', '.join(cached)})" if cached else ")")
    missing = spec.missing_files(root)
    if not missing:
        return "yes"
    return f"no ({len(missing)} of {len(spec.files)} files missing)"


def dataset_rows(root: Path | str | None = None) -> list[dict[str, str]]:
    root = Path(root) if root else default_data_root()
    rows = []
    for spec in DATASETS.values():
        if spec.source == "generated":
            location = f"generated into {root / 'cache'}"
        elif spec.source == "bundled":
            location = "inside the gnnpar package" if spec.files else "built into PyG"
        else:
            location = f"{spec.folder(root)}/ ({', '.join(spec.files)})"
        rows.append(
            {
                "name": spec.name,
                "kind": spec.kind,
                "source": spec.source,
                "size": spec.size,
                "location": location,
                "available": _availability(spec, root),
            }
        )
    return rows


def print_datasets(root: Path | str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    check_data_root(root or default_data_root(), given=root is not None)
    root = Path(root) if root else default_data_root()
    table = Table(title=f"gnnpar datasets (data root: {root})")
    for col in ("name", "kind", "source", "size", "location", "available"):
        table.add_column(col, overflow="fold")
    rows = dataset_rows(root)
    for row in rows:
        table.add_row(*row.values())
    console = Console(width=160)
    console.print(table)
    absent = [DATASETS[r["name"]] for r in rows if r["available"].startswith("no")]
    if absent:
        console.print("Where to get the missing files (place them in the folder shown above):")
        for spec in absent:
            console.print(f"  {spec.name}: {spec.obtain}", overflow="fold")
    console.print(own_graph_text(root), overflow="fold", highlight=False, markup=False)


def own_graph_text(root: Path) -> str:
    """The "Your own graph" paragraph of `gnnpar datasets` (the forms user.py accepts)."""
    count = len(list((root / "cache").glob("user-*/meta.json"))) if root.is_dir() else 0
    cached = f"; {count} cached there now" if count else ""
    return f"""
Your own graph: --dataset takes, instead of a name,
  FILE.pt          a torch.save'd PyG Data (or a one-graph InMemoryDataset, [data], a dict) with
                   x [N, F], edge_index [2, E], y [N] class indices or [N, C] 0/1 (multi-label),
                   optionally all of train_mask, val_mask, test_mask (bool [N])
  FOLDER           OGB node-property layout under any name: raw/edge.csv.gz, raw/node-feat.csv.gz,
                   raw/node-label.csv.gz, split/<name>/{{train,valid,test}}.csv.gz (one split folder)
  module:function  function() from module (the current folder comes first on sys.path) returns a Data
Without masks (or split/), nodes are split 60/20/20 within each class, seeded by --seed. Edges are
kept as given: a directed graph stays directed, messages flow edge_index[0] -> edge_index[1] (the
ogbn-* datasets above are made symmetric). Each graph is converted once into
{root / "cache"}/user-<sha256>/ (keyed by content, not name{cached}) and memory-mapped
by every local rank. A .pt file is read with torch.load(weights_only=True) and PyG's Data
allowed: it cannot run code; one holding other objects is refused, saying how to convert it.
Example:
  python -c "import torch; from torch_geometric.data import Data; torch.save(Data(x=torch.randn(100, 8),
      edge_index=torch.randint(0, 100, (2, 400)), y=torch.randint(0, 3, (100,))), 'my.pt')"
  gnnpar train --dataset my.pt --model gcn --workers 2 --strategy allreduce --partitions 4"""
