"""Emulated heterogeneity (study 003's non-dedicated cluster): ``--slowdown`` and ``--jitter``."""

from __future__ import annotations

import random
import time


class Straggler:
    """Slows this rank's steps down.

    ``factor`` F makes a step take F times as long: after a step's compute of t seconds the
    rank sleeps (F-1)*t. ``jitter`` X adds, with probability 0.1 per step, a transient pause of
    up to X times the step. ``delay_s`` is the total slept (``per_worker_delay_s``).
    """

    def __init__(self, factor: float = 1.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.factor = factor
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.delay_s = 0.0

    @classmethod
    def for_rank(cls, slowdown: dict[int, float], jitter: float, seed: int, rank: int) -> Straggler:
        return cls(slowdown.get(rank, 1.0), jitter, seed + rank)

    def pause_s(self, step_s: float) -> float:
        """The pause after a step of ``step_s`` seconds (draws the jitter; ``gnnpar advise``
        simulates stragglers with this very sequence)."""
        pause = (self.factor - 1.0) * step_s
        if self.jitter > 0 and self.rng.random() < 0.1:
            pause += self.rng.uniform(0, self.jitter) * step_s
        return pause

    def after_step(self, step_s: float) -> None:
        pause = self.pause_s(step_s)
        if pause > 0:
            time.sleep(pause)
            self.delay_s += pause

    def state(self) -> tuple:
        """What a checkpoint keeps: the generator's state and the delay so far."""
        return (self.rng.getstate(), self.delay_s)

    def load_state(self, state: tuple) -> None:
        self.rng.setstate(state[0])
        self.delay_s = state[1]
