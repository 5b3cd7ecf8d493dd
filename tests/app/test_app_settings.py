"""Settings across launches, first launch with and without the demo pair, model lists and drops."""

import json
import shutil

import pytest

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent

from engine.models.demo import SAMPLE_PROMPT, SAMPLE_PROMPTS
from app.catalog import DRAFTER, TARGET
from app.settings import AppSettings, load_settings, settings_path

from window_helpers import choose


def test_settings_saved_and_restored(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    choose(w, qwen3_tied_dirs, "print('hello')", max_tokens=77, temperature=0.7, top_p=0.9, top_k=40,
           seed=1234, block_size=6, mode="both")
    w.prompt.format.setCurrentIndex(w.prompt.format.findData("chat"))
    with qtbot.waitSignal(w.load_finished, timeout=30_000) as loaded:
        w.start_load()
    assert loaded.args == [True]
    # The thinking toggle follows the loaded tokenizer's chat template.
    assert w.prompt.thinking.isEnabled() == (w.loaded.has_chat_template and w.loaded.has_thinking)
    w.resize(720, 640)  # inside the offscreen screen (800x800), where restoreGeometry clamps
    w.main_split.setSizes([330, 200, 190])
    sizes = w.main_split.sizes()
    w.close()
    assert settings_path().is_file()

    w2 = make_window()
    p = w2.prompt
    assert p.prompt() == "print('hello')" and p.format.currentData() == "chat" and p.mode() == "both"
    assert (p.max_tokens.value(), p.temperature.value(), p.top_p.value(), p.top_k.value(), p.seed.value(),
            p.block_size.value()) == (77, 0.7, 0.9, 40, 1234, 6)
    assert w2.models.target_value() == str(qwen3_tied_dirs[0])
    assert w2.models.drafter_value() == str(qwen3_tied_dirs[1])
    assert w2.settings.recent_targets[0] == str(qwen3_tied_dirs[0])
    assert str(qwen3_tied_dirs[1]) in [e.value for e in w2.models.drafter.entries]
    assert (w2.width(), w2.height()) == (720, 640)
    assert w2.main_split.sizes() == sizes


def test_corrupt_settings_reset_with_a_notice(qtbot, make_window):
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"max_tokens": 5, "temperature": ')
    w = make_window()
    assert w.notices and "corrupt" in w.notices[0] and str(path) in w.notices[0]
    assert w.notice_box.isVisible() and not w.notice_box.isModal()
    assert w.prompt.max_tokens.value() == AppSettings().max_tokens
    assert path.with_name("settings.json.corrupt").read_text().startswith('{"max_tokens": 5')
    w.close()
    settings, notice = load_settings()
    assert notice is None and settings.max_tokens == AppSettings().max_tokens


def test_wrong_typed_fields_fall_back_alone(qtbot, make_window):
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"max_tokens": "many", "seed": 9, "recent_targets": "x"}))
    w = make_window()
    assert "max_tokens" in w.notices[0] and "recent_targets" in w.notices[0]
    assert w.prompt.seed.value() == 9 and w.prompt.max_tokens.value() == AppSettings().max_tokens


