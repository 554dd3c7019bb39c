"""The effort-weighted contact distribution of the reference's feed-forward (``TrackingSettings.fit_effort``,
``kangengine/sim/tracking.py`` item 3): among the cone forces that explain the root's wrench, those that minimise
the joints' torques relative to their effort limits.

Oracles outside the fit: scipy's SLSQP solving the same equality-constrained problem on real frames of CMU 08_02
on dm_control's CMU humanoid (its generalised forces built here from the link Jacobians), and the analytic split of
a body leaning forward on two feet with a weak and a strong ankle (the torque goes where it is cheap, in the ratio
of the squared limits). The real walks: 07_01 whole on the suite model's motors drops from 11.4 % to 8.2 % of frames
needing over 3x a limit (the ``effort_over_limit`` rule's reject ratio), reference-side (no tracking), while the
unsupported wrench of every frame stays what the minimum-norm fit leaves.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import cmu_humanoid, data_file, free_root_model
from scipy.optimize import minimize

import kangengine as ke
from kangengine.sim import TrackingSettings
from kangengine.sim import tracking as T
from kangengine.sim.dynamics import inverse_dynamics
from kangengine.sim.kinematics import link_jacobians, link_transforms


@pytest.fixture(scope="module")
def cmu():
    return cmu_humanoid()


def _on_cmu(cmu, rel):
    desc, layout, _ = cmu
    src = ke.pipelines.load_motion(data_file(rel))
    on_model = ke.retarget.retarget_motion(src, "cmu_fbx_to_cmu_humanoid", desc).motion
    return ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(on_model, clamp_to_limits=True).motion


@pytest.fixture(scope="module")
def walk_08_02(cmu):
    return _on_cmu(cmu, "fbx/08_02_cmu.fbx")


def _over_threshold(model, ref, ratio=3.0):
    """Frames whose feed-forward exceeds ``ratio`` x a DOF's limit (3: ``effort_over_limit``'s reject ratio)."""
    j0 = T._first_joint_dof(model)
    return float(((ref.feedforward[:, j0:].abs() / model.dof_effort_limit[j0:]).amax(-1) > ratio).double().mean())


def test_fit_matches_scipy_slsqp_on_real_double_support_frames(cmu, walk_08_02):
    """Frames of 08_02 in double support at the foot transitions (float64 model): the fit's joint cost
    ``sum_j ((tau_j - (J^T f)_j) / limit_j)^2`` equals SLSQP's optimum of the same problem (edge magnitudes
    >= 0 on the same four-edge cones, the root wrench held at what the minimum-norm fit explains) within 1 %,
    explains that wrench to 1e-3 m g, and is never above the minimum-norm distribution's cost."""
    desc, _, _ = cmu
    _, model = free_root_model(desc, torch.float64)
    settings = TrackingSettings(fit_effort=True)
    ref = T.prepare_reference(model, [walk_08_02], settings)
    rows = torch.tensor([36, 67, 98])
    q, v, a = ref.q[rows], ref.qd[rows], ref.qdd[rows]
    tau = inverse_dynamics(model, q, v, a)
    pos, quat = link_transforms(model, q)
    pts = T._contact_points(model, pos, quat)
    jac = link_jacobians(model, q)
    plain = dataclasses.replace(settings, fit_effort=False)
    f0, idx, ex0, p = T._fit_contacts(model, plain, pts, pos[:, 0], tau[:, :6])
    f1, idx1, ex1, _ = T._fit_contacts(model, settings, pts, pos[:, 0], tau[:, :6], (pos, jac, tau))
    assert torch.equal(idx, idx1)
    j0 = T._first_joint_dof(model)
    limit = model.dof_effort_limit[j0:].numpy()
    mg = model.total_mass * T.GRAVITY
    body = model.contact_point_body[idx]

    def joint_cost(forces, i):
        gen = T._generalized(jac, T._body_wrenches(model, pos, p, body, forces))
        return float(((((tau - gen)[i, j0:]).numpy() / limit) ** 2).sum())

    # the cone edges and their generalised forces, built here from the link Jacobians
    mu = model.contact_friction[idx] * settings.friction_margin  # [n, k]
    ang = np.arange(4) * (math.pi / 2)
    for i in range(rows.numel()):
        active = (pts[i, idx[i], 2] - model.contact.ground_height < settings.contact_height).numpy()
        cols = []
        for c in range(idx.shape[1]):
            for e in range(4):
                d = np.array([mu[i, c] * math.cos(ang[e]), mu[i, c] * math.sin(ang[e]), 1.0]) * active[c]
                force = torch.zeros(1, idx.shape[1], 3, dtype=torch.float64)
                force[0, c] = torch.as_tensor(d)
                gen = T._generalized(
                    jac[i : i + 1], T._body_wrenches(model, pos[i : i + 1], p[i : i + 1], body[i : i + 1], force)
                )
                cols.append(gen[0].numpy())
        g = np.stack(cols, 1) * mg  # [nv, 4k] generalised force per m g on each edge
        root, joints = g[:6] / mg, g[j0:] / limit[:, None]  # root rows in units of m g, as the goal
        goal = ex0[i].numpy() / mg
        target = tau[i, j0:].numpy() / limit

        def fun(x, joints=joints, target=target):
            r = joints @ x - target
            return r @ r, 2.0 * joints.T @ r

        x0 = np.zeros(g.shape[1])
        sol = minimize(
            fun,
            x0,
            jac=True,
            method="SLSQP",
            bounds=[(0.0, None)] * g.shape[1],
            constraints=[
                {"type": "eq", "fun": lambda x, root=root, goal=goal: root @ x - goal, "jac": lambda x, root=root: root}
            ],
            options={"maxiter": 1000, "ftol": 1e-12},
        )
        assert sol.success, sol.message
        edges = torch.as_tensor(
            np.stack(
                [
                    np.stack([[mu[i, c] * math.cos(t), mu[i, c] * math.sin(t), 1.0] for t in ang])
                    for c in range(idx.shape[1])
                ]
            )
        )  # [k, 4, 3]
        f_scipy = torch.zeros_like(f1)
        f_scipy[i] = (torch.as_tensor(sol.x).reshape(-1, 4, 1) * edges * torch.as_tensor(active)[:, None, None]).sum(
            1
        ) * mg
        assert joint_cost(f_scipy, i) == pytest.approx(sol.fun, rel=1e-9)  # the matrix built here is the torques'
        assert np.abs(root @ sol.x - goal).max() < 1e-6
        ours, minnorm = joint_cost(f1, i), joint_cost(f0, i)
        assert ours == pytest.approx(sol.fun, rel=1e-2, abs=1e-3), (i, ours, sol.fun, minnorm)
        assert ours <= minnorm + 1e-9
        assert float(torch.linalg.vector_norm(ex1[i] - ex0[i])) < 1e-3 * mg


