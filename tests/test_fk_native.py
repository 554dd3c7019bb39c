"""The native (LLVM) execution of the traced forward-kinematics programs: equal to MuJoCo and to the
numpy replay on every model, exact sin/cos (with numpy's taking over out of range), the backend policy
and its fallbacks, and the on-disk cache of built kernels (across processes, corrupted and unwritable)."""

from __future__ import annotations

import os
import subprocess
import sys

import mujoco
import numpy as np
import pytest
import torch
from conftest import MJCF_COMPILABLE, data_file
from test_layout import _assert_same_rotations, _has_free, _mujoco_fk, _random_q

from kangengine.animation import ArticulationCoordinateLayout, SkeletonTree, forward_kinematics
from kangengine.animation import kinematics as K
from kangengine.animation.kinematics import native as _native
from kangengine.asset import MJCFLoader
from kangengine.errors import UnknownNameError

pytestmark = pytest.mark.skipif(not _native.available(), reason="llvmlite is not installed")


@pytest.fixture(autouse=True)
def _own_kernel_cache(tmp_path_factory, monkeypatch):
    """Every test here sees one kernel cache of its own module (not the user's), so what it builds is known."""
    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fk-cache"))


def _backend(monkeypatch, mode):
    monkeypatch.setenv("KANGENGINE_FK_BACKEND", mode)


def _kernels(plan, key):
    return K._PROGRAMS[plan][key].native


@pytest.mark.parametrize("rel", MJCF_COMPILABLE)
def test_native_matches_mujoco_and_the_numpy_replay(rel, monkeypatch):
    path = data_file(rel)
    desc = MJCFLoader.load(path)
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=_has_free(desc))
    m = mujoco.MjModel.from_xml_path(str(path))
    q = _random_q(layout, m, np.random.default_rng(3), 37)  # two full SIMD blocks and a partial one
    xpos, xquat = _mujoco_fk(m, q)
    _backend(monkeypatch, "numpy")
    ref_local = layout.local_transforms(q)
    _backend(monkeypatch, "native")
    pos, rot = forward_kinematics(layout, q)
    assert isinstance(_kernels(layout.tree_plan, "world")[(("qt",), np.dtype(np.float64))], _native.NativeKernel)
    assert pos.dtype == np.float64 and pos.shape == xpos.shape and pos.flags.c_contiguous
    np.testing.assert_allclose(pos, xpos, atol=1e-9)
    _assert_same_rotations(rot, xquat, 1e-9)
    lp, lr = layout.local_transforms(q)
    np.testing.assert_allclose(lp, ref_local[0], atol=1e-12)
    np.testing.assert_allclose(lr, ref_local[1], atol=1e-12)
    p32, r32 = forward_kinematics(layout, q.astype(np.float32))
    assert p32.dtype == np.float32
    np.testing.assert_allclose(p32, xpos, atol=2e-5)
    _assert_same_rotations(r32, xquat, 1e-5)
    tp, tr = forward_kinematics(layout, torch.as_tensor(q))
    assert tp.dtype == torch.float64 and tp.is_contiguous()
    np.testing.assert_array_equal(tp.numpy(), pos)
    np.testing.assert_array_equal(tr.numpy(), rot)


def _hinge_z():
    """One body on a hinge about z at the origin: its rotation is (cos q/2, 0, 0, sin q/2)."""
    plan = K.TreePlan(
        parents=(-1,),
        rest_positions=((0.0, 0.0, 0.0),),
        rest_rotations=((1.0, 0.0, 0.0, 0.0),),
        steps=((K.JointStep("hinge", 0, axis=(0.0, 0.0, 1.0)),),),
    )
    return K.BodyKinematics(plan)


