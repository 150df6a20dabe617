"""Hostile input, one table: every row ends with its exit code (2: bad input, 1: a peer never
came, 130: interrupted), one message holding a given phrase, no traceback, within a bound.

Rows that need only argument, config, environment or data checks run ``gnnpar.cli.main`` in
this process (fast: no interpreter start, torch already imported); the environment of a row is
set with monkeypatch. Rows that start processes, wait for --timeout or need a signal run
``python -m gnnpar`` in a subprocess and are marked slow.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gnnpar.cli import main
from helpers import ROOT, rank_pids, run_cli

BOUND_S = 60  # a row that takes longer is hanging (the slowest in-process row takes ~2 s)
USER = "tests.models.user_models"  # malformed model factories
QUICK = ["--epochs", "1", "--max-steps", "1", "--threads", "1", "--quiet"]
AR = ["--strategy", "allreduce", "--partitions", "2"]
SAMPLED = ["--strategy", "sampled", "--model", "sage"]


@dataclass
class Row:
    id: str
    argv: list[str]
    code: int
    phrase: str
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes | str] = field(default_factory=dict)  # {tmp}/path -> content


def train(*args: str) -> list[str]:
    """``gnnpar train ARGS`` kept short (QUICK), except for the flags the row itself gives."""
    quick = [QUICK[i : i + 2] for i in range(0, 6, 2) if QUICK[i] not in args]
    rest = [a for pair in quick for a in pair] + ["--quiet"]
    return ["train", *args, *rest, "--out", "{tmp}/run"]


def _gz(text: str) -> bytes:
    return gzip.compress(text.encode())


def _npz(**arrays) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _ogb(edges: str = "0,1\n1,2\n2,3\n", feats: str = "0.1,0.2\n0.3,0.4\n0.5,0.6\n0.7,0.8\n"):
    base = "data/ogbn-arxiv"
    files = {
        f"{base}/raw/edge.csv.gz": _gz(edges),
        f"{base}/raw/node-feat.csv.gz": _gz(feats),
        f"{base}/raw/node-label.csv.gz": _gz("0\n1\n0\n1\n"),
    }
    for split, idx in (("train", "0\n1\n"), ("valid", "2\n"), ("test", "3\n")):
        files[f"{base}/split/time/{split}.csv.gz"] = _gz(idx)
    return files


def _reddit(col: int) -> dict[str, bytes]:
    data = _npz(
        feature=np.ones((5, 3), np.float32),
        label=np.array([0, 1, 0, 1, 0]),
        node_types=np.array([1, 1, 2, 3, 3]),
    )
    graph = _npz(row=np.array([0, 1]), col=np.array([1, col]), shape=np.array([5, 5]))
    return {"data/reddit/reddit_data.npz": data, "data/reddit/reddit_graph.npz": graph}


def _amazon(col: int) -> dict[str, bytes | str]:
    adj = _npz(indptr=np.array([0, 1, 2, 2, 2, 2]), indices=np.array([1, col]))
    return {
        "data/amazon/adj_full.npz": adj,
        "data/amazon/feats.npy": _npy(np.ones((5, 4), np.float32)),
        "data/amazon/class_map.json": '{"0": [1, 0], "1": [0, 1], "2": [1, 1], "3": [0, 0]}',
        "data/amazon/role.json": '{"tr": [0, 1], "va": [2], "te": [3, 4]}',
    }


def _npy(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _cifar(labels: list[int]) -> dict[str, bytes]:
    batch = _pickle({b"labels": labels, b"data": np.zeros((len(labels), 3072), np.uint8)})
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return {f"data/cifar10/cifar-10-batches-py/{n}": batch for n in names}


PWNED = "PWNED"


class _RunsCode:
    """Unpickled, it runs a command: the file it would create (by default in the row's folder,
    the current one) must never exist (test_hostile_input checks every row)."""

    def __init__(self, target: str | Path = PWNED) -> None:
        self.target = str(target)

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _torch_save(obj) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _user_model_file(target: str) -> dict:
    """A model.pt of a user's model whose recipe names ``target`` (edited by someone)."""
    return {
        "format": "gnnpar-model-1",
        "state_dict": {},
        "model": {"name": target},
        "config": {},
        "in_dim": 3,
        "num_classes": 2,
        "multilabel": False,
        "user_model": {"target": target, "call": "factory", "kwargs": {"path": "/"}},
    }


