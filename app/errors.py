"""Turn whatever the worker caught into the one sentence the user sees."""

from __future__ import annotations

from engine.errors import DFlashError

OUT_OF_MEMORY = (
    "out of memory: MLX could not allocate memory for this run; try fewer max tokens, a shorter prompt, "
    "a smaller (or quantized) model, or close other applications."
)

_OOM_MARKERS = ("allocat", "out of memory", "outofmemory", "insufficient memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """MLX reports allocation failures as RuntimeError ("[malloc] Unable to allocate ...")."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MARKERS)


def user_message(exc: BaseException) -> str:
    """The engine's own sentence for DFlashError; a clear line for out-of-memory; else type and text."""
    if isinstance(exc, DFlashError):
        return str(exc)
    if is_out_of_memory(exc):
        return OUT_OF_MEMORY
    from engine.runtime.temp_dir import explain

    known = explain(exc)  # the user's environment (a TEMP that names no folder), not our bug
    if known is not None:
        return known
    return f"unexpected {type(exc).__name__}: {exc} (the traceback is in the log)."
