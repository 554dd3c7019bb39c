"""Simulator kinematics and dynamics against MuJoCo (mj_fullM, qfrc_bias, mj_jacBody, mj_inverse) and
against identities that do not use our code paths (finite differences of the shared FK, link kinetic
energy summed by hand, momentum conservation under an independent RK4)."""

from __future__ import annotations

import warnings

import mujoco
import numpy as np
import pytest
import torch
from conftest import MJCF_COMPILABLE, data_file

import kangengine as ke
from kangengine import rotations as R
from kangengine.asset import JointType, MJCFLoader
from kangengine.errors import ShapeError

DYN_MODELS = [
    "mjcf/mujoco/humanoid.xml",
    "mjcf/protomotions/smpl_humanoid.xml",
    "mjcf/dm_control/humanoid_CMU.xml",
    "mjcf/unitree/g1_29dof.nomesh.xml",
    "mjcf/dm_control/model_with_ball_joints.xml",
    "mjcf/dm_control/cartpole.xml",  # slide (prismatic) + hinge
]


def _load(rel, dtype=torch.float64, free_root=None, **kw):
    path = data_file(rel)
    desc = MJCFLoader.load(path)
    free = any(j.type is JointType.FREE for j in desc.joints) if free_root is None else free_root
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=free)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ke.sim.Model.from_desc(desc, layout, dtype=dtype, **kw)
    return path, desc, layout, model


def _random_state(layout, qpos0, rng, n, scale=0.6):
    q = np.tile(qpos0, (n, 1)) + scale * rng.normal(size=(n, layout.nq))
    for b in layout.blocks:
        if b.joint_type is JointType.FREE:
            sl = slice(b.q_offset + 3, b.q_offset + 7)
            q[:, sl] = R.quat_normalize(q[:, sl])
        elif b.joint_type is JointType.BALL:
            q[:, b.q_slice] = R.quat_normalize(q[:, b.q_slice])
    return q, rng.normal(size=(n, layout.nv)), rng.normal(size=(n, layout.nv))


def _velocity_map(layout, q):
    """T with MuJoCo qvel = T qd: free/ball angular velocity is local (child frame) in MuJoCo."""
    t = np.eye(layout.nv)
    for b in layout.blocks:
        if b.joint_type is JointType.FREE:
            rot = R.quat_to_matrix(q[b.q_offset + 3 : b.q_offset + 7])
            t[b.qd_offset + 3 : b.qd_offset + 6, b.qd_offset + 3 : b.qd_offset + 6] = rot.T
        elif b.joint_type is JointType.BALL:
            rot = R.quat_to_matrix(q[b.q_slice])
            t[b.qd_slice, b.qd_slice] = rot.T
    return t


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(np.asarray(b)).max(), 1e-12))


@pytest.mark.parametrize("rel", MJCF_COMPILABLE)
def test_joint_frames_match_mujoco_anchor_and_axis(rel):
    """The foundation FK's joint frames (extension used by the simulator) == MuJoCo xanchor / xaxis."""
    path, desc, layout, _ = _load(rel)
    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    q, _, _ = _random_state(layout, m.qpos0, np.random.default_rng(3), 3)
    frames = layout.kinematics.joint_frames(torch.as_tensor(q))
    frames_np = layout.kinematics.joint_frames(q)
    steps = [b for b in layout.blocks if b.joint_type is not JointType.FIXED]
    assert frames.joint_positions.shape == (3, len(steps), 3)
    for i in range(len(q)):
        d.qpos[:] = q[i]
        mujoco.mj_kinematics(m, d)
        np.testing.assert_allclose(frames.joint_positions[i].numpy(), d.xanchor, atol=1e-12)
        np.testing.assert_allclose(frames_np.joint_positions[i], d.xanchor, atol=1e-12)
        np.testing.assert_allclose(frames.body_positions[i].numpy(), d.xpos[1:], atol=1e-12)
        for k, b in enumerate(steps):
            if b.axis is not None:
                axis = R.quat_rotate(frames.joint_rotations_wxyz[i, k].numpy(), np.array(b.axis))
                np.testing.assert_allclose(axis, d.xaxis[k], atol=1e-12)
                np.testing.assert_allclose(frames.dof_axes[i, b.qd_offset].numpy(), d.xaxis[k], atol=1e-12)
            elif b.joint_type is JointType.BALL:  # the three axes of the parent-side joint frame
                frame = R.quat_to_matrix(frames.joint_rotations_wxyz[i, k].numpy())
                np.testing.assert_allclose(frames.dof_axes[i, b.qd_slice].numpy(), frame.T, atol=1e-12)


