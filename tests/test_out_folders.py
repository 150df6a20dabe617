"""A command that fails before writing anything leaves no output folder it made (cli.py,
run.check_out / discard_unused_out, api.fit); a folder that existed, or that holds anything,
stays. In this process: train (sequential), gnnpar.fit, bench and predict."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

import gnnpar
from gnnpar import UsageError
from gnnpar.cli import main
from gnnpar.run import _CREATED, check_out, discard_unused_out


def nan_graph() -> Data:
    """A graph whose features hold a NaN: refused once loaded, after --out was checked."""
    x = torch.ones(4, 2)
    x[1, 0] = float("nan")
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    return Data(x=x, edge_index=edge_index, y=torch.tensor([0, 1, 0, 1]))


def test_train_failing_after_the_out_check_leaves_no_folder(tmp_path, capsys):
    torch.save(nan_graph(), tmp_path / "bad.pt")
    out = tmp_path / "runs/deep/run"
    code = main(
        ["train", "--dataset", str(tmp_path / "bad.pt"), "--model", "gcn", "--quiet"]
        + ["--epochs", "1", "--out", str(out), "--data-root", str(tmp_path / "data")]
    )
    assert code == 2 and "not a finite number" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not _CREATED


def test_fit_failing_leaves_no_folder_but_an_existing_one_stays(tmp_path):
    kept = tmp_path / "mine"
    kept.mkdir()
    for out in (tmp_path / "new/run", kept):
        with pytest.raises(UsageError, match="not a finite number"):
            gnnpar.fit(
                nan_graph(),
                model="gcn",
                epochs=1,
                out=str(out),
                quiet=True,
                data_root=str(tmp_path / "data"),
            )
    assert not (tmp_path / "new").exists()
    assert kept.is_dir() and list(kept.iterdir()) == []


def test_bench_failing_leaves_no_folder(tmp_path, monkeypatch, capsys):
    from gnnpar import bench

    def failing(**kwargs):
        raise UsageError("the suite could not run")

    monkeypatch.setitem(bench.SUITES, "tour", failing)
    out = tmp_path / "bench/tour"
    assert main(["bench", "--out", str(out), "--quiet"]) == 2
    assert "the suite could not run" in capsys.readouterr().err
    assert not (tmp_path / "bench").exists()


def test_predict_of_a_missing_run_makes_no_folder(tmp_path, capsys):
    out = tmp_path / "preds/p"
    assert main(["predict", str(tmp_path / "no-run"), "--out", str(out)]) == 2
    assert not (tmp_path / "preds").exists()


def test_a_folder_that_holds_anything_stays_and_success_keeps_everything(tmp_path):
    check_out(str(tmp_path / "a/b"))
    (tmp_path / "a/b/metrics.jsonl").write_text("{}\n")
    assert discard_unused_out() == []  # b holds a file; a holds b
    assert (tmp_path / "a/b/metrics.jsonl").exists()
    check_out(str(tmp_path / "c/d"))
    assert discard_unused_out(keep=True) == [] and (tmp_path / "c/d").is_dir()
    check_out(str(tmp_path / "e/f"))
    assert discard_unused_out() == [tmp_path / "e/f", tmp_path / "e"]


def test_an_unwritable_out_leaves_nothing_it_made(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if _writable(parent):
            pytest.skip("running as root: permissions do not stop writes")
        with pytest.raises(UsageError, match="cannot be written"):
            check_out(str(parent / "x/y"))
        assert list(parent.iterdir()) == [] and not _CREATED
    finally:
        parent.chmod(0o700)


def _writable(folder) -> bool:
    try:
        (folder / ".w").write_text("")
    except OSError:
        return False
    (folder / ".w").unlink()
    return True
