"""The stages of the ``kangengine`` command end to end (issue 14): convert -> validate -> library build -> export
-> preview through ``subprocess`` on real CMU clips (cropped to a fraction of a second), then ``demo``, the
progress bar on a terminal, every subcommand's ``--help`` and bad arguments.

Oracles outside the code under test: bvhio re-reads the exported BVH (joint positions against the converted
motion's own forward kinematics, < 1 mm); ``MotionLibrary.load`` re-reads the library (its frames against the
``.npz`` files); Pillow re-reads the GIF (frame count from the clip's duration and the asked rate, size);
matplotlib's own artists for the validation figure (labels, threshold lines, the fall line).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import bvhio
import numpy as np
import pytest
from conftest import REPO, crop_bvh, data_file

import kangengine as ke
from kangengine.cli import main
from kangengine.data import data_path
from kangengine.pipelines.plots import contact_groups

MODEL = data_path("humanoid_CMU.xml")
CONFIG = "cmu_bvh_to_cmu_humanoid"
STAGES = ("library", "library build", "export", "preview", "demo")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "kangengine", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def _manifest(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """Two CMU walk crops (0.4 s and 0.3 s at 120 fps) in a tree, through convert and validate (subprocess)."""
    root = tmp_path_factory.mktemp("stages")
    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    src = root / "src"
    crop_bvh(walk, src / "walks" / "a.bvh", 48, start=10)
    crop_bvh(walk, src / "walks" / "deep" / "b.bvh", 36, start=120)
    conv = _run("convert", MODEL, src, "--config", CONFIG, "--out", root / "conv")
    val = _run("validate", MODEL, root / "conv", "--out", root / "val", "--root-assist-hz", "1")
    return root, conv, val


def test_convert_and_validate_outputs_mirror_the_tree_and_record_warnings(stages):
    root, conv, val = stages
    assert conv.returncode == 0, conv.stderr
    assert val.returncode == 0, val.stderr
    # not a terminal: one line per clip on stderr, the JSON summary on stdout
    assert [x.split()[0] for x in conv.stderr.splitlines()] == ["[1/2]", "[2/2]"], conv.stderr
    assert json.loads(conv.stdout)["counts"]["converted"] == 2
    out = json.loads(val.stdout)
    assert sorted(c["clip"] for c in out["clips"]) == ["walks/a", "walks/deep/b"]
    for e in _manifest(root / "conv" / "manifest.jsonl") + _manifest(root / "val" / "manifest.jsonl"):
        assert e["status"] == "done" and isinstance(e["warnings"], list)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    a = ke.animation.load_articulation_motion_npz(root / "conv" / "walks" / "a.npz", layout)
    assert a.num_frames == 48 and a.fps() == pytest.approx(120.0)
    for stem in ("walks/a", "walks/deep/b"):
        report = json.loads((root / "val" / f"{stem}.json").read_text())
        assert report["verdict"] in ("ok", "warn", "reject")
        from PIL import Image

        with Image.open(root / "val" / f"{stem}.png") as im:  # the validation plot is a real PNG
            assert im.format == "PNG" and im.size[0] > 600 and im.size[1] > 600


def test_library_build_packs_the_folder_and_reads_back(stages, tmp_path):
    root, _, _ = stages
    lib_file = tmp_path / "walks.safetensors"
    verdicts = ["--verdicts", "ok,warn,reject", "--validation", root / "val"]  # any verdict, but validated
    done = _run("library", "build", root / "conv", "--out", lib_file, *verdicts)
    assert done.returncode == 0, done.stderr
    assert str(lib_file) in done.stdout and "2 clips" in done.stdout
    import torch

    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    lib = ke.animation.MotionLibrary.load(lib_file)
    assert lib.clip_names == ("walks/a", "walks/deep/b")
    for k, stem in enumerate(lib.clip_names):
        clip = ke.animation.load_articulation_motion_npz(root / "conv" / f"{stem}.npz", layout)
        assert int(lib.clip_frame_count[k]) == clip.num_frames
        n = clip.num_frames - 1  # every frame time before the clip's end (sample wraps t = duration to 0)
        times = torch.arange(n, dtype=torch.float64) / clip.fps()
        state = lib.forward_kinematics(lib.sample(torch.full((n,), k), times))
        pos, _ = ke.animation.forward_kinematics(layout, clip.q[:n].astype(np.float64))
        np.testing.assert_allclose(state.body_positions.numpy(), pos, atol=1e-4)
    # a verdict filter that nothing passes: exit 1, one line, no file
    none = tmp_path / "none.safetensors"
    verdicts = {json.loads((root / "val" / f"{s}.json").read_text())["verdict"] for s in ("walks/a", "walks/deep/b")}
    missing = sorted({"ok", "warn", "reject"} - verdicts)
    if missing:
        done = _run(
            "library", "build", root / "conv", "--out", none, "--verdicts", missing[0], "--validation", root / "val"
        )
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and "no clip to pack" in done.stderr
        assert not none.exists()


def test_export_bvh_reread_by_bvhio_matches_the_converted_motion_within_1_mm(stages, tmp_path):
    root, _, _ = stages
    npz = root / "conv" / "walks" / "a.npz"
    out = tmp_path / "a.bvh"
    done = _run("export", npz, MODEL, "--format", "bvh", "--out", out)
    assert done.returncode == 0 and str(out) in done.stdout, done.stderr
    rm = ke.pipelines.load_robot_motion(npz, MODEL)
    pos, _ = ke.animation.forward_kinematics(rm.layout, rm.motion.q.astype(np.float64))
    expected_cm = ke.conventions.vec_yup_from_zup(pos) * 100.0  # the BVH is Y up, centimetres
    hierarchy = bvhio.readAsHierarchy(str(out))
    joints = {j.Name: j for j, _, _ in hierarchy.layout()}
    worst = 0.0
    for f in range(0, rm.motion.num_frames, 7):
        hierarchy.loadPose(f, recursive=True)
        got = np.array([list(joints[n].PositionWorld) for n in rm.layout.body_names], dtype=np.float64)
        worst = max(worst, float(np.abs(got - expected_cm[f]).max()))
    assert worst < 0.1, f"{worst} cm"  # < 1 mm
    mj = tmp_path / "a_mjlab.npz"
    assert _run("export", npz, MODEL, "--format", "mjlab", "--out", mj).returncode == 0
    with np.load(mj) as z:
        assert z["joint_pos"].shape == (48, rm.layout.nq - 7) and z["body_pos_w"].shape == (48, rm.layout.num_bodies, 3)
        np.testing.assert_allclose(z["body_pos_w"], pos, atol=1e-5)


def test_preview_gif_has_the_frames_and_size_asked(stages, tmp_path):
    from PIL import Image

    root, _, _ = stages
    npz = root / "conv" / "walks" / "a.npz"
    out = tmp_path / "a.gif"
    args = ["preview", npz, MODEL, "--out", out, "--source", root / "src" / "walks" / "a.bvh"]
    done = _run(*args, "--fps", "10", "--size", "320x180")
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and "renderer" in done.stdout
    duration = ke.pipelines.load_robot_motion(npz, MODEL).motion.duration  # 48 frames at 120 fps
    with Image.open(out) as im:
        assert im.size == (320, 180)
        assert im.n_frames == int(math.floor(duration * 10 + 1e-9)) + 1
        renderer = im.info.get("comment", b"").decode()
        assert "renderer=" in renderer
        # both panels drawn: neither half of the middle frame is a single colour
        im.seek(im.n_frames // 2)
        rgb = np.asarray(im.convert("RGB"))[: 180 - 16]
        assert rgb[:, :160].reshape(-1, 3).std(0).max() > 5 and rgb[:, 160:].reshape(-1, 3).std(0).max() > 5


def test_demo_runs_every_stage_and_ends_with_a_gif(tmp_path):
    from PIL import Image

    out = tmp_path / "demo"
    done = _run("demo", "--out", out, "--seconds", "0.4", "--renderer", "pillow")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [x.split()[0] for x in lines if x[:2] in ("1/", "2/", "3/", "4/", "5/")] == [
        "1/5",
        "2/5",
        "3/5",
        "4/5",
        "5/5",
    ]
    gif = out / "preview.gif"
    assert lines[-1] == f"open this picture: {gif.resolve()}"
    for rel in ("converted/cmu_02_01_walk.npz", "validation/no_assist/cmu_02_01_walk.json", "library.safetensors"):
        assert (out / rel).is_file(), rel
    assert (out / "export" / "cmu_02_01_walk.bvh").is_file()
    free = json.loads((out / "validation" / "no_assist" / "cmu_02_01_walk.json").read_text())
    if free["verdict"] == "reject":  # then it says so and validates again with root assistance
        assert "rejected without help" in done.stdout and "root assistance ON (1 Hz)" in done.stdout
        assert (out / "validation" / "root_assist_1hz" / "cmu_02_01_walk.json").is_file()
    duration = ke.pipelines.load_robot_motion(out / "converted" / "cmu_02_01_walk.npz", MODEL).motion.duration
    assert duration == pytest.approx(0.4, abs=1e-3)
    with Image.open(gif) as im:
        assert im.n_frames == int(math.floor(duration * 25 + 1e-9)) + 1 and im.size == (640, 360)
    # the BVH re-read by bvhio has the cropped clip's frames (0.4 s at 120 fps: 49 rows)
    assert bvhio.readAsBvh(str(out / "export" / "cmu_02_01_walk.bvh")).FrameCount == 49


# -- the progress bar ------------------------------------------------------------------------------------------


def _run_on_terminal(args) -> tuple[int, str]:
    """Run the command with stderr on a pseudo-terminal; returns (exit status, what the terminal showed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))  # 30 rows, 120 columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "kangengine", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=_env(),
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_with_per_clip_status_and_warnings_in_the_manifest(tmp_path):
    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    for i in range(3):
        crop_bvh(walk, tmp_path / "src" / f"clip_{i}.bvh", 12, start=20 * i)
    (tmp_path / "smpl").mkdir()
    args = ["convert", MODEL, tmp_path / "src", "--config", CONFIG, "--smpl-model-dir", tmp_path / "smpl"]
    rc, shown = _run_on_terminal([*args, "--out", tmp_path / "out"])
    assert rc == 0, shown
    assert "convert: 100%" in shown and "3/3" in shown and "clip" in shown  # tqdm's bar, its unit
    # the option the BVH reader does not take is a warning: a line above the bar and in the manifest
    assert shown.count("warning(s)") == 3 and "[1/3]" in shown
    entries = _manifest(tmp_path / "out" / "manifest.jsonl")
    assert len(entries) == 3 and all("model_dir" in " ".join(e["warnings"]) for e in entries)
    rc, shown = _run_on_terminal([*args, "--out", tmp_path / "out2", "--quiet"])
    assert rc == 0 and shown.strip() == ""


