"""``PreparedData``: the PyG ``Data`` of a prepared folder (:mod:`gnnpar.data.prepared`), whose
``edge_index`` is rebuilt from the memory-mapped CSR on first use. The sampled strategy reads the
CSR in place and never asks for it, so training from disk holds no ``[2, E]`` int64 copy; the
full-graph strategies and evaluation ask, and get the in-memory graph's edge_index, column for
column. Apart from :mod:`gnnpar.data.prepared` (which loader workers import without PyG)."""

from __future__ import annotations

from torch_geometric.data import Data


class PreparedData(Data):
    def _built(self) -> None:
        store = self._store
        p = self.__dict__.get("_prepared")
        if p is not None and "edge_index" not in store:
            store["edge_index"] = p.edge_index()

    @property
    def edge_index(self):  # noqa: ANN201
        self._built()
        return self._store["edge_index"] if "edge_index" in self._store else None

    @edge_index.setter
    def edge_index(self, value) -> None:  # noqa: ANN001
        self._store["edge_index"] = value

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        if key == "edge_index":
            self._built()
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:  # noqa: ANN001
        return key == "edge_index" or super().__contains__(key)

    def keys(self):  # noqa: ANN201
        self._built()
        return super().keys()

    def apply(self, func, *args):  # noqa: ANN001, ANN201 (to, cpu, share_memory_, ...)
        self._built()
        return super().apply(func, *args)

    def to_dict(self):  # noqa: ANN201
        self._built()
        return super().to_dict()
