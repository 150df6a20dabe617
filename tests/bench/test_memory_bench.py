"""benchmarks/memory/eval_memory.py --smoke runs (so that the script does not rot): a 22k-node
graph trained and evaluated, without a limit (the side inside a cgroup is the same code with
resources.memory_cgroup, which tests/runtime/test_resources_real.py runs)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_eval_memory_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "eval_memory", ROOT / "benchmarks" / "memory" / "eval_memory.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    report = mod.main(
        [
            "--smoke",
            "--sides",
            "nolimit",
            "--data-root",
            str(tmp_path),
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    sides = report["sides"]
    runs = [r for v in sides.values() for r in v if "skipped" not in r]
    assert runs and all(r["exit"] == 0 and r["peak_rss_bytes"] > 0 for r in runs), sides
    assert (tmp_path / "r.json").exists()
