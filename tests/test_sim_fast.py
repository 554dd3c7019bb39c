"""The CPU fast path of the step (kangengine.sim.fast: the whole step as one numba kernel) against the torch
step, the reference: from the same state, every output of a step agrees to float64 round-off on the CMU
humanoid and the G1 over 200 steps with ground contact, saturated drives, active joint limits and joint
friction, and on models with fixed tendons, ball-joint friction, pins, loads and per-world gains; float32
models agree within float32's resolution; the features the kernel does not cover fall back to the torch
step and say why."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import data_file

import kangengine as ke
from kangengine.asset.desc import JointType
from kangengine.data import data_path
from kangengine.sim import Control, Simulator, State

FIELDS = (
    "contact_normal_force",
    "contact_friction_force",
    "contact_depth",
    "contact_position",
    "drive_force",
    "drive_force_requested",
    "energy_correction",
)

BALL = """<mujoco><worldbody><geom name="floor" type="plane" size="5 5 .1"/>
<body name="base" pos="0 0 1"><freejoint/><geom type="sphere" size=".1" mass="3"/>
<body name="arm" pos="0 0 .3"><joint name="hinge" type="hinge" axis="0 1 0" frictionloss="2" damping="0.3"
 stiffness="20" range="-0.3 0.3"/><geom type="capsule" fromto="0 0 0 .3 0 0" size=".04" mass="2"/>
<body name="rotor" pos=".3 0 0"><joint name="ball" type="ball" frictionloss="1.5"/>
<geom type="box" size=".1 .05 .05" pos=".1 0 0" mass="4"/></body></body></body></worldbody></mujoco>"""


def _model(path, dtype=torch.float64, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        desc = ke.asset.MJCFLoader.load(path)
        return ke.sim.Model.from_desc(desc, dtype=dtype, **kw)


def _pair(model, **kw):
    fast = Simulator(model, dt=1 / 60, **kw)
    ref = Simulator(model, dt=1 / 60, fast_path=False, **kw)
    assert fast.fast_path and fast.fast_path_reason is None
    assert not ref.fast_path and ref.fast_path_reason == "fast_path=False"
    return fast, ref


def _rel(a, b):
    """Largest difference of two tensors relative to the reference's largest magnitude (at least 1)."""
    if a is None or b is None:
        assert a is None and b is None
        return 0.0
    assert a.shape == b.shape and a.dtype == b.dtype
    if not b.numel():
        return 0.0
    bad = ~torch.isfinite(b)  # a diverged world's outputs: non-finite in both, at the same entries
    assert torch.equal(bad, ~torch.isfinite(a))
    a, b = a.double().masked_fill(bad, 0.0), b.double().masked_fill(bad, 0.0)
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1.0)


def _compare(fast, ref, state, ctrl):
    """Both paths from ``state``: the torch result and the worst relative difference of every output."""
    rf, rr = fast.step(state, ctrl), ref.step(state, ctrl)
    worst = {f: _rel(getattr(rf, f), getattr(rr, f)) for f in FIELDS}
    worst["q"] = _rel(rf.state.q, rr.state.q)
    worst["qd"] = _rel(rf.state.qd, rr.state.qd)
    worst["energy_budget"] = _rel(rf.state.energy_budget, rr.state.energy_budget)
    assert torch.equal(rf.state.frozen, rr.state.frozen) and torch.equal(rf.nonfinite, rr.nonfinite)
    sat = (rf.drive_saturated != rr.drive_saturated).sum()
    return rr, worst, int(sat)


def _run(fast, ref, state, ctrl_of, steps):
    """``steps`` steps along the torch trajectory, each also taken by the fast path from the same state.
    Returns the worst difference per output, the number of saturation flags that differ (an entry exactly at
    the limit may flip) and what the trajectory exercised."""
    worst = {}
    flips = 0
    seen = {"contact": 0.0, "limit": 0.0, "saturated": 0}
    model = ref.model
    for i in range(steps):
        ctrl = ctrl_of(i, state)
        rr, w, sat = _compare(fast, ref, state, ctrl)
        flips += sat
        for k, v in w.items():
            worst[k] = max(worst.get(k, 0.0), v)
        seen["contact"] = max(
            seen["contact"], float(rr.contact_normal_force.max()) if rr.contact_normal_force.numel() else 0
        )
        qs = rr.state.q[:, model.dof_q_index] * model.dof_is_scalar
        beyond = torch.clamp(qs - model.dof_upper, min=0) + torch.clamp(model.dof_lower - qs, min=0)
        seen["limit"] = max(seen["limit"], float(beyond.max()))
        seen["saturated"] += int(rr.drive_saturated.sum())
        state = rr.state
    return worst, flips, seen


