"""Draft trees in the round loop (--tree): lossless at T = 0 on the tiny families and the demo pairs,
with lookup on and off, fixed and auto verify length, a fixed budget and --tree auto; each tree
round's event carries its tree; settings a tree cannot serve are refused in one line."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.decode.events import RoundEvent, from_dict, to_dict
from engine.decode.prompts import encode_prompt
from engine.decode.settings import MAX_TREE, GenerationSettings, SamplingSettings
from engine.errors import SettingsError
from engine.models.demo import demo_pairs, sample_prompt
from engine.models.pair import load_pair
from engine.tools.parity import run_parity

from distribution import RUNS, assert_draws_from, assert_rejected, exact_outcomes
from helpers import PROMPTS, assert_lossless, run

TREES = [dict(tree=3), dict(tree=12, lookup=True), dict(tree=8, auto=True, lookup=True),
         dict(tree_auto=True, auto=True, lookup=True), dict(tree_auto=True, block_size=4)]


def _check_tree_rounds(rounds: list[RoundEvent], budget: int = MAX_TREE) -> list[RoundEvent]:
    """The tree rounds, each checked: its tree's nodes, the committed tokens the accepted path's."""
    trees = [r for r in rounds if r.tree_parents]
    for r in trees:
        n = len(r.tree_parents)
        assert r.verified == n and r.tree_tokens[0] == r.anchor
        assert len(r.tree_tokens) == len(r.tree_scores) == len(r.tree_ranks) == n
        path = r.tree_path
        assert all(r.tree_parents[b] == a for a, b in zip(path, path[1:]))
        assert r.accepted == len(path) - 1
        assert r.committed == ([r.tree_tokens[i] for i in path[1:]] + [r.bonus])[: len(r.committed)]
        assert r.drafted[: r.accepted] == [r.tree_tokens[i] for i in path[1:]]
        if not any(rank == -1 for rank in r.tree_ranks):  # no copy grafted: the budget bounds it
            assert n - 1 <= budget
    return trees


@pytest.mark.parametrize("dirs", ["qwen3_tied_dirs", "llama_dirs", "sliding_dirs"])
@pytest.mark.parametrize("settings", TREES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_tree_rounds_give_ar_output(dirs, settings, request):
    pair = load_pair(*request.getfixturevalue(dirs))
    assert_lossless(pair, PROMPTS[:2], **settings)
    _, rounds = run(pair, PROMPTS[0], max_tokens=32, **settings)
    trees = _check_tree_rounds(rounds, settings.get("tree", MAX_TREE))
    if not settings.get("tree_auto"):  # a fixed budget: every drafter round is a tree
        assert trees and all(r.tree_parents for r in rounds if r.source == "drafter")


@pytest.mark.parametrize("auto", [False, True], ids=["fixed", "auto"])
def test_trees_copied_from_the_context_stay_lossless(alternating_dirs, oracle_ids, auto):
    """The alternating oracle: once its output repeats, a copy is grafted into the tree as a branch
    deeper than the block, and the rounds accept down it."""
    pair = load_pair(*alternating_dirs)
    ids = [7, 8, oracle_ids[0]]
    ar, _ = run(pair, ids, mode="ar", max_tokens=80)
    tree, rounds = run(pair, ids, max_tokens=80, tree=6, lookup=True, auto=auto)
    assert tree.token_ids == ar.token_ids
    grafted = [r for r in _check_tree_rounds(rounds) if -1 in r.tree_ranks]
    if not auto:  # auto's length comes from a measured cost curve: it may step plainly and verify copies alone
        assert grafted and max(r.accepted for r in grafted) > pair.drafter.cfg.block_size - 1


@pytest.mark.parametrize("target,drafter", demo_pairs()[:2], ids=[d.name for _, d in demo_pairs()[:2]])
def test_demo_pair_trees_are_lossless_and_take_second_choices(target, drafter):
    pair = load_pair(target, drafter)
    ids = encode_prompt(pair.tokenizer, sample_prompt(target), chat=False)
    for settings in (dict(tree=15), dict(tree_auto=True, auto=True, lookup=True)):
        result = run_parity(pair, ids, GenerationSettings(max_tokens=64, **settings))
        assert result.identical, (settings, result.first_divergence, result.margin_at_divergence)
    _, rounds = run(pair, ids, max_tokens=64, tree=15)
    trees = _check_tree_rounds(rounds, 15)
    # a second choice on an accepted path: a round the chain would have ended earlier
    assert any(any(r.tree_ranks[i] > 0 for i in r.tree_path) for r in trees)


def test_a_tree_round_survives_its_trace(qwen3_pair):
    _, rounds = run(qwen3_pair, PROMPTS[1], max_tokens=16, tree=5)
    event = next(r for r in rounds if r.tree_parents)
    assert from_dict(to_dict(event)) == event
    broken = to_dict(event) | {"tree_path": [0, 0]}
    with pytest.raises(ValueError, match="accepted tree path is not a walk down from the root"):
        from_dict(broken)
    uneven = to_dict(event) | {"tree_tokens": event.tree_tokens[:-1]}
    with pytest.raises(ValueError, match="different numbers of nodes"):
        from_dict(uneven)


@pytest.mark.parametrize("settings,message", [
    (dict(tree=MAX_TREE + 1), f"tree {MAX_TREE + 1} is outside 0..{MAX_TREE} draft nodes"),
    (dict(tree=-1), "tree -1 is outside"),
    (dict(tree=4, block_size=1), "--tree needs a block of at least 2"),
])
def test_settings_a_tree_cannot_serve_are_refused(qwen3_pair, settings, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        GenerationSettings(**settings).resolved(qwen3_pair)


def test_other_modes_leave_the_tree_out(qwen3_pair):
    assert not GenerationSettings(mode="ar", tree=8).resolved(qwen3_pair).uses_tree
    assert not GenerationSettings(mode="lookup", tree_auto=True).resolved(qwen3_pair).uses_tree


def test_the_command_line_takes_a_budget_or_auto(qwen3_tied_dirs, capsys):
    from app.cli import main as cli
    from engine.decode.settings import TREE_BY_DEFAULT
    from engine.tools.cli import _settings
    from engine.tools.cli_parser import build_parser

    parser = build_parser()
    for command in (["generate", "--prompt", "x"], ["parity", "--prompt", "x"], ["bench", "--prompts", "p.jsonl"]):
        given = _settings(parser.parse_args(command + ["--tree", "8"]), "dflash")
        assert (given.tree, given.tree_auto) == (8, False)
        assert _settings(parser.parse_args(command + ["--tree", "auto"]), "dflash").tree_auto is True
        default = _settings(parser.parse_args(command), "dflash")
        auto = TREE_BY_DEFAULT == "auto"
        assert (default.tree_auto, default.tree) == ((True, 0) if auto else (False, TREE_BY_DEFAULT))
    t, d = qwen3_tied_dirs
    run = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", "x", "--max-tokens", "4"]
    for extra, words in ((["--tree", "99"], f"tree 99 is outside 0..{MAX_TREE} draft nodes"),
                         (["--tree", "-2"], "tree -2 is outside")):
        assert cli(run + extra) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit):  # argparse's own exit, one line too
        cli(run + ["--tree", "many"])
    err = capsys.readouterr().err
    assert "'many' is not a whole number or 'auto'" in err and err.count("\n") == 1
    assert cli(run + ["--mode", "ar", "--tree", "4"]) == 0
    assert "--tree is not used: only --mode dflash verifies a tree" in capsys.readouterr().err


def test_bench_races_the_tree_beside_the_chain(qwen3_tied_dirs, tmp_path, capsys):
    import json

    from app.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "import json\\n\\nclass Decoder:\\n"}\n'
                       '{"prompt": "x = [1, 2, 3]\\ny = [1, 2, 3]\\n"}\n')
    t, d = qwen3_tied_dirs
    args = ["bench", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--max-tokens", "12", "--raw",
            "--methods", "dflash+lookup,dflash-tree", "--tree", "6", "--block-size", "8"]
    assert main(args + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tree, chain = result["methods"]["dflash-tree"], result["methods"]["dflash+lookup"]
    assert tree["identical"] is True and tree["verdict"] == "identical"
    assert tree["mean_verified"] is not None and tree["verify_ms"] is not None
    assert result["tree_vs_chain"]["tau"] == round(tree["mean_acceptance_length"] / chain["mean_acceptance_length"], 4)
    assert result["tree_vs_chain"]["round_time"] == round(tree["round_ms"] / chain["round_ms"], 4)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "dflash-tree against dflash+lookup:" in out and "a round's time" in out and "verify per round:" in out
    assert main(args[:-4] + ["--methods", "dflash", "--tree", "6"]) == 0
    assert "--tree is not used: only the dflash-tree method in --methods verifies a tree" in capsys.readouterr().err


SAMPLED = dict(temperature=1.0, top_k=3)


@pytest.fixture(scope="module")
def soft_oracle(oracle_dirs):
    """The oracle pair softened so that the drafter is sure where the target is not: the target's
    favoured token at logit 1 (p = e, 1, 1 over its top 3, 58%), the drafter's at logit 3 (91%). Their
    top 3 overlap, so children are accepted and rejected often: a residual matters."""
    pair = load_pair(*oracle_dirs)
    scale = pair.target.model.norm.weight.shape[0] ** -0.5  # a one-hot hidden state reaches the head at sqrt(H)
    pair.target.model.norm.weight = pair.target.model.norm.weight * scale
    pair.drafter.norm.weight = pair.drafter.norm.weight * (3 * scale)
    return pair


def _first_two(pair, ids, seeds, **settings):
    """The first two tokens of a 3-token sampled run per seed: the prefill's, then the first round's."""
    counts = Counter()
    for seed in seeds:
        summary, _ = run(pair, ids, sampling=SamplingSettings(seed=seed, **SAMPLED), max_tokens=3, **settings)
        counts[tuple(summary.token_ids[:2])] += 1
    return counts


@pytest.fixture(scope="module")
def exact_first_two(soft_oracle, oracle_ids):
    """AR's exact distribution of the first two tokens (tests/distribution.py)."""
    ids = [7, 8, oracle_ids[0]]
    return ids, exact_outcomes(soft_oracle, ids, SamplingSettings(**SAMPLED), tokens=2)


