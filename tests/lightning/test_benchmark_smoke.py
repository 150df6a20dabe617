"""benchmarks/frameworks/lightning_loaders.py --smoke runs (so the script does not rot): one
Lightning fit of study 002's GraphSAGE on gnnpar's data module, Cora, 1 rank (the PyG side is
skipped: pyg-lib is the anchors' environment's, not gnnpar's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow


def test_lightning_loaders_smoke(tmp_path):
    script = ROOT / "benchmarks" / "frameworks" / "lightning_loaders.py"
    out = tmp_path / "record.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--peer-path", "", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "pyg side skipped" in proc.stdout and "gnnpar x1: wait" in proc.stdout
    assert out.is_file()
