"""Skeleton-to-skeleton retargeting (kangengine.retarget) on real mocap and real models."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine import rotations as R
from kangengine.animation.mapper import ArticulationMotionMapper
from kangengine.errors import FileMissingError, FormatError, MotionError, ShapeError, UnknownNameError
from kangengine.retarget import skeleton as rt

AMP_MJCF = "mjcf/protomotions/amp_humanoid.xml"
AMP_TPOSE_ADJUST = (
    rt.JointAdjustment("left_upper_arm", [1, 0, 0], 90.0),
    rt.JointAdjustment("right_upper_arm", [1, 0, 0], -90.0),
)


@pytest.fixture(scope="module")
def amp_desc():
    return ke.asset.MJCFLoader.load(data_file(AMP_MJCF))


@pytest.fixture(scope="module")
def walk():
    return ke.datasets.load_poselib(data_file("motions/amp_poselib/amp_humanoid_walk.npy"))


@pytest.fixture(scope="module")
def amp_tpose():
    return ke.datasets.load_poselib(data_file("motions/amp_poselib/amp_humanoid_tpose.npy"))


@pytest.fixture(scope="module")
def cmu_desc():
    return ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))


@pytest.fixture(scope="module")
def cmu_bvh():
    return ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))


def _mapper(desc):
    return ArticulationMotionMapper(ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True))


# -- configurations ---------------------------------------------------------------------------------------


def test_shipped_configurations_load_and_round_trip(tmp_path):
    names = rt.list_retarget_configs()
    assert {"cmu_bvh_to_cmu_humanoid", "cmu_to_amp", "smpl_to_smpl_humanoid"} <= set(names)
    for name in names:
        cfg = rt.load_retarget_config(name)
        assert cfg.name == name and cfg.joint_mapping and cfg.description and cfg.attribution
        again = rt.RetargetConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again.to_dict() == cfg.to_dict()
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(cfg.to_dict()))
        assert rt.load_retarget_config(str(p)).to_dict() == cfg.to_dict()
    with pytest.raises(UnknownNameError, match="cmu_to_amp"):
        rt.load_retarget_config("cmu_to_g1")


def test_poselib_reference_config_matches_shipped_cmu_to_amp():
    ref = rt.RetargetConfig.from_poselib_json(data_file("motions/amp_poselib/retarget_cmu_to_amp.json"))
    raw = json.loads(data_file("motions/amp_poselib/retarget_cmu_to_amp.json").read_text())
    np.testing.assert_allclose(
        ref.rotation_wxyz, np.array(raw["rotation"])[[3, 0, 1, 2]] / np.linalg.norm(raw["rotation"])
    )
    assert ref.trim_frames == (75, 372) and ref.scale == raw["scale"] and ref.root_height_offset == 0.05
    shipped = rt.load_retarget_config("cmu_to_amp")
    assert dict(shipped.joint_mapping) == raw["joint_mapping"]
    assert shipped.root_height_offset == raw["root_height_offset"]
    assert "BSD" in shipped.attribution


@pytest.mark.parametrize(
    ("change", "item"),
    [
        ({"rotation_wxyz": [1, 1, 0, 0]}, "rotation_wxyz"),
        ({"scale": -1}, "scale"),
        ({"scale": "big"}, "scale"),
        ({"ground_fix": "sometimes"}, "ground_fix"),
        ({"joint_mapping": {}}, "joint_mapping"),
        ({"joint_mapping": {"a": "x", "b": "x"}}, "joint_mapping"),
        ({"trim_frames": [5, 2]}, "trim_frames"),
        ({"source_tpose": {"adjust": [{"joint": "a", "axis": [0, 0, 0], "angle_deg": 3}]}}, "adjust"),
        ({"colour": "red"}, "unknown keys"),
    ],
)
def test_bad_configurations_name_the_file_and_key(tmp_path, change, item):
    d = rt.load_retarget_config("cmu_to_amp").to_dict() | change
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(FormatError) as info:
        rt.RetargetConfig.from_json(p)
    assert str(p) in str(info.value) and item in str(info.value)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        rt.RetargetConfig.from_json(tmp_path / "broken.json")
    with pytest.raises(FileMissingError):
        rt.RetargetConfig.from_json(tmp_path / "none.json")


# -- the algorithm ------------------------------------------------------------------------------------------


def test_target_tpose_from_articulation_equals_poselib_tpose(amp_desc, amp_tpose):
    t = rt.make_tpose(amp_desc, rt.TPoseSpec(adjust=AMP_TPOSE_ADJUST))
    assert t.tree.node_names == amp_tpose.tree.node_names
    np.testing.assert_allclose(R.quat_angle_between(t.global_rotation, amp_tpose.global_rotation), 0, atol=1e-6)
    d = t.global_translation - amp_tpose.global_translation
    np.testing.assert_allclose(d - d[0], 0, atol=1e-6)  # same pose; the MJCF root stands 0.1 m higher


def test_same_skeleton_is_reproduced(amp_desc, walk, amp_tpose):
    cfg = rt.RetargetConfig(
        {n: n for n in walk.tree.node_names}, ground_fix="none", target_tpose=rt.TPoseSpec(adjust=AMP_TPOSE_ADJUST)
    )
    res = rt.retarget_motion(walk, cfg, amp_desc, source_tpose=amp_tpose)
    d = res.motion.global_translation - walk.global_translation
    np.testing.assert_allclose(d - d[:1, :1], 0, atol=2e-5)
    assert res.motion.fps == walk.fps and res.motion.local_rotation.dtype == np.float32
    assert res.unmapped_target_joints == ("right_hand", "left_hand") == res.rigid_target_joints


def _reframe(state_or_motion, rot_z_deg, scale, seed):
    """The same motion on a skeleton with other joint frames, other units and another world heading."""
    tree = state_or_motion.tree
    rng = np.random.default_rng(seed)
    F = R.quat_normalize(rng.normal(size=(tree.num_nodes, 4)))  # body_old_from_body_new
    Qz = R.quat_from_axis_angle([0, 0, 1], np.radians(rot_z_deg))
    parents = tree.parent_indices
    Fp = F[np.where(parents < 0, 0, parents)]
    off = scale * R.quat_rotate(R.quat_conjugate(Fp), tree.local_translation)
    off[0] = scale * R.quat_rotate(Qz, tree.local_translation[0])
    new_tree = ke.animation.SkeletonTree(tree.node_names, parents, off)
    G = R.quat_multiply(R.quat_multiply(Qz, np.asarray(state_or_motion.global_rotation, np.float64)), F)
    root = scale * R.quat_rotate(Qz, np.asarray(state_or_motion.root_translation, np.float64))
    s = ke.animation.SkeletonState.from_global(new_tree, G, root)
    if isinstance(state_or_motion, ke.animation.SkeletonMotion):
        return ke.animation.SkeletonMotion(new_tree, s.root_translation, s.local_rotation, state_or_motion.fps)
    return s


def test_joint_frames_heading_and_units_of_the_source_do_not_matter(amp_desc, walk, amp_tpose):
    # a source with random joint frames, in centimetres, turned by 70 degrees: retargeting with the matching
    # rotation offset and scale gives back the original walk
    src = _reframe(walk, 70.0, 100.0, seed=1)
    src_tpose = _reframe(amp_tpose, 70.0, 100.0, seed=1)
    np.testing.assert_allclose(
        src.global_translation[..., :2] / 100,
        R.quat_rotate(R.quat_from_axis_angle([0, 0, 1], np.radians(70)), walk.global_translation)[..., :2],
        atol=1e-5,
    )
    cfg = rt.RetargetConfig(
        {n: n for n in walk.tree.node_names},
        ground_fix="none",
        scale=0.01,
        rotation_wxyz=R.quat_from_axis_angle([0, 0, 1], np.radians(-70)),
        target_tpose=rt.TPoseSpec(adjust=AMP_TPOSE_ADJUST),
    )
    res = rt.retarget_motion(src, cfg, amp_desc, source_tpose=src_tpose)
    d = res.motion.global_translation - walk.global_translation
    np.testing.assert_allclose(d - d[:1, :1], 0, atol=1e-4)
    # the result does not depend on the source frames at all
    res2 = rt.retarget_motion(
        _reframe(walk, 70.0, 100.0, seed=7), cfg, amp_desc, source_tpose=_reframe(amp_tpose, 70.0, 100.0, seed=7)
    )
    np.testing.assert_allclose(res2.motion.global_translation, res.motion.global_translation, atol=1e-4)


def test_unmapped_target_joints_keep_their_tpose_local_rotation(amp_desc, walk, amp_tpose):
    mapping = {n: n for n in walk.tree.node_names if n not in ("left_lower_arm", "head")}
    cfg = rt.RetargetConfig(mapping, ground_fix="none", target_tpose=rt.TPoseSpec(adjust=AMP_TPOSE_ADJUST))
    res = rt.retarget_motion(walk, cfg, amp_desc, source_tpose=amp_tpose)
    t = res.target_tpose
    for name in ("left_lower_arm", "head", "left_hand"):
        i = t.tree.index(name)
        np.testing.assert_allclose(
            res.motion.local_rotation[:, i], np.broadcast_to(t.local_rotation[i], (walk.num_frames, 4)), atol=1e-7
        )
    assert set(res.unmapped_target_joints) == {"left_lower_arm", "head", "left_hand", "right_hand"}


def test_ground_fix_modes(amp_desc, walk, amp_tpose):
    base = rt.RetargetConfig({n: n for n in walk.tree.node_names}, target_tpose=rt.TPoseSpec(adjust=AMP_TPOSE_ADJUST))
    run = lambda **kw: rt.retarget_motion(walk, base.replace(**kw), amp_desc, source_tpose=amp_tpose)
    none = run(ground_fix="none")
    z = none.motion.global_translation[..., 2].min(axis=1)
    clip = run(ground_fix="clip_min", root_height_offset=0.05)
    np.testing.assert_allclose(clip.motion.global_translation[..., 2].min(), 0.05, atol=1e-6)
    assert clip.ground_shift == pytest.approx(-z.min() + 0.05, abs=1e-6)
    first = run(ground_fix="first_frame")
    np.testing.assert_allclose(first.motion.global_translation[0, :, 2].min(), 0, atol=1e-6)
    rolling = run(ground_fix="rolling_min", ground_window_s=0.5)
    assert rolling.ground_shift.shape == (walk.num_frames,)
    lowest = rolling.motion.global_translation[..., 2].min(axis=1)
    assert np.abs(lowest).max() < np.abs(z - z.min()).max()  # drift removed
    # collision geoms: AMP feet are boxes below the foot body origins
    geoms = run(ground_fix="clip_min", ground_reference="collision_geoms")
    assert geoms.ground_shift > clip.ground_shift - 0.05 + 0.02


def test_errors_name_what_is_wrong(amp_desc, walk, amp_tpose):
    cfg = rt.RetargetConfig({"pelvis": "pelvis", "nose": "torso"})
    with pytest.raises(UnknownNameError, match="nose.*nodes are: pelvis"):
        rt.retarget_motion(walk, cfg, amp_desc)
    with pytest.raises(UnknownNameError, match="tail"):
        rt.retarget_motion(walk, rt.RetargetConfig({"pelvis": "tail"}), amp_desc)
    with pytest.raises(FormatError, match="target root 'pelvis' is not mapped"):
        rt.retarget_motion(walk, rt.RetargetConfig({"torso": "torso"}), amp_desc)
    with pytest.raises(ShapeError, match="SkeletonMotion"):
        rt.retarget_motion(amp_tpose, rt.RetargetConfig({"pelvis": "pelvis"}), amp_desc)
    with pytest.raises(ShapeError, match="target"):
        rt.retarget_motion(walk, rt.RetargetConfig({"pelvis": "pelvis"}), target=42)
    with pytest.raises(ShapeError, match="no shipped target"):
        rt.retarget_motion(walk, rt.RetargetConfig({"pelvis": "pelvis"}))


# -- SMPL -> SMPL humanoid ---------------------------------------------------------------------------------


def test_smpl_to_smpl_humanoid_is_a_renaming(tmp_path):
    desc = ke.asset.MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    rng = np.random.default_rng(0)
    T = 40
    poses = rng.normal(scale=0.3, size=(T, 72))
    poses[:, :3] = [np.pi / 2, 0, 0]  # standing along +Z, as AMASS clips do
    trans = np.cumsum(rng.normal(scale=0.01, size=(T, 3)), axis=0) + [0, 0, 0.9]
    np.savez(
        tmp_path / "clip.npz", poses=poses, trans=trans, betas=np.zeros(10), gender="neutral", mocap_framerate=60.0
    )
    clip = ke.datasets.amass.load(tmp_path / "clip.npz")
    res = rt.retarget_motion(clip, "smpl_to_smpl_humanoid", desc)
    order = [clip.tree.index(n) for n in res.motion.tree.node_names]
    d = res.motion.global_translation - clip.global_translation[:, order]
    np.testing.assert_allclose(d - [0, 0, res.ground_shift], 0, atol=1e-5)
    assert not res.unmapped_target_joints and not res.projected_joints
    # the SMPL humanoid's hinge triplets reach every rotation: the mapper reproduces the motion
    mr = _mapper(desc).to_articulation_motion(res.motion)
    pos, _ = ke.animation.forward_kinematics(_mapper(desc).layout, mr.motion.q)
    np.testing.assert_allclose(pos, res.motion.global_translation, atol=1e-4)
    low, _ = rt._lowest_points(
        desc, res.motion.global_translation.astype(float), res.motion.global_rotation.astype(float)
    )
    assert low.min() == pytest.approx(0.0, abs=1e-5)  # the lowest collision geom touches the ground


# -- CMU BVH -> CMU humanoid --------------------------------------------------------------------------------


def test_cmu_bvh_to_cmu_humanoid_feet_on_ground_and_small_mapping_error(cmu_bvh, cmu_desc):
    res = rt.retarget_motion(cmu_bvh, "cmu_bvh_to_cmu_humanoid", cmu_desc)
    m = res.motion
    assert m.tree.node_names == cmu_desc.body_names and m.num_frames == cmu_bvh.num_frames
    assert set(res.projected_joints) == {"ltibia", "rtibia", "lradius", "rradius"}
    assert set(res.rigid_target_joints) == {"lhipjoint", "rhipjoint"}
    assert 0.9 < res.scale < 1.0  # the dm_control model is a slightly smaller CMU subject
    # feet: the lowest collision geom of each frame stays within a few cm of the floor (walking: one foot down)
    low, _ = rt._lowest_points(cmu_desc, m.global_translation.astype(float), m.global_rotation.astype(float))
    assert low.min() > -0.005 and np.percentile(low, 95) < 0.03 and np.median(low) < 0.015
    # the articulation reproduces the retargeted skeleton motion (knees, elbows fitted; ankles have 2 hinges)
    mapper = _mapper(cmu_desc)
    mr = mapper.to_articulation_motion(m)
    pos, _ = ke.animation.forward_kinematics(mapper.layout, mr.motion.q)
    err = np.linalg.norm(pos - m.global_translation, axis=-1)
    assert err.mean() < 0.003 and err.max() < 0.02
    knees = [mapper.layout.body_index(n) for n in ("ltibia", "rtibia", "lradius", "rradius")]
    assert np.degrees(mr.residual_angles[:, knees]).max() < 0.1
    assert np.degrees(mr.residual_angles).mean() < 1.0
    # the walk goes where the source goes: heading turned by the config's -90 degrees about z, scaled
    src_root = cmu_bvh.global_translation[:, 0].astype(float)
    want = res.scale * R.quat_rotate(
        rt.load_retarget_config("cmu_bvh_to_cmu_humanoid").rotation_wxyz, src_root - src_root[0]
    )
    got = m.root_translation.astype(float) - m.root_translation[0]
    np.testing.assert_allclose(got[:, :2], want[:, :2], atol=1e-5)


def test_project_hinges_keeps_feet_where_the_source_puts_them(cmu_bvh, cmu_desc):
    cfg = rt.load_retarget_config("cmu_bvh_to_cmu_humanoid")
    mapper = _mapper(cmu_desc)
    errs = {}
    for flag in (True, False):
        m = rt.retarget_motion(cmu_bvh, cfg.replace(project_hinges=flag), cmu_desc).motion
        pos, _ = ke.animation.forward_kinematics(mapper.layout, mapper.to_articulation_motion(m).motion.q)
        foot = mapper.layout.body_index("lfoot")
        errs[flag] = np.linalg.norm(pos[:, foot] - m.global_translation[:, foot], axis=-1).mean()
    assert errs[True] < 1e-3 < 5e-3 < errs[False]


# -- CMU FBX -> AMP humanoid (poselib's reference configuration) -----------------------------------------


@pytest.fixture(scope="module")
def cmu_fbx():
    pytest.importorskip("pyassimp", reason="FBX needs the 'fbx' extra (pyassimp + libassimp)")
    return ke.io.load_fbx(data_file("fbx/07_01_cmu.fbx"), scale=ke.io.BVH_LENGTH_UNITS["cmu"])


def _poselib_reference(src, mapping, rotation_xyzw, scale, root_height_offset):
    """poselib's retarget_to + retarget_motion.py ground fix, frame by frame with scipy, in poselib's own frames.

    poselib reads the FBX with raw node frames in the frame of the Hips' parent (Z up, facing -Y, CMU units);
    load_fbx gives metres, Z up, facing +X and joint frames re-axed by zup_from_yup. So for this reference:
    p_poselib = Rz(-90) p / 0.056444 and G_poselib = Rz(-90) G zup_from_yup.
    """
    from scipy.spatial.transform import Rotation as Rot

    def raw(name):  # trusted third-party files: numpy's own loader
        return np.load(data_file(f"motions/amp_poselib/{name}"), allow_pickle=True).item()

    st, tt = raw("cmu_tpose.npy"), raw("amp_humanoid_tpose.npy")
    s_names = [str(x) for x in st["skeleton_tree"]["node_names"]]
    t_names = list(tt["skeleton_tree"]["node_names"])
    t_par = tt["skeleton_tree"]["parent_indices"]["arr"]
    t_off = tt["skeleton_tree"]["local_translation"]["arr"].astype(float)
    s_tpose_global = {n: Rot.from_quat(st["rotation"]["arr"][i]) for i, n in enumerate(s_names)}  # is_local=False
    t_local = [Rot.from_quat(q) for q in tt["rotation"]["arr"]]
    t_glob = []
    for k, p in enumerate(t_par):
        t_glob.append(t_local[k] if p < 0 else t_glob[p] * t_local[k])
    q = Rot.from_quat(rotation_xyzw)
    back = Rot.from_euler("z", -90, degrees=True)
    zup_from_yup = Rot.from_matrix([[0, 0, 1], [1, 0, 0], [0, 1, 0]])
    inv = {v: k for k, v in mapping.items()}
    unit = ke.io.BVH_LENGTH_UNITS["cmu"]
    G = src.global_rotation.astype(float)
    p = src.global_translation.astype(float)
    hips = src.tree.index("Hips")
    tpose_root = st["root_translation"]["arr"].astype(float)
    out = np.zeros((src.num_frames, len(t_names), 3))
    for f in range(src.num_frames):
        root = back.apply(p[f, hips]) / unit
        diff = (q.apply(root) - q.apply(tpose_root)) * scale
        glob = []
        for k, name in enumerate(t_names):
            j = src.tree.index(inv[name])
            g_src = back * Rot.from_quat(G[f, j][[1, 2, 3, 0]]) * zup_from_yup
            glob.append(q * g_src * (q * s_tpose_global[inv[name]]).inv() * t_glob[k])
        pos = np.zeros((len(t_names), 3))
        for k, par in enumerate(t_par):
            pos[k] = tt["root_translation"]["arr"] + diff if par < 0 else pos[par] + glob[par].apply(t_off[k])
        out[f] = pos
    out[..., 2] += -out[..., 2].min() + root_height_offset
    return t_names, out


def test_cmu_fbx_to_amp_equals_an_independent_poselib_reimplementation(cmu_fbx, amp_desc):
    raw = json.loads(data_file("motions/amp_poselib/retarget_cmu_to_amp.json").read_text())
    src = cmu_fbx[::12]  # 10 fps is enough to compare, and keeps the scipy loop short
    names, want = _poselib_reference(
        src, raw["joint_mapping"], raw["rotation"], raw["scale"], raw["root_height_offset"]
    )
    res = rt.retarget_motion(src, "cmu_to_amp", amp_desc)
    got = res.motion.global_translation.astype(float)[:, [res.motion.tree.index(n) for n in names]]
    got[..., :2] -= got[:1, :1, :2]  # the start offset: poselib keeps the source T-pose's root position
    want[..., :2] -= want[:1, :1, :2]
    np.testing.assert_allclose(got, want, atol=2e-4)


def _align_to_reference(motion, reference):
    """Best mean global body-position error of ``motion`` against ``reference`` over time offsets, frame rates
    (every 2nd/4th source frame against every 1st/2nd reference frame) and a left-right mirror, after removing
    the horizontal start offset. Returns (error m, description)."""
    names = list(reference.tree.node_names)
    P = motion.global_translation.astype(float)[:, [motion.tree.index(n) for n in names]]
    swap = [names.index(n.replace("left", "#").replace("right", "left").replace("#", "right")) for n in names]
    mirrored = P[:, swap].copy()
    mirrored[..., 1] = 2 * P[:1, :1, 1] - mirrored[..., 1]
    W = reference.global_translation.astype(float)
    best = (np.inf, "")
    for label, X in (("as is", P), ("mirrored", mirrored)):
        for ref_step, step in ((1, 2), (2, 4)):
            B = W[::ref_step].copy()
            B[..., :2] -= B[:1, :1, :2]
            n = len(B)
            for k in range(0, len(X) - (n - 1) * step):
                A = X[k::step][:n].copy()
                A[..., :2] -= A[:1, :1, :2]
                e = float(np.linalg.norm(A - B, axis=-1).mean())
                if e < best[0]:
                    best = (e, f"{label}, source frames {k}::{step} vs reference frames ::{ref_step}")
    return best


@pytest.mark.xfail(
    strict=True,
    reason=(
        "amp_humanoid_walk.npy is not reproducible from 07_01_cmu.fbx: its poses are pairs of identical frames "
        "(distinct poses every 1/30 s), its gait cycle is ~1.0 s with a 1.54-1.60 m stride where 07_01's is ~1.08 s "
        "with a 1.49-1.51 m stride, and the best alignment (time offset, 60/30 fps, left-right mirror, horizontal "
        "start offset removed) leaves ~0.30 m mean error (0.05 m root-relative, mirrored); it comes from "
        "neither: the other CMU walk poselib ships, 08_02_cmu.fbx (now in ../shared/data), is 0.10 m mean from it "
        "after the same alignment (measured by the data's curator): no shared file reproduces it as is"
    ),
)
def test_cmu_fbx_reproduces_poselib_amp_walk(cmu_fbx, amp_desc, walk):
    res = rt.retarget_motion(cmu_fbx, "cmu_to_amp", amp_desc)
    err, how = _align_to_reference(res.motion, walk)
    assert err <= 0.03, f"best alignment {how}: mean body error {err:.3f} m"


def test_cgspeed_name_variants_and_layout_targets(cmu_desc):
    # 01_01 names the finger joints LFingers/RFingers where 02_01 says LeftHandIndex1/RightHandIndex1
    hops = ke.io.load_bvh(data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh"))[:600]
    assert "LFingers" in hops.tree.node_names and "LeftHandIndex1" not in hops.tree.node_names
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=cmu_desc, free_root=True)
    # level_feet needs the collision geoms (the sole), which a layout target does not have: compare without it
    cfg = rt.load_retarget_config("cmu_bvh_to_cmu_humanoid").replace(level_feet=())
    a = rt.retarget_motion(hops, cfg.replace(ground_reference="body_origins"), cmu_desc)
    b = rt.retarget_motion(hops, cfg.replace(ground_reference="body_origins"), layout)  # same joints, no geoms needed
    np.testing.assert_allclose(a.motion.global_translation, b.motion.global_translation, atol=1e-6)
    assert b.projected_joints == a.projected_joints and b.rigid_target_joints == a.rigid_target_joints
    i = cmu_desc.body_index("lfingers")
    assert "lfingers" in a.mapped_target_joints and not np.allclose(
        a.motion.local_rotation[:, i], a.motion.local_rotation[:1, i]
    )
    with pytest.raises(UnknownNameError, match=r"LeftHandIndex1\|LFingerz"):
        rt.retarget_motion(
            hops, cfg.replace(joint_mapping={"Hips": "root", "LeftHandIndex1|LFingerz": "lfingers"}), cmu_desc
        )


# -- implausible inputs are refused, not passed on ------------------------------------------------------------


def test_auto_scale_refuses_a_rest_pose_that_does_not_stand_along_z(cmu_bvh, cmu_desc):
    """A target whose rest pose lies along -Y (legs and arms sideways) once got scale 0.0088 and a walk that
    moved 3 cm: the fit is refused with the numbers."""
    cfg = rt.load_retarget_config("cmu_bvh_to_cmu_humanoid")
    upright = rt.make_tpose(cmu_desc, cfg.target_tpose)
    lying = ke.animation.SkeletonState(
        upright.tree,
        R.quat_rotate(R.quat_from_axis_angle([1.0, 0.0, 0.0], np.pi / 2), upright.root_translation),
        upright.local_rotation.copy(),
    )
    lying.local_rotation[0] = R.quat_multiply(
        R.quat_from_axis_angle([1.0, 0.0, 0.0], np.pi / 2), lying.local_rotation[0]
    )
    with pytest.raises(MotionError, match="target T-pose .* does not stand up along \\+Z"):
        rt.retarget_motion(cmu_bvh[:10], cfg, cmu_desc, target_tpose=lying)
    # the upright pose gives the plausible scale (the dm_control model is a slightly smaller CMU subject)
    assert 0.9 < rt.retarget_motion(cmu_bvh[:10], cfg, cmu_desc, target_tpose=upright).scale < 1.0


def test_auto_scale_refuses_an_implausible_ratio(cmu_bvh, cmu_desc):
    """A source read in the wrong unit (centimetres taken for metres: a 170 m performer) fits scale ~0.01."""
    big = ke.animation.SkeletonMotion(
        ke.animation.SkeletonTree(
            cmu_bvh.tree.node_names, cmu_bvh.tree.parent_indices, cmu_bvh.tree.local_translation * 100.0
        ),
        cmu_bvh.root_translation[:10] * 100.0,
        cmu_bvh.local_rotation[:10],
        cmu_bvh.fps,
    )
    with pytest.raises(MotionError, match=r"fitted 0\.0\d+ .* outside the plausible 0\.1-10"):
        rt.retarget_motion(big, "cmu_bvh_to_cmu_humanoid", cmu_desc)


def test_feet_without_collision_geoms_stand_on_their_origins(cmu_bvh, cmu_desc):
    """With the feet's collision geoms removed, the ground fix once put the ankles 0.6-0.7 m under the
    floor (only the other bodies' geoms were looked at): bodies without geometry now count by their origin,
    and the result says which they were."""
    feet = {"lfoot", "ltoes", "rfoot", "rtoes"}
    ids = {i for i, b in enumerate(cmu_desc.bodies) if b.name in feet}
    no_feet = dataclasses.replace(cmu_desc, geoms=tuple(g for g in cmu_desc.geoms if g.body not in ids))
    res = rt.retarget_motion(cmu_bvh[:300], "cmu_bvh_to_cmu_humanoid", no_feet)
    pos = res.motion.global_translation
    foot_z = pos[:, [no_feet.body_names.index(n) for n in sorted(feet)], 2]
    assert foot_z.min() == pytest.approx(0.0, abs=1e-5)  # the lowest foot origin is on the floor, not under it
    assert set(res.motion.metadata["retarget"]["ground_bodies_without_geoms"]) == feet
    # the shipped config levels the feet; with no sole to level they are left as they are, and named
    assert res.motion.metadata["retarget"]["feet_not_levelled"] == {
        "lfoot": "the foot has no collision geom",
        "rfoot": "the foot has no collision geom",
    }


def _stance_sole_heights(desc, motion):
    """Per foot: median height of the rearmost (heel) and of the toe sole points over the frames it stands
    (sole low and slow), from the collision geoms: capsule end spheres and toe spheres (m)."""
    pos, rot = motion.global_translation.astype(float), motion.global_rotation.astype(float)
    geoms = rt._usable_geoms(desc)
    out = {}
    for side in "lr":
        fi, ti = desc.body_names.index(side + "foot"), desc.body_names.index(side + "toes")
        fp, fr = rt._sole_points([g for g in geoms if g.body == fi])
        tp, tr = rt._sole_points([g for g in geoms if g.body == ti])
        zf = (pos[:, fi][:, None] + R.quat_rotate(rot[:, fi][:, None], fp))[..., 2] - fr
        zt = (pos[:, ti][:, None] + R.quat_rotate(rot[:, ti][:, None], tp))[..., 2] - tr
        v = np.linalg.norm(np.diff(pos[:, fi, :2], axis=0), axis=-1) * motion.fps
        speed = np.maximum(np.r_[v, v[-1]], np.r_[v[0], v])
        stance = (np.minimum(zf.min(1), zt.min(1)) < 0.03) & (speed < 0.3)
        fwd = np.array([float(np.mean(p @ [0, 1, 0])) for p in fp])  # capsule ends: the +y end is the heel
        heel = zf[:, fwd > fwd.mean()].min(1)
        out[side] = (float(np.median(heel[stance])), float(np.median(zt.min(1)[stance])))
    return out


def test_level_feet_puts_the_cmu_humanoid_on_its_soles(cmu_bvh, cmu_desc):
    """Retargeted CMU walks stood on the humanoid's toe spheres with the heels several cm up (a foot pitch
    the T-poses do not capture); level_feet finds one pitch per foot that levels the sole where it stands."""
    shipped = rt.load_retarget_config("cmu_bvh_to_cmu_humanoid")
    assert shipped.level_feet == (("lfoot", "ltoes"), ("rfoot", "rtoes"))  # on by default (issue 12 item 5)
    cfg = shipped.replace(level_feet=())
    before = _stance_sole_heights(cmu_desc, rt.retarget_motion(cmu_bvh, cfg, cmu_desc).motion)
    res = rt.retarget_motion(cmu_bvh, shipped, cmu_desc)
    after = _stance_sole_heights(cmu_desc, res.motion)
    for side in "lr":
        assert before[side][0] > 0.05  # heel up by more than 5 cm
        assert after[side][0] < 0.03 and abs(after[side][0] - after[side][1]) < 0.015  # heel down, sole level
    angles = res.motion.metadata["retarget"]["feet_levelled_deg"]
    assert set(angles) == {"lfoot", "rfoot"} and all(-40 < a < -20 for a in angles.values())
    # still on the floor and still representable by the humanoid's joints
    low, _ = rt._lowest_points(
        cmu_desc, res.motion.global_translation.astype(float), res.motion.global_rotation.astype(float)
    )
    assert low.min() == pytest.approx(0.0, abs=1e-5)
    mapper = _mapper(cmu_desc)
    pos, _ = ke.animation.forward_kinematics(mapper.layout, mapper.to_articulation_motion(res.motion).motion.q)
    assert np.linalg.norm(pos - res.motion.global_translation, axis=-1).mean() < 0.003
    with pytest.raises(UnknownNameError, match="lfot"):
        rt.retarget_motion(cmu_bvh[:5], cfg.replace(level_feet=(("lfot", "ltoes"),)), cmu_desc)
