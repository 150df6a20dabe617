"""The dataset cache: hit after build, rebuild on a new version, memory-mapped loads, two
processes building the same entry at once build it once; and crash safety: a stopped lock holder
is reported within the timeout, damaged entries are rebuilt, killed builds leave nothing."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import signal
import socket
import time
import warnings
from pathlib import Path

import pytest
import torch

from gnnpar.data.cache import cache_dir, cached, check_file, remove_stale_temporaries
from gnnpar.data.filelock import CacheLockTimeout, exclusive_lock


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
@pytest.mark.slow
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


# ------------------------------------------------------------------ crash safety (issue 11)
def _hold_lock_while_building(root: str, ready) -> None:  # noqa: ANN001
    """A child that takes the cache lock of "k" and builds for a minute (it gets stopped)."""

    def build():
        ready.set()
        time.sleep(60)
        return {"a": torch.arange(3)}, {}

    cached(Path(root), "k", "v1", build, lock_timeout_s=60)


def _start(target, *args):  # noqa: ANN001, ANN002
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=target, args=(*args, ready), daemon=True)
    proc.start()
    assert ready.wait(30), "the child never took the lock"
    return proc


def _end(proc) -> None:  # noqa: ANN001
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_lock_held_by_a_stopped_process_fails_within_the_timeout_naming_it(tmp_path):
    proc = _start(_hold_lock_while_building, str(tmp_path))
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(CacheLockTimeout) as info:
            cached(tmp_path, "k", "v1", _build(), lock_timeout_s=2)
        waited = time.monotonic() - t0
    finally:
        _end(proc)
    assert 1.8 <= waited <= 3.0, waited  # ~ the timeout, within 1.5x
    message = str(info.value)
    assert str(tmp_path / "cache" / "k.lock") in message  # the lock file
    assert str(cache_dir(tmp_path, "k")) in message  # what it is writing
    assert f"PID {proc.pid} on host {socket.gethostname()}" in message
    assert "stopped" in message and f"kill -CONT {proc.pid}" in message
    assert isinstance(info.value, RuntimeError)  # not bad input: exit 1, not 2


def _slow_builder(root: str, ready) -> None:  # noqa: ANN001
    def build():
        ready.set()
        time.sleep(3)  # longer than the waiter's timeout, but alive all along
        return {"a": torch.arange(10)}, {"kind": "slow"}

    cached(Path(root), "k", "v1", build)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_live_builder_slower_than_the_timeout_is_waited_for_not_blamed(tmp_path, capsys):
    proc = _start(_slow_builder, str(tmp_path))
    try:
        t, meta, hit = cached(tmp_path, "k", "v1", _build(), lock_timeout_s=1)
    finally:
        _end(proc)
    assert hit and meta["kind"] == "slow" and int(t["a"].sum()) == 45  # built by the child
    err = capsys.readouterr().err
    assert "waiting" in err and f"PID {proc.pid}" in err and "still alive" in err


def _hold_flock_without_record(lock: str, ready) -> None:  # noqa: ANN001
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        ready.set()
        time.sleep(60)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_holder_that_never_says_who_it_is_is_reported_after_the_timeout(tmp_path):
    (tmp_path / "cache").mkdir()
    lock = tmp_path / "cache" / "k.lock"
    proc = _start(_hold_flock_without_record, str(lock))
    try:
        t0 = time.monotonic()
        with pytest.raises(CacheLockTimeout, match=r"did not record itself.*fuser -v"):
            cached(tmp_path, "k", "v1", _build(), lock_timeout_s=1)
        assert time.monotonic() - t0 <= 1.5
    finally:
        _end(proc)


def test_the_holder_writes_its_pid_and_host_and_clears_them_on_release(tmp_path):
    lock = tmp_path / "x.lock"
    with exclusive_lock(lock, "x", 5):
        record = json.loads(lock.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert lock.read_text() == ""


def test_truncated_tensors_pt_is_rebuilt_with_a_warning_then_loads(tmp_path):
    calls: list = []
    cached(tmp_path, "k", "v1", _build(calls))
    tensors_pt = cache_dir(tmp_path, "k") / "tensors.pt"
    meta = json.loads((cache_dir(tmp_path, "k") / "meta.json").read_text())
    record = meta["integrity"]["tensors.pt"]
    assert record["size"] == tensors_pt.stat().st_size and len(record["sha256"]) == 64
    os.truncate(tensors_pt, tensors_pt.stat().st_size // 2)
    with pytest.warns(UserWarning, match=rf"{cache_dir(tmp_path, 'k')} is damaged .*truncated"):
        t, meta, hit = cached(tmp_path, "k", "v1", _build(calls))
    assert not hit and len(calls) == 2 and int(t["a"].sum()) == 45
    assert meta == {"kind": "test", "version": "v1"}  # the integrity record stays internal
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt entry is good: no second warning
        t, _, hit = cached(tmp_path, "k", "v1", _build(calls))
    assert hit and len(calls) == 2 and torch.equal(t["b"], torch.ones(3, 2))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["k", "k.lock"]


def test_same_size_damage_and_entries_without_a_record_are_caught(tmp_path):
    calls: list = []
    cached(tmp_path, "k", "v1", _build(calls))
    folder = cache_dir(tmp_path, "k")
    tensors_pt = folder / "tensors.pt"
    size = tensors_pt.stat().st_size
    with open(tensors_pt, "r+b") as fh:  # overwrite the zip index at the end, same size
        fh.seek(size - 64)
        fh.write(b"\0" * 64)
    with pytest.warns(UserWarning, match="differs from what was written"):
        cached(tmp_path, "k", "v1", _build(calls))
    # An entry written before integrity records existed is checked by torch.load alone.
    meta = json.loads((folder / "meta.json").read_text())
    del meta["integrity"]
    (folder / "meta.json").write_text(json.dumps(meta))
    assert cached(tmp_path, "k", "v1", _build(calls))[2]  # still a hit while it loads
    os.truncate(tensors_pt, 100)
    with pytest.warns(UserWarning, match="torch.load of tensors.pt failed"):
        assert not cached(tmp_path, "k", "v1", _build(calls))[2]
    assert len(calls) == 3


def test_the_full_check_finds_damage_in_the_middle_that_the_cheap_one_does_not_read(tmp_path):
    big = lambda: ({"big": torch.arange(1 << 20, dtype=torch.float64)}, {})  # noqa: E731
    cached(tmp_path, "big", "v1", big)
    folder = cache_dir(tmp_path, "big")
    record = json.loads((folder / "meta.json").read_text())["integrity"]["tensors.pt"]
    tensors_pt = folder / "tensors.pt"
    assert record["size"] > 4 << 20  # 8 MiB: the 1 MiB ends do not cover the middle
    with open(tensors_pt, "r+b") as fh:
        fh.seek(record["size"] // 2)
        byte = fh.read(1)
        fh.seek(record["size"] // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert check_file(tensors_pt, record) is None  # size and ends: what every open checks
    assert "SHA-256" in check_file(tensors_pt, record, full=True)


def _killed_while_saving(root: str, ready) -> None:  # noqa: ANN001
    import gnnpar.data.cache as cache_module

    def slow_save(obj, path):  # noqa: ANN001
        Path(path).write_bytes(b"half a file")
        ready.set()
        time.sleep(60)  # SIGKILLed here, inside its temporary folder

    cache_module.save_tensors = slow_save
    cached(Path(root), "k", "v1", _build())


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_build_killed_mid_write_leaves_nothing_after_the_next_build(tmp_path):
    proc = _start(_killed_while_saving, str(tmp_path))
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    cache = tmp_path / "cache"
    assert [p.name[: len(".k.tmp-")] for p in cache.glob(".k.tmp-*")] == [".k.tmp-"]
    # leftovers of another key: one whose builder is dead, one whose builder holds its lock
    (cache / ".dead.tmp-abcd1234").mkdir()
    (cache / ".dead.old-abcd1234").mkdir()
    (cache / ".live.tmp-abcd1234").mkdir()
    with open(cache / "live.lock", "w") as live:
        fcntl.flock(live, fcntl.LOCK_EX)  # a live builder of "live" (another descriptor)
        t, _, hit = cached(tmp_path, "k", "v1", _build())
    assert not hit and int(t["a"].sum()) == 45
    left = sorted(p.name for p in cache.iterdir())
    assert left == [".live.tmp-abcd1234", "k", "k.lock", "live.lock"]
    assert remove_stale_temporaries(cache) == [cache / ".live.tmp-abcd1234"]  # now it is free


def test_partition_cache_damage_is_rebuilt_and_killed_temporaries_removed(tmp_path):
    from gnnpar.data.datasets import load_dataset
    from gnnpar.data.partition import cache_path, integrity_path, load_or_build

    data = load_dataset("karate", tmp_path).data
    path = cache_path(tmp_path, "karate-scale1.0", 2, "random", 0)
    first, hit = load_or_build(data, "random", 2, 0, path)
    assert not hit and json.loads(integrity_path(path).read_text())["size"] == path.stat().st_size
    os.truncate(path, path.stat().st_size - 10)
    (path.parent / f".{path.name}.tmp-abcd1234").write_bytes(b"killed")  # a killed build
    (path.parent / f".{path.name}.x1y2z3w4").write_bytes(b"killed")  # older naming
    with pytest.warns(UserWarning, match=rf"partition cache file {path} is damaged .*truncated"):
        second, hit = load_or_build(data, "random", 2, 0, path)
    assert not hit and torch.equal(first.tensors["n_id"], second.tensors["n_id"])
    assert load_or_build(data, "random", 2, 0, path)[1]  # a hit again
    assert not list(path.parent.glob(".*"))


def test_cli_reports_a_cache_lock_timeout_as_exit_1_without_a_traceback(
    tmp_path, monkeypatch, capsys
):
    import gnnpar.run
    from gnnpar.cli import main

    def stuck(cfg):  # noqa: ANN001
        raise CacheLockTimeout("Waited 2 s for the lock /x/k.lock, held by PID 7 on host h")

    monkeypatch.setattr(gnnpar.run, "run", stuck)
    code = main(["train", "--dataset", "cora", "--model", "gcn", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and "gnnpar: error: Waited 2 s for the lock /x/k.lock" in err
    assert "Traceback" not in err


def test_a_build_is_announced_with_what_where_and_its_size(tmp_path, capsys):
    """One line: what is generated, into which folder, its size on disk; nothing on a hit."""
    import torch

    from gnnpar.data.cache import cached, human_bytes

    def build():
        return {"x": torch.zeros(1000, 100)}, {"kind": "graph"}  # 400,000 bytes of floats

    cached(tmp_path, "synthetic-reddit-scale0.5-seed3", "v1", build)
    (line,) = capsys.readouterr().out.splitlines()
    folder = tmp_path / "cache" / "synthetic-reddit-scale0.5-seed3"
    assert line.startswith(
        f"gnnpar: generating synthetic-reddit (--scale 0.5, seed 3) into {folder} ... 39"
    )
    assert " KiB on disk, " in line and line.endswith(" s; later runs reuse it")
    cached(tmp_path, "synthetic-reddit-scale0.5-seed3", "v1", build)
    assert capsys.readouterr().out == ""
    assert [human_bytes(n) for n in (5, 2048, 738 * 10**6, 3 * 2**30)] == [
        "5 bytes",
        "2.0 KiB",
        "704 MiB",
        "3.0 GiB",
    ]


def test_a_failed_build_ends_its_line_before_the_error(tmp_path, capsys):
    import pytest

    from gnnpar.data.cache import cached

    def build():
        raise ValueError("no")

    with pytest.raises(ValueError):
        cached(tmp_path, "reddit", "v1", build, what="converting reddit's files")
    assert capsys.readouterr().out.endswith(
        f"converting reddit's files into {tmp_path / 'cache' / 'reddit'} ... stopped\n"
    )
