"""Cheap checks of the app packaging (packaging/): the spec, the launcher, the icons, the desktop entry.

Building the bundle itself takes minutes: that is packaging/check_bundle.py, run here only
with DFLASH_BUNDLE_TEST=1.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "packaging"
SPEC = PKG / "dflash_playground.spec"
LAUNCHER = PKG / "launch.py"
DESKTOP = PKG / "linux" / "dflash-playground.desktop"
LINUX_ICON = PKG / "linux" / "dflash-playground.png"
ICON_SOURCE = ROOT / "resources" / "icons" / "app-icon.svg"


def _load_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _calls(tree: ast.AST, func_name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == func_name]


def _keywords(call: ast.Call) -> dict[str, ast.AST]:
    return {k.arg: k.value for k in call.keywords}


def test_packaging_is_never_a_python_package():
    # A packaging/__init__.py would shadow the `packaging` library that pip and PyInstaller import.
    assert not (PKG / "__init__.py").exists()
    import packaging
    import packaging.version

    assert Path(packaging.__file__).resolve().parent != PKG.resolve()


def test_spec_is_a_windowed_one_folder_build_with_a_macos_bundle():
    tree = ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))
    (exe,) = _calls(tree, "EXE")
    kw = _keywords(exe)
    assert ast.literal_eval(kw["console"]) is False  # windowed
    assert ast.literal_eval(kw["exclude_binaries"]) is True  # one-folder: binaries go to COLLECT
    assert len(_calls(tree, "COLLECT")) == 1
    (bundle,) = _calls(tree, "BUNDLE")
    kw = _keywords(bundle)
    assert {"name", "icon", "bundle_identifier", "version", "info_plist"} <= kw.keys()
    plist_keys = {ast.literal_eval(k) for k in kw["info_plist"].keys}
    assert {"NSHighResolutionCapable", "LSMinimumSystemVersion", "CFBundleShortVersionString"} <= plist_keys
    # Open With on a trace, never claimed as every .jsonl's default app
    (documents,) = [ast.literal_eval(v) for k, v in zip(kw["info_plist"].keys, kw["info_plist"].values)
                    if ast.literal_eval(k) == "CFBundleDocumentTypes"]
    assert documents == [{"CFBundleTypeName": "DFlash trace", "CFBundleTypeExtensions": ["jsonl"],
                          "CFBundleTypeRole": "Viewer", "LSHandlerRank": "Alternate"}]
    (analysis,) = _calls(tree, "Analysis")
    assert "launch.py" in ast.unparse(analysis.args[0])
    text = SPEC.read_text(encoding="utf-8")
    for needed in ('collect_dynamic_libs("mlx")', "*.metallib", 'collect_submodules("mlx_lm.models")',
                   "libopenblas.so.0", "mlx_cpu.libs", "copy_metadata"):
        assert needed in text, needed


def test_spec_bundle_id_and_version():
    text = SPEC.read_text(encoding="utf-8")
    assert re.search(r'BUNDLE_ID = "dev\.dflash\.playground"', text)
    version = re.search(r'(?m)^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert version  # the spec reads it from pyproject.toml (CFBundleShortVersionString)
    assert "pyproject.toml" in text


def test_launcher_runs_the_cli_and_keeps_the_hf_cache_alone():
    source = LAUNCHER.read_text(encoding="utf-8")
    assert "from app.cli import main" in source
    # Nothing in the launcher or the spec may point the Hugging Face cache into the bundle.
    for path in (LAUNCHER, SPEC):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                assert "environ" not in ast.unparse(node.value), f"{path.name}: sets {ast.unparse(node)}"
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                assert name not in ("os.putenv", "os.environ.update"), f"{path.name}: calls {name}"
                if name == "os.environ.setdefault":
                    assert not ast.unparse(node.args[0]).strip("'\"").startswith(("HF_", "HUGGINGFACE")), path.name
    launcher = _load_script(LAUNCHER, "dflash_launch")
    assert launcher._user_args(["-psn_0_12345", "generate", "--json"]) == ["generate", "--json"]
    assert launcher._user_args([]) == []


def test_desktop_entry_is_valid():
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read(DESKTOP, encoding="utf-8")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application"
    assert entry["Name"] == "DFlash Playground"
    assert entry["Terminal"] == "false"
    # the project's script: `gui` opens the window, with the file a file manager opens with it (%f, maybe none)
    assert entry["Exec"] == "dflash-playground gui %f"
    assert entry["Icon"] == LINUX_ICON.stem
    assert entry["Categories"].endswith(";")
    if shutil.which("desktop-file-validate"):
        proc = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_linux_icon_is_a_256px_png():
    data = LINUX_ICON.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (256, 256)


def test_make_icns_on_a_tiny_image(tmp_path):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is in the `package` extra")
    make_icns = _load_script(PKG / "make_icns.py", "dflash_make_icns")
    source = tmp_path / "tiny.png"
    Image.new("RGBA", (64, 64), (40, 120, 200, 255)).save(source)
    master = make_icns.load_master(source)
    assert master.size == (1024, 1024)
    icns, tool = make_icns.write_icns(master, tmp_path / "app.icns", use_iconutil=False)
    assert tool == "pillow"
    assert icns.read_bytes()[:4] == b"icns"
    with Image.open(icns) as im:
        assert im.format == "ICNS"
        assert (512, 512, 2) in im.info["sizes"]  # the 1024 px retina image
    iconset = make_icns.write_iconset(master, tmp_path / "app.iconset")
    assert sorted(p.name for p in iconset.iterdir()) == sorted(n for n, _ in make_icns.ICONSET)
    png = make_icns.write_png(master, tmp_path / "icon.png", 48)
    with Image.open(png) as im:
        assert im.size == (48, 48)
    not_square = tmp_path / "wide.png"
    Image.new("RGBA", (64, 32)).save(not_square)
    with pytest.raises(SystemExit, match="square"):
        make_icns.load_master(not_square)


def test_icon_source_svg_renders(tmp_path):
    pytest.importorskip("PIL.Image", reason="Pillow is in the `package` extra")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    make_icns = _load_script(PKG / "make_icns.py", "dflash_make_icns")
    master = make_icns.load_master(ICON_SOURCE, size=64)
    assert master.size == (64, 64) and master.mode == "RGBA"
    assert master.getpixel((32, 32))[3] == 255  # the body is opaque...
    assert master.getpixel((0, 0))[3] == 0  # ...the corners transparent


def test_package_extra_and_readme_section():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"(?m)^package\s*=\s*\[(.*)\]", pyproject)
    assert extra and "pyinstaller" in extra.group(1).lower() and "pillow" in extra.group(1).lower()
    assert "## Building the app" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.skipif(os.environ.get("DFLASH_BUNDLE_TEST") != "1",
                    reason="builds the PyInstaller bundle (several minutes); set DFLASH_BUNDLE_TEST=1 to run it")
def test_bundle_builds_and_runs(tmp_path):
    pytest.importorskip("PyInstaller", reason="pip install -e '.[package]'")
    proc = subprocess.run([sys.executable, str(PKG / "check_bundle.py"), "--report", str(tmp_path / "report.json")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
