"""DistDGL's side of ``benchmarks/comm/shard_sampled_vs_distdgl.py``: DGL 2.1's ``dgl.distributed``
run as its own example does (``examples/distributed/graphsage/node_classification.py``, launched
by ``tools/launch.py``). Runs in the peer's interpreter (``/work/peers/dgl/bin/python``) and
imports nothing of gnnpar.

Three commands:

* ``partition PREPARED OUT PARTS``: the prepared folder's in-edge CSR (``indptr.npy``,
  ``indices.npy``: node v aggregates ``indices[indptr[v]:indptr[v+1]]``), features, labels and
  splits into one ``DGLGraph`` (``("csc", ...)``: the same in-edges), then
  ``dgl.distributed.partition_graph(..., part_method="metis", balance_ntypes=train_mask,
  balance_edges=True)`` into PARTS parts under OUT (``OUT/papers.json``), as DGL's
  ``examples/distributed/graphsage/partition_graph.py`` does. Prints one JSON line: the edge cut
  METIS reports is not exposed, so the cut is counted from the parts' inner/halo edges.
* ``train ...``: the example's trainer and server, unchanged in what it computes: ``DistGraph``,
  ``node_split(train_mask, force_even=True)``, ``DistNodeDataLoader`` over a
  ``NeighborSampler``, ``DistSAGE`` (``SAGEConv`` "mean") under DDP (gloo), Adam, cross-entropy.
  Launched by ``launch.py`` this file is both the server (``DGL_ROLE=server``: ``initialize``
  serves and exits) and the trainer. Deviations from the example, each to match gnnpar's side:
  the fan-outs are given in gnnpar's order (hop 1 first) and reversed for DGL (which lists them
  from the input layer); Adam with gnnpar's GraphSAGE settings (lr 5e-3, weight decay 5e-4,
  dropout 0.5); no per-epoch evaluation (gnnpar's epoch time excludes its evaluation); one JSON line per trainer with its epoch
  times, steps and losses (``--result``: written by trainer 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def partition(prepared: str, out: str, parts: int) -> None:
    import dgl
    import numpy as np
    import torch

    def arr(name: str) -> np.ndarray:
        return np.load(os.path.join(prepared, f"{name}.npy"))

    indptr = torch.from_numpy(arr("indptr").astype(np.int64))
    indices = torch.from_numpy(arr("indices").astype(np.int64))
    n = indptr.numel() - 1
    g = dgl.graph(("csc", (indptr, indices, torch.tensor([], dtype=torch.int64))), num_nodes=n)
    del indptr, indices
    g.ndata["features"] = torch.from_numpy(arr("features"))
    g.ndata["labels"] = torch.from_numpy(arr("labels").astype(np.int64))
    for split in ("train", "val", "test"):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(arr(split).astype(np.int64))] = True
        g.ndata[f"{split}_mask"] = mask
    t0 = time.perf_counter()
    dgl.distributed.partition_graph(
        g,
        "papers",
        parts,
        out,
        part_method="metis",
        balance_ntypes=g.ndata["train_mask"],
        balance_edges=True,
    )
    took = time.perf_counter() - t0
    meta = json.loads(open(os.path.join(out, "papers.json")).read())
    inner_edges = [b - a for a, b in meta["edge_map"]["_N:_E:_N"]] if "edge_map" in meta else []
    nodes = [b - a for a, b in meta["node_map"]["_N"]]
    print(
        json.dumps(
            {
                "nodes": n,
                "edges": int(g.num_edges()),
                "parts": parts,
                "nodes_per_part": nodes,
                "edges_per_part": inner_edges,
                "partition_s": took,
            }
        )
    )


def edge_cut(out: str) -> None:
    """The edges whose two ends METIS put in different parts: each part holds its nodes'
    in-edges (``inner_edge``) with halo copies of the remote sources (not ``inner_node``)."""
    import dgl

    meta = json.loads(open(os.path.join(out, "papers.json")).read())
    cut = total = 0
    for p in range(meta["num_parts"]):
        g = dgl.load_graphs(os.path.join(out, f"part{p}", "graph.dgl"))[0][0]
        inner = g.edata["inner_edge"].bool()
        src, _ = g.edges()
        cut += int((inner & ~g.ndata["inner_node"].bool()[src]).sum())
        total += int(inner.sum())
    print(json.dumps({"edges": total, "edge_cut": cut, "edge_cut_share": cut / total}))


def build_model(in_feats: int, hidden: int, classes: int, layers: int, dropout: float):  # noqa: ANN201
    import dgl.nn.pytorch as dglnn
    import torch.nn.functional as F
    from torch import nn

    class Model(nn.Module):
        """The example's DistSAGE (its forward; the layer-wise inference is not used here)."""

        def __init__(self) -> None:
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
            self.layers = nn.ModuleList(
                dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:])
            )
            self.dropout = nn.Dropout(dropout)

        def forward(self, blocks, x):  # noqa: ANN001, ANN202
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    return Model()


def train(args: argparse.Namespace) -> None:
    import dgl
    import torch as th
    from torch import nn

    th.set_num_threads(args.threads)
    dgl.distributed.initialize(args.ip_config)  # a server serves here and exits
    th.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    fanouts = [int(f) for f in args.fanouts.split(",")][::-1]  # DGL: input layer first
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    loader = dgl.dataloading.DistNodeDataLoader(
        g, train_nid, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False
    )
    th.manual_seed(args.seed)
    model = build_model(
        g.ndata["features"].shape[1], args.hidden, args.classes, len(fanouts), args.dropout
    )
    model = th.nn.parallel.DistributedDataParallel(model)
    loss_fcn = nn.CrossEntropyLoss()
    optimizer = th.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    epoch_s, losses, steps = [], [], []
    for _ in range(args.epochs):
        tic = time.time()
        total, n = 0.0, 0
        with model.join():
            for input_nodes, seeds, blocks in loader:
                x = g.ndata["features"][input_nodes]
                y = g.ndata["labels"][seeds].long()
                loss = loss_fcn(model(blocks, x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss)
                n += 1
        epoch_s.append(time.time() - tic)
        losses.append(total / max(n, 1))
        steps.append(n)
    times = [None] * th.distributed.get_world_size()
    th.distributed.all_gather_object(times, epoch_s)
    rec = {
        "rank": g.rank(),
        "epoch_s": epoch_s,
        "epoch_s_slowest": [max(t[e] for t in times) for e in range(len(epoch_s))],
        "loss_curve": losses,
        "steps_per_epoch": steps,
        "train_nodes": int(len(train_nid)),
    }
    print(json.dumps(rec), flush=True)
    if g.rank() == 0 and args.result:
        with open(args.result + ".tmp", "w") as f:
            json.dump(rec, f)
        os.replace(args.result + ".tmp", args.result)
    th.distributed.barrier()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "partition":
        partition(argv[1], argv[2], int(argv[3]))
        return
    if argv and argv[0] == "cut":
        edge_cut(argv[1])
        return
    p = argparse.ArgumentParser(description="DistDGL trainer (node_classification.py's)")
    p.add_argument("--graph_name", default="papers")
    p.add_argument("--ip_config")
    p.add_argument("--part_config")
    p.add_argument("--classes", type=int, required=True)
    p.add_argument("--fanouts", default="15,10", help="gnnpar's order: hop 1 first")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--weight_decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--result", default="")
    p.add_argument("--local_rank", type=int)  # torch.distributed.run may pass it
    train(p.parse_args(argv))


if __name__ == "__main__":
    main()
