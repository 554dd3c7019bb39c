"""The validate workflow on files, as a dataset batch: clips from files, folders and globs, reports mirrored
under ``--out``, a manifest that accumulates across runs, resume, workers and shards.

:func:`validate_clips` loads each clip (an articulation ``.npz`` from ``kangengine convert``, or any motion
file retargeted with a configuration), tracks it with :func:`kangengine.pipelines.validate` (clips in
batches of ``batch_size``) and records one manifest line per clip (verdict, reasons, headline numbers,
report file, warnings; or the error of a clip that could not be read). ``summary.csv`` is rewritten from the
manifests after every batch, so it lists every clip ever validated into the folder.

This module needs no torch at import (the summary is written without the simulator); the workers load it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._files import atomic_write
from ..errors import FileMissingError, FormatError

__all__ = [
    "ValidationOptions",
    "ValidationBatchReport",
    "validate_clips",
    "write_validation_summary",
    "summary_row",
    "write_summary_csv",
    "CSV_COLUMNS",
    "SUMMARY_CSV",
]

SUMMARY_CSV = "summary.csv"

#: Metrics (``ClipReport.metrics`` keys) written as ``summary.csv`` columns, in order.
CSV_COLUMNS = (
    "body_error_mean_m",
    "body_error_peak_m",
    "root_drift_final_m",
    "heading_drift_final_rad",
    "fell_at_s",
    "impossible_fraction",
    "skating_fraction",
    "longest_airborne_s",
    "reference_penetration_max_m",
    "feedforward_over_threshold_fraction",
    "residual_force_max_over_weight",
    "assist_force_mean_over_weight",
    "assist_torque_mean_nm",
)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    return f"{float(v):.6g}"


def summary_row(name: str, verdict: str, reason_codes: Sequence[str], metrics: Mapping, *, error: str = "") -> list:
    """One ``summary.csv`` row: clip, verdict, reasons (``;``-joined), duration, :data:`CSV_COLUMNS`, error."""
    return (
        [name, verdict, ";".join(reason_codes), _fmt(metrics.get("duration_s"))]
        + [_fmt(metrics.get(k)) for k in CSV_COLUMNS]
        + [error or ""]
    )


def write_summary_csv(path: str | os.PathLike, rows: Sequence[list]) -> Path:
    """Write ``summary.csv`` (header, then ``rows`` sorted by clip name), atomically."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["clip", "verdict", "reasons", "duration_s", *CSV_COLUMNS, "error"])
    for row in sorted(rows, key=lambda x: x[0]):
        w.writerow(row)
    data = buf.getvalue().encode()
    return atomic_write(path, lambda f: f.write(data))


def write_validation_summary(out_dir: str | os.PathLike, entries: Mapping[str, dict]) -> Path:
    """``summary.csv`` of ``out_dir`` from manifest entries (latest per clip): validated clips with their
    verdict and numbers, failed ones with verdict ``skipped`` and their error."""
    rows = []
    for e in entries.values():
        if e["status"] == "done":
            rows.append(summary_row(e["name"], e["verdict"], e.get("reasons", ()), e.get("metrics", {})))
        else:
            rows.append(summary_row(e["name"], "skipped", (), {}, error=e.get("error") or ""))
    return write_summary_csv(Path(out_dir) / SUMMARY_CSV, rows)


@dataclass(frozen=True)
class ValidationOptions:
    """How :func:`validate_clips` builds the simulator and reads clips (part of every clip's fingerprint).

    Attributes:
        config: retarget configuration for motion files (``None``: articulation ``.npz`` only).
        order: body order (``"DFS"``/``"BFS"``). free_root: a free root block.
        dtype: ``"float32"`` or ``"float64"``. device: torch device (``"cpu"``, ``"cuda"``).
        plots: write ``<clip>.png``. clamp_to_limits: clamp retargeted motion files into the joint limits.
        fps: resample motion files before retargeting (``None``: their own rate).
        batch_size: clips simulated together (not part of the fingerprint).
        effort_limit: ``{joint or DOF name: N m or N}`` replacing the model file's effort limits for those
            DOFs (``None``: the file's), e.g. :func:`~kangengine.sim.read_effort_limits` of
            ``kangengine.data.CMU_HUMANOID_TRACKING_EFFORT``.
    """

    config: str | None = None
    order: str = "DFS"
    free_root: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    plots: bool = True
    clamp_to_limits: bool = True
    fps: float | None = None
    batch_size: int = 64
    effort_limit: dict | None = None


