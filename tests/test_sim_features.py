"""Cycle joints, tendons and drive envelopes inside the implicit step, against MuJoCo and exact balances.

Oracles: MuJoCo's tendon lengths and moments (``ten_length``, ``ten_J``) at random poses; MuJoCo
trajectories of the same model (equality ``connect`` for a four-bar loop, fixed and spatial tendons with
stiffness and damping); the momentum balance of one backward-Euler step (``M (v1 - v0) / h + c = tau``) for
the force a tendon applies; the envelope inequalities themselves for the drives.

Why the trajectory tolerances are what they are: our step is backward Euler (forces at the end of the step),
MuJoCo's ``implicit`` integrator is semi-implicit Euler (positions and spring forces at the start, damping
implicit). Both are first-order methods for the same ODE, so their trajectories differ by ``C h`` over a fixed
time: the tests check that the difference is small at ``h = 1 ms`` *and* halves when ``h`` halves (ratio
0.5 +- 0.15), which a modelling difference (a wrong force, a wrong Jacobian, another constraint
stiffness) would not do: it leaves an ``O(1)`` floor that does not shrink with ``h``. The loop-closure
constraint differs too (our spring of 50000 N/m, MuJoCo's soft constraint with its ``solref``); both keep
the gap far below the difference being measured (< 0.1 mm against ~1 mrad), so it does not set a floor.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import data_file

import kangengine as ke
from kangengine.asset.desc import JointType
from kangengine.sim import runtime
from kangengine.sim.constraints import constraint_rows
from kangengine.sim.drives import with_drive_envelope
from kangengine.sim.ik import solve_ik
from kangengine.sim.pose import PoseTargets

mujoco = pytest.importorskip("mujoco")

F64 = torch.float64
NO_CONTACT = ke.sim.ContactParams(enabled=False)

FOURBAR = """
<mujoco model="fourbar">
  <option timestep="0.001" integrator="implicit"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="base">
      <geom type="box" size="0.2 0.02 0.01" pos="0.15 0 -0.01" mass="2"/>
      <body name="crank">
        <joint name="crank" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.2" size="0.01" mass="0.2"/>
        <body name="coupler" pos="0 0 0.2">
          <joint name="coupler" type="hinge" axis="0 1 0"/>
          <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.01" mass="0.3"/>
        </body>
      </body>
      <body name="rocker" pos="0.3 0 0">
        <joint name="rocker" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.2" size="0.01" mass="0.2"/>
      </body>
    </body>
  </worldbody>
  <equality>
    <connect name="loop" body1="coupler" body2="rocker" anchor="0.3 0 0" solref="0.002 1"
             solimp="0.99 0.999 0.001"/>
  </equality>
  <actuator>
    <position name="crank" joint="crank" kp="20" kv="1"/>
  </actuator>
</mujoco>
"""

TENDONS = """
<mujoco model="tendons">
  <option integrator="implicit"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="a" pos="0 0 1">
      <joint name="j0" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" mass="1"/>
      <site name="s0" pos="0.1 0 0.05"/>
      <body name="b" pos="0.3 0 0">
        <joint name="j1" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" mass="1"/>
        <site name="s1" pos="0.2 0 0.05"/>
        <site name="s2" pos="0.25 0.02 -0.04"/>
        <body name="c" pos="0.3 0 0">
          <joint name="j2" type="hinge" axis="1 0 0"/>
          <geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.03" mass="0.5"/>
          <site name="s3" pos="0.1 0.03 0"/>
        </body>
      </body>
    </body>
  </worldbody>
  <tendon>
    <fixed name="ft" stiffness="20" damping="1.5" springlength="0.1">
      <joint joint="j0" coef="1"/>
      <joint joint="j1" coef="-0.5"/>
    </fixed>
    <spatial name="st" stiffness="300" damping="2">
      <site site="s0"/>
      <site site="s1"/>
      <site site="s3"/>
    </spatial>
    <spatial name="pulley" stiffness="150" damping="0.5">
      <site site="s0"/>
      <site site="s2"/>
      <pulley divisor="2"/>
      <site site="s2"/>
      <site site="s3"/>
    </spatial>
  </tendon>
