"""The docs a newcomer reads: every relative link in README.md and docs/*.md leads somewhere (a file
that exists, a heading that exists), and docs/cli.md says what the parsers say."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from app import cli_docs

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _without_code_blocks(path: Path) -> str:
    return re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))


def _prose(path: Path) -> str:
    """The page without its code (fenced blocks and inline), where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", _without_code_blocks(path))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    found = set()
    for heading in re.findall(r"(?m)^#{1,6} +(.+?) *$", _without_code_blocks(path)):
        found.add(re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-"))
    return found


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_docs_exist_and_the_readme_is_short():
    assert (ROOT / "docs" / "cli.md").exists() and len(PAGES) > 2
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_check_sees_a_broken_link_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## The `race`, again\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#the-race-again) [gone](missing.md) [bad](other.md#nope) "
                    "[web](https://example.com)\n```\n[in code](nowhere.md)\n```\n", encoding="utf-8")
    assert _links(page) == ["other.md#the-race-again", "missing.md", "other.md#nope"]
    assert "the-race-again" in _anchors(tmp_path / "other.md") and "nope" not in _anchors(tmp_path / "other.md")


def test_the_cli_reference_is_generated_from_the_parsers():
    on_disk = cli_docs.DOC.read_text(encoding="utf-8")
    assert on_disk == cli_docs.current(), f"docs/cli.md is stale: run `{cli_docs.COMMAND}` and commit it"


def test_the_cli_reference_holds_every_command_and_flag():
    parser = cli_docs.build_parser(cli_docs._add_parsers)
    text = cli_docs.render(parser)
    for name, _, sub in cli_docs._commands(parser):
        assert f"\n## {name}\n" in text
        for action in sub._actions:
            for flag in [] if isinstance(action, argparse._HelpAction) else action.option_strings:
                assert f"`{flag}" in text or f", {flag}" in text, (name, flag)
    assert "--mode {dflash,ar,lookup,draft-model}" in text and "--rollback {replay,rerun}" in text
