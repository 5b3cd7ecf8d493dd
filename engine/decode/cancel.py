"""Stopping a run from another thread (the window's Stop, a closing window, Ctrl-C)."""

from __future__ import annotations

import threading


class CancelToken:
    """Set from any thread; generation checks it once per round and then summarises."""

    def __init__(self):
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until cancelled or timeout seconds pass; True when cancelled."""
        return self._event.wait(timeout)