def _posed_control(model, state, amplitude=0.6, seed=0):
    """Targets away from the neutral pose (some beyond the joint limits, so limits and effort clamps act),
    and a velocity target and feed-forward on top."""
    rng = np.random.default_rng(seed)
    target = state.q.clone()
    scalar = model.dof_is_scalar.nonzero()[:, 0]
    idx = model.dof_q_index[scalar]
    noise = torch.as_tensor(rng.normal(size=(state.q.shape[0], len(idx))) * amplitude, dtype=model.dtype)
    target[:, idx] += noise
    qd_target = torch.as_tensor(rng.normal(size=state.qd.shape) * 0.2, dtype=model.dtype)
    ff = torch.as_tensor(rng.normal(size=state.qd.shape) * 2.0, dtype=model.dtype)
    ff[:, :6] = 0.0
    return Control(q_target=target, qd_target=qd_target, tau_feedforward=ff)


ROBOTS = {
    "cmu": lambda: data_path("humanoid_CMU.xml"),
    "g1": lambda: data_file("mjcf/unitree/g1_29dof.nomesh.xml"),
}


@pytest.mark.parametrize("robot", sorted(ROBOTS))
def test_fast_path_equals_torch_step_over_200_steps(robot):
    """CMU humanoid and G1 dropped onto the ground (two worlds from different heights) under PD towards
    random poses beyond their limits with effort limits, joint damping and dry friction: at each of 200
    steps the fast path's outputs from the torch trajectory's state equal the torch step's to 1e-9 of
    their scale (float64), and the run had contacts, limit violations and saturated drives."""
    model = _model(
        ROBOTS[robot](),
        drive_stiffness=200.0,
        drive_damping=10.0,
        effort_limit=40.0,
        joint_damping=0.5,
        joint_friction=0.3,
        limit_damping=2.0,
    )
    fast, ref = _pair(model)
    state = State.neutral(model, 2)
    state.q[:, 2] += torch.tensor([0.02, 0.15], dtype=model.dtype)
    ctrl = _posed_control(model, state)
    worst, flips, seen = _run(fast, ref, state, lambda i, s: ctrl, 200)
    assert seen["contact"] > 50.0 and seen["limit"] > 1e-3 and seen["saturated"] > 10, seen
    assert flips == 0
    for k, v in worst.items():
        assert v < 1e-9, (k, v)


