"""Tracking mapped motions in the simulator and validating them: a real CMU walk (BVH -> retarget -> mapper
-> CMU humanoid) is tracked within 5 cm and passes; the same walk with a root jump, lifted into the air or
sliding on still legs is rejected for that reason; the residual wrench of a free fall is zero and of a
hovering pose equals its weight and its moment (analytic); reports are byte-identical across runs,
resumable, and list bad clips; clips of different lengths and rates share one batch."""

from __future__ import annotations

import csv
import json
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import cmu_tracking_efforts, data_file, infeasible_variants

import kangengine as ke
from kangengine import rotations as R
from kangengine.errors import ShapeError, UnknownNameError
from kangengine.sim import TrackingSettings, ValidationThresholds, Verdict

# The settings that track the real walk: see docs/tracking.md ("Tracking a real walk").
WALK_SETTINGS = TrackingSettings(root_assist_frequency_hz=1.0)


def _model(desc, dtype=torch.float32, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # geoms of unsupported types are not simulated (none on this model)
        return ke.sim.Model.from_desc(desc, dtype=dtype, **kw)


@pytest.fixture(scope="module")
def cmu_desc():
    return ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))


@pytest.fixture(scope="module")
def layout(cmu_desc):
    return ke.animation.ArticulationCoordinateLayout.from_data(data=cmu_desc, free_root=True)


@pytest.fixture(scope="module")
def model(cmu_desc, layout):
    # dm_control's tracking walker's effort limits: the suite motors are too weak for the walk (docs/verdicts.md)
    return _model(cmu_desc, effort_limit=cmu_tracking_efforts())


@pytest.fixture(scope="module")
def walk(cmu_desc, layout):
    """CMU 02_01 (walk, 343 frames at 120 fps) retargeted and mapped onto the CMU humanoid."""
    bvh = ke.io.load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))
    on_robot = ke.retarget.retarget_motion(bvh, "cmu_bvh_to_cmu_humanoid", cmu_desc).motion
    mapper = ke.animation.ArticulationMotionMapper(layout)
    return mapper.to_articulation_motion(on_robot, clamp_to_limits=True).motion


@pytest.fixture(scope="module")
def broken(walk, layout):
    """The walk with a 0.5 m sideways root jump halfway, lifted 0.3 m, and a stance pose whose root slides
    forward at walking speed while the legs stand still."""
    v = infeasible_variants(walk, layout)
    return {"jump": v["teleport"], "lifted": v["lifted"], "skating": v["skating"]}


