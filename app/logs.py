"""File logging for the window: tracebacks go here, one-sentence messages go to the user."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Optional

from app.paths import log_dir

_HANDLER: Optional[logging.Handler] = None


def setup_logging() -> Optional[Path]:
    """Log to <log dir>/app.log (rotated); returns the file, or None when it cannot be written."""
    global _HANDLER
    path = log_dir() / "app.log"
    if _HANDLER is not None:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(path, maxBytes=2_000_000, backupCount=3, encoding="utf-8")
    except OSError:
        return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
    logger = logging.getLogger("app")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _HANDLER = handler
    return path
