"""Every refused input gets one specific sentence naming the file and the field."""

import json
import shutil

import pytest

from app.cli import main as cli
from engine.models.doctor import check_pair
from engine.models.drafter_config import default_target_layer_ids
from engine.errors import DFlashError
from engine.models.pair import load_pair

from helpers import edit_config


@pytest.fixture
def pair_copy(qwen3_tied_dirs, tmp_path):
    target, drafter = qwen3_tied_dirs
    shutil.copytree(target, tmp_path / "target")
    shutil.copytree(drafter, tmp_path / "drafter")
    return tmp_path / "target", tmp_path / "drafter"


def problem(target, drafter):
    report = check_pair(target, drafter)
    assert not report.ok
    assert len(report.problems) >= 1
    return report.problems[0]


def test_both_schemas_pass(qwen3_tied_dirs, qwen3_untied_dirs):
    for dirs in (qwen3_tied_dirs, qwen3_untied_dirs):
        report = check_pair(*dirs)
        assert report.ok, report.problems
    assert "rope_theta" not in json.loads((qwen3_untied_dirs[1] / "config.json").read_text())


def test_published_default_tap_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]


def test_missing_config(pair_copy):
    target, drafter = pair_copy
    (drafter / "config.json").unlink()
    msg = problem(target, drafter)
    assert str(drafter / "config.json") in msg and "missing" in msg


def test_an_ordinary_model_given_as_the_drafter_is_pointed_to_draft_model_mode(qwen3_tied_dirs):
    """A small AR model given as --drafter got 'dflash_config is missing' and no word of the mode that
    takes it (QA pass)."""
    target = qwen3_tied_dirs[0]
    msg = problem(target, target)
    assert "field 'dflash_config' is missing, so this is not a DFlash drafter config (a 'qwen3' model" in msg
    assert "--mode draft-model --draft-model" in msg


def test_config_not_json(pair_copy):
    target, drafter = pair_copy
    (drafter / "config.json").write_text("{not json")
    msg = problem(target, drafter)
    assert "config.json" in msg and "not valid JSON" in msg


def test_target_config_missing(pair_copy):
    target, drafter = pair_copy
    (target / "config.json").unlink()
    msg = problem(target, drafter)
    assert str(target / "config.json") in msg


def test_target_without_a_tokenizer(pair_copy):
    """Its weights load, then the tokenizer fails with a cut-off transformers message: the doctor says it first."""
    target, drafter = pair_copy
    for f in target.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
            f.unlink()
    msg = problem(target, drafter)
    assert str(target) in msg and "no tokenizer" in msg


def test_rope_theta_absent_everywhere(pair_copy):
    target, drafter = pair_copy

    def drop(c):
        c.pop("rope_theta", None)
        c["rope_parameters"] = {"rope_type": "default"}

    edit_config(drafter, drop)
    msg = problem(target, drafter)
    assert "rope_theta" in msg and "rope_parameters" in msg and "config.json" in msg


def test_rope_theta_only_under_rope_parameters_is_read(pair_copy):
    target, drafter = pair_copy

    def move(c):
        c["rope_parameters"] = {"rope_theta": 1e7, "rope_type": "default"}
        c.pop("rope_theta")

    edit_config(drafter, move)
    report = check_pair(target, drafter)
    assert report.ok and report.facts["rope_theta"] == 1e7


def test_tap_outside_target_layers(pair_copy):
    target, drafter = pair_copy
    edit_config(drafter, lambda c: c["dflash_config"].update(target_layer_ids=[1, 9]))
    msg = problem(target, drafter)
    assert "target_layer_ids" in msg and "9" in msg and "4 layers" in msg


def test_hidden_size_mismatch(pair_copy):
    target, drafter = pair_copy
    edit_config(target, lambda c: c.update(hidden_size=128))
    msg = problem(target, drafter)
    assert "hidden_size" in msg and "128" in msg


