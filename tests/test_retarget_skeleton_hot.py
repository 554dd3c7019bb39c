"""The skeleton retarget's fast paths give what the previous, one-thing-at-a-time implementation gives.

Oracles: the whole retarget as it was written before its per-target plan (``_reference_retarget`` below: every
constant per call, hinge steps one at a time, feet levelled by a 40-step sequential bisection on sole points
rotated with scipy at every pitch, the ground from every geom's own rotation matrix), MuJoCo's geom poses for the
lowest points, scipy / rotations.py for the small quaternion helpers, ``np.median`` for the padded median, and a
plain sequential bisection.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from conftest import data_file
from scipy.ndimage import minimum_filter1d, uniform_filter1d
from scipy.spatial.transform import Rotation

import kangengine as ke
from kangengine import rotations as R
from kangengine.retarget import skeleton as sk

CONFIG = "cmu_bvh_to_cmu_humanoid"


def _sequential_bisection(f, lo, hi, f_lo, steps):
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        f_mid = f(mid)
        if np.sign(f_mid) == np.sign(f_lo):
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _scipy(q):
    return Rotation.from_quat(np.asarray(q)[..., [1, 2, 3, 0]])


# -- the reference: the retarget as written before -------------------------------------------------------------


def _project_one(G, art, st):
    """The hinge projection of one step, as it was written before the steps were batched."""
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


def _reference_pitch(desc, tree, pos, rot, local, fps, foot, toe):
    """(axis, pitch) of one foot as ``level_feet`` found it before: sole points rotated (scipy) at every pitch of
    a 40-step bisection on their median rear-minus-front height; pitch 0 where it does not apply."""
    fi = tree.index(foot)
    ti = tree.index(toe) if toe else None
    geoms = sk._usable_geoms(desc)
    fp, fr = sk._sole_points([g for g in geoms if g.body == fi])
    tp, tr = sk._sole_points([g for g in geoms if ti is not None and g.body == ti])
    radii = np.concatenate([fr, tr])

    def sole(frames, axis=None, theta=0.0):
        gf = _scipy(rot[frames, fi])
        if axis is not None:
            gf = gf * Rotation.from_rotvec(axis * theta)
        foot_pts = pos[frames, fi][:, None] + np.stack([gf.apply(p) for p in fp], axis=1)
        if ti is None:
            return foot_pts
        gt = gf * _scipy(local[frames, ti])
        toe_origin = pos[frames, fi] + gf.apply(np.array(tree.local_translation[ti], dtype=np.float64))
        return np.concatenate([foot_pts, toe_origin[:, None] + np.stack([gt.apply(p) for p in tp], axis=1)], axis=1)

    every = sole(np.arange(len(pos)))
    low = (every[..., 2] - radii).min(axis=1)
    v = np.linalg.norm(np.diff(pos[:, fi, :2], axis=0), axis=-1) * fps
    speed = np.maximum(np.r_[v, v[-1]], np.r_[v[0], v])
    S = np.flatnonzero((low < low.min() + 0.03) & (speed < 0.3))
    if len(S) < 3:
        return None, 0.0
    pts = every[S]
    span = pts[..., :2] - pts[..., :2].mean(axis=1, keepdims=True)
    forward = np.r_[np.linalg.svd(span.reshape(-1, 2), full_matrices=False)[2][0], 0.0]
    if ti is not None and np.mean((pos[S, ti, :2] - pos[S, fi, :2]) @ forward[:2]) < 0:
        forward = -forward
    along = (pts @ forward).mean(0)
    rear, front = int(np.argmin(along)), int(np.argmax(along))
    axis = _scipy(rot[S, fi]).inv().apply(np.cross([0.0, 0.0, 1.0], forward)).mean(axis=0)
    axis /= np.linalg.norm(axis)

    def tilt(theta):
        z = sole(S, axis, theta)[..., 2] - radii
        return float(np.median(z[:, rear] - z[:, front]))

    if np.sign(tilt(-0.6)) == np.sign(tilt(0.6)):
        return axis, 0.0
    return axis, _sequential_bisection(tilt, -0.6, 0.6, tilt(-0.6), 40)


def _reference_lowest(desc, pos, rot):
    """``[T]`` lowest z over every usable geom (its world rotation matrix from scipy, one geom at a time) and the
    origins of the bodies without one."""
    geoms = sk._usable_geoms(desc)
    low = np.full(len(pos), np.inf)
    for g in geoms:
        world = _scipy(rot[:, g.body]) * _scipy(g.quat_wxyz)
        r = world.as_matrix()[:, 2, :]  # third row: z of the geom's axes
        centre = pos[:, g.body, 2] + _scipy(rot[:, g.body]).apply(np.array(g.pos, dtype=np.float64))[:, 2]
        size = np.asarray(g.size, dtype=np.float64)
        kind = g.type.value
        if kind == "sphere":
            ext = np.full(len(pos), size[0])
        elif kind == "capsule":
            ext = np.abs(r[:, 2]) * size[1] + size[0]
        elif kind == "cylinder":
            ext = np.abs(r[:, 2]) * size[1] + size[0] * np.sqrt(np.clip(1 - r[:, 2] ** 2, 0, 1))
        elif kind == "box":
            ext = (np.abs(r) * size).sum(-1)
        else:
            ext = np.sqrt(((r * size) ** 2).sum(-1))
        low = np.minimum(low, centre - ext)
    bare = sorted(set(range(len(desc.bodies))) - {g.body for g in geoms})
    if bare:
        low = np.minimum(low, pos[:, bare, 2].min(axis=1))
    return low


def _reference_retarget(src, config, desc):
    """``(root [T, 3], local [T, n, 4], feet {foot: degrees}, ground shift)`` in float64, as before."""
    src = src.numpy()
    tgt = sk._as_target(desc)
    inv = {v: k for k, v in sk._resolve_sources(dict(config.joint_mapping), src.tree).items()}
    s_tpose = sk._tpose_of(sk._as_target(src.tree), config.source_tpose)
    t_tpose = sk._tpose_of(tgt, config.target_tpose)
    names, parents = tgt.tree.node_names, tgt.tree.parent_indices
    mapped = np.array([n in inv for n in names])
    mapped[[k for k in range(1, len(names)) if not tgt.art.joints[k]]] = False
    tgt_idx = np.flatnonzero(mapped)
    src_idx = [src.tree.index(inv[names[k]]) for k in tgt_idx]
    srcT_idx = np.array([s_tpose.tree.index(inv[names[k]]) for k in tgt_idx])
    Q = config.rotation_wxyz
    Gs = np.asarray(src.global_rotation, dtype=np.float64)[:, src_idx]
    Gst = np.asarray(s_tpose.global_rotation, dtype=np.float64)[srcT_idx]
    delta = R.quat_multiply(R.quat_multiply(Q, R.quat_multiply(Gs, R.quat_conjugate(Gst))), R.quat_conjugate(Q))
    tl = np.asarray(t_tpose.local_rotation, dtype=np.float64)
    G = np.empty((src.num_frames, len(names), 4))
    G[:, tgt_idx] = R.quat_normalize(R.quat_multiply(delta, t_tpose.global_rotation[tgt_idx]))

    def place_unmapped():
        for k in np.flatnonzero(~mapped):
            G[:, k] = R.quat_multiply(G[:, parents[k]], tl[k])

    place_unmapped()
    for st in sk._hinge_plan(tgt.art, mapped):
        _project_one(G, tgt.art, st)
    place_unmapped()
    local = R.quat_multiply(R.quat_conjugate(G[:, np.maximum(parents, 0)]), G)
    local[:, 0] = G[:, 0]
    local[:, ~mapped] = tl[~mapped]
    local = R.quat_normalize(local)
    scale = sk._auto_scale(s_tpose, t_tpose, srcT_idx, tgt_idx)
    sr = s_tpose.tree.index(inv[names[0]])
    src_root = np.asarray(src.global_translation, dtype=np.float64)[:, src.tree.index(inv[names[0]])]
    root = t_tpose.root_translation + scale * R.quat_rotate(Q, src_root - s_tpose.global_translation[sr])
    motion = ke.animation.SkeletonMotion(tgt.tree, root, local, src.fps)
    pos, rot = np.asarray(motion.global_translation), np.asarray(motion.global_rotation)
    feet = {}
    for foot, toe in config.level_feet:
        axis, theta = _reference_pitch(desc, tgt.tree, pos, rot, local, src.fps, foot, toe)
        if theta:
            fi = tgt.tree.index(foot)
            local[:, fi] = R.quat_multiply(local[:, fi], R.quat_from_axis_angle(axis, theta))
        feet[foot] = math.degrees(theta)
    motion = ke.animation.SkeletonMotion(tgt.tree, root, local, src.fps)
    low = _reference_lowest(desc, np.asarray(motion.global_translation), np.asarray(motion.global_rotation))
    width = max(1, int(round(config.ground_window_s * src.fps)) | 1)
    shift = -uniform_filter1d(minimum_filter1d(low, width, mode="nearest"), width, mode="nearest")
    root = root.copy()
    root[:, 2] += shift
    return root, local, feet, shift


# -- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cmu_desc():
    return ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))


@pytest.fixture(scope="module")
def clips():
    """Real CMU clips as convert sees them (1 s crops resampled to 30 fps, float32) and a longer one at 120 fps,
    in float32 and float64."""
    walk = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    hops = ke.io.load_bvh(data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh"))
    out = [m[s : s + 120].resample(30.0) for m in (walk, hops) for s in (0, 150)]
    long = walk[:240]
    as64 = ke.animation.SkeletonMotion(
        long.tree, long.root_translation.astype(np.float64), long.local_rotation.astype(np.float64), long.fps
    )
    return out + [long, as64]


# -- the whole retarget ---------------------------------------------------------------------------------------


def test_retarget_equals_the_previous_implementation(clips, cmu_desc):
    """Body positions to 1e-6 m, local rotations to 1e-6 rad, the feet's pitches to 1e-4 degrees (the bisection
    now stops at a 1.1e-6 rad bracket and interpolates), the ground shift to 1e-6 m."""
    config = sk.load_retarget_config(CONFIG)
    found = []
    for clip in clips:
        res = sk.retarget_motion(clip, CONFIG, cmu_desc)
        root, local, feet, shift = _reference_retarget(clip, config, cmu_desc)
        m = res.motion
        assert m.local_rotation.dtype == clip.local_rotation.dtype
        want = ke.animation.SkeletonMotion(m.tree, root, local, clip.fps)
        got = ke.animation.SkeletonMotion(
            m.tree, m.root_translation.astype(np.float64), m.local_rotation.astype(np.float64), clip.fps
        )
        eps = 1e-6 if clip.local_rotation.dtype == np.float64 else 2e-6  # float32 output: its own rounding
        np.testing.assert_allclose(got.global_translation, want.global_translation, atol=eps)
        assert float(np.max(R.quat_angle_between(got.local_rotation, want.local_rotation))) < eps
        levelled = m.metadata["retarget"]["feet_levelled_deg"]
        assert set(levelled) == set(feet) and all(abs(levelled[f] - feet[f]) < 1e-4 for f in feet)
        np.testing.assert_allclose(res.ground_shift, shift, atol=1e-6)
        found += [a for a in feet.values() if a != 0.0]
    assert len(found) >= len(clips) and all(-45 < a < -5 for a in found), found  # the pitch is really found


def test_retarget_with_feet_of_different_sole_point_counts_equals_the_previous_implementation(clips, cmu_desc):
    """One foot with its toe (9 sole points), one without (6; its walking direction from the SVD, no toe to point
    at): the feet's padded rows and the SVD path against the previous implementation."""
    config = sk.load_retarget_config(CONFIG).replace(level_feet=(("lfoot", "ltoes"), ("rfoot", "")))
    for clip in (clips[0], clips[-1]):
        res = sk.retarget_motion(clip, config, cmu_desc)
        root, local, feet, shift = _reference_retarget(clip, config, cmu_desc)
        levelled = res.motion.metadata["retarget"]["feet_levelled_deg"]
        assert set(levelled) == {"lfoot", "rfoot"} and all(abs(levelled[f] - feet[f]) < 1e-4 for f in feet)
        want = ke.animation.SkeletonMotion(res.motion.tree, root, local, clip.fps)
        np.testing.assert_allclose(res.motion.global_translation, want.global_translation, atol=2e-6)
        np.testing.assert_allclose(res.ground_shift, shift, atol=1e-6)


