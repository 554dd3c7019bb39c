"""The shipped robot retarget configurations (``kangengine/retarget/configs/*g1*``): every one loads against its
real model file, names bodies the real source skeletons have, refuses other models and bad names, finds its
model by the documented search, and puts the real clips of its source on the G1.

Oracles: the layout signatures and body names of the real model files (MJCF, mesh MJCF, URDF in
``../shared/data``), the joint names of the real CMU BVH (cgspeed and 3dsMax), CMU FBX and SMPL skeletons, the
byte-identity of the shipped G1 model with its third-party original, MuJoCo's joint ranges, and the forward
kinematics of the MJCF and the URDF of the same robot compared with each other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine.animation.layout import forward_kinematics
from kangengine.data import G1_MJCF, data_path
from kangengine.datasets import amass
from kangengine.errors import FileMissingError, FormatError, LayoutMismatch, UnknownNameError
from kangengine.retarget.robot_config import MODEL_PATH_ENV, resolve_source_name

MJCF = "mjcf/unitree/g1_29dof.nomesh.xml"
MESH = "mjcf/unitree/g1_29dof.xml"
URDF = "urdf/unitree/g1_29dof.urdf"
SOURCES = {"cmu_bvh": "bvh", "cmu_fbx": "fbx", "smpl": "smpl"}
MODELS = {"": MJCF, "_mesh": MESH, "_urdf": URDF}
NAMES = [f"{s}_to_g1{m}" for s in SOURCES for m in MODELS]


@pytest.fixture()
def model_path(monkeypatch):
    """The documented search path pointed at the shared G1 files (the mesh MJCF and the URDF are not shipped)."""
    folders = [str(data_file(MESH).parent), str(data_file(URDF).parent)]
    monkeypatch.setenv(MODEL_PATH_ENV, os.pathsep.join(folders))


def _layout(rel):
    return ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(data_file(rel)), free_root=True)


@pytest.fixture(scope="module")
def skeletons():
    """Joint names of the real source skeletons each configuration is for."""
    bvh = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    max3ds = ke.io.load_bvh(data_file("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"))
    fbx = ke.pipelines.load_motion(data_file("fbx/07_01_cmu.fbx"))
    return {
        "bvh": [bvh.tree.node_names, max3ds.tree.node_names],
        "fbx": [fbx.tree.node_names],
        "smpl": [amass.joint_names("smpl")],
    }


def test_every_g1_configuration_is_listed_and_loads_against_its_real_model(model_path):
    assert set(NAMES) <= set(ke.retarget.list_robot_configs())
    assert not set(NAMES) & set(ke.retarget.list_retarget_configs())  # the skeleton list stays skeleton-only
    for name in NAMES:
        cfg = ke.retarget.load_robot_config(name)
        rel = MODELS[name[name.index("_to_g1") + 6 :]]
        layout = _layout(rel)
        assert cfg.name == name and cfg.model_signature == layout.model_signature, name
        expected = data_path(G1_MJCF) if rel == MJCF else data_file(rel).resolve()
        assert Path(cfg.target_model) == expected, name
        for b in (*cfg.bodies, *cfg.feet):
            assert b.robot in layout.body_names, (name, b.robot)


def test_shipped_g1_model_is_the_third_party_file_with_its_license():
    shipped = data_path(G1_MJCF)
    assert shipped.read_bytes() == data_file(MJCF).read_bytes()
    lic = (shipped.parent / "LICENSE").read_text()
    assert lic.startswith("BSD 3-Clause License") and "Unitree Robotics" in lic
    assert G1_MJCF in (shipped.parent.parent / "LICENSES.md").read_text()
    # the default configuration reads the shipped file: no folder outside the package is needed
    cfg = ke.retarget.load_robot_config("cmu_bvh_to_g1")
    assert Path(cfg.target_model) == shipped
    text = json.loads((Path(ke.retarget.__file__).parent / "configs" / "cmu_bvh_to_g1.json").read_text())
    assert "shared" not in text["target_model"]


@pytest.mark.parametrize("source", SOURCES)
def test_source_names_exist_in_the_real_skeletons(source, skeletons):
    cfg = ke.retarget.load_robot_config(f"{source}_to_g1")
    specs = [b.source for b in cfg.bodies] + [f.source_heel for f in cfg.feet] + [f.source_toe for f in cfg.feet]
    specs += [*cfg.heading_alignment.left, *cfg.heading_alignment.right]
    for names in skeletons[SOURCES[source]]:
        picked = [names[resolve_source_name(s, names, item=s)] for s in specs]
        assert len(picked) == len(specs)
    if source == "cmu_bvh":  # the shoulder joint of each naming variant, not the clavicle
        cg, max3ds = skeletons["bvh"]
        shoulder = next(b.source for b in cfg.bodies if b.robot == "left_shoulder_roll_link")
        assert cg[resolve_source_name(shoulder, cg, item="s")] == "LeftArm"
        assert max3ds[resolve_source_name(shoulder, max3ds, item="s")] == "LeftShoulder"


def test_mesh_and_urdf_models_are_found_by_the_search_path_or_named_when_absent(monkeypatch, tmp_path):
    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    with pytest.raises(FileMissingError) as e:
        ke.retarget.load_robot_config("cmu_bvh_to_g1_urdf")
    msg = str(e.value)
    assert "g1_29dof.urdf" in msg and "cmu_bvh_to_g1_urdf" in msg and MODEL_PATH_ENV in msg and "model=" in msg
    # model= wins over the search
    cfg = ke.retarget.load_robot_config("cmu_bvh_to_g1_urdf", model=data_file(URDF))
    assert Path(cfg.target_model) == data_file(URDF).resolve()
    # a folder of the search path holding the file by its name
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(MODEL_PATH_ENV, os.pathsep.join([str(tmp_path / "empty"), str(data_file(MESH).parent)]))
    assert Path(ke.retarget.load_robot_config("smpl_to_g1_mesh").target_model) == data_file(MESH).resolve()


def test_unknown_robot_body_names_the_valid_ones(tmp_path):
    """An ``extends`` variant in the user's folder with a misspelt body: the key and the valid names."""
    p = tmp_path / "mine.json"
    p.write_text(json.dumps({"extends": "cmu_bvh_to_g1", "bodies": [{"robot": "pelvs", "source": "Hips"}]}))
    with pytest.raises(UnknownNameError) as e:
        ke.retarget.load_robot_config(p)
    msg = str(e.value)
    assert "'pelvs'" in msg and "bodies[0].robot" in msg and str(p) in msg
    for valid in _layout(MJCF).body_names:
        assert valid in msg
    p.write_text(json.dumps({"extends": "cmu_bvh_to_g1", "feet": [{"robot": "left_foot", "source_heel": "x"}]}))
    with pytest.raises(FormatError, match=r"feet\[0\].*sole_points"):
        ke.retarget.load_robot_config(p)
    p.write_text(json.dumps({"extends": "cmu_bvh_to_g1", "scale": {"default": "auto", "bodies": {"hand": 1.0}}}))
    with pytest.raises(UnknownNameError, match="no robot body 'hand'.*left_wrist_yaw_link"):
        ke.retarget.load_robot_config(p)


