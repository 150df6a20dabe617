"""`gnnpar datasets [--data-root DIR]`: every dataset, its size, where its files are expected,
whether it is available offline, and which generated variants are already cached.

Run: ``gnnpar datasets`` (or ``python -m gnnpar datasets --data-root /data``).
"""

from __future__ import annotations

from pathlib import Path

from gnnpar.config import default_data_root
from gnnpar.data.datasets import REGISTRY, DatasetSpec


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
    for spec in REGISTRY.values():
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

    root = Path(root) if root else default_data_root()
    table = Table(title=f"gnnpar datasets (data root: {root})")
    for col in ("name", "kind", "source", "size", "location", "available"):
        table.add_column(col, overflow="fold")
    rows = dataset_rows(root)
    for row in rows:
        table.add_row(*row.values())
    console = Console(width=160)
    console.print(table)
    absent = [REGISTRY[r["name"]] for r in rows if r["available"].startswith("no")]
    if absent:
        console.print("Where to get the missing files (place them in the folder shown above):")
        for spec in absent:
            console.print(f"  {spec.name}: {spec.obtain}", overflow="fold")
