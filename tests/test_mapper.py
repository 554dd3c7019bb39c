"""ArticulationMotionMapper: exact joint decomposition, residuals, limits, velocities and continuity.

Oracles: MuJoCo (body positions at the mapped qpos), scipy (Euler angles, brute-force residual minima),
analytic derivatives of synthetic trajectories, and round trips through our own forward kinematics.
"""

from __future__ import annotations

import warnings

import mujoco
import numpy as np
import pytest
import torch
from conftest import data_file
from scipy.optimize import minimize
from scipy.spatial.transform import Rotation

from kangengine import rotations as R
from kangengine.animation import (
    ArticulationCoordinateLayout,
    ArticulationMotion,
    ArticulationMotionMapper,
    CoordinatesResult,
    MappingResult,
    SkeletonMotion,
    SkeletonOffsetWarning,
    SkeletonState,
    SkeletonTree,
    forward_kinematics,
)
from kangengine.asset import JointType, MJCFLoader, URDFLoader
from kangengine.errors import FormatError, LayoutMismatch, MotionError, ShapeError, UnknownNameError

ROTATIONAL_MJCF = [
    "mjcf/protomotions/smpl_humanoid.xml",
    "mjcf/dm_control/humanoid_CMU.xml",
    "mjcf/unitree/g1_29dof.nomesh.xml",
    "mjcf/dm_control/model_with_ball_joints.xml",
    "mjcf/mujoco/humanoid.xml",  # anchors, non-orthogonal 2-hinge shoulders
    "mjcf/protomotions/amp_humanoid.xml",
]

# Arbitrary axes, anchors, refs and limits, 1/2/3/4 hinges, parallel axes, a ball next to a hinge.
SYNTH_MJCF = """
<mujoco model="mapper_synth">
  <default><joint armature="0.01" damping="0.1"/><geom type="sphere" size="0.05" mass="1"/></default>
  <worldbody>
    <body name="base" pos="0 0 1">
      <freejoint name="root"/>
      <geom size="0.1"/>
      <body name="one" pos="0.2 0 0" quat="0.9 0.1 0.3 0.2">
        <joint name="h1" axis="0.3 0.5 0.8" range="-60 60"/>
        <geom/>
      </body>
      <body name="two" pos="0 0.2 0">
        <joint name="h2a" axis="1 0.2 0.1" pos="0 0 0.03"/>
        <joint name="h2b" axis="0.1 1 0.5" ref="20"/>
        <geom/>
      </body>
      <body name="three" pos="0 -0.2 0" quat="0.7 0.7 0 0">
        <joint name="h3a" axis="1 0.3 0"/>
        <joint name="h3b" axis="0.2 1 0.3"/>
        <joint name="h3c" axis="0 0.4 1"/>
        <geom/>
      </body>
      <body name="euler" pos="0 0 0.2">
        <joint name="eza" axis="0 0 1"/>
        <joint name="exb" axis="-1 0 0"/>
        <joint name="ezc" axis="0 0 1"/>
        <geom/>
      </body>
      <body name="skewed" pos="0.1 0 0.2">
        <joint name="ka" axis="1 0 0"/>
        <joint name="kb" axis="0 1 0"/>
        <joint name="kc" axis="1 0 1"/>
        <geom/>
      </body>
      <body name="par" pos="0 0 -0.2">
        <joint name="pa" axis="1 0 0"/>
        <joint name="pb" axis="1 0 0"/>
        <joint name="pc" axis="0 1 0"/>
        <geom/>
      </body>
      <body name="four" pos="0.2 0.2 0">
        <joint name="fa" axis="1 0 0"/>
        <joint name="fb" axis="0 1 0"/>
        <joint name="fc" axis="0 0 1"/>
        <joint name="fd" axis="1 1 0"/>
        <geom/>
      </body>
      <body name="wheel" pos="-0.2 0.2 0">
        <joint name="spin" axis="0 0 1" limited="false"/>
        <geom/>
      </body>
      <body name="offset" pos="-0.2 -0.2 0">
        <joint name="off" axis="0 1 0" range="30 310"/>
        <geom/>
      </body>
      <body name="fixedchild" pos="-0.2 0 0">
        <geom/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("mapper") / "synth.xml"
    path.write_text(SYNTH_MJCF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        desc = MJCFLoader.load(path)
    return path, ArticulationCoordinateLayout.from_data(data=desc)


def _layout(rel, *, free_root=None):
    """The layout of a shared model; ``free_root`` follows the file (as MuJoCo's qpos does) by default."""
    path = data_file(rel)
    desc = URDFLoader.load(path) if rel.endswith(".urdf") else MJCFLoader.load(path)
    if free_root is None:
        free_root = any(j.type is JointType.FREE for j in desc.joints)
    return ArticulationCoordinateLayout.from_data(data=desc, free_root=free_root)


def _hinge_blocks(layout, body):
    return [b for b in layout.blocks_of_body(body) if b.joint_type is JointType.HINGE]


def _random_q(layout, rng, n, *, triplet_max=0.45 * np.pi):
    """Random q inside the limits; on bodies with 3+ hinges every angle within +-triplet_max (one
    decomposition branch is then clearly the nearest, so q itself must come back)."""
    q = np.tile(layout.neutral(), (n, 1))
    for b in layout.blocks:
        s = b.q_slice
        if b.joint_type is JointType.FREE:
            q[:, s.start : s.start + 3] = rng.normal(size=(n, 3))
            q[:, s.start + 3 : s.stop] = R.quat_normalize(rng.normal(size=(n, 4)))
        elif b.joint_type is JointType.BALL:
            q[:, s] = R.quat_normalize(rng.normal(size=(n, 4)))
        elif b.joint_type is JointType.HINGE:
            lo, hi = b.limits if b.limits is not None else (b.ref - 3.0, b.ref + 3.0)
            if len(_hinge_blocks(layout, b.body_index)) >= 3:
                lo, hi = max(lo, b.ref - triplet_max), min(hi, b.ref + triplet_max)
            q[:, s.start] = rng.uniform(lo, hi, size=n)
    return q


def _standardize_quats(layout, q):
    q = np.array(q, dtype=np.float64, copy=True)
    for b in layout.blocks:
        o = b.q_offset + 3 if b.joint_type is JointType.FREE else b.q_offset
        if b.joint_type in (JointType.FREE, JointType.BALL):
            q[:, o : o + 4] *= np.where(q[:, o : o + 1] < 0, -1.0, 1.0)
    return q


def _motion(mapper, q, fps):
    st = mapper.to_skeleton_state(q)
    return SkeletonMotion(mapper.skeleton_tree, st.root_translation, st.local_rotation, fps, st.local_translation)


def _mujoco_xpos(model, q):
    d = mujoco.MjData(model)
    out = np.empty((len(q), model.nbody - 1, 3))
    for i, qi in enumerate(q):
        d.qpos[:] = qi
        mujoco.mj_kinematics(model, d)
        out[i] = d.xpos[1:]
    return out


def _mujoco_model(rel):
    path = data_file(rel)
    if rel.endswith(".urdf"):
        spec = mujoco.MjSpec.from_file(str(path))
        spec.compiler.fusestatic = False
        return spec.compile()
    return mujoco.MjModel.from_xml_path(str(path))


# -- round trips on every model with rotational joints -----------------------------------------------


@pytest.mark.parametrize("rel", ROTATIONAL_MJCF + ["urdf/unitree/g1_29dof.nomesh.urdf"])
def test_round_trip_q_skeleton_q_and_mujoco_positions(rel):
    layout = _layout(rel)
    mapper = ArticulationMotionMapper(layout)
    q = _random_q(layout, np.random.default_rng(0), 300)
    state = mapper.to_skeleton_state(q)
    res = mapper.to_articulation_coordinates(state)
    assert isinstance(res, CoordinatesResult)
    assert res.q.shape == q.shape and res.residual_angles.shape == (300, layout.num_bodies)
    np.testing.assert_allclose(_standardize_quats(layout, res.q), _standardize_quats(layout, q), atol=1e-5)
    assert res.residual_angles.max() < 1e-5
    # MuJoCo at the mapped qpos puts every body where the skeleton has it
    model = _mujoco_model(rel)
    assert model.nq == layout.nq
    xpos = _mujoco_xpos(model, res.q[:40])
    np.testing.assert_allclose(xpos, np.asarray(state.global_translation)[:40], atol=1e-9)
    # float32 states: same answer to float32 precision
    res32 = mapper.to_articulation_coordinates(mapper.to_skeleton_state(q.astype(np.float32)))
    assert res32.q.dtype == np.float32
    np.testing.assert_allclose(_standardize_quats(layout, res32.q), _standardize_quats(layout, q), atol=2e-5)
    assert res32.residual_angles.max() < 2e-5


@pytest.mark.parametrize("rel", ["mjcf/dm_control/humanoid_CMU.xml", "mjcf/mujoco/humanoid.xml"])
def test_motion_round_trip_and_skeleton_motion(rel):
    layout = _layout(rel)
    mapper = ArticulationMotionMapper(layout)
    q, _ = _synthetic_trajectory(layout, 30.0, seconds=50 / 30.0)  # a motion: smooth in time
    q = q[:50]
    result = mapper.to_articulation_motion(_motion(mapper, q, 30.0))
    assert isinstance(result, MappingResult)
    motion = result.motion
    assert isinstance(motion, ArticulationMotion) and motion.q.dtype == np.float32
    assert motion.layout_signature == layout.model_signature and motion.fps() == 30.0
    assert result.clamped.shape == (50, layout.nv) and not result.clamped.any()
    hinge = [b.q_offset for b in layout.blocks if b.joint_type is JointType.HINGE]
    np.testing.assert_allclose(motion.q[:, hinge], q[:, hinge], atol=2e-6)
    back = mapper.to_skeleton_motion(motion)
    assert isinstance(back, SkeletonMotion) and back.fps == 30.0
    p_back = np.asarray(back.global_translation)
    p_ref, _ = forward_kinematics(layout, q)
    np.testing.assert_allclose(p_back, p_ref, atol=2e-5)


def test_batched_states_keep_their_shape_and_torch_states_work():
    layout = _layout("mjcf/protomotions/smpl_humanoid.xml")
    mapper = ArticulationMotionMapper(layout)
    q = _random_q(layout, np.random.default_rng(2), 24).reshape(2, 3, 4, layout.nq)
    st = mapper.to_skeleton_state(q)
    assert st.local_rotation.shape == (2, 3, 4, layout.num_bodies, 4)
    res = mapper.to_articulation_coordinates(st)
    assert res.q.shape == (2, 3, 4, layout.nq) and res.residual_angles.shape == (2, 3, 4, layout.num_bodies)
    np.testing.assert_allclose(res.q[..., 7:], q[..., 7:], atol=1e-9)
    single = mapper.to_articulation_coordinates(st[1, 2, 3])
    assert single.q.shape == (layout.nq,)
    np.testing.assert_allclose(single.q, res.q[1, 2, 3])
    st_t = mapper.to_skeleton_state(torch.as_tensor(q))
    assert isinstance(st_t.local_rotation, torch.Tensor)
    np.testing.assert_allclose(mapper.to_articulation_coordinates(st_t).q, res.q, atol=1e-12)


def test_to_skeleton_state_fills_anchor_translations_and_matches_mujoco():
    rel = "mjcf/mujoco/humanoid.xml"  # hinges with anchors move body origins
    layout = _layout(rel)
    mapper = ArticulationMotionMapper(layout)
    q = _random_q(layout, np.random.default_rng(3), 20)
    st = mapper.to_skeleton_state(q)
    assert st.local_translation is not None
    np.testing.assert_allclose(np.asarray(st.global_translation), _mujoco_xpos(_mujoco_model(rel), q), atol=1e-9)
    pos, rot = forward_kinematics(layout, q)
    np.testing.assert_allclose(np.asarray(st.global_translation), pos, atol=1e-12)
    assert np.all(np.abs(np.abs(np.sum(np.asarray(st.global_rotation) * rot, -1)) - 1) < 1e-12)


# -- the decomposition itself -----------------------------------------------------------------------


def test_xyz_triplets_equal_scipy_intrinsic_euler_angles():
    layout = _layout("mjcf/protomotions/smpl_humanoid.xml")
    mapper = ArticulationMotionMapper(layout)
    rng = np.random.default_rng(4)
    n = 500
    local = R.quat_normalize(rng.normal(size=(n, layout.num_bodies, 4)))
    res = mapper.to_articulation_coordinates(SkeletonState(mapper.skeleton_tree, rng.normal(size=(n, 3)), local))
    body = layout.body_index("L_Knee")
    blocks = _hinge_blocks(layout, body)
    assert [b.axis for b in blocks] == [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)]
    ours = res.q[:, [b.q_offset for b in blocks]]
    quat = local[:, body]
    a = Rotation.from_quat(quat[:, [1, 2, 3, 0]]).as_euler("XYZ")  # intrinsic x, then y, then z
    b = np.stack([a[:, 0] + np.pi, np.pi - a[:, 1], a[:, 2] + np.pi], axis=-1)  # the other branch
    wrap = lambda x: x - 2 * np.pi * np.rint(x / (2 * np.pi))
    a, b = wrap(a), wrap(b)
    # every SMPL hinge is limited to +-pi, so both branches fit: the one with smaller angles is chosen
    want = np.where((np.abs(b).sum(-1) < np.abs(a).sum(-1))[:, None], b, a)
    np.testing.assert_allclose(wrap(ours - want), 0.0, atol=1e-9)
    assert (np.abs(b).sum(-1) < np.abs(a).sum(-1)).any() and (np.abs(a).sum(-1) < np.abs(b).sum(-1)).any()
    assert res.residual_angles.max() == 0.0


