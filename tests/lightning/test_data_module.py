"""GraphDataModule in one process (quick lane): settings through gnnpar's config, batches as
PyG's NeighborLoader gives them, every seed once per epoch, resuming mid-epoch, Cluster-GCN
batches; and ``import gnnpar.lightning`` without Lightning installed."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from gnnpar import UsageError
from helpers import assert_trimming_exact

pytest.importorskip("lightning", reason="gnnpar.lightning needs the lightning extra")

from gnnpar.lightning import GraphDataModule  # noqa: E402


@pytest.fixture(scope="module")
def cora():
    dm = GraphDataModule(dataset="cora", batch_size=32, fanouts=[4, 3], seed=3)
    dm.setup()
    return dm


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"bach_size": 3}, "Unknown setting 'bach_size' in GraphDataModule(...)"),
        ({"lr": 0.1}, "'lr' is a setting of `gnnpar train` that does not choose the data"),
        ({"partitions": 4, "fanouts": [3]}, "partitions=4 gives Cluster-GCN batches"),
        ({"batch_size": 0}, "--batch-size must be at least 1, got 0."),
        ({"fanouts": "3,x"}, "fanouts"),
        ({"scale": 0.5}, "--scale"),  # read by synthetic-* datasets only (gnnpar's own message)
    ],
)
def test_settings_are_checked_as_gnnpar_train_checks_them(settings, message):
    with pytest.raises(UsageError) as err:
        GraphDataModule(dataset="cora", **settings)
    assert message in str(err.value)


def test_a_dataset_gnnpar_cannot_read_is_its_usage_error():
    with pytest.raises(UsageError, match="Unknown --dataset .no-such-graph."):
        GraphDataModule(dataset="no-such-graph")
    with pytest.raises(UsageError, match="holds images"):
        GraphDataModule(dataset="synthetic-cifar10")


def test_sizes_and_batches_as_neighbor_loader_gives_them(cora):
    ds = cora.ds
    assert (cora.num_features, cora.num_classes) == (1433, 7)
    batch = next(iter(cora.train_dataloader()))
    bs = batch.batch_size
    assert bs == 32 and batch.n_id.unique().numel() == batch.n_id.numel()
    assert torch.equal(batch.x, ds.data.x[batch.n_id])
    assert torch.equal(batch.y, ds.data.y[batch.n_id])  # every node's label, seeds first
    assert bool(ds.data.train_mask[batch.n_id[:bs]].all())
    assert int(batch.edge_index.max()) < batch.n_id.numel()
    assert batch.num_sampled_nodes[0] == bs and sum(batch.num_sampled_nodes) == batch.num_nodes
    # every sampled edge is an edge of the graph, source -> target
    edges = set(map(tuple, ds.data.edge_index.t().tolist()))
    src, dst = batch.n_id[batch.edge_index]
    assert all((int(s), int(d)) in edges for s, d in zip(src, dst))
    # in-degree at most the fan-out for the seeds
    seeds_in = torch.bincount(batch.edge_index[1], minlength=batch.n_id.numel())[:bs]
    assert int(seeds_in.max()) <= 4


def test_batches_carry_the_hops_for_pyg_trim_to_layer(cora):
    """The data module's batches carry ``num_sampled_nodes``/``num_sampled_edges`` with nodes
    and edges ordered by hop, as PyG's hierarchical sampling needs: a model that trims each
    layer gives the seeds the outputs and gradients of one that does not."""
    batch = next(iter(cora.train_dataloader()))
    assert len(batch.num_sampled_nodes) == 3 and len(batch.num_sampled_edges) == 2
    assert sum(batch.num_sampled_edges) == batch.edge_index.size(1)
    assert_trimming_exact(batch, batch.x)


def test_every_seed_once_per_epoch_and_a_seeded_reshuffle(cora):
    loader = cora.train_dataloader()
    train = set(cora.split_index("train").tolist())
    epochs = []
    for epoch in (0, 1, 0):
        loader.sampler.set_epoch(epoch)
        seeds = torch.cat([b.n_id[: b.batch_size] for b in loader])
        assert sorted(seeds.tolist()) == sorted(train)
        epochs.append(seeds)
    assert not torch.equal(epochs[0], epochs[1])
    assert torch.equal(epochs[0], epochs[2])  # the same epoch, the same batches


def test_resume_mid_epoch_yields_the_rest_of_the_epoch(cora):
    loader = cora.train_dataloader()
    loader.sampler.set_epoch(1)
    whole = [b.n_id for b in loader]
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["done"]) == (1, 2)
    fresh = cora.train_dataloader()
    fresh.load_state_dict(state)
    rest = [b.n_id for b in fresh]
    assert len(rest) == len(whole) - 2 and len(fresh) == len(whole)
    assert all(torch.equal(a, b) for a, b in zip(whole[2:], rest))
    wrong = dict(state, world_size=4)
    with pytest.raises(UsageError, match="4 ranks"):
        cora.train_dataloader().load_state_dict(wrong)


def test_a_checkpoint_at_an_epoch_end_resumes_at_the_next_epoch(cora):
    loader = cora.train_dataloader()
    loader.sampler.set_epoch(0)
    list(loader)
    fresh = cora.train_dataloader()
    fresh.load_state_dict(loader.state_dict())
    loader.sampler.set_epoch(1)
    assert all(torch.equal(a.n_id, b.n_id) for a, b in zip(loader, fresh))


def test_validation_and_test_loaders_cover_their_split_once(cora):
    for split, loader in (("val", cora.val_dataloader()), ("test", cora.test_dataloader())):
        seeds = torch.cat([b.n_id[: b.batch_size] for b in loader])
        assert sorted(seeds.tolist()) == cora.split_index(split).tolist()
        again = torch.cat([b.n_id for b in loader])
        assert torch.equal(again, torch.cat([b.n_id for b in loader]))  # fixed batches


def test_eval_batches_are_equal_in_number_on_every_rank():
    from gnnpar.lightning.batches import eval_batches

    idx = torch.arange(101)
    shares = [eval_batches(idx, r, 3, 10) for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    assert sorted(torch.cat([torch.cat(s) for s in shares]).tolist()) == idx.tolist()
    assert all(b.numel() > 0 for s in shares for b in s)


def test_cluster_gcn_batches_put_the_split_first():
    dm = GraphDataModule(dataset="cora", partitions=6, seed=1)
    dm.setup()
    batches = list(dm.train_dataloader())
    assert len(batches) == 6  # every subgraph holds training nodes here
    seen = torch.cat([b.n_id for b in batches])
    assert sorted(seen.tolist()) == list(range(dm.ds.num_nodes))  # each subgraph once
    for b in batches:
        bs = b.batch_size
        assert bool(b.train_mask[:bs].all()) and not bool(b.train_mask[bs:].any())
        assert torch.equal(b.x, dm.ds.data.x[b.n_id]) and torch.equal(b.y, dm.ds.data.y[b.n_id])
    test = list(dm.test_dataloader())
    assert sum(b.batch_size for b in test) == int(dm.ds.data.test_mask.sum())


def test_import_without_lightning_says_how_to_install_it():
    """Lightning absent (a meta-path finder refuses it): one line naming the extra."""

    class NoLightning:
        def find_spec(self, name, path=None, target=None):
            if name == "lightning" or name.startswith("lightning."):
                raise ModuleNotFoundError(f"No module named '{name}'")
            return None

    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "lightning"}
    saved |= {k: v for k, v in sys.modules.items() if k.startswith("gnnpar.lightning")}
    for k in saved:
        del sys.modules[k]
    blocker = NoLightning()
    sys.meta_path.insert(0, blocker)
    try:
        with pytest.raises(ImportError) as err:
            importlib.import_module("gnnpar.lightning")
        message = str(err.value)
        assert "\n" not in message and 'pip install "gnnpar[lightning]"' in message
        importlib.import_module("gnnpar.cli")  # gnnpar itself imports
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.update(saved)


def test_strategy_and_callback_settings_are_checked():
    from gnnpar.lightning import GossipStrategy, PeriodicAverageStrategy, Slowdown

    with pytest.raises(UsageError, match="sync_every must be at least 1"):
        PeriodicAverageStrategy(sync_every=0)
    with pytest.raises(UsageError, match="Unknown average 'mean'"):
        GossipStrategy(average="mean")
    with pytest.raises(UsageError, match="timeout must be positive"):
        GossipStrategy(timeout=0)
    with pytest.raises(UsageError, match="checkpoint_every must be at least 1"):
        GossipStrategy(checkpoint_every=0)
    with pytest.raises(UsageError, match="factors >= 1"):
        Slowdown({1: 0.5})
    assert Slowdown("1=3,2=1.5").slowdown == {1: 3.0, 2: 1.5}
    s = PeriodicAverageStrategy(sync_every=4, average="params")
    assert (s.sync_every, s.average, s.timeout_s) == (4, "params", 120.0)


def test_gossip_strategy_runs_only_on_the_lightning_releases_it_was_checked_against(monkeypatch):
    """GossipStrategy replaces the one per-batch collective of Lightning's training loop (a
    private method: strategies._unlock_batches says why). The range it checks at run time is
    the one pyproject's extra pins, and the method it replaces exists where it says it does."""
    import inspect
    import re
    from types import SimpleNamespace

    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    import lightning
    from gnnpar.lightning import strategies
    from helpers import ROOT

    low, high = strategies.LIGHTNING_CHECKED
    extra = re.search(
        r'^lightning = \["lightning(.*)"\]', (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert extra.group(1) == f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    version = tuple(int(p) for p in lightning.__version__.split(".")[:2])
    if version >= (2, 5):  # the broadcast arrived in 2.5.2: the installed loop runs it per batch
        source = inspect.getsource(_TrainingEpochLoop.advance)
        assert "self._broadcast_sigterm_tensor()" in source
        assert "torch.distributed.broadcast" in inspect.getsource(
            _TrainingEpochLoop._broadcast_sigterm_tensor
        )

    loop = _TrainingEpochLoop.__new__(_TrainingEpochLoop)
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop), received_sigterm=False)
    strategies._unlock_batches(trainer)
    loop._broadcast_sigterm_tensor()  # this rank's own check: no collective, no SIGTERM
    trainer.received_sigterm = True
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    with pytest.raises(SIGTERMException):
        loop._broadcast_sigterm_tensor()
    monkeypatch.setattr(lightning, "__version__", f"{high[0]}.{high[1]}.0")
    with pytest.raises(UsageError, match=r'pip install "lightning>=2.2,<2.7"'):
        strategies._unlock_batches(trainer)


