"""Nothing the user made is lost, and bad input is one line: a table of cases run through the CLI.

Each case asserts exit 2, one line on stderr with no "unexpected" and no traceback, and that
every file that existed before is byte-identical afterwards. Fault cases kill a writer with
SIGKILL mid-write and check what is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main as cli
from engine.models.checkpoint import target_fingerprint
from engine.tools.trace import read_trace

from helpers import PROMPTS


def _snapshot(*roots: Path) -> dict[str, str]:
    files = {}
    for root in roots:
        for p in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if p.is_file():
                files[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files


def _refused(argv: list[str], capsys, *keep: Path) -> str:
    before = _snapshot(*keep)
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "unexpected" not in err and "Traceback" not in err
    assert _snapshot(*keep) == before, "a file that existed before was changed"
    return lines[0]


@pytest.fixture
def old_trace(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text('{"type": "header", "schema": "dflash-trace/1"}\n{"type": "summary"}\n')
    return path


BAD_GENERATE_SETTINGS = {
    "block size 99": ["--block-size", "99"],
    "negative temperature": ["--temperature", "-1"],
    "top-p 0": ["--top-p", "0"],
    "top-k past the vocabulary": ["--top-k", "100000000"],
    "min-p 1": ["--min-p", "1"],
    "negative seed": ["--seed", "-3"],
    "zero max tokens": ["--max-tokens", "0"],
    "max tokens past the limit": ["--max-tokens", "1000000000"],
}


@pytest.mark.parametrize("extra", BAD_GENERATE_SETTINGS.values(), ids=BAD_GENERATE_SETTINGS.keys())
def test_a_refused_setting_leaves_the_previous_trace(qwen3_tied_dirs, old_trace, capsys, extra):
    t, d = qwen3_tied_dirs
    _refused(["generate", "--target", str(t), "--drafter", str(d), "--prompt", PROMPTS[0], "--raw",
              "--trace", str(old_trace), *extra], capsys, old_trace)
    assert not list(old_trace.parent.glob(old_trace.name + ".*.partial"))


def test_the_trace_is_never_the_prompt_file(qwen3_tied_dirs, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPTS[0])
    t, d = qwen3_tied_dirs
    line = _refused(["generate", "--target", str(t), "--drafter", str(d), "--prompt-file", str(prompt),
                     "--trace", str(prompt)], capsys, prompt)
    assert "input" in line


def test_export_never_replaces_its_input(old_trace, tmp_path, capsys):
    _refused(["export", str(old_trace), "--chrome", str(old_trace)], capsys, old_trace)
    _refused(["export", str(old_trace), "--chrome", str(tmp_path)], capsys, old_trace)  # a folder


def test_a_finished_run_replaces_the_trace_whole(qwen3_tied_dirs, old_trace, capsys):
    t, d = qwen3_tied_dirs
    assert cli(["generate", "--target", str(t), "--drafter", str(d), "--prompt", PROMPTS[0], "--raw",
                "--max-tokens", "12", "--trace", str(old_trace), "--json"]) == 0
    header, records = read_trace(old_trace)
    assert header["prompt"]["text"] == PROMPTS[0] and records[-1]["type"] == "summary"
    assert not list(old_trace.parent.glob(old_trace.name + ".*.partial"))


def _train(target, corpus_dir, out, *extra):
    return ["train-drafter", "--target", str(target), "--data", str(corpus_dir), "--out", str(out), "--steps", "2",
            "--batch", "2", "--seq-len", "48", "--block-size", "8", "--eval-every", "1", "--checkpoint-every", "1",
            *extra]


BAD_TRAIN_NUMBERS = {
    "lr nan": ["--lr", "nan"], "lr inf": ["--lr", "inf"], "lr 0": ["--lr", "0"], "lr negative": ["--lr", "-1"],
    "steps 0": ["--steps", "0"], "batch 0": ["--batch", "0"], "seq-len 1": ["--seq-len", "1"],
    "anchors 0": ["--anchors", "0"], "block size 1": ["--block-size", "1"], "layers 0": ["--layers", "0"],
    "layers past the target's": ["--layers", "500"],  # was accepted: 102 s a step, a 1.2 GB checkpoint
    "seq-len 16 with a block of 16": ["--seq-len", "16", "--block-size", "16"],
}


@pytest.mark.parametrize("extra", BAD_TRAIN_NUMBERS.values(), ids=BAD_TRAIN_NUMBERS.keys())
def test_training_numbers_are_checked_first(qwen3_tied_dirs, corpus_dir, tmp_path, capsys, extra):
    out = tmp_path / "drafter"
    _refused(_train(qwen3_tied_dirs[0], corpus_dir, out, *extra), capsys, qwen3_tied_dirs[0])
    assert not out.exists()


def test_training_numbers_are_refused_with_the_limit_that_applies(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    """--seq-len 1 said "at least 2", and 16 then failed on the block; --layers past the target's said nothing."""
    from engine.models.drafter_config import flat_config, read_config_json

    target = qwen3_tied_dirs[0]
    line = _refused(_train(target, corpus_dir, tmp_path / "d", "--seq-len", "1"), capsys, target)
    assert "--seq-len 1 must be longer than the block (8)" in line
    depth = flat_config(read_config_json(target))["num_hidden_layers"]
    line = _refused(_train(target, corpus_dir, tmp_path / "d", "--layers", str(depth + 1)), capsys, target)
    assert f"more than the target's own {depth}" in line


