"""Study 002's GraphSAGE under PyTorch Lightning, the same ``LightningModule`` fed by gnnpar's
``GraphDataModule``, by PyG's ``NeighborLoader`` or by DGL's ``DataLoader``, on 1 and 2
ranks; and gnnpar's ``GossipStrategy`` against Lightning's DDP with rank 1 three times slower.

    python benchmarks/frameworks/lightning_loaders.py                       # the figures
    python benchmarks/frameworks/lightning_loaders.py --smoke               # a few seconds
    python benchmarks/frameworks/lightning_loaders.py --peer-path DIR       # where pyg-lib is
    python benchmarks/frameworks/lightning_loaders.py --dgl-python DGLDIR/bin/python \
        --dgl-pyg-path PYGDIR                                               # and DGL's loader

What is measured, per run (one ``Trainer.fit`` in fresh processes, Lightning's DDP on CPU with
gloo, ``torch.set_num_threads(cores // ranks)``):

* ``data_wait_s``: the seconds the training loop waits for batches, summed over an epoch, from
  the end of one step (``on_train_batch_end``) to the start of the next (``on_train_batch_start``:
  Lightning has fetched the batch), the slowest rank's;
* ``epoch_s``: an epoch end to end (``on_train_epoch_start`` to ``on_train_epoch_end``), the
  slowest rank's. The first epoch (workers starting, caches warming) is reported apart; the
  figures are medians over the later epochs and the repetitions, sides alternating;
* ``cpu_s``: the training process's CPU time over the epoch (``time.process_time``, all its
  threads, not its loader workers), the slowest rank's: the model's work and the batches'
  hand-over, less moved by other work on a loaded machine than ``epoch_s``;
* ``fit_s``: ``Trainer.fit`` end to end (set-up and every epoch), the slowest rank's.

The record also keeps each rank's wait for every batch (``rank_waits``, per epoch).
``--trace`` adds, per run, where each epoch's time went: every rank's step start and end times
(from rank 0's epoch start) and the CPU seconds of every process of the run in that epoch
(ranks, their fork servers, loader workers, resource trackers; sampled from ``/proc`` every
25 ms by the driver, ``_proc_cpu.py``), and the same CPU over the set-up. ``--forkserver-side``
adds gnnpar with its loader workers from a fork server (``GNNPAR_LOADER_START=forkserver``,
side ``gnnpar-forkserver``) instead of forks of the training process.

The model of every side but ``dgl-blocks`` is written as PyG's hierarchical-sampling example
writes it (``trim_to_layer`` before each layer: layer ``i`` runs on the nodes and edges the later
layers read, as DGL's blocks do; ``--no-trim``: every layer over the whole sampled subgraph).
The sides (each as its own Lightning example writes it; the model, optimiser and loss are the
same code): gnnpar, ``GraphDataModule(dataset, batch_size=1024, fanouts=[25, 10, 10],
loader_workers=W)``; PyG, ``NeighborLoader(data, input_nodes=train_idx, num_neighbors=[25, 10,
10], batch_size=1024, shuffle=True, num_workers=W, persistent_workers=W > 0)`` in a
``LightningDataModule`` (Lightning gives it a ``DistributedSampler`` under DDP), sampling with
pyg-lib (the anchors' wheels, /work/shared/anchors; never a dependency of gnnpar: ``--peer-path``
is a folder they are installed in, e.g. ``pip install --no-deps --target DIR wheels/*.whl``, put
on that side's ``PYTHONPATH`` only; the side is skipped with a message where pyg-lib is missing).
DGL (``dgl``): the same ``LightningModule`` fed by ``dgl.dataloading.DataLoader`` with
``NeighborSampler`` as DGL's Lightning example (``examples/pytorch/graphsage/lightning``) writes
the loader (features and labels prefetched by DGL's loader, ``use_ddp`` under DDP, loader
workers sampling), with one step added to the sampler in the workers: the blocks made into the
hop-ordered PyG batch the module takes (``_dgl_hops.blocks_to_hops``; DGL samples each node anew
in every block, the batch keeps each node's first sample, as NeighborLoader samples once). DGL
lists fan-outs from the input layer, so it is given ``[10, 10, 25]``: 25 for the seeds, as on
the other sides. It runs in DGL's own interpreter (``--dgl-python``: the anchors' ``setup.sh dgl
DIR``, DGL 2.1.0 on torch 2.2.1, then ``DIR/bin/pip install "lightning>=2.2,<2.5"
torch==2.2.1``) with PyG's Python package for it (``--dgl-pyg-path``: ``DIR/bin/python -m pip
install --no-deps --target PYGDIR torch_geometric==2.8.1 xxhash``; no pyg-lib: DGL samples);
skipped with a message without them. ``--dgl-blocks`` adds DGL's own model too (side
``dgl-blocks``): a ``dglnn.SAGEConv`` per block, as DGL's example writes it, a different
computation (each layer on its block's destination nodes only).

Straggler: ``Trainer(strategy="ddp")`` and ``GossipStrategy(sync_every=1)`` on gnnpar's data
module (batches of ``--straggler-batch`` seeds: an epoch of many batches, which gossip's work
pool shares out by speed), ``Slowdown({1: 3})`` on both; ``train_s`` is the whole fit's training time (the
slowest rank's summed epochs) and ``test_acc`` the final model's accuracy on the test nodes
(each rank its share of the test nodes, the scores averaged by ``sync_dist``; gossip's final
model is the ranks' average). In these runs the straggler's sleep comes after the step's end
as the timing callback sees it, so their raw ``data_wait_s`` includes it: only ``epoch_s`` (and
``train_s``, their sum) is read from them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

STARTED = time.time()  # this process's start (a side's marks count from it)
HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
FANOUTS = [25, 10, 10]
BATCH = 1024


# ------------------------------------------------------------------------------ one side
def side_main(args: argparse.Namespace) -> None:
    """One Trainer.fit (Lightning starts rank 1 by running this again with the same argv)."""
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.ranks))
    if args.side == "dgl":
        SAGE, dm = dgl_side(args, pl, torch, F)
    elif args.side == "dgl-blocks":
        SAGE, dm = dgl_blocks_side(args, pl, torch, F)
    else:
        SAGE, dm = pyg_model(pl, torch, F, trim=not args.no_trim), None
    _fit(args, pl, torch, dist, SAGE, dm)


def pyg_model(pl, torch, F, trim: bool = True):
    """Study 002's GraphSAGE on PyG batches (gnnpar's and PyG's sides), written as PyG's
    hierarchical-sampling example writes it (examples/hierarchical_sampling.py): where the batch
    carries ``num_sampled_nodes``/``num_sampled_edges`` (NeighborLoader's and gnnpar's do),
    ``trim_to_layer`` before each layer, so layer ``i`` runs only on the nodes and edges the
    later layers read (the seeds' outputs are those of the untrimmed model). ``trim=False``:
    every layer over the whole sampled subgraph (``--no-trim``, the earlier figures)."""
    from torch_geometric.nn import SAGEConv
    from torch_geometric.utils import trim_to_layer

    class SAGE(pl.LightningModule):
        """Study 002's GraphSAGE: 3 x 256, mean, dropout 0.5; Adam 5e-3, weight decay 5e-4."""

        def __init__(self, in_dim: int, num_classes: int, hidden: int = 256) -> None:
            super().__init__()
            dims = [in_dim, hidden, hidden, num_classes]
            self.convs = torch.nn.ModuleList(
                SAGEConv(a, b, aggr="mean") for a, b in zip(dims, dims[1:])
            )

        def forward(self, x, edge_index, num_sampled_nodes=None, num_sampled_edges=None):
            for i, conv in enumerate(self.convs):
                if trim and num_sampled_nodes is not None:
                    x, edge_index, _ = trim_to_layer(
                        i, num_sampled_nodes, num_sampled_edges, x, edge_index
                    )
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = F.dropout(F.relu(x), 0.5, self.training)
            return x

        def _seeds_out(self, batch):
            hops = [getattr(batch, k, None) for k in ("num_sampled_nodes", "num_sampled_edges")]
            return self(batch.x, batch.edge_index, *hops)[: batch.batch_size]

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self._seeds_out(batch), batch.y[: batch.batch_size])

        def test_step(self, batch, batch_idx):
            out = self._seeds_out(batch)
            acc = (out.argmax(-1) == batch.y[: batch.batch_size]).float().mean()
            self.log("test_acc", acc, batch_size=batch.batch_size, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=5e-3, weight_decay=5e-4)

    return SAGE


