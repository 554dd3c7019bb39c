"""The verdict of a tracked clip: per-clip numbers (:func:`clip_metrics`) and the rules that turn them into
reasons and a verdict (``ok``, ``warn``, ``reject``).

Pure functions of a :class:`~kangengine.sim.TrackingResult`: no files. Each rule is one small function in
:data:`RULES`, in the order its reasons are listed; :func:`summarize` runs them all and
:func:`verdict_of` folds the reasons into a :class:`Verdict`. Report files, fingerprints and resume live in
:mod:`kangengine.pipelines.validate`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..animation.motion import ArticulationMotion
from .model import Model
from .tracking import TrackingResult

__all__ = [
    "Verdict",
    "Severity",
    "Reason",
    "ValidationThresholds",
    "ClipEvidence",
    "RULES",
    "TRACKER_CODES",
    "clip_metrics",
    "summarize",
    "verdict_of",
    "json_number",
    "json_clean",
]


class Verdict(str, enum.Enum):
    """Outcome of a clip: usable (``OK``), usable with caveats (``WARN``), not physically usable (``REJECT``)."""

    OK = "ok"
    WARN = "warn"
    REJECT = "reject"


class Severity(str, enum.Enum):
    """Weight of one :class:`Reason`: ``INFO`` does not change the verdict."""

    INFO = "info"
    WARN = "warn"
    REJECT = "reject"


@dataclass(frozen=True)
class Reason:
    """Why a clip got its verdict.

    Attributes:
        code: stable identifier (``floating``, ``foot_skating``, ``root_discontinuity``, ...; see
            ``docs/tracking.md``).
        severity: :class:`Severity`.
        message: one sentence with the numbers and where in the clip (seconds).
        value: the measured quantity; threshold: the threshold it was compared with (same unit).
    """

    code: str
    severity: Severity
    message: str
    value: float
    threshold: float

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "value": self.value,
            "threshold": self.threshold,
        }


@dataclass(frozen=True)
class ValidationThresholds:
    """Thresholds of the verdict rules (SI units; ``m g`` is the model's weight).

    Tracking:
        body_error_ok: m, mean body position error up to which tracking is ``ok`` (above: warn).
        body_error_reject: m, mean body error above which the clip is rejected.
        body_error_peak_reject: m, a frame whose mean body error exceeds this rejects the clip.
        fall_body_error: m, per-frame mean body error that counts as a fall.
        fall_root_height_ratio: the tracker fell when the simulated root is lower than this fraction of
            the reference root height.
    Reference (the motion itself, no simulation):
        max_root_speed: m/s, root speed between two frames of the clip above which it is a jump.
        max_root_angular_speed: rad/s, the same for the root rotation.
        max_joint_speed: rad/s (m/s), the same for any other DOF.
        near_ground: m, a contact point this close to the ground (or below) touches it.
        max_flight_s: s, longest plausible flight (no point near the ground); longer is floating.
        unsupported_force: fraction of ``m g``; unsupported_torque: m (torque / ``m g``): a frame whose
            residual wrench the contacts cannot explain by more than either is physically impossible.
        impossible_warn, impossible_reject: fraction of frames that are impossible.
        skate_height: m, a contact body whose lowest point is this close to the ground stands on it.
        skate_speed: m/s, horizontal speed above which the slowest standing body is skating.
        skate_lift_speed: m/s, a near-ground body whose lowest point rises or sinks faster than this is
            lifting off or touching down, not standing (a jump's take-off and landing frames).
        skate_warn, skate_reject: fraction of the frames with a standing body that skate.
        penetration_warn, penetration_reject: m, deepest reference contact point below the ground.
        limit_warn: rad (m), largest reference joint-limit violation.
        effort_ratio: the feed-forward a frame needs, as a multiple of a DOF's effort limit, above which
            that frame is over the limit (1: the limit itself); effort_warn: fraction of such frames above
            which the model's actuators are too weak for the motion (a real walk on the G1, or on the CMU
            humanoid with dm_control's tracking force ranges, needs it in at most 3 % of frames; on the suite
            CMU humanoid's 20 N m ankles, whose own joint damping at push-off speed needs more, in 65-95 %).
        effort_reject_ratio, effort_reject: a clip whose feed-forward needs more than ``effort_reject_ratio``
            x a limit in more than ``effort_reject`` of its frames is rejected (e.g. a tenth of the model's
            actuators: every frame).
    Self-collision (models with link-to-link pairs, ``ContactParams(self_collision=True)``):
        self_penetration_depth: m, two links' collision geoms overlapping deeper than this pass through
            each other; self_penetration_s: s, for longer than this (a brush is not a pass-through).
    Root assistance (only when used):
        assist_force_ok, assist_force_reject: mean assistance force as a fraction of ``m g``.
        assist_torque_ok, assist_torque_reject: m, mean assistance torque / ``m g``.
    """

    body_error_ok: float = 0.05
    body_error_reject: float = 0.15
    body_error_peak_reject: float = 0.3
    fall_body_error: float = 0.5
    fall_root_height_ratio: float = 0.5
    max_root_speed: float = 10.0
    max_root_angular_speed: float = 30.0
    max_joint_speed: float = 60.0
    near_ground: float = 0.05
    max_flight_s: float = 0.5
    unsupported_force: float = 0.5
    unsupported_torque: float = 0.25
    impossible_warn: float = 0.05
    impossible_reject: float = 0.2
    skate_height: float = 0.03
    skate_speed: float = 0.2
    skate_lift_speed: float = 0.2
    skate_warn: float = 0.15
    skate_reject: float = 0.3
    penetration_warn: float = 0.03
    penetration_reject: float = 0.1
    limit_warn: float = 0.05
    effort_ratio: float = 1.0
    effort_warn: float = 0.1
    effort_reject_ratio: float = 3.0
    effort_reject: float = 0.5
    self_penetration_depth: float = 0.03
    self_penetration_s: float = 0.1
    assist_force_ok: float = 0.15
    assist_force_reject: float = 0.3
    assist_torque_ok: float = 0.05
    assist_torque_reject: float = 0.1

    def to_dict(self) -> dict:
        return asdict(self)


# -- numbers ------------------------------------------------------------------------------------------------


def json_number(x) -> float | None:
    """A float with 6 significant digits (deterministic JSON text), ``None`` when not finite."""
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.6g}")


def json_clean(obj):
    """``obj`` with numpy scalars, enums and floats made JSON-ready (floats through :func:`json_number`)."""
    if isinstance(obj, dict):
        return {str(k): json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return json_number(obj)
    return obj


def _runs(mask: np.ndarray) -> tuple[int, int]:
    """``(length, start)`` of the longest run of True."""
    if not mask.any():
        return 0, -1
    x = np.concatenate([[0], mask.astype(np.int8), [0]])
    d = np.diff(x)
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    i = int(np.argmax(ends - starts))
    return int(ends[i] - starts[i]), int(starts[i])


def _reference_speeds(model: Model, motion: ArticulationMotion) -> dict:
    """Largest frame-to-frame speeds of the clip at its own fps: root linear, root angular, other DOFs."""
    layout = model.layout
    q = np.asarray(motion.q, dtype=np.float64)
    v = layout.difference(q[1:], q[:-1], 1.0 / motion.fps())
    j0 = 6 if layout.free_root else 0
    out = {"root_speed": 0.0, "root_angular_speed": 0.0, "joint_speed": 0.0, "root_frame": 0, "joint_frame": 0}
    if j0:
        lin = np.linalg.norm(v[:, :3], axis=-1)
        ang = np.linalg.norm(v[:, 3:6], axis=-1)
        score = np.maximum(lin / 1.0, ang / 1.0)
        out.update(
            root_speed=float(lin.max()),
            root_angular_speed=float(ang.max()),
            root_frame=int(np.argmax(score)) + 1,
            root_linear_frame=int(np.argmax(lin)) + 1,
            root_angular_frame=int(np.argmax(ang)) + 1,
        )
    if v.shape[1] > j0:
        a = np.abs(v[:, j0:])
        out["joint_speed"] = float(a.max())
        f, d = np.unravel_index(int(np.argmax(a)), a.shape)
        out["joint_frame"] = int(f) + 1
        out["joint_name"] = layout.dof_names[j0 + int(d)]
    return out


@dataclass(frozen=True)
class ClipEvidence:
    """What the rules read besides the metrics: where things happen in the clip and what was simulated.

    Attributes:
        metrics: the flat dict of :func:`clip_metrics`.
        thresholds: the :class:`ValidationThresholds` in force.
        dt: s, simulator step; fps: the clip's frame rate.
        speeds: largest frame-to-frame speeds of the reference (root linear/angular, joints) and their frames.
        fell_step: first step counted as a fall, or ``None``.
        airborne_run, airborne_start: steps of the longest flight and its first step (``-1``: none).
        impossible_first_step: first step with an unsupported wrench, or ``None``.
        body_error_peak_step: step of the largest mean body error.
        free_root: the model has a floating base (a fixed base hangs from the world).
        nonfinite: the simulation diverged and was stopped (``TrackingResult.diverged``).
        root_assist_hz: the root assistance frequency used (0: none).
    """

    metrics: dict
    thresholds: ValidationThresholds
    dt: float
    fps: float
    speeds: dict
    fell_step: int | None
    airborne_run: int
    airborne_start: int
    impossible_first_step: int | None
    body_error_peak_step: int
    free_root: bool
    nonfinite: bool
    root_assist_hz: float

    def at(self, step: int) -> str:
        """``"1.23 s (frame 74)"`` for a simulator step."""
        return f"{step * self.dt:.2f} s (frame {int(round(step * self.dt * self.fps))})"


def _reason(code: str, severity: str, message: str, value, threshold) -> Reason:
    return Reason(code, Severity(severity), message, json_number(value), json_number(threshold))


def _graded(value: float, warn: float, reject: float) -> tuple[str, float]:
    """``("reject", reject)`` above ``reject``, else ``("warn", warn)`` (callers check ``value > warn``)."""
    return ("reject", reject) if value > reject else ("warn", warn)


def clip_metrics(
    result: TrackingResult,
    index: int,
    motion: ArticulationMotion,
    model: Model,
    thresholds: ValidationThresholds = ValidationThresholds(),
) -> ClipEvidence:
    """Numbers of clip ``index`` of a :class:`TrackingResult` (``motion`` is that clip, used for the
    frame-to-frame checks at its own fps), and where in the clip the rules' events happen.

    Returns:
        :class:`ClipEvidence`; its ``metrics`` is a flat dict (SI units; see ``docs/tracking.md``).
    """
    th = thresholds
    i = index
    n = int(result.clip_step_count[i])
    dt = result.dt
    mg = result.weight
    sl = slice(0, n)
    t = np.arange(n) * dt
    m: dict = {"frames": motion.num_frames, "fps": motion.fps(), "duration_s": motion.duration, "steps": n, "dt_s": dt}
    # -- tracking: over the simulated frames only (up to a fall with early stop, or a divergence) ----------
    ns = min(int(result.stop_step[i]) + 1, n)
    diverged = bool(result.diverged[i])
    m["simulated_fraction"] = ns / n
    m["simulated_until_s"] = float(t[ns - 1])
    m["simulator_steps"] = int(result.step_count[i])
    m["diverged"] = diverged
    m["diverged_at_s"] = float(ns * dt) if diverged else None
    sl = slice(0, ns)
    bem = result.body_error_mean[i, sl]
    m["body_error_mean_m"] = float(bem.mean())
    m["body_error_p95_m"] = float(np.quantile(bem, 0.95))
    m["body_error_peak_m"] = float(bem.max())
    m["body_error_peak_s"] = float(t[int(np.argmax(bem))])
    m["body_error_max_m"] = float(result.body_error_max[i, sl].max())
    per_body = result.body_error[i, sl].mean(0)
    m["body_error_by_body_m"] = {b: float(x) for b, x in zip(result.body_names, per_body)}
    dof_rms = np.sqrt((result.dof_error[i, sl] ** 2).mean(0))
    m["dof_error_rms"] = {d: float(x) for d, x in zip(result.dof_names, dof_rms)}
    m["root_drift_final_m"] = float(result.root_horizontal_error[i, ns - 1])
    m["root_drift_max_m"] = float(result.root_horizontal_error[i, sl].max())
    m["root_height_error_mean_m"] = float(result.root_height_error[i, sl].mean())
    m["heading_drift_final_rad"] = float(result.heading_error[i, ns - 1])
    m["heading_drift_max_rad"] = float(np.abs(result.heading_error[i, sl]).max())
    ref_root_h = result.reference_root_height[i, sl]
    sim_root_h = ref_root_h + result.root_height_error[i, sl]
    fell = (bem > th.fall_body_error) | (sim_root_h < th.fall_root_height_ratio * ref_root_h)
    fell_step = int(np.argmax(fell)) if fell.any() else None
    m["fell_at_s"] = None if fell_step is None else float(t[fell_step])
    m["simulation_failed"] = diverged
    _limit_and_effort_metrics(m, result, i, slice(0, n), sl, th)
    impossible = _reference_physics_metrics(m, result, i, slice(0, n), th)
    airborne_run, airborne_start = _contact_metrics(m, result, i, slice(0, n), sl, th, n)
    _self_contact_metrics(m, result, i, slice(0, n), sl, th)
    spd = _reference_speeds(model, motion)
    m["root_speed_max_mps"] = spd["root_speed"]
    m["root_angular_speed_max_radps"] = spd["root_angular_speed"]
    m["joint_speed_max"] = spd["joint_speed"]
    # -- root assistance ------------------------------------------------------------------------------------
    af, at_ = result.assist_force[i, sl], result.assist_torque[i, sl]
    m["root_assist_used"] = result.settings.root_assist_frequency_hz > 0
    m["controller"] = result.settings.controller.value
    m["search_env_steps"] = int(result.search_step_count[i]) if result.search_step_count is not None else 0
    m["assist_force_mean_over_weight"] = float(af.mean() / mg)
    m["assist_force_max_over_weight"] = float(af.max() / mg)
    m["assist_torque_mean_nm"] = float(at_.mean())
    m["assist_torque_mean_over_weight_m"] = float(at_.mean() / mg)
    return ClipEvidence(
        metrics=m,
        thresholds=th,
        dt=dt,
        fps=motion.fps(),
        speeds=spd,
        fell_step=fell_step,
        airborne_run=airborne_run,
        airborne_start=airborne_start,
        impossible_first_step=int(np.argmax(impossible)) if impossible.any() else None,
        body_error_peak_step=int(np.argmax(bem)),
        free_root=model.layout.free_root,
        nonfinite=diverged,
        root_assist_hz=float(result.settings.root_assist_frequency_hz),
    )


def _limit_and_effort_metrics(
    m: dict, result: TrackingResult, i: int, sl: slice, sim: slice, th: ValidationThresholds
) -> None:
    """Joint limits and efforts: of the reference over the clip (``sl``), of the simulation over its
    simulated frames (``sim``)."""
    rl = result.reference_limit_violation[i, sl]
    m["reference_limit_violation_max"] = float(rl.max())
    m["reference_limit_violation_fraction"] = float((rl > 1e-6).mean())
    m["sim_limit_violation_max"] = float(result.sim_limit_violation[i, sim].max())
    er, fr = result.effort_ratio[i, sim], result.feedforward_ratio[i, sl]
    m["effort_ratio_median"] = float(np.median(er))
    m["effort_ratio_p95"] = float(np.quantile(er, 0.95))
    m["effort_over_limit_fraction"] = float((er > 1.0).mean())
    m["feedforward_ratio_median"] = float(np.median(fr))
    m["feedforward_ratio_p95"] = float(np.quantile(fr, 0.95))
    m["feedforward_over_limit_fraction"] = float((fr > 1.0).mean())
    m["feedforward_over_threshold_fraction"] = float((fr > th.effort_ratio).mean())
    m["feedforward_over_reject_ratio_fraction"] = float((fr > th.effort_reject_ratio).mean())
    top = result.feedforward_ratio_by_dof[i]
    order = np.argsort(-top, kind="stable")[:5]
    m["feedforward_ratio_p95_by_dof"] = {result.dof_names[j]: float(top[j]) for j in order}


def _reference_physics_metrics(
    m: dict, result: TrackingResult, i: int, sl: slice, th: ValidationThresholds
) -> np.ndarray:
    """Residual and unsupported wrenches of the reference; returns the per-step ``impossible`` mask."""
    mg = result.weight
    rf, rt = result.residual_force[i, sl], result.residual_torque[i, sl]
    uf, ut = result.unsupported_force[i, sl], result.unsupported_torque[i, sl]
    m["residual_force_mean_over_weight"] = float(rf.mean() / mg)
    m["residual_force_max_over_weight"] = float(rf.max() / mg)
    m["residual_torque_mean_nm"] = float(rt.mean())
    m["unsupported_force_mean_over_weight"] = float(uf.mean() / mg)
    m["unsupported_force_max_over_weight"] = float(uf.max() / mg)
    m["unsupported_torque_mean_over_weight_m"] = float(ut.mean() / mg)
    impossible = (uf > th.unsupported_force * mg) | (ut > th.unsupported_torque * mg)
    m["impossible_fraction"] = float(impossible.mean())
    m["impossible_first_s"] = float(int(np.argmax(impossible)) * result.dt) if impossible.any() else None
    return impossible


def _contact_metrics(
    m: dict, result: TrackingResult, i: int, sl: slice, sim: slice, th: ValidationThresholds, n: int
) -> tuple[int, int]:
    """Flight, skating and penetration of the reference (over ``sl``) and the simulation (over its
    simulated frames ``sim``); returns the longest flight ``(steps, first step)``."""
    dt = result.dt
    height = result.reference_contact_height[i, sl]  # [n, Bc]
    speed = result.reference_contact_speed[i, sl]
    lowest = height.min(-1) if height.shape[1] else np.full(n, np.inf)
    airborne = lowest > th.near_ground
    run, start = _runs(airborne)
    m["airborne_fraction"] = float(airborne.mean())
    m["longest_airborne_s"] = float(run * dt)
    near = height < th.skate_height
    has_contact = near.any(-1)
    # a body whose lowest point rises or sinks faster than skate_lift_speed is lifting off or touching down,
    # not standing: a hop's feet near the ground at take-off and landing do not count as sliding
    vertical = np.abs(np.gradient(height, dt, axis=0)) if n > 1 else np.zeros_like(height)
    standing = near & (vertical <= th.skate_lift_speed)
    stands = standing.any(-1)
    support = np.where(standing, speed, np.inf).min(-1) if height.shape[1] else np.full(n, np.inf)
    skating = stands & (support > th.skate_speed)
    m["contact_fraction"] = float(has_contact.mean())
    m["support_speed_median_mps"] = float(np.median(support[stands])) if stands.any() else None
    m["skating_fraction"] = float(skating.sum() / max(int(stands.sum()), 1))
    m["reference_penetration_max_m"] = float(max(-lowest.min(), 0.0)) if height.shape[1] else 0.0
    m["sim_penetration_max_m"] = float(result.sim_penetration[i, sim].max())
    ss = result.sim_skating_speed[i, sim]
    m["sim_skating_speed_median_mps"] = float(np.median(ss))
    m["sim_skating_speed_p95_mps"] = float(np.quantile(ss, 0.95))
    return run, start


# -- rules: each returns the reasons it finds (none, one or more) ---------------------------------------------


def _self_contact_metrics(
    m: dict, result: TrackingResult, i: int, sl: slice, sim: slice, th: ValidationThresholds
) -> None:
    """Deepest link-to-link overlap of the reference (over ``sl``) and of the tracked motion (over its
    simulated frames ``sim``), its pair and time, and the longest run deeper than ``self_penetration_depth``."""
    names = getattr(result, "self_pair_names", ())
    for key, depth, pair, part in (
        ("reference", result.reference_self_penetration, result.reference_self_pair, sl),
        ("sim", result.sim_self_penetration, result.sim_self_pair, sim),
    ):
        d, p = depth[i, part], pair[i, part]
        k = int(np.argmax(d)) if d.size else 0
        run, start = _runs(d > th.self_penetration_depth) if d.size else (0, -1)
        m[f"{key}_self_penetration_max_m"] = float(d[k]) if d.size else 0.0
        m[f"{key}_self_penetration_at_s"] = float(k * result.dt)
        m[f"{key}_self_penetration_pair"] = "/".join(names[int(p[k])]) if d.size and p[k] >= 0 else None
        m[f"{key}_self_penetration_run_s"] = float(run * result.dt)
        m[f"{key}_self_penetration_start_s"] = float(start * result.dt) if run else None
    m["sim_self_contact_force_max_n"] = float(result.sim_self_contact_force[i, sim].max()) if sim.stop else 0.0


def rule_self_collision(e: ClipEvidence) -> list[Reason]:
    """``self_collision`` (reject): two links pass through each other, deeper than ``self_penetration_depth``
    for longer than ``self_penetration_s``: in the reference itself (the motion cannot be performed by this
    body), or else in the tracked motion (following the reference needs a deep, lasting self-contact the
    reference does not have)."""
    th, m = e.thresholds, e.metrics
    for key, what in (("reference", "the reference"), ("sim", "the tracked motion")):
        run = m.get(f"{key}_self_penetration_run_s", 0.0)
        if run > th.self_penetration_s:
            depth = m[f"{key}_self_penetration_max_m"]
            msg = (
                f"in {what} links pass through each other: {m[f'{key}_self_penetration_pair']} overlap by up to "
                f"{depth:.3f} m (at {m[f'{key}_self_penetration_at_s']:.2f} s), deeper than "
                f"{th.self_penetration_depth:g} m for {run:.2f} s from {m[f'{key}_self_penetration_start_s']:.2f} s"
            )
            return [_reason("self_collision", "reject", msg, depth, th.self_penetration_depth)]
    return []


def rule_diverged(e: ClipEvidence) -> list[Reason]:
    """``diverged`` (reject): the simulation of the clip diverged (a non-finite state or input, a speed or a
    coordinate past the tracker's bounds) and was stopped; the tracking metrics cover the frames before."""
    if not e.nonfinite:
        return []
    m = e.metrics
    s = e.metrics["diverged_at_s"]
    msg = (
        f"the simulation diverged at {s:.2f} s (a non-finite or absurd state, or a non-finite input) and was "
        f"stopped; the tracking numbers cover the {m['simulated_fraction']:.0%} of the clip before"
    )
    return [_reason("diverged", "reject", msg, s, 0)]


def rule_root_discontinuity(e: ClipEvidence) -> list[Reason]:
    """``root_discontinuity`` (reject): the reference root jumps between frames (linear or angular)."""
    th, spd, out = e.thresholds, e.speeds, []
    if spd["root_speed"] > th.max_root_speed:
        f = spd["root_linear_frame"]
        msg = f"the root moves {spd['root_speed']:.3g} m/s between frames {f - 1} and {f} ({f / e.fps:.2f} s): a jump"
        out.append(_reason("root_discontinuity", "reject", msg, spd["root_speed"], th.max_root_speed))
    if spd["root_angular_speed"] > th.max_root_angular_speed:
        f = spd["root_angular_frame"]
        msg = f"the root turns at {spd['root_angular_speed']:.3g} rad/s between frames {f - 1} and {f}: a jump"
        out.append(_reason("root_discontinuity", "reject", msg, spd["root_angular_speed"], th.max_root_angular_speed))
    return out


def rule_joint_discontinuity(e: ClipEvidence) -> list[Reason]:
    """``joint_discontinuity`` (reject): a non-root DOF of the reference jumps between frames."""
    th, spd = e.thresholds, e.speeds
    if spd["joint_speed"] <= th.max_joint_speed:
        return []
    f = spd["joint_frame"]
    msg = f"DOF {spd['joint_name']} moves {spd['joint_speed']:.3g} rad/s between frames {f - 1} and {f}: a jump"
    return [_reason("joint_discontinuity", "reject", msg, spd["joint_speed"], th.max_joint_speed)]


def rule_floating(e: ClipEvidence) -> list[Reason]:
    """``floating`` (reject, floating base only): no body near the ground for longer than a plausible flight."""
    th, m = e.thresholds, e.metrics
    flight = e.airborne_run * e.dt
    if not (e.free_root and flight > th.max_flight_s):
        return []
    msg = (
        f"no body within {th.near_ground:g} m of the ground for {flight:.2f} s from {e.at(e.airborne_start)}, "
        f"longer than a plausible flight ({th.max_flight_s:g} s); {m['airborne_fraction']:.0%} of the clip is airborne"
    )
    return [_reason("floating", "reject", msg, flight, th.max_flight_s)]


def rule_impossible_dynamics(e: ClipEvidence) -> list[Reason]:
    """``impossible_dynamics`` (warn/reject, floating base only): frames whose wrench no contact can supply."""
    th, frac = e.thresholds, e.metrics["impossible_fraction"]
    if not (e.free_root and frac > th.impossible_warn):
        return []
    sev, thr = _graded(frac, th.impossible_warn, th.impossible_reject)
    msg = (
        f"{frac:.1%} of frames need a wrench the contacts cannot supply (more than {th.unsupported_force:g} m g "
        f"or {th.unsupported_torque:g} m x m g), first at {e.at(e.impossible_first_step or 0)}"
    )
    return [_reason("impossible_dynamics", sev, msg, frac, thr)]


def rule_foot_skating(e: ClipEvidence) -> list[Reason]:
    """``foot_skating`` (warn/reject, floating base only): every standing body slides."""
    th, m = e.thresholds, e.metrics
    sk = m["skating_fraction"]
    if not (e.free_root and sk > th.skate_warn):
        return []
    sev, thr = _graded(sk, th.skate_warn, th.skate_reject)
    msg = (
        f"in {sk:.0%} of the frames with a standing body every standing body slides faster than "
        f"{th.skate_speed:g} m/s (median {m['support_speed_median_mps']:.2f} m/s)"
    )
    return [_reason("foot_skating", sev, msg, sk, thr)]


def rule_ground_penetration(e: ClipEvidence) -> list[Reason]:
    """``ground_penetration`` (warn/reject): the reference goes below the ground."""
    th, pen = e.thresholds, e.metrics["reference_penetration_max_m"]
    if pen <= th.penetration_warn:
        return []
    sev, thr = _graded(pen, th.penetration_warn, th.penetration_reject)
    return [_reason("ground_penetration", sev, f"the reference goes {pen:.3f} m below the ground", pen, thr)]


def rule_fell(e: ClipEvidence) -> list[Reason]:
    """``fell`` (reject): the tracker fell (body error or root height past the fall thresholds)."""
    th = e.thresholds
    if e.fell_step is None:
        return []
    msg = (
        f"the tracker fell at {e.at(e.fell_step)} (body error over {th.fall_body_error:g} m or root below "
        f"{th.fall_root_height_ratio:g} of the reference height)"
    )
    if e.metrics["simulated_fraction"] < 1.0:
        msg += f"; simulated up to {e.metrics['simulated_until_s']:.2f} s, the rest of the clip was not"
    return [_reason("fell", "reject", msg, e.fell_step * e.dt, th.fall_body_error)]


def rule_tracking_error(e: ClipEvidence) -> list[Reason]:
    """``tracking_error``: reject on a peak over ``body_error_peak_reject``, else graded on the mean."""
    th, m = e.thresholds, e.metrics
    peak, be = m["body_error_peak_m"], m["body_error_mean_m"]
    if peak > th.body_error_peak_reject:
        msg = f"mean body error reaches {peak:.3f} m at {e.at(e.body_error_peak_step)}"
        return [_reason("tracking_error", "reject", msg, peak, th.body_error_peak_reject)]
    if be <= th.body_error_ok:
        return []
    sev, thr = _graded(be, th.body_error_ok, th.body_error_reject)
    return [_reason("tracking_error", sev, f"mean body error {be:.3f} m over the clip", be, thr)]


def rule_joint_limits(e: ClipEvidence) -> list[Reason]:
    """``joint_limits`` (warn): the reference exceeds joint limits."""
    th, m = e.thresholds, e.metrics
    v = m["reference_limit_violation_max"]
    if v <= th.limit_warn:
        return []
    msg = (
        f"the reference exceeds joint limits by up to {v:.3f} in "
        f"{m['reference_limit_violation_fraction']:.0%} of frames"
    )
    return [_reason("joint_limits", "warn", msg, v, th.limit_warn)]


def rule_effort_over_limit(e: ClipEvidence) -> list[Reason]:
    """``effort_over_limit`` (warn/reject): the feed-forward exceeds ``effort_ratio`` x a DOF's effort limit
    in more than ``effort_warn`` of the frames (warn), or ``effort_reject_ratio`` x in more than
    ``effort_reject`` of them (reject)."""
    th, m = e.thresholds, e.metrics
    frac, gross = m["feedforward_over_threshold_fraction"], m["feedforward_over_reject_ratio_fraction"]
    worst = ", ".join(f"{k} {v:.1f}x" for k, v in list(m["feedforward_ratio_p95_by_dof"].items())[:3])
    if gross > th.effort_reject:
        msg = (
            f"in {gross:.0%} of frames the motion needs more than {th.effort_reject_ratio:g}x a DOF's effort "
            f"limit (95th percentiles: {worst}): the actuators are far too weak for it"
        )
        return [_reason("effort_over_limit", "reject", msg, gross, th.effort_reject)]
    if frac <= th.effort_warn:
        return []
    msg = (
        f"in {frac:.0%} of frames the motion needs more than {th.effort_ratio:g}x a DOF's effort limit "
        f"(95th percentiles: {worst}); the simulation measures the effort, it does not enforce it "
        f"(TrackingSettings.clamp_effort)"
    )
    return [_reason("effort_over_limit", "warn", msg, frac, th.effort_warn)]


def rule_root_assistance(e: ClipEvidence) -> list[Reason]:
    """``root_assistance`` (info/warn/reject, only when used): how much external support the tracker had."""
    th, m = e.thresholds, e.metrics
    if e.root_assist_hz <= 0:
        return []
    fa, ta = m["assist_force_mean_over_weight"], m["assist_torque_mean_over_weight_m"]
    msg = (
        f"root assistance ({e.root_assist_hz:g} Hz) supplied a mean force of "
        f"{fa:.3f} m g (peak {m['assist_force_max_over_weight']:.2f} m g) and a mean torque of "
        f"{m['assist_torque_mean_nm']:.1f} N m ({ta:.3f} m x m g)"
    )
    if fa > th.assist_force_reject or ta > th.assist_torque_reject:
        return [
            _reason(
                "root_assistance", "reject", msg + ": the motion needs external support", fa, th.assist_force_reject
            )
        ]
    if fa > th.assist_force_ok or ta > th.assist_torque_ok:
        return [_reason("root_assistance", "warn", msg, fa, th.assist_force_ok)]
    return [_reason("root_assistance", "info", msg + " (within the accepted assistance)", fa, th.assist_force_ok)]


def rule_sampling(e: ClipEvidence) -> list[Reason]:
    """``sampling`` (info, only with :attr:`~kangengine.sim.Controller.SAMPLING`): the tracker's targets were
    planned by the sampling search, and what it cost."""
    m = e.metrics
    if m["controller"] != "sampling":
        return []
    steps = m["search_env_steps"]
    msg = (
        f"tracked with target offsets planned by the sampling search ({steps} world-steps, "
        f"{steps / max(m['duration_s'], 1e-9):.0f} per clip-second), no root assistance unless reported"
    )
    return [_reason("sampling", "info", msg, float(steps), math.nan)]


#: Reason codes whose outcome depends on the tracker, not the reference (what another controller may change).
TRACKER_CODES = frozenset({"fell", "tracking_error"})


#: The verdict rules, in the order their reasons are listed (within one severity).
RULES: tuple[Callable[[ClipEvidence], list[Reason]], ...] = (
    rule_diverged,
    rule_root_discontinuity,
    rule_joint_discontinuity,
    rule_floating,
    rule_impossible_dynamics,
    rule_foot_skating,
    rule_ground_penetration,
    rule_self_collision,
    rule_fell,
    rule_tracking_error,
    rule_joint_limits,
    rule_effort_over_limit,
    rule_root_assistance,
    rule_sampling,
)

_SEVERITY_RANK = {Severity.REJECT: 0, Severity.WARN: 1, Severity.INFO: 2}


def summarize(
    result: TrackingResult,
    index: int,
    motion: ArticulationMotion,
    model: Model,
    thresholds: ValidationThresholds = ValidationThresholds(),
) -> tuple[dict, list[Reason]]:
    """Numbers and reasons of clip ``index`` of a :class:`TrackingResult` (:func:`clip_metrics`, then every
    rule of :data:`RULES`).

    Returns:
        ``(metrics, reasons)``: a flat JSON-ready dict and the :class:`Reason` list (most severe first).
    """
    evidence = clip_metrics(result, index, motion, model, thresholds)
    reasons = [r for rule in RULES for r in rule(evidence)]
    reasons.sort(key=lambda r: _SEVERITY_RANK[r.severity])
    return evidence.metrics, reasons


def verdict_of(reasons: Sequence[Reason]) -> Verdict:
    """``REJECT`` if any reason rejects, else ``WARN`` if any warns, else ``OK``."""
    sev = {r.severity for r in reasons}
    if Severity.REJECT in sev:
        return Verdict.REJECT
    if Severity.WARN in sev:
        return Verdict.WARN
    return Verdict.OK
