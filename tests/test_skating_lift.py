"""The skating rule's take-off and landing frames: a body near the ground whose lowest point rises or sinks faster
than ``ValidationThresholds.skate_lift_speed`` is lifting off or touching down, not standing on it.

Oracles: analytic motions (a stance pose carried rigidly along the floor at 1 m/s, at a constant height, rising
at 0.1 m/s and rising at 0.5 m/s: only the fast rise is a lift-off), and the real hop of CMU 01_01 on the CMU
humanoid, whose frames no longer counted all lie at its take-off and landing (next to its flight).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import cmu_humanoid, data_file

import kangengine as ke
from kangengine.sim import ValidationThresholds
from kangengine.sim.verdict import clip_metrics


@pytest.fixture(scope="module")
def cmu():
    return cmu_humanoid()


@pytest.fixture(scope="module")
def mapped(cmu):
    desc, layout, _ = cmu
    mapper = ke.animation.ArticulationMotionMapper(layout)

    def run(path):
        on_robot = ke.retarget.retarget_motion(ke.io.load_bvh(data_file(path)), "cmu_bvh_to_cmu_humanoid", desc)
        return mapper.to_articulation_motion(on_robot.motion, clamp_to_limits=True).motion

    return run


def _metrics(model, clip, thresholds=None):
    res = ke.sim.track(model, [clip])  # the PD tracker: the reference-side metrics do not depend on it
    return clip_metrics(res, 0, clip, model, thresholds or ValidationThresholds()).metrics, res


def _carried(walk, layout, rise_mps: float, seconds: float = 0.4):
    """Frame 30 of the walk (one foot flat on the floor) carried rigidly forward at 1 m/s, rising at
    ``rise_mps``."""
    fps = walk.fps()
    n = int(round(seconds * fps))
    t = np.arange(n) / fps
    q = np.repeat(walk.q[30:31].astype(np.float64), n, axis=0)
    q[:, 0] += 1.0 * t
    q[:, 2] += rise_mps * t
    qd = ke.animation.ArticulationMotionMapper(layout).velocities(q.astype(np.float32), fps)
    return ke.animation.ArticulationMotion(q.astype(np.float32), qd, fps, walk.layout_signature)


def test_a_foot_carried_along_the_floor_skates_unless_it_is_lifting_off(cmu, mapped):
    """At a constant height and rising at 0.1 m/s (under the lift speed) every frame with the foot near the ground
    skates; rising at 0.5 m/s the same foot is lifting off: its near-ground frames are not standing frames."""
    _, layout, model = cmu
    walk = mapped("bvh/cmu/02_01_cgspeed_walk.bvh")
    th = ValidationThresholds()
    assert th.skate_lift_speed == pytest.approx(0.2)
    flat, _ = _metrics(model, _carried(walk, layout, 0.0))
    slow, _ = _metrics(model, _carried(walk, layout, 0.1))
    fast, res = _metrics(model, _carried(walk, layout, 0.5))
    assert flat["skating_fraction"] == pytest.approx(1.0) and flat["contact_fraction"] == pytest.approx(1.0)
    assert flat["support_speed_median_mps"] == pytest.approx(1.0, abs=0.02)
    assert slow["skating_fraction"] == pytest.approx(1.0) and slow["contact_fraction"] > 0.5
    # the fast rise: the foot is within skate_height for its first ~0.06 s, rising all the time
    h = res.reference_contact_height[0, : int(res.clip_step_count[0])].min(-1)
    assert int((h < th.skate_height).sum()) >= 3  # it does touch the ground at the start
    assert fast["skating_fraction"] == 0.0 and fast["support_speed_median_mps"] is None
    # without the lift rule (an infinite lift speed) the same frames are skating, as the rule was before
    old, _ = _metrics(model, _carried(walk, layout, 0.5), ValidationThresholds(skate_lift_speed=math.inf))
    assert old["skating_fraction"] == pytest.approx(1.0)


def _skating_frames(res, th):
    """Rows where every standing body slides, by the rule's definition with and without the lift test."""
    n = int(res.clip_step_count[0])
    h = np.asarray(res.reference_contact_height[0, :n], dtype=np.float64)
    v = np.asarray(res.reference_contact_speed[0, :n], dtype=np.float64)
    near = h < th.skate_height
    lifting = np.abs(np.gradient(h, res.dt, axis=0)) > th.skate_lift_speed
    standing = near & ~lifting
    slowest = np.where(standing, v, np.inf).min(-1)
    before = near.any(-1) & (np.where(near, v, np.inf).min(-1) > th.skate_speed)
    return before, standing.any(-1) & (slowest > th.skate_speed), h


def test_the_hops_take_off_and_landing_are_not_skating(cmu, mapped):
    """CMU 01_01's hop at 3.2-4.5 s on the CMU humanoid: its feet moving forward as they leave and meet the
    ground counted as skating in 19 % of the contact frames (warn line 15 %). The frames the lift rule no longer
    counts all lie within 0.1 s of the hop's flight (no contact point within ``near_ground``), and what is left
    (the feet sliding just after landing) is under the warning."""
    _, _, model = cmu
    hop = mapped("bvh/cmu/01_01_cgspeed_hops_long.bvh")[384:540]
    th = ValidationThresholds()
    m, res = _metrics(model, hop)
    old, _ = _metrics(model, hop, ValidationThresholds(skate_lift_speed=math.inf))
    assert old["skating_fraction"] > th.skate_warn  # the warning it had
    assert m["skating_fraction"] < 0.1
    before, after, h = _skating_frames(res, th)
    assert old["skating_fraction"] == pytest.approx(before.sum() / (h < th.skate_height).any(-1).sum())
    dropped = np.nonzero(before & ~after)[0]
    flight = np.nonzero(h.min(-1) > th.near_ground)[0]
    assert dropped.size >= 5 and flight.size >= 15  # a 0.35 s flight at 60 Hz
    gap = np.abs(dropped[:, None] - flight[None, :]).min(-1) * res.dt
    assert gap.max() <= 0.1, gap
