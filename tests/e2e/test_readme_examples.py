"""The README's bash examples keep working as written (slow lane: they are processes).

Every command of every ```bash block of README.md is read in order (continuation lines joined,
``python -c "..."`` and here-documents kept whole) and handled in one of three ways:

- **run** in a temporary folder, through bash, exactly as written, with ``gnnpar`` and
  ``python`` this test's interpreter: the own-graph chain (``run.toml``, the KarateClub file,
  its two-rank Cluster-GCN run, ``gnnpar predict``, ``gnnpar.load``, ``mymodels.py``), the
  cheapest subset that starts ranks, predicts and loads a model; each must exit 0 and leave
  the files the README says it writes (:data:`WRITES`), and the KarateClub run must score
  well above chance;
- **checked**: every other ``gnnpar train`` (also inside ``torchrun ... -m gnnpar train``,
  ``gnnpar torchrun ... train`` and ``srun python -m gnnpar train``) goes through the flag
  parser and :func:`gnnpar.configure.build_config` in the folder the run commands
  filled, which refuses an unknown flag, a flag its strategy, model or dataset does not read,
  or a bad value, exactly as the command would before starting anything; ``gnnpar
  advise``/``bench``/``predict``/``datasets`` through the parser;
- **skipped**: set-up and the test commands (``make``, ``pip``, ``source``, ``export``,
  ``sysctl``, ``.venv/bin/python -m pytest``), which CI runs itself.

A command of a kind this test does not know fails it (also in the quick lane, which only
classifies), so a new example is classified here when it is added. Running every example
would take minutes (the hybrid example alone generates a 704 MiB dataset); the ones checked
here cost ~1 s together.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

# commands run as written, named by their start; what each writes is checked in WRITES
RUN = (
    'printf \'dataset = "cora"',
    'python -c "\nimport torch; from torch_geometric.datasets import KarateClub\ndata = ',
    "gnnpar train --dataset my_graph.pt --model gcn --strategy allreduce --workers 2",
    "gnnpar predict runs/mine",
    'python -c "\nimport gnnpar, torch; from torch_geometric.datasets import KarateClub',
    "gnnpar prepare --dataset synthetic-papers100m --scale 0.001 --out papers-0001",
    "gnnpar prepare --dataset cora --shards 2 --partitioner metis --out cora-2",
    "cat > mymodels.py <<'PY'",
)
WRITES = {
    'printf \'dataset = "cora"': ("run.toml",),
    'python -c "\nimport torch; from torch_geometric.datasets import KarateClub\ndata = ': (
        "my_graph.pt",
    ),
    "gnnpar train --dataset my_graph.pt --model gcn --strategy allreduce --workers 2": (
        "runs/mine/result.json",
        "runs/mine/model.pt",
        "runs/mine/metrics.jsonl",
    ),
    "gnnpar predict runs/mine": ("runs/mine/predictions.csv", "runs/mine/predictions.pt"),
    "cat > mymodels.py <<'PY'": ("mymodels.py",),
    "gnnpar prepare --dataset synthetic-papers100m --scale 0.001 --out papers-0001": (
        "papers-0001/manifest.json",
        "papers-0001/features.npy",
    ),
    "gnnpar prepare --dataset cora --shards 2 --partitioner metis --out cora-2": (
        "cora-2/manifest.json",
        "cora-2/shard-0/features.npy",
        "cora-2/shard-1/orig_ids.npy",
    ),
}
SKIP = (
    "make ",
    "GNNPAR_PYTHON=",
    "pip ",
    "source ",
    "export ",
    "sysctl ",
    ".venv/bin/python -m pytest",
)
PARSED = (
    ["gnnpar", "advise"],
    ["gnnpar", "bench"],
    ["gnnpar", "predict"],
    ["gnnpar", "datasets"],
    ["gnnpar", "prepare"],
)


def commands(text: str) -> list[str]:
    """The commands of the README's bash blocks, in order, each one whole."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cmd = line
            heredoc = re.search(r"<<'(\w+)'", line)
            if heredoc:  # up to the terminator line
                while lines[i] != heredoc[1]:
                    cmd += "\n" + lines[i]
                    i += 1
                cmd += "\n" + lines[i]
                i += 1
                # the command after the terminator may continue the same line of thought
            elif cmd.rstrip().endswith('-c "'):  # python -c "<lines>"
                while not lines[i].rstrip().endswith('"'):
                    cmd += "\n" + lines[i]
                    i += 1
                cmd += "\n" + lines[i]
                i += 1
            else:
                while cmd.rstrip().endswith("\\"):
                    cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
                    i += 1
            out.append(cmd)
    return out


