"""Writes docs/cli.md, the command-line reference, from the real parsers: `python -m app.cli_docs`.

tests/test_docs.py renders it again and fails when the file on disk differs, so a flag added or
reworded in a parser (engine/tools/cli_parser.py, engine/training/cli.py, app/cli.py) is in the
reference once this is run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli import _add_parsers
from engine.tools.cli_parser import build_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
COMMAND = "python -m app.cli_docs"


def _flag(action: argparse.Action) -> str:
    """`--block-size N|auto`, `--mode {dflash,ar}`, `--json` or a positional's name."""
    names = ", ".join(action.option_strings) or (action.metavar or action.dest)
    if action.nargs == 0 or not action.option_strings:
        return names
    if action.choices is not None:
        return f"{names} {{{','.join(map(str, action.choices))}}}"
    return f"{names} {action.metavar or action.dest.upper()}"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    default = action.default
    shown = not (default is None or default is False or default == [] or default == argparse.SUPPRESS
                 or action.nargs == 0)
    if shown and "default" not in text:
        text = f"{text} (default {default})" if text else f"default {default}"
    if action.required and action.option_strings:
        text = f"required. {text}" if text else "required"
    return _cell(text)


def _cell(text: str) -> str:
    """One Markdown table cell: on one line, with `|` and `<` that would end the cell or open a tag escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        rows.append(f"| `{_cell(_flag(action))}` | {_help(parser, action)} |")
    return ["| option | what it does |", "| --- | --- |", *rows] if rows else ["No options."]


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def render(parser: argparse.ArgumentParser) -> str:
    """The whole reference as Markdown: the top-level options, then one section per command."""
    commands = _commands(parser)
    lines = ["# Command-line reference", "",
             f"Generated from the argparse parsers by `{COMMAND}`; do not edit by hand "
             "(`tests/test_docs.py` fails when this file is stale).", "",
             f"`{parser.prog}`: {parser.description}", "",
             "| command | what it does |", "| --- | --- |",
             *(f"| [`{name}`](#{name}) | {help_} |" for name, help_, _ in commands), "",
             f"## {parser.prog}", "", *_options(parser), ""]
    for name, help_, sub in commands:
        lines += [f"## {name}", "", f"`{parser.prog} {name}`: {help_}", "", *_options(sub), ""]
    return "\n".join(lines)


def current() -> str:
    return render(build_parser(_add_parsers))


def main() -> int:
    DOC.write_text(current(), encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