def test_native_sin_cos_are_accurate_to_an_ulp(monkeypatch):
    _backend(monkeypatch, "native")
    kin = _hinge_z()
    rng = np.random.default_rng(0)
    h = np.concatenate(
        [
            rng.uniform(-np.pi, np.pi, 20000),
            rng.uniform(-1e5, 1e5, 20000),  # up to the exact-reduction limit
            np.arange(-64, 65) * (np.pi / 4),  # octant boundaries, where the quadrant flips
            np.nextafter(np.arange(-8, 9) * (np.pi / 4), np.inf),
            [0.0, -0.0, 1e-300, 5e-324, 1e-8, -1e-8],
        ]
    )
    _, rot = kin.from_coordinates((2 * h)[:, None])
    rot = rot[:, 0]
    np.testing.assert_allclose(rot[:, 0], np.cos(h), rtol=0, atol=3e-16)
    np.testing.assert_allclose(rot[:, 3], np.sin(h), rtol=0, atol=3e-16)
    assert not rot[:, 1:3].any()
    # float32: within two float32 ulps of the float64 value
    h32 = rng.uniform(-2e3, 2e3, 20000).astype(np.float32)
    rot32 = kin.from_coordinates((2 * h32)[:, None])[1][:, 0]
    np.testing.assert_allclose(rot32[:, 0], np.cos(h32.astype(np.float64)), rtol=0, atol=1.2e-7)
    np.testing.assert_allclose(rot32[:, 3], np.sin(h32.astype(np.float64)), rtol=0, atol=1.2e-7)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_out_of_range_angles_are_recomputed_by_numpy(monkeypatch, dtype):
    kin = _hinge_z()
    q = np.linspace(-3, 3, 100, dtype=dtype)[:, None]
    q[[5, 60]] = [[1e12], [np.inf]]
    _backend(monkeypatch, "numpy")
    with np.errstate(invalid="ignore"):
        ref = kin.from_coordinates(q)
    _backend(monkeypatch, "native")
    with np.errstate(invalid="ignore"):
        got = kin.from_coordinates(q)
    np.testing.assert_array_equal(got[1][[5, 60]], ref[1][[5, 60]])  # those frames came from the numpy replay
    good = np.setdiff1d(np.arange(100), [5, 60])
    np.testing.assert_array_equal(got[1][good], kin.from_coordinates(q[good])[1])  # the others from the kernel
    assert np.isnan(got[1][60, 0, [0, 3]]).all()
    np.testing.assert_allclose(np.linalg.norm(got[1][5]), 1.0, rtol=1e-6)


