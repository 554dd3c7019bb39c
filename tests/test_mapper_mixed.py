"""The compiled mixed-layout mapping pass (:mod:`kangengine.animation.native_mapper_mixed`, numba).

Oracles: the numpy reference path of the mapper (``use_native = False``, and the path that runs where numba does
not import), MuJoCo's forward kinematics of the mapped ``q`` (the joint rotations it reproduces against the
retargeted source's, up to the reported residuals) and ``layout.difference`` for ``qd``. Real clips: the CMU walk
(02_01) and hops (01_01) read from BVH and retargeted onto dm_control's CMU humanoid (bodies with 1, 2 and 3
hinges, rest rotations, narrow limits).
"""

from __future__ import annotations

import builtins
import warnings

import mujoco
import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine import _deps
from kangengine import rotations as R
from kangengine.animation import ArticulationCoordinateLayout, ArticulationMotionMapper, SkeletonMotion
from kangengine.animation import mapper as mapper_module
from kangengine.asset import MJCFLoader
from kangengine.errors import FormatError, NonFiniteError

pytest.importorskip("numba")

CMU = "mjcf/dm_control/humanoid_CMU.xml"


def _retargeted(name: str, fps: float | None) -> SkeletonMotion:
    source = ke.io.load_bvh(data_file(f"bvh/cmu/{name}"))
    if fps is not None:
        source = source.resample(fps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the retarget's own notes (joint limits of the reference)
        return ke.retarget.retarget_motion(source, "cmu_bvh_to_cmu_humanoid").motion


@pytest.fixture(scope="module")
def clips():
    """The walk at its own 120 fps (343 frames) and the hops resampled to 30 fps (688 frames), on the robot."""
    return {
        "02_01": _retargeted("02_01_cgspeed_walk.bvh", None),
        "01_01": _retargeted("01_01_cgspeed_hops_long.bvh", 30.0),
    }


@pytest.fixture(scope="module")
def cmu():
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file(CMU)), free_root=True)
    return layout, ArticulationMotionMapper(layout)