def dgl_graph(args, torch):
    """The saved graph as a DGL graph with its features and labels (both DGL sides)."""
    import dgl

    graph = torch.load(args.graph, weights_only=True)
    g = dgl.graph((graph["edge_index"][0], graph["edge_index"][1]), num_nodes=graph["x"].size(0))
    g.ndata["feat"], g.ndata["label"] = graph["x"], graph["y"]
    return g, graph["train_idx"], (graph["x"].size(1), int(graph["num_classes"]))


def dgl_loader(args, g, train_idx, sampler):
    """DGL's training loader as DGL's Lightning example writes it (both DGL sides)."""
    import dgl

    return dgl.dataloading.DataLoader(
        g,
        train_idx,
        sampler,
        device="cpu",
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=False,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        use_uva=False,
        use_ddp=args.ranks > 1,
    )


def dgl_side(args, pl, torch, F):
    """DGL's loader feeding the PyG ``LightningModule`` of the other sides (``dgl``): DGL's
    ``NeighborSampler`` and ``DataLoader`` as DGL's Lightning example writes them (features and
    labels prefetched by DGL's loader, ``use_ddp`` under DDP, loader workers sampling), with one
    step added to the sampler, in the loader workers: the blocks made into the hop-ordered PyG
    layout (``_dgl_hops.blocks_to_hops``: each node's first sample, re-samples left out), and
    DGL's prefetch told to gather the features of the kept nodes and the seeds' labels (one
    block of no edges carries them). The training process makes the PyG ``Data`` of it
    (``on_after_batch_transfer``, before the step: counted as data wait)."""
    import dgl
    from _dgl_hops import blocks_to_hops
    from dgl.dataloading import set_dst_lazy_features, set_src_lazy_features
    from torch_geometric.data import Data

    g, train_idx, dims = dgl_graph(args, torch)

    class HopSampler(dgl.dataloading.NeighborSampler):
        def sample(self, g, seed_nodes, exclude_eids=None):
            input_nodes, seeds, blocks = self.sample_blocks(g, seed_nodes, exclude_eids)
            keep, edge_index, nodes, edges = blocks_to_hops(
                input_nodes.numel(),
                [b.edges() for b in blocks],
                [b.num_dst_nodes() for b in blocks],
            )
            none = torch.zeros(0, dtype=torch.int64)
            carrier = dgl.create_block(
                (none, none), num_src_nodes=keep.numel(), num_dst_nodes=seeds.numel()
            )
            carrier.srcdata[dgl.NID], carrier.dstdata[dgl.NID] = input_nodes[keep], seeds
            set_src_lazy_features(carrier, self.prefetch_node_feats)
            set_dst_lazy_features(carrier, self.prefetch_labels)
            return carrier, edge_index, torch.tensor(nodes), torch.tensor(edges)

    class DGLData(pl.LightningDataModule):
        def train_dataloader(self):
            # DGL lists fan-outs from the input layer: hop 1 (the seeds') is the last
            sampler = HopSampler(
                FANOUTS[::-1], prefetch_node_feats=["feat"], prefetch_labels=["label"]
            )
            return dgl_loader(args, g, train_idx, sampler)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            carrier, edge_index, nodes, edges = batch
            return Data(
                x=carrier.srcdata["feat"],
                y=carrier.dstdata["label"],
                edge_index=edge_index,
                n_id=carrier.srcdata[dgl.NID],
                num_sampled_nodes=nodes.tolist(),
                num_sampled_edges=edges.tolist(),
                batch_size=carrier.num_dst_nodes(),
            )

    dm = DGLData()
    dm.dims = dims
    return pyg_model(pl, torch, F, trim=not args.no_trim), dm


