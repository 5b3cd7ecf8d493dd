#!/usr/bin/env python3
"""Build the one-folder bundle from packaging/dflash_playground.spec and check it runs.

    . .venv/bin/activate && pip install -e ".[package]"
    python packaging/check_bundle.py                      # build, then check
    python packaging/check_bundle.py --no-build           # check dist/dflash-playground as it is
    python packaging/check_bundle.py --target T --drafter D   # also run on this pair (folders)

Checks, each on the bundled program only (clean environment, no venv on PATH, run from a
scratch folder, HOME pointed at a scratch folder):

- the bundle holds libmlx, the OpenBLAS / libgfortran files engine/runtime/blas.py looks for,
  the demo pair, icons and styles, all mlx-lm model modules, tokenizer libraries' metadata;
- `--version` prints the project version;
- `doctor` on the bundled demo pair says ready;
- `generate --prompt 'def fibonacci(n):' --raw --max-tokens 32 --json` on the bundled
  demo pair works, its trace header says OpenBLAS ran, and its tokens equal those of the
  same command run from the source tree;
- Hugging Face ids resolve through the user's cache, not the bundle: once with HF_HUB_CACHE
  set, once with no HF_* variable at all (the default ~/.cache/huggingface/hub), offline;
- the window renders (`gui --screenshot`, offscreen).

Until the trained demo pair exists in resources/models/, the bundle gets a stand-in pair:
copies of --target/--drafter when given, else a tiny random pair from tests/fixtures/tiny_models.py.
Re-run without --no-build once the real pair is installed.

Linux (or macOS, where it checks the one-folder build next to the .app). Slow: a build takes
minutes, so this is not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "dflash_playground.spec"
EXE_NAME = "dflash-playground"
PROMPT = "def fibonacci(n):"
GENERATE = ["generate", "--prompt", PROMPT, "--raw", "--max-tokens", "32", "--json"]
HF_ORG = "dflash-check"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    seconds: float | None = None
    soft: bool = False  # a warning, not a failure


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str = "", seconds: float | None = None, soft: bool = False) -> bool:
        self.checks.append(Check(name, ok, detail, seconds, soft))
        mark = "ok  " if ok else ("warn" if soft else "FAIL")
        took = f" ({seconds:.2f} s)" if seconds is not None else ""
        print(f"[{mark}] {name}{took}{': ' + detail if detail else ''}", flush=True)
        return ok

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and not c.soft]


def project_version() -> str:
    import re

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'(?m)^version\s*=\s*"([^"]+)"', text).group(1)


DEFAULT_DRAFTER = "demo-dflash2-drafter"  # preferred over demo-drafter, as engine/models/demo.py does


def has_demo_pair(models: Path) -> bool:
    return all((models / name / "config.json").is_file() for name in ("demo-target", "demo-drafter"))


def stand_in_models(scratch: Path, target: str | None, drafter: str | None) -> Path:
    """A folder with demo-target/ and demo-drafter/ for the bundle, while the real pair is missing."""
    out = scratch / "stand-in-models"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if target and drafter:
        for src, name in ((target, "demo-target"), (drafter, "demo-drafter")):
            if not Path(src).is_dir():
                raise SystemExit(f"error: {src}: a stand-in pair must be local folders.")
            shutil.copytree(src, out / name)
        print(f"stand-in demo pair: copies of {target} and {drafter}")
        return out
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the test fixtures build the stand-in pair
    import engine  # noqa: F401  (BLAS before MLX)
    from fixtures.tiny_models import write_drafter, write_target, write_tokenizer

    write_tokenizer(scratch / "tokenizer")
    write_target(out / "demo-target", scratch / "tokenizer")
    write_drafter(out / "demo-drafter", out / "demo-target")
    print(f"stand-in demo pair: a tiny random pair in {out} (tests/fixtures/tiny_models.py)")
    return out


def build(dist: Path, work: Path, models: Path | None, clean: bool) -> float:
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--distpath", str(dist), "--workpath", str(work)]
    if clean:
        cmd.append("--clean")
    cmd.append(str(SPEC))
    if shutil.which("nice"):
        cmd = ["nice", "-n", "10"] + cmd
    env = dict(os.environ)
    if models is not None:
        env["DFLASH_BUNDLE_MODELS"] = str(models)
    else:
        env.pop("DFLASH_BUNDLE_MODELS", None)
    print("building:", " ".join(cmd), flush=True)
    start = time.perf_counter()
    log = work.parent / "pyinstaller-build.log"
    work.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        print(Path(log).read_text()[-4000:])
        raise SystemExit(f"error: PyInstaller failed (exit {proc.returncode}); full log: {log}")
    print(f"built in {took:.0f} s (log: {log})")
    return took


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """What a fresh login would have: no venv, no PYTHON*, no HF_*; a scratch HOME."""
    env = {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "QT_QPA_PLATFORM": "offscreen",
    }
    for key in ("TMPDIR", "DFLASH_NO_OPENBLAS"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra)
    return env


def run(exe: Path, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([str(exe), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - start


def tail(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or "") + (proc.stdout or "")
    return " | ".join(text.strip().splitlines()[-3:])


def du(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def fake_hf_cache(hub: Path, repo_id: str, source: Path) -> Path:
    """huggingface_hub's layout: models--org--name/{refs/main, snapshots/<rev>/...}."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    snapshot = repo / "snapshots" / rev
    if snapshot.exists():
        shutil.rmtree(snapshot)
    shutil.copytree(source, snapshot)
    return snapshot


