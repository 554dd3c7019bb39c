"""What ``convert`` does besides converting (issue 16): the summary written once at the end of a run (and when
Ctrl-C or SIGTERM ends it) or spaced during it, never re-encoded after every clip; manifest lines appended to an
open file; outputs written as one in-memory ``.npz`` without ``fsync``, a torn one caught on resume by its CRCs.

Oracles: numpy's own ``np.savez`` (member bytes), ``zipfile`` and ``np.load`` (reading), the standard ``json``
encoder (the summary's content), real CMU BVH crops converted by real processes that are really signalled.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, crop_bvh, data_file

from kangengine._files import load_npz, npz_bytes, write_npz
from kangengine.cli import main
from kangengine.data import data_path
from kangengine.pipelines import ConvertOptions, convert_clips
from kangengine.pipelines.batch import ManifestAppender, read_manifests, run_tasks
from kangengine.pipelines.convert import SUMMARY_NAME, summary_quality, write_convert_summary

MODEL = data_path("humanoid_CMU.xml")
CONFIG = "cmu_bvh_to_cmu_humanoid"
OPTS = ConvertOptions(config=CONFIG, fps=30.0)


def _crops(folder: Path, count: int, frames: int = 24) -> list[Path]:
    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    return [crop_bvh(walk, folder / f"clip_{i:02d}.bvh", frames, start=7 * i) for i in range(count)]


def _manifest(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# -- the .npz writer ------------------------------------------------------------------------------------------

_ARRAYS = {
    "q": np.arange(30 * 7, dtype=np.float32).reshape(30, 7) / 7,
    "fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    "strided": np.arange(40, dtype=np.int16)[::3],
    "big_endian": np.arange(5, dtype=">f8"),
    "empty": np.zeros((0, 3), np.float32),
    "flags": np.array([True, False, True]),
    "fps": np.array(30.0),
    "nq": np.array(63),
    "format": np.array("kangengine.articulation_motion"),
    "joint_names": np.array(["root", "lfemur", "rtibia_long_name"], dtype=np.str_),
    "structured": np.zeros(2, dtype=[("x", "<f4"), ("name", "<U3")]),
    "größe": np.array([1.5, 2.5]),
}


def test_npz_bytes_hold_what_np_savez_holds_member_for_member():
    ours = npz_bytes(_ARRAYS)
    ref = io.BytesIO()
    np.savez(ref, **_ARRAYS)
    with zipfile.ZipFile(io.BytesIO(ours)) as zo, zipfile.ZipFile(io.BytesIO(ref.getvalue())) as zr:
        assert zo.testzip() is None  # every member's CRC right
        assert zo.namelist() == zr.namelist() == [f"{k}.npy" for k in _ARRAYS]
        for name in zr.namelist():
            assert zo.read(name) == zr.read(name), name  # numpy's own .npy bytes, header included
    with np.load(io.BytesIO(ours), allow_pickle=False) as z:
        for key, value in _ARRAYS.items():
            np.testing.assert_array_equal(z[key], value)
            assert z[key].dtype == value.dtype
    assert npz_bytes(_ARRAYS) == ours  # the same arrays, the same bytes


def test_write_npz_is_read_by_our_bounded_reader_and_refuses_objects(tmp_path):
    path = write_npz(tmp_path / "a.npz", _ARRAYS, durable=False)
    got = load_npz(path)
    assert list(got) == list(_ARRAYS)
    for key, value in _ARRAYS.items():
        np.testing.assert_array_equal(got[key], value)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="object"):
        write_npz(path, {"bad": np.array([{"a": 1}], dtype=object)})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["a.npz"]


# -- the summary ----------------------------------------------------------------------------------------------


def test_summary_is_the_same_json_as_one_indented_document_with_one_line_per_clip(tmp_path):
    clips = _crops(tmp_path / "src", 3)
    clips.append(tmp_path / "src" / "broken.bvh")
    clips[-1].write_text("HIERARCHY\nROOT Hips\n{\n")
    report = convert_clips(clips, MODEL, options=OPTS, out_dir=tmp_path / "out")
    entries = read_manifests(tmp_path / "out", command="convert")
    text = (tmp_path / "out" / SUMMARY_NAME).read_text()
    run = {"model": report.model, "model_signature": report.model_signature, "options": report.to_dict()["options"]}
    run["counts"] = {"converted": 3, "up_to_date": 0, "failed": 1}
    listed = [entries[k] for k in sorted(entries)]
    body = {  # what one json.dumps(indent=2) of the whole summary held
        "format": "kangengine.convert_summary",
        **run,
        "totals": {"done": 3, "failed": 1},
        "quality": summary_quality(listed),
        "clips": listed,
    }
    assert json.loads(text) == json.loads(json.dumps(body, indent=2, sort_keys=True, default=str))
    lines = text.splitlines()
    start = lines.index('  "clips": [')
    assert [json.loads(x.rstrip(",")) for x in lines[start + 1 : start + 5]] == json.loads(json.dumps(listed))
    # no clip at all: still one JSON document
    empty = write_convert_summary(tmp_path / "empty.json", {}, run=run)
    assert json.loads(empty.read_text())["clips"] == [] and json.loads(empty.read_text())["totals"]["done"] == 0


def test_summary_is_written_at_the_end_or_spaced_never_after_every_clip(tmp_path):
    clips = _crops(tmp_path / "src", 3)
    seen: list = []

    def look(out):
        def progress(done, due, outcome):
            path = out / SUMMARY_NAME
            seen.append(len(json.loads(path.read_text())["clips"]) if path.exists() else None)

        return progress

    late = tmp_path / "late"
    convert_clips(clips, MODEL, options=OPTS, out_dir=late, summary_every_s=1e9, progress=look(late))
    assert seen == [None, None, None]  # nothing during the run ...
    summary = json.loads((late / SUMMARY_NAME).read_text())
    assert summary["totals"]["done"] == 3 and summary["counts"]["converted"] == 3  # ... all of it at the end
    seen.clear()
    eager = tmp_path / "eager"
    convert_clips(clips, MODEL, options=OPTS, out_dir=eager, summary_every_s=0.0, progress=look(eager))
    assert seen[0] == 1  # written during the run: after the first clip, the first write is due at once
    assert json.loads((eager / SUMMARY_NAME).read_text())["totals"]["done"] == 3


# -- the manifest ---------------------------------------------------------------------------------------------


def test_manifest_lines_are_in_the_file_as_soon_as_appended(tmp_path):
    path = tmp_path / "manifest.jsonl"
    lines = ManifestAppender(path, sync_every_s=3600.0)
    lines.append({"clip": "a.bvh", "command": "convert", "status": "done", "time": 1.0})
    # another process (the next run after a SIGKILL of this one) reads it before any fsync or close
    code = "import json,sys; print(len(open(sys.argv[1]).read().splitlines()))"
    assert subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True).stdout == "1\n"
    lines.append({"clip": "b.bvh", "command": "convert", "status": "failed", "time": 2.0})
    lines.close()
    lines.close()
    assert sorted(read_manifests(tmp_path, command="convert")) == ["a.bvh", "b.bvh"]


# -- resume ---------------------------------------------------------------------------------------------------


def test_an_output_torn_after_its_manifest_line_is_converted_again(tmp_path):
    """A machine crash can leave an output written without fsync torn under its final name: its CRCs say so."""
    clips = _crops(tmp_path / "src", 2)
    out = tmp_path / "out"
    convert_clips(clips, MODEL, options=OPTS, out_dir=out)
    torn = out / "clip_01.npz"
    with zipfile.ZipFile(torn) as zf:
        info = zf.getinfo("q.npy")
    raw = bytearray(torn.read_bytes())
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size - 3  # inside q's data
    raw[at] ^= 0xFF
    torn.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile):  # what a reader that checks CRCs sees
        with zipfile.ZipFile(torn) as zf:
            zf.read("q.npy")
    again = convert_clips(clips, MODEL, options=OPTS, out_dir=out)
    assert [(o.name, o.status) for o in again.outcomes] == [("clip_00.bvh", "up_to_date"), ("clip_01.bvh", "converted")]
    with zipfile.ZipFile(torn) as zf:
        assert zf.testzip() is None


# -- signals --------------------------------------------------------------------------------------------------


def test_an_interrupted_process_pool_leaves_no_manager_thread_behind():
    """A batch on worker processes ended by an exception while recording a result (as Ctrl-C and SIGTERM end
    it): the workers still busy are terminated and the pool's manager thread is joined before the exception
    leaves ``run_tasks``. Left running, that thread closes its wakeup pipe while the interpreter's exit hook
    writes to it (CPython 3.11: "OSError: Bad file descriptor" printed at the exit of a signalled run)."""
    import concurrent.futures.process as cfp
    import threading
    import time

    def stop(_):
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_tasks(time.sleep, [(0.0,)] + [(60.0,)] * 3, workers=2, on_result=stop)
    assert time.monotonic() - started < 50  # the sleeping workers were not waited for
    assert not [t for t in threading.enumerate() if isinstance(t, cfp._ExecutorManagerThread)]


@pytest.mark.parametrize(
    ("signum", "workers", "status"), [(signal.SIGTERM, 1, 143), (signal.SIGTERM, 2, 143), (signal.SIGINT, 1, 130)]
)
def test_a_signalled_run_writes_the_summary_of_its_manifest_and_resumes(tmp_path, signum, workers, status):
    _crops(tmp_path / "src", 20, frames=200)  # 18 clips left when signalled: a busy machine still has work there
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kangengine", "convert", str(MODEL), str(tmp_path / "src"), "--config", CONFIG]
    cmd += ["--out", str(out), "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        finished = 0
        while finished < 2:
            line = proc.stderr.readline()
            assert line, f"the batch ended before the signal (exit {proc.poll()})"
            finished += line.startswith("[")
        proc.send_signal(signum)
        rest = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == status, rest
    assert "Traceback" not in rest
    assert ("terminated (SIGTERM)" if signum == signal.SIGTERM else "run the same command again to resume") in rest
    done = _manifest(out / "manifest.jsonl")
    assert 2 <= len(done) < 20 and all(e["status"] == "done" for e in done)
    summary = json.loads((out / SUMMARY_NAME).read_text())
    assert [c["clip"] for c in summary["clips"]] == sorted(e["clip"] for e in done)
    assert summary["counts"]["converted"] == len(done)
    assert not list(out.rglob("*.tmp"))
    assert main([*cmd[3:-1], "1", "--quiet"]) == 0  # the same batch, resumed in this process
    after = _manifest(out / "manifest.jsonl")
    assert after[: len(done)] == done and sorted(e["clip"] for e in after) == [f"clip_{i:02d}.bvh" for i in range(20)]
    assert json.loads((out / SUMMARY_NAME).read_text())["totals"] == {"done": 20, "failed": 0}