# -- threads --------------------------------------------------------------------------------------------------


def test_passive_openmp_waits_unless_the_user_chose_and_threads_reach_the_tracker(tmp_path):
    code = (
        "import os, sys; from kangengine.cli import main; main(['configs']); "
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in _env().items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split()[-2:] == ["PASSIVE", "False"], done.stderr  # set before torch was loaded
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "OMP_WAIT_POLICY": "ACTIVE"}
    )
    assert done.stdout.split()[-2] == "ACTIVE"  # the user's choice is kept
    # --threads reaches the simulator's settings (recorded in each report), default 1
    walk = crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "w.bvh", 8)
    args = ["validate", str(MODEL), str(walk), "--config", CONFIG, "--no-plots", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "t1")]) in (0, 1)
    assert main([*args, "--out", str(tmp_path / "t2"), "--threads", "2"]) in (0, 1)
    for out, threads in (("t1", 1), ("t2", 2)):
        assert json.loads((tmp_path / out / "w.json").read_text())["settings"]["threads"] == threads


# -- the parser -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", STAGES)
def test_every_stage_has_help_with_a_worked_example(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command.split(), "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: kangengine {command}" in text and "example:" in text
    assert f"kangengine {command} " in text.split("example:")[1]
    assert all("_" not in opt for opt in text.split() if opt.startswith("--"))  # kebab-case flags


def test_bad_arguments_give_one_line_and_exit_2(tmp_path, capsys):
    npz = tmp_path / "clip.npz"
    npz.write_bytes(b"")  # exists; never read: each case is refused before
    a_file = tmp_path / "file"
    a_file.write_text("")
    cases = [
        ["library"],
        ["library", "build", tmp_path / "no_such_folder", "--out", tmp_path / "x.safetensors"],
        ["library", "build", tmp_path, "--out", tmp_path / "x.txt"],
        ["library", "build", tmp_path, "--out", tmp_path / "x.safetensors", "--verdicts", "good"],
        ["library", "build", tmp_path, "--out", tmp_path / "x.safetensors", "--validation", tmp_path / "nope"],
        ["export", npz, MODEL, "--out", tmp_path / "x.bvh"],
        ["export", npz, MODEL, "--out", tmp_path / "x.fbx", "--format", "fbx"],
        ["export", tmp_path / "no_such.npz", MODEL, "--out", tmp_path / "x.bvh", "--format", "bvh"],
        ["export", npz, tmp_path / "no_such.xml", "--out", tmp_path / "x.bvh", "--format", "bvh"],
        ["preview", npz, MODEL, "--out", tmp_path / "x.png"],
        ["preview", npz, MODEL, "--out", tmp_path / "x.gif", "--size", "big"],
        ["preview", npz, MODEL, "--out", tmp_path / "x.gif", "--size", "32x32"],
        ["preview", npz, MODEL, "--out", tmp_path / "x.gif", "--fps", "0"],
        ["preview", npz, MODEL, "--out", tmp_path / "x.gif", "--source", tmp_path / "no_such.bvh"],
        ["demo", "--out", a_file],
        ["demo", "--renderer", "opengl"],
        ["demo", "--seconds", "0", "--out", tmp_path / "x.demo"],
        ["demo", "--root-assist-hz", "-1", "--out", tmp_path / "x.demo"],
    ]
    for args in cases:
        args = [str(a) for a in args]
        try:
            rc = main(args)
        except SystemExit as exc:  # argparse's own refusals
            rc = exc.code
        err = capsys.readouterr().err
        assert rc == 2, (args, err)
        assert err.count("\n") == 1 and err.startswith("kangengine") and "error" in err, (args, err)
    assert not list(tmp_path.glob("x.*"))
    done = _run("export", npz, MODEL, "--out", tmp_path / "x.bvh", "--format", "fbx")  # the real process
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


# -- the validation figure ------------------------------------------------------------------------------------


def test_validation_figure_reads_at_a_glance_on_a_clip_that_falls(tmp_path):
    """A real walk crop tracked with limp drives falls; the figure shows the worst DOFs only, the thresholds,
    the fall in every panel and the contacts grouped per foot."""
    from kangengine.pipelines.plots import validation_figure, write_plot
    from kangengine.pipelines.validate import ClipReport
    from kangengine.sim.verdict import summarize, verdict_of

    desc = ke.asset.load(MODEL)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc)
    clip = ke.io.load_bvh(crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "w.bvh", 100, start=10))
    moved = ke.retarget.retarget_motion(clip, CONFIG, desc).motion
    motion = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(moved, clamp_to_limits=True).motion
    model = ke.sim.Model.from_desc(desc, layout)
    th = ke.sim.ValidationThresholds()
    # PD drives too weak to carry the body (0.2 Hz, no feed-forward, no balance correction): a certain fall
    settings = ke.sim.TrackingSettings(drive_frequency_hz=0.2, balance=False, feedforward="none")
    result = ke.sim.track(model, [motion], settings=settings, names=["walk"])
    metrics, reasons = summarize(result, 0, motion, model, th)
    report = ClipReport("walk", verdict_of(reasons), tuple(reasons), metrics, "")
    assert metrics["fell_at_s"] is not None, "expected the limp tracker to fall"
    fig = validation_figure(result, 0, report, thresholds=th, top_dofs=10)
    dof_ax, body_ax, wrench_ax, contact_ax = fig.axes[:4]
    labels = [t.get_text() for t in dof_ax.get_yticklabels()]
    assert len(labels) == 10 < len(result.dof_names)
    # the worst DOF by RMS over the simulated frames is at the top
    sim = result.simulated[0, : int(result.clip_step_count[0])]
    rms = np.sqrt((result.dof_error[0, : len(sim)][sim] ** 2).mean(0))
    assert labels[-1].split()[0] == result.dof_names[int(np.argmax(rms))]
    thresholds = sorted(round(line.get_ydata()[0], 6) for line in body_ax.lines if line.get_gid() == "threshold")
    assert thresholds == sorted([th.body_error_ok, th.body_error_reject, th.fall_body_error])
    assert len([x for x in wrench_ax.lines if x.get_gid() == "threshold"]) == 2
    for ax in (dof_ax, body_ax, wrench_ax, contact_ax):
        falls = [x for x in ax.lines if x.get_gid() == "fall"]
        assert len(falls) == 1 and falls[0].get_xdata()[0] == pytest.approx(metrics["fell_at_s"])
    assert "fell at" in " ".join(t.get_text() for t in dof_ax.texts)
    groups = [t.get_text() for t in contact_ax.texts]
    assert "left foot" in groups and "right foot" in groups
    first = next(r for r in report.reasons if r.severity.value != "info")
    shown = next(t.get_text() for t in fig.texts if t.get_gid() == "reasons")
    assert first.message[:100] in shown  # the reasons, with their numbers, under the title
    png = write_plot(tmp_path / "walk.png", result, 0, report, thresholds=th)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_contact_groups_per_foot_for_the_naming_styles_of_real_models():
    cmu = ["lfemur", "ltibia", "lfoot", "ltoes", "rfoot", "rtoes", "lowerback", "lhand"]
    assert dict(contact_groups(cmu)) == {
        "lfemur": [0],
        "left knee": [1],
        "left foot": [2, 3],
        "right foot": [4, 5],
        "lowerback": [6],
        "left hand": [7],
    }
    g1 = ["left_ankle_roll_link", "right_ankle_roll_link", "pelvis"]
    assert dict(contact_groups(g1)) == {"left foot": [0], "right foot": [1], "pelvis": [2]}
    smpl = ["L_Ankle", "L_Toe", "R_Ankle", "R_Toe"]
    assert dict(contact_groups(smpl)) == {"left foot": [0, 1], "right foot": [2, 3]}
