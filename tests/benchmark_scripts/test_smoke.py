"""Every benchmark script still runs: ``benchmarks/<topic>/<name>.py --smoke`` (its smallest
setting, a few seconds), so that none rots while gnnpar changes under it.

Scripts are found by glob (a file whose name starts with ``_`` is the other side of a script,
not a script), so a new one is covered the day it lands. They run through the harness's driver
(``python -m benchmarks.harness --smoke MODULE ...``), which calls each script's ``main`` in one
interpreter: two drivers side by side, each with half of the scripts, one interpreter start each
rather than one per script. The figures a smoke run prints mean nothing (tiny sizes, one
repetition); only that every script ran to the end is checked.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ("frameworks", "kernels", "comm", "advise", "memory", "robustness", "datasets")


def scripts() -> list[Path]:
    return sorted(
        f
        for f in (ROOT / "benchmarks").glob("*/*.py")
        if not f.name.startswith("_") and f.parent.name != "pending"
    )


def module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_scripts_are_grouped_by_topic_and_take_smoke():
    found = scripts()
    assert len(found) >= 30, found
    flat = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert flat == ["__init__.py", "harness.py"], f"scripts belong in a topic folder: {flat}"
    for path in found:
        assert path.parent.name in TOPICS, f"{path}: not in a topic folder {TOPICS}"
        assert (path.parent / "__init__.py").exists(), f"{path.parent} is not a package"
        text = path.read_text()
        tree = ast.parse(text)
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        assert mains, f"{path}: no main() for the harness to call"
        assert "--smoke" in text or "harness.parser(" in text, f"{path}: no --smoke setting"
        for node in ast.walk(tree):  # benchmarks do not reach into the test suite
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("tests", "conftest")), f"{path}: {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("tests") for a in node.names), path
        assert '"tests"' not in text, f"{path}: reaches into tests/ (through sys.path?)"


# The three heaviest smoke runs (~50 CPU seconds of the ~125 on 2 cores): each runs real ranks
# through paths the suite's own tests already run (tests/e2e/test_two_hosts_outage.py,
# tests/training/test_checkpoint.py's restarts, the shared graph of tests/data/test_sampling.py),
# so the suite's time stays under CI's 20 minutes. GNNPAR_SMOKE_ALL=1 runs them too. Likewise
# the two hosts across shards (two ranks from a fresh interpreter each; the paths
# tests/e2e/test_shard_sampled.py and tests/e2e/test_shard_cluster.py run).
HEAVY = (
    "benchmarks.memory.shared_graph_ranks",
    "benchmarks.robustness.outage_cost",
    "benchmarks.robustness.checkpoint_cost",
    "benchmarks.comm.shard_sampled_two_hosts",
    "benchmarks.comm.shard_sampled_scaling",  # the same two hosts, and one rank beside them
    "benchmarks.comm.shard_sampled_ahead",  # the same two hosts, twice (in line, ahead)
    "benchmarks.comm.shard_cluster_two_hosts",
    # 20-25 s each at their smallest (Lightning's start-up; three prepares and an epoch), their
    # paths run by tests/lightning and tests/data/test_prepared*.py
    "benchmarks.frameworks.lightning_loaders",
    "benchmarks.memory.prepared_format",
    # an advise profile and an epoch, each in a memory cgroup; their paths run by
    # tests/advise/test_disk.py and tests/runtime/test_resources_real.py
    "benchmarks.memory.advise_from_disk",
    # a prepare and a training run stopped after 3 steps (DGL's side too where it is installed)
    "benchmarks.memory.bytes_per_node_edge",
)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_script_runs_its_smoke_setting(tmp_path):
    found = [module(p) for p in scripts()]
    if os.environ.get("GNNPAR_SMOKE_ALL") != "1":
        found = [m for m in found if m not in HEAVY]
    env = {**os.environ, "GNNPAR_DATA": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p
    )
    halves = [found[0::2], found[1::2]]
    logs = [tmp_path / f"driver{i}.log" for i in range(2)]
    procs = []
    for half, log in zip(halves, logs, strict=True):
        cmd = [sys.executable, "-m", "benchmarks.harness", "--smoke", *half]
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    try:
        codes = [p.wait(timeout=1100) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    report = []
    for log, code in zip(logs, codes, strict=True):
        text = log.read_text()
        timings = [line for line in text.splitlines() if line.startswith("== ") and "exit" in line]
        report.append(f"{log.name}: exit {code}\n" + "\n".join(timings))
        if code != 0:
            report.append(text[-6000:])
    assert codes == [0, 0], "\n".join(report)
    ran = sum(r.count(", exit 0") for r in report)
    assert ran == len(found), "\n".join(report)