</mujoco>
"""


# the same model with joint damping: an undamped triple pendulum is chaotic, and the tendon comparison is
# about the tendon forces, not about how fast two integrators' round-off grows apart
TENDONS_DAMPED = TENDONS.replace('axis="0 1 0"/>', 'axis="0 1 0" damping="0.3"/>').replace(
    'axis="1 0 0"/>', 'axis="1 0 0" damping="0.1"/>'
)


def _write(tmp_path, name: str, xml: str) -> str:
    path = tmp_path / name
    path.write_text(xml)
    return str(path)


def _fourbar_model(path: str, **kw) -> ke.sim.Model:
    desc = ke.asset.MJCFLoader.load(path)
    return ke.sim.Model.from_desc(
        desc,
        free_root=False,
        dtype=F64,
        drive_stiffness={"crank": 20.0},
        drive_damping={"crank": 1.0},
        contact=NO_CONTACT,
        **kw,
    )


def _crank_target(t: float) -> float:
    return 0.5 * np.sin(2 * np.pi * t)


# -- cycle joints ---------------------------------------------------------------------------------------


def test_fourbar_stays_closed_under_gravity_and_drive(tmp_path):
    path = _write(tmp_path, "fourbar.xml", FOURBAR)
    model = _fourbar_model(path)
    assert model.constraints.cycle_names == ("loop",)
    assert float(model.constraints.stiffness[0]) == 50000.0  # the default of CycleJointDesc
    h = 2e-3
    sim = ke.sim.Simulator(model, dt=h)
    state = ke.sim.State.neutral(model, 2)
    qs = []
    for i in range(500):
        target = torch.zeros(2, 3, dtype=F64)
        target[:, 0] = torch.tensor([_crank_target(i * h), -0.8 * _crank_target(i * h)])
        state = sim.step(state, ke.sim.Control(q_target=target)).state
        qs.append(state.q)
    q = torch.cat(qs)
    gap = constraint_rows(model, q).value[:3].norm(dim=0)
    assert float(q[:, 0].abs().max()) > 0.3  # the mechanism really moved (crank swings ~0.5 rad)
    assert float(gap.max()) < 1e-3  # closed to < 1 mm throughout
    # the loop is what holds it: without the cycle row the rocker falls away from the coupler
    open_model = _fourbar_model(path, cycle_stiffness=0.0)
    st = ke.sim.Simulator(open_model, dt=2e-3)
    s = ke.sim.State.neutral(open_model, 1)
    s = ke.sim.State.from_q(open_model, s.q + 0.05)
    for _ in range(150):
        s = st.step(s).state
    assert float(constraint_rows(open_model, s.q).value[:3].norm()) > 0.01


def _fourbar_difference(model, mj, dt: float, duration: float = 0.5) -> float:
    mj.opt.timestep = dt
    data = mujoco.MjData(mj)
    sim = ke.sim.Simulator(model, dt=dt, iterations=3)
    state = ke.sim.State.neutral(model, 1)
    worst = 0.0
    for i in range(int(round(duration / dt))):
        target = _crank_target(i * dt)
        data.ctrl[0] = target
        mujoco.mj_step(mj, data)
        q_target = torch.zeros(1, 3, dtype=F64)
        q_target[0, 0] = target
        state = sim.step(state, ke.sim.Control(q_target=q_target)).state
        worst = max(worst, float(np.abs(state.q[0].numpy() - data.qpos).max()))
    return worst


def test_fourbar_trajectory_agrees_with_mujoco_connect(tmp_path):
    path = _write(tmp_path, "fourbar.xml", FOURBAR)
    model = _fourbar_model(path)
    mj = mujoco.MjModel.from_xml_path(path)
    coarse = _fourbar_difference(model, mj, 2e-3)
    fine = _fourbar_difference(model, mj, 1e-3)
    assert coarse < 1e-2, coarse  # rad, over 0.5 s of a 0.5 rad swing
    assert 0.35 < fine / coarse < 0.65, (coarse, fine)  # first order: the gap is integration error only


# -- tendons --------------------------------------------------------------------------------------------


def test_mjcf_reads_spatial_tendons_with_pulleys(tmp_path):
    desc = ke.asset.MJCFLoader.load(_write(tmp_path, "tendons.xml", TENDONS))
    assert [t.name for t in desc.tendons] == ["ft"]
    assert desc.tendons[0].spring_length == (0.1, 0.1)
    st, pulley = desc.spatial_tendons
    assert st.site_bodies == ("a", "b", "c") and st.segments == ((0, 1), (1, 2))
    assert pulley.segments == ((0, 1), (2, 3)) and pulley.segment_weights == (1.0, 0.5)
    np.testing.assert_allclose(st.site_positions[2], [0.1, 0.03, 0.0])
    assert (st.stiffness, st.damping) == (300.0, 2.0)


def test_mjcf_skips_a_tendon_wrapping_a_geom_with_a_warning(tmp_path):
    xml = TENDONS.replace(
        '<site site="s3"/>\n    </spatial>\n    <spatial name="pulley"',
        '<geom geom="wrap"/>\n      <site site="s3"/>\n    </spatial>\n    <spatial name="pulley"',
        1,
    )
    xml = xml.replace(
        '<site name="s3" pos="0.1 0.03 0"/>',
        '<site name="s3" pos="0.1 0.03 0"/>\n          <geom name="wrap" type="sphere" size="0.01" pos="0.05 0 0.2"/>',
    )
    with pytest.warns(UserWarning, match="wraps around a geom"):
        desc = ke.asset.MJCFLoader.load(_write(tmp_path, "wrap.xml", xml))
    assert [t.name for t in desc.spatial_tendons] == ["pulley"]


def _tendon_model(path: str) -> ke.sim.Model:
    return ke.sim.Model.from_desc(ke.asset.MJCFLoader.load(path), free_root=False, dtype=F64, contact=NO_CONTACT)


def _dense_tendon_moments(mj, data) -> np.ndarray:
    """``[ntendon, nv]`` from MuJoCo's ``ten_J`` (dense or compressed-row, by version)."""
    jac = np.asarray(data.ten_J).ravel()
    if jac.size == mj.ntendon * mj.nv:
        return jac.reshape(mj.ntendon, mj.nv)
    out = np.zeros((mj.ntendon, mj.nv))
    for t in range(mj.ntendon):
        adr, nnz = int(mj.ten_J_rowadr[t]), int(mj.ten_J_rownnz[t])
        out[t, mj.ten_J_colind[adr : adr + nnz]] = jac[adr : adr + nnz]
    return out


def test_tendon_lengths_and_moments_equal_mujoco(tmp_path):
    path = _write(tmp_path, "tendons.xml", TENDONS)
    model = _tendon_model(path)
    assert model.constraints.names == ("ft", "st", "pulley")
    mj = mujoco.MjModel.from_xml_path(path)
    data = mujoco.MjData(mj)
    rng = np.random.default_rng(3)
    for _ in range(5):
        q = rng.uniform(-1.5, 1.5, 3)
        data.qpos[:] = q
        mujoco.mj_forward(mj, data)
        rows = constraint_rows(model, torch.tensor(q[None]))
        np.testing.assert_allclose(rows.value[:, 0].numpy(), data.ten_length, atol=1e-12)
        np.testing.assert_allclose(rows.jacobian[0].numpy(), _dense_tendon_moments(mj, data), atol=1e-12)
    # rest lengths: the file's springlength for ft, MuJoCo's compiled length at qpos0 for the spatial ones
    np.testing.assert_allclose(model.constraints.spring_lower.numpy(), mj.tendon_lengthspring[:, 0], atol=1e-12)


def test_tendon_force_equals_the_formula(tmp_path):
    """One step's momentum balance: ``M (v1 - v0) / h + c(q0, v0) = J^T f`` with the tendon force
    ``f = -(k (l - l0) + c dl/dt)`` at the end of the step (``l = l(q0) + h J v1``, the step's linearised
    length; exact for the fixed tendon)."""
    model = _tendon_model(_write(tmp_path, "tendons.xml", TENDONS))
    h = 1e-3
    sim = ke.sim.Simulator(model, dt=h, iterations=4, energy_correction=False)
    q0 = torch.tensor([[0.4, -0.7, 0.9]], dtype=F64)
    v0 = torch.tensor([[1.5, -2.0, 3.0]], dtype=F64)
    v1 = sim.step(ke.sim.State.from_q(model, q0, v0)).state.qd
    rows = constraint_rows(model, q0)
    jac = rows.jacobian[0]
    rate = jac @ v1[0]
    length = rows.value[:, 0] + h * rate
    c = model.constraints
    force = -(c.stiffness * (length - c.spring_lower) + c.damping * rate)  # springlength is a point here
    lhs = ke.sim.mass_matrix(model, q0)[0] @ (v1 - v0)[0] / h + ke.sim.bias_forces(model, q0, v0)[0]
    np.testing.assert_allclose(lhs.numpy(), (jac.t() @ force).numpy(), rtol=1e-7, atol=1e-9)
    assert float(force.abs().min()) > 0.1  # every tendon pulls in this pose


