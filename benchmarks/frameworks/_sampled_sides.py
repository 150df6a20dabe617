"""One side of ``benchmarks/frameworks/sampled_vs_dgl_pyg.py``: study 002's neighbour-sampled training in plain PyG or
plain DGL, written the way each library's own examples do it, on the graph sampled_vs_dgl_pyg.py saved.

Runs in the peer's own interpreter (``/work/peers/pyg/bin/python``, ``/work/peers/dgl/bin/python``)
and imports nothing of gnnpar. ``python _sampled_sides.py SIDE FOLDER MODEL RANKS WORKERS EPOCHS
[PRECISION]`` starts RANKS processes (``torch.multiprocessing.spawn``, gloo, one thread each), trains EPOCHS
epochs and prints one JSON line: per-epoch wall time of the slowest rank, sampled edges and
computed messages per batch (means over rank 0's batches) and the test accuracy.

* PyG (``examples/multi_gpu/distributed_sampling.py``, ``examples/reddit.py``): each rank gets
  ``train_idx.split(...)[rank]``, a ``NeighborLoader(num_neighbors=[25, 10, 10],
  batch_size=1024, shuffle=True)`` over it, the model under DDP, and trains on
  ``model(batch.x, batch.edge_index)[:batch.batch_size]``: every layer on the whole sampled
  subgraph (PyG's default; ``trim_to_layer`` is opt-in).
* DGL (``examples/pytorch/graphsage/node_classification.py``, ``multigpu/``): ``NeighborSampler
  ([10, 10, 25])`` (DGL lists fan-outs from the input layer), ``DataLoader(use_ddp=True)``,
  blocks, DDP.

``PRECISION`` ``bf16``: the forward and the loss under ``torch.autocast("cpu",
dtype=torch.bfloat16)``, as PyTorch's AMP recipe writes it (fp32 weights, Adam in fp32, no
gradient scaler for bfloat16); the default ``fp32`` runs without autocast.

Deviations, the same on both sides: test accuracy is computed on the test nodes with the same
sampled neighbourhoods (fan-outs 25, 10, 10) rather than with the examples' layer-wise full
inference (gnnpar evaluates exactly on the full graph; on this stand-in every side reaches 1.0);
GAT on DGL samples from the graph with self-loops added (``dgl.add_self_loop``, as DGL's GAT
examples do) because PyG's GATConv adds a self-loop to every node and DGL's does not.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FANOUTS = [25, 10, 10]
BATCH = 1024


def load(folder: str) -> dict:
    g = {k: torch.from_numpy(np.load(os.path.join(folder, f"{k}.npy"))) for k in NAMES}
    return g


NAMES = ("rowptr", "col", "x", "y", "train_idx", "test_idx")


def edge_index_of(g: dict) -> torch.Tensor:
    """source -> target edges from the incoming CSR (row v lists v's in-neighbours)."""
    deg = g["rowptr"][1:] - g["rowptr"][:-1]
    dst = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    return torch.stack([g["col"], dst])


# ----------------------------------------------------------------------------------------- PyG
def pyg_model(name: str, in_dim: int, classes: int) -> nn.Module:
    from torch_geometric.nn import GATConv, SAGEConv

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if name == "sage":
                dims, self.p = [in_dim, 256, 256, classes], 0.5
                self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))
            else:
                dims, self.p = [in_dim, 16, 16, classes], 0.6
                self.convs = nn.ModuleList(
                    GATConv(a, b, heads=1, dropout=0.6) for a, b in zip(dims, dims[1:])
                )

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                last = i == len(self.convs) - 1
                if name == "sage":
                    x = conv(x, edge_index)
                    if not last:
                        x = F.dropout(x.relu(), self.p, self.training)
                else:
                    x = conv(F.dropout(x, self.p, self.training), edge_index)
                    if not last:
                        x = F.elu(x)
            return x

    return Net()