def test_first_launch_with_demo_pair_runs_in_one_click(qtbot, make_window, qwen3_tied_dirs, tmp_path,
                                                       monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    (models / "demo-target").symlink_to(qwen3_tied_dirs[0])
    (models / "demo-drafter").symlink_to(qwen3_tied_dirs[1])
    monkeypatch.setenv("DFLASH_MODELS_DIR", str(models))
    w = make_window()
    assert w.models.target_value() == str(models / "demo-target")
    assert w.models.drafter_value() == str(models / "demo-drafter")
    assert w.prompt.prompt() == SAMPLE_PROMPT
    assert w.models.verdict_ok is True
    with qtbot.waitSignal(w.run_finished, timeout=60_000):
        qtbot.mouseClick(w.prompt.run_button, Qt.MouseButton.LeftButton)
    assert w.errors == []
    assert w.rounds.rounds_model.rowCount() > 0 and len(w.plots.series()["acceptance_length"]) > 0
    assert w.output.plain_text() and w.output.plain_text() == w.rounds_run.summary.text


def bundled_pairs(tmp_path, monkeypatch, dense_dirs, hybrid_dirs):
    """A models folder holding the dense demo pair and the hybrid one (tiny stand-ins), in use."""
    models = tmp_path / "models"
    models.mkdir()
    for name, folder in [("demo-target", dense_dirs[0]), ("demo-drafter", dense_dirs[1]),
                         ("demo-hybrid-target", hybrid_dirs[0]), ("demo-hybrid-drafter", hybrid_dirs[1])]:
        (models / name).symlink_to(folder)
    monkeypatch.setenv("DFLASH_MODELS_DIR", str(models))
    return models


def test_every_bundled_pair_is_listed_the_default_preselected(make_window, qwen3_tied_dirs, sliding_dirs, tmp_path,
                                                              monkeypatch):
    models = bundled_pairs(tmp_path, monkeypatch, qwen3_tied_dirs, sliding_dirs)
    w = make_window()
    demo_targets = [e.value for e in w.models.target.entries if e.source == "demo"]
    demo_drafters = [e.value for e in w.models.drafter.entries if e.source == "demo"]
    assert demo_targets == [str(models / "demo-target"), str(models / "demo-hybrid-target")]
    assert demo_drafters == [str(models / "demo-drafter"), str(models / "demo-hybrid-drafter")]
    assert w.models.target_value() == str(models / "demo-target")


def test_first_launch_without_demo_pair_explains(qtbot, make_window):
    w = make_window()
    assert w.models.target_value() == "" and w.models.drafter_value() is None
    assert "demo pair is not installed" in w.models.verdict.text()
    assert w.prompt.prompt() == SAMPLE_PROMPT
    w.start_run()
    assert "choose a target" in w.errors[-1] and not w.busy


def fake_hf_repo(cache, repo_id, source, edit=None):
    """A Hugging Face cache entry as huggingface_hub lays it out (refs/main -> snapshots/<rev>)."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(rev)
    (folder / "blobs").mkdir()
    snap = folder / "snapshots" / rev
    shutil.copytree(source, snap)
    if edit:
        config = json.loads((snap / "config.json").read_text())
        edit(config)
        (snap / "config.json").write_text(json.dumps(config))
    return snap


def test_hf_cache_models_listed_and_drafters_matched(qtbot, make_window, qwen3_tied_dirs, app_env):
    cache = app_env / "hf-cache"
    target = fake_hf_repo(cache, "org/tiny-target", qwen3_tied_dirs[0])
    good = fake_hf_repo(cache, "org/tiny-drafter", qwen3_tied_dirs[1])
    bad = fake_hf_repo(cache, "org/other-drafter", qwen3_tied_dirs[1],
                       lambda c: c["dflash_config"].update(target_layer_ids=[1, 9]))
    w = make_window()
    qtbot.waitUntil(lambda: getattr(w, "hf_scan_done", False), timeout=30_000)
    targets = {e.value: e for e in w.models.target.entries}
    drafters = {e.value: e for e in w.models.drafter.entries}
    assert targets[str(target)].role == TARGET and targets[str(target)].label.startswith("org/tiny-target")
    assert {str(good), str(bad)} <= set(drafters) and str(good) not in targets
    assert all(e.role == DRAFTER for e in drafters.values())

    w.models.target.combo.setCurrentIndex(w.models.target.combo.findText(targets[str(target)].label))
    assert w.models.target_value() == str(target)
    w.models.check_now()
    marks = w.models.drafter.marks()
    assert "✓" in marks[str(good)] and "✗" in marks[str(bad)] and "target_layer_ids" in marks[str(bad)]

    # Once loaded (the pair becomes a recent one), the cache's models keep their names, not their paths.
    w.settings.remember(str(target), str(good))
    w.model_lists.refresh()
    labels = {e.value: e.label for e in w.models.target.entries + w.models.drafter.entries}
    assert labels[str(target)] == "org/tiny-target (HF cache)" and labels[str(good)] == "org/tiny-drafter (HF cache)"
    assert w.models.target.combo.findText(str(target)) == -1


def drop(window, folder):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(folder))])
    enter = QDragEnterEvent(window.rect().center(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    window.dragEnterEvent(enter)
    assert enter.isAccepted()
    event = QDropEvent(QPointF(window.rect().center()), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)


def test_drop_model_folders(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    w = make_window()
    drop(w, qwen3_tied_dirs[1])
    drop(w, qwen3_tied_dirs[0])
    assert w.models.target_value() == str(qwen3_tied_dirs[0])
    assert w.models.drafter_value() == str(qwen3_tied_dirs[1])
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    drop(w, empty)
    assert "config.json" in w.errors[-1] and w.models.target_value() == str(qwen3_tied_dirs[0])


def test_a_typed_drafter_survives_the_fit_marks_of_a_target_change(make_window, qwen3_tied_dirs, sliding_dirs):
    """Typing a drafter over a listed one, then changing the target, keeps what was typed."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"target": str(qwen3_tied_dirs[0]), "drafter": str(qwen3_tied_dirs[1]),
                                "recent_targets": [str(qwen3_tied_dirs[0])],
                                "recent_drafters": [str(qwen3_tied_dirs[1])]}))
    w = make_window()
    assert w.models.drafter_value() == str(qwen3_tied_dirs[1])
    w.models.drafter.set_value(str(sliding_dirs[1]))
    w.models.target.set_value(str(sliding_dirs[0]))
    w.models.check_now()  # marks every listed drafter against the new target
    assert w.models.drafter_value() == str(sliding_dirs[1])
    assert w.models.verdict_ok is True


