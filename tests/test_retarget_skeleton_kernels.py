"""The skeleton retarget's compiled passes (``kangengine.retarget._skeleton_kernels``) give what its numpy paths
give, and what a batch keeps between clips is never another skeleton's.

Oracles: the numpy paths of ``kangengine.retarget.skeleton`` (themselves checked against the previous
implementation and MuJoCo in ``test_retarget_skeleton_hot.py``), scipy's ``minimum_filter1d`` /
``uniform_filter1d``, MuJoCo's geom poses, forward kinematics of the levelled local rotations, a fresh plan (an
emptied cache), and ``rotations.quat_slerp`` for the resample.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import data_file
from scipy.ndimage import minimum_filter1d, uniform_filter1d
from scipy.spatial.transform import Rotation

import kangengine as ke
from kangengine import _deps
from kangengine import rotations as R
from kangengine.retarget import skeleton as sk

CONFIG = "cmu_bvh_to_cmu_humanoid"

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def cmu_desc():
    return ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))


@pytest.fixture(scope="module")
def walk():
    return ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))


@pytest.fixture(scope="module")
def hops():
    return ke.io.load_bvh(data_file("bvh/cmu/01_01_cgspeed_hops_long.bvh"))


@pytest.fixture(scope="module")
def tall(hops):
    """The hops on a performer 10 % taller (every bone, the root's path): another source skeleton."""
    tree = ke.animation.SkeletonTree(hops.tree.node_names, hops.tree.parent_indices, 1.1 * hops.tree.local_translation)
    return ke.animation.SkeletonMotion(tree, 1.1 * hops.root_translation, hops.local_rotation, hops.fps)


@pytest.fixture
def numpy_paths(monkeypatch):
    """Run the numpy paths (as where numba is missing) inside the ``with``; the kernels outside it."""

    class _Switch:
        def __enter__(self):
            monkeypatch.setitem(_deps._OPTIONAL, "kangengine.retarget._skeleton_kernels", None)

        def __exit__(self, *exc):
            monkeypatch.undo()

    return _Switch()


def _both(clip, config, desc, numpy_paths):
    got = sk.retarget_motion(clip, config, desc)
    with numpy_paths:
        want = sk.retarget_motion(clip, config, desc)
    return got, want


def _assert_same(got, want, *, eps):
    a, b = got.motion, want.motion
    assert a.local_rotation.dtype == b.local_rotation.dtype
    np.testing.assert_allclose(a.global_translation, b.global_translation, atol=eps)
    angle = R.quat_angle_between(np.asarray(a.local_rotation, np.float64), np.asarray(b.local_rotation, np.float64))
    assert float(np.max(angle)) < eps
    np.testing.assert_allclose(got.ground_shift, want.ground_shift, atol=1e-12)
    fa, fb = a.metadata["retarget"].get("feet_levelled_deg", {}), b.metadata["retarget"].get("feet_levelled_deg", {})
    assert set(fa) == set(fb) and all(abs(fa[k] - fb[k]) < 1e-9 for k in fa)
    assert got.projected_joints == want.projected_joints
    assert got.unmapped_target_joints == want.unmapped_target_joints
    assert got.mapped_target_joints == want.mapped_target_joints


def test_kernels_equal_the_numpy_paths_on_real_clips(walk, hops, cmu_desc, numpy_paths):
    """1 s crops at 30 fps (float32, as convert sees them; the hops' first frame is the BVH rest pose, arms
    straight), a 2 s crop at 120 fps and the same in float64: to float32 rounding (float64: 1e-12)."""
    clips = [m[s : s + 120].resample(30.0) for m in (walk, hops) for s in (0, 150, 220)]
    long = walk[:240]
    as64 = ke.animation.SkeletonMotion(
        long.tree, long.root_translation.astype(np.float64), long.local_rotation.astype(np.float64), long.fps
    )
    levelled = 0
    for clip in clips + [long, as64]:
        got, want = _both(clip, CONFIG, cmu_desc, numpy_paths)
        _assert_same(got, want, eps=1e-12 if clip.local_rotation.dtype == np.float64 else 2e-7)
        levelled += sum(v != 0.0 for v in got.motion.metadata["retarget"]["feet_levelled_deg"].values())
    assert levelled >= len(clips)  # the levelling really ran (both feet of most clips)


def test_kernels_equal_the_numpy_paths_without_feet_levelling_or_hinges(walk, cmu_desc, numpy_paths):
    """The hinge projection off, the feet levelling off, the ground from the first frame and from body origins."""
    base = sk.load_retarget_config(CONFIG)
    clip = walk[:120].resample(30.0)
    for config in (
        base.replace(project_hinges=False),
        base.replace(level_feet=()),
        base.replace(ground_fix=sk.GroundFix.FIRST_FRAME),
        base.replace(ground_reference=sk.GroundReference.BODY_ORIGINS, ground_fix=sk.GroundFix.CLIP_MIN),
    ):
        got, want = _both(clip, config, cmu_desc, numpy_paths)
        _assert_same(got, want, eps=2e-7)


def test_a_foot_without_toe_points_takes_the_numpy_path(walk, cmu_desc, numpy_paths):
    """One foot without a toe (its walking direction from the SVD): the numpy levelling, the same pitches."""
    config = sk.load_retarget_config(CONFIG).replace(level_feet=(("lfoot", "ltoes"), ("rfoot", "")))
    got, want = _both(walk[:120].resample(30.0), config, cmu_desc, numpy_paths)
    _assert_same(got, want, eps=2e-7)


def test_levelled_poses_equal_forward_kinematics_of_the_levelled_rotations(walk, cmu_desc):
    """The kernel moves the world poses at and below each levelled foot instead of running forward kinematics
    again: they equal forward kinematics of the new local rotations."""
    plan = sk._plan_for(sk._named_config(CONFIG), cmu_desc, walk.tree, None, None)
    clip = walk[:240].resample(30.0)
    src = clip.numpy()
    src_pos, src_rot = plan.source_kinematics.from_local(src.root_translation, src.local_rotation)
    local = sk._local_rotations(plan, src_rot)
    root = plan.target_tpose_root + (src_pos[:, plan.source_root] - plan.source_tpose_root) @ plan.root_map.T
    tree = plan.tgt.tree
    pos, rot = tree.kinematics.from_local(root, local)
    angles, current = sk._level_feet_in_place(plan.feet, pos, rot, local, clip.fps)
    assert current and all(a != 0.0 for a in angles.values())
    want_pos, want_rot = tree.kinematics.from_local(root, local)
    np.testing.assert_allclose(pos, want_pos, atol=1e-12)
    assert float(np.max(R.quat_angle_between(rot, want_rot))) < 1e-12


def test_lowest_points_kernel_equals_numpy_and_mujoco(tmp_path, cmu_desc):
    """Every geom kind in random poses (the hot test's model), and the CMU humanoid's geoms in random body poses:
    the kernel against the numpy pass, and against MuJoCo for the first."""
    from test_retarget_skeleton_hot import every_geom_in_random_poses

    desc, pos, rot, want = every_geom_in_random_poses(tmp_path, 30, seed=11)
    ground = sk._GroundGeoms.from_desc(desc)
    np.testing.assert_allclose(ground.lowest(pos, rot), want, atol=1e-9)
    np.testing.assert_allclose(ground.lowest(pos, rot), ground.lowest_numpy(pos, rot), atol=1e-14)
    cmu = sk._GroundGeoms.from_desc(cmu_desc)
    n, rng = len(cmu_desc.bodies), np.random.default_rng(11)
    pos = rng.normal(size=(50, n, 3))
    rot = Rotation.random(50 * n, random_state=rng).as_quat()[:, [3, 0, 1, 2]].reshape(50, n, 4)
    np.testing.assert_allclose(cmu.lowest(pos, rot), cmu.lowest_numpy(pos, rot), atol=1e-14)


@pytest.mark.parametrize("width", [1, 3, 31, 61])
def test_rolling_ground_equals_scipy(width):
    """The running minimum then mean (``mode="nearest"``) against scipy's, windows shorter and longer than the
    clip."""
    rng = np.random.default_rng(width)
    for frames in (1, 2, 30, 47):
        low = rng.normal(size=frames)
        want = uniform_filter1d(minimum_filter1d(low, width, mode="nearest"), width, mode="nearest")
        np.testing.assert_allclose(sk._rolling_ground(low, width), want, atol=1e-14)


def test_a_batch_of_two_skeletons_keeps_a_plan_for_each(walk, tall, cmu_desc, numpy_paths):
    """A clip of another performer (10 % taller) after the walk gets its own plan, T-pose and scale, equal to what
    a fresh cache gives it, and the walk after it is still the walk's."""
    a1 = sk.retarget_motion(walk[:120].resample(30.0), CONFIG, cmu_desc)
    b1 = sk.retarget_motion(tall[:120].resample(30.0), CONFIG, cmu_desc)
    a2 = sk.retarget_motion(walk[:120].resample(30.0), CONFIG, cmu_desc)
    assert a1.source_tpose is a2.source_tpose and b1.source_tpose is not a1.source_tpose
    np.testing.assert_array_equal(b1.source_tpose.tree.local_translation, tall.tree.local_translation)
    assert abs(b1.scale * 1.1 - a1.scale) < 1e-12
    sk._PLANS.clear()
    b0 = sk.retarget_motion(tall[:120].resample(30.0), CONFIG, cmu_desc)
    np.testing.assert_array_equal(b1.motion.local_rotation, b0.motion.local_rotation)
    np.testing.assert_array_equal(b1.motion.root_translation, b0.motion.root_translation)
    np.testing.assert_array_equal(a1.motion.local_rotation, a2.motion.local_rotation)
    with numpy_paths:  # the uncached, numpy path: the same to float32 rounding
        sk._PLANS.clear()
        b_np = sk.retarget_motion(tall[:120].resample(30.0), CONFIG, cmu_desc)
    _assert_same(b1, b_np, eps=2e-7)


def test_convert_batch_of_two_skeletons_equals_each_clip_alone(tmp_path, walk, tall):
    """One convert batch holding a clip of each performer writes, for each, what a batch of that clip alone
    writes after every kept plan and configuration is dropped."""
    from kangengine.data import data_path

    src = tmp_path / "src"
    src.mkdir()
    for name, motion in (("a_walk.bvh", walk[:60]), ("b_tall.bvh", tall[300:360])):
        ke.io.save_bvh(src / name, motion)
    model = data_path("humanoid_CMU.xml")
    opts = ke.pipelines.ConvertOptions(config=CONFIG, fps=30.0)
    both = ke.pipelines.convert_clips(sorted(src.iterdir()), model, options=opts, out_dir=tmp_path / "both")
    assert both.to_dict()["counts"]["converted"] == 2
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(model))
    scales = []
    for name in ("a_walk", "b_tall"):
        sk._PLANS.clear()
        sk._CONFIGS.clear()
        alone = ke.pipelines.convert_clips(
            [src / f"{name}.bvh"], model, options=opts, out_dir=tmp_path / f"alone_{name}"
        )
        got = ke.animation.load_articulation_motion_npz(tmp_path / "both" / f"{name}.npz", layout)
        want = ke.animation.load_articulation_motion_npz(alone.converted[0].output, layout)
        np.testing.assert_array_equal(got.q, want.q)
        np.testing.assert_array_equal(got.qd, want.qd)
        scales.append(got.metadata["retarget_scale"])
    assert abs(scales[1] * 1.1 - scales[0]) < 1e-6  # the second clip was really on another skeleton


