"""The skeleton retarget's vectorised hot spots give what their one-at-a-time forms give.

Oracles: a plain sequential bisection (the loop ``level_feet`` used), the hinge projection applied one step at a
time with the per-step formulas written out here, and the sole points rotated frame by frame with scipy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import data_file
from scipy.spatial.transform import Rotation

import kangengine as ke
from kangengine.retarget import skeleton as sk


def _sequential_bisection(f, lo, hi, f_lo, steps):
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        f_mid = f(mid)
        if np.sign(f_mid) == np.sign(f_lo):
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("per_call", [1, 3, 4])
def test_batched_bisection_takes_the_sequential_steps(seed, per_call):
    """Monotone and wiggly functions (several sign changes: the path matters), 40 and 41 steps."""
    rng = np.random.default_rng(seed)
    roots = np.sort(rng.uniform(-0.55, 0.55, size=int(rng.integers(1, 6))))

    def f(x):
        x = np.asarray(x, dtype=np.float64)
        return np.prod(x[..., None] - roots, axis=-1) * (1.0 + 0.1 * np.sin(7.0 * x))

    lo, hi = -0.6, 0.6
    f_lo = float(f(lo))
    for steps in (40, 41):
        want = _sequential_bisection(lambda x: float(f(x)), lo, hi, f_lo, steps)
        got = sk._bisect(f, lo, hi, f_lo, steps=steps, per_call=per_call)
        assert got == want
        assert np.min(np.abs(roots - got)) < 1e-9


def test_bisection_points_are_the_midpoints_a_bisection_visits():
    pts = sk._bisection_points(-0.6, 0.6, 3)
    assert len(pts) == 7 and pts[0] == 0.0 and pts[1] == 0.5 * (-0.6 + 0.0) and pts[4] == 0.5 * (0.0 + 0.6)


@pytest.fixture(scope="module")
def cmu_walk_on_humanoid():
    desc = ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    src = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))[:120]
    cfg = ke.retarget.load_retarget_config("cmu_bvh_to_cmu_humanoid")
    return desc, src, cfg


def test_sole_points_for_many_pitches_equal_one_pitch_at_a_time_and_scipy(cmu_walk_on_humanoid):
    desc, src, cfg = cmu_walk_on_humanoid
    res = ke.retarget.retarget_motion(src, cfg.replace(level_feet=()), desc)
    tree = res.motion.tree
    pos = np.asarray(res.motion.global_translation, dtype=np.float64)
    rot = np.asarray(res.motion.global_rotation, dtype=np.float64)
    local = np.asarray(res.motion.local_rotation, dtype=np.float64)
    rot /= np.linalg.norm(rot, axis=-1, keepdims=True)  # float32 motion: unit in float64 too, as scipy makes them
    local /= np.linalg.norm(local, axis=-1, keepdims=True)
    fi, ti = tree.index("lfoot"), tree.index("ltoes")
    geoms = sk._usable_geoms(desc)
    fp, _ = sk._sole_points([g for g in geoms if g.body == fi])
    tp, _ = sk._sole_points([g for g in geoms if g.body == ti])
    pose = sk._FootPose(pos, rot, local, fi, ti, fp, tp, np.asarray(tree.local_translation[ti], dtype=np.float64))
    frames = np.arange(0, 120, 7)
    axis = np.array([0.2, 0.9, -0.1])
    thetas = np.array([-0.4, -0.01, 0.0, 0.25])
    many = pose.sole(frames, axis, thetas)
    assert many.shape == (4, len(frames), len(fp) + len(tp), 3)
    for k, th in enumerate(thetas):
        np.testing.assert_array_equal(many[k], pose.sole(frames, axis, float(th)))
        # scipy: world_from_foot * exp(axis theta) applied to the foot's points, then the toe's chain
        gf = Rotation.from_quat(rot[frames, fi][:, [1, 2, 3, 0]]) * Rotation.from_rotvec(
            axis / np.linalg.norm(axis) * th
        )
        foot = pos[frames, fi][:, None] + np.stack([gf.apply(np.array(p)) for p in fp], axis=1)
        gt = gf * Rotation.from_quat(local[frames, ti][:, [1, 2, 3, 0]])
        toe_origin = pos[frames, fi] + gf.apply(np.array(pose.toe_offset))
        toe = toe_origin[:, None] + np.stack([gt.apply(np.array(p)) for p in tp], axis=1)
        np.testing.assert_allclose(many[k], np.concatenate([foot, toe], axis=1), atol=1e-12)


def _project_one(G, art, st):
    """The hinge projection of one step, as it was written before the steps were batched."""
    from kangengine import rotations as R

    rest = art.quat[st.body]
    u = art.pos[st.body] / np.linalg.norm(art.pos[st.body])
    d = art.pos[st.child]
    a = st.axis
    Gp, Gb = G[:, st.parent], G[:, st.body]
    J = R.quat_multiply(R.quat_conjugate(rest), R.quat_multiply(R.quat_conjugate(Gp), Gb))
    v_body = R.quat_rotate(J, d)
    u_b = R.quat_rotate(R.quat_conjugate(rest), u)
    A = u_b @ (d - a * (a @ d))
    B = u_b @ np.cross(a, d)
    C = (u_b @ a) * (a @ d)
    rho = math.hypot(A, B)
    if rho < 1e-9:
        return
    c = np.clip((v_body @ u_b - C) / rho, -1.0, 1.0)
    base, delta = math.atan2(B, A), np.arccos(c)
    th = np.stack([R.wrap_angle(base + delta), R.wrap_angle(base - delta)], axis=-1)
    _, twist = R.quat_swing_twist(J, a)
    th0 = 2 * np.arctan2(twist[..., 1:] @ a, twist[..., 0])
    outside = np.maximum(st.lo - th, 0) + np.maximum(th - st.hi, 0)
    cost = outside * 1e3 + np.abs(R.wrap_angle(th - R.wrap_angle(th0)[:, None]))
    pick = th[np.arange(len(th)), np.argmin(cost, axis=1)]
    Jn = R.quat_from_axis_angle(a, pick)
    w = R.quat_rotate(rest, R.quat_rotate(Jn, d))
    v = R.quat_rotate(rest, v_body)
    w_perp = w - np.outer(w @ u, u)
    v_perp = v - np.outer(v @ u, u)
    phi = np.arctan2(np.cross(w_perp, v_perp) @ u, (w_perp * v_perp).sum(-1))
    Gp_new = R.quat_multiply(Gp, R.quat_from_axis_angle(u, phi))
    G[:, st.parent] = Gp_new
    G[:, st.body] = R.quat_multiply(Gp_new, R.quat_multiply(rest, Jn))


def test_batched_hinge_projection_equals_the_steps_one_by_one(cmu_walk_on_humanoid):
    desc, _, _ = cmu_walk_on_humanoid
    art = sk._Articulation.from_desc(desc)
    mapped = np.ones(len(desc.bodies), dtype=bool)
    steps = sk._hinge_plan(art, mapped)
    assert len(steps) >= 4
    bodies = {s.parent for s in steps} | {s.body for s in steps}
    assert len(bodies) == 2 * len(steps)  # the steps touch disjoint bodies: batching them is exact
    rng = np.random.default_rng(0)
    G = Rotation.random(300 * len(desc.bodies), random_state=rng).as_quat()[:, [3, 0, 1, 2]]
    G = G.reshape(300, len(desc.bodies), 4)
    one = G.copy()
    for st in steps:
        _project_one(one, art, st)
    batch = G.copy()
    sk._project_hinges(batch, art, steps)
    np.testing.assert_allclose(batch, one, atol=1e-12)


def test_tilt_curve_equals_the_rotated_sole_points_and_levels_to_the_same_pitch(cmu_walk_on_humanoid):
    """The closed-form tilt (one sinusoid per stance frame) against the median over sole points rotated at each
    pitch (``_FootPose.sole``, itself checked against scipy above): equal heights to 1e-12 m at any pitch, and
    the 40-step bisection on either lands on the same pitch to 1e-9 rad (the sole-point form is what
    ``level_feet`` bisected before)."""
    desc, src, cfg = cmu_walk_on_humanoid
    res = ke.retarget.retarget_motion(src, cfg.replace(level_feet=()), desc)
    tree = res.motion.tree
    pos = np.asarray(res.motion.global_translation, dtype=np.float64)
    rot = np.asarray(res.motion.global_rotation, dtype=np.float64)
    local = np.asarray(res.motion.local_rotation, dtype=np.float64)
    raw = (rot.copy(), local.copy())
    rot /= np.linalg.norm(rot, axis=-1, keepdims=True)  # unit in float64: the sole-point form assumes it
    local /= np.linalg.norm(local, axis=-1, keepdims=True)
    geoms = sk._usable_geoms(desc)
    rng = np.random.default_rng(4)
    for foot, toe in (("lfoot", "ltoes"), ("rfoot", "rtoes")):
        fi, ti = tree.index(foot), tree.index(toe)
        fp, fr = sk._sole_points([g for g in geoms if g.body == fi])
        tp, tr = sk._sole_points([g for g in geoms if g.body == ti])
        radii = np.concatenate([fr, tr])
        pose = sk._FootPose(pos, rot, local, fi, ti, fp, tp, np.asarray(tree.local_translation[ti], dtype=np.float64))
        S = np.sort(rng.choice(len(pos), size=41, replace=False))
        axis = np.array([0.1, 0.95, -0.2])
        axis /= np.linalg.norm(axis)
        for rear, front in ((0, len(radii) - 1), (len(fp), 1), (len(radii) - 1, 0)):  # foot/toe points both ways

            def by_points(theta, S=S, axis=axis, rear=rear, front=front, pose=pose, radii=radii):
                p = pose.sole(S, axis, theta)[..., 2] - radii
                d = np.median(p[..., rear] - p[..., front], axis=-1)
                return float(d) if np.ndim(theta) == 0 else d

            curve = sk._TiltCurve(pose, S, axis, rear, front, radii)
            thetas = np.linspace(-0.6, 0.6, 13)
            np.testing.assert_allclose(curve(thetas), by_points(thetas), atol=1e-12)
            assert isinstance(curve(0.3), float) and curve(0.3) == pytest.approx(by_points(0.3), abs=1e-12)
            lo, hi = -0.6, 0.6
            if np.sign(by_points(lo)) != np.sign(by_points(hi)):
                want = _sequential_bisection(by_points, lo, hi, by_points(lo), 40)
                got = sk._bisect(curve, lo, hi, curve(lo), steps=40)
                assert abs(got - want) < 1e-9
                # on the clip's own (float32, unit to ~1e-7) rotations, as level_feet bisected them before
                old = sk._FootPose(pos, *raw, fi, ti, fp, tp, pose.toe_offset)
                old_f = lambda t, old=old, S=S, axis=axis, rear=rear, front=front, radii=radii: float(  # noqa: E731
                    np.median(
                        (old.sole(S, axis, t)[..., 2] - radii)[..., rear]
                        - (old.sole(S, axis, t)[..., 2] - radii)[..., front]
                    )
                )
                got_raw = sk._bisect(sk._TiltCurve(old, S, axis, rear, front, radii), lo, hi, curve(lo), steps=40)
                assert abs(got_raw - _sequential_bisection(old_f, lo, hi, old_f(lo), 40)) < 1e-6
