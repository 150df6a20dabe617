"""`gnnpar bench [SUITE]`: suites of runs with a report.md, results.json and PNG plots.

SUITES is the one explicit dict of suite names; each suite is a function
``(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]`` that runs its
training runs, writes its report into ``out`` and returns the result dicts.
"""

from __future__ import annotations

from pathlib import Path

from gnnpar.bench.gat_citation import gat_citation
from gnnpar.bench.gossip_vs_allreduce import gossip_vs_allreduce
from gnnpar.bench.sampled_ddp import sampled_ddp
from gnnpar.bench.tour import tour
from gnnpar.bench.vig_pipeline import vig_pipeline
from gnnpar.errors import UsageError

SUITES = {
    "tour": tour,
    "vig-pipeline": vig_pipeline,
    "gat-citation": gat_citation,
    "gossip-vs-allreduce": gossip_vs_allreduce,
    "sampled-ddp": sampled_ddp,
}


def run_suite(
    name: str,
    quick: bool = False,
    out: str | None = None,
    data_root: str | None = None,
    quiet: bool = False,
) -> list[dict]:
    if name not in SUITES:
        raise UsageError(f"Unknown bench suite '{name}'. Choose one of: {', '.join(SUITES)}.")
    out_dir = Path(out) if out else Path("runs") / f"bench-{name}"
    from gnnpar.run import check_out  # the same check as a run's --out, before any run

    check_out(str(out_dir))
    return SUITES[name](quick=quick, out=out_dir, data_root=data_root, quiet=quiet)