def test_window_saves_settings_where_it_read_them(make_window, tmp_path, monkeypatch):
    w = make_window()
    read_from = w.settings_file
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(tmp_path / "elsewhere"))
    w.save_settings()
    assert read_from.is_file() and not (tmp_path / "elsewhere").exists()


CORRUPT_FILES = {
    "not UTF-8": b"\xff\xfe{\"max_tokens\": 5}",
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "nested field": b'{"max_tokens": 7, "recent_targets": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "not an object": b"[1, 2, 3]",
    "empty": b"",
    "an integer of 5000 digits": b'{"seed": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("content", CORRUPT_FILES.values(), ids=CORRUPT_FILES.keys())
def test_a_corrupt_settings_file_is_moved_aside_and_the_window_starts(make_window, content):
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    w = make_window()
    assert w.notices and "corrupt" in w.notices[0]
    assert path.with_name("settings.json.corrupt").read_bytes() == content  # kept, not destroyed
    assert w.prompt.max_tokens.value() == AppSettings().max_tokens


def test_a_second_corrupt_settings_file_never_replaces_the_first_ones_copy(make_window):
    """Each corrupt file is kept under its own name: the first held the user's prompt."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"prompt": "my precious prompt", "max_tokens": ')
    make_window().close()
    path.write_text('{"prompt": "second", ')
    w = make_window()
    assert path.with_name("settings.json.corrupt").read_text().startswith('{"prompt": "my precious prompt"')
    second = path.with_name("settings.json.corrupt-2")
    assert second.read_text() == '{"prompt": "second", '
    assert str(second) in w.notices[0]


def test_a_window_that_never_saves_leaves_a_corrupt_settings_file_where_it_is(make_window):
    """--screenshot's window (persist=False) writes no settings, so it has no reason to move the file."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"max_tokens": ')
    w = make_window(persist=False)
    assert w.notices and "corrupt" in w.notices[0] and "left as it is" in w.notices[0]
    assert path.read_text() == '{"max_tokens": '
    assert not path.with_name("settings.json.corrupt").exists()


HOSTILE_FIELDS = {
    "seed": 10**30,  # too large for Qt's spin box (it would raise)
    "temperature": float("nan"),
    "top_p": 0.0,
    "block_size": 99,
    "max_tokens": 0,
    "mode": "turbo",
    "prompt_format": "markdown",
    "center_tab": -5,
}


@pytest.mark.parametrize("name,value", HOSTILE_FIELDS.items(), ids=HOSTILE_FIELDS.keys())
def test_a_hostile_field_falls_back_alone(make_window, name, value):
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({name: value, "top_k": 7}))
    w = make_window()
    assert w.notices and name in w.notices[0]
    assert w.prompt.top_k.value() == 7  # the other fields are kept
    settings, _ = load_settings()
    assert getattr(settings, name) == getattr(AppSettings(), name)