def _mujoco_lowest(mujoco, model, data) -> float:
    """The lowest point (world z, m) over the colliding geoms of ``model`` from MuJoCo's own geom poses
    (``geom_xpos``, ``geom_xmat``) after ``mj_kinematics``: spheres, capsules, boxes, cylinders, ellipsoids."""
    low = []
    for g in range(model.ngeom):
        if model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0:
            continue
        r, size, z = data.geom_xmat[g].reshape(3, 3)[2], model.geom_size[g], data.geom_xpos[g, 2]
        kind = model.geom_type[g]
        if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
            low.append(z - size[0])
        elif kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
            low.append(z - abs(r[2]) * size[1] - size[0])
        elif kind == mujoco.mjtGeom.mjGEOM_BOX:
            low.append(z - (np.abs(r) * size).sum())
        elif kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
            low.append(z - abs(r[2]) * size[1] - size[0] * math.sqrt(max(0.0, 1 - r[2] ** 2)))
        elif kind == mujoco.mjtGeom.mjGEOM_ELLIPSOID:
            low.append(z - math.sqrt(((r * size) ** 2).sum()))
    return min(low)


def test_lowest_points_equal_mujoco_geom_poses(clips, cmu_desc):
    """The lowest point of every collision geom, from the bodies' world poses MuJoCo computes for the converted
    joint coordinates, against the same formula on MuJoCo's own geom poses (geom_xpos, geom_xmat)."""
    mujoco = pytest.importorskip("mujoco")
    model = mujoco.MjModel.from_xml_path(str(data_file("mjcf/dm_control/humanoid_CMU.xml")))
    data = mujoco.MjData(model)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=cmu_desc, free_root=True)
    res = sk.retarget_motion(clips[0], CONFIG, cmu_desc)
    q = ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(res.motion).motion.q
    qpos = ke.adapters.MuJoCoMotionAdapter(layout, model=model).pack_arrays(q, np.zeros((len(q), layout.nv))).qpos
    names = [model.body(i).name for i in range(model.nbody)]
    order = [names.index(b.name) for b in cmu_desc.bodies]
    pos, rot, want = [], [], []
    ground = sk._GroundGeoms.from_desc(cmu_desc)
    for row in np.asarray(qpos, dtype=np.float64):
        data.qpos[:] = row
        mujoco.mj_kinematics(model, data)
        pos.append(data.xpos[order].copy())
        rot.append(data.xquat[order].copy())
        want.append(_mujoco_lowest(mujoco, model, data))
    got = ground.lowest(np.array(pos), np.array(rot))
    assert len(ground.bare) == 0 or np.array(pos)[:, ground.bare, 2].min() > np.min(want)
    np.testing.assert_allclose(got, want, atol=1e-9)


