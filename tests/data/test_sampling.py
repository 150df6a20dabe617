"""The neighbour sampler: batches are subgraphs of the graph, obey fan-outs, put seeds first,
never repeat a neighbour without replacement, equal the exact L-hop neighbourhood at fan-out -1,
are reproducible from the seed, and shard into equal step counts on every rank."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import k_hop_subgraph

from gnnpar.data.sampling.kernel import kernel_available
from gnnpar.data.sampling.loader import (
    SampledBatches,
    build_loader,
    epoch_seeds,
    save_shared_graph,
    shard_plan,
)
from gnnpar.data.sampling.reference import reference_sample
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from helpers import assert_trimming_exact, tiny_graph

# the compiled kernel is what users get (scripts/setup.sh builds it); torch is its fallback
BACKENDS = ["kernel", "torch"]


def random_graph(n: int = 300, e: int = 3000, seed: int = 0) -> torch.Tensor:
    """A directed multigraph-free random graph with skewed degrees (some nodes have none)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = (torch.rand(e, generator=g) ** 2 * n).long()  # in-degrees skewed to low ids
    ei = torch.unique(torch.stack([src, dst]), dim=1)
    return ei[:, ei[0] != ei[1]]


def edge_set(ei: torch.Tensor) -> set[tuple[int, int]]:
    return set(zip(ei[0].tolist(), ei[1].tolist()))


def global_edges(batch) -> list[tuple[int, int]]:
    src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    return list(zip(src.tolist(), dst.tolist()))


def test_csr_rows_hold_in_neighbours(graph6):
    csr = CSRGraph.from_edge_index(graph6.edge_index, 6)
    assert csr.rowptr.tolist() == [0, 2, 4, 7, 10, 12, 14]
    # node 3 aggregates from 2, 4 and 5 (edges 2->3, 4->3, 5->3)
    assert sorted(csr.col[csr.rowptr[3] : csr.rowptr[4]].tolist()) == [2, 4, 5]


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_edges_exist_fanouts_hold_seeds_first(replace, backend):
    ei = random_graph()
    csr = CSRGraph.from_edge_index(ei, 300)
    fanouts = [4, 3]
    sampler = NeighborSampler(csr, fanouts, replace=replace, backend=backend)
    seeds = torch.tensor([5, 0, 17, 250, 3])
    b = sampler.sample(seeds, torch.Generator().manual_seed(1))
    assert b.n_id[:5].tolist() == seeds.tolist()
    assert b.batch_size == 5
    assert b.n_id.unique().numel() == b.n_id.numel()  # each node once
    assert set(global_edges(b)) <= edge_set(ei)
    assert sum(b.num_sampled_nodes) == b.num_nodes
    assert sum(b.num_sampled_edges) == b.edge_index.size(1)
    deg = csr.rowptr[1:] - csr.rowptr[:-1]
    # hop k: targets are the nodes added at hop k-1, each with its own fan-out budget
    begin, e0 = 0, 0
    for hop, fanout in enumerate(fanouts):
        end = begin + b.num_sampled_nodes[hop]
        e1 = e0 + b.num_sampled_edges[hop]
        tgt = b.edge_index[1, e0:e1]
        assert ((tgt >= begin) & (tgt < end)).all()
        counts = torch.bincount(tgt - begin, minlength=end - begin)
        frontier_deg = deg[b.n_id[begin:end]]
        if replace:  # exactly `fanout` draws for every node that has a neighbour
            assert counts.tolist() == torch.where(frontier_deg > 0, fanout, 0).tolist()
        else:
            assert counts.tolist() == frontier_deg.clamp(max=fanout).tolist()
        begin, e0 = end, e1


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_replacement_no_neighbour_twice(backend):
    ei = random_graph(200, 4000, seed=3)
    sampler = NeighborSampler(CSRGraph.from_edge_index(ei, 200), [6, 6, 6], backend=backend)
    b = sampler.sample(torch.arange(0, 200, 7), torch.Generator().manual_seed(0))
    pairs = global_edges(b)
    assert len(pairs) == len(set(pairs))


