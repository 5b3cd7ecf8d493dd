"""The OpenBLAS preload checks, in a child process, that the library runs on this CPU."""

from __future__ import annotations

import pytest

from engine.runtime import blas


def test_a_library_that_cannot_run_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = tmp_path / "libopenblas.so.0"
    broken.write_bytes(b"\x7fELF not really a library")
    assert blas._runs_here(broken, "") is False
    stamps = list((tmp_path / "cache").rglob("*.bad"))
    assert len(stamps) == 1
    assert blas._runs_here(broken, "") is False  # the verdict is remembered, not probed again
    assert list((tmp_path / "cache").rglob("*.ok")) == []


def test_the_installed_library_runs_here(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lib = blas._find("cmeel.prefix/lib", "libopenblas.so.0")
    if lib is None:
        pytest.skip("cmeel-openblas is not installed (it is only a dependency on Linux)")
    assert blas._runs_here(lib, blas._load_gfortran()) is True
    assert blas.status.startswith("openblas"), blas.status
