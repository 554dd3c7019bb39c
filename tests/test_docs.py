"""Every ``python`` code block in the README and in docs/ runs, and prints what its comments say it prints.

How a documented output is written (the rule the docs follow)::

    print(layout.nq, layout.nv)  # 63 62
    print(md["scale"], md["up_axis"])  # 0.05644... y  (detected, see below)
    print(motion.fps, motion.local_rotation[0, 0])  # 30.0 [1. 0. 0. 0.]: WXYZ, identity
    print([desc.joints[j].name for j in femur.joints])  # three hinges on one body

- The comment on the line where a ``print(...)`` call ends (or on its first line) is its documented output,
  **unless it is prose**: a comment that starts with two lower-case words (``# three hinges on one body``,
  ``# close to [0, 0, pi/2] rad/s``) explains the line and is not compared.
- The documented output may be followed by an explanation after ``": "``, ``"; "``, ``" ("``, two spaces or a
  space and a lower-case word (a unit: ``# 0.95 m``); the part before it must equal everything the call
  printed.
- A torch shape is written as a list: ``[4096, 3]`` stands for ``torch.Size([4096, 3])``.
- Compared after normalising white space and commas (runs of blanks, commas and line breaks are one space; no
  space just inside brackets), so numpy's line wrapping and column padding do not matter. A number matches a
  printed number that rounds to it at its last written digit (``0.95`` matches ``0.9512``, ``[0.5, 0, 0]``
  matches ``[0.5 0.  0. ]``, ``5.0e-07`` matches ``5.01187513e-07``). In the comment ``...`` stands for any
  text (``0.05644...``, ``MotionLibrary(clips=2, ...)``) and ``<description>`` for one word
  (``<16 hex digits>``).
- A ``print`` that runs more than once is compared with all it printed, joined.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

import pytest
from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_PROSE = re.compile(r"[a-z][a-z'\-]*\s+[a-z]")
_SEPARATOR = re.compile(r":\s|;\s|\s\(|\s\s|\s(?=[a-z][a-z/]*\b)")


def _blocks():
    for path in DOCS:
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)):
            yield pytest.param(path, code, id=f"{path.name}-{i}")


_NUMBER = r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _normalise(text: str) -> str:
    text = re.sub(r"torch\.Size\((\[[^\]]*\])\)", r"\1", text)
    text = re.sub(r"\s+", " ", text.replace(",", " ")).strip()
    return re.sub(r"(?<=[\[(])\s+|\s+(?=[\])])", "", text)


def _rounds_to(printed: str, documented: str) -> bool:
    """``printed`` (a number as printed) rounds to ``documented`` at the documented number's last digit, or
    starts with it when the documentation cut it short (``0.01...``)."""
    if documented.endswith("..."):
        return printed.startswith(documented[:-3])
    mantissa = re.split("[eE]", documented)[0]
    exponent = int(documented.lower().split("e")[1]) if "e" in documented.lower() else 0
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    half_step = 0.5 * 10.0 ** (exponent - decimals)
    return abs(float(printed) - float(documented)) <= half_step * (1 + 1e-9)


def _pattern(documented: str) -> tuple[re.Pattern, list[str]]:
    parts = re.split(rf"(\.\.\.|<[^<>]+>|(?<![\w.]){_NUMBER})", _normalise(documented))
    regex, numbers = [], []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            regex.append(re.escape(part))
        elif part == "...":
            regex.append(".*?")
        elif part.startswith("<"):
            regex.append(r"\S+")
        else:
            regex.append(f"({_NUMBER})")
            numbers.append(part + ("..." if parts[i + 1 : i + 3] == ["", "..."] else ""))
    return re.compile("".join(regex), re.S), numbers


def matches(documented: str, printed: str) -> bool:
    """Whether ``documented`` (a comment, maybe with a trailing explanation) states ``printed``."""
    actual = _normalise(printed)
    cuts = [m.start() for m in _SEPARATOR.finditer(documented)] + [len(documented)]
    for cut in cuts:
        pattern, numbers = _pattern(documented[:cut])
        found = pattern.fullmatch(actual)
        if found and all(_rounds_to(got, want) for got, want in zip(found.groups(), numbers)):
            return True
    return False


def is_prose(comment: str) -> bool:
    return bool(_PROSE.match(comment))


def documented_prints(code: str) -> dict[int, tuple[int, str]]:
    """Line number of every line inside a commented ``print(...)`` call -> (the call's first line, comment)."""
    comments = {
        tok.start[0]: tok.string[1:].strip()
        for tok in tokenize.generate_tokens(io.StringIO(code).readline)
        if tok.type == tokenize.COMMENT
    }
    found = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            comment = comments.get(node.end_lineno) or comments.get(node.lineno)
            if comment and not is_prose(comment):
                for line in range(node.lineno, node.end_lineno + 1):
                    found[line] = (node.lineno, comment)
    return found


def test_output_rule():
    assert matches("[[0 0 1] [1 0 0]]: up is +Z", "[[0 0 1]\n [1 0 0]]")
    assert matches("[ 0.  -0.1 -0.3]", "[ 0.  -0.1 -0.3]") and matches("[0. -0.1 -0.3]", "[ 0.  -0.1 -0.3]")
    assert matches("cmu 0.05644... y  (detected, see below)", "cmu 0.056444 y")
    assert matches("63 62 <16 hex digits>", "63 62 0123456789abcdef")
    assert matches("{'converted': 1, 'failed': 0}", "{'converted': 1, 'failed': 0}")
    assert not matches("63 62 31", "63 62 30") and not matches("343 120.005 38", "343 120.005")
    assert not matches("True: yes", "False") and matches("[4096, 3]", "torch.Size([4096, 3])")
    assert matches("[[0.5, 0, 0, 0]]: rotation vector", "[[0.5 0.  0.  0. ]]") and matches("1.03", "1.0312")
    assert matches("[5.0e-07 4.0e-06]", "[5.01187513e-07 4.00987647e-06]") and not matches("1.03", "1.04")
    assert matches("ok 0.01...", "ok 0.019") and not matches("ok 0.02...", "ok 0.019")
    assert matches("(30, 24, 3) m, world", "(30, 24, 3)") and matches("[5.0e-07] rad", "[5.01e-07]")
    assert matches("(0, 'lfemurrz', 1e-5)", "(0, 'lfemurrz', 1e-05)") and not matches("-0.1", "0.1")
    assert is_prose("three hinges on one body") and is_prose("round-off error only")
    assert not any(map(is_prose, ["ok 0.01...", "cmu 0.05 y", "True", "[1, 2]", "line 190: bad", "2 m"]))
    code = "x = 1\nprint(\n    x\n)  # 1\nprint(x)  # the value\nprint(x)\n"
    assert documented_prints(code) == {2: (2, "1"), 3: (2, "1"), 4: (2, "1")}


@pytest.mark.parametrize(("path", "code"), list(_blocks()))
def test_doc_snippet_runs_and_prints_what_it_says(path, code):
    import builtins

    expected = documented_prints(code)
    printed: dict[int, list[str]] = {}

    def recording_print(*args, sep=" ", end="\n", file=None, flush=False):
        sep = " " if sep is None else sep
        frame = __import__("sys")._getframe(1)
        if file is None and frame.f_code.co_filename == str(path) and frame.f_lineno in expected:
            printed.setdefault(expected[frame.f_lineno][0], []).append(sep.join(map(str, args)))
        builtins.print(*args, sep=sep, end=end, file=file, flush=flush)

    exec(compile(code, str(path), "exec"), {"__name__": "__docs__", "print": recording_print})

    lines = code.splitlines()
    wrong = {}
    for first in sorted({first for first, _ in expected.values()}):
        source = lines[first - 1].strip()
        got = "\n".join(printed.get(first, ["<not printed>"]))
        if not matches(expected[first][1], got):
            wrong[source] = f"{path.name}: {source}\n    printed: {got!r}"
    assert not wrong, "documented output differs from what runs:\n" + "\n".join(wrong.values())
