"""The dataset cache: hit after build, rebuild on a new version, memory-mapped loads, and two
processes building the same entry at once build it once."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from gnnpar.data.cache import cache_dir, cached


def _build(counter: list | None = None):
    def build():
        if counter is not None:
            counter.append(1)
        return {"a": torch.arange(10), "b": torch.ones(3, 2)}, {"kind": "test"}

    return build


def test_build_then_hit(tmp_path):
    calls: list = []
    t1, meta1, hit1 = cached(tmp_path, "k", "v1", _build(calls))
    t2, meta2, hit2 = cached(tmp_path, "k", "v1", _build(calls))
    assert (hit1, hit2, len(calls)) == (False, True, 1)
    assert torch.equal(t1["a"], t2["a"]) and torch.equal(t2["b"], torch.ones(3, 2))
    assert meta2 == {"kind": "test", "version": "v1"}
    # no temporary folders left behind
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["k", "k.lock"]


def test_new_version_rebuilds(tmp_path):
    calls: list = []
    cached(tmp_path, "k", "v1", _build(calls))
    _, meta, hit = cached(tmp_path, "k", "v2", _build(calls))
    assert not hit and len(calls) == 2 and meta["version"] == "v2"


def test_loads_are_memory_mapped(tmp_path):
    cached(tmp_path, "k", "v1", _build())
    t, _, _ = cached(tmp_path, "k", "v1", _build())
    path = str(cache_dir(tmp_path, "k") / "tensors.pt")
    maps = Path("/proc/self/maps").read_text()
    assert path in maps  # the file is mapped into this process, not copied
    assert t["a"].sum() == 45


def _slow_build_in_child(root: str, marker: str) -> None:
    import time

    def build():
        with open(marker, "a") as fh:
            fh.write("built\n")
        time.sleep(1.0)  # long enough that the other process arrives while this one builds
        return {"x": torch.arange(100)}, {}

    t, _, _ = cached(Path(root), "shared", "v1", build)
    assert int(t["x"].sum()) == 4950


@pytest.mark.timeout(120)
def test_concurrent_builders_build_once(tmp_path):
    marker = tmp_path / "marker"
    ctx = mp.get_context("fork")  # fast start; the children only save and load small tensors
    procs = [
        ctx.Process(target=_slow_build_in_child, args=(str(tmp_path), str(marker)))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=100)
    assert [p.exitcode for p in procs] == [0, 0]
    assert marker.read_text().count("built") == 1


def test_unwritable_cache_builds_in_memory(tmp_path):
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    with pytest.warns(UserWarning, match="Cannot write the dataset cache"):
        t, meta, hit = cached(tmp_path, "k", "v1", _build())
    assert not hit and int(t["a"].sum()) == 45 and meta["version"] == "v1"