def _brute_force_residual(J, axes, rng):
    """Smallest geodesic angle over several starts of L-BFGS on 1 - <chain(theta), J>^2 (monotone in
    the angle), composing the chain with scipy's rotations (independent of ours)."""
    rv = np.asarray(axes, dtype=float)
    j_xyzw = np.array([J[1], J[2], J[3], J[0]])

    def f(th):
        p = Rotation.identity()
        for k in range(len(th)):
            p = p * Rotation.from_rotvec(rv[k] * th[k])
        return 1.0 - float(np.dot(p.as_quat(), j_xyzw)) ** 2

    best = min(
        minimize(
            f, rng.uniform(-np.pi, np.pi, len(axes)), method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12}
        ).fun
        for _ in range(4)
    )
    return 2.0 * np.arccos(np.sqrt(min(1.0, max(0.0, 1.0 - best))))


def _chain(axes, theta):
    p = np.array([1.0, 0.0, 0.0, 0.0])
    for a, t in zip(axes, theta):
        p = R.quat_multiply(p, R.quat_from_axis_angle(np.asarray(a, dtype=float), t))
    return p


def test_residuals_are_the_best_fit_on_any_axes(synth):
    """Random (mostly unreachable) rotations: the reported residual is the geodesic distance to the
    joints' rotation at the mapped angles, and no other angles come closer (scipy multi-start)."""
    _, layout = synth
    mapper = ArticulationMotionMapper(layout)
    rng = np.random.default_rng(5)
    n = 4
    local = R.quat_normalize(rng.normal(size=(n, layout.num_bodies, 4)))
    res = mapper.to_articulation_coordinates(SkeletonState(mapper.skeleton_tree, np.zeros((n, 3)), local))
    for name in ("one", "two", "three", "skewed", "par"):
        b = layout.body_index(name)
        blocks = _hinge_blocks(layout, b)
        axes = [blk.axis for blk in blocks]
        J = R.quat_multiply(R.quat_conjugate(layout.rest_rotations_wxyz[b]), local[:, b])
        for i in range(n):
            theta = [res.q[i, blk.q_offset] - blk.ref for blk in blocks]
            got = res.residual_angles[i, b]
            assert abs(R.quat_angle_between(_chain(axes, theta), J[i]) - got) < 1e-9
            assert got <= _brute_force_residual(J[i], axes, rng) + 1e-7, name
    fixed = layout.body_index("fixedchild")
    J = R.quat_multiply(R.quat_conjugate(layout.rest_rotations_wxyz[fixed]), local[:, fixed])
    np.testing.assert_allclose(res.residual_angles[:, fixed], R.quat_angle(J), atol=1e-12)


def test_reachable_rotations_come_back_exactly_on_any_axes(synth):
    _, layout = synth
    mapper = ArticulationMotionMapper(layout)
    q = _random_q(layout, np.random.default_rng(6), 400, triplet_max=1.2)
    st = mapper.to_skeleton_state(q)
    res = mapper.to_articulation_coordinates(st)
    assert res.residual_angles.max() < 1e-8
    _, r0 = forward_kinematics(layout, q)
    _, r1 = forward_kinematics(layout, res.q)
    assert R.quat_angle_between(r0, r1).max() < 1e-8
    # non-redundant bodies give q itself back (ref of h2b included)
    for name in ("one", "two", "euler"):
        for blk in _hinge_blocks(layout, layout.body_index(name)):
            d = res.q[:, blk.q_offset] - q[:, blk.q_offset]
            np.testing.assert_allclose(d - 2 * np.pi * np.rint(d / (2 * np.pi)), 0.0, atol=1e-9)


def test_single_hinge_residual_is_the_perpendicular_rotation():
    layout = _layout("mjcf/unitree/g1_29dof.nomesh.xml")
    mapper = ArticulationMotionMapper(layout)
    knee = layout.block("left_knee_joint")
    axis = np.asarray(knee.axis)
    perp = np.cross(axis, [1.0, 0.0, 0.0]) if abs(axis[0]) < 0.9 else np.cross(axis, [0.0, 1.0, 0.0])
    perp /= np.linalg.norm(perp)
    q = np.tile(layout.neutral(), (5, 1))
    st = mapper.to_skeleton_state(q)
    beta = np.array([0.0, 0.1, 0.7, 1.5, 3.0])
    theta = np.array([0.3, 1.0, -0.4, 2.0, 0.5])
    b = knee.body_index
    local = np.array(st.local_rotation, copy=True)
    twist = R.quat_from_axis_angle(np.broadcast_to(axis, (5, 3)), theta)
    swing = R.quat_from_axis_angle(np.broadcast_to(perp, (5, 3)), beta)
    local[:, b] = R.quat_multiply(layout.rest_rotations_wxyz[b], R.quat_multiply(swing, twist))
    res = mapper.to_articulation_coordinates(SkeletonState(mapper.skeleton_tree, st.root_translation, local))
    np.testing.assert_allclose(res.residual_angles[:, b], beta, atol=1e-12)
    np.testing.assert_allclose(res.q[:, knee.q_offset], theta, atol=1e-12)
    others = np.delete(res.residual_angles, b, axis=1)
    assert others.max() < 1e-12


def test_gimbal_lock_frames_are_exact():
    layout = _layout("mjcf/protomotions/smpl_humanoid.xml")
    mapper = ArticulationMotionMapper(layout)
    q = np.tile(layout.neutral(), (6, 1))
    sh = [b.q_offset for b in _hinge_blocks(layout, layout.body_index("R_Shoulder"))]
    q[:, sh[0]] = [0.3, -1.0, 2.0, 0.0, 0.5, 1.2]
    q[:, sh[1]] = [np.pi / 2, -np.pi / 2, np.pi / 2 - 1e-9, -np.pi / 2 + 1e-5, np.pi / 2, np.pi / 2 - 1e-3]
    q[:, sh[2]] = [0.1, 0.4, -2.5, 1.0, 0.0, -0.7]
    st = mapper.to_skeleton_state(q)
    for res in (mapper.to_articulation_coordinates(st), mapper.to_articulation_motion(_motion(mapper, q, 10.0))):
        qq = res.q if isinstance(res, CoordinatesResult) else res.motion.q.astype(np.float64)
        _, r0 = forward_kinematics(layout, q)
        _, r1 = forward_kinematics(layout, qq)
        assert R.quat_angle_between(r0, r1).max() < 2e-6


# -- limits ------------------------------------------------------------------------------------------


def test_clamping_reports_the_exact_amount(synth):
    _, layout = synth
    mapper = ArticulationMotionMapper(layout)
    h1 = layout.block("h1")  # single hinge, +-60 deg
    lo, hi = h1.limits
    q = np.tile(layout.neutral(), (4, 1))
    q[:, layout.block("off").q_offset] = 3.0  # its ref (0) is outside its limits (30..310 deg)
    q[:, h1.q_offset] = [hi + 0.3, lo - 0.2, 0.5 * hi, hi + 1e-3]
    motion = _motion(mapper, q, 20.0)
    free = mapper.to_articulation_motion(motion)
    np.testing.assert_allclose(free.motion.q[:, h1.q_offset], q[:, h1.q_offset], atol=1e-6)
    assert not free.clamped.any() and free.residual_angles.max() < 1e-6
    out = mapper.to_articulation_motion(motion, clamp_to_limits=True)
    expected = np.clip(q[:, h1.q_offset], lo, hi) - q[:, h1.q_offset]
    np.testing.assert_allclose(out.clamped[:, h1.qd_offset], expected, atol=1e-6)
    others = np.delete(out.clamped, h1.qd_offset, axis=1)
    assert not others.any()
    np.testing.assert_allclose(out.motion.q[:, h1.q_offset], np.clip(q[:, h1.q_offset], lo, hi), atol=1e-6)
    b = h1.body_index
    np.testing.assert_allclose(out.residual_angles[:, b], np.abs(expected), atol=1e-6)
    assert out.motion.metadata["mapper"]["clamp_to_limits"] is True
    # states too
    st = mapper.to_articulation_coordinates(mapper.to_skeleton_state(q), clamp_to_limits=True)
    np.testing.assert_allclose(st.clamped[:, h1.qd_offset], expected, atol=1e-9)


def test_clamping_a_triplet_recomputes_its_residual():
    layout = _layout("mjcf/dm_control/humanoid_CMU.xml")
    mapper = ArticulationMotionMapper(layout)
    blocks = _hinge_blocks(layout, layout.body_index("lfemur"))
    q = np.tile(layout.neutral(), (3, 1))
    for blk, v in zip(blocks, (0.2, 0.1, 0.0)):
        q[:, blk.q_offset] = v
    over = blocks[0]
    q[:, over.q_offset] = over.limits[1] + np.array([0.0, 0.05, 0.2])
    res = mapper.to_articulation_coordinates(mapper.to_skeleton_state(q), clamp_to_limits=True)
    np.testing.assert_allclose(res.clamped[:, over.qd_offset], [0.0, -0.05, -0.2], atol=1e-9)
    b = over.body_index
    want = R.quat_multiply(
        R.quat_conjugate(layout.rest_rotations_wxyz[b]), mapper.to_skeleton_state(q).local_rotation[:, b]
    )
    got = np.array([_chain([blk.axis for blk in blocks], [res.q[i, blk.q_offset] for blk in blocks]) for i in range(3)])
    np.testing.assert_allclose(res.residual_angles[:, b], R.quat_angle_between(got, want), atol=1e-9)
    np.testing.assert_allclose(res.residual_angles[:, b], [0.0, 0.05, 0.2], atol=1e-9)  # one axis moved