def dgl_blocks_side(args, pl, torch, F):
    """DGL's own side as DGL's Lightning example writes it (examples/pytorch/graphsage/lightning,
    ``dgl-blocks``): ``dgl.dataloading.NeighborSampler`` with the features and labels
    prefetched into the blocks, ``dgl.dataloading.DataLoader`` over the training ids
    (``use_ddp`` under DDP, loader workers for CPU sampling), a ``dglnn.SAGEConv`` per block:
    DGL's model, not the other sides' (each layer on its block's destination nodes only).
    Study 002's sizes and optimiser."""
    import dgl
    import dgl.nn.pytorch as dglnn

    g, train_idx, dims = dgl_graph(args, torch)

    class SAGE(pl.LightningModule):
        def __init__(self, in_dim: int, num_classes: int, hidden: int = 256) -> None:
            super().__init__()
            dims = [in_dim, hidden, hidden, num_classes]
            self.layers = torch.nn.ModuleList(
                dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims, dims[1:])
            )
            self.dropout = torch.nn.Dropout(0.5)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

        def training_step(self, batch, batch_idx):
            _, _, blocks = batch
            out = self(blocks, blocks[0].srcdata["feat"])
            return F.cross_entropy(out, blocks[-1].dstdata["label"])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=5e-3, weight_decay=5e-4)

    class DGLData(pl.LightningDataModule):
        def train_dataloader(self):
            # DGL lists fan-outs from the input layer: hop 1 (the seeds') is the last
            sampler = dgl.dataloading.NeighborSampler(
                FANOUTS[::-1], prefetch_node_feats=["feat"], prefetch_labels=["label"]
            )
            return dgl_loader(args, g, train_idx, sampler)

    dm = DGLData()
    dm.dims = dims
    return SAGE, dm


