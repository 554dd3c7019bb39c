"""The implicit step: convergence against scipy's solve_ivp on MuJoCo's dynamics, energy, friction (joint
and contact) against the reference formulas and the analytic sliding distance, drives, limits, loads,
pinned DOFs, robustness, and a standing humanoid."""

from __future__ import annotations

import math
import warnings

import mujoco
import numpy as np
import pytest
import torch
from conftest import data_file
from scipy.integrate import solve_ivp
from scipy.special import erf

import kangengine as ke
from kangengine.asset import MJCFLoader
from kangengine.errors import ShapeError
from kangengine.sim import Control, Simulator, State

CHAIN = """<mujoco><option gravity="0 0 -9.81"/>
<default><geom type="capsule" size="0.03" contype="0" conaffinity="0"/>
<joint type="hinge" axis="0 1 0" damping="{damp}"/></default>
<worldbody><body name="l1" pos="0 0 2"><joint name="j1"/><geom fromto="0 0 0 0.5 0 0" mass="1"/>
<body name="l2" pos="0.5 0 0"><joint name="j2" pos="0 0 0.02"/><geom fromto="0 0 0 0.4 0 0.1" mass="0.7"/>
<body name="l3" pos="0.4 0 0.1"><joint name="j3" axis="0.3 1 0"/><geom fromto="0 0 0 0.3 0 0" mass="0.5"/>
</body></body></body></worldbody></mujoco>"""

BOX = """<mujoco><worldbody><geom name="floor" type="plane" size="5 5 .1" friction="{mu}"/>
<body name="box" pos="0 0 0.1"><freejoint/><geom type="box" size=".1 .1 .1" mass="1" friction="{mu}"/></body>
</worldbody></mujoco>"""

