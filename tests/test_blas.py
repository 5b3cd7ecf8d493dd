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


def test_a_probe_that_times_out_is_not_remembered(tmp_path, monkeypatch):
    """A timeout says the machine was busy, not that the library is bad: the next start checks again."""
    import subprocess

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = tmp_path / "libopenblas.so.0"
    broken.write_bytes(b"\x7fELF not really a library")
    calls = []

    def slow(*args, **kwargs):
        calls.append(args)
        raise subprocess.TimeoutExpired(args[0], kwargs.get("timeout"))

    monkeypatch.setattr(blas.subprocess, "run", slow)
    assert blas._runs_here(broken, "") is None
    assert blas._runs_here(broken, "") is None
    assert len(calls) == 2 and list((tmp_path / "cache").rglob("*.bad")) == []
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert blas._runs_here(broken, "") is False  # a probe that finishes is remembered
    assert len(list((tmp_path / "cache").rglob("*.bad"))) == 1


def test_two_ranks_copying_libgfortran_at_once(tmp_path, monkeypatch):
    """Two ranks of `mlx.launch -n 2` start together: while one renames its copy into place, the other
    copies too. Neither may fail or find half a file, and no temporary file is left behind."""
    import os

    if blas._find("mlx_cpu.libs", "libgfortran-*.so*") is None:
        pytest.skip("mlx[cpu]'s bundled libgfortran is not installed (Linux only)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real_replace, started, other = os.replace, [], []

    def replace(src, dst):
        if str(dst).endswith("libgfortran.so.5") and not started:
            started.append(dst)
            other.append(blas._gfortran_copy())  # the other rank, running between our write and rename
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    mine = blas._gfortran_copy()
    assert other == [mine] and mine.name == "libgfortran.so.5"
    folder = mine.parent
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".")) == []
    source = blas._find("mlx_cpu.libs", "libgfortran-*.so*")
    assert len(mine.read_bytes()) == len(source.read_bytes())
    for dep in source.parent.glob("libquadmath-*"):
        assert (folder / dep.name).read_bytes() == dep.read_bytes()