def test_float32_models_agree_within_float32_resolution():
    """A float32 model: the fast path computes in float64 and rounds its outputs, the torch step computes
    in float32. Against the float64 step (float64 model) from the same state the fast path is off by the
    float32 rounding of the model's constants and of the state, amplified by the stiff Newton system (below
    1e-5 of scale; about 2e-6 here), the torch float32 step by its own round-off amplified likewise (up to
    ~1e-3 of scale at the impact here). So every output of the fast path stays within 1e-5 of the float64
    step's, the two float32 paths agree within 2e-3 of scale, and where they do not (3.4e-3 in the contact
    friction force on an AVX-512 host, whose float32 kernels round differently) the gap is the torch step's
    own: it is that far from the float64 step itself."""
    path = ROBOTS["g1"]()
    kw = {"drive_stiffness": 200.0, "drive_damping": 10.0, "effort_limit": 40.0}
    model, model64 = _model(path, dtype=torch.float32, **kw), _model(path, **kw)
    fast, ref = _pair(model)
    exact = Simulator(model64, dt=1 / 60, fast_path=False)
    state = State.neutral(model, 2)
    state.q[:, 2] += torch.tensor([0.02, 0.15])
    ctrl = _posed_control(model, state)
    ctrl64 = Control(**{k: getattr(ctrl, k).double() for k in ("q_target", "qd_target", "tau_feedforward")})
    err_fast, err_torch, contact = 0.0, 0.0, 0.0
    for _ in range(60):
        rf, rr = fast.step(state, ctrl), ref.step(state, ctrl)
        s64 = State(q=state.q.double(), qd=state.qd.double(), frozen=state.frozen, energy_budget=None)
        if state.energy_budget is not None:
            s64 = State(q=s64.q, qd=s64.qd, frozen=s64.frozen, energy_budget=state.energy_budget.double())
        re = exact.step(s64, ctrl64)
        for res, key in ((rf, "fast"), (rr, "torch")):
            e = max(_rel(res.state.q.double(), re.state.q), _rel(res.state.qd.double(), re.state.qd))
            if key == "fast":
                err_fast = max(err_fast, e)
            else:
                err_torch = max(err_torch, e)
        contact = max(contact, float(rr.contact_normal_force.max()))
        worst = {f: _rel(getattr(rf, f), getattr(rr, f)) for f in FIELDS}
        worst["q"], worst["qd"] = _rel(rf.state.q, rr.state.q), _rel(rf.state.qd, rr.state.qd)
        off64 = {}  # each float32 path against the float64 step, output by output
        for res, key in ((rf, "fast"), (rr, "torch")):
            off64[key] = {f: _rel(getattr(res, f).double(), getattr(re, f)) for f in FIELDS}
            off64[key]["q"] = _rel(res.state.q.double(), re.state.q)
            off64[key]["qd"] = _rel(res.state.qd.double(), re.state.qd)
        for k, v in worst.items():
            assert off64["fast"][k] < 1e-5, (k, off64["fast"][k])  # every output: the float64 step, rounded
            # the paths agree to 2e-3 of scale; a larger gap is the torch float32 step's own round-off
            assert v < 2e-3 or off64["torch"][k] > 0.9 * v, (k, v, off64["torch"][k])
        state = rr.state
    assert contact > 50.0
    assert err_fast < 1e-5 and err_fast < err_torch, (err_fast, err_torch)


def test_fast_path_with_tendons_ball_friction_pins_loads_and_world_gains(tmp_path):
    """The MuJoCo humanoid's fixed tendons (joint-space coupling rows), a ball joint with dry friction, a
    hinge with a passive spring and a limit, pinned DOFs with prescribed velocities, external forces, gains
    per world, gravity off on one link, three Newton iterations and no line search: the fast path equals
    the torch step, to 1e-8 of scale: with Stribeck friction the line search's step length (the minimiser
    of a quadratic whose curvature is a difference of nearly equal energies) amplifies round-off, and one
    entry in one step here moves by 1.6e-9 (without line search below 1e-11; the other cases below 2e-10);
    Stribeck joint and contact friction with stiction, a raised ground, a fixed base, contact off and
    energy correction off besides."""
    hum = _model(data_file("mjcf/mujoco/humanoid.xml"), drive_stiffness=300.0, drive_damping=20.0)
    assert hum.coupling_matrix is not None and hum.coupling_matrix.shape[0] > 0
    p = tmp_path / "ball.xml"
    p.write_text(BALL)
    ball = _model(p, drive_stiffness=5.0, drive_damping=1.0, link_gravity={"rotor": False})
    assert ball.has_ball_friction and bool((ball.dof_spring_stiffness > 0).any())
    rng = np.random.default_rng(1)
    stribeck = _model(  # Stribeck joint and contact friction with stiction, a raised ground, a fixed base
        p,
        drive_stiffness=5.0,
        drive_damping=1.0,
        free_root=False,
        friction_params=ke.sim.JointFriction(stiction_extra=0.5, stribeck_vel=0.05),
        contact=ke.sim.ContactParams(friction=0.8, stiction_extra=0.3, stribeck_vel=0.02, ground_height=0.85),
    )
    no_contact = _model(p, drive_stiffness=5.0, drive_damping=1.0, contact=ke.sim.ContactParams(enabled=False))
    cases = [(hum, {}), (ball, {}), (hum, {"iterations": 3, "line_search": False}), (ball, {"iterations": 3})]
    cases += [(stribeck, {}), (no_contact, {}), (hum, {"energy_correction": False})]
    for model, kw in cases:
        fast, ref = _pair(model, **kw)
        w = 3
        state = State.neutral(model, w)
        root = 7 if model.layout.blocks[0].joint_type is JointType.FREE else 0
        state.q[:, 2] += 0.05 if root else 0.0
        pinned = torch.zeros(w, model.nv, dtype=torch.bool)
        pinned[1, model.nv - 1] = True
        pinned[2, :3] = True
        t = lambda *shape, dt=model.dtype: torch.as_tensor(rng.normal(size=shape), dtype=dt)
        ctrl = Control(
            q_target=state.q + 0.1 * torch.cat([torch.zeros(w, root), t(w, model.nq - root)], -1),
            tau_external=2.0 * t(w, model.nv),
            drive_stiffness=torch.abs(50.0 * t(w, model.nv)),
            drive_damping=torch.abs(2.0 * t(model.nv)),
            pinned=pinned,
            pinned_qd=0.3 * t(w, model.nv),
        )
        worst, _, _ = _run(fast, ref, state, lambda i, s, c=ctrl: c, 40)
        for k, v in worst.items():  # 1e-8: see the docstring
            assert v < 1e-8, (model.name, kw, k, v)