def test_limited_hinge_is_shifted_into_its_limits_and_unlimited_spins_unwrap(synth):
    _, layout = synth
    mapper = ArticulationMotionMapper(layout)
    off, spin = layout.block("off"), layout.block("spin")  # limits 30..310 deg; unlimited
    n = 600
    t = np.arange(n) / 60.0
    q = np.tile(layout.neutral(), (n, 1))
    q[:, off.q_offset] = 4.5 + 0.8 * np.sin(2 * t)  # beyond pi: wrapped values would leave the limits
    q[:, spin.q_offset] = 0.2 + 7.0 * t  # ~11 turns
    res = mapper.to_articulation_motion(_motion(mapper, q, 60.0))
    got = res.motion.q.astype(np.float64)
    np.testing.assert_allclose(got[:, off.q_offset], q[:, off.q_offset], atol=2e-5)
    np.testing.assert_allclose(got[:, spin.q_offset], q[:, spin.q_offset], atol=2e-5)  # frame 0 within pi of ref
    assert np.abs(np.diff(got[:, spin.q_offset])).max() < 7.0 / 60.0 + 1e-4
    # a single state lands within pi of the middle of the limits
    st = mapper.to_articulation_coordinates(mapper.to_skeleton_state(q[:5]))
    np.testing.assert_allclose(st.q[:, off.q_offset], q[:5, off.q_offset], atol=1e-9)


# -- velocities ---------------------------------------------------------------------------------------


def _synthetic_trajectory(layout, fps, seconds=2.0, *, amp=0.5):
    """q(t) and analytic qd(t): root translation + constant world spin, balls spinning at constant
    parent-frame rates, hinges sin waves."""
    t = np.arange(int(seconds * fps) + 1) / fps
    n = len(t)
    q = np.tile(layout.neutral(), (n, 1))
    qd = np.zeros((n, layout.nv))
    rng = np.random.default_rng(7)
    for b in layout.blocks:
        qo, vo = b.q_offset, b.qd_offset
        if b.joint_type is JointType.FREE:
            q[:, qo] = np.sin(t)
            q[:, qo + 1] = np.cos(2 * t)
            q[:, qo + 2] = 1.0 + 0.1 * t
            qd[:, vo : vo + 3] = np.stack([np.cos(t), -2 * np.sin(2 * t), np.full(n, 0.1)], -1)
            w = np.array([0.3, -0.2, 0.5])
            q0 = R.quat_normalize(np.array([0.9, 0.1, -0.3, 0.2]))
            q[:, qo + 3 : qo + 7] = R.quat_multiply(R.quat_from_rotvec(np.outer(t, w)), q0)
            qd[:, vo + 3 : vo + 6] = w
        elif b.joint_type is JointType.BALL:
            w = rng.normal(size=3)
            q[:, qo : qo + 4] = R.quat_multiply(
                R.quat_from_rotvec(np.outer(t, w)), R.quat_normalize(rng.normal(size=4))
            )
            qd[:, vo : vo + 3] = w
        elif b.joint_type is JointType.HINGE:
            f, ph = rng.uniform(0.5, 2.0), rng.uniform(0, 6)
            lo, hi = b.limits if b.limits is not None else (-np.inf, np.inf)
            mid = 0.5 * (lo + hi) if np.isfinite(lo + hi) else b.ref
            a = min(amp, 0.45 * (hi - lo)) if np.isfinite(hi - lo) else amp
            q[:, qo] = mid + a * np.sin(f * t + ph)
            qd[:, vo] = a * f * np.cos(f * t + ph)
    return q, qd


@pytest.mark.parametrize("rel", ["mjcf/mujoco/humanoid.xml", "mjcf/dm_control/model_with_ball_joints.xml"])
def test_qd_matches_analytic_derivative_and_integrates_to_the_next_frame(rel):
    layout = _layout(rel)
    mapper = ArticulationMotionMapper(layout)
    errs = []
    for fps in (100.0, 200.0):
        q, qd_true = _synthetic_trajectory(layout, fps)
        st = mapper.to_skeleton_state(q)
        sm = SkeletonMotion(mapper.skeleton_tree, st.root_translation, st.local_rotation, fps, st.local_translation)
        res = mapper.to_articulation_motion(sm)
        qd = res.motion.qd.astype(np.float64)
        np.testing.assert_allclose(qd[1:-1], qd_true[1:-1], atol=2e-3)  # central: O(dt^2)
        np.testing.assert_allclose(qd[[0, -1]], qd_true[[0, -1]], atol=0.06)  # one-sided: O(dt)
        # exactly the layout's central differences of the mapped q
        qm = res.motion.q.astype(np.float64)
        np.testing.assert_allclose(qd[5], layout.difference(qm[6], qm[4], 2.0 / fps), atol=1e-4)
        # integrate(q, qd, dt) reaches the next frame to first order
        nxt = layout.integrate(qm[:-1], qd[:-1], 1.0 / fps)
        errs.append(np.abs(layout.difference(nxt, qm[1:], 1.0)).max())
    assert errs[0] < 5e-4
    assert errs[1] < max(errs[0] / 3.0, 2e-6)  # error O(dt^2), down to float32 round-off


def test_single_frame_motion_has_zero_velocity():
    layout = _layout("mjcf/dm_control/model_with_ball_joints.xml")
    mapper = ArticulationMotionMapper(layout)
    q = _random_q(layout, np.random.default_rng(8), 1)
    res = mapper.to_articulation_motion(_motion(mapper, q, 30.0))
    assert res.motion.qd.shape == (1, layout.nv) and not res.motion.qd.any()


# -- continuity ---------------------------------------------------------------------------------------


def _narrow(block) -> bool:
    return block.limits is not None and block.limits[1] - block.limits[0] < 2 * np.pi - 1e-9


@pytest.mark.parametrize("rel", ["mjcf/protomotions/smpl_humanoid.xml", "mjcf/dm_control/humanoid_CMU.xml"])
def test_long_motion_with_full_turns_and_gimbal_crossings_stays_continuous(rel):
    """Triplet first/third angles turn several times, middle angles cross +-pi/2 (the two Davenport
    branches meet there); the mapped q equals the generating q up to one 2 pi multiple per hinge."""
    layout = _layout(rel, free_root=True)
    mapper = ArticulationMotionMapper(layout)
    fps, n = 60.0, 3000
    q = _turning_q(layout, n, fps, seed=9)  # the root moves and spins
    res = mapper.to_articulation_motion(_motion(mapper, q, fps))
    got = res.motion.q.astype(np.float64)
    assert res.residual_angles.max() < 1e-5
    for b in range(layout.num_bodies):
        blocks = _hinge_blocks(layout, b)
        cols = [blk.q_offset for blk in blocks]
        if not cols:
            continue
        candidates = [q[:, cols]]
        if len(blocks) == 3:  # the other Davenport branch, followed continuously: (t1 + pi, 2 phi - t2, t3 + pi)
            a1, a2, a3 = (np.asarray(blk.axis) for blk in blocks)
            phi = np.arctan2(a1 @ np.cross(a2, a3), a1 @ a3)
            candidates.append(q[:, cols] + [np.pi, 0.0, np.pi])
            candidates[-1][:, 1] = 2 * phi - q[:, cols[1]]
        # the mapped path is one of them: up to one constant 2 pi multiple per hinge, and for a hinge whose
        # limits span less than 2 pi, up to the per-frame turn that keeps it within pi of its limits' middle
        narrow = np.array([_narrow(blk) for blk in blocks])
        ok = []
        for c in candidates:
            d = got[:, cols] - c
            turns = d / (2 * np.pi)
            exact_turns = np.abs(turns - np.rint(turns)).max() < 1e-4
            constant = np.abs(d - d[0])[:, ~narrow].max(initial=0.0) < 5e-4
            ok.append(exact_turns and constant)
        assert any(ok), layout.body_names[b]
        for blk, nar in zip(blocks, narrow):
            if nar:
                mid = 0.5 * (blk.limits[0] + blk.limits[1])
                assert np.abs(got[:, blk.q_offset] - mid).max() <= np.pi + 1e-6, blk.joint_name
    wide = [b.q_offset for b in layout.blocks if b.joint_type is JointType.HINGE and not _narrow(b)]
    jumps = np.abs(np.diff(got[:, wide], axis=0)).max(axis=0, initial=0.0)
    assert np.all(jumps <= np.abs(np.diff(q[:, wide], axis=0)).max(axis=0, initial=0.0) + 1e-4)
    # qd follows the unwrapped path: no 2 pi / dt spikes where a narrow hinge was re-wrapped
    assert np.abs(res.motion.qd[:, 6:]).max() < 20.0
    winds_narrow = any(_narrow(b) for b in layout.blocks if b.joint_type is JointType.HINGE)
    assert bool(res.motion.metadata["mapper"]["rewrapped_frames"]) == winds_narrow
    # root quaternion: sign-continuous
    quat = got[:, 3:7]
    assert np.all(np.sum(quat[1:] * quat[:-1], axis=-1) > 0.99)


def test_ball_joints_are_hemisphere_continuous():
    layout = _layout("mjcf/dm_control/model_with_ball_joints.xml")
    mapper = ArticulationMotionMapper(layout)
    q, _ = _synthetic_trajectory(layout, 30.0, seconds=20.0)  # several full turns of every ball
    res = mapper.to_articulation_motion(_motion(mapper, q, 30.0))
    for b in layout.blocks:
        if b.joint_type is JointType.BALL:
            quat = res.motion.q[:, b.q_slice].astype(np.float64)
            assert quat[0, 0] >= 0
            assert np.all(np.sum(quat[1:] * quat[:-1], axis=-1) > 0.9)
            assert R.quat_angle_between(quat, q[:, b.q_slice]).max() < 1e-5


# -- free_root=False, prismatic, bad input --------------------------------------------------------------


def test_fixed_root_reports_the_root_residual():
    layout = _layout("mjcf/unitree/g1_29dof.nomesh.xml", free_root=False)
    mapper = ArticulationMotionMapper(layout)
    q = _random_q(layout, np.random.default_rng(10), 4)
    st = mapper.to_skeleton_state(q)
    local = np.array(st.local_rotation, copy=True)
    tilt = R.quat_from_axis_angle(np.array([0.0, 1.0, 0.0]), np.array([0.0, 0.1, 0.5, 1.0]))
    local[:, 0] = R.quat_multiply(tilt, local[:, 0])
    res = mapper.to_articulation_coordinates(SkeletonState(mapper.skeleton_tree, st.root_translation + 1.0, local))
    np.testing.assert_allclose(res.residual_angles[:, 0], [0.0, 0.1, 0.5, 1.0], atol=1e-12)
    np.testing.assert_allclose(res.q, q, atol=1e-12)  # the root translation is not represented either


