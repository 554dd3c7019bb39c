"""Project-level promises: the README's two commands, CI calling the test command, the CLI, and a light
``import kangengine``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

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
    assert "kangengine convert --example" in install_run and "pytest" in install_test
    for c in cmds:
        assert c.index("torch==2.13.0") < c.index("pip install -e")
    ci = (REPO / ".ci" / "run").read_text()
    assert install_test in ci


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
