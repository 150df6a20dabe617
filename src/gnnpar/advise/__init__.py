"""``gnnpar advise``: profile briefly here, simulate every strategy on the cluster described,
rank them (``gnnpar advise --help``; README "Which strategy for my graph?").

* :mod:`~gnnpar.advise.events`: a small discrete-event engine.
* :mod:`~gnnpar.advise.simulate`: each strategy's semantics as a simulation (torch-free).
* :mod:`~gnnpar.advise.profile`: the measurements, taken with gnnpar's own models and batches.
* :mod:`~gnnpar.advise.predict`: the grid of configurations, simulated from a profile.
* :mod:`~gnnpar.advise.report`: the table, the plot and ``advice.json``.
* :mod:`~gnnpar.advise.validate`: predicted against measured with real ``gnnpar train`` runs.
* :mod:`~gnnpar.advise.scale`: a stand-in's profile mapped onto a larger graph (papers100M).
"""

# train flags advise does not take (one strategy, or a run to resume); torch-free, for the CLI
NOT_TAKEN = ("strategy", "resume", "checkpoint-every", "checkpoint-every-steps")
NOT_TAKEN += ("max-restarts", "tensorboard", "max-steps", "replicas")