def _crop(motion: SkeletonMotion, n: int, start: int, dtype=np.float32) -> SkeletonMotion:
    s = slice(start, start + n)
    rt = np.asarray(motion.root_translation[s], dtype=dtype)
    return SkeletonMotion(motion.tree, rt, np.asarray(motion.local_rotation[s], dtype=dtype), motion.fps)


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of the compiled pass (the mapper's lazily imported ``map_motion``)."""
    kern = mapper_module._mixed_kernel()
    assert kern is not None
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return kern(*args, **kwargs)

    monkeypatch.setattr(mapper_module, "_mixed_kernel", lambda: counted)
    return calls


def _numpy_path(mapper, motion, clamp):
    mapper.use_native = False
    try:
        return mapper.to_articulation_motion(motion, clamp_to_limits=clamp)
    finally:
        mapper.use_native = True


def _assert_same_mapping(a, b, *, dtype):
    """q, qd, residuals, clamping and the summary of two mappings equal to the dtype's rounding."""
    tol = 1e-9 if dtype == np.float64 else 2e-6  # rad: float32 angles up to a few rad
    fps = a.motion.fps()
    np.testing.assert_allclose(a.motion.q, b.motion.q, rtol=0, atol=tol)
    # qd: differences of q over 2 dt (the stored q is float32 either way, so 4 ulps of its largest angle)
    q_ulp = 4 * np.finfo(np.float32).eps * max(1.0, float(np.abs(b.motion.q[:, 7:]).max()))
    np.testing.assert_allclose(a.motion.qd, b.motion.qd, rtol=0, atol=max(tol, q_ulp) * fps)
    assert a.residual_angles.dtype == b.residual_angles.dtype == dtype
    np.testing.assert_allclose(a.residual_angles, b.residual_angles, rtol=0, atol=tol)
    assert a.clamped.dtype == b.clamped.dtype
    np.testing.assert_allclose(a.clamped, b.clamped, rtol=0, atol=tol)
    ma, mb = a.motion.metadata["mapper"], b.motion.metadata["mapper"]
    assert ma.keys() == mb.keys()
    assert ma["rewrapped_frames"] == mb["rewrapped_frames"] and ma["clamp_to_limits"] == mb["clamp_to_limits"]
    assert ma["limit_violation_dofs"].keys() == mb["limit_violation_dofs"].keys()
    for dof, v in ma["limit_violation_dofs"].items():
        assert v["max"] == pytest.approx(mb["limit_violation_dofs"][dof]["max"], abs=tol), dof
        assert v["fraction"] == mb["limit_violation_dofs"][dof]["fraction"], dof
    for key in ("max_residual_angle", "limit_violation_max", "clamped_max"):
        assert ma[key] == pytest.approx(mb[key], abs=tol), key


@pytest.mark.parametrize("clamp", [False, True], ids=["free", "clamped"])
@pytest.mark.parametrize("n", [1, 2, 7, 30, 300])
@pytest.mark.parametrize("clip", ["02_01", "01_01"])
def test_compiled_pass_equals_the_numpy_path_on_real_clips(clips, cmu, spy, clip, n, clamp):
    """Crops of 1 to 300 frames of both real clips, with and without clamping: the same q, qd, residuals,
    clamping amounts and summary as the numpy path, to float32 rounding, and the compiled pass did run."""
    layout, mapper = cmu
    motion = _crop(clips[clip], n, start=37)
    got = mapper.to_articulation_motion(motion, clamp_to_limits=clamp)
    assert len(spy) == 1
    want = _numpy_path(mapper, motion, clamp)
    assert len(spy) == 1  # the reference did not use it
    _assert_same_mapping(got, want, dtype=np.float32)
    if clamp and n >= 30:  # the crops leave the limits: clamping moved something, the residuals say where
        assert got.clamped.any() and got.motion.metadata["mapper"]["clamped_max"] > 0
        assert got.residual_angles.max() > 1e-3


@pytest.mark.parametrize("clamp", [False, True], ids=["free", "clamped"])
def test_float64_clips_equal_the_numpy_path_to_float64_rounding(clips, cmu, spy, clamp):
    """The compiled pass computes in float64: a float64 clip gives the numpy path's float64 values to ~1e-9."""
    layout, mapper = cmu
    motion = _crop(clips["01_01"], 300, start=200, dtype=np.float64)
    got = mapper.to_articulation_motion(motion, clamp_to_limits=clamp)
    assert len(spy) == 1
    _assert_same_mapping(got, _numpy_path(mapper, motion, clamp), dtype=np.float64)


@pytest.mark.parametrize("clamp", [False, True], ids=["free", "clamped"])
@pytest.mark.parametrize("clip", ["02_01", "01_01"])
def test_mujoco_reproduces_the_source_rotations_up_to_the_residuals(clips, cmu, spy, clip, clamp):
    """MuJoCo's forward kinematics at the mapped qpos: each body's rotation relative to its parent equals the
    retargeted source's local rotation up to the reported residual (exactly, where the joints reach it: the free
    root and the 3-hinge bodies), and the root body sits where the source puts it."""
    layout, mapper = cmu
    motion = _crop(clips[clip], 120, start=11, dtype=np.float64)
    res = mapper.to_articulation_motion(motion, clamp_to_limits=clamp)
    assert len(spy) == 1
    model = mujoco.MjModel.from_xml_path(str(data_file(CMU)))
    assert model.nq == layout.nq and [model.body(i).name for i in range(1, model.nbody)] == list(layout.body_names)
    data = mujoco.MjData(model)
    n, nb = res.motion.q.shape[0], layout.num_bodies
    xquat, xpos = np.empty((n, nb, 4)), np.empty((n, 3))
    for t in range(n):
        data.qpos[:] = res.motion.q[t]
        mujoco.mj_kinematics(model, data)
        xquat[t] = data.xquat[1:]
        xpos[t] = data.xpos[1]
    parents = np.asarray(layout.parent_indices)
    local_mj = xquat.copy()
    inner = parents >= 0
    local_mj[:, inner] = R.quat_multiply(R.quat_conjugate(xquat[:, parents[inner]]), xquat[:, inner])
    angle = R.quat_angle_between(local_mj, np.asarray(motion.local_rotation, dtype=np.float64))  # [frames, bodies]
    # q is stored in float32: its rounding (~1e-7 rad per angle, a few angles per body) is the floor
    np.testing.assert_allclose(angle, res.residual_angles, rtol=0, atol=2e-6)
    complete = [b for g in mapper._groups if g.complete for b in g.bodies.tolist()] + [0]
    if not clamp:  # (clamped triplets leave their wanted rotation: the first check holds them to their residual)
        assert angle[:, complete].max() < 2e-6 and not res.residual_angles[:, complete].any()
    np.testing.assert_allclose(xpos, motion.root_translation, atol=1e-6)
    assert res.residual_angles[:, [b for b in range(nb) if b not in complete]].max() > 1e-3  # some are not reached


def test_qd_is_the_layout_difference_of_the_mapped_path(clips, cmu, spy):
    """The compiled pass's qd: central differences of the continuous path through ``layout.difference``
    (``mapper.velocities``), to the float32 rounding of q over 2 dt."""
    layout, mapper = cmu
    res = mapper.to_articulation_motion(_crop(clips["01_01"], 300, start=300))
    assert len(spy) == 1
    q, fps = res.motion.q, res.motion.fps()
    if not res.motion.metadata["mapper"]["rewrapped_frames"]:  # then q is the continuous path itself
        ulp = 4 * np.finfo(np.float32).eps * float(np.abs(q).max())
        np.testing.assert_allclose(res.motion.qd, mapper.velocities(q, fps), rtol=0, atol=ulp * fps)
    clamped = mapper.to_articulation_motion(_crop(clips["01_01"], 300, start=300), clamp_to_limits=True)
    q = clamped.motion.q  # with clamping, qd differentiates the clamped q
    ulp = 4 * np.finfo(np.float32).eps * float(np.abs(q).max())
    np.testing.assert_allclose(clamped.motion.qd, mapper.velocities(q, fps), rtol=0, atol=ulp * fps)


def test_without_numba_the_numpy_path_gives_the_same_results(clips, cmu, monkeypatch):
    """numba not importable (the import made to fail): the mapper falls back to the numpy path, which gives the
    compiled pass's results to float32 rounding, clamped or not."""
    layout, mapper = cmu
    motions = [_crop(clips["02_01"], 30, 0), _crop(clips["01_01"], 75, 100)]
    native = [mapper.to_articulation_motion(m, clamp_to_limits=c) for m in motions for c in (False, True)]
    real_import = builtins.__import__

    def no_numba(name, *args, **kwargs):
        if name == "numba" or name.startswith("numba.") or name.endswith("native_mapper_mixed"):
            raise ImportError(f"No module named {name!r} (made to fail by the test)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(_deps, "_OPTIONAL", {})
    monkeypatch.delitem(__import__("sys").modules, "kangengine.animation.native_mapper_mixed", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_numba)
    assert mapper_module._mixed_kernel() is None
    fallback = [mapper.to_articulation_motion(m, clamp_to_limits=c) for m in motions for c in (False, True)]
    monkeypatch.undo()
    reference = [_numpy_path(mapper, m, c) for m in motions for c in (False, True)]
    for a, b, c in zip(native, fallback, reference):
        _assert_same_mapping(a, b, dtype=np.float32)
        for x, y in [(b.motion.q, c.motion.q), (b.motion.qd, c.motion.qd), (b.residual_angles, c.residual_angles)]:
            assert np.array_equal(x, y)  # the fallback is the numpy path itself


def test_bad_frames_are_refused_as_the_numpy_path_refuses_them(clips, cmu, spy):
    """An all-zero quaternion: FormatError naming the frame and body (the first in frame order); a NaN:
    NonFiniteError, as the numpy path raises them."""
    layout, mapper = cmu
    motion = _crop(clips["02_01"], 30, 0)
    for frame, body in [(4, 0), (17, 9), (29, 30)]:
        local = np.array(motion.local_rotation)
        local[frame, body] = 0.0
        local[frame + 1 :, 3] = 0.0  # later zeros are not the ones named
        bad = SkeletonMotion(motion.tree, motion.root_translation, local, motion.fps, skip_checks=True)
        name = layout.body_names[body]
        with pytest.raises(FormatError, match=f"frame {frame}, body '{name}'"):
            mapper.to_articulation_motion(bad)
        with pytest.raises(FormatError, match=f"frame {frame}, body '{name}'"):
            _numpy_path(mapper, bad, False)
    local = np.array(motion.local_rotation)
    local[12, 5, 1] = np.nan
    bad = SkeletonMotion(motion.tree, motion.root_translation, local, motion.fps, skip_checks=True)
    for run in (lambda: mapper.to_articulation_motion(bad), lambda: _numpy_path(mapper, bad, False)):
        with pytest.raises(NonFiniteError):
            run()
    assert len(spy) == 4


@pytest.mark.parametrize("rel", ["mjcf/mujoco/humanoid.xml", "mjcf/unitree/g1_29dof.nomesh.xml"])
def test_other_mixed_layouts_equal_the_numpy_path(rel, monkeypatch):
    """Other layouts the pass takes: MuJoCo's humanoid (non-perpendicular 2-hinge shoulders: the chain residual;
    x/y/z triplets; anchors) and the G1 (single hinges only), on a smooth motion that turns past its limits."""
    layout = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file(rel)))
    mapper = ArticulationMotionMapper(layout)
    assert mapper._mixed_spec is not None
    rng = np.random.default_rng(3)
    n, fps = 240, 60.0
    t = np.arange(n) / fps
    q = np.tile(layout.neutral(), (n, 1))
    hinges = [b for b in layout.blocks if b.joint_type.name == "HINGE"]
    for b in hinges:
        amp, w, ph = rng.uniform(0.3, 2.5), rng.uniform(0.5, 3.0), rng.uniform(0, 6.3)
        q[:, b.q_offset] = b.ref + amp * np.sin(w * t + ph)
    q[:, 0] = 0.4 * t
    st = mapper.to_skeleton_state(q)
    motion = SkeletonMotion(mapper.skeleton_tree, st.root_translation, st.local_rotation, fps, st.local_translation)
    for clamp in (False, True):
        got = mapper.to_articulation_motion(motion, clamp_to_limits=clamp)
        _assert_same_mapping(got, _numpy_path(mapper, motion, clamp), dtype=np.float64)


