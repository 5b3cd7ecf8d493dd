"""What the model pickers list: the demo pairs, recent models, and the Hugging Face cache.

The cache is scanned on a plain thread (it can be large or on a slow disk); the result
comes back to the GUI thread through a queued signal.
"""

from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QObject, Signal

from app import catalog
from app.catalog import DRAFTER, TARGET
from app.models_panel import ModelsPanel
from app.settings import AppSettings

log = logging.getLogger("app.model_lists")


class ModelLists(QObject):
    scanned = Signal(object)  # list of catalog.ModelEntry, from the scan thread

    def __init__(self, panel: ModelsPanel, settings: AppSettings, parent: QObject):
        super().__init__(parent)
        self.panel = panel
        self.settings = settings
        self.hf_entries: list[catalog.ModelEntry] = []
        self.scan_done = False
        self.scanned.connect(self._on_scanned)

    def refresh(self) -> None:
        s = self.settings
        demo = catalog.demo_entries()
        groups = {role: catalog.merge_entries(
            [e for e in demo if e.role == role],
            catalog.recent_entries(s.recent_targets if role == TARGET else s.recent_drafters, role),
            [e for e in self.hf_entries if e.role == role],
        ) for role in (TARGET, DRAFTER)}
        self.panel.set_entries(groups[TARGET], groups[DRAFTER])

    def start_scan(self) -> None:
        def scan() -> None:
            try:
                entries = catalog.scan_hf_cache()
            except Exception:  # noqa: BLE001 - a broken cache just lists nothing
                log.exception("scanning the Hugging Face cache failed")
                entries = []
            try:
                self.scanned.emit(entries)
            except RuntimeError:  # the window is gone
                pass

        self._thread = threading.Thread(target=scan, name="hf-cache-scan", daemon=True)
        self._thread.start()

    def _on_scanned(self, entries: list) -> None:
        self.hf_entries = entries
        self.refresh()
        self.scan_done = True
