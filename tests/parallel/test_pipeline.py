"""Pipeline strategy: real processes over gloo give the sequential model's loss and gradients.

The multi-rank checks spawn ranks (torch.multiprocessing, gloo, a 60 s process-group timeout)
that each build the same model, run one pipeline step on their stage and compare the stage's
gradients with a sequential full-batch step computed in the same process. The CLI checks run
``gnnpar train`` end to end and check the usage errors (exit 2) found before or after launch.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from gnnpar.cli import main
from gnnpar.config.schema import Config, ModelConfig
from gnnpar.data.types import GraphDataset, ImageDataset
from gnnpar.models import build_model
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.training.pipeline_batches import (
    GraphMicroBatches,
    ImageMicroBatches,
    StagePlace,
    receptive_field,
)
from gnnpar.training.pipeline_step import PipelineStep
from gnnpar.training.sync import ReplicaGradSum


def graph_dataset(n: int = 60, seed: int = 0) -> GraphDataset:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, 150), generator=g)
    ei = to_undirected(ei[:, ei[0] != ei[1]], num_nodes=n)
    idx = torch.arange(n)
    data = Data(
        x=torch.randn(n, 6, generator=g),
        edge_index=ei,
        y=torch.randint(0, 3, (n,), generator=g),
        train_mask=idx % 3 == 0,
        val_mask=idx % 3 == 1,
        test_mask=idx % 3 == 2,
    )
    return GraphDataset("tiny", data, 3)


def image_dataset(n: int = 48, seed: int = 0) -> ImageDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return ImageDataset("tiny-images", x, y, x[:8], y[:8], x[:12], y[:12])


def config(kind: str, stages: int, replicas: int, chunks: int, schedule: str) -> Config:
    cfg = Config()
    cfg.strategy.stages, cfg.strategy.replicas, cfg.strategy.chunks = stages, replicas, chunks
    cfg.strategy.schedule, cfg.strategy.batch_size = schedule, 12
    cfg.run.seed, cfg.run.epochs = 0, 1
    if kind == "graph":
        cfg.model = ModelConfig(name="gat", hidden=4, layers=2, heads=2, dropout=0.0)
    else:
        cfg.model = ModelConfig(name="vig", hidden=8, layers=4, dropout=0.0)
    return cfg


def user_model(kind: str) -> nn.Module:
    """PyG's own models (issue 20), cut into blocks by gnnpar.models.adapt."""
    from torch_geometric.nn.models import GAT, GIN

    from gnnpar.models.adapt import to_block_model

    if kind == "user:GIN":
        return to_block_model(GIN(6, 8, 2, 3))
    return to_block_model(GAT(6, 4, 2, 3, v2=True, heads=2, jk="cat"))


def reference_grads(kind: str, model: nn.Module, ds, cfg: Config) -> tuple[float, dict]:
    """One sequential step on the same data: full graph, or the global image batch."""
    if kind != "image":
        d = ds.data
        loss = F.cross_entropy(model(d.x, d.edge_index)[d.train_mask], d.y[d.train_mask])
    else:
        from gnnpar.training.sources import image_batches

        n = cfg.strategy.batch_size * cfg.strategy.replicas
        x, y = next(image_batches(ds.train_x, ds.train_y, n, cfg.run.seed))
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss), {k: p.grad.clone() for k, p in model.named_parameters()}


def check_step(rank: int, kind: str, cfg: Config) -> dict:
    """One pipeline (or hybrid) step on this rank's stage against a sequential step."""
    ds = image_dataset() if kind == "image" else graph_dataset()
    torch.manual_seed(0)
    if kind.startswith("user"):
        model = user_model(kind)
    else:
        model = build_model(cfg.model, 6, 3) if kind == "graph" else build_model(cfg.model, 3, 10)
    ref = copy.deepcopy(model)
    R, S = cfg.strategy.replicas, cfg.strategy.stages
    mesh = StagePlace.from_mesh(ParallelDims(R, S, R * S).build_mesh("cpu"))
    if kind == "image":
        job = ImageMicroBatches(cfg, ds, mesh)
    else:
        job = GraphMicroBatches(cfg, ds, mesh, receptive_field(cfg.model, model)[0])
    balance = [1, 3] if kind == "image" else [1, 1]  # uneven on purpose
    runner = PipelineStep(cfg, model, job, mesh, balance, torch.device("cpu"))
    batch = next(iter(job.epoch(0)))
    losses = runner.micro_losses(batch)
    ReplicaGradSum(runner.parameters(), mesh.reduce_group).after_backward(True)
    ref_loss, ref_grads = reference_grads(kind, ref, ds, cfg)
    mine = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert mine, "this stage got no gradients"
    for k, g in mine.items():
        torch.testing.assert_close(g, ref_grads[k], atol=1e-5, rtol=1e-4, msg=k)
    result: dict = {"rank": rank, "params": sorted(mine), "loss": None}
    if runner.last:
        result.update(
            loss=sum(float(v.detach()) for v in losses),
            own_loss=sum(float(v.detach()) for v in losses) * batch.own_scale,
            ref_loss=ref_loss,
        )
    if kind != "image" and cfg.strategy.replicas == 1:
        payload, _ = runner.evaluate(job)
        if runner.last:
            ref.eval()
            with torch.no_grad():
                full = ref(ds.data.x, ds.data.edge_index)
            ids, rows = payload
            torch.testing.assert_close(rows, full[ids], atol=1e-5, rtol=1e-4)
            result["evaluated"] = int(ids.numel())
    return result