@pytest.fixture(scope="module")
def validated(model, walk, broken, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    clips = {"walk": walk, **broken, "one_frame": walk[:1]}
    return ke.pipelines.validate(model, clips, out_dir=out, settings=WALK_SETTINGS)


def test_real_cmu_walk_is_tracked_within_5cm_and_ok(validated):
    rep = validated.report("walk")
    assert rep.verdict is Verdict.OK, [r.message for r in rep.reasons]
    m = rep.metrics
    assert m["body_error_mean_m"] < 0.05
    assert m["body_error_peak_m"] < 0.1
    assert m["fell_at_s"] is None
    # the assistance is reported, and small: what the verdict accepted
    assert m["root_assist_used"] is True
    assert m["assist_force_mean_over_weight"] < ValidationThresholds().assist_force_ok
    assert [r.code for r in rep.reasons] == ["root_assistance"] and rep.reasons[0].severity.value == "info"
    # a real walk stands on the ground and does not skate or float
    assert m["longest_airborne_s"] == 0.0 and m["skating_fraction"] < 0.15
    assert m["contact_fraction"] > 0.95


@pytest.mark.parametrize(
    ("clip", "reason"), [("jump", "root_discontinuity"), ("lifted", "floating"), ("skating", "foot_skating")]
)
def test_broken_walks_are_rejected_for_the_matching_reason(validated, clip, reason):
    rep = validated.report(clip)
    assert rep.verdict is Verdict.REJECT
    assert rep.reason_codes[0] == reason, rep.reason_codes
    first = rep.reasons[0]
    assert first.severity.value == "reject" and first.value > first.threshold


def test_broken_walk_details(validated):
    jump = validated.report("jump")
    assert "170" in jump.reasons[0].message and jump.metrics["root_speed_max_mps"] > 50  # 0.5 m in 1/120 s
    lifted = validated.report("lifted").metrics
    assert lifted["airborne_fraction"] == 1.0 and lifted["impossible_fraction"] == 1.0
    assert lifted["body_error_mean_m"] > 0.2  # the simulated body drops to the floor
    skating = validated.report("skating").metrics
    assert skating["support_speed_median_mps"] == pytest.approx(1.0, abs=0.02)


def test_files_summary_and_skipped_clips(validated):
    out = validated.out_dir
    assert [s.name for s in validated.skipped] == ["one_frame"]
    assert "at least one step" in validated.skipped[0].error
    rows = list(csv.DictReader(open(validated.summary_path)))
    assert [r["clip"] for r in rows] == sorted(["walk", "jump", "lifted", "skating", "one_frame"])
    by = {r["clip"]: r for r in rows}
    assert by["walk"]["verdict"] == "ok" and by["one_frame"]["verdict"] == "skipped"
    assert by["lifted"]["reasons"].split(";")[0] == "floating"
    for name in ("walk", "jump", "lifted", "skating"):
        assert validated.report(name).report_path.endswith(f"{name}.json")
        d = json.loads(open(validated.report(name).report_path).read())
        assert d["format"] == "kangengine.validation_report" and d["clip"] == name
        assert d["verdict"] == validated.report(name).verdict.value
        png = open(f"{out}/{name}.png", "rb").read(8)
        assert png == b"\x89PNG\r\n\x1a\n"
    assert validated.counts() == {"ok": 1, "warn": 0, "reject": 3, "skipped": 1}


def test_reports_are_byte_identical_and_resumable(model, walk, tmp_path):
    clip = walk[:48]  # 0.4 s
    a = ke.pipelines.validate(model, {"crop": clip}, out_dir=tmp_path / "a", plots=False)
    ke.pipelines.validate(model, {"crop": clip}, out_dir=tmp_path / "b", plots=False)
    ja, jb = (tmp_path / "a" / "crop.json").read_bytes(), (tmp_path / "b" / "crop.json").read_bytes()
    assert ja == jb
    assert (tmp_path / "a" / "summary.csv").read_bytes() == (tmp_path / "b" / "summary.csv").read_bytes()
    assert b"/tmp" not in ja and b"time" not in ja.lower().replace(b"timestep", b"")
    # resume: the same input is not recomputed; a changed setting is
    c = ke.pipelines.validate(model, {"crop": clip}, out_dir=tmp_path / "a", plots=False)
    assert c.reports[0].resumed and c.simulated_seconds == 0.0
    assert c.reports[0].verdict == a.reports[0].verdict and c.reports[0].metrics == json.loads(ja)["metrics"]
    d = ke.pipelines.validate(
        model, {"crop": clip}, out_dir=tmp_path / "a", plots=False, thresholds=ValidationThresholds(body_error_ok=0.04)
    )
    assert not d.reports[0].resumed and d.simulated_seconds > 0


def test_clips_of_different_lengths_and_rates_share_a_batch(model, walk, layout):
    a = walk[:72]  # 0.6 s at 120 fps
    b = walk[:72:4]  # the same at 30 fps
    c = walk[:36]  # 0.3 s
    res = ke.sim.track(model, [a, b, c], settings=WALK_SETTINGS, names=["a", "b", "c"])
    steps = [int(np.floor(m.duration / WALK_SETTINGS.dt + 1e-6)) + 1 for m in (a, b, c)]  # fps 120.005, not 120
    np.testing.assert_array_equal(res.clip_step_count, steps)
    k = steps[2]
    assert res.valid.shape == (3, max(steps)) and not res.valid[2, k:].any() and res.valid[2, :k].all()
    assert (res.body_error_mean[2, k:] == 0).all()
    err = [res.body_error_mean[i][res.valid[i]].mean() for i in range(3)]
    assert max(err) < 0.05
    # the 30 fps clip is the 120 fps clip sampled coarser: same reference on the grid up to interpolation
    assert abs(err[0] - err[1]) < 0.01


def _hover_and_fall(layout, fps=64.0, seconds=1.0, g=8.0):
    """A pose held 3 m above the ground, and the same pose in a ballistic flight (constant horizontal
    velocity, free fall at ``g``). With fps 64 and g 8 every coordinate is exact in float32."""
    q0 = layout.neutral()
    q0[2] = 3.0  # far from the ground
    n = int(seconds * fps) + 1
    t = np.arange(n) / fps
    hover = np.repeat(q0[None], n, axis=0)
    fall = hover.copy()
    fall[:, 0] += 0.75 * t
    fall[:, 2] -= 0.5 * g * t * t
    mk = lambda q: ke.animation.ArticulationMotion(q, np.zeros((n, layout.nv)), fps, layout.model_signature)
    return mk(hover), mk(fall)


def test_residual_wrench_of_free_fall_is_zero_and_of_hovering_is_the_weight(cmu_desc, layout):
    model = _model(cmu_desc, dtype=torch.float64, gravity=[0.0, 0.0, -8.0])
    hover, fall = _hover_and_fall(layout)
    settings = TrackingSettings(dt=1 / 64, smoothing_s=0.0)
    ref = ke.sim.prepare_reference(model, [hover, fall], settings)
    n = int(ref.clip_step_count[0])
    w_hover, w_fall = ref.residual_wrench[:n].numpy(), ref.residual_wrench[n : 2 * n].numpy()
    mg = model.total_mass * 8.0
    # free fall: the motion needs nothing from outside
    np.testing.assert_allclose(w_fall, 0.0, atol=1e-9 * mg)
    # hovering: the weight, straight up, and its moment about the root origin (analytic, from the COM)
    q0 = torch.as_tensor(hover.q[:1], dtype=torch.float64)
    pos, quat = ke.sim.link_transforms(model, q0)
    com_b = pos[0] + R.quat_rotate(quat[0], model.body_com)
    com = (model.body_mass[:, None] * com_b).sum(0) / model.body_mass.sum()
    force = np.array([0.0, 0.0, mg])
    torque = np.cross((com - pos[0, 0]).numpy(), force)
    np.testing.assert_allclose(w_hover[:, :3], np.broadcast_to(force, (n, 3)), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(w_hover[:, 3:], np.broadcast_to(torque, (n, 3)), rtol=1e-9, atol=1e-9)
    # no contact point near the ground: nothing is explained by contact
    np.testing.assert_allclose(ref.unsupported_wrench[:n].numpy(), w_hover, atol=1e-9)
    # the default smoothing (ends continued by a constant-acceleration fit) keeps both exact, ends included
    smooth = ke.sim.prepare_reference(model, [hover, fall], TrackingSettings(dt=1 / 64))
    np.testing.assert_allclose(smooth.residual_wrench[n : 2 * n].numpy(), 0.0, atol=1e-9 * mg)
    np.testing.assert_allclose(smooth.residual_wrench[:n].numpy(), w_hover, rtol=1e-9, atol=1e-9)


def test_hovering_and_falling_through_track_and_validate(model, layout):
    hover, fall = _hover_and_fall(layout, fps=60.0, seconds=0.6, g=9.81)  # the model's gravity
    res = ke.sim.track(model, [hover, fall], settings=TrackingSettings(smoothing_s=0.0), names=["hover", "fall"])
    v = res.valid[0]
    np.testing.assert_allclose(res.residual_force[0][v], res.weight, rtol=1e-4)
    assert res.residual_force[1][v].max() < 2e-3 * res.weight  # float32 q and model
    # the simulated body falls in both; only the falling reference agrees with it
    assert res.body_error_mean[0][res.valid[0]][-1] > 0.5
    # the energy-corrected step keeps E = T + V exact with the state's velocity, a backward difference
    # (the mean over the last step), so a ballistic flight moves 0.5 g h^2 too far per step: O(h), below
    # g h t at time t (0.098 m at 0.6 s); plain backward Euler reproduced the parabola to round-off
    t = np.arange(res.valid.shape[1]) * res.dt
    err = res.body_error_mean[1][res.valid[1]]
    assert (err <= 9.81 * res.dt * t[res.valid[1]] + 1e-3).all()


def test_root_assistance_is_off_by_default_and_gains(model, layout):
    s = TrackingSettings()
    assert s.root_assist_frequency_hz == 0.0
    kp, kd = ke.sim.drive_gains(model, s)
    assert (kp[:6] == 0).all() and (kd[:6] == 0).all() and (kp[6:] > 0).all()
    kp2, _ = ke.sim.drive_gains(model, TrackingSettings(root_assist_frequency_hz=1.0))
    assert kp2[2] == 0 and (kp2[[0, 1, 3, 4, 5]] > 0).all()  # never holds the body up by default
    # kp_i = I_i w^2 with I_i the whole body's inertia about the DOF's axis: parallel-axis theorem by hand
    q0 = torch.as_tensor(layout.neutral(), dtype=model.dtype)[None]
    pos, quat = ke.sim.link_transforms(model, q0)
    rot = R.quat_to_matrix(quat[0]).double()
    com = (pos[0] + R.quat_rotate(quat[0], model.body_com)).double()
    inertia_w = rot @ model.body_inertia.double() @ rot.transpose(-1, -2)
    jac = ke.sim.link_jacobians(model, q0)[0].double()
    w = 2 * math.pi * s.drive_frequency_hz
    for name in ("lfemurrx", "ltibiarx", "lfootrx", "rhumerusrz"):
        d = layout.dof_names.index(name)
        b = int(model.dof_body[d])
        axis = jac[b, 3:, d]
        anchor_v = jac[b, :3, d]  # velocity of the link origin for a unit rate: axis x (origin - anchor)
        point = pos[0, b].double() + torch.linalg.cross(axis, anchor_v)  # a point on the (unit) axis
        r = com - point
        perp = r - (r @ axis)[:, None] * axis
        i_axis = (model.body_mass.double() * (perp * perp).sum(-1)).sum() + (axis @ inertia_w @ axis).sum()
        expected = (i_axis + model.dof_armature[d].double()) * w * w
        assert float(kp[d]) == pytest.approx(float(expected), rel=1e-4), name


def test_settings_and_input_errors(model, walk, layout):
    with pytest.raises(ShapeError, match="dt"):
        TrackingSettings(dt=0.0)
    with pytest.raises(UnknownNameError, match="lfemurrx"):
        ke.sim.drive_gains(model, TrackingSettings(drive_stiffness={"lfemur_rx": 10.0}))
    with pytest.raises(ShapeError, match="drive_damping"):
        ke.sim.drive_gains(model, TrackingSettings(drive_damping=[1.0, 2.0]))
    kp, _ = ke.sim.drive_gains(model, TrackingSettings(drive_stiffness={"lfemurrx": 10.0, "ltibiarx": 5.0}))
    assert float(kp[layout.dof_names.index("lfemurrx")]) == 10.0
    other = ke.animation.ArticulationMotion(walk.q, walk.qd, walk.fps(), "0" * 16)
    with pytest.raises(ke.errors.LayoutMismatch):
        ke.sim.track(model, [other])
    res = ke.pipelines.validate(model, {"other": other, "text": "not a motion"})
    assert [s.name for s in res.skipped] == ["other", "text"] and res.reports == ()
    with pytest.raises(ke.errors.DuplicateNameError):
        ke.pipelines.validate(model, [walk, walk], names=["a/b", "a_b"], out_dir=None)


def test_cli_validate_writes_reports(model, walk, layout, tmp_path, capsys):
    from kangengine.cli import main

    clip = tmp_path / "crop.npz"
    ke.animation.save_articulation_motion_npz(clip, walk[:60], layout=layout)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    rc = main(
        [
            "validate",
            str(data_file("mjcf/dm_control/humanoid_CMU.xml")),
            str(clip),
            str(bad),
            "--out",
            str(tmp_path / "out"),
            "--no-plots",
            "--root-assist-hz",
            "1",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1  # a clip could not be validated (issue 14: exit status 1 when any clip failed)
    assert (
        out["counts"]["skipped"] == 1 and out["skipped"][0]["clip"] == "bad" and "bad.npz" in out["skipped"][0]["error"]
    )
    d = json.loads((tmp_path / "out" / "crop.json").read_text())
    assert d["settings"]["root_assist_frequency_hz"] == 1.0
    rows = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert {r["clip"] for r in rows} == {"crop", "bad"}


def test_fixed_base_model_is_tracked_without_support_rules():
    """A fixed-base model (dm_control cartpole: slide + hinge) hangs from the world: no residual wrench, no
    floating or skating rules, and a smooth motion is tracked exactly enough to pass."""
    desc = ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/cartpole.xml"))
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=False)
    model = _model(desc, dtype=torch.float64, free_root=False)
    t = np.arange(61) / 60
    q = np.stack([0.3 * np.sin(2 * t), 0.5 * np.sin(3 * t)], axis=1)
    clip = ke.animation.ArticulationMotion(q, np.zeros_like(q), 60.0, layout.model_signature)
    res = ke.pipelines.validate(model, {"cart": clip})
    rep = res.reports[0]
    assert rep.verdict is Verdict.OK, rep.reason_codes
    assert rep.metrics["body_error_mean_m"] < 1e-3 and rep.metrics["residual_force_max_over_weight"] == 0.0
    assert rep.metrics["longest_airborne_s"] > 0.5  # measured, but not a reason for a fixed base


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_matches_cpu(cmu_desc, walk):
    clip = walk[:60]
    cpu = _model(cmu_desc, dtype=torch.float64)
    gpu = _model(cmu_desc, dtype=torch.float64, device="cuda")
    a = ke.sim.track(cpu, [clip], settings=WALK_SETTINGS)
    b = ke.sim.track(gpu, [clip], settings=WALK_SETTINGS)
    np.testing.assert_allclose(a.body_error_mean, b.body_error_mean, atol=1e-4)
    np.testing.assert_allclose(a.residual_force, b.residual_force, rtol=1e-6, atol=1e-6)


def _finite_json(path):
    """The report at ``path``, parsed so that any NaN or infinity in the file fails."""

    def refuse(token):
        raise AssertionError(f"{path}: non-finite number {token} in the report")

    return json.loads(open(path).read(), parse_constant=refuse)


def test_diverging_clip_is_rejected_and_the_others_reports_are_byte_identical(model, walk, tmp_path):
    """A clip whose knee target jumps by 1e8 rad makes its world diverge: that clip is rejected with
    ``diverged`` first, its report stays finite and covers only the frames before; the other clips of the
    batch give byte-identical reports with and without it (and wherever they sit in the batch)."""
    a, b = walk[:90], walk[30:100]
    q = walk.q[:80].copy()
    q[40:, 10] += 1e8
    bad = ke.animation.ArticulationMotion(q, walk.qd[:80], walk.fps(), walk.layout_signature)
    alone = ke.pipelines.validate(
        model, {"a": a, "b": b}, out_dir=tmp_path / "alone", settings=WALK_SETTINGS, plots=False
    )
    mixed = ke.pipelines.validate(
        model, {"a": a, "bad": bad, "b": b}, out_dir=tmp_path / "mixed", settings=WALK_SETTINGS, plots=False
    )
    for name in ("a", "b"):
        assert (tmp_path / "alone" / f"{name}.json").read_bytes() == (tmp_path / "mixed" / f"{name}.json").read_bytes()
        assert alone.report(name).verdict is Verdict.OK
    rep = mixed.report("bad")
    assert rep.verdict is Verdict.REJECT and rep.reason_codes[0] == "diverged", rep.reason_codes
    d = _finite_json(tmp_path / "mixed" / "bad.json")
    m = d["metrics"]
    assert m["diverged"] is True and 0 < m["diverged_at_s"] < bad.duration
    assert 0 < m["simulated_fraction"] < 0.6 and m["body_error_peak_m"] < 1.0  # nothing from after it
    # in the result: the diverged world stopped; what was simulated before it is finite
    res = ke.sim.track(model, [bad, a], settings=WALK_SETTINGS, names=["bad", "a"])
    assert res.diverged.tolist() == [True, False]
    n = int(res.stop_step[0]) + 1
    assert res.simulated[0, :n].all() and not res.simulated[0, n:].any()
    assert np.isfinite(res.body_error).all() and res.body_error_mean[0].max() < 1.0
    # clips in another order and company: bit-identical per clip (batch-invariant stepping)
    res2 = ke.sim.track(model, [b, a], settings=WALK_SETTINGS, names=["b", "a"])
    k = int(res.clip_step_count[1])
    np.testing.assert_array_equal(res.body_error[1, :k], res2.body_error[1, :k])
    np.testing.assert_array_equal(res.effort_ratio[1, :k], res2.effort_ratio[1, :k])


def test_fallen_clip_stops_early_and_frees_its_world(model, walk, layout, tmp_path):
    """A pose hovering 1 m above the ground for 10 s: the tracker falls within half a second and its world
    stops there. Measured in simulator steps it costs under 5% of simulating the whole clip (one step per
    frame after the first, as the walk that does not fall shows); with one world, the next clip takes the
    freed world, and its report is byte-identical to validating it alone. The report still covers the
    whole clip."""
    q = np.repeat(walk.q[:1], 601, axis=0)
    q[:, 2] += 1.0
    hover = ke.animation.ArticulationMotion(q, np.zeros((601, layout.nv)), 60.0, layout.model_signature)
    stop = ke.sim.track(model, [hover])
    steps = int(stop.clip_step_count[0])
    assert steps == 601  # simulating the whole clip takes steps - 1 = 600 (checked on the walk below)
    assert int(stop.step_count[0]) < 0.05 * (steps - 1), stop.step_count
    fell = int(stop.fell_step[0])
    assert 0 < fell == int(stop.stop_step[0]) and stop.simulated[0].sum() == fell + 1
    # the frames after the fall keep the fallen state: the reference is still measured against it
    assert stop.valid[0].all() and (stop.body_error_mean[0, fell:] >= stop.body_error_mean[0, fell] - 1e-6).all()
    crop = walk[:60]
    one = ke.pipelines.validate(
        model,
        {"hover": hover, "walk": crop},
        out_dir=tmp_path / "one",
        settings=WALK_SETTINGS,
        batch_size=1,
        plots=False,
    )
    ke.pipelines.validate(model, {"walk": crop}, out_dir=tmp_path / "alone", settings=WALK_SETTINGS, plots=False)
    assert (tmp_path / "one" / "walk.json").read_bytes() == (tmp_path / "alone" / "walk.json").read_bytes()
    walk_m = one.report("walk").metrics
    assert walk_m["simulator_steps"] == walk_m["steps"] - 1 and walk_m["simulated_fraction"] == 1.0
    rep = one.report("hover")
    assert rep.verdict is Verdict.REJECT and "fell" in rep.reason_codes
    m = _finite_json(tmp_path / "one" / "hover.json")["metrics"]
    assert m["duration_s"] == pytest.approx(10.0) and m["steps"] == 601
    assert m["fell_at_s"] == pytest.approx(m["simulated_until_s"]) and m["fell_at_s"] < 0.5
    assert m["simulated_fraction"] < 0.05 and m["simulator_steps"] < 30
    assert m["longest_airborne_s"] == pytest.approx(10.0, abs=0.02)  # the reference is judged in full
    assert "simulated up to" in next(r.message for r in rep.reasons if r.code == "fell")


def test_slowest_support_speed_is_the_min_norm_point_of_the_hull_against_scipy():
    """The slowest material point of a sole's hull: the convex hull's point nearest zero, against scipy's
    SLSQP on the simplex of the points on the ground (``inf`` where none is)."""
    from scipy.optimize import minimize

    from kangengine.sim.tracking import _slowest_support_speed

    rng = np.random.default_rng(3)
    vel, on = rng.normal(size=(150, 6, 2)), rng.random((150, 6)) < 0.6
    got = _slowest_support_speed(torch.tensor(vel), torch.tensor(on)).numpy()
    for k in range(vel.shape[0]):
        pts = vel[k][on[k]]
        if len(pts) == 0:
            assert math.isinf(got[k])
            continue
        w0 = np.full(len(pts), 1.0 / len(pts))
        res = minimize(
            lambda w, pts=pts: np.sum((w @ pts) ** 2),
            w0,
            bounds=[(0.0, 1.0)] * len(pts),
            constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert got[k] == pytest.approx(math.sqrt(max(res.fun, 0.0)), abs=1e-5)


def test_a_pose_turning_on_its_standing_foot_pivots_and_does_not_skate(model, walk, layout):
    """A stance pose turned at 5 rad/s about a vertical through a point of its standing foot's sole: the foot's
    lowest point moves faster than the skating speed, the point it turns about stands still, so the
    reference's contact speed is ~0; the same pose sliding at 1 m/s still skates (``broken``)."""
    from kangengine.sim.kinematics import link_transforms

    q0 = torch.as_tensor(walk.q[30:31], dtype=model.dtype)
    pos, quat = link_transforms(model, q0)
    pb = model.contact_point_body
    pts = pos[0, pb] + R.quat_rotate(quat[0, pb], model.contact_point_local)
    pts[:, 2] -= model.contact_radius
    h = pts[:, 2] - model.contact.ground_height
    foot = int(pb[torch.argmin(h)])
    near = (pb == foot) & (h < 0.03)
    assert int(near.sum()) >= 3
    low = pts[torch.argmin(h)]
    sole = pts[near]
    pivot = sole[torch.argmax(torch.linalg.vector_norm(sole[:, :2] - low[:2], dim=-1))].double().numpy()
    n, omega = int(walk.fps()), 5.0
    theta = np.arange(n) / walk.fps() * omega
    turn = R.quat_from_axis_angle(np.array([0.0, 0.0, 1.0]), theta)
    q = np.repeat(walk.q[30:31].astype(np.float64), n, axis=0)
    q[:, 3:7] = R.quat_multiply(turn, q[:, 3:7])
    off = q[:, :3] - np.array([pivot[0], pivot[1], 0.0])
    q[:, :3] = R.quat_rotate(turn, off) + np.array([pivot[0], pivot[1], 0.0])
    qd = ke.animation.ArticulationMotionMapper(layout).velocities(q.astype(np.float32), walk.fps())
    spin = ke.animation.ArticulationMotion(q.astype(np.float32), qd, walk.fps(), walk.layout_signature)
    ref = ke.sim.prepare_reference(model, [spin], TrackingSettings())
    slot = int(torch.nonzero(ref.contact_bodies == foot)[0, 0])
    inner = slice(2, ref.contact_speed.shape[0] - 2)
    lowest = float(np.linalg.norm(low[:2].double().numpy() - pivot[:2])) * omega
    assert lowest > 0.2  # the lowest point's own speed: the old measure called this skating
    assert float(ref.contact_speed[inner, slot].max()) < 0.02
