"""No function in src/gnnpar is over 80 lines unless its docstring says why (a paragraph starting
"Why one function:"): a long function is split into named steps, or keeps its reason where the
reader meets it. Read from the source files' syntax trees; the check is also shown to fail on a
long function without a reason, so that it does not pass for want of looking."""

from __future__ import annotations

import ast
from pathlib import Path

import gnnpar

LIMIT = 80  # lines, the def line and the docstring included
REASON = "Why one function:"


def long_without_reason(source: str, where: str) -> list[str]:
    """``where:line name (n lines)`` of each function of ``source`` over :data:`LIMIT` lines
    whose docstring gives no reason."""
    found = []
    for node in _statements(ast.parse(source).body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > LIMIT and REASON not in (ast.get_docstring(node) or ""):
                found.append(f"{where}:{node.lineno} {node.name} ({n} lines)")
    return found


def _statements(body: list[ast.stmt]):
    """Every statement in ``body`` and in the blocks inside it (functions are statements; the
    expressions, most of a syntax tree, are not walked)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def test_no_function_over_80_lines_without_a_reason():
    root = Path(gnnpar.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        found += long_without_reason(path.read_text(), str(path.relative_to(root.parent)))
    assert not found, "split these into named steps, or say why not in the docstring:\n" + (
        "\n".join(found)
    )


def test_a_long_function_without_a_reason_is_reported():
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    plain = f'def f():\n    """Adds."""\n{body}'
    assert long_without_reason(plain, "m.py") == [f"m.py:1 f ({LIMIT + 2} lines)"]
    kept = f'def f():\n    """Adds.\n\n    {REASON} the sums share their terms."""\n{body}'
    assert long_without_reason(kept, "m.py") == []
    short = 'def f():\n    """Adds."""\n' + "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 2))
    assert long_without_reason(short, "m.py") == []
