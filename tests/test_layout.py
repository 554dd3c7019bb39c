"""Coordinate layout, forward kinematics and the manifold maps, against MuJoCo."""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest
import torch
from conftest import MJCF_COMPILABLE, data_file

from kangengine import rotations as R
from kangengine.animation import ArticulationCoordinateLayout, SkeletonState, SkeletonTree, forward_kinematics
from kangengine.asset import JointType, MJCFLoader, URDFLoader
from kangengine.errors import ShapeError, UnknownNameError


def _has_free(desc):
    return any(j.type is JointType.FREE for j in desc.joints)


def _random_q(layout, m, rng, n):
    """Random q inside the joint limits (hinge/slide), random unit quaternions for free/ball."""
    q = np.tile(m.qpos0, (n, 1)).astype(np.float64)
    for b in layout.blocks:
        s = b.q_slice
        if b.q_dim == 0:
            continue
        if b.joint_type is JointType.FREE:
            q[:, s.start : s.start + 3] = rng.normal(size=(n, 3))
            q[:, s.start + 3 : s.stop] = R.quat_normalize(rng.normal(size=(n, 4)))
        elif b.joint_type is JointType.BALL:
            q[:, s] = R.quat_normalize(rng.normal(size=(n, 4)))
        elif b.limits is not None:
            q[:, s.start] = rng.uniform(b.limits[0], b.limits[1], size=n)
        else:
            q[:, s.start] = rng.uniform(-np.pi, np.pi, size=n)
    return q


def _mujoco_fk(m, q):
    d = mujoco.MjData(m)
    xpos = np.empty((len(q), m.nbody - 1, 3))
    xquat = np.empty((len(q), m.nbody - 1, 4))
    for i, qi in enumerate(q):
        d.qpos[:] = qi
        mujoco.mj_kinematics(m, d)
        xpos[i], xquat[i] = d.xpos[1:], d.xquat[1:]
    return xpos, xquat


def _assert_same_rotations(a, b, atol):
    dots = np.abs(np.sum(np.asarray(a) * np.asarray(b), axis=-1))
    assert np.all(np.abs(dots - 1) < atol), np.max(np.abs(dots - 1))


@pytest.mark.parametrize("rel", MJCF_COMPILABLE)
def test_forward_kinematics_matches_mujoco(rel):
    path = data_file(rel)
    desc = MJCFLoader.load(path)
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=_has_free(desc))
    m = mujoco.MjModel.from_xml_path(str(path))
    assert (layout.nq, layout.nv) == (m.nq, m.nv)
    np.testing.assert_allclose(layout.neutral(), m.qpos0, atol=1e-12)
    q = _random_q(layout, m, np.random.default_rng(1), 16)
    xpos, xquat = _mujoco_fk(m, q)
    pos, rot = forward_kinematics(layout, q)
    np.testing.assert_allclose(pos, xpos, atol=1e-9)
    _assert_same_rotations(rot, xquat, 1e-9)
    # torch path, float64, same implementation
    tp, tr = forward_kinematics(layout, torch.as_tensor(q))
    assert tp.dtype == torch.float64
    np.testing.assert_allclose(tp.numpy(), xpos, atol=1e-9)
    # float32 keeps float32
    p32, _ = forward_kinematics(layout, q.astype(np.float32))
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, xpos, atol=2e-5)
    # the same through a skeleton of the articulation's bodies
    tree = SkeletonTree.from_articulation(desc)
    lp, lr = layout.local_transforms(q)
    state = SkeletonState(tree, lp[:, 0], lr, lp)
    np.testing.assert_allclose(state.global_translation, xpos, atol=1e-9)
    _assert_same_rotations(state.global_rotation, xquat, 1e-9)


def test_forward_kinematics_large_batch_chunks_and_leading_dims():
    desc = MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    layout = ArticulationCoordinateLayout.from_data(data=desc)
    m = mujoco.MjModel.from_xml_path(str(data_file("mjcf/protomotions/smpl_humanoid.xml")))
    q = _random_q(layout, m, np.random.default_rng(2), 3 * 8192 + 17)
    pos, rot = forward_kinematics(layout, q)
    idx = [0, 8191, 8192, 20000, len(q) - 1]
    xpos, xquat = _mujoco_fk(m, q[idx])
    np.testing.assert_allclose(pos[idx], xpos, atol=1e-9)
    p2, _ = forward_kinematics(layout, q[:24].reshape(2, 3, 4, layout.nq))
    assert p2.shape == (2, 3, 4, layout.num_bodies, 3)
    np.testing.assert_allclose(p2.reshape(24, -1, 3), pos[:24])


def test_urdf_forward_kinematics_matches_mujoco_compile():
    path = data_file("urdf/unitree/g1_29dof.nomesh.urdf")
    desc = URDFLoader.load(path)
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=False)
    spec = mujoco.MjSpec.from_file(str(path))
    spec.compiler.fusestatic = False
    m = spec.compile()
    assert layout.nq == m.nq == 29
    assert [b.joint_name for b in layout.blocks if b.q_dim] == [m.joint(j).name for j in range(m.njnt)]
    q = _random_q(layout, m, np.random.default_rng(3), 10)
    xpos, xquat = _mujoco_fk(m, q)
    pos, rot = forward_kinematics(layout, q)
    np.testing.assert_allclose(pos, xpos, atol=1e-9)
    _assert_same_rotations(rot, xquat, 1e-9)


