"""Writing files without losing what the user had.

Every file the project writes is checked before any byte is written (not a folder, not one of
the same command's inputs, a folder we can create), then written to a temporary name in the
same folder and renamed into place: a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import fnmatch
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional

from engine.errors import DFlashError


def same_path(a: Path, b: Path) -> bool:
    """One file or folder, also where the names differ only in case on a case-insensitive disk
    (macOS' default) or reach it through a link."""
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# The files a model folder holds (weights, configs, tokenizer): ours, the user's or a Hugging Face
# snapshot's. Anything else there (a trace the user saved beside a drafter) may be replaced.
MODEL_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "generation_config.json", "tokenizer*",
               "special_tokens_map.json", "added_tokens.json", "chat_template*", "vocab.*", "merges.txt", "*.model",
               "*.tiktoken", "preprocessor_config.json", "train_drafter.json")


def model_folder(folder: Path) -> bool:
    """Whether a folder holds a model (a config.json beside safetensors weights)."""
    try:
        return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    except OSError:
        return False


def model_file(path: Path) -> bool:
    """Whether `path` is one of a model's own files, where it is named (a Hugging Face snapshot's files
    are links into its blobs/ folder, which holds no config.json: the link's folder is the model's)."""
    return any(fnmatch.fnmatch(path.name, pattern) for pattern in MODEL_FILES) and model_folder(path.parent)


def hf_snapshot_of(path: Path) -> Optional[Path]:
    """The Hugging Face cache folder `path` lies in (.../models--org--name/snapshots/<revision>, or the
    repo's blobs/ its snapshot files link to), if any."""
    parts = path.absolute().parts
    for i in range(len(parts) - 2):
        if parts[i].startswith("models--") and parts[i + 1] == "snapshots" and i + 3 < len(parts):
            return Path(*parts[: i + 3])
        if parts[i].startswith("models--") and parts[i + 1] == "blobs":
            return Path(*parts[: i + 2])
    return None


def check_output(path: str | Path, what: str, inputs: Iterable[Optional[str | Path]] = ()) -> Path:
    """The path, once it is known to be writable as `what` without touching any of `inputs`, a
    model's files, or anything that is not a plain file. A link is written through (the file it
    points at is replaced, the link kept): the path returned is where the bytes go."""
    path = Path(path)
    if path.is_dir():
        raise DFlashError(f"{path}: is a folder; give a file name for {what}.")
    if path.exists() and not path.is_file():  # a device (/dev/null), a pipe: a rename would replace it
        raise DFlashError(f"{path}: is not a plain file (a device or a pipe); give a file name for {what}.")
    for named in (path, path.resolve()):  # as given (a snapshot's link) and where the bytes would go
        if named.exists() and model_file(named):
            raise DFlashError(f"{path}: is one of the files of the model in {named.parent}; write {what} to "
                              "another file.")
    as_given = path
    if path.is_symlink():
        path = path.resolve()
    # as given, through a linked folder, and where a snapshot file's link points (blobs/)
    cache = next(filter(None, (hf_snapshot_of(p) for p in (as_given, as_given.parent.resolve() / as_given.name,
                                                            path))), None)
    if cache is not None:
        raise DFlashError(f"{as_given}: is inside {cache}, in the Hugging Face cache, which only the cache may "
                          f"change; write {what} elsewhere.")
    for given in inputs:
        if given is not None and (same_path(path, Path(given)) or path.resolve() == Path(given).resolve()):
            raise DFlashError(f"{path}: is also what is being read (the open trace, or a command's input); "
                              f"write {what} to another file.")
    parent = path.parent
    existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise DFlashError(f"{path}: {existing} is a file, not a folder; cannot write {what} there.")
    if existing is not None and not os.access(existing, os.W_OK):
        raise DFlashError(f"{path}: no permission to write in {existing}.")
    return path


def temporary_name(path: Path, suffix: str = ".tmp") -> Path:
    """A name beside `path` that no other writer uses (the ranks of one job start together)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}{suffix}")


@contextmanager
def atomic_path(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """The one way files are written in place: the block writes the temporary name this yields (numpy
    and MLX take a name, and insist on their `suffix`), which is renamed over `path` when the block
    ends, and removed when it raises. A crash leaves either the old file or the new one."""
    tmp = temporary_name(path, suffix)
    try:
        yield tmp
        replace_with(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # no temporary file was made (its folder is a file, say)
            pass
        raise


def replace_with(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    try:  # make the rename itself durable where the platform allows it
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_atomic(path: str | Path, data: str | bytes, what: str = "the file") -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise DFlashError(f"{path}: cannot write {what} ({exc.strerror or exc}).") from None