def _fit(args, pl, torch, dist, SAGE, dm) -> None:
    class Times(pl.Callback):
        def __init__(self) -> None:
            self.epochs: list[dict] = []
            self.t_last = self.t_epoch = 0.0
            self.wait = 0.0
            self.steps = 0
            # wall-clock marks (time.time(), comparable across the ranks' processes)
            self.marks: list[tuple[str, float]] = [("started", STARTED)]

        def setup(self, trainer, pl_module, stage) -> None:
            self.marks.append(("setup", time.time()))

        def on_train_start(self, trainer, pl_module) -> None:
            self.marks.append(("train_start", time.time()))

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.marks.append(("epoch_start", time.time()))
            self.cpu_epoch = time.process_time()
            self.t_epoch = self.t_last = time.perf_counter()
            self.wait, self.steps, self.waits = 0.0, 0, []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.marks.append(("step_start", time.time()))
            self.waits.append(time.perf_counter() - self.t_last)
            self.wait += self.waits[-1]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.marks.append(("step_end", time.time()))
            self.t_last = time.perf_counter()
            self.steps += 1

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.marks.append(("epoch_end", time.time()))
            now, cpu = time.perf_counter(), time.process_time() - self.cpu_epoch
            self.epochs.append(
                {
                    "epoch_s": now - self.t_epoch,
                    "data_wait_s": self.wait,
                    "cpu_s": cpu,
                    "steps": self.steps,
                    "waits": self.waits,
                }
            )

    if args.side.startswith("dgl"):
        in_dim, classes = dm.dims
    elif args.side == "gnnpar":
        from gnnpar.lightning import GossipStrategy, GraphDataModule

        dm = GraphDataModule(
            dataset=args.dataset,
            scale=args.scale if args.dataset.startswith("synthetic-") else None,
            batch_size=args.batch_size,
            fanouts=FANOUTS,
            loader_workers=args.workers,
            seed=0,
        )
        in_dim, classes = dm.num_features, dm.num_classes
    else:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        graph = torch.load(args.graph, weights_only=True)
        data = Data(x=graph["x"], edge_index=graph["edge_index"], y=graph["y"])
        in_dim, classes = data.num_features, int(graph["num_classes"])
        kw = {"num_workers": args.workers, "persistent_workers": args.workers > 0}

        class PyGData(pl.LightningDataModule):
            def train_dataloader(self):
                return NeighborLoader(
                    data,
                    input_nodes=graph["train_idx"],
                    num_neighbors=FANOUTS,
                    batch_size=args.batch_size,
                    shuffle=True,
                    **kw,
                )

            def test_dataloader(self):
                return NeighborLoader(
                    data,
                    input_nodes=graph["test_idx"],
                    num_neighbors=FANOUTS,
                    batch_size=args.batch_size,
                    **kw,
                )

        dm = PyGData()

    times = Times()
    callbacks = [times]
    if args.slowdown:
        from gnnpar.lightning import Slowdown

        callbacks.append(Slowdown(args.slowdown))
    if args.strategy == "gossip":
        from gnnpar.lightning import GossipStrategy

        strategy = GossipStrategy(sync_every=1)
    else:
        strategy = "ddp" if args.ranks > 1 else "auto"
    pl.seed_everything(0, verbose=False)
    model = SAGE(in_dim, classes)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.ranks,
        strategy=strategy,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        # DGL's DataLoader shards the ids itself under DDP (use_ddp)
        use_distributed_sampler=not args.side.startswith("dgl"),
    )
    t_fit = time.perf_counter()
    times.marks.append(("fit", time.time()))
    trainer.fit(model, datamodule=dm)
    fit_s = time.perf_counter() - t_fit
    acc = None
    if args.test:
        trainer.test(model, datamodule=dm, verbose=False)
        acc = float(trainer.callback_metrics["test_acc"])
    ranks, fits, marks = [times.epochs], [fit_s], [times.marks]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, times.epochs)
        fits = [None] * dist.get_world_size()
        dist.all_gather_object(fits, fit_s)
        marks = [None] * dist.get_world_size()
        dist.all_gather_object(marks, times.marks)
    if trainer.global_rank == 0:
        epochs = [
            {k: max(r[e][k] for r in ranks) for k in ("epoch_s", "data_wait_s", "cpu_s")}
            | {
                "steps": [r[e]["steps"] for r in ranks],
                "rank_waits": [r[e]["waits"] for r in ranks],
            }
            for e in range(min(len(r) for r in ranks))
        ]
        record = {"epochs": epochs, "test_acc": acc, "fit_s": max(fits), "marks": marks}
        Path(args.result).write_text(json.dumps(record))


