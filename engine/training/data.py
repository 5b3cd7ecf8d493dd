"""Training text: plain files, folders of them, or JSONL with a `text` field, as one token stream."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from engine.errors import DFlashError
from engine.tools.textfiles import jsonl_strings, read_text

TEXT_SUFFIXES = {".txt", ".py", ".md", ".rst", ".json", ".c", ".h", ".js", ".ts", ".html", ".css", ".sh", ".toml"}


def _files(spec: str) -> Iterator[Path]:
    path = Path(spec).expanduser()
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.suffix == ".jsonl"))
        if not found:
            raise DFlashError(f"{path}: the folder holds no text files ({', '.join(sorted(TEXT_SUFFIXES))}, .jsonl).")
        yield from found
    elif path.is_file():
        yield path
    else:
        raise DFlashError(f"{path}: no such file or folder for --data.")


def read_texts(specs: list[str]) -> list[str]:
    texts = []
    for spec in specs:
        for path in _files(spec):
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