def _turning_q(layout, n: int, fps: float, seed: int) -> np.ndarray:
    """Hinges turning several times (far past their limits: re-wrapping, 2 pi shifts), triplets' middle angles
    swinging across +-pi/2 (branch crossings), one frame exactly in gimbal lock, the free root turning."""
    t = np.arange(n) / fps
    rng = np.random.default_rng(seed)
    q = np.tile(layout.neutral(), (n, 1))
    q[:, 0:3] = np.stack([np.sin(t), 0.8 * t, 0.9 + 0.05 * np.cos(3 * t)], axis=-1)
    q[:, 3:7] = R.quat_from_rotvec(np.outer(t, [0.1, -0.2, 1.1]))
    locked = False
    for b in range(layout.num_bodies):
        blocks = [x for x in layout.blocks_of_body(b) if x.joint_type.name == "HINGE"]
        for i, blk in enumerate(blocks):
            if len(blocks) == 3 and i == 1:
                q[:, blk.q_offset] = rng.uniform(0.5, 1.8) * np.sin(rng.uniform(0.3, 1.0) * t)
                if not locked:
                    q[n // 2, blk.q_offset], locked = np.pi / 2, True
            else:
                q[:, blk.q_offset] = rng.uniform(-2.0, 2.0) * t + rng.uniform(-3, 3)
    return q


def test_turns_crossings_and_gimbal_lock_take_the_numpy_paths_branches(cmu, spy):
    """A synthetic CMU-humanoid motion that turns every hinge several times past its limits, swings the triplets'
    middle angles across +-pi/2 and passes one frame through gimbal lock: float64, the compiled pass gives the numpy
    path's q, qd, residuals and summary (the same branches, shifts and re-wrapped frames); float32, it is at least
    as close to the float64 mapping as numpy's float32 arithmetic, and the joints reproduce the generating
    rotations."""
    layout, mapper = cmu
    fps, n = 60.0, 1200
    q = _turning_q(layout, n, fps, 5)
    st = mapper.to_skeleton_state(q)
    results = {}
    for dtype in (np.float64, np.float32):
        motion = SkeletonMotion(
            mapper.skeleton_tree, st.root_translation.astype(dtype), st.local_rotation.astype(dtype), fps
        )
        for clamp in (False, True):
            results[dtype, clamp] = (mapper.to_articulation_motion(motion, clamp_to_limits=clamp),
                                     _numpy_path(mapper, motion, clamp))  # fmt: skip
    assert len(spy) == 4
    for clamp in (False, True):
        got, want = results[np.float64, clamp]
        _assert_same_mapping(got, want, dtype=np.float64)
        assert got.motion.metadata["mapper"]["rewrapped_frames"]  # the turns were brought back into reach
    got, want = results[np.float32, False]
    q64 = results[np.float64, False][0].motion.q.astype(np.float64)
    qa, qb = got.motion.q.astype(np.float64), want.motion.q.astype(np.float64)
    assert np.abs(qa - qb).max() < 1e-4
    assert np.abs(qa - q64).max() <= np.abs(qb - q64).max() + 1e-6
    assert got.motion.metadata["mapper"]["rewrapped_frames"] == want.motion.metadata["mapper"]["rewrapped_frames"]
    _, r0 = ke.animation.forward_kinematics(layout, q)
    _, r1 = ke.animation.forward_kinematics(layout, qa)
    assert R.quat_angle_between(r0, r1).max() < 3e-4
