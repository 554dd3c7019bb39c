"""Skeleton types: forward kinematics against an independent scipy implementation, velocities against
analytic derivatives, slicing, resampling and npz files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import data_file
from scipy.spatial.transform import Rotation

from kangengine import rotations as R
from kangengine.animation import SkeletonMotion, SkeletonState, SkeletonTree
from kangengine.asset import MJCFLoader
from kangengine.errors import (
    DuplicateNameError,
    FormatError,
    NonFiniteError,
    ShapeError,
    TopologyError,
    UnknownNameError,
)


def _tree():
    return SkeletonTree(
        ("hips", "spine", "head", "l_leg", "l_foot"),
        np.array([-1, 0, 1, 0, 3]),
        np.array([[0, 0, 1.0], [0, 0, 0.2], [0, 0, 0.3], [0.1, 0, -0.1], [0, 0, -0.4]]),
    )


def _scipy_fk(tree, root, local_wxyz, local_t=None):
    """Per-node loop with scipy rotations (independent of our implementation)."""
    n = tree.num_nodes
    gpos = np.zeros((n, 3))
    grot = [None] * n
    for i in range(n):
        r = Rotation.from_quat(local_wxyz[i][[1, 2, 3, 0]])
        p = tree.parent_indices[i]
        t = np.array(tree.local_translation[i] if local_t is None else local_t[i])
        if p < 0:
            gpos[i], grot[i] = root, r
        else:
            gpos[i] = gpos[p] + grot[p].apply(t)
            grot[i] = grot[p] * r
    return gpos, np.array([g.as_quat()[[3, 0, 1, 2]] for g in grot])


def test_global_transforms_match_scipy_loop():
    tree = _tree()
    rng = np.random.default_rng(0)
    lr = R.quat_normalize(rng.normal(size=(6, 5, 4)))
    root = rng.normal(size=(6, 3))
    lt = rng.normal(size=(6, 5, 3))
    s = SkeletonState(tree, root, lr)
    s2 = SkeletonState(tree, root, lr, lt)
    for f in range(6):
        gp, gr = _scipy_fk(tree, root[f], lr[f])
        np.testing.assert_allclose(s.global_translation[f], gp, atol=1e-12)
        assert np.allclose(np.abs(np.sum(s.global_rotation[f] * gr, -1)), 1, atol=1e-12)
        gp2, _ = _scipy_fk(tree, root[f], lr[f], lt[f])
        np.testing.assert_allclose(s2.global_translation[f], gp2, atol=1e-12)
    # torch, float32
    st = SkeletonState(tree, torch.as_tensor(root, dtype=torch.float32), torch.as_tensor(lr, dtype=torch.float32))
    assert st.global_translation.dtype == torch.float32
    np.testing.assert_allclose(st.global_translation.numpy(), s.global_translation, atol=1e-5)


def test_from_global_round_trip_and_zero_pose():
    tree = _tree()
    rng = np.random.default_rng(1)
    lr = R.quat_normalize(rng.normal(size=(4, 5, 4)))
    s = SkeletonState(tree, rng.normal(size=(4, 3)), lr)
    back = SkeletonState.from_global(tree, s.global_rotation, s.root_translation)
    assert np.allclose(np.abs(np.sum(back.local_rotation * lr, -1)), 1, atol=1e-12)
    z = SkeletonState.zero_pose(tree)
    np.testing.assert_allclose(z.global_translation[4], [0.1, 0, 0.5])


def test_tree_from_articulation_and_lookup():
    desc = MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    tree = SkeletonTree.from_articulation(desc)
    assert tree.node_names == desc.body_names and tree.num_nodes == 24
    np.testing.assert_allclose(tree.local_translation[tree.index("L_Knee")], [-0.0045, 0.0343, -0.3752])
    with pytest.raises(UnknownNameError, match="L_Knee"):
        tree.index("L_Kne")


def test_tree_validation():
    with pytest.raises(DuplicateNameError):
        SkeletonTree(("a", "a"), [-1, 0], np.zeros((2, 3)))
    with pytest.raises(TopologyError):
        SkeletonTree(("a", "b"), [-1, 1], np.zeros((2, 3)))
    with pytest.raises(ShapeError):
        SkeletonTree(("a", "b"), [-1, 0], np.zeros((3, 3)))
    with pytest.raises(NonFiniteError):
        SkeletonTree(("a", "b"), [-1, 0], [[0, 0, 0], [np.nan, 0, 0]])


def _spin_motion(fps=60.0, frames=121, rate=1.7):
    """Root turns about z at `rate` rad/s and moves along (sin t, t^2, 0); the rest stays still."""
    tree = _tree()
    t = np.arange(frames) / fps
    lr = np.zeros((frames, 5, 4))
    lr[..., 0] = 1
    lr[:, 0] = R.quat_from_axis_angle(np.array([0, 0, 1.0]), rate * t)
    root = np.stack([np.sin(t), t**2, np.ones_like(t)], -1)
    return SkeletonMotion(tree, root, lr, fps), t


def test_velocities_against_analytic_derivatives():
    motion, t = _spin_motion()
    w = motion.global_angular_velocity
    np.testing.assert_allclose(w[:, :, 2], 1.7, atol=1e-10)
    np.testing.assert_allclose(w[:, :, :2], 0, atol=1e-10)
    v = motion.global_velocity
    analytic = np.stack([np.cos(t), 2 * t, 0 * t], -1)
    dt = 1 / motion.fps
    np.testing.assert_allclose(v[1:-1, 0], analytic[1:-1], atol=dt**2)  # central differences: O(dt^2)
    np.testing.assert_allclose(v[[0, -1], 0], analytic[[0, -1]], atol=2 * dt)  # one-sided ends: O(dt)
    # a child node: v = v_root + w x r
    r = motion.global_translation[:, 4] - motion.global_translation[:, 0]
    np.testing.assert_allclose(v[1:-1, 4], analytic[1:-1] + np.cross([0, 0, 1.7], r[1:-1]), atol=3e-3)


def test_slice_and_resample():
    motion, t = _spin_motion(fps=120.0, frames=241)
    every4 = motion[::4]
    assert every4.fps == 30 and every4.num_frames == 61
    r30 = motion.resample(30)
    assert r30.num_frames == 61
    np.testing.assert_allclose(r30.root_translation, motion.root_translation[::4], atol=1e-12)
    assert np.allclose(np.abs(np.sum(r30.local_rotation * motion.local_rotation[::4], -1)), 1, atol=1e-12)
    up = every4.resample(60)
    assert up.num_frames == 121
    mid = R.quat_slerp(every4.local_rotation[0, 0], every4.local_rotation[1, 0], 0.5)
    assert abs(abs(np.dot(up.local_rotation[1, 0], mid)) - 1) < 1e-12
    np.testing.assert_allclose(up.root_translation[1], 0.5 * (every4.root_translation[0] + every4.root_translation[1]))
    assert motion.duration == pytest.approx(2.0) and up.duration == pytest.approx(2.0)
    single = motion[5]
    assert isinstance(single, SkeletonState) and single.batch_shape == ()


def test_npz_round_trip_and_no_pickle(tmp_path):
    motion, _ = _spin_motion()
    lt = np.broadcast_to(motion.tree.local_translation, (motion.num_frames, 5, 3)).copy()
    lt[:, 2, 2] += np.linspace(0, 0.1, motion.num_frames)
    motion = SkeletonMotion(
        motion.tree,
        motion.root_translation,
        motion.local_rotation,
        motion.fps,
        lt,
        metadata={"source_file": "x.bvh", "source_units": "cm"},
    )
    path = tmp_path / "m.npz"
    motion.save_npz(path)
    back = SkeletonMotion.load_npz(path)
    assert back.tree.same_as(motion.tree) and back.fps == motion.fps and back.metadata == motion.metadata
    np.testing.assert_array_equal(back.local_rotation, motion.local_rotation)
    np.testing.assert_array_equal(back.local_translation, motion.local_translation)
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]  # no temp files left behind
    evil = tmp_path / "evil.npz"
    arrays = dict(np.load(path))
    arrays["node_names"] = np.array([{"a": 1}], dtype=object)
    np.savez(evil, **arrays)
    with pytest.raises(FormatError, match="pickle"):
        SkeletonMotion.load_npz(evil)


def test_bad_inputs():
    tree = _tree()
    lr = np.zeros((3, 5, 4))
    lr[..., 0] = 1
    with pytest.raises(ShapeError, match="local_rotation"):
        SkeletonMotion(tree, np.zeros((3, 3)), lr[:, :4], 30)
    with pytest.raises(ShapeError, match="root_translation"):
        SkeletonMotion(tree, np.zeros((2, 3)), lr, 30)
    bad = lr.copy()
    bad[1, 2, 0] = np.nan
    with pytest.raises(NonFiniteError, match="local_rotation"):
        SkeletonMotion(tree, np.zeros((3, 3)), bad, 30)
    with pytest.raises(FormatError, match="fps"):
        SkeletonMotion(tree, np.zeros((3, 3)), lr, 0)
    with pytest.raises(ShapeError, match="zero frames"):
        SkeletonMotion(tree, np.zeros((0, 3)), lr[:0], 30)
