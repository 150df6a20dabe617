"""A user's ``module:function`` (``--dataset``, ``--model``, ``gnnpar.fit``'s factories): its
pattern, finding and importing its module from the current folder, and the words of every error
about it. Torch-free, one place for data and models alike.

    >>> bool(TARGET.match("graphs:karate")), bool(TARGET.match("graphs.py"))
    (True, False)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gnnpar.errors import UsageError

TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")  # module:function


def no_module_message(flag: str, name: str, module: str) -> str:
    """What ``flag name`` (a user's ``module:function``) says when ``module`` cannot be found:
    one wording for --dataset and --model, before any rank starts and when a rank imports it."""
    return (
        f"{flag} {name}: no module named '{module}' (looked in {os.getcwd()} and on "
        f"sys.path). Run gnnpar from the folder that holds {module.replace('.', '/')}.py, or "
        "install the module."
    )


@contextmanager
def cwd_on_path() -> Iterator[None]:
    """The current folder first on sys.path while importing the user's module."""
    importlib.invalidate_caches()  # a module written since the last import (notebooks, tests)
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def check_findable(flag: str, name: str) -> None:
    """The module of ``flag name`` (``module:function``) can be found from here, without
    importing it (a cheap check before any process starts); UsageError otherwise."""
    module = name.split(":")[0]
    if module in sys.modules:
        return
    with cwd_on_path():
        try:
            found = importlib.util.find_spec(module) is not None
        except Exception:  # a parent package that fails to import: said when it is imported
            found = True
    if not found:
        raise UsageError(no_module_message(flag, name, module))


def import_target_module(flag: str, name: str, module_name: str) -> Any:
    """The module of a user's ``module:function`` given to ``flag`` (``--dataset``, ``--model``),
    imported (call it inside :func:`cwd_on_path`); UsageError naming ``flag name`` when it is
    missing or its import fails."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name or module_name.startswith(f"{e.name}."):
            raise UsageError(no_module_message(flag, name, module_name)) from None
        raise UsageError(f"{flag} {name}: importing {module_name} failed: {brief(e)}.") from None
    except Exception as e:
        raise UsageError(f"{flag} {name}: importing {module_name} failed: {brief(e)}.") from None


def brief(e: BaseException) -> str:
    """An exception from the user's code in a few words for a message: its type and the first
    line of its text (callers end the sentence)."""
    text = str(e).strip().splitlines()
    first = text[0].rstrip(". ") if text else ""
    first = first if len(first) <= 200 else first[:200] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def describe(v: Any) -> str:
    """What a user's function returned, for a message: "a tensor of shape [..]", "a dict"."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is loaded
    if torch is not None and isinstance(v, torch.Tensor):
        return f"a tensor of shape {list(v.shape)}"
    return f"a {type(v).__module__}.{type(v).__qualname__}".replace("builtins.", "")