# ------------------------------------------------------------------------------ the driver
def run_side(args, side: str, ranks: int, graph: Path, folder: Path, **extra) -> dict | None:
    result = folder / f"{side}-{ranks}-{time.monotonic_ns()}.json"
    cmd = [
        sys.executable,
        str(HERE),
        "--side",
        side,
        "--ranks",
        str(ranks),
        "--graph",
        str(graph),
        "--result",
        str(result),
        "--dataset",
        args.dataset,
        "--scale",
        str(args.scale),
        "--epochs",
        str(args.epochs),
        "--workers",
        str(args.workers),
    ]
    if args.no_trim:
        cmd.append("--no-trim")
    if "batch_size" not in extra:
        extra["batch_size"] = args.batch_size
    for key, value in extra.items():
        flag = f"--{key.replace('_', '-')}"
        cmd += [flag] if value is True else [flag, str(value)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if side == "gnnpar-forkserver":  # gnnpar with its loader workers from a fork server
        cmd[cmd.index(side)] = "gnnpar"
        env["GNNPAR_LOADER_START"] = "forkserver"
    if side == "pyg":
        env["PYTHONPATH"] = os.pathsep.join([args.peer_path, str(ROOT / "src")])
    if side.startswith("dgl"):  # DGL's own interpreter (torch 2.2.1): nothing of gnnpar
        cmd[0], env["DGLBACKEND"] = args.dgl_python, "pytorch"
        env["PYTHONPATH"] = args.dgl_pyg_path if side == "dgl" else ""
    if not args.trace:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=str(folder), timeout=3000
        )
        out, err = proc.stdout, proc.stderr
    else:  # every process of the run's CPU time over time (ranks, fork servers, workers)
        from _proc_cpu import ProcCPU

        popen = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=folder
        )
        watch = ProcCPU(popen.pid)
        out, err = popen.communicate(timeout=3000)
        watch.stop()
        proc = popen
    if proc.returncode != 0:
        sys.exit(f"{side} x{ranks} failed:\n{out[-2000:]}\n{err[-4000:]}")
    record = json.loads(result.read_text())
    if args.trace:
        record["trace"] = trace_summary(watch, record["marks"])
        record["procs"] = watch.record()["procs"]  # the samples themselves are not kept
        print(f"{side} x{ranks} trace: {json.dumps(record['trace'])}", flush=True)
    return record


def trace_summary(watch, marks: list[list]) -> dict:
    """Where each epoch's time went: per epoch (rank 0's epoch start to the last rank's epoch
    end), each rank's steps (start, end, relative to that epoch start) and every kind of
    process's CPU seconds in that window; and the same CPU from the first rank's start to the
    first epoch's start (the set-up)."""
    starts = [[t for k, t in m if k == "epoch_start"] for m in marks]
    ends = [[t for k, t in m if k == "epoch_end"] for m in marks]
    epochs = []
    for e in range(min(len(s) for s in starts)):
        t0, t1 = min(s[e] for s in starts), max(x[e] for x in ends)
        steps = []
        for m in marks:
            mine = [t for k, t in m if k in ("step_start", "step_end") and t0 <= t <= t1 + 1e-3]
            steps.append([round(t - t0, 3) for t in mine])
        epochs.append(
            {
                "wall_s": round(t1 - t0, 3),
                "steps": steps,
                "cpu_s": {k: round(v, 3) for k, v in watch.cpu_between(t0, t1).items()},
            }
        )
    first = min(s[0] for s in starts)
    began = min(t for m in marks for k, t in m if k == "started")
    marks_rel = [
        [(k, round(t - began, 3)) for k, t in m if k not in ("step_start", "step_end")]
        for m in marks
    ]
    return {
        "setup_cpu_s": {
            k: round(v, 3) for k, v in watch.cpu_between(watch.samples[0][0], first).items()
        },
        "marks": marks_rel,
        "epochs": epochs,
    }


def peer_ready(path: str) -> bool:
    env = {**os.environ, "PYTHONPATH": path}
    check = "import torch_geometric.typing as t; assert t.WITH_PYG_LIB"
    return (
        subprocess.run([sys.executable, "-c", check], env=env, capture_output=True).returncode == 0
    )