def _tendon_difference(model, mj, dt: float, duration: float = 0.25) -> float:
    mj.opt.timestep = dt
    data = mujoco.MjData(mj)
    q0 = np.array([0.5, -0.6, 0.8])
    data.qpos[:] = q0
    sim = ke.sim.Simulator(model, dt=dt, iterations=2)
    state = ke.sim.State.from_q(model, torch.tensor(q0[None]))
    worst = 0.0
    for _ in range(int(round(duration / dt))):
        mujoco.mj_step(mj, data)
        state = sim.step(state).state
        worst = max(worst, float(np.abs(state.q[0].numpy() - data.qpos).max()))
    return worst


def test_tendon_trajectory_agrees_with_mujoco(tmp_path):
    path = _write(tmp_path, "tendons.xml", TENDONS_DAMPED)
    model = _tendon_model(path)
    assert float(model.dof_damping.min()) > 0
    mj = mujoco.MjModel.from_xml_path(path)
    coarse = _tendon_difference(model, mj, 2e-3)
    fine = _tendon_difference(model, mj, 1e-3)
    assert coarse < 1.5e-2, coarse
    assert 0.35 < fine / coarse < 0.65, (coarse, fine)
    # the tendons matter: without their rows the same start drifts far from MuJoCo's trajectory
    bare = dataclasses.replace(model, constraints=None)
    assert _tendon_difference(bare, mj, 2e-3) > 10 * coarse


def test_spatial_tendon_range_is_a_limit(tmp_path):
    # free of its spring, this tendon's length sweeps 0.495..0.62 m as the chain falls; the range stops it
    xml = TENDONS.replace('<spatial name="st" stiffness="300" damping="2">', '<spatial name="st" range="0.52 0.615">')
    model = ke.sim.Model.from_desc(
        ke.asset.MJCFLoader.load(_write(tmp_path, "limit.xml", xml)),
        free_root=False,
        dtype=F64,
        contact=NO_CONTACT,
        tendon_limit_stiffness=1e5,
        tendon_limit_damping=50.0,
    )
    assert model.constraints.lower[1] == 0.52 and model.constraints.upper[1] == 0.615
    sim = ke.sim.Simulator(model, dt=2e-3)
    state = ke.sim.State.from_q(model, torch.zeros(1, 3, dtype=F64))
    qs = []
    for _ in range(300):
        state = sim.step(state).state
        qs.append(state.q)
    length = constraint_rows(model, torch.cat(qs)).value[1]
    assert float(length.min()) > 0.52 - 2e-3 and float(length.max()) < 0.615 + 2e-3
    assert float(length.min()) < 0.525  # gravity really pushed it to the bound


# -- drive envelopes -----------------------------------------------------------------------------------


HINGE = """
<mujoco model="hinge">
  <worldbody>
    <body name="arm">
      <joint name="j" type="hinge" axis="0 0 1"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.02" mass="1.5"/>
      <body name="fore" pos="0.4 0 0">
        <joint name="k" type="hinge" axis="0 0 1"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.02" mass="1"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def _envelope_model(path, **env):
    model = ke.sim.Model.from_desc(
        ke.asset.MJCFLoader.load(path),
        free_root=False,
        dtype=F64,
        drive_stiffness=400.0,
        drive_damping=5.0,
        contact=NO_CONTACT,
    )
    return with_drive_envelope(model, **env)


WHEEL = """
<mujoco model="wheel">
  <worldbody>
    <body name="wheel">
      <joint name="spin" type="hinge" axis="0 0 1" damping="0.05"/>
      <geom type="cylinder" size="0.2 0.02" mass="2"/>
    </body>
  </worldbody>
