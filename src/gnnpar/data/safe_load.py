"""Reading files that this process did not write, without running code from them.

A pickle (and ``torch.save`` is a pickle in a zip file) names functions and classes that the
loader imports and calls: a file whose object defines ``__reduce__`` as ``(os.system, (...))``
runs that command while it is read. gnnpar reads such files from users (``--dataset X.pt``,
CIFAR-10's and Planetoid's pickled raw files) and from other runs (``model.pt`` for ``gnnpar
predict`` and ``gnnpar.load``, checkpoints for ``--resume``); each is read here, with an
allowlist of the globals its format needs (gnnpar's own caches, tensors only, are read with
``torch.load(weights_only=True)`` in cache.py):

- :func:`torch_load`: ``torch.load(weights_only=True)`` (tensors, containers and numbers only)
  plus the globals a caller allows for that one call (``torch.serialization.safe_globals``).
- :func:`pickle_load`: a plain pickle through an ``Unpickler`` whose ``find_class`` hands out
  the allowed globals and refuses any other one.

A file that names any other global raises :class:`Refused` before anything of it is called; the
caller turns it into a :class:`gnnpar.UsageError` that says which global and how to convert the
file. What each caller allows, and why, is listed where it calls.
"""

from __future__ import annotations

import _codecs
import _compat_pickle
import io
import pickle
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

import torch


class Refused(Exception):
    """The file names globals outside the allowlist: loading it would have to call them."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(set(names))
        super().__init__(self.why())

    def why(self, subject: str = "it") -> str:
        more = len(self.names) - 3
        shown = ", ".join(self.names[:3]) + (f" and {more} more" if more > 0 else "")
        return f"{subject} holds {shown}, which loading would have to execute"


def qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


# ------------------------------------------------------------------------------ torch.load
@contextmanager
def allowed(globals_: Iterable[Any]) -> Iterator[None]:
    """``torch.serialization.safe_globals`` for the ones not already allowed process-wide (its
    exit removes what it was given, which would drop e.g. PyG's own registrations)."""
    have = set(torch.serialization.get_safe_globals())
    new = [g for g in dict.fromkeys(globals_) if g not in have]
    with torch.serialization.safe_globals(new):
        yield


_REFUSAL = re.compile(
    r"GLOBAL (\S+) was not an allowed global|unsupported GLOBAL (\S+) whose module"
    r"|call reduce for unrecognized function (.+?)(?: which belongs|$)"
)


def torch_load(
    f: str | Any,
    allow: Iterable[Any] = (),
    *,
    resolve: Callable[[str], Any] | None = None,
    map_location: Any = "cpu",
    mmap: bool = False,
) -> Any:
    """``torch.load(f, weights_only=True)``, with ``allow`` (objects, or ``(object, "module.name")``
    pairs) allowed for this call. ``resolve(name)``, where given, may allow one more global the
    file names (it returns the object, or None to refuse it). :class:`Refused` when the file
    names any other global; other errors (a truncated or foreign file) propagate as torch
    raises them."""
    with allowed(allow):
        unsafe = _unsafe_globals(f)
        found = {name: resolve(name) for name in unsafe} if resolve else {}
        extra = [(obj, name) for name, obj in found.items() if obj is not None]
        refused = [name for name in unsafe if found.get(name) is None]
        if refused:
            raise Refused(refused)
        with allowed(extra), warnings.catch_warnings():
            # a legacy file pickled with protocol 4: torch warns, then refuses its STACK_GLOBAL
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            try:
                return torch.load(f, map_location=map_location, weights_only=True, mmap=mmap)
            except pickle.UnpicklingError as e:  # a file of the legacy (non-zip) format
                m = _REFUSAL.search(str(e))
                if m:
                    raise Refused([next(g for g in m.groups() if g)]) from None
                raise


def _unsafe_globals(f: Any) -> list[str]:
    """The globals of a torch.save zip file that weights_only loading does not allow (static: the
    pickle is disassembled, nothing is called). [] where it is not such a file: torch.load then
    says what is wrong, or refuses a global itself."""
    pos = f.tell() if hasattr(f, "seek") else None
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(f))
    except Exception:
        return []
    finally:
        if pos is not None:
            f.seek(pos)


# ---------------------------------------------------------------------------------- pickle
class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], allow: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.allow = allow

    def find_class(self, module: str, name: str) -> Any:
        key = f"{module}.{name}"
        if key not in self.allow:  # Python 2's names (__builtin__.list) as Python 3 spells them
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            else:
                module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            key = f"{module}.{name}"
        if key in self.allow:
            return self.allow[key]
        raise Refused([key])

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not supported")


def pickle_load(f: IO[bytes] | bytes, allow: Mapping[str, Any], **kwargs: Any) -> Any:
    """``pickle.load`` that resolves only the globals in ``allow`` (``{"module.name": object}``)
    and raises :class:`Refused` for any other; ``kwargs`` as ``pickle.Unpickler`` takes them
    (``encoding="bytes"`` for Python 2 pickles)."""
    if isinstance(f, bytes | bytearray):
        f = io.BytesIO(f)
    return _Unpickler(f, allow, **kwargs).load()


def by_name(objs: Iterable[Any]) -> dict[str, Any]:
    """``{"module.qualname": obj}`` for :func:`pickle_load`."""
    return {qualname(o): o for o in objs}


# ------------------------------------------------------------------------------ allowlists
def numpy_arrays() -> dict[str, Any]:
    """What a pickled numpy array (not of dtype object) needs: its class, its dtype and the two
    functions that rebuild it (numpy 2 moved ``numpy.core`` to ``numpy._core``; files name
    either). They construct an array from bytes, a shape and a dtype, and call nothing else."""
    import numpy as np

    core = np._core if hasattr(np, "_core") else np.core
    out = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype}
    for mod in ("numpy.core", "numpy._core"):
        out[f"{mod}.multiarray._reconstruct"] = core.multiarray._reconstruct
        out[f"{mod}.numeric._frombuffer"] = core.numeric._frombuffer
    out["_codecs.encode"] = _codecs.encode  # bytes, as Python 3 pickles them
    # torch's unpickler also wants the class of a dtype (float32's is Float32DType) allowed
    # before it sets the dtype's state; files never name these
    for cls in vars(getattr(np, "dtypes", object)).values():
        if isinstance(cls, type) and issubclass(cls, np.dtype):
            out[qualname(cls)] = cls
    return out


def torch_pairs(allow: Mapping[str, Any]) -> list[tuple[Any, str]]:
    """``allow`` as the ``(object, "module.name")`` pairs :func:`torch_load` takes."""
    return [(obj, name) for name, obj in allow.items()]