def _random_bytes(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(n)


CKPT = "run/checkpoints"


def _checkpoints(*manifests: bytes | str) -> dict[str, bytes | str]:
    """Checkpoint folders under {tmp}/run (train()'s --out), one per manifest (rank0.json); the
    part (rank0.pt) random bytes."""
    files: dict[str, bytes | str] = {}
    for i, manifest in enumerate(manifests, 1):
        folder = f"{CKPT}/epoch-{i:06d}-step-00000000"
        files[f"{folder}/rank0.json"] = manifest
        files[f"{folder}/rank0.pt"] = _random_bytes(5000, 10 + i)
    return files


def _pubmed_garbage() -> dict[str, bytes]:
    names = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return {f"data/pubmed/ind.pubmed.{n}": b"\x00garbage\xff" * 9 for n in names}


DATA = ["--data-root", "{tmp}/data"]
GCN = ["--model", "gcn"]

_SHARDED = (  # the top manifest of a 4-node graph in one shard, as prepare --shards writes it
    '{"format": "gnnpar-prepared", "format_version": 1, "name": "g", "num_nodes": 4, '
    '"num_edges": 0, "num_features": 1, "num_classes": 2, "feature_dtype": "fp32", '
    '"edge_index_order": "target", "splits": {"train": 1, "val": 1, "test": 1}, "arrays": {}, '
    '"shards": [{"folder": "shard-0", "nodes": [0, 4], "manifest_sha256": "00"}]}'
)


ROWS = [
    # ------------------------------------------------ non-finite and absurd numbers
    Row("lr nan", train("--lr", "nan"), 2, "'lr' must be a finite number"),
    Row("lr inf", train("--lr", "inf"), 2, "'lr' must be a finite number"),
    Row("lr 1e300", train("--lr", "1e300"), 2, "does not fit in float32"),
    Row("lr 0", train("--lr", "0"), 2, "--lr must be positive"),
    Row("weight-decay nan", train("--weight-decay", "nan"), 2, "must be a finite number"),
    Row("weight-decay 1e300", train("--weight-decay", "1e300"), 2, "does not fit in float32"),
    Row("timeout nan", train("--timeout", "nan"), 2, "'timeout' must be a finite number"),
    Row("timeout inf", train("--timeout", "inf"), 2, "'timeout' must be a finite number"),
    Row("timeout 1e300", train("--timeout", "1e300"), 2, "between 1 and 604800 seconds"),
    Row("timeout 1e10", train("--timeout", "1e10"), 2, "between 1 and 604800 seconds"),
    Row("timeout 0.001", train("--timeout", "0.001"), 2, "between 1 and 604800 seconds"),
    Row("timeout -1", train("--timeout", "-1"), 2, "--timeout must be positive"),
    Row("slowdown 1=inf", train(*AR, "--slowdown", "1=inf"), 2, "with finite factors"),
    Row("slowdown 1=nan", train(*AR, "--slowdown", "1=nan"), 2, "with finite factors"),
    Row(
        "slowdown 1=1e300", train(*AR, "--slowdown", "1=1e300"), 2, "factors >= 1 and at most 1000"
    ),
    Row("slowdown 1=0.5", train(*AR, "--slowdown", "1=0.5"), 2, "factors >= 1 and at most 1000"),
    Row("slowdown 2**64=3", train(*AR, "--slowdown", f"{2**64}=3"), 2, "must fit in 64 bits"),
    Row("slowdown rank twice", train(*AR, "--slowdown", "1=3,1=4"), 2, "names rank 1 twice"),
    Row("slowdown 1=3,,2=2", train(*AR, "--slowdown", "1=3,,2=2"), 2, "an empty entry"),
    Row("jitter nan", train(*AR, "--jitter", "nan"), 2, "'jitter' must be a finite number"),
    Row("jitter 1e9", train(*AR, "--jitter", "1e9"), 2, "--jitter must be at most 1000"),
    Row("seed 2**64", train("--seed", str(2**64)), 2, "'seed' must fit in 64 bits"),
    Row("seed 5000 digits", train("--seed", "9" * 5000), 2, "'seed' must fit in 64 bits"),
    Row("seed -1", train("--seed", "-1"), 2, "--seed must be between 0 and"),
    Row("fanouts 2**64", train(*SAMPLED, "--fanouts", f"{2**64},1,1"), 2, "fit in 64 bits"),
    Row("fanouts 10,,10,10", train(*SAMPLED, "--fanouts", "10,,10,10"), 2, "an empty entry"),
    Row("fanouts 10,10,", train(*SAMPLED, "--fanouts", "10,10,"), 2, "an empty entry"),
    Row("fanouts 0", train(*SAMPLED, "--fanouts", "0,1,1"), 2, "must be positive, or -1"),
    Row("fanouts a,b", train(*SAMPLED, "--fanouts", "a,b,c"), 2, "comma-separated integers"),
    Row("balance 1,,1", train("--strategy", "pipeline", "--balance", "1,,1"), 2, "empty entry"),
    Row("hidden 1e9", train("--hidden", "1000000000"), 2, "more than 16,777,216"),
    Row("hidden x heads", train("--hidden", "8", "--heads", str(2**62)), 2, "features per node"),
    Row("hidden beyond memory", train(*GCN, "--hidden", str(2**24)), 2, "GiB available"),
    Row("hidden 0", train("--hidden", "0"), 2, "--hidden must be at least 1"),
    Row("layers 1e6", train(*GCN, "--layers", "1000000"), 2, "--layers 1000000 is more than"),
    Row("epochs 0", train("--epochs", "0"), 2, "--epochs must be at least 1"),
    Row("epochs 2**64", train("--epochs", str(2**64)), 2, "'epochs' must fit in 64 bits"),
    Row("workers 0", train(*AR, "--workers", "0"), 2, "--workers must be at least 1"),
    Row("workers 2**40", train("--strategy", "pipeline", "--workers", str(2**40)), 2, "needs 2"),
    Row("threads 0", train("--threads", "0"), 2, "--threads must be at least 1"),
    Row("threads 10**6", train("--threads", "1000000"), 2, "more than the"),
    Row("loader-workers 1000", train(*SAMPLED, "--loader-workers", "1000"), 2, "more than the"),
    Row("partitions 2**62", train("--partitions", str(2**62)), 2, "non-empty partitions"),
    Row("partitions 0", train("--partitions", "0"), 2, "--partitions must be at least 1"),
    Row("batch-size 0", train(*SAMPLED, "--batch-size", "0"), 2, "at least 1"),
    Row("scale 0", train("--dataset", "synthetic-reddit", "--scale", "0"), 2, "in (0, 1]"),
    Row("dropout 1", train("--dropout", "1"), 2, "--dropout must be in [0, 1)"),
    Row("max-steps 0", ["train", "--max-steps", "0", "--quiet"], 2, "at least 1"),
    Row("eval-every -1", train("--eval-every", "-1"), 2, "--eval-every must be >= 0"),
    # ------------------------------------------------ names, choices, files and folders
    Row("slowdown rank 5 allreduce", train(*AR, "--slowdown", "5=3"), 2, "names rank 5"),
    Row("slowdown rank 1 of 1 sampled", train(*SAMPLED, "--slowdown", "1=3"), 2, "ranks 0..0"),
    Row("model unicode", train("--model", "gät"), 2, "Unknown --model 'gät'"),
    Row("strategy empty", train("--strategy", ""), 2, "Unknown --strategy ''"),
    Row("dataset unicode", train("--dataset", "ünï☃"), 2, "Unknown --dataset"),
    Row("dataset /dev/null", train("--dataset", "/dev/null"), 2, "not a .pt file"),
    Row("unknown flag", train("--lrate", "1"), 2, "unrecognized arguments: --lrate"),
    Row("abbreviated flag", train("--load", "2"), 2, "unrecognized arguments: --load"),
    Row("no command", [], 2, "the following arguments are required"),
    Row("out a file", ["train", "--quiet", "--out", "{tmp}/f"], 2, "is a file", files={"f": "x"}),
    Row(
        "out inside a file", ["train", "--out", "{tmp}/f/x"], 2, "Not a directory", files={"f": ""}
    ),
    Row("out name too long", ["train", "--out", "{tmp}/" + "x" * 300], 2, "cannot be written"),
    Row("data-root a file", train(*DATA[:1], "{tmp}/f"), 2, "is a file", files={"f": "x"}),
    Row("data-root in file", train(*DATA[:1], "{tmp}/f/d"), 2, "lies inside", files={"f": ""}),
    Row("GNNPAR_DATA a file", train(), 2, "$GNNPAR_DATA", {"GNNPAR_DATA": "{tmp}/f"}, {"f": ""}),
    Row(
        "GNNPAR_START_METHOD garbage",
        train(*AR, "--workers", "2"),
        2,
        "GNNPAR_START_METHOD='fork': use forkserver",
        {"GNNPAR_START_METHOD": "fork"},
    ),
    Row(
        "datasets root a file", ["datasets", *DATA[:1], "{tmp}/f"], 2, "is a file", files={"f": ""}
    ),
    # ------------------------------------------------ config files
    Row("config a folder", train("--config", "{tmp}"), 2, "is a folder"),
    Row("config /dev/null", train("--config", "/dev/null"), 2, "is not a file"),
    Row("config ''", train("--config", ""), 2, "--config was given an empty path"),
    Row("config missing", train("--config", "{tmp}/nope.toml"), 2, "does not exist"),
    Row(
        "toml out = {}",
        train("--config", "{tmp}/c.toml"),
        2,
        "'out' must be a string",
        files={"c.toml": "out = {}\n"},
    ),
    Row(
        "toml syntax",
        train("--config", "{tmp}/c.toml"),
        2,
        "is not valid TOML",
        files={"c.toml": "lr = = 3\n"},
    ),
    Row(
        "toml binary",
        train("--config", "{tmp}/c.toml"),
        2,
        "is not valid TOML",
        files={"c.toml": b"\xff\xfe\x00garbage"},
    ),
    Row(
        "toml unknown key",
        train("--config", "{tmp}/c.toml"),
        2,
        "Unknown setting 'bogus'",
        files={"c.toml": "bogus = 1\n"},
    ),
    Row(
        "toml nan",
        train("--config", "{tmp}/c.toml"),
        2,
        "'lr' must be a finite number",
        files={"c.toml": "lr = nan\n"},
    ),
    Row(
        "toml date as seed",
        train("--config", "{tmp}/c.toml"),
        2,
        "'seed' must be an integer",
        files={"c.toml": "seed = 1979-05-27\n"},
    ),
    Row(
        "toml bool as 1",
        train("--config", "{tmp}/c.toml"),
        2,
        "must be true or false",
        files={"c.toml": "tensorboard = 1\n"},
    ),
    # ------------------------------------------------ damaged dataset files (named readers)
    Row(
        "reddit edge to no node",
        train("--dataset", "reddit", *GCN, *DATA),
        2,
        "hold an edge to node 9, but the graph has 5 nodes",
        files=_reddit(9),
    ),
    Row(
        "amazon edge to no node",
        train("--dataset", "amazon", *GCN, *DATA),
        2,
        "hold an edge to node 7, but the graph has 5 nodes",
        files=_amazon(7),
    ),
    Row(
        "ogbn edge to no node",
        train("--dataset", "ogbn-arxiv", *GCN, *DATA),
        2,
        "hold an edge to node 99",
        files=_ogb(edges="0,1\n3,99\n"),
    ),
    Row(
        "ogbn malformed csv",
        train("--dataset", "ogbn-arxiv", *GCN, *DATA),
        2,
        "could not be read",
        files=_ogb(edges="0,1\n1,,2\n"),
    ),
    Row(
        "ogbn nan feature",
        train("--dataset", "ogbn-arxiv", *GCN, *DATA),
        2,
        "not finite numbers",
        files=_ogb(feats="nan,1\n1,1\n1,1\n1,1\n"),
    ),
    Row(
        "ogbn truncated gzip",
        train("--dataset", "ogbn-arxiv", *GCN, *DATA),
        2,
        "could not be read",
        files={**_ogb(), "data/ogbn-arxiv/raw/edge.csv.gz": _gz("0,1\n" * 9)[:-8]},
    ),
    Row(
        "cifar label 55",
        train("--dataset", "cifar10", "--model", "vig", *DATA),
        2,
        "label 55 outside the 10 classes",
        files=_cifar([55] * 10),
    ),
    Row(
        "cifar 0-byte",
        train("--dataset", "cifar10", "--model", "vig", *DATA),
        2,
        "could not be read",
        files={k: b"" for k in _cifar([0])},
    ),
    Row(
        "pubmed garbage",
        train("--dataset", "pubmed", *GCN, *DATA),
        2,
        "Dataset 'pubmed'",
        files=_pubmed_garbage(),
    ),
    Row(
        "cifar batch running code",
        train("--dataset", "cifar10", "--model", "vig", *DATA),
        2,
        "holds posix.system, which loading would have to execute",
        files={
            **_cifar([0] * 10),
            "data/cifar10/cifar-10-batches-py/data_batch_2": _pickle(_RunsCode()),
        },
    ),
    Row(
        "pubmed pickle running code",
        train("--dataset", "pubmed", *GCN, *DATA),
        2,
        "holds posix.system, which loading would have to execute",
        files={**_pubmed_garbage(), "data/pubmed/ind.pubmed.x": _pickle(_RunsCode())},
    ),
    # ------------------------------------------------ files that would run code, checkpoints
    Row(
        "pt graph running code",
        train("--dataset", "{tmp}/evil.pt", *GCN, *DATA),
        2,
        "holds posix.system, which loading would have to execute",
        files={"evil.pt": _torch_save(_RunsCode())},
    ),
    Row(
        "pt graph legacy pickle running code",
        train("--dataset", "{tmp}/evil.pt", *GCN, *DATA),
        2,
        "holds posix.system, which loading would have to execute",
        files={"evil.pt": _pickle(_RunsCode())},
    ),
    Row(
        "pt graph of an unknown class",
        train("--dataset", "{tmp}/evil.pt", *GCN, *DATA),
        2,
        "pass the graph to gnnpar.fit",
        files={"evil.pt": _torch_save(Row("x", [], 0, ""))},
    ),
    Row(
        "resume random-byte checkpoints",
        train("--resume"),
        2,
        f"{CKPT} can be resumed from (epoch-000002-step-00000000 has an unreadable",
        files=_checkpoints(_random_bytes(200, 1), _random_bytes(200, 2)),
    ),
    Row(
        "resume foreign checkpoint folders",
        train("--resume"),
        2,
        "has a rank0.json that is not a gnnpar checkpoint's",
        files=_checkpoints("[1, 2]", '{"epoch": "one"}', "null"),
    ),
    Row(
        "resume marker not UTF-8",
        train("--resume"),
        2,
        "has an unreadable rank0.json (not UTF-8 JSON)",
        files=_checkpoints(b"\xff\xfe{}"),
    ),
    # ------------------------------------------------ environment (torchrun's variables)
    Row(
        "RANK=abc",
        train(*AR),
        2,
        "RANK='abc' is not an integer",
        {"RANK": "abc", "WORLD_SIZE": "2"},
    ),
    Row("WORLD_SIZE=abc", train(*AR), 2, "WORLD_SIZE='abc'", {"RANK": "0", "WORLD_SIZE": "abc"}),
    Row("RANK=5 of 2", train(*AR), 2, "inconsistent", {"RANK": "5", "WORLD_SIZE": "2"}),
    Row(
        "no MASTER_ADDR",
        train(*AR),
        2,
        "MASTER_ADDR/MASTER_PORT are not",
        {"RANK": "0", "WORLD_SIZE": "2"},
    ),
    Row(
        "MASTER_PORT=99999",
        train(*AR),
        2,
        "is not a TCP port",
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
    ),
    Row(
        "MASTER_PORT=abc",
        train(*AR),
        2,
        "MASTER_PORT='abc' is not an integer",
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"},
    ),
    # ------------------------------------------------ a user's model (gnnpar.models.user)
    *[
        Row(f"user model {what}", train("--dataset", "karate", "--model", model), 2, phrase)
        for what, model, phrase in (
            ("factory raises", f"{USER}:raises", f"--model {USER}:raises: raises(in_dim"),
            ("not a module", f"{USER}:not_a_module", "returned a str, not a torch.nn.Module"),
            ("no parameters", f"{USER}:frozen", f"--model {USER}:frozen: the model has no train"),
            ("wrong shape", f"{USER}:wrong_width", "must return logits of shape [34, 4]"),
            ("forward raises", f"{USER}:broken", "calling it as model(x, edge_index)"),
            ("no function", f"{USER}:nope", f"module {USER} has no function or class nope"),
            ("no module", "no_such_module_u20:build", "no module named 'no_such_module_u20'"),
            ("pyg unknown", "pyg:Gin", "Unknown --model pyg:Gin"),
            ("pyg missing argument", "pyg:LINKX", "pyg:LINKX needs num_nodes"),
            ("bad form", "my/model", "Unknown --model 'my/model'"),
        )
    ],
    Row(
        "user model module fails to import",
        train("--dataset", "karate", "--model", "badimport_row:build"),
        2,
        "importing badimport_row failed: ZeroDivisionError",
        files={"badimport_row.py": "x = 1 / 0\n"},
    ),
    Row(
        "model-args not JSON",
        train("--model", f"{USER}:build", "--model-args", "{hidden: 8}"),
        2,
        "--model-args must be a JSON object",
    ),
    Row("model-args for gcn", train("--model", "gcn", "--model-args", "{}"), 2, "--model-args is"),
    Row(
        "split-at sequential", train("--model", "pyg:GIN", "--split-at", "convs.1"), 2, "--split-at"
    ),
    Row(  # no BasicGNN: known from its class, before launch (a factory's model: in the ranks)
        "pipeline of a model that cannot be cut",
        train("--model", "pyg:GraphUNet", "--strategy", "pipeline", "--workers", "2"),
        2,
        "cannot cut the model GraphUNet into pipeline stages by itself; make it splittable",
    ),
    Row(
        "predict model.pt naming shutil.rmtree",
        ["predict", "{tmp}"],
        2,
        "shutil:rmtree: a function of shutil is no model factory",
        files={"model.pt": _torch_save(_user_model_file("shutil:rmtree"))},
    ),
    # ------------------------------------------------ predict, bench, datasets
    Row("predict no run", ["predict", "{tmp}/nope"], 2, "No model file"),
    Row(
        "predict garbage model",
        ["predict", "{tmp}"],
        2,
        "not a readable gnnpar model file",
        files={"model.pt": b"\x00garbage" * 20},
    ),
    Row(
        "predict 0-byte model",
        ["predict", "{tmp}"],
        2,
        "not a readable gnnpar model file",
        files={"model.pt": b""},
    ),
    Row(
        "predict model.pt running code",
        ["predict", "{tmp}"],
        2,
        "holds posix.system, which loading would have to execute",
        files={"model.pt": _torch_save(_RunsCode())},
    ),
    Row(
        "predict model.pt legacy pickle running code",
        ["predict", "{tmp}"],
        2,
        "holds posix.system, which loading would have to execute",
        files={"model.pt": _pickle(_RunsCode())},
    ),
    Row("bench unknown suite", ["bench", "nope"], 2, "Unknown bench suite 'nope'"),
    Row("bench out a file", ["bench", "--out", "{tmp}/f"], 2, "is a file", files={"f": ""}),
    # prepared folders (gnnpar prepare): a manifest that is not one, arrays that lie
    Row(
        "prepared manifest garbage",
        train("--dataset", "{tmp}/g"),
        2,
        "manifest.json cannot be read",
        files={"g/manifest.json": "\x00{nope"},
    ),
    Row(
        "prepared manifest of another format",
        train("--dataset", "{tmp}/g"),
        2,
        "not a gnnpar prepared-graph manifest",
        files={"g/manifest.json": '{"format": "dgl"}'},
    ),
    Row(
        "prepared manifest without arrays",
        train("--dataset", "{tmp}/g"),
        2,
        "lacks what a prepared graph records",
        files={"g/manifest.json": '{"format": "gnnpar-prepared", "format_version": 1}'},
    ),
    Row(
        "prepare feature dtype fp8",
        ["prepare", "--dataset", "cora", "--out", "{tmp}/p", "--feature-dtype", "fp8"],
        2,
        "--feature-dtype fp8",
    ),
    Row(
        "prepare out a file",
        ["prepare", "--dataset", "cora", "--out", "{tmp}/f"],
        2,
        "already exists",
        files={"f": ""},
    ),
    Row(
        "prepare graphbolt path escapes",
        ["prepare", "--dataset", "{tmp}/gb", "--out", "{tmp}/p"],
        2,
        "leaves the folder",
        files={
            "gb/metadata.yaml": "graph:\n  nodes:\n    - num: 2\n  edges:\n"
            "    - format: numpy\n      path: ../../../etc/passwd\n"
        },
    ),
    Row("feature cache garbage", train(*SAMPLED, "--feature-cache", "lots"), 2, "--feature-cache"),
    # sharded prepared folders (gnnpar prepare --shards H)
    Row(
        "sharded manifest shard leaving its folder",
        train("--dataset", "{tmp}/g"),
        2,
        "list of shards is damaged",
        files={"g/manifest.json": _SHARDED.replace("shard-0", "../../etc")},
    ),
    Row(
        "sharded manifest ranges with a gap",
        train("--dataset", "{tmp}/g"),
        2,
        "list of shards is damaged",
        files={"g/manifest.json": _SHARDED.replace("[0, 4]", "[1, 4]")},
    ),
    Row(
        "sharded shard folder given alone",
        train("--dataset", "{tmp}/g"),
        2,
        "one shard of a graph sharded across hosts",
        files={"g/manifest.json": '{"format": "gnnpar-prepared-shard"}'},
    ),
    Row(
        "sharded shard missing",
        train("--dataset", "{tmp}/g"),
        2,
        "shard 0",
        files={"g/manifest.json": _SHARDED},
    ),
    Row(
        "prepare shards zero",
        ["prepare", "--dataset", "cora", "--out", "{tmp}/p", "--shards", "0"],
        2,
        "--shards 0",
    ),
    Row(
        "prepare partitioner unknown",
        ["prepare", "--dataset", "cora", "--out", "{tmp}/p", "--shards", "2", "--partitioner", "x"],
        2,
        "--partitioner x: choose metis, stream, random",
    ),
]


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


def _make_files(row: Row, tmp: Path) -> None:
    for rel, content in row.files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def test_the_table_is_long_enough_and_its_ids_unique():
    assert len(ROWS) >= 60 and len({r.id for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_hostile_input(row: Row, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        monkeypatch.delenv(var, raising=False)
    for var, value in row.env.items():
        monkeypatch.setenv(var, _fill(value, tmp_path))
    _make_files(row, tmp_path)
    t0 = time.monotonic()
    try:
        code = main([_fill(a, tmp_path) for a in row.argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert code == row.code, (out, err)
    assert row.phrase in err, err
    assert "Traceback" not in out + err
    assert err.count("gnnpar: error:") == 1 and len(err) < 2000, err  # one message
    assert elapsed < BOUND_S
    assert not (tmp_path / PWNED).exists(), "a file's pickled command ran"


# ------------------------------------------------ checkpoints of a real run, then tampered with
def _pickled_command(path: Path, pwned: Path | None = None) -> None:
    """``path`` (a rank's part) made a pickle that runs a command, and its manifest made to
    match it: only the loader's allowlist stands between the file and the command."""
    import hashlib

    data = _pickle(_RunsCode() if pwned is None else _RunsCode(pwned))
    path.write_bytes(data)
    manifest_path = path.with_suffix(".json")
    manifest = json.loads(manifest_path.read_text())
    manifest["file"] |= {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))


def _halved(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _random(path: Path) -> None:
    path.write_bytes(_random_bytes(max(path.stat().st_size, 1), len(path.name)))


TAMPERED = {  # files of each checkpoint -> change, phrase
    "part running code, manifest to match": (
        "rank0.pt",
        _pickled_command,
        "its rank0.pt holds posix.system, which loading would have to execute",
    ),
    "parts truncated": ("rank0.pt", _halved, "is damaged (its rank0.pt has"),
    "manifest truncated": ("rank0.json", _halved, "has an unreadable rank0.json (not UTF-8"),
    "every file random bytes": ("*", _random, "has an unreadable rank0.json"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_resume_over_tampered_checkpoints_exits_2(case, tmp_path, capsys, monkeypatch):
    """A real run's checkpoints, every one damaged or made to run a command: --resume reports
    each and ends with one message naming the folder (exit 2), running nothing from them."""
    monkeypatch.chdir(tmp_path)
    run = ["train", "--dataset", "karate", "--model", "gcn", "--epochs", "3", "--threads", "1"]
    run += ["--quiet", "--out", str(tmp_path / "run"), "--checkpoint-every", "1"]
    assert main(run) == 0
    pattern, change, phrase = TAMPERED[case]
    checkpoints = sorted((tmp_path / CKPT).iterdir())
    assert len(checkpoints) == 2
    for folder in checkpoints:
        for path in folder.glob(pattern):
            change(path)
    capsys.readouterr()
    assert main([*run, "--resume"]) == 2
    out, err = capsys.readouterr()
    assert f"no checkpoint in {tmp_path / CKPT} can be resumed from" in err, err
    assert phrase in err and "delete" in err, err
    assert all(f"checkpoint {folder} " in out for folder in checkpoints), out  # each reported
    assert "Traceback" not in out + err and err.count("gnnpar: error:") == 1, err
    assert not (tmp_path / PWNED).exists(), "a checkpoint's pickled command ran"


# ------------------------------------------------------------------ slow: real processes
def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", ["port in use", "peer never comes", "rank 0 never comes"])
def test_rendezvous_failures_end_with_one_message(case, tmp_path):
    """A rendezvous port in use is bad input (2); a peer that never comes fails the run after
    --timeout (1); neither prints a Python traceback."""
    args = ["train", *AR, *QUICK, "--timeout", "3", "--out", str(tmp_path / "run")]
    if case == "port in use":
        with _busy_port() as s:
            proc = run_cli(*args, env=_env(0, s.getsockname()[1]), timeout=120)
        code, phrase = 2, "is already in use"
    elif case == "peer never comes":
        proc = run_cli(*args, env=_env(0, _free_port()), timeout=120)
        code, phrase = 1, "not all of the other"
    else:
        proc = run_cli(*args, env=_env(1, _free_port()), timeout=120)
        code, phrase = 1, "could not reach the store"
    assert proc.returncode == code, proc.stderr
    assert phrase in proc.stderr and "Traceback" not in proc.stdout + proc.stderr


CHECKPOINTED = ["train", *AR, "--workers", "2", "--dataset", "karate", "--model", "gcn"]
CHECKPOINTED += ["--epochs", "3", "--threads", "1", "--quiet", "--checkpoint-every", "1"]
CHECKPOINTED += ["--timeout", "60"]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """The --out of a two-rank run that wrote checkpoints, for each case to copy."""
    out = tmp_path_factory.mktemp("checkpointed") / "run"
    first = run_cli(*CHECKPOINTED, "--out", str(out))
    assert first.returncode == 0, first.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", ["every file random bytes", "part running code"])
def test_two_ranks_resuming_over_tampered_checkpoints_exit_2(case, tmp_path, checkpointed):
    """Two ranks (allreduce) reject the same checkpoints together and the launcher reports the
    ranks' UsageError: exit 2, one message naming the folder, nothing run from the files."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(checkpointed, out)
    args = [*CHECKPOINTED, "--out", str(out)]
    pwned = tmp_path / PWNED
    for folder in (out / "checkpoints").iterdir():
        for path in folder.iterdir():
            if case == "every file random bytes":
                path.write_bytes(_random_bytes(max(path.stat().st_size, 1), len(path.name)))
            elif path.suffix == ".pt":
                _pickled_command(path, pwned)
    proc = run_cli(*args, "--resume")
    assert proc.returncode == 2, proc.stderr
    assert f"no checkpoint in {out / 'checkpoints'} can be resumed from" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.count("gnnpar: error:") == 1, proc.stderr
    assert not pwned.exists(), "a checkpoint's pickled command ran"


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.5, 3.0])
def test_ctrl_c_during_rank_start_up_exits_130_quietly(after_s, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the ranks are
    still importing torch: exit 130, 'gnnpar: interrupted', no traceback, no rank left."""
    args = ["train", *AR, "--workers", "2", "--epochs", "500", "--quiet", "--threads", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnnpar", *args, "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        ranks = rank_pids(proc.pid, 2, deadline_s=120)
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert "gnnpar: interrupted" in err and "Traceback" not in out + err, err
    time.sleep(0.5)
    alive = [p for p in ranks if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
    assert not alive, f"ranks left running: {alive}"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