def test_training_never_writes_into_the_bundled_demo_models(qwen3_tied_dirs, corpus_dir, tmp_path, capsys,
                                                             monkeypatch):
    """The demo drafters say train-drafter made them, so --force replaced the app's own copy."""
    bundled = tmp_path / "resources" / "models"
    shutil.copytree(qwen3_tied_dirs[1], bundled / "demo-drafter")
    monkeypatch.setenv("DFLASH_MODELS_DIR", str(bundled))
    for out in (bundled / "demo-drafter", bundled / "mine", bundled):
        line = _refused(_train(qwen3_tied_dirs[0], corpus_dir, out, "--force"), capsys, bundled / "demo-drafter")
        assert "bundled demo models" in line
    assert not (bundled / "mine").exists()


def test_training_never_writes_over_a_model_it_did_not_make(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    target, drafter = qwen3_tied_dirs
    line = _refused(_train(target, corpus_dir, target), capsys, target)
    assert "own folder" in line
    _refused(_train(target, corpus_dir, target, "--force"), capsys, target)  # the target: not even with --force
    inside = target / "sub"  # it wrote a drafter and its checkpoints into the target's folder
    assert "inside the --target model's folder" in _refused(_train(target, corpus_dir, inside, "--force"), capsys,
                                                            target)
    assert not inside.exists()
    copy = tmp_path / "someone-elses-drafter"
    shutil.copytree(drafter, copy)
    assert "--force" in _refused(_train(target, corpus_dir, copy), capsys, copy)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    _refused(_train(target, corpus_dir, a_file), capsys, a_file)
    # With --force, a drafter folder may be replaced; the result is marked as ours.
    assert cli(_train(target, corpus_dir, copy, "--force")) == 0
    made = json.loads((copy / "train_drafter.json").read_text())
    assert made["target"] == {"name": target.name, "fingerprint": target_fingerprint(target)}  # the doctor reads it
    capsys.readouterr()
    # A drafter train-drafter finished is the user's now: a new run does not replace it silently.
    line = _refused(_train(target, corpus_dir, copy, "--lr", "1e-3"), capsys, copy)
    assert "made before" in line and "--force" in line and "--resume" in line
    # ... and --force does: over its checkpoint too (it had nowhere to go but a hand-deleted folder).
    assert cli(_train(target, corpus_dir, copy, "--lr", "1e-3", "--force")) == 0
    assert json.loads((copy / "train_drafter.json").read_text())["settings"]["lr"] == 1e-3
    capsys.readouterr()


def test_force_never_removes_a_checkpoint_folder_train_drafter_did_not_write(qwen3_tied_dirs, corpus_dir, tmp_path,
                                                                           capsys):
    """`checkpoint` is a common name: a folder of one's own notes (or TensorFlow's `checkpoint` file) in --out
    is refused by name, --force or not; train-drafter's own is removed only once every input was read."""
    target = qwen3_tied_dirs[0]
    out = tmp_path / "work"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "notes.txt").write_text("mine")
    line = _refused(_train(target, corpus_dir, out, "--force"), capsys, out)
    assert "is not a train-drafter checkpoint" in line and (out / "checkpoint" / "notes.txt").read_text() == "mine"
    tf = tmp_path / "tf"
    tf.mkdir()
    (tf / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"')
    assert "is not a train-drafter checkpoint" in _refused(_train(target, corpus_dir, tf, "--force"), capsys, tf)
    # train-drafter's own, with --force and a --data that does not exist: nothing removed before the refusal
    ours = tmp_path / "ours"
    assert cli(_train(target, corpus_dir, ours)) == 0
    state = (ours / "checkpoint" / "state.json").read_text()
    capsys.readouterr()
    args = _train(target, corpus_dir, ours, "--force")
    args[args.index("--data") + 1] = str(tmp_path / "no-such-corpus")
    assert cli(args) == 2 and (ours / "checkpoint" / "state.json").read_text() == state
    capsys.readouterr()


def test_a_checkpoint_swap_cut_short_is_still_train_drafters(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    """A kill while the old checkpoint is being removed leaves checkpoint.old without its state.json: still
    ours (--resume goes on from the new one), where a folder of one's own files is not."""
    from engine.training.cli import ours_checkpoint

    out = tmp_path / "drafter"
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out)) == 0
    old = out / "checkpoint.old"
    shutil.copytree(out / "checkpoint", old)
    (old / "state.json").unlink()  # rmtree got that far
    assert ours_checkpoint(old) and not ours_checkpoint(tmp_path)
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out, "--resume")) == 0
    capsys.readouterr()


