"""Per-clip physics reports: a verdict (``ok``, ``warn``, ``reject``) with reasons, deterministic JSON, a
summary CSV for a dataset, and PNG plots (matplotlib, headless).

:func:`validate` tracks the clips (:func:`kangengine.sim.track`), turns the per-frame metrics into
numbers and reasons (:func:`summarize`, thresholds in :class:`ValidationThresholds`) and writes, for each
clip, ``<name>.json`` and ``<name>.png`` into the output folder, plus ``summary.csv`` listing every clip
(skipped ones with their error). Writes are atomic. A second run with the same inputs skips clips whose
report exists and records the same input hash (model, clip, settings, thresholds, report version).

JSON reports are deterministic: keys sorted, floats written with 6 significant digits, no timestamps or
machine paths, so the same input gives byte-identical files.
"""

from __future__ import annotations

import csv
import enum
import hashlib
import io
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .._files import atomic_write
from ..animation.motion import ArticulationMotion
from ..errors import KangEngineError, ShapeError
from .model import Model
from .tracking import TrackingResult, TrackingSettings, track

__all__ = [
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "Verdict",
    "Severity",
    "Reason",
    "ValidationThresholds",
    "ClipReport",
    "SkippedClip",
    "ValidationResult",
    "summarize",
    "validate",
    "write_plot",
]

REPORT_FORMAT = "kangengine.validation_report"
REPORT_VERSION = 1


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
        skate_warn, skate_reject: fraction of frames with contact that skate.
        penetration_warn, penetration_reject: m, deepest reference contact point below the ground.
        limit_warn: rad (m), largest reference joint-limit violation.
        effort_ratio: the feed-forward a frame needs, as a multiple of a DOF's effort limit, above which
            that frame is over the limit; effort_warn: fraction of such frames.
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
    skate_warn: float = 0.15
    skate_reject: float = 0.3
    penetration_warn: float = 0.03
    penetration_reject: float = 0.1
    limit_warn: float = 0.05
    effort_ratio: float = 3.0
    effort_warn: float = 0.1
    assist_force_ok: float = 0.15
    assist_force_reject: float = 0.3
    assist_torque_ok: float = 0.05
    assist_torque_reject: float = 0.1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ClipReport:
    """The report of one clip (what its JSON file holds).

    Attributes:
        name: clip name. verdict: :class:`Verdict`. reasons: :class:`Reason` tuple (most severe first).
        metrics: flat dict of numbers (see ``docs/tracking.md``), JSON-ready.
        input_hash: SHA-256 of the model, clip, settings and thresholds.
        report_path, plot_path: files written (``None`` when not written).
        resumed: the report was read back from an earlier run instead of being recomputed.
    """

    name: str
    verdict: Verdict
    reasons: tuple[Reason, ...]
    metrics: dict
    input_hash: str
    report_path: str | None = None
    plot_path: str | None = None
    resumed: bool = False

    @property
    def reason_codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons if r.severity is not Severity.INFO)


@dataclass(frozen=True)
class SkippedClip:
    """A clip that could not be validated, and why."""

    name: str
    error: str


@dataclass(frozen=True)
class ValidationResult:
    """Reports of a dataset.

    Attributes:
        reports: :class:`ClipReport` per validated clip, in input order.
        skipped: :class:`SkippedClip` per clip that could not be validated.
        out_dir: output folder (``None``: nothing written). summary_path: the CSV.
        timings: seconds: ``simulation`` (stepping), ``setup`` (references, feed-forward, contact fit),
            ``metrics``, ``reports`` (verdicts, JSON, CSV), ``plots``, ``total``.
        simulated_seconds: clip-seconds validated in this run (resumed clips excluded).
    """

    reports: tuple[ClipReport, ...]
    skipped: tuple[SkippedClip, ...]
    out_dir: str | None
    summary_path: str | None
    timings: dict = field(default_factory=dict)
    simulated_seconds: float = 0.0

    def counts(self) -> dict:
        """``{"ok": n, "warn": n, "reject": n, "skipped": n}``."""
        out = {v.value: 0 for v in Verdict}
        for r in self.reports:
            out[r.verdict.value] += 1
        out["skipped"] = len(self.skipped)
        return out

    def report(self, name: str) -> ClipReport:
        for r in self.reports:
            if r.name == name:
                return r
        from ..errors import UnknownNameError

        raise UnknownNameError(f"no report {name!r}; reports are: {', '.join(r.name for r in self.reports)}")