@pytest.mark.parametrize("rel", DYN_MODELS)
def test_dynamics_match_mujoco(rel):
    path, desc, layout, model = _load(rel)
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.disableflags |= (
        mujoco.mjtDisableBit.mjDSBL_CONTACT
        | mujoco.mjtDisableBit.mjDSBL_SPRING
        | mujoco.mjtDisableBit.mjDSBL_DAMPER
        | mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    )
    d = mujoco.MjData(m)
    n = 4
    q, qd, qdd = _random_state(layout, m.qpos0, np.random.default_rng(7), n)
    qt, qdt, qddt = (torch.as_tensor(x) for x in (q, qd, qdd))
    mass = ke.sim.mass_matrix(model, qt).numpy()
    bias = ke.sim.bias_forces(model, qt, qdt).numpy()
    tau = ke.sim.inverse_dynamics(model, qt, qdt, qddt).numpy()
    jac = ke.sim.link_jacobians(model, qt).numpy()
    assert mass.shape == (n, m.nv, m.nv) and jac.shape == (n, m.nbody - 1, 6, m.nv)
    for i in range(n):
        t = _velocity_map(layout, q[i])
        d.qpos[:], d.qvel[:] = q[i], t @ qd[i]
        mujoco.mj_forward(m, d)
        full = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, full)
        assert _rel(mass[i], t.T @ full @ t) <= 1e-9
        assert _rel(bias[i], t.T @ d.qfrc_bias) <= 1e-9
        d.qacc[:] = t @ qdd[i]  # d(T qd)/dt = T qdd here: T' qd = 0 for left-multiplied rotations
        mujoco.mj_inverse(m, d)
        assert _rel(tau[i], t.T @ d.qfrc_inverse) <= 1e-9
        for b in range(1, m.nbody):
            jp, jr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
            mujoco.mj_jacBody(m, d, jp, jr, b)
            ref = np.vstack([jp, jr]) @ t
            np.testing.assert_allclose(jac[i, b - 1], ref, atol=1e-9 * max(1.0, np.abs(ref).max()))


def test_internal_identities():
    """Mass-matrix columns = ID(e_i) - ID(0); 1/2 qd^T M qd = summed link kinetic energy; J qd = link
    twists from finite differences of the shared FK."""
    _, desc, layout, model = _load("mjcf/mujoco/humanoid.xml")
    rng = np.random.default_rng(11)
    q, qd, _ = _random_state(layout, layout.neutral(), rng, 3)
    qt, qdt = torch.as_tensor(q), torch.as_tensor(qd)
    mass = ke.sim.mass_matrix(model, qt)
    nv = layout.nv
    eye = torch.eye(nv, dtype=torch.float64)
    tau0 = ke.sim.inverse_dynamics(model, qt, qdt, torch.zeros_like(qdt))
    cols = (
        ke.sim.inverse_dynamics(
            model, qt[:, None].expand(-1, nv, -1), qdt[:, None].expand(-1, nv, -1), eye.expand(3, -1, -1)
        )
        - tau0[:, None]
    )
    torch.testing.assert_close(cols.transpose(-1, -2), mass, rtol=0, atol=1e-10)
    torch.testing.assert_close(mass, mass.transpose(-1, -2), rtol=0, atol=1e-12)
    assert bool((torch.linalg.eigvalsh(mass) > 0).all())

    # kinetic energy by hand from link twists + inertias (numpy), and through M
    vel = ke.sim.link_velocities(model, qt, qdt)
    pos, rot = ke.animation.forward_kinematics(layout, q)
    ke_links = np.zeros(3)
    for b, body in enumerate(desc.bodies):
        rm = R.quat_to_matrix(rot[:, b])
        w = vel.angular[:, b].numpy()
        v_com = vel.linear[:, b].numpy() + np.cross(w, np.einsum("nij,j->ni", rm, body.com))
        iw = np.einsum("nij,jk,nlk,nl->ni", rm, body.inertia, rm, w)
        ke_links += 0.5 * body.mass * (v_com**2).sum(-1) + 0.5 * (w * iw).sum(-1)
    ke_links += 0.5 * (model.dof_armature.numpy() * qd**2).sum(-1)
    quad = 0.5 * torch.einsum("ni,nij,nj->n", qdt, mass, qdt).numpy()
    np.testing.assert_allclose(quad, ke_links, rtol=1e-12)
    np.testing.assert_allclose(ke.sim.kinetic_energy(model, qt, qdt).numpy(), ke_links, rtol=1e-12)

    # J qd against central differences of the foundation FK along qd
    eps = 1e-6
    qp = layout.integrate(q, qd, eps)
    qm = layout.integrate(q, qd, -eps)
    pp, rp = ke.animation.forward_kinematics(layout, qp)
    pm, rmq = ke.animation.forward_kinematics(layout, qm)
    lin_fd = (pp - pm) / (2 * eps)
    ang_fd = R.quat_to_rotvec(R.quat_multiply(rp, R.quat_conjugate(rmq))) / (2 * eps)
    twist = torch.einsum("nbij,nj->nbi", ke.sim.link_jacobians(model, qt), qdt).numpy()
    np.testing.assert_allclose(twist[..., :3], lin_fd, atol=1e-6)
    np.testing.assert_allclose(twist[..., 3:], ang_fd, atol=1e-6)
    np.testing.assert_allclose(vel.linear.numpy(), twist[..., :3], atol=1e-12)
    np.testing.assert_allclose(vel.angular.numpy(), twist[..., 3:], atol=1e-12)