def test_configuration_for_another_model_refuses_with_the_signatures():
    mjcf_sig, urdf_sig = _layout(MJCF).model_signature, _layout(URDF).model_signature
    with pytest.raises(LayoutMismatch) as e:
        ke.retarget.load_robot_config("cmu_bvh_to_g1", model=data_file(URDF))
    assert mjcf_sig in str(e.value) and urdf_sig in str(e.value) and "model_signature" in str(e.value)
    with pytest.raises(LayoutMismatch) as e:
        ke.retarget.load_robot_config("smpl_to_g1_urdf", model=data_file(MJCF))
    assert urdf_sig in str(e.value) and mjcf_sig in str(e.value)
    with pytest.raises(LayoutMismatch):
        ke.retarget.load_robot_config("cmu_fbx_to_g1", model=data_file("mjcf/dm_control/humanoid_CMU.xml"))


def test_bad_extends_chains_are_refused(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"extends": "b.json"}))
    b.write_text(json.dumps({"extends": "a.json"}))
    with pytest.raises(FormatError, match="cycle"):
        ke.retarget.load_robot_config(a)
    a.write_text(json.dumps({"extends": "cmu_bvh_to_g2"}))
    with pytest.raises(UnknownNameError, match="cmu_bvh_to_g2.*cmu_bvh_to_g1, cmu_bvh_to_g1_mesh"):
        ke.retarget.load_robot_config(a)
    a.write_text(json.dumps({"extends": 3}))
    with pytest.raises(FormatError, match="extends"):
        ke.retarget.load_robot_config(a)
    # a relative target_model is read from the folder of the file that sets it
    a.write_text(json.dumps({"extends": "cmu_bvh_to_g1", "target_model": "robot.xml"}))
    with pytest.raises(FileMissingError, match="robot.xml"):
        ke.retarget.load_robot_config(a)
    (tmp_path / "robot.xml").write_bytes(data_file(MJCF).read_bytes())
    assert Path(ke.retarget.load_robot_config(a).target_model) == (tmp_path / "robot.xml").resolve()