def check_layout(report: Report, bundle: Path) -> None:
    internal = bundle / "_internal"
    base = internal if internal.is_dir() else bundle
    report.facts["bundle"] = str(bundle)

    def has(pattern: str) -> bool:
        return any(base.glob(pattern))

    report.add("layout: libmlx in mlx/lib", has("mlx/lib/libmlx.*"))
    if sys.platform == "darwin":
        report.add("layout: mlx.metallib next to libmlx", has("mlx/lib/mlx.metallib"))
    else:
        report.add("layout: OpenBLAS at cmeel.prefix/lib/libopenblas.so.0 (engine/runtime/blas.py)",
                   (base / "cmeel.prefix" / "lib" / "libopenblas.so.0").is_file())
        report.add("layout: mlx_cpu.libs/libgfortran-* (engine/runtime/blas.py)", has("mlx_cpu.libs/libgfortran-*"))
    for name in ("demo-target", "demo-drafter"):
        report.add(f"layout: resources/models/{name}/config.json", (base / "resources/models" / name / "config.json").is_file())
    # a stand-in pair has none: the app then falls back to demo-drafter
    report.add(f"layout: resources/models/{DEFAULT_DRAFTER}/config.json (the default drafter)",
               (base / "resources/models" / DEFAULT_DRAFTER / "config.json").is_file(), soft=True)
    report.add("layout: recipe scripts left out", not (base / "resources/models/recipe").exists())
    report.add("layout: resources/styles/app.qss", (base / "resources/styles/app.qss").is_file())
    report.add("layout: resources/icons", has("resources/icons/*.svg") or has("resources/icons/*.png"))
    for dist in ("transformers", "tokenizers", "huggingface_hub", "mlx_lm", "safetensors"):
        report.add(f"layout: {dist} metadata (dist-info)", has(f"{dist}-*.dist-info"))
    report.add("layout: no torch", not (base / "torch").exists())

    try:
        from PyInstaller.archive.readers import pkg_archive_contents

        modules = set(pkg_archive_contents(str(bundle / EXE_NAME)))
    except Exception as exc:  # noqa: BLE001
        report.add("archive: readable", False, f"{type(exc).__name__}: {exc}")
        return
    # Every model module of the installed mlx-lm (it imports them by model_type).
    import importlib.util
    import pkgutil

    mlx_lm_dir = Path(importlib.util.find_spec("mlx_lm").submodule_search_locations[0])
    want = {f"mlx_lm.models.{m.name}" for m in pkgutil.iter_modules([str(mlx_lm_dir / "models")])}
    missing = sorted(want - modules)
    report.add("archive: mlx_lm model modules", bool(want) and not missing,
               f"{len(want) - len(missing)}/{len(want)}" + (f", missing {missing[:5]}" if missing else ""))
    tok = [m for m in modules if m.startswith("transformers.models.") and ".tokenization_" in m]
    report.add("archive: transformers tokenizer modules", "transformers.models.qwen2.tokenization_qwen2" in modules,
               f"{len(tok)} modules")
    ours = ["app.cli", "engine.tools.cli", "engine.decode.generate", "engine.runtime.blas", "kernels", "app.main", "app.window"]
    missing = [m for m in ours if m not in modules]
    report.add("archive: engine, kernels, app", not missing, f"missing {missing}" if missing else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="a target folder: also run the bundle on it (and use it as stand-in demo)")
    parser.add_argument("--drafter", help="its drafter folder")
    parser.add_argument("--no-build", action="store_true", help="check the existing bundle")
    parser.add_argument("--clean", action="store_true", help="PyInstaller --clean (no cached analysis)")
    parser.add_argument("--dist", default=str(ROOT / "dist"), help="PyInstaller --distpath (default: dist/)")
    parser.add_argument("--work", default=str(ROOT / "build" / "pyinstaller"), help="--workpath (default: build/pyinstaller)")
    parser.add_argument("--skip-gui", action="store_true", help="do not render the window")
    parser.add_argument("--report", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if bool(args.target) != bool(args.drafter):
        parser.error("give --target and --drafter together.")

    report = Report()
    scratch = Path(tempfile.mkdtemp(prefix="dflash-bundle-check-"))
    dist, work = Path(args.dist).resolve(), Path(args.work).resolve()
    bundle = dist / EXE_NAME
    exe = bundle / EXE_NAME

    demo_in_repo = has_demo_pair(ROOT / "resources" / "models")
    models = None
    if not demo_in_repo:
        print("note: the trained demo pair is not in resources/models yet; "
              + ("checking the bundle as built." if args.no_build else "bundling a stand-in pair."))
        if not args.no_build:
            models = stand_in_models(scratch, args.target, args.drafter)
    report.facts["demo_pair"] = "resources/models" if demo_in_repo else "stand-in (re-run once the trained pair exists)"

    if not args.no_build:
        report.facts["build_s"] = f"{build(dist, work, models, args.clean):.0f}"
    if not exe.is_file():
        raise SystemExit(f"error: {exe} not found; build first (drop --no-build).")
    size = du(bundle)
    report.facts["size"] = f"{size / 2**20:.0f} MiB"
    print(f"bundle: {bundle} ({size / 2**20:.0f} MiB)")

    check_layout(report, bundle)

    home = scratch / "home"
    home.mkdir()
    cwd = scratch / "cwd"
    cwd.mkdir()
    env = clean_env(home)

    # --version, three times (the first start also warms the page cache).
    times = []
    version = project_version()
    for _ in range(3):
        proc, took = run(exe, ["--version"], env, cwd)
        times.append(took)
    ok = proc.returncode == 0 and proc.stdout.strip() == f"{EXE_NAME} {version}"
    report.add("--version", ok, proc.stdout.strip() or tail(proc), statistics.median(times))
    report.facts["version_start_s"] = f"{statistics.median(times):.2f} (median of 3; first {times[0]:.2f})"

    proc, took = run(exe, ["doctor"], env, cwd)
    report.add("doctor on the bundled demo pair", proc.returncode == 0 and "verdict: ready" in proc.stdout,
               tail(proc) if proc.returncode else "", took)
    blas_lines = [line for line in proc.stdout.splitlines() if "blas" in line.lower()]
    if blas_lines:
        report.add("doctor: OpenBLAS loaded", any("openblas" in line for line in blas_lines), blas_lines[0])
    elif sys.platform.startswith("linux"):
        report.add("doctor: OpenBLAS loaded", False, "doctor prints no BLAS line (engine change pending); "
                   "see the trace header check", soft=True)

    trace = scratch / "trace.jsonl"
    proc, took = run(exe, GENERATE + ["--trace", str(trace)], env, cwd)
    demo_tokens = None
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        demo_tokens = result["token_ids"]
        ok = proc.returncode == 0 and result["num_generated"] > 0 and result["mode"] == "dflash"
        detail = (f"{result['num_generated']} tokens, {result['tok_per_s']:.1f} tok/s, tau "
                  f"{result['mean_acceptance_length']:.2f}, stop {result['stop_reason']}")
    except (IndexError, ValueError, KeyError):
        ok, detail = False, tail(proc)
    report.add("generate on the bundled demo pair (no --target/--drafter)", ok, detail, took)
    report.facts["generate_s"] = f"{took:.2f} (process wall time, model load included)"
    if trace.is_file():
        header = json.loads(trace.read_text().splitlines()[0])
        device = header.get("device", "")
        report.facts["device"] = device
        if sys.platform.startswith("linux"):
            report.add("trace header: OpenBLAS ran", "blas: openblas" in device, device)
        else:
            report.add("trace header: device", True, device)

    # The same command from the source tree must give the same tokens.
    base = bundle / "_internal" if (bundle / "_internal").is_dir() else bundle
    # The bundle's default drafter, as engine/models/demo.py's demo_pair() picks it: DFlash2 if bundled.
    bundled = (base / "resources/models" / DEFAULT_DRAFTER / "config.json").is_file()
    drafter = DEFAULT_DRAFTER if bundled else "demo-drafter"
    pair = [str(base / "resources/models/demo-target"), str(base / "resources/models" / drafter)]
    src = subprocess.run([sys.executable, "-m", "engine.tools.cli", *GENERATE, "--target", pair[0], "--drafter", pair[1]],
                         cwd=ROOT, capture_output=True, text=True)
    try:
        src_tokens = json.loads(src.stdout.strip().splitlines()[-1])["token_ids"]
        report.add("bundle tokens == source-tree tokens", demo_tokens is not None and src_tokens == demo_tokens,
                   "" if src_tokens == demo_tokens else f"bundle {demo_tokens} vs source {src_tokens}")
    except (IndexError, ValueError, KeyError):
        report.add("bundle tokens == source-tree tokens", False, "source-tree run failed: " + tail(src), soft=True)

    if args.target:
        proc, took = run(exe, GENERATE + ["--target", str(Path(args.target).resolve()),
                                          "--drafter", str(Path(args.drafter).resolve())], env, cwd)
        report.add("generate with --target/--drafter folders", proc.returncode == 0, tail(proc) if proc.returncode else "", took)

    # Hugging Face ids from the user's cache (offline). First HF_HUB_CACHE, then the default location.
    ids = (f"{HF_ORG}/demo-target", f"{HF_ORG}/{drafter}")
    explicit_hub = scratch / "hf-cache" / "hub"
    for repo_id, folder in zip(ids, pair):
        fake_hf_cache(explicit_hub, repo_id, Path(folder))
    hf_args = GENERATE + ["--target", ids[0], "--drafter", ids[1]]
    proc, took = run(exe, hf_args, clean_env(home, HF_HUB_CACHE=str(explicit_hub), HF_HUB_OFFLINE="1"), cwd)
    same = proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["token_ids"] == demo_tokens
    report.add("generate with Hugging Face ids (HF_HUB_CACHE, offline)", same, tail(proc) if proc.returncode else "", took)

    default_hub = home / ".cache" / "huggingface" / "hub"
    for repo_id, folder in zip(ids, pair):
        snapshot = fake_hf_cache(default_hub, repo_id, Path(folder))
    proc, took = run(exe, hf_args + ["--trace", str(scratch / "hf-trace.jsonl")], clean_env(home, HF_HUB_OFFLINE="1"), cwd)
    used = ""
    if (scratch / "hf-trace.jsonl").is_file():
        used = json.loads((scratch / "hf-trace.jsonl").read_text().splitlines()[0]).get("target", "")
    ok = proc.returncode == 0 and str(default_hub) in str(used)
    report.add("generate with Hugging Face ids (default ~/.cache/huggingface, no HF_* set)", ok,
               (f"target resolved to {used}" if proc.returncode == 0 else tail(proc)), took)
    shutil.rmtree(snapshot.parent.parent, ignore_errors=True)
    proc, _ = run(exe, hf_args, clean_env(home, HF_HUB_OFFLINE="1"), cwd)
    report.add("missing Hugging Face id fails with one clear line", proc.returncode == 2 and "error:" in proc.stderr,
               tail(proc))

    if not args.skip_gui:
        shot = scratch / "window.png"
        proc, took = run(exe, ["gui", "--screenshot", str(shot)], env, cwd, timeout=300)
        report.add("window renders (gui --screenshot, offscreen)", proc.returncode == 0 and shot.is_file(),
                   str(shot) if shot.is_file() else tail(proc), took)

    print("\nsummary")
    for key, value in report.facts.items():
        print(f"  {key}: {value}")
    failed = report.failed
    print(f"  checks: {len(report.checks) - len(failed)}/{len(report.checks)} passed"
          + (f"; FAILED: {', '.join(c.name for c in failed)}" if failed else ""))
    if args.report:
        Path(args.report).write_text(json.dumps({
            "facts": report.facts,
            "checks": [c.__dict__ for c in report.checks],
        }, indent=2))
    shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
