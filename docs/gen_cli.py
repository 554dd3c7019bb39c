"""MkDocs hook: the CLI reference page (``reference/cli.md``), rendered from ``kangengine.cli.build_parser()``
at build time, so it always shows the parser as it is: the command's help, then every subcommand's (nested
ones such as ``library build`` included), each as argparse prints it for ``--help``.

Registered in ``mkdocs.yml`` (``hooks:``) and excluded from the site's files (``exclude_docs``). Also runs as a
script: ``python docs/gen_cli.py`` prints the page.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PAGE = "reference/cli.md"
WIDTH = "100"  # help text wrapped at a fixed width, whatever the terminal that runs the build

_INTRO = """# CLI reference

Generated from the parser (`kangengine.cli.build_parser()`) each time the site is built: each section is
what `kangengine ... --help` prints. The guide to the command, with what each flag is for, is
[the kangengine command](../cli.md); the exit status is 0 when every clip is done, 1 when a clip failed (with
`--strict`, also rejected), 2 for bad arguments and 130 after Ctrl-C.
"""


def _subcommands(parser: argparse.ArgumentParser, prefix: str):
    """``(command line, parser)`` for ``parser`` and every subcommand below it, depth first, in the order the
    parser lists them."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix} {name}")


def render_cli_reference() -> str:
    """The CLI reference page as Markdown: one section per (sub)command with its ``--help`` text."""
    from kangengine.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [_INTRO]
        for line, parser in _subcommands(build_parser(), "kangengine"):
            parts.append(f"## `{line}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(parts)


def on_files(files, config):
    """MkDocs ``on_files`` event: add the generated page to the site's files (the parser of the checkout being
    built: its root, beside ``mkdocs.yml``, goes first on ``sys.path``)."""
    from mkdocs.structure.files import File

    root = str(Path(config["config_file_path"]).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)

    files.append(File.generated(config, PAGE, content=render_cli_reference()))
    return files


if __name__ == "__main__":
    print(render_cli_reference())
