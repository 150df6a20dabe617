"""Pool several finished ``gnnpar advise --validate`` grids into the issue's one measurable grid.

Issue 22's targets are over the whole grid (graphs x one or two hosts x with or without a
straggler): the median absolute error of predicted against measured epoch time, the largest,
and in how many grids the recommended configuration was measured best or within 10% of it.
Each advice.json holds one grid; this reads them as written (nothing is re-predicted: see
``repredict_validation.py`` for that) and prints a row per grid, every case, and the pooled figures.

    python -m benchmarks.advise.validation_grid_summary /tmp/val/*/advice.json
    python -m benchmarks.advise.validation_grid_summary --cases /tmp/val/a/advice.json /tmp/val/b/advice.json
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import harness

SMOKE = [harness.RESULTS / "advise_validate_cora_amd_2026-11-27_wake_gossip.json"]


def label(advice: dict, path: Path) -> str:
    """What grid this was: graph, model, hosts and link, straggler."""
    p, c = advice["profile"], advice["cluster"]
    where = f"{c['hosts']} host(s) x {c['ranks_per_host']}"
    net = c.get("network")
    if net and c["hosts"] > 1:
        where += f", {net['bandwidth_Bps'] * 8 / 1e6:g} Mbit/s {net['latency_s'] * 1e3:g} ms"
    slow = c.get("slowdown") or {}
    strag = ", " + ", ".join(f"rank {r} {f:g}x slow" for r, f in slow.items()) if slow else ""
    return f"{p['dataset']} {p['model']}, {where}{strag} ({path.parent.name})"


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("advice", nargs="*", type=Path, help="advice.json files of --validate runs")
    ap.add_argument("--cases", action="store_true", help="also print every case")
    a = ap.parse_args(argv)
    if a.smoke:  # a stored grid
        a.advice, a.cases = SMOKE, True
    if not a.advice:
        ap.error("name at least one advice.json")
    pooled, hits, rows = [], 0, []
    for path in a.advice:
        advice = json.loads(path.read_text())
        val = advice.get("validation")
        if not val:
            print(f"skipped {path}: no validation in it")
            continue
        errs = [abs(c["error"]) for c in val["cases"]]
        pooled += errs
        hits += bool(val["recommended_within_10pct"])
        rows.append((label(advice, path), len(errs), statistics.median(errs), max(errs), val))
    if not rows:
        raise SystemExit("no grid with a validation")
    print("| grid | cases | median \\|error\\| | largest | recommended = measured best (10%) |")
    print("|---|---|---|---|---|")
    for name, n, med, top, val in rows:
        ok = "yes" if val["recommended_within_10pct"] else "no"
        print(f"| {name} | {n} | {med:.0%} | {top:.0%} | {ok} |")
    print(
        f"| **all {len(rows)} grids** | {len(pooled)} | **{statistics.median(pooled):.0%}** | "
        f"**{max(pooled):.0%}** | **{hits} of {len(rows)}** |"
    )
    if a.cases:
        print("\n| grid | configuration | predicted ms | measured ms (runs) | error |")
        print("|---|---|---|---|---|")
        for name, _, _, _, val in rows:
            for c in val["cases"]:
                runs = ", ".join(f"{t * 1e3:.1f}" for t in c.get("measured_runs_epoch_s", []))
                cfg = ", ".join(f"{k}={v}" for k, v in c["settings"].items())
                print(
                    f"| {name.split(' (')[0]} | {c['strategy']}({cfg}) | "
                    f"{c['predicted_epoch_s'] * 1e3:.1f} | {c['measured_epoch_s'] * 1e3:.1f} "
                    f"({runs}) | {c['error']:+.0%} |"
                )


if __name__ == "__main__":
    main()
