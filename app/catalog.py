"""Which models the pickers offer: the demo pair, recent models, and the Hugging Face cache.

File-only and Qt-free; the HF cache scan can take a while on a big cache, so the
window runs `scan_hf_cache` off the GUI thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from engine import json_text
from engine.models.demo import demo_pairs
from engine.models.checkpoint import model_name

TARGET, DRAFTER = "target", "drafter"


@dataclass(frozen=True)
class ModelEntry:
    value: str  # what load_pair gets: a folder or a Hugging Face id
    label: str  # what the picker shows
    role: str  # TARGET or DRAFTER
    source: str  # "demo", "recent", "hf-cache" or "folder"


def folder_role(folder: str | Path) -> Optional[str]:
    """DRAFTER for a DFlash checkpoint, TARGET for another model folder, None when no config.json."""
    try:
        config = json_text.loads((Path(folder) / "config.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    archs = config.get("architectures") or []
    if "dflash_config" in config or any("dflash" in str(a).lower() for a in archs):
        return DRAFTER
    return TARGET


def demo_entries() -> list[ModelEntry]:
    entries, seen = [], set()
    for target, drafter in demo_pairs():  # pairs may share a target (v1 and DFlash2 drafters): list it once
        for folder, role in ((target, TARGET), (drafter, DRAFTER)):
            if folder not in seen:
                seen.add(folder)
                entries.append(ModelEntry(str(folder), f"{folder.name} (demo)", role, "demo"))
    return entries


def hf_cache_dir() -> Path:
    override = os.environ.get("HF_HUB_CACHE")
    if override:
        return Path(override)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def scan_hf_cache(cache_dir: Optional[Path] = None) -> list[ModelEntry]:
    """Model repos in the HF cache with a config.json, classified as targets or drafters."""
    from huggingface_hub import scan_cache_dir

    cache_dir = cache_dir or hf_cache_dir()
    if not cache_dir.is_dir():
        return []
    try:
        info = scan_cache_dir(cache_dir)
    except Exception:  # CacheNotFound, CorruptedCacheException, permissions: no cached models then
        return []
    entries = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        main = [rev for rev in repo.revisions if "main" in rev.refs]
        rev = main[0] if main else max(repo.revisions, key=lambda r: r.last_modified)
        role = folder_role(rev.snapshot_path)
        if role is not None:
            entries.append(ModelEntry(str(rev.snapshot_path), f"{repo.repo_id} (HF cache)", role, "hf-cache"))
    return entries


def cache_label(value: str) -> Optional[str]:
    """"org/name (HF cache)" for a folder that is a snapshot in a Hugging Face cache
    (.../models--org--name/snapshots/<revision>), else None: a recent model loaded from the cache keeps
    the name the cache listing gave it instead of a 100-character path."""
    name = model_name(Path(value))
    return f"{name} (HF cache)" if name != Path(value).name else None


def recent_entries(values: list[str], role: str) -> list[ModelEntry]:
    return [ModelEntry(v, cache_label(v) or v, role, "recent") for v in values]


def merge_entries(*groups: list[ModelEntry]) -> list[ModelEntry]:
    """First occurrence of each (role, value) wins, in group order."""
    seen, out = set(), []
    for group in groups:
        for e in group:
            key = (e.role, os.path.normpath(e.value))
            if key not in seen:
                seen.add(key)
                out.append(e)
    return out


def drafter_verdict(target: str, drafter: str) -> tuple[Optional[bool], str]:
    """(fits, sentence) for a drafter against a target, from files only (no download): fits is None
    where it loads but the doctor warns (trained for other target weights, say)."""
    from engine.models.doctor import check_pair

    try:
        report = check_pair(target, drafter, download=False, kernels=False)
    except Exception as exc:  # noqa: BLE001 - one odd folder must not stop the list
        return False, f"could not check it ({type(exc).__name__}: {exc})"
    if not report.ok:
        return False, report.problems[0]
    if report.warnings:
        return None, f"loads, but {report.warnings[0]}"
    return True, "matches this target"
