"""Dataset conversion: real clips onto the CMU humanoid, bad clips listed, resume, parallel workers, CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine.cli import main
from kangengine.data import data_path
from kangengine.pipelines import ConvertOptions, convert_clips

MODEL = data_path("humanoid_CMU.xml")
OPTS = ConvertOptions(config="cmu_bvh_to_cmu_humanoid")


@pytest.fixture()
def clips(tmp_path):
    good = tmp_path / "walk.bvh"
    shutil.copy(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), good)
    truncated = tmp_path / "truncated.bvh"
    truncated.write_text(good.read_text()[:5000])
    foreign = tmp_path / "arm.bvh"  # a 3-joint arm: the CMU joint map does not apply
    shutil.copy(data_file("bvh/other/arm_3joint.bvh"), foreign)
    return good, truncated, foreign


def test_converts_good_clips_and_lists_bad_ones(clips, tmp_path):
    good, truncated, foreign = clips
    out = tmp_path / "out"
    report = convert_clips([good, truncated, foreign], MODEL, options=OPTS, out_dir=out)
    # sorted by the clips' paths relative to their common folder
    assert [(o.name, o.status) for o in report.outcomes] == [
        ("arm.bvh", "failed"),
        ("truncated.bvh", "failed"),
        ("walk.bvh", "converted"),
    ]
    assert "truncated.bvh" in report.outcomes[1].error and "FormatError" in report.outcomes[1].error
    assert "UnknownNameError" in report.outcomes[0].error
    summary = json.loads((out / "convert_summary.json").read_text())
    assert summary["counts"] == {"converted": 1, "up_to_date": 0, "failed": 2}
    assert summary["totals"] == {"done": 1, "failed": 2} and len(summary["clips"]) == 3
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    motion = ke.animation.load_articulation_motion_npz(out / "walk.npz", layout)
    assert motion.num_frames == 343 and motion.fps() == pytest.approx(120, rel=1e-4)
    assert motion.metadata["residual_max_rad"] < 0.5 and np.isfinite(motion.q).all()
    # the written q is the mapper's own result for the retargeted clip
    src = ke.io.load_bvh(good)
    moved = ke.retarget.retarget_motion(src, OPTS.config, ke.asset.load(MODEL))
    again = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(moved.motion)
    np.testing.assert_array_equal(motion.q, again.motion.q)


def test_resume_skips_up_to_date_and_redoes_stale(clips, tmp_path):
    good, _, _ = clips
    out = tmp_path / "out"
    convert_clips([good], MODEL, options=OPTS, out_dir=out)
    before = (out / "walk.npz").stat().st_mtime_ns
    again = convert_clips([good], MODEL, options=OPTS, out_dir=out)
    assert again.outcomes[0].status == "up_to_date" and (out / "walk.npz").stat().st_mtime_ns == before
    # other options: stale, converted again
    at60 = convert_clips([good], MODEL, options=ConvertOptions(config=OPTS.config, fps=60.0), out_dir=out)
    assert at60.outcomes[0].status == "converted"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(MODEL))
    assert ke.animation.load_articulation_motion_npz(out / "walk.npz", layout).fps() == 60.0
    # a changed source file: stale too
    text = good.read_text().replace("Frame Time: 0.008333", "Frame Time: 0.010000")
    good.write_text(text)
    assert (
        convert_clips([good], MODEL, options=ConvertOptions(config=OPTS.config, fps=60.0), out_dir=out)
        .outcomes[0]
        .status
        == "converted"
    )


def test_parallel_workers_give_the_same_outputs(clips, tmp_path):
    good, truncated, _ = clips
    serial = convert_clips([good, truncated], MODEL, options=OPTS, out_dir=tmp_path / "a")
    parallel = convert_clips([good, truncated], MODEL, options=OPTS, out_dir=tmp_path / "b", jobs=2)
    assert [o.status for o in serial.outcomes] == [o.status for o in parallel.outcomes]
    za, zb = np.load(tmp_path / "a" / "walk.npz"), np.load(tmp_path / "b" / "walk.npz")
    np.testing.assert_array_equal(za["q"], zb["q"])
    np.testing.assert_array_equal(za["qd"], zb["qd"])


def test_cli_convert(clips, tmp_path, capsys):
    good, truncated, _ = clips
    assert main(["convert", "--example", "--out", str(tmp_path / "ex")]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["converted"] == 1
    rc = main(["convert", str(MODEL), str(good), str(truncated), "--config", OPTS.config, "--out", str(tmp_path / "o")])
    assert rc == 1  # a failed clip makes the exit status non-zero, after converting the rest
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {"converted": 1, "up_to_date": 0, "failed": 1}
    assert report["failed"][0]["clip"].endswith("truncated.bvh")
    # an unknown configuration is a bad argument: one line, exit 2, nothing written
    assert main(["convert", str(MODEL), str(good), "--config", "no_such_config", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no_such_config" in err and err.count("\n") == 1 and not (tmp_path / "x").exists()


def test_globs_folders_and_output_stems(tmp_path):
    from kangengine.pipelines.batch import collect_clips, output_stems

    walk = data_file("bvh/cmu/02_01_cgspeed_walk.bvh")
    for rel in ("a/x.bvh", "a/b/y.bvh", "a/b/.hidden.bvh", "c/z.bvh", "c/z.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(walk, tmp_path / rel)
    exts = ke.pipelines.MOTION_LOADERS
    assert [c.rel for c in collect_clips([tmp_path / "a"], extensions=exts)] == ["b/y.bvh", "x.bvh"]
    found = collect_clips([str(tmp_path / "**" / "*.bvh"), tmp_path / "c"], extensions=exts)
    assert [c.rel for c in found] == ["a/b/y.bvh", "a/x.bvh", "c/z.bvh"]  # the overlap is listed once
    with pytest.raises(ke.errors.FileMissingError):
        collect_clips([str(tmp_path / "nothing_*.bvh")], extensions=exts)
    stems = output_stems(["w/a.bvh", "w/a.fbx", "w/b.bvh"])
    assert stems[2] == "w/b" and stems[0].startswith("w/a-") and stems[1].startswith("w/a-") and stems[0] != stems[1]
    assert output_stems(["walk a.npz", "walk_a.npz", "ok.npz"], clean=True)[2] == "ok"
    assert len(set(output_stems(["walk a.npz", "walk_a.npz"], clean=True))) == 2


def test_manifest_skips_a_torn_line_and_keeps_the_latest_entry(tmp_path):
    from kangengine.pipelines.batch import append_manifest, read_manifests

    append_manifest(tmp_path / "manifest.jsonl", {"clip": "a.bvh", "status": "failed", "time": 1.0})
    append_manifest(tmp_path / "manifest.shard-0-of-2.jsonl", {"clip": "a.bvh", "status": "done", "time": 2.0})
    append_manifest(tmp_path / "manifest.jsonl", {"clip": "b.bvh", "status": "done", "time": 3.0})
    with open(tmp_path / "manifest.jsonl", "ab") as f:
        f.write(b'{"clip": "c.bvh", "sta')  # what a kill inside a write would leave
    latest = read_manifests(tmp_path)
    assert sorted(latest) == ["a.bvh", "b.bvh"] and latest["a.bvh"]["status"] == "done"


def test_left_over_temporaries_of_this_run_are_removed_others_kept(clips, tmp_path):
    import tempfile

    good, _, _ = clips
    out = tmp_path / "out"
    out.mkdir()
    fd, mine = tempfile.mkstemp(prefix=".walk.npz.", suffix=".npz.tmp", dir=out)  # atomic_write's name
    os.close(fd)
    fd, other = tempfile.mkstemp(prefix=".other_clip.npz.", suffix=".npz.tmp", dir=out)  # another shard's
    os.close(fd)
    convert_clips([good], MODEL, options=OPTS, out_dir=out)
    assert not os.path.exists(mine) and os.path.exists(other)


def test_reader_options_reach_the_reader_or_are_noted(clips, tmp_path):
    good, _, _ = clips
    desc = ke.asset.load(MODEL)
    mapper = ke.animation.ArticulationMotionMapper(ke.animation.ArticulationCoordinateLayout.from_data(data=desc))
    detected = ke.pipelines.map_clip(good, desc, mapper, OPTS.config)[2].metadata
    given = ke.pipelines.map_clip(good, desc, mapper, OPTS.config, load_options={"units": "cm"})[2].metadata
    assert detected["source_units"] == "cmu" and given["scale"] == ke.io.BVH_LENGTH_UNITS["cm"]
    # a KangEngine skeleton .npz takes no reader options: converted, with a note in its warnings
    npz = tmp_path / "walk_skeleton.npz"
    ke.io.load_bvh(good).save_npz(npz)
    report = convert_clips([npz], MODEL, options=OPTS, out_dir=tmp_path / "o", load_options={"units": "cm"})
    (outcome,) = report.outcomes
    assert outcome.status == "converted" and any("does not apply" in w for w in outcome.warnings)
    line = json.loads((tmp_path / "o" / "manifest.jsonl").read_text())
    assert line["warnings"] == list(outcome.warnings)


# -- the robot path (issue 12 item 6) and what the summary shows (issue 17) ---------------------------------------


def _crop_bvh(src, dst, frames: int, start: int = 0):
    """A real BVH file with only ``frames`` motion rows (from ``start``): same header, ``Frames:`` fixed."""
    head, motion = Path(src).read_text().split("MOTION", 1)
    lines = motion.strip("\n").split("\n")
    rows = lines[2 + start : 2 + start + frames]
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    Path(dst).write_text(f"{head}MOTION\nFrames: {len(rows)}\n{lines[1]}\n" + "\n".join(rows) + "\n")
    return Path(dst)


def _without_times(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("time_s", "cpu_time_s")}


def test_robot_configuration_runs_retarget_to_robot_and_writes_its_metrics(tmp_path):
    clip = _crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "src" / "walk.bvh", 60)
    out = tmp_path / "out"
    opts = ConvertOptions(config="cmu_bvh_to_g1")
    report = convert_clips([clip], None, options=opts, out_dir=out)  # the model: the configuration's own
    (o,) = report.outcomes
    assert o.status == "converted", o.error
    # the oracle: the public API on the same clip
    expected = ke.retarget.retarget_to_robot(ke.io.load_bvh(clip), "cmu_bvh_to_g1")
    layout = expected.layout
    assert report.model_signature == layout.model_signature
    motion = ke.animation.load_articulation_motion_npz(out / "walk.npz", layout)
    np.testing.assert_allclose(motion.q, expected.motion.q, atol=1e-6)
    written = json.loads((out / "walk.metrics.json").read_text())
    assert written["clip"] == "walk.bvh" and written["fingerprint"] == motion.metadata["fingerprint"]
    assert (
        written["model_signature"] == layout.model_signature and motion.metadata["metrics_file"] == "walk.metrics.json"
    )
    got, want = _without_times(written["metrics"]), _without_times(json.loads(json.dumps(expected.metrics)))
    assert got.keys() == want.keys()
    assert got["key_body_error_m"]["mean"] == pytest.approx(want["key_body_error_m"]["mean"], abs=1e-6)
    assert got["joint_limit_hits"] == want["joint_limit_hits"] and got["frames"] == 60
    # the per-clip line of the summary and the folder's worst
    summary = json.loads((out / "convert_summary.json").read_text())
    (entry,) = summary["clips"]
    assert entry["quality"] == pytest.approx(ke.pipelines.convert.robot_quality(written["metrics"]))
    assert summary["quality"]["robot"]["key_body_error_m_mean_max"] == entry["quality"]["key_body_error_m_mean"]
    assert summary["quality"]["robot"]["clips_outside_limits"] == []
    # resume: up to date; a lost metrics file makes the clip stale
    assert convert_clips([clip], None, options=opts, out_dir=out).outcomes[0].status == "up_to_date"
    (out / "walk.metrics.json").unlink()
    assert convert_clips([clip], None, options=opts, out_dir=out).outcomes[0].status == "converted"
    assert (out / "walk.metrics.json").is_file()


def test_robot_configuration_for_another_model_converts_nothing(tmp_path):
    clip = _crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "walk.bvh", 20)
    with pytest.raises(ke.errors.LayoutMismatch, match="487073a8514741e4"):
        convert_clips([clip], MODEL, options=ConvertOptions(config="cmu_bvh_to_g1"), out_dir=tmp_path / "o")
    with pytest.raises(ke.errors.LayoutMismatch):  # BFS order is another layout of the same robot
        convert_clips([clip], None, options=ConvertOptions(config="cmu_bvh_to_g1", order="BFS"), out_dir=tmp_path / "o")
    with pytest.raises(ke.errors.FormatError, match="free root"):
        convert_clips([clip], None, options=ConvertOptions(config="cmu_bvh_to_g1", free_root=False), out_dir=tmp_path)
    assert not list(tmp_path.rglob("*.npz"))
    with pytest.raises(ke.errors.UnknownNameError, match="skeleton configurations: .*robot configurations: .*g1"):
        ke.pipelines.convert.config_kind("cmu_bvh_to_h1")


def _lowest_body_mujoco(model_path, layout, q):
    """``[frames]`` the lowest body origin height of ``q`` by MuJoCo's ``mj_kinematics`` (the oracle)."""
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(model_path))
    data = mujoco.MjData(model)
    qpos = ke.adapters.MuJoCoMotionAdapter(layout, model=model).pack_arrays(q, np.zeros((len(q), layout.nv))).qpos
    out = np.empty(len(q))
    for t in range(len(q)):
        data.qpos[:] = qpos[t]
        mujoco.mj_kinematics(model, data)
        out[t] = data.xpos[1:, 2].min()
    return out


