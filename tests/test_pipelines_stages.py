"""Pipeline stages on the shipped example (CMU walk on the CMU humanoid): library build, export.

Oracles: bvhio re-reads the exported BVH (joint positions vs forward kinematics, < 1 mm); MuJoCo's own
kinematics (``xpos``, ``xquat``, ``mj_objectVelocity``) for the mjlab / ProtoMotions body arrays; the library
file re-loaded with ``MotionLibrary.load`` and sampled against the clip's own forward kinematics.
"""

from __future__ import annotations

import json

import bvhio
import mujoco
import numpy as np
import pytest
import torch

import kangengine as ke
from kangengine.data import data_path
from kangengine.pipelines import ConvertOptions, convert_clips
from kangengine.pipelines.export import export_motion, load_robot_motion
from kangengine.pipelines.library_build import build_library

MODEL = data_path("humanoid_CMU.xml")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The shipped walk, cropped to 0.5 s, converted onto the shipped humanoid."""
    root = tmp_path_factory.mktemp("stages")
    src = ke.io.load_bvh(data_path("cmu_02_01_walk.bvh"))[:61]
    ke.io.save_bvh(root / "src" / "walk.bvh", src)
    (root / "src" / "sub").mkdir()
    ke.io.save_bvh(root / "src" / "sub" / "walk_b.bvh", ke.io.load_bvh(data_path("cmu_02_01_walk.bvh"))[60:121])
    out = root / "conv"
    rep = convert_clips([root / "src"], MODEL, options=ConvertOptions(config="cmu_bvh_to_cmu_humanoid"), out_dir=out)
    assert [o.status for o in rep.outcomes] == ["converted", "converted"]
    return out


def _mj_state(rm):
    m = mujoco.MjModel.from_xml_path(str(MODEL))
    d = mujoco.MjData(m)
    buf = ke.adapters.MuJoCoMotionAdapter(rm.layout, model=m).pack(rm.motion)
    return m, d, np.asarray(buf.qpos, np.float64), np.asarray(buf.qvel, np.float64)


def test_bvh_export_reread_by_bvhio_matches_forward_kinematics(converted, tmp_path):
    res = export_motion(converted / "walk.npz", MODEL, tmp_path, format="bvh")
    assert res.path.endswith("walk.bvh") and res.frames == 61
    rm = load_robot_motion(converted / "walk.npz", MODEL)
    pos, _ = ke.animation.forward_kinematics(rm.layout, rm.motion.q.astype(np.float64))
    pos_yup_cm = ke.conventions.vec_yup_from_zup(pos) * 100.0
    root = bvhio.readAsHierarchy(res.path)
    joints = {j.Name: j for j, _, _ in root.layout()}
    assert set(rm.layout.body_names) <= set(joints)
    worst = 0.0
    for f in (0, 30, 60):
        root.loadPose(f, recursive=True)
        got = np.array([joints[n].PositionWorld for n in rm.layout.body_names], dtype=np.float64)
        worst = max(worst, float(np.abs(got - pos_yup_cm[f]).max()))
    assert worst < 0.1  # cm: < 1 mm


def test_mjlab_npz_matches_mujoco_kinematics(converted, tmp_path):
    res = export_motion(converted / "walk.npz", MODEL, tmp_path / "walk_mjlab.npz", format="mjlab")
    z = np.load(res.path)
    keys = {"fps", "joint_pos", "joint_vel", "body_pos_w", "body_quat_w", "body_lin_vel_w", "body_ang_vel_w"}
    assert keys <= set(z.files) and z["fps"].shape == (1,) and z["fps"][0] == pytest.approx(120.0)
    rm = load_robot_motion(converted / "walk.npz", MODEL)
    m, d, qpos, qvel = _mj_state(rm)
    assert z["body_pos_w"].shape == (61, m.nbody - 1, 3) and z["joint_pos"].shape == (61, m.nq - 7)
    vel = np.zeros(6)
    for f in (5, 30, 55):
        d.qpos[:], d.qvel[:] = qpos[f], qvel[f]
        mujoco.mj_forward(m, d)
        np.testing.assert_allclose(z["body_pos_w"][f], d.xpos[1:], atol=1e-5)
        dots = np.abs(np.sum(z["body_quat_w"][f] * d.xquat[1:], axis=-1))  # WXYZ, sign free
        np.testing.assert_allclose(dots, 1.0, atol=1e-5)
        np.testing.assert_allclose(z["joint_pos"][f], qpos[f, 7:], atol=1e-6)
        for b in (1, 8, 20):  # world-frame velocity of the body origin (flg_local=0)
            mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_XBODY, b, vel, 0)
            np.testing.assert_allclose(z["body_ang_vel_w"][f, b - 1], vel[:3], atol=0.15)
            np.testing.assert_allclose(z["body_lin_vel_w"][f, b - 1], vel[3:], atol=0.05)


def test_gmr_csv_and_protomotions_files(converted, tmp_path):
    rm = load_robot_motion(converted / "walk.npz", MODEL)
    _, _, qpos, _ = _mj_state(rm)
    csv = export_motion(converted / "walk.npz", MODEL, tmp_path / "walk.csv", format="gmr_csv")
    rows = np.loadtxt(csv.path, delimiter=",")
    assert rows.shape == (61, qpos.shape[1])
    np.testing.assert_allclose(rows[:, :3], qpos[:, :3], atol=1e-6)
    np.testing.assert_allclose(rows[:, 3:7], qpos[:, [4, 5, 6, 3]], atol=1e-6)  # XYZW
    np.testing.assert_allclose(rows[:, 7:], qpos[:, 7:], atol=1e-6)
    pm = export_motion(converted / "walk.npz", MODEL, tmp_path / "walk.motion", format="protomotions")
    data = torch.load(pm.path, weights_only=True)  # plain tensors only: no pickled classes
    assert data["fps"] == pytest.approx(120.0)
    pos, quat = ke.animation.forward_kinematics(rm.layout, rm.motion.q.astype(np.float64))
    np.testing.assert_allclose(data["rigid_body_pos"].numpy(), pos, atol=1e-5)
    xyzw = data["rigid_body_rot"].numpy()
    np.testing.assert_allclose(np.abs(np.sum(xyzw[..., [3, 0, 1, 2]] * quat, axis=-1)), 1.0, atol=1e-5)
    assert data["dof_pos"].shape == (61, rm.layout.nv - 6)
    with pytest.raises(ke.errors.FormatError, match="formats are"):
        export_motion(converted / "walk.npz", MODEL, tmp_path / "x", format="fbx")


def test_library_build_filters_by_verdict_and_reloads(converted, tmp_path):
    val = tmp_path / "val"
    (val / "sub").mkdir(parents=True)
    (val / "walk.json").write_text(json.dumps({"verdict": "warn"}))
    (val / "sub" / "walk_b.json").write_text(json.dumps({"verdict": "reject"}))
    res = build_library(converted, tmp_path / "lib.safetensors", verdict_filter={"ok", "warn"}, validation_dir=val)
    assert res.clip_names == ("walk",)
    assert [(s.name, "reject" in s.reason) for s in res.skipped] == [("sub/walk_b", True)]
    every = build_library(converted, tmp_path / "all.safetensors")
    assert every.clip_names == ("sub/walk_b", "walk") and every.total_frames == 122
    lib = ke.animation.MotionLibrary.load(every.path)
    assert lib.clip_names == ("sub/walk_b", "walk")
    rm = load_robot_motion(converted / "walk.npz", MODEL)
    pos, _ = ke.animation.forward_kinematics(rm.layout, rm.motion.q.astype(np.float64))
    state = lib.forward_kinematics(lib.sample(torch.tensor([1, 1]), torch.tensor([0.0, 0.25])))
    np.testing.assert_allclose(state.body_positions[1].numpy(), pos[30], atol=1e-4)  # 0.25 s = frame 30
    with pytest.raises(ke.errors.MotionError, match="no clip to pack"):
        build_library(converted, tmp_path / "none.safetensors", verdict_filter={"ok"}, validation_dir=val)
    assert not (tmp_path / "none.safetensors").exists()


def _gif_frames(path):
    from PIL import Image, ImageSequence

    with Image.open(path) as im:
        return [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)], im.size, im.info.get("comment", b"")


def test_preview_gif_pillow_side_by_side(converted, tmp_path):
    from kangengine.pipelines.preview import render_preview

    src = ke.io.load_bvh(data_path("cmu_02_01_walk.bvh"))[:61]
    res = render_preview(
        converted / "walk.npz", MODEL, tmp_path / "p.gif", source=src, fps=10, size=(320, 180), renderer="pillow"
    )
    frames, size, comment = _gif_frames(res.path)
    assert res.renderer == "pillow" and b"renderer=pillow" in comment
    assert len(frames) == res.frames == 6 and size == (320, 180)  # 0.5 s at 10 fps: t = 0, 0.1, ..., 0.5
    for half in (frames[3][:160, :160], frames[3][:160, 160:]):  # robot and source panels both drawn
        assert len(np.unique(half.reshape(-1, 3), axis=0)) > 3 and half.std() > 5
    assert not np.array_equal(frames[0][-16:], frames[-1][-16:])  # the time bar moves
    with pytest.raises(ke.errors.FormatError, match="expected .gif or .mp4"):
        render_preview(converted / "walk.npz", MODEL, tmp_path / "p.avi")


def test_preview_gif_mujoco_renderer(converted, tmp_path):
    from kangengine.pipelines.preview import gl_backend, render_preview

    backend, message = gl_backend()
    if backend is None:
        with pytest.raises(ke.errors.MissingDependencyError, match="apt-get install"):
            render_preview(converted / "walk.npz", MODEL, tmp_path / "m.gif", renderer="mujoco")
        pytest.skip(message)
    res = render_preview(converted / "walk.npz", MODEL, tmp_path / "m.gif", fps=5, size=(160, 96), renderer="mujoco")
    frames, size, _ = _gif_frames(res.path)
    assert res.renderer == f"mujoco-{backend}" and len(frames) == 3 and size == (160, 96)
    assert frames[1][: 96 - 16].std() > 10  # the scene is drawn, not a blank buffer