_EVERY_GEOM = """<mujoco><worldbody><body name="a" pos="0 0 1"><freejoint/>
  <geom type="sphere" size="0.05" pos="0.1 0 0"/>
  <geom type="capsule" size="0.03 0.2" pos="0 0.1 0" euler="30 10 0"/>
  <body name="b" pos="0.3 0 0" euler="0 40 20"><joint type="ball"/>
    <geom type="box" size="0.1 0.05 0.02" pos="0 0 0.1" euler="10 20 30"/>
    <geom type="cylinder" size="0.04 0.15" euler="70 0 15"/>
    <geom type="ellipsoid" size="0.1 0.06 0.03" pos="0.1 0 -0.1" euler="5 60 0"/>
  </body></body></worldbody></mujoco>"""


def every_geom_in_random_poses(tmp_path, n: int, seed: int):
    """The :data:`_EVERY_GEOM` model in ``n`` random poses of its two bodies, posed by MuJoCo:
    ``(desc, pos [n, 2, 3] m, rot [n, 2, 4] wxyz, lowest [n] m)``, the lowest point of its geoms from MuJoCo's
    geom poses."""
    mujoco = pytest.importorskip("mujoco")
    path = tmp_path / "geoms.xml"
    path.write_text(_EVERY_GEOM)
    desc = ke.asset.MJCFLoader.load(path)
    model = mujoco.MjModel.from_xml_path(str(path))
    data = mujoco.MjData(model)
    rng = np.random.default_rng(seed)
    pos, rot, want = [], [], []
    for _ in range(n):
        data.qpos[:3] = rng.normal(size=3)
        data.qpos[3:7] = Rotation.random(random_state=rng).as_quat()[[3, 0, 1, 2]]
        data.qpos[7:11] = Rotation.random(random_state=rng).as_quat()[[3, 0, 1, 2]]
        mujoco.mj_kinematics(model, data)
        pos.append(data.xpos[1:].copy())
        rot.append(data.xquat[1:].copy())
        want.append(_mujoco_lowest(mujoco, model, data))
    return desc, np.array(pos), np.array(rot), np.array(want)


