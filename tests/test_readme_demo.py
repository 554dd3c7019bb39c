"""The README's first command, literally, in a fresh copy of the repository: it makes its own virtual
environment, installs the package and runs ``kangengine demo``, which must end with a picture a person can open.

It downloads and installs packages (a minute or two), so it runs where ``.ci/run`` asks for it
(``KANGENGINE_TEST_FRESH_VENV=1``) and skips elsewhere, saying so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from PIL import Image

pytestmark = pytest.mark.skipif(
    os.environ.get("KANGENGINE_TEST_FRESH_VENV") != "1",
    reason="installs a fresh virtual environment; .ci/run sets KANGENGINE_TEST_FRESH_VENV=1",
)


def _first_command() -> str:
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup, flags=re.S)[0]


def _copy_tracked_files(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def test_readme_first_command_runs_the_demo_in_a_fresh_environment(tmp_path):
    repo = tmp_path / "kangengine"
    _copy_tracked_files(repo)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        ["bash", "-c", _first_command()], cwd=repo, env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = [line for line in done.stdout.splitlines() if line.strip()][-1]
    assert last.endswith(".gif"), last
    picture = Path(last.split()[-1])
    picture = picture if picture.is_absolute() else repo / picture
    with Image.open(picture) as gif:
        assert gif.n_frames > 10 and min(gif.size) >= 64