# -- numbers ------------------------------------------------------------------------------------------------


def _f(x) -> float | None:
    """A float with 6 significant digits (deterministic text), ``None`` when not finite."""
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.6g}")


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _f(obj)
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


def summarize(
    result: TrackingResult,
    index: int,
    motion: ArticulationMotion,
    model: Model,
    thresholds: ValidationThresholds = ValidationThresholds(),
) -> tuple[dict, list[Reason]]:
    """Numbers and reasons of clip ``index`` of a :class:`TrackingResult` (``motion`` is that clip, used
    for the frame-to-frame checks at its own fps).

    Returns:
        ``(metrics, reasons)``: a flat JSON-ready dict and the :class:`Reason` list (most severe first).
    """
    th = thresholds
    i = index
    n = int(result.clip_step_count[i])
    dt = result.dt
    mg = result.weight
    sl = slice(0, n)
    t = np.arange(n) * dt
    fps = motion.fps()
    reasons: list[Reason] = []

    def at(step: int) -> str:
        return f"{step * dt:.2f} s (frame {int(round(step * dt * fps))})"

    def add(code, sev, msg, value, thr):
        reasons.append(Reason(code, Severity(sev), msg, _f(value), _f(thr)))

    m: dict = {
        "frames": motion.num_frames,
        "fps": fps,
        "duration_s": motion.duration,
        "steps": n,
        "dt_s": dt,
    }
    # -- tracking --------------------------------------------------------------------------------------
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
    m["root_drift_final_m"] = float(result.root_horizontal_error[i, n - 1])
    m["root_drift_max_m"] = float(result.root_horizontal_error[i, sl].max())
    m["root_height_error_mean_m"] = float(result.root_height_error[i, sl].mean())
    m["heading_drift_final_rad"] = float(result.heading_error[i, n - 1])
    m["heading_drift_max_rad"] = float(np.abs(result.heading_error[i, sl]).max())
    ref_root_h = result.reference_root_height[i, sl]
    sim_root_h = ref_root_h + result.root_height_error[i, sl]
    fell = (bem > th.fall_body_error) | (sim_root_h < th.fall_root_height_ratio * ref_root_h)
    fell_step = int(np.argmax(fell)) if fell.any() else None
    m["fell_at_s"] = None if fell_step is None else float(t[fell_step])
    m["simulation_failed"] = bool(result.nonfinite[i])

    # -- limits and effort -------------------------------------------------------------------------------
    rl = result.reference_limit_violation[i, sl]
    m["reference_limit_violation_max"] = float(rl.max())
    m["reference_limit_violation_fraction"] = float((rl > 1e-6).mean())
    m["sim_limit_violation_max"] = float(result.sim_limit_violation[i, sl].max())
    er, fr = result.effort_ratio[i, sl], result.feedforward_ratio[i, sl]
    m["effort_ratio_median"] = float(np.median(er))
    m["effort_ratio_p95"] = float(np.quantile(er, 0.95))
    m["effort_over_limit_fraction"] = float((er > 1.0).mean())
    m["feedforward_ratio_median"] = float(np.median(fr))
    m["feedforward_ratio_p95"] = float(np.quantile(fr, 0.95))
    m["feedforward_over_limit_fraction"] = float((fr > 1.0).mean())
    over = fr > th.effort_ratio
    m["feedforward_over_threshold_fraction"] = float(over.mean())
    top = result.feedforward_ratio_by_dof[i]
    order = np.argsort(-top, kind="stable")[:5]
    m["feedforward_ratio_p95_by_dof"] = {result.dof_names[j]: float(top[j]) for j in order}

    # -- the reference's physics ---------------------------------------------------------------------------
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
    m["impossible_first_s"] = float(t[int(np.argmax(impossible))]) if impossible.any() else None

    height = result.reference_contact_height[i, sl]  # [n, Bc]
    speed = result.reference_contact_speed[i, sl]
    lowest = height.min(-1) if height.shape[1] else np.full(n, np.inf)
    airborne = lowest > th.near_ground
    run, start = _runs(airborne)
    m["airborne_fraction"] = float(airborne.mean())
    m["longest_airborne_s"] = float(run * dt)
    standing = height < th.skate_height
    has_contact = standing.any(-1)
    support = np.where(standing, speed, np.inf).min(-1) if height.shape[1] else np.full(n, np.inf)
    skating = has_contact & (support > th.skate_speed)
    m["contact_fraction"] = float(has_contact.mean())
    m["support_speed_median_mps"] = float(np.median(support[has_contact])) if has_contact.any() else None
    m["skating_fraction"] = float(skating.sum() / max(int(has_contact.sum()), 1))
    m["reference_penetration_max_m"] = float(max(-lowest.min(), 0.0)) if height.shape[1] else 0.0
    m["sim_penetration_max_m"] = float(result.sim_penetration[i, sl].max())
    ss = result.sim_skating_speed[i, sl]
    m["sim_skating_speed_median_mps"] = float(np.median(ss))
    m["sim_skating_speed_p95_mps"] = float(np.quantile(ss, 0.95))
    spd = _reference_speeds(model, motion)
    m["root_speed_max_mps"] = spd["root_speed"]
    m["root_angular_speed_max_radps"] = spd["root_angular_speed"]
    m["joint_speed_max"] = spd["joint_speed"]

    # -- root assistance ------------------------------------------------------------------------------------
    used = result.settings.root_assist_frequency_hz > 0
    af, at_ = result.assist_force[i, sl], result.assist_torque[i, sl]
    m["root_assist_used"] = used
    m["assist_force_mean_over_weight"] = float(af.mean() / mg)
    m["assist_force_max_over_weight"] = float(af.max() / mg)
    m["assist_torque_mean_nm"] = float(at_.mean())
    m["assist_torque_mean_over_weight_m"] = float(at_.mean() / mg)

    # -- verdict rules ---------------------------------------------------------------------------------------
    if result.nonfinite[i]:
        add("simulation_failed", "reject", "the simulation became non-finite and the world was frozen", 1, 0)
    if spd["root_speed"] > th.max_root_speed:
        f = spd["root_linear_frame"]
        add(
            "root_discontinuity",
            "reject",
            f"the root moves {spd['root_speed']:.3g} m/s between frames {f - 1} and {f} ({f / fps:.2f} s): a jump",
            spd["root_speed"],
            th.max_root_speed,
        )
    if spd["root_angular_speed"] > th.max_root_angular_speed:
        f = spd["root_angular_frame"]
        add(
            "root_discontinuity",
            "reject",
            f"the root turns at {spd['root_angular_speed']:.3g} rad/s between frames {f - 1} and {f}: a jump",
            spd["root_angular_speed"],
            th.max_root_angular_speed,
        )
    if spd["joint_speed"] > th.max_joint_speed:
        f = spd["joint_frame"]
        add(
            "joint_discontinuity",
            "reject",
            f"DOF {spd['joint_name']} moves {spd['joint_speed']:.3g} rad/s between frames {f - 1} and {f}: a jump",
            spd["joint_speed"],
            th.max_joint_speed,
        )
    floating_base = model.layout.free_root  # a fixed base hangs from the world: no flight, skating or support
    if floating_base and run * dt > th.max_flight_s:
        add(
            "floating",
            "reject",
            f"no body within {th.near_ground:g} m of the ground for {run * dt:.2f} s from {at(start)}, longer than "
            f"a plausible flight ({th.max_flight_s:g} s); {airborne.mean():.0%} of the clip is airborne",
            run * dt,
            th.max_flight_s,
        )
    frac = m["impossible_fraction"]
    if floating_base and frac > th.impossible_warn:
        sev = "reject" if frac > th.impossible_reject else "warn"
        add(
            "impossible_dynamics",
            sev,
            f"{frac:.1%} of frames need a wrench the contacts cannot supply (more than {th.unsupported_force:g} m g "
            f"or {th.unsupported_torque:g} m x m g), first at {at(int(np.argmax(impossible)))}",
            frac,
            th.impossible_reject if sev == "reject" else th.impossible_warn,
        )
    sk = m["skating_fraction"]
    if floating_base and sk > th.skate_warn:
        sev = "reject" if sk > th.skate_reject else "warn"
        add(
            "foot_skating",
            sev,
            f"in {sk:.0%} of the frames with ground contact every standing body slides faster than "
            f"{th.skate_speed:g} m/s (median {m['support_speed_median_mps']:.2f} m/s)",
            sk,
            th.skate_reject if sev == "reject" else th.skate_warn,
        )
    pen = m["reference_penetration_max_m"]
    if pen > th.penetration_warn:
        sev = "reject" if pen > th.penetration_reject else "warn"
        add(
            "ground_penetration",
            sev,
            f"the reference goes {pen:.3f} m below the ground",
            pen,
            th.penetration_reject if sev == "reject" else th.penetration_warn,
        )
    if fell_step is not None:
        add(
            "fell",
            "reject",
            f"the tracker fell at {at(fell_step)} (body error over {th.fall_body_error:g} m or root below "
            f"{th.fall_root_height_ratio:g} of the reference height)",
            float(t[fell_step]),
            th.fall_body_error,
        )
    be = m["body_error_mean_m"]
    if m["body_error_peak_m"] > th.body_error_peak_reject:
        add(
            "tracking_error",
            "reject",
            f"mean body error reaches {m['body_error_peak_m']:.3f} m at {at(int(np.argmax(bem)))}",
            m["body_error_peak_m"],
            th.body_error_peak_reject,
        )
    elif be > th.body_error_ok:
        sev = "reject" if be > th.body_error_reject else "warn"
        add(
            "tracking_error",
            sev,
            f"mean body error {be:.3f} m over the clip",
            be,
            th.body_error_reject if sev == "reject" else th.body_error_ok,
        )
    if m["reference_limit_violation_max"] > th.limit_warn:
        add(
            "joint_limits",
            "warn",
            f"the reference exceeds joint limits by up to {m['reference_limit_violation_max']:.3f} "
            f"in {m['reference_limit_violation_fraction']:.0%} of frames",
            m["reference_limit_violation_max"],
            th.limit_warn,
        )
    if m["feedforward_over_threshold_fraction"] > th.effort_warn:
        worst = ", ".join(f"{k} {v:.1f}x" for k, v in list(m["feedforward_ratio_p95_by_dof"].items())[:3])
        add(
            "effort_over_limit",
            "warn",
            f"in {m['feedforward_over_threshold_fraction']:.0%} of frames the motion needs more than "
            f"{th.effort_ratio:g}x a DOF's effort limit (95th percentiles: {worst})",
            m["feedforward_over_threshold_fraction"],
            th.effort_warn,
        )
    if used:
        fa, ta = m["assist_force_mean_over_weight"], m["assist_torque_mean_over_weight_m"]
        msg = (
            f"root assistance ({result.settings.root_assist_frequency_hz:g} Hz) supplied a mean force of "
            f"{fa:.3f} m g (peak {m['assist_force_max_over_weight']:.2f} m g) and a mean torque of "
            f"{m['assist_torque_mean_nm']:.1f} N m ({ta:.3f} m x m g)"
        )
        if fa > th.assist_force_reject or ta > th.assist_torque_reject:
            add("root_assistance", "reject", msg + ": the motion needs external support", fa, th.assist_force_reject)
        elif fa > th.assist_force_ok or ta > th.assist_torque_ok:
            add("root_assistance", "warn", msg, fa, th.assist_force_ok)
        else:
            add("root_assistance", "info", msg + " (within the accepted assistance)", fa, th.assist_force_ok)
    rank = {Severity.REJECT: 0, Severity.WARN: 1, Severity.INFO: 2}
    reasons.sort(key=lambda r: rank[r.severity])
    return m, reasons


