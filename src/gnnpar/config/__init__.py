"""Every setting of a run: one dataclass tree and its parser, from TOML files and flags.

* :mod:`gnnpar.config.schema`: the dataclasses (:class:`~gnnpar.config.schema.Config` and its
  sections) and the fixed choices some settings allow. Plain data.
* :mod:`gnnpar.config.parse`: the flag / TOML key table (``KEYS``), type coercion, TOML files,
  the data root.

The configure step that fills and checks a Config, consulting the strategies' specs, stands
above them: :mod:`gnnpar.configure` (``resolve``, ``used_by``, ``validate``, ``build_config``).
This package is the vocabulary below every other: it imports nothing of gnnpar's but
:mod:`gnnpar.errors`, nothing is imported here (import the module you need), and nothing in it
imports torch.
"""