def test_summary_shows_limit_violations_and_how_far_clamping_lifted_the_reference(tmp_path):
    """Knees that may not straighten (range 40-170 deg instead of 1-170): the walk's stance knees leave the
    range, clamping bends them and lifts the reference off the floor. The summary names the clip and the
    knee DOFs, and the lift agrees with MuJoCo's kinematics of the clamped and unclamped joint values."""
    shutil.copytree(MODEL.parent / "common", tmp_path / "common")
    text = MODEL.read_text()
    for knee in ("ltibiarx", "rtibiarx"):
        old = f'name="{knee}" axis="1 0 0" range="1   170"'
        assert old in text
        text = text.replace(old, f'name="{knee}" axis="1 0 0" range="40   170"')
    model = tmp_path / "stiff_knees.xml"
    model.write_text(text)
    clip = _crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "walk.bvh", 120)
    opts = ConvertOptions(config="cmu_bvh_to_cmu_humanoid", clamp_to_limits=True)
    (o,) = convert_clips([clip], model, options=opts, out_dir=tmp_path / "out").outcomes
    assert o.status == "converted", o.error
    quality = o.quality
    assert {"ltibiarx", "rtibiarx"} <= set(quality["limit_violation_dofs"]) and quality["limit_violation_max"] > 0.3
    # the oracle: MuJoCo on the written (clamped) q and on the mapper's unclamped q
    desc = ke.asset.load(model)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc)
    clamped = ke.animation.load_articulation_motion_npz(tmp_path / "out" / "walk.npz", layout)
    moved = ke.retarget.retarget_motion(ke.io.load_bvh(clip), opts.config, desc)
    free = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(moved.motion).motion
    lift = _lowest_body_mujoco(model, layout, clamped.q) - _lowest_body_mujoco(model, layout, free.q)
    assert lift.max() > 0.02
    assert quality["clamp_lift_m_max"] == pytest.approx(lift.max(), abs=1e-4)
    assert quality["clamp_lifted_share"] == pytest.approx((lift > ke.pipelines.convert.CLAMP_LIFT_M).mean(), abs=0.02)
    summary = json.loads((tmp_path / "out" / "convert_summary.json").read_text())["quality"]["skeleton"]
    assert summary["clips_outside_limits"] == ["walk.bvh"] and summary["clips_lifted_by_clamping"] == ["walk.bvh"]
    assert summary["clamp_lift_m_max"] == pytest.approx(lift.max(), abs=1e-4)