def test_a_last_pair_that_no_longer_loads_never_stops_the_start(make_window, qwen3_tied_dirs, tmp_path):
    """The drafter saved as the last pair was later broken (a config nested too deeply to parse,
    as a hostile or corrupt file can be): the window still starts and says what is wrong."""
    import shutil

    drafter = tmp_path / "broken-drafter"
    shutil.copytree(qwen3_tied_dirs[1], drafter)
    (drafter / "config.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"target": str(qwen3_tied_dirs[0]), "drafter": str(drafter)}))
    w = make_window()
    w.models.check_now()
    assert w.models.verdict_ok is False
    assert "config.json" in w.models.verdict.text() and "nested too deeply" in w.models.verdict.text()


def test_loading_a_bundled_pair_swaps_an_untouched_sample_prompt_for_its_own(qtbot, make_window, qwen3_tied_dirs,
                                                                              sliding_dirs, tmp_path, monkeypatch):
    """The hybrid demo target stops at a bare trailing newline (its tokenizer joins a newline to the
    indentation after it), so it has its own sample; a prompt the user wrote is never replaced."""
    models = bundled_pairs(tmp_path, monkeypatch, qwen3_tied_dirs, sliding_dirs)
    w = make_window()
    assert w.prompt.prompt() == SAMPLE_PROMPT

    def load(target, drafter):
        w.models.target.set_value(str(models / target))
        w.models.drafter.set_value(str(models / drafter))
        with qtbot.waitSignal(w.controller.load_finished, timeout=60_000):
            w.start_load()
        assert w.errors == []

    load("demo-hybrid-target", "demo-hybrid-drafter")
    assert w.prompt.prompt() == SAMPLE_PROMPTS["demo-hybrid-target"] != SAMPLE_PROMPT
    load("demo-target", "demo-drafter")
    assert w.prompt.prompt() == SAMPLE_PROMPT
    w.prompt.set_prompt("def mine():\n")
    w.prompt.editor.insertPlainText("# typed\n")  # there is something to undo
    mine = w.prompt.prompt()
    load("demo-hybrid-target", "demo-hybrid-drafter")
    assert w.prompt.prompt() == mine
    assert w.prompt.editor.document().isUndoAvailable()  # the user's text was left alone, not set again


def test_a_bundled_target_named_as_the_command_line_takes_it_gets_its_own_sample(qwen3_tied_dirs, sliding_dirs,
                                                                                 tmp_path, monkeypatch):
    from engine.models.demo import sample_prompt

    models = bundled_pairs(tmp_path, monkeypatch, qwen3_tied_dirs, sliding_dirs)
    monkeypatch.chdir(tmp_path)
    own = SAMPLE_PROMPTS["demo-hybrid-target"]
    assert sample_prompt("demo-hybrid-target") == sample_prompt(str(models / "demo-hybrid-target")) == own
    assert sample_prompt(qwen3_tied_dirs[0]) == sample_prompt(None) == SAMPLE_PROMPT
    (tmp_path / "demo-hybrid-target").mkdir()  # a folder of that name here is what --target loads
    assert sample_prompt("demo-hybrid-target") == SAMPLE_PROMPT


def saved() -> dict:
    path = settings_path()
    return json.loads(path.read_text()) if path.is_file() else {}


def test_settings_are_saved_when_they_change_not_only_on_close(qtbot, make_window, monkeypatch):
    """A crash after typing loses at most the debounce's second: the file holds the typed prompt
    and the changed settings with the window still open, written once for a burst of keys."""
    import app.window

    w = make_window()
    qtbot.waitUntil(lambda: w.hf_scan_done and not w.autosave.timer.isActive())  # the launch's own changes
    writes = []
    real_save = app.window.save_settings
    monkeypatch.setattr(app.window, "save_settings", lambda s, path: writes.append(s.prompt) or real_save(s, path))
    w.prompt.editor.clear()
    qtbot.keyClicks(w.prompt.editor, "typed, then a crash")
    w.prompt.max_tokens.setValue(33)
    w.prompt.set_mode("ar")
    qtbot.waitUntil(lambda: saved().get("prompt") == "typed, then a crash", timeout=5000)
    assert (saved()["max_tokens"], saved()["mode"]) == (33, "ar") and w.isVisible()
    assert writes == ["typed, then a crash"]


def test_the_race_tabs_choices_are_kept_across_launches(qtbot, make_window):
    """The ticked methods, the draft model and its draft count were lost at every launch; they are saved
    as they change, like the prompt panel's settings, and a file naming a method no more known still loads."""
    w = make_window()
    qtbot.waitUntil(lambda: w.hf_scan_done and not w.autosave.timer.isActive())
    assert w.race_view.methods() == ["ar", "dflash", "lookup", "dflash+lookup"]  # a first launch's
    w.race_view.set_methods(["dflash", "draft-model"])
    w.race_view.draft_model.setText("/models/my-draft")
    w.race_view.num_draft.setValue(5)
    qtbot.waitUntil(lambda: saved().get("race_num_draft") == 5, timeout=5000)
    assert saved()["race_methods"] == ["ar", "dflash", "draft-model"]
    assert saved()["race_draft_model"] == "/models/my-draft" and w.isVisible()
    w.close()
    w2 = make_window()
    r = w2.race_view
    assert r.methods() == ["ar", "dflash", "draft-model"] and r.draft_model_value() == "/models/my-draft"
    assert r.num_draft.value() == 5 and r.num_draft.isEnabled()
    w2.close()
    data = saved()
    data.update(race_methods=["dflash", "medusa", 7], race_num_draft=10**6)
    settings_path().write_text(json.dumps(data))
    settings, notice = load_settings()
    assert settings.race_methods == ["dflash", "medusa"] and "race_num_draft" in notice
    w3 = make_window()
    assert w3.race_view.methods() == ["ar", "dflash"] and w3.race_view.num_draft.value() == AppSettings().race_num_draft


def test_a_screenshot_window_never_writes_settings(qtbot, make_window):
    w = make_window(persist=False)
    w.prompt.set_prompt("not to be kept")
    w.prompt.max_tokens.setValue(33)
    assert not w.autosave.timer.isActive() and not settings_path().exists()


def test_a_file_from_before_auto_was_the_default_gets_auto_and_a_choice_since_is_kept(tmp_path):
    """block_auto false in a file written before schema 2 was the old default, not a choice."""
    from app.settings import SCHEMA, load_settings, save_settings

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"block_auto": False, "max_tokens": 77}))
    settings, notice = load_settings(path)
    assert notice is None and settings.block_auto is True and settings.max_tokens == 77
    settings.block_auto = False  # the user unticks it: that is a choice, kept from now on
    assert save_settings(settings, path) is None and json.loads(path.read_text())["schema"] == SCHEMA
    assert load_settings(path)[0].block_auto is False