def _verdict(reasons: Sequence[Reason]) -> Verdict:
    sev = {r.severity for r in reasons}
    if Severity.REJECT in sev:
        return Verdict.REJECT
    if Severity.WARN in sev:
        return Verdict.WARN
    return Verdict.OK


# -- hashing and files ----------------------------------------------------------------------------------------


def _model_fingerprint(model: Model) -> str:
    h = hashlib.sha256()
    h.update(model.layout.model_signature.encode())
    h.update(f"{model.dtype}|{model.device.type}|{model.contact!r}".encode())
    for name in (
        "body_mass",
        "body_com",
        "body_inertia",
        "body_gravity",
        "gravity",
        "armature",
        "damping",
        "friction_coulomb",
        "lower",
        "upper",
        "limit_stiffness",
        "limit_damping",
        "spring_stiffness",
        "spring_ref",
        "effort_limit",
        "contact_point_body",
        "contact_point_local",
        "contact_radius",
        "contact_friction",
    ):
        x = getattr(model, name).detach().cpu().double().numpy()
        h.update(name.encode())
        h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


def _input_hash(
    model_fp: str, motion: ArticulationMotion, settings: TrackingSettings, thresholds: ValidationThresholds
) -> str:
    h = hashlib.sha256()
    from .. import __version__

    h.update(f"{REPORT_FORMAT}|{REPORT_VERSION}|{__version__}|{model_fp}".encode())
    h.update(np.ascontiguousarray(motion.q).tobytes())
    h.update(np.ascontiguousarray(motion.qd).tobytes())
    h.update(repr(float(motion.fps())).encode())
    h.update(json.dumps(_clean(settings.to_dict()), sort_keys=True).encode())
    h.update(json.dumps(_clean(thresholds.to_dict()), sort_keys=True).encode())
    return h.hexdigest()


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _file_stem(name: str) -> str:
    stem = _SAFE.sub("_", name).strip("._") or "clip"
    return stem


