"""MotionLibrary: packing, sampling (exact, halfway, looping, clamping, per-clip fps, weights), velocities,
kinematics, adapter hook, library files and bad input. Real clips: the poselib AMP clips, CMU and Bandai
Namco BVH; oracles: scipy (Slerp, chi-square, KS), poselib's own stored velocities, MuJoCo, analytic motion.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import data_file
from scipy import stats
from scipy.ndimage import gaussian_filter1d
from scipy.spatial.transform import Rotation, Slerp

import kangengine.rotations as R
from kangengine.animation import (
    ArticulationCoordinateLayout,
    ArticulationMotion,
    Interpolation,
    MotionLibrary,
    SkeletonMotion,
    SkeletonTree,
    forward_kinematics,
)
from kangengine.animation.library import MixedSkeletonError, UnknownMotionError, nlerp_max_error
from kangengine.asset import MJCFLoader
from kangengine.datasets.arrays import load_npy, load_poselib
from kangengine.errors import (
    FileMissingError,
    FormatError,
    LayoutSignatureWarning,
    MotionError,
    NonFiniteError,
    ShapeError,
    UnknownNameError,
)

AMP = ("walk", "run", "backflip")  # 154 frames @ 60, 82 @ 60, 29 @ 16 (float64 in the file)


@pytest.fixture(scope="module")
def amp():
    return [load_poselib(data_file(f"motions/amp_poselib/amp_humanoid_{n}.npy")) for n in AMP]


@pytest.fixture(scope="module")
def lib(amp):
    return MotionLibrary(amp, precompute_kinematics=True, keep_source_motions=True)


@pytest.fixture(scope="module")
def amp_layout():
    desc = MJCFLoader.load(data_file("mjcf/protomotions/amp_humanoid.xml"), order="DFS")
    return ArticulationCoordinateLayout.from_data(data=desc, free_root=True)


def _np(x):
    return x.detach().cpu().numpy().astype(np.float64)


def _angle(a, b):
    """Rotation angle between unit WXYZ quaternions (numpy)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return R.quat_angle_between(R.quat_normalize(a), R.quat_normalize(b))


def _all_frames(lib):
    count = lib.clip_frame_count.numpy()
    ids = np.repeat(np.arange(len(count)), count)
    frames = np.concatenate([np.arange(c) for c in count])
    return ids, frames


# -- packing and exact frames ---------------------------------------------------------------------------------


def test_packing_layout(lib, amp):
    b = lib.packed_buffers()
    assert lib.num_motions == 3 and lib.num_bodies == 15 and lib.total_frames == 154 + 82 + 29
    assert lib.clip_names == tuple(f"amp_humanoid_{n}" for n in AMP)
    assert b.clip_frame_start.tolist() == [0, 154, 236] and b.clip_frame_count.tolist() == [154, 82, 29]
    assert b.clip_fps.tolist() == [60.0, 60.0, 16.0] and b.clip_weight.tolist() == [1.0, 1.0, 1.0]
    assert np.allclose(b.clip_duration.numpy(), [153 / 60, 81 / 60, 28 / 16])
    assert b.frames_packed.dtype == torch.float32 and b.frames_packed.shape == (265, 3 + 60 + 6)
    assert b.global_positions.shape == (265, 15, 3) and b.global_rotations_wxyz.shape == (265, 15, 4)
    assert b.local_translations is None and b.backend == {}
    # views share memory with the packed rows
    assert b.root_positions.data_ptr() == b.frames_packed.data_ptr()
    assert torch.equal(b.root_rotations_wxyz, b.local_rotations_wxyz[:, 0])
    # quaternions are hemisphere-continuous along each clip (no neighbour pair needs a sign flip)
    for start, count in zip(b.clip_frame_start.tolist(), b.clip_frame_count.tolist()):
        for q in (b.local_rotations_wxyz, b.global_rotations_wxyz):
            seg = q[start : start + count]
            assert ((seg[1:] * seg[:-1]).sum(-1) >= 0).all()


def test_sample_frames_is_bit_exact_and_equals_the_source(lib, amp):
    ids, frames = _all_frames(lib)
    s = lib.sample_frames(ids, frames)
    b = lib.packed_buffers()
    g = torch.as_tensor(np.arange(lib.total_frames))
    assert torch.equal(s.frame0, g) and torch.equal(s.frame1, g) and not s.interpolated
    assert torch.equal(s.rows, b.frames_packed[g]) and (s.blend == 0).all() and s.loop_offsets is None
    assert np.allclose(_np(s.times), frames / lib.clip_fps.numpy()[ids])
    src_rot = np.concatenate([m.local_rotation for m in amp])
    src_root = np.concatenate([m.root_translation for m in amp])
    assert np.allclose(_np(s.root_positions), src_root, atol=1e-6)
    assert _angle(_np(s.local_rotations_wxyz), src_rot).max() < 1e-3 * 1e-3  # float32 rounding only


def test_exact_frame_times_equal_stored_frames(lib):
    ids, frames = _all_frames(lib)
    fps = lib.clip_fps.numpy()[ids]
    for loop in (False, True):
        s = lib.sample(ids, frames / fps, loop=loop)
        exact = lib.sample_frames(ids, frames)
        # the last frame of a looping clip is reached as frame 0 of the next loop (+ displacement): skip it
        keep = np.ones(len(ids), bool) if not loop else frames < lib.clip_frame_count.numpy()[ids] - 1
        assert np.allclose(_np(s.root_positions)[keep], _np(exact.root_positions)[keep], atol=2e-6)
        assert np.abs(_np(s.local_rotations_wxyz) - _np(exact.local_rotations_wxyz))[keep].max() < 2e-6
        assert np.abs(_np(s.root_angular_velocities) - _np(exact.root_angular_velocities))[keep].max() < 1e-4


def test_per_clip_fps(lib):
    # backflip is 16 fps, walk and run 60: the same time lands on different frames
    s = lib.sample([0, 2, 2, 1], [0.5, 0.5, 3.5 / 16, 40.25 / 60], loop=False)
    start = lib.clip_frame_start.numpy()
    assert (s.frame0.numpy() - start[[0, 2, 2, 1]]).tolist() == [30, 8, 3, 40]
    assert (s.frame1.numpy() - start[[0, 2, 2, 1]]).tolist() == [31, 9, 4, 41]
    assert np.allclose(s.blend.numpy(), [0.0, 0.0, 0.5, 0.25], atol=1e-6)


# -- blending ----------------------------------------------------------------------------------------------