def test_thinking_goes_with_the_chat_template_only(qtbot, make_window):
    """A saved thinking choice with the raw format would have the engine refuse every run: raw text
    has no template to pass it to, so the panel passes none."""
    p = make_window().prompt
    p.thinking.setEnabled(True)  # as for a tokenizer whose template has a thinking switch
    p.thinking.setCurrentIndex(p.thinking.findData("on"))
    p.format.setCurrentIndex(p.format.findData("raw"))
    assert p.thinking_flag() is None
    p.format.setCurrentIndex(p.format.findData("chat"))
    assert p.thinking_flag() is True


def test_top_k_ranges_over_the_loaded_vocabulary(qtbot, make_window, qwen3_tied_dirs):
    """The Top-k box took up to 1,000,000 and Run then named the vocabulary's limit (QA pass): loading a
    pair bounds it by that target's vocabulary, and a value past it is cut to the bound with a notice."""
    w = make_window()
    choose(w, qwen3_tied_dirs, "print('hello')", top_k=200_000)
    with qtbot.waitSignal(w.load_finished, timeout=30_000):
        w.start_load()
    vocab = w.loaded.vocab_size
    assert vocab < 200_000 and w.prompt.top_k.maximum() == vocab - 1 == w.prompt.top_k.value()
    assert any("top-k 200,000" in n and f"{vocab:,} tokens" in n for n in w.notices)
    w.prompt.top_k.setValue(10)
    notices = len(w.notices)
    with qtbot.waitSignal(w.load_finished, timeout=30_000):
        w.start_load()
    assert w.prompt.top_k.value() == 10 and len(w.notices) == notices  # within the bound: left alone