def dgl_ready(python: str | None, pyg_path: str | None = None) -> bool:
    if not python:
        return False
    check = "import dgl, lightning" + (", torch_geometric" if pyg_path is not None else "")
    env = {**os.environ, "PYTHONPATH": pyg_path or "", "DGLBACKEND": "pytorch"}
    try:
        return subprocess.run([python, "-c", check], env=env, capture_output=True).returncode == 0
    except OSError:
        return False


def save_graph(args, folder: Path) -> Path:
    """The graph gnnpar loads, saved for the PyG side (the same tensors on both sides)."""
    import torch

    from gnnpar.data.datasets import load_dataset

    ds = load_dataset(args.dataset, os.environ.get("GNNPAR_DATA") or _root(), args.scale, 0)
    d = ds.data
    path = folder / "graph.pt"
    torch.save(
        {
            "x": d.x,
            "edge_index": d.edge_index,
            "y": d.y,
            "train_idx": d.train_mask.nonzero().view(-1),
            "test_idx": d.test_mask.nonzero().view(-1),
            "num_classes": ds.num_classes,
        },
        path,
    )
    print(
        f"graph: {args.dataset} scale {args.scale}: {ds.num_nodes:,} nodes, "
        f"{d.edge_index.size(1):,} edges, {int(d.train_mask.sum()):,} training nodes"
    )
    return path


def _root() -> str:
    from gnnpar.config.parse import default_data_root

    return str(default_data_root())


def later(runs: list[dict], key: str) -> float:
    """Median of ``key`` over every epoch but the first, over the repetitions."""
    xs = [e[key] for r in runs for e in r["epochs"][1:]] or [
        e[key] for r in runs for e in r["epochs"]
    ]
    return statistics.median(xs)


class LoadWatch:
    """The machine's load over the run: the 1-minute load average every 30 s, and the CPU busy
    share of all cores from /proc/stat (1 - idle / total; load counts threads waiting on the
    disk too, the busy share does not)."""

    def __init__(self, every_s: float = 30.0) -> None:
        import threading

        self.samples: list[float] = [os.getloadavg()[0]]
        self.stat0 = self._stat()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    @staticmethod
    def _stat() -> tuple[int, int] | None:
        try:
            cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return None
        ticks = [int(t) for t in cpu]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, total

    def stop(self) -> dict:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])
        end, busy = self._stat(), None
        if end is not None and self.stat0 is not None and end[1] > self.stat0[1]:
            busy = 1 - (end[0] - self.stat0[0]) / (end[1] - self.stat0[1])
        return {
            "load_1min_samples": self.samples,
            "load_1min_median": statistics.median(self.samples),
            "cpu_busy_share": busy,
        }


def driver(args: argparse.Namespace) -> None:
    import tempfile

    load_start, watch = os.getloadavg(), LoadWatch()
    folder = Path(tempfile.mkdtemp(prefix="gnnpar-lightning-bench-"))
    try:
        _drive(args, load_start, watch, folder)
    finally:  # the saved graph and the sides' results
        shutil.rmtree(folder, ignore_errors=True)


