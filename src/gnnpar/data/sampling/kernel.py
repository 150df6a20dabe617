"""The neighbour sampler's compiled hop kernel: find it, check its version, load it with ctypes.

``sampler_kernel.c`` (next to this file) is plain C that pip compiles when it installs gnnpar
(setup.py, extension name ``gnnpar.data.sampling._sampler_kernel``), and scripts/setup.sh rebuilds
in a checkout; :class:`gnnpar.data.sampling.sampler.NeighborSampler` calls it through ctypes. A
C library rather than a torch C++ extension: no torch headers, so it builds in a second and fits
any torch build (CPU or CUDA); rather than numba: no extra dependency and no JIT compile in every
loader worker. Without it the sampler falls back to vectorised torch (slower, other random
stream), with a warning that says how to get it (:data:`HINT`).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
from pathlib import Path

_KERNEL_VERSION = 4  # must equal GNNPAR_KERNEL_VERSION in sampler_kernel.c
_KERNEL_DIR = Path(__file__).parent
_KERNEL_STEM = "_sampler_kernel"
HINT = (
    "install a C compiler (gcc) and reinstall gnnpar (from its source: pip install "
    "--force-reinstall --no-deps .), or in a checkout run scripts/setup.sh (make setup)"
)
_kernel_lib: ctypes.CDLL | None = None
_kernel_file: Path | None = None
_kernel_tried = False


def _kernel_candidates() -> list[Path]:
    """Where the compiled kernel may lie, in order of preference: the names setuptools gives the
    library it builds from ``sampler_kernel.c`` (``_sampler_kernel`` plus an extension-module
    suffix such as ``.cpython-311-x86_64-linux-gnu.so``), then the plain ``_sampler_kernel.so``
    that older versions of scripts/setup.sh built."""
    suffixes = list(importlib.machinery.EXTENSION_SUFFIXES)
    if ".so" not in suffixes:
        suffixes.append(".so")
    return [_KERNEL_DIR / f"{_KERNEL_STEM}{s}" for s in suffixes]


def where() -> str:
    """Where the kernel is looked for, for messages: ``_sampler_kernel*.so in <folder>``."""
    return f"{_KERNEL_STEM}*.so in {_KERNEL_DIR}"


def kernel_available() -> bool:
    """Whether the compiled hop kernel (built from ``sampler_kernel.c`` by ``pip install``, a
    wheel build or scripts/setup.sh) is present and of the version this module expects."""
    return load() is not None


def kernel_path() -> Path | None:
    """The file the compiled hop kernel was loaded from (None: not available)."""
    return _kernel_file if load() is not None else None


def load() -> ctypes.CDLL | None:
    """The compiled hop kernel, loaded with ctypes on first use; None when it is not built (or
    only stale builds are)."""
    global _kernel_lib, _kernel_file, _kernel_tried
    if not _kernel_tried:  # once per process (a loader worker loads it for itself)
        _kernel_tried = True
        for path in _kernel_candidates():
            if not path.is_file():
                continue
            try:
                lib = ctypes.CDLL(str(path))
                lib.gnnpar_kernel_version.restype = ctypes.c_int64
                if lib.gnnpar_kernel_version() != _KERNEL_VERSION:
                    continue  # a stale build: perhaps a later candidate is current
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                lib.gnnpar_sample_hop.restype = i64
                # rowptr, col, frontier, keys, n, frontier_begin, fanout, replace, seed, local,
                # total, out_row, out_col, out_new, n_new, table
                lib.gnnpar_sample_hop.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64]
                lib.gnnpar_sample_hop.argtypes += [ctypes.c_uint64, ptr, i64, ptr, ptr, ptr]
                lib.gnnpar_sample_hop.argtypes += [ptr, ptr]
                lib.gnnpar_sample_hop32.restype = i64  # int32 col (a prepared graph's)
                lib.gnnpar_sample_hop32.argtypes = lib.gnnpar_sample_hop.argtypes
                # rowptr, col, col32, rows, keys, n, fanout, replace, seed, out_tgt, out_nbr,
                # table (the owner's half of a hop over its shard)
                lib.gnnpar_draw_hop.restype = i64
                lib.gnnpar_draw_hop.argtypes = [ptr, ptr, i64, ptr, ptr, i64, i64, i64]
                lib.gnnpar_draw_hop.argtypes += [ctypes.c_uint64, ptr, ptr, ptr]
                # nbr, e, local, total, out_row, out_new (the requester's half)
                lib.gnnpar_relabel.restype = i64
                lib.gnnpar_relabel.argtypes = [ptr, i64, ptr, i64, ptr, ptr]
                lib.gnnpar_table_size.restype = i64
                lib.gnnpar_table_size.argtypes = [i64]
                # fd, base, row_bytes, rows, n, out, threads, align, gap (feature rows from a
                # prepared folder's file: gnnpar.data.prepared.FileRows)
                lib.gnnpar_pread_rows.restype = i64
                lib.gnnpar_pread_rows.argtypes = [i64, i64, i64, ptr, i64, ptr, i64, i64, i64]
                # rowptr, col, col32, rows, v, fanout, share_unit, nxt, went, share (one hop of
                # the feature cache's ranking: gnnpar.data.visits)
                lib.gnnpar_visit_hop.restype = i64
                lib.gnnpar_visit_hop.argtypes = [ptr, ptr, i64, i64, ptr, i64, ctypes.c_double]
                lib.gnnpar_visit_hop.argtypes += [ptr, ptr, ptr]
            except (OSError, AttributeError):  # not loadable here, or not the kernel
                continue
            _kernel_lib, _kernel_file = lib, path
            break
    return _kernel_lib