def test_halfway_samples_are_lerp_and_slerp_of_the_neighbours(amp):
    libs = {k: MotionLibrary(amp, interpolation=k) for k in ("nlerp", "slerp")}
    b = libs["slerp"].packed_buffers()
    for c, m in enumerate(amp):
        k = np.arange(m.num_frames - 1)
        for frac in (0.5, 0.25, 0.9):
            t = (k + frac) / m.fps
            s_slerp = libs["slerp"].sample(np.full(len(k), c), t, loop=False)
            s_nlerp = libs["nlerp"].sample(np.full(len(k), c), t, loop=False)
            p = np.asarray(m.root_translation, np.float64)
            assert np.allclose(_np(s_slerp.root_positions), p[k] + frac * (p[k + 1] - p[k]), atol=2e-6)
            assert np.allclose(_np(s_nlerp.root_positions), _np(s_slerp.root_positions))
            v = _np(b.root_linear_velocities)[int(b.clip_frame_start[c]) + k]
            v1 = _np(b.root_linear_velocities)[int(b.clip_frame_start[c]) + k + 1]
            assert np.allclose(_np(s_slerp.root_linear_velocities), v + frac * (v1 - v), atol=1e-4)
            # slerp against scipy's Slerp on the source rotations
            q = np.asarray(m.local_rotation, np.float64)
            ref = np.empty((len(k), q.shape[1], 4))
            for j in range(q.shape[1]):
                rot = Rotation.from_quat(q[:, j], scalar_first=True)
                ref[:, j] = Slerp(np.arange(m.num_frames), rot)(k + frac).as_quat(scalar_first=True)
            assert _angle(_np(s_slerp.local_rotations_wxyz), ref).max() < 2e-5
            # nlerp: normalised sum of the sign-aligned neighbours; within the analytic bound of slerp
            q0, q1 = q[k], q[k + 1]
            q1 = np.where((q0 * q1).sum(-1, keepdims=True) < 0, -q1, q1)
            nl = R.quat_normalize(q0 + frac * (q1 - q0))
            assert _angle(_np(s_nlerp.local_rotations_wxyz), nl).max() < 2e-5
            bound = nlerp_max_error(_angle(q0, q1))
            assert (_angle(_np(s_nlerp.local_rotations_wxyz), ref) <= bound + 2e-5).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_default_is_exact_slerp_of_the_stored_neighbours(amp, dtype):
    """The default interpolation is slerp (the reference page's SLERP), for sample and sample_kinematics: equal to
    kangengine.rotations.quat_slerp of the two stored frames (float64, on the stored values) to the dtype's
    precision, also across the 16 fps backflip's large steps and on a still clip (zero angles)."""
    still = SkeletonMotion(
        amp[0].tree, np.repeat(amp[0].root_translation[:1], 20, 0), np.repeat(amp[0].local_rotation[:1], 20, 0), 30.0
    )
    lb = MotionLibrary([*amp, still], precompute_kinematics=True, dtype=dtype)
    assert lb.interpolation is Interpolation.SLERP
    gen = torch.Generator().manual_seed(4)
    ids = lb.sample_motion_ids(3000, generator=gen)
    s = lb.sample(ids, lb.sample_times(ids, generator=gen) * 2.3)
    k = lb.sample_kinematics(s)
    b = lb.packed_buffers()
    t = _np(s.blend)[:, None]
    tol = 2e-6 if dtype == torch.float32 else 1e-12
    for got, stored in (
        (s.local_rotations_wxyz, b.local_rotations_wxyz),
        (k.body_rotations_wxyz, b.global_rotations_wxyz),
    ):
        q0, q1 = _np(stored[s.frame0]), _np(stored[s.frame1])
        ref = R.quat_slerp(q0, q1, t)
        assert np.abs(_np(got) - ref).max() < tol
        assert np.abs(np.linalg.norm(_np(got), axis=-1) - 1).max() < tol
    # scipy's Slerp on one joint of the backflip (up to 1.1 rad between its stored frames)
    m = amp[2]
    kk = np.arange(m.num_frames - 1)
    sb = lb.sample(np.full(len(kk), 2), (kk + 0.3) / m.fps, loop=False)
    q = np.asarray(m.local_rotation, np.float64)
    step = _angle(q[1:], q[:-1]).max()
    assert step > 0.5
    for j in range(q.shape[1]):
        ref = Slerp(np.arange(m.num_frames), Rotation.from_quat(q[:, j], scalar_first=True))(kk + 0.3)
        assert _angle(_np(sb.local_rotations_wxyz[:, j]), ref.as_quat(scalar_first=True)).max() < 2e-5
    # the still clip: every angle is zero, the sample is the stored frame
    st = lb.sample(np.full(5, 3), np.linspace(0, 0.6, 5), loop=False)
    assert torch.allclose(st.local_rotations_wxyz, b.local_rotations_wxyz[int(b.clip_frame_start[3])].expand(5, -1, -1))


def test_nlerp_option_still_normalised_lerp(amp):
    lb = MotionLibrary(amp, precompute_kinematics=True, interpolation="nlerp")
    assert lb.interpolation is Interpolation.NLERP
    s = lb.sample([0, 1, 2], [0.51, 0.33, 1.1], loop=False)
    b = lb.packed_buffers()
    q0, q1 = _np(b.local_rotations_wxyz[s.frame0]), _np(b.local_rotations_wxyz[s.frame1])
    assert np.abs(_np(s.local_rotations_wxyz) - R.quat_nlerp(q0, q1, _np(s.blend)[:, None])).max() < 2e-6
    g0, g1 = _np(b.global_rotations_wxyz[s.frame0]), _np(b.global_rotations_wxyz[s.frame1])
    ref = R.quat_nlerp(g0, g1, _np(s.blend)[:, None])
    assert np.abs(_np(lb.sample_kinematics(s).body_rotations_wxyz) - ref).max() < 2e-6


def test_pair_angle_table_against_scipy():
    """The per-frame-pair table behind the slerp: half-angles from scipy, sign of the shorter arc, clip ends."""
    from kangengine.animation.library.sampling import pair_angle_table

    rng = np.random.default_rng(7)
    q = R.quat_normalize(rng.normal(size=(6, 2, 4)))
    q[3, 1] = -q[2, 1]  # the same rotation with the other sign: zero angle, negative dot product
    last = torch.tensor([2, 2, 2, 5, 5, 5])
    tab = pair_angle_table(torch.as_tensor(q.reshape(6, 8)), last).numpy()
    nxt = np.minimum(np.arange(1, 7), last.numpy())
    rot = Rotation.from_quat(q.reshape(-1, 4), scalar_first=True)
    rel = (Rotation.from_quat(q[nxt].reshape(-1, 4), scalar_first=True) * rot.inv()).magnitude().reshape(6, 2)
    assert tab.shape == (6, 2)
    assert np.allclose(np.abs(tab), np.maximum(rel / 2, 1e-8), atol=1e-7)  # float64: at least 1e-8
    dot = (q * q[nxt]).sum(-1)
    assert np.array_equal(np.sign(tab), np.sign(np.where(dot == 0, 1, dot)))  # the shorter arc's sign


def test_nlerp_error_bound_is_right():
    rng = np.random.default_rng(3)
    for theta in (0.01, 0.1, 0.5, 1.5):
        q0 = R.quat_normalize(rng.normal(size=(200, 4)))
        axis = rng.normal(size=(200, 3))
        q1 = R.quat_multiply(
            R.quat_from_axis_angle(axis / np.linalg.norm(axis, axis=1, keepdims=True), np.full(200, theta)), q0
        )
        t = np.linspace(0, 1, 401)[:, None]
        err = R.quat_angle_between(R.quat_nlerp(q0, q1, t), R.quat_slerp(q0, q1, t)).max()
        assert err == pytest.approx(float(nlerp_max_error(theta)), rel=1e-3)
        small_angle = theta**3 / (144 * math.sqrt(3))
        assert float(nlerp_max_error(theta)) == pytest.approx(small_angle, rel=0.01 if theta <= 0.5 else 0.05)


def test_nlerp_is_as_accurate_as_slerp_on_real_mocap():
    """CMU 02_01 at 120 fps, kept at 30 fps: both blends are compared with the held-out 120 fps frames."""
    import kangengine as ke

    m = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    kept = m[::4]
    libs = {k: MotionLibrary([kept], interpolation=k) for k in ("nlerp", "slerp")}
    frames = np.arange(m.num_frames)
    frames = frames[(frames % 4 != 0) & (frames < (kept.num_frames - 1) * 4)]
    truth = np.asarray(m.local_rotation, np.float64)[frames]
    err = {}
    for k, lb in libs.items():
        s = lb.sample(np.zeros(len(frames), np.int64), frames / m.fps, loop=False)
        err[k] = _angle(_np(s.local_rotations_wxyz), truth)
    q = np.asarray(kept.local_rotation, np.float64)
    step = _angle(q[1:], q[:-1]).max()
    # the two blends differ by far less than either differs from the true motion
    assert np.abs(err["nlerp"] - err["slerp"]).max() <= nlerp_max_error(step) + 2e-5
    assert abs(err["nlerp"].mean() - err["slerp"].mean()) < 0.01 * err["slerp"].mean()
    assert err["slerp"].mean() > 1e-3  # (the interpolation error itself is not negligible)