def test_prismatic_joints_map_to_ref_and_refuse_skeleton_output():
    layout = _layout("mjcf/dm_control/cartpole.xml")
    mapper = ArticulationMotionMapper(layout)
    slide = next(b for b in layout.blocks if b.joint_type is JointType.SLIDE)
    state = SkeletonState.zero_pose(mapper.skeleton_tree)
    res = mapper.to_articulation_coordinates(state)
    assert res.q[slide.q_offset] == slide.ref
    with pytest.raises(MotionError, match=slide.joint_name):
        mapper.to_skeleton_state(layout.neutral())
    motion = ArticulationMotion(
        np.tile(layout.neutral(), (3, 1)), np.zeros((3, layout.nv)), 30.0, layout.model_signature
    )
    with pytest.raises(MotionError, match=slide.joint_name):
        mapper.to_skeleton_motion(motion)


def test_bad_input_is_refused_with_clear_errors():
    layout = _layout("mjcf/dm_control/humanoid_CMU.xml")
    mapper = ArticulationMotionMapper(layout)
    tree = mapper.skeleton_tree
    names = list(tree.node_names)
    renamed = SkeletonTree(tuple(["pelvs"] + names[1:]), tree.parent_indices, tree.local_translation)
    with pytest.raises(UnknownNameError, match="pelvs") as err:
        mapper.to_articulation_coordinates(SkeletonState.zero_pose(renamed))
    assert names[0] in str(err.value)
    swapped = names[:]
    swapped[-1], swapped[-2] = swapped[-2], swapped[-1]
    parents = np.array(tree.parent_indices)
    reordered = SkeletonTree(tuple(swapped), parents, tree.local_translation)
    with pytest.raises(LayoutMismatch, match="order"):
        mapper.to_articulation_coordinates(SkeletonState.zero_pose(reordered))
    other_parent = parents.copy()
    other_parent[-1] = 0
    with pytest.raises(LayoutMismatch, match="parents"):
        mapper.to_articulation_coordinates(
            SkeletonState.zero_pose(SkeletonTree(tree.node_names, other_parent, tree.local_translation))
        )
    scaled = SkeletonTree(tree.node_names, parents, tree.local_translation * 1.3)
    with pytest.warns(SkeletonOffsetWarning):
        res = mapper.to_articulation_coordinates(SkeletonState.zero_pose(scaled))
    assert res.residual_angles.max() < 1e-12
    with pytest.raises(ShapeError):
        mapper.to_articulation_motion(SkeletonState.zero_pose(tree))
    other = ArticulationCoordinateLayout.from_data(
        data=MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"), order="BFS")
    )
    motion = ArticulationMotion(np.tile(other.neutral(), (2, 1)), np.zeros((2, other.nv)), 30.0, other.model_signature)
    with pytest.raises(LayoutMismatch):
        mapper.to_skeleton_motion(motion)
    with pytest.raises(ShapeError):
        ArticulationMotionMapper("not a layout")


@pytest.mark.parametrize("rel", ["mjcf/protomotions/smpl_humanoid.xml", "mjcf/dm_control/model_with_ball_joints.xml"])
def test_zero_quaternions_are_refused_naming_frame_and_body(rel):
    layout = _layout(rel)
    mapper = ArticulationMotionMapper(layout)
    q = np.tile(layout.neutral(), (6000, 1))  # more than one solver block
    st = mapper.to_skeleton_state(q)
    local = np.array(st.local_rotation, copy=True)
    local[5000, 2] = 0.0
    with pytest.raises(FormatError, match=f"frame 5000, body '{layout.body_names[2]}'"):
        mapper.to_articulation_motion(SkeletonMotion(mapper.skeleton_tree, st.root_translation, local, 30.0))


def test_every_joint_structure_is_continuous_over_a_smooth_motion(synth):
    """Arbitrary axes, non-orthogonal triplets, parallel axes and a 4-hinge chain over 3000 frames: the
    rotations come back, non-redundant bodies give the generating q back, and the redundant ones (another
    split of the same rotation) step no further in a frame than a small multiple of the body's rotation."""
    _, layout = synth
    mapper = ArticulationMotionMapper(layout)
    n, fps = 3000, 60.0
    t = np.arange(n) / fps
    rng = np.random.default_rng(11)
    q = np.tile(layout.neutral(), (n, 1))
    for blk in layout.blocks:
        if blk.joint_type is JointType.HINGE:
            q[:, blk.q_offset] = blk.ref + 0.6 * np.sin(rng.uniform(0.3, 1.5) * t + rng.uniform(0, 6))
    q[:, layout.block("off").q_offset] = 3.0 + np.sin(t)
    st = mapper.to_skeleton_state(q)
    res = mapper.to_articulation_motion(_motion(mapper, q, fps))
    got = res.motion.q.astype(np.float64)
    assert res.residual_angles.max() < 1e-6
    _, r0 = layout.local_transforms(q)
    _, r1 = layout.local_transforms(got)
    assert R.quat_angle_between(r0, r1).max() < 2e-6
    local = np.asarray(st.local_rotation)
    step = R.quat_angle_between(local[1:], local[:-1])  # [frames - 1, bodies]
    for b, name in enumerate(layout.body_names):
        cols = [blk.q_offset for blk in _hinge_blocks(layout, b)]
        if not cols:
            continue
        if name not in ("par", "four"):
            np.testing.assert_allclose(got[:, cols], q[:, cols], atol=2e-5, err_msg=name)
        else:  # redundant: another, equally exact split, which must not jump either
            jump = np.abs(np.diff(got[:, cols], axis=0)).max(axis=1)
            assert np.all(jump <= 3.0 * (step[:, b] + 1e-4)), name


def test_real_cmu_clip_retargeted_onto_the_cmu_humanoid_is_continuous():
    """22.9 s of real CMU mocap (jumps and turns), read from BVH and retargeted onto the CMU humanoid: no
    hinge moves further between two frames than (a little more than) its body's wanted rotation does."""
    import kangengine as ke
    from kangengine.data import data_path

    source = ke.io.load_bvh(data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh"))
    retargeted = ke.retarget.retarget_motion(source, "cmu_bvh_to_cmu_humanoid").motion
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_path("humanoid_CMU.xml")))
    mapper = ArticulationMotionMapper(layout)
    res = mapper.to_articulation_motion(retargeted)
    q = res.motion.q.astype(np.float64)
    assert q.shape == (2752, layout.nq) and np.isfinite(res.residual_angles).all()
    local = np.asarray(retargeted.local_rotation, dtype=np.float64)
    step = R.quat_angle_between(local[1:], local[:-1])  # [frames - 1, bodies]: the motion itself
    for b, name in enumerate(layout.body_names):
        cols = [blk.q_offset for blk in _hinge_blocks(layout, b)]
        if cols:
            jump = np.abs(np.diff(q[:, cols], axis=0)).max(axis=1)
            assert np.all(jump <= 1.5 * (step[:, b] + 1e-3)), name
    assert np.all(np.sum(q[1:, 3:7] * q[:-1, 3:7], axis=-1) > 0.99)  # root quaternion sign-continuous
    # what the joints reproduce is the retargeted motion, up to the reported residuals
    _, rot = layout.local_transforms(q)
    wanted = R.quat_multiply(R.quat_conjugate(layout.rest_rotations_wxyz), local)
    got = R.quat_multiply(R.quat_conjugate(layout.rest_rotations_wxyz), rot)
    np.testing.assert_allclose(R.quat_angle_between(got, wanted)[:, 1:], res.residual_angles[:, 1:], atol=2e-4)


def test_a_narrow_hinge_never_winds_and_the_summary_says_what_left_its_limits():
    """A knee (limits narrower than 2 pi) whose wanted rotation goes the long way round, past its upper limit
    through the back and in again from below: unwrapping alone would end the clip one turn up (6.48 rad, and
    clamping would then pin it at the limit for the rest of the clip); the mapper brings those frames back
    to the nearest turn, keeps qd on the unwrapped path, and records the violation and the re-wrapped frames."""
    layout = _layout("mjcf/dm_control/humanoid_CMU.xml", free_root=True)
    mapper = ArticulationMotionMapper(layout)
    knee = next(b for b in layout.blocks if "tibia" in b.joint_name and len(_hinge_blocks(layout, b.body_index)) == 1)
    lo, hi = knee.limits
    assert hi - lo < 2 * np.pi
    n, fps = 400, 60.0
    path = np.empty(n)
    path[: n // 2] = np.linspace(0.5 * (lo + hi), lo + 2 * np.pi + 0.2, n // 2)  # up, round the back
    path[n // 2 :] = lo + 2 * np.pi + 0.2 - np.linspace(0, 0.1, n - n // 2)  # just inside again, one turn up
    q = np.tile(layout.neutral(), (n, 1))
    q[:, knee.q_offset] = path
    for clamp in (False, True):
        res = mapper.to_articulation_motion(_motion(mapper, q, fps), clamp_to_limits=clamp)
        got = res.motion.q[:, knee.q_offset].astype(np.float64)
        turns = (got - path) / (2 * np.pi)
        wrapped = lo + np.mod(path - lo, 2 * np.pi)  # the wanted rotation's turn that starts at the lower limit
        same = np.ones(n, bool) if not clamp else wrapped <= hi  # clamped frames moved to a limit
        np.testing.assert_allclose(turns[same], np.rint(turns[same]), atol=1e-4)  # the same rotation
        tail = got[n // 2 :]
        assert np.all((tail >= lo - 1e-5) & (tail <= hi + 1e-5))  # back inside its limits, not one turn up
        meta = res.motion.metadata["mapper"]
        assert meta["rewrapped_frames"][knee.joint_name] >= n // 2
        assert meta["limit_violation_max"] > 0.5 and knee.joint_name in meta["limit_violation_dofs"]
        if not clamp:
            assert np.abs(res.motion.qd[:, knee.qd_offset]).max() < 2 * np.pi * fps / n * 4  # no 2 pi / dt spike


@pytest.mark.parametrize("rel", ["mjcf/protomotions/smpl_humanoid.xml", "mjcf/dm_control/model_with_ball_joints.xml"])
def test_velocities_are_central_differences_and_scipy_rotation_logs(rel):
    """qd written block by block in place: hinges are plain central differences, quaternions (free root, balls)
    the rotation vector of ``q[t+1] q[t-1]^-1`` (scipy) over 2 dt, one-sided at the ends."""
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file(rel)))
    mapper = ArticulationMotionMapper(layout)
    rng = np.random.default_rng(5)
    n, fps = 257, 50.0
    t = np.arange(n) / fps
    q = np.tile(layout.neutral(), (n, 1))
    for b in layout.blocks:
        o = b.q_offset
        if b.joint_type in (JointType.HINGE, JointType.SLIDE):
            q[:, o] = 0.3 * np.sin(rng.uniform(0.5, 2.0) * t + rng.uniform(0, 6))
        elif b.joint_type is JointType.FREE:
            q[:, o : o + 3] = rng.normal(size=3) + np.outer(t, rng.normal(size=3))
            q[:, o + 3 : o + 7] = Rotation.from_rotvec(np.outer(t, rng.normal(size=3))).as_quat()[:, [3, 0, 1, 2]]
        elif b.joint_type is JointType.BALL:
            q[:, o : o + 4] = Rotation.from_rotvec(np.outer(t, rng.normal(size=3))).as_quat()[:, [3, 0, 1, 2]]
    qd = mapper.velocities(q, fps)
    dt = 1.0 / fps
    for b in layout.blocks:
        o, v = b.q_offset, b.qd_offset
        if b.joint_type in (JointType.HINGE, JointType.SLIDE, JointType.FREE):
            k = 3 if b.joint_type is JointType.FREE else 1
            want = np.empty((n, k))
            want[1:-1] = (q[2:, o : o + k] - q[:-2, o : o + k]) / (2 * dt)
            want[0], want[-1] = (q[1, o : o + k] - q[0, o : o + k]) / dt, (q[-1, o : o + k] - q[-2, o : o + k]) / dt
            np.testing.assert_allclose(qd[:, v : v + k], want, rtol=1e-12, atol=1e-12)
        if b.joint_type in (JointType.FREE, JointType.BALL):
            a, w = (o + 3, v + 3) if b.joint_type is JointType.FREE else (o, v)
            rot = Rotation.from_quat(q[:, a : a + 4][:, [1, 2, 3, 0]])
            want = np.empty((n, 3))
            want[1:-1] = (rot[2:] * rot[:-2].inv()).as_rotvec() / (2 * dt)
            want[0], want[-1] = (rot[1] * rot[0].inv()).as_rotvec() / dt, (rot[-1] * rot[-2].inv()).as_rotvec() / dt
            np.testing.assert_allclose(qd[:, w : w + 3], want, rtol=1e-9, atol=1e-9)
    assert mapper.velocities(q[:1], fps).shape == (1, layout.nv) and not mapper.velocities(q[:1], fps).any()


@pytest.mark.parametrize("clamp", [False, True])
def test_limit_summary_equals_a_brute_force_count(clamp):
    """The block-wise limit summary (only blocks that leave the limits are measured) against a column-by-column
    count over the whole clip, on a G1 clip pushed past its limits."""
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file("mjcf/unitree/g1_29dof.nomesh.xml")))
    mapper = ArticulationMotionMapper(layout)
    n = 9000  # a few summary blocks, the last one partial
    t = np.arange(n) / 60.0
    q = np.tile(layout.neutral(), (n, 1))
    q[:, 3:7] = [1.0, 0.0, 0.0, 0.0]
    hinges = [b for b in layout.blocks if b.joint_type is JointType.HINGE]
    for i, b in enumerate(hinges):
        lo, hi = b.limits
        mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
        amp = 1.2 if i % 3 == 0 else 0.8  # a third of the hinges leave their limits part of the time
        q[:, b.q_offset] = mid + amp * half * np.sin(0.7 * t + i)
    st = mapper.to_skeleton_state(q)
    motion = SkeletonMotion(mapper.skeleton_tree, st.root_translation, st.local_rotation, 60.0)
    res = mapper.to_articulation_motion(motion, clamp_to_limits=clamp)
    summary = res.motion.metadata["mapper"]
    got = summary["limit_violation_dofs"]
    # brute force on the unclamped angles (float64 mapping of the same motion)
    free = mapper.to_articulation_motion(motion, clamp_to_limits=False).motion.q.astype(np.float64)
    want = {}
    for b in hinges:
        col = free[:, b.q_offset]
        over = np.maximum(b.limits[0] - col, 0.0) + np.maximum(col - b.limits[1], 0.0)
        if over.max() > 1e-6:
            want[b.joint_name] = (over.max(), (over > 1e-6).mean())
    worst = sorted(want, key=lambda k: -want[k][0])[:10]
    assert len(want) >= 5 and set(got) == set(worst)
    for name in worst:
        assert got[name]["max"] == pytest.approx(want[name][0], abs=2e-6)
        assert got[name]["fraction"] == pytest.approx(want[name][1], abs=2e-3)
    assert summary["limit_violation_max"] == pytest.approx(max(v[0] for v in want.values()), abs=2e-6)
    if clamp:
        assert summary["clamped_max"] == pytest.approx(float(np.abs(res.clamped).max()))
        assert summary["clamped_max"] > 0
    else:
        assert summary["clamped_max"] == 0.0 and not res.clamped.any()


