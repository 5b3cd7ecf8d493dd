"""Every field of a drafter's and a target's config.json, set to values a corrupt or hostile file
can hold, loaded the way a user's first run loads a pair: the pair either runs or is refused with
one sentence (a DFlashError, which the command line prints as one line and exit 2), never another
exception (the command line's "unexpected"). Each of the 330 cases is checked at the loader and a
short run; the command line itself runs a sample (every field once, the bad values in turn), where
it must stop with one line or run.

The runs verify the unbroken drafter's own block, fixed: with auto (the default) every broken
copy, a new folder, would need its own cost curve first; the curve itself is test_cost_curve's."""

from __future__ import annotations

import json
import shutil

import pytest

from app.cli import main as cli
from engine.decode.generate import generate
from engine.decode.prompts import encode_prompt
from engine.decode.settings import LOOKUP_BY_DEFAULT, GenerationSettings
from engine.errors import DFlashError
from engine.models.pair import load_pair

from helpers import PROMPTS

BAD_VALUES = {"missing": ..., "null": None, "negative": -1, "zero": 0, "text": "x", "fraction": 1.5,
              "list": [], "object": {}, "huge": 10**30, "true": True}


def _cases(fields):
    return [(f, name) for f in fields for name in BAD_VALUES]


def _write_config(src, dst, path_in_config, value):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    node = config
    for key in path_in_config[:-1]:
        node = node[key]
    if value is ...:
        node.pop(path_in_config[-1], None)
    else:
        node[path_in_config[-1]] = value
    (dst / "config.json").write_text(json.dumps(config))


def _block(unbroken_drafter) -> int:
    """The block of the drafter the broken copy was made from (a literal block would be refused by a
    fixture drafting smaller blocks, and every case would pass as a one-line stop)."""
    return json.loads((unbroken_drafter / "config.json").read_text())["block_size"]


def _run(capsys, target, drafter, unbroken_drafter) -> tuple[int, str]:
    """`generate` of 3 tokens at the unbroken drafter's block: (exit code, stderr)."""
    code = cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPTS[0], "--raw",
                "--max-tokens", "3", "--block-size", str(_block(unbroken_drafter)), "--json"])
    err = capsys.readouterr().err.strip()
    return code, err


def _assert_runs_or_one_line(code, err, case):
    assert code in (0, 2), case
    assert "unexpected" not in err and "Traceback" not in err, (case, err)
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("error: "), (case, err)


def _assert_loads_and_runs_or_one_sentence(target, drafter, unbroken_drafter, case):
    """What `generate` does before its output, through the library: load the pair, check the
    settings, run 3 tokens; the only refusal allowed is a DFlashError of one line."""
    try:
        pair = load_pair(target, drafter)
        settings = GenerationSettings(mode="dflash", max_tokens=3, block_size=_block(unbroken_drafter),
                                      lookup=LOOKUP_BY_DEFAULT).resolved(pair)
        list(generate(pair, encode_prompt(pair.tokenizer, PROMPTS[0], chat=False), settings))
    except DFlashError as exc:
        assert str(exc).strip() and "\n" not in str(exc).strip(), (case, str(exc))


def _check(capsys, target, drafter, unbroken_drafter, fields, field, bad):
    """The case at the loader; through the command line too when it is the field's sample: the
    bad values taken in turn, one per field, so every field and every kind of value meet the CLI."""
    _assert_loads_and_runs_or_one_sentence(target, drafter, unbroken_drafter, (field, bad))
    if fields.index(field) % len(BAD_VALUES) == list(BAD_VALUES).index(bad):
        _assert_runs_or_one_line(*_run(capsys, target, drafter, unbroken_drafter), (field, bad))


def test_the_unbroken_pair_runs(qwen3_tied_dirs, capsys):
    """The arguments every case runs with do run a pair: the cases below can tell a run from a stop."""
    target, drafter = qwen3_tied_dirs
    assert _run(capsys, target, drafter, drafter) == (0, "")


DRAFTER_FIELDS = [("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("num_key_value_heads",),
                  ("head_dim",), ("intermediate_size",), ("vocab_size",), ("rms_norm_eps",), ("rope_theta",),
                  ("max_position_embeddings",), ("layer_types",), ("num_target_layers",), ("block_size",),
                  ("dflash_config",), ("dflash_config", "mask_token_id"), ("dflash_config", "target_layer_ids"),
                  ("rope_scaling",), ("sliding_window",), ("is_causal",)]


@pytest.mark.parametrize("field,bad", _cases(DRAFTER_FIELDS), ids=lambda v: ".".join(v) if isinstance(v, tuple) else v)
def test_every_drafter_field(qwen3_tied_dirs, tmp_path, capsys, field, bad):
    target, drafter = qwen3_tied_dirs
    config = json.loads((drafter / "config.json").read_text())
    if field[0] == "dflash_config" and len(field) == 2 and field[0] not in config:
        pytest.skip("legacy schema without dflash_config")
    broken = tmp_path / "drafter"
    _write_config(drafter, broken, field, BAD_VALUES[bad])
    _check(capsys, target, broken, drafter, DRAFTER_FIELDS, field, bad)


TARGET_FIELDS = [("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("num_key_value_heads",),
                 ("vocab_size",), ("intermediate_size",), ("max_position_embeddings",), ("rope_theta",),
                 ("head_dim",), ("model_type",), ("tie_word_embeddings",), ("rms_norm_eps",)]


@pytest.mark.parametrize("field,bad", _cases(TARGET_FIELDS), ids=lambda v: ".".join(v) if isinstance(v, tuple) else v)
def test_every_target_field(qwen3_tied_dirs, tmp_path, capsys, field, bad):
    target, drafter = qwen3_tied_dirs
    broken = tmp_path / "target"
    _write_config(target, broken, field, BAD_VALUES[bad])
    _check(capsys, broken, drafter, drafter, TARGET_FIELDS, field, bad)


SCALING_FIELDS = [("embedding_multiplier",), ("logits_scaling",)]


@pytest.fixture(scope="module")
def granite_dirs(models_root, tokenizer_dir):
    """A Granite pair: its config keys scale the embeddings and logits the drafter borrows."""
    from fixtures import tiny_models as tm
    from fixtures.tiny_models import GRANITE, write_config_target

    root = models_root / "bad-config-granite"
    if not root.exists():
        write_config_target(root / "target", tokenizer_dir, "granite", seed=70, **GRANITE)
        tm.write_drafter(root / "drafter", root / "target", seed=71)
    return root / "target", root / "drafter"


@pytest.mark.parametrize("field,bad", _cases(SCALING_FIELDS), ids=lambda v: ".".join(v) if isinstance(v, tuple) else v)
def test_every_scaling_field(granite_dirs, tmp_path, capsys, field, bad):
    target, drafter = granite_dirs
    broken = tmp_path / "target"
    _write_config(target, broken, field, BAD_VALUES[bad])
    _check(capsys, broken, drafter, drafter, SCALING_FIELDS, field, bad)
