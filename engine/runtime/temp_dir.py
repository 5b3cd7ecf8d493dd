"""MLX's CPU backend compiles kernels into the temporary folder C++ names (std::filesystem::
temp_directory_path: TMPDIR, TMP, TEMP or TEMPDIR, the first one set, else /tmp). When that variable
names no folder, every run fails with "filesystem error: temp_directory_path" from deep inside MLX;
this turns that into a sentence that says which variable to fix."""

from __future__ import annotations

import os
from typing import Optional

VARIABLES = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")  # libstdc++'s order


def temp_dir_problem() -> Optional[str]:
    """The sentence for a temporary-folder variable that names no folder, or None."""
    for name in VARIABLES:
        value = os.environ.get(name)
        if value:
            if os.path.isdir(value):
                return None
            return (f"the temporary folder {name}={value} does not exist, and MLX compiles its kernels there; "
                    f"create it, or point {name} at an existing folder (or unset it).")
    return None


def explain(exc: BaseException) -> Optional[str]:
    """temp_dir_problem() for MLX's filesystem error about the temporary folder, else None."""
    if isinstance(exc, RuntimeError) and "temp_directory_path" in str(exc):
        return temp_dir_problem() or f"MLX could not find a temporary folder ({exc})."
    return None