def autocast(precision: str):
    """The forward and loss in ``precision`` (``fp32``: a context that does nothing)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def pyg_run(rank, world, g: dict, name: str, workers: int, epochs: int, precision: str) -> dict:
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    data = Data(x=g["x"], y=g["y"], edge_index=edge_index_of(g))
    mine = g["train_idx"].split(g["train_idx"].numel() // world)[rank]
    kw = dict(num_workers=workers, persistent_workers=workers > 0)
    loader = NeighborLoader(data, FANOUTS, input_nodes=mine, batch_size=BATCH, shuffle=True, **kw)
    model = pyg_model(name, g["x"].size(1), int(g["y"].max()) + 1)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=5e-3, weight_decay=5e-4)
    layers, times, edges = 3, [], []
    for _ in range(epochs):
        net.train()
        t0 = time.perf_counter()
        for batch in loader:
            opt.zero_grad()
            with autocast(precision):
                out = net(batch.x, batch.edge_index)[: batch.batch_size]
                loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
            edges.append(batch.edge_index.size(1))
        times.append(time.perf_counter() - t0)
    # every layer runs on the whole batch; GATConv adds one self-loop per node
    messages = [e * layers for e in edges]
    acc = None
    if rank == 0:
        model.eval()
        test = NeighborLoader(data, FANOUTS, input_nodes=g["test_idx"], batch_size=4096)
        right = 0
        with torch.no_grad():
            for b in test:
                pred = model(b.x, b.edge_index)[: b.batch_size].argmax(-1)
                right += int((pred == b.y[: b.batch_size]).sum())
        acc = right / g["test_idx"].numel()
    return {"times": times, "edges": edges, "messages": messages, "acc": acc}


# ----------------------------------------------------------------------------------------- DGL
def dgl_model(name: str, in_dim: int, classes: int) -> nn.Module:
    import dgl.nn as dglnn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if name == "sage":
                dims = [in_dim, 256, 256, classes]
                self.layers = nn.ModuleList(
                    dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims, dims[1:])
                )
                self.dropout = nn.Dropout(0.5)
            else:
                dims = [in_dim, 16, 16, classes]
                self.layers = nn.ModuleList(
                    dglnn.GATConv(a, b, 1, feat_drop=0.6, attn_drop=0.6, allow_zero_in_degree=True)
                    for a, b in zip(dims, dims[1:])
                )

        def forward(self, blocks, h):
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                last = i == len(self.layers) - 1
                h = layer(block, h)
                if name == "sage":
                    if not last:
                        h = self.dropout(F.relu(h))
                else:
                    h = h.mean(1) if last else F.elu(h.flatten(1))
            return h

    return Net()


def dgl_run(rank, world, g: dict, name: str, workers: int, epochs: int, precision: str) -> dict:
    import dgl

    n = g["rowptr"].numel() - 1
    graph = dgl.graph(
        ("csc", (g["rowptr"], g["col"], torch.tensor([], dtype=torch.long))), num_nodes=n
    )
    if name == "gat3":
        graph = dgl.add_self_loop(graph)
    graph.ndata["feat"], graph.ndata["label"] = g["x"], g["y"]
    sampler = dgl.dataloading.NeighborSampler(
        list(reversed(FANOUTS)), prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )
    loader = dgl.dataloading.DataLoader(
        graph,
        g["train_idx"],
        sampler,
        batch_size=BATCH,
        shuffle=True,
        drop_last=False,
        num_workers=workers,
        use_ddp=world > 1,
    )
    model = dgl_model(name, g["x"].size(1), int(g["y"].max()) + 1)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=5e-3, weight_decay=5e-4)
    times, edges, messages = [], [], []
    for _ in range(epochs):  # use_ddp: the loader reshuffles every epoch itself
        net.train()
        t0 = time.perf_counter()
        for _, _, blocks in loader:
            opt.zero_grad()
            with autocast(precision):
                out = net(blocks, blocks[0].srcdata["feat"])
                loss = F.cross_entropy(out, blocks[-1].dstdata["label"])
            loss.backward()
            opt.step()
            e = [b.num_edges() for b in blocks]
            edges.append(sum(e))
            messages.append(sum(e))  # a block's layer computes its own edges only
        times.append(time.perf_counter() - t0)
    acc = None
    if rank == 0:
        model.eval()
        test = dgl.dataloading.DataLoader(graph, g["test_idx"], sampler, batch_size=4096)
        right = 0
        with torch.no_grad():
            for _, _, blocks in test:
                pred = model(blocks, blocks[0].srcdata["feat"]).argmax(-1)
                right += int((pred == blocks[-1].dstdata["label"]).sum())
        acc = right / g["test_idx"].numel()
    return {"times": times, "edges": edges, "messages": messages, "acc": acc}


# --------------------------------------------------------------------------------------- ranks
def rank_main(rank, world, side, folder, name, workers, epochs, precision, port, owner):
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    g = load(folder)
    run = pyg_run if side == "pyg" else dgl_run
    out = run(rank, world, g, name, workers, epochs, precision)
    if world > 1:  # the slowest rank's epoch
        t = torch.tensor(out["times"], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out["times"] = t.tolist()
        dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(folder, f"out-{side}-{owner}.json"), "w") as f:
            json.dump(out, f)


def main() -> None:
    side, folder, name = sys.argv[1], sys.argv[2], sys.argv[3]
    world, workers, epochs = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    precision = sys.argv[7] if len(sys.argv) > 7 else "fp32"
    port = 29500 + os.getpid() % 1000
    args = (world, side, folder, name, workers, epochs, precision, port, os.getpid())
    if world == 1:
        rank_main(0, *args)
    else:
        torch.multiprocessing.spawn(rank_main, args=args, nprocs=world, join=True)
    path = os.path.join(folder, f"out-{side}-{os.getpid()}.json")
    with open(path) as f:
        out = json.load(f)
    os.unlink(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
