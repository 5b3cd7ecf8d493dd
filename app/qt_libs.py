"""Before Qt starts on Linux: are the system libraries of its xcb platform plugin there?

Without them Qt aborts the process (SIGABRT, a core dump) and its message names the wrong
library, so a user who double-clicks never sees the window and cannot tell why. `ldd` on the
plugin lists what the dynamic loader cannot find; we name those libraries and the Debian/Ubuntu
packages that install them, in one line, before any Qt code runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)


def qt_dir() -> Optional[Path]:
    try:
        import PySide6
    except ImportError:
        return None
    folder = Path(PySide6.__file__).resolve().parent / "Qt"
    return folder if folder.is_dir() else None


def platform_plugin(name: str = "xcb") -> Optional[Path]:
    folder = qt_dir()
    plugin = folder / "plugins" / "platforms" / f"libq{name}.so" if folder else None
    return plugin if plugin is not None and plugin.is_file() else None


def missing_libraries(plugin: Path) -> list[str]:
    """Shared libraries the plugin needs that the loader cannot find (Qt's own found in Qt/lib)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    folder = qt_dir()
    env = dict(os.environ)
    if folder is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(folder / "lib"), env.get("LD_LIBRARY_PATH")]))
    try:
        out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=30, env=env).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(set(NOT_FOUND.findall(out)))


def debian_package(soname: str) -> str:
    """libxcb-icccm.so.4 -> libxcb-icccm4; libxkbcommon-x11.so.0 -> libxkbcommon-x11-0 (Debian's rule:
    a dash before the version when the name ends in a digit)."""
    base, _, version = soname.partition(".so.")
    version = version.split(".")[0]
    base = base.lower()
    return f"{base}-{version}" if base[-1:].isdigit() else f"{base}{version}"


def uses_xcb() -> bool:
    """Whether Qt will pick its xcb (X11) plugin here."""
    if not sys.platform.startswith("linux"):
        return False
    chosen = os.environ.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(";")[0].split(":")[0] == "xcb"
    return not (os.environ.get("WAYLAND_DISPLAY") and os.environ.get("XDG_SESSION_TYPE") == "wayland")


def xcb_problem(plugin: Optional[Path] = None) -> Optional[str]:
    """One sentence naming what is missing and how to install it, or None when Qt can start."""
    if not uses_xcb():
        return None
    plugin = plugin or platform_plugin("xcb")
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    packages = " ".join(debian_package(m) for m in missing)
    return (f"the window cannot start: Qt's X11 (xcb) plugin needs system libraries that are not installed: "
            f"{', '.join(missing)}. On Debian/Ubuntu: sudo apt-get install {packages} "
            "(without a desktop, `dflash-playground demo` runs in the terminal).")
