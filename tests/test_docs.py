"""The docs stand alone in a clone: no path outside the repository, every linked file present,
and docs/CONTRACTS.md lists every key result.json always has."""

from __future__ import annotations

import re
from pathlib import Path

from gnnpar.result import CONTRACT

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "ARCHITECTURE.md", "docs/CONTRACTS.md")


def test_docs_point_at_nothing_outside_the_repository():
    for name in DOCS:
        text = (ROOT / name).read_text()
        assert "../shared" not in text and "/work/" not in text, name
        for target in re.findall(r"\]\(([^)#]+)\)", text):  # markdown links to files
            if "://" not in target:
                assert (ROOT / name).parent.joinpath(target).exists(), f"{name}: {target}"


def test_contracts_doc_lists_every_required_result_key():
    text = (ROOT / "docs/CONTRACTS.md").read_text()
    block = text.split("## result.json", 1)[1].split("```", 2)[1]
    listed = set(
        re.findall(r"[a-z_]+", " ".join(line.split("#")[0] for line in block.splitlines()))
    )
    assert set(CONTRACT) <= listed, set(CONTRACT) - listed


def test_contracts_doc_names_every_train_flag():
    from gnnpar.config.parse import KEYS

    text = (ROOT / "docs/CONTRACTS.md").read_text()
    assert [k for k in KEYS if f"--{k}" not in text] == []
