"""Pace view refreshes so that watching a run costs the GUI thread a fixed share of wall time."""

from __future__ import annotations

import time
from typing import Callable, Optional


class Throttle:
    """Ask `due()`; call `started()` as each refresh begins.

    The CPU time the GUI thread used since the previous refresh began (that refresh, the
    repaints it caused, the queue drains in between) sets the gap before the next one:
    `max(min_interval, cpu / budget)`. Repaints happen after a refresh returns, so timing the
    refresh alone would miss most of the cost; thread CPU time counts it all. With budget
    0.02 the GUI thread stays near 2% of a core however many rounds arrive.
    """

    def __init__(self, min_interval: float, budget: float,
                 wall: Callable[[], float] = time.perf_counter, cpu: Callable[[], float] = time.thread_time):
        self.min_interval = min_interval
        self.budget = budget
        self.wall = wall
        self.cpu = cpu
        self.next_at = 0.0
        self.last_gap = min_interval
        self._cpu0: Optional[float] = None

    def due(self) -> bool:
        return self.wall() >= self.next_at

    def started(self) -> None:
        now, cpu = self.wall(), self.cpu()
        cost = 0.0 if self._cpu0 is None else cpu - self._cpu0
        self._cpu0 = cpu
        self.last_gap = max(self.min_interval, cost / self.budget)
        self.next_at = now + self.last_gap

    def reset(self) -> None:
        self.next_at = 0.0
        self._cpu0 = None
