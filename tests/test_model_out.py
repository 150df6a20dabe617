"""Your model out: every run writes model.pt (rebuildable), metrics.jsonl as it goes, and
result.json; `gnnpar predict` reproduces the run's test score; `gnnpar.fit` / `gnnpar.load`
return a model called the PyG way. --out is checked before any training starts."""

from __future__ import annotations

import json

import pytest
import torch
from torch_geometric.datasets import KarateClub

import gnnpar
from gnnpar.cli import main
from gnnpar.result import load_model, read_model_file

BASE = ["train", "--dataset", "cora", "--model", "gcn", "--epochs", "3", "--threads", "1"]


def test_a_run_writes_a_model_that_rebuilds_and_predicts_its_own_test_score(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*BASE, "--quiet", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert str(out) in last  # the last line names the folder
    result = json.loads((out / "result.json").read_text())
    payload = read_model_file(out)
    assert payload["model"]["name"] == "gcn" and payload["in_dim"] == 1433
    assert payload["config"] == result["config"] and payload["versions"]["gnnpar"]
    model = load_model(out)
    assert not model.training
    assert main(["predict", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"test {result['test_score']:.4f}" in printed
    preds = torch.load(out / "predictions.pt")
    assert preds["pred"].shape == (2708,) and preds["prob"].shape == (2708, 7)
    assert torch.allclose(preds["prob"].sum(1), torch.ones(2708), atol=1e-5)
    header = (out / "predictions.csv").read_text().splitlines()[0]
    assert header == "node,pred," + ",".join(f"p_{c}" for c in range(7))
    from gnnpar.predict import predict

    assert predict(str(out))["scores"]["test"] == result["test_score"]  # exactly


def test_metrics_jsonl_has_every_step_and_epoch_with_peak_memory(tmp_path):
    out = tmp_path / "run"
    assert main([*BASE, "--quiet", "--partitions", "4", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["event"] == "step"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert len(steps) == 12 and [r["epoch"] for r in epochs] == [0, 1, 2]
    assert all(r["peak_rss_bytes"] > 0 for r in epochs) and records[-1]["event"] == "final"
    result = json.loads((out / "result.json").read_text())
    assert result["peak_rss_bytes"][0] >= epochs[-1]["peak_rss_bytes"]
    assert [r["loss"] for r in epochs] == pytest.approx(result["loss_curve"])


def test_one_line_per_epoch_unless_quiet(tmp_path, capsys):
    assert main([*BASE, "--out", str(tmp_path / "run")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "2/3", "3/3"]
    assert all("loss" in ln and "peak" in ln for ln in lines)


def test_default_out_folder_is_named_after_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*BASE, "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-cora-gcn-sequential") and (run / "model.pt").exists()
    assert str(run.relative_to(tmp_path)) in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.parametrize("where", ["file", "under-a-file", "proc"])
def test_an_out_that_cannot_be_written_exits_2_before_training(tmp_path, capsys, where):
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = {"file": afile, "under-a-file": afile / "sub", "proc": "/proc/gnnpar-out"}[where]
    assert main([*BASE, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "Traceback" not in err and "epoch" not in err


def test_tensorboard_writes_event_files_and_is_refused_without_the_package(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    assert main([*BASE, "--quiet", "--tensorboard", "--out", str(out)]) == 0
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a)
    )
    assert main([*BASE, "--tensorboard", "--out", str(tmp_path / "run2")]) == 2
    assert "pip install tensorboard" in capsys.readouterr().err


def test_fit_takes_a_pyg_data_and_returns_a_model_called_the_pyg_way(tmp_path):
    data = KarateClub()[0]
    run = gnnpar.fit(data, model="gcn", epochs=5, quiet=True, out=str(tmp_path / "k"))
    logits = run.model(data.x, data.edge_index)
    assert logits.shape == (34, 4) and not run.model.training
    assert run.result["test_score"] >= 0 and run.out == tmp_path / "k"
    again = gnnpar.load(run.out)
    torch.testing.assert_close(again(data.x, data.edge_index), logits)


@pytest.mark.slow
def test_fit_with_two_ranks_returns_the_final_model(tmp_path):
    run = gnnpar.fit(
        "cora", model="gcn", strategy="allreduce", workers=2, partitions=4, epochs=2,
        quiet=True, out=str(tmp_path / "ar"),
    )  # fmt: skip
    from gnnpar.predict import predict

    assert run.result["workers"] == 2
    assert predict(str(run.out))["scores"]["test"] == run.result["test_score"]


def test_a_damaged_model_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "model.pt").write_bytes(b"not a model")
    assert main(["predict", str(tmp_path)]) == 2
    assert "not a readable gnnpar model file" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "nowhere")]) == 2
