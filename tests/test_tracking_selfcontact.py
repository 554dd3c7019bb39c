"""Self-collision in tracking and validation: a real CMU walk (02_01 onto the CMU humanoid) whose left
forearm is driven through the torso (shoulder and elbow angles edited for one second) is rejected with
``self_collision`` naming the pair; the unedited walk is not. The overlap depths are checked against an
independent closest-distance computation (scipy's minimiser over the two capsule axes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import cmu_humanoid, cmu_tracking_efforts, data_file
from scipy.optimize import minimize

import kangengine as ke
from kangengine.sim import TrackingSettings, Verdict
from kangengine.sim import tracking as T
from kangengine.sim.kinematics import link_transforms

# 1 Hz root assistance as in tests/test_tracking_verdicts.py (the walk is then tracked)
SETTINGS = TrackingSettings(root_assist_frequency_hz=1.0)
# left shoulder and elbow: the forearm crosses the thorax (8 cm deep at the full pose)
THROUGH = {"lhumerusrz": 1.5708, "lhumerusry": 0.7854, "lhumerusrx": -1.0472, "lradiusrx": 2.967}


@pytest.fixture(scope="module")
def cmu():
    desc, layout, model = cmu_humanoid(
        contact=ke.sim.ContactParams(self_collision=True), effort_limit=cmu_tracking_efforts()
    )
    bvh = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    on_robot = ke.retarget.retarget_motion(bvh, "cmu_bvh_to_cmu_humanoid", desc).motion
    walk = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(on_robot, clamp_to_limits=True).motion
    return model, layout, walk


def _through_torso(model, layout, walk, start_s=0.6, hold_s=1.0, ramp_s=0.3):
    """The walk with the left arm blended (smoothstep, ``ramp_s``) into :data:`THROUGH` for ``hold_s``."""
    q = np.asarray(walk.q, dtype=np.float64).copy()
    t = np.arange(q.shape[0]) / walk.fps()
    x = np.clip(np.minimum(t - start_s, start_s + 2 * ramp_s + hold_s - t) / ramp_s, 0.0, 1.0)
    w = x * x * (3.0 - 2.0 * x)
    for name, value in THROUGH.items():
        i = int(model.dof_q_index[layout.dof_names.index(name)])
        q[:, i] = (1.0 - w) * q[:, i] + w * value
    return ke.animation.ArticulationMotion(q, np.zeros_like(walk.qd), walk.fps(), walk.layout_signature)


def test_hands_through_the_torso_are_rejected_and_the_walk_is_not(cmu, tmp_path):
    model, layout, walk = cmu
    clip = walk[: int(2.5 * walk.fps())]
    bad = _through_torso(model, layout, clip)
    res = ke.pipelines.validate(model, {"walk": clip, "through": bad}, out_dir=tmp_path, settings=SETTINGS, plots=False)
    reps = {r.name: r for r in res.reports}
    codes = {k: [x.code for x in r.reasons] for k, r in reps.items()}
    assert "self_collision" not in codes["walk"]
    assert reps["walk"].verdict is Verdict.OK
    assert reps["through"].verdict is Verdict.REJECT
    reason = next(x for x in reps["through"].reasons if x.code == "self_collision")
    assert "the reference" in reason.message
    assert any(f"thorax/l{x}" in reason.message or f"l{x}" in reason.message for x in ("radius", "wrist", "hand"))
    print(reason.message)
    assert reason.value > 0.05  # the full pose overlaps by 8 cm
    m = reps["through"].metrics
    assert 0.9 < m["reference_self_penetration_run_s"] < 1.6  # the held second plus part of the ramps
    assert reps["walk"].metrics["reference_self_penetration_max_m"] < 0.01  # a real walk only brushes


def _capsule_distance(a0, a1, b0, b1):
    """Closest distance of segments ``a0-a1`` and ``b0-b1`` by scipy's bounded minimiser."""
    f = lambda st: np.linalg.norm(a0 + st[0] * (a1 - a0) - b0 - st[1] * (b1 - b0))  # noqa: E731
    best = min(
        (minimize(f, x0, bounds=[(0, 1), (0, 1)], method="L-BFGS-B") for x0 in ([0.5, 0.5], [0, 1], [1, 0])),
        key=lambda r: r.fun,
    )
    return best.fun


def test_penetration_depth_matches_an_independent_distance(cmu):
    model, layout, walk = cmu
    bad = _through_torso(model, layout, walk[: int(2.5 * walk.fps())])
    q = torch.as_tensor(bad.q[[int(1.0 * bad.fps())]], dtype=model.dtype)
    pos, quat = link_transforms(model, q)
    depth, pair = T._self_penetration(model, pos, quat)
    ga, gb = (int(g) for g in model.self_pair_geom[int(pair[0])])
    ends = []
    for g in (ga, gb):
        b = int(model.self_geom_body[g])
        rot = ke.rotations.quat_to_matrix(quat[0, b].double().numpy())
        c = pos[0, b].double().numpy() + rot @ model.self_geom_center[g].double().numpy()
        ax = rot @ model.self_geom_axis[g].double().numpy()
        ends += [c - ax, c + ax]
    dist = _capsule_distance(*ends)
    expected = float(model.self_geom_radius[ga] + model.self_geom_radius[gb]) - dist
    assert expected > 0.05
    np.testing.assert_allclose(float(depth[0]), expected, atol=2e-4)


def test_simulated_self_collision_pushes_back_and_needs_the_pairs(cmu):
    model, layout, walk = cmu
    bad = _through_torso(model, layout, walk[: int(1.2 * walk.fps())], start_s=0.2, hold_s=0.4, ramp_s=0.2)
    on = ke.sim.track(model, [bad], settings=TrackingSettings(root_assist_frequency_hz=1.0, self_collision=True))
    off = ke.sim.track(model, [bad], settings=SETTINGS)
    v = on.valid[0]
    assert on.sim_self_contact_force[0][v].max() > 10.0  # the torso pushes the forearm out
    assert off.sim_self_contact_force[0][v].max() == 0.0
    # with the contact simulated the tracked forearm stays shallower than the reference and than without it
    assert on.sim_self_penetration[0][v].max() < 0.7 * off.sim_self_penetration[0][v].max()
    plain = ke.sim.Model.from_desc(ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml")), layout)
    with pytest.raises(ke.errors.ShapeError, match="self_collision"):
        ke.sim.track(plain, [bad], settings=TrackingSettings(self_collision=True))