# -- the native Euler kernel (kangengine.animation.native_mapper) ---------------------------------------

needs_native = pytest.mark.skipif(
    not __import__("kangengine.animation.kinematics.native", fromlist=["available"]).available(),
    reason="llvmlite is not available: the numpy path is the only one",
)


def _turning_q(layout, n, fps, seed):
    """Triplet outer angles turning several times, middle angles swinging across +-pi/2 (branch crossings)."""
    t = np.arange(n) / fps
    rng = np.random.default_rng(seed)
    q = np.tile(layout.neutral(), (n, 1))
    if layout.blocks[0].joint_type is JointType.FREE:
        q[:, 0:3] = np.stack([np.sin(t), 0.8 * t, 0.9 + 0.05 * np.cos(3 * t)], axis=-1)
        q[:, 3:7] = R.quat_from_rotvec(np.outer(t, [0.1, -0.2, 1.1]))
    for b in range(layout.num_bodies):
        blocks = _hinge_blocks(layout, b)
        for i, blk in enumerate(blocks):
            if len(blocks) == 3 and i == 1:
                q[:, blk.q_offset] = rng.uniform(0.5, 1.8) * np.sin(rng.uniform(0.3, 1.0) * t)
            else:
                q[:, blk.q_offset] = rng.uniform(-2.0, 2.0) * t + rng.uniform(-3, 3)
    return q


@needs_native
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_native_euler_kernel_matches_scipy_and_the_numpy_block(dtype):
    """Kernel level, random rotations: the angles against scipy's as_euler (float64 of the same input), the
    branch cost difference and the crossing flags against the numpy _fast_block of the same frames."""
    from kangengine.animation import native_mapper

    layout = _layout("mjcf/protomotions/smpl_humanoid.xml")
    mapper = ArticulationMotionMapper(layout)
    (g,) = mapper._groups
    dv = mapper._davenport[g.axes]
    n, nb = 5000, layout.num_bodies
    rng = np.random.default_rng(3)
    L = R.quat_normalize(rng.normal(size=(n, nb, 4))).astype(dtype)
    L[::7] = R.quat_normalize(L[::7] + 0.05 * rng.normal(size=(len(L[::7]), nb, 4))).astype(dtype)
    L = np.ascontiguousarray(L)
    kern = native_mapper.euler_block_kernel(dtype, nb, g.bodies, mapper._hinge_q[g.hinge_cols], *dv.euler, dv.phi, 1e-3)
    assert kern is not None
    k = len(g.bodies)
    q = np.zeros((n, layout.nq), dtype=dtype)
    dcost, cross, carry = np.zeros((n, k), dtype=dtype), np.zeros((n, k), dtype=bool), np.zeros((6, k))
    bad = kern(L, q, dcost, cross, carry, False)
    sp = Rotation.from_quat(L[:, g.bodies][..., [1, 2, 3, 0]].reshape(-1, 4).astype(np.float64))
    euler = sp.as_euler("XYZ").reshape(n, k, 3)
    got = q[:, mapper._hinge_q[g.hinge_cols]].astype(np.float64)
    lock = np.abs(np.abs(euler[..., 1]) - np.pi / 2) < 1e-3  # counted by the kernel, redone by numpy
    assert bad == int(lock.sum())
    d = np.abs(R.wrap_angle(got - euler))[~lock]
    assert d.max() < (1e-10 if dtype == np.float64 else 1e-6)
    # the numpy block on the same frames
    q_np = np.zeros_like(q)
    cross_np, dcost_np = np.zeros_like(cross), np.zeros_like(dcost)
    Lt = np.ascontiguousarray(L.transpose(2, 0, 1))
    mapper._fast_block(g, mapper._group_comps(g, Lt), q_np, 0, n, cross_np, dcost_np, {}, True)
    ok = ~lock.any(axis=1)
    ok[1:] &= ok[:-1]  # crossing flags read the frame before too
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert np.abs(dcost - dcost_np)[ok].max() < tol * 10
    flips = cross != cross_np
    assert not flips[ok].any()
    assert carry[0] == pytest.approx(got[-1, :, 0], abs=1e-6)
    # the running track parity and the branch-decision sums (the numpy path's accumulate and sums)
    parity = np.logical_xor.accumulate(cross, axis=0)
    assert np.array_equal(carry[3] == 1.0, parity[-1])
    np.testing.assert_allclose(carry[4], dcost.sum(axis=0, dtype=np.float64), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        carry[5], np.where(parity, dcost, 0).sum(axis=0, dtype=np.float64), rtol=1e-12, atol=1e-12
    )


