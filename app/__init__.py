"""The DFlash Playground window (PySide6 + pyqtgraph) over the headless engine.

Only `app.main` and the Qt modules import Qt; the engine never imports this package
except lazily, from the `gui` command.
"""
