"""The window's tests: each runs with its own settings, logs, HF cache and no demo pair."""

import pytest


@pytest.fixture(autouse=True)
def _sandboxed(app_env):
    return app_env