def test_energy_budget_frozen_and_diverging_worlds_match():
    """Energy correction against a handed-on budget (NaN for a fresh world: not corrected), a frozen
    world and a world whose target is NaN (frozen by this step): flags, states and budgets as the torch
    step's."""
    model = _model(data_path("humanoid_CMU.xml"), drive_stiffness=300.0, drive_damping=20.0)
    fast, ref = _pair(model)
    state = State.neutral(model, 4)
    state.q[:, 2] += 0.1
    ctrl = Control(q_target=state.q.clone())
    for _ in range(5):
        state = ref.step(state, ctrl).state
    budget = state.energy_budget.clone()
    budget[0] = math.nan
    budget[1] += 5.0  # a budget above the state's energy: velocities scaled up
    frozen = torch.tensor([False, False, True, False])
    state = State(q=state.q, qd=state.qd, frozen=frozen, energy_budget=budget)
    target = ctrl.q_target.clone()
    target[3, 10] = math.nan
    rr, worst, _ = _compare(fast, ref, state, Control(q_target=target))
    assert rr.state.frozen.tolist() == [False, False, True, True] and rr.nonfinite.tolist() == [False] * 3 + [True]
    assert float(rr.energy_correction[1]) > 0 and float(rr.energy_correction[0]) == 0.0
    for k, v in worst.items():
        assert v < 1e-9, (k, v)


def test_fast_path_batch_invariant(monkeypatch):
    """A world's step does not depend on the others in its batch (worlds are stepped one by one), with the
    batch-invariant forward kinematics (the replay; the native FK kernel's SIMD blocks round a row
    differently with the batch size, see docs/sim.md)."""
    monkeypatch.setenv("KANGENGINE_FK_BACKEND", "numpy")
    model = _model(data_path("humanoid_CMU.xml"), dtype=torch.float32, drive_stiffness=300.0, drive_damping=20.0)
    sim = Simulator(model, dt=1 / 60)
    state = State.neutral(model, 5)
    state.q[:, 2] += torch.linspace(0, 0.2, 5)
    ctrl = Control(q_target=state.q.clone())
    both = sim.step(state, ctrl)
    one = sim.step(
        State(q=state.q[3:4], qd=state.qd[3:4], frozen=state.frozen[3:4]), Control(q_target=state.q[3:4].clone())
    )
    assert torch.equal(both.state.q[3:4], one.state.q) and torch.equal(
        both.contact_normal_force[3:4], one.contact_normal_force
    )


def test_unsupported_features_fall_back_to_torch_and_say_why():
    """Self-collision, cycle and tendon rows, hard mimics and drive envelopes run the torch step; the
    simulator says why (``fast_path_reason``); autograd inputs take the torch step per call."""
    path = data_path("humanoid_CMU.xml")
    selfc = _model(path, contact=ke.sim.ContactParams(self_collision=True))
    sim = Simulator(selfc, dt=1 / 60)
    assert not sim.fast_path and sim.fast_path_reason == "self-collision"
    assert Simulator(selfc, dt=1 / 60, fast_path=False).fast_path_reason == "fast_path=False"
    model = _model(path, drive_stiffness=300.0, drive_damping=20.0)
    fast, ref = _pair(model)
    state = State.neutral(model, 1)
    q = state.q.clone().requires_grad_(True)
    ctrl = Control(q_target=q)
    assert not fast._fast.accepts(state, ctrl)
    a, b = fast.step(state, ctrl), ref.step(state, ctrl)
    assert a.state.q.grad_fn is not None and torch.equal(a.state.q, b.state.q)  # the torch step ran
