"""The prepared graph format: one folder of flat ``.npy`` arrays and a JSON manifest, which
``gnnpar prepare`` writes and ``gnnpar train --dataset FOLDER`` trains from, memory-mapped.

Anyone can read it with numpy alone (``numpy.load(path, mmap_mode="r")``); nothing in it is a
pickle, and gnnpar never unpickles it (``allow_pickle=False``). Layout, format version 1::

    FOLDER/
      manifest.json   what the folder holds (below); written last, so a folder without it is
                      not a prepared graph
      indptr.npy      int64 [N + 1]  in-edge CSR row offsets
      indices.npy     int32 [E] (int64 when N >= 2**31)  the source of every edge, grouped by
                      target: node v aggregates indices[indptr[v]:indptr[v + 1]] (messages flow
                      source -> target, PyG's convention; the order within a row is the order of
                      the graph's edge_index, a stable sort by target)
      features.npy    [N, F] float32, float16 (--feature-dtype fp16) or uint16 holding the raw
                      bits of bfloat16 (--feature-dtype bf16: numpy has no bfloat16; read with
                      torch.from_numpy(a).view(torch.bfloat16))
      labels.npy      int64 [N] class indices, or uint8 [N, C] 0/1 (multi-label)
      train.npy, val.npy, test.npy    int64 node ids of each split, ascending
      edge_order.npy  int64 [E], only when "edge_index_order" is "permuted" (below)

``manifest.json``::

    {"format": "gnnpar-prepared", "format_version": 1,
     "name": "synthetic-papers100m", "num_nodes": N, "num_edges": E, "num_features": F,
     "num_classes": C, "multilabel": false, "directed": false,
     "feature_dtype": "fp32" | "fp16" | "bf16",
     "edge_index_order": "target" | "source" | "permuted",
     "splits": {"train": n_train, "val": n_val, "test": n_test},
     "arrays": {"indptr": {"file": "indptr.npy", "dtype": "int64", "shape": [N + 1],
                           "bytes": ..., "sha256": ..., "sha256_ends": ...}, ...},
     "made": {"source": ..., "scale": ..., "seed": ..., "split": ..., "generator": ...,
              "gnnpar_version": ..., "created": "2026-11-28T01:30:00Z"},
     "shards": []}

- ``arrays``: every file's dtype and shape (as ``numpy.load`` reports them), its size in bytes,
  the SHA-256 of the whole file, and ``sha256_ends``, the SHA-256 of its first and last MiB.
  Opening a folder checks every size and ends checksum (a ``stat`` and 2 MiB per array,
  whatever the graph's size): a truncated or overwritten array is named before anything trains
  on it. ``gnnpar prepare --verify FOLDER`` hashes every byte and checks the values (CSR
  offsets, node ids in range, labels below C, finite features): any flipped byte is found.
- ``edge_index_order`` says how to rebuild the ``edge_index`` that the in-memory graph had, so
  that a run from the folder does the same arithmetic as the in-memory run, bit for bit:
  ``target``: ``[indices, targets]`` in CSR order; ``source``: ``[targets, indices]`` (a
  symmetric graph whose edge_index was sorted by (source, target): every generated and coalesced
  graph); ``permuted``: column j of edge_index is CSR position ``edge_order[j]``.
- ``made``: where the graph came from (``--dataset`` as given, ``--scale``, ``--seed``), how the
  split was made, the generator's version for generated graphs, and gnnpar's version.
- ``shards``: empty for a graph in one folder. For a graph sharded across hosts (``gnnpar
  prepare --shards H``), a list of ``{"folder": "shard-<h>", "nodes": [first, end],
  "num_edges": ..., "manifest_sha256": ...}``, each shard a folder of this same layout over its
  node range (plus ``orig_ids.npy``), and a ``partition`` record; see :mod:`gnnpar.data.shards`.

Writing is atomic: arrays go into ``FOLDER.tmp-<pid>-<random>`` beside FOLDER, the manifest is
written last and the folder renamed into place, so a killed ``prepare`` leaves no folder that
loads (its leftover is removed by the next ``prepare`` into the same place). The destination is
checked first: writable, not an existing folder, and with the space the arrays need.

    gnnpar prepare --dataset synthetic-papers100m --scale 0.02 --out papers-002
    gnnpar train --dataset papers-002 --strategy sampled --model sage
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gnnpar.errors import UsageError

if TYPE_CHECKING:
    import torch

FORMAT, FORMAT_VERSION = "gnnpar-prepared", 1
MANIFEST = "manifest.json"
ENDS = 1 << 20  # bytes hashed at each end of an array on every open
TMP_MARK = ".tmp-"
FEATURE_DTYPES = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
}
SPLITS = ("train", "val", "test")
CHUNK_BYTES = 64 << 20  # what one write holds: the fixed buffer of a streaming prepare


def is_prepared(path: str | os.PathLike) -> bool:
    """Is ``path`` a prepared graph folder (a folder holding ``manifest.json``)?"""
    p = Path(path).expanduser()
    return p.is_dir() and (p / MANIFEST).is_file()


def index_dtype(num_nodes: int) -> np.dtype:
    """indices.npy's dtype: int32 while every node id fits, else int64."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


