"""Project-level promises: the README's two commands, CI calling the test command (lint first), the CLI, a
light ``import kangengine``, and imports that go down the layers only."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, data_file

from kangengine.cli import main


def _readme_commands():
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup, flags=re.S)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    cmds = _readme_commands()
    assert len(cmds) == 2 and all("\n" not in c for c in cmds)
    install_run, install_test = cmds
    assert "kangengine demo" in install_run and "pytest" in install_test
    for c in cmds:
        assert c.index("torch==2.13.0") < c.index("pip install -e")
    ci = (REPO / ".ci" / "run").read_text()
    assert install_test in ci


def test_ci_lints_before_it_tests():
    install_test = _readme_commands()[1]
    steps = [s.strip() for s in install_test.split("&&")]
    lint = [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."]
    assert all(s in steps for s in lint), steps
    assert max(steps.index(s) for s in lint) < steps.index(".venv/bin/python -m pytest -q")


def test_import_is_light():
    code = (
        "import sys, kangengine; print(sorted(m for m in ('torch', 'mujoco', 'smplx', 'newton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_info_on_model(capsys):
    assert main(["info", str(data_file("mjcf/dm_control/humanoid_CMU.xml"))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["nq"] == 63 and report["model"]["nv"] == 62
    assert report["model"]["blocks"][0] == {"joint": "root", "type": "free", "body": "root", "q": [0, 7], "qd": [0, 6]}


def test_cli_error_is_reported_not_raised(capsys, tmp_path):
    assert main(["info", str(tmp_path / "missing.xml")]) == 1
    assert "missing.xml" in capsys.readouterr().err


# -- import direction ---------------------------------------------------------------------------------------------
# The layers (CONTRIBUTING.md): core -> asset -> animation -> io, datasets, retarget, adapters, sim (siblings) ->
# pipelines -> cli. ``data`` (shipped example files) needs only the core and may be used by any layer above it.
CORE = frozenset({"errors", "rotations", "conventions", "_files", "_deps"})
SIBLINGS = frozenset({"io", "datasets", "retarget", "adapters", "sim"})
ALLOWED = {
    **{c: CORE for c in CORE},
    "data": CORE,
    "asset": CORE | {"data"},
    "animation": CORE | {"data", "asset"},
    **{s: CORE | {"data", "asset", "animation"} for s in SIBLINGS},
    "pipelines": CORE | SIBLINGS | {"data", "asset", "animation"},
    "cli": CORE | SIBLINGS | {"data", "asset", "animation", "pipelines"},
}
PACKAGE = REPO / "kangengine"


def _module_name(path: Path) -> tuple[str, bool]:
    """``kangengine/io/bvh.py`` -> ``("kangengine.io.bvh", False)``; ``.../__init__.py`` -> the package, True."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imported(source: str, module: str, is_package: bool = False):
    """``(line, dotted name)`` of every import in ``source`` (module level, in functions, relative or absolute,
    and ``importlib.import_module("...")`` with a literal name), relative names resolved against ``module``.
    ``from kangengine import io`` yields ``kangengine.io``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base == "kangengine" else base
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield node.lineno, node.args[0].value


def _component(dotted: str) -> str | None:
    """The layer a ``kangengine`` module belongs to (``kangengine.io.bvh`` -> ``"io"``); None outside the package
    and for the package root (``import kangengine``, ``from kangengine import __version__``)."""
    parts = dotted.split(".")
    if parts[0] != "kangengine" or len(parts) < 2 or parts[1] not in ALLOWED:
        return None
    return parts[1]


def _violations(source: str, module: str, is_package: bool = False, where: str = "") -> list[str]:
    own = _component(module)
    if own is None:  # the root __init__ (lazy attribute loader) is above every layer
        return []
    found = []
    for line, target in _imported(source, module, is_package):
        if target == "kangengine" and own not in ("pipelines", "cli"):
            found.append(f"{where or module}:{line}: {own} imports the package root (ke.<any layer> bypasses the rule)")
            continue
        other = _component(target)
        if other is not None and other != own and other not in ALLOWED[own]:
            allowed = ", ".join(sorted(ALLOWED[own]))
            found.append(f"{where or module}:{line}: {own} imports {target} (allowed: {allowed})")
    return found


def test_import_checker_sees_relative_function_level_and_literal_imports():
    source = (
        "from .skeleton import SkeletonMotion\n"
        "from ... import rotations as R, io\n"
        "def f():\n"
        "    from ...pipelines.load import load_motion\n"
        "    import kangengine.sim.model\n"
        "    importlib.import_module('kangengine.cli')\n"
    )
    found = _violations(source, "kangengine.animation.library.sampling")
    assert [v.split(" (")[0] for v in found] == [
        "kangengine.animation.library.sampling:2: animation imports kangengine.io",
        "kangengine.animation.library.sampling:4: animation imports kangengine.pipelines.load",
        "kangengine.animation.library.sampling:5: animation imports kangengine.sim.model",
        "kangengine.animation.library.sampling:6: animation imports kangengine.cli",
    ]
    assert _violations("from . import errors\nfrom .animation import x\n", "kangengine", True) == []
    assert _violations("from .bvh import x\nfrom ..asset import y\n", "kangengine.io", True) == []
    assert _violations("from ..pipelines import x\n", "kangengine.io", True)  # io/__init__: '..' is kangengine
    assert _violations("from ..animation import x\n", "kangengine.io.bvh") == []
    assert _violations("from ..sim import x\n", "kangengine.io.bvh")  # siblings
    assert _violations("from .animation import x\n", "kangengine.errors")  # core imports a subpackage
    assert _violations("import kangengine as ke\n", "kangengine.asset.mjcf")  # ke.pipelines would be reachable
    assert _violations("import kangengine as ke\nfrom .. import __version__\n", "kangengine.pipelines.load") == []


def test_imports_go_down_the_layers_only():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40
    found = []
    for path in modules:
        module, is_package = _module_name(path)
        where = path.relative_to(REPO).as_posix()
        found += _violations(path.read_text(encoding="utf-8"), module, is_package, where)
    assert not found, "imports against the layer rule (CONTRIBUTING.md):\n" + "\n".join(found)
