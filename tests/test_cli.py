"""The ``kangengine`` command as a dataset tool (issue 14), on real CMU clips cropped to a few frames.

Through ``subprocess`` (``sys.executable -m kangengine ...``) where the process matters (exit status, one
line on stderr, SIGKILL, Ctrl-C, workers left behind) and in-process ``main([...])`` elsewhere. The oracles
are outside the batch code: the mapper's own result for a clip converted by hand, a byte comparison with
a run in one process, the files on disk after a kill.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, crop_bvh, data_file

import kangengine as ke
from kangengine.cli import build_parser, main
from kangengine.data import data_path

MODEL = data_path("humanoid_CMU.xml")
CONFIG = "cmu_bvh_to_cmu_humanoid"
SUBCOMMANDS = ("info", "configs", "convert", "validate", "merge", "library", "export", "preview", "demo")


def _run(*args, timeout=120, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "kangengine", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


def _manifest(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """``src/`` with a nested tree, a Hugging Face style symlink (``linked.bvh`` -> an extensionless blob), a
    corrupt file, a FIFO and a foreign text file that is not a motion (ignored in a folder walk)."""
    root = tmp_path_factory.mktemp("tree")
    walk, hops = data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh")
    src = root / "src"
    crop_bvh(walk, src / "walks" / "walk_a.bvh", 24, start=10)
    crop_bvh(walk, src / "walks" / "deep" / "walk_b.bvh", 30, start=100)
    crop_bvh(hops, src / "hops" / "hop.bvh", 24)  # from the T-pose frame 0: rejected
    blob = crop_bvh(walk, root / "blobs" / "5f0c1e9a", 28, start=50)
    (src / "hops" / "linked.bvh").symlink_to(blob)
    (src / "hops" / "corrupt.bvh").write_text("HIERARCHY\nROOT Hips\n{\n  OFFSET 0 0\n")
    (src / "notes.txt").write_text("not a clip")
    os.mkfifo(src / "hops" / "fifo.bvh")
    return root


GOOD = ("hops/hop.bvh", "hops/linked.bvh", "walks/deep/walk_b.bvh", "walks/walk_a.bvh")
BAD = ("hops/corrupt.bvh", "hops/fifo.bvh")


@pytest.fixture(scope="module")
def converted(tree):
    """The tree converted once in this process (``--workers 1``): the reference of the other runs."""
    out = tree / "conv1"
    rc = main(["convert", str(MODEL), str(tree / "src"), "--config", CONFIG, "--out", str(out), "--quiet"])
    return rc, out


# -- the parser ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help_with_an_example_and_a_version(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: kangengine {command}" in text and "example:" in text and f"kangengine {command} " in text
    assert all("_" not in opt for opt in text.split() if opt.startswith("--"))  # kebab-case flags
    with pytest.raises(SystemExit) as exc:
        main([command, "--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"kangengine {ke.__version__}"


def test_python_dash_m_kangengine_and_bad_arguments_give_one_line_and_exit_2(tmp_path):
    done = _run("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"kangengine {ke.__version__}"
    for args in (
        ["convert", MODEL, tmp_path, "--config", CONFIG, "--no-such-flag"],
        ["convert", MODEL, tmp_path, "--config", CONFIG, "--workers", "0"],
        ["convert", MODEL, tmp_path, "--config", CONFIG, "--shard-index", "0"],
        ["convert", MODEL, tmp_path, "--config", CONFIG, "--shard-index", "2", "--shard-count", "2"],
        ["convert", MODEL, tmp_path, "--config", "no_such_config", "--out", tmp_path / "o"],
        ["convert", MODEL, tmp_path, "--config", CONFIG, "--scale", "0.01", "--units", "cm"],
        ["convert", MODEL, tmp_path / "no_such_folder", "--config", CONFIG],
        ["convert", MODEL, tmp_path, "--config", CONFIG],  # a folder without motion files
        ["convert", tmp_path / "no_such_model.xml", tmp_path, "--config", CONFIG],
        ["validate"],
        ["frobnicate"],
    ):
        done = _run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("kangengine") and "error" in done.stderr
    assert not (tmp_path / "o").exists()


def test_configs_lists_every_shipped_configuration_and_what_it_maps(capsys):
    assert main(["configs", "--json"]) == 0
    listed = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert sorted(listed) == sorted([*ke.retarget.list_retarget_configs(), *ke.retarget.list_robot_configs()])
    cfg = ke.retarget.load_retarget_config(CONFIG)
    assert listed[CONFIG]["description"] == cfg.description
    assert listed[CONFIG]["mapping"] == dict(cfg.joint_mapping) and listed[CONFIG]["mapped"] == len(cfg.joint_mapping)
    assert main(["configs"]) == 0
    text = capsys.readouterr().out
    assert all(f"{name}: maps " in text for name in listed)


def test_parser_defaults_match_for_convert_and_validate():
    """One clamping default (and one set of batch flags) for both commands."""
    parser = build_parser()
    conv = parser.parse_args(["convert", "m.xml", "c.bvh"])
    val = parser.parse_args(["validate", "m.xml", "c.bvh"])
    assert conv.clamp is True and val.clamp is True
    assert (conv.workers, conv.threads) == (val.workers, val.threads) == (1, 1)


# -- convert ------------------------------------------------------------------------------------------------


def test_folder_is_mirrored_symlink_read_by_its_name_bad_files_listed(tree, converted):
    rc, out = converted
    assert rc == 1  # two clips failed, after the others were converted
    entries = {e["clip"]: e for e in _manifest(out / "manifest.jsonl")}
    assert sorted(entries) == sorted(GOOD + BAD)  # notes.txt is not a motion file
    assert all(entries[c]["status"] == "done" for c in GOOD)
    assert (
        "FormatError" in entries["hops/corrupt.bvh"]["error"] and "corrupt.bvh" in entries["hops/corrupt.bvh"]["error"]
    )
    assert "FIFO" in entries["hops/fifo.bvh"]["error"]
    for rel in GOOD:
        assert (out / rel).with_suffix(".npz").is_file()
    summary = json.loads((out / "convert_summary.json").read_text())
    assert summary["totals"] == {"done": 4, "failed": 2} and [c["clip"] for c in summary["clips"]] == sorted(GOOD + BAD)
    # the symlinked clip is the blob read as BVH: the same q as converting it by hand
    desc = ke.asset.load(MODEL)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc)
    blob_as_bvh = shutil.copy(tree / "blobs" / "5f0c1e9a", tree / "blob_copy.bvh")
    moved = ke.retarget.retarget_motion(ke.io.load_bvh(blob_as_bvh), CONFIG, desc)
    expected = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(moved.motion, clamp_to_limits=True)
    got = ke.animation.load_articulation_motion_npz(out / "hops" / "linked.npz", layout)
    np.testing.assert_array_equal(got.q, expected.motion.q)
    assert got.metadata["source_file"] == "hops/linked.bvh"


def test_device_file_given_as_a_clip_is_failed_without_blocking(tree, tmp_path, capsys):
    walk = tree / "src" / "walks" / "walk_a.bvh"
    rc = main(["convert", str(MODEL), str(walk), "/dev/zero", "--config", CONFIG, "--out", str(tmp_path), "--quiet"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["counts"] == {"converted": 1, "up_to_date": 0, "failed": 1}
    assert "device" in report["failed"][0]["error"]


def test_workers_and_merged_shards_give_byte_identical_outputs(tree, converted):
    _, ref = converted
    src = tree / "src"
    w2 = tree / "conv_w2"
    assert _run("convert", MODEL, src, "--config", CONFIG, "--out", w2, "--workers", "2", "--quiet").returncode == 1
    sh = tree / "conv_sh"
    for i in range(2):
        args = ["--shard-index", str(i), "--shard-count", "2", "--quiet"]
        assert main(["convert", str(MODEL), str(src), "--config", CONFIG, "--out", str(sh), *args]) == 1
    assert sorted(p.name for p in sh.glob("manifest*")) == [
        "manifest.shard-0-of-2.jsonl",
        "manifest.shard-1-of-2.jsonl",
    ]
    assert main(["merge", str(sh)]) == 0
    for rel in GOOD:
        npz = Path(rel).with_suffix(".npz")
        assert (ref / npz).read_bytes() == (w2 / npz).read_bytes() == (sh / npz).read_bytes(), rel
    merged = json.loads((sh / "convert_summary.json").read_text())
    assert merged["totals"] == {"done": 4, "failed": 2} and len(merged["clips"]) == 6


def test_rerun_redoes_nothing_and_an_edited_model_makes_every_clip_stale(tree, tmp_path, capsys):
    model = Path(shutil.copy(MODEL, tmp_path / "robot.xml"))
    shutil.copytree(Path(MODEL).parent / "common", tmp_path / "common")  # its <include> files
    src, out = tree / "src" / "walks", tmp_path / "out"
    args = ["convert", str(model), str(src), "--config", CONFIG, "--out", str(out), "--quiet"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["converted"] == 2
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"converted": 0, "up_to_date": 2, "failed": 0}
    # the same path, other bytes (a comment: the robot is the same, the file is not): every clip is stale
    model.write_text(model.read_text() + "\n<!-- edited -->\n")
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["converted"] == 2
    lines = _manifest(out / "manifest.jsonl")
    assert len(lines) == 4 and len({e["fingerprint"] for e in lines}) == 4  # two runs of two clips, accumulated


def test_unwritable_out_is_refused_before_any_work(tree, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    src = tree / "src" / "walks"
    for out in (a_file, a_file / "below"):
        done = _run("convert", MODEL, src, "--config", CONFIG, "--out", out)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and str(a_file) in done.stderr, done.stderr
        assert done.stdout == ""
    if os.geteuid() != 0:  # root writes into a read-only folder anyway
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        done = _run("convert", MODEL, src, "--config", CONFIG, "--out", ro)
        assert done.returncode == 2 and "not writable" in done.stderr


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_at_a_random_moment_then_rerun(tmp_path, workers):
    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    src = tmp_path / "src"
    for i in range(12):
        crop_bvh(walk, src / f"part{i % 3}" / f"clip_{i:02d}.bvh", 20, start=8 * i)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kangengine", "convert", str(MODEL), str(src), "--config", CONFIG]
    cmd += ["--out", str(out), "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    kill_after = random.Random().randint(1, 9)  # progress lines: clips finished before the kill
    children: set[int] = set()
    seen = 0
    while seen < kill_after:
        children.update(_children(proc.pid))
        line = proc.stderr.readline()
        if not line:
            break
        seen += line.startswith("[")
    children.update(_children(proc.pid))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(c) for c in children), "a worker outlived its killed parent"
    before = _manifest(out / "manifest.jsonl") if (out / "manifest.jsonl").exists() else []
    assert len(before) >= seen and all(e["status"] == "done" for e in before)
    # rerun: the clips finished before the kill are not redone, the others are, nothing is left half-written
    assert main(cmd[3:] + ["--quiet"]) == 0
    after = _manifest(out / "manifest.jsonl")
    clips = [e["clip"] for e in after]
    assert sorted(set(clips)) == sorted(f"part{i % 3}/clip_{i:02d}.bvh" for i in range(12))
    assert len(clips) == len(set(clips)), "a finished clip was converted again"
    assert not [p for p in out.rglob("*.tmp")], "a temporary file of the killed run was left"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    for e in after:
        motion = ke.animation.load_articulation_motion_npz(out / e["output"], layout)
        assert motion.num_frames == 20 and motion.metadata["fingerprint"] == e["fingerprint"]


def test_validate_killed_during_a_batch_resumes_without_redoing_finished_clips(converted, tmp_path):
    _, conv = converted
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kangengine", "validate", str(MODEL), str(conv), "--out", str(out)]
    cmd += ["--no-plots", "--batch-size", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert line.startswith("[1/4]")
    first = _manifest(out / "manifest.jsonl")
    assert len(first) >= 1
    assert main(cmd[3:] + ["--quiet"]) == 0
    after = _manifest(out / "manifest.jsonl")
    assert after[: len(first)] == first and sorted(e["clip"] for e in after) == sorted(
        str(Path(c).with_suffix(".npz")) for c in GOOD
    )  # each clip once: those finished before the kill were not redone
    assert not list(out.rglob("*.tmp")) and all(json.loads((out / e["report"]).read_text()) for e in after)
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert len(rows) == 4


def test_ctrl_c_ends_cleanly_with_one_line_and_exit_130(tmp_path):
    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    for i in range(40):
        crop_bvh(walk, tmp_path / "src" / f"clip_{i:02d}.bvh", 20, start=5 * i)
    cmd = [sys.executable, "-m", "kangengine", "convert", str(MODEL), str(tmp_path / "src"), "--config", CONFIG]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        cmd + ["--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stderr.readline().startswith("[1/40]")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr and "interrupted" in last and "of 40 clips" in last and stdout == ""
    done = len(_manifest(tmp_path / "out" / "manifest.jsonl"))
    assert f"{done} of 40" in last


# -- validate -----------------------------------------------------------------------------------------------


def test_validate_batch_settings_file_names_workers_shards_and_strict(tree, converted, tmp_path, capsys):
    _, conv = converted
    clips = tmp_path / "clips"
    for rel in ("hops/hop", "walks/walk_a"):
        (clips / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(conv / f"{rel}.npz", clips / f"{rel}.npz")
    shutil.copy(conv / "walks/walk_a.npz", clips / "walks" / "walk a.npz")  # cleans to walk_a too
    (clips / "broken.npz").write_bytes(b"not an npz")
    settings = tmp_path / "settings.toml"
    settings.write_text("[tracking]\nroot_assist_frequency_hz = 1.0\n[thresholds]\nbody_error_ok = 0.06\n")
    base = ["validate", str(MODEL), str(clips), "--no-plots", "--batch-size", "2", "--settings", str(settings)]
    ref = tmp_path / "v1"
    assert main([*base, "--out", str(ref), "--quiet"]) == 1  # broken.npz failed
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"][0]["clip"] == "broken" and "broken.npz" in report["skipped"][0]["error"]
    names = sorted(c["clip"] for c in report["clips"])
    assert names[0] == "hops/hop" and names[1].startswith("walks/walk_a-") and names[2].startswith("walks/walk_a-")
    walk_report = json.loads((ref / f"{names[1]}.json").read_text())
    assert walk_report["settings"]["root_assist_frequency_hz"] == 1.0
    assert walk_report["thresholds"]["body_error_ok"] == 0.06
    rows = {r["clip"]: r for r in csv.DictReader(open(ref / "summary.csv"))}
    assert sorted(rows) == sorted(names + ["broken"]) and rows["broken"]["verdict"] == "skipped"
    # a rerun simulates nothing
    assert main([*base, "--out", str(ref), "--quiet"]) == 1
    assert json.loads(capsys.readouterr().out)["counts"]["skipped"] == 1
    assert sum(1 for _ in open(ref / "manifest.jsonl")) == 4  # nothing appended: every clip is up to date
    # the hop crop (from the T-pose frame) is rejected: exit 0, and 1 with --strict
    assert {c["clip"]: c["verdict"] for c in report["clips"]}["hops/hop"] == "reject"
    hop_only = [
        str(MODEL),
        str(clips / "hops"),
        "--no-plots",
        "--settings",
        str(settings),
        "--out",
        str(tmp_path / "h"),
    ]
    assert main(["validate", *hop_only, "--quiet"]) == 0
    assert main(["validate", *hop_only, "--quiet", "--strict"]) == 1
    capsys.readouterr()
    # two workers, and two shards merged: byte-identical reports and summary
    w2 = tmp_path / "w2"
    assert _run(*base, "--out", w2, "--workers", "2", "--quiet").returncode == 1
    sh = tmp_path / "sh"
    for i in range(2):
        main([*base, "--out", str(sh), "--shard-index", str(i), "--shard-count", "2", "--quiet"])
    assert main(["merge", str(sh)]) == 0
    for name in names:
        assert (
            (ref / f"{name}.json").read_bytes()
            == (w2 / f"{name}.json").read_bytes()
            == (sh / f"{name}.json").read_bytes()
        )
    assert (ref / "summary.csv").read_bytes() == (w2 / "summary.csv").read_bytes() == (sh / "summary.csv").read_bytes()


def test_settings_file_with_an_unknown_key_is_refused_naming_the_valid_ones(tree, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tracking": {"dtt": 0.01}}))
    args = ["validate", str(MODEL), str(tree / "src" / "walks"), "--settings", str(bad), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dtt" in err and "root_assist_frequency_hz" in err and str(bad) in err
    bad.write_text(json.dumps({"thresholds": {"body_error_okay": 1}}))
    assert main(args) == 2 and "body_error_ok," in capsys.readouterr().err
    bad.write_text(json.dumps({"tracking": {"dt": -1.0}}))  # a value the dataclass refuses
    assert main(args) == 2 and "dt" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_every_flag_of_the_parser_is_on_the_cli_page():
    import argparse

    def subcommands(parser, prefix=""):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield f"{prefix}{name}", child
                    yield from subcommands(child, f"{prefix}{name} ")

    page = (REPO / "docs" / "cli.md").read_text()
    found = dict(subcommands(build_parser()))
    assert sorted(n for n in found if " " not in n) == sorted(SUBCOMMANDS) and "library build" in found
    missing = [
        (name, flag)
        for name, parser in found.items()
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
        if flag not in ("-h", "--help") and f"`{flag}`" not in page
    ]
    assert not missing and all(f"`kangengine {name}" in page for name in found), missing
