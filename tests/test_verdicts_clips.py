"""Verdicts of the shared CMU clips beyond the 02_01 walk (docs/verdicts.md), pinned where they are cheap
enough for CI: the first 1.5 s of the FBX walks that are ``ok`` on the G1 (the sampling search after the PD
tracker falls, no root assistance, ``validate``'s defaults), 08_02's first 1.5 s on the CMU humanoid with
dm_control's tracking walker's effort limits (feet planted, within 5 cm, ``ok``), 08_02 whole passing the
reference-side rules once its toe glitch is corrected, and the clips whose references are rejected before any
search, each with its reason.

Clips (``../shared/data``): CMU 07_01 and 08_02 (walks, poselib FBX), 131_01 (the cgspeed 3dsMax-friendly BVH,
"start, walk, stop"), 002_03 (a jog on the iClone Character Creator rig), converted with the shipped
configurations onto the Unitree G1 (``cmu_fbx_to_g1``, ``cmu_bvh_to_g1``, ``cmu_iclone_bvh_to_g1``) and onto
dm_control's CMU humanoid (``cmu_fbx_to_cmu_humanoid``, ``cmu_iclone_bvh_to_cmu_humanoid``). The oracles are
outside the tracker: the source files themselves (the iClone run's pelvis height, the 08_02 FBX's toe
rotation between two frames) and the rules' thresholds.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cmu_humanoid, cmu_tracking_efforts, data_file, free_root_model

import kangengine as ke
from kangengine import rotations as R
from kangengine.sim import TrackingSettings, Verdict

CLIPS = {
    "07_01": "fbx/07_01_cmu.fbx",
    "08_02": "fbx/08_02_cmu.fbx",
    "131_01": "bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh",
    "002_03": "bvh/cmu/002_03_iclone_cc_run.bvh",
}
G1_CONFIG = {
    "07_01": "cmu_fbx_to_g1",
    "08_02": "cmu_fbx_to_g1",
    "131_01": "cmu_bvh_to_g1",
    "002_03": "cmu_iclone_bvh_to_g1",
}
CMU_CONFIG = {"08_02": "cmu_fbx_to_cmu_humanoid", "002_03": "cmu_iclone_bvh_to_cmu_humanoid"}


def _source(clip):
    return ke.pipelines.load_motion(data_file(CLIPS[clip]))


@pytest.fixture(scope="module")
def g1():
    from kangengine.data import G1_MJCF, data_path

    return free_root_model(ke.asset.MJCFLoader.load(data_path(G1_MJCF)))


@pytest.fixture(scope="module")
def cmu():
    return cmu_humanoid(effort_limit=cmu_tracking_efforts())  # dm_control's tracking walker's (docs/verdicts.md)


def _validate(model, name, motion, tmp_path):
    res = ke.pipelines.validate(model, {name: motion}, out_dir=tmp_path, plots=False)
    assert not res.skipped, res.skipped
    return res.reports[0]


def _on_g1(clip, seconds=None):
    motion = ke.retarget.retarget_to_robot(_source(clip), G1_CONFIG[clip]).motion
    return motion if seconds is None else motion[: int(round(seconds * motion.fps()))]


def _on_cmu(cmu, clip):
    desc, layout, _ = cmu
    cfg = CMU_CONFIG[clip]
    if cfg in ke.retarget.list_robot_configs():
        return ke.retarget.retarget_to_robot(_source(clip), cfg).motion
    on_model = ke.retarget.retarget_motion(_source(clip), cfg, desc).motion
    return ke.animation.ArticulationMotionMapper(layout).to_articulation_motion(on_model, clamp_to_limits=True).motion


# -- feasible walks: ok, by the search, no root assistance -----------------------------------------------------

# clip -> measured mean body error (m) of its first 1.5 s on the G1 (docs/verdicts.md), for the bound below
OK_ON_G1 = {"07_01": 0.034, "08_02": 0.040}
# 131_01's first 1.5 s (ok, 3.0 cm when measured) are not pinned: the kick that starts at 1.25 s is cut at the
# crop's end, and with the G1 retarget being tuned it went to warn (impossible_dynamics on 6.7 % of frames)


@pytest.mark.parametrize("clip", sorted(OK_ON_G1))
def test_first_seconds_of_the_walks_are_ok_on_the_g1(g1, clip, tmp_path):
    _, model = g1
    rep = _validate(model, f"{clip}_g1", _on_g1(clip, 1.5), tmp_path)
    m = rep.metrics
    assert rep.verdict is Verdict.OK, [r.message for r in rep.reasons]
    assert [r.code for r in rep.reasons] == ["sampling", "sampling_fallback"]
    assert m["body_error_mean_m"] < 0.05 and m["fell_at_s"] is None and m["simulated_fraction"] == 1.0
    assert not m["root_assist_used"] and m["assist_force_max_over_weight"] == 0.0
    assert m["body_error_mean_m"] < OK_ON_G1[clip] + 0.01
    # the PD tracker alone falls (0.80 and 0.85 s); the search spent at least its samples on every step
    assert m["pd_fell_at_s"] is not None and m["pd_fell_at_s"] < 1.5
    assert m["search_env_steps"] >= 256 * (m["steps"] - 1)


def test_first_seconds_of_08_02_on_the_cmu_humanoid_are_ok(cmu, tmp_path):
    """08_02's first 1.5 s by name map onto the CMU humanoid with dm_control's tracking walker's effort limits
    (feet planted, toe glitch corrected): the PD tracker falls (1.33 s when measured), the search holds it to its
    end within 5 cm (4.4 cm measured) with no fall, no assistance, no skating and no impossible frame, and the
    feed-forward stays within the limits: ``ok``. On the suite model's own motors the same crop is ``warn``
    (``effort_over_limit``: the ankles' 20 N m, docs/verdicts.md)."""
    motion = _on_cmu(cmu, "08_02")
    rep = _validate(cmu[2], "08_02_cmu_15", motion[: int(round(1.5 * motion.fps()))], tmp_path)
    m = rep.metrics
    codes = [r.code for r in rep.reasons]
    assert rep.verdict is Verdict.OK, [r.message for r in rep.reasons]
    assert codes == ["sampling", "sampling_fallback"], codes
    assert m["feedforward_over_limit_fraction"] < 0.05
    assert m["body_error_mean_m"] < 0.05 and m["fell_at_s"] is None and m["simulated_fraction"] == 1.0
    assert not m["root_assist_used"] and m["assist_force_max_over_weight"] == 0.0
    assert m["skating_fraction"] < 0.05 and m["impossible_fraction"] == 0.0
    assert m["pd_fell_at_s"] is not None and m["search_env_steps"] >= 256 * (m["steps"] - 1)


# -- references rejected before any search -----------------------------------------------------------------------


def test_iclone_run_is_rejected_its_pelvis_never_leaves_one_height(g1, cmu, tmp_path):
    """002_03 on the iClone rig: the converter locked the pelvis height (1.0521 m in all 86 frames, while a jog
    rises and falls a few cm every step) and its feet float 7-14 cm above any floor. A body that leaves the
    ground and does not fall cannot be pushed by the ground: ``impossible_dynamics`` (and ``foot_skating``),
    on both models, with no search spent."""
    src = _source("002_03")
    hip = src.global_translation[:, src.tree.index("CC_Base_Hip"), 2]
    assert float(np.ptp(hip)) < 1e-5  # 0.01 mm: float32 rounding of one number
    _, g1_model = g1
    for model, motion, name in ((g1_model, _on_g1("002_03"), "g1"), (cmu[2], _on_cmu(cmu, "002_03"), "cmu")):
        rep = _validate(model, f"002_03_{name}", motion, tmp_path / name)
        rejected = [r.code for r in rep.reasons if r.severity.value == "reject"]
        assert rep.verdict is Verdict.REJECT and rejected[:2] == ["impossible_dynamics", "foot_skating"], rejected
        impossible = next(r for r in rep.reasons if r.code == "impossible_dynamics")
        assert impossible.value > 0.3 and rep.metrics["impossible_fraction"] > 0.3
        assert rep.metrics["controller"] == "pd" and rep.metrics["search_env_steps"] == 0


def test_08_02_fbx_on_the_cmu_humanoid_passes_the_reference_rules_once_its_toe_glitch_is_corrected(cmu, tmp_path):
    """The 08_02 FBX turns its right toe by 0.51 rad between frames 281 and 282 (61.5 rad/s at 120 fps, the clip's
    99th percentile under 40 rad/s): a capture glitch ``cmu_fbx_to_cmu_humanoid`` now corrects (the recorded
    jump out of frame 281 is the source's own), so ``joint_discontinuity`` (60 rad/s) no longer rejects the clip,
    and with the feet planted neither ``impossible_dynamics`` nor ``foot_skating`` fires on the whole clip (before:
    21.5 % and 34 % of its first 2.25 s). The PD tracker alone, no search (the search's verdict is measured in
    docs/verdicts.md)."""
    src = _source("08_02")
    toe = src.local_rotation[:, src.tree.index("RightToeBase")].astype(np.float64)
    step = R.quat_multiply(R.quat_conjugate(toe[:-1]), toe[1:])
    speed = 2.0 * np.arccos(np.clip(np.abs(step[:, 0]), 0.0, 1.0)) * src.fps
    assert int(speed.argmax()) == 281 and 60.0 < speed.max() < 63.0 and np.percentile(speed, 99) < 40.0
    motion = _on_cmu(cmu, "08_02")
    fixed = [k for k in motion.metadata["retarget"]["spikes_corrected"] if k["joint"] == "RightToeBase"]
    assert [k["source_frame"] for k in fixed] == [276, 281]
    assert fixed[1]["speed_out_rad_s"] == pytest.approx(speed.max(), rel=1e-3)
    res = ke.pipelines.validate(
        cmu[2], {"08_02_cmu": motion}, out_dir=tmp_path, plots=False, settings=TrackingSettings(sampling_fallback=False)
    )
    rep = res.reports[0]
    codes = {r.code for r in rep.reasons}
    assert not codes & {"joint_discontinuity", "impossible_dynamics", "foot_skating", "floating"}, codes
    assert rep.metrics["skating_fraction"] < 0.05 and rep.metrics["impossible_fraction"] < 0.02
    assert rep.metrics["reference_penetration_max_m"] < 0.005 and rep.metrics["search_env_steps"] == 0
