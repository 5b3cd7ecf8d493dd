"""The house rules: dependencies point one way (kernels <- engine <- app), no import cycles,
no module over ~400 lines. Read from the source with `ast`, lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernels", "engine", "app")
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that `path` imports anywhere in its body (the longest known prefix of each name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for name in names:
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                if ".".join(parts[:k]) in modules:
                    found.add(".".join(parts[:k]))
                    break
            if parts[0] in ("app", "tests", "fixtures") and not any(n.startswith(parts[0]) for n in found):
                found.add(parts[0])
    return found


def test_dependencies_point_one_way():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        layer = name.split(".")[0]
        for dep in _imports(path, modules):
            top = dep.split(".")[0]
            if layer == "kernels" and top != "kernels":
                wrong.append(f"{name} imports {dep}")
            if layer == "engine" and (top in ("app", "tests", "fixtures") or dep == "engine.training.cli"
                                      and not name.startswith("engine.training")):
                wrong.append(f"{name} imports {dep}")
    assert not wrong, wrong


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # A package's __init__ is imported with each of its modules; that edge is not a cycle.
    graph = {n: {d for d in deps if not n.startswith(d + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_no_module_is_a_room_of_its_own():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_engine_never_imports_qt():
    for name, path in _modules().items():
        if name.split(".")[0] in ("engine", "kernels"):
            assert "PySide6" not in path.read_text() and "pyqtgraph" not in path.read_text(), name


def test_every_package_folder_is_a_package():
    """setuptools' find and PyInstaller's collect_submodules only see folders with __init__.py."""
    missing = [str(d.relative_to(ROOT)) for pkg in PACKAGES for d in [ROOT / pkg, *(ROOT / pkg).rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert not missing, missing


def test_the_round_loop_probes_no_capability():
    """The round loop calls its proposer's methods (engine/decode/proposer_base.py's defaults): a
    `hasattr` probe would bring back a contract that lives only in docstrings."""
    probes = [f"{name}:{i}" for name, path in _modules().items() if name.startswith("engine.decode")
              for i, line in enumerate(path.read_text().splitlines(), 1) if "hasattr(" in line]
    assert not probes, probes


def test_no_test_module_imports_another():
    """Shared fixtures live in conftest.py (pytest finds them unasked), shared helpers in helper modules
    (tests/helpers.py, tests/distribution.py, tests/app/window_helpers.py, tests/fixtures/): a test
    module imported by another runs its module-level code twice and ties the two together."""
    tests = ROOT / "tests"
    test_modules = {p.stem for p in tests.rglob("test_*.py")} | {"conftest"}
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            offenders += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] in test_modules]
    assert not offenders, offenders
