"""Config: TOML with the same keys as the flags, flags win, study defaults, one-line errors."""

from __future__ import annotations

import pytest

from gnnpar import UsageError
from gnnpar.config import KEYS, build_config, parse_int_list, parse_slowdown


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_toml_accepts_flag_names_with_dashes_underscores_and_sections(tmp_path):
    toml = write(
        tmp_path,
        'dataset = "citeseer"\nsync-every = 5\nbatch_size = 64\nslowdown = "1=3"\n'
        '[model]\nname = "gcn"\nhidden = 32\n[strategy]\ntimeout_s = 30\n',
    )
    cfg = build_config(toml, {})
    assert cfg.data.dataset == "citeseer"
    assert cfg.strategy.sync_every == 5 and cfg.strategy.batch_size == 64
    assert cfg.strategy.slowdown == {1: 3.0}
    assert cfg.model.name == "gcn" and cfg.model.hidden == 32
    assert cfg.strategy.timeout_s == 30.0


def test_every_flag_is_a_toml_key(tmp_path):
    """The flags and the TOML keys come from one table, so each flag name works in a file."""
    values = {"quiet": "true", "slowdown": '"0=2"', "balance": "[1, 1]", "fanouts": "[5, 5]"}
    numbers = {"scale": "0.5", "jitter": "0.1", "lr": "0.1", "weight-decay": "0.0"}
    numbers.update({"dropout": "0.1", "timeout": "30.0"})
    names = {"dataset": '"cora"', "model": '"gat"', "strategy": '"sequential"'}
    names.update({"partitioner": '"random"', "average": '"grads"', "microbatch": '"exact"'})
    names.update({"schedule": '"gpipe"', "optimizer": '"adam"', "data-root": f'"{tmp_path}"'})
    names.update({"out": f'"{tmp_path}"'})
    lines = []
    for key in KEYS:
        value = values.get(key) or numbers.get(key) or names.get(key) or "2"
        lines.append(f"{key} = {value}")
    cfg = build_config(write(tmp_path, "\n".join(lines)), {})
    assert cfg.run.quiet is True and cfg.strategy.balance == [1, 1] and cfg.run.epochs == 2
    assert cfg.strategy.timeout_s == 30.0 and cfg.model.layers == 2


def test_flags_win_over_the_file(tmp_path):
    toml = write(tmp_path, 'model = "gcn"\nepochs = 9\nlr = 0.5\n')
    cfg = build_config(toml, {"epochs": "3", "lr": None})  # None: flag not given
    assert cfg.run.epochs == 3 and cfg.optim.lr == 0.5 and cfg.model.name == "gcn"


def test_study_defaults_fill_unset_settings():
    gat = build_config(None, {"model": "gat"})
    assert (gat.model.hidden, gat.model.heads, gat.model.layers, gat.model.dropout) == (
        8,
        8,
        2,
        0.6,
    )
    assert (gat.optim.lr, gat.optim.weight_decay, gat.run.epochs) == (0.005, 5e-4, 300)
    gat3 = build_config(None, {"model": "gat3"})
    assert (gat3.model.hidden, gat3.model.heads, gat3.model.layers) == (16, 1, 3)
    assert gat3.model.dropout == 0.6 and gat3.optim.lr == 5e-3
    sage = build_config(None, {"model": "sage"})
    assert (sage.model.hidden, sage.model.layers, sage.model.dropout) == (256, 3, 0.5)
    reddit = build_config(None, {"model": "sage", "dataset": "synthetic-reddit"})
    assert (reddit.model.hidden, reddit.model.dropout, reddit.optim.lr) == (128, 0.2, 1e-2)
    amazon = build_config(None, {"model": "sage", "dataset": "synthetic-amazon"})
    assert (amazon.model.hidden, amazon.model.dropout) == (512, 0.1)
    vig = build_config(None, {"model": "vig", "dataset": "synthetic-cifar10"})
    assert (vig.model.hidden, vig.model.layers) == (107, 8)
    assert build_config(None, {"model": "gat", "hidden": "4"}).model.hidden == 4


def test_unknown_key_message_names_key_source_and_suggestion(tmp_path):
    with pytest.raises(
        UsageError, match=r"Unknown setting 'sync_evry' in config file .*sync-every"
    ):
        build_config(write(tmp_path, "sync_evry = 2\n"), {})


def test_bad_toml_and_bad_types_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not valid TOML"):
        build_config(write(tmp_path, "epochs = = 3\n"), {})
    with pytest.raises(UsageError, match="'quiet' must be true or false"):
        build_config(write(tmp_path, 'quiet = "yes"\n'), {})
    with pytest.raises(UsageError, match="'epochs' must be an integer, got 2.5"):
        build_config(write(tmp_path, "epochs = 2.5\n"), {})
    with pytest.raises(UsageError, match="'lr' must be a number"):
        build_config(None, {"lr": "fast"})


@pytest.mark.parametrize(
    "flags,message",
    [
        ({"epochs": "0"}, "--epochs must be at least 1"),
        ({"dropout": "1.5"}, r"--dropout must be in \[0, 1\)"),
        ({"dropout": "-0.1"}, r"--dropout must be in \[0, 1\)"),
        ({"scale": "2"}, r"--scale must be in \(0, 1\]"),
        ({"scale": "0"}, r"--scale must be in \(0, 1\]"),
        ({"heads": "0"}, "--heads must be at least 1"),
        ({"workers": "0"}, "--workers must be at least 1"),
        ({"jitter": "-1"}, "--jitter must be >= 0"),
        ({"batch-size": "0"}, "--batch-size must be at least 1"),
        ({"balance": "2,0"}, "--balance entries must each be at least 1"),
        ({"fanouts": "10,0"}, "--fanouts entries must be positive, or -1"),
        ({"slowdown": "1=0.5"}, "factors >= 1"),
        ({"partitioner": "kmeans"}, "Unknown --partitioner 'kmeans'"),
        ({"average": "weights"}, "Unknown --average"),
        ({"optimizer": "lamb"}, "Unknown --optimizer 'lamb'"),
    ],
)
def test_impossible_values_are_usage_errors(flags, message):
    with pytest.raises(UsageError, match=message):
        build_config(None, flags)


def test_list_and_slowdown_syntax():
    assert parse_int_list("25, 10,10", "fanouts") == [25, 10, 10]
    assert parse_int_list([4, 4], "balance") == [4, 4]
    assert parse_int_list("-1,5", "fanouts") == [-1, 5]
    with pytest.raises(UsageError, match="--balance expects comma-separated integers"):
        parse_int_list("4;4", "balance")
    assert parse_slowdown("1=3,2=1.5") == {1: 3.0, 2: 1.5}
    assert parse_slowdown({"0": 2}) == {0: 2.0}
    for bad in ("1:3", "x=2", "1=", "=2"):
        with pytest.raises(UsageError, match="--slowdown expects RANK=FACTOR"):
            parse_slowdown(bad)