def _check_quality(result, model_rel, *, key_error_m):
    m = result.metrics
    assert m["key_body_error_m"]["mean"] < key_error_m, m["key_body_error_m"]
    assert m["floating_share"] <= 0.05 and m["penetration_m"] <= 0.01 and m["joints_outside_limits"] == 0
    assert all(f["phases"] >= 1 for f in m["feet"].values())
    if model_rel.endswith(".xml"):  # MuJoCo's joint ranges of the same file
        _within_mujoco_ranges(result, MJCF)


def _within_mujoco_ranges(result, rel: str) -> None:
    """Every hinge of ``result.motion.q`` within MuJoCo's ``jnt_range`` of the same joint in the MJCF ``rel``
    (1e-5 rad of float32 rounding)."""
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(data_file(rel)))
    for b in result.layout.blocks[1:]:
        lo, hi = model.jnt_range[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, b.joint_name)]
        q = result.motion.q[:, b.q_offset]
        assert q.min() >= lo - 1e-5 and q.max() <= hi + 1e-5, b.joint_name


def test_3dsmax_bvh_and_fbx_clips_onto_the_g1():
    walk = ke.io.load_bvh(data_file("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"))[:120]
    _check_quality(ke.retarget.retarget_to_robot(walk, "cmu_bvh_to_g1"), MJCF, key_error_m=0.05)
    fbx = ke.pipelines.load_motion(data_file("fbx/07_01_cmu.fbx"))
    _check_quality(ke.retarget.retarget_to_robot(fbx[:120], "cmu_fbx_to_g1"), MJCF, key_error_m=0.06)


def _smpl_gait(path, frames=60, fps=30.0):
    """An AMASS-layout SMPL clip: standing (root_orient Rx(90 deg), then turned to face +X), hips swinging
    +-0.4 rad out of phase, knees bending in swing, arms lowered from the T-pose."""
    from scipy.spatial.transform import Rotation

    t = np.arange(frames) / fps
    poses = np.zeros((frames, 72))
    poses[:, 0:3] = (Rotation.from_euler("z", 90, degrees=True) * Rotation.from_rotvec([np.pi / 2, 0, 0])).as_rotvec()
    w = 2 * np.pi
    poses[:, 3], poses[:, 6] = 0.4 * np.sin(w * t), -0.4 * np.sin(w * t)  # L_Hip, R_Hip about SMPL x
    poses[:, 12] = 0.6 * np.clip(np.sin(w * t + 1.2), 0, None)  # L_Knee
    poses[:, 15] = 0.6 * np.clip(-np.sin(w * t + 1.2), 0, None)  # R_Knee
    poses[:, 50], poses[:, 53] = -1.1, 1.1  # L_Shoulder, R_Shoulder about SMPL z: arms down
    trans = np.zeros((frames, 3))
    np.savez(path, poses=poses, trans=trans, betas=np.zeros(10), gender="neutral", mocap_framerate=fps)
    return path


def test_smpl_clip_onto_the_g1_mjcf_and_urdf_agree(tmp_path):
    """The SMPL skeleton (mean shape, AMASS layout) on the G1; the URDF of the same robot gives the same body
    positions as the MJCF (their link frames are equal; only the fixed links and signatures differ)."""
    clip = ke.pipelines.load_motion(_smpl_gait(tmp_path / "gait.npz"))
    on_mjcf = ke.retarget.retarget_to_robot(clip, "smpl_to_g1")
    _check_quality(on_mjcf, MJCF, key_error_m=0.06)
    on_urdf = ke.retarget.retarget_to_robot(clip, "smpl_to_g1_urdf", model=data_file(URDF))
    lm, lu = on_mjcf.layout, on_urdf.layout
    pm, _ = forward_kinematics(lm, on_mjcf.motion.q.astype(np.float64))
    pu, _ = forward_kinematics(lu, on_urdf.motion.q.astype(np.float64))
    common = [n for n in lm.body_names if n in lu.body_names]
    assert len(common) == len(lm.body_names)
    diff = np.abs(pm[:, [lm.body_index(n) for n in common]] - pu[:, [lu.body_index(n) for n in common]])
    assert diff.max() < 0.01, diff.max()


