"""`gnnpar datasets`: name, size, where files are expected, available offline?"""

from __future__ import annotations

from pathlib import Path

from gnnpar.config import default_data_root
from gnnpar.data.datasets import REGISTRY


def dataset_rows(root: Path | None = None) -> list[dict[str, str]]:
    root = Path(root) if root else default_data_root()
    rows = []
    for spec in REGISTRY.values():
        rows.append(
            {
                "name": spec.name,
                "kind": spec.kind,
                "source": spec.source,
                "size": spec.size,
                "location": str(spec.folder(root))
                if spec.source != "generated"
                else f"generated, cached in {root / 'cache'}",
                "available": "yes" if spec.available(root) else "no (see location)",
            }
        )
    return rows


def print_datasets(root: Path | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gnnpar datasets")
    for col in ("name", "kind", "source", "size", "location", "available"):
        table.add_column(col, overflow="fold")
    for row in dataset_rows(root):
        table.add_row(*row.values())
    Console(width=160).print(table)