@needs_native
@pytest.mark.parametrize("free_root", [True, False], ids=["fused-pass", "two-passes"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_native_and_numpy_mapper_paths_agree_over_turns_and_crossings(dtype, free_root):
    """The whole mapping (two solver blocks and more, turns, branch crossings, a frame in gimbal lock): the
    native kernel path against the numpy reference path (``use_native = False``). With the free root the fused
    pass does everything (q, qd, the summary's counters); without it (the root body has no joint) the Euler
    kernel and the placing pass run, the rest is numpy."""
    layout = _layout("mjcf/protomotions/smpl_humanoid.xml", free_root=free_root)
    mapper = ArticulationMotionMapper(layout)
    fps, n = 60.0, 9000
    q = _turning_q(layout, n, fps, 11)
    sh = [b.q_offset for b in _hinge_blocks(layout, layout.body_index("R_Shoulder"))]
    q[4500, sh[1]] = np.pi / 2  # gimbal lock: that block is recomputed by numpy
    st = mapper.to_skeleton_state(q)
    motion = SkeletonMotion(
        mapper.skeleton_tree, st.root_translation.astype(dtype), st.local_rotation.astype(dtype), fps
    )
    a = mapper.to_articulation_motion(motion)
    mapper.use_native = False
    b = mapper.to_articulation_motion(motion)
    assert mapper._native_kernels(np.dtype(dtype)) == {}
    mapper.use_native = True
    assert len(mapper._native_kernels(np.dtype(dtype))) == 1
    if free_root:
        assert mapper._native_fused(np.dtype(dtype)) is not None  # the fused pass ran
    else:
        assert mapper._native_fused(np.dtype(dtype)) is None
        assert mapper._native_place(np.dtype(dtype), mapper._groups, True) is not None  # both native passes ran
    qa, qb = a.motion.q.astype(np.float64), b.motion.q.astype(np.float64)
    if dtype == np.float64:
        np.testing.assert_allclose(qa, qb, rtol=1e-12, atol=1e-9)
    else:  # the native passes unwrap in float64 and round once (the fused pass's Euler angles are float32
        # arithmetic, as numpy's); numpy rounds each float32 step, its unwrapped angles carry the float32 error
        # of 2 pi * turns (~4e-6 rad at 20 turns): closer to the float64 mapping here
        motion64 = SkeletonMotion(mapper.skeleton_tree, st.root_translation, st.local_rotation, fps)
        m64 = mapper.to_articulation_motion(motion64).motion
        q64, qd64 = m64.q.astype(np.float64), m64.qd.astype(np.float64)
        assert np.abs(qa - qb).max() < 1e-4
        assert np.abs(qa - q64).max() <= np.abs(qb - q64).max() + 1e-6
        assert np.abs(a.motion.qd - b.motion.qd).max() < 5e-3  # q's differences / (2 dt)
        assert np.abs(a.motion.qd - qd64).max() <= np.abs(b.motion.qd - qd64).max() + 1e-4
    if dtype == np.float64:
        assert np.abs(a.motion.qd - b.motion.qd).max() < 1e-6
    assert np.array_equal(a.residual_angles, b.residual_angles)
    # the hinges' qd written by the native second pass: the public velocities() of the mapped q (float32 q: its
    # rounding / 2 dt)
    ulp_rate = 4 * np.finfo(np.float32).eps * np.abs(a.motion.q).max() * fps
    np.testing.assert_allclose(a.motion.qd, mapper.velocities(a.motion.q, fps), atol=ulp_rate)
    ma, mb = a.motion.metadata["mapper"], b.motion.metadata["mapper"]
    assert ma.keys() == mb.keys() and ma["rewrapped_frames"] == mb["rewrapped_frames"]
    assert ma["limit_violation_dofs"].keys() == mb["limit_violation_dofs"].keys()
    for dof, v in ma["limit_violation_dofs"].items():
        assert v == pytest.approx(mb["limit_violation_dofs"][dof], rel=1e-6, abs=1e-6), dof
    assert ma["limit_violation_max"] == pytest.approx(mb["limit_violation_max"], rel=1e-6)
    # and the body rotations are the generating motion's (q is stored in float32; angles up to ~40 rad)
    _, r0 = forward_kinematics(layout, q)
    _, r1 = forward_kinematics(layout, qa)
    assert R.quat_angle_between(r0, r1).max() < (1e-4 if dtype == np.float64 else 3e-4)


@needs_native
def test_native_path_refuses_zero_quaternions_of_kernel_and_other_bodies():
    layout = _layout("mjcf/protomotions/smpl_humanoid.xml")
    mapper = ArticulationMotionMapper(layout)
    st = mapper.to_skeleton_state(np.tile(layout.neutral(), (5000, 1)))
    for body in (0, 7):  # the root (checked in Python) and a triplet body (flagged by the kernel)
        local = np.array(st.local_rotation, copy=True)
        local[4200, body] = 0.0
        with pytest.raises(FormatError, match=f"frame 4200, body '{layout.body_names[body]}'"):
            mapper.to_articulation_motion(SkeletonMotion(mapper.skeleton_tree, st.root_translation, local, 30.0))


@needs_native
def test_native_kernels_are_kept_on_disk_and_the_cached_code_gives_the_same_angles(tmp_path, monkeypatch):
    from kangengine.animation import native_mapper
    from kangengine.animation.kinematics import native as _native

    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(tmp_path))
    args = (np.float64, 3, [0, 1, 2], [[0, 1, 2], [3, 4, 5], [6, 7, 8]], "zyx", (1.0, -1.0, 1.0), np.pi / 2, 1e-3)
    text = native_mapper.euler_block_ir(*args)
    key = _native.host_key("mapper-euler test", text)
    built = _native.compile_ir(lambda: text, key, "kernel")
    loaded = _native.compile_ir(lambda: pytest.fail("rebuilt instead of loaded"), key, "kernel")
    assert not built[2] and loaded[2] and list(tmp_path.rglob("*.o"))
    rng = np.random.default_rng(5)
    L = np.ascontiguousarray(R.quat_normalize(rng.normal(size=(500, 3, 4))))
    outs = []
    for engine, address, _ in (built, loaded):
        kern = native_mapper.EulerBlockKernel(engine, address, np.float64, 3, 3)
        q = np.zeros((500, 9))
        kern(L, q, np.zeros((500, 3)), np.zeros((500, 3), dtype=bool), np.zeros((6, 3)), False)
        outs.append(q)
    np.testing.assert_array_equal(outs[0], outs[1])
    # axes z, -y, x: intrinsic "zyx" Euler angles with the middle one negated (scipy, same input)
    want = Rotation.from_quat(L[..., [1, 2, 3, 0]].reshape(-1, 4)).as_euler("ZYX").reshape(500, 3, 3) * [1, -1, 1]
    lock = np.abs(np.abs(want[..., 1]) - np.pi / 2) < 1e-3
    assert np.abs(R.wrap_angle(outs[0].reshape(500, 3, 3) - want))[~lock].max() < 1e-10


def test_kernel_refuses_arrays_of_the_wrong_layout():
    from kangengine.animation import native_mapper

    kern = native_mapper.EulerBlockKernel.__new__(native_mapper.EulerBlockKernel)
    kern.dtype, kern.num_bodies, kern.k = np.dtype(np.float64), 3, 3
    L = np.zeros((10, 3, 4), dtype=np.float32)  # wrong dtype: never handed to the machine code
    with pytest.raises(ShapeError, match="EulerBlockKernel|expected C-contiguous"):
        kern(L, np.zeros((10, 9)), np.zeros((10, 3)), np.zeros((10, 3), dtype=bool), np.zeros((6, 3)), False)


# -- the fused native pass (native_mapper.fused_ir): q, qd and the summary's counters in one pass ------------


def _brute_force_limits(layout, q) -> dict:
    """``{dof name: (largest excess, share of frames over)}`` of every hinge of ``q [frames, nq]`` past its
    limits by more than 1e-6 rad, counted column by column (the reference of the limit summary)."""
    want = {}
    for b in layout.blocks:
        if b.joint_type is JointType.HINGE:
            col = q[:, b.q_offset]
            over = np.maximum(b.limits[0] - col, 0.0) + np.maximum(col - b.limits[1], 0.0)
            if over.max() > 1e-6:
                want[layout.dof_names[b.qd_offset]] = (over.max(), (over > 1e-6).mean())
    return want


def _smpl_fused(dtype=np.float64):
    layout = _layout("mjcf/protomotions/smpl_humanoid.xml", free_root=True)
    mapper = ArticulationMotionMapper(layout)
    assert mapper._native_fused(np.dtype(dtype)) is not None
    return layout, mapper


def _motion_of(mapper, q, fps, dtype):
    st = mapper.to_skeleton_state(q)
    return SkeletonMotion(mapper.skeleton_tree, st.root_translation.astype(dtype), st.local_rotation.astype(dtype), fps)


@needs_native
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [2, 3, 9, 17, 1030, 2061])
def test_fused_pass_root_eight_frames_per_vector_matches_numpy_at_every_length(dtype, n):
    """The fused pass walks the root 8 frames per vector between a scalar head (frames 0, 1) and a scalar tail
    (the rest of each 1024-frame call): at lengths that leave every kind of remainder, with the root quaternion's
    sign flipped at random frames (the output must be sign-continuous from ``w >= 0``), q and qd equal the numpy
    reference path's."""
    layout, mapper = _smpl_fused(dtype)
    fps = 30.0
    q = _turning_q(layout, n, fps, 5)
    motion = _motion_of(mapper, q, fps, dtype)
    local = np.array(motion.local_rotation)
    local[:, 0] *= np.where(np.random.default_rng(n).random(n) < 0.4, -1.0, 1.0)[:, None].astype(dtype)
    motion = SkeletonMotion(mapper.skeleton_tree, motion.root_translation, local, fps)
    a = mapper.to_articulation_motion(motion).motion
    mapper.use_native = False
    b = mapper.to_articulation_motion(motion).motion
    mapper.use_native = True
    quat = a.q[:, 3:7].astype(np.float64)
    assert quat[0, 0] >= 0 and (np.sum(quat[1:] * quat[:-1], axis=-1) >= 0).all()  # sign-continuous
    tol = 1e-9 if dtype == np.float64 else 5e-5
    np.testing.assert_allclose(a.q.astype(np.float64), b.q, atol=tol)
    np.testing.assert_allclose(a.qd[:, :6].astype(np.float64), b.qd[:, :6], atol=tol * fps)  # the root's rates


@needs_native
@pytest.mark.parametrize("n", [3, 4, 5, 6, 1027, 1028, 2049])
def test_fused_pass_two_frames_per_vector_match_numpy_at_every_length(n):
    """Float32: the last chunk of bodies (7 here: the left wrist to the right hand) goes two frames per 16-lane
    vector from frame 2 on, what one frame passes to the next taken across the halves. At lengths that leave an
    odd or even frame after each 1024-frame call, no frame near gimbal lock (the kernel's own angles throughout),
    in that chunk: crossings every third frame (both parities), outer angles turning every few frames, the
    right elbow beyond pi/2 (the clip wants its other track: placed again), a hinge swinging past its limits;
    q, qd and the limit summary against the numpy path, the body rotations against the generating ones."""
    layout, mapper = _smpl_fused(np.float32)
    assert len(mapper._groups[0].bodies) % 16 == 7
    fps = 30.0
    t = np.arange(n) / fps
    rng = np.random.default_rng(n)
    q = np.tile(layout.neutral(), (n, 1))
    q[:, 0:3] = np.stack([np.sin(t), 0.8 * t, 0.9 + 0.05 * np.cos(3 * t)], axis=-1)
    q[:, 3:7] = R.quat_from_rotvec(np.outer(t, [0.1, -0.2, 1.1]))
    for b in range(1, layout.num_bodies):
        blocks = _hinge_blocks(layout, b)
        for i, blk in enumerate(blocks):
            amp = 1.2 if i == 1 else 2.5
            q[:, blk.q_offset] = amp * np.sin(rng.uniform(0.3, 1.0) * t + rng.uniform(0, 6))
    elbow = [x.q_offset for x in _hinge_blocks(layout, layout.body_index("R_Elbow"))]
    q[:, elbow[1]] = 1.9 + 0.1 * np.sin(t)  # branch 1 all along: the clip's cheaper track starts there
    q[:, elbow[0]] = 0.5 * np.sin(2 * t)
    q[:, elbow[2]] = 0.4 * np.cos(3 * t)
    f = np.arange(n)
    hand = [x.q_offset for x in _hinge_blocks(layout, layout.body_index("L_Hand"))]
    q[:, hand[1]] = np.where(f % 6 < 3, 1.3, 1.85) + 0.01 * np.sin(t)  # across pi/2 every third frame
    wrist = [x.q_offset for x in _hinge_blocks(layout, layout.body_index("R_Wrist"))]
    q[:, wrist[0]] = 0.9 * f  # a turn every seventh frame or so
    q[:, wrist[2]] = -0.7 * f
    q[:, wrist[1]] = 1.3 * np.sin(0.9 * t)
    motion = _motion_of(mapper, q, fps, np.float32)
    passes = []
    run = mapper._fused_pass
    mapper._fused_pass = lambda *a: passes.append(len(run(*a))) or set()
    try:
        out = mapper.to_articulation_motion(motion)
    finally:
        del mapper._fused_pass
    assert passes == [0, 0]  # placed again with the elbow's other track; no block left to numpy
    mapper.use_native = False
    ref = mapper.to_articulation_motion(motion)
    mapper.use_native = True
    got = out.motion.q.astype(np.float64)
    # angles up to 1800 rad: numpy rounds each float32 step of its unwrapping, the kernel rounds once; both
    # against the float64 mapping
    m64 = mapper.to_articulation_motion(_motion_of(mapper, q, fps, np.float64)).motion
    assert np.abs(got - m64.q).max() <= np.abs(ref.motion.q - m64.q).max() + 1e-6
    assert np.abs(got - ref.motion.q).max() < 2e-4
    assert np.abs(out.motion.qd - m64.qd).max() <= np.abs(ref.motion.qd - m64.qd).max() + 1e-4
    ulp_rate = 4 * np.finfo(np.float32).eps * np.abs(out.motion.q).max() * fps
    np.testing.assert_allclose(out.motion.qd, mapper.velocities(out.motion.q, fps), atol=ulp_rate)
    assert np.abs(got[:, elbow] - q[:, elbow]).max() < 2e-6  # the elbow's generating branch: its other track
    _, r0 = forward_kinematics(layout, q)
    _, r1 = forward_kinematics(layout, got)
    assert R.quat_angle_between(r0, r1).max() < 3e-4  # the generating rotations (q in float32, up to 40 rad)
    ma, mb = out.motion.metadata["mapper"], ref.motion.metadata["mapper"]
    assert ma["limit_violation_dofs"].keys() == mb["limit_violation_dofs"].keys()
    for dof, v in ma["limit_violation_dofs"].items():
        assert v == pytest.approx(mb["limit_violation_dofs"][dof], rel=1e-6, abs=1e-6), dof
    want = _brute_force_limits(layout, got)
    assert set(ma["limit_violation_dofs"]) == set(sorted(want, key=lambda k: -want[k][0])[:10])


