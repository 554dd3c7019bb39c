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
    KangEngineError,
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


# -- issue 17: the npz reader checks what it reads and reads only what it needs ------------------------------


def _saved(tmp_path, name="m.npz"):
    motion, _ = _spin_motion(frames=20)
    path = tmp_path / name
    motion.save_npz(path)
    return motion, path, dict(np.load(path))


def _peak(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
    except Exception as exc:
        out = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return out, peak


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("fps", np.array("fast"), "expected a number"),
        ("fps", np.array([30.0, 60.0]), "expected one value"),
        ("fps", np.array(np.inf), "finite"),
        ("fps", np.array(0.0), "fps"),
        ("metadata_json", np.array("{"), "not valid JSON"),
        ("metadata_json", np.array("[" * 100_000), "not valid JSON"),  # RecursionError in json
        ("metadata_json", np.array("[1, 2]"), "expected dict"),
        ("metadata_json", np.array(b"\xff"), "expected text"),
        ("format", np.array(3), "expected text"),
        ("node_names", np.array("hips"), "expected 1 dimensions"),
        ("parent_indices", np.array([-1.0, 0.5, 1, 0, 3]), "expected integers"),
        ("tree_local_translation", np.full((5, 3), "x"), "expected floats"),
        ("root_translation", np.full((20, 3), np.nan), "NaN"),
        ("local_rotation_wxyz", np.zeros((20, 5, 4)), "norm 0"),
    ],
)
def test_npz_values_are_checked_and_named(tmp_path, key, value, expected):
    _, _, arrays = _saved(tmp_path)
    arrays[key] = value
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(KangEngineError) as info:
        SkeletonMotion.load_npz(bad)
    msg = str(info.value)
    assert str(bad) in msg and key in msg and expected in msg, msg


def test_npz_quaternions_slightly_off_are_normalised_with_a_note(tmp_path):
    motion, _, arrays = _saved(tmp_path)
    arrays["local_rotation_wxyz"] = arrays["local_rotation_wxyz"] * 1.0004
    p = tmp_path / "scaled.npz"
    np.savez(p, **arrays)
    back = SkeletonMotion.load_npz(p)
    np.testing.assert_allclose(back.local_rotation, motion.local_rotation, atol=1e-12)
    assert "0.0004" in back.metadata["quaternions_normalised"]
    arrays["local_rotation_wxyz"] = arrays["local_rotation_wxyz"] * 1.01
    np.savez(p, **arrays)
    with pytest.raises(FormatError, match=r"norm 1\.01"):
        SkeletonMotion.load_npz(p)


def test_random_bytes_are_not_an_npz_file(tmp_path):
    p = tmp_path / "noise.npz"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(FormatError) as info:
        SkeletonMotion.load_npz(p)
    assert "not an npz file" in str(info.value) and "pickle" not in str(info.value) and str(p) in str(info.value)


def test_npz_reads_only_the_members_it_needs(tmp_path):
    motion, path, arrays = _saved(tmp_path)
    arrays["unrelated_cache"] = np.zeros(4_000_000)  # 32 MB nobody asked for
    big = tmp_path / "big.npz"
    np.savez(big, **arrays)
    out, peak = _peak(lambda: SkeletonMotion.load_npz(big))
    assert isinstance(out, SkeletonMotion) and out.num_frames == 20
    assert peak < 2 << 20, peak  # before: every member was read (32 MB)


def test_npz_member_header_claims_are_capped_by_the_file_size(tmp_path):
    import io
    import zipfile

    _, path, arrays = _saved(tmp_path)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": (250_000_000, 5, 4)})
    members = {k: v for k, v in arrays.items() if k != "local_rotation_wxyz"}
    p = tmp_path / "claim.npz"
    with zipfile.ZipFile(p, "w") as z:
        for k, v in members.items():
            f = io.BytesIO()
            np.lib.format.write_array(f, v)
            z.writestr(k + ".npy", f.getvalue())
        z.writestr("local_rotation_wxyz.npy", head.getvalue() + b"\0" * 640)
    out, peak = _peak(lambda: SkeletonMotion.load_npz(p))
    assert isinstance(out, FormatError) and "local_rotation_wxyz" in str(out) and "40000000000 bytes" in str(out)
    assert peak < 2 << 20, peak
    # a zip directory entry claiming more stored bytes than the file has
    raw = bytearray(path.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")  # the last central-directory entry; its compressed size is at +20
    raw[cd + 20 : cd + 24] = (2**31).to_bytes(4, "little")
    raw[cd + 24 : cd + 28] = (2**31).to_bytes(4, "little")
    p.write_bytes(bytes(raw))
    out, peak = _peak(lambda: SkeletonMotion.load_npz(p))
    assert isinstance(out, FormatError) and str(p) in str(out), out
    assert peak < 2 << 20, peak
