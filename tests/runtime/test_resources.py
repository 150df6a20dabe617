"""The memory a run may use (its cgroup's limit, v1 and v2, read from a fake root folder) and
resources that run out in words: a full disk, an OOM kill. The same in real cgroups and on a
real full file system: tests/runtime/test_resources_real.py (slow lane)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gnnpar import UsageError
from gnnpar.runtime import footprint, resources

GIB = 2**30
MEMINFO = "MemTotal:       24000000 kB\nMemFree:        20000000 kB\nMemAvailable:   {} kB\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_root(tmp_path: Path, limit: int, usage: int, inactive: int = 0, parent: int | None = None):
    """A machine with cgroup v1's memory controller at /sys/fs/cgroup/memory, this process in
    /job/step (and, if ``parent``, a limit on /job too), 20 GiB MemAvailable."""
    root = tmp_path / "v1"
    _write(root / "proc/self/cgroup", "9:pids:/job\n4:memory:/job/step\n0::/job\n")
    _write(
        root / "proc/self/mountinfo",
        "30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
        "31 25 0:28 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n"
        "32 25 0:29 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n",
    )
    _write(root / "proc/meminfo", MEMINFO.format(20 * 2**20))
    mem = root / "sys/fs/cgroup/memory"
    _write(mem / "memory.limit_in_bytes", "9223372036854771712\n")
    _write(mem / "memory.usage_in_bytes", str(5 * GIB))
    _write(root / "sys/fs/cgroup/unified/cgroup.controllers", "")
    _write(mem / "job/memory.limit_in_bytes", f"{parent or 9223372036854771712}\n")
    _write(mem / "job/memory.usage_in_bytes", f"{usage}\n")
    step = mem / "job/step"
    _write(step / "memory.limit_in_bytes", f"{limit}\n")
    _write(step / "memory.usage_in_bytes", f"{usage}\n")
    _write(step / "memory.stat", f"cache 0\ntotal_inactive_file {inactive}\nrss {usage}\n")
    _write(step / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    _write(root / "proc/vmstat", "nr_free_pages 1\noom_kill 3\n")
    return root


def v2_root(tmp_path: Path, limit: str, current: int, inactive: int = 0, mount_root: str = "/"):
    """A machine with only cgroup v2 at /sys/fs/cgroup, this process in /user.slice/job.scope
    (``mount_root``: the folder of the hierarchy mounted there, as in a container)."""
    root = tmp_path / "v2"
    _write(root / "proc/self/cgroup", "0::/user.slice/job.scope\n")
    _write(
        root / "proc/self/mountinfo",
        f"26 22 0:23 {mount_root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    _write(root / "proc/meminfo", MEMINFO.format(20 * 2**20))
    base = root / "sys/fs/cgroup"
    _write(base / "cgroup.controllers", "cpu memory pids\n")
    rel = "user.slice/job.scope"
    if mount_root != "/":
        rel = rel[len(mount_root.strip("/")) + 1 :]
    scope = base / rel
    _write(scope / "memory.max", f"{limit}\n")
    _write(scope / "memory.current", f"{current}\n")
    _write(scope / "memory.stat", f"anon {current}\ninactive_file {inactive}\n")
    _write(scope / "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 0\n")
    if mount_root == "/":
        _write(base / "user.slice/memory.max", "max\n")
        _write(base / "user.slice/memory.current", f"{current}\n")
    _write(root / "proc/vmstat", "oom_kill 0\n")
    return root


def test_v1_limit_and_usage_are_read_less_the_inactive_page_cache(tmp_path):
    root = v1_root(tmp_path, limit=3 * GIB, usage=GIB, inactive=GIB // 4)
    lim = resources.memory_limit(root)
    assert lim is not None and lim.version == 1
    assert lim.folder == root / "sys/fs/cgroup/memory/job/step"
    assert (lim.limit, lim.used, lim.headroom) == (3 * GIB, 3 * GIB // 4, 3 * GIB - 3 * GIB // 4)
    assert lim.words() == "the memory cgroup's limit of 3.0 GiB"
    budget = resources.available_memory(root)  # 2.25 GiB < 20 GiB MemAvailable: the cgroup's
    assert budget.free == lim.headroom and budget.limit == lim
    assert budget.words() == "the memory cgroup's limit of 3.0 GiB (2.2 GiB of it free)"


def test_v1_a_smaller_limit_above_this_cgroup_binds(tmp_path):
    root = v1_root(tmp_path, limit=8 * GIB, usage=GIB, parent=2 * GIB)
    lim = resources.memory_limit(root)
    assert lim.folder == root / "sys/fs/cgroup/memory/job" and lim.limit == 2 * GIB


def test_v1_no_limit_is_the_machines_memory(tmp_path):
    root = v1_root(tmp_path, limit=9223372036854771712, usage=GIB)
    assert resources.memory_limit(root) is None
    budget = resources.available_memory(root)
    assert budget.free == 20 * GIB and budget.limit is None
    assert budget.words() == "this machine's available memory (20.0 GiB)"


def test_a_limit_above_the_machines_free_memory_leaves_the_machines_figure(tmp_path):
    root = v1_root(tmp_path, limit=64 * GIB, usage=GIB)
    assert resources.memory_limit(root).limit == 64 * GIB
    assert resources.available_memory(root).limit is None


@pytest.mark.parametrize("mount_root", ["/", "/user.slice"])
def test_v2_memory_max_and_current_are_read(tmp_path, mount_root):
    root = v2_root(tmp_path, str(int(1.5 * GIB)), current=GIB // 2, mount_root=mount_root)
    lim = resources.memory_limit(root)
    assert lim is not None and lim.version == 2
    assert (lim.limit, lim.used) == (int(1.5 * GIB), GIB // 2)
    assert lim.words() == "the memory cgroup's limit of 1.5 GiB"
    assert resources.available_memory(root).free == GIB


def test_v2_max_is_no_limit(tmp_path):
    root = v2_root(tmp_path, "max", current=GIB)
    assert resources.memory_limit(root) is None


def test_no_cgroup_files_at_all(tmp_path):
    _write(tmp_path / "proc/meminfo", MEMINFO.format(2**20))
    assert resources.memory_limit(tmp_path) is None
    assert resources.available_memory(tmp_path).free == GIB
    assert resources.available_memory(tmp_path / "nothing") is None


def test_garbage_in_cgroup_files_reads_as_no_limit(tmp_path):
    root = v1_root(tmp_path, limit=3 * GIB, usage=GIB)
    (root / "sys/fs/cgroup/memory/job/step/memory.limit_in_bytes").write_text("lots\n")
    (root / "proc/self/mountinfo").write_text("garbage\n\n - cgroup\n")
    assert resources.memory_limit(root) is None


def test_oom_kills_name_the_cgroups_limit_or_the_machine(tmp_path):
    root = v1_root(tmp_path, limit=int(1.5 * GIB), usage=GIB)
    before = resources.oom_kills(root)
    assert resources.killed_by_memory_limit(before, resources.oom_kills(root)) is None
    control = root / "sys/fs/cgroup/memory/job/step/memory.oom_control"
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    words = resources.killed_by_memory_limit(before, resources.oom_kills(root))
    assert words == "the memory limit of 1.5 GiB (the memory cgroup's limit)"
    # v2, and the machine's own OOM killer
    root2 = v2_root(tmp_path, "max", current=GIB)
    before = resources.oom_kills(root2)
    (root2 / "proc/vmstat").write_text("oom_kill 1\n")
    words = resources.killed_by_memory_limit(before, resources.oom_kills(root2))
    assert words == "the kernel's out-of-memory killer (the machine ran out of memory)"
    root3 = v2_root(tmp_path / "3", str(GIB), current=GIB // 2)
    before = resources.oom_kills(root3)
    events = root3 / "sys/fs/cgroup/user.slice/job.scope/memory.events"
    events.write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    words = resources.killed_by_memory_limit(before, resources.oom_kills(root3))
    assert words == "the memory limit of 1.0 GiB (the memory cgroup's limit)"


def test_footprint_refusal_names_the_cgroups_limit(monkeypatch):
    """check_memory's refusal names the limit it compared against and its source."""
    import torch

    from gnnpar.config.schema import Config
    from gnnpar.configure import resolve
    from gnnpar.data.datasets import load_dataset

    cfg = Config()
    cfg.data.dataset, cfg.model.name, cfg.model.hidden = "karate", "gcn", 2**24
    resolve(cfg)
    ds = load_dataset("karate", ".")
    lim = resources.MemoryLimit(Path("/sys/fs/cgroup/memory/job"), 1, 3 * GIB, GIB // 2)
    monkeypatch.setattr(
        footprint, "available_memory", lambda: resources.MemoryBudget(lim.headroom, lim)
    )
    with pytest.raises(UsageError) as e:
        footprint.check_memory(cfg, ds, 1, torch.device("cpu"))
    assert "but the memory cgroup's limit of 3.0 GiB leaves 2.5 GiB available" in str(e.value)
    assert footprint.available_bytes(torch.device("cpu")) == lim.headroom


def test_forced_limit_env(monkeypatch, tmp_path):
    _write(tmp_path / "proc/meminfo", MEMINFO.format(20 * 2**20))
    monkeypatch.setenv("GNNPAR_MEMORY_LIMIT", "1.5G")
    budget = resources.available_memory(tmp_path)
    assert budget.free == int(1.5 * GIB) and budget.limit.limit == int(1.5 * GIB)
    for bad in ("lots", "-1G", "nan", "0"):
        monkeypatch.setenv("GNNPAR_MEMORY_LIMIT", bad)
        with pytest.raises(UsageError, match="GNNPAR_MEMORY_LIMIT"):
            resources.available_memory(tmp_path)


def test_a_full_disk_is_one_message_naming_path_and_bytes(tmp_path):
    path = tmp_path / "ckpt" / "rank0.pt"
    with pytest.raises(UsageError) as e:
        with resources.writing(path, 5 * 2**20):
            raise OSError(errno.ENOSPC, "No space left on device")
    msg = str(e.value)
    assert str(path) in msg and "5.0 MiB needed" in msg and " free on its file system" in msg
    with pytest.raises(UsageError, match="the disk is full"):  # a quota, or torch.save's writer
        with resources.writing(path):
            raise RuntimeError("[enforce fail at inline_container.cc] No space left on device")
    with pytest.raises(UsageError, match="the disk is full"):
        with resources.writing(path):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(PermissionError):  # other errors pass unchanged
        with resources.writing(path):
            raise PermissionError(errno.EACCES, "denied")
    with pytest.raises(UsageError, match=r"needed, .* free"):
        resources.check_space(tmp_path, 2**62)
    resources.check_space(tmp_path, 1)


def test_parse_bytes():
    assert resources.parse_bytes("3G") == 3 * GIB
    assert resources.parse_bytes("512MiB") == 512 * 2**20
    assert resources.parse_bytes("1000") == 1000
    with pytest.raises(ValueError):
        resources.parse_bytes("G")