</mujoco>
"""

ENVELOPE = {"max_effort": 6.0, "velocity_resistance": 0.5, "max_actuator_velocity": 9.0, "speed_effort_gradient": 1.2}


def test_drive_at_its_envelope_never_leaves_the_feasible_region(tmp_path):
    """A drive that alone moves its joint (a wheel about a vertical axis) asked for far targets, reversed
    now and then so that it also brakes against the motion: every step's effort and speed satisfy both
    envelope inequalities, and the drive reaches the envelope's corner speeds."""
    env = ENVELOPE
    model = _envelope_model(_write(tmp_path, "wheel.xml", WHEEL), **env)
    h = 2e-3
    sim = ke.sim.Simulator(model, dt=h)
    worlds = 4
    state = ke.sim.State.neutral(model, worlds)
    targets = torch.tensor([[40.0], [-40.0], [3.0], [15.0]], dtype=F64)
    speeds, efforts, saturated = [], [], 0
    for i in range(500):
        sign = 1.0 if (i // 125) % 2 == 0 else -1.0
        res = sim.step(state, ke.sim.Control(q_target=state.q.detach() + sign * targets))
        state = res.state
        speeds.append(state.qd.abs())
        efforts.append(res.drive_force.abs())
        saturated += int(res.drive_saturated.sum())
    s, e = torch.stack(speeds), torch.stack(efforts)
    tol = 1e-9
    assert bool((e <= env["max_effort"] - env["velocity_resistance"] * s + tol).all())
    assert bool((s <= env["max_actuator_velocity"] - env["speed_effort_gradient"] * e + tol).all())
    assert saturated > 500
    # it got close to the no-load speed (effort 0 at 9 rad/s less damping) and used its full effort
    assert float(s.max()) > 8.0 and float(e.max()) > 5.5
    # the constant clamp alone would have let it run faster than the actuator can
    plain = dataclasses.replace(model, drive_envelope=None)
    plain = dataclasses.replace(plain, dof_effort_limit=torch.full_like(plain.dof_effort_limit, env["max_effort"]))
    sim_plain, st = ke.sim.Simulator(plain, dt=h), ke.sim.State.neutral(plain, 1)
    for _ in range(125):
        st = sim_plain.step(st, ke.sim.Control(q_target=st.q + 40.0)).state
    assert float(st.qd.abs().max()) > env["max_actuator_velocity"] + 1.0


@pytest.mark.parametrize(
    ("target", "iterations"),
    [((20.0, -20.0), 2), ((-20.0, 20.0), 8)],
    ids=["accelerating", "braking"],
)
def test_envelope_effort_reported_is_the_effort_applied(tmp_path, target, iterations):
    """One step's momentum balance on a two-link arm with saturated, speed-limited drives:
    ``M (v1 - v0) / h + c = tau_drive`` with the effort the step reports, which is the envelope's bound at
    the step's final speed. Accelerating, Newton has the bound's slope and converges quadratically (the
    default 2 iterations); braking, the bound is lagged (its slope would make the Hessian indefinite) and
    converges linearly, so the balance is checked after 8."""
    model = _envelope_model(_write(tmp_path, "hinge.xml", HINGE), **ENVELOPE)
    h = 2e-3
    sim = ke.sim.Simulator(model, dt=h, iterations=iterations, energy_correction=False)
    state = ke.sim.State.from_q(model, torch.tensor([[0.3, -0.2]], dtype=F64), torch.tensor([[4.0, -6.0]], dtype=F64))
    res = sim.step(state, ke.sim.Control(q_target=torch.tensor([target], dtype=F64)))
    assert bool(res.drive_saturated.all())
    q0, v0, v1 = state.q, state.qd, res.state.qd
    lhs = (ke.sim.mass_matrix(model, q0)[0] @ (v1 - v0)[0]) / h + ke.sim.bias_forces(model, q0, v0)[0]
    np.testing.assert_allclose(lhs.numpy(), res.drive_force[0].numpy(), rtol=0, atol=1e-5)
    bound = model.drive_envelope.effort_bound(v1.abs().t()).t()
    np.testing.assert_allclose(res.drive_force.abs().numpy(), bound.numpy(), rtol=1e-12)


def test_max_joint_velocity_holds_whatever_drives_the_joint(tmp_path):
    path = _write(tmp_path, "hinge.xml", HINGE)
    model = _envelope_model(path, max_effort=50.0, max_joint_velocity=2.0)
    sim = ke.sim.Simulator(model, dt=2e-3)
    state = ke.sim.State.neutral(model, 1)
    top = 0.0
    for _ in range(300):  # the drive pulls hard and an external torque pushes too
        res = sim.step(
            state,
            ke.sim.Control(
                q_target=torch.tensor([[30.0, -30.0]], dtype=F64), tau_external=torch.tensor([[5.0, -5.0]], dtype=F64)
            ),
        )
        state = res.state
        top = max(top, float(state.qd.abs().max()))
    assert 1.95 < top < 2.0 * (1 + 2e-3)


# -- pose controller and IK ---------------------------------------------------------------------------

G1 = "mjcf/unitree/g1_29dof.nomesh.xml"
RIGHT_ARM = {
    "right_shoulder_pitch_joint": -0.6,
    "right_shoulder_roll_joint": -0.3,
    "right_shoulder_yaw_joint": 0.2,
    "right_elbow_joint": 0.9,
    "right_wrist_roll_joint": 0.3,
    "right_wrist_pitch_joint": -0.2,
    "right_wrist_yaw_joint": 0.1,
}


def _g1(**kw) -> ke.sim.Model:
    desc = ke.asset.MJCFLoader.load(data_file(G1))
    return ke.sim.Model.from_desc(desc, free_root=False, dtype=F64, contact=NO_CONTACT, **kw)


def test_pose_controller_brings_a_g1_hand_to_a_cartesian_target():
    """Pelvis fixed, gravity on, every joint but the right arm's held by joint-space PD (a hybrid): the
    hand's position and rotation targets (from FK at another arm pose) are reached to the sag the Cartesian
    springs allow under the arm's weight."""
    desc = ke.asset.MJCFLoader.load(data_file(G1))
    others = [j.name for j in desc.joints if j.name not in RIGHT_ARM and j.type is not JointType.FREE]
    model = _g1(
        drive_stiffness=dict.fromkeys(others, 200.0),
        drive_damping=dict.fromkeys(others, 10.0),
        joint_damping=dict.fromkeys(RIGHT_ARM, 1.0),
    )
    q_goal = torch.zeros(1, model.nq, dtype=F64)
    for name, value in RIGHT_ARM.items():
        q_goal[0, model.layout.block(name).q_slice] = value
    pos, rot = ke.sim.link_transforms(model, q_goal)
    hand = model.body_names.index("right_wrist_yaw_link")
    start, _ = ke.sim.link_transforms(model, torch.zeros_like(q_goal))
    assert float((start[0, hand] - pos[0, hand]).norm()) > 0.1  # 10 cm to go
    targets = PoseTargets.from_names(
        model,
        ["right_wrist_yaw_link"],
        position_world=pos[:, [hand]],
        rotation_wxyz=rot[:, [hand]],
        position_stiffness=2e4,
        position_damping=300.0,
        rotation_stiffness=200.0,
        rotation_damping=5.0,
    )
    sim = ke.sim.Simulator(model, dt=2e-3)
    state = ke.sim.State.neutral(model, 1)
    control = ke.sim.Control(q_target=torch.zeros_like(q_goal), pose_targets=targets)
    for _ in range(300):
        state = sim.step(state, control).state
    p, r = ke.sim.link_transforms(model, state.q)
    assert float((p[0, hand] - pos[0, hand]).norm()) < 2e-3  # m
    assert float(ke.rotations.quat_angle_between(r[0, hand], rot[0, hand])) < 2e-2  # rad
    # the other joints kept their joint-space targets
    other_dofs = [model.layout.block(n).qd_offset for n in others]
    assert float(state.q[0, other_dofs].abs().max()) < 5e-2


def test_pose_targets_reject_bad_input():
    model = _g1()
    with pytest.raises(ke.errors.UnknownNameError, match="right_wrist_yaw_link"):
        PoseTargets.from_names(model, ["right_hand"], position_world=torch.zeros(1, 1, 3, dtype=F64))
    with pytest.raises(ke.errors.ShapeError, match="pose.position_world"):
        PoseTargets.from_names(model, ["pelvis"], position_world=torch.zeros(1, 2, 3, dtype=F64))


def test_ik_reaches_reachable_targets_and_reports_unreachable_ones():
    model = _g1()
    gen = torch.Generator().manual_seed(0)
    q_true = model.dof_lower + (model.dof_upper - model.dof_lower) * torch.rand(4, model.nv, generator=gen, dtype=F64)
    pos, rot = ke.sim.link_transforms(model, q_true)
    names = ["right_wrist_yaw_link", "left_wrist_yaw_link"]
    hands = [model.body_names.index(n) for n in names]
    goal = pos[:, hands].clone()
    goal[3, 0, 0] += 2.0  # 2 m in front of a reachable pose: out of reach
    result = solve_ik(model, PoseTargets.from_names(model, names, position_world=goal))
    assert bool(result.reached[:3].all())
    assert float(result.position_error[:3].max()) < 1e-3
    assert not bool(result.reached[3, 0])
    # what it reports is the real remaining distance (FK of its answer), and it did come closer
    got, _ = ke.sim.link_transforms(model, result.q)
    np.testing.assert_allclose(
        result.position_error.numpy(), (got[:, hands] - goal).norm(dim=-1).numpy(), rtol=1e-9, atol=1e-12
    )
    assert float(result.position_error[3, 0]) > 1.0
    # alone, the unreachable target draws the hand as close as the body allows (closer than it started)
    alone = solve_ik(model, PoseTargets.from_names(model, names[:1], position_world=goal[3:, :1]))
    start, _ = ke.sim.link_transforms(model, torch.zeros(1, model.nq, dtype=F64))
    assert not bool(alone.reached.any())
    assert 1.0 < float(alone.position_error[0, 0]) < float((start[0, hands[0]] - goal[3, 0]).norm()) - 0.1
    # within the joint ranges (fixed base: q holds the hinges in DOF order)
    assert bool((result.q >= model.dof_lower).all() and (result.q <= model.dof_upper).all())
    # position and rotation together
    both = PoseTargets.from_names(model, names[:1], position_world=pos[:, hands[:1]], rotation_wxyz=rot[:, hands[:1]])
    result = solve_ik(model, both)
    assert bool(result.reached.all()) and float(result.rotation_error.max()) < 1e-2


# -- runtime helpers --------------------------------------------------------------------------------------


def test_runtime_queries_equal_mujoco_and_round_trip():
    path = data_file(G1)
    mj = mujoco.MjModel.from_xml_path(str(path))
    model = ke.sim.Model.from_desc(ke.asset.MJCFLoader.load(path), dtype=F64, contact=NO_CONTACT)
    assert runtime.total_mass(model) == pytest.approx(float(mj.body_mass.sum()), rel=1e-12)
    limits = runtime.dof_limits(model)[6:]  # the hinges after the free root's six DOFs
    np.testing.assert_allclose(limits.numpy(), mj.jnt_range[1:], atol=1e-12)
    gen = torch.Generator().manual_seed(1)
    state = ke.sim.State.neutral(model, 3)
    q_a = runtime.add_delta_to_pose(model, state.q, torch.randn(3, model.nv, generator=gen, dtype=F64) * 0.5)
    q_b = runtime.add_delta_to_pose(model, state.q, torch.randn(3, model.nv, generator=gen, dtype=F64) * 0.5)
    delta = runtime.pose_delta(model, q_a, q_b)
    back = runtime.add_delta_to_pose(model, q_a, delta)
    np.testing.assert_allclose(
        ke.sim.link_transforms(model, back)[0], ke.sim.link_transforms(model, q_b)[0], atol=1e-12
    )
    # teleport: the root goes where it is told and the body moves rigidly with it
    st = runtime.pose_from_joints(model, q_a)
    pos0, _ = ke.sim.link_transforms(model, st.q)
    new_pos = torch.tensor([[1.0, 2.0, 0.8]], dtype=F64).expand(3, 3)
    new_rot = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64).expand(3, 4)
    moved = runtime.set_root_transform(model, st, new_pos, new_rot)
    root_pos, root_rot = runtime.root_transform(model, moved)
    np.testing.assert_allclose(root_pos.numpy(), new_pos.numpy(), atol=1e-12)
    np.testing.assert_allclose(root_rot.numpy(), new_rot.numpy(), atol=1e-12)
    pos1, _ = ke.sim.link_transforms(model, moved.q)
    dist = lambda p: (p[:, :, None] - p[:, None]).norm(dim=-1)
    np.testing.assert_allclose(dist(pos1).numpy(), dist(pos0).numpy(), atol=1e-12)
    fixed = _g1()
    with pytest.raises(ke.errors.ShapeError, match="fixed to the world"):
        runtime.set_root_transform(fixed, ke.sim.State.neutral(fixed, 1), new_pos[:1], new_rot[:1])
    # the per-link Jacobian is the derivative of the link's origin (central differences)
    link = "left_wrist_yaw_link"
    jac = runtime.link_jacobian(model, q_a[:1], link)[0, :3]
    b = model.body_names.index(link)
    eps = 1e-6
    fd = torch.stack(
        [
            (
                ke.sim.link_transforms(model, runtime.add_delta_to_pose(model, q_a[:1], eps * e))[0][0, b]
                - ke.sim.link_transforms(model, runtime.add_delta_to_pose(model, q_a[:1], -eps * e))[0][0, b]
            )
            / (2 * eps)
            for e in torch.eye(model.nv, dtype=F64)[:, None]
        ],
        dim=-1,
    )
    np.testing.assert_allclose(jac.numpy(), fd.numpy(), atol=1e-7)