@needs_native
@pytest.mark.filterwarnings("ignore:Gimbal lock detected")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_pass_takes_the_cheaper_track_redoes_gimbal_blocks_and_counts_limits(dtype):
    """Cases the fused pass hands on or redoes: a body whose middle angle stays beyond pi/2 (the clip's first
    frame starts the cheaper track on branch 1: the clip is placed again with that choice), gimbal lock in the
    first and a later block (numpy's angles placed by the kernel's second entry), hinges that wind (a 2 pi shift
    into the limits, their summary columns counted again). Against the generating q, scipy's Euler angles, the
    numpy path, and a brute-force limit count over the returned q."""
    layout, mapper = _smpl_fused(dtype)
    fps, n = 30.0, 10000
    t = np.arange(n) / fps
    rng = np.random.default_rng(7)
    q = np.tile(layout.neutral(), (n, 1))
    q[:, 0:3] = np.stack([0.5 * t, np.sin(t), 0.9 + 0.0 * t], axis=-1)
    q[:, 3:7] = R.quat_from_rotvec(np.outer(np.sin(0.3 * t), [0.2, 0.1, 1.5]))
    for b in range(1, layout.num_bodies):
        h = _hinge_blocks(layout, b)
        for blk in h:
            q[:, blk.q_offset] = rng.uniform(0.2, 0.5) * np.sin(rng.uniform(0.2, 1.5) * t + rng.uniform(0, 6))
    elbow = [x.q_offset for x in _hinge_blocks(layout, layout.body_index("L_Elbow"))]
    q[:, elbow[1]] = 1.9 + 0.1 * np.sin(t)  # beyond pi/2 all the time: branch 1 of the Euler angles
    wrist = [x.q_offset for x in _hinge_blocks(layout, layout.body_index("R_Wrist"))]
    q[:, wrist[0]] = 0.004 * np.arange(n)  # winds about 6 turns: leaves its +-pi limits
    shoulder = [x.q_offset for x in _hinge_blocks(layout, layout.body_index("R_Shoulder"))]
    q[[100, 7000], shoulder[1]] = np.pi / 2  # gimbal lock in the first block and in a later one
    motion = _motion_of(mapper, q, fps, dtype)
    passes = []
    run = mapper._fused_pass
    mapper._fused_pass = lambda *a: passes.append(len(run(*a))) or set(passes)
    try:
        out = mapper.to_articulation_motion(motion)
    finally:
        del mapper._fused_pass
    assert len(passes) == 2 and passes[0] == 2  # placed again with the elbow's track; two blocks from numpy
    got = out.motion.q.astype(np.float64)
    # the elbow comes back on its own branch (the cheaper track), the root and the other triplets as generated
    # (q is stored in float32; at the two gimbal-lock frames only the sum of the shoulder's outer angles counts)
    keep = np.ones(layout.nq, dtype=bool)
    keep[wrist[0]] = False
    err = np.abs(got - q) / np.maximum(np.abs(q), 1.0)  # the root walks 170 m
    err[[100, 7000]] = 0.0
    assert err[:, keep].max() < 2e-6
    sum_err = got[[100, 7000], shoulder[0]] + got[[100, 7000], shoulder[2]] - q[[100, 7000], shoulder[0]]
    assert np.abs(R.wrap_angle(sum_err - q[[100, 7000], shoulder[2]])).max() < 1e-4
    # the winding hinge: the generating series less whole turns (a constant shift into the limits)
    turns = (got[:, wrist[0]] - q[:, wrist[0]]) / (2 * np.pi)
    assert np.abs(turns - np.rint(turns[0])).max() < 1e-5 and np.rint(turns[0]) != 0
    # scipy's intrinsic XYZ Euler angles of every triplet (the elbow on the other branch)
    L = np.asarray(motion.local_rotation, dtype=np.float64)
    (g,) = mapper._groups
    euler = Rotation.from_quat(L[:, g.bodies][..., [1, 2, 3, 0]].reshape(-1, 4)).as_euler("XYZ").reshape(n, -1, 3)
    mine = got[:, mapper._hinge_q[g.hinge_cols]]
    ok = np.abs(np.abs(euler[..., 1]) - np.pi / 2) > 1e-3
    e = layout.body_index("L_Elbow") - 1
    alt = euler[:, e] + [np.pi, 0.0, np.pi]
    alt[:, 1] = np.pi - euler[:, e, 1]
    euler[:, e] = alt
    assert np.abs(R.wrap_angle(mine - euler))[ok].max() < 5e-6  # q is stored in float32 (up to 40 rad here)
    # the numpy reference path
    mapper.use_native = False
    ref = mapper.to_articulation_motion(motion)
    mapper.use_native = True
    np.testing.assert_allclose(got, ref.motion.q, atol=1e-9 if dtype == np.float64 else 5e-5)
    np.testing.assert_allclose(out.motion.qd, ref.motion.qd, atol=1e-6 if dtype == np.float64 else 5e-3)
    # qd: the public velocities of the returned q (central differences, root angular velocity in world)
    ulp_rate = 4 * np.finfo(np.float32).eps * np.abs(out.motion.q).max() * fps
    np.testing.assert_allclose(out.motion.qd, mapper.velocities(out.motion.q, fps), atol=ulp_rate)
    # the limit summary against a brute-force count over the returned q
    summary = out.motion.metadata["mapper"]
    want = _brute_force_limits(layout, got)
    assert want and set(summary["limit_violation_dofs"]) == set(sorted(want, key=lambda k: -want[k][0])[:10])
    for name, v in summary["limit_violation_dofs"].items():
        # counted on q before its float32 storage
        assert v["max"] == pytest.approx(want[name][0], abs=5e-6) and v["fraction"] == pytest.approx(
            want[name][1], abs=2 / n
        )
    assert (
        summary == ref.motion.metadata["mapper"]
        or dtype == np.float32
        or all(summary[k] == pytest.approx(ref.motion.metadata["mapper"][k]) for k in ("limit_violation_max",))
    )
    assert summary["max_residual_angle"] == 0.0 and not out.residual_angles.any()


@needs_native
def test_fused_pass_limit_counters_match_a_brute_force_count_without_shifts():
    """A clip inside +-pi except a few hinges swinging past pi and back (no 2 pi shift: the kernel's own
    counters are the summary) against a brute-force count over the returned q (float32: the kernel counts the
    stored values)."""
    layout, mapper = _smpl_fused(np.float32)
    fps, n = 60.0, 9000
    t = np.arange(n) / fps
    q = np.tile(layout.neutral(), (n, 1))
    hinges = [b for b in layout.blocks if b.joint_type is JointType.HINGE]
    outer = [b for b in hinges if not b.joint_name.endswith("_y")]  # x and z: the outer angles of each triplet
    for i, b in enumerate(outer):
        q[:, b.q_offset] = (3.3 if i % 5 == 0 else 1.0) * np.sin(0.4 * t + i)
    for b in hinges:
        if b.joint_name.endswith("_y"):
            q[:, b.q_offset] = 0.3 * np.sin(0.9 * t)
    out = mapper.to_articulation_motion(_motion_of(mapper, q, fps, np.float32))
    got = out.motion.q.astype(np.float64)
    assert np.abs(got - q).max() < 2e-6  # no shift needed: the generating series itself
    summary = out.motion.metadata["mapper"]
    want = {}
    for b in hinges:
        col = got[:, b.q_offset]
        over = np.maximum(b.limits[0] - col, 0.0) + np.maximum(col - b.limits[1], 0.0)
        if over.max() > 1e-6:
            want[layout.dof_names[b.qd_offset]] = (over.max(), (over > 1e-6).mean())
    assert len(want) >= 5 and set(summary["limit_violation_dofs"]) == set(want)
    for name, v in summary["limit_violation_dofs"].items():
        assert v["max"] == pytest.approx(want[name][0], abs=1e-12) and v["fraction"] == want[name][1]
    assert summary["limit_violation_max"] == pytest.approx(max(v[0] for v in want.values()), abs=1e-12)


@needs_native
@pytest.mark.parametrize("where", ["root", "triplet", "translation"])
def test_fused_pass_refuses_non_finite_input(where):
    """Unchecked input (``skip_checks=True``) with a NaN: the fused pass's counters refuse the result with the
    NonFiniteError ArticulationMotion raises, as the numpy path does."""
    from kangengine.errors import NonFiniteError

    layout, mapper = _smpl_fused()
    st = mapper.to_skeleton_state(np.tile(layout.neutral(), (5000, 1)))
    local, root = np.array(st.local_rotation, copy=True), np.array(st.root_translation, copy=True)
    if where == "translation":
        root[4100, 1] = np.nan
    else:
        local[4100, 0 if where == "root" else 5, 2] = np.nan
    motion = SkeletonMotion(mapper.skeleton_tree, root, local, 30.0, skip_checks=True)
    for native in (True, False):  # (numpy's unwrapping spreads a NaN angle over the whole column)
        mapper.use_native = native
        with pytest.raises(NonFiniteError, match="frame 4100" if native else "non-finite"):
            mapper.to_articulation_motion(motion)


@needs_native
def test_fused_kernel_is_kept_on_disk_and_refuses_wrong_arrays(tmp_path, monkeypatch):
    """The fused pair loaded from the disk cache (both entry points) gives the same q and qd as the one just
    built; arrays of another layout never reach the machine code."""
    from kangengine.animation import native_mapper
    from kangengine.animation.kinematics import native as _native

    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(tmp_path))
    layout, mapper = _smpl_fused()
    text = native_mapper.fused_ir(np.float64, **mapper._fused_spec)
    key = _native.host_key("mapper-fused test", text)
    built = _native.compile_ir(lambda: text, key, "fused0")
    loaded = _native.compile_ir(lambda: pytest.fail("rebuilt instead of loaded"), key, "fused0")
    assert not built[2] and loaded[2] and list(tmp_path.rglob("*.o"))
    q = _turning_q(layout, 600, 60.0, 3)
    middle = [x.q_offset for b in range(1, layout.num_bodies) for x in _hinge_blocks(layout, b)[1:2]]
    q[:, middle] *= 0.7  # away from gimbal lock (which the kernel leaves to numpy)
    motion = _motion_of(mapper, q, 60.0, np.float64)
    L, rt = np.ascontiguousarray(motion.local_rotation), np.ascontiguousarray(motion.root_translation)
    outs = []
    for engine, address, _ in (built, loaded):
        kern = native_mapper.FusedKernel(
            engine, (address, engine.get_function_address("fused1")), np.float64, 24, 23, layout.nq, layout.nv
        )
        q, qd = np.zeros((600, layout.nq)), np.zeros((600, layout.nv))
        flip = np.zeros(23, dtype=bool)
        for _ in range(2):  # the second time on the cheaper track of each body (as the mapper does)
            state = kern.new_state()
            run = kern.bind(L, rt, q, qd, flip, state, 60.0)
            assert run(0, 300, 0) == 0 and run(300, 600, 0) == 0
            flip = kern.body(state, "diff") < 0
        outs.append((q, qd, state))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
    # float64 q of the kernel against scipy's intrinsic XYZ Euler angles: the track is continuous, so each frame
    # is on scipy's branch or the other one ((t1 + pi, pi - t2, t3 + pi)), up to whole turns
    (g,) = mapper._groups
    scipy = Rotation.from_quat(L[:, g.bodies][..., [1, 2, 3, 0]].reshape(-1, 4)).as_euler("XYZ").reshape(600, -1, 3)
    other = scipy + [np.pi, 0.0, np.pi]
    other[..., 1] = np.pi - scipy[..., 1]
    mine = outs[0][0][:, mapper._hinge_q[g.hinge_cols]]
    d = np.minimum(np.abs(R.wrap_angle(mine - scipy)).max(-1), np.abs(R.wrap_angle(mine - other)).max(-1))
    assert d.max() < 1e-9
    want = mapper.to_articulation_motion(motion).motion
    ulp_rate = 4 * np.finfo(np.float32).eps * np.abs(want.q).max() * 60.0  # the motion stores q in float32
    np.testing.assert_allclose(outs[0][1][1:-1], want.qd[1:-1], atol=ulp_rate)
    with pytest.raises(ShapeError, match="FusedKernel"):
        kern.bind(L.astype(np.float32), rt, q, qd, np.zeros(23, dtype=bool), state, 60.0)
    with pytest.raises(ShapeError, match="FusedKernel"):
        kern.bind(L, rt, q[:, :-1], qd, np.zeros(23, dtype=bool), state, 60.0)
    with pytest.raises(ShapeError, match="FusedKernel"):
        kern.bind(L, rt, q, qd, np.zeros(23, dtype=bool), state, 60.0)(0, 601, 0)
    # the runner keeps what it was bound to alive (the machine code writes the state through its address)
    import gc
    import weakref

    temp = kern.new_state()
    alive = weakref.ref(temp)
    run = kern.bind(L, rt, q, qd, np.zeros(23, dtype=bool), temp, 60.0)
    del temp
    gc.collect()
    assert alive() is not None and run(0, 300, 0) == 0 and np.isfinite(alive()).any()
    del run
    gc.collect()
    assert alive() is None


