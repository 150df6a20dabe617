"""The feature cache that ``gnnpar train`` starts writing before it imports torch
(gnnpar.data.cache_writer): the same file as one written in line, taken once by the run that
started it, nothing left behind by a run that ends before taking it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gnnpar.cli import start_cache_writer
from gnnpar.configure import build_config
from gnnpar.data import cache_writer, prepared
from gnnpar.data.prepare_command import run_prepare
from gnnpar.runtime import resources

FLAGS = {"strategy": "sampled", "model": "sage", "hidden": "16", "layers": "2", "quiet": True}
FLAGS |= {"fanouts": "5,5", "batch-size": "32", "epochs": "1", "threads": "1", "seed": "3"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cw")
    out = tmp / "prepared"
    run_prepare("cora", str(out), None, None, None, str(tmp / "root"), None, True)
    return out


def _cfg(folder: Path, tmp_path: Path, **flags):
    return build_config(
        None, {**FLAGS, "dataset": str(folder), "out": str(tmp_path / "o"), **flags}
    )


def _ours() -> set[str]:
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    if folder is None:
        return set()
    return {f.name for f in folder.glob(f"gnnpar-features-{os.getpid()}-*")}


@pytest.fixture(autouse=True)
def _no_writer_left():
    yield
    cache_writer.discard()


def test_the_cache_written_early_is_the_cache_written_in_line(folder, tmp_path, monkeypatch):
    """Sized by the one rule (the memory the run may use, less the imports to come and the
    step's reserve), its bytes are write_feature_cache's for that many rows."""
    monkeypatch.setenv(resources.FORCED_LIMIT_ENV, str(2 << 30))
    w = start_cache_writer(_cfg(folder, tmp_path))
    assert w is not None and w.free is not None
    path, fd, size, direct = w.wait()
    p = prepared.open_prepared(folder)
    k, want_size, want_direct = cache_writer.plan(p, None, w.free, w.reserve)
    assert k > 0 and (size, direct) == (want_size, want_direct)
    in_line = tmp_path / "cache"
    assert (w.fanouts, w.batch_size) == ([5, 5], 32)  # ranked by expected visits at the run's
    prepared.write_feature_cache(p, k, str(in_line), False, [5, 5], 32)
    assert Path(path).read_bytes() == in_line.read_bytes()
    assert w.held_bytes() == in_line.stat().st_size
    assert cache_writer.take(str(folder), None) is w  # handed over once
    assert cache_writer.take(str(folder), None) is None
    os.close(fd)


def test_the_reserve_is_the_steps_batches(folder, tmp_path):
    w = start_cache_writer(_cfg(folder, tmp_path))
    m = prepared.read_manifest(folder)
    batch = cache_writer.batch_feature_bytes(m["num_nodes"], m["num_features"], 32, [5, 5])
    assert batch == min(32 * 6 * 6, m["num_nodes"]) * m["num_features"] * 4
    assert w.reserve == cache_writer.STEP_BATCHES * batch


def test_another_setting_or_folder_is_not_taken(folder, tmp_path):
    start_cache_writer(_cfg(folder, tmp_path, **{"feature-cache": "0.5"}))
    assert cache_writer.take(str(folder), None) is None
    assert cache_writer.take(str(tmp_path), "0.5") is None
    w = cache_writer.take(str(folder), "0.5")
    assert w is not None and w.wait()[2] == 1354 * 1433 * 4  # half of Cora's 2708 rows
    w.discard()


@pytest.mark.parametrize(
    "flags",
    [
        {"strategy": "sequential", "fanouts": None, "batch-size": None},  # no cache
        {"workers": "2"},  # two local ranks: local rank 0 writes it for both, in line
    ],
)
def test_started_only_where_one_process_writes_a_cache_for_itself(folder, tmp_path, flags):
    given = {k: v for k, v in {**FLAGS, **flags}.items() if v is not None}
    cfg = build_config(None, {**given, "dataset": str(folder), "out": str(tmp_path / "o")})
    assert start_cache_writer(cfg) is None


def test_no_cache_asked_writes_none(folder, tmp_path):
    w = start_cache_writer(_cfg(folder, tmp_path, **{"feature-cache": "0"}))
    assert w.wait()[:3] == (None, None, 0) and _ours() == set()


def test_a_run_that_ends_before_taking_it_leaves_nothing(folder, tmp_path):
    before = _ours()
    start_cache_writer(_cfg(folder, tmp_path))
    cache_writer.discard()
    assert _ours() == before and cache_writer.started() is None


def test_a_folder_damaged_after_the_check_is_named_where_the_cache_is_taken(tmp_path):
    out = tmp_path / "p"
    run_prepare("cora", str(out), None, None, None, str(tmp_path / "root"), None, True)
    cfg = _cfg(out, tmp_path)  # checked here, whole
    with open(out / "labels.npy", "r+b") as fh:  # then its end overwritten
        fh.seek(-8, os.SEEK_END)
        fh.write(b"\xff" * 8)
    w = start_cache_writer(cfg)
    with pytest.raises(prepared.Damaged, match="labels.npy differs"):
        w.wait()
    assert _ours() == set()


@pytest.mark.slow
def test_train_reaches_the_cache_thread_without_importing_torch(folder, tmp_path):
    """What makes the overlap: from the flags to the thread's start, `gnnpar train` on a
    prepared folder imports neither torch nor PyG (a fresh interpreter; ~1 s)."""
    import subprocess
    import sys

    code = f"""
import sys
from gnnpar.cli import _one_rank_under_a_memory_limit, build_parser, start_cache_writer
from gnnpar.configure import build_config
from gnnpar.data import cache_writer
args = build_parser().parse_args(
    ["train", "--dataset", {str(folder)!r}, "--strategy", "sampled", "--model", "sage",
     "--fanouts", "5,5", "--batch-size", "32", "--out", {str(tmp_path / "o")!r}])
cfg = build_config(args.config, {{k: v for k, v in vars(args).items()
                                 if k not in ("command", "config")}})
_one_rank_under_a_memory_limit(cfg)
w = start_cache_writer(cfg)
print(w is not None, "torch" in sys.modules, "torch_geometric" in sys.modules)
cache_writer.discard()
"""
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["True", "False", "False"], out.stderr
