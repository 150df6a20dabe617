"""Report rendering shared by every suite: run a config, tables (markdown + terminal), plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnnpar.configure import build_config


def run_config(flags: dict[str, Any], out: Path, name: str, quiet: bool = True) -> dict[str, Any]:
    """One `gnnpar train` run from flag-named settings; its result.json goes to out/runs/name."""
    from gnnpar.run import run

    cfg = build_config(None, {**flags, "out": str(out / "runs" / name), "quiet": quiet})
    result = run(cfg)
    if result is None:  # launched ranks write result.json; read rank 0's back
        result = json.loads((out / "runs" / name / "result.json").read_text())
    result["run_name"] = name
    return result


def run_plan(
    plan: Sequence[tuple[str, dict[str, Any]]],
    out: Path,
    data_root: str | None,
    quiet: bool,
    label: str = "",
) -> list[dict[str, Any]]:
    """Run each (name, flags) of a suite in order, announcing "[label i/n] name" unless quiet."""
    results = []
    for i, (name, flags) in enumerate(plan, 1):
        if not quiet:
            print(f"[{label}{i}/{len(plan)}] {name}", flush=True)
        if data_root:
            flags = {**flags, "data-root": data_root}
        results.append(run_config(flags, out, name))
    return results


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def print_table(title: str, rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*(fmt(r.get(c, "")) for c in cols))
    Console(width=160).print(table)


def write_report(
    out: Path, title: str, sections: Sequence[tuple[str, str]], results: Sequence[dict[str, Any]]
) -> Path:
    """report.md (title, then (heading, markdown body) sections) and results.json."""
    body = [f"# {title}", ""]
    for heading, text in sections:
        body += [f"## {heading}", "", text, ""]
    (out / "report.md").write_text("\n".join(body))
    (out / "results.json").write_text(json.dumps(list(results), indent=2, default=str))
    return out / "report.md"


def bar_plot(
    path: Path, labels: Sequence[str], values: Sequence[float], ylabel: str, title: str
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(labels) + 2), 3.5))
    ax.bar(range(len(labels)), values, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def line_plot(
    path: Path, curves: dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for label, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