def _batches_holding(row, others, sizes):
    """``(batch, position)`` pairs: ``row [1, ...]`` inside batches of ``sizes`` rows drawn from ``others``, first,
    in the middle and last."""
    for n in sizes:
        for pos in sorted({0, n // 2, n - 1}):
            yield np.concatenate([others[:pos], row, others[pos : n - 1]]), pos


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_row_is_bit_identical_alone_and_inside_batches_of_every_size(monkeypatch, dtype):
    """The kernel's result for one frame does not depend on the batch: computed alone and inside batches of 2,
    3, 15-17, 31-33 (partial SIMD blocks, full ones and both) and 100 frames (chunks of 40 on the thread pool),
    at the start, the middle and the end, beside a frame whose hinge angle is out of the exact sin/cos range
    (recomputed by numpy: it must not drag its neighbours to numpy's rounding), numpy and torch, bit for bit."""
    path = data_file("mjcf/mujoco/humanoid.xml")
    desc = MJCFLoader.load(path)
    layout = ArticulationCoordinateLayout.from_data(data=desc)
    m = mujoco.MjModel.from_xml_path(str(path))
    q = _random_q(layout, m, np.random.default_rng(11), 120).astype(dtype)
    q[[3, 40], -1] += 1e8  # out of range: these frames come from the numpy replay
    _backend(monkeypatch, "native")
    monkeypatch.setattr(K, "_NATIVE_CHUNK", 40)
    sizes = (2, 3, 15, 16, 17, 31, 32, 33, 100)
    for row in (q[:1], q[3:4]):  # a frame the kernel computes, and one it hands to numpy
        for wrap in (np.asarray, torch.as_tensor):
            p1, r1 = (np.asarray(x)[0] for x in forward_kinematics(layout, wrap(row)))
            for batch, pos in _batches_holding(row, q[1:], sizes):
                p, r = forward_kinematics(layout, wrap(batch))
                assert np.asarray(p[pos]).tobytes() == p1.tobytes(), (len(batch), pos)
                assert np.asarray(r[pos]).tobytes() == r1.tobytes(), (len(batch), pos)
    # skeleton kinematics (no sin/cos; the partial-block path against the full one)
    tree = SkeletonTree.from_articulation(MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml")))
    rng = np.random.default_rng(12)
    lr = rng.normal(size=(40, tree.num_nodes, 4)).astype(dtype)
    lr /= np.linalg.norm(lr, axis=-1, keepdims=True)
    root = rng.normal(size=(40, 3)).astype(dtype)
    g1 = tree.kinematics.from_local(root[:1], lr[:1])
    for n in (2, 3, 16, 17, 33):
        g = tree.kinematics.from_local(root[:n], lr[:n])
        assert g[0][0].tobytes() == g1[0][0].tobytes() and g[1][0].tobytes() == g1[1][0].tobytes(), n


def test_native_skeleton_from_local_with_and_without_translation(monkeypatch):
    desc = MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    tree = SkeletonTree.from_articulation(desc)
    kin = tree.kinematics
    rng = np.random.default_rng(4)
    n, nb = 45, tree.num_nodes
    lr = rng.normal(size=(n, nb, 4))
    lr /= np.linalg.norm(lr, axis=-1, keepdims=True)
    root = rng.normal(size=(n, 3))
    lt = rng.normal(size=(n, nb, 3))
    cases = [
        (root, lr, None),
        (root, lr, lt),
        (root[:1], lr, None),  # one root translation for every frame (a broadcast row)
        (root, lr[:1], lt[:1]),  # one pose, many root translations
        (root, np.asfortranarray(lr), lt[:, ::-1][:, ::-1]),  # non-contiguous inputs
    ]
    for args in cases:
        _backend(monkeypatch, "numpy")
        ref = kin.from_local(*args)
        _backend(monkeypatch, "native")
        got = kin.from_local(*args)
        np.testing.assert_allclose(got[0], ref[0], atol=1e-12)
        np.testing.assert_allclose(got[1], ref[1], atol=1e-12)
        tgot = kin.from_local(*(None if a is None else torch.as_tensor(np.ascontiguousarray(a)) for a in args))
        np.testing.assert_allclose(tgot[0].numpy(), ref[0], atol=1e-12)
    assert any(isinstance(k, _native.NativeKernel) for k in _kernels(kin.plan, "skeleton_t").values())


def test_shapes_strides_chunks_and_empty_batches(monkeypatch):
    desc = MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml"))
    layout = ArticulationCoordinateLayout.from_data(data=desc)
    m = mujoco.MjModel.from_xml_path(str(data_file("mjcf/mujoco/humanoid.xml")))
    q = _random_q(layout, m, np.random.default_rng(5), 333)
    _backend(monkeypatch, "numpy")
    ref_p, ref_r = forward_kinematics(layout, q)
    _backend(monkeypatch, "native")
    monkeypatch.setattr(K, "_NATIVE_CHUNK", 40)  # several chunks on the thread pool, a ragged last one
    for n in (0, 1, 7, 8, 9, 333):
        p, r = forward_kinematics(layout, q[:n])
        assert p.shape == (n, layout.num_bodies, 3) and r.shape == (n, layout.num_bodies, 4)
        np.testing.assert_allclose(p, ref_p[:n], atol=1e-12)
        np.testing.assert_allclose(r, ref_r[:n], atol=1e-12)
    p, _ = forward_kinematics(layout, np.asfortranarray(q)[::-1])  # strided rows, reversed order
    np.testing.assert_allclose(p, ref_p[::-1], atol=1e-12)
    p, _ = forward_kinematics(layout, q[:330].reshape(2, 3, 55, layout.nq))
    np.testing.assert_allclose(p.reshape(330, -1, 3), ref_p[:330], atol=1e-12)
    t = torch.as_tensor(q).T.contiguous().T  # a torch view with strided columns
    np.testing.assert_allclose(forward_kinematics(layout, t)[0].numpy(), ref_p, atol=1e-12)


def test_policy_and_fallbacks(monkeypatch):
    kin = _hinge_z()
    prog = kin._traced_coordinates(False)
    q = np.linspace(-1, 1, 50)[:, None]
    _backend(monkeypatch, "auto")
    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(_fresh_dir(monkeypatch)))
    prog.native.clear()
    prog.not_on_disk.clear()
    assert K._NATIVE_BUILD_FRAMES == 1  # by default the first CPU call of any size builds the kernel
    kin.from_coordinates(q[:1])
    assert isinstance(prog.native[(("qt",), np.dtype(np.float64))], _native.NativeKernel)
    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(_fresh_dir(monkeypatch)))
    prog.native.clear()
    monkeypatch.setattr(K, "_NATIVE_BUILD_FRAMES", 51)
    kin.from_coordinates(q)  # below the build size, no kernel in memory or on disk: the numpy replay, nothing built
    assert not prog.native and prog.not_on_disk
    monkeypatch.setattr(K, "_NATIVE_BUILD_FRAMES", 50)  # a call this large builds the kernel
    kin.from_coordinates(q)
    assert isinstance(prog.native[(("qt",), np.dtype(np.float64))], _native.NativeKernel)
    # a small call after that (another program object, as in a new process) loads it from the disk cache
    monkeypatch.setattr(K, "_NATIVE_BUILD_FRAMES", 1 << 30)
    prog.native.clear()
    prog.not_on_disk.clear()
    _, r = kin.from_coordinates(q[:3])
    assert prog.native[(("qt",), np.dtype(np.float64))].from_cache
    np.testing.assert_allclose(r[:, 0, 0], np.cos(q[:3, 0] / 2), atol=1e-15)
    # gradients and other dtypes take the torch / numpy replay
    tq = torch.as_tensor(q, dtype=torch.float32).requires_grad_()
    _, r = kin.from_coordinates(tq)
    r[:, 0, 3].sum().backward()
    np.testing.assert_allclose(tq.grad.numpy()[:, 0], 0.5 * np.cos(q[:, 0] / 2), atol=1e-6)
    assert kin.from_coordinates(q.astype(np.float16))[1].dtype == np.float16
    # a kernel that cannot be built: warn once, replay
    prog.native.clear()

    def broken(*args, **kwargs):
        raise RuntimeError("no code generator")

    monkeypatch.setattr(_native, "compile_program", broken)
    with pytest.warns(RuntimeWarning, match="no code generator"):
        _, r = kin.from_coordinates(q)
    np.testing.assert_allclose(r[:, 0, 0], np.cos(q[:, 0] / 2), atol=1e-15)
    assert prog.native[(("qt",), np.dtype(np.float64))] is None
    _backend(monkeypatch, "fast")
    with pytest.raises(UnknownNameError, match="KANGENGINE_FK_BACKEND.*'fast' is not a backend"):
        kin.from_coordinates(q)


def _fresh_dir(monkeypatch):
    import tempfile

    d = tempfile.mkdtemp(prefix="ke-fk-cache-")
    monkeypatch.setattr(_native, "_source_digest", None)
    return d


def _smpl():
    layout = ArticulationCoordinateLayout.from_data(
        data=MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml")), free_root=True
    )
    kin = K.BodyKinematics(layout.tree_plan)
    return layout, kin, kin._traced_coordinates(False)


def test_kernel_cache_round_trip_corruption_and_keys(tmp_path, monkeypatch):
    """A built kernel is stored once; a second build loads it (same results, bit for bit); a file that does not
    check out is ignored and rewritten; another dtype or program is another file; an unwritable folder only
    costs the rebuild."""
    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(tmp_path))
    _backend(monkeypatch, "native")
    layout, kin, prog = _smpl()
    trace = prog.trace
    rng = np.random.default_rng(0)
    q = np.tile(layout.neutral(), (3000, 1)) + 0.3 * rng.normal(size=(3000, layout.nq))
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    q = q.astype(np.float32)
    built = _native.compile_trace(trace, ("qt",), np.float32)
    files = list((tmp_path / "fk-native").glob("*.o"))
    assert not built.from_cache and len(files) == 1
    loaded = _native.compile_trace(trace, ("qt",), np.float32)
    assert loaded.from_cache
    assert _native.compile_trace(trace, ("qt",), np.float64, cached_only=True) is None  # another key
    outs = []
    for kern in (built, loaded):
        prog.native[(("qt",), np.dtype(np.float32))] = kern
        outs.append(kin.from_coordinates(q))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    _backend(monkeypatch, "numpy")
    ref_p, ref_r = kin.from_coordinates(q.astype(np.float64))
    assert np.abs(outs[1][0] - ref_p).max() < 2e-5 and np.abs(outs[1][1] - ref_r).max() < 2e-6
    data = bytearray(files[0].read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the object code
    files[0].write_bytes(bytes(data))
    again = _native.compile_trace(trace, ("qt",), np.float32)
    assert not again.from_cache and _native.compile_trace(trace, ("qt",), np.float32).from_cache
    files[0].write_bytes(b"garbage")
    assert _native.compile_trace(trace, ("qt",), np.float32, cached_only=True) is None
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setenv("KANGENGINE_CACHE_DIR", str(locked))
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # (root may write anyway)
            assert not _native.compile_trace(trace, ("qt",), np.float32).from_cache
            assert not list(locked.rglob("*.o"))
    finally:
        locked.chmod(0o700)


def test_a_new_process_loads_the_cached_kernel(tmp_path):
    """The first FK call of a fresh process finds the kernel an earlier process built (no rebuild)."""
    script = (
        "import numpy as np, kangengine as ke\n"
        "from kangengine.animation import kinematics as K\n"
        "from kangengine.data import data_path\n"
        "layout = ke.animation.ArticulationCoordinateLayout.from_data(\n"
        "    data=ke.asset.MJCFLoader.load(data_path('humanoid_CMU.xml')))\n"
        "q = np.tile(layout.neutral(), (1000, 1)).astype(np.float32)\n"
        "ke.animation.forward_kinematics(layout, q)\n"
        "kern = [k for p in K._PROGRAMS.values() for g in p.values() for k in g.native.values()]\n"
        "print(len(kern), kern[0].from_cache if kern else None)\n"
    )
    env = dict(os.environ, KANGENGINE_CACHE_DIR=str(tmp_path), KANGENGINE_FK_BACKEND="auto")
    run = lambda e: subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True, check=True)
    assert run(dict(env, KANGENGINE_FK_BACKEND="numpy")).stdout.split() == ["0", "None"]  # the replay builds nothing
    assert run(env).stdout.split() == ["1", "False"]  # the first call builds the kernel and stores it
    assert run(env).stdout.split() == ["1", "True"]  # the first call of a new process loads it