def test_force_over_a_sharded_model_leaves_no_shard_beside_the_drafter(qwen3_tied_dirs, corpus_dir, tmp_path,
                                                                       capsys):
    """A sharded model replaced with --force: its shards and index would be read with the new weights."""
    import mlx.core as mx

    target, drafter = qwen3_tied_dirs
    sharded = tmp_path / "sharded"
    shutil.copytree(drafter, sharded)
    weights = mx.load(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        mx.save_safetensors(str(sharded / file), {k: weights[k] for k in keys})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in halves.items() for k in keys}}))
    assert cli(["doctor", "--target", str(target), "--drafter", str(sharded)]) == 0
    assert cli(_train(target, corpus_dir, sharded, "--force")) == 0
    assert sorted(f.name for f in sharded.glob("*.safetensors*")) == ["model.safetensors"]
    assert cli(["doctor", "--target", str(target), "--drafter", str(sharded)]) == 0
    capsys.readouterr()


def test_a_crash_mid_checkpoint_resumes_from_the_saved_step(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    out = tmp_path / "drafter"
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out)) == 0
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 2
    # A kill between the two renames of a checkpoint swap leaves only checkpoint.old.
    (out / "checkpoint").rename(out / "checkpoint.old")
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out)) == 2  # not silently started anew
    assert "--resume" in capsys.readouterr().err
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out, "--resume")) == 0
    assert "resumed from step 2" in capsys.readouterr().err
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 2
    assert not (out / "checkpoint.old").exists()


