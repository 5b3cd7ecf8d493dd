"""Where the app finds its resources and keeps its settings and logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from platformdirs import user_config_dir, user_log_dir

APP_NAME = "dflash-playground"


def resources_dir() -> Path:
    """The repo's resources/ folder, or the bundled copy in a frozen app."""
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def config_dir() -> Path:
    """Settings folder; DFLASH_CONFIG_DIR overrides it (tests use temporary folders)."""
    override = os.environ.get("DFLASH_CONFIG_DIR")
    return Path(override) if override else Path(user_config_dir(APP_NAME))


def log_dir() -> Path:
    """Log folder; DFLASH_LOG_DIR overrides it."""
    override = os.environ.get("DFLASH_LOG_DIR")
    return Path(override) if override else Path(user_log_dir(APP_NAME))
