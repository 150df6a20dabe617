"""Two hosts over a sharded folder, each a real process of a gloo group with a folder of its
own (the top manifest and the shard it holds): a missing or damaged shard on one host is named
with its host on both, exit 2, before any step, and neither waits for the other. (Hosts that
each hold only their shard train across shards, and hosts that hold every shard train on the
whole graph, with the same loss curve: tests/e2e/test_shard_sampled.py; how the hosts judge what
each holds, for every strategy: tests/data/test_shards.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from gnnpar.data.prepare_command import run_prepare
from gnnpar.runtime.launch import free_port
from helpers import ROOT

pytestmark = pytest.mark.slow


def _hosts(tmp_path, keep, damage=None):
    """host-<h>/g: the top manifest and the shards ``keep[h]`` of a 2-shard karate."""
    full = tmp_path / "full"
    if not full.exists():
        run_prepare("karate", str(full), None, None, None, str(tmp_path / "root"), None, True,
                    shards="2", partitioner="metis")  # fmt: skip
    folders = []
    for h, held in enumerate(keep):
        g = tmp_path / f"host-{h}" / "g"
        g.mkdir(parents=True)
        shutil.copy(full / "manifest.json", g / "manifest.json")
        for s in held:
            shutil.copytree(full / f"shard-{s}", g / f"shard-{s}")
        folders.append(g)
    if damage is not None:
        f = folders[damage] / f"shard-{damage}" / "indices.npy"
        f.write_bytes(f.read_bytes()[:-8])
    return folders


def _run(tmp_path, folders, timeout_s=150):
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GROUP_"))}
    procs = []
    for h, folder in enumerate(folders):
        env = {**base, "RANK": str(h), "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
        env |= {"LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(h), "GROUP_WORLD_SIZE": "2"}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        args = [sys.executable, "-m", "gnnpar", "train", "--dataset", str(folder)]
        args += ["--model", "sage", "--layers", "2", "--fanouts", "5,5", "--strategy", "sampled"]
        args += ["--epochs", "2", "--threads", "1", "--timeout", "30", "--quiet"]
        args += ["--out", str(tmp_path / f"run-{h}")]
        procs.append(subprocess.Popen(args, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True))
    t0 = time.monotonic()
    try:
        errs = [p.communicate(timeout=timeout_s)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [p.returncode for p in procs], errs, time.monotonic() - t0


@pytest.mark.timeout(400)
def test_a_damaged_shard_on_one_host_is_named_on_both_exit_2(tmp_path):
    folders = _hosts(tmp_path, [[0], [1]], damage=1)
    codes, errs, _ = _run(tmp_path, folders)
    assert codes == [2, 2], errs
    for err in errs:
        line = err.strip().splitlines()[-1]
        assert line.startswith("gnnpar: error: host 1 (rank 1) cannot use its shard 1"), err
        assert "indices.npy has" in line and "Traceback" not in err
    # the healthy host 0 says host 1's words, not a --timeout 30 on a peer that went away
    assert not (tmp_path / "run-0" / "metrics.jsonl").exists()