def test_bfs_and_dfs_give_the_same_body_poses():
    path = data_file("mjcf/dm_control/humanoid_CMU.xml")
    dfs = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(path, order="DFS"))
    bfs = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(path, order="BFS"))
    assert dfs.model_signature != bfs.model_signature  # order is part of the signature
    m = mujoco.MjModel.from_xml_path(str(path))
    q_dfs = _random_q(dfs, m, np.random.default_rng(4), 5)
    q_bfs = np.empty_like(q_dfs)
    for b in bfs.blocks:  # move each joint's values to its BFS offset
        q_bfs[:, b.q_slice] = q_dfs[:, dfs.block(b.joint_name).q_slice]
    p_dfs, _ = forward_kinematics(dfs, q_dfs)
    p_bfs, _ = forward_kinematics(bfs, q_bfs)
    perm = [dfs.body_index(n) for n in bfs.body_names]
    np.testing.assert_allclose(p_bfs, p_dfs[:, perm], atol=1e-12)


def _canonical_to_mujoco_qvel(layout, q, qd):
    """Canonical qd (world / parent-frame angular velocity) to MuJoCo qvel (local angular velocity)."""
    out = np.array(qd, copy=True)
    for b in layout.blocks:
        if b.joint_type is JointType.FREE:
            quat = q[..., b.q_offset + 3 : b.q_offset + 7]
            out[..., b.qd_offset + 3 : b.qd_offset + 6] = R.quat_rotate_inverse(
                quat, qd[..., b.qd_offset + 3 : b.qd_offset + 6]
            )
        elif b.joint_type is JointType.BALL:
            quat = q[..., b.q_slice]
            out[..., b.qd_slice] = R.quat_rotate_inverse(quat, qd[..., b.qd_slice])
    return out


@pytest.mark.parametrize(
    "rel",
    [
        "mjcf/mujoco/humanoid.xml",
        "mjcf/dm_control/model_with_ball_joints.xml",
        "mjcf/dm_control/cartpole.xml",
        "mjcf/unitree/g1_29dof.nomesh.xml",
    ],
)
def test_integrate_and_difference_match_mujoco(rel):
    path = data_file(rel)
    desc = MJCFLoader.load(path)
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=_has_free(desc))
    m = mujoco.MjModel.from_xml_path(str(path))
    rng = np.random.default_rng(5)
    q = _random_q(layout, m, rng, 8)
    qd = rng.normal(size=(8, layout.nv))
    dt = 0.037
    ours = layout.integrate(q, qd, dt)
    qvel = _canonical_to_mujoco_qvel(layout, q, qd)
    for i in range(len(q)):
        qpos = q[i].copy()
        mujoco.mj_integratePos(m, qpos, qvel[i], dt)
        for b in layout.blocks:  # quaternion sign is free
            s = b.q_slice
            if b.joint_type is JointType.BALL or b.joint_type is JointType.FREE:
                qs = slice(s.stop - 4, s.stop)
                if np.dot(qpos[qs], ours[i, qs]) < 0:
                    qpos[qs] *= -1
        np.testing.assert_allclose(ours[i], qpos, atol=1e-12)
        # MuJoCo's difference of the two configurations, converted back to canonical
        qv = np.empty(m.nv)
        mujoco.mj_differentiatePos(m, qv, dt, q[i], ours[i])
        np.testing.assert_allclose(qv, qvel[i], atol=1e-9)
    back = layout.difference(ours, q, dt)
    np.testing.assert_allclose(back, qd, atol=1e-9)
    # torch path
    back_t = layout.difference(torch.as_tensor(ours), torch.as_tensor(q), dt)
    np.testing.assert_allclose(back_t.numpy(), qd, atol=1e-9)
    fwd_t = layout.integrate(torch.as_tensor(q), torch.as_tensor(qd), dt)
    np.testing.assert_allclose(fwd_t.numpy(), ours, atol=1e-12)


def test_integrate_difference_round_trip_and_per_frame_dt():
    path = data_file("mjcf/dm_control/model_with_ball_joints.xml")
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(path), free_root=True)
    rng = np.random.default_rng(6)
    q0 = np.concatenate(
        [
            rng.normal(size=(20, 3)),
            R.quat_normalize(rng.normal(size=(20, 4))),
            R.quat_normalize(rng.normal(size=(20, 4))),
            R.quat_normalize(rng.normal(size=(20, 4))),
        ],
        1,
    )
    q1 = np.concatenate(
        [
            rng.normal(size=(20, 3)),
            R.quat_normalize(rng.normal(size=(20, 4))),
            R.quat_normalize(rng.normal(size=(20, 4))),
            R.quat_normalize(rng.normal(size=(20, 4))),
        ],
        1,
    )
    dt = rng.uniform(0.01, 0.1, size=20)
    qd = layout.difference(q1, q0, dt)
    q1b = layout.integrate(q0, qd, dt)
    for b in layout.blocks:
        s = slice(b.q_slice.stop - 4, b.q_slice.stop)
        _assert_same_rotations(q1b[:, s], q1[:, s], 1e-12)
    np.testing.assert_allclose(q1b[:, :3], q1[:, :3], atol=1e-12)