def test_lowest_points_of_every_geom_kind_equal_mujoco(tmp_path):
    """Spheres, capsules, boxes, cylinders and ellipsoids in random poses: the one-formula extents against each
    kind's lowest point from MuJoCo's geom poses."""
    desc, pos, rot, want = every_geom_in_random_poses(tmp_path, 40, seed=7)
    ground = sk._GroundGeoms.from_desc(desc)
    assert ground.disc is not None and ground.ellipsoid is not None and len(ground.bare) == 0
    np.testing.assert_allclose(ground.lowest(pos, rot), want, atol=1e-9)
    np.testing.assert_allclose(_reference_lowest(desc, pos, rot), want, atol=1e-9)


def test_plans_are_kept_per_configuration_target_and_skeleton(clips, cmu_desc, tmp_path):
    """A second clip reuses the plan (same results as a fresh one); an edited configuration file is read again;
    T-poses given by the caller are used as given and not made read-only; kept T-poses are read-only."""
    a = sk.retarget_motion(clips[0], CONFIG, cmu_desc)
    b = sk.retarget_motion(clips[0], CONFIG, cmu_desc)
    assert a.source_tpose is b.source_tpose  # the kept plan
    np.testing.assert_array_equal(a.motion.local_rotation, b.motion.local_rotation)
    sk._PLANS.clear()
    c = sk.retarget_motion(clips[0], CONFIG, cmu_desc)
    np.testing.assert_array_equal(a.motion.local_rotation, c.motion.local_rotation)
    with pytest.raises(ValueError):
        c.target_tpose.local_rotation[0, 0] = 2.0
    # an edited file: read again (its modification time and size change)
    cfg = sk.load_retarget_config(CONFIG).to_dict()
    cfg["target_asset"] = None
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(cfg))
    first = sk.retarget_motion(clips[0], str(path), cmu_desc)
    cfg["scale"] = 0.5
    path.write_text(json.dumps(cfg) + " ")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = sk.retarget_motion(clips[0], str(path), cmu_desc)
    assert first.scale != 0.5 and second.scale == 0.5
    # T-poses of the caller: used, not kept, left writable
    tpose = sk.make_tpose(clips[0].tree)
    given = sk.retarget_motion(clips[0], CONFIG, cmu_desc, source_tpose=tpose)
    assert tpose.local_rotation.flags.writeable and given.source_tpose.tree is tpose.tree
    np.testing.assert_allclose(given.motion.local_rotation, a.motion.local_rotation, atol=1e-6)


