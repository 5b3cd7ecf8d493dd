#!/usr/bin/env bash
# Install the Linux one-folder bundle for the current user, with a menu entry and icon.
#
#   packaging/linux/install.sh [BUNDLE_DIR]     # default: dist/dflash-playground
#
# Copies the bundle to ~/.local/opt/dflash-playground, links the program as
# ~/.local/bin/dflash-playground, and installs the desktop entry and its 256 px icon under
# ~/.local/share. Run it again to update; remove those four paths to uninstall.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BUNDLE="${1:-$HERE/../../dist/dflash-playground}"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
OPT="$HOME/.local/opt/dflash-playground"
BIN="$HOME/.local/bin"

if [[ ! -x "$BUNDLE/dflash-playground" ]]; then
    echo "error: $BUNDLE/dflash-playground not found; build it first: python packaging/check_bundle.py" >&2
    exit 2
fi
BUNDLE="$(cd "$BUNDLE" && pwd)"

mkdir -p "$OPT" "$BIN" "$DATA/applications" "$DATA/icons/hicolor/256x256/apps"
if [[ "$BUNDLE" != "$OPT" ]]; then
    rm -rf "$OPT"
    cp -a "$BUNDLE" "$OPT"
fi
ln -sf "$OPT/dflash-playground" "$BIN/dflash-playground"
install -m 644 "$HERE/dflash-playground.png" "$DATA/icons/hicolor/256x256/apps/dflash-playground.png"
# Absolute paths: a menu launcher does not read the shell's PATH.
# (Exec is quoted, for a HOME with spaces; TryExec takes the bare path.)
sed -e "s|^Exec=.*|Exec=\"$OPT/dflash-playground\"|" -e "s|^TryExec=.*|TryExec=$OPT/dflash-playground|" \
    "$HERE/dflash-playground.desktop" > "$DATA/applications/dflash-playground.desktop"
chmod 644 "$DATA/applications/dflash-playground.desktop"

if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$DATA/applications" || true
fi
if command -v gtk-update-icon-cache >/dev/null; then
    gtk-update-icon-cache -q -t "$DATA/icons/hicolor" || true
fi

echo "installed: $OPT"
echo "menu entry: $DATA/applications/dflash-playground.desktop (DFlash Playground)"
echo "command: $BIN/dflash-playground (make sure ~/.local/bin is on your PATH)"