# -- the other CMU releases onto the CMU humanoid and the G1 (docs/verdicts.md) ------------------------------

CMU_HUMANOID = "mjcf/dm_control/humanoid_CMU.xml"


@pytest.fixture(scope="module")
def cmu_humanoid():
    desc = ke.asset.MJCFLoader.load(data_file(CMU_HUMANOID))
    return desc, ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)


def _relative_body_error(src, result, config):
    """Mean distance (m) per mapped body between the retargeted body and the source joint, both relative to
    their roots, the source turned by the configuration's ``Q`` and scaled: ``{target body: m}``."""
    names = src.tree.node_names
    first = config.trim_frames[0] if config.trim_frames else 0
    sp = src.global_translation[first : first + result.motion.num_frames].astype(np.float64)
    tp = result.motion.global_translation.astype(np.float64)
    pick = {t: next(a for a in k.split("|") if a in names) for k, t in config.joint_mapping.items()}
    root = sp[:, names.index(pick["root"])]
    out = {}
    for target, source in pick.items():
        want = result.scale * ke.rotations.quat_rotate(config.rotation_wxyz, sp[:, names.index(source)] - root)
        got = tp[:, result.motion.tree.index(target)] - tp[:, 0]
        out[target] = float(np.linalg.norm(got - want, axis=-1).mean())
    return out


def _peak_joint_speed(layout, result):
    """Largest hinge speed (rad/s) of the mapped articulation motion, the quantity ``joint_discontinuity``
    reads (limit 60 rad/s)."""
    mapped = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(result.motion, clamp_to_limits=True)
    return float((np.abs(np.diff(mapped.motion.q[:, 7:], axis=0)) * result.motion.fps).max())


