"""Verdicts of real clips and of made-infeasible variants, pinned per clip, and the whole-body controller's
plan checked against the simulator and inverse dynamics.

Clips: CMU 02_01 (walk) retargeted onto the CMU humanoid with ``cmu_bvh_to_cmu_humanoid`` (feet levelled),
validated with the default settings: no root assistance. The PD tracker falls on the walk at 1.1 s, so
``validate`` tracks it again with the sampling search (``controller="sampling"``, docs/tracking.md), which
holds it within 5 cm to its end. The variants, also without assistance: a 0.5 m sideways root jump halfway
(``root_discontinuity``), lifted 0.3 m (``floating``), a stance pose sliding at 1 m/s (``foot_skating``), the
walk played 3x fast (``impossible_dynamics``) and the CMU humanoid with a tenth of its effort limits
(``effort_over_limit``); reference-side rules reject them, so no search is spent on them. The experimental
IMPLICIT controller's step sensitivity is checked against finite differences of the simulator's step."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import cmu_tracking_efforts, data_file, infeasible_variants

import kangengine as ke
from kangengine.sim import TrackingSettings, Verdict
from kangengine.sim import tracking as T
from kangengine.sim.control import Control
from kangengine.sim.dynamics import inverse_dynamics
from kangengine.sim.kinematics import link_jacobians, link_transforms
from kangengine.sim.wbc import contact_points, point_generalized_forces


def _model(desc, layout, dtype=torch.float32, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ke.sim.Model.from_desc(desc, layout, dtype=dtype, **kw)


@pytest.fixture(scope="module")
def cmu():
    desc = ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    return desc, layout


@pytest.fixture(scope="module")
def walk(cmu):
    desc, layout = cmu
    bvh = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    on_robot = ke.retarget.retarget_motion(bvh, "cmu_bvh_to_cmu_humanoid", desc).motion
    return ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(on_robot, clamp_to_limits=True).motion


@pytest.fixture(scope="module")
def verdicts(cmu, walk, tmp_path_factory):
    """Every clip validated with the default settings (no root assistance), on the CMU humanoid with
    dm_control's tracking walker's effort limits; the walk also on the suite model's own, weaker motors
    (``walk_suite_motors``) and with a tenth of the suite's (``walk_10pct_effort``)."""
    desc, layout = cmu
    model = _model(desc, layout, effort_limit=cmu_tracking_efforts())
    fast = ke.animation.ArticulationMotion(walk.q, walk.qd * 3.0, walk.fps() * 3.0, walk.layout_signature)
    clips = {"walk": walk, "walk_3x_fast": fast, **infeasible_variants(walk, layout)}
    res = ke.pipelines.validate(model, clips, out_dir=tmp_path_factory.mktemp("v"), plots=False)
    out = {r.name: r for r in res.reports}
    suite = _model(desc, layout)
    weak = dataclasses.replace(suite, dof_effort_limit=suite.dof_effort_limit * 0.1)
    for name, m in (("walk_suite_motors", suite), ("walk_10pct_effort", weak)):
        res = ke.pipelines.validate(m, {name: walk}, out_dir=tmp_path_factory.mktemp("w"), plots=False)
        out.update({r.name: r for r in res.reports})
    return out


# clip -> (verdict, the reason: the first reason code of an ok clip (info), else one of its reject reasons)
PINNED = {
    "walk": (Verdict.OK, "sampling"),
    "walk_suite_motors": (Verdict.WARN, "effort_over_limit"),
    "walk_3x_fast": (Verdict.REJECT, "impossible_dynamics"),
    "walk_10pct_effort": (Verdict.REJECT, "effort_over_limit"),
    "teleport": (Verdict.REJECT, "root_discontinuity"),
    "lifted": (Verdict.REJECT, "floating"),
    "skating": (Verdict.REJECT, "foot_skating"),
}


