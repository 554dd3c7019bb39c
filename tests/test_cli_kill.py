"""SIGKILL of a ``kangengine convert --workers 2`` batch leaves no process behind and, after a rerun, no temporary
file (issue 17).

Checked by pid: every descendant of the command (its two workers and multiprocessing's resource tracker, read
from ``/proc/<pid>/task/*/children``) is recorded while the batch runs, the parent alone is killed with
SIGKILL while the workers are mid-clip, and each recorded pid must be gone (or a zombie) within a few
seconds. The rerun must finish every clip, redo none that the killed run had finished, and leave no ``.tmp``.
The helper that makes workers die with their parent is checked directly too
(:func:`kangengine.pipelines._workers.bind_to_parent`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, crop_bvh, data_file

from kangengine.cli import main
from kangengine.data import data_path

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")

MODEL = data_path("humanoid_CMU.xml")
CONFIG = "cmu_bvh_to_cmu_humanoid"


def _descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (children of each of its threads, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_sigkill_of_a_two_worker_batch_leaves_no_process_and_no_temporary(tmp_path):
    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    src = tmp_path / "src"
    names = [f"clip_{i:02d}.bvh" for i in range(8)]
    for i, name in enumerate(names):
        crop_bvh(walk, src / name, 40, start=10 * i)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kangengine", "convert", str(MODEL), str(src), "--config", CONFIG]
    cmd += ["--out", str(out), "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen: set[int] = set()
        finished = 0
        while finished < 2:  # two clips done: both workers started and busy with the next ones
            line = proc.stderr.readline()
            assert line, f"the batch ended before the kill (exit {proc.poll()})"
            finished += line.startswith("[")
            seen |= _descendants(proc.pid)
        seen |= _descendants(proc.pid)
        workers = [p for p in seen if "spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        assert len(workers) == 2, f"expected 2 worker processes among {sorted(seen)}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    left = _wait_gone(seen, 5.0)
    assert not left, f"processes outlived their killed parent: {left}"
    before = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(before) >= 2 and all(e["status"] == "done" for e in before)
    # the rerun finishes the batch, redoes nothing finished, and leaves no temporary file
    assert main(cmd[3:] + ["--quiet"]) == 0
    after = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    clips = [e["clip"] for e in after]
    assert sorted(clips) == names, "a clip was converted twice or not at all"
    assert not list(out.rglob("*.tmp")), "a temporary file of the killed run was left"


_CHILD = """
import os, sys, time
sys.path.insert(0, {repo!r})
from kangengine.pipelines._workers import bind_to_parent
parent = os.getppid()
how = bind_to_parent(parent)
print(how, flush=True)
while True:  # busy in pure Python without sleeping: only the kernel (or the watchdog thread) ends it
    sum(range(10000))
"""

_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {child!r}], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_bind_to_parent_ends_a_busy_child_when_its_parent_is_killed(tmp_path):
    child = _CHILD.format(repo=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT.format(child=child)], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        pid = int(proc.stdout.readline())
        how = proc.stdout.readline().strip()
        assert how in ("pdeathsig", "watchdog") and _alive(pid)
        if sys.platform.startswith("linux"):
            assert how == "pdeathsig"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert not _wait_gone([pid], 3.0), "the child outlived its killed parent"


def test_bind_to_parent_leaves_at_once_when_the_parent_is_already_gone():
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from kangengine.pipelines._workers import bind_to_parent\n"
        "bind_to_parent(2 ** 22 + 12345)\n"  # not our parent: it is as if it had died before we bound to it
        "print('still here')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "still here" not in done.stdout