@pytest.mark.parametrize("free_root", [False, True], ids=["fixed", "free"])
def test_pose_from_links_recovers_the_joint_values(free_root):
    """Link transforms from FK at random joint values (and a random root pose, with the ground contact on:
    the search ignores it) give back those values."""
    model = ke.sim.Model.from_desc(ke.asset.MJCFLoader.load(data_file(G1)), free_root=free_root, dtype=F64)
    gen = torch.Generator().manual_seed(2)
    lo = torch.where(torch.isfinite(model.dof_lower), model.dof_lower, -1.0)
    hi = torch.where(torch.isfinite(model.dof_upper), model.dof_upper, 1.0)
    delta = lo + (hi - lo) * (0.1 + 0.8 * torch.rand(3, model.nv, generator=gen, dtype=F64))
    q_true = runtime.add_delta_to_pose(model, ke.sim.State.neutral(model, 3).q, delta)
    pos, rot = ke.sim.link_transforms(model, q_true)
    state, residual = runtime.pose_from_links(model, pos, rot)
    assert float(residual.max()) < 1e-6
    got, _ = ke.sim.link_transforms(model, state.q)
    np.testing.assert_allclose(got.numpy(), pos.numpy(), atol=1e-9)
    np.testing.assert_allclose(runtime.pose_delta(model, q_true, state.q).numpy(), 0.0, atol=1e-9)


