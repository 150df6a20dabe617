"""gnnpar's layers hold: every import in src/gnnpar, those inside functions and under
TYPE_CHECKING included, runs down the list of layers in pyproject.toml ([tool.importlinter]);
no module is left off that list; no import cycle anywhere, within a layer either; and nothing in
the package imports its face (gnnpar/__init__.py, which hands ``gnnpar.fit`` up from api.py).

The graph is grimp's (the engine of import-linter), built from the source files' syntax trees,
in this process. Each check is also shown to fail on a graph with one deliberate wrong import
added, so that none of them passes for want of looking."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import grimp
import pytest

import gnnpar

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _layers_contract() -> dict:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    return contract


def _layers() -> list[grimp.Layer]:
    return [
        grimp.Layer(*(part.strip() for part in line.split("|")), independent=True)
        for line in _layers_contract()["layers"]
    ]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # the package this process imports is the one checked (the work tree's under PYTHONPATH=src)
    assert Path(gnnpar.__file__).parent.name == "gnnpar"
    return grimp.build_graph("gnnpar", cache_dir=None)


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    """Imports that run up the layers or across independent siblings, as readable lines."""
    found = graph.find_illegal_dependencies_for_layers(layers=_layers(), containers={"gnnpar"})
    return sorted(
        f"{d.importer} -> {d.imported}: "
        + "; ".join(" -> ".join([*sorted(r.heads), *r.middle, *sorted(r.tails)]) for r in d.routes)
        for d in found
    )


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of two or more modules that import each other in a loop (strongly connected
    components, Tarjan's algorithm without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def off_the_list(graph: grimp.ImportGraph) -> list[str]:
    """Modules directly under gnnpar that no layer names (the layers check would not see them)."""
    named = {part for layer in _layers() for part in layer.module_tails}
    children = graph.find_children("gnnpar")
    return sorted(m for m in children if m.split(".", 1)[1] not in named)


def face_importers(graph: grimp.ImportGraph) -> list[str]:
    return sorted(graph.find_modules_that_directly_import("gnnpar"))


def test_every_import_runs_down_the_layers(graph):
    assert upward_imports(graph) == []


# Cycles left on purpose, each with why; the test below fails when one is gone (strike it then).
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycle_anywhere(graph):
    found = cycles(graph)
    assert [c for c in found if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in found] == [], "a known cycle is gone: strike it"


def test_every_module_is_on_a_layer_and_none_imports_the_face(graph):
    assert off_the_list(graph) == []
    assert face_importers(graph) == []


def test_imports_inside_functions_are_in_the_graph(graph):
    """The strategies import their training parts inside build() (the specs stay torch-free):
    those imports are edges of the graph, so an upward one would be seen."""
    details = graph.get_import_details(
        importer="gnnpar.strategies.gossip", imported="gnnpar.training.gossip_sync"
    )
    assert details and all(d["line_contents"].startswith("from ") for d in details)
    source = (Path(gnnpar.__file__).parent / "strategies" / "gossip.py").read_text().splitlines()
    line = source[details[0]["line_number"] - 1]
    assert line.startswith("    from gnnpar.training.gossip_sync import"), line


@pytest.mark.parametrize(
    "importer,imported",
    [
        ("gnnpar.data.types", "gnnpar.cli"),  # far up
        ("gnnpar.config.schema", "gnnpar.configure"),  # the configure step is above config/
        ("gnnpar.parallel.collectives", "gnnpar.training.sync"),  # one layer up
        ("gnnpar.parallel.gossip.pool", "gnnpar.runtime.dist"),  # across independent siblings
        ("gnnpar.errors", "gnnpar.targets"),  # the bottom reaching up one
    ],
)
def test_a_deliberate_upward_import_is_reported(graph, importer, imported):
    graph = copy.deepcopy(graph)
    graph.add_import(importer=importer, imported=imported)
    found = upward_imports(graph)
    assert any(imported in line and importer in line for line in found), found


def test_a_deliberate_cycle_inside_one_layer_is_reported(graph):
    """runtime/dist.py imports runtime/heartbeat.py: heartbeat importing dist back closes a loop
    that the layers check cannot see (both are runtime/)."""
    assert graph.direct_import_exists(
        importer="gnnpar.runtime.dist", imported="gnnpar.runtime.heartbeat"
    )
    graph = copy.deepcopy(graph)
    graph.add_import(importer="gnnpar.runtime.heartbeat", imported="gnnpar.runtime.dist")
    assert upward_imports(graph) == []
    assert ["gnnpar.runtime.dist", "gnnpar.runtime.heartbeat"] in cycles(graph)


def test_a_module_off_the_list_and_an_import_of_the_face_are_reported(graph):
    graph = copy.deepcopy(graph)
    graph.add_module("gnnpar.newcomer")
    graph.add_import(importer="gnnpar.data.types", imported="gnnpar")
    assert off_the_list(graph) == ["gnnpar.newcomer"]
    assert face_importers(graph) == ["gnnpar.data.types"]


def test_import_linter_reads_the_same_contract(capsys, monkeypatch):
    """`lint-imports` (import-linter's command) keeps the contract, run here in-process."""
    from importlinter.cli import lint_imports

    monkeypatch.chdir(PYPROJECT.parent)
    code = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 kept, 0 broken" in out, out
