"""One benchmark process of ``benchmarks/frameworks/sampler_vs_peers.py``: times neighbour samplers on a saved graph.

Runs in whichever interpreter has the library it times (gnnpar's venv, the PyG peer env, the DGL
peer env), so it imports nothing of gnnpar at module level and each library only when asked for
one of its sides. It reads the graph that ``sampler_vs_peers.py`` saved (``rowptr.npy``, ``col.npy``: the
incoming CSR, i.e. the CSC of ``source -> target`` edges, int64; ``seeds.npy``: [batches, 1024]
seed ids) and then answers commands on stdin, one JSON object per line:

    {"side": "dgl-frontier", "fanouts": [25, 10, 10], "replace": false, "threads": 1}

with one JSON line on stdout: wall and CPU seconds for all seed batches (after one untimed
warm-up batch), sampled edges and nodes per batch. Every side yields a training-ready mini-batch:
the sampled nodes' global ids and the edges relabelled to positions in them (or the library's
equivalent: DGL blocks, PyG ``Data``). Nothing here gathers features: every side is timed on
sampling plus relabelling only.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch


def _graph(folder: str) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    rowptr = torch.from_numpy(np.load(os.path.join(folder, "rowptr.npy")))
    col = torch.from_numpy(np.load(os.path.join(folder, "col.npy")))
    seeds = torch.from_numpy(np.load(os.path.join(folder, "seeds.npy")))
    return rowptr, col, list(seeds)


class Sides:
    """Builders of each side's per-batch function; a builder runs once (untimed set-up) per
    (side, fanouts, replace) and returns ``sample(seeds) -> (edges, nodes)``."""

    def __init__(self, folder: str) -> None:
        self.rowptr, self.col, self.batches = _graph(folder)
        self.num_nodes = self.rowptr.numel() - 1
        self._cache: dict = {}

    # ------------------------------------------------------------------------------ gnnpar
    def _gnnpar(self, fanouts, replace, backend):
        from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler

        sampler = NeighborSampler(CSRGraph(self.rowptr, self.col), fanouts, replace, backend)
        gen = torch.Generator().manual_seed(0)

        def sample(seeds):
            b = sampler.sample(seeds, gen)  # n_id, edge_index (local), batch_size
            return b.edge_index.size(1), b.n_id.numel()

        return sample

    def gnnpar(self, fanouts, replace):
        return self._gnnpar(fanouts, replace, "kernel")

    def gnnpar_torch(self, fanouts, replace):
        return self._gnnpar(fanouts, replace, "torch")

    # --------------------------------------------------------------------------------- PyG
    def _pyg_data(self):
        if "pyg_data" not in self._cache:
            from torch_geometric.data import Data

            deg = self.rowptr[1:] - self.rowptr[:-1]
            dst = torch.arange(self.num_nodes).repeat_interleave(deg)
            # sorted by target: PyG's to_csc can skip its sort (is_sorted=True)
            ei = torch.stack([self.col, dst])
            self._cache["pyg_data"] = Data(edge_index=ei, num_nodes=self.num_nodes)
        return self._cache["pyg_data"]

    def _pyg_loader(self, fanouts, replace, pyg_lib: bool):
        import torch_geometric.typing as tgt
        from torch_geometric.loader import NeighborLoader

        if not pyg_lib and not tgt.WITH_TORCH_SPARSE:
            raise ImportError("torch-sparse is not installed")
        if pyg_lib and not tgt.WITH_PYG_LIB:
            raise ImportError("pyg-lib is not installed")
        loader = NeighborLoader(
            self._pyg_data(),
            num_neighbors=list(fanouts),
            batch_size=self.batches[0].numel(),
            input_nodes=torch.cat(self.batches),
            replace=replace,
            shuffle=False,
            is_sorted=True,
        )

        size = self.batches[0].numel()

        def sample(seeds):
            # the loader's own path (what iterating it calls per batch): its sampler, then the
            # filter into a Data (n_id, edge_index, batch_size); it takes positions in
            # input_nodes, i.e. batch i's are i * size .. (i + 1) * size - 1
            i = next(k for k, b in enumerate(self.batches) if b is seeds)
            before = tgt.WITH_PYG_LIB
            tgt.WITH_PYG_LIB = pyg_lib  # PyG picks torch-sparse's kernel when pyg-lib is off
            try:
                d = loader.collate_fn(list(range(i * size, (i + 1) * size)))
            finally:
                tgt.WITH_PYG_LIB = before
            return d.edge_index.size(1), d.num_nodes

        return sample

    def pyg_loader(self, fanouts, replace):
        return self._pyg_loader(fanouts, replace, True)

    def pyg_torch_sparse(self, fanouts, replace):
        return self._pyg_loader(fanouts, replace, False)

    def pyg_lib(self, fanouts, replace):
        import pyg_lib  # noqa: F401  (registers torch.ops.pyg)

        rowptr, col = self.rowptr, self.col

        def sample(seeds):
            row, colx, node, _, _, _ = torch.ops.pyg.neighbor_sample(
                rowptr, col, seeds, list(fanouts), csc=True, replace=replace, return_edge_id=False
            )  # relabelled edges (local ids) and the node ids: training-ready
            return row.numel(), node.numel()

        return sample

    # --------------------------------------------------------------------------------- DGL
    def _dgl_graph(self):
        if "dgl" not in self._cache:
            import dgl

            g = dgl.graph(
                ("csc", (self.rowptr, self.col, torch.empty(0, dtype=torch.long))),
                num_nodes=self.num_nodes,
            )
            self._cache["dgl"] = g.formats(["csc"])  # in-edge sampling needs only CSC
        return self._cache["dgl"]

    def dgl_frontier(self, fanouts, replace):
        """``dgl.sampling.sample_neighbors`` hop by hop on gnnpar's frontier (the nodes first
        reached at the previous hop), relabelled with a node-mark array: the same work as
        gnnpar, with DGL's C++ kernel doing the sampling."""
        import dgl

        g = self._dgl_graph()
        local = torch.full((self.num_nodes,), -1, dtype=torch.long)

        def sample(seeds):
            local[seeds] = torch.arange(seeds.numel())
            n_ids, rows, cols = [seeds], [], []
            frontier, total = seeds, seeds.numel()
            for f in fanouts:
                sg = dgl.sampling.sample_neighbors(
                    g, frontier, f, replace=replace, copy_ndata=False, copy_edata=False
                )
                src, dst = sg.edges()
                fresh = src[local[src] < 0]
                new = torch.unique(fresh)
                local[new] = torch.arange(total, total + new.numel())
                rows.append(local[src])
                cols.append(local[dst])
                n_ids.append(new)
                frontier, total = new, total + new.numel()
            n_id = torch.cat(n_ids)
            local[n_id] = -1
            edge_index = torch.stack([torch.cat(rows), torch.cat(cols)])
            return edge_index.size(1), n_id.numel()

        return sample

    def dgl_blocks(self, fanouts, replace):
        """DGL's training sampler: ``dataloading.NeighborSampler`` (samples every node reached
        so far at each hop) and ``to_block`` per layer."""
        import dgl

        g = self._dgl_graph()
        # DGL lists fan-outs from the input layer to the output layer: gnnpar's hop 1 is last
        sampler = dgl.dataloading.NeighborSampler(list(reversed(fanouts)), replace=replace)

        def sample(seeds):
            input_nodes, _, blocks = sampler.sample(g, seeds)
            return sum(b.num_edges() for b in blocks), input_nodes.numel()

        return sample

    def graphbolt(self, fanouts, replace):
        """GraphBolt's pipeline: ``ItemSampler`` (batches of the same seeds, in order) then
        ``sample_neighbor`` (FusedCSCSamplingGraph, every node reached so far at each hop) and
        the DGL blocks of each minibatch. A datapipe runs over all batches, so this side
        returns ``run_all(batches)`` instead of a per-batch function."""
        import dgl.graphbolt as gb

        if "gb" not in self._cache:
            self._cache["gb"] = gb.fused_csc_sampling_graph(self.rowptr, self.col)
        graph = self._cache["gb"]

        def run_all(batches):
            items = gb.ItemSet(torch.cat(batches), names="seed_nodes")
            pipe = gb.ItemSampler(items, batch_size=batches[0].numel(), shuffle=False)
            pipe = pipe.sample_neighbor(graph, list(reversed(fanouts)), replace=replace)
            edges = nodes = 0
            for mb in pipe:
                edges += sum(b.num_edges() for b in mb.blocks)  # training-ready blocks
                nodes += mb.input_nodes.numel()
            return edges, nodes

        return run_all


