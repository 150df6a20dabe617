"""One side of ``benchmarks/frameworks/cluster_gcn_vs_dgl_pyg.py``: study 003's Cluster-GCN all-reduce training in
plain PyG or plain DGL, written the way each library's own examples do it, on the graph that
``benchmarks/frameworks/sampled_vs_dgl_pyg.py``'s ``export`` saved.

Runs in the peer's own interpreter (``/work/peers/pyg/bin/python``, ``/work/peers/dgl/bin/python``)
and imports nothing of gnnpar. ``python _cluster_gcn_sides.py SIDE FOLDER RANKS EPOCHS PARTS`` starts
RANKS processes (``torch.multiprocessing.spawn``, gloo, one thread each), partitions the graph
into PARTS METIS parts in every rank (timed: ``partition_s``), trains EPOCHS epochs of one part
per step under DDP (all-reduce of the gradients every step) and prints one JSON line: per-epoch
wall time of the slowest rank (partitioning excluded), partition time, intra-part edges per
batch and rank 0's test accuracy with a full-graph forward.

Model, study 003 table 3.3 (Reddit): GCN, 3 graph convolutions (2 hidden layers of 128),
dropout 0.2 before each convolution, ReLU between, Adam lr 1e-2, no weight decay; loss: cross
entropy over the training nodes of the batch's subgraph; symmetric normalisation with a self-loop
per node computed on the subgraph each step (PyG's ``GCNConv`` default, DGL's ``GraphConv
(norm="both")`` on a subgraph of the graph with self-loops added).

* PyG (``examples/cluster_gcn_reddit.py``, DDP as ``examples/multi_gpu/``): ``ClusterData(data,
  num_parts=PARTS)`` (METIS through pyg-lib / torch-sparse), ``ClusterLoader(batch_size=1)``
  with a ``DistributedSampler`` over the parts, so each rank gets its share and a new order each
  epoch (``set_epoch``).
* DGL (``examples/pytorch/cluster_gcn``): ``ClusterGCNSampler(g, PARTS)`` (``dgl.metis_partition``),
  ``DataLoader(g, torch.arange(PARTS), sampler, batch_size=1, shuffle=True, use_ddp=True)``.

Deviations: the examples use SAGEConv (PyG) / GraphSAGE (DGL) and bigger batches of parts;
here both run study 003's GCN with one part per step, as gnnpar does. Both peers' partition
caches are not used: every run partitions afresh (timed separately).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HIDDEN, LAYERS, DROPOUT, LR = 128, 3, 0.2, 1e-2
NAMES = ("rowptr", "col", "x", "y", "train_idx", "test_idx")


def load(folder: str) -> dict:
    g = {k: torch.from_numpy(np.load(os.path.join(folder, f"{k}.npy"))) for k in NAMES}
    n = g["rowptr"].numel() - 1
    g["train_mask"] = torch.zeros(n, dtype=torch.bool)
    g["train_mask"][g["train_idx"]] = True
    return g


def edge_index_of(g: dict) -> torch.Tensor:
    """source -> target edges from the incoming CSR (row v lists v's in-neighbours)."""
    deg = g["rowptr"][1:] - g["rowptr"][:-1]
    dst = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    return torch.stack([g["col"], dst])


def dims_of(g: dict) -> list[int]:
    return [g["x"].size(1)] + [HIDDEN] * (LAYERS - 1) + [int(g["y"].max()) + 1]


class Net(nn.Module):
    def __init__(self, convs):
        super().__init__()
        self.convs = nn.ModuleList(convs)

    def forward(self, graph, x):
        for i, conv in enumerate(self.convs):
            x = conv(graph, F.dropout(x, DROPOUT, self.training))
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def accuracy(model, graph, g: dict) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(graph, g["x"]).argmax(-1)
    test = g["test_idx"]
    return float((pred[test] == g["y"][test]).float().mean())


# ----------------------------------------------------------------------------------------- PyG
def pyg_run(rank: int, world: int, g: dict, epochs: int, parts: int) -> dict:
    from torch_geometric.data import Data
    from torch_geometric.loader import ClusterData, ClusterLoader
    from torch_geometric.nn import GCNConv

    class Conv(nn.Module):  # Net passes (graph, x); GCNConv takes (x, edge_index)
        def __init__(self, a, b):
            super().__init__()
            self.conv = GCNConv(a, b)

        def forward(self, edge_index, x):
            return self.conv(x, edge_index)

    data = Data(x=g["x"], y=g["y"], edge_index=edge_index_of(g), train_mask=g["train_mask"])
    t0 = time.perf_counter()
    cluster = ClusterData(data, num_parts=parts, save_dir=None, log=False)
    partition_s = time.perf_counter() - t0
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(parts), num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    loader = ClusterLoader(cluster, batch_size=1, sampler=sampler)
    d = dims_of(g)
    model = Net(Conv(a, b) for a, b in zip(d, d[1:]))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    times, edges = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        net.train()
        t0 = time.perf_counter()
        for batch in loader:
            opt.zero_grad()
            out = net(batch.edge_index, batch.x)
            m = batch.train_mask
            F.cross_entropy(out[m], batch.y[m]).backward()
            opt.step()
            edges.append(batch.edge_index.size(1))
        times.append(time.perf_counter() - t0)
    acc = accuracy(model, data.edge_index, g) if rank == 0 else None
    return {"times": times, "partition_s": partition_s, "edges": edges, "acc": acc}


# ----------------------------------------------------------------------------------------- DGL
def dgl_run(rank: int, world: int, g: dict, epochs: int, parts: int) -> dict:
    import dgl
    from dgl.nn import GraphConv

    n = g["rowptr"].numel() - 1
    graph = dgl.graph(
        ("csc", (g["rowptr"], g["col"], torch.tensor([], dtype=torch.long))), num_nodes=n
    )
    graph = dgl.add_self_loop(graph)  # PyG's GCNConv adds one per node; DGL's GraphConv does not
    graph.ndata["feat"], graph.ndata["label"] = g["x"], g["y"]
    graph.ndata["train_mask"] = g["train_mask"]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sampler = dgl.dataloading.ClusterGCNSampler(
            graph,
            parts,
            cache_path=os.path.join(tmp, "cluster_gcn.pkl"),
            prefetch_ndata=["feat", "label", "train_mask"],
        )
        partition_s = time.perf_counter() - t0
    loader = dgl.dataloading.DataLoader(
        graph,
        torch.arange(parts),
        sampler,
        batch_size=1,
        shuffle=True,
        drop_last=False,
        num_workers=0,
        use_ddp=world > 1,
    )
    d = dims_of(g)
    model = Net(GraphConv(a, b, norm="both") for a, b in zip(d, d[1:]))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    times, edges = [], []
    for _ in range(epochs):  # use_ddp: the loader reshuffles every epoch itself
        net.train()
        t0 = time.perf_counter()
        for sg in loader:
            opt.zero_grad()
            out = net(sg, sg.ndata["feat"])
            m = sg.ndata["train_mask"]
            F.cross_entropy(out[m], sg.ndata["label"][m]).backward()
            opt.step()
            edges.append(sg.num_edges())
        times.append(time.perf_counter() - t0)
    acc = accuracy(model, graph, g) if rank == 0 else None
    return {"times": times, "partition_s": partition_s, "edges": edges, "acc": acc}


# --------------------------------------------------------------------------------------- ranks
def rank_main(rank, world, side, folder, epochs, parts, port, owner):
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    g = load(folder)
    out = (pyg_run if side == "pyg" else dgl_run)(rank, world, g, epochs, parts)
    if world > 1:  # the slowest rank's epoch and partitioning
        t = torch.tensor(out["times"] + [out["partition_s"]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out["times"], out["partition_s"] = t[:-1].tolist(), float(t[-1])
        dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(folder, f"cluster-{side}-{owner}.json"), "w") as f:
            json.dump(out, f)


def main() -> None:
    side, folder = sys.argv[1], sys.argv[2]
    world, epochs, parts = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    with socket.socket() as s:  # a free port, not one derived from the pid (tests run beside)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (world, side, folder, epochs, parts, port, os.getpid())
    if world == 1:
        rank_main(0, *args)
    else:
        torch.multiprocessing.spawn(rank_main, args=args, nprocs=world, join=True)
    path = os.path.join(folder, f"cluster-{side}-{os.getpid()}.json")
    with open(path) as f:
        out = json.load(f)
    os.unlink(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