def test_resample_gathers_frames_on_source_frames(walk):
    """120 -> 30 fps (every frame on a source frame) and 120 -> 50 fps (some on, most between) against
    ``quat_slerp`` at every frame, as resample computed them before: to float32 rounding."""
    clip = walk[:240]
    for fps in (30.0, 50.0, 120.0):
        got = clip.resample(fps)
        n = got.num_frames
        t = np.arange(n) * (clip.fps / fps)
        i0 = np.minimum(np.floor(t).astype(np.int64), clip.num_frames - 1)
        i1 = np.minimum(i0 + 1, clip.num_frames - 1)
        a = (t - i0).astype(np.float32)
        want = R.quat_slerp(clip.local_rotation[i0], clip.local_rotation[i1], a[:, None])
        assert got.local_rotation.dtype == clip.local_rotation.dtype
        np.testing.assert_allclose(got.local_rotation, want, atol=2e-7)
        root = clip.root_translation[i0] + (clip.root_translation[i1] - clip.root_translation[i0]) * a[:, None]
        np.testing.assert_allclose(got.root_translation, root, atol=1e-6)
        on = a == 0
        np.testing.assert_array_equal(got.local_rotation[on], clip.local_rotation[i0[on]])


def test_named_configuration_lookup_is_kept_and_still_refuses_unknown_names():
    """A shipped name resolves to its file once and gives the kept configuration; an unknown name still raises
    naming the shipped configurations, also after a known one was looked up."""
    a = sk._named_config(CONFIG)
    assert sk._named_config(CONFIG) is a and a.name == CONFIG
    with pytest.raises(ke.errors.UnknownNameError, match=CONFIG):
        sk._named_config("no_such_configuration")