@dataclass(frozen=True)
class ValidationBatchReport:
    """One :func:`validate_clips` run.

    Attributes:
        entries: manifest entry (dict) per clip of this run, sorted by relative path; ``status`` is
            ``done`` (with ``verdict``, ``reasons``, ``metrics``, ``report``) or ``failed`` (with ``error``);
            ``up_to_date`` is true for clips found done by an earlier run.
        out_dir, summary_path, manifest_path: where the files are.
    """

    entries: tuple[dict, ...]
    out_dir: str
    summary_path: str
    manifest_path: str
    counts: dict = field(default_factory=dict)

    @property
    def failed(self) -> tuple[dict, ...]:
        return tuple(e for e in self.entries if e["status"] == "failed")

    @property
    def rejected(self) -> tuple[dict, ...]:
        return tuple(e for e in self.entries if e.get("verdict") == "reject")


# -- workers --------------------------------------------------------------------------------------------------

_MODEL_CACHE: dict = {}


def _setup_model(model: str, model_sha: str, options: ValidationOptions):
    efforts = tuple(sorted((options.effort_limit or {}).items()))
    key = (model_sha, options.order, options.free_root, options.dtype, options.device, efforts)
    if key not in _MODEL_CACHE:
        import warnings

        import torch

        from ..animation import ArticulationCoordinateLayout, ArticulationMotionMapper
        from ..asset import load
        from ..sim import ContactParams, Model

        _MODEL_CACHE.clear()
        desc = load(model, order=options.order)
        layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=options.free_root)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # link-to-link pairs for the self_collision rule (simulated only with TrackingSettings.self_collision)
            sim_model = Model.from_desc(
                desc,
                layout,
                device=options.device,
                dtype=getattr(torch, options.dtype),
                contact=ContactParams(self_collision=True),
                effort_limit=dict(efforts) if efforts else None,
            )
        _MODEL_CACHE[key] = (desc, layout, ArticulationMotionMapper(layout), sim_model)
    return _MODEL_CACHE[key]


@dataclass(frozen=True)
class _Clip:
    source: str
    rel: str
    name: str  # report stem (cleaned, unique; "/" for sub-folders)
    previous_fingerprint: str | None
    previous_status: str | None


@dataclass(frozen=True)
class _Chunk:
    clips: tuple[_Clip, ...]
    out_dir: str
    model: str
    model_sha: str
    options: ValidationOptions
    settings: object
    thresholds: object
    load_options: dict
    job_fingerprint: str
    overwrite: bool
    retry_failed: bool


def _base(clip: _Clip, fingerprint, t0) -> dict:
    return {
        "command": "validate",
        "clip": clip.rel,
        "name": clip.name,
        "source": clip.source,
        "fingerprint": fingerprint,
        "seconds": round(time.perf_counter() - t0, 3),
        "warnings": [],
    }


def _load_chunk(chunk: _Chunk, desc, layout, mapper):
    from .batch import file_sha256, recorded_warnings, regular_file_problem
    from .validate import load_for_validation

    o = chunk.options
    motions, fingerprints, early, notes = {}, {}, [], {}
    for clip in chunk.clips:
        t0 = time.perf_counter()
        fingerprint = None
        try:
            problem = regular_file_problem(clip.source)
            if problem is not None:
                raise FormatError(problem, path=clip.source)
            fingerprint = hashlib.sha256(f"{file_sha256(clip.source)}|{chunk.job_fingerprint}".encode()).hexdigest()
            report = Path(chunk.out_dir) / f"{clip.name}.json"
            if not chunk.overwrite and fingerprint == clip.previous_fingerprint:
                if clip.previous_status == "done" and report.is_file():
                    early.append({**_base(clip, fingerprint, t0), "status": "up_to_date"})
                    continue
                if clip.previous_status == "failed" and not chunk.retry_failed:
                    early.append({**_base(clip, fingerprint, t0), "status": "failed_before"})
                    continue
            with recorded_warnings() as caught:
                motions[clip.name] = load_for_validation(
                    Path(clip.source),
                    layout,
                    desc,
                    o.config,
                    mapper,
                    clamp_to_limits=o.clamp_to_limits,
                    fps=o.fps,
                    load_options=chunk.load_options,
                )
            fingerprints[clip.name] = fingerprint
            notes[clip.name] = caught
        except Exception as exc:  # a bad clip is listed, never allowed to stop the batch
            early.append({**_base(clip, fingerprint, t0), "status": "failed", "error": f"{type(exc).__name__}: {exc}"})
    return motions, fingerprints, early, notes