@pytest.mark.parametrize("clip", sorted(PINNED))
def test_pinned_verdicts(verdicts, clip):
    rep = verdicts[clip]
    verdict, first = PINNED[clip]
    assert rep.verdict is verdict, [r.message for r in rep.reasons]
    if verdict is Verdict.OK:
        assert [r.code for r in rep.reasons][0] == first, [r.code for r in rep.reasons]
    elif verdict is Verdict.WARN:
        assert [r.code for r in rep.reasons if r.severity.value == "warn"] == [first], [r.code for r in rep.reasons]
    else:
        assert first in [r.code for r in rep.reasons if r.severity.value == "reject"], [r.code for r in rep.reasons]


def test_feasible_walk_numbers(verdicts):
    rep = verdicts["walk"]
    m = rep.metrics
    assert m["body_error_mean_m"] < 0.05 and m["fell_at_s"] is None and m["simulated_fraction"] == 1.0
    # no help from outside: the body is carried by its own actuators through the ground
    assert not m["root_assist_used"] and m["assist_force_max_over_weight"] == 0.0
    # the PD tracker alone fell; the report says so and says what the search cost
    # (1.08 s with the minimum-norm contact distribution, the default; 1.13 s with fit_effort)
    assert m["pd_fell_at_s"] == pytest.approx(1.08, abs=0.05) and m["controller"] == "sampling"
    assert [r.code for r in rep.reasons] == ["sampling", "sampling_fallback"]
    assert m["search_env_steps"] >= 256 * (m["steps"] - 1)
    # levelled feet roll over heel and toe: rolling is not slip, so the real walk does not skate
    assert m["skating_fraction"] < 0.15 and m["contact_fraction"] > 0.95
    assert m["feedforward_over_threshold_fraction"] < 0.1


def test_suite_motors_are_too_weak_for_the_walk(verdicts):
    """dm_control's suite CMU humanoid drives its ankles with 20 N m motors, less than the ankles' own joint
    damping (5 N m s/rad) costs at a walk's push-off speed (over 4 rad/s): the reference needs more than a limit
    in most frames, which the verdict says (``effort_over_limit``, warn). The simulation measures effort and does
    not enforce it (``clamp_effort=False``), so the tracked motion is the same as with the tracking walker's limits
    to the bit; only the verdict differs."""
    suite, strong = verdicts["walk_suite_motors"], verdicts["walk"]
    assert suite.metrics["feedforward_over_limit_fraction"] > 0.5
    assert strong.metrics["feedforward_over_limit_fraction"] < 0.05
    assert suite.metrics["body_error_mean_m"] == strong.metrics["body_error_mean_m"] < 0.05
    assert suite.metrics["fell_at_s"] is None and not suite.metrics["root_assist_used"]
    r = next(r for r in suite.reasons if r.code == "effort_over_limit")
    assert "footrx" in r.message and r.value > r.threshold


def test_infeasible_variant_numbers(verdicts):
    fast = verdicts["walk_3x_fast"]
    assert fast.metrics["impossible_fraction"] > 0.2  # the ground cannot push 9x the accelerations
    weak = verdicts["walk_10pct_effort"]
    r = next(r for r in weak.reasons if r.code == "effort_over_limit")
    assert r.severity.value == "reject" and r.value > r.threshold
    assert weak.metrics["feedforward_ratio_median"] > 10  # a tenth of the actuators: ten times over the limit
    # reference-side rejections: no search was spent on them
    for name in ("walk_3x_fast", "walk_10pct_effort", "teleport", "lifted", "skating"):
        assert verdicts[name].metrics["controller"] == "pd", name
        assert verdicts[name].metrics["search_env_steps"] == 0, name


