"""The validate workflow: track clips in physics and write one report per clip, resumably.

:func:`validate` tracks the clips (:func:`kangengine.sim.track`), turns the per-frame metrics into
numbers and reasons (:func:`kangengine.sim.verdict.summarize`, thresholds in
:class:`~kangengine.sim.ValidationThresholds`) and writes, for each clip, ``<name>.json`` and ``<name>.png``
into the output folder, plus ``summary.csv`` listing every clip (skipped ones with their error). Writes are
atomic. A second run with the same inputs skips clips whose report exists and records the same input hash
(model, clip, settings, thresholds, report version, KangEngine version).

JSON reports are deterministic: keys sorted, floats written with 6 significant digits, no timestamps or
machine paths, so the same input gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .. import __version__
from .._files import atomic_write, load_npz
from ..animation.motion import ArticulationMotion, load_articulation_motion_npz
from ..errors import DuplicateNameError, FormatError, KangEngineError, ShapeError, UnknownNameError
from ..sim.model import Model
from ..sim.tracking import Controller, TrackingSettings, track
from ..sim.verdict import (
    TRACKER_CODES,
    Reason,
    Severity,
    ValidationThresholds,
    Verdict,
    json_clean,
    json_number,
    summarize,
    verdict_of,
)
from .convert import map_clip
from .plots import write_plot
from .validate_files import summary_row, write_summary_csv

__all__ = [
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "ClipReport",
    "SkippedClip",
    "ValidationResult",
    "validate",
    "load_for_validation",
]

REPORT_FORMAT = "kangengine.validation_report"
REPORT_VERSION = 1

# clips per track call, in batches of batch_size worlds (slots reused as clips end or fall)
_GROUP_BATCHES = 4


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
        timings: seconds: ``simulation`` (stepping), ``search`` (the sampling fallback's search, see
            :class:`~kangengine.sim.TrackingSettings` ``sampling_fallback``), ``setup`` (references, feed-forward,
            contact fit), ``metrics``, ``reports`` (verdicts, JSON, CSV), ``plots``, ``total``.
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
        raise UnknownNameError(f"no report {name!r}; reports are: {', '.join(r.name for r in self.reports)}")


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
        "dof_armature",
        "dof_damping",
        "dof_friction_coulomb",
        "dof_lower",
        "dof_upper",
        "dof_limit_stiffness",
        "dof_limit_damping",
        "dof_spring_stiffness",
        "dof_spring_ref",
        "dof_effort_limit",
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
    h.update(f"{REPORT_FORMAT}|{REPORT_VERSION}|{__version__}|{model_fp}".encode())
    h.update(np.ascontiguousarray(motion.q).tobytes())
    h.update(np.ascontiguousarray(motion.qd).tobytes())
    h.update(repr(float(motion.fps())).encode())
    h.update(json.dumps(json_clean(settings.to_dict()), sort_keys=True).encode())
    h.update(json.dumps(json_clean(thresholds.to_dict()), sort_keys=True).encode())
    return h.hexdigest()


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _file_stem(name: str) -> str:
    stem = _SAFE.sub("_", name).strip("._") or "clip"
    return stem


def _report_dict(report: ClipReport, model: Model, settings: TrackingSettings, thresholds: ValidationThresholds):
    return json_clean(
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


def _named_items(motions, names) -> list[tuple[str, object]]:
    if isinstance(motions, ArticulationMotion):
        motions = [motions]
    if isinstance(motions, Mapping):
        return [(str(k), v) for k, v in motions.items()]
    motions = list(motions)
    nm = list(names) if names is not None else [f"clip_{i}" for i in range(len(motions))]
    if len(nm) != len(motions):
        raise ShapeError(f"{len(nm)} names for {len(motions)} clips", item="names")
    return list(zip(nm, motions))


def _report_stems(items, report_stems: Mapping[str, str] | None) -> dict[str, str]:
    """Name -> report file stem; two names with one stem are refused (they would overwrite each other)."""
    stem_of = {name: (report_stems or {}).get(name) or _file_stem(name) for name, _ in items}
    seen: dict[str, str] = {}
    for name, _ in items:
        stem = stem_of[name]
        if stem in seen:
            raise DuplicateNameError(
                f"clips {seen[stem]!r} and {name!r} would write the same report {stem}.json", item="names"
            )
        seen[stem] = name
    return stem_of


def _earlier_report(stem: Path, name: str, input_hash: str, plots: bool) -> ClipReport | None:
    """The report an earlier run wrote at ``stem`` (.json, .png) for the same clip and input, or ``None``."""
    old = _read_report(stem.with_name(stem.name + ".json"))
    png = stem.with_name(stem.name + ".png")
    if old is None or old.get("input_hash") != input_hash or old.get("clip") != name or (plots and not png.is_file()):
        return None
    return _from_dict(old, str(stem.with_name(stem.name + ".json")), str(png) if png.is_file() else None)


def _write_summary(path: Path, reports: Sequence[ClipReport], skipped: Sequence[SkippedClip]) -> None:
    rows = [summary_row(r.name, r.verdict.value, r.reason_codes, r.metrics) for r in reports]
    rows += [summary_row(s.name, "skipped", (), {}, error=s.error) for s in skipped]
    write_summary_csv(path, rows)


# -- validate -------------------------------------------------------------------------------------------------


def validate(
    model: Model,
    motions: ArticulationMotion | Sequence[ArticulationMotion] | Mapping[str, ArticulationMotion],
    *,
    names: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    settings: TrackingSettings | None = None,
    thresholds: ValidationThresholds | None = None,
    plots: bool = True,
    resume: bool = True,
    batch_size: int = 64,
    skipped: Mapping[str, str] | None = None,
    report_stems: Mapping[str, str] | None = None,
    summary: bool = True,
    on_report: Callable[[ClipReport], None] | None = None,
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
        batch_size: worlds simulated together; clips are taken longest first, and a world whose clip ends,
            falls or diverges takes the next clip (its report still covers the whole clip). A clip the ``PD``
            tracker loses (free root, no root assistance, ``settings.sampling_fallback``) and that no
            reference-side rule rejects is tracked again with ``controller="sampling"`` and reported so.
        skipped: clips that failed before validation (name -> error), listed in the summary.
        report_stems: name -> file stem relative to ``out_dir``, ``/`` for sub-folders (``walks/02_01`` writes
            ``walks/02_01.json``); default: the name with characters other than ``A-Za-z0-9._-`` replaced.
        summary: write ``summary.csv`` (a batch of files writes its own from its manifest).
        on_report: called with each clip's :class:`ClipReport` once its files are written (resumed ones
            too).
    Returns:
        :class:`ValidationResult`. Clips that cannot be validated (wrong layout, shorter than one step) are
        listed in ``skipped`` with the error; the others are reported.
    """
    t_start = time.perf_counter()
    settings = settings if settings is not None else TrackingSettings()
    thresholds = thresholds if thresholds is not None else ValidationThresholds()
    items = _named_items(motions, names)
    stem_of = _report_stems(items, report_stems)
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
        earlier = _earlier_report(out / stem_of[name], name, h, plots) if resume and out is not None else None
        if earlier is not None:
            reports[name] = earlier
            if on_report is not None:
                on_report(earlier)
            continue
        todo.append((name, motion, h))

    timings = {"setup": 0.0, "search": 0.0, "simulation": 0.0, "metrics": 0.0, "reports": 0.0, "plots": 0.0}
    simulated = 0.0
    order = sorted(range(len(todo)), key=lambda j: (-todo[j][1].duration, todo[j][0]))
    bs = max(int(batch_size), 1)
    # batch_size worlds step together; a world whose clip ends, falls (early stop) or diverges takes the
    # next clip of its group (longest first); groups of _GROUP_BATCHES batches bound the memory of a call
    track_settings = replace(
        settings,
        fall_body_error=thresholds.fall_body_error,
        fall_root_height_ratio=thresholds.fall_root_height_ratio,
    )
    group = bs * _GROUP_BATCHES
    for b0 in range(0, len(order), group):
        batch = [todo[j] for j in order[b0 : b0 + group]]
        try:
            result = track(
                model,
                [m for _, m, _ in batch],
                settings=track_settings,
                names=[n for n, _, _ in batch],
                num_worlds=bs,
            )
        except KangEngineError as exc:
            for name, _, _ in batch:
                skips.append(SkippedClip(name, f"{type(exc).__name__}: {exc}"))
            continue
        for k in ("setup", "simulation", "metrics"):
            timings[k] += result.timings.get(k, 0.0)
        tracked = [
            (result, j, *summarize(result, j, motion, model, thresholds)) for j, (_, motion, _) in enumerate(batch)
        ]
        _sampling_fallback(model, batch, tracked, track_settings, thresholds, bs, timings)
        for j, (name, motion, h) in enumerate(batch):
            t0 = time.perf_counter()
            result, jr, metrics, reasons = tracked[j]
            rep = ClipReport(
                name=name,
                verdict=verdict_of(reasons),
                reasons=tuple(reasons),
                metrics=json_clean(metrics),
                input_hash=h,
            )
            simulated += motion.duration
            if out is not None:
                stem = stem_of[name]
                jpath = out / f"{stem}.json"
                data = _dumps(_report_dict(rep, model, settings, thresholds))
                atomic_write(jpath, lambda f, d=data: f.write(d))
                rep = ClipReport(**{**rep.__dict__, "report_path": str(jpath)})
                timings["reports"] += time.perf_counter() - t0
                if plots:
                    t1 = time.perf_counter()
                    ppath = write_plot(out / f"{stem}.png", result, jr, rep, thresholds=thresholds)
                    rep = ClipReport(**{**rep.__dict__, "plot_path": str(ppath)})
                    timings["plots"] += time.perf_counter() - t1
            else:
                timings["reports"] += time.perf_counter() - t0
            reports[name] = rep
            if on_report is not None:
                on_report(rep)
    summary_path = None
    if out is not None and summary:
        t0 = time.perf_counter()
        summary_path = out / "summary.csv"
        ordered = [reports[n] for n, _ in items if n in reports]
        _write_summary(summary_path, ordered, skips)
        timings["reports"] += time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    return ValidationResult(
        reports=tuple(reports[n] for n, _ in items if n in reports),
        skipped=tuple(skips),
        out_dir=str(out) if out is not None else None,
        summary_path=str(summary_path) if summary_path is not None else None,
        timings=timings,
        simulated_seconds=simulated,
    )