def _validate_chunk(chunk: _Chunk) -> list[dict]:
    from .batch import recorded_warnings
    from .validate import validate

    t0 = time.perf_counter()
    desc, layout, mapper, model = _setup_model(chunk.model, chunk.model_sha, chunk.options)
    motions, fingerprints, entries, notes = _load_chunk(chunk, desc, layout, mapper)
    if not motions:
        return entries
    by_name = {c.name: c for c in chunk.clips}
    with recorded_warnings() as caught:
        result = validate(
            model,
            motions,
            out_dir=chunk.out_dir,
            settings=chunk.settings,
            thresholds=chunk.thresholds,
            plots=chunk.options.plots,
            resume=not chunk.overwrite,
            batch_size=len(motions),
            report_stems={n: n for n in motions},
            summary=False,
        )
    for rep in result.reports:
        clip = by_name[rep.name]
        entries.append(
            {
                **_base(clip, fingerprints[rep.name], t0),
                "status": "done",
                "verdict": rep.verdict.value,
                "reasons": list(rep.reason_codes),
                "metrics": {k: rep.metrics.get(k) for k in ("duration_s", *CSV_COLUMNS)},
                "report": f"{clip.name}.json",
                "plot": f"{clip.name}.png" if rep.plot_path else None,
                "resumed": rep.resumed,
                "warnings": notes[rep.name] + caught,
            }
        )
    for s in result.skipped:
        clip = by_name[s.name]
        entries.append({**_base(clip, fingerprints.get(s.name), t0), "status": "failed", "error": s.error})
    return entries


