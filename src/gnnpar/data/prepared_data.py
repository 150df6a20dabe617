"""``PreparedData``: the PyG ``Data`` of a prepared folder (:mod:`gnnpar.data.prepared`), whose
``edge_index`` is rebuilt from the memory-mapped CSR on first use, and whose half-precision
features (``--feature-dtype fp16|bf16``) are widened to float32 on first use. The sampled
strategy reads the CSR and the features in place and never asks for either, so training from
disk holds no ``[2, E]`` int64 copy and no ``[N, F]`` float32 copy; the full-graph strategies and
evaluation ask, and get the in-memory graph's tensors, column for column. Apart from
:mod:`gnnpar.data.prepared` (which loader workers import without PyG)."""

from __future__ import annotations

from torch_geometric.data import Data

LAZY = ("edge_index", "x")


class PreparedData(Data):
    def _built(self, key: str | None = None) -> None:
        store = self._store
        p = self.__dict__.get("_prepared")
        if p is None:
            return
        for k in LAZY if key is None else (key,):
            if k not in store:
                store[k] = p.edge_index() if k == "edge_index" else p.tensor("features").float()

    @property
    def edge_index(self):  # noqa: ANN201
        self._built("edge_index")
        return self._store["edge_index"] if "edge_index" in self._store else None

    @edge_index.setter
    def edge_index(self, value) -> None:  # noqa: ANN001
        self._store["edge_index"] = value

    @property
    def x(self):  # noqa: ANN201
        self._built("x")
        return self._store["x"] if "x" in self._store else None

    @x.setter
    def x(self, value) -> None:  # noqa: ANN001
        self._store["x"] = value

    @property
    def num_nodes(self) -> int:
        p = self.__dict__.get("_prepared")
        return p.num_nodes if p is not None else super().num_nodes

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        if key in LAZY:
            self._built(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:  # noqa: ANN001
        return key in LAZY or super().__contains__(key)

    def keys(self):  # noqa: ANN201
        self._built()
        return super().keys()

    def apply(self, func, *args):  # noqa: ANN001, ANN201 (to, cpu, share_memory_, ...)
        self._built()
        return super().apply(func, *args)

    def to_dict(self):  # noqa: ANN201
        self._built()
        return super().to_dict()
