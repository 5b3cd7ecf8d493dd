#!/usr/bin/env python3
"""Make the app icons from one source image.

    python packaging/make_icns.py resources/icons/app-icon.svg --icns build/icons/app.icns
    python packaging/make_icns.py resources/icons/app-icon.svg --png packaging/linux/dflash-playground.png --png-size 256

The source is an SVG (rendered with Qt's SVG module, which PySide6 brings) or a square
raster image (PNG...) of at least 512 px, ideally 1024 px.

The .icns is made with Apple's `iconutil` on macOS (from a standard .iconset folder:
16..512 px at 1x and 2x) and with Pillow's ICNS writer elsewhere (or with --pillow).
Pillow is in the project's `package` extra.

This file is a script, not a module of a package: `packaging/` must never become a Python
package (it would shadow the `packaging` library that pip and PyInstaller import).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MASTER_SIZE = 1024
# iconutil's .iconset names: (file name, pixel size).
ICONSET = [
    ("icon_16x16.png", 16), ("icon_16x16@2x.png", 32),
    ("icon_32x32.png", 32), ("icon_32x32@2x.png", 64),
    ("icon_128x128.png", 128), ("icon_128x128@2x.png", 256),
    ("icon_256x256.png", 256), ("icon_256x256@2x.png", 512),
    ("icon_512x512.png", 512), ("icon_512x512@2x.png", 1024),
]
# The sizes Pillow's ICNS writer stores.
PILLOW_ICNS_SIZES = (32, 64, 128, 256, 512, 1024)


def _render_svg(path: Path, size: int):
    """Rasterise an SVG to a size x size RGBA Pillow image with QtSvg."""
    from PIL import Image

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication(["make_icns"])  # noqa: F841  (kept alive while painting)
    renderer = QSvgRenderer(str(path))
    if not renderer.isValid():
        raise SystemExit(f"error: {path}: not a valid SVG file.")
    image = QImage(size, size, QImage.Format.Format_RGBA8888)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    data = bytes(image.constBits())
    return Image.frombuffer("RGBA", (size, size), data, "raw", "RGBA", image.bytesPerLine(), 1).copy()


def load_master(source: str | Path, size: int = MASTER_SIZE):
    """The source image as a square RGBA image of size x size pixels."""
    from PIL import Image

    source = Path(source)
    if not source.is_file():
        raise SystemExit(f"error: {source}: no such file.")
    if source.suffix.lower() == ".svg":
        return _render_svg(source, size)
    image = Image.open(source)
    image.load()
    if image.width != image.height:
        raise SystemExit(f"error: {source}: the icon must be square, not {image.width}x{image.height}.")
    image = image.convert("RGBA")
    if image.width != size:
        image = image.resize((size, size), Image.Resampling.LANCZOS)
    return image


def _scaled(master, size: int):
    from PIL import Image

    return master if master.width == size else master.resize((size, size), Image.Resampling.LANCZOS)


def write_png(master, out: str | Path, size: int) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _scaled(master, size).save(out, format="PNG", optimize=True)
    return out


def write_iconset(master, folder: str | Path) -> Path:
    """A standard macOS .iconset folder (what `iconutil -c icns` takes)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in ICONSET:
        _scaled(master, size).save(folder / name, format="PNG")
    return folder


def write_icns(master, out: str | Path, use_iconutil: bool | None = None) -> tuple[Path, str]:
    """Write an .icns; return (path, tool used)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if use_iconutil is None:
        use_iconutil = sys.platform == "darwin" and shutil.which("iconutil") is not None
    if use_iconutil:
        with tempfile.TemporaryDirectory() as tmp:
            iconset = write_iconset(master, Path(tmp) / "app.iconset")
            subprocess.run(["iconutil", "-c", "icns", "-o", str(out), str(iconset)], check=True)
        return out, "iconutil"
    extra = [_scaled(master, s) for s in PILLOW_ICNS_SIZES if s != master.width]
    _scaled(master, MASTER_SIZE).save(out, format="ICNS", append_images=extra)
    return out, "pillow"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make .icns / .png app icons from one source image.")
    parser.add_argument("source", help="SVG, or a square PNG of at least 512 px")
    parser.add_argument("--icns", help="write a macOS .icns here")
    parser.add_argument("--png", help="write a PNG here (e.g. the Linux desktop icon)")
    parser.add_argument("--png-size", type=int, default=256, help="pixel size of --png (default 256)")
    parser.add_argument("--pillow", action="store_true", help="use Pillow even where iconutil exists")
    args = parser.parse_args(argv)
    if not args.icns and not args.png:
        parser.error("nothing to do: give --icns and/or --png.")
    master = load_master(args.source)
    if args.icns:
        path, tool = write_icns(master, args.icns, use_iconutil=False if args.pillow else None)
        print(f"wrote {path} ({tool})")
    if args.png:
        print(f"wrote {write_png(master, args.png, args.png_size)} ({args.png_size} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
