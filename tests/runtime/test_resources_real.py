"""Resources that run out, for real: gnnpar in a memory cgroup that it cannot fit (refused before
it starts, exit 2, both figures), a rank killed by its cgroup's limit (named as that, one rank
training in a forked child of gnnpar under a limit), and a
full disk (a 2 MiB tmpfs) while writing a checkpoint (one message, exit 2, the checkpoint
before intact). The parsing of the cgroup files themselves: tests/runtime/test_resources.py.

Needs root (cgroups, mount); skipped with the reason otherwise, and a failure instead of a skip
when ``GNNPAR_REQUIRE_CGROUP=1`` (CI sets it: it runs as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gnnpar.runtime import resources
from tests.helpers import ROOT

pytestmark = pytest.mark.slow
GIB = 2**30


def unavailable(reason: str) -> None:
    if os.environ.get("GNNPAR_REQUIRE_CGROUP") == "1":
        pytest.fail(f"GNNPAR_REQUIRE_CGROUP=1 but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def cgroup(limit: int) -> Iterator[Path]:
    try:
        with resources.memory_cgroup(limit) as folder:
            yield folder
    except resources.CgroupUnavailable as e:
        unavailable(f"a memory cgroup cannot be made here: {e}")


def gnnpar_in(folder: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    argv = resources.in_cgroup(folder, [sys.executable, "-m", "gnnpar", *args])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GNNPAR_MEMORY_LIMIT", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_a_run_that_cannot_fit_its_cgroup_is_refused_before_it_starts(tmp_path):
    """A model of ~9 GiB in a 1 GiB cgroup on a 24 GiB machine: refused with both figures and
    the limit's source, exit 2, before anything is trained (today: 'fits', then killed)."""
    with cgroup(GIB) as folder:
        p = gnnpar_in(
            folder, "train", "--dataset", "karate", "--model", "gcn", "--hidden", str(2**24),
            "--epochs", "1", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("gnnpar: error: --model gcn --hidden 16777216"), err
    assert "needs at least " in err and "but the memory cgroup's limit of 1.0 GiB leaves" in err
    assert "Traceback" not in p.stderr and not (tmp_path / "run" / "result.json").exists()


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        unavailable("mounting a small file system (tmpfs) needs root")
    folder.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True, text=True,
    )  # fmt: skip
    if p.returncode != 0:
        unavailable(f"a tmpfs cannot be mounted here: {p.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_while_checkpointing_ends_in_one_message_and_keeps_the_last_one(tmp_path):
    """Checkpoints of 1.4 MiB on a 2 MiB disk: the first fits, the second does not. One message
    naming the file, the bytes needed and free, exit 2; the first checkpoint verifies."""
    from gnnpar.training.checkpoint import checkpoint_folders, verify_part

    with small_disk(tmp_path / "disk", "2m") as disk:
        out = disk / "run"
        p = subprocess.run(
            [sys.executable, "-m", "gnnpar", "train", "--dataset", "karate", "--model", "gcn",
             "--hidden", "3000", "--epochs", "6", "--checkpoint-every", "1", "--out", str(out)],
            capture_output=True, text=True, timeout=240, cwd=ROOT,
        )  # fmt: skip
        assert p.returncode == 2, p.stderr
        err = p.stderr.strip().splitlines()[-1]
        second = out / "checkpoints" / "epoch-000002-step-00000000" / "rank0.pt"
        assert err.startswith(f"gnnpar: error: the disk is full: writing {second} failed"), err
        assert "(1.4 MiB needed, " in err and " KiB free on its file system)" in err
        assert "Traceback" not in p.stderr
        folders = checkpoint_folders(out)
        assert [f.name for f in folders] == ["epoch-000001-step-00000000"]
        manifest, why = verify_part(folders[0], 0)
        assert manifest is not None, why
        assert not list(disk.rglob(".*.tmp"))  # no half-written file left behind
        # a result.json and a model.pt that do not fit: the same message, for their paths
        import torch

        from gnnpar.result import atomic_save

        with pytest.raises(resources.ResourceError, match="model.pt failed"):
            atomic_save({"w": torch.zeros(2**20)}, out / "model.pt")
        assert not (out / "model.pt").exists() and not list(out.glob(".model.pt.tmp*"))


def test_evaluation_spilling_to_a_full_disk_ends_in_one_message(tmp_path, monkeypatch, capsys):
    """Hidden states spilled to a 1 MiB tmpfs that cannot hold a layer (5000 x 64 floats): one
    message naming the layer's file and the bytes, and a word that a tmpfs is memory."""
    import torch

    from gnnpar.config.schema import ModelConfig
    from gnnpar.models import build_model
    from gnnpar.training import evaluation as ev

    with small_disk(tmp_path / "disk", "1m") as disk:
        monkeypatch.setenv("GNNPAR_SPILL_DIR", str(disk))
        g = torch.Generator().manual_seed(0)
        x, ei = torch.randn(5000, 16, generator=g), torch.randint(0, 5000, (2, 20000), generator=g)
        mc = ModelConfig()
        mc.name, mc.hidden, mc.layers, mc.dropout, mc.heads = "gat", 32, 2, 0.0, 2
        model = build_model(mc, 16, 3, False).eval()
        with pytest.raises(resources.ResourceError) as e:
            ev.graph_logits(model, x, ei, limit=4000 * 64 * 4, budget=1)
        assert "the disk is full: writing " in str(e.value) and "layer1.npy" in str(e.value)
        assert "1.2 MiB needed" in str(e.value)
        assert "a tmpfs (memory, not disk)" in capsys.readouterr().err
        assert list(disk.iterdir()) == []  # its folder removed


def test_a_single_rank_killed_by_the_cgroups_limit_is_named(tmp_path):
    """One rank (no --workers) that outgrows a 1.5 GiB cgroup: under a limit gnnpar trains in a
    forked child and names the kill, exit 2 (before: the process itself was killed and the
    shell printed only 'Killed', exit 137)."""
    with cgroup(3 * GIB // 2) as folder:
        p = gnnpar_in(
            folder, "train", "--dataset", "karate", "--model", "tests.runtime.memory_hog:hog",
            "--epochs", "100", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert "was killed by the memory limit of 1.5 GiB (the memory cgroup's limit)" in err, err
    assert err.startswith("gnnpar: error: the run was killed by") and "Signal 9" not in err


@pytest.mark.timeout(900)
def test_a_graph_half_again_larger_than_its_cgroup_trains_and_evaluates_from_disk(
    tmp_path, wide_prepared
):
    """A prepared folder of 1.53 GiB (tests.runtime.wide_graph: 200,000 nodes x 2,048 fp32
    features) trained with sampled GraphSAGE and evaluated inside a cgroup of 1/1.5 of the
    folder's bytes (torch alone takes ~0.3 GiB of it): it finishes, scores val and test, and its
    loss curve is the in-memory run's, bit for bit (the same graph from memory, no limit)."""
    from tests.helpers import run_cli

    folder, data = wide_prepared[0], str(wide_prepared[1])
    source = "tests.runtime.wide_graph:wide"
    size = sum(f.stat().st_size for f in folder.iterdir())
    flags = [
        "--strategy", "sampled", "--model", "sage", "--hidden", "32", "--fanouts", "4,4,4",
        "--batch-size", "128", "--epochs", "2", "--threads", "1", "--seed", "3", "--quiet",
    ]  # fmt: skip
    mem = run_cli("train", "--dataset", source, "--data-root", data, *flags,
                  "--out", str(tmp_path / "memory"), timeout=600)  # fmt: skip
    assert mem.returncode == 0, mem.stderr
    limit = int(size / 1.5)
    with cgroup(limit) as cg:
        disk = gnnpar_in(cg, "train", "--dataset", str(folder), *flags,
                         "--out", str(tmp_path / "disk"), timeout=600)  # fmt: skip
    assert disk.returncode == 0, disk.stderr
    want = json.loads((tmp_path / "memory" / "result.json").read_text())
    got = json.loads((tmp_path / "disk" / "result.json").read_text())
    assert got["loss_curve"] == want["loss_curve"]
    assert 0.0 <= got["val_score"] <= 1.0 and 0.0 <= got["test_score"] <= 1.0, got