@pytest.mark.parametrize("settings", [dict(tree=2, block_size=4), dict(tree=7, block_size=8, lookup=True)],
                         ids=["tree2", "tree7"])
def test_sampled_tree_rounds_give_the_target_distribution(soft_oracle, exact_first_two, settings):
    """At T > 0 the tree's tokens are drawn without replacement from the drafter's q and verified by
    rejection sampling over siblings: the output is distributed as AR's exact distribution (chi-square)."""
    ids, exact = exact_first_two
    _, rounds = run(soft_oracle, ids, sampling=SamplingSettings(seed=0, **SAMPLED), max_tokens=12, **settings)
    assert _check_tree_rounds(rounds) and all(r.tree_parents for r in rounds if r.source == "drafter")
    assert_draws_from(_first_two(soft_oracle, ids, range(2000, 2000 + RUNS), **settings), exact)


# Runs each mutation needs: runs_for_power (tests/distribution.py) on its effect measured over 300
# runs gave about 960 for the residual's (a small shift), and under 300 for the top-k one.
MUTATION_RUNS = {"no residual": 1200, "top-k tested as sampled": RUNS}


@pytest.mark.parametrize("mutation", list(MUTATION_RUNS))
def test_sampled_tree_mutations_are_caught(soft_oracle, exact_first_two, monkeypatch, mutation):
    """A rejected child's mass left in p, or the drafter's top-k placed as children and tested against
    q as if drawn from it: not AR's distribution."""
    from engine.decode.tree import plan, walk
    from engine.decode.tree.layout import top_candidates

    if mutation == "no residual":
        monkeypatch.setattr(walk, "_residual", lambda p, proposal: p)
    else:
        monkeypatch.setattr(plan, "sampled_candidates", lambda logq, width, key: top_candidates(logq, width))
    ids, exact = exact_first_two
    runs = range(2000, 2000 + MUTATION_RUNS[mutation])
    assert_rejected(_first_two(soft_oracle, ids, runs, tree=2, block_size=4), exact)