def test_friction_and_joint_inertia_change_between_steps_without_a_new_model():
    """Changed mid-run, the step equals that of a model built with the new values from the start."""
    desc = ke.asset.MJCFLoader.load(data_file(G1))
    kw = {"free_root": False, "dtype": F64, "contact": NO_CONTACT, "drive_stiffness": 50.0, "drive_damping": 2.0}
    model = ke.sim.Model.from_desc(desc, **kw)
    sim = ke.sim.Simulator(model, dt=2e-3)
    state = ke.sim.State.from_q(model, torch.full((2, model.nq), 0.2, dtype=F64))
    control = ke.sim.Control(q_target=torch.zeros(2, model.nq, dtype=F64))
    for _ in range(5):
        state = sim.step(state, control).state
    runtime.set_joint_inertia(sim, 0.05)
    runtime.set_joint_friction(sim, 0.3)
    assert float(sim.model.dof_armature.min()) == 0.05 and sim.model.body_mass is model.body_mass  # shared
    fresh = ke.sim.Simulator(ke.sim.Model.from_desc(desc, armature=0.05, joint_friction=0.3, **kw), dt=2e-3)
    a, b = state, state
    for _ in range(5):
        a, b = sim.step(a, control).state, fresh.step(b, control).state
    np.testing.assert_allclose(a.q.numpy(), b.q.numpy(), atol=1e-12)
    untouched = ke.sim.Simulator(model, dt=2e-3)
    c = state
    for _ in range(5):
        c = untouched.step(c, control).state
    assert float((c.q - a.q).abs().max()) > 1e-4  # the change mattered


# -- mimic joints from a natural frequency and damping ratio -------------------------------------------

GRIPPER = """
<mujoco model="gripper">
  <option integrator="implicit"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="palm">
      <geom type="box" size="0.05 0.02 0.01" mass="0.5"/>
      <body name="left" pos="-0.03 0 0">
        <joint name="left" type="hinge" axis="0 1 0" damping="0.01"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.08" size="0.008" mass="0.05"/>
      </body>
      <body name="right" pos="0.03 0 0">
        <joint name="right" type="hinge" axis="0 1 0" damping="0.01"/>
        <geom type="capsule" fromto="0 0 0 0 0 0.08" size="0.008" mass="0.08"/>
      </body>
    </body>
  </worldbody>
  <equality>
    <joint joint1="right" joint2="left" polycoef="0.1 -1 0 0 0" solref="0.02 1" solimp="0.9999 0.9999 0.001"/>
  </equality>
  <actuator><position joint="left" kp="2" kv="0.05"/></actuator>
</mujoco>
"""


def _gripper(path, omega, **kw):
    return ke.sim.Model.from_desc(
        ke.asset.MJCFLoader.load(path),
        free_root=False,
        dtype=F64,
        contact=NO_CONTACT,
        drive_stiffness={"left": 2.0},
        drive_damping={"left": 0.05},
        mimic_natural_frequency=omega,
        **kw,
    )


def test_mimic_ratio_stays_within_the_compliance_its_parameters_imply(tmp_path):
    """``right = -left + 0.1`` with omega = 200 rad/s, zeta = 1: the spring is ``k = m omega^2`` with the
    row's effective mass ``m = 1 / (J M^-1 J^T)`` (from our CRBA, checked against MuJoCo elsewhere); a torque
    on the follower with the leader pinned leaves exactly ``r = tau / k``, reached without overshoot."""
    path = _write(tmp_path, "gripper.xml", GRIPPER)
    omega = 200.0
    model = _gripper(path, omega, gravity=(0.0, 0.0, 0.0))
    assert model.coupling_names == () and model.constraints.names == ("mimic right",)
    jac = torch.tensor([1.0, 1.0], dtype=F64)  # r = q_right + q_left - 0.1 (DOF order: left, right)
    mass = ke.sim.mass_matrix(model, torch.zeros(1, 2, dtype=F64))[0]
    k = omega**2 / float(jac @ torch.linalg.solve(mass, jac))
    assert float(model.constraints.stiffness[0]) == pytest.approx(k, rel=1e-12)
    tau = 0.02
    sim = ke.sim.Simulator(model, dt=1e-3)
    state = ke.sim.State.from_q(model, torch.tensor([[0.0, 0.1]], dtype=F64))
    control = ke.sim.Control(pinned=torch.tensor([[True, False]]), tau_external=torch.tensor([[0.0, tau]], dtype=F64))
    r = []
    for _ in range(400):
        state = sim.step(state, control).state
        r.append(float(state.q[0, 0] + state.q[0, 1] - 0.1))
    np.testing.assert_allclose(r[-1], tau / k, rtol=1e-3)  # the follower gives way by tau / k
    assert max(abs(x) for x in r) < abs(tau / k) * 1.02  # critically damped (with the pin): no overshoot


def _gripper_difference(model, mj, dt, duration=0.5):
    mj.opt.timestep = dt
    data = mujoco.MjData(mj)
    data.qpos[:] = [0.0, 0.1]
    sim = ke.sim.Simulator(model, dt=dt)
    state = ke.sim.State.from_q(model, torch.tensor([[0.0, 0.1]], dtype=F64))
    worst = 0.0
    for i in range(int(round(duration / dt))):
        target = 0.6 * np.sin(4 * np.pi * i * dt)
        data.ctrl[0] = target
        mujoco.mj_step(mj, data)
        state = sim.step(state, ke.sim.Control(q_target=torch.tensor([[target, 0.0]], dtype=F64))).state
        worst = max(worst, float(np.abs(state.q[0].numpy() - data.qpos).max()))
    return worst


def test_mimic_trajectory_agrees_with_mujoco_joint_equality(tmp_path):
    """A stiff mimic (omega = 3000 rad/s: its compliance leaves ~1e-4 rad under these loads) against
    MuJoCo's joint equality (impedance 0.9999, nearly hard): first-order agreement as for the tendons."""
    path = _write(tmp_path, "gripper.xml", GRIPPER)
    model = _gripper(path, 3000.0)
    mj = mujoco.MjModel.from_xml_path(path)
    coarse = _gripper_difference(model, mj, 2e-3)
    fine = _gripper_difference(model, mj, 1e-3)
    assert coarse < 5e-2, coarse
    assert 0.35 < fine / coarse < 0.65, (coarse, fine)


