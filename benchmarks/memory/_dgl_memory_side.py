"""DGL's side of ``benchmarks/memory/bytes_per_node_edge.py``: sampled GraphSAGE training on
the arrays of a gnnpar prepared folder, held in memory, written as DGL's own example
(``examples/pytorch/graphsage/node_classification.py``: ``NeighborSampler``,
``dgl.dataloading.DataLoader`` with ``num_workers=0``, three ``dglnn.SAGEConv(..., "mean")``,
Adam), for ``STEPS`` steps; then prints one JSON line: ``base_rss_bytes`` (this process after
its imports), ``peak_rss_bytes`` (``VmHWM``), ``rss_anon_bytes`` and ``rss_file_bytes`` at
the end, ``steps``. Imports nothing of gnnpar; runs in DGL's interpreter.

    python _dgl_memory_side.py FOLDER FANOUTS BATCH STEPS THREADS HIDDEN

The graph is built from the folder's in-edge CSR with ``dgl.graph(("csc", ...))`` (DGL's
cheapest form for neighbour sampling, which reads in-edges: no COO copy, no conversion);
features and labels are loaded into memory (``g.ndata``), as the example's datasets are.
``FANOUTS`` is given seeds' hop first (gnnpar's order) and reversed for DGL (its first
fan-out is the input layer's).
"""

from __future__ import annotations

import json
import sys


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    folder, fanouts, batch, steps, threads, hidden = sys.argv[1:7]
    import dgl
    import dgl.nn as dglnn
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(int(threads))
    base = status("VmRSS")
    torch.manual_seed(0)
    indptr = torch.from_numpy(np.load(f"{folder}/indptr.npy"))
    indices = torch.from_numpy(np.load(f"{folder}/indices.npy").astype(np.int64))
    n = indptr.numel() - 1
    g = dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))), num_nodes=n)
    del indptr, indices
    g.ndata["feat"] = torch.from_numpy(np.load(f"{folder}/features.npy"))
    g.ndata["label"] = torch.from_numpy(np.load(f"{folder}/labels.npy"))
    train_idx = torch.from_numpy(np.load(f"{folder}/train.npy"))
    classes = int(g.ndata["label"].max()) + 1

    class SAGE(nn.Module):  # the example's model
        def __init__(self, in_size: int, hid_size: int, out_size: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                [
                    dglnn.SAGEConv(in_size, hid_size, "mean"),
                    dglnn.SAGEConv(hid_size, hid_size, "mean"),
                    dglnn.SAGEConv(hid_size, out_size, "mean"),
                ]
            )
            self.dropout = nn.Dropout(0.5)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    fan = [int(f) for f in fanouts.split(",")][::-1]
    sampler = dgl.dataloading.NeighborSampler(
        fan, prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )
    loader = dgl.dataloading.DataLoader(
        g, train_idx, sampler, batch_size=int(batch), shuffle=True, drop_last=False,
        num_workers=0,
    )  # fmt: skip
    model = SAGE(g.ndata["feat"].shape[1], int(hidden), classes)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    done = 0
    model.train()
    while done < int(steps):
        for _, _, blocks in loader:
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done >= int(steps):
                break
    print(
        json.dumps(
            {
                "base_rss_bytes": base,
                "peak_rss_bytes": status("VmHWM"),
                "rss_anon_bytes": status("RssAnon"),
                "rss_file_bytes": status("RssFile"),
                "steps": done,
            }
        )
    )


if __name__ == "__main__":
    main()
