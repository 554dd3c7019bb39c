"""Every shared walk and hop, whole (or the hop crops), on the Unitree G1 and on dm_control's CMU humanoid with its
tracking walker's effort limits: ``ok`` with ``validate``'s defaults, no root assistance, each verdict and error
pinned (docs/verdicts.md, "The models' own motors"). Opt-in: together about 32 CPU minutes on one thread, too
slow beside the rest of CI; ``KANGENGINE_TEST_WHOLE_CLIPS=1 pytest tests/test_verdicts_whole.py`` runs them.

The cheap pins of the same clips (02_01 whole on both models, the first 1.5 s of the FBX walks, the G1's one hop)
are in ``tests/test_tracking_verdicts.py``, ``tests/test_verdicts_clips.py`` and ``tests/test_sampling.py``.
"""

from __future__ import annotations

import os

import pytest
from conftest import cmu_humanoid, cmu_tracking_efforts, data_file, free_root_model

import kangengine as ke
from kangengine.sim import Verdict

pytestmark = pytest.mark.skipif(
    os.environ.get("KANGENGINE_TEST_WHOLE_CLIPS") != "1",
    reason="whole-clip verdicts take about 32 CPU minutes: set KANGENGINE_TEST_WHOLE_CLIPS=1",
)

SOURCES = {
    "02_01": "bvh/cmu/02_01_cgspeed_walk.bvh",
    "07_01": "fbx/07_01_cmu.fbx",
    "08_02": "fbx/08_02_cmu.fbx",
    "131_01": "bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh",
    "01_01": "bvh/cmu/01_01_cgspeed_hops_long.bvh",
}
G1_CONFIG = {"07_01": "cmu_fbx_to_g1", "08_02": "cmu_fbx_to_g1"}  # the BVH releases: cmu_bvh_to_g1
CMU_CONFIG = {
    "07_01": "cmu_fbx_to_cmu_humanoid",
    "08_02": "cmu_fbx_to_cmu_humanoid",
    "131_01": "cmu_3dsmax_bvh_to_cmu_humanoid",
}  # the cgspeed BVH: cmu_bvh_to_cmu_humanoid

# (model, clip, crop in s or None) -> mean body error measured (m); pinned: ok, and at most 1 cm worse (under 5 cm)
MEASURED = {
    ("g1", "02_01", None): 0.0233,
    ("g1", "07_01", None): 0.0226,
    ("g1", "08_02", None): 0.0450,
    ("g1", "131_01", None): 0.0295,
    ("g1", "01_01", (3.0, 6.0)): 0.0377,
    ("cmu", "07_01", None): 0.0378,
    ("cmu", "08_02", None): 0.0344,
    ("cmu", "131_01", None): 0.0440,
    ("cmu", "01_01", (3.2, 4.5)): 0.0421,
    ("cmu", "01_01", (3.0, 6.0)): 0.0495,
}


@pytest.fixture(scope="module")
def models():
    from kangengine.data import G1_MJCF, data_path

    desc, layout, cmu = cmu_humanoid(effort_limit=cmu_tracking_efforts())
    _, g1 = free_root_model(ke.asset.MJCFLoader.load(data_path(G1_MJCF)))
    return {"g1": g1, "cmu": (desc, layout, cmu)}


def _motion(models, robot, clip, crop):
    source = ke.pipelines.load_motion(data_file(SOURCES[clip]))
    if robot == "g1":
        motion = ke.retarget.retarget_to_robot(source, G1_CONFIG.get(clip, "cmu_bvh_to_g1")).motion
    else:
        desc, layout, _ = models["cmu"]
        on_model = ke.retarget.retarget_motion(source, CMU_CONFIG.get(clip, "cmu_bvh_to_cmu_humanoid"), desc).motion
        mapper = ke.animation.ArticulationMotionMapper(layout)
        motion = mapper.to_articulation_motion(on_model, clamp_to_limits=True).motion
    if crop is None:
        return motion
    f = motion.fps()
    return motion[int(round(crop[0] * f)) : int(round(crop[1] * f))]


@pytest.mark.parametrize(
    "key",
    sorted(MEASURED, key=str),
    ids=lambda k: f"{k[0]}-{k[1]}-" + ("whole" if k[2] is None else f"{k[2][0]}-{k[2][1]}s"),
)
def test_whole_clip_is_ok_without_assistance(models, key, tmp_path):
    robot, clip, crop = key
    model = models["g1"] if robot == "g1" else models["cmu"][2]
    rep = ke.pipelines.validate(model, {clip: _motion(models, robot, clip, crop)}, out_dir=tmp_path, plots=False)
    rep = rep.reports[0]
    m = rep.metrics
    assert rep.verdict is Verdict.OK, [r.message for r in rep.reasons]
    assert [r.code for r in rep.reasons] == ["sampling", "sampling_fallback"]
    assert m["fell_at_s"] is None and m["simulated_fraction"] == 1.0
    assert not m["root_assist_used"] and m["assist_force_max_over_weight"] == 0.0
    assert m["body_error_mean_m"] < min(0.05, MEASURED[key] + 0.01)
    assert m["feedforward_over_limit_fraction"] < 0.05  # the motors can give what the motion needs