# -- looping and clamping --------------------------------------------------------------------------------


def test_loop_wraps_time_and_carries_root_displacement(lib, amp):
    walk = amp[0]
    p = np.asarray(walk.root_translation, np.float64)
    disp = np.array([*(p[-1, :2] - p[0, :2]), 0.0])
    dur = (walk.num_frames - 1) / walk.fps
    k = np.arange(0, walk.num_frames - 1, 7)
    base = lib.sample_frames(np.zeros_like(k), k)
    for loops in (1, 3):
        s = lib.sample(np.zeros_like(k), loops * dur + k / walk.fps, loop=True)
        assert np.allclose(_np(s.loop_offsets), loops * disp, atol=1e-5)
        assert np.allclose(_np(s.root_positions), _np(base.root_positions) + loops * disp, atol=2e-5)
        assert np.abs(_np(s.local_rotations_wxyz) - _np(base.local_rotations_wxyz)).max() < 2e-6
        kin, kin0 = lib.sample_kinematics(s), lib.sample_kinematics(base)
        assert np.allclose(_np(kin.body_positions), _np(kin0.body_positions) + loops * disp, atol=2e-5)
        assert np.allclose(_np(kin.body_linear_velocities), _np(kin0.body_linear_velocities), atol=1e-4)
    # exactly at the end: looping shows frame 0 of the next loop, whose root xy is the last frame's
    s = lib.sample([0], [dur], loop=True)
    assert np.allclose(_np(s.root_positions)[0, :2], p[-1, :2], atol=1e-5)
    assert np.allclose(_np(s.root_positions)[0, 2], p[0, 2], atol=1e-6)


def test_clamp_holds_the_ends(lib, amp):
    ends = lib.sample_frames([0, 1, 2], [153, 81, 28])
    for scale in (1.0, 1.5, 7.0):
        t = lib.clip_duration.numpy() * scale
        s = lib.sample([0, 1, 2], t, loop=False)
        assert s.loop_offsets is None
        assert np.allclose(_np(s.root_positions), _np(ends.root_positions), atol=1e-6)
        assert np.abs(_np(s.local_rotations_wxyz) - _np(ends.local_rotations_wxyz)).max() < 2e-6
    s = lib.sample([0, 1, 2], 0.0, loop=False)
    first = lib.sample_frames([0, 1, 2], 0)
    assert torch.allclose(s.root_positions, first.root_positions)


# -- random draws ------------------------------------------------------------------------------------------


def test_weighted_motion_ids_chi_square(amp):
    weights = np.array([1.0, 3.0, 6.0])
    lb = MotionLibrary(amp, weights=weights)
    gen = torch.Generator().manual_seed(1234)
    ids = lb.sample_motion_ids(60_000, generator=gen)
    assert ids.dtype == torch.int64 and ids.shape == (60_000,)
    observed = np.bincount(ids.numpy(), minlength=3)
    p = stats.chisquare(observed, weights / weights.sum() * 60_000).pvalue
    assert p > 1e-3
    # the same generator state gives the same draws; a zero weight is never drawn
    assert torch.equal(
        lb.sample_motion_ids(100, generator=torch.Generator().manual_seed(7)),
        lb.sample_motion_ids(100, generator=torch.Generator().manual_seed(7)),
    )
    lz = MotionLibrary(amp, weights=[0.0, 1.0, 1.0])
    assert (lz.sample_motion_ids(5000, generator=gen) != 0).all()
    # a single strongly skewed weight set: draws follow it (chi-square again)
    lz.add_motions([amp[0]], weights=[8.0])
    obs = np.bincount(lz.sample_motion_ids(50_000, generator=gen).numpy(), minlength=4)
    assert stats.chisquare(obs, np.array([0, 1, 1, 8]) / 10 * 50_000 + np.array([1e-12, 0, 0, 0])).pvalue > 1e-3


def test_sample_times_uniform_and_truncated(lib):
    gen = torch.Generator().manual_seed(5)
    ids = torch.tensor([0, 1, 2] * 4000)
    dur = lib.clip_duration.numpy()[ids.numpy()]
    t = lib.sample_times(ids, truncate_time=0.5, generator=gen)
    assert t.dtype == torch.float64 and (t >= 0).all()
    assert (t.numpy() <= dur - 0.5).all()
    assert stats.kstest(t.numpy() / (dur - 0.5), "uniform").pvalue > 1e-3
    assert (lib.sample_times([2], truncate_time=10.0) == 0).all()


# -- velocities --------------------------------------------------------------------------------------------


def test_velocities_match_skeleton_motion_and_poselib(lib, amp):
    b = lib.packed_buffers()
    for c, m in enumerate(amp):
        rows = slice(int(b.clip_frame_start[c]), int(b.clip_frame_start[c] + b.clip_frame_count[c]))
        v = _np(b.global_linear_velocities[rows])
        w = _np(b.global_angular_velocities[rows])
        m64 = SkeletonMotion(
            m.tree, np.asarray(m.root_translation, np.float64), np.asarray(m.local_rotation, np.float64), m.fps
        )
        assert np.allclose(v, m64.global_velocity, atol=2e-4)
        assert np.allclose(w, m64.global_angular_velocity, atol=2e-3)
        assert np.allclose(_np(b.root_linear_velocities[rows]), v[:, 0], atol=1e-6)
        assert np.allclose(_np(b.root_angular_velocities[rows]), w[:, 0], atol=1e-6)
        # poselib stored gaussian_filter1d(central differences, sigma 2) of the same global positions
        stored = load_npy(data_file(f"motions/amp_poselib/amp_humanoid_{AMP[c]}.npy"))["global_velocity"]["arr"]
        assert np.allclose(gaussian_filter1d(v, 2, axis=0, mode="nearest"), stored, atol=1e-4)


def _synthetic(fps=50.0, frames=101):
    """Two nodes: the root walks and sways, (v t, A sin(om t), h), and yaws at rate wz; the child sits at
    (L, 0, 0) and rolls about its own x axis at rate beta."""
    v, a, om, h, wz, beta, length = 1.2, 0.3, 2.0, 0.9, 0.7, 1.9, 0.4
    t = np.arange(frames) / fps
    tree = SkeletonTree(("root", "child"), np.array([-1, 0]), np.array([[0, 0, 0], [length, 0, 0.0]]))
    root = np.stack([v * t, a * np.sin(om * t), np.full_like(t, h)], axis=1)
    q_root = R.quat_from_axis_angle(np.array([0, 0, 1.0]), wz * t)
    q_child = R.quat_from_axis_angle(np.array([1.0, 0, 0]), beta * t)
    motion = SkeletonMotion(tree, root, np.stack([q_root, q_child], axis=1), fps)
    c, s = np.cos(wz * t), np.sin(wz * t)
    root_v = np.stack([np.full_like(t, v), a * om * np.cos(om * t), 0 * t], axis=1)
    child_v = root_v + wz * length * np.stack([-s, c, 0 * t], axis=1)
    root_w = np.tile([0, 0, wz], (frames, 1))
    child_w = root_w + beta * np.stack([c, s, 0 * t], axis=1)
    return motion, t, (root_v, child_v, root_w, child_w), (v, a, om, wz, beta, length)


