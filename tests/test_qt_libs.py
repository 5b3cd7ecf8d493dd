"""On Linux, a missing system library of Qt's xcb plugin is one line and exit 2, never an abort."""

from __future__ import annotations

import sys

import pytest

from app import qt_libs


@pytest.mark.parametrize("soname,package", [
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libdbus-1.so.3", "libdbus-1-3"),
    ("libEGL.so.1", "libegl1"),
])
def test_debian_package_names(soname, package):
    assert qt_libs.debian_package(soname) == package


@pytest.fixture
def plugin_missing_a_library(tmp_path):
    """A copy of Qt's xcb plugin whose list of needed libraries names one that does not exist."""
    plugin = qt_libs.platform_plugin("xcb")
    if plugin is None or not sys.platform.startswith("linux"):
        pytest.skip("Qt's xcb plugin is only shipped on Linux")
    data = plugin.read_bytes()
    needed = b"libxcb-shape.so.0\0"
    assert needed in data
    copy = tmp_path / "libqxcb.so"
    copy.write_bytes(data.replace(needed, b"libxcb-shapX.so.0\0"))
    return copy


def test_missing_library_is_named_with_its_package(plugin_missing_a_library, monkeypatch):
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    problem = qt_libs.xcb_problem(plugin_missing_a_library)
    assert problem is not None and "libxcb-shapX.so.0" in problem and "apt-get install" in problem
    assert "libxcb-shapx0" in problem


def test_gui_command_exits_2_with_one_line(plugin_missing_a_library, monkeypatch, capsys):
    from app.cli import main as cli

    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr(qt_libs, "platform_plugin", lambda name="xcb": plugin_missing_a_library)
    assert cli(["gui"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the window cannot start") and "libxcb-shapX.so.0" in err[0]


def test_no_check_where_qt_will_not_use_xcb(monkeypatch, plugin_missing_a_library):
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert qt_libs.xcb_problem(plugin_missing_a_library) is None