def test_resume_without_a_checkpoint_says_so(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    line = _refused(_train(qwen3_tied_dirs[0], corpus_dir, tmp_path / "empty", "--resume"), capsys,
                    qwen3_tied_dirs[0])
    assert "no checkpoint" in line


def test_kill_9_mid_trace_keeps_the_old_trace_and_a_readable_prefix(qwen3_tied_dirs, old_trace):
    """SIGKILL while a trace is written: the earlier trace is untouched and what was written reads back."""
    t, d = qwen3_tied_dirs
    before = old_trace.read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "generate", "--target", str(t), "--drafter", str(d),
                             "--prompt", PROMPTS[0], "--raw", "--max-tokens", "4000", "--block-size", "2",
                             "--trace", str(old_trace), "--json"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = old_trace.with_name(f"{old_trace.name}.{proc.pid}.partial")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait for a few rounds on disk, then kill
            if partial.exists() and partial.read_text().count('"type": "round"') >= 3:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("no rounds were written within 120 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert old_trace.read_bytes() == before
    header, records = read_trace(partial)
    assert header["schema"] == "dflash-trace/1" and any(r["type"] == "round" for r in records)


class _CancelAfterFirstChunk:
    """A cancel token that reads as not cancelled once (before the first prefill chunk), then cancelled."""

    def __init__(self):
        self.reads = 0

    @property
    def cancelled(self) -> bool:
        self.reads += 1
        return self.reads > 1

    def cancel(self) -> None:
        pass


def test_stop_reaches_prefill_between_chunks(qwen3_pair, monkeypatch):
    import engine.decode.generate as decoder
    import engine.decode.prefill as prefill
    from engine.decode.events import SummaryEvent, TextEvent
    from engine.decode.settings import GenerationSettings

    monkeypatch.setattr(prefill, "chunk_size", lambda: 4)
    ids = list(range(100, 140))  # 10 chunks of 4
    cancel = _CancelAfterFirstChunk()
    events = list(decoder.generate(qwen3_pair, ids, GenerationSettings(max_tokens=8), cancel))
    summary = events[-1]
    assert isinstance(summary, SummaryEvent) and summary.stop_reason == "cancelled"
    assert summary.num_generated == 0 and not any(isinstance(e, TextEvent) for e in events)
    assert cancel.reads == 2  # checked before chunk 1 and chunk 2; the other 8 never ran


def test_prompts_longer_than_the_context_are_refused(qwen3_pair, qwen3_tied_dirs, tmp_path, capsys):
    from engine.decode.generate import generate
    from engine.decode.settings import GenerationSettings
    from engine.errors import SettingsError

    context = 4096  # the fixtures' max_position_embeddings
    with pytest.raises(SettingsError, match="context is 4096"):
        next(generate(qwen3_pair, [100] * context, GenerationSettings(max_tokens=4)))
    with pytest.raises(SettingsError, match="max tokens 96 or fewer"):
        next(generate(qwen3_pair, [100] * (context - 96), GenerationSettings(max_tokens=200)))
    # bench checks every prompt before it measures any, and names the one at fault
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n" + json.dumps({"prompt": "x " * 5000}) + "\n")
    t, d = qwen3_tied_dirs
    line = _refused(["bench", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--raw"],
                    capsys, prompts)
    assert line.startswith("error: prompt 2 ")


@pytest.fixture(scope="module")
def real_trace(qwen3_tied_dirs, tmp_path_factory):
    """A real run's trace records, written once for the module's damaged copies."""
    import contextlib
    import io

    t, d = qwen3_tied_dirs
    path = tmp_path_factory.mktemp("trace") / "good.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli(["generate", "--target", str(t), "--drafter", str(d), "--prompt", PROMPTS[0], "--raw",
                    "--max-tokens", "16", "--trace", str(path), "--json"]) == 0
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trace_window(qapp):
    """One window for every damaged trace of the module: each must leave it usable for the next."""
    from app.window import MainWindow

    window = MainWindow(persist=False)
    yield window
    window.close()
    window.deleteLater()


HOSTILE_RECORD_VALUES = {"text": "many", "negative": -5, "list of text": ["a"], "null": None, "object": {},
                         "nan": float("nan"), "missing": ...}


@pytest.mark.parametrize("kind", ["header", "round", "text", "summary"])
@pytest.mark.parametrize("bad", HOSTILE_RECORD_VALUES, ids=HOSTILE_RECORD_VALUES.keys())
def test_a_damaged_trace_is_one_sentence_and_the_window_stays_usable(real_trace, trace_window, tmp_path, capsys,
                                                                     kind, bad):
    """Every field of one record of each kind, set to a value of the wrong kind: export and the
    window's File > Open either read it (the field was optional) or say which line is damaged. One
    window opens every damaged trace in turn, so each must leave it able to open the next."""
    records, window = real_trace, trace_window
    index = next(i for i, r in enumerate(records) if r["type"] == kind)
    fields = [k for k in records[index] if k not in ("type", "schema")]
    for field in fields:
        damaged = [dict(r) for r in records]
        if HOSTILE_RECORD_VALUES[bad] is ...:
            damaged[index].pop(field)
        else:
            damaged[index][field] = HOSTILE_RECORD_VALUES[bad]
        path = tmp_path / f"{kind}-{field}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in damaged))
        code = cli(["export", str(path), "--chrome", str(tmp_path / "out.json")])
        err = capsys.readouterr().err.strip()
        assert code in (0, 2) and "unexpected" not in err and "Traceback" not in err, (field, err)
        if code == 2:
            assert len(err.splitlines()) == 1 and str(path) in err, (field, err)
        before = len(window.errors)
        opened = window.open_trace(path)
        assert opened == (len(window.errors) == before), field  # opened, or one error shown


def _kill_when(proc, ready, what: str, timeout: float = 120) -> None:
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            assert proc.poll() is None, f"the process ended before {what}"
            time.sleep(0.02)
        pytest.fail(f"no {what} within {timeout} s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _env():
    root = str(Path(__file__).parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_kill_9_mid_training_resumes_from_a_checkpoint(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    """SIGKILL while train-drafter checkpoints every step: --resume continues from a saved step."""
    out = tmp_path / "drafter"
    argv = _train(qwen3_tied_dirs[0], corpus_dir, out, "--steps", "40")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", *argv], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def saved_a_few() -> bool:
        for name in ("checkpoint", "checkpoint.tmp", "checkpoint.old"):
            try:
                if json.loads((out / name / "state.json").read_text())["step"] >= 3:
                    return True
            except (OSError, ValueError, KeyError):
                pass
        return False

    _kill_when(proc, saved_a_few, "three checkpoints")
    assert cli(argv + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "resumed from step " in err
    step = int(err.split("resumed from step ")[1].split()[0])
    assert step >= 3
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 40


def test_kill_9_mid_settings_save_leaves_settings_that_load(tmp_path):
    """SIGKILL while the window's settings are saved over and over: what is left loads cleanly."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "from app.settings import AppSettings, save_settings\n"
        "path = Path(sys.argv[2]); n = 0\n"
        "while True:\n"
        "    n += 1\n"
        "    save_settings(AppSettings(seed=n % 1000, prompt='x' * 200_000), path)\n"
        "    if n == 3: Path(sys.argv[3]).touch()\n"
    )
    path, started = tmp_path / "settings.json", tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent.parent), str(path), str(started)],
                            env=_env())
    _kill_when(proc, started.exists, "three saves")
    from app.settings import load_settings

    settings, notice = load_settings(path)
    assert notice is None and settings.prompt == "x" * 200_000


def test_resume_refuses_a_checkpoint_made_with_other_taps(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    out = tmp_path / "drafter"
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out, "--taps", "0,1")) == 0
    capsys.readouterr()
    line = _refused(_train(qwen3_tied_dirs[0], corpus_dir, out, "--taps", "1,2", "--resume"), capsys, out)
    assert "taps" in line


def test_a_leftover_tmp_checkpoint_is_not_thrown_away_without_resume(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    out = tmp_path / "drafter"
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, out)) == 0
    capsys.readouterr()
    (out / "checkpoint").rename(out / "checkpoint.tmp")  # the first save crashed before its rename
    assert "--resume" in _refused(_train(qwen3_tied_dirs[0], corpus_dir, out), capsys, out)


def test_the_partial_trace_is_never_an_input(qwen3_tied_dirs, tmp_path, capsys):
    import os as _os

    trace = tmp_path / "p.txt"
    prompt = tmp_path / f"p.txt.{_os.getpid()}.partial"
    prompt.write_text(PROMPTS[0])
    t, d = qwen3_tied_dirs
    _refused(["generate", "--target", str(t), "--drafter", str(d), "--prompt-file", str(prompt),
              "--trace", str(trace)], capsys, prompt)


def test_ctrl_c_mid_training_resumes_exactly_as_if_never_stopped(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    """SIGINT lands wherever it lands in a step; the run saves a consistent state, exits 130, and a
    resumed run ends with the very weights of an uninterrupted one."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    steps = ["--steps", "20"]
    assert cli(_train(qwen3_tied_dirs[0], corpus_dir, whole, *steps)) == 0
    capsys.readouterr()
    argv = _train(qwen3_tied_dirs[0], corpus_dir, split, *steps)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", *argv], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if json.loads((split / "checkpoint" / "state.json").read_text())["step"] >= 3:
                    break
            except (OSError, ValueError, KeyError):
                pass
            assert proc.poll() is None, "training ended before it could be interrupted"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    stopped_at = json.loads((split / "checkpoint" / "state.json").read_text())["step"]
    assert 3 <= stopped_at < 20
    assert cli(argv + ["--resume"]) == 0
    capsys.readouterr()
    assert (split / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


def test_no_output_lands_on_a_model_file(qwen3_tied_dirs, old_trace, tmp_path, capsys):
    """A trace or an export pointed at a model's own file (weights, config, tokenizer) is refused: it
    once replaced the target's model.safetensors with a 5 KB trace."""
    t, d = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(qwen3_tied_dirs[0], t)
    shutil.copytree(qwen3_tied_dirs[1], d)
    run = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "4"]
    for victim in (t / "model.safetensors", d / "model.safetensors", t / "config.json", t / "tokenizer.json"):
        assert victim.is_file()
        line = _refused([*run, "--trace", str(victim)], capsys, t, d)
        assert "is one of the files of the model in" in line, line
    line = _refused(["export", str(old_trace), "--chrome", str(t / "model.safetensors")], capsys, t, old_trace)
    assert "is one of the files of the model in" in line, line
    # a file of the user's beside a model is no model's file: written, and replaced the next time
    for _ in range(2):
        assert cli([*run, "--trace", str(t / "run.jsonl"), "--json"]) == 0
        assert read_trace(t / "run.jsonl")[1][-1]["type"] == "summary"
    capsys.readouterr()
    # a Hugging Face snapshot: its files are links into blobs/, a folder that holds no config.json
    repo = tmp_path / "hub" / "models--someone--model"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for f in t.iterdir():
        if f.is_file() and f.name != "run.jsonl":
            blob = repo / "blobs" / f"sha-{f.name}"
            shutil.copy(f, blob)
            (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    line = _refused([*run, "--trace", str(snapshot / "model.safetensors")], capsys, repo / "blobs")
    assert "is one of the files of the model in" in line, line


def test_a_pipe_or_device_is_never_replaced_and_a_link_is_written_through(qwen3_tied_dirs, tmp_path, capsys):
    """Writing to a temporary name and renaming it over a device (`--trace /dev/null` as root) or a
    pipe would replace it with a plain file: refused. A link keeps being a link to the new trace."""
    import stat

    t, d = qwen3_tied_dirs
    run = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "4"]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    line = _refused([*run, "--trace", str(pipe)], capsys)
    assert "not a plain file" in line and stat.S_ISFIFO(os.stat(pipe).st_mode)
    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    real.write_text("old")
    link.symlink_to(real)
    assert cli([*run, "--trace", str(link), "--json"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and read_trace(real)[1][-1]["type"] == "summary"


BAD_CALIBRATE_SETTINGS = {"block size 0": ["--block-size", "0"], "block size 1000": ["--block-size", "1000"],
                          "negative window": ["--draft-window", "-5"], "repeats 0": ["--repeats", "0"]}


@pytest.mark.parametrize("extra", BAD_CALIBRATE_SETTINGS.values(), ids=BAD_CALIBRATE_SETTINGS.keys())
def test_calibrate_checks_its_settings_as_a_run_does(qwen3_tied_dirs, tmp_path, monkeypatch, capsys, extra):
    """calibrate once took block 0 as the drafter's, measured and cached a window of -5, and blamed
    the repeats for a block of 1000."""
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    t, d = qwen3_tied_dirs
    line = _refused(["calibrate", "--target", str(t), "--drafter", str(d), *extra], capsys)
    said = {"0": "block size 0 is not a block size", "1000": "block size 1000 is outside",
            "-5": "draft window -5 is outside", "repeats": "repeats 0 must be at least 1"}
    assert said["repeats" if extra[0] == "--repeats" else extra[1]] in line, line
    assert not list(tmp_path.rglob("*.json"))


def test_calibrate_without_a_drafter_measures_the_target(qwen3_tied_dirs, tmp_path, monkeypatch, capsys):
    """A target alone has a cost curve too (verifies of 1..16 and its AR step): the settings check
    must not ask for a drafter there."""
    import engine.decode.cost_curve as cc

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS,))
    assert cli(["calibrate", "--target", str(qwen3_tied_dirs[0]), "--block-size", "4", "--repeats", "1",
                "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["verify_ms"]) == 4