def test_checkpoints_by_steps_or_time_are_refused_under_gossip():
    """Gossip ranks train different numbers of batches: a ModelCheckpoint that saves every N
    steps (or T seconds) would ask them to save at different moments. Refused with one message
    naming what works; epoch-end checkpoints pass. (The real Trainer's refusal, on 2 ranks:
    tests/lightning/test_lightning_ranks.py.)"""
    from datetime import timedelta

    from lightning.pytorch.callbacks import ModelCheckpoint

    from gnnpar.lightning.strategies import _refuse_step_checkpoints

    for cb, what in (
        (ModelCheckpoint(every_n_train_steps=3), "every_n_train_steps=3"),
        (ModelCheckpoint(train_time_interval=timedelta(seconds=30)), "train_time_interval=0:00:30"),
    ):
        with pytest.raises(UsageError) as err:
            _refuse_step_checkpoints([cb])
        message = str(err.value)
        assert message.startswith(f"ModelCheckpoint({what}) cannot run under GossipStrategy")
        assert "GossipStrategy(checkpoint_every=N)" in message and "\n" not in message
    _refuse_step_checkpoints([ModelCheckpoint(), ModelCheckpoint(every_n_epochs=2)])


def test_a_pt_file_module_function_and_prepared_folder_give_their_own_graphs(tmp_path, monkeypatch):
    """Any graph ``gnnpar train --dataset`` reads: each batch holds that graph's features and
    labels of its nodes, the seeds from its training nodes."""
    from torch_geometric.data import Data

    from gnnpar.data.prepare_command import run_prepare

    n = 60
    src = torch.arange(n)
    ring = torch.stack([src, (src + 1) % n])
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(1))
    y = src % 3
    data = Data(x=x, edge_index=torch.cat([ring, ring.flip(0)], 1), y=y, train_mask=src < 30)
    data.val_mask, data.test_mask = (src >= 30) & (src < 45), src >= 45
    torch.save(data, tmp_path / "ring.pt")
    (tmp_path / "ringgraphs.py").write_text(
        f"import torch\n\ndef build():\n    return torch.load({str(tmp_path / 'ring.pt')!r}, "
        "weights_only=False)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    root = str(tmp_path / "root")
    run_prepare("cora", str(tmp_path / "cora-prepared"), None, None, None, root, None, quiet=True)
    cora_x = GraphDataModule(dataset="cora", data_root=root).load().data.x
    cases = {
        str(tmp_path / "ring.pt"): (x, y, data.train_mask),
        "ringgraphs:build": (x, y, data.train_mask),
    }
    for dataset, (want_x, want_y, train) in cases.items():
        dm = GraphDataModule(dataset=dataset, batch_size=8, fanouts=[2], data_root=root)
        dm.setup()
        assert (dm.num_features, dm.num_classes) == (5, 3)
        b = next(iter(dm.train_dataloader()))
        assert torch.equal(b.x, want_x[b.n_id]) and torch.equal(b.y, want_y[b.n_id])
        assert bool(train[b.n_id[: b.batch_size]].all()) and b.batch_size == 8
    dm = GraphDataModule(dataset=str(tmp_path / "cora-prepared"), batch_size=8, data_root=root)
    dm.setup()
    b = next(iter(dm.train_dataloader()))
    assert (dm.num_features, dm.num_classes) == (1433, 7)
    assert torch.equal(b.x, cora_x[b.n_id])


def test_the_hand_off_thread_gives_every_batch_in_order_and_the_loaders_error_in_place():
    """HandOff (the training stream's thread that takes batches from the loader workers ahead of
    the loop): each item converted, in order, then the end; an error of the loader is raised at
    the batch where it happened; close() ends the thread even with its queue full."""
    import threading
    import time

    from gnnpar.lightning.data import HandOff

    assert list(HandOff(iter(range(5)), lambda i: i * 10)) == [0, 10, 20, 30, 40]

    def failing():
        yield from (1, 2)
        raise RuntimeError("DataLoader worker (pid 123) exited unexpectedly")

    stream = HandOff(failing(), str)
    assert next(stream) == "1" and next(stream) == "2"
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        next(stream)
    with pytest.raises(StopIteration):
        next(stream)

    made = []

    def endless():
        i = 0
        while True:
            made.append(i)
            yield i
            i += 1

    stream = HandOff(endless(), lambda i: i, depth=1)
    assert next(stream) == 0
    time.sleep(0.2)  # the thread fills the queue, then waits to put the next one
    stream.close()
    deadline = time.monotonic() + 5
    while stream._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stream._thread.is_alive() and len(made) <= 4  # one queued, one in hand, no more
    while "gnnpar-release" in [t.name for t in threading.enumerate()]:
        assert time.monotonic() < deadline, "the release thread did not end after close()"
        time.sleep(0.05)
    assert "gnnpar-hand-off" not in [t.name for t in threading.enumerate()]


def test_the_hand_off_frees_the_batches_the_loop_let_go_of_on_its_own_thread():
    """The loop does not pay for freeing a batch: once it has dropped batch i and taken
    HandOff.KEEP more, the last reference to batch i is the hand-off's, let go on its release
    thread; a batch the loop still holds is not freed; at the stream's end every kept batch goes
    and the release thread ends."""
    import threading
    import time

    from gnnpar.lightning.data import HandOff

    freed: dict[int, str] = {}

    class Batch:
        def __init__(self, i: int) -> None:
            self.i = i

        def __del__(self) -> None:
            freed[self.i] = threading.current_thread().name

    def wait_for(cond) -> None:
        deadline = time.monotonic() + 5
        while not cond():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    stream = HandOff(iter(range(6)), Batch)
    held = next(stream)  # batch 0, kept by the loop all along
    for _ in range(HandOff.KEEP + 2):  # batches 1..4, each dropped by the loop at once
        next(stream)
    wait_for(lambda: {1, 2} <= set(freed))
    assert freed[1] == freed[2] == "gnnpar-release"  # not the loop's thread
    assert 0 not in freed and held.i == 0
    with pytest.raises(StopIteration):
        for _ in range(5):
            next(stream)
    wait_for(lambda: {3, 4, 5} <= set(freed))
    wait_for(lambda: "gnnpar-release" not in [t.name for t in threading.enumerate()])
    del held
    assert freed[0] == threading.current_thread().name  # the loop let go of it last


class _HereItems:
    """A batch dataset whose item ``i`` is ``"here i"`` (made in this process), recording its
    ``release()``."""

    released = False

    def __getitem__(self, i):
        return f"here {i}"

    def release(self):
        self.released = True


def test_a_new_stream_makes_its_head_here_while_its_workers_start():
    """A new training stream makes its first batches in this process, one index at a time,
    until the workers' loader (started on a thread meanwhile: the fork server may still be
    importing torch, the workers still mapping the graph) takes its first index; the loader then
    has every later index, in order."""
    import threading
    import time

    from gnnpar.lightning import data

    # the loader's workers ready at once (a DataLoader takes its first indices when it starts):
    # every index once, in order, those made here first
    items, claims = _HereItems(), data.Claims(3, 9)

    def ready_start():
        indices = claims.for_loader()
        ahead = [next(indices), next(indices)]
        return (f"worker {i}" for i in [*ahead, *indices])

    got = list(data.made_here(items, claims, ready_start))
    assert [int(g.split()[1]) for g in got] == list(range(3, 9)) and items.released
    assert got == sorted(got, key=lambda g: g.startswith("worker"))

    # workers slow to start: this process makes batches while the loop takes them
    gate, claims = threading.Event(), data.Claims(0, 6)

    def slow_start():
        gate.wait(5)
        indices = claims.for_loader()
        ahead = [next(indices)]
        return (f"worker {i}" for i in [*ahead, *indices])

    stream = data.made_here(_HereItems(), claims, slow_start)
    assert [next(stream) for _ in range(3)] == ["here 0", "here 1", "here 2"]
    gate.set()
    deadline = time.monotonic() + 5
    while not claims.loader_began and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(stream) == ["worker 3", "worker 4", "worker 5"]

    def broken():
        raise RuntimeError("the fork server is gone")

    stream = data.made_here(_HereItems(), data.Claims(0, 1), broken)
    assert next(stream) == "here 0"
    with pytest.raises(RuntimeError, match="fork server is gone"):
        next(stream)

    # made here whether or not the fork server has answered: a ready server still leaves the
    # worker to start and map the graph before its first batch (0.40 s against PyG's 0.13-0.24 s)
    loader = data.ResumableLoader(_HereItems(), None, str, end=10, head=True)
    assert loader._head() and not data.ResumableLoader(_HereItems(), None, str, head=False)._head()


def test_loader_workers_are_forks_of_the_training_process_unless_asked_or_unsafe(monkeypatch):
    """On Linux the data module's loader workers are forks of the training process made by its
    main thread (as PyG's are), and no fork server is started for them; a fork server where
    GNNPAR_LOADER_START=forkserver asks, or where a loader is made off the main thread; any
    other value is a usage error."""
    import multiprocessing
    import threading

    from gnnpar.lightning import data

    monkeypatch.delenv(data.LOADER_START, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    started = []
    monkeypatch.setattr(data, "start_fork_server", lambda: started.append(1) or "server")
    assert data.worker_start() == "fork"
    kw = data._worker_kwargs(1, 30.0)
    assert kw["multiprocessing_context"] is multiprocessing.get_context("fork")
    dm = GraphDataModule(dataset="cora", batch_size=32, fanouts=[4, 3], loader_workers=1)
    dm.setup()
    loader = dm.train_dataloader()  # not iterated: no worker is started in the quick lane
    assert loader.head and loader.multiprocessing_context.get_start_method() == "fork"
    assert started == []  # neither the data module nor its loader started a fork server

    off_main: list[str] = []
    t = threading.Thread(target=lambda: off_main.append(data.worker_start()))
    t.start()
    t.join()
    assert off_main == ["forkserver"]
    monkeypatch.setattr(sys, "platform", "darwin")
    assert data.worker_start() == "forkserver"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv(data.LOADER_START, "forkserver")
    assert (
        data.worker_start() == "forkserver"
        and data._worker_kwargs(1, 30.0)["multiprocessing_context"] == "server"
    )
    GraphDataModule(dataset="cora", batch_size=32, fanouts=[4, 3], loader_workers=1)
    assert len(started) == 2  # the data module starts the server early, as before
    monkeypatch.setenv(data.LOADER_START, "thread")
    with pytest.raises(UsageError, match="GNNPAR_LOADER_START='thread': use fork"):
        data.worker_start()


def test_the_first_batch_is_made_here_then_the_forked_workers_batches():
    """With forked workers a new stream's first batch is made in this process (on the hand-off
    thread) while the workers, started first, make the rest: every index once, in order, and
    this process's sampler released."""
    from gnnpar.lightning import data

    items = _HereItems()
    got = list(data.first_here(items, 4, (f"worker {i}" for i in range(5, 8))))
    assert got == ["here 4", "worker 5", "worker 6", "worker 7"] and items.released


def test_iter_starts_the_stream_and_the_first_batch_reads_the_sampler(cora):
    """``iter`` makes the stream for where the sampler will begin (as a DataLoader starts its
    workers then: Lightning calls it for the first epoch before ``on_train_epoch_start``); the
    batches still follow the sampler as it is at the first batch: a ``set_epoch`` in between
    gives that epoch's batches."""
    loader = cora.train_dataloader()
    steps = loader.sampler.steps
    loader.sampler.set_epoch(2)
    it = iter(loader)
    assert loader._stream is not None and loader._stream_at == 2 * steps
    epoch2 = [b.n_id for b in it]
    loader.sampler.set_epoch(0)
    it = iter(loader)
    assert loader._stream_at == 0
    loader.sampler.set_epoch(2)  # moved before the first batch
    assert all(torch.equal(a, b.n_id) for a, b in zip(epoch2, it, strict=True))