# -- contact filtering ---------------------------------------------------------------------------------

CHAIN = """
<mujoco model="chain">
  <worldbody>
    <body name="a">
      <geom name="ga" type="capsule" fromto="0 0 0 0.2 0 0" size="0.02"/>
      <body name="b" pos="0.2 0 0">
        <joint name="jb" type="hinge" axis="0 0 1"/>
        <geom name="gb" type="capsule" fromto="0 0 0 0.2 0 0" size="0.02"/>
        <body name="c" pos="0.2 0 0">
          <joint name="jc" type="hinge" axis="0 0 1"/>
          <geom name="gc" type="capsule" fromto="0 0 0 0.2 0 0" size="0.02" contype="2" conaffinity="2"/>
          <body name="d" pos="0.2 0 0">
            <joint name="jd" type="hinge" axis="0 0 1"/>
            <geom name="gd" type="capsule" fromto="0 0 0 0.2 0 0" size="0.02"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def test_contact_filtering_by_adjacency_layers_and_overrides(tmp_path):
    desc = ke.asset.MJCFLoader.load(_write(tmp_path, "chain.xml", CHAIN))
    contact = ke.sim.ContactParams(self_collision=True)

    def pairs(**kw):
        model = ke.sim.Model.from_desc(desc, free_root=False, contact=contact, **kw)
        return sorted(tuple(sorted(p)) for p in model.self_pair_names)

    # adjacency removes a-b, b-c, c-d; gc's masks (2) meet no other geom's (1)
    assert pairs() == [("ga", "gd"), ("gb", "gd")]
    layers = {"a": "arm", "b": "arm", "c": "hand", "d": "hand"}
    assert pairs(contact_layers=layers, layer_contacts={("hand", "arm"): False}) == []
    assert pairs(contact_layers=layers, layer_contacts={("arm", "arm"): False}) == [("ga", "gd"), ("gb", "gd")]
    # a per-pair override has the last word: on beats adjacency, layers and masks; off removes a pair
    got = pairs(
        contact_layers=layers,
        layer_contacts={("hand", "arm"): False},
        contact_overrides={("b", "c"): True, ("d", "a"): True},
    )
    assert got == [("ga", "gd"), ("gb", "gc")]
    assert pairs(contact_overrides={("a", "d"): False}) == [("gb", "gd")]
    with pytest.raises(ke.errors.UnknownNameError, match="no link 'e'"):
        pairs(contact_overrides={("a", "e"): True})


def test_model_setters_rebuild_the_step_cache_and_check_input():
    model = _g1()
    stiff = model.with_joint_inertia(0.1).with_joint_friction(torch.full((model.nv,), 0.2, dtype=F64))
    assert stiff.step_cache is not model.step_cache and stiff.body_inertia is model.body_inertia
    np.testing.assert_allclose(
        ke.sim.mass_matrix(stiff, torch.zeros(1, model.nq, dtype=F64))[0].numpy()
        - ke.sim.mass_matrix(model, torch.zeros(1, model.nq, dtype=F64))[0].numpy(),
        0.1 * np.eye(model.nv),
        atol=1e-12,
    )
    with pytest.raises(ke.errors.ShapeError, match="armature"):
        model.with_joint_inertia(torch.zeros(3, dtype=F64))
    with pytest.raises(ke.errors.ShapeError, match="coulomb"):
        model.with_joint_friction(-1.0)


# -- hard mimic joints (an equality constraint of the Newton solve) -------------------------------------


def test_hard_mimic_holds_the_ratio_exactly_where_the_compliant_one_gives_way(tmp_path):
    """``right = -left + 0.1``. Hard (the default without compliance parameters): driven and gravity-loaded
    for 2 s, the residual stays at round-off (< 1e-9 rad; each step solves ``C (q + h v) + b = 0`` exactly,
    so it does not accumulate). Under a static torque on the follower with the leader pinned, the hard pair
    does not move while the compliant one (omega = 200 rad/s) deflects by ``tau / k`` with ``k = m omega^2``."""
    path = _write(tmp_path, "gripper.xml", GRIPPER)
    desc = ke.asset.MJCFLoader.load(path)
    common = dict(free_root=False, dtype=F64, contact=NO_CONTACT, drive_stiffness={"left": 2.0})
    hard = ke.sim.Model.from_desc(desc, gravity=(4.0, 0.0, -9.81), **common)
    assert hard.mimic_names == ("mimic right",) and hard.coupling_names == () and hard.constraints is None
    dt = 2e-3
    sim = ke.sim.Simulator(hard, dt=dt)
    state = ke.sim.State.from_q(hard, torch.tensor([[0.0, 0.1]], dtype=F64))
    worst, travel = 0.0, 0.0
    for i in range(1000):
        target = torch.tensor([[0.6 * np.sin(4 * np.pi * i * dt), 0.0]], dtype=F64)
        state = sim.step(state, ke.sim.Control(q_target=target)).state
        worst = max(worst, abs(float(state.q[0, 0] + state.q[0, 1] - 0.1)))
        travel = max(travel, abs(float(state.q[0, 0])))
    assert travel > 0.3  # the pair really moved
    assert worst < 1e-9, worst

    tau, omega = 0.02, 200.0
    control = ke.sim.Control(pinned=torch.tensor([[True, False]]), tau_external=torch.tensor([[0.0, tau]], dtype=F64))
    for mode, kw in (("hard", {}), ("compliant", {"mimic_natural_frequency": omega})):
        model = ke.sim.Model.from_desc(desc, gravity=(0.0, 0.0, 0.0), mimic=mode, **common, **kw)
        sim = ke.sim.Simulator(model, dt=dt)
        state = ke.sim.State.from_q(model, torch.tensor([[0.0, 0.1]], dtype=F64))
        for _ in range(200):
            state = sim.step(state, control).state
        r = float(state.q[0, 0] + state.q[0, 1] - 0.1)
        if mode == "hard":
            assert abs(r) < 1e-12 and float(state.qd.abs().max()) < 1e-9, (r, state.qd)
        else:
            k = float(model.constraints.stiffness[0])
            np.testing.assert_allclose(r, tau / k, rtol=1e-3)


def test_hard_mimic_trajectory_agrees_with_mujoco_stiff_joint_equality(tmp_path):
    """The hard pair against MuJoCo's joint equality with a stiff ``solref`` (5 ms, impedance 0.9999: its
    own violation stays ~1e-5 rad here, far below the integrators' difference): first-order agreement, the
    difference halving with ``h`` like the tendons' (see the module docstring)."""
    path = _write(tmp_path, "gripper.xml", GRIPPER.replace('solref="0.02 1"', 'solref="0.005 1"'))
    model = ke.sim.Model.from_desc(
        ke.asset.MJCFLoader.load(path),
        free_root=False,
        dtype=F64,
        contact=NO_CONTACT,
        drive_stiffness={"left": 2.0},
        drive_damping={"left": 0.05},
        mimic="hard",
    )
    assert model.mimic_names == ("mimic right",)
    mj = mujoco.MjModel.from_xml_path(path)
    coarse = _gripper_difference(model, mj, 2e-3)
    fine = _gripper_difference(model, mj, 1e-3)
    assert coarse < 5e-2, coarse
    assert 0.35 < fine / coarse < 0.65, (coarse, fine)