BALL = """<mujoco><option gravity="0 0 0"/><worldbody><body name="base">
<geom type="sphere" size=".05" mass="1" contype="0" conaffinity="0"/>
<body name="arm" pos="0 0 1"><joint name="hinge" type="hinge" axis="0 0 1" frictionloss="2" damping="0.3"/>
<geom type="box" size=".5 .1 .1" mass="12" contype="0" conaffinity="0"/></body>
<body name="rotor" pos="2 0 1"><joint name="ball" type="ball" frictionloss="1.5"/>
<geom type="sphere" size=".4" mass="40" contype="0" conaffinity="0"/></body>
</body></worldbody></mujoco>"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _model(desc, **kw):
    kw.setdefault("dtype", torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ke.sim.Model.from_desc(desc, **kw)


def _energy(model, state):
    return (ke.sim.kinetic_energy(model, state.q, state.qd) + ke.sim.potential_energy(model, state.q)).numpy()


def test_pendulum_chain_converges_first_order(tmp_path):
    """Frictionless 3-link chain (offset anchors, skewed axis): error at T against solve_ivp (DOP853 on
    MuJoCo's forward dynamics) halves when h halves."""
    path = _write(tmp_path, "chain.xml", CHAIN.format(damp=0))
    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    q0, v0 = np.array([0.3, -0.5, 0.8]), np.array([0.0, 1.0, -0.5])

    def rhs(_, y):
        d.qpos[:], d.qvel[:] = y[:3], y[3:]
        mujoco.mj_forward(m, d)
        return np.concatenate([y[3:], d.qacc])

    t_end = 0.5
    ref = solve_ivp(rhs, (0, t_end), np.concatenate([q0, v0]), method="DOP853", rtol=1e-11, atol=1e-12).y[:, -1]
    model = _model(MJCFLoader.load(path), free_root=False)
    errors = []
    for n in (50, 100, 200, 400):
        sim = Simulator(model, dt=t_end / n, iterations=1, line_search=False)
        st = State.from_q(model, q0, v0)
        for _ in range(n):
            st = sim.step(st).state
        errors.append(float(np.abs(st.q[0].numpy() - ref[:3]).max()))
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert errors[-1] < 1e-2
    assert np.all((ratios > 1.8) & (ratios < 2.2)), ratios


def test_energy_never_grows_with_damping(tmp_path):
    path = _write(tmp_path, "chain.xml", CHAIN.format(damp=0.5))
    model = _model(MJCFLoader.load(path), free_root=False)
    sim = Simulator(model, dt=1 / 60)
    st = State.from_q(model, np.array([[0.3, -0.5, 0.8], [1.2, 0.4, -1.0]]), np.array([[0.0, 1.0, -0.5], [2, -1, 3]]))
    energies = [_energy(model, st)]
    for _ in range(300):
        st = sim.step(st).state
        energies.append(_energy(model, st))
    e = np.array(energies)
    assert np.all(np.diff(e, axis=0) <= 1e-9), np.diff(e, axis=0).max()
    assert np.all(e[-1] < e[0] - 1.0)


def test_box_slides_analytic_distance(tmp_path):
    """A box launched at v0 on ground with friction mu stops after v0^2 / (2 mu g) (within the O(h)
    backward-Euler error v0 h / 2 and the friction smoothing); at rest the contact carries its weight."""
    mu, v0, g = 0.5, 2.0, 9.81
    desc = MJCFLoader.load(_write(tmp_path, "box.xml", BOX.format(mu=mu)))
    model = _model(desc)
    assert model.num_contact_points == 8
    h = 1 / 240
    sim = Simulator(model, dt=h)
    st = State.neutral(model, 1)
    for _ in range(120):
        res = sim.step(st)
        st = res.state
    np.testing.assert_allclose(res.contact_normal_force.sum().item(), 1.0 * g, rtol=1e-3)
    per_body = ke.sim.contact_force_per_body(
        model, torch.cat([res.contact_friction_force, res.contact_normal_force[..., None]], -1)
    )
    np.testing.assert_allclose(per_body[0, 0].numpy(), [0, 0, g], atol=1e-2)
    qd = st.qd.clone()
    qd[0, 0] = v0
    st = State.from_q(model, st.q, qd)
    x0 = st.q[0, 0].item()
    for _ in range(int(1.5 / h)):
        st = sim.step(st).state
    dist = st.q[0, 0].item() - x0
    expected = v0**2 / (2 * mu * g)
    assert expected - v0 * h <= dist <= expected + 2e-3, (dist, expected)
    assert abs(st.qd[0, 0].item()) < 1e-6
    assert abs(st.q[0, 2].item() - 0.1) < 1e-3  # resting on its face


def _phi_reference(x, vf, r, vs):
    """The reference document's phi, transcribed with numpy/scipy."""
    x = np.asarray(x, dtype=np.float64)
    lo = x**2 / vf * (1 - x / (3 * vf))
    if vs > 0:
        hi = 2 * vf / 3 + r * (x - vf) + (1 - r) * vs * math.sqrt(math.pi) / 2 * erf((x - vf) / vs)
    else:
        hi = 2 * vf / 3 + r * (x - vf)
    return np.where(x < vf, lo, hi)


@pytest.mark.parametrize("stribeck", [0.0, 0.05])
def test_joint_friction_torque_curve_matches_reference(tmp_path, stribeck):
    """The torque the step applies on a hinge (and a ball joint) equals -(mu_v v + mu_0 phi'(|v|) sign v)
    with phi' from central differences of the reference phi; ke.sim.friction_* agree too."""
    vf, extra = 0.01, 1.0
    desc = MJCFLoader.load(_write(tmp_path, "fric.xml", BALL))
    model = _model(
        desc,
        free_root=False,
        friction_params=ke.sim.JointFriction(falloff_vel=vf, stiction_extra=extra, stribeck_vel=stribeck),
    )
    mu_c, mu_v = 2.0, 0.3
    mu0 = mu_c + extra
    r = mu_c / mu0

    def dphi_ref(x):
        eps = 1e-7
        return (_phi_reference(x + eps, vf, r, stribeck) - _phi_reference(np.maximum(x - eps, 0), vf, r, stribeck)) / (
            x + eps - np.maximum(x - eps, 0)
        )

    speeds = np.array([-0.3, -0.08, -0.02, -0.009, -0.004, 0.001, 0.006, 0.012, 0.03, 0.1, 0.4])
    n = len(speeds)
    rng = np.random.default_rng(0)
    axes = rng.normal(size=(n, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    qd = np.zeros((n, model.nv))
    qd[:, 0] = speeds
    qd[:, 1:4] = np.abs(speeds)[:, None] * axes
    q = np.tile(model.layout.neutral(), (n, 1))
    h = 1e-3
    sim = Simulator(model, dt=h, iterations=30)
    st = State.from_q(model, q, qd)
    new = sim.step(st).state
    mass = ke.sim.mass_matrix(model, st.q)
    applied = (torch.einsum("nij,nj->ni", mass, new.qd - st.qd) / h).numpy()
    v1 = new.qd.numpy()
    ref_hinge = -(mu_v * v1[:, 0] + mu0 * dphi_ref(np.abs(v1[:, 0])) * np.sign(v1[:, 0]))
    np.testing.assert_allclose(applied[:, 0], ref_hinge, rtol=1e-5, atol=1e-6)
    w = v1[:, 1:4]
    speed = np.linalg.norm(w, axis=1)
    mu0_ball = 1.5 + extra  # the shared stiction_extra applies to every DOF with dry friction
    r_ball = 1.5 / mu0_ball
    eps = 1e-7
    dphi_b = (_phi_reference(speed + eps, vf, r_ball, stribeck) - _phi_reference(speed - eps, vf, r_ball, stribeck)) / (
        2 * eps
    )
    ref_ball = -(mu0_ball * dphi_b / speed)[:, None] * w
    np.testing.assert_allclose(applied[:, 1:4], ref_ball, rtol=1e-5, atol=1e-6)
    # the public helpers follow the same formula
    v = torch.linspace(-0.5, 0.5, 200, dtype=torch.float64) + 1.3e-4  # off the kinks at 0 and +-v_f
    f = ke.sim.friction_force(
        v, coulomb=mu_c, viscous=mu_v, falloff_vel=vf, stiction_extra=extra, stribeck_vel=stribeck
    )
    ref = -(mu_v * v.numpy() + mu0 * dphi_ref(np.abs(v.numpy())) * np.sign(v.numpy()))
    np.testing.assert_allclose(f.numpy(), ref, rtol=1e-5, atol=1e-6)
    pot = ke.sim.friction_potential(
        v, coulomb=mu_c, viscous=mu_v, falloff_vel=vf, stiction_extra=extra, stribeck_vel=stribeck
    )
    np.testing.assert_allclose(
        pot.numpy(), 0.5 * mu_v * v.numpy() ** 2 + mu0 * _phi_reference(np.abs(v.numpy()), vf, r, stribeck), rtol=1e-12
    )


def _hinge_arm(tmp_path, extra=""):
    xml = f"""<mujoco><compiler angle="radian"/><worldbody><body name="arm" pos="0 0 1">
    <joint name="j" type="hinge" axis="0 1 0" range="-0.5 0.5" {extra}/>
    <geom type="capsule" fromto="0 0 0 0.6 0 0" size="0.04" mass="2" contype="0" conaffinity="0"/></body></worldbody>
    <actuator><motor joint="j" gear="1" ctrlrange="-3 3" ctrllimited="true"/></actuator></mujoco>"""
    return MJCFLoader.load(_write(tmp_path, "arm.xml", xml))


def test_pd_drive_settles_to_target(tmp_path):
    desc = _hinge_arm(tmp_path)
    model = _model(
        desc,
        free_root=False,
        drive_stiffness=80.0,
        drive_damping=8.0,
        effort_limit=float("inf"),
        link_gravity={"arm": False},
    )
    assert float(model.body_gravity[0]) == 0.0
    sim = Simulator(model, dt=1 / 60)
    st = State.from_q(model, np.array([[-0.2], [0.3]]))
    target = torch.tensor([[0.35], [-0.1]], dtype=torch.float64)
    ctrl = Control(q_target=target)
    for _ in range(240):
        res = sim.step(st, ctrl)
        st = res.state
    np.testing.assert_allclose(st.q.numpy(), target.numpy(), atol=1e-6)
    assert float(st.qd.abs().max()) < 1e-5
    # with gravity the PD settles where kp * error balances the gravity torque m g l/2 cos(q)
    model_g = _model(desc, free_root=False, drive_stiffness=80.0, drive_damping=8.0, effort_limit=float("inf"))
    sim_g = Simulator(model_g, dt=1 / 60)
    st = State.from_q(model_g, np.zeros((1, 1)))
    for _ in range(600):
        st = sim_g.step(st, Control(q_target=torch.zeros(1, 1, dtype=torch.float64))).state
    qs = st.q[0, 0].item()
    assert abs(80.0 * (0 - qs) + 2 * 9.81 * 0.3 * math.cos(qs)) < 1e-6  # gravity torque about +y: m g l cos(q)


def test_effort_limit_clamps_and_reports(tmp_path):
    desc = _hinge_arm(tmp_path)
    model = _model(desc, free_root=False, drive_stiffness=1000.0, drive_damping=10.0, link_gravity={"arm": False})
    assert float(model.dof_effort_limit[0]) == 3.0  # MJCF gear * ctrlrange
    sim = Simulator(model, dt=1 / 60)
    st = State.from_q(model, np.zeros((1, 1)))
    res = sim.step(st, Control(q_target=torch.full((1, 1), 0.4, dtype=torch.float64)))
    assert bool(res.drive_saturated[0, 0])
    np.testing.assert_allclose(res.drive_force[0, 0].item(), 3.0)
    assert res.drive_force_requested[0, 0].item() > 300.0  # kp * 0.4 - (h kp + kd) v: far above the limit
    mass = ke.sim.mass_matrix(model, st.q)[0, 0, 0].item()
    np.testing.assert_allclose(res.state.qd[0, 0].item(), 3.0 / mass / 60, rtol=1e-3)  # not 400 / mass / 60


def test_limit_held_with_bounded_penetration(tmp_path):
    desc = _hinge_arm(tmp_path)
    k_lim, push = 2000.0, 20.0
    model = _model(desc, free_root=False, limit_stiffness=k_lim, limit_damping=5.0, link_gravity={"arm": False})
    assert float(model.dof_upper[0]) == 0.5
    sim = Simulator(model, dt=1 / 60)
    st = State.from_q(model, np.zeros((1, 1)), np.array([[3.0]]))
    tau = torch.full((1, 1), push, dtype=torch.float64)
    worst = 0.0
    for _ in range(300):
        st = sim.step(st, Control(tau_external=tau)).state
        worst = max(worst, st.q[0, 0].item() - 0.5)
    np.testing.assert_allclose(st.q[0, 0].item() - 0.5, push / k_lim, rtol=1e-6)  # static balance
    assert worst < 0.06  # including the impact at 3 rad/s


def test_default_limit_stiffness_is_reference_default(tmp_path):
    model = _model(_hinge_arm(tmp_path), free_root=False)
    assert float(model.dof_limit_stiffness[0]) == 100.0 and float(model.dof_limit_damping[0]) == 0.0


def test_external_force_pinned_dofs_and_gravity(tmp_path):
    """A free box in zero gravity accelerates by F/m; pinned DOFs stay put while others move."""
    desc = MJCFLoader.load(_write(tmp_path, "box.xml", BOX.format(mu=1)))
    model = _model(desc, gravity=(0, 0, 0), contact=ke.sim.ContactParams(enabled=False))
    sim = Simulator(model, dt=0.01)
    st = State.neutral(model, 2)
    tau = torch.zeros(2, 6, dtype=torch.float64)
    tau[:, 1] = 3.0  # 3 N along y
    tau[:, 5] = 0.5  # torque about z
    pinned = torch.zeros(2, 6, dtype=torch.bool)
    pinned[1, 1] = True  # world 1: y translation pinned
    for _ in range(10):
        st = sim.step(st, Control(tau_external=tau, pinned=pinned)).state
    np.testing.assert_allclose(st.qd[0, 1].item(), 3.0 * 0.1, rtol=1e-9)
    assert st.qd[1, 1].item() == 0.0 and st.q[1, 1].item() == 0.0
    izz = 1.0 * (0.2**2 + 0.2**2) / 12
    np.testing.assert_allclose(st.qd[:, 5].numpy(), 0.5 * 0.1 / izz, rtol=1e-9)
    # a pinned DOF with a prescribed velocity follows it exactly
    pq = torch.zeros(2, 6, dtype=torch.float64)
    pq[1, 1] = 0.25
    st2 = sim.step(st, Control(pinned=pinned, pinned_qd=pq)).state
    assert st2.qd[1, 1].item() == 0.25


def test_nonfinite_world_is_frozen_others_continue(tmp_path):
    desc = MJCFLoader.load(_write(tmp_path, "box.xml", BOX.format(mu=1)))
    model = _model(desc)
    sim = Simulator(model, dt=0.01)
    q = np.tile(model.layout.neutral(), (3, 1))
    q[:, 2] = 0.5
    qd = np.zeros((3, 6))
    qd[1, 0] = np.nan
    st = State.from_q(model, q, qd)
    res = sim.step(st)
    assert res.nonfinite.tolist() == [False, True, False]
    assert res.state.frozen.tolist() == [False, True, False]
    for _ in range(5):
        res = sim.step(res.state)
    assert res.nonfinite.tolist() == [False, False, False]  # flagged once, stays frozen
    assert res.state.frozen.tolist() == [False, True, False]
    torch.testing.assert_close(res.state.q[1], torch.as_tensor(q[1]))  # frozen at its last finite q
    assert res.state.q[0, 2].item() < 0.5 and torch.isfinite(res.state.q[[0, 2]]).all()


def test_diverging_worlds_are_frozen_at_the_first_step():
    """The issue's cases on the MuJoCo humanoid (float64, unclamped drives): a world launched at qd = 1e30
    (it used to be flagged only once its root was at 5e111 m), a world with an infinite position target,
    one with a NaN feed-forward and one past the speed bound are all frozen by the first step at their
    last state; the healthy worlds step exactly as they do alone (same batch size, neighbours replaced)."""
    model = _humanoid(torch.float64)
    sim = Simulator(model, dt=1 / 60, divergence_speed=50.0)
    st = State.neutral(model, 6)
    qd = st.qd.clone()
    qd[1, 0] = 1e30
    qd[4, 0] = 60.0  # the root at 60 m/s: past this simulator's bound of 50 (well in the default 1e4)
    target, ff = st.q.clone(), torch.zeros_like(qd)
    target[2, 9] = math.inf
    ff[3, 10] = math.nan
    res = sim.step(State(q=st.q, qd=qd, frozen=st.frozen), Control(q_target=target, tau_feedforward=ff))
    assert res.nonfinite.tolist() == [False, True, True, True, True, False]
    torch.testing.assert_close(res.state.q[1:5], st.q[1:5], rtol=0, atol=0)  # frozen at the last state
    assert torch.isfinite(res.state.q).all() and res.state.q.abs().max() < 10
    # the healthy worlds, with healthy neighbours instead: the same step
    clean = sim.step(st, Control(q_target=st.q.clone(), tau_feedforward=torch.zeros_like(qd)))
    torch.testing.assert_close(res.state.q[[0, 5]], clean.state.q[[0, 5]], rtol=0, atol=0)
    assert not clean.nonfinite.any() and Simulator(model, dt=1 / 60).divergence_speed == 1e4
    with pytest.raises(ValueError, match="divergence"):
        Simulator(model, dt=1 / 60, divergence_distance=0.0)


def test_contact_points_match_mujoco_geoms_and_filter():
    path = data_file("mjcf/mujoco/humanoid.xml")
    desc = MJCFLoader.load(path)
    model = _model(desc)
    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    rng = np.random.default_rng(4)
    q = model.layout.neutral() + 0.3 * rng.normal(size=model.nq)
    q[3:7] /= np.linalg.norm(q[3:7])
    d.qpos[:] = q
    mujoco.mj_kinematics(m, d)
    from kangengine.sim.contact import contact_geometry
    from kangengine.sim.kinematics import compute_frames

    geo = contact_geometry(model, compute_frames(model, torch.as_tensor(q)[None]))
    pos = torch.stack(geo.position, -1)[:, 0].numpy()  # components are [C, W]
    for k in range(model.num_contact_points):
        g = m.geom(model.contact_point_geom[k])
        centre, axis, r = d.geom_xpos[g.id], d.geom_xmat[g.id].reshape(3, 3)[:, 2], m.geom_size[g.id][0]
        if m.geom_type[g.id] == mujoco.mjtGeom.mjGEOM_CAPSULE:
            ends = [centre + s * m.geom_size[g.id][1] * axis for s in (-1, 1)]
            dist = min(np.linalg.norm(pos[k] + [0, 0, r] - e) for e in ends)
        else:
            dist = np.linalg.norm(pos[k] + [0, 0, r] - centre)
        assert dist < 1e-12
    assert model.num_contact_points == 2 * 16 + 3  # 16 capsules (2 ends) + 3 spheres; the floor is not a link geom
    pairs = {frozenset(p) for p in model.collision_filter_pairs}
    assert {"pelvis", "thigh_right"} in pairs  # adjacent
    assert {"thigh_right", "waist_lower"} in pairs  # MJCF <exclude>
    assert {"thigh_left", "thigh_right"} not in pairs


def test_control_shape_errors_name_the_field(tmp_path):
    model = _model(_hinge_arm(tmp_path), free_root=False)
    sim = Simulator(model, dt=0.01)
    st = State.neutral(model, 2)
    with pytest.raises(ShapeError, match="q_target"):
        sim.step(st, Control(q_target=torch.zeros(3, 1, dtype=torch.float64)))
    with pytest.raises(ShapeError, match="pinned"):
        sim.step(st, Control(pinned=torch.zeros(2, 1)))
    with pytest.raises(ShapeError, match="qd"):
        sim.step(State(q=st.q, qd=torch.zeros(2, 4, dtype=torch.float64), frozen=st.frozen))


def _humanoid(dtype):
    desc = MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml"))
    return _model(desc, dtype=dtype, drive_stiffness=2000.0, drive_damping=100.0, effort_limit=float("inf"))


def test_float32_step_tracks_float64():
    m64, m32 = _humanoid(torch.float64), _humanoid(torch.float32)
    s64, s32 = State.neutral(m64, 2), State.neutral(m32, 2)
    c64, c32 = Control(q_target=s64.q.clone()), Control(q_target=s32.q.clone())
    sim64, sim32 = Simulator(m64, dt=1 / 60), Simulator(m32, dt=1 / 60)
    for _ in range(30):
        s64 = sim64.step(s64, c64).state
        s32 = sim32.step(s32, c32).state
    assert s32.q.dtype == torch.float32
    assert float((s32.q.double() - s64.q).abs().max()) < 2e-3


def test_humanoid_stands_under_pd_for_10s():
    """MuJoCo humanoid on the ground, joint PD holding the modelled pose, h = 1/60 s: stays up 10 s and
    the ground carries its weight."""
    model = _humanoid(torch.float32)
    sim = Simulator(model, dt=1 / 60)
    st = State.neutral(model, 2)
    ctrl = Control(q_target=st.q.clone())
    weight = model.total_mass * 9.81
    for _ in range(600):
        res = sim.step(st, ctrl)
        st = res.state
    assert not bool(st.frozen.any())
    assert float(st.q[:, 2].min()) > 1.2  # torso still at standing height (1.282 modelled)
    np.testing.assert_allclose(res.contact_normal_force.sum(-1).numpy(), weight, rtol=0.02)
    assert float(res.contact_depth.max()) < 0.01


@pytest.mark.parametrize("solver", ["dense", "tree"])
def test_step_never_synchronises_and_keeps_shapes(solver):
    """No op in a step needs a value on the host (the ops behind .item(), bool(tensor), nonzero or
    data-dependent shapes), so on CUDA a step never waits for the device and can be graph-captured;
    output shapes depend on the number of worlds only. Both Newton solvers."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    forbidden = {
        aten._local_scalar_dense.default,
        aten.nonzero.default,
        aten.masked_select.default,
        aten.is_nonzero.default,
        aten.equal.default,
        aten._unique2.default,
        aten.unique_consecutive.default,
    }

    class NoHostSync(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            assert func not in forbidden, f"host synchronisation through {func}"
            return func(*args, **(kwargs or {}))

    model = _humanoid(torch.float32)
    # the torch step (the CUDA path); the CPU fast path is one native call
    sim = Simulator(model, dt=1 / 60, check_inputs=False, solver=solver, fast_path=False)
    st = State.neutral(model, 3)
    pinned = torch.zeros(3, model.nv, dtype=torch.bool)
    pinned[0, 7] = True
    ctrl = Control(
        q_target=st.q.clone(),
        qd_target=torch.zeros_like(st.qd),
        tau_feedforward=torch.zeros_like(st.qd),
        tau_external=torch.zeros_like(st.qd),
        pinned=pinned,
    )
    with NoHostSync():
        first = sim.step(st, ctrl)
        second = sim.step(first.state, ctrl)
    for a, b in (
        (first.state.q, second.state.q),
        (first.contact_normal_force, second.contact_normal_force),
        (first.contact_friction_force, second.contact_friction_force),
        (first.drive_force, second.drive_force),
    ):
        assert a.shape == b.shape and a.shape[0] == 3
    assert first.contact_normal_force.shape == (3, model.num_contact_points)


def test_pd_on_ball_joint_and_free_root_reaches_target_rotation(tmp_path):
    """PD on rotation DOFs uses the tangent difference (rotation vector in the parent / world frame):
    a ball joint and a free root both settle on their target orientation and position."""
    from kangengine import rotations as R

    desc = MJCFLoader.load(_write(tmp_path, "ball.xml", BALL))
    model = _model(
        desc,
        free_root=True,
        drive_stiffness={"ball": 60.0, "hinge": 60.0},
        drive_damping={"ball": 12.0, "hinge": 12.0},
        effort_limit=float("inf"),
        joint_friction=0.0,
    )
    kp, kd = torch.zeros(model.nv, dtype=torch.float64), torch.zeros(model.nv, dtype=torch.float64)
    kp[:] = model.dof_drive_stiffness
    kd[:] = model.dof_drive_damping
    kp[:6], kd[:6] = 4000.0, 2000.0  # hold the free root too (a "root assistance" drive)
    sim = Simulator(model, dt=1 / 60)
    st = State.neutral(model, 1)
    target = st.q.clone()
    ball = model.layout.block("ball").q_slice
    target[0, ball] = torch.as_tensor(R.quat_from_axis_angle(np.array([0.3, -1.0, 0.5]), 1.1))
    target[0, 3:7] = torch.as_tensor(R.quat_from_axis_angle(np.array([0.0, 0.0, 1.0]), 0.4))
    target[0, :3] += torch.tensor([0.2, -0.1, 0.3], dtype=torch.float64)
    ctrl = Control(q_target=target, drive_stiffness=kp, drive_damping=kd)
    for _ in range(600):
        st = sim.step(st, ctrl).state
    err = model.layout.difference(st.q, target)
    assert float(err.abs().max()) < 1e-4, err


COUPLED = """<mujoco><compiler angle="radian"/><option gravity="0 0 0"/><worldbody><body name="a" pos="0 0 1">
<joint name="j1" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.03" mass="1"
 contype="0" conaffinity="0"/>
<body name="b" pos="0.4 0 0"><joint name="j2" type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.03" mass="1" contype="0" conaffinity="0"/>
<body name="c" pos="0.4 0 0"><joint name="j3" type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" mass="0.5" contype="0" conaffinity="0"/></body>
</body></body></worldbody>
<tendon><fixed name="t12" limited="true" range="-0.5 0.4"><joint joint="j1" coef="1"/><joint joint="j2" coef="1"/>
</fixed></tendon>
<equality><joint joint1="j3" joint2="j1" polycoef="0.1 -2 0 0 0"/></equality></mujoco>"""


def test_fixed_tendon_limit_and_mimic_joint(tmp_path):
    """A fixed tendon leaving its range is pushed back like a joint limit (static balance: violation =
    torque / stiffness); a mimic joint follows multiplier * leader + offset (MJCF joint equality)."""
    desc = MJCFLoader.load(_write(tmp_path, "coupled.xml", COUPLED))
    k = 500.0
    model = _model(
        desc,
        free_root=False,
        tendon_limit_stiffness=k,
        tendon_limit_damping=2.0,
        joint_damping=1.0,
        mimic_stiffness=2e4,
    )
    assert model.coupling_names == ("t12", "mimic j3")
    sim = Simulator(model, dt=1 / 60)
    st = State.from_q(model, np.zeros((1, 3)))
    tau = torch.tensor([[3.0, 3.0, 0.0]], dtype=torch.float64)
    for _ in range(400):
        st = sim.step(st, Control(tau_external=tau)).state
    q = st.q[0].numpy()
    np.testing.assert_allclose(q[0] + q[1], 0.4 + 3.0 / k, rtol=1e-6)  # tendon length beyond its upper end
    np.testing.assert_allclose(q[2], 0.1 - 2.0 * q[0], atol=2e-4)  # mimic: j3 = -2 j1 + 0.1


def test_collapsing_humanoid_comes_to_rest_on_the_ground():
    """No drives: thrown humanoids fall, hit the ground with many contacts at once, and come to rest
    without blowing up: bounded penetration, the ground carries the weight, kinetic energy ~ 0."""
    desc = MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml"))
    model = _model(desc, dtype=torch.float32)
    sim = Simulator(model, dt=1 / 60)
    st = State.neutral(model, 2)
    qd = st.qd.clone()
    qd[:, 0] = torch.tensor([1.0, -1.0])
    qd[:, 4] = torch.tensor([3.0, -2.0])  # tumbling
    st = State.from_q(model, st.q, qd)
    worst = 0.0
    for _ in range(300):
        res = sim.step(st)
        st = res.state
        worst = max(worst, float(res.contact_depth.max()))
    assert not bool(st.frozen.any()) and bool(torch.isfinite(st.q).all())
    assert worst < 0.05 and float(st.q[:, 2].max()) < 0.3  # lying on the ground
    np.testing.assert_allclose(res.contact_normal_force.sum(-1).numpy(), model.total_mass * 9.81, rtol=0.01)
    assert float(ke.sim.kinetic_energy(model, st.q, st.qd).max()) < 0.1


BRANCHED = """<mujoco><compiler angle="radian"/><option gravity="0 0 -9.81"/><worldbody><body name="base" pos="0 0 1">
<geom type="sphere" size="0.05" mass="1" contype="0" conaffinity="0"/>
<body name="a" pos="0.1 0 0"><joint name="ja" type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.03" mass="1" contype="0" conaffinity="0"/></body>
<body name="b" pos="-0.1 0 0"><joint name="jb" type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 -0.4 0 0" size="0.03" mass="1" contype="0" conaffinity="0"/></body>
</body></worldbody>
<tendon><fixed name="tab" limited="true" range="-0.2 0.2"><joint joint="ja" coef="1"/><joint joint="jb" coef="1"/>
</fixed></tendon></mujoco>"""


def test_tree_and_dense_solvers_agree(tmp_path):
    """The tree-sparse factorisation and the dense Cholesky give the same steps (float64 round-off) with
    contacts, effort limits, pinned DOFs, tendons (MuJoCo humanoid) and ball-joint friction; the default
    uses the tree from a few hundred worlds on CPU. The torch step's solvers (the CPU fast path, which
    always factorises along the tree, is held to the torch step in tests/test_sim_fast.py)."""
    desc = MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml"))
    model = _model(desc, drive_stiffness=300.0, drive_damping=20.0, effort_limit=60.0)
    gen = torch.Generator().manual_seed(0)
    st0 = State.neutral(model, 6)
    st0.q[:, 2] += torch.linspace(-0.05, 0.4, 6, dtype=torch.float64)
    st0 = State.from_q(model, st0.q, 0.5 * torch.randn(6, model.nv, generator=gen, dtype=torch.float64))
    target = st0.q.clone()
    target[:, 7:] += 0.3
    pinned = torch.zeros(6, model.nv, dtype=torch.bool)
    pinned[1, 9] = pinned[2, 20] = True
    ctrl = Control(q_target=target, tau_feedforward=torch.full_like(st0.qd, 2.0), pinned=pinned)
    states = {}
    for solver in ("dense", "tree"):
        sim, st = Simulator(model, dt=1 / 60, solver=solver, fast_path=False), st0
        for _ in range(25):
            st = sim.step(st, ctrl).state
        states[solver] = st
    np.testing.assert_allclose(states["tree"].q.numpy(), states["dense"].q.numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(states["tree"].qd.numpy(), states["dense"].qd.numpy(), rtol=0, atol=1e-8)

    ball = _model(MJCFLoader.load(_write(tmp_path, "ball.xml", BALL)), free_root=False, gravity=(0, 0, -9.81))
    st0 = State.from_q(model=ball, q=State.neutral(ball, 3).q, qd=torch.randn(3, ball.nv, generator=gen).double())
    out = {}
    for solver in ("dense", "tree"):
        sim, st = Simulator(ball, dt=1 / 60, solver=solver, fast_path=False), st0
        for _ in range(30):
            st = sim.step(st).state
        out[solver] = st.qd.numpy()
    np.testing.assert_allclose(out["tree"], out["dense"], rtol=0, atol=1e-9)

    many = State.neutral(model, 300)  # auto: tree on CPU
    auto = Simulator(model, dt=1 / 60, fast_path=False).step(many, Control(q_target=many.q)).state
    dense = Simulator(model, dt=1 / 60, solver="dense", fast_path=False).step(many, Control(q_target=many.q)).state
    np.testing.assert_allclose(auto.qd.numpy(), dense.qd.numpy(), rtol=0, atol=1e-9)


def test_tree_solver_needs_couplings_on_one_branch(tmp_path):
    """A tendon joining two branches leaves the tree pattern: solver='tree' refuses the model, the
    default falls back to the dense factorisation (same result)."""
    model = _model(MJCFLoader.load(_write(tmp_path, "branched.xml", BRANCHED)), free_root=False)
    with pytest.raises(ValueError, match="two branches"):
        Simulator(model, dt=0.01, solver="tree")
    with pytest.raises(ValueError, match="solver must be one of"):
        Simulator(model, dt=0.01, solver="sparse")
    st = State.from_q(model, torch.tensor([[0.5, 0.4]] * 300, dtype=torch.float64))
    a = Simulator(model, dt=0.01).step(st).state.qd
    b = Simulator(model, dt=0.01, solver=ke.sim.LinearSolver.DENSE).step(st).state.qd
    assert torch.equal(a, b) and float(a[0].abs().max()) > 0


def test_undamped_chain_energy_does_not_drift_against_rk45(tmp_path):
    """10 s of the frictionless 3-link chain at h = 1/60 s: the mechanical energy stays within 1 % (of the
    peak kinetic energy) of scipy's RK45 on our own forward dynamics, whose energy is conserved to ~1e-7;
    without the energy correction the explicit gravity and Coriolis forces gain far more."""
    model = _model(MJCFLoader.load(_write(tmp_path, "chain.xml", CHAIN.format(damp=0))), free_root=False)
    q0, v0 = np.array([1.2, 0.4, -1.0]), np.array([2.0, -1.0, 3.0])

    def energy(q, qd):
        q, qd = torch.as_tensor(q), torch.as_tensor(qd)
        return (ke.sim.kinetic_energy(model, q, qd) + ke.sim.potential_energy(model, q)).numpy()

    def rhs(_, y):
        qdd = ke.sim.forward_dynamics(model, torch.as_tensor(y[:3]), torch.as_tensor(y[3:]))
        return np.concatenate([y[3:], qdd.numpy()])

    y0 = np.concatenate([q0, v0])
    ref = solve_ivp(rhs, (0, 10), y0, method="RK45", rtol=1e-8, atol=1e-9, t_eval=np.linspace(0, 10, 601))
    e_ref = energy(ref.y[:3].T, ref.y[3:].T)
    scale = float(ke.sim.kinetic_energy(model, torch.as_tensor(ref.y[:3].T), torch.as_tensor(ref.y[3:].T)).max())
    assert np.abs(e_ref - e_ref[0]).max() < 1e-5 * scale  # the reference conserves energy

    def drift(correction):
        sim = Simulator(model, dt=1 / 60, energy_correction=correction)
        st, corrections = State.from_q(model, q0, v0), []
        for _ in range(600):
            result = sim.step(st)
            st = result.state
            corrections.append(float(result.energy_correction[0]))
        return float(energy(st.q, st.qd)[0] - e_ref[-1]) / scale, np.array(corrections)

    fixed, corrections = drift(True)
    raw, none = drift(False)
    assert abs(fixed) < 0.01, fixed
    assert raw > 0.1, raw  # the uncorrected step gains energy (O(h))
    assert np.all(none == 0.0) and np.abs(corrections).max() > 0  # the correction is reported
