"""The skeleton retarget's two clean-ups (``kangengine/retarget/_plant.py``): single-frame rotation spikes of the
source corrected, and stance feet held in place by a two-bone leg IK.

Oracles: the 08_02 FBX's toe keys read with pyassimp itself and composed with scipy's Slerp (not our loader); a
synthetic fast turn, a fast kick start and an inserted glitch (scipy's Slerp for the expected midpoint); the
validator's own reference contact quantities (``prepare_reference``: heights and slip speeds of the model's
collision geoms after the mapping onto MuJoCo coordinates) for the feet; Rodrigues' formula through scipy for the
knee IK.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import cmu_humanoid, data_file
from scipy.spatial.transform import Rotation, Slerp

import kangengine as ke
from kangengine.retarget import _plant as P

CONFIG = "cmu_fbx_to_cmu_humanoid"


@pytest.fixture(scope="module")
def cmu():
    return cmu_humanoid(torch.float64)


def _scipy_midpoint_deviation(quat_wxyz: np.ndarray) -> np.ndarray:
    """``[T - 2]`` rad: each key's angle from the scipy Slerp midpoint of its neighbours."""
    rot = Rotation.from_quat(quat_wxyz[:, [1, 2, 3, 0]])
    out = []
    for k in range(1, len(rot) - 1):
        mid = Slerp([0.0, 1.0], rot[[k - 1, k + 1]])(0.5)
        out.append((mid.inv() * rot[k]).magnitude())
    return np.array(out)


# -- spikes ------------------------------------------------------------------------------------------------------


def test_08_02_toe_glitch_is_found_in_the_fbx_itself_and_corrected(cmu):
    """The 08_02 FBX's right toe: keys 276 and 281 stand 0.38 and 0.35 rad from the midpoint of their neighbours
    (pyassimp's own keys, scipy's Slerp), an acceleration of ~10,000 rad/s^2 at 120 fps; the retarget replaces
    exactly those two frames of the toe (and the right hand's frame 273, as far out), says so in the metadata, and
    the 61.5 rad/s jump the validator rejected is gone from the mapped motion."""
    pyassimp = pytest.importorskip("pyassimp")
    path = data_file("fbx/08_02_cmu.fbx")
    with pyassimp.load(str(path)) as scene:
        chan = next(c for c in scene.animations[0].channels if c.nodename.data.decode() == "RightToeBase")
        keys = np.array([k.value for k in chan.rotationkeys], dtype=np.float64)  # WXYZ, the node's local rotation
    dev = _scipy_midpoint_deviation(keys)
    limit = 8000.0 / (2 * 120.0**2)
    # over the threshold: 275, 276 (neighbours: the larger, 276, is the glitch; 275 only leans on it) and 281
    assert sorted((np.flatnonzero(dev > limit) + 1).tolist()) == [275, 276, 281] and dev[275] > dev[274]

    desc, layout, _ = cmu
    src = ke.pipelines.load_motion(path)
    res = ke.retarget.retarget_motion(src, CONFIG, desc)
    spikes = res.motion.metadata["retarget"]["spikes_corrected"]
    toe = [s for s in spikes if s["joint"] == "RightToeBase"]
    assert [s["source_frame"] for s in toe] == [276, 281]
    for s in toe:
        assert s["deviation_rad"] == pytest.approx(dev[s["source_frame"] - 1], abs=2e-3)
        assert "slerp" in s["reason"]
    assert {s["joint"] for s in spikes} <= {"RightToeBase", "RightFingerBase", "RThumb"}
    mapped = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(res.motion, clamp_to_limits=True)
    speed = np.abs(np.diff(mapped.motion.q[:, 7:], axis=0)).max(0) * res.motion.fps
    names = [b.joint_name for b in layout.blocks[1:]]
    assert speed[names.index("rtoesrx")] < 45.0 and speed.max() < 60.0


def test_despike_corrects_a_glitch_and_leaves_fast_motion_alone():
    """Three joints over 1 s at 120 fps: a steady 30 rad/s spin (a turn far faster than 02_01's 245 degrees/s),
    a kick that goes from rest to 30 rad/s within one frame and stops again, and a slow joint with one frame
    thrown 0.6 rad away: only the glitch frame changes, to scipy's Slerp midpoint of its neighbours."""
    fps, T = 120.0, 120
    t = np.arange(T) / fps
    spin = Rotation.from_rotvec(np.outer(30.0 * t, [0.0, 0.0, 1.0]))
    kick_angle = np.clip((t - 0.3) * 30.0, 0.0, 0.4 * 30.0 * 0.5)  # 30 rad/s from one frame to the next, then held
    kick = Rotation.from_rotvec(np.outer(kick_angle, [1.0, 0.0, 0.0]))
    slow = Rotation.from_rotvec(np.outer(0.5 * np.sin(2 * np.pi * t), [0.0, 1.0, 0.0]))
    glitch = slow[60] * Rotation.from_rotvec([0.6, 0.0, 0.0])
    slow_q = slow.as_quat()
    slow_q[60] = glitch.as_quat()
    quats = np.stack([spin.as_quat(), kick.as_quat(), slow_q], 1)[..., [3, 0, 1, 2]]  # [T, 3, 4] WXYZ
    fixed, spikes = P.despike_rotations(quats.astype(np.float32), fps, max_acceleration=8000.0)
    assert fixed.dtype == np.float32
    assert [(s.frame, s.joint) for s in spikes] == [(60, 2)]
    assert spikes[0].deviation_rad == pytest.approx(0.6, abs=0.02)
    changed = np.abs(fixed - quats).max(-1) > 1e-6
    assert np.argwhere(changed).tolist() == [[60, 2]]
    want = Slerp([0.0, 1.0], Rotation.from_quat(slow_q[[59, 61]]))(0.5)
    got = Rotation.from_quat(fixed[60, 2, [1, 2, 3, 0]].astype(np.float64))
    assert (want.inv() * got).magnitude() < 1e-6