def test_velocities_of_an_analytic_motion():
    motion, t, (root_v, child_v, root_w, child_w), (v, a, om, wz, beta, length) = _synthetic()
    dt = t[1]
    lb = MotionLibrary([motion], precompute_kinematics=True, dtype=torch.float64)
    b = lb.packed_buffers()
    gv, gw = _np(b.global_linear_velocities), _np(b.global_angular_velocities)
    inner = slice(1, -1)
    tol2 = 2 * dt**2  # central differences: O(dt^2) with these rates
    assert np.allclose(gv[inner, 0], root_v[inner], atol=tol2 * a * om**3)
    assert np.allclose(gv[inner, 1], child_v[inner], atol=tol2 * (a * om**3 + wz**3 * length))
    assert np.allclose(gw[:, 0], root_w, atol=1e-12)  # constant rate: exact, ends included
    assert np.allclose(gw[inner, 1], child_w[inner], atol=tol2 * beta * wz**2)
    # one-sided differences at the ends
    p = np.asarray(motion.root_translation)
    assert np.allclose(gv[0, 0], (p[1] - p[0]) / dt) and np.allclose(gv[-1, 0], (p[-1] - p[-2]) / dt)
    # samples carry the same velocities (exact frames) and lerp them between frames
    s = lb.sample([0, 0], [10 * dt, 10.5 * dt], loop=False)
    assert np.allclose(_np(s.root_linear_velocities)[0], gv[10, 0])
    assert np.allclose(_np(s.root_linear_velocities)[1], (gv[10, 0] + gv[11, 0]) / 2)
    assert np.allclose(_np(s.root_angular_velocities), [0, 0, wz])
    kin = lb.sample_kinematics(s)
    assert np.allclose(_np(kin.body_angular_velocities)[1, 1], (gw[10, 1] + gw[11, 1]) / 2)


# -- kinematics --------------------------------------------------------------------------------------------


def test_sample_kinematics_equals_forward_kinematics(lib, amp):
    ids, frames = _all_frames(lib)
    exact = lib.sample_frames(ids, frames)
    fk, pk = lib.forward_kinematics(exact), lib.sample_kinematics(exact)
    assert np.abs(_np(fk.body_positions) - _np(pk.body_positions)).max() < 1e-5
    assert _angle(_np(fk.body_rotations_wxyz), _np(pk.body_rotations_wxyz)).max() < 1e-3 * 1e-3
    assert fk.body_linear_velocities is None and pk.body_linear_velocities.shape == (len(ids), 15, 3)
    src = np.concatenate([m.global_translation for m in amp])
    assert np.abs(_np(fk.body_positions) - src).max() < 1e-5
    # at exact frame times through sample() too
    s = lib.sample(ids, frames / lib.clip_fps.numpy()[ids], loop=False)
    diff = _np(lib.sample_kinematics(s).body_positions) - _np(lib.forward_kinematics(s).body_positions)
    assert np.abs(diff).max() < 2e-5
    # between frames: blended body transforms vs FK of blended local rotations differ only to second order
    gen = torch.Generator().manual_seed(0)
    ids = lib.sample_motion_ids(4000, generator=gen)
    mid = lib.sample(ids, lib.sample_times(ids, generator=gen) * 2.5)
    fk, pk = lib.forward_kinematics(mid), lib.sample_kinematics(mid)
    dp = np.linalg.norm(_np(fk.body_positions) - _np(pk.body_positions), axis=-1)
    at60 = mid.motion_ids.numpy() < 2  # walk and run (60 fps): millimetres; the 16 fps backflip: up to 16 cm
    assert dp[at60].max() < 0.01 and dp[at60].mean() < 1e-3 and dp[~at60].max() < 0.2
    dr = _angle(_np(fk.body_rotations_wxyz), _np(pk.body_rotations_wxyz))
    assert dr[at60].max() < 0.02


def test_blended_kinematics_error_is_second_order(amp):
    """Blending body transforms instead of local rotations errs by O(frame spacing^2): halving the frame
    rate about quadruples the mean difference from forward kinematics at the midpoints."""
    means = []
    for step in (2, 4, 8):
        clip = amp[1][::step]
        lb = MotionLibrary([clip], precompute_kinematics=True)
        k = np.arange(clip.num_frames - 1)
        s = lb.sample(np.zeros_like(k), (k + 0.5) / clip.fps, loop=False)
        means.append(
            float(
                (lb.forward_kinematics(s).body_positions - lb.sample_kinematics(s).body_positions).norm(dim=-1).mean()
            )
        )
    assert 2.5 < means[1] / means[0] < 6 and 2.5 < means[2] / means[1] < 6


def test_forward_kinematics_uses_local_translations():
    import kangengine as ke

    walk = ke.io.load_bvh(data_file("bvh/bandai_namco_ccbync/dataset-1_walk_normal_001.bvh"))
    assert walk.local_translation is not None  # position channels on every joint
    clips = [walk, walk[::2]]  # the same skeleton at 30 and 15 fps
    lb = MotionLibrary(clips, precompute_kinematics=True)
    assert lb.has_local_translations
    ids, frames = _all_frames(lb)
    s = lb.sample_frames(ids, frames)
    src = np.concatenate([c.global_translation for c in clips])
    assert np.abs(_np(lb.forward_kinematics(s).body_positions) - src).max() < 2e-5
    assert np.abs(_np(lb.sample_kinematics(s).body_positions) - src).max() < 2e-5
    lt = np.asarray(clips[0].local_translation, np.float64)
    h = lb.sample([0], [2.5 / clips[0].fps], loop=False)
    assert np.allclose(_np(h.local_translations)[0], (lt[2] + lt[3]) / 2, atol=1e-6)


# -- adding clips, devices, buffers ---------------------------------------------------------------------------


def test_add_motions_matches_building_at_once(amp):
    once = MotionLibrary(amp, precompute_kinematics=True)
    grown = MotionLibrary(amp[:1], precompute_kinematics=True)
    old_view = grown.packed_buffers().frames_packed
    grown.add_motions(amp[1:])
    assert old_view.shape[0] == 154 and grown.total_frames == 265
    for f in ("frames_packed", "kinematics_packed", "clip_frame_start", "clip_fps", "clip_loop_displacement"):
        assert torch.equal(getattr(grown.packed_buffers(), f), getattr(once.packed_buffers(), f)), f


def test_adding_local_translations_widens_the_rows(amp):
    walk = amp[0]
    lt = np.broadcast_to(walk.tree.local_translation, (walk.num_frames, 15, 3)).copy()
    lt[:, 2, 2] += 0.05 * np.sin(np.arange(walk.num_frames) / 10)  # the head slides up and down
    moving = SkeletonMotion(walk.tree, walk.root_translation, walk.local_rotation, walk.fps, lt)
    lb = MotionLibrary([walk], precompute_kinematics=True)
    before = lb.sample_frames([0, 0], [3, 40])
    lb.add_motions([moving])
    assert lb.has_local_translations and lb.packed_buffers().local_translations.shape == (308, 15, 3)
    after = lb.sample_frames([0, 0, 1], [3, 40, 40])
    assert torch.allclose(lb.forward_kinematics(after).body_positions[:2], lb.forward_kinematics(before).body_positions)
    assert torch.allclose(lb.sample_kinematics(after).body_positions[:2], lb.sample_kinematics(before).body_positions)
    head = lb.forward_kinematics(after).body_positions[2, 2] - lb.forward_kinematics(after).body_positions[2, 1]
    assert abs(float(head.norm()) - float(np.linalg.norm(lt[40, 2]))) < 1e-5


