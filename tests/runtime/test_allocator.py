"""release_free_memory gives the heap's free pages back (glibc), also below the heap's top."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnpar.runtime.allocator import _malloc_trim, release_free_memory


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_freed_heap_memory_goes_back_to_the_system():
    if _malloc_trim() is None:
        pytest.skip("not glibc: nothing to trim")
    blocks = [bytearray(64 << 10) for _ in range(3200)]  # 200 MiB from the heap (under mmap's
    keep = bytearray(64 << 10)  # threshold), and one block above them: the top is not free
    del blocks
    before = _rss_bytes()
    assert release_free_memory()
    after = _rss_bytes()
    assert before - after > 100 << 20, (before, after)
    assert len(keep) == 64 << 10