def test_vocab_mismatch(pair_copy):
    target, drafter = pair_copy
    edit_config(drafter, lambda c: c.update(vocab_size=1000))
    msg = problem(target, drafter)
    assert "vocab_size" in msg and "1000" in msg


def test_mask_token_outside_vocab(pair_copy):
    target, drafter = pair_copy
    edit_config(drafter, lambda c: c["dflash_config"].update(mask_token_id=99999))
    msg = problem(target, drafter)
    assert "mask_token_id" in msg and "99999" in msg


def test_truncated_safetensors(pair_copy):
    target, drafter = pair_copy
    weights = drafter / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    msg = problem(target, drafter)
    assert "model.safetensors" in msg and "truncated or corrupt" in msg


def test_corrupt_target_safetensors(pair_copy):
    target, drafter = pair_copy
    (target / "model.safetensors").write_bytes(b"\x00" * 64)
    msg = problem(target, drafter)
    assert str(target / "model.safetensors") in msg and "truncated or corrupt" in msg


def _rewrite_weights(drafter, change):
    import mlx.core as mx

    weights = dict(mx.load(str(drafter / "model.safetensors")))
    change(weights)
    mx.save_safetensors(str(drafter / "model.safetensors"), weights)


def test_missing_tensor(pair_copy):
    target, drafter = pair_copy
    _rewrite_weights(drafter, lambda w: w.pop("layers.1.self_attn.k_norm.weight"))
    msg = problem(target, drafter)
    assert "layers.1.self_attn.k_norm.weight" in msg and "missing" in msg


def test_extra_tensor(pair_copy):
    import mlx.core as mx

    target, drafter = pair_copy
    _rewrite_weights(drafter, lambda w: w.update({"lm_head.weight": mx.zeros((4, 4))}))
    msg = problem(target, drafter)
    assert "lm_head.weight" in msg and "unexpected" in msg


def test_wrong_shape(pair_copy):
    import mlx.core as mx

    target, drafter = pair_copy
    _rewrite_weights(drafter, lambda w: w.update({"fc.weight": mx.zeros((64, 64))}))
    msg = problem(target, drafter)
    assert "fc.weight" in msg and "[64, 64]" in msg and "[64, 128]" in msg


def test_v1_config_with_dflash2_tensors_refused(pair_copy):
    import mlx.core as mx

    target, drafter = pair_copy
    _rewrite_weights(drafter, lambda w: w.update({"candidate_selector.weight": mx.zeros((4,))}))
    msg = problem(target, drafter)
    assert "DFlash v1" in msg and "DFlash2 tensor 'candidate_selector.weight'" in msg


def test_load_pair_raises_the_doctors_sentence(pair_copy):
    target, drafter = pair_copy
    edit_config(drafter, lambda c: c.update(vocab_size=7))
    with pytest.raises(DFlashError, match="vocab_size"):
        load_pair(target, drafter)


def test_cli_doctor_exit_codes(qwen3_tied_dirs, pair_copy, capsys):
    assert cli(["doctor", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1])]) == 0
    assert "verdict: ready" in capsys.readouterr().out
    # A target alone is ready for AR only, and says so: "ready" alone read as ready for DFlash, and then
    # parity refused with advice ("use AR mode") that parity cannot take.
    assert cli(["doctor", "--target", str(qwen3_tied_dirs[0])]) == 0
    assert "drafter_given: none: AR only (DFlash, parity and bench need --drafter)" in capsys.readouterr().out
    assert cli(["parity", "--target", str(qwen3_tied_dirs[0]), "--prompt", "x = 1", "--max-tokens", "4"]) == 2
    said = capsys.readouterr().err
    assert "DFlash needs a drafter: give --drafter" in said and "use AR mode" not in said
    target, drafter = pair_copy
    edit_config(drafter, lambda c: c.update(hidden_size=32))
    assert cli(["doctor", "--target", str(target), "--drafter", str(drafter)]) == 2
    out = capsys.readouterr().out
    assert "verdict: cannot run" in out and "hidden_size" in out