def test_cmu_fbx_onto_the_cmu_humanoid_equals_the_bvh_of_the_same_capture(cmu_humanoid):
    """``cmu_fbx_to_cmu_humanoid`` on the poselib FBX of CMU 01_01 puts every body where
    ``cmu_bvh_to_cmu_humanoid`` puts it from the cgspeed BVH of the same capture (an independent conversion):
    the FBX's T-pose frame 0 trimmed, its node frames turned back by the configuration's T-pose rotations (the
    FBX configuration's feet planting and spike correction off: the BVH configuration has neither)."""
    desc, _ = cmu_humanoid
    fbx = ke.io.load_fbx(data_file("fbx/01_01_cmu.fbx"))[:361]
    bvh = ke.io.load_bvh(data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh"))[1:361]
    cfg = ke.retarget.load_retarget_config("cmu_fbx_to_cmu_humanoid").replace(plant_feet=(), despike_acceleration=None)
    a = ke.retarget.retarget_motion(fbx, cfg, desc)
    b = ke.retarget.retarget_motion(bvh, "cmu_bvh_to_cmu_humanoid", desc)
    pa, pb = a.motion.global_translation.astype(np.float64), b.motion.global_translation.astype(np.float64)
    assert pa.shape == pb.shape and a.scale == pytest.approx(b.scale, rel=1e-4)
    rel = np.linalg.norm((pa - pa[:, :1]) - (pb - pb[:, :1]), axis=-1)
    assert rel.mean() < 0.001 and rel.max() < 0.01, (rel.mean(), rel.max())
    # the roots move alike (the two files place the capture's origin differently: one constant shift)
    shift = pa[:, 0] - pb[:, 0]
    assert np.abs(shift - shift.mean(0)).max() < 0.005


def test_cmu_fbx_walk_onto_the_cmu_humanoid(cmu_humanoid):
    """CMU 07_01 (subject 07, FBX): the bodies follow the source joints as closely as the cgspeed BVH's do
    (the model is another subject: 02_01 gives 7 cm over all bodies, 4 cm at the feet), its feet stand on the
    floor, and no hinge jumps (the thigh twist flips project_hinges gave, 377 rad/s, are gone)."""
    desc, layout = cmu_humanoid
    src = ke.io.load_fbx(data_file("fbx/07_01_cmu.fbx"))
    cfg = ke.retarget.load_retarget_config("cmu_fbx_to_cmu_humanoid")
    res = ke.retarget.retarget_motion(src, cfg, desc)
    assert res.motion.num_frames == src.num_frames - 1  # poselib's T-pose frame 0 dropped
    err = _relative_body_error(src, res, cfg)
    # the feet within 5 cm: planted, they stand where the model's legs put them (3 cm without plant_feet)
    assert np.mean(list(err.values())) < 0.07 and max(err["lfoot"], err["rfoot"]) < 0.05, err
    assert all(-35 < a < 0 for a in res.motion.metadata["retarget"]["feet_levelled_deg"].values())
    assert _peak_joint_speed(layout, res) < 60.0


def test_cmu_3dsmax_bvh_onto_the_cmu_humanoid(cmu_humanoid):
    """CMU 131_01 (the 3dsMax-friendly names, arms down at rest, mixed rotation orders): with the arms raised
    into the T-pose the wrists follow the source like the feet do (arms left down: 0.6 m off); thumbs unmapped."""
    desc, layout = cmu_humanoid
    src = ke.io.load_bvh(data_file("bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"))[:240]
    cfg = ke.retarget.load_retarget_config("cmu_3dsmax_bvh_to_cmu_humanoid")
    res = ke.retarget.retarget_motion(src, cfg, desc)
    err = _relative_body_error(src, res, cfg)
    assert np.mean(list(err.values())) < 0.08 and max(err["lfoot"], err["rfoot"]) < 0.04, err
    assert max(err["lwrist"], err["rwrist"]) < 0.12, err
    assert {"lthumb", "rthumb"} <= set(res.unmapped_target_joints)
    down = ke.retarget.retarget_motion(src, cfg.replace(source_tpose=ke.retarget.TPoseSpec()), desc)
    assert _relative_body_error(src, down, cfg)["lwrist"] > 0.4
    assert _peak_joint_speed(layout, res) < 60.0


@pytest.mark.parametrize("name", ["cmu_iclone_bvh_to_g1", "cmu_iclone_bvh_to_cmu_humanoid"])
def test_cmu_iclone_bvh_onto_the_g1_and_the_cmu_humanoid(name):
    """CMU 02_03 on the iClone Character Creator rig (CC_Base_* names, cm, no usable rest pose): followed by
    position on both models, within their joint limits (MuJoCo's ranges), orientations of pelvis and chest
    within a few degrees."""
    src = ke.io.load_bvh(data_file("bvh/cmu/002_03_iclone_cc_run.bvh"))
    res = ke.retarget.retarget_to_robot(src, name)
    m = res.metrics
    assert m["key_body_error_m"]["mean"] < (0.055 if name.endswith("g1") else 0.07), m["key_body_error_m"]
    assert m["orientation_error_deg"]["mean"] < 5.0 and m["joints_outside_limits"] == 0
    _within_mujoco_ranges(res, MJCF if name.endswith("g1") else CMU_HUMANOID)


def test_cmu_names_onto_the_cmu_humanoid_by_position():
    """``cmu_to_cmu_humanoid_ik``: the cgspeed BVH, 3dsMax BVH and FBX names (``|`` alternatives) put on the CMU
    humanoid by inverse kinematics with held feet, within MuJoCo's joint ranges, bodies within 8 cm of the
    scaled source joints (the name-map configurations: 5-7 cm; the model is another subject)."""
    for rel in ("fbx/07_01_cmu.fbx", "bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"):
        res = ke.retarget.retarget_to_robot(ke.pipelines.load_motion(data_file(rel))[:240], "cmu_to_cmu_humanoid_ik")
        m = res.metrics
        assert m["key_body_error_m"]["mean"] < 0.08 and m["joints_outside_limits"] == 0, (rel, m["key_body_error_m"])
        assert m["floating_share"] <= 0.05 and all(f["phases"] >= 1 for f in m["feet"].values()), rel
        _within_mujoco_ranges(res, CMU_HUMANOID)
