"""The peers' side of ``benchmarks/memory/disk_vs_peers.py``: one epoch of sampled GraphSAGE in
PyG ("PyG+", Ginex's baseline) or DGL GraphBolt, on the arrays of a gnnpar prepared folder,
written the way each library's own examples write it. Imports nothing of gnnpar; runs in the
peer's interpreter (``harness.PEERS``).

    python _disk_sides.py pyg FOLDER PEERDIR FANOUTS BATCH WORKERS THREADS SEED [MAX_STEPS]
    python _disk_sides.py graphbolt FOLDER PEERDIR FANOUTS BATCH WORKERS THREADS SEED [MAX_STEPS]

``FOLDER``: the gnnpar prepared folder (features.npy fp32 [N, F], labels.npy, train.npy);
``PEERDIR``: what disk_vs_peers.py made beside it: ``edges.npy`` (int64 [2, E], source row
then target row, sorted by target: the prepared CSR as PyG's ``edge_index``) and, for
GraphBolt, an ``OnDiskDataset`` folder (``gb/metadata.yaml`` over those arrays). ``FANOUTS``:
seeds' hop first (gnnpar's and PyG's order), e.g. ``10,5,5``; ``MAX_STEPS`` (0: all) ends the
epoch after that many steps, as gnnpar's ``--max-steps`` does. Prints one JSON line when the
epoch ends: ``epoch_end_unix`` (the parent measures end to end from its own start),
``epoch_s`` (the epoch alone), ``setup_s``, ``steps``, ``loss`` (mean), ``peak_rss_bytes``;
and one stderr line per step, ``step K SECONDS`` (steps done, seconds into the epoch).

* PyG+ (Ginex, VLDB'22; PyG's ``examples/hierarchical_sampling.py`` for the trimming): a
  ``Data`` whose ``x`` is the ``np.memmap`` of features.npy (``NeighborLoader`` gathers its rows
  with ``np.take``), ``edge_index`` the memory-mapped edges.npy (sorted by target, so
  ``is_sorted=True``: PyG builds its CSC pointer once and copies nothing), ``NeighborLoader``
  (pyg-lib), ``GraphSAGE(F, 256, 3, classes, dropout=0.5)`` called with
  ``num_sampled_nodes_per_hop`` / ``num_sampled_edges_per_hop`` (layer trimming), Adam.
* GraphBolt (DGL 2.1's ``examples/sampling/graphbolt/node_classification.py``):
  ``OnDiskDataset(gb).load()`` (features ``in_memory: false``), ``ItemSampler(train_set,
  shuffle=True)`` -> ``sample_neighbor(graph, fanouts)`` -> ``fetch_feature(features, ["feat"])``
  -> ``copy_to(cpu)`` -> ``gb.DataLoader(num_workers=WORKERS)``, three ``dglnn.SAGEConv(...,
  "mean")`` on the minibatch's blocks, Adam. In DGL 2.1 ``in_memory: false`` maps the
  feature file (``np.load(mmap_mode="r+")``) and ``fetch_feature`` gathers rows with
  ``index_select`` on the map: each missed row is a page fault, served with the disk's
  read-around; the ``FusedCSCSamplingGraph`` is loaded whole (``torch.load``).

The model and optimiser are gnnpar's ``sage`` preset on both: 3 layers x 256, mean aggregation,
ReLU, dropout 0.5, Adam lr 5e-3, weight decay 5e-4, cross-entropy on the seeds.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LR, WD, HIDDEN, DROPOUT = 5e-3, 5e-4, 256, 0.5


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def progress(t0: float, steps: int) -> None:
    """One stderr line per step (``step K T``: steps done, seconds since the epoch began): the
    parent reads the last one when the side does not finish within its timeout."""
    print(f"step {steps} {time.perf_counter() - t0:.3f}", file=sys.stderr, flush=True)


def report(t_setup: float, t0: float, steps: int, loss_sum: float) -> None:
    end = time.time()
    print(
        json.dumps(
            {
                "epoch_end_unix": end,
                "epoch_s": time.perf_counter() - t0,
                "setup_s": t_setup,
                "steps": steps,
                "loss": loss_sum / max(1, steps),
                "peak_rss_bytes": peak_rss(),
            }
        ),
        flush=True,
    )


def pyg(folder: str, peer: str, fanouts: list[int], batch: int, workers: int, cap: int) -> None:
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn.models import GraphSAGE

    t = time.perf_counter()
    x = np.load(os.path.join(folder, "features.npy"), mmap_mode="r")
    y = torch.from_numpy(np.load(os.path.join(folder, "labels.npy"))).long()
    train = torch.from_numpy(np.load(os.path.join(folder, "train.npy"))).long()
    edges = np.load(os.path.join(peer, "edges.npy"), mmap_mode="r")
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():  # a read-only map: nothing writes to it
            warnings.simplefilter("ignore")
            edge_index = torch.from_numpy(edges)
    data = Data(x=x, y=y, edge_index=edge_index, num_nodes=x.shape[0])
    loader = NeighborLoader(
        data,
        num_neighbors=fanouts,
        input_nodes=train,
        batch_size=batch,
        shuffle=True,
        is_sorted=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    classes = int(y.max()) + 1
    model = GraphSAGE(x.shape[1], HIDDEN, len(fanouts), classes, dropout=DROPOUT)
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WD)
    t_setup = time.perf_counter() - t
    model.train()
    t0, steps, loss_sum = time.perf_counter(), 0, 0.0
    for b in loader:
        opt.zero_grad()
        out = model(
            b.x,
            b.edge_index,
            num_sampled_nodes_per_hop=b.num_sampled_nodes,
            num_sampled_edges_per_hop=b.num_sampled_edges,
        )[: b.batch_size]
        loss = F.cross_entropy(out, b.y[: b.batch_size])
        loss.backward()
        opt.step()
        steps, loss_sum = steps + 1, loss_sum + float(loss.detach())
        progress(t0, steps)
        if steps == cap:
            break
    report(t_setup, t0, steps, loss_sum)


def graphbolt(
    folder: str, peer: str, fanouts: list[int], batch: int, workers: int, cap: int
) -> None:
    import dgl.graphbolt as gb
    import dgl.nn as dglnn

    class SAGE(nn.Module):
        def __init__(self, in_size: int, hidden: int, out: int, layers: int) -> None:
            super().__init__()
            dims = [in_size] + [hidden] * (layers - 1) + [out]
            self.layers = nn.ModuleList(
                dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:], strict=True)
            )
            self.dropout = nn.Dropout(DROPOUT)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    t = time.perf_counter()
    # preprocessed once, beside the prepared arrays (disk_vs_peers.py): loaded as its
    # BuiltinDataset loads one, without hashing every file of the folder first
    dataset = gb.OnDiskDataset(os.path.join(peer, "gb"), force_preprocess=False).load()
    graph, features = dataset.graph, dataset.feature
    task = dataset.tasks[0]
    datapipe = gb.ItemSampler(task.train_set, batch_size=batch, shuffle=True)
    # GraphBolt lists fan-outs from the input layer: gnnpar's / PyG's order reversed
    datapipe = datapipe.sample_neighbor(graph, list(reversed(fanouts)))
    datapipe = datapipe.fetch_feature(features, node_feature_keys=["feat"])
    datapipe = datapipe.copy_to(torch.device("cpu"))
    loader = gb.DataLoader(datapipe, num_workers=workers)
    in_size = features.size("node", None, "feat")[0]
    model = SAGE(in_size, HIDDEN, task.metadata["num_classes"], len(fanouts))
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WD)
    t_setup = time.perf_counter() - t
    model.train()
    t0, steps, loss_sum = time.perf_counter(), 0, 0.0
    for data in loader:
        x = data.node_features["feat"]
        y = data.labels
        out = model(data.blocks, x)
        loss = F.cross_entropy(out, y.long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps, loss_sum = steps + 1, loss_sum + float(loss.detach())
        progress(t0, steps)
        if steps == cap:
            break
    report(t_setup, t0, steps, loss_sum)


def main() -> None:
    side, folder, peer, fanouts, batch, workers, threads, seed = sys.argv[1:9]
    cap = int(sys.argv[9]) if len(sys.argv) > 9 else 0
    torch.set_num_threads(int(threads))
    torch.manual_seed(int(seed))
    fan = [int(f) for f in fanouts.split(",")]
    run = {"pyg": pyg, "graphbolt": graphbolt}[side]
    run(folder, peer, fan, int(batch), int(workers), cap)


if __name__ == "__main__":
    main()
