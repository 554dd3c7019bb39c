"""The documentation site's sources (``mkdocs.yml``, ``docs/``): what ``mkdocs build --strict`` in ``.ci/run``
relies on, checked without building (seconds): the generated CLI reference is argparse's own ``--help`` of
every subcommand, every page is in the nav and every nav entry is a page, and every object the API reference
names exists.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re

import pytest
from conftest import REPO

from kangengine.cli import build_parser

yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs (the dev extra)")


def _gen_cli():
    spec = importlib.util.spec_from_file_location("gen_cli", REPO / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def _config() -> dict:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_cli_reference_is_the_help_of_every_subcommand(monkeypatch):
    gen = _gen_cli()
    page = gen.render_cli_reference()
    monkeypatch.setenv("COLUMNS", gen.WIDTH)  # the width the page is rendered at
    parsers = {"kangengine": build_parser()}
    todo = list(parsers.items())
    while todo:  # every subcommand, nested ones (library build) included
        line, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    parsers[f"{line} {name}"] = sub
                    todo.append((f"{line} {name}", sub))
    assert {"kangengine convert", "kangengine validate", "kangengine library build"} <= set(parsers)
    for line, parser in parsers.items():
        assert f"## `{line}`\n\n```text\n{parser.format_help().rstrip()}\n```" in page, line
    assert "--ray ADDRESS" in page and os.environ["COLUMNS"] == gen.WIDTH


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = _config()
    nav = _nav_pages(config["nav"])
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    generated = {_gen_cli().PAGE}
    assert len(nav) == len(set(nav)), "a page is twice in the nav"
    assert sorted(set(nav) - pages - generated) == [], "nav entries without a page"
    assert sorted(pages - set(nav)) == [], "pages left out of the nav"
    assert config["strict"] is True and "docs/gen_cli.py" in config["hooks"]


def test_every_object_the_api_reference_names_exists():
    names = [
        (page.name, name)
        for page in sorted((REPO / "docs" / "reference").glob("*.md"))
        for name in re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.M)
    ]
    assert len(names) >= 10
    for page, name in names:
        module = importlib.import_module(name)  # every identifier is a module of the package
        assert module.__doc__, f"{page}: {name} has no module docstring to render"
    packages = {n.split(".")[1] for _, n in names}
    assert {"asset", "animation", "io", "datasets", "retarget", "adapters", "sim", "pipelines"} <= packages
