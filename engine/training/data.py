"""Training text: plain files, folders of them, or JSONL with a `text` field, as one token stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import DFlashError
from engine.tools.textfiles import jsonl_strings, read_text

TEXT_SUFFIXES = {".txt", ".py", ".md", ".rst", ".json", ".c", ".h", ".js", ".ts", ".html", ".css", ".sh", ".toml"}


# Folders a --data folder's walk leaves out: hidden ones (.git, .venv), installed packages and caches.
# Someone's project folder holds them, and they are not the text its drafter should learn.
SKIPPED_FOLDERS = {"node_modules", "__pycache__", "site-packages"}


def _inside(path: Path, folders: tuple[Path, ...]) -> bool:
    resolved = path.resolve()
    return any(resolved == f or f in resolved.parents for f in folders)


def data_files(specs: list[str], exclude: tuple[Path, ...] = ()) -> tuple[list[Path], int]:
    """(the files --data names, how many files its folders held that were left out): hidden and
    SKIPPED_FOLDERS folders, and anything inside `exclude` (the run's --out: its checkpoint would
    otherwise become training text, and a resumed run find its text changed)."""
    exclude = tuple(Path(e).resolve() for e in exclude)
    files, skipped = [], 0
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*")
                           if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.suffix == ".jsonl"))
            kept = [p for p in found if not _inside(p, exclude) and not any(
                part.startswith(".") or part in SKIPPED_FOLDERS for part in p.relative_to(path).parts[:-1])]
            skipped += len(found) - len(kept)
            if not kept:
                raise DFlashError(f"{path}: the folder holds no text files ({', '.join(sorted(TEXT_SUFFIXES))}, .jsonl)"
                                  + (f" outside hidden folders, {', '.join(sorted(SKIPPED_FOLDERS))} and --out."
                                     if found else "."))
            files += kept
        elif path.is_file():
            files.append(path)
        else:
            raise DFlashError(f"{path}: no such file or folder for --data.")
    return files, skipped


def read_texts(specs: list[str], exclude: tuple[Path, ...] = ()) -> list[str]:
    return texts_of(data_files(specs, exclude)[0])


def texts_of(files: list[Path]) -> list[str]:
    """The texts of data_files()' files (a JSONL file's 'text' fields, each one)."""
    texts = []
    for path in files:
        if path.suffix == ".jsonl":
            texts += jsonl_strings(path, "text", "the training data")
        else:
            texts.append(read_text(path, "the training data"))
    if not any(t.strip() for t in texts):
        raise DFlashError("the training data holds no text.")
    return texts


def token_stream(tokenizer, texts: list[str], eos_id: int) -> np.ndarray:
    """All texts tokenized and joined by EOS, as int32. transformers' warning that a text is longer
    than the model's context is held back: the stream is cut into --seq-len windows, never run whole."""
    from transformers.utils import logging as hf_logging

    ids: list[int] = []
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        for text in texts:
            ids.extend(tokenizer.encode(text, add_special_tokens=False))
            ids.append(eos_id)
    finally:
        hf_logging.set_verbosity(verbosity)
    return np.asarray(ids, dtype=np.int32)