def _rank(rank: int, world: int, port: int, scenarios: list, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        for i, (kind, cfg) in enumerate(scenarios):
            result = check_step(rank, kind, cfg)
            with open(os.path.join(out_dir, f"s{i}_rank{rank}.json"), "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, world: int, scenarios: list[tuple[str, Config]]) -> list[list[dict]]:
    """Start ``world`` ranks once and check every scenario in them (process start-up is slow)."""
    mp.spawn(_rank, args=(world, free_port(), scenarios, str(tmp_path)), nprocs=world, join=True)
    out = []
    for i, (_, cfg) in enumerate(scenarios):
        results = [json.loads((tmp_path / f"s{i}_rank{r}.json").read_text()) for r in range(world)]
        stages = [set(r["params"]) for r in results[: cfg.strategy.stages]]
        assert all(not (a & b) for j, a in enumerate(stages) for b in stages[j + 1 :])  # disjoint
        out.append(results)
    return out


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_two_stages_equal_sequential_loss_and_grads(tmp_path):
    """gat with exact micro-batches (GPipe and 1F1B), ViG (8x8 images) with an uneven split, and
    users' models (issue 20): PyG's GIN and GAT(v2=True, jk="cat") cut by gnnpar.models.adapt."""
    big_images = config("image", 2, 1, 2, "gpipe")
    big_images.strategy.batch_size = 40
    scenarios = [
        ("graph", config("graph", 2, 1, 3, "gpipe")),
        ("graph", config("graph", 2, 1, 3, "1f1b")),
        ("image", config("image", 2, 1, 4, "gpipe")),
        ("image", big_images),  # micro-batches of 20 images: more than blocks are timed on
        ("user:GIN", config("graph", 2, 1, 3, "gpipe")),
        ("user:GATv2", config("graph", 2, 1, 3, "1f1b")),
    ]
    for results in run_ranks(tmp_path, 2, scenarios):
        last = results[-1]
        assert last["loss"] == pytest.approx(last["ref_loss"], abs=1e-5)
        assert results[0]["params"] and last["params"]
    for s in (0, 4, 5):
        graph_last = json.loads((tmp_path / f"s{s}_rank1.json").read_text())
        assert graph_last["evaluated"] == 60  # every node's output equals the full-graph output


# ------------------------------------------------------------------------------------ the CLI
def _train(cli, tmp_path, *flags: str):
    return cli("train", "--quiet", "--out", str(tmp_path), *flags)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "gat", "--stages", "3", "--workers", "3"], "more than the 2 blocks"),
        (["--model", "gat", "--balance", "2,1", "--workers", "2"], "add up to the model's 2"),
        (["--model", "gat", "--stages", "2", "--workers", "3"], "needs 2 ranks"),
        (["--model", "gat", "--chunks", "1", "--schedule", "1f1b", "--workers", "2"], "1f1b"),
        (["--strategy", "hybrid", "--replicas", "2", "--workers", "2"], "needs 4 ranks"),
    ],
)
def test_bad_pipeline_settings_exit_2_before_launch(capsys, tmp_path, flags, message):
    base = ["--dataset", "cora", "--strategy", "pipeline", "--epochs", "1", "--quiet"]
    assert main(["train", *base, *flags, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "result.json").exists()


def test_more_chunks_than_images_exit_2(capsys, tmp_path):
    flags = ["--dataset", "synthetic-cifar10", "--model", "vig", "--strategy", "pipeline"]
    flags += ["--workers", "2", "--batch-size", "4", "--chunks", "5", "--out", str(tmp_path)]
    assert main(["train", *flags]) == 2
    assert "more than the 4 images" in capsys.readouterr().err


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_more_chunks_than_training_nodes_exit_2_through_launcher(cli, tmp_path):
    # Cora has 140 training nodes: only known once the data is loaded, inside the ranks.
    flags = ["--dataset", "cora", "--model", "gat", "--strategy", "pipeline", "--workers", "2"]
    proc = _train(cli, tmp_path, *flags, "--chunks", "141", "--epochs", "1")  # a real `gnnpar`
    assert proc.returncode == 2, proc.stderr
    assert "more than the 140 training nodes" in proc.stderr


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_cli_pipeline_matches_sequential_without_dropout(tmp_path):
    common = ["train", "--dataset", "cora", "--model", "gat", "--epochs", "3", "--dropout", "0"]
    common += ["--quiet", "--eval-every", "0"]
    assert main([*common, "--out", str(tmp_path / "seq")]) == 0
    flags = ["--strategy", "pipeline", "--workers", "2", "--chunks", "4"]
    assert main([*common, *flags, "--out", str(tmp_path / "pipe")]) == 0
    a = json.loads((tmp_path / "seq" / "result.json").read_text())
    b = json.loads((tmp_path / "pipe" / "result.json").read_text())
    assert b["loss_curve"] == pytest.approx(a["loss_curve"], abs=1e-4)
    assert b["test_score"] == pytest.approx(a["test_score"], abs=1e-6)
    assert b["gpipe_bound"] == pytest.approx(2 * 4 / 5)
    assert b["balance"] == [1, 1] and b["halo_overhead"] > 0
    assert b["step_time_s"]["count"] == 3 and b["test_step_time_s"]["count"] >= 1


# ------------------------------------------------------------------------- balance by time
def test_split_by_cost_minimises_the_slowest_stage():
    from gnnpar.parallel.pipeline.stages import bounds, gpipe_bound, split_by_cost

    assert split_by_cost([4, 1, 1, 1, 1], 2) == [1, 4]
    assert split_by_cost([1, 1, 1, 1], 2) == [2, 2]
    assert split_by_cost([1, 1, 1, 1, 1, 1, 1, 1], 4) == [2, 2, 2, 2]
    assert split_by_cost([1, 2, 3, 4, 5], 3) == [3, 1, 1]  # loads 6, 4, 5
    assert bounds([1, 3, 2]) == [(0, 1), (1, 4), (4, 6)]
    assert gpipe_bound(2, 5) == pytest.approx(10 / 6)


def test_profile_blocks_times_every_block():
    from gnnpar.parallel.pipeline.stages import profile_blocks

    ds = graph_dataset()
    model = build_model(ModelConfig(name="gat", hidden=4, layers=3, heads=2, dropout=0.0), 6, 3)
    times = profile_blocks(model, ds.data.x, ds.data.edge_index, repeats=2)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert all(p.grad is None for p in model.parameters())  # profiling leaves no gradients


def test_image_blocks_are_timed_on_at_most_profile_images(tmp_path, monkeypatch):
    """Rank 0 times the blocks while the other ranks wait (within --timeout): at study 000's
    200-image micro-batches, timing whole micro-batches took longer than the default timeout.
    The stages still send whole micro-batches (the probe's shape)."""
    import gnnpar.parallel.pipeline.stages as stages

    seen = []

    def profile(model, x, edge_index):  # noqa: ANN001, ANN202
        seen.append(x.size(0))
        return [1.0] * len(model.blocks)

    monkeypatch.setattr(stages, "profile_blocks", profile)
    cfg = config("image", 2, 1, 2, "gpipe")
    cfg.strategy.batch_size = 40
    job = ImageMicroBatches(cfg, image_dataset(), StagePlace(1, 2, 0, 0))
    model = build_model(cfg.model, 3, 10)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        balance, times = stages.choose_balance(cfg, model, job)
    finally:
        dist.destroy_process_group()
    assert seen == [stages.PROFILE_IMAGES] and job.probe()[0].size(0) == 20
    assert balance == [2, 2] and times == [1.0] * 4


# ------------------------------------------------------------------ a user's model's blocks
@pytest.mark.parametrize(
    "stages, balance, message",
    [
        (3, None, "--stages 3 is more than the 2 blocks of the model GIN (GIN: one block per"),
        (2, [2, 1], "add up to the 2 blocks of the model GIN"),
        (2, [1, 1], None),
    ],
)
def test_a_users_model_needs_blocks_for_its_stages(stages, balance, message):
    from torch_geometric.nn.models import GIN

    from gnnpar import UsageError
    from gnnpar.models.adapt import to_block_model
    from gnnpar.strategies.pipeline import check_cut

    cfg = config("graph", stages, 1, 3, "gpipe")
    cfg.strategy.balance = balance
    model = to_block_model(GIN(6, 8, 2, 3))
    if message is None:
        check_cut(cfg, model)
    else:
        with pytest.raises(UsageError, match=message.replace("(", r"\(")):
            check_cut(cfg, model)
    one_block = to_block_model(nn.Linear(6, 3))
    with pytest.raises(UsageError, match="cannot cut the model Linear into pipeline stages"):
        check_cut(cfg, one_block)
    shared = to_block_model(GIN(6, 8, 3, 3))
    shared.blocks[2].conv = shared.blocks[0].conv = GIN(8, 8, 1, 8).convs[0]
    with pytest.raises(UsageError, match="blocks 0 and 2 of the model GIN .* share weights"):
        check_cut(cfg, shared)