def _wants_fallback(model: Model, settings: TrackingSettings, reasons: Sequence[Reason]) -> bool:
    """The ``PD`` tracker (free root, no root assistance) lost the clip
    (:data:`~kangengine.sim.verdict.TRACKER_CODES`) and no other rule rejects it: another controller may change
    the verdict."""
    if not settings.sampling_fallback or settings.controller is not Controller.PD or not model.layout.free_root:
        return False
    if settings.root_assist_frequency_hz > 0:
        return False
    lost = any(r.code in TRACKER_CODES and r.severity is not Severity.INFO for r in reasons)
    other = any(r.code not in TRACKER_CODES and r.severity is Severity.REJECT for r in reasons)
    return lost and not other


def _sampling_fallback(model, batch, tracked, settings, thresholds, num_worlds, timings) -> None:
    """Track again, with :attr:`~kangengine.sim.Controller.SAMPLING`, the clips of ``batch`` whose ``tracked``
    entry (result, index, metrics, reasons) :func:`_wants_fallback`, and put that result in their place with an
    info reason naming what the ``PD`` tracker did."""
    redo = [j for j, (_, _, _, reasons) in enumerate(tracked) if _wants_fallback(model, settings, reasons)]
    if not redo:
        return
    again = track(
        model,
        [batch[j][1] for j in redo],
        settings=replace(settings, controller=Controller.SAMPLING),
        names=[batch[j][0] for j in redo],
        num_worlds=num_worlds,
    )
    for k in ("search", "simulation", "metrics"):
        timings[k] += again.timings.get(k, 0.0)
    for i, j in enumerate(redo):
        _, _, pd_metrics, pd_reasons = tracked[j]
        metrics, reasons = summarize(again, i, batch[j][1], model, thresholds)
        lost = [r.code for r in pd_reasons if r.code in TRACKER_CODES and r.severity is not Severity.INFO]
        fell = pd_metrics.get("fell_at_s")
        msg = (
            f"the PD tracker lost the clip ({', '.join(lost)}"
            + (f", fell at {fell:.2f} s" if fell is not None else "")
            + f", mean body error {pd_metrics['body_error_mean_m']:.3f} m); the sampling search tracked it instead"
        )
        reasons = sorted(
            [
                *reasons,
                Reason(
                    "sampling_fallback", Severity.INFO, msg, json_number(fell if fell is not None else math.nan), None
                ),
            ],
            key=lambda r: {Severity.REJECT: 0, Severity.WARN: 1, Severity.INFO: 2}[r.severity],
        )
        metrics["pd_body_error_mean_m"] = pd_metrics["body_error_mean_m"]
        metrics["pd_fell_at_s"] = fell
        tracked[j] = (again, i, metrics, reasons)


