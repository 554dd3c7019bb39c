"""Every ``python`` code block in the README and in docs/ runs."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _blocks():
    for path in DOCS:
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)):
            yield pytest.param(path, code, id=f"{path.name}-{i}")


@pytest.mark.parametrize(("path", "code"), list(_blocks()))
def test_doc_snippet_runs(path, code):
    exec(compile(code, str(path), "exec"), {"__name__": "__docs__"})