@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_full_fanout_is_exact_l_hop_neighbourhood(hops, backend):
    ei = random_graph(400, 1600, seed=hops)
    seeds = torch.tensor([1, 30, 399])
    b = NeighborSampler(CSRGraph.from_edge_index(ei, 400), [-1] * hops, backend=backend).sample(
        seeds, torch.Generator()
    )
    subset, _, _, _ = k_hop_subgraph(seeds, hops, ei, num_nodes=400)
    assert sorted(b.n_id.tolist()) == subset.tolist()
    # every edge into a node within hops-1 of the seeds (what L layers read), nothing else
    inner, _, _, _ = k_hop_subgraph(seeds, hops - 1, ei, num_nodes=400)
    want = {(s, t) for s, t in edge_set(ei) if t in set(inner.tolist())}
    got = global_edges(b)
    assert len(got) == len(set(got)) and set(got) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_reference_sampler_at_full_fanout(backend):
    ei = random_graph(150, 900, seed=5)
    csr = CSRGraph.from_edge_index(ei, 150)
    seeds = torch.tensor([9, 2, 77])
    fast = NeighborSampler(csr, [-1, -1], backend=backend).sample(seeds, torch.Generator())
    ref = reference_sample(csr, seeds, [-1, -1], torch.Generator())
    assert fast.n_id.tolist() == ref.n_id.tolist()  # same order: first appearance
    assert sorted(global_edges(fast)) == sorted(global_edges(ref))
    assert fast.num_sampled_nodes == ref.num_sampled_nodes


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_batch_other_seed_other_batch(backend):
    ei = random_graph()
    csr = CSRGraph.from_edge_index(ei, 300)
    seeds = torch.arange(0, 300, 11)

    def run(seed: int):
        return NeighborSampler(csr, [5, 5], backend=backend).sample(
            seeds, torch.Generator().manual_seed(seed)
        )

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    assert not torch.equal(a.edge_index, c.edge_index)


@pytest.mark.parametrize("fanout", [2, 5])  # deg >= 4 fanout: rejection; else random keys
@pytest.mark.parametrize("backend", BACKENDS)
def test_without_replacement_is_uniform(fanout, backend):
    """A node with 10 in-neighbours, 3000 batches: each neighbour is kept with probability
    fanout/10; counts stay within 5 standard deviations of that (seeded: not flaky), and pairs
    of neighbours come up together as often as a uniform subset says."""
    ei = torch.stack([torch.arange(1, 11), torch.zeros(10, dtype=torch.long)])
    sampler = NeighborSampler(CSRGraph.from_edge_index(ei, 11), [fanout], backend=backend)
    gen = torch.Generator().manual_seed(0)
    reps, p = 3000, fanout / 10
    counts, pair = torch.zeros(11), 0
    for _ in range(reps):
        b = sampler.sample(torch.tensor([0]), gen)
        assert b.num_nodes == 1 + fanout
        counts.index_add_(0, b.n_id[1:], torch.ones(fanout))
        pair += int({1, 2} <= set(b.n_id.tolist()))
    sd = (reps * p * (1 - p)) ** 0.5
    assert counts[0] == 0 and ((counts[1:] - reps * p).abs() < 5 * sd).all()
    p2 = fanout * (fanout - 1) / 90  # P(two given neighbours both kept)
    assert abs(pair - reps * p2) < 5 * (reps * p2 * (1 - p2)) ** 0.5


def stars(targets: int, deg: int) -> CSRGraph:
    """``targets`` nodes 0..targets-1, node t with in-neighbours targets + t * deg + j, j < deg:
    one batch of all targets gives ``targets`` independent draws of one node's neighbours."""
    src = targets + torch.arange(targets * deg)
    dst = torch.arange(targets).repeat_interleave(deg)
    return CSRGraph.from_edge_index(torch.stack([src, dst]), targets * (deg + 1))