# ----------------------------------------------------------------------------------- writing
class Array:
    """One ``.npy`` file written front to back in chunks, hashed as it is written."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.name, self.file = name, f"{name}.npy"
        self.path = folder / self.file
        self.dtype, self.shape = np.dtype(dtype), tuple(int(s) for s in shape)
        self.rows = self.shape[0] if self.shape else 1
        self.written = 0  # rows so far
        self.sha = hashlib.sha256()
        self.fh = open(self.path, "wb")  # noqa: SIM115 (closed in finish)
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False}
        header["shape"] = self.shape
        np.lib.format.write_array_header_1_0(_Hashing(self.fh, self.sha), header)

    def write(self, chunk: np.ndarray) -> None:
        chunk = np.ascontiguousarray(chunk, dtype=self.dtype)
        if chunk.shape[1:] != self.shape[1:] or self.written + len(chunk) > self.rows:
            raise ValueError(f"{self.file}: chunk of shape {chunk.shape} does not fit {self.shape}")
        data = memoryview(chunk.reshape(-1).view(np.uint8))
        self.sha.update(data)
        self.fh.write(data)
        self.written += len(chunk)

    def finish(self) -> dict[str, Any]:
        if self.written != self.rows:
            raise ValueError(f"{self.file}: {self.written} of {self.rows} rows written")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        size = self.path.stat().st_size
        return {
            "file": self.file,
            "dtype": self.dtype.str,
            "shape": list(self.shape),
            "bytes": size,
            "sha256": self.sha.hexdigest(),
            "sha256_ends": ends_digest(self.path, size),
        }


class _Hashing:
    def __init__(self, fh, sha) -> None:  # noqa: ANN001
        self.fh, self.sha = fh, sha

    def write(self, data) -> int:  # noqa: ANN001
        self.sha.update(data)
        return self.fh.write(data)


def ends_digest(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(ENDS))
        fh.seek(max(0, size - ENDS))
        h.update(fh.read(ENDS))
    return h.hexdigest()


def array_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))) + 128


class Writer:
    """A prepared folder being written: ``with Writer(out, need) as w: a = w.array(...) ...;
    w.commit(manifest)``. Everything goes into ``out.tmp-*``; :meth:`commit` writes the manifest
    last and renames the folder into place; leaving the block otherwise removes it."""

    def __init__(self, out: str | os.PathLike, need_bytes: int) -> None:
        self.out = Path(out).expanduser().absolute()
        self.need = int(need_bytes)
        self.records: dict[str, dict[str, Any]] = {}
        self.tmp: Path | None = None
        self._open: list[Array] = []

    def __enter__(self) -> Writer:
        check_destination(self.out, self.need)
        self.tmp = Path(
            tempfile.mkdtemp(prefix=f"{self.out.name}{TMP_MARK}{os.getpid()}-", dir=self.out.parent)
        )
        self.tmp.chmod(0o755)
        return self

    def __exit__(self, kind, value, tb) -> None:  # noqa: ANN001
        for a in self._open:
            if not a.fh.closed:
                a.fh.close()
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)
        if isinstance(value, OSError) and value.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(self.out.parent).free
            raise UsageError(
                f"{self.out}: the disk filled up while writing the prepared graph ({_gib(free)} "
                f"free, {_gib(self.need)} needed); nothing was left behind. Free space or "
                "choose another --out."
            ) from None

    def array(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Array:
        assert self.tmp is not None
        a = Array(self.tmp, name, dtype, shape)
        self._open.append(a)
        return a

    def finish(self, a: Array) -> None:
        self.records[a.name] = a.finish()

    def put(self, name: str, values: np.ndarray) -> None:
        """A whole (small or already in memory) array, written in chunks."""
        a = self.array(name, values.dtype, values.shape)
        rows = max(1, CHUNK_BYTES // max(1, values[:1].nbytes))
        for i in range(0, len(values), rows):
            a.write(values[i : i + rows])
        self.finish(a)

    def commit(self, manifest: dict[str, Any]) -> Path:
        assert self.tmp is not None
        manifest = {**manifest, "arrays": self.records}
        path = self.tmp / MANIFEST
        with open(path, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(self.tmp, self.out)
        self.tmp = None
        try:  # the rename itself on disk, not only in the page cache
            fd = os.open(self.out.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
        return self.out


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_destination(out: Path, need: int) -> None:
    """Refuse, before any work, an ``--out`` that exists, cannot be written, or lacks the space
    (UsageError); remove leftovers of earlier prepares into ``out`` whose process is gone."""
    if out.exists():
        raise UsageError(
            f"--out {out}: already exists. Give a new folder (a prepared graph is never "
            "overwritten), or remove it first."
        )
    parent = out.parent
    if not parent.is_dir():
        raise UsageError(f"--out {out}: its folder {parent} does not exist.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: cannot write in {parent} (permission denied).")
    remove_leftovers(out)
    free = shutil.disk_usage(parent).free
    if free < need + (16 << 20):
        raise UsageError(
            f"--out {out}: {parent} has {_gib(free)} free, the prepared graph needs "
            f"{_gib(need)}. Free space or choose another --out."
        )


def remove_leftovers(out: Path) -> list[Path]:
    """``out.tmp-<pid>-*`` folders of prepares that were killed (their process is gone)."""
    removed = []
    prefix = f"{out.name}{TMP_MARK}"
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid = entry.name[len(prefix) :].split("-")[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def made_record(source: str, scale: float | None, seed: int, split: str, **extra) -> dict:
    from gnnpar._version import __version__

    return {
        "source": source,
        "scale": scale,
        "seed": seed,
        "split": split,
        **extra,
        "gnnpar_version": __version__,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def base_manifest(
    name: str,
    num_nodes: int,
    num_edges: int,
    num_features: int,
    num_classes: int,
    multilabel: bool,
    directed: bool,
    feature_dtype: str,
    edge_index_order: str,
    splits: dict[str, int],
    made: dict[str, Any],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": name,
        "num_nodes": int(num_nodes),
        "num_edges": int(num_edges),
        "num_features": int(num_features),
        "num_classes": int(num_classes),
        "multilabel": bool(multilabel),
        "directed": bool(directed),
        "feature_dtype": feature_dtype,
        "edge_index_order": edge_index_order,
        "splits": {k: int(v) for k, v in splits.items()},
        "made": made,
        "shards": [],
    }


def features_to(x: np.ndarray, feature_dtype: str) -> np.ndarray:
    """float32 rows in the stored dtype (bf16: round to nearest even, as torch does, as bits)."""
    if feature_dtype == "fp32":
        return np.asarray(x, dtype=np.float32)
    if feature_dtype == "fp16":
        return np.asarray(x, dtype=np.float32).astype(np.float16)
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def write_graph(
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    out: str | os.PathLike,
    feature_dtype: str,
    made: dict[str, Any],
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Prepare a graph held in memory (``x, edge_index, y, train_mask, val_mask, test_mask``;
    ``meta``: name, num_classes, multilabel, directed) into ``out``. The CSR is built as the
    sampler builds it from edge_index (a stable sort by target), so a run from the folder
    samples the same batches."""
    import torch

    from gnnpar.csr import indptr as make_indptr

    x, ei, y = tensors["x"], tensors["edge_index"], tensors["y"]
    n, f = int(x.size(0)), int(x.size(1))
    e = int(ei.size(1))
    src, dst = ei[0].long(), ei[1].long()
    order = torch.sort(dst, stable=True).indices
    ptr = make_indptr(dst, n)
    idx = src[order]
    rows = torch.repeat_interleave(torch.arange(n), ptr[1:] - ptr[:-1], output_size=e)
    edge_order = None
    if torch.equal(order, torch.arange(e)):
        how = "target"
    elif torch.equal(src, rows) and torch.equal(dst, idx):
        how = "source"
    else:
        how = "permuted"
        edge_order = torch.empty(e, dtype=torch.long)
        edge_order[order] = torch.arange(e)
    del order, rows, src, dst
    labels = y.to(torch.uint8) if y.dim() == 2 else y.long()
    splits = {s: tensors[f"{s}_mask"].nonzero().view(-1) for s in SPLITS}
    fdt = FEATURE_DTYPES[feature_dtype]
    need = array_bytes(np.int64, (n + 1,)) + array_bytes(index_dtype(n), (e,))
    need += array_bytes(fdt, (n, f)) + labels.numel() * labels.element_size()
    need += sum(8 * s.numel() for s in splits.values()) + (8 * e if edge_order is not None else 0)
    with Writer(out, need) as w:
        w.put("indptr", ptr.numpy())
        w.put("indices", idx.numpy().astype(index_dtype(n), copy=False))
        del idx
        if edge_order is not None:
            w.put("edge_order", edge_order.numpy())
        a = w.array("features", fdt, (n, f))
        step = max(1, CHUNK_BYTES // max(1, 4 * f))
        for i in range(0, n, step):
            a.write(features_to(x[i : i + step].float().numpy(), feature_dtype))
            if progress:
                progress("features", min(i + step, n), n)
        w.finish(a)
        w.put("labels", labels.numpy())
        for s in SPLITS:
            w.put(s, splits[s].numpy())
        manifest = base_manifest(
            meta["name"],
            n,
            e,
            f,
            int(meta["num_classes"]),
            bool(meta.get("multilabel", False)),
            bool(meta.get("directed", False)),
            feature_dtype,
            how,
            {s: splits[s].numel() for s in SPLITS},
            made,
        )
        return w.commit(manifest)


# ----------------------------------------------------------------------------------- reading
class Damaged(UsageError):
    """A prepared folder whose manifest or arrays are not what was written."""


REQUIRED = ("indptr", "indices", "features", "labels", *SPLITS)


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    folder = Path(folder).expanduser()
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{folder}: not a prepared graph (no {MANIFEST}; a prepare that was killed leaves "
            "none). Prepare it again with `gnnpar prepare`."
        ) from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise Damaged(f"{folder}: {MANIFEST} cannot be read ({_brief(e)}).") from None
    if isinstance(manifest, dict) and manifest.get("format") == "gnnpar-prepared-shard":
        raise UsageError(
            f"{folder}: one shard of a graph sharded across hosts; give --dataset the folder "
            "above it (the one whose manifest names every shard)."
        )
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Damaged(f"{folder}: {MANIFEST} is not a gnnpar prepared-graph manifest.")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise UsageError(
            f"{folder}: prepared with format version {version}; this gnnpar reads version "
            f"{FORMAT_VERSION}. Prepare it again with this gnnpar."
        )
    arrays = manifest.get("arrays")
    if manifest.get("shards"):  # gnnpar.data.shards reads the rest
        keys = ("num_nodes", "num_edges", "num_features", "num_classes", "splits")
        if (
            not isinstance(arrays, dict)
            or any(k not in manifest for k in keys)
            or manifest.get("feature_dtype") not in FEATURE_DTYPES
            or manifest.get("edge_index_order") not in ("target", "source", "permuted")
            or (manifest["edge_index_order"] == "permuted" and "edge_order" not in arrays)
        ):
            raise Damaged(f"{folder}: {MANIFEST} lacks what a sharded prepared graph records.")
        return manifest
    keys = ("num_nodes", "num_edges", "num_features", "num_classes", "feature_dtype")
    if (
        not isinstance(arrays, dict)
        or any(k not in arrays for k in REQUIRED)
        or any(k not in manifest for k in keys)
        or manifest.get("feature_dtype") not in FEATURE_DTYPES
        or manifest.get("edge_index_order") not in ("target", "source", "permuted")
        or (manifest["edge_index_order"] == "permuted" and "edge_order" not in arrays)
    ):
        raise Damaged(f"{folder}: {MANIFEST} lacks what a prepared graph records.")
    return manifest


def map_array(path: str | os.PathLike) -> np.ndarray:
    """A prepared array, memory-mapped **read-only**. Not copy-on-write (``mmap_mode="c"``): a
    private writable mapping is charged to the kernel's commit count, and under the default
    heuristic overcommit one larger than RAM + swap fails with ENOMEM (papers100M's 28 GB of fp16
    features on a 24 GiB machine); a shared read-only one is charged nothing. Nothing in gnnpar
    writes a prepared array: a write now fails loudly instead of copying a page."""
    return np.load(path, mmap_mode="r", allow_pickle=False)


def mapped_tensor(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` over a read-only mapped array, without torch's warning that the
    tensor is not writable (gnnpar only reads these; a write would fault, not corrupt)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)


def check_arrays(folder: Path, manifest: dict[str, Any], full: bool = False) -> list[str]:
    """What is wrong with the folder's files (empty: nothing found): sizes and ends checksums;
    ``full``: every byte's SHA-256 too."""
    problems = []
    for name, rec in manifest["arrays"].items():
        if not isinstance(rec, dict) or not isinstance(rec.get("file"), str):
            problems.append(f"{MANIFEST}'s record of {name} is damaged")
            continue
        path = folder / Path(rec["file"]).name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append(f"{path.name} is missing")
            continue
        except OSError as e:
            problems.append(f"{path.name} cannot be read ({_brief(e)})")
            continue
        if size != rec.get("bytes"):
            problems.append(f"{path.name} has {size} bytes, {rec.get('bytes')} were written")
            continue
        try:
            if ends_digest(path, size) != rec.get("sha256_ends"):
                problems.append(f"{path.name} differs from what was written (checksum of its ends)")
                continue
            if full:
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    while chunk := fh.read(1 << 24):
                        h.update(chunk)
                if h.hexdigest() != rec.get("sha256"):
                    problems.append(f"{path.name} differs from what was written (SHA-256)")
        except OSError as e:
            problems.append(f"{path.name} cannot be read ({_brief(e)})")
    return problems


class Prepared:
    """An opened prepared folder: its manifest and its arrays, memory-mapped (numpy, copy-on-
    write: pages are shared with every process that maps them, and nothing writes them)."""

    def __init__(self, folder: str | os.PathLike, full: bool = False) -> None:
        self.folder = Path(folder).expanduser().absolute()
        self.manifest = read_manifest(self.folder)
        problems = check_arrays(self.folder, self.manifest, full)
        if problems:
            raise Damaged(
                f"{self.folder}: the prepared graph is damaged: {'; '.join(problems)}. "
                "Prepare it again with `gnnpar prepare`."
            )
        self._arrays: dict[str, np.ndarray] = {}
        m = self.manifest
        n, e, f = m["num_nodes"], m["num_edges"], m["num_features"]
        expect = {
            "indptr": ((n + 1,), (np.dtype(np.int64),)),
            "indices": ((e,), (np.dtype(np.int32), np.dtype(np.int64))),
            "features": ((n, f), (FEATURE_DTYPES[m["feature_dtype"]],)),
            "labels": ((n, m["num_classes"]) if m.get("multilabel") else (n,), None),
            "edge_order": ((e,), (np.dtype(np.int64),)),
        }
        for name, (shape, dtypes) in expect.items():
            if name not in m["arrays"]:
                continue
            a = self.array(name)
            if a.shape != shape or (dtypes is not None and a.dtype not in dtypes):
                raise Damaged(
                    f"{self.folder}: {name}.npy holds {a.dtype} {list(a.shape)}, the manifest "
                    f"says {list(shape)}."
                )

    def __reduce__(self):  # noqa: ANN204 (another process maps the folder itself)
        return (Prepared, (str(self.folder),))

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            path = self.folder / Path(self.manifest["arrays"][name]["file"]).name
            try:
                self._arrays[name] = map_array(path)
            except (OSError, ValueError) as e:
                raise Damaged(f"{self.folder}: {path.name} cannot be read ({_brief(e)}).") from None
        return self._arrays[name]

    def tensor(self, name: str) -> torch.Tensor:
        """The array as a torch tensor over the same mapped pages (bf16 features as bfloat16)."""
        import torch

        t = mapped_tensor(self.array(name))
        if name == "features" and self.manifest["feature_dtype"] == "bf16":
            t = t.view(torch.bfloat16)
        return t

    @property
    def num_nodes(self) -> int:
        return int(self.manifest["num_nodes"])

    def edge_index(self) -> torch.Tensor:
        """The in-memory graph's edge_index, rebuilt in its column order (``edge_index_order``)."""
        import torch

        ptr = self.tensor("indptr")
        src = self.tensor("indices").long()
        e = src.numel()
        dst = torch.repeat_interleave(
            torch.arange(self.num_nodes), ptr[1:] - ptr[:-1], output_size=e
        )
        how = self.manifest["edge_index_order"]
        if how == "source":
            return torch.stack([dst, src])
        ei = torch.stack([src, dst])
        if how == "permuted":
            ei = ei[:, self.tensor("edge_order")]
        return ei

    def verify(self) -> list[str]:
        """Value checks beyond the checksums, chunk by chunk (``--verify``)."""
        m, n, problems = self.manifest, self.num_nodes, []
        ptr = self.array("indptr")
        if ptr[0] != 0 or ptr[-1] != m["num_edges"]:
            problems.append("indptr.npy does not run from 0 to the edge count")
        step = CHUNK_BYTES // 8
        for i in range(0, n, step):
            if np.any(np.diff(ptr[i : i + step + 1]) < 0):
                problems.append("indptr.npy decreases")
                break
        for name, bound in (("indices", n), ("edge_order", m["num_edges"])):
            if name not in m["arrays"]:
                continue
            a = self.array(name)
            for i in range(0, len(a), step):
                c = a[i : i + step]
                if len(c) and (c.min() < 0 or c.max() >= bound):
                    problems.append(f"{name}.npy holds a value outside 0..{bound - 1}")
                    break
        for s in SPLITS:
            a = self.array(s)
            if len(a) and (a.min() < 0 or a.max() >= n):
                problems.append(f"{s}.npy holds a node outside 0..{n - 1}")
        labels = self.array("labels")
        if not m.get("multilabel") and len(labels):
            lo, hi = labels.min(), labels.max()
            if lo < 0 or hi >= m["num_classes"]:
                problems.append(f"labels.npy holds a class outside 0..{m['num_classes'] - 1}")
        x = self.tensor("features")
        rows = max(1, CHUNK_BYTES // max(1, 4 * m["num_features"]))
        import torch

        for i in range(0, n, rows):
            if not bool(torch.isfinite(x[i : i + rows].float()).all()):
                problems.append("features.npy holds a value that is not finite (nan or inf)")
                break
        return problems


def is_sharded(folder: str | os.PathLike) -> bool:
    """Is ``folder`` the top of a graph sharded across hosts (gnnpar.data.shards)?"""
    try:
        return bool(json.loads((Path(folder).expanduser() / MANIFEST).read_text()).get("shards"))
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return False


def open_prepared(folder: str | os.PathLike, full: bool = False) -> Prepared:
    """An unsharded folder opened and checked. A sharded one is refused here: gnnpar.data.shards
    (a module above this one) checks and reads it (``check_folder``, ``load_sharded``)."""
    if is_sharded(folder):
        raise UsageError(
            f"{folder}: a graph sharded across hosts; it is read with gnnpar.data.shards."
        )
    return Prepared(folder, full)


def verify(folder: str | os.PathLike) -> Prepared:
    """Every byte against its SHA-256 and every value checked; Damaged naming what is wrong."""
    p = Prepared(folder, full=True)
    problems = p.verify()
    if problems:
        raise Damaged(f"{p.folder}: the prepared graph is damaged: {'; '.join(problems)}.")
    return p


def load_graph(folder: str | os.PathLike):
    """The GraphDataset of a prepared folder: features and labels memory-mapped; edge_index
    rebuilt on first use (:class:`PreparedData`); the split masks from the split ids."""
    import torch

    from gnnpar.data.types import GraphDataset

    p = open_prepared(folder)  # a sharded folder: gnnpar.data.datasets hands it to shards
    m = p.manifest
    n = p.num_nodes
    from gnnpar.data.prepared_data import PreparedData

    # fp32 features are the mapped file itself; fp16/bf16 ones are widened on first use only
    x = p.tensor("features")
    data = PreparedData(y=p.tensor("labels"))
    if x.dtype == torch.float32:
        data.x = x
    object.__setattr__(data, "_prepared", p)  # not an attribute of the graph: not in the store
    for s in SPLITS:
        mask = torch.zeros(n, dtype=torch.bool)
        mask[p.tensor(s)] = True
        data[f"{s}_mask"] = mask
    info = {
        "source": str(p.folder),
        "prepared": str(p.folder),
        "fingerprint": hashlib.sha256(json.dumps(m["arrays"], sort_keys=True).encode()).hexdigest(),
        "directed": bool(m.get("directed", False)),
        "split": m.get("made", {}).get("split", "given"),
        "split_counts": dict(m["splits"]),
        "num_nodes": n,
        "num_edges": int(m["num_edges"]),
        "num_features": int(m["num_features"]),
        "feature_dtype": m["feature_dtype"],
        "made": m.get("made", {}),
    }
    return GraphDataset(m["name"], data, int(m["num_classes"]), bool(m.get("multilabel")), info)


def _brief(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


# ----------------------------------------------------------------------- the feature cache
CACHE_SHARE = 0.25  # default cache: this share of the memory the run may use
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_cache_size(text: str) -> tuple[int | None, float | None]:
    """``--feature-cache``: ``(bytes, None)`` for "512M", "2G", "1000000" (an integer is bytes;
    "0" turns the cache off); ``(None, fraction)`` for "0.25", "1.0" (a share of the feature
    array, written with its decimal point). ValueError with the message otherwise."""
    t = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    why = (
        f"--feature-cache {text}: give bytes (512M, 2G, 1000000) or a fraction of the "
        "features from 0 to 1 (0.25)."
    )
    if t[-1:] in _UNITS and t[-1:]:
        try:
            v = float(t[:-1])
        except ValueError:
            raise ValueError(why) from None
        if not 0 <= v < 2**50 or v != v:
            raise ValueError(why)
        return int(v * _UNITS[t[-1]]), None
    if t.isdigit():  # an integer: bytes ("0" turns the cache off)
        return int(t), None
    try:
        v = float(t)
    except ValueError:
        raise ValueError(why) from None
    if "." not in t or not 0 <= v <= 1:  # a fraction is written with its point: 0.25, 1.0
        raise ValueError(why)
    return None, v


def cache_rows(p: Prepared, setting: str | None, available: int | None, reserve: int = 0) -> int:
    """How many feature rows the cache holds: ``--feature-cache`` as bytes or a fraction of the
    features; without it, :data:`CACHE_SHARE` of ``available`` (the memory the run may use),
    but never what the training step needs (``reserve`` bytes of ``available``: the cache is
    shared memory, which the kernel cannot reclaim, so a cache that leaves the step too little
    gets the run killed) nor the page cache's room for the CSR (``indptr`` and ``indices``,
    which the sampler reads at every hop of every batch: a feature cache that squeezes them out
    makes each hop fault them in again, at the disk's read-ahead a fault; the full papers100M
    inside 16 GiB spent 20-30 s a step so, its 4.8 GB cache beside a 7.4 GB CSR), or no cache
    when that is unknown. The default counts the cache's slot array too (int32 per node, shared
    memory as well: 444 MB for the full papers100M). Never more than the graph's rows."""
    n, f = p.num_nodes, int(p.manifest["num_features"])
    row = max(1, f * p.array("features").dtype.itemsize)
    if setting is None:
        csr = p.array("indptr").nbytes + p.array("indices").nbytes
        budget = min(int(CACHE_SHARE * available), available - reserve - csr) if available else 0
        budget -= 4 * n
    else:
        size, fraction = parse_cache_size(setting)
        budget = size if size is not None else int(fraction * n * row)
    return max(0, min(n, budget // row))


def hot_rows(
    p: Prepared, k: int, fanouts: list[int] | None = None, batch_size: int | None = None
) -> np.ndarray:
    """The ``k`` nodes a neighbour sampler reaches most, ascending, ties to the lower id. With
    the run's ``fanouts`` and ``batch_size``: the most expected visits per batch from the
    training nodes (gnnpar.data.visits: one pass over ``indices`` per hop); without them (or
    without training nodes): the most frequent sources in the CSR (out-degree). An undirected
    graph's CSR is symmetric, so its sources' counts are its rows' lengths (``indptr``'s
    differences: O(nodes) reads); a directed one's are counted over ``indices`` chunk by chunk
    (O(nodes) memory)."""
    from gnnpar.data.visits import expected_visits, top_rows

    n = p.num_nodes
    if k >= n:
        return np.arange(n, dtype=np.int64)
    train = p.array("train") if fanouts and batch_size else None
    if train is not None and len(train):
        symmetric = not p.manifest.get("directed", False)
        score = expected_visits(
            p.array("indptr"), p.array("indices"), train, fanouts, batch_size, symmetric=symmetric
        )
        return top_rows(score, k)
    if not p.manifest.get("directed", False):
        counts = np.diff(np.asarray(p.array("indptr"), dtype=np.int64))
    else:
        counts = np.zeros(n, dtype=np.int64)
        idx = p.array("indices")
        step = CHUNK_BYTES // idx.dtype.itemsize
        for i in range(0, len(idx), step):
            counts += np.bincount(idx[i : i + step], minlength=n)
    return top_rows(counts, k)


class FileRows:
    """Rows of a prepared folder's memory-mapped feature array read from its file by the compiled
    kernel's ``gnnpar_pread_rows``: many threads, each waiting on its own small reads, so the
    disk gets a deep queue of just the pages a batch needs. A gather through the map instead
    faults one page at a time, and each fault reads the device's read-ahead window around it
    (8 MiB on a virtio disk, where papers100m 0.1's 5.7 GB of features were read nearly whole
    every step inside 3 GiB); the descriptor is opened ``POSIX_FADV_RANDOM`` (no read-ahead) for
    that reason. The bytes are the file's, so the rows are bit for bit the map's."""

    THREADS = 64  # reads in flight (they wait on the disk, not on a core)
    GAP = 4096  # rows at most this many bytes apart are read in one call
    DIRECT_ALIGN = 4096  # O_DIRECT alignment where the device's own cannot be read

    def __init__(
        self, path: str, offset: int, row_bytes: int, direct: bool = False, align: int = 0
    ) -> None:
        self.path, self.offset, self.row_bytes = path, offset, row_bytes
        self.fd: int | None = None
        self.align = 1
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(path, flags | os.O_DIRECT)
                self.align = align or direct_align(path)
            except OSError:  # a file system without direct I/O (tmpfs): through the page cache
                self.fd = None
        if self.fd is None:
            self.fd = os.open(path, flags)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    @classmethod
    def open(cls, g: dict, direct: bool = False) -> FileRows | None:
        """A reader of the features of ``g`` (gnnpar.data.sampling.loader.open_graph_folder's:
        ``x`` and its file, ``x_file``), or None when the compiled kernel is not built (the
        gather then reads through the map: the same rows). ``direct``: read around the page
        cache (O_DIRECT), for a file larger than the memory the run may give the page cache:
        inside a memory cgroup every page read through the cache is charged to it and must be
        reclaimed first (papers100m 0.1 inside 3 GiB: 4-5 s a step to read the rows against 10 s
        through the cache, BENCHMARKS.md)."""
        from gnnpar.data.sampling import kernel

        if kernel.load() is None or "x_file" not in g:
            return None
        x = g["x"]
        return cls(*g["x_file"], x.size(1) * x.element_size(), direct)

    def read(self, rows: torch.Tensor | np.ndarray, out: torch.Tensor | np.ndarray) -> None:
        """``out[i] = row rows[i]`` for ascending int64 ``rows``, ``out`` contiguous in the
        file's dtype (torch tensors, or numpy arrays: the feature cache is written before torch
        is imported); OSError naming the file when a read fails."""
        from gnnpar.data.sampling import kernel

        if isinstance(rows, np.ndarray):
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            rows_at, count = rows.ctypes.data, rows.size
        else:
            rows = rows.contiguous()
            rows_at, count = rows.data_ptr(), rows.numel()
        out_at = out.ctypes.data if isinstance(out, np.ndarray) else out.data_ptr()
        err = kernel.load().gnnpar_pread_rows(
            self.fd, self.offset, self.row_bytes, rows_at, count,
            out_at, self.THREADS, self.align, self.GAP,
        )  # fmt: skip
        if err == errno.EINVAL and 1 < self.align < self.DIRECT_ALIGN:  # a finer alignment
            self.close()  # than the file system's refused: the page's
            self.__init__(self.path, self.offset, self.row_bytes, True, self.DIRECT_ALIGN)
            return self.read(rows, out)
        if err == errno.EINVAL and self.align > 1:  # direct I/O refused after all: buffered
            self.close()
            self.__init__(self.path, self.offset, self.row_bytes)
            return self.read(rows, out)
        if err:
            raise OSError(err, f"reading feature rows: {os.strerror(err)}", self.path)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.close()


def direct_align(path: str) -> int:
    """The alignment O_DIRECT reads of ``path`` need: the logical block size of the block device
    holding it (``/sys/dev/block/MAJ:MIN``, or its disk's for a partition), 512 bytes on most
    disks, else :attr:`FileRows.DIRECT_ALIGN` (a page). A 512-byte row of papers100M's fp32
    features read 4 KiB-aligned costs 8x its bytes (16x for fp16's 256): ~120 GB of reads an
    epoch at scale 0.1 inside 3 GiB (BENCHMARKS.md); aligned to the device's 512 bytes, 250K
    random rows read 322 MB from the device where 4 KiB alignment read 1,053 MB, in about the
    same time (the reads' count, not their bytes, sets it here: benchmarks/memory/feature_reads.py)."""
    try:
        dev = os.stat(path).st_dev
        base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        for q in (f"{base}/queue/logical_block_size", f"{base}/../queue/logical_block_size"):
            if os.path.exists(q):
                with open(q) as fh:
                    size = int(fh.read().strip())
                if 512 <= size <= FileRows.DIRECT_ALIGN and size & (size - 1) == 0:
                    return size
    except (OSError, ValueError):
        pass
    return FileRows.DIRECT_ALIGN


def write_feature_cache(
    p: Prepared,
    k: int,
    path: str,
    direct: bool = False,
    fanouts: list[int] | None = None,
    batch_size: int | None = None,
) -> None:
    """The cache file every local process maps, written in bounded memory (a chunk of rows at a
    time, straight into the file: the cache is never built in the process's own memory, which
    inside a memory cgroup would count twice): ``slot``, int32 [N] (the row's place in the cache,
    -1 when not cached), then ``rows``, [k, F] in the stored dtype (bf16 as its bits), no header
    (N, F and the dtype are the graph's; k follows from the size). Written to ``path + ".tmp"``
    and renamed; read by :func:`open_feature_cache`. The rows are read by :class:`FileRows`
    (``direct``: around the page cache) where the compiled kernel is built. The rows:
    :func:`hot_rows` (by expected visits for the run's ``fanouts`` and ``batch_size``)."""
    x = p.array("features")
    n, f = p.num_nodes, int(x.shape[1])
    nodes = hot_rows(p, k, fanouts, batch_size)
    k = len(nodes)
    head = 4 * n
    with open(f"{path}.tmp", "wb") as fh:
        fh.truncate(head + k * f * x.dtype.itemsize)
    slot = np.memmap(f"{path}.tmp", dtype=np.int32, mode="r+", shape=(n,))
    slot[:] = -1
    slot[nodes] = np.arange(k, dtype=np.int32)
    slot.flush()
    del slot
    if k:  # numpy only (no torch): gnnpar train writes it while it imports torch
        from gnnpar.data.sampling import kernel

        rows = np.memmap(f"{path}.tmp", dtype=x.dtype, mode="r+", offset=head, shape=(k, f))
        step = max(1, CHUNK_BYTES // max(1, f * x.dtype.itemsize))
        reader = None
        if kernel.load() is not None:  # else the gather reads through the map: the same rows
            reader = FileRows(x.filename, x.offset, f * x.dtype.itemsize, direct)
        for i in range(0, k, step):  # ascending ids: the folder's file is read front to back
            if reader is not None:  # many reads at once, straight into the cache file
                reader.read(nodes[i : i + step], rows[i : i + step])
            else:
                rows[i : i + step] = x[nodes[i : i + step]]
        if reader is not None:
            reader.close()
        rows.flush()
        del rows
    os.replace(f"{path}.tmp", path)


def open_feature_cache(path: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"slot", "rows"}`` of a cache written by :func:`write_feature_cache` for the features
    ``x`` (the folder's, as :meth:`Prepared.tensor` gives them), mapped: every process that
    opens it shares the same pages."""
    import torch

    n, f = x.shape
    item = x.element_size()
    k = (os.path.getsize(path) - 4 * n) // max(1, f * item)
    slot = torch.from_numpy(np.memmap(path, dtype=np.int32, mode="c", shape=(n,)))
    if k == 0:
        return {"slot": slot, "rows": x.new_empty((0, f))}
    dtype = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}
    rows = torch.from_numpy(
        np.memmap(path, dtype=dtype[x.dtype], mode="c", offset=4 * n, shape=(k, f))
    )
    return {"slot": slot, "rows": rows.view(torch.bfloat16) if x.dtype == torch.bfloat16 else rows}