@pytest.fixture(scope="module")
def g1_walk(tmp_path_factory):
    """CMU 02_01 retargeted onto the Unitree G1 (``cmu_bvh_to_g1``, the shipped G1 MJCF), validated with the
    default settings: no root assistance."""
    from kangengine.data import G1_MJCF, data_path

    desc = ke.asset.MJCFLoader.load(data_path(G1_MJCF))
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    motion = ke.retarget.retarget_to_robot(ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh")), "cmu_bvh_to_g1")
    res = ke.pipelines.validate(
        _model(desc, layout), {"g1_walk": motion.motion}, out_dir=tmp_path_factory.mktemp("g1"), plots=False
    )
    return res.reports[0]


def test_g1_walk_is_ok_without_assistance(g1_walk):
    """The PD tracker drops the G1 at 0.93 s; the sampling search holds the whole walk within 5 cm (measured
    3.5 cm), on the robot's own actuators."""
    m = g1_walk.metrics
    assert g1_walk.verdict is Verdict.OK, [r.message for r in g1_walk.reasons]
    assert [r.code for r in g1_walk.reasons][0] == "sampling"
    assert m["body_error_mean_m"] < 0.05 and m["fell_at_s"] is None and not m["root_assist_used"]
    assert m["pd_fell_at_s"] < 1.2


# -- the whole-body controller ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wbc64(cmu, walk):
    desc, layout = cmu
    model = _model(desc, layout, torch.float64)
    st = TrackingSettings(controller="whole_body", dt=1.0 / 120.0)
    ref = T.prepare_reference(model, [walk[:60]], st)
    return model, st, ref, T._WholeBody(model, ref, st)


def test_wbc_plan_is_what_the_simulator_does_in_flight(wbc64):
    """Lifted 1 m off the ground (no contact), the simulator's implicit step under the controller's torques
    and drive targets lands on the planned accelerations (the planned passive forces included)."""
    model, st, ref, wbc = wbc64
    sim_model = dataclasses.replace(model, dof_effort_limit=torch.full_like(model.dof_effort_limit, math.inf))
    sim = ke.sim.Simulator(sim_model, dt=st.dt, iterations=4, check_inputs=False)
    rows = torch.tensor([10, 30, 50])
    q = ref.q[rows].clone()
    q[:, 2] += 1.0
    state = ke.sim.State.from_q(model, q, ref.qd[rows])
    q_t, qd_t, tau = wbc.command(state, rows, rows + 1)
    kp, kd = T.drive_gains(model, st)
    out = sim.step(state, Control(q_target=q_t, qd_target=qd_t, tau_feedforward=tau, drive_stiffness=kp * 0.25))
    np.testing.assert_allclose(out.state.qd.numpy(), qd_t.numpy(), atol=1e-6)
    assert float(tau[:, :6].abs().max()) == 0.0  # the root is not actuated
    # in flight the root follows the whole body's momentum: its rows of inverse dynamics vanish
    acc = (qd_t - state.qd) / st.dt
    np.testing.assert_allclose(inverse_dynamics(model, state.q, state.qd, acc)[:, :6].numpy(), 0.0, atol=1e-3)


def test_wbc_plan_in_contact_obeys_newton_euler_friction_and_stance(wbc64):
    """On the ground: the root rows of inverse dynamics of the plan equal the root rows of the planned ground
    forces (RNEA against the contact Jacobians), every force is in the friction pyramid and pushes, and the
    stance bodies' twists come to rest at the commanded rate."""
    from kangengine.sim.wbc import whole_body_control

    model, st, ref, wbc = wbc64
    rows = torch.tensor([5, 25, 45])
    state = ke.sim.State.from_q(model, ref.q[rows], ref.qd[rows])
    stance_c = ref.contact_height[rows] < st.contact_height
    stance_body = torch.zeros(3, model.num_bodies, dtype=torch.bool)
    stance_body[:, ref.contact_bodies] = stance_c
    cmd = whole_body_control(
        model,
        state.q,
        state.qd,
        torch.zeros_like(state.qd),
        stance_c[:, wbc.point_slot],
        stance_body,
        wbc.stance_candidates,
        dof_weight=wbc.dof_weight,
        stance_time=st.wbc_stance_settle_s,
        friction=wbc.friction,
        contact_height=0.01,
        max_points=16,
        iterations=200,
    )
    pos, quat = link_transforms(model, state.q)
    jac = link_jacobians(model, state.q)
    pts = torch.gather(contact_points(model, pos, quat), 1, cmd.contact_index[..., None].expand(-1, -1, 3))
    gen = point_generalized_forces(jac, pos, pts, model.contact_point_body[cmd.contact_index], cmd.contact_force)
    need = inverse_dynamics(model, state.q, state.qd, cmd.qdd)
    np.testing.assert_allclose(need[:, :6].numpy(), gen[:, :6].numpy(), atol=1e-6 * model.total_mass * 9.81)
    np.testing.assert_allclose((need - gen)[:, 6:].numpy(), cmd.tau[:, 6:].numpy(), atol=1e-6)
    f = cmd.contact_force
    mu = wbc.friction[cmd.contact_index]
    assert float(f[..., 2].min()) >= 0.0 and float(f[..., 2].sum(-1).min()) > 0.3 * model.total_mass * 9.81
    assert bool(((f[..., 0].abs() + f[..., 1].abs()) <= mu * f[..., 2] + 1e-6).all())
    # the stance bodies touching the ground: J_b qdd = -J_b qd / stance_time
    height = contact_points(model, pos, quat)[..., 2]
    low = torch.full((3, model.num_bodies), math.inf, dtype=height.dtype).scatter_reduce(
        1, model.contact_point_body.expand(3, -1), height, "amin"
    )
    candidate = torch.zeros(model.num_bodies, dtype=torch.bool)
    candidate[wbc.stance_candidates] = True
    on = stance_body & (low < 0.01) & candidate
    assert bool(on.any())
    want = -torch.einsum("wbiv,wv->wbi", jac, state.qd) / st.wbc_stance_settle_s
    got = torch.einsum("wbiv,wv->wbi", jac, cmd.qdd)
    np.testing.assert_allclose(got[on].numpy(), want[on].numpy(), rtol=1e-4, atol=1e-4)


def _implicit_probe(cmu, walk, frame, lift=0.0):
    """The experimental IMPLICIT controller's pieces at one reference frame of the walk (optionally lifted
    ``lift`` m off the ground): its simulator, probe control and state."""
    desc, layout = cmu
    model = _model(desc, layout, dtype=torch.float64)
    settings = TrackingSettings(controller="implicit")
    ref = T.prepare_reference(model, [walk[: int(2.0 * walk.fps())]], settings)  # 120 grid steps
    kp, kd = T.implicit_gains(model, settings)
    sim = ke.sim.Simulator(
        dataclasses.replace(model, dof_effort_limit=torch.full_like(model.dof_effort_limit, math.inf)), dt=settings.dt
    )
    imp = T._Implicit(model, settings, sim)
    q = ref.q[frame : frame + 1].clone()
    q[:, 2] += lift
    state = ke.sim.State.from_q(model, q, ref.qd[frame : frame + 1])
    ctrl = Control(
        q_target=ref.q[frame + 1 : frame + 2],
        qd_target=ref.qd[frame + 1 : frame + 2],
        tau_feedforward=ref.feedforward[frame : frame + 1],
        drive_stiffness=kp[None],
        drive_damping=kd[None],
    )
    return model, sim, imp, state, ctrl


@pytest.mark.parametrize("lift", [1.0, -0.01])
def test_implicit_sensitivity_matches_finite_differences_of_the_step(cmu, walk, lift):
    """``d qd' / d tau = h H^-1 S^T`` with the Hessian the controller builds, against central differences of
    the simulator's step: exact in flight (mass matrix and implicit drives), within 30 % in stance (the
    contact's friction curvature is taken at sticking)."""
    model, sim, imp, state, ctrl = _implicit_probe(cmu, walk, 60, lift)
    probe = sim.step(state, ctrl)
    x = imp.sensitivity(imp.hessian(state.q, probe.contact_normal_force, probe.contact_position))[0]
    assert (float(probe.contact_normal_force.sum()) > 0) == (lift < 0)
    names = model.layout.dof_names
    for dof in ("lfemurrx", "rfemurrx", "lowerbackrz", "lhumerusrx"):
        j = names.index(dof)
        cols = []
        for d in (1.0, -1.0):
            tau = ctrl.tau_feedforward.clone()
            tau[:, j] += d
            cols.append(sim.step(state, dataclasses.replace(ctrl, tau_feedforward=tau)).state.qd[0])
        fd = (cols[0] - cols[1]) / 2.0
        err = float(torch.linalg.vector_norm(fd - x[:, j - 6]) / torch.linalg.vector_norm(fd))
        assert err < (2e-4 if lift > 0 else 0.3), (dof, err)
