"""`gnnpar train` end to end, and every kind of bad input ending in exit 2 without a traceback."""

from __future__ import annotations

import json

import pytest
import torch

from gnnpar.cli import main
from helpers import run_cli

# The result.json contract of docs/CONTRACTS.md, written out here on purpose (not imported
# from gnnpar.result).
CONTRACT_KEYS = {
    "dataset",
    "model",
    "strategy",
    "workers",
    "epochs",
    "seed",
    "config",
    "train_time_s",
    "partition_time_s",
    "step_time_s",
    "test_step_time_s",
    "score_name",
    "test_score",
    "val_score",
    "per_worker_batches",
    "loss_curve",
    "versions",
    "machine",
}
STATS = {"mean", "std", "min", "max", "median", "count"}


def check_stats(stats: dict, count: int) -> None:
    assert set(stats) == STATS
    assert stats["count"] == count
    assert 0 < stats["min"] <= stats["median"] <= stats["max"]
    assert stats["min"] <= stats["mean"] <= stats["max"] and stats["std"] >= 0


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_train_on_cora_writes_every_result_key(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--dataset", "cora", "--model", "gat", "--epochs", "3", "--seed", "7"]
    proc = run_cli(*args, "--threads", "1", "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads((out / "result.json").read_text())
    assert CONTRACT_KEYS <= set(r)
    assert (r["dataset"], r["model"], r["strategy"]) == ("cora", "gat", "sequential")
    assert (r["workers"], r["epochs"], r["seed"]) == (1, 3, 7)
    assert r["config"]["model"]["name"] == "gat" and r["config"]["optim"]["lr"] == 0.005
    assert r["config"]["run"]["epochs"] == 3 and r["config"]["model"]["heads"] == 8
    check_stats(r["step_time_s"], 3)
    check_stats(r["test_step_time_s"], 3)  # evaluated after every epoch (--eval-every 1)
    assert 0 < r["train_time_s"] <= 3 * r["step_time_s"]["max"] + 1e-9
    assert r["partition_time_s"] == 0
    assert r["score_name"] == "accuracy"
    assert 0 <= r["test_score"] <= 1 and 0 <= r["val_score"] <= 1
    assert r["per_worker_batches"] == [3]
    assert len(r["loss_curve"]) == 3 and all(0 < v < 10 for v in r["loss_curve"])
    assert set(r["versions"]) >= {"torch", "torch_geometric", "gnnpar", "python"}
    assert r["machine"]["cpu_count"] >= 1 and "accelerator" in r["machine"]
    assert r["machine"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert "train_score" in r  # strategies may add keys


@pytest.mark.slow
def test_config_file_with_flag_overrides_end_to_end(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('dataset = "cora"\nmodel = "gcn"\nepochs = 4\nweight-decay = 0.001\n')
    out = tmp_path / "run"
    args = ["train", "--config", str(toml), "--epochs", "2", "--threads", "1", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0  # in this process: saves a torch start-up
    r = json.loads((out / "result.json").read_text())
    assert r["model"] == "gcn" and r["epochs"] == 2 and len(r["loss_curve"]) == 2
    assert r["config"]["optim"]["weight_decay"] == 0.001


@pytest.mark.slow
def test_usage_error_in_a_real_process_has_no_traceback(tmp_path):
    toml = tmp_path / "bad.toml"
    toml.write_text("epocs = 3\n")
    proc = run_cli("train", "--config", str(toml), "--quiet", "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("gnnpar: error: Unknown setting 'epocs'")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "result.json").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "gatt"], "Unknown --model 'gatt'. Choose one of: gcn, gat"),
        (["--strategy", "ring"], "Unknown --strategy 'ring'"),
        (["--dataset", "imagenet"], "Unknown --dataset 'imagenet'"),
        (["--epochs", "0"], "--epochs must be at least 1, got 0"),
        (["--epochs", "three"], "'epochs' must be an integer, got 'three'"),
        (["--dropout", "1.5"], "--dropout must be in [0, 1), got 1.5"),
        (["--dataset", "synthetic-reddit", "--scale", "2"], "--scale must be in (0, 1], got 2.0"),
        (["--balance", "4,x"], "--balance expects comma-separated integers"),
        (["--slowdown", "1:3"], "--slowdown expects RANK=FACTOR"),
        (["--strategy", "allreduce", "--slowdown", "1=0.5"], "factors >= 1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--partitions", "0"], "--partitions must be at least 1"),
        (["--model", "vig"], "--model vig needs an image dataset"),
        (["--dataset", "synthetic-cifar10"], "only --model vig trains on it"),
        (["--config", "/nonexistent/run.toml"], "does not exist"),
        (["--lr", "nan"], "'lr' must be a finite number, got 'nan'"),
        (["--timeout", "inf"], "'timeout' must be a finite number, got 'inf'"),
        (["--dropout=-inf"], "'dropout' must be a finite number"),
        (["--seed", "1" * 30], "'seed' must fit in 64 bits"),
        (["--seed", "1" * 5000], "'seed' must fit in 64 bits"),
        (["--seed", "-3"], "--seed must be between 0 and 4294967295"),
        (["--epochs", str(2**64)], "'epochs' must fit in 64 bits"),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys, args, message):
    assert main(["train", *args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gnnpar: error: ")
    assert message in err and "Traceback" not in err and len(err) < 1000


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--fanouts", "10,10"],
            "--fanouts is used by --strategy sampled only; --strategy sequential would ignore it. "
            "Drop it, or choose a strategy that uses it.",
        ),
        (
            ["--strategy", "pipeline", "--workers", "2", "--slowdown", "1=3"],
            "--slowdown is used by --strategy allreduce, gossip, gossip-bipartite, sampled only; "
            "--strategy pipeline would ignore it.",
        ),
        (
            ["--dataset", "cora", "--scale", "0.5"],
            "--scale is used by synthetic-* datasets only; --dataset cora (not generated) would "
            "ignore it. Drop it, or choose a dataset that uses it.",
        ),
        (
            ["--model", "gcn", "--heads", "4"],
            "--heads is used by --model gat, gat3, pyg:GAT only; --model gcn would ignore it. "
            "Drop it, or choose a model that uses it.",
        ),
        (["--strategy", "sampled", "--model", "sage", "--sync-every", "5"], "--sync-every is"),
        (["--strategy", "allreduce", "--load", "2"], "unrecognized arguments: --load"),
    ],
)
def test_a_flag_the_run_would_ignore_exits_2(capsys, args, message):
    with _exit_code() as code:
        code.value = main(["train", *args, "--quiet"])
    err = capsys.readouterr().err
    assert code.value == 2 and message in err and "Traceback" not in err


def test_a_foreign_key_in_a_config_file_exits_2_naming_the_file(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('model = "gcn"\nfanouts = [10, 10]\n')
    assert main(["train", "--config", str(toml), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--fanouts (set in config file {toml}) is used by --strategy sampled only" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--load", "2"],  # once silently --loader-workers 2
        ["train", "--epoch", "3"],
        ["train", "--strat", "sampled"],
        ["train", "--config=x.toml", "--qui"],
        ["bench", "--qui"],
        ["datasets", "--data", "/tmp"],
    ],
)
def test_abbreviated_flags_are_not_accepted(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "gnnpar: error: unrecognized arguments" in err and "Traceback" not in err


def test_help_says_which_runs_use_each_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--fanouts FANOUTS neighbours sampled per layer" in out
    assert "[used by --strategy sampled only]" in out
    assert "[used by --model gat, gat3, pyg:GAT only]" in out
    assert "[used by synthetic-* datasets only]" in out
    assert "[used by --strategy hybrid only]" in out


class _exit_code:
    """``main`` returns 2 for gnnpar's errors and argparse exits 2 for its own: catch both."""

    def __enter__(self):
        self.value = None
        return self

    def __exit__(self, kind, exc, tb):
        if kind is SystemExit:
            self.value = exc.code
            return True
        return False


def test_unknown_toml_key_names_the_key_and_the_file(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text("epocs = 3\n")
    assert main(["train", "--config", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "Unknown setting 'epocs'" in err and str(toml) in err and "epochs" in err


def test_unknown_flag_is_an_argparse_error_with_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--epocs", "3"])
    assert e.value.code == 2
    assert "gnnpar: error:" in capsys.readouterr().err