SIDE_NAMES = {
    "gnnpar": "gnnpar",
    "gnnpar-torch": "gnnpar_torch",
    "pyg-loader": "pyg_loader",
    "pyg-lib": "pyg_lib",
    "pyg-torch-sparse": "pyg_torch_sparse",
    "dgl-frontier": "dgl_frontier",
    "dgl-blocks": "dgl_blocks",
    "graphbolt": "graphbolt",
}


def run(side, batches: list[torch.Tensor]) -> tuple[int, int]:
    """(sampled edges, sampled nodes) over ``batches``."""
    if side.__name__ == "run_all":
        return side(batches)
    edges = nodes = 0
    for seeds in batches:
        e, n = side(seeds)
        edges, nodes = edges + e, nodes + n
    return edges, nodes


class _Batches(torch.utils.data.Dataset):
    """Batch i of the saved seeds, sampled by a side that each worker builds for itself on
    first use (spawned workers: forking a process whose OpenMP pool is running crashes
    libgomp, as DGL and pyg-lib use OpenMP)."""

    def __init__(self, folder: str, side: str, fanouts: list[int], replace: bool) -> None:
        self.args = (folder, side, fanouts, replace)
        self.sides = self.side = None

    def __len__(self) -> int:
        return np.load(os.path.join(self.args[0], "seeds.npy"), mmap_mode="r").shape[0]

    def __getitem__(self, i: int) -> tuple[int, int]:
        if self.side is None:
            folder, side, fanouts, replace = self.args
            self.sides = Sides(folder)
            self.side = getattr(self.sides, SIDE_NAMES[side])(fanouts, replace)
        return self.side(self.sides.batches[i])


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)


