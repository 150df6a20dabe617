"""A small discrete-event engine: processes are generators that yield what they wait for.

Why our own and not SimPy: the simulator needs three things only (a delay, an event that one
process triggers and others wait for, and a rendezvous of n processes), each a few lines on a
heap of ``(time, sequence, callback)``. SimPy is not a dependency of gnnpar (it would be one
more package for every user, for ~80 lines), and owning the queue lets ties be broken
deterministically and documented: events at the same instant run in the order they were
scheduled, so a prediction is a pure function of its inputs and a hand-computed case in a test
is reproduced exactly.

    sim = Sim()

    def rank(sim, done):
        yield sim.delay(1.5)        # compute
        yield done                  # wait for an Event
        return sim.now

    p = sim.start(rank(sim, done))
    sim.run()
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator
from typing import Any


class Event:
    """Triggered once (with a value); every process waiting on it resumes then, in order."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.triggered = False
        self.value: Any = None
        self._waiters: list[Callable[[Any], None]] = []

    def succeed(self, value: Any = None, delay: float = 0.0) -> Event:
        """Trigger now, or ``delay`` seconds from now."""
        if delay > 0:
            self.sim.at(self.sim.now + delay, lambda: self.succeed(value))
            return self
        if self.triggered:
            raise RuntimeError("an event is triggered once")
        self.triggered, self.value = True, value
        waiters, self._waiters = self._waiters, []
        for resume in waiters:
            self.sim.at(self.sim.now, lambda r=resume: r(value))
        return self

    def _wait(self, resume: Callable[[Any], None]) -> None:
        if self.triggered:
            self.sim.at(self.sim.now, lambda: resume(self.value))
        else:
            self._waiters.append(resume)


class Rendezvous:
    """``n`` processes meet; once the last arrives, all resume ``cost`` seconds later (a barrier,
    or a collective whose cost starts when everybody is in), except that those who arrived
    before the last resume ``late`` seconds after that (woken late from their wait). Of
    processes that arrive at the same instant, all but the last to call :meth:`arrive` count
    as having waited: equal simulated steps stand for real ones, of which one always waits."""

    def __init__(self, sim: Sim, n: int, cost: float = 0.0, late: float = 0.0) -> None:
        self.sim, self.n, self.cost, self.late = sim, n, cost, late
        self.arrivals: list[float] = []
        self.done = Event(sim)
        self._early = Event(sim) if late > 0 else self.done  # for those who waited

    def arrive(self) -> Event:
        self.arrivals.append(self.sim.now)
        if len(self.arrivals) < self.n:
            return self._early
        last = max(self.arrivals)
        self.done.succeed(last, delay=self.cost)
        if self._early is not self.done:
            self._early.succeed(last, delay=self.cost + self.late)
        return self.done


class Swap:
    """Two processes exchange something: once the second is in, each resumes at the instant
    ``done(first_s, second_s)`` gives it (``(first's, second's)``, from both arrival times: a
    protocol in which who came first matters), the first ``late`` seconds after that (woken
    late from its wait). Of two arriving at the same instant, the first to call
    :meth:`arrive` is the first."""

    def __init__(
        self, sim: Sim, done: Callable[[float, float], tuple[float, float]], late: float = 0.0
    ) -> None:
        self.sim, self.done, self.late = sim, done, late
        self.arrivals: list[float] = []
        self._events = [Event(sim), Event(sim)]

    def arrive(self) -> Event:
        if len(self.arrivals) == 2:
            raise RuntimeError("a swap is between two processes")
        self.arrivals.append(self.sim.now)
        if len(self.arrivals) == 2:
            first, second = self.done(*self.arrivals)
            now = self.sim.now
            self._events[0].succeed(first, delay=max(first + self.late - now, 0.0))
            self._events[1].succeed(second, delay=max(second - now, 0.0))
        return self._events[len(self.arrivals) - 1]


class Process(Event):
    """A running generator; as an event it triggers with the generator's return value."""

    def __init__(self, sim: Sim, gen: Generator) -> None:
        super().__init__(sim)
        self.gen = gen
        sim.at(sim.now, lambda: self._step(None))

    def _step(self, value: Any) -> None:
        try:
            waited = self.gen.send(value)
        except StopIteration as stop:
            self.succeed(stop.value)
            return
        if not isinstance(waited, Event):
            raise TypeError(f"a process yields events, got {waited!r}")
        waited._wait(self._step)


class Sim:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        if t < self.now:
            raise ValueError(f"cannot schedule at {t} before now ({self.now})")
        heapq.heappush(self._queue, (t, self._seq, fn))
        self._seq += 1

    def delay(self, seconds: float) -> Event:
        if seconds < 0:
            raise ValueError(f"a delay must be >= 0, got {seconds}")
        return Event(self).succeed(None, delay=seconds) if seconds > 0 else self._now_event()

    def _now_event(self) -> Event:
        e = Event(self)
        self.at(self.now, lambda: e.succeed())
        return e

    def event(self) -> Event:
        return Event(self)

    def start(self, gen: Generator) -> Process:
        return Process(self, gen)

    def run(self, until: float | None = None) -> None:
        while self._queue:
            t, _, fn = self._queue[0]
            if until is not None and t > until:
                break
            heapq.heappop(self._queue)
            self.now = t
            fn()