def offsets(b, targets: int, deg: int) -> torch.Tensor:
    """[targets, k] sampled neighbour offsets j of each target, in the order they were drawn."""
    src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
    order = torch.sort(dst, stable=True).indices  # edges of a target in draw order
    return ((src[order] - targets) % deg).view(targets, -1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("deg,fanout", [(6, 3), (5, 1), (7, 6)])
def test_without_replacement_every_subset_equally_likely(backend, deg, fanout):
    """Chi-square over all C(deg, fanout) subsets, 6000 draws (one batch of 6000 stars): the
    subsets are uniform (p > 0.001; seeded, so the test is reproducible, not flaky)."""
    from itertools import combinations

    from scipy.stats import chisquare

    targets = 6000
    csr = stars(targets, deg)
    b = NeighborSampler(csr, [fanout], backend=backend).sample(
        torch.arange(targets), torch.Generator().manual_seed(3)
    )
    picked = offsets(b, targets, deg).sort(dim=1).values
    index = {c: i for i, c in enumerate(combinations(range(deg), fanout))}
    counts = torch.bincount(
        torch.tensor([index[tuple(r)] for r in picked.tolist()]), minlength=len(index)
    )
    assert chisquare(counts.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_replacement_large_fanout_is_uniform(backend):
    """fanout 40 of 50 neighbours (the kernel's hash-table path, fanout > 32): no repeats,
    every neighbour kept with probability 0.8 (chi-square), on 3000 stars."""
    from scipy.stats import chisquare

    targets, deg, k = 3000, 50, 40
    b = NeighborSampler(stars(targets, deg), [k], backend=backend).sample(
        torch.arange(targets), torch.Generator().manual_seed(4)
    )
    picked = offsets(b, targets, deg)
    assert picked.shape == (targets, k)
    assert (picked.sort(dim=1).values.diff(dim=1) > 0).all()  # distinct in every row
    kept = torch.bincount(picked.view(-1), minlength=deg)
    # kept vs dropped per neighbour: kept counts have equal expectation targets * k / deg
    assert chisquare(kept.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_with_replacement_draws_are_uniform_and_independent(backend):
    """fanout 4 of 7 neighbours with replacement: chi-square over the 49 (first, second) draw
    pairs of 8000 stars (uniform and independent draws), and every draw's marginal."""
    from scipy.stats import chisquare

    targets, deg, k = 8000, 7, 4
    b = NeighborSampler(stars(targets, deg), [k], replace=True, backend=backend).sample(
        torch.arange(targets), torch.Generator().manual_seed(5)
    )
    # with replacement a neighbour drawn twice is one node: read the draws from the edges
    picked = offsets(b, targets, deg)
    assert picked.shape == (targets, k)
    pairs = torch.bincount(picked[:, 0] * deg + picked[:, 1], minlength=deg * deg)
    assert chisquare(pairs.numpy()).pvalue > 1e-3
    assert chisquare(torch.bincount(picked.view(-1), minlength=deg).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("replace", [False, True])
def test_fanout_at_least_degree_keeps_all_neighbours_once(replace):
    """Without replacement a fanout >= degree keeps every neighbour exactly once, and both
    backends give the identical batch (no randomness is involved)."""
    ei = random_graph(300, 1200, seed=8)  # in-degrees up to ~15
    csr = CSRGraph.from_edge_index(ei, 300)
    deg = csr.rowptr[1:] - csr.rowptr[:-1]
    fan = int(deg.max())
    seeds = torch.arange(0, 300, 3)
    k = NeighborSampler(csr, [fan, fan], backend="kernel").sample(seeds, torch.Generator())
    t = NeighborSampler(csr, [fan, fan], backend="torch").sample(seeds, torch.Generator())
    full = NeighborSampler(csr, [-1, -1], backend="kernel").sample(seeds, torch.Generator())
    assert torch.equal(k.n_id, t.n_id) and torch.equal(k.n_id, full.n_id)
    assert sorted(global_edges(k)) == sorted(global_edges(t)) == sorted(global_edges(full))
    assert len(set(global_edges(k))) == k.edge_index.size(1)


def test_kernel_batches_reproducible_across_samplers_and_buffer_growth():
    """The kernel's batch depends only on (graph, seeds, fanouts, generator seed): a fresh
    sampler and one that has already sampled bigger and smaller batches (buffers grown, mark
    array reused) give identical batches."""
    ei = random_graph(300, 3000, seed=9)
    csr = CSRGraph.from_edge_index(ei, 300)
    seeds = torch.tensor([4, 99, 7, 250])
    used = NeighborSampler(csr, [6, 4], backend="kernel")
    for s in (torch.arange(0, 300, 2), torch.tensor([1])):
        used.sample(s, torch.Generator().manual_seed(1))
    a = used.sample(seeds, torch.Generator().manual_seed(2))
    b = NeighborSampler(csr, [6, 4], backend="kernel").sample(
        seeds, torch.Generator().manual_seed(2)
    )
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    assert a.num_sampled_nodes == b.num_sampled_nodes
    assert (used._local == -1).all()  # mark array left clean


def test_missing_kernel_falls_back_to_torch_or_raises(monkeypatch):
    from gnnpar import UsageError
    from gnnpar.data.sampling import kernel

    monkeypatch.setattr(kernel, "_kernel_lib", None)
    monkeypatch.setattr(kernel, "_kernel_tried", True)
    csr = CSRGraph.from_edge_index(random_graph(), 300)
    with pytest.warns(UserWarning, match="scripts/setup.sh"):
        assert NeighborSampler(csr, [3]).backend == "torch"
    with pytest.raises(UsageError, match="scripts/setup.sh"):
        NeighborSampler(csr, [3], backend="kernel")


def test_kernel_is_built():
    """scripts/setup.sh builds the kernel: a missing build would silently cost ~3x speed."""
    assert kernel_available()


@pytest.mark.parametrize("model", ["sage", "gat3"])
def test_full_fanout_batch_gives_seeds_full_graph_outputs(model):
    from gnnpar.config.schema import ModelConfig
    from gnnpar.models import build_model

    torch.manual_seed(0)
    n = 120
    ei = random_graph(n, 700, seed=11)
    x = torch.randn(n, 8)
    net = build_model(ModelConfig(model, hidden=16, layers=3, heads=1, dropout=0.5), 8, 4).eval()
    seeds = torch.tensor([3, 64, 100, 7])
    b = NeighborSampler(CSRGraph.from_edge_index(ei, n), [-1, -1, -1]).sample(
        seeds, torch.Generator()
    )
    with torch.no_grad():
        full = net(x, ei)[seeds]
        batch = net(x[b.n_id], b.edge_index)[: b.batch_size]
    torch.testing.assert_close(batch, full, rtol=1e-5, atol=1e-6)


# in-edges by hand (source -> target): 0 <- 1, 2; 1 <- 3; 2 <- 3, 4; 3 <- 5; 4 <- 0; 5 <- 6
HAND_EDGES = torch.tensor([[1, 2, 3, 3, 4, 5, 0, 6], [0, 0, 1, 2, 2, 3, 4, 5]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_hop_counts_and_order_are_neighbor_loaders(backend):
    """PyG's NeighborLoader layout (what ``trim_to_layer`` relies on), by hand on seeds 2, 0 at
    full fan-out: the seeds, then each hop's new nodes in order of first appearance; each hop's
    edges after the previous hop's, grouped by target in frontier order, a target's neighbours
    in the graph's order; ``num_sampled_nodes`` = [seeds, new at hop 1, ...],
    ``num_sampled_edges`` = [edges of hop 1, ...]. Hop 1: 2 <- 3, 4 (new), 0 <- 1 (new), 2;
    hop 2: 3 <- 5 (new), 4 <- 0, 1 <- 3; hop 3: 5 <- 6 (new)."""
    sampler = NeighborSampler(CSRGraph.from_edge_index(HAND_EDGES, 7), [-1] * 3, backend=backend)
    b = sampler.sample(torch.tensor([2, 0]), torch.Generator().manual_seed(0))
    assert b.n_id.tolist() == [2, 0, 3, 4, 1, 5, 6]
    assert (b.batch_size, b.num_sampled_nodes, b.num_sampled_edges) == (2, [2, 3, 1, 1], [4, 3, 1])
    hops = [[(2, 0), (3, 0), (4, 1), (0, 1)], [(5, 2), (1, 3), (2, 4)], [(6, 5)]]
    edges = list(zip(*b.edge_index.tolist()))
    # the kernel keeps the frontier's order within a hop; the torch fallback only the hops
    within = (lambda h: h) if backend == "kernel" else sorted
    assert [within(edges[a:e]) for a, e in ((0, 4), (4, 7), (7, 8))] == [within(h) for h in hops]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pyg_trim_to_layer_gives_the_untrimmed_seed_outputs_and_gradients(backend):
    """PyG's hierarchical sampling (examples/hierarchical_sampling.py: ``trim_to_layer`` before
    each layer) on gnnpar's batches: the seeds' outputs and every gradient equal those of the
    same model run over the whole sampled subgraph (only fewer rows are computed)."""
    n = 300
    batch = NeighborSampler(
        CSRGraph.from_edge_index(random_graph(n, 3000, seed=5), n), [5, 3, 3], backend=backend
    ).sample(torch.arange(0, n, 19), torch.Generator().manual_seed(2))
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(1))[batch.n_id]
    assert_trimming_exact(batch.to_data(), x)


def test_batches_equal_neighbor_loaders_where_pyg_lib_is_installed():
    """Against PyG's own NeighborLoader (pyg-lib's sampler, not a dependency of gnnpar) at full
    fan-out, where the draw is not random: the same ``n_id``, ``edge_index`` and counts per hop
    (``is_sorted``: PyG reads the neighbours in the graph's order, as gnnpar does)."""
    pytest.importorskip("pyg_lib", reason="the cross-check needs PyG's pyg-lib sampler")
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    n = 120
    ei = random_graph(n, 600, seed=7)
    ei = ei[:, torch.argsort(ei[1] * n + ei[0])]
    data = Data(x=torch.zeros(n, 1), edge_index=ei, num_nodes=n)
    seeds = torch.tensor([3, 64, 100, 7])
    for fanouts in ([-1], [-1, -1], [-1, -1, -1]):
        ref = next(
            iter(NeighborLoader(data, fanouts, input_nodes=seeds, batch_size=4, is_sorted=True))
        )
        b = NeighborSampler(CSRGraph.from_edge_index(ei, n), fanouts).sample(
            seeds, torch.Generator()
        )
        assert torch.equal(b.n_id, ref.n_id) and torch.equal(b.edge_index, ref.edge_index)
        assert b.num_sampled_nodes == ref.num_sampled_nodes
        assert b.num_sampled_edges == ref.num_sampled_edges


def test_bad_fanouts_rejected():
    csr = CSRGraph.from_edge_index(tiny_graph().edge_index, 6)
    with pytest.raises(ValueError, match="fanouts"):
        NeighborSampler(csr, [3, 0])


def test_equal_steps_on_every_rank_for_every_size():
    """For every training-set size, rank count and batch size: every rank gets the same number of
    batches, ranks' seeds are disjoint, batches respect the size, and fewer than `world` nodes
    are dropped per epoch."""
    for world in range(1, 9):
        for n in range(world, 90):
            train = torch.arange(n) * 3  # node ids need not be 0..n-1
            for bs in (1, 2, 5, 16, 64):
                per_rank, steps = shard_plan(n, world, bs)
                ranks = [epoch_seeds(train, 7, 2, r, world, bs) for r in range(world)]
                assert all(len(batches) == steps for batches in ranks)
                flat = torch.cat([torch.cat(batches) for batches in ranks])
                assert flat.numel() == per_rank * world and n - flat.numel() < world
                assert flat.unique().numel() == flat.numel()
                assert all(0 < b.numel() <= bs for batches in ranks for b in batches)


def test_epochs_reshuffle():
    train = torch.arange(50)
    a = torch.cat(epoch_seeds(train, 0, 0, 0, 2, 8))
    b = torch.cat(epoch_seeds(train, 0, 1, 0, 2, 8))
    assert not torch.equal(a, b)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_loader_workers_give_the_same_batches(tmp_path):
    """Two persistent forkserver workers produce, over two epochs, exactly the batches the
    training process makes itself (batch randomness depends on epoch/rank/step, not worker)."""
    n = 200
    ei = random_graph(n, 1500, seed=2)
    path = str(tmp_path / "g.pt")
    save_shared_graph(
        path, CSRGraph.from_edge_index(ei, n), torch.randn(n, 3), torch.randint(0, 2, (n,))
    )
    train = torch.arange(0, n, 2)
    _, steps = shard_plan(train.numel(), 2, 16)
    batches = {}
    for workers in (0, 2):
        ds = SampledBatches(path, train, [4, 4], 16, 1, 2, 0, steps)
        loader = build_loader(ds, 2, workers, timeout_s=60)
        batches[workers] = [(b.n_id, b.edge_index, b.x, b.y) for b in loader]
        del loader
    assert len(batches[0]) == 2 * steps
    for a, b in zip(batches[0], batches[2], strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b))


WORKER_SCRIPT = """
import sys, time, torch
from gnnpar.data.sampling.loader import SampledBatches, build_loader, save_shared_graph
from gnnpar.data.sampling.sampler import CSRGraph
ei = torch.randint(0, 50, (2, 300), generator=torch.Generator().manual_seed(0))
save_shared_graph(sys.argv[1], CSRGraph.from_edge_index(ei, 50), torch.randn(50, 2),
                  torch.zeros(50, dtype=torch.long))
ds = SampledBatches(sys.argv[1], torch.arange(50), [3], 5, 0, 1, 0, steps=10)
it = iter(build_loader(ds, 1000, 2, timeout_s=60))
next(it)
print(" ".join(str(w.pid) for w in it._workers), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_workers_end_when_their_training_process_is_killed(tmp_path):
    """SIGKILL the training process: its forkserver workers notice and exit (no orphans)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER_SCRIPT, str(tmp_path / "g.pt")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_alive(p) for p in pids)
