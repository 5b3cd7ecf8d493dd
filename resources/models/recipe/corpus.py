"""The demo target's corpus: the Python standard library's own source code.

Deterministic: files are sorted by their path relative to the stdlib folder.
A fixed list of modules is held out of training and used to measure held-out loss.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

# Held out of training (and of the tokenizer), used only for evaluation.
HELD_OUT = (
    "statistics.py",
    "textwrap.py",
    "fractions.py",
    "heapq.py",
    "bisect.py",
    "colorsys.py",
)

EXCLUDED_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "__pycache__",
}


# A machine whose Python differs from the one the demo models were trained on (a GPU machine
# lent for training, say) sets DEMO_CORPUS_STDLIB to a copy of that Python's standard library and
# DEMO_CORPUS_PYTHON to its version (for the card), so the corpus, and its token ids, stay the same.
STDLIB_ENV, VERSION_ENV = "DEMO_CORPUS_STDLIB", "DEMO_CORPUS_PYTHON"


def stdlib_dir() -> Path:
    return Path(os.environ.get(STDLIB_ENV) or sysconfig.get_paths()["stdlib"])


def python_version() -> str:
    if os.environ.get(STDLIB_ENV):
        if not os.environ.get(VERSION_ENV):
            raise SystemExit(f"{STDLIB_ENV} is set: set {VERSION_ENV} to that standard library's Python version too")
        return os.environ[VERSION_ENV]
    return sys.version.split()[0]


def _is_test_file(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py") or name in {"test.py", "tests.py", "conftest.py"}


def corpus_files(root: Path | None = None) -> list[Path]:
    """All eligible .py files under the stdlib, sorted by relative path (held-out ones included)."""
    root = root or stdlib_dir()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        if _is_test_file(rel.name):
            continue
        if not path.is_file():
            continue
        files.append(rel)
    return [root / rel for rel in sorted(files, key=lambda p: p.as_posix())]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def load_corpus(root: Path | None = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Return (train, held_out): lists of (relative path, text), both sorted."""
    root = root or stdlib_dir()
    train, held = [], []
    for path in corpus_files(root):
        text = _read(path)
        if text is None or not text.strip():
            continue
        rel = path.relative_to(root).as_posix()
        (held if rel in HELD_OUT else train).append((rel, text))
    missing = set(HELD_OUT) - {rel for rel, _ in held}
    if missing:
        raise RuntimeError(f"held-out modules not found in {root}: {sorted(missing)}")
    return train, held


if __name__ == "__main__":
    train, held = load_corpus()
    chars = sum(len(t) for _, t in train)
    print(f"python {python_version()} stdlib {stdlib_dir()}")
    print(f"train files {len(train)} ({chars / 1e6:.1f} M chars); held out {[r for r, _ in held]}")
