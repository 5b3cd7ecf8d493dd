"""The Race tab's table as a CSV file (File > Export race table): every method's figures side by side,
which a trace, one method's run at a time, does not hold."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from engine.errors import DFlashError
from app.files import write_checked


def race_rows(view) -> list[list[str]]:
    """The table as it reads: its header, then one row per method (cell texts; '' where empty)."""
    table = view.table
    header = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    rows = [[(table.item(r, c).text() if table.item(r, c) is not None else "") for c in range(table.columnCount())]
            for r in range(table.rowCount())]
    return [header] + rows


def export_race_table(window, path: str | Path) -> bool:
    """Write the race table to `path` (checked first, written atomically); False, with the reason shown,
    when there is no race or the file cannot be written."""
    rows = race_rows(window.race_view)
    if len(rows) < 2 or window.controller.job_mode == "race" and window.busy:
        window.show_error("Nothing to export", "run a race (the Race tab) and let it finish first.")
        return False
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(rows)
    try:
        write_checked(Path(path), buffer.getvalue(), "the race table", (window.controller.replaying,))
    except DFlashError as exc:
        window.show_error("Could not export the race table", str(exc))
        return False
    window.statusBar().showMessage(f"saved the race table ({len(rows) - 1} methods) to {path}")
    return True