def test_to_device_and_out_buffers(lib):
    assert lib.to("cpu") is lib
    ids, t = torch.tensor([0, 1, 2, 0]), torch.tensor([0.1, 0.7, 1.0, 9.0], dtype=torch.float64)
    s1 = lib.sample(ids, t)
    s2 = lib.sample(ids, t * 0.5, out=s1)
    assert s2.rows.data_ptr() == s1.rows.data_ptr()
    assert torch.equal(s2.rows, lib.sample(ids, t * 0.5).rows)
    keep = s2.clone()
    lib.sample(ids, t, out=s2)
    assert keep.rows.data_ptr() != s2.rows.data_ptr() and torch.equal(keep.rows, lib.sample(ids, t * 0.5).rows)
    with pytest.raises(ShapeError, match="out"):
        lib.sample(ids[:2], t[:2], out=s1)
    k1 = lib.sample_kinematics(s1)
    k2 = lib.sample_kinematics(lib.sample(ids, t * 0.25), out=k1)
    assert k2.rows.data_ptr() == k1.rows.data_ptr()
    assert torch.equal(k2.rows, lib.sample_kinematics(lib.sample(ids, t * 0.25)).rows)
    assert torch.equal(
        lib.sample_kinematics(lib.sample_frames(ids, 3), out=k1).rows,
        lib.sample_kinematics(lib.sample_frames(ids, 3)).rows,
    )
    with pytest.raises(ShapeError, match="out"):
        lib.sample_kinematics(lib.sample(ids[:2], t[:2]), out=k1)
    # inputs: lists, numpy int32, torch int32, float32 times, scalar broadcast either way
    a = lib.sample([0, 1], [0.25, 0.25])
    assert torch.equal(lib.sample(0, [0.1, 0.2]).rows, lib.sample([0, 0], [0.1, 0.2]).rows)
    assert torch.equal(lib.sample_frames([0, 2], 4).rows, lib.sample_frames([0, 2], [4, 4]).rows)
    for ids_in, t_in in (
        (np.array([0, 1], np.int32), np.float32(0.25)),
        (torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0.25, 0.25])),
    ):
        assert torch.allclose(lib.sample(ids_in, t_in).rows, a.rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(amp):  # pragma: no cover - runs where a GPU exists
    cpu = MotionLibrary(amp, precompute_kinematics=True)
    gpu = MotionLibrary(amp, precompute_kinematics=True).to("cuda")
    ids, t = torch.tensor([0, 1, 2, 2]), torch.tensor([0.3, 2.0, 5.5, 0.0], dtype=torch.float64)
    a, b = cpu.sample(ids, t), gpu.sample(ids.cuda(), t.cuda())
    assert torch.allclose(a.rows, b.rows.cpu(), atol=1e-6)
    assert torch.allclose(
        cpu.sample_kinematics(a).body_positions, gpu.sample_kinematics(b).body_positions.cpu(), atol=1e-5
    )


def test_cpu_and_gpu_strategies_agree():
    """The CPU-only tricks (GEMV norms, GEMM offsets) give what the generic (GPU) path gives."""
    from kangengine.animation.library.sampling import _add_offsets_, _normalize_quats_

    rows = torch.randn(300, 13 * 24, dtype=torch.float64)
    a, b = rows.clone(), rows.clone()
    _normalize_quats_(a[:, 72:168], torch.ones(4, dtype=torch.float64))
    _normalize_quats_(b[:, 72:168])
    assert torch.allclose(a, b, atol=1e-15) and torch.allclose(
        a[:, 72:168].unflatten(1, (24, 4)).norm(dim=-1), torch.ones(300, 24, dtype=torch.float64)
    )
    off = torch.randn(300, 3, dtype=torch.float64)
    _add_offsets_(a[:, :72], off, torch.eye(3, dtype=torch.float64).repeat(1, 24))
    _add_offsets_(b[:, :72], off)
    assert torch.allclose(a, b, atol=1e-14)


def test_sample_path_never_reads_tensors_back_to_the_host(lib, monkeypatch):
    """What would synchronise with a GPU (item, tolist, numpy, bool, cpu) is never called on the hot path."""
    ids = torch.tensor([0, 1, 2, 1])
    t = torch.tensor([0.3, 2.0, 5.5, 0.0], dtype=torch.float64)
    frames = torch.tensor([0, 5, 28, 81])

    def boom(*a, **k):
        raise AssertionError("host read-back on the hot path")

    for name in ("item", "tolist", "numpy", "__bool__", "cpu", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    for loop in (True, False):
        s = lib.sample(ids, t, loop=loop, check=False)
        lib.sample_kinematics(s)
    lib.sample_kinematics(lib.sample_frames(ids, frames, check=False))
    monkeypatch.undo()


# -- adapters ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CanonicalState:
    q: torch.Tensor
    qd: torch.Tensor


class CanonicalQAdapter:
    """A minimal real adapter: the layout's own canonical ``q``/``qd`` through ArticulationMotionMapper."""

    def __init__(self, layout):
        from kangengine.animation.mapper import ArticulationMotionMapper

        self.layout = layout
        self.mapper = ArticulationMotionMapper(layout)

    def prepare_motion(self, motion, *, skeleton_motion=None):
        am = (
            motion
            if isinstance(motion, ArticulationMotion)
            else self.mapper.to_articulation_motion(skeleton_motion).motion
        )
        return {"q": am.q, "qd": am.qd}

    def pack_sample(self, frames0, frames1, blend, *, root_offset=None):
        q = self.layout.interpolate(frames0["q"], frames1["q"], blend)
        if root_offset is not None:
            q[:, :3] += root_offset
        return CanonicalState(q=q, qd=torch.lerp(frames0["qd"], frames1["qd"], blend[:, None]))


def _hinge_motion(layout, frames=90, fps=30.0, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(frames) / fps
    q = np.tile(layout.neutral(), (frames, 1))
    lo, hi = layout.dof_lower, layout.dof_upper
    for blk in layout.blocks[1:]:
        mid = 0.5 * (lo[blk.qd_offset] + hi[blk.qd_offset]) if np.isfinite(lo[blk.qd_offset]) else 0.0
        q[:, blk.q_offset] = mid + 0.3 * np.sin(rng.uniform(1, 4) * t + rng.uniform(0, 6))
    q[:, 0] = 1.1 * t
    q[:, 3:7] = R.quat_from_axis_angle(np.array([0, 0, 1.0]), 0.4 * t)
    qd = np.zeros((frames, layout.nv))
    return ArticulationMotion(q, qd, fps, layout.model_signature, joint_names=layout.joint_names)


def test_articulation_motion_input_and_canonical_adapter(amp_layout):
    am = _hinge_motion(amp_layout)
    adapter = CanonicalQAdapter(amp_layout)
    lb = MotionLibrary([am], adapter=adapter, precompute_kinematics=True)
    assert lb.layout_signature == amp_layout.model_signature
    assert lb.packed_buffers().backend["q"].shape == (90, amp_layout.nq)
    frames = np.arange(90)
    s = lb.sample_frames(np.zeros(90, np.int64), frames)
    pos, rot = forward_kinematics(amp_layout, am.q.astype(np.float64))
    assert np.abs(_np(lb.forward_kinematics(s).body_positions) - pos).max() < 2e-5
    assert np.abs(_np(lb.sample_kinematics(s).body_positions) - pos).max() < 2e-5
    assert torch.allclose(s.backend_state.q, torch.from_numpy(am.q), atol=1e-6)
    # a looping sample: the backend root moves with the library's loop offset
    dur = 89 / 30
    h = lb.sample([0, 0], [10.5 / 30, dur + 10.5 / 30], loop=True)
    q = h.backend_state.q
    assert torch.allclose(q[1, :3] - q[0, :3], h.loop_offsets[1], atol=1e-5)
    assert torch.allclose(q[1, 3:], q[0, 3:], atol=1e-6)
    p_fk, _ = forward_kinematics(amp_layout, q.double())
    assert np.abs(p_fk.numpy() - _np(lb.forward_kinematics(h).body_positions)).max() < 2e-3


def test_skeleton_motion_through_the_canonical_adapter(amp, amp_layout):
    from kangengine.animation.mapper import ArticulationMotionMapper

    mapper = ArticulationMotionMapper(amp_layout)
    walk = mapper.to_skeleton_motion(
        mapper.to_articulation_motion(
            SkeletonMotion(mapper.skeleton_tree, amp[0].root_translation, amp[0].local_rotation, 60.0)
        ).motion
    )
    lb = MotionLibrary([walk], adapter=CanonicalQAdapter(amp_layout))
    s = lb.sample_frames(np.zeros(154, np.int64), np.arange(154))
    pos, _ = forward_kinematics(amp_layout, s.backend_state.q.double())
    assert np.abs(pos.numpy() - _np(lb.forward_kinematics(s).body_positions)).max() < 1e-4


def test_mujoco_adapter_backend_state_matches_mujoco(amp_layout):
    mujoco = pytest.importorskip("mujoco")
    from kangengine.adapters.mujoco import MuJoCoMotionAdapter

    model = mujoco.MjModel.from_xml_path(str(data_file("mjcf/protomotions/amp_humanoid.xml")))
    data = mujoco.MjData(model)
    am = _hinge_motion(amp_layout, seed=4)
    lb = MotionLibrary([am], adapter=MuJoCoMotionAdapter(amp_layout, model=model), precompute_kinematics=True)
    s = lb.sample([0] * 5, [0.0, 0.5, 17.5 / 30, 2.0, 4.1], loop=True)
    qpos = s.backend_state.qpos.double().numpy()
    assert qpos.shape == (5, model.nq) and s.backend_state.qvel.shape == (5, model.nv)
    body = lb.sample_kinematics(s)
    fk = lb.forward_kinematics(s)
    for i in range(5):
        data.qpos[:] = qpos[i]
        mujoco.mj_kinematics(model, data)
        # MuJoCo places every body from the backend qpos where the library's own kinematics put it
        assert np.abs(data.xpos[1:] - _np(fk.body_positions)[i]).max() < 1e-3
        assert np.abs(data.xpos[1:] - _np(body.body_positions)[i]).max() < 2e-3
    exact = lb.sample_frames([0, 0], [0, 45])
    assert np.allclose(exact.backend_state.qpos.numpy(), am.q[[0, 45]], atol=1e-6)


def test_prismatic_articulation_motion_is_refused():
    desc = MJCFLoader.load(data_file("mjcf/dm_control/cartpole.xml"))
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=False)
    am = ArticulationMotion(np.zeros((5, layout.nq)), np.zeros((5, layout.nv)), 30.0, layout.model_signature)
    with pytest.raises(MotionError, match="prismatic"):
        MotionLibrary([am], layout=layout)


# -- files -------------------------------------------------------------------------------------------------


def test_save_load_round_trip_is_bit_exact(tmp_path, lib, amp_layout):
    path = tmp_path / "lib.safetensors"
    lib.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["lib.safetensors"]  # no temp file left behind
    gen = torch.Generator().manual_seed(2)
    ids = lib.sample_motion_ids(500, generator=gen)
    t = lib.sample_times(ids, generator=gen) * 3
    for mmap in (True, False):
        back = MotionLibrary.load(path, mmap=mmap)
        a, b = lib.packed_buffers(), back.packed_buffers()
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and torch.equal(x, y), f.name
        assert back.clip_names == lib.clip_names and back.skeleton_tree.same_as(lib.skeleton_tree, atol=0)
        assert back.interpolation is lib.interpolation and back.layout_signature is None
        s0, s1 = lib.sample(ids, t), back.sample(ids, t)
        assert torch.equal(s0.rows, s1.rows)
        assert torch.equal(lib.sample_kinematics(s0).body_positions, back.sample_kinematics(s1).body_positions)
        with pytest.raises(MotionError, match="keep_source_motions"):
            back.motion(0)


def test_loaded_library_keeps_metadata_and_grows(tmp_path, amp):
    import kangengine as ke

    walk = ke.io.load_bvh(data_file("bvh/bandai_namco_ccbync/dataset-1_walk_normal_001.bvh"))
    lb = MotionLibrary([walk], names=["walk"])
    lb.save(tmp_path / "m.safetensors")
    back = MotionLibrary.load(tmp_path / "m.safetensors")
    assert back.clip_metadata(0) == json.loads(json.dumps(walk.metadata))
    assert back.clip_metadata(0)["source_format"] == "bvh" and back.clip_names == ("walk",)
    back.add_motions([walk[::2]], names=["walk_15fps"], weights=[2.0])
    assert back.clip_names == ("walk", "walk_15fps") and back.clip_metadata(0)["source_format"] == "bvh"
    assert back.clip_fps.tolist() == pytest.approx([walk.fps, walk.fps / 2])
    assert torch.equal(back.sample_frames([1], [3]).rows, back.sample_frames([0], [6]).rows)
    with pytest.raises(UnknownMotionError):
        back.clip_metadata(2)


def test_layout_signature_travels_with_the_file(tmp_path, amp_layout):
    am = _hinge_motion(amp_layout, frames=20)
    lb = MotionLibrary([am], layout=amp_layout)
    lb.save(tmp_path / "a.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = MotionLibrary.load(tmp_path / "a.safetensors", layout=amp_layout)
    assert same.layout_signature == amp_layout.model_signature
    other = ArticulationCoordinateLayout.from_data(
        data=MJCFLoader.load(data_file("mjcf/protomotions/amp_humanoid.xml"), order="BFS")
    )
    assert other.model_signature != amp_layout.model_signature
    with pytest.warns(LayoutSignatureWarning, match=amp_layout.model_signature):
        MotionLibrary.load(tmp_path / "a.safetensors", layout=other)


def test_adapter_frames_are_saved_and_reused(tmp_path, amp_layout):
    adapter = CanonicalQAdapter(amp_layout)
    lb = MotionLibrary([_hinge_motion(amp_layout, frames=30)], adapter=adapter)
    lb.save(tmp_path / "b.safetensors")
    back = MotionLibrary.load(tmp_path / "b.safetensors", adapter=adapter)
    assert torch.equal(back.packed_buffers().backend_packed, lb.packed_buffers().backend_packed)
    s = back.sample([0, 0], [0.2, 0.5])
    assert torch.allclose(s.backend_state.q, lb.sample([0, 0], [0.2, 0.5]).backend_state.q)
    # without the adapter the stored frames stay readable; a new adapter instance re-uses them too
    assert MotionLibrary.load(tmp_path / "b.safetensors").packed_buffers().backend["q"].shape == (30, amp_layout.nq)


def test_bad_library_files(tmp_path):
    with pytest.raises(FileMissingError):
        MotionLibrary.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(FormatError):
        MotionLibrary.load(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, str(tmp_path / "other.safetensors"), metadata={"format": "pt"})
    with pytest.raises(FormatError, match="kangengine.motion_library"):
        MotionLibrary.load(tmp_path / "other.safetensors")


# -- bad input ---------------------------------------------------------------------------------------------


def test_bad_queries(lib):
    with pytest.raises(UnknownMotionError, match=r"0\.\.2"):
        lib.sample([0, 3], [0.0, 0.0])
    with pytest.raises(UnknownMotionError, match="-1"):
        lib.sample(torch.tensor([-1]), [0.0])
    with pytest.raises(UnknownMotionError):
        lib.sample_times([5])
    with pytest.raises(NonFiniteError, match="entry 1"):
        lib.sample([0, 1], [0.0, float("nan")])
    with pytest.raises(MotionError, match="negative"):
        lib.sample([0], np.array([-0.1]))
    with pytest.raises(ShapeError, match="integer"):
        lib.sample([0.5], [0.0])
    with pytest.raises(ShapeError):
        lib.sample([0, 1], [0.0, 0.1, 0.2])
    with pytest.raises(MotionError, match="outside clip 2"):
        lib.sample_frames([2], [29])
    with pytest.raises(MotionError, match="truncate_time"):
        lib.sample_times([0], truncate_time=-1)
    lib.sample([0], [-0.1], check=False)  # the hot path does not look
    with pytest.raises(UnknownNameError, match="amp_humanoid_walk"):
        lib.clip_index("jump")
    assert lib.clip_index("amp_humanoid_run") == 1


def test_bad_libraries(amp):
    with pytest.raises(MotionError, match="at least one"):
        MotionLibrary([])
    with pytest.raises(MotionError, match="expected SkeletonMotion"):
        MotionLibrary([np.zeros((3, 4))])
    tree = amp[0].tree
    stretched = SkeletonTree(tree.node_names, tree.parent_indices, tree.local_translation * 1.1)
    other = SkeletonMotion(stretched, amp[1].root_translation, amp[1].local_rotation, 60.0)
    with pytest.raises(MixedSkeletonError, match="rest translation of node"):
        MotionLibrary([amp[0], other])
    import kangengine as ke

    bvh = ke.io.load_bvh(data_file("bvh/bandai_namco_ccbync/dataset-1_run_normal_001.bvh"))
    with pytest.raises(MixedSkeletonError, match="node names differ"):
        MotionLibrary([amp[0], bvh])
    for w, err in (
        ([1, -1, 1], MotionError),
        ([1, float("nan"), 1], MotionError),
        ([0, 0, 0], MotionError),
        ([1, 1], ShapeError),
    ):
        with pytest.raises(err):
            MotionLibrary(amp, weights=w)
    lb = MotionLibrary(amp)
    with pytest.raises(MotionError, match="keep_source_motions"):
        lb.motion(0)
    with pytest.raises(MotionError, match="precompute_kinematics"):
        lb.sample_kinematics(lb.sample([0], [0.0]))
    kept = MotionLibrary(amp, keep_source_motions=True)
    assert kept.motion(2) is amp[2]
    with pytest.raises(UnknownMotionError):
        kept.motion(3)
    with pytest.raises(FormatError, match="dtype"):
        MotionLibrary(amp, dtype=torch.float16)


def test_single_frame_clip(amp):
    still = amp[0][10:11]
    lb = MotionLibrary([still, amp[1]], precompute_kinematics=True)
    assert float(lb.clip_duration[0]) == 0.0
    s = lb.sample([0, 0, 0], [0.0, 0.7, 12.3], loop=True)
    exact = lb.sample_frames([0], [0])
    assert torch.allclose(s.rows, exact.rows.expand(3, -1), atol=1e-6) and (s.loop_offsets == 0).all()
    assert (s.root_linear_velocities == 0).all() and (lb.sample_kinematics(s).body_angular_velocities == 0).all()
    assert (lb.sample_times([0, 0]) == 0).all()


def test_float64_library(amp):
    lb = MotionLibrary(amp, dtype=torch.float64, precompute_kinematics=True)
    s = lb.sample([0, 2], [0.3, 1.0])
    assert s.root_positions.dtype == torch.float64 and lb.sample_kinematics(s).body_positions.dtype == torch.float64
    assert Interpolation("slerp") is Interpolation.SLERP


# -- issue 17: MotionLibrary.load validates the file's tables at load ------------------------------------------


def _rewrite(src, dst, *, tensors=None, header=None, meta=None):
    """Copy library file ``src`` to ``dst`` with some tensors, header fields or metadata replaced."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        old_meta = dict(f.metadata())
        ts = {k: f.get_tensor(k) for k in f.keys()}
    ts.update(tensors or {})
    h = json.loads(old_meta["header"])
    h.update(header or {})
    old_meta["header"] = json.dumps(h)
    old_meta.update(meta or {})
    save_file({k: v.contiguous() for k, v in ts.items()}, str(dst), metadata=old_meta)
    return dst


@pytest.fixture(scope="module")
def saved_library(amp, tmp_path_factory):
    p = tmp_path_factory.mktemp("lib") / "amp.safetensors"
    MotionLibrary(amp, precompute_kinematics=True).save(p)
    return p


def test_load_refuses_shifted_starts_instead_of_returning_another_clips_frames(saved_library, tmp_path):
    good = MotionLibrary.load(saved_library)
    start = good.clip_frame_start.clone()
    shifted = torch.roll(start, 1)  # clip 0 would read clip 2's frames, and so on
    bad = _rewrite(saved_library, tmp_path / "shifted.safetensors", tensors={"clip_frame_start": shifted})
    with pytest.raises(FormatError) as info:
        MotionLibrary.load(bad)
    msg = str(info.value)
    assert str(bad) in msg and "clip_frame_start" in msg and "cumulative" in msg
    with pytest.raises(FormatError, match="clip_frame_start"):
        MotionLibrary.load(bad, skip_checks=True)  # tables are checked on the fast path too


@pytest.mark.parametrize(
    ("table", "make", "expected"),
    [
        ("clip_weight", lambda t: t * 0, "positive sum"),
        ("clip_weight", lambda t: t * float("nan"), "finite weights"),
        ("clip_weight", lambda t: -t, "finite weights"),
        ("clip_fps", lambda t: t * 0, "frames per second > 0"),
        ("clip_fps", lambda t: t * float("inf"), "frames per second > 0"),
        ("clip_frame_start", lambda t: t + 10_000, "cumulative"),
        ("clip_frame_count", lambda t: t * 0, ">= 1 frame"),
        ("clip_frame_count", lambda t: t + 1, "sum to"),
        ("clip_fps", lambda t: t[:-1], "shape"),
        ("clip_loop_displacement", lambda t: t[:, :2], "shape"),
        ("clip_weight", lambda t: t.to(torch.int64), "dtype"),
        ("frames_packed", lambda t: t[:, :-1], "shape"),
        ("kinematics_packed", lambda t: t[:-1], "shape"),
        ("skeleton_parent_indices", lambda t: t.double(), "dtype"),
        ("clip_metadata_json", lambda t: torch.tensor([0xFF, 0xFE], dtype=torch.uint8), "UTF-8"),
    ],
)
def test_load_validates_each_table(saved_library, tmp_path, table, make, expected):
    from safetensors import safe_open

    with safe_open(str(saved_library), framework="pt") as f:
        t = f.get_tensor(table)
    bad = _rewrite(saved_library, tmp_path / "bad.safetensors", tensors={table: make(t)})
    with pytest.raises(FormatError) as info:
        MotionLibrary.load(bad)
    msg = str(info.value)
    assert str(bad) in msg and table in msg and expected in msg, msg


@pytest.mark.parametrize(
    ("header", "meta", "expected"),
    [
        ({"clip_names": ["a"]}, None, "clip_frame_count"),
        ({"interpolation": "cubic"}, None, "interpolation"),
        ({"node_names": 7}, None, "node_names"),
        ({"dtype": "float16"}, None, "dtype"),
        ({"backend_fields": [["q", "x"]]}, None, "backend_fields"),
        (None, {"format_version": "one"}, "format_version"),
        (None, {"header": "[" * 100_000}, "header"),
        (None, {"header": "17"}, "header"),
    ],
)
def test_load_validates_the_header(saved_library, tmp_path, header, meta, expected):
    bad = tmp_path / "bad.safetensors"
    if meta and "header" in meta:
        _rewrite(saved_library, bad)
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(bad), framework="pt") as f:
            m = dict(f.metadata()) | meta
            ts = {k: f.get_tensor(k) for k in f.keys()}
        save_file(ts, str(bad), metadata=m)
    else:
        _rewrite(saved_library, bad, header=header, meta=meta)
    with pytest.raises(FormatError) as info:
        MotionLibrary.load(bad)
    assert str(bad) in str(info.value) and expected in str(info.value), str(info.value)


def test_load_scans_frames_unless_skip_checks(saved_library, tmp_path):
    from safetensors import safe_open

    with safe_open(str(saved_library), framework="pt") as f:
        frames = f.get_tensor("frames_packed").clone()
    nan = frames.clone()
    nan[7, 2] = float("nan")
    scaled = frames.clone()
    scaled[9, 3:7] *= 1.001  # the root rotation of row 9 no longer unit
    for name, t, expected in (("nan", nan, "NaN"), ("scaled", scaled, "unit quaternions")):
        bad = _rewrite(saved_library, tmp_path / f"{name}.safetensors", tensors={"frames_packed": t})
        with pytest.raises(FormatError) as info:
            MotionLibrary.load(bad)
        assert str(bad) in str(info.value) and "frames_packed" in str(info.value) and expected in str(info.value)
        assert MotionLibrary.load(bad, skip_checks=True).total_frames == frames.shape[0]  # the trusted fast path
    a, b = MotionLibrary.load(saved_library), MotionLibrary.load(saved_library, skip_checks=True)
    ids, times = torch.tensor([0, 1, 2]), torch.tensor([0.3, 0.9, 1.1], dtype=torch.float64)
    assert torch.equal(a.sample(ids, times).rows, b.sample(ids, times).rows)


# -- the compiled CPU strategy (native_blend) ---------------------------------------------------------------


def _torch_strategy(lb):
    """A library object sharing ``lb``'s buffers that samples with the torch strategy (what CUDA runs)."""
    import copy

    other = copy.copy(lb)
    other._scratch_cache, other._const_cache = {}, {}
    other._use_native_blend = False
    return other


needs_llvmlite = pytest.mark.skipif(
    not __import__("kangengine.animation.kinematics.native", fromlist=["x"]).available(), reason="needs llvmlite"
)


@needs_llvmlite
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("interpolation", ["slerp", "nlerp"])
def test_compiled_and_torch_strategies_agree(amp, dtype, interpolation):
    """The one-pass CPU kernels against the torch strategy on the real AMP clips: frame pairs, blend weights and
    loop offsets bit for bit (the same float64 operations, torch.div's floor included), every row value to the
    dtype's rounding; queries at stored frames, clip ends, exact loop periods, far loops, clamped and looped."""
    from kangengine.animation.library import native_blend

    lb = MotionLibrary(amp, precompute_kinematics=True, dtype=dtype, interpolation=interpolation)
    ref = _torch_strategy(lb)
    gen = torch.Generator().manual_seed(7)
    ids = lb.sample_motion_ids(2000, generator=gen)
    times = lb.sample_times(ids, generator=gen) * 3.0
    dur = lb.clip_duration[ids]
    times[:300] = torch.round(times[:300] * lb.clip_fps[ids[:300]]) / lb.clip_fps[ids[:300]]  # stored frames
    times[300:400] = dur[300:400] * torch.arange(100, dtype=torch.float64) % 7  # whole periods
    times[400:450] = dur[400:450]
    times[450:500] = 1e4 + times[450:500]
    tol = 2e-6 if dtype == torch.float32 else 1e-13
    for loop in (True, False):
        a, b = lb.sample(ids, times, loop=loop), ref.sample(ids, times, loop=loop)
        for field in ("frame0", "frame1", "blend", "loop_offsets"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None and y is None) or torch.equal(x, y), field
        assert torch.allclose(a.rows, b.rows, rtol=tol, atol=tol)  # (positions 1e4 s away are large)
        ka, kb = lb.sample_kinematics(a), ref.sample_kinematics(b)
        assert torch.allclose(ka.rows, kb.rows, rtol=tol, atol=tol)
        q = _np(ka.body_rotations_wxyz)
        assert np.abs(np.linalg.norm(q, axis=-1) - 1).max() < tol
    dt = np.float32 if dtype == torch.float32 else np.float64
    assert native_blend.blend_kernel(
        dt, lb._kin.shape[1], 3 * lb.num_bodies, lb.num_bodies, interpolation == "slerp", 0
    )


@needs_llvmlite
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_slerp_against_scipy_on_random_rotations(dtype):
    """Random rotations up to pi apart between stored frames (hemisphere flips, near-antipodal and identical
    neighbours), one clip per body count so the SIMD pieces of every width run: scipy's Slerp of the stored
    frames, both strategies."""
    rng = np.random.default_rng(21)
    for bodies in (1, 3, 7, 24):
        tree = SkeletonTree(
            [f"b{i}" for i in range(bodies)], np.arange(-1, bodies - 1), rng.normal(size=(bodies, 3)) * 0.1
        )
        frames = 40
        rot = Rotation.random(frames * bodies, random_state=rng).as_quat(scalar_first=True).reshape(frames, bodies, 4)
        rot[5] = rot[4]  # identical neighbours
        rot[9] = R.quat_multiply(rot[8], R.quat_from_axis_angle(np.array([0.0, 0.0, 1.0]), np.pi - 1e-3))  # ~antipodal
        m = SkeletonMotion(tree, rng.normal(size=(frames, 3)), rot, 10.0)
        lb = MotionLibrary([m], dtype=dtype)
        t = rng.uniform(0, (frames - 1) / 10.0, 500)
        t[:20] = np.arange(20) / 10.0 + 0.5 / 10.0
        stored = _np(lb.packed_buffers().local_rotations_wxyz)
        for strategy in (lb, _torch_strategy(lb)):
            s = strategy.sample(np.zeros(500, np.int64), t, loop=False)
            got = _np(s.local_rotations_wxyz)
            for j in range(bodies):
                ref = Slerp(np.arange(frames), Rotation.from_quat(stored[:, j], scalar_first=True))(t * 10.0)
                err = _angle(got[:, j], ref.as_quat(scalar_first=True)).max()
                assert err < (1e-5 if dtype == torch.float32 else 1e-12), (bodies, j, err)


@needs_llvmlite
def test_a_sample_does_not_depend_on_its_batch(amp, monkeypatch):
    """A query's pose and body state are bit-identical computed alone and inside batches of any size and position
    (every query runs the same instructions), and on one thread or in slices on several."""
    from kangengine.animation.library import native_blend

    lb = MotionLibrary(amp, precompute_kinematics=True)
    gen = torch.Generator().manual_seed(5)
    ids = lb.sample_motion_ids(100, generator=gen)
    times = lb.sample_times(ids, generator=gen) * 2.0
    one = lb.sample(ids, times)
    one_k = lb.sample_kinematics(one)
    monkeypatch.setattr(native_blend, "_THREAD_MIN", 8)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        s = lb.sample(ids, times)
        k = lb.sample_kinematics(s)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(s.rows, one.rows) and torch.equal(k.rows, one_k.rows)
    gen = torch.Generator().manual_seed(3)
    ids = lb.sample_motion_ids(64, generator=gen)
    times = lb.sample_times(ids, generator=gen) * 2.0
    one = lb.sample(ids[:1], times[:1])
    one_k = lb.sample_kinematics(one)
    for n in (2, 3, 17, 64):
        for pos in (0, n - 1):
            order = torch.cat([ids[1 : pos + 1], ids[:1], ids[pos + 1 : n]])
            tt = torch.cat([times[1 : pos + 1], times[:1], times[pos + 1 : n]])
            s = lb.sample(order, tt)
            assert torch.equal(s.rows[pos], one.rows[0]) and torch.equal(
                lb.sample_kinematics(s).rows[pos], one_k.rows[0]
            )


@needs_llvmlite
def test_unchecked_bad_queries_stay_inside_the_tables(lib):
    """With ``check=False`` nothing is validated, but the compiled pass never reads outside the packed tables: an id
    out of range reads clip 0, a NaN time its last frame, a negative time (clamped) its first."""
    ids = torch.tensor([99, -1, 0, 1])
    t = torch.tensor([0.1, 0.1, float("nan"), -5.0], dtype=torch.float64)
    for loop in (True, False):
        s = lib.sample(ids, t, loop=loop, check=False)
        k = lib.sample_kinematics(s)
        start, count = lib.clip_frame_start, lib.clip_frame_count
        assert ((s.frame0 >= 0) & (s.frame1 < lib.total_frames)).all() and k.rows.shape == (4, 13 * lib.num_bodies)
    assert int(s.frame0[0]) == int(s.frame0[1]) == int(lib.sample([0], [0.1], loop=False).frame0[0])
    assert int(s.frame0[2]) == int(start[0] + count[0] - 1) and int(s.frame0[3]) == int(start[1])