def _drive(args: argparse.Namespace, load_start, watch: LoadWatch, folder: Path) -> None:
    graph = save_graph(args, folder)
    sides = ["gnnpar"]
    if peer_ready(args.peer_path):
        sides.append("pyg")
    else:
        print(f"pyg side skipped: pyg-lib not importable from --peer-path {args.peer_path!r}")
    if dgl_ready(args.dgl_python, args.dgl_pyg_path):
        sides.append("dgl")
    else:
        print(
            f"dgl side skipped: --dgl-python {args.dgl_python!r} cannot import dgl and "
            f"lightning, or torch_geometric from --dgl-pyg-path {args.dgl_pyg_path!r} (build "
            "it with /work/shared/anchors/setup.sh dgl DIR, then `DIR/bin/python -m pip "
            'install "lightning>=2.2,<2.7"` and `DIR/bin/python -m pip install --no-deps '
            "--target PYGDIR torch_geometric==2.8.1 xxhash`)"
        )
    if args.dgl_blocks and dgl_ready(args.dgl_python):
        sides.append("dgl-blocks")
    if args.forkserver_side:
        sides.append("gnnpar-forkserver")
    rank_counts = [1] if args.smoke else [int(r) for r in args.rank_counts.split(",")]
    loaders: dict[str, dict] = {}
    for ranks in rank_counts:
        runs: dict[str, list] = {s: [] for s in sides}
        for rep in range(args.reps):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                runs[side].append(run_side(args, side, ranks, graph, folder))
        for side in sides[1:]:  # gnnpar's figure over the peer's, per repetition, median
            loaders[f"gnnpar/{side} x{ranks}"] = {
                key: statistics.median(
                    later([a], key) / later([b], key)
                    for a, b in zip(runs["gnnpar"], runs[side], strict=True)
                )
                for key in ("data_wait_s", "epoch_s", "cpu_s")
            } | {
                "first_epoch_s": statistics.median(
                    a["epochs"][0]["epoch_s"] / b["epochs"][0]["epoch_s"]
                    for a, b in zip(runs["gnnpar"], runs[side], strict=True)
                )
            }
            print(f"gnnpar/{side} x{ranks}: {loaders[f'gnnpar/{side} x{ranks}']}")
        for side in sides:
            loaders[f"{side} x{ranks}"] = {
                "data_wait_s": later(runs[side], "data_wait_s"),
                "epoch_s": later(runs[side], "epoch_s"),
                "cpu_s": later(runs[side], "cpu_s"),
                "first_epoch_s": statistics.median(r["epochs"][0]["epoch_s"] for r in runs[side]),
                "first_wait_s": statistics.median(
                    r["epochs"][0]["data_wait_s"] for r in runs[side]
                ),
                "fit_s": statistics.median(r["fit_s"] for r in runs[side]),
                "runs": runs[side],
            }
            print(
                f"{side} x{ranks}: wait {loaders[f'{side} x{ranks}']['data_wait_s']:.3f} s, "
                f"epoch {loaders[f'{side} x{ranks}']['epoch_s']:.3f} s, first epoch "
                f"{loaders[f'{side} x{ranks}']['first_epoch_s']:.3f} s (wait "
                f"{loaders[f'{side} x{ranks}']['first_wait_s']:.3f} s), fit "
                f"{loaders[f'{side} x{ranks}']['fit_s']:.2f} s"
            )
    straggler: dict[str, dict] = {}
    if not args.smoke and not args.no_straggler:
        kinds = ["ddp", "gossip"]
        runs = {k: [] for k in kinds}
        for rep in range(args.reps):
            for kind in kinds if rep % 2 == 0 else kinds[::-1]:
                runs[kind].append(
                    run_side(
                        args,
                        "gnnpar",
                        2,
                        graph,
                        folder,
                        strategy=kind,
                        slowdown="1=3",
                        test=True,
                        batch_size=args.straggler_batch,
                    )
                )
        for kind in kinds:
            train = [sum(e["epoch_s"] for e in r["epochs"]) for r in runs[kind]]
            straggler[kind] = {
                "train_s": statistics.median(train),
                "test_acc": statistics.median(r["test_acc"] for r in runs[kind]),
                "runs": runs[kind],
            }
            print(
                f"{kind} with rank 1 at 3x: train {straggler[kind]['train_s']:.2f} s, "
                f"test acc {straggler[kind]['test_acc']:.4f}"
            )
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "load_start": load_start,
        "load_end": os.getloadavg(),
        **watch.stop(),
        "python": platform.python_version(),
        "settings": vars(args),
        "loaders": loaders,
        "straggler": straggler,
    }
    busy = record["cpu_busy_share"]
    print(
        f"load (1-minute, every 30 s): median {record['load_1min_median']:.1f}, range "
        f"{min(record['load_1min_samples']):.1f}-{max(record['load_1min_samples']):.1f}; CPU busy "
        + ("n/a" if busy is None else f"{100 * busy:.0f}%")
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")


def stream_check(args: argparse.Namespace) -> None:
    """gnnpar's training loader alone, in one process, the model's step replaced by a sleep of
    ``--step-s``: a DataLoader pass per epoch (what Lightning's ``iter`` at each epoch start
    gives a plain DataLoader, persistent workers) against the run-long stream
    (``ResumableLoader``), the same dataset and workers, alternating. ``wait`` is the time spent
    in the loader per epoch; the figures are medians over the epochs after the first."""
    import torch

    from gnnpar.lightning import GraphDataModule
    from gnnpar.lightning.data import GraphLoader, ResumableLoader

    torch.set_num_threads(1)
    dm = GraphDataModule(
        dataset=args.dataset,
        scale=args.scale if args.dataset.startswith("synthetic-") else None,
        batch_size=args.batch_size,
        fanouts=FANOUTS,
        loader_workers=max(1, args.workers),
        seed=0,
    )
    dm.setup()
    epochs = args.epochs
    waits: dict[str, list[list[float]]] = {"per-epoch": [], "stream": []}
    for rep in range(args.reps):
        for side in list(waits) if rep % 2 == 0 else list(waits)[::-1]:
            made = dm.train_dataloader()
            kw = {
                k: getattr(made, k)
                for k in ("num_workers", "multiprocessing_context", "worker_init_fn", "timeout")
            }
            kw.update(persistent_workers=True, prefetch_factor=made.prefetch_factor)
            if side == "stream":
                end = epochs * made.sampler.steps
                loader = ResumableLoader(made.dataset, made.sampler, made.convert, end, **kw)
            else:
                loader = GraphLoader(made.dataset, made.sampler, made.convert, **kw)
            run = []
            for epoch in range(epochs):
                loader.sampler.set_epoch(epoch)
                wait, t = 0.0, time.perf_counter()
                for _ in loader:
                    wait += time.perf_counter() - t
                    time.sleep(args.step_s)
                    t = time.perf_counter()
                run.append(wait)
            waits[side].append(run)
            print(f"{side}: wait per epoch {[round(w, 3) for w in run]}", flush=True)
            del loader, made
    later_ = {k: statistics.median(w for r in v for w in r[1:]) for k, v in waits.items()}
    ratio = later_["stream"] / later_["per-epoch"]
    print(f"median wait per epoch after the first: {later_} (stream / per-epoch {ratio:.2f})")
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "load": os.getloadavg(),
        "settings": vars(args),
        "waits": waits,
        "median_later": later_,
        "ratio": ratio,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line
        )
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="Cora, 1 rank, 1 epoch, 1 repetition")
    p.add_argument("--dataset", default="synthetic-reddit")
    p.add_argument("--scale", type=float, default=0.02)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="loader workers per rank, both sides")
    p.add_argument("--batch-size", type=int, default=BATCH, help="seed nodes per batch (study 002)")
    p.add_argument(
        "--straggler-batch",
        type=int,
        default=128,
        help="batch of the straggler runs: an epoch of many batches, for the work pool to share",
    )
    p.add_argument("--peer-path", default="/tmp/pygpeer", help="folder holding pyg-lib (PyG side)")
    p.add_argument(
        "--dgl-python",
        default=os.environ.get("GNNPAR_DGL_PYTHON"),
        help="an interpreter with DGL and Lightning (DGL side; skipped without)",
    )
    p.add_argument(
        "--dgl-pyg-path",
        default=os.environ.get("GNNPAR_DGL_PYG_PATH", ""),
        help="a folder with torch_geometric for --dgl-python (the dgl side feeds the PyG model)",
    )
    p.add_argument(
        "--dgl-blocks",
        action="store_true",
        help="also DGL's own model on blocks (dglnn.SAGEConv), side dgl-blocks",
    )
    p.add_argument("--out", default=None, help="JSON record (default: none)")
    p.add_argument("--no-straggler", action="store_true", help="the loaders' figures only")
    p.add_argument("--rank-counts", default="1,2", help="the loaders' runs: ranks, comma-separated")
    p.add_argument(
        "--stream-check",
        action="store_true",
        help="gnnpar's loader alone: a DataLoader pass per epoch against the run-long stream",
    )
    p.add_argument(
        "--forkserver-side",
        action="store_true",
        help="also gnnpar with its loader workers from a fork server (GNNPAR_LOADER_START="
        "forkserver; side gnnpar-forkserver) instead of forks of the training process",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="record every process's CPU time (ranks, fork servers, workers) and each step's "
        "wall-clock times, per epoch (Linux /proc)",
    )
    p.add_argument("--step-s", type=float, default=0.5, help="--stream-check's simulated step")
    # one side (internal)
    p.add_argument("--side", choices=("gnnpar", "pyg", "dgl", "dgl-blocks"))
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--graph")
    p.add_argument("--result")
    p.add_argument("--strategy", choices=("ddp", "gossip"), default="ddp")
    p.add_argument("--slowdown", default="")
    p.add_argument("--test", action="store_true")
    p.add_argument(
        "--no-trim",
        action="store_true",
        help="gnnpar's and PyG's model: every layer over the whole sampled subgraph",
    )
    args = p.parse_args()
    if args.side:
        side_main(args)
        return
    if args.stream_check:
        stream_check(args)
        return
    if args.smoke:
        args.dataset, args.scale, args.epochs, args.reps, args.workers = "cora", 1.0, 1, 1, 0
    driver(args)


if __name__ == "__main__":
    main()