def test_auto_where_no_tree_can_run_says_so_and_verifies_the_chain(qwen3_tied_dirs, capsys):
    from app.cli import main as cli

    target, drafter = qwen3_tied_dirs
    pair = load_pair(target, drafter)
    assert not GenerationSettings(tree_auto=True, block_size=1).resolved(pair).uses_tree
    argv = ["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "x",
            "--max-tokens", "3", "--tree", "auto", "--block-size", "1"]
    assert cli(argv) == 0
    assert "note: --tree auto verifies the chain here: a draft tree needs a block of at least 2" in \
        capsys.readouterr().err


def test_tree_against_chain_leaves_out_prompts_that_never_drafted():
    """A prompt whose output ended at its first token ran the same work both ways: its tok/s ratio
    is noise, and must not be the worst prompt."""
    from engine.tools.race import tree_vs_chain

    def method(rows):
        per_prompt = [dict(dflash_tok_s=tok_s, speedup=None if tok_s is None or not drafted else tok_s / 100)
                      for tok_s, drafted in rows]
        return dict(per_prompt=per_prompt, mean_acceptance_length=4.0, dflash_tok_s=300.0, round_ms=12.0)

    # prompt 3 never drafted: 50 against 80 tok/s (0.62x) is its prefill's noise
    tree = method([(330.0, True), (300.0, True), (50.0, False)])
    chain = method([(300.0, True), (310.0, True), (80.0, False)])
    assert tree_vs_chain(tree, chain)["worst_prompt_speed"] == round(300.0 / 310.0, 4)
    chain["per_prompt"][2]["speedup"] = 0.8  # had both drafted, it would be the worst
    tree["per_prompt"][2]["speedup"] = 0.5
    assert tree_vs_chain(tree, chain)["worst_prompt_speed"] == round(50.0 / 80.0, 4)