def test_canonical_tangent_convention_is_world_angular_velocity():
    """A free body turning with world angular velocity w: FK rotation after dt is exp(w dt) * R0."""
    path = data_file("mjcf/mujoco/humanoid.xml")
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(path))
    q0 = layout.neutral()
    q0[3:7] = R.quat_normalize(np.array([0.3, -0.2, 0.9, 0.1]))
    qd = np.zeros(layout.nv)
    w = np.array([0.4, -1.3, 0.7])
    v = np.array([1.0, 2.0, -0.5])
    qd[:3], qd[3:6] = v, w
    q1 = layout.integrate(q0, qd, 0.1)
    expect = R.quat_multiply(R.quat_from_rotvec(w * 0.1), q0[3:7])
    _assert_same_rotations(q1[3:7], expect, 1e-12)
    np.testing.assert_allclose(q1[:3], q0[:3] + v * 0.1)
    p0, _ = forward_kinematics(layout, q0)
    p1, _ = forward_kinematics(layout, q1)
    np.testing.assert_allclose(p1[0] - p0[0], v * 0.1, atol=1e-12)  # root body origin moves by v dt


def test_hinge_ref_means_modelled_pose(tmp_path):
    xml = tmp_path / "ref.xml"
    xml.write_text(
        '<mujoco><compiler angle="radian"/><worldbody><body name="a"><joint name="h" axis="0 0 1" ref="0.5"/>'
        '<geom size=".1"/><body name="b" pos="1 0 0"><geom size=".1"/></body></body></worldbody></mujoco>'
    )
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(xml), free_root=False)
    assert layout.blocks[0].ref == 0.5
    pos, _ = forward_kinematics(layout, np.array([0.5]))
    np.testing.assert_allclose(pos[1], [1, 0, 0], atol=1e-12)  # q == ref: the modelled pose
    m = mujoco.MjModel.from_xml_path(str(xml))
    xpos, _ = _mujoco_fk(m, np.array([[1.2]]))
    np.testing.assert_allclose(forward_kinematics(layout, np.array([1.2]))[0], xpos[0], atol=1e-12)


def test_layout_blocks_names_limits_and_signature():
    path = data_file("mjcf/dm_control/model_with_ball_joints.xml")
    desc = MJCFLoader.load(path)
    lay = ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    assert [(b.joint_type, b.q_dim, b.qd_dim) for b in lay.blocks] == [
        (JointType.FREE, 7, 6),
        (JointType.BALL, 4, 3),
        (JointType.BALL, 4, 3),
    ]
    assert lay.dof_names[:6] == tuple(f"body1_free_{s}" for s in ("tx", "ty", "tz", "rx", "ry", "rz"))
    assert lay.q_names[7:11] == ("joint_1_qw", "joint_1_qx", "joint_1_qy", "joint_1_qz")
    fixed = ArticulationCoordinateLayout.from_data(data=desc, free_root=False)
    assert (fixed.nq, fixed.nv) == (8, 6)
    cart = ArticulationCoordinateLayout.from_data(
        data=MJCFLoader.load(data_file("mjcf/dm_control/cartpole.xml")), free_root=False
    )
    assert cart.dof_lower[0] == pytest.approx(-1.8) and cart.dof_upper[0] == pytest.approx(1.8)
    assert np.isinf(cart.dof_lower[1])
    assert cart.block("slider").joint_type is JointType.SLIDE
    with pytest.raises(UnknownNameError, match="slider"):
        cart.block("slidr")
    # signature: stable across loads, changes with a limit or a rest offset
    again = ArticulationCoordinateLayout.from_data(
        data=MJCFLoader.load(data_file("mjcf/dm_control/cartpole.xml")), free_root=False
    )
    assert again.model_signature == cart.model_signature
    d2 = MJCFLoader.load(data_file("mjcf/dm_control/cartpole.xml"))
    j0 = dataclasses.replace(d2.joints[0], range=(-1.7, 1.8))
    changed = dataclasses.replace(d2, joints=(j0,) + d2.joints[1:])
    assert ArticulationCoordinateLayout.from_data(data=changed, free_root=False).model_signature != cart.model_signature
    b1 = dataclasses.replace(d2.bodies[1], pos=d2.bodies[1].pos + 1e-3)
    moved = dataclasses.replace(d2, bodies=(d2.bodies[0], b1))
    assert ArticulationCoordinateLayout.from_data(data=moved, free_root=False).model_signature != cart.model_signature


def test_wrong_q_shape_is_a_shape_error():
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml")))
    with pytest.raises(ShapeError, match="expected 28"):
        forward_kinematics(layout, np.zeros((4, 27)))
    with pytest.raises(ShapeError, match="qd"):
        layout.integrate(np.zeros((4, 28)), np.zeros((4, 28)), 0.1)