def test_cli_error_is_one_line_without_traceback(pair_copy, capsys):
    target, drafter = pair_copy
    (drafter / "config.json").write_text("[]")
    code = cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


def test_missing_folder_and_unknown_id(tmp_path, capsys):
    code = cli(["doctor", "--target", str(tmp_path / "nope"), "--drafter", str(tmp_path / "nope2")])
    out = capsys.readouterr().out
    assert code == 2 and "no such folder" in out


def test_a_drafter_trained_for_another_target_is_named(capsys):
    """The two demo targets have the same shapes, so only train-drafter's record tells their drafters
    apart: the doctor, the CLI and the window's verdict warn; the pair still runs (exactly)."""
    from pathlib import Path

    MODELS_DIR = Path(__file__).resolve().parents[1] / "resources" / "models"
    target, hybrid_drafter = MODELS_DIR / "demo-target", MODELS_DIR / "demo-hybrid-drafter"
    report = check_pair(target, hybrid_drafter)
    assert report.ok and len(report.warnings) == 1
    assert report.warnings[0].startswith("demo-hybrid-drafter was trained for other target weights than these (demo-hybrid-target")
    assert check_pair(target, MODELS_DIR / "demo-dflash2-drafter").warnings == []
    assert check_pair(MODELS_DIR / "demo-hybrid-target", hybrid_drafter).warnings == []
    assert cli(["doctor", "--target", str(target), "--drafter", str(hybrid_drafter)]) == 0
    assert f"warning: {report.warnings[0]}" in capsys.readouterr().out
    assert cli(["generate", "--target", str(target), "--drafter", str(hybrid_drafter), "--prompt", "def f(",
                "--raw", "--max-tokens", "2", "--block-size", "4", "--json"]) == 0
    assert f"warning: {report.warnings[0]}" in capsys.readouterr().err


@pytest.mark.parametrize("field,value,said", [("vocab_size", 8192, "the weights' embedding"),
                                              ("num_hidden_layers", 30, "the weights hold layers")])
def test_a_target_config_that_does_not_fit_its_weights_is_the_targets_problem(pair_copy, field, value, said):
    """It was reported as the drafter's (its taps outside the config's layers, its selector's rows)."""
    target, drafter = pair_copy
    edit_config(target, lambda c: c.update({field: value}))
    line = problem(target, drafter)
    assert line.startswith(f"{target / 'config.json'}: '{field}' is {value}") and said in line, line
    assert str(drafter) not in line


def test_a_missing_shard_is_named_not_blamed_on_the_config(pair_copy):
    """An interrupted download of a sharded model: the missing file is named (it read as a config whose
    layer count does not fit its weights)."""
    target, drafter = pair_copy
    (target / "model.safetensors").rename(target / "model-00001-of-00002.safetensors")
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    line = problem(target, drafter)
    assert "model-00002-of-00002.safetensors (of 2 in model.safetensors.index.json) is missing" in line, line


def test_an_unfinished_training_run_is_named_not_read_as_a_broken_drafter(qwen3_tied_dirs, tmp_path):
    """After Ctrl-C a train-drafter --out holds only checkpoint/: doctor said 'config.json is missing',
    and on checkpoint/ itself '30 extra tensors' (the optimizer's state read as weights; QA pass)."""
    import shutil

    run = tmp_path / "run"
    ckpt = run / "checkpoint"
    ckpt.mkdir(parents=True)
    shutil.copy(qwen3_tied_dirs[1] / "model.safetensors", ckpt / "model.safetensors")
    shutil.copy(qwen3_tied_dirs[1] / "model.safetensors", ckpt / "optimizer.safetensors")
    (ckpt / "state.json").write_text('{"step": 3}')
    said = problem(qwen3_tied_dirs[0], run)
    assert "no drafter yet, only the checkpoint of a train-drafter run that did not finish" in said
    assert f"train-drafter --out {run} --resume" in said
    said = problem(qwen3_tied_dirs[0], ckpt)
    assert "a train-drafter checkpoint, not a drafter" in said and f"--out {run} --resume" in said
