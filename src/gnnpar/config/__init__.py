"""Every setting of a run: one dataclass tree, loaded from TOML and flags, defaulted, checked.

* :mod:`gnnpar.config.schema`: the dataclasses (:class:`~gnnpar.config.schema.Config` and its
  sections) and the fixed choices some settings allow. Plain data.
* :mod:`gnnpar.config.parse`: the flag / TOML key table (``KEYS``), type coercion, TOML files,
  the data root.
* :mod:`gnnpar.config.validate`: study and strategy defaults (``resolve``), which runs read which
  setting (``used_by``, from the strategies' specs), ``validate``, and ``build_config``, the
  whole way from a TOML file and flags to a checked Config.

Nothing is imported here (import the module you need), and nothing in this package imports
torch.
"""
