"""What the fork server of local ranks imports once, before any rank is forked from it.

:func:`gnnpar.runtime.launch.launch` starts local ranks with multiprocessing's ``forkserver`` (the
default, :func:`gnnpar.runtime.launch.start_method`): a fresh, single-threaded interpreter imports
this module, and every rank is then a fork of it. The ranks share the pages of the interpreter
with torch, PyG and gnnpar imported (~0.2 GiB of private memory per spawned process)
copy-on-write, so N local ranks hold them once, and a rank starts without importing torch again.

This module imports torch and PyG itself, and gnnpar's modules only by name: the launcher names
the rank function's module (for ``gnnpar train``, :mod:`gnnpar.run`, which imports everything a
rank runs) in ``GNNPAR_PRELOAD_MODULES`` (:data:`gnnpar.runtime.launch.PRELOAD_MODULES_ENV`)
while it starts the server. So this module imports nothing of gnnpar by itself, and only the
fork server (and so its ranks) imports it: in any other process its ``gc.freeze`` would only
keep garbage alive.

Nothing here computes: no tensor op (it would start OpenMP's pool, which a forked child must not
inherit), no process group, no CUDA. The server's environment at start is kept in
:data:`SERVER_ENV` so that a rank can tell the variables its launcher set for it from those it
inherited from the server (:func:`gnnpar.runtime.launch._rank_entry`).
"""

from __future__ import annotations

import gc
import importlib
import os

# comma-separated modules to import after torch and PyG (launch.PRELOAD_MODULES_ENV; set by the
# launcher for the server alone and taken out of the server's environment here, so no rank
# inherits it)
MODULES = [
    m for m in os.environ.pop("GNNPAR_PRELOAD_MODULES", "").split(",") if m and m != "__main__"
]

SERVER_ENV = dict(os.environ)

try:  # an import that fails here fails again, with its message, in the rank that needs it
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch_geometric  # noqa: F401
except Exception:  # pragma: no cover - the rank reports it
    pass
for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # pragma: no cover - the rank reports it
        pass

# what exists now moves to a generation the collector never visits, so the ranks' collections
# do not write to (and so copy) the pages they share with the server
gc.collect()
gc.freeze()
