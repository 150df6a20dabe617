"""What the fork server of local ranks imports once, before any rank is forked from it.

:func:`gnnpar.runtime.launch.launch` starts local ranks with multiprocessing's ``forkserver`` (the
default, :func:`gnnpar.runtime.launch.start_method`): a fresh, single-threaded interpreter imports this
module, and every rank is then a fork of it. The ranks share the pages of the interpreter with
torch, PyG and gnnpar imported (~0.2 GiB of private memory per spawned process) copy-on-write,
so N local ranks hold them once, and a rank starts without importing torch again.

Nothing here computes: no tensor op (it would start OpenMP's pool, which a forked child must not
inherit), no process group, no CUDA. The server's environment at start is kept in
:data:`SERVER_ENV` so that a rank can tell the variables its launcher set for it from those it
inherited from the server (:func:`gnnpar.runtime.launch._rank_entry`).
"""

from __future__ import annotations

import gc
import os

SERVER_ENV = dict(os.environ)

# gnnpar.strategies.registry imports the specs only (no torch); what their builds import when a
# rank runs one (partitions, gossip, pipelines, sources, sync) is named here too
try:  # an import that fails here fails again, with its message, in the rank that needs it
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch_geometric  # noqa: F401

    import gnnpar.data.partition  # noqa: F401
    import gnnpar.data.sampling  # noqa: F401
    import gnnpar.parallel.gossip  # noqa: F401
    import gnnpar.parallel.pipeline.step  # noqa: F401
    import gnnpar.predict  # noqa: F401
    import gnnpar.run  # noqa: F401
    import gnnpar.strategies.registry  # noqa: F401
    import gnnpar.training.final_model  # noqa: F401
    import gnnpar.training.sources  # noqa: F401
    import gnnpar.training.sync  # noqa: F401
except Exception:  # pragma: no cover - the rank reports it
    pass

# what exists now moves to a generation the collector never visits, so the ranks' collections
# do not write to (and so copy) the pages they share with the server
gc.collect()
gc.freeze()