MIMIC_TREE = """
<mujoco model="mimic_tree">
  <option integrator="implicit" gravity="0 0 -9.81"/>
  <default><geom contype="0" conaffinity="0"/><joint type="hinge" axis="0 1 0" damping="0.02"/></default>
  <worldbody>
    <body name="base">
      <geom type="box" size="0.05 0.05 0.02" mass="1"/>
      <body name="a1" pos="0.05 0 0">
        <joint name="j1"/>
        <geom type="capsule" fromto="0 0 0 0.1 0 0" size="0.01" mass="0.2"/>
        <body name="a2" pos="0.1 0 0">
          <joint name="j2"/>
          <geom type="capsule" fromto="0 0 0 0.1 0 0" size="0.01" mass="0.15"/>
          <body name="a3" pos="0.1 0 0">
            <joint name="j3"/>
            <geom type="capsule" fromto="0 0 0 0.08 0 0" size="0.01" mass="0.1"/>
          </body>
        </body>
      </body>
      <body name="b1" pos="-0.05 0 0">
        <joint name="j4"/>
        <geom type="capsule" fromto="0 0 0 -0.1 0 0" size="0.01" mass="0.2"/>
      </body>
    </body>
  </worldbody>
  <equality>
    <joint joint1="j3" joint2="j2" polycoef="0 -0.8 0 0 0" solref="0.005 1" solimp="0.9999 0.9999 0.001"/>
    <joint joint1="j2" joint2="j1" polycoef="0.1 0.5 0 0 0" solref="0.005 1" solimp="0.9999 0.9999 0.001"/>
    <joint joint1="j4" joint2="j1" polycoef="-0.05 -1.5 0 0 0" solref="0.005 1" solimp="0.9999 0.9999 0.001"/>
  </equality>
  <actuator><position joint="j1" kp="3" kv="0.1"/></actuator>
</mujoco>
"""


def _tree_difference(model, mj, dt, duration=0.5):
    mj.opt.timestep = dt
    data = mujoco.MjData(mj)
    q0 = np.array([0.0, 0.1, -0.08, -0.05])  # on the constraints
    data.qpos[:] = q0
    sim = ke.sim.Simulator(model, dt=dt)
    state = ke.sim.State.from_q(model, torch.tensor(q0[None], dtype=F64))
    worst, resid = 0.0, 0.0
    for i in range(int(round(duration / dt))):
        target = 0.5 * np.sin(3 * np.pi * i * dt)
        data.ctrl[0] = target
        mujoco.mj_step(mj, data)
        state = sim.step(state, ke.sim.Control(q_target=torch.tensor([[target, 0.0, 0.0, 0.0]], dtype=F64))).state
        q = state.q[0].numpy()
        worst = max(worst, float(np.abs(q - data.qpos).max()))
        resid = max(resid, abs(q[2] + 0.8 * q[1]), abs(q[1] - 0.1 - 0.5 * q[0]), abs(q[3] + 0.05 + 1.5 * q[0]))
    return worst, resid


def test_hard_mimic_chain_and_a_mimic_across_branches(tmp_path):
    """``j3`` mimics ``j2``, which mimics ``j1``; ``j4``, on another branch, mimics ``j1``: one Schur solve
    holds all three rows (residual < 1e-9 rad under gravity and the drive) and the trajectory agrees with
    MuJoCo's stiff joint equalities to first order. The cross-branch row rules out the tree-sparse solver."""
    path = _write(tmp_path, "mimic_tree.xml", MIMIC_TREE)
    desc = ke.asset.MJCFLoader.load(path)
    model = ke.sim.Model.from_desc(
        desc, free_root=False, dtype=F64, contact=NO_CONTACT, drive_stiffness={"j1": 3.0}, drive_damping={"j1": 0.1}
    )
    assert model.mimic_names == ("mimic j3", "mimic j2", "mimic j4")
    mj = mujoco.MjModel.from_xml_path(path)
    coarse, resid_c = _tree_difference(model, mj, 2e-3)
    fine, resid_f = _tree_difference(model, mj, 1e-3)
    assert max(resid_c, resid_f) < 1e-9, (resid_c, resid_f)
    assert coarse < 5e-2, coarse
    assert 0.35 < fine / coarse < 0.65, (coarse, fine)
    with pytest.raises(ValueError, match="hard mimic joints need solver='dense'"):
        ke.sim.Simulator(model, dt=1e-3, solver="tree")


def test_mimic_mode_per_joint_and_bad_modes(tmp_path):
    desc = ke.asset.MJCFLoader.load(_write(tmp_path, "mimic_tree.xml", MIMIC_TREE))
    build = lambda **kw: ke.sim.Model.from_desc(desc, free_root=False, contact=NO_CONTACT, **kw)
    mixed = build(mimic={"j4": "compliant"})
    assert mixed.mimic_names == ("mimic j3", "mimic j2") and mixed.coupling_names == ("mimic j4",)
    assert build(mimic_stiffness=1e3).mimic_names == ()  # compliance parameters given: compliant by default
    assert build(mimic="hard", mimic_natural_frequency=100.0).constraints is None
    with pytest.raises(ke.errors.UnknownNameError, match="must be one of 'hard', 'compliant'"):
        build(mimic="rigid")
    with pytest.raises(ke.errors.UnknownNameError, match="mimics no other"):
        build(mimic={"j1": "hard"})
