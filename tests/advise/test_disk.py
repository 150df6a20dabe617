"""``gnnpar advise`` for a run from a prepared folder: the profile records what the run's
batches read (the hit rate of the feature cache the run gets, the bytes read from the folder
per step: the batches' own counts) and the folder's read rate; the prediction adds to each
batch's making the reads the memory the run may use leaves to the disk, overlapped with the
rank's compute by loader workers."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from gnnpar.advise import simulate as sim
from gnnpar.advise.predict import Candidate, ClusterSpec, make_cluster, predict
from gnnpar.advise.profile import Profile
from gnnpar.advise.profile import disk as adv_disk
from gnnpar.advise.profile.sampled import profile_sampled
from gnnpar.data.prepared import load_graph, made_record, write_graph

STEP = {"compute_s": 0.010, "main_sample_s": 0.002, "sample_s": 0.002, "first_batch_s": 0.0,
        "worker_s": 0.002, "recv_s": 0.0, "compute_recv_s": 0.010}  # fmt: skip


def _profile(memory: int | None, rate: float = 100e6, read: float = 1e6) -> Profile:
    io = {"rows_per_step": 5000.0, "hit_rate": 0.25, "bytes_read_per_step": read}
    return Profile(
        machine="test", cores=2, threads=1, dataset="f", model="sage", epochs=1, seed=0,
        num_nodes=10**6, num_train=4096, param_bytes=1000, base_rss_bytes=100 << 20,
        sampled={"1024": STEP | {"io": io}},
        disk={"folder": "f", "feature_bytes": 4 << 30, "cache_bytes": 1 << 30,
              "memory_bytes": memory, "limited": memory is not None, "read_bytes_s": rate},
    )  # fmt: skip


def test_the_disk_serves_what_the_page_cache_the_limit_leaves_cannot_hold():
    """``memory_bytes``: what the limit left to the page cache in the profile's process (which
    held the graph, the cache and batches as a rank does); 3 GiB of features beyond the cache."""
    # the 3 GiB beyond the cache fit in the 8 GiB left
    assert adv_disk.disk_share(_profile(8 << 30).disk) == 0.0
    assert adv_disk.disk_share(_profile(0).disk) == 1.0  # nothing left: all from the disk
    assert adv_disk.disk_share(_profile(3 << 29).disk) == 0.5  # 1.5 GiB left: half
    assert adv_disk.disk_share(_profile(None).disk) == 0.0  # unknown: no limit seen
    # the CSR competes for the page cache: 1.5 GiB for 3 GiB of features and 3 GiB of CSR
    csr = _profile(3 << 29).disk | {"graph_bytes": 3 << 30}
    assert adv_disk.disk_share(csr) == 0.75
    io = adv_disk.io_per_step(_profile(0), "1024")
    assert io == {"io_s": 1e6 / 100e6, "bytes_read_per_step": 1e6, "disk_share": 1.0,
                  "hit_rate": 0.25}  # fmt: skip
    no_disk = _profile(None)
    no_disk.disk = {}
    assert adv_disk.io_per_step(no_disk, "1024") is None  # a run from memory


def test_the_prediction_adds_the_reads_to_the_batch_and_workers_overlap_them(monkeypatch):
    """10 ms of reads per batch (1 MB at 100 MB/s, all from the disk) on a 10 ms step: made in
    line (``GNNPAR_BATCH_AHEAD=0``) the rank waits for them, every step; made on a thread (the
    default without workers) or by two workers, they overlap its compute."""
    spec = ClusterSpec(1, 1)
    tight = _profile(0)  # nothing left to the page cache: every read from the disk
    roomy = _profile(64 << 30)
    c0 = Candidate("sampled", {"batch_size": 1024, "loader_workers": 0}, 1)
    cluster = make_cluster(spec, tight, 1)
    steps = 4  # 4096 training nodes, batches of 1024
    monkeypatch.setenv("GNNPAR_BATCH_AHEAD", "0")
    slow, fast = (predict(c0, p, spec, sim.NONE, 1) for p in (tight, roomy))
    want = sim.sampled(cluster, steps, 1, 0.010, 0.002 + 0.010, 0, 1000)
    assert slow.train_time_s == pytest.approx(want.train_time_s)
    assert slow.train_time_s - fast.train_time_s == pytest.approx(steps * 0.010, rel=1e-6)
    assert slow.disk["io_s"] == pytest.approx(0.010) and fast.disk["io_s"] == 0.0
    assert slow.to_json()["disk"]["hit_rate"] == 0.25
    monkeypatch.delenv("GNNPAR_BATCH_AHEAD")
    ahead = predict(c0, tight, spec, sim.NONE, 1)
    # one batch ahead on a thread: 12 ms of making beside each 10 ms step
    on_thread = sim.sampled(cluster, steps, 1, 0.010, 0.002 + 0.010, 1, 1000, prefetch=1)
    assert ahead.train_time_s == pytest.approx(on_thread.train_time_s)
    assert ahead.train_time_s < slow.train_time_s - (steps - 1) * 0.008
    c2 = Candidate("sampled", {"batch_size": 1024, "loader_workers": 2}, 1)
    overlapped = predict(c2, tight, spec, sim.NONE, 1)
    assert overlapped.train_time_s < slow.train_time_s - 2 * 0.010


def test_what_is_made_on_a_thread_is_what_the_run_makes_there(monkeypatch):
    """:func:`made_on_thread` against :func:`gnnpar.training.sources.made_ahead`: a thread
    without loader workers, from a folder whose rows the cache does not all hold, or across
    shards; never with workers, from memory, or with ``GNNPAR_BATCH_AHEAD=0``."""
    from gnnpar.advise.predict import made_on_thread

    missed, held = {"hit_rate": 0.25}, {"hit_rate": 1.0}
    assert made_on_thread(0, False, missed) and made_on_thread(0, True, None)
    assert not made_on_thread(0, False, held)  # only the sampling runs ahead: as in line
    assert not made_on_thread(0, False, None)  # an in-memory graph
    assert not made_on_thread(2, False, missed) and not made_on_thread(1, True, missed)
    monkeypatch.setenv("GNNPAR_BATCH_AHEAD", "0")
    assert not made_on_thread(0, True, missed)


def test_the_profile_records_the_runs_cache_hits_and_bytes_read(tmp_path):
    """Profiling sampled batches of a prepared folder with the run's ``--feature-cache``
    records their hit rate and bytes read per step (equal to the batches' own counts, made
    again here), the cache's and the features' bytes, and a read rate."""
    from gnnpar.advise.profile.core import _plan, flags_for, reference

    g = torch.Generator().manual_seed(0)
    n, f = 3000, 32
    ei = torch.randint(0, n, (2, 30000), generator=g)
    split = torch.randint(0, 4, (n,), generator=g)
    masks = {f"{s}_mask": split == i for i, s in enumerate(("train", "val", "test"))}
    data = Data(x=torch.randn(n, f, generator=g), edge_index=ei,
                y=torch.randint(0, 3, (n,), generator=g), **masks)  # fmt: skip
    meta = {"name": "g", "num_classes": 3, "multilabel": False, "directed": True}
    folder = write_graph(dict(data), meta, tmp_path / "g", "fp32", made_record("t", None, 0, "g"))
    ds = load_graph(folder)
    base = {"dataset": str(folder), "model": "sage", "hidden": 16, "fanouts": [5, 5],
            "epochs": 1, "threads": 1, "feature_cache": "0.25", "seed": 0}  # fmt: skip
    prof = Profile(
        machine="test", cores=2, threads=1, dataset=str(folder), model="sage", epochs=1,
        seed=0, num_nodes=n, num_train=int(masks["train_mask"].sum()), param_bytes=1000,
        base_rss_bytes=100 << 20,
    )  # fmt: skip
    profile_sampled(base, ds, [128], prof)
    io = prof.sampled["128"]["io"]
    cfg, plan = _plan(flags_for(base, reference("sampled"), batch_size=128), ds)
    try:
        want = adv_disk.batch_io(plan.source.batches, 4)
        cache = plan.source.cache_bytes
    finally:
        plan.source.close()
    assert io == want and 0.0 < io["hit_rate"] < 1.0 and io["bytes_read_per_step"] > 0
    assert prof.disk["cache_bytes"] == cache == int(0.25 * n) * f * 4
    assert prof.disk["feature_bytes"] == n * f * 4 and prof.disk["folder"] == str(folder)
    assert prof.disk["graph_bytes"] == (n + 1) * 8 + 30000 * 4  # indptr, int32 indices
    assert prof.disk["read_bytes_s"] is None or prof.disk["read_bytes_s"] > 0
