"""Settings that persist across launches: one JSON file in the config folder.

A file that is not valid JSON (or not an object) is moved aside and replaced by
defaults; fields of the wrong type fall back to their defaults. Either way the
caller gets a notice to show instead of a crash.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from app.paths import config_dir
from engine import json_text
from engine.errors import DFlashError
from engine.safe_write import write_atomic
from engine.decode.prompts import PROMPT_FORMATS
from engine.decode.settings import (
    AUTO_BY_DEFAULT, DEFAULTS, LOOKUP_BY_DEFAULT, MAX_BLOCK, MAX_DRAFT_CONTEXT, MAX_NUM_DRAFT, MAX_TEMPERATURE,
    MAX_TOKENS_LIMIT, MAX_TREE, MODES, NUM_DRAFT, TREE_BY_DEFAULT,
)
from engine.json_text import is_int, is_number

FILE_NAME = "settings.json"
MAX_RECENT = 8
DEFAULT_RACE_METHODS = ("ar", "dflash", "lookup", "dflash+lookup")  # the Race tab's ticks on a first launch
# 2: auto verify length became the default. A file written before held block_auto = false because
# that was the default, not because its user chose it, so it is read as the new default.
SCHEMA = 2


@dataclass
class AppSettings:
    target: str = ""
    drafter: str = ""
    recent_targets: list = field(default_factory=list)
    recent_drafters: list = field(default_factory=list)
    prompt: Optional[str] = None  # None: never set, so the sample prompt is filled in
    prompt_format: str = "raw"  # "auto", "chat" or "raw"
    thinking: str = "default"  # "default", "on" or "off"
    mode: str = DEFAULTS.mode  # "dflash", "ar" or "both"
    temperature: float = DEFAULTS.sampling.temperature
    top_p: float = DEFAULTS.sampling.top_p
    top_k: int = DEFAULTS.sampling.top_k
    seed: int = DEFAULTS.sampling.seed
    max_tokens: int = DEFAULTS.max_tokens
    block_size: int = 0  # 0: the drafter's own
    block_auto: bool = AUTO_BY_DEFAULT  # --block-size auto: the verify length chosen each round
    lookup: bool = LOOKUP_BY_DEFAULT  # --lookup: rounds verify a copy of the context where the text repeats it
    tree: int = 0  # --tree N: draft nodes a round verifies (0: the chain), where tree_auto is off
    tree_auto: bool = TREE_BY_DEFAULT == "auto"  # --tree auto (off, as on the command line: the chain)
    draft_window: int = DEFAULTS.draft_window  # 0: the drafter's whole context
    draft_sink: int = DEFAULTS.draft_sink
    window_geometry: str = ""  # base64 of QMainWindow.saveGeometry()
    splitters: dict = field(default_factory=dict)  # name -> base64 of QSplitter.saveState()
    center_tab: int = 0
    race_methods: list = field(default_factory=lambda: list(DEFAULT_RACE_METHODS))  # the Race tab's ticks
    race_draft_model: str = ""
    race_num_draft: int = NUM_DRAFT
    schema: int = SCHEMA

    def remember(self, target: str, drafter: Optional[str]) -> None:
        """Put a pair that loaded at the front of the recent lists."""
        for value, recents in ((target, self.recent_targets), (drafter, self.recent_drafters)):
            if value:
                if value in recents:
                    recents.remove(value)
                recents.insert(0, value)
                del recents[MAX_RECENT:]


def settings_path() -> Path:
    return config_dir() / FILE_NAME


def _typed(value: Any, default: Any) -> bool:
    if default is None:  # optional text
        return value is None or isinstance(value, str)
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, float):
        return is_number(value)
    if isinstance(default, int):
        return is_int(value)
    return isinstance(value, type(default))


# What the window's controls can hold; a value outside is reset (Qt would raise on a too-large int).
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, MAX_TEMPERATURE),
    "top_p": (0.01, 1.0),
    "top_k": (0, 1_000_000),
    "seed": (0, 2_147_483_647),
    "max_tokens": (1, MAX_TOKENS_LIMIT),
    "block_size": (0, MAX_BLOCK),
    "tree": (0, MAX_TREE),
    "draft_window": (0, MAX_DRAFT_CONTEXT),
    "draft_sink": (0, MAX_DRAFT_CONTEXT),
    "center_tab": (0, 16),
    "race_num_draft": (1, MAX_NUM_DRAFT),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "prompt_format": tuple(PROMPT_FORMATS),
    "thinking": ("default", "on", "off"),
    "mode": (*MODES, "both"),
}


def _in_range(name: str, value: Any) -> bool:
    if name in RANGES:
        low, high = RANGES[name]
        return value == value and low <= value <= high  # value == value: not NaN
    if name in CHOICES:
        return value in CHOICES[name]
    if isinstance(value, str):
        return len(value) <= 1_000_000 and "\0" not in value
    return True


def load_settings(path: Optional[Path] = None, move_aside: bool = True) -> tuple[AppSettings, Optional[str]]:
    """(settings, notice); the notice says what was reset, or is None. A corrupt file is moved aside
    (never over an earlier one), so the next save does not destroy what it held; with `move_aside`
    False (a window that never saves, as --screenshot's) it is left where it is."""
    path = path or settings_path()
    defaults = AppSettings()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return defaults, None
    except OSError as exc:
        return defaults, f"could not read the settings file {path} ({exc.strerror}); using defaults."
    try:
        data = json_text.loads(raw)  # not UTF-8, not JSON, nested too deeply: all ValueError
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        if not move_aside:
            return defaults, f"the settings file {path} is corrupt; using defaults (the file is left as it is)."
        try:
            aside = _free_name(path.with_name(FILE_NAME + ".corrupt"))
            os.replace(path, aside)
            where = f" (the old file is now {aside})"
        except OSError:
            where = ""
        return defaults, f"the settings file {path} was corrupt and has been reset to defaults{where}."
    if data.get("schema", 1) == 1 and data.get("block_auto") is False:
        data.pop("block_auto")
    data.pop("schema", None)  # what the file was written with; the settings are this version's now
    values, bad = {}, []
    for f in fields(AppSettings):
        if f.name not in data:
            continue
        default = getattr(defaults, f.name)
        value = data[f.name]
        if _typed(value, default) and _in_range(f.name, value):
            values[f.name] = float(value) if isinstance(default, float) else value
        else:
            bad.append(f.name)
    settings = AppSettings(**values)
    settings.recent_targets = [v for v in settings.recent_targets if isinstance(v, str)][:MAX_RECENT]
    settings.recent_drafters = [v for v in settings.recent_drafters if isinstance(v, str)][:MAX_RECENT]
    settings.race_methods = [v for v in settings.race_methods if isinstance(v, str)]  # the tab ignores unknown ones
    notice = f"some settings in {path} were invalid and were reset: {', '.join(bad)}." if bad else None
    return settings, notice


def _free_name(path: Path) -> Path:
    """`path`, or the first of path-2, path-3, ... that holds nothing: a copy kept aside is never
    replaced by a later one."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def save_settings(settings: AppSettings, path: Optional[Path] = None) -> Optional[str]:
    """Write atomically (engine/safe_write.py); returns an error sentence instead of raising."""
    path = path or settings_path()
    try:
        write_atomic(path, json.dumps(asdict(settings), indent=2), "the settings")
    except DFlashError as exc:
        return f"could not save settings: {exc}"
    return None