def in_workers(folder: str, cmd: dict, workers: int):
    """The side of ``cmd`` run by a DataLoader with ``workers`` one-thread worker processes
    (kept alive across repetitions, as a training rank's persistent loader workers are)."""
    loader = torch.utils.data.DataLoader(
        _Batches(folder, cmd["side"], cmd["fanouts"], cmd["replace"]),
        batch_size=None,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context="spawn",
        worker_init_fn=_one_thread,
    )

    def run_all(_batches):
        edges = nodes = 0
        for e, n in loader:
            edges, nodes = edges + e, nodes + n
        return edges, nodes

    return run_all


def main() -> None:
    sides = Sides(sys.argv[1])
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    built: dict = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        torch.set_num_threads(cmd.get("threads", 1))
        key = (cmd["side"], tuple(cmd["fanouts"]), cmd["replace"])
        try:
            if key not in built:
                if workers:  # one live loader at a time: each holds W processes with a graph
                    built.clear()
                side = getattr(sides, SIDE_NAMES[cmd["side"]])(cmd["fanouts"], cmd["replace"])
                if workers and side.__name__ == "run_all":
                    raise ImportError("its datapipe is not run with loader workers here")
                if workers:
                    side = in_workers(sys.argv[1], cmd, workers)
                built[key] = side
                run(built[key], sides.batches[:1])  # warm-up (first-call allocations)
            w0, c0 = time.perf_counter(), time.process_time()
            edges, nodes = run(built[key], sides.batches)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            out = {
                "wall_s": wall,
                # with loader workers the work is in other processes: CPU time not comparable
                "cpu_s": None if workers else cpu,
                "seeds": sum(b.numel() for b in sides.batches),
                "edges_per_batch": edges / len(sides.batches),
                "nodes_per_batch": nodes / len(sides.batches),
            }
        except ImportError as e:
            out = {"skip": f"{cmd['side']}: {e}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
