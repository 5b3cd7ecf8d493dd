"""The window's Serve tab: it serves the loaded pair, lists each request with its figures, shows a
selected one in the window's views, queues the window's own runs with the clients', refuses to load
another pair while serving, and stops."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from app.serve_view import add_serve_tab  # noqa: E402
from engine.decode.settings import GenerationSettings  # noqa: E402

RUN_TIMEOUT_MS = 60_000


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """A shown window with its Serve tab, its own settings, and no demo pair; closed (serving stopped) after."""
    for name, folder in (("DFLASH_CONFIG_DIR", "config"), ("DFLASH_LOG_DIR", "logs"),
                         ("DFLASH_MODELS_DIR", "no-demo-models")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    from app.window import MainWindow

    w = MainWindow(persist=False)
    qtbot.addWidget(w)
    add_serve_tab(w)
    w.show()
    yield w
    w.close()
    assert w.serve_view.serving is None and w.host.thread.isFinished()


def _load(qtbot, w, dirs) -> None:
    w.models.target.set_value(str(dirs[0]))
    w.models.drafter.set_value(str(dirs[1]))
    with qtbot.waitSignal(w.controller.load_finished, timeout=RUN_TIMEOUT_MS):
        w.start_load()


def test_the_serve_tab_serves_the_loaded_pair_and_lists_its_requests(qtbot, window, qwen3_tied_dirs, llama_dirs):
    w, view = window, window.serve_view
    assert not view.start()  # nothing loaded: refused, said
    _load(qtbot, w, qwen3_tied_dirs)
    view.port.setValue(0)
    assert view.start() and view.url.text().startswith("http://127.0.0.1:")
    client = openai.OpenAI(base_url=view.url.text(), api_key="x", max_retries=0)
    reply = client.completions.create(model="m", prompt="def main():\n", max_tokens=12)
    view.drain()  # the run's events were all handed over before its answer was sent
    assert view.table.rowCount() == 1
    cells = [view.table.item(0, c).text() for c in range(view.table.columnCount())]
    assert cells[1] == "/v1/completions" and cells[3] == "12" and cells[6] == reply.choices[0].finish_reason.replace(
        "length", "max_tokens")
    view.table.selectRow(0)  # its run, in the window's views
    assert w.controller.current_run.text == reply.choices[0].text
    with qtbot.waitSignal(w.run_finished, timeout=RUN_TIMEOUT_MS):  # AR beside it, on the server's thread in turn
        view.parity_button.click()
    assert w.controller.parity is not None and w.controller.parity.identical
    assert w.controller.runs["dflash"].text == reply.choices[0].text

    # the window's own run queues on the server's decode thread, and gives its usual output
    w.prompt.set_prompt("def main():\n")
    w.prompt.format.setCurrentIndex(w.prompt.format.findData("raw"))
    with qtbot.waitSignal(w.run_finished, timeout=RUN_TIMEOUT_MS):
        w.start_run()
    assert w.controller.current_run.summary is not None and w.controller.current_run.summary.num_generated > 0

    # another pair is refused while serving, with the way out named; the served pair stays loaded
    errors = len(w.errors)
    w.models.target.set_value(str(llama_dirs[0]))
    w.models.drafter.set_value(str(llama_dirs[1]))
    with qtbot.waitSignal(w.controller.load_finished, timeout=RUN_TIMEOUT_MS):
        w.start_load()
    assert "stop serving" in " ".join(w.errors[errors:]) and w.controller.loaded.target == str(qwen3_tied_dirs[0])

    view.stop()
    assert view.serving is None and not view.url.text() and w.host.worker.serving is None
    with pytest.raises(openai.APIConnectionError):
        client.completions.create(model="m", prompt="x", max_tokens=2)


def test_closing_the_window_while_serving_stops_the_server(qtbot, window, qwen3_tied_dirs):
    _load(qtbot, window, qwen3_tied_dirs)
    window.serve_view.port.setValue(0)
    assert window.serve_view.start()
    assert GenerationSettings  # the fixture's close asserts the server stopped and the worker let go