# -- the pieces ---------------------------------------------------------------------------------------------


def test_quaternion_helpers_equal_rotations_py():
    rng = np.random.default_rng(3)
    a = Rotation.random(300, random_state=rng).as_quat()[:, [3, 0, 1, 2]].reshape(30, 10, 4)
    b = Rotation.random(300, random_state=rng).as_quat()[:, [3, 0, 1, 2]].reshape(30, 10, 4)
    np.testing.assert_allclose(sk._qmul(a, b), R.quat_multiply(a, b), atol=1e-15)
    np.testing.assert_allclose(sk._qmul(a, b, conj_a=True), R.quat_multiply(R.quat_conjugate(a), b), atol=1e-15)
    np.testing.assert_allclose(sk._qmul(a[0], b), R.quat_multiply(a[0], b), atol=1e-15)  # broadcast
    np.testing.assert_allclose(sk._qmat(a), _scipy(a.reshape(-1, 4)).as_matrix().reshape(30, 10, 3, 3), atol=1e-15)
    np.testing.assert_allclose(sk._third_rows(a), sk._qmat(a)[..., 2, :], atol=1e-15)
    axis = rng.normal(size=(10, 3))
    axis /= np.linalg.norm(axis, axis=-1, keepdims=True)
    angle = rng.uniform(-4, 4, size=(30, 10))
    np.testing.assert_allclose(sk._qaxis(axis, angle), R.quat_from_axis_angle(axis, angle), atol=1e-15)
    v = rng.normal(size=(10, 3))
    np.testing.assert_allclose(np.einsum("sij,sj->si", sk._cross_matrix(axis), v), np.cross(axis, v), atol=1e-15)
    np.testing.assert_allclose(sk._unit(3.0 * a), a, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_bisection_rows_land_on_the_sequential_bisection_root(seed):
    """Monotone and wiggly functions (several sign changes: the path matters), two rows at once: the root the
    40-step sequential bisection finds, to the final bracket's width (1.2 / 2**20) and to 1e-9 where the function
    is smooth there."""
    rng = np.random.default_rng(seed)
    roots = [np.sort(rng.uniform(-0.55, 0.55, size=int(rng.integers(1, 6)))) for _ in range(2)]

    def one(x, r):
        x = np.asarray(x, dtype=np.float64)
        return np.prod(x[..., None] - r, axis=-1) * (1.0 + 0.1 * np.sin(7.0 * x))

    f = lambda t: np.stack([one(t[0], roots[0]), one(t[1], roots[1])])  # noqa: E731
    lo, hi = -0.6, 0.6
    ends = np.array([[one(lo, r), one(hi, r)] for r in roots])
    ok = np.sign(ends[:, 0]) != np.sign(ends[:, 1])
    for per_call in (1, 4, 5):
        got, at_lo, at_hi = sk._bisect_rows(f, [lo, lo], [hi, hi], steps=20, per_call=per_call)
        np.testing.assert_array_equal(np.stack([at_lo, at_hi], axis=1), ends)
        for i in np.flatnonzero(ok):
            want = _sequential_bisection(lambda x, i=i: float(one(x, roots[i])), lo, hi, ends[i, 0], 40)
            assert abs(got[i] - want) < 1e-9 and np.min(np.abs(roots[i] - got[i])) < 1e-9


def test_padded_median_equals_numpy_median():
    rng = np.random.default_rng(5)
    count = np.array([7, 12, 1, 2])
    coef = np.zeros((4, 3, 12))
    coef[:, 0] = np.inf
    for i, c in enumerate(count):
        coef[i, :, :c] = rng.normal(size=(3, c))
    theta = rng.uniform(-0.6, 0.6, size=(4, 9))
    got = sk._median_tilt(coef, count)(theta)
    for i, c in enumerate(count):
        k0, k1, k2 = coef[i, :, :c]
        d = k0 + np.cos(theta[i])[:, None] * k1 + np.sin(theta[i])[:, None] * k2
        np.testing.assert_array_equal(got[i], np.median(d, axis=-1))


def test_tilt_coefficients_equal_points_rotated_with_scipy(clips, cmu_desc):
    """``k0 + k1 cos + k2 sin`` against the two sole points pitched about the axis with scipy, then put in the
    world by the foot's rotation (any axis, any pitch)."""
    res = sk.retarget_motion(clips[-1], sk.load_retarget_config(CONFIG).replace(level_feet=()), cmu_desc)
    pos = np.asarray(res.motion.global_translation, dtype=np.float64)
    rot = R.quat_normalize(np.asarray(res.motion.global_rotation, dtype=np.float64))
    fi = res.motion.tree.index("lfoot")
    rng = np.random.default_rng(2)
    R_foot = _scipy(rot[:, fi]).as_matrix()[:, None]  # [T, 1, 3, 3]
    pair = rng.normal(scale=0.1, size=(len(pos), 1, 2, 3))
    radii = np.array([[0.02, 0.01]])
    axis = np.array([[0.1, 0.95, -0.2]]) / np.linalg.norm([0.1, 0.95, -0.2])
    k = sk._tilt_coefficients(R_foot, pos[:, fi, 2][:, None], pair, radii, axis)[:, :, 0]  # [3, T]
    for theta in (-0.5, -0.1, 0.0, 0.3):
        world = [
            pos[:, fi] + (_scipy(rot[:, fi]) * Rotation.from_rotvec(axis[0] * theta)).apply(pair[:, 0, j])
            for j in (0, 1)
        ]
        want = (world[0][:, 2] - radii[0, 0]) - (world[1][:, 2] - radii[0, 1])
        np.testing.assert_allclose(k[0] + k[1] * np.cos(theta) + k[2] * np.sin(theta), want, atol=1e-12)


def test_batched_hinge_projection_equals_the_steps_one_by_one(cmu_desc):
    art = sk._Articulation.from_desc(cmu_desc)
    mapped = np.ones(len(cmu_desc.bodies), dtype=bool)
    steps = sk._hinge_plan(art, mapped)
    assert len(steps) >= 4
    bodies = {s.parent for s in steps} | {s.body for s in steps}
    assert len(bodies) == 2 * len(steps)  # the steps touch disjoint bodies: batching them is exact
    rng = np.random.default_rng(0)
    G = Rotation.random(300 * len(cmu_desc.bodies), random_state=rng).as_quat()[:, [3, 0, 1, 2]]
    G = G.reshape(300, len(cmu_desc.bodies), 4)
    one = G.copy()
    for st in steps:
        _project_one(one, art, st)
    batch = G.copy()
    sk._project_hinges(batch, art, steps)
    np.testing.assert_allclose(batch, one, atol=1e-12)
