"""Pace view refreshes so that watching a run costs the GUI thread a fixed share of wall time."""

from __future__ import annotations

import time
from typing import Callable, Optional


class Throttle:
    """Ask `due()`; call `started()` as each refresh begins.

    The CPU time the GUI thread used since the previous refresh began (that refresh, the
    repaints it caused, the queue drains in between) sets the gap before the next one:
    `cpu / budget`, at least `min_interval`, and at most `max_interval` unless a refresh costs more
    than a quarter of that (then 4 x its cost). Repaints happen after a refresh returns, so timing
    the refresh alone would miss most of the cost; thread CPU time counts it all. With budget 0.02
    the GUI thread stays near 2% of a core while refreshes are cheap, a view is no older than
    `max_interval` while they cost under a quarter of it, and the thread never passes a fifth of a
    core (a run's first refresh after the user clicked around between runs once waited 27 s:
    `reset()` as a job starts forgets that CPU).
    """

    def __init__(self, min_interval: float, budget: float, max_interval: float = 1.0,
                 wall: Callable[[], float] = time.perf_counter, cpu: Callable[[], float] = time.thread_time):
        self.min_interval = min_interval
        self.max_interval = max_interval
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
        # never longer than max_interval unless a refresh itself is that costly: then 4x its cost, so
        # the GUI thread stays under a fifth of a core whatever the cap
        self.last_gap = max(self.min_interval, min(cost / self.budget, max(self.max_interval, 4 * cost)))
        self.next_at = now + self.last_gap

    def reset(self) -> None:
        """A new job: the next refresh is due now, and the GUI CPU spent before it is not counted."""
        self.next_at = 0.0
        self._cpu0 = None