LEANING = """
<mujoco model="two_feet">
  <compiler angle="radian"/>
  <worldbody>
    <body name="torso" pos="0 0 0.5">
      <freejoint name="root"/>
      <geom name="trunk" type="box" size="0.05 0.05 0.05" pos="0.04 0 0.1" mass="50"/>
      <body name="lfoot" pos="0 0.1 -0.4">
        <joint name="lankle" type="hinge" axis="0 1 0"/>
        <geom name="lheel" type="sphere" size="0.02" pos="-0.08 0 -0.08" mass="0.5"/>
        <geom name="ltoe" type="sphere" size="0.02" pos="0.08 0 -0.08" mass="0.5"/>
      </body>
      <body name="rfoot" pos="0 -0.1 -0.4">
        <joint name="rankle" type="hinge" axis="0 1 0"/>
        <geom name="rheel" type="sphere" size="0.02" pos="-0.08 0 -0.08" mass="0.5"/>
        <geom name="rtoe" type="sphere" size="0.02" pos="0.08 0 -0.08" mass="0.5"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor name="lankle" joint="lankle" gear="WEAK" ctrllimited="true" ctrlrange="-1 1"/>
    <motor name="rankle" joint="rankle" gear="STRONG" ctrllimited="true" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""


@pytest.mark.parametrize("weak, strong", [(20.0, 40.0), (10.0, 80.0)])
def test_a_body_leaning_on_a_weak_and_a_strong_ankle_loads_the_strong_one(tmp_path, weak, strong):
    """A 50 kg trunk 4 cm ahead of two ankles, standing still on two feet side by side, each with a heel and a toe
    sphere 8 cm behind and ahead of its ankle. The ground must supply the trunk's moment ``T = m_t g x_t`` about
    the ankles' line, and only the ankles carry it: ``tau_l + tau_r = T``, any split within the feet. The
    minimum-norm fit splits it evenly (the body is symmetric); the torque-minimising one minimises
    ``(tau_l / L_l)^2 + (tau_r / L_r)^2``, whose optimum is ``tau_i = T L_i^2 / (L_l^2 + L_r^2)``."""
    path = tmp_path / "two_feet.xml"
    path.write_text(LEANING.replace("WEAK", str(weak)).replace("STRONG", str(strong)))
    desc = ke.asset.MJCFLoader.load(path)
    layout, model = free_root_model(desc, torch.float64)
    q = np.zeros((12, layout.nq))
    q[:, 2] = 0.5
    q[:, 3] = 1.0  # identity root: the spheres' lowest points on the ground
    motion = ke.animation.ArticulationMotion(q, np.zeros((12, layout.nv)), 60.0, layout.model_signature)
    names = list(layout.dof_names)
    il, ir = names.index("lankle"), names.index("rankle")
    total = 50.0 * T.GRAVITY * 0.04
    for on in (False, True):
        ref = T.prepare_reference(model, [motion], TrackingSettings(fit_effort=on, smoothing_s=0.0))
        tl, tr = ref.feedforward[:, il].abs().numpy(), ref.feedforward[:, ir].abs().numpy()
        assert float(ref.unsupported_wrench.abs().max()) < 1e-3 * model.total_mass * T.GRAVITY
        np.testing.assert_allclose(tl + tr, total, rtol=1e-2)
        want_l = total * (0.5 if not on else weak**2 / (weak**2 + strong**2))
        np.testing.assert_allclose(tl, want_l, rtol=2e-2, atol=2e-2)


def test_07_01_feedforward_is_under_the_effort_warn_line_and_supports_the_same_wrench(cmu):
    """07_01 whole (feet planted) on the CMU humanoid, reference-side: the minimum-norm distribution needs over
    3x an ankle's effort limit in 11.4 % of frames (the warn line is 10 %), the effort-weighted one in 8.2 %
    (measured); the unsupported wrench is no larger in any frame (the fit keeps the root's wrench first)."""
    _, _, model = cmu
    motion = _on_cmu(cmu, "fbx/07_01_cmu.fbx")
    mg = model.total_mass * T.GRAVITY
    before = T.prepare_reference(model, [motion], TrackingSettings(fit_effort=False))
    after = T.prepare_reference(model, [motion], TrackingSettings(fit_effort=True))
    assert _over_threshold(model, before) == pytest.approx(0.114, abs=0.005)
    assert _over_threshold(model, after) == pytest.approx(0.082, abs=0.01) and _over_threshold(model, after) < 0.1
    for part in (slice(0, 3), slice(3, 6)):  # force (N), torque (N m)
        ub = torch.linalg.vector_norm(before.unsupported_wrench[:, part], dim=-1)
        ua = torch.linalg.vector_norm(after.unsupported_wrench[:, part], dim=-1)
        assert float((ua - ub).max()) <= 1e-4 * mg + 1e-3
    torch.testing.assert_close(after.residual_wrench, before.residual_wrench)