def _report_dict(report: ClipReport, model: Model, settings: TrackingSettings, thresholds: ValidationThresholds):
    return _clean(
        {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "clip": report.name,
            "verdict": report.verdict,
            "reasons": [r.to_dict() for r in report.reasons],
            "input_hash": report.input_hash,
            "model": {
                "name": model.name,
                "signature": model.layout.model_signature,
                "total_mass_kg": model.total_mass,
                "nv": model.nv,
                "dtype": str(model.dtype).replace("torch.", ""),
                "device": model.device.type,
            },
            "settings": settings.to_dict(),
            "thresholds": thresholds.to_dict(),
            "metrics": report.metrics,
        }
    )


def _dumps(d: dict) -> bytes:
    return (json.dumps(d, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


def _read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _from_dict(d: dict, report_path: str, plot_path: str | None) -> ClipReport:
    reasons = tuple(
        Reason(r["code"], Severity(r["severity"]), r["message"], r["value"], r["threshold"]) for r in d["reasons"]
    )
    return ClipReport(
        name=d["clip"],
        verdict=Verdict(d["verdict"]),
        reasons=reasons,
        metrics=d["metrics"],
        input_hash=d["input_hash"],
        report_path=report_path,
        plot_path=plot_path,
        resumed=True,
    )


_CSV_COLUMNS = (
    ("body_error_mean_m", "body_error_mean_m"),
    ("body_error_peak_m", "body_error_peak_m"),
    ("root_drift_final_m", "root_drift_final_m"),
    ("heading_drift_final_rad", "heading_drift_final_rad"),
    ("fell_at_s", "fell_at_s"),
    ("impossible_fraction", "impossible_fraction"),
    ("skating_fraction", "skating_fraction"),
    ("longest_airborne_s", "longest_airborne_s"),
    ("reference_penetration_max_m", "reference_penetration_max_m"),
    ("feedforward_over_threshold_fraction", "feedforward_over_threshold_fraction"),
    ("residual_force_max_over_weight", "residual_force_max_over_weight"),
    ("assist_force_mean_over_weight", "assist_force_mean_over_weight"),
    ("assist_torque_mean_nm", "assist_torque_mean_nm"),
)


def _write_summary(path: Path, reports: Sequence[ClipReport], skipped: Sequence[SkippedClip]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["clip", "verdict", "reasons", "duration_s"] + [c for c, _ in _CSV_COLUMNS] + ["error"])
    rows = []
    for r in reports:
        vals = [r.metrics.get(k) for _, k in _CSV_COLUMNS]
        rows.append(
            [r.name, r.verdict.value, ";".join(r.reason_codes), _fmt(r.metrics.get("duration_s"))]
            + [_fmt(v) for v in vals]
            + [""]
        )
    for s in skipped:
        rows.append([s.name, "skipped", "", ""] + [""] * len(_CSV_COLUMNS) + [s.error])
    for row in sorted(rows, key=lambda x: x[0]):
        w.writerow(row)
    data = buf.getvalue().encode()
    atomic_write(path, lambda f: f.write(data))


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    return f"{float(v):.6g}"


# -- plots ----------------------------------------------------------------------------------------------------


def write_plot(path, result: TrackingResult, index: int, report: ClipReport | None = None) -> Path:
    """PNG of clip ``index``: per-DOF error over time (heat map), body error, the reference's residual and
    unsupported wrench (and root assistance when used), and the contact timeline of the reference and
    the simulation. Headless (matplotlib's Agg canvas); written atomically. Needs the ``viz`` extra."""
    from ..adapters.base import require

    require("matplotlib", "viz")
    from matplotlib.figure import Figure

    i = index
    n = int(result.clip_step_count[i])
    t = np.arange(n) * result.dt
    mg = result.weight
    fig = Figure(figsize=(11, 11), dpi=90)
    axes = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3, 1.3, 2]})
    title = result.clip_names[i]
    if report is not None:
        title += f"  -  {report.verdict.value}"
        if report.reason_codes:
            title += " (" + ", ".join(dict.fromkeys(report.reason_codes)) + ")"
    fig.suptitle(title)
    ext = (0.0, max(t[-1], result.dt), -0.5, len(result.dof_names) - 0.5)
    ax = axes[0]
    img = ax.imshow(
        np.degrees(result.dof_error[i, :n].T),
        aspect="auto",
        origin="lower",
        extent=ext,
        cmap="magma",
        interpolation="nearest",
    )
    ax.set_yticks(range(len(result.dof_names)))
    ax.set_yticklabels(result.dof_names, fontsize=4)
    ax.set_ylabel("DOF error (deg)")
    fig.colorbar(img, ax=ax, pad=0.01)
    ax = axes[1]
    ax.plot(t, result.body_error_mean[i, :n], label="mean over bodies")
    ax.plot(t, result.body_error_max[i, :n], label="max over bodies", alpha=0.7)
    ax.set_ylabel("body error (m)")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    ax.plot(t, result.residual_force[i, :n] / mg, label="residual force (no contact)")
    ax.plot(t, result.unsupported_force[i, :n] / mg, label="unsupported force")
    ax.plot(t, result.unsupported_torque[i, :n] / mg, label="unsupported torque / m g (m)", alpha=0.8)
    if result.settings.root_assist_frequency_hz > 0:
        ax.plot(t, result.assist_force[i, :n] / mg, label="root assistance force", alpha=0.8)
    ax.set_ylabel("/ m g")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[3]
    h = result.reference_contact_height[i, :n]
    f = result.sim_contact_force[i, :n]
    touched = np.flatnonzero((h < 0.03).any(0) | (f > 1.0).any(0))
    names = [result.contact_body_names[b] for b in touched]
    rows = []
    for b in touched:
        rows.append((h[:, b] < 0.03).astype(float))
        rows.append(np.where(f[:, b] > 1.0, 2.0, 0.0))
    if rows:
        ax.imshow(
            np.array(rows),
            aspect="auto",
            origin="lower",
            cmap="Blues",
            vmin=0,
            vmax=2,
            extent=(0.0, max(t[-1], result.dt), -0.5, len(rows) - 0.5),
            interpolation="nearest",
        )
        labels = [f"{nm} {kind}" for nm in names for kind in ("ref", "sim")]
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=6)
    ax.set_ylabel("contact")
    ax.set_xlabel("time (s)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = buf.getvalue()
    return atomic_write(path, lambda fh: fh.write(data))


# -- validate -------------------------------------------------------------------------------------------------


def validate(
    model: Model,
    motions: ArticulationMotion | Sequence[ArticulationMotion] | Mapping[str, ArticulationMotion],
    *,
    names: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    settings: TrackingSettings | None = None,
    thresholds: ValidationThresholds = ValidationThresholds(),
    plots: bool = True,
    resume: bool = True,
    batch_size: int = 64,
    skipped: Mapping[str, str] | None = None,
) -> ValidationResult:
    """Track every clip in physics and write one report per clip.

    Args:
        model: the simulator :class:`~kangengine.sim.Model` (CPU or CUDA, float32 or float64).
        motions: clips of ``model.layout``: one, a sequence (named by ``names`` or ``clip_0``, ...), or a
            mapping from names to clips.
        out_dir: folder for ``<name>.json``, ``<name>.png`` and ``summary.csv`` (``None``: write nothing).
        settings: :class:`~kangengine.sim.TrackingSettings` (defaults when omitted).
        thresholds: :class:`ValidationThresholds`.
        plots: write the PNG plots (needs matplotlib, the ``viz`` extra).
        resume: skip clips whose report in ``out_dir`` records the same input hash.
        batch_size: clips simulated together (sorted by length to limit padding).
        skipped: clips that failed before validation (name -> error), listed in the summary.
    Returns:
        :class:`ValidationResult`. Clips that cannot be validated (wrong layout, shorter than one step) are
        listed in ``skipped`` with the error; the others are reported.
    """
    t_start = time.perf_counter()
    settings = settings if settings is not None else TrackingSettings()
    if isinstance(motions, ArticulationMotion):
        motions = [motions]
    if isinstance(motions, Mapping):
        items = [(str(k), v) for k, v in motions.items()]
    else:
        motions = list(motions)
        nm = list(names) if names is not None else [f"clip_{i}" for i in range(len(motions))]
        if len(nm) != len(motions):
            raise ShapeError(f"{len(nm)} names for {len(motions)} clips", item="names")
        items = list(zip(nm, motions))
    seen: dict[str, str] = {}
    for name, _ in items:
        stem = _file_stem(name)
        if stem in seen:
            from ..errors import DuplicateNameError

            raise DuplicateNameError(
                f"clips {seen[stem]!r} and {name!r} would write the same report {stem}.json", item="names"
            )
        seen[stem] = name
    out = Path(out_dir) if out_dir is not None else None
    model_fp = _model_fingerprint(model)
    skips = [SkippedClip(str(k), str(v)) for k, v in (skipped or {}).items()]
    reports: dict[str, ClipReport] = {}
    todo: list[tuple[str, ArticulationMotion, str]] = []
    for name, motion in items:
        try:
            if not isinstance(motion, ArticulationMotion):
                raise ShapeError(f"expected an ArticulationMotion, got {type(motion).__name__}", item=name)
            motion.check_layout(model.layout, what=f"clip {name!r}")
            if motion.num_frames < 2 or motion.duration < settings.dt:
                raise ShapeError(
                    f"lasts {motion.duration:.4g} s ({motion.num_frames} frames); expected at least one step "
                    f"of {settings.dt:.4g} s",
                    item=name,
                )
        except KangEngineError as exc:
            skips.append(SkippedClip(name, f"{type(exc).__name__}: {exc}"))
            continue
        h = _input_hash(model_fp, motion, settings, thresholds)
        if resume and out is not None:
            stem = _file_stem(name)
            old = _read_report(out / f"{stem}.json")
            png = out / f"{stem}.png"
            if old is not None and old.get("input_hash") == h and (not plots or png.is_file()):
                reports[name] = _from_dict(old, str(out / f"{stem}.json"), str(png) if png.is_file() else None)
                continue
        todo.append((name, motion, h))

    timings = {"setup": 0.0, "simulation": 0.0, "metrics": 0.0, "reports": 0.0, "plots": 0.0}
    simulated = 0.0
    order = sorted(range(len(todo)), key=lambda j: (-todo[j][1].duration, todo[j][0]))
    bs = max(int(batch_size), 1)
    for b0 in range(0, len(order), bs):
        batch = [todo[j] for j in order[b0 : b0 + bs]]
        try:
            result = track(model, [m for _, m, _ in batch], settings=settings, names=[n for n, _, _ in batch])
        except KangEngineError as exc:
            for name, _, _ in batch:
                skips.append(SkippedClip(name, f"{type(exc).__name__}: {exc}"))
            continue
        for k in ("setup", "simulation", "metrics"):
            timings[k] += result.timings.get(k, 0.0)
        for j, (name, motion, h) in enumerate(batch):
            t0 = time.perf_counter()
            metrics, reasons = summarize(result, j, motion, model, thresholds)
            rep = ClipReport(
                name=name, verdict=_verdict(reasons), reasons=tuple(reasons), metrics=_clean(metrics), input_hash=h
            )
            simulated += motion.duration
            if out is not None:
                stem = _file_stem(name)
                jpath = out / f"{stem}.json"
                data = _dumps(_report_dict(rep, model, settings, thresholds))
                atomic_write(jpath, lambda f, d=data: f.write(d))
                rep = ClipReport(**{**rep.__dict__, "report_path": str(jpath)})
                timings["reports"] += time.perf_counter() - t0
                if plots:
                    t1 = time.perf_counter()
                    ppath = write_plot(out / f"{stem}.png", result, j, rep)
                    rep = ClipReport(**{**rep.__dict__, "plot_path": str(ppath)})
                    timings["plots"] += time.perf_counter() - t1
            else:
                timings["reports"] += time.perf_counter() - t0
            reports[name] = rep
    summary = None
    if out is not None:
        t0 = time.perf_counter()
        summary = out / "summary.csv"
        ordered = [reports[n] for n, _ in items if n in reports]
        _write_summary(summary, ordered, skips)
        timings["reports"] += time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    return ValidationResult(
        reports=tuple(reports[n] for n, _ in items if n in reports),
        skipped=tuple(skips),
        out_dir=str(out) if out is not None else None,
        summary_path=str(summary) if summary is not None else None,
        timings=timings,
        simulated_seconds=simulated,
    )
