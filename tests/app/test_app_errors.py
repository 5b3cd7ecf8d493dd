"""Every engine error reaches the user as its own sentence, and the window stays usable."""

import shutil
import threading

import pytest
from PySide6.QtCore import Qt

import engine.decode.generate
import engine.models.pair
from engine.models.doctor import check_pair
from engine.errors import SettingsError
from engine.decode.settings import GenerationSettings
from engine.models.pair import load_pair
from app.errors import OUT_OF_MEMORY, is_out_of_memory

from helpers import PROMPTS
from window_helpers import choose, run_and_wait


def assert_usable_after(qtbot, w, good_dirs, prompt):
    """The prompt and settings survived the error, and a good pair then runs to the end."""
    assert w.prompt.prompt() == prompt
    assert w.prompt.max_tokens.value() == 12 and w.prompt.run_button.isEnabled()
    assert not w.error_box.isModal()
    choose(w, good_dirs)
    run_and_wait(qtbot, w)
    assert w.rounds_run.summary.stop_reason == "max_tokens" and w.rounds.rounds_model.rowCount() > 0


def bad_drafter(dirs, tmp_path):
    bad = tmp_path / "bad-drafter"
    shutil.copytree(dirs[1], bad)
    (bad / "config.json").write_text("{not json")
    return dirs[0], bad


def incompatible(dirs, oracle_dirs, tmp_path):
    """The 4-layer target's drafter taps layer 3; the oracle target has 2 layers."""
    return oracle_dirs[0], dirs[1]


def missing_folder(dirs, tmp_path):
    return tmp_path / "no-such-model", dirs[1]


@pytest.mark.parametrize("make_pair", [bad_drafter, incompatible, missing_folder])
def test_load_errors_show_the_engine_sentence(qtbot, make_window, qwen3_tied_dirs, oracle_dirs, tmp_path,
                                              make_pair):
    args = (qwen3_tied_dirs, oracle_dirs, tmp_path) if make_pair is incompatible else (qwen3_tied_dirs, tmp_path)
    target, drafter = make_pair(*args)
    expected = check_pair(target, drafter).problems[0]  # the engine's own sentence for this pair
    w = make_window()
    choose(w, qwen3_tied_dirs)
    with qtbot.waitSignal(w.load_finished, timeout=30_000):  # a good pair first: the bad one replaces it
        w.start_load()
    choose(w, (target, drafter), PROMPTS[0], max_tokens=12)
    with qtbot.waitSignal(w.error_shown, timeout=30_000) as shown:
        run_and_wait(qtbot, w)
    assert shown.args == [expected]
    assert w.error_box.isVisible() and w.error_box.text() == expected
    # checked before the loaded pair was let go: it is still there, and the panel says so
    assert w.loaded is not None and w.loaded.target == str(qwen3_tied_dirs[0])
    assert w.models.status.text().startswith("still loaded:") and w.host.worker.pair is not None
    # The doctor's inline verdict already said the same before Run.
    w.models.check_now()
    assert w.models.verdict_ok is False and expected in w.models.verdict.text()
    assert_usable_after(qtbot, w, qwen3_tied_dirs, PROMPTS[0])


def test_out_of_memory_is_named(qtbot, make_window, qwen3_tied_dirs, monkeypatch):
    """MLX raises RuntimeError on a failed allocation; simulated at the engine boundary."""
    real = engine.decode.generate.generate

    def oom(*args, **kwargs):
        raise RuntimeError("[malloc] Unable to allocate 68719476736 bytes.")
        yield  # pragma: no cover

    monkeypatch.setattr(engine.decode.generate, "generate", oom)
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=12)
    with qtbot.waitSignal(w.error_shown, timeout=30_000) as shown:
        run_and_wait(qtbot, w)
    assert shown.args == [OUT_OF_MEMORY]
    assert w.loaded is not None  # the pair itself loaded and stays loaded
    monkeypatch.setattr(engine.decode.generate, "generate", real)
    assert_usable_after(qtbot, w, qwen3_tied_dirs, PROMPTS[0])


@pytest.mark.parametrize("message, oom", [
    ("[malloc] Unable to allocate 1024 bytes.", True),
    ("[metal::malloc] Attempting to allocate 9e10 bytes which is greater than the maximum allowed buffer size",
     True),
    ("[reshape] Cannot reshape array of size 6 into shape (4).", False),
])
def test_out_of_memory_detection(message, oom):
    assert is_out_of_memory(RuntimeError(message)) is oom
    assert is_out_of_memory(ValueError(message)) is False


@pytest.fixture
def blocking_target_load(monkeypatch):
    """Holds the worker inside the target load until the test releases it."""
    entered, release = threading.Event(), threading.Event()
    real = engine.models.pair.load_target

    def slow_load_target(path):
        entered.set()
        release.wait(timeout=30)
        return real(path)

    monkeypatch.setattr(engine.models.pair, "load_target", slow_load_target)
    return entered, release