def _job_fingerprint(model_sha, config, options, settings, thresholds, load_options) -> str:
    from .. import __version__

    text = json.dumps(
        {
            "model_sha256": model_sha,
            "config": config,
            "options": {k: v for k, v in asdict(options).items() if k != "batch_size"},
            "settings": settings.to_dict(),
            "thresholds": thresholds.to_dict(),
            "load_options": {k: v for k, v in sorted((load_options or {}).items()) if v is not None},
            "kangengine": __version__,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


# -- the batch ------------------------------------------------------------------------------------------------


def validate_clips(
    clips: Sequence[str | os.PathLike],
    model: str | os.PathLike,
    *,
    out_dir: str | os.PathLike,
    options: ValidationOptions | None = None,
    settings=None,
    thresholds=None,
    overwrite: bool = False,
    workers: int = 1,
    threads: int = 1,
    load_options: Mapping | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    retry_failed: bool = False,
    progress: Callable[[int, int, dict], None] | None = None,
    ray: str | None = None,
) -> ValidationBatchReport:
    """Validate clip files in physics, resumably, one report per clip mirrored under ``out_dir``.

    Args:
        clips: articulation ``.npz`` files (``kangengine convert``) or, with ``options.config``, any motion
            file; folders (recursive) and globs too. A symlink is read by its own name's extension; a file
            that is not regular (a FIFO, a device) is listed as failed without being opened.
        model: MJCF or URDF file.
        out_dir: output folder (checked writable first): ``<rel stem>.json`` (and ``.png``) per clip, the
            clip's path relative to the inputs' common folder mirrored (characters other than
            ``A-Za-z0-9._-`` become ``_``; names that clean to the same file get ``-<8 hex>``),
            ``manifest.jsonl`` and ``summary.csv``.
        options: :class:`ValidationOptions`. settings: :class:`~kangengine.sim.TrackingSettings`.
            thresholds: :class:`~kangengine.sim.ValidationThresholds`.
        overwrite: redo clips that are done. retry_failed: read again clips that failed with the same input.
        workers: processes (each simulates its batches with ``threads`` torch threads).
        load_options: reader keyword arguments for motion files (``scale``, ``up_axis``, ``model_dir``).
        shard_index, shard_count: only shard ``I`` of ``N``: the sorted clips are cut into batches of
            ``options.batch_size`` and the shard takes batches ``I, I+N, ...``; recorded in
            ``manifest.shard-I-of-N.jsonl`` (``kangengine merge`` writes the summary of all shards). Reports
            are byte-identical for any worker or shard count (the same clips share a batch).
        progress: called after each clip with ``(finished, due, entry)``.
        ray: simulate the batches as Ray tasks: ``"local"`` or a cluster's address
            (:func:`kangengine.pipelines.batch.run_tasks`); the same files as ``workers=1``.
    Returns:
        :class:`ValidationBatchReport`.
    Raises:
        FileMissingError: no model file. OutputFolderError: ``out_dir`` not writable.
        BatchInterrupted: Ctrl-C (what finished is in the manifest and the summary).
    """
    from ..retarget import load_retarget_config
    from ..sim.tracking import TrackingSettings
    from ..sim.verdict import ValidationThresholds
    from . import batch
    from .load import MOTION_LOADERS

    options = options or ValidationOptions()
    settings = settings if settings is not None else TrackingSettings()
    thresholds = thresholds if thresholds is not None else ValidationThresholds()
    config = None if options.config is None else load_retarget_config(options.config).to_dict()
    model = os.fspath(Path(model).absolute())
    if not Path(model).is_file():
        raise FileMissingError("no such model file", path=model)
    model_sha = batch.file_sha256(model)
    out = batch.check_out_dir(out_dir)
    sources = batch.collect_clips(clips, extensions=MOTION_LOADERS)
    names = batch.output_stems([c.rel for c in sources], clean=True)
    # Clips are simulated in fixed batches of the whole sorted list, and a shard takes whole batches (I, I+N,
    # ...): float32 results depend (in the last digits) on which clips share a batch, so every worker and
    # shard count gives the same batches and byte-identical reports.
    size = max(int(options.batch_size), 1)
    every = list(zip(sources, names))
    chunks = batch.shard_of([every[i : i + size] for i in range(0, len(every), size)], shard_index, shard_count)
    mine = [item for chunk in chunks for item in chunk]
    manifest = out / batch.manifest_name(shard_index, shard_count)
    owned = [out / f"{n}{ext}" for _, n in mine for ext in (".json", ".png")]
    batch.clean_stale_temporaries(out, [*owned, out / SUMMARY_CSV])
    entries = batch.read_manifests(out, command="validate")
    job_fp = _job_fingerprint(model_sha, config, options, settings, thresholds, load_options)

    def clip_item(s, n) -> _Clip:
        prev = entries.get(s.rel, {})
        return _Clip(s.path, s.rel, n, prev.get("fingerprint"), prev.get("status"))

    common = (os.fspath(out), model, model_sha, options, settings, thresholds, dict(load_options or {}), job_fp)
    tasks = [(_Chunk(tuple(clip_item(s, n) for s, n in chunk), *common, overwrite, retry_failed),) for chunk in chunks]
    due = len(mine)
    finished: dict[str, dict] = {}

    def record(chunk_entries: list[dict]) -> None:
        for e in sorted(chunk_entries, key=lambda x: x["clip"]):
            if e["status"] == "up_to_date":
                e = {**entries[e["clip"]], "up_to_date": True}
            elif e["status"] == "failed_before":
                e = {**entries[e["clip"]], "up_to_date": True}
            else:
                e = {**e, "time": time.time()}
                batch.append_manifest(manifest, e)
                entries[e["clip"]] = e
            finished[e["clip"]] = e
            if progress is not None:
                progress(len(finished), due, e)
        write_validation_summary(out, entries)

    try:
        batch.run_tasks(_validate_chunk, tasks, workers=workers, threads=threads, on_result=record, ray=ray)
    except KeyboardInterrupt:
        raise batch.BatchInterrupted(len(finished), due, out) from None
    summary = write_validation_summary(out, entries)
    ordered = tuple(finished[s.rel] for s, _ in mine if s.rel in finished)
    counts = {v: sum(e.get("verdict") == v for e in ordered) for v in ("ok", "warn", "reject")}
    counts["failed"] = sum(e["status"] == "failed" for e in ordered)
    counts["up_to_date"] = sum(bool(e.get("up_to_date")) for e in ordered)
    return ValidationBatchReport(ordered, os.fspath(out), os.fspath(summary), os.fspath(manifest), counts)