@needs_native
def test_fused_pass_shortcuts_with_offset_limits_and_reference_angles(tmp_path):
    """The fused pass's float32 shortcut (no turn so far: the placed value ``t + ref`` in float32, the limit count
    skipped only where ``[-pi, pi] + ref`` lies within the limits) on a humanoid where a knee and a wrist have
    limits ``[-2, 2 pi - 2]`` (angles below -2 rad count) and a hip and an elbow have reference angles (``ref =
    0.5``, a float32, in the first chunk of 16 bodies; ``0.3``, not one, in the second: that chunk always rounds
    in float64), with swings past the limits and no turns (every frame takes the shortcut where it may):
    q against the numpy reference path, the float64 mapping and the generating rotations; the limit summary
    against a brute-force count over the returned q."""
    import re

    text = data_file("mjcf/protomotions/smpl_humanoid.xml").read_text()
    text = text.replace('<compiler coordinate="local" />', '<compiler coordinate="local" angle="radian" />')
    text = re.sub(r'range="-180\.0000 180\.0000"', f'range="{-np.pi!r} {np.pi!r}"', text)
    for name, extra in (("L_Knee_x", None), ("R_Wrist_z", None), ("L_Hip_x", "0.5"), ("R_Elbow_y", "0.3")):
        pattern = f'(<joint name="{name}" [^>]*?)range="[^"]*"'
        new = f'range="-2.0 {2 * np.pi - 2.0!r}"' if extra is None else f'ref="{extra}" range="{-np.pi!r} {np.pi!r}"'
        text, count = re.subn(pattern, lambda m, new=new: m.group(1) + new, text)
        assert count == 1, name
    path = tmp_path / "smpl_offset_limits.xml"
    path.write_text(text)
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(path), free_root=True)
    mapper = ArticulationMotionMapper(layout)
    assert mapper._native_fused(np.dtype(np.float32)) is not None
    refs = mapper._fused_spec["refs"]
    assert sorted(set(np.round(refs.ravel(), 6))) == [0.0, 0.3, 0.5]
    fps, n = 30.0, 5000
    t = np.arange(n) / fps
    rng = np.random.default_rng(4)
    q = np.tile(layout.neutral(), (n, 1))
    q[:, 0:3] = np.stack([np.sin(t), 0.8 * t, 0.9 + 0.05 * np.cos(3 * t)], axis=-1)
    q[:, 3:7] = R.quat_from_rotvec(np.outer(np.sin(0.2 * t), [0.1, -0.2, 1.1]))
    for b in layout.blocks:  # no turns: the shortcut's frames throughout
        if b.joint_type is JointType.HINGE:
            q[:, b.q_offset] = rng.uniform(0.2, 0.6) * np.sin(rng.uniform(0.3, 1.5) * t + rng.uniform(0, 6))
    for name, swing, ref in (
        ("L_Knee_x", 2.7, 0.0),
        ("R_Wrist_z", 2.4, 0.0),
        ("L_Hip_x", 2.9, 0.5),
        ("R_Elbow_y", 1.2, 0.3),
    ):
        q[:, layout.blocks[layout.joint_names.index(name)].q_offset] = ref + swing * np.sin(0.7 * t + 1.0)
    motion = _motion_of(mapper, q, fps, np.float32)
    out = mapper.to_articulation_motion(motion).motion
    mapper.use_native = False
    ref = mapper.to_articulation_motion(motion).motion
    mapper.use_native = True
    m64 = mapper.to_articulation_motion(_motion_of(mapper, q, fps, np.float64)).motion
    got = out.q.astype(np.float64)
    assert np.abs(got - ref.q).max() < 1e-4
    assert np.abs(got - m64.q).max() <= np.abs(ref.q - m64.q).max() + 1e-6  # as close to the float64 mapping
    _, r0 = forward_kinematics(layout, q)
    _, r1 = forward_kinematics(layout, got)
    assert R.quat_angle_between(r0, r1).max() < 3e-4
    summary = out.metadata["mapper"]
    want = _brute_force_limits(layout, got)
    assert {"L_Knee_x", "R_Wrist_z", "L_Hip_x"} <= set(want)
    assert set(summary["limit_violation_dofs"]) == set(sorted(want, key=lambda k: -want[k][0])[:10])
    for name, v in summary["limit_violation_dofs"].items():
        assert v["max"] == pytest.approx(want[name][0], abs=1e-12) and v["fraction"] == want[name][1]
    assert summary["limit_violation_dofs"].keys() == ref.metadata["mapper"]["limit_violation_dofs"].keys()


def _cmu_crop_on_robot(layout, seconds: float, start: int):
    """A real CMU walk crop (BVH, resampled to 30 fps as ``convert`` does) retargeted onto the CMU humanoid."""
    import kangengine as ke

    source = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    n = int(round(seconds * source.fps))
    crop = SkeletonMotion(
        source.tree,
        source.root_translation[start : start + n],
        source.local_rotation[start : start + n],
        source.fps,
    ).resample(30.0)
    return ke.retarget.retarget_motion(crop, "cmu_bvh_to_cmu_humanoid").motion


def _same_mapping(a: MappingResult, b: MappingResult):
    """Bit for bit: q, qd, residuals, clamping amounts and the mapper's summary."""
    for x, y in [(a.motion.q, b.motion.q), (a.motion.qd, b.motion.qd), (a.residual_angles, b.residual_angles)]:
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert np.array_equal(a.clamped, b.clamped)
    assert a.motion.metadata["mapper"] == b.motion.metadata["mapper"]


def test_per_mapper_caches_give_the_results_of_a_fresh_mapper_and_are_not_shared():
    """The mapper keeps layout constants and the skeletons that passed its checks between calls: a second,
    third call (short clips and long, float32 and float64, clamped or not, interleaved with another layout's
    mapper) gives exactly what a fresh mapper gives on its first call, and each layout's mapper keeps its own."""
    from kangengine.data import data_path

    desc = MJCFLoader.load(data_path("humanoid_CMU.xml"))
    free = ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    fixed = ArticulationCoordinateLayout.from_data(data=desc, free_root=False)
    assert free.model_signature != fixed.model_signature
    kept = {lay.model_signature: ArticulationMotionMapper(lay) for lay in (free, fixed)}
    clips = [_cmu_crop_on_robot(free, s, start) for s, start in [(1.0, 0), (2.5, 60)]]
    clips.append(SkeletonMotion(clips[0].tree, clips[0].root_translation.astype(np.float64),
                                clips[0].local_rotation.astype(np.float64), clips[0].fps))  # fmt: skip
    for _ in range(2):
        for clip in clips:
            for lay in (free, fixed):
                for clamp in (False, True):
                    got = kept[lay.model_signature].to_articulation_motion(clip, clamp_to_limits=clamp)
                    want = ArticulationMotionMapper(lay).to_articulation_motion(clip, clamp_to_limits=clamp)
                    _same_mapping(got, want)
                    assert got.motion.q.shape == (clip.local_rotation.shape[0], lay.nq)
    a, b = kept.values()
    assert a._trees_ok is not b._trees_ok and a._summary_plan is not b._summary_plan


def test_checked_skeletons_are_remembered_by_content_not_identity():
    """After a skeleton passed the checks, one with other offsets still warns (every time) and one with other
    parents is still refused."""
    from kangengine.data import data_path

    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_path("humanoid_CMU.xml")))
    mapper = ArticulationMotionMapper(layout)
    clip = _cmu_crop_on_robot(layout, 1.0, 0)
    own = SkeletonTree(clip.tree.node_names, clip.tree.parent_indices, clip.tree.local_translation.copy())

    def on(tree):
        return SkeletonMotion(tree, clip.root_translation, clip.local_rotation, clip.fps)

    with warnings.catch_warnings():
        warnings.simplefilter("error", SkeletonOffsetWarning)
        first = mapper.to_articulation_motion(on(own))
        again = mapper.to_articulation_motion(on(own))
    _same_mapping(first, again)
    scaled = SkeletonTree(own.node_names, own.parent_indices, own.local_translation * 1.3)
    for _ in range(2):  # not remembered after a warning
        with pytest.warns(SkeletonOffsetWarning):
            _same_mapping(mapper.to_articulation_motion(on(scaled)), first)
    other_parent = np.array(own.parent_indices)
    other_parent[-1] = 0
    with pytest.raises(LayoutMismatch, match="parents"):
        mapper.to_articulation_motion(on(SkeletonTree(own.node_names, other_parent, own.local_translation)))
    assert not own.local_translation.flags.writeable  # a tree cannot change under its remembered contents


@pytest.mark.parametrize("n", [2, 3, 30, 75, 4097])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_velocities_of_short_and_long_clips_are_layout_differences_bit_for_bit(n, dtype):
    """``velocities`` (one pass over all rows for clips of one block, the block loop beyond) equals
    ``layout.difference`` of the rows two apart over ``2 dt`` inside and one apart over ``dt`` at the ends,
    exactly."""
    from kangengine.data import data_path

    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_path("humanoid_CMU.xml")))
    mapper = ArticulationMotionMapper(layout)
    q = _turning_q(layout, n, 30.0, seed=n).astype(dtype)
    dt = 1.0 / 30.0
    want = np.empty((n, layout.nv), dtype=dtype)
    want[0] = layout.difference(q[1], q[0], dt)
    want[-1] = layout.difference(q[-1], q[-2], dt)
    if n > 2:
        want[1:-1] = layout.difference(q[2:], q[:-2], 2.0 * dt)
    got = mapper.velocities(q, 30.0)
    assert got.dtype == dtype and np.array_equal(got, want)
