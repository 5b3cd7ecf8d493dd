"""The bundled demo pairs, loaded as a user's first run loads them.

Every pair must pass `doctor`, decode the sample prompt losslessly, and have a
drafter trained for its target: one retrained without the other accepts no
more than an untrained drafter does. The default target must go on from the sample prompt with an
indented body, which is what its tokenizer was changed for.
"""

from __future__ import annotations

import json

import pytest

from engine.models.demo import DEMO_PAIRS, SAMPLE_PROMPT, demo_pair, demo_pairs, sample_prompt
from engine.models.doctor import check_pair
from engine.decode.settings import GenerationSettings
from engine.tools.parity import run_parity
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair
from fixtures.tiny_models import write_untrained_copy

PAIRS = demo_pairs()


def test_every_bundled_pair_is_installed_in_the_source_tree():
    assert [(t.name, d.name) for t, d in PAIRS] == DEMO_PAIRS
    assert demo_pair() == PAIRS[0]


def _parity(target, drafter, max_tokens=48):
    pair = load_pair(target, drafter)
    ids = encode_prompt(pair.tokenizer, sample_prompt(target), chat=False)  # the window's start on this pair
    return run_parity(pair, ids, GenerationSettings(max_tokens=max_tokens))


@pytest.mark.parametrize("target,drafter", PAIRS, ids=[t.name for t, _ in PAIRS])
def test_bundled_pair_is_lossless_and_its_drafter_fits_its_target(target, drafter, tmp_path):
    assert check_pair(target, drafter).ok
    result = _parity(target, drafter)
    assert result.identical, (result.first_divergence, result.margin_at_divergence)

    untrained = _parity(target, write_untrained_copy(tmp_path / "untrained", drafter))
    assert untrained.identical
    assert result.dflash.mean_acceptance_length > untrained.dflash.mean_acceptance_length + 0.1


def test_default_target_continues_the_sample_prompt_with_an_indented_body():
    result = _parity(*PAIRS[0], max_tokens=16)
    first_line = result.ar.text.split("\n")[0]
    assert first_line.startswith("    ") and first_line.strip(), repr(result.ar.text)


@pytest.mark.parametrize("target,drafter", PAIRS, ids=[t.name for t, _ in PAIRS])
def test_first_runs_encode_the_prompt_as_the_pair_was_trained(target, drafter, capsys):
    """The demo targets are base models: with no format flag (generate, parity, bench, demo) the
    prompt is encoded raw, as in training and in the model cards' figures, never chat-wrapped."""
    from app.cli import main as cli
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    raw = tokenizer.encode(SAMPLE_PROMPT, add_special_tokens=True)
    pair = load_pair(target, drafter)
    assert not pair.tokenizer.has_chat_template
    assert encode_prompt(pair.tokenizer, SAMPLE_PROMPT) == encode_prompt(pair.tokenizer, SAMPLE_PROMPT, chat=False)
    assert encode_prompt(pair.tokenizer, SAMPLE_PROMPT) == raw
    assert cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", SAMPLE_PROMPT,
                "--max-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_token_ids"] == raw


def test_the_bundled_draft_model_is_found_by_name_and_drafts_losslessly():
    """`--draft-model demo-draft-model` finds the bundled draft model, as --target finds a demo target,
    and its rounds accept drafts (it was distilled from the demo target) with AR's output."""
    from engine.models.demo import DEMO_DRAFT_MODEL, bundled_model
    from engine.models.paths import resolve_model_path

    folder = bundled_model(DEMO_DRAFT_MODEL)
    assert folder is not None and resolve_model_path(DEMO_DRAFT_MODEL) == folder
    target, drafter = PAIRS[0]
    pair = load_pair(target, drafter)
    ids = encode_prompt(pair.tokenizer, SAMPLE_PROMPT, chat=False)
    result = run_parity(pair, ids, GenerationSettings(mode="draft-model", draft_model=DEMO_DRAFT_MODEL,
                                                      max_tokens=32))
    assert result.identical, (result.first_divergence, result.margin_at_divergence)
    assert result.dflash.mean_acceptance_length > 1.5
