"""Load an optimised BLAS before MLX on Linux.

The ``mlx[cpu]`` wheel for Linux links a reference BLAS. Loading OpenBLAS (from
the ``cmeel-openblas`` wheel) into the global symbol scope before ``mlx.core``
is imported makes MLX resolve its CBLAS symbols to OpenBLAS, which is what makes
a 16-token verify cheap enough for speculative decoding to win on a CPU.

cmeel's OpenBLAS needs ``libgfortran.so.5``. When the system has none, we use
the libgfortran that the mlx[cpu] wheel already ships (renamed by auditwheel):
a copy in the user cache whose SONAME is rewritten to ``libgfortran.so.5``,
so the dynamic loader accepts it for OpenBLAS's dependency.

OpenBLAS runs single-threaded unless ``OPENBLAS_NUM_THREADS`` is set: its spinning
worker threads fight MLX's own CPU thread (and anything else running), which made
decoding several times slower here with two threads on two cores.

Set ``DFLASH_NO_OPENBLAS=1`` to turn all of this off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from engine.safe_write import atomic_path

DISABLE_ENV = "DFLASH_NO_OPENBLAS"
GFORTRAN_SONAME = b"libgfortran.so.5"

# What happened, for `doctor` and trace headers.
status: str = "not attempted"


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _find(relative: str, pattern: str) -> Path | None:
    for site in _site_dirs():
        folder = site / relative
        if folder.is_dir():
            found = sorted(folder.glob(pattern))
            if found:
                return found[0]
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dflash-playground" / "blas"


def _gfortran_copy() -> Path | None:
    """A copy of mlx[cpu]'s bundled libgfortran whose SONAME is libgfortran.so.5."""
    source = _find("mlx_cpu.libs", "libgfortran-*.so*")
    if source is None:
        return None
    target_dir = _cache_dir() / source.stem
    target = target_dir / "libgfortran.so.5"
    if target.exists():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    old = source.name.encode() + b"\0"
    if data.count(old) < 1 or len(GFORTRAN_SONAME) + 1 > len(old):
        return None
    data = data.replace(old, GFORTRAN_SONAME + b"\0" * (len(old) - len(GFORTRAN_SONAME)))
    # libgfortran finds its own bundled dependencies (libquadmath) through RPATH $ORIGIN. They go
    # first: the copy's name appearing is what says the folder is complete.
    for dep in source.parent.glob("libquadmath-*"):
        _write_whole(target_dir / dep.name, dep.read_bytes())
    _write_whole(target, data)
    return target


def _write_whole(path: Path, data: bytes) -> None:
    """Write `data` under a temporary name no other process or thread uses, then rename it into place.

    The ranks of an `mlx.launch -n 2` job start together and may copy the same library at once: with
    one shared temporary name, one rank's rename took the file the other was writing or renaming,
    and a rank could load a library the other was still writing.
    """
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755)


def _load_gfortran() -> str:
    """Load libgfortran.so.5 globally; the path of our copy when the system has none, else ""."""
    if ctypes.util.find_library("gfortran"):  # the system's own, which a child process finds too
        try:
            ctypes.CDLL("libgfortran.so.5", mode=os.RTLD_GLOBAL)
            return ""
        except OSError:
            pass
    copy = _gfortran_copy()
    if copy is not None:
        ctypes.CDLL(str(copy), mode=os.RTLD_GLOBAL)
        return str(copy)
    return ""


# A child process loads the library and runs one small sgemm: exit 0 means this CPU can run it.
_PROBE = """
import ctypes, os, sys
if sys.argv[2]:
    ctypes.CDLL(sys.argv[2], mode=os.RTLD_GLOBAL)
blas = ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)
n = 64
a = (ctypes.c_float * (n * n))(*([1.0] * (n * n)))
c = (ctypes.c_float * (n * n))()
blas.cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1.0), a, n, a, n, ctypes.c_float(0.0), c, n)
sys.exit(0 if abs(c[0] - n) < 1e-3 else 3)
"""


PROBE_TIMEOUT_S = 60


def _runs_here(lib: Path, gfortran: str) -> Optional[bool]:
    """Whether this OpenBLAS runs on this CPU, checked once per library file in a child process;
    None when the check gave no answer (it timed out, or could not start), which is not remembered:
    a machine busy at one start says nothing about the library, so the next start checks again.

    Some builds pick kernels the CPU cannot execute (cmeel-openblas 0.3.31 dies with SIGILL on
    x86_64 machines without AVX-512), and an illegal instruction kills the process outright, so
    the check cannot run in this one. A frozen app has no Python to start: it trusts its bundle.
    """
    if getattr(sys, "frozen", False):
        return True
    st = lib.stat()
    key = f"{lib.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()
    stamp = _cache_dir() / "checked" / hashlib.sha256(key).hexdigest()[:24]
    for verdict in (True, False):
        if stamp.with_suffix(f".{'ok' if verdict else 'bad'}").exists():
            return verdict
    try:
        ok = subprocess.run([sys.executable, "-c", _PROBE, str(lib), gfortran], capture_output=True,
                            timeout=PROBE_TIMEOUT_S, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.with_suffix(".ok" if ok else ".bad").touch()
    except OSError:
        pass
    return ok


def preload() -> str:
    """Load OpenBLAS globally, once, before MLX; return what was done."""
    global status
    if not sys.platform.startswith("linux"):
        status = "not needed (not Linux)"
    elif "mlx.core" in sys.modules:
        status = "not loaded: mlx was imported before the engine"
    elif os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        status = f"off ({DISABLE_ENV} set)"
    else:
        lib = _find("cmeel.prefix/lib", "libopenblas.so.0")
        if lib is None:
            status = "unavailable: cmeel-openblas is not installed"
        else:
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read by OpenBLAS when it loads
            try:
                gfortran = _load_gfortran()
                runs = _runs_here(lib, gfortran)
                if runs:
                    ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)
                    status = f"openblas, {os.environ['OPENBLAS_NUM_THREADS']} thread(s) ({lib})"
                elif runs is None:
                    status = (f"unavailable: the check that {lib} runs on this CPU gave no answer in "
                              f"{PROBE_TIMEOUT_S} s (reference BLAS in use; checked again at the next start)")
                else:
                    status = f"unavailable: {lib} does not run on this CPU (reference BLAS in use)"
            except OSError as exc:
                status = f"unavailable: {exc}"
    return status