def _kangengine(*args, env=None, timeout=180):
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kangengine", *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_cli_convert_model_or_config_reaches_retarget_to_robot(tmp_path, capsys, monkeypatch):
    """``kangengine convert MODEL_OR_CONFIG CLIP... [--config NAME] --out DIR`` in a subprocess, on a crop;
    the other forms in this process (``main``)."""
    clip = _crop_bvh(data_file("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"), tmp_path / "src" / "walk.bvh", 40)
    done = _kangengine("convert", "cmu_bvh_to_g1", clip, "--out", tmp_path / "a", "--quiet")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["counts"] == {"converted": 1, "up_to_date": 0, "failed": 0}
    summary = json.loads((tmp_path / "a" / "convert_summary.json").read_text())
    (entry,) = summary["clips"]
    assert entry["quality"]["joints_outside_limits"] == 0 and entry["quality"]["key_body_error_m_mean"] < 0.06
    assert (tmp_path / "a" / "walk.metrics.json").is_file() and summary["options"]["config"] == "cmu_bvh_to_g1"
    # MODEL --config NAME: the same outputs (the model given is the shipped one)
    shipped = ke.data.data_path(ke.data.G1_MJCF)
    assert main(["convert", str(shipped), str(clip), "--config", "cmu_bvh_to_g1", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "walk.npz").read_bytes() == (tmp_path / "b" / "walk.npz").read_bytes()
    # a configuration whose model is not shipped: one line naming where it was looked for, exit 2
    env = ke.retarget.robot_config.MODEL_PATH_ENV
    monkeypatch.delenv(env, raising=False)
    capsys.readouterr()
    assert main(["convert", "cmu_bvh_to_g1_urdf", str(clip), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "g1_29dof.urdf" in err and env in err and not (tmp_path / "c").exists()
    # two different configurations: a bad argument
    assert main(["convert", "cmu_bvh_to_g1", str(clip), "--config", "cmu_fbx_to_g1", "--out", str(tmp_path)]) == 2
    assert "two configurations" in capsys.readouterr().err
    # kangengine configs lists the robot configurations and what they map
    assert main(["configs", "--json"]) == 0
    listed = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert {"cmu_bvh_to_g1", "cmu_fbx_to_g1_mesh", "smpl_to_g1_urdf"} <= set(listed)
    assert listed["smpl_to_g1_urdf"]["maps"] == "bodies" and listed["smpl_to_g1_urdf"]["mapping"]["L_Wrist"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_given_as_a_clip_is_failed_without_blocking(tmp_path):
    """Nothing writes to the FIFO: opening it would block forever; the clip is listed failed unopened."""
    fifo = tmp_path / "clip.bvh"
    os.mkfifo(fifo)
    walk = _crop_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"), tmp_path / "walk.bvh", 20)
    done = _kangengine("convert", MODEL, walk, fifo, "--config", OPTS.config, "--out", tmp_path / "o", timeout=120)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["counts"] == {"converted": 1, "up_to_date": 0, "failed": 1}
    assert "FIFO" in report["failed"][0]["error"] and report["failed"][0]["clip"].endswith("clip.bvh")


def test_summary_names_a_clip_whose_hinge_was_brought_back_from_a_wound_angle(tmp_path):
    """A knee whose wanted rotation goes the long way round (past its upper limit, through the back, and in
    again from below, as a long dance winds a hip): the mapper re-wraps those frames to the turn inside the
    limits, and the clip's quality and the summary say so (the frames counted against the path we wound)."""
    desc = ke.asset.load(MODEL)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    mapper = ke.animation.ArticulationMotionMapper(layout)
    knee = next(b for b in layout.blocks if b.joint_name == "ltibiarx")
    lo, hi = knee.limits
    n = 120
    path = np.empty(n)
    path[: n // 2] = np.linspace(0.5 * (lo + hi), lo + 2 * np.pi + 0.2, n // 2)
    path[n // 2 :] = lo + 2 * np.pi + 0.2 - np.linspace(0, 0.1, n - n // 2)
    q = np.tile(layout.neutral(), (n, 1))
    q[:, knee.q_offset] = path
    st = mapper.to_skeleton_state(q)
    clip = tmp_path / "wound.npz"
    ke.animation.SkeletonMotion(
        mapper.skeleton_tree, st.root_translation, st.local_rotation, 60.0, st.local_translation
    ).save_npz(clip)
    identity = {"name": "identity", "joint_mapping": {b: b for b in layout.body_names}, "target_asset": None}
    identity.update(rotation_wxyz=[1, 0, 0, 0], scale=1.0, ground_fix="none", project_hinges=False)
    config = tmp_path / "identity.json"
    config.write_text(json.dumps(identity))
    (o,) = convert_clips([clip], MODEL, options=ConvertOptions(config=str(config)), out_dir=tmp_path / "out").outcomes
    assert o.status == "converted", o.error
    outside = int(((path < lo) | (path > hi)).sum())
    assert n // 2 <= o.quality["rewrapped_frames"]["ltibiarx"] <= outside
    assert "ltibiarx" in o.quality["limit_violation_dofs"] and o.quality["limit_violation_max"] > 0.2
    summary = json.loads((tmp_path / "out" / "convert_summary.json").read_text())
    assert summary["quality"]["skeleton"]["clips_rewrapped"] == ["wound.npz"]
    assert summary["clips"][0]["quality"]["rewrapped_frames"] == o.quality["rewrapped_frames"]