def runs(cmd: str) -> str | None:
    """The RUN entry this command is, if any."""
    for start in RUN:
        if cmd.startswith(start):
            return start
    return None


def train_argv(cmd: str) -> list[str] | None:
    """The `gnnpar train` arguments inside ``cmd`` (also under torchrun or srun), else None."""
    words = shlex.split(cmd, comments=True)
    if words[:2] == ["gnnpar", "train"]:
        return words[2:]
    if words[:2] == ["gnnpar", "torchrun"] and "train" in words:
        return words[words.index("train") + 1 :]
    if words[0] in ("torchrun", "srun"):
        for i in range(len(words) - 2):
            if words[i : i + 3] == ["-m", "gnnpar", "train"]:
                return words[i + 3 :]
    return None


def check_train(argv: list[str], where: Path) -> None:
    """What `gnnpar train ARGV` checks before it starts anything (exit 2 otherwise)."""
    from gnnpar.cli import build_parser
    from gnnpar.configure import build_config

    args = build_parser().parse_args(["train", *argv])
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    cwd = os.getcwd()
    os.chdir(where)  # --config run.toml, mymodels:build: relative to the example's folder
    try:
        build_config(args.config, flags)
    finally:
        os.chdir(cwd)


def test_readme_commands_are_classified():
    """Every command is run, checked or skipped (a new kind of example is noticed here)."""
    kinds = {"run": 0, "skip": 0, "train": 0, "parse": 0}
    for cmd in commands(README.read_text()):
        if runs(cmd):
            kinds["run"] += 1
        elif cmd.startswith(SKIP):
            kinds["skip"] += 1
        elif train_argv(cmd) is not None:
            kinds["train"] += 1
        else:
            words = shlex.split(cmd, comments=True)
            assert words[:2] in PARSED, f"README command of an unknown kind: {cmd!r}"
            kinds["parse"] += 1
    assert kinds["run"] == len(RUN) and kinds["train"] >= 10 and kinds["parse"] >= 4


@pytest.mark.slow
def test_readme_examples_run_in_order(tmp_path):
    from gnnpar.cli import build_parser

    shims = tmp_path / "bin"
    shims.mkdir()
    for name, body in (("gnnpar", '-m gnnpar "$@"'), ("python", '"$@"')):
        (shims / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {body}\n')
        (shims / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    ran, checked = [], 0
    for cmd in commands(README.read_text()):
        start = runs(cmd)
        if start is not None:
            t0 = time.perf_counter()
            done = subprocess.run(
                ["bash", "-c", cmd],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            for path in WRITES.get(start, ()):
                assert (work / path).exists(), f"{cmd} did not write {path}"
            ran.append(start)
            print(f"{time.perf_counter() - t0:6.1f} s  {cmd[:70]!r}")  # with -s: what costs
        elif cmd.startswith(SKIP):
            continue
        elif (argv := train_argv(cmd)) is not None:
            check_train(argv, work)
            checked += 1
        else:  # advise, bench, predict of a run not made here: flags known to the parser
            words = shlex.split(cmd, comments=True)
            assert words[:2] in PARSED, f"README command of an unknown kind: {cmd!r}"
            build_parser().parse_args(words[1:])
            checked += 1
    assert ran == list(RUN), "a command to run was not found in the README"
    assert checked >= 15
    # the KarateClub example trains to a sensible score (4 classes; chance ~0.3)
    mine = json.loads((work / "runs/mine/result.json").read_text())
    assert mine["test_score"] >= 0.5 and mine["dataset_info"]["split"].startswith("stratified")