def load_for_validation(
    path,
    layout,
    desc,
    config: str | None,
    mapper,
    *,
    clamp_to_limits: bool = True,
    fps: float | None = None,
    load_options: Mapping | None = None,
) -> ArticulationMotion:
    """An :class:`~kangengine.animation.ArticulationMotion` of ``layout`` from an articulation ``.npz``
    (``kangengine convert``) or, with a retarget configuration, from any motion file (load -> retarget -> map,
    clamped to the joint limits).

    Args:
        path: the clip file.
        layout, desc: the model's coordinate layout and description; mapper: an
            :class:`~kangengine.animation.ArticulationMotionMapper` of ``layout``.
        config: retarget configuration name or file for motion files (``None``: only ``.npz`` are accepted).
        clamp_to_limits, fps, load_options: for motion files, as in :func:`kangengine.pipelines.map_clip`
            (``fps`` resamples before retargeting; an articulation ``.npz`` is used as written).
    Raises:
        FormatError: a motion file without ``config``; whatever the readers raise for a bad file.
    """
    path = Path(path)
    if path.suffix.lower() == ".npz":
        z = load_npz(path, kind="motion")
        if str(z.get("format", "")) == "kangengine.articulation_motion":
            return load_articulation_motion_npz(path, layout)
    if config is None:
        raise FormatError(
            "is not an articulation motion (.npz from `kangengine convert`); give --config to retarget it", path=path
        )
    mapped = map_clip(path, desc, mapper, config, clamp_to_limits=clamp_to_limits, fps=fps, load_options=load_options)
    return mapped[0].motion