def test_a_clean_capture_has_no_spike():
    """02_01 (the cgspeed BVH) and 07_01 (FBX): every joint's largest midpoint deviation is under the threshold."""
    for rel in ("bvh/cmu/02_01_cgspeed_walk.bvh", "fbx/07_01_cmu.fbx"):
        src = ke.pipelines.load_motion(data_file(rel))[1:]
        _, spikes = P.despike_rotations(src.local_rotation, src.fps, max_acceleration=8000.0)
        assert spikes == [], rel


# -- the knee IK -------------------------------------------------------------------------------------------------


def test_knee_angle_puts_the_ankle_at_the_asked_distance():
    """Random legs: the hinge turn found puts the ankle (turned about the knee axis with scipy's rotation) at the
    asked hip distance, keeps the knee bent its hinge's way, and takes the smaller of the two turns."""
    rng = np.random.default_rng(0)
    n = 200
    hip = rng.normal(size=(n, 3))
    axis = rng.normal(size=(n, 3))
    axis /= np.linalg.norm(axis, axis=1, keepdims=True)
    down = np.cross(axis, rng.normal(size=(n, 3)))
    down /= np.linalg.norm(down, axis=1, keepdims=True)
    knee = hip + 0.4 * down
    bend = rng.uniform(0.2, 1.5, n)
    ankle = knee + Rotation.from_rotvec(axis * bend[:, None]).apply(0.4 * down)
    dist = rng.uniform(0.3, 0.75, n)
    theta = P._knee_angle(hip, knee, ankle, axis, dist)
    moved = knee + Rotation.from_rotvec(axis * theta[:, None]).apply(ankle - knee)
    np.testing.assert_allclose(np.linalg.norm(moved - hip, axis=1), dist, atol=1e-9)
    assert (bend + theta > 0).all()  # still bent forward (axis . thigh x shank > 0)


# -- planted feet ------------------------------------------------------------------------------------------------


def _contact(model, layout, on_model, *, clamp=True):
    mapped = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(on_model, clamp_to_limits=clamp)
    ref = ke.sim.tracking.prepare_reference(model, [mapped.motion])
    h, s = ref.contact_height.numpy(), ref.contact_speed.numpy()
    standing = h < 0.03  # the validator's skate_height
    has = standing.any(-1)
    support = np.where(standing, s, np.inf).min(-1)
    return {
        "skating": float((has & (support > 0.2)).sum() / max(has.sum(), 1)),  # skate_speed 0.2 m/s
        "support_median": float(np.median(support[has])),
        "lowest": float(h.min()),
        "contact": float(has.mean()),
    }


@pytest.mark.parametrize("clip", ["07_01", "08_02"])
def test_planted_feet_do_not_slide_or_sink(cmu, clip):
    """07_01 and 08_02 by name map onto the CMU humanoid, measured as ``validate`` measures a reference: with the
    feet planted, under 3 % of contact frames skate (without: 15 % and 29 %), the slowest standing body moves at
    1-2.5 cm/s in the median (without: 8 and 11 cm/s), a body stands on the ground in over 90 % of frames, and no
    frame is more than 5 mm under the ground (without: 07_01's first frame 1.3 cm, 2.3 cm at worst)."""
    desc, layout, model = cmu
    src = ke.pipelines.load_motion(data_file(f"fbx/{clip}_cmu.fbx"))
    cfg = ke.retarget.load_retarget_config(CONFIG)
    res = ke.retarget.retarget_motion(src, cfg, desc)
    planted = _contact(model, layout, res.motion)
    off = ke.retarget.retarget_motion(src, cfg.replace(plant_feet=()), desc)
    before = _contact(model, layout, off.motion)
    assert planted["skating"] < 0.03 and before["skating"] > 0.1, (planted, before)
    assert planted["support_median"] < 0.03 < before["support_median"] + 0.04
    assert planted["contact"] > 0.9
    assert _contact(model, layout, res.motion, clamp=False)["lowest"] > -0.005
    info = res.motion.metadata["retarget"]["feet_planted"]
    assert set(info["phases"]) == {"lfoot", "rfoot"} and all(n >= 2 for n in info["phases"].values())
    assert 0.0 <= info["pelvis_lowered_max_m"] < 0.1


def test_plant_feet_names_what_it_cannot_hold(cmu):
    """A 'foot' whose parent is no one-hinge knee is left alone and named with why."""
    desc, _, _ = cmu
    src = ke.pipelines.load_motion(data_file("fbx/07_01_cmu.fbx"))[:60]
    cfg = ke.retarget.load_retarget_config(CONFIG).replace(plant_feet=(("lhumerus", ""), ("lfoot", "ltoes")))
    meta = ke.retarget.retarget_motion(src, cfg, desc).motion.metadata["retarget"]
    assert "one-hinge knee" in meta["feet_not_planted"]["lhumerus"]
    assert set(meta["feet_planted"]["phases"]) == {"lfoot"}
