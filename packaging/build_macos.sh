#!/usr/bin/env bash
# Build "DFlash Playground.app" on a Mac with Apple silicon (macOS 14 or later).
#
#   packaging/build_macos.sh            # venv (.venv), pip install -e ".[package]", icns, PyInstaller, smoke test
#
# Environment (optional):
#   PYTHON=python3.12        interpreter for a new venv (a native arm64 Python with a shared
#                            libpython: python.org, Homebrew or uv builds; pyenv needs --enable-framework)
#   VENV=.venv               the venv to create or reuse
#   SKIP_SMOKE=1             do not run the bundled program after the build
#   DFLASH_CODESIGN_IDENTITY="Developer ID Application: ..."   sign with this identity (default: ad-hoc)
#   DFLASH_ENTITLEMENTS=path.plist                            entitlements for that signature
#
# The .app is written to dist/, with a zip of it (made with ditto, which keeps the
# bundle's symbolic links) next to it. The MLX wheel decides the oldest macOS the app runs
# on: its mlx.metallib is built for the macOS version in the wheel's tag, and the spec
# copies that into LSMinimumSystemVersion; build on the oldest macOS you want to support.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"

if [[ "$(uname -s)" != "Darwin" ]]; then
    echo "error: build_macos.sh builds the macOS app; on Linux run: python packaging/check_bundle.py" >&2
    exit 2
fi
if [[ "$(uname -m)" != "arm64" ]]; then
    echo "error: MLX needs Apple silicon; this shell runs as $(uname -m) (under Rosetta?)." >&2
    exit 2
fi

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "== creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
if [[ "$(python -c 'import platform; print(platform.machine())')" != "arm64" ]]; then
    echo "error: $VENV/bin/python is not a native arm64 Python; MLX will not install." >&2
    exit 2
fi

echo "== installing the project with the package extra (PyInstaller, Pillow)"
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[package]"
python -c 'import mlx.core as mx; print("mlx", mx.__version__, "default device:", mx.default_device())'

if [[ ! -f resources/models/demo-target/config.json || ! -f resources/models/demo-drafter/config.json ]]; then
    echo "warning: the demo pair (resources/models/demo-target, demo-drafter) is missing;" >&2
    echo "         the app will be built without it (models from folders / the HF cache still work)." >&2
fi

echo "== app icon"
mkdir -p build/icons
python packaging/make_icns.py resources/icons/app-icon.svg --icns build/icons/app.icns

echo "== PyInstaller"
DFLASH_ICNS="$ROOT/build/icons/app.icns" python -m PyInstaller --noconfirm --clean \
    --distpath dist --workpath build/pyinstaller-macos packaging/dflash_playground.spec

APP="dist/DFlash Playground.app"
BIN="$APP/Contents/MacOS/dflash-playground"
if [[ ! -x "$BIN" ]]; then
    echo "error: $BIN was not built." >&2
    exit 1
fi

echo "== bundle"
for key in CFBundleIdentifier CFBundleShortVersionString LSMinimumSystemVersion NSHighResolutionCapable; do
    printf '  %-28s %s\n' "$key" "$(plutil -extract "$key" raw -o - "$APP/Contents/Info.plist")"
done
if ! find "$APP/Contents" -name mlx.metallib | grep -q .; then
    echo "error: mlx.metallib is not in the bundle." >&2
    exit 1
fi
if codesign --verify --deep --strict "$APP"; then
    echo "  signature: valid ($(codesign -dv "$APP" 2>&1 | sed -n 's/^Signature=//p'))"
else
    echo "warning: codesign --verify failed; the app may still run here, but not on other Macs." >&2
fi
du -sh "$APP"

if [[ "${SKIP_SMOKE:-0}" != "1" ]]; then
    # As Finder would start it: no venv, no project folder, a minimal environment.
    echo "== smoke test (the bundled program, clean environment)"
    clean=(env -i "HOME=$HOME" "PATH=/usr/bin:/bin" "LANG=en_US.UTF-8")
    (cd /tmp && "${clean[@]}" "$ROOT/$BIN" --version)
    if [[ -f resources/models/demo-target/config.json ]]; then
        trace="$ROOT/build/smoke-trace.jsonl"
        (cd /tmp && "${clean[@]}" "$ROOT/$BIN" generate --prompt 'def fibonacci(n):' --raw --max-tokens 32 \
            --json --trace "$trace")
        device="$(head -n 1 "$trace" | python -c 'import json, sys; print(json.load(sys.stdin)["device"])')"
        echo "  device: $device"
        case "$device" in
            *gpu*) ;;
            *) echo "error: the bundled program did not run on the GPU (Metal); see above." >&2; exit 1 ;;
        esac
    fi
fi

VERSION="$(python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])' 2>/dev/null || echo dev)"
ZIP="dist/DFlash-Playground-$VERSION-macos-arm64.zip"
rm -f "$ZIP"
ditto -c -k --sequesterRsrc --keepParent "$APP" "$ZIP"

echo
echo "built: $ROOT/$APP"
echo "zip:   $ROOT/$ZIP"
echo "open it with: open \"$ROOT/$APP\"   (or double-click it in Finder)"
echo "Unsigned/ad-hoc signed: a copy downloaded on another Mac needs right-click > Open the first time,"
echo "or: xattr -dr com.apple.quarantine \"DFlash Playground.app\"."
