"""Without Lightning installed, gnnpar and every command work; only ``import gnnpar.lightning``
fails, with one line saying how to install the extra. Lightning's absence is simulated in a
fresh interpreter by a meta-path finder that refuses it (so the test runs where it is installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow

BLOCK = textwrap.dedent(
    """
    import sys

    class NoLightning:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("lightning", "pytorch_lightning"):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, NoLightning())
    """
)

CHECK = BLOCK + textwrap.dedent(
    """
    import importlib, importlib.util, pkgutil
    import gnnpar
    mods = [m.name for m in pkgutil.walk_packages(gnnpar.__path__, "gnnpar.")]
    for name in mods:
        if name.startswith(("gnnpar.lightning", "gnnpar.__main__")):
            continue  # the extra's; __main__ runs the command line
        if importlib.util.find_spec(name).origin.endswith(".py"):  # not the ctypes kernels
            importlib.import_module(name)
    assert not [m for m in sys.modules if m.split(".")[0] == "lightning"]
    try:
        import gnnpar.lightning
    except ImportError as e:
        print("MESSAGE:" + str(e))
    from gnnpar.cli import main
    out = sys.argv[1]
    for argv in (["--help"], ["train", "--help"], ["bench", "--help"], ["predict", "--help"],
                 ["advise", "--help"], ["torchrun", "--help"], ["datasets"]):
        sys.argv = ["gnnpar", *argv]  # `gnnpar torchrun` reads its own arguments from there
        try:
            main(argv)
        except SystemExit as e:
            assert e.code in (0, None), (argv, e.code)
    main(["train", "--dataset", "karate", "--model", "gcn", "--epochs", "2", "--quiet",
          "--out", out])
    print("ALL-OK")
    """
)


def test_gnnpar_and_its_commands_work_without_lightning(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "ALL-OK" in proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("MESSAGE:")]
    assert line == (
        "MESSAGE:gnnpar.lightning needs PyTorch Lightning, which is not installed: "
        'pip install "gnnpar[lightning]"'
    )
    assert (tmp_path / "run" / "result.json").is_file()