def test_cancel_mid_load(qtbot, make_window, qwen3_tied_dirs, blocking_target_load, monkeypatch):
    entered, release = blocking_target_load
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=12)
    w.start_run()
    qtbot.waitUntil(lambda: entered.is_set() and "loading target" in w.models.status.text(), timeout=30_000)
    assert w.models.progress.isVisible() and w.models.cancel_button.isVisible()
    with qtbot.waitSignal(w.run_finished, timeout=30_000):
        qtbot.mouseClick(w.models.cancel_button, Qt.MouseButton.LeftButton)
        release.set()
    assert w.loaded is None and w.errors == []  # a cancel is not an error: said inline
    assert w.models.status.text() == "loading was cancelled." and w.notices[-1] == "loading was cancelled."
    assert not w.models.progress.isVisible()
    assert w.prompt.prompt() == PROMPTS[0] and w.prompt.max_tokens.value() == 12
    monkeypatch.undo()
    run_and_wait(qtbot, w)
    assert w.loaded is not None and w.rounds_run.summary.num_generated == 12


def test_close_during_a_run_exits_cleanly(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=4000)  # the fixtures' context is 4096
    w.start_run()
    qtbot.waitUntil(lambda: w.rounds.rounds_model.rowCount() > 0, timeout=60_000)
    w.close()
    assert w.host.thread.isFinished() and w.host.worker.pair is None


def test_close_during_a_load_exits_cleanly(qtbot, make_window, qwen3_tied_dirs, blocking_target_load):
    entered, release = blocking_target_load
    w = make_window()
    choose(w, qwen3_tied_dirs)
    w.start_load()
    qtbot.waitUntil(entered.is_set, timeout=30_000)
    threading.Timer(0.2, release.set).start()  # the GUI thread is about to wait for the worker
    w.close()
    assert w.host.thread.isFinished() and w.host.worker.pair is None


def test_bad_settings_are_refused_by_the_engine(qtbot, make_window, qwen3_tied_dirs):
    """AR-only pair (no drafter) in DFlash mode: the engine's SettingsError sentence, shown as is."""
    with pytest.raises(SettingsError) as refused:
        GenerationSettings(max_tokens=12).resolved(load_pair(qwen3_tied_dirs[0], None))
    w = make_window()
    choose(w, (qwen3_tied_dirs[0], None), PROMPTS[0], max_tokens=12)
    with qtbot.waitSignal(w.error_shown, timeout=30_000) as shown:
        run_and_wait(qtbot, w)
    assert shown.args == [str(refused.value)]
    w.prompt.set_mode("ar")
    run_and_wait(qtbot, w)
    assert w.current_run.summary.num_generated == 12


def test_a_load_that_fails_after_the_check_reads_the_previous_pair_back(qtbot, make_window, qwen3_tied_dirs,
                                                                      qwen3_untied_dirs, monkeypatch):
    """Weights that pass the doctor but fail to load: the pair loaded before is read back, so the
    user keeps a working pair and the run that follows uses it."""
    real = engine.models.pair.load_target

    def failing(path):
        if path.resolve() == qwen3_untied_dirs[0].resolve():
            raise SettingsError("simulated: these weights could not be read.")
        return real(path)

    monkeypatch.setattr(engine.models.pair, "load_target", failing)
    w = make_window()
    choose(w, qwen3_tied_dirs)
    with qtbot.waitSignal(w.load_finished, timeout=30_000):
        w.start_load()
    choose(w, qwen3_untied_dirs, PROMPTS[0], max_tokens=12)
    with qtbot.waitSignal(w.error_shown, timeout=30_000) as shown:
        with qtbot.waitSignal(w.load_finished, timeout=30_000):
            w.start_load()
    assert shown.args == ["simulated: these weights could not be read."]
    assert w.loaded is not None and w.loaded.target == str(qwen3_tied_dirs[0])
    assert w.host.worker.pair is not None and w.host.worker.pair_key == (str(qwen3_tied_dirs[0]),
                                                                         str(qwen3_tied_dirs[1]))


def test_closing_never_waits_without_a_bound_on_a_stuck_worker(qtbot, make_window, qwen3_tied_dirs,
                                                              blocking_target_load):
    """A read of weights cannot be interrupted: closing gives up on the worker after its bound and
    says so (app/main.py then leaves at once), instead of lingering."""
    import time

    entered, release = blocking_target_load
    w = make_window()
    choose(w, qwen3_tied_dirs)
    w.start_load()
    qtbot.waitUntil(entered.is_set, timeout=30_000)
    t0 = time.perf_counter()
    assert w.host.shutdown(timeout_s=0.3) is False
    assert time.perf_counter() - t0 < 5
    release.set()  # let the worker finish, so the test leaves no running thread behind
    qtbot.waitUntil(w.host.thread.isFinished, timeout=30_000)


def test_a_temporary_folder_that_does_not_exist_is_named_not_unexpected(monkeypatch, tmp_path):
    """MLX's CPU backend compiles kernels in the folder TMPDIR/TMP/TEMP names: when it names none, every
    run failed with 'unexpected RuntimeError: filesystem error: temp_directory_path' (QA pass)."""
    from app.errors import user_message
    from engine.runtime.temp_dir import explain

    for name in ("TMPDIR", "TMP", "TEMP", "TEMPDIR"):
        monkeypatch.delenv(name, raising=False)
    mlx_error = RuntimeError("filesystem error: temp_directory_path: No such file or directory")
    monkeypatch.setenv("TEMP", str(tmp_path / "gone"))
    said = user_message(mlx_error)
    assert said.startswith(f"the temporary folder TEMP={tmp_path / 'gone'} does not exist") and "unexpected" not in said
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the first one set decides, as in C++
    assert "MLX could not find a temporary folder" in explain(mlx_error)
    assert explain(RuntimeError("something else")) is None
    assert user_message(RuntimeError("something else")).startswith("unexpected RuntimeError")