def test_momentum_conserved_free_floating_zero_gravity():
    """A free-floating chain (ball joints + hinges) in zero gravity: RK4 on forward dynamics keeps the
    total linear and angular momentum."""
    _, desc, layout, model = _load("mjcf/dm_control/model_with_ball_joints.xml", free_root=True, gravity=(0, 0, 0))
    assert layout.free_root
    rng = np.random.default_rng(5)
    q, qd, _ = _random_state(layout, layout.neutral(), rng, 2, scale=0.3)
    q, qd = torch.as_tensor(q), torch.as_tensor(qd) * 2.0
    h0 = ke.sim.momentum(model, q, qd)
    dt = 1e-3

    def f(state):
        qq, vv = state
        return vv, ke.sim.forward_dynamics(model, qq, vv)

    for _ in range(200):  # RK4 on the manifold (integrate along tangent increments)
        k1 = f((q, qd))
        k2 = f((layout.integrate(q, k1[0], dt / 2), qd + dt / 2 * k1[1]))
        k3 = f((layout.integrate(q, k2[0], dt / 2), qd + dt / 2 * k2[1]))
        k4 = f((layout.integrate(q, k3[0], dt), qd + dt * k3[1]))
        q = layout.integrate(q, (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0]) / 6, dt)
        qd = qd + dt * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1]) / 6
    h1 = ke.sim.momentum(model, q, qd)
    assert float((h1 - h0).abs().max()) < 1e-6 * float(h0.abs().max())
    assert float(h0.abs().max()) > 1e-3


def test_float32_and_batch_dims():
    _, _, layout, m64 = _load("mjcf/unitree/g1_29dof.nomesh.xml")
    _, _, _, m32 = _load("mjcf/unitree/g1_29dof.nomesh.xml", dtype=torch.float32)
    q, qd, qdd = _random_state(layout, layout.neutral(), np.random.default_rng(2), 6)
    q64, qd64, qdd64 = (torch.as_tensor(x).reshape(2, 3, -1) for x in (q, qd, qdd))
    tau64 = ke.sim.inverse_dynamics(m64, q64, qd64, qdd64)
    assert tau64.shape == (2, 3, layout.nv)
    tau32 = ke.sim.inverse_dynamics(m32, q64.float(), qd64.float(), qdd64.float())
    assert tau32.dtype == torch.float32
    assert _rel(tau32.double().numpy(), tau64.numpy()) < 1e-4
    mass32 = ke.sim.mass_matrix(m32, q64.float())
    assert mass32.shape == (2, 3, layout.nv, layout.nv)
    assert _rel(mass32.double().numpy(), ke.sim.mass_matrix(m64, q64).numpy()) < 1e-5
    qdd_back = ke.sim.forward_dynamics(m64, q64, qd64, tau64)
    torch.testing.assert_close(qdd_back, qdd64, rtol=0, atol=1e-8)


def test_bad_input_names_the_array():
    _, _, layout, model = _load("mjcf/mujoco/humanoid.xml")
    with pytest.raises(ShapeError, match="qd"):
        ke.sim.bias_forces(
            model, torch.zeros(2, layout.nq, dtype=torch.float64), torch.zeros(2, 5, dtype=torch.float64)
        )
    with pytest.raises(ShapeError, match="float64"):
        ke.sim.mass_matrix(model, torch.zeros(2, layout.nq, dtype=torch.float32))
    with pytest.raises(ShapeError):
        ke.sim.mass_matrix(model, np.zeros((2, layout.nq)))


@pytest.mark.parametrize("rel", DYN_MODELS)
def test_tree_factorisation_solves_like_mujoco(rel):
    """The tree-sparse L^T D L factorisation (vectorised over worlds) solves M x = b like MuJoCo's own
    sparse factorisation (mj_solveM), and its pattern holds every nonzero of the mass matrix."""
    from kangengine.sim.treesolve import TreePattern

    path, desc, layout, model = _load(rel)
    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    n = 3
    rng = np.random.default_rng(3)
    q, _, b = _random_state(layout, m.qpos0, rng, n)
    mass = ke.sim.mass_matrix(model, torch.as_tensor(q))
    tree = TreePattern(model.dof_above)
    stored = tree.from_dense(mass)  # [nnz, n]
    inside = torch.zeros(model.nv * model.nv, dtype=torch.bool)
    inside[tree.row * model.nv + tree.col] = True
    inside = inside.reshape(model.nv, model.nv)
    inside = inside | inside.T
    assert not bool((mass[:, ~inside] != 0).any())  # no nonzero outside the pattern
    x = tree.solve(stored, torch.as_tensor(b).t().contiguous()).t().numpy()
    for i in range(n):
        t = _velocity_map(layout, q[i])  # ours M = T^T M_mj T with orthogonal T
        d.qpos[:] = q[i]
        mujoco.mj_forward(m, d)
        y = np.zeros((1, m.nv))
        mujoco.mj_solveM(m, d, y, (t @ b[i])[None])
        assert _rel(x[i], t.T @ y[0]) <= 1e-9
