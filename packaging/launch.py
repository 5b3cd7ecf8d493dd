"""Entry point of the frozen app (PyInstaller): the `dflash-playground` command.

A double-click start (macOS .app, Linux desktop entry) passes no arguments, so
`app.cli.main()` opens the window; from a terminal the bundled program takes the
same subcommands as the installed CLI (`--version`, `generate`, `doctor`, ...).

Nothing here touches HF_HOME / HF_HUB_CACHE: models chosen from the Hugging Face
cache are looked up where the user's huggingface_hub would look, never in the bundle.
"""

import multiprocessing
import sys


def _user_args(argv: list[str]) -> list[str]:
    # Finder on old macOS versions passes a process serial number (-psn_0_12345); drop it.
    return [a for a in argv if not a.startswith("-psn_")]


if __name__ == "__main__":
    multiprocessing.freeze_support()
    from app.cli import main  # importing `engine` preloads OpenBLAS before MLX (engine/runtime/blas.py)

    sys.exit(main(_user_args(sys.argv[1:])))
