"""A drafter config that gives a field twice (under dflash_config or rope_parameters, and at the top
level) with two values is refused by the loader and by doctor, naming both: runtimes read one or the
other, so the file would run as a different model in each. Agreeing copies load as before."""

from __future__ import annotations

import json
import shutil

import pytest

from app.cli import main as cli
from engine.errors import DFlashError
from engine.models.pair import load_pair
from fixtures.tiny_dflash2 import write_dflash2_drafter


def _copy_with(src, dst, edit):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _top(config, inner, name, value):  # a top-level copy of a field the fixture gives under `inner`
    assert name in config[inner] and name not in config
    config[name] = value


CASES = {
    "block_size": (lambda c: _top(c, "dflash_config", "block_size", 8), "'block_size' is 16 under 'dflash_config' but 8"),
    "rope_theta": (lambda c: _top(c, "rope_parameters", "rope_theta", 20000.0),
                   "'rope_theta' is 10000.0 under 'rope_parameters' but 20000.0"),
}


@pytest.mark.parametrize("name", CASES)
def test_disagreeing_copies_are_refused_by_the_loader_and_doctor(qwen3_untied_dirs, tmp_path, capsys, name):
    target, drafter = qwen3_untied_dirs
    edit, words = CASES[name]
    broken = _copy_with(drafter, tmp_path / "drafter", edit)
    with pytest.raises(DFlashError, match="runtimes read one or the other") as refused:
        load_pair(target, broken)
    assert words in str(refused.value)
    assert cli(["doctor", "--target", str(target), "--drafter", str(broken)]) == 2
    assert words in capsys.readouterr().out


def test_a_dflash2_key_given_twice_must_agree(qwen3_untied_dirs, tmp_path, capsys):
    target = qwen3_untied_dirs[0]
    drafter = write_dflash2_drafter(tmp_path / "dflash2", target, seed=5)
    kernel = json.loads((drafter / "config.json").read_text())["dflash_config"]["conv_kernel_size"]
    same = _copy_with(drafter, tmp_path / "same", lambda c: c.update(conv_kernel_size=kernel))
    assert load_pair(target, same).drafter.cfg.selector.conv_kernel_size == kernel  # agreeing: loads
    other = _copy_with(drafter, tmp_path / "other", lambda c: c.update(conv_kernel_size=kernel + 1))
    with pytest.raises(DFlashError, match=f"'conv_kernel_size' is {kernel} under 'dflash_config' but {kernel + 1}"):
        load_pair(target, other)
    assert cli(["doctor", "--target", str(target), "--drafter", str(other)]) == 2
    assert "'conv_kernel_size'" in capsys.readouterr().out
