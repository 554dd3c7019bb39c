"""Dataset preprocessing: many clips onto one robot, resumable, with bad clips skipped and listed.

:func:`convert_clips` runs, for every clip, ``load_motion`` -> ``retarget`` (a named or given
configuration) -> ``ArticulationMotionMapper.to_articulation_motion`` and writes one articulation motion
``.npz`` per clip (atomically). Each output records a fingerprint of its input (the clip's bytes, the
model's layout signature and the options); a second run skips clips whose output is up to date, redoes
stale ones, and never stops at a bad clip: the error is kept in the report and the next clip is tried.
A ``convert_summary.json`` in the output folder lists every clip's outcome.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._files import atomic_write
from ..errors import FormatError

__all__ = [
    "ConvertOptions",
    "ClipOutcome",
    "BatchReport",
    "convert_clips",
    "clip_names",
    "map_clip",
    "SUMMARY_NAME",
]

SUMMARY_NAME = "convert_summary.json"


@dataclass(frozen=True)
class ConvertOptions:
    """What a conversion does (part of every output's fingerprint).

    Attributes:
        config: name of a shipped retarget configuration (``ke.retarget.list_retarget_configs()``).
        free_root: the layout's free root (``ArticulationCoordinateLayout.from_data(free_root=...)``).
        clamp_to_limits: clamp hinge/slide values into their limits (the residual reports the cost).
        fps: resample every clip to this rate before mapping (``None``: keep the clip's own rate).
        order: body order of the model (``"DFS"`` or ``"BFS"``).
    """

    config: str
    free_root: bool = True
    clamp_to_limits: bool = False
    fps: float | None = None
    order: str = "DFS"


@dataclass(frozen=True)
class ClipOutcome:
    """One clip of a batch.

    Attributes:
        source: the clip file. output: the written ``.npz`` (``None`` when failed).
        status: ``"converted"``, ``"up_to_date"`` (skipped on resume) or ``"failed"``.
        error: the error message of a failed clip (its type first).
        frames, fps: of the written motion. seconds: wall time spent on the clip.
        residual_mean_rad, residual_max_rad: the mapper's residual angles over frames and bodies.
    """

    source: str
    output: str | None
    status: str
    error: str | None = None
    frames: int | None = None
    fps: float | None = None
    seconds: float = 0.0
    residual_mean_rad: float | None = None
    residual_max_rad: float | None = None


@dataclass(frozen=True)
class BatchReport:
    """Outcomes of :func:`convert_clips` in the order the clips were given."""

    outcomes: tuple[ClipOutcome, ...]
    options: ConvertOptions
    model: str
    model_signature: str
    summary_path: str | None = None

    def _status(self, status: str) -> tuple[ClipOutcome, ...]:
        return tuple(o for o in self.outcomes if o.status == status)

    @property
    def converted(self) -> tuple[ClipOutcome, ...]:
        return self._status("converted")

    @property
    def up_to_date(self) -> tuple[ClipOutcome, ...]:
        return self._status("up_to_date")

    @property
    def failed(self) -> tuple[ClipOutcome, ...]:
        return self._status("failed")

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "model_signature": self.model_signature,
            "options": asdict(self.options),
            "counts": {s: len(self._status(s)) for s in ("converted", "up_to_date", "failed")},
            "clips": [asdict(o) for o in self.outcomes],
        }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fingerprint(source_sha: str, signature: str, options: ConvertOptions) -> str:
    text = json.dumps({"source": source_sha, "model": signature, "options": asdict(options)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def clip_names(clips: Sequence[str | os.PathLike]) -> list[str]:
    """One name per clip: its file stem, or ``<stem>-<8 hex of the path>`` for clips that share a stem."""
    stems = [Path(c).stem for c in clips]
    return [
        s if stems.count(s) == 1 else f"{s}-{hashlib.sha256(os.fsencode(c)).hexdigest()[:8]}"
        for c, s in zip(clips, stems)
    ]


def map_clip(path, desc, mapper, config: str, *, clamp_to_limits: bool = False, fps: float | None = None):
    """``load_motion`` -> (optional resample to ``fps``) -> ``retarget_motion(config)`` onto ``desc`` ->
    ``mapper.to_articulation_motion``.

    Returns:
        ``(mapping, retarget_result, source_motion)``: the mapper's
        :class:`~kangengine.animation.MappingResult`, the :class:`~kangengine.retarget.RetargetResult`, and
        the clip as read.
    """
    from ..retarget import retarget_motion
    from .load import load_motion

    motion = load_motion(path)
    if fps is not None:
        motion = motion.resample(fps)
    moved = retarget_motion(motion, config, desc)
    return mapper.to_articulation_motion(moved.motion, clamp_to_limits=clamp_to_limits), moved, motion


_WORKER_CACHE: dict = {}


def _setup(model: str, options: ConvertOptions):
    key = (model, options.order, options.free_root)
    if key not in _WORKER_CACHE:
        from ..animation import ArticulationCoordinateLayout, ArticulationMotionMapper
        from ..asset import load

        desc = load(model, order=options.order)
        layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=options.free_root)
        _WORKER_CACHE[key] = (desc, layout, ArticulationMotionMapper(layout))
    return _WORKER_CACHE[key]


def _existing_fingerprint(path: Path) -> str | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return json.loads(str(z["metadata_json"])).get("fingerprint")
    except Exception:  # an unreadable or foreign file is stale: it gets rewritten
        return None


def _convert_one(source: str, output: str, model: str, options: ConvertOptions, overwrite: bool) -> ClipOutcome:
    from ..animation import save_articulation_motion_npz

    t0 = time.perf_counter()
    src, out = Path(source), Path(output)
    try:
        desc, layout, mapper = _setup(model, options)
        fingerprint = _fingerprint(_sha256(src), layout.model_signature, options)
        if not overwrite and out.is_file() and _existing_fingerprint(out) == fingerprint:
            return ClipOutcome(source, output, "up_to_date", seconds=time.perf_counter() - t0)
        mapped, moved, motion = map_clip(
            src, desc, mapper, options.config, clamp_to_limits=options.clamp_to_limits, fps=options.fps
        )
        res = np.asarray(mapped.residual_angles, dtype=np.float64)
        art = mapped.motion
        art.metadata.update(
            {
                "source_file": os.fspath(src),
                "source_fps": motion.fps,
                "fingerprint": fingerprint,
                "retarget_config": options.config,
                "retarget_scale": float(moved.scale),
                "residual_mean_rad": float(res.mean()),
                "residual_max_rad": float(res.max()),
                "clamped_max": float(np.abs(mapped.clamped).max()) if mapped.clamped.size else 0.0,
            }
        )
        save_articulation_motion_npz(out, art, layout=layout)
        return ClipOutcome(
            source,
            output,
            "converted",
            frames=art.num_frames,
            fps=art.fps(),
            seconds=time.perf_counter() - t0,
            residual_mean_rad=float(res.mean()),
            residual_max_rad=float(res.max()),
        )
    except Exception as exc:  # a bad clip is listed, never allowed to stop the batch
        return ClipOutcome(
            source, None, "failed", error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0
        )


def convert_clips(
    clips: Sequence[str | os.PathLike],
    model: str | os.PathLike,
    *,
    options: ConvertOptions,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    jobs: int = 1,
) -> BatchReport:
    """Convert motion clips onto an articulation, one ``.npz`` per clip, resumably.

    Args:
        clips: motion files any :func:`kangengine.pipelines.load_motion` reader handles (BVH, FBX, AMASS npz,
            poselib npy, SkeletonMotion npz).
        model: the articulation file (MJCF or URDF) the configuration retargets onto.
        options: :class:`ConvertOptions` (the retarget configuration and mapping options).
        out_dir: output folder (created); outputs are ``<clip stem>.npz`` plus ``convert_summary.json``.
        overwrite: redo clips whose output is up to date.
        jobs: worker processes (1: in this process).
    Returns:
        :class:`BatchReport`; failed clips are listed there and in the summary, never raised.
    Raises:
        FormatError: the model cannot be loaded or the configuration does not exist (nothing could be
            converted), or two clips are the same file.
    """
    from ..retarget import load_retarget_config

    load_retarget_config(options.config)  # fail early on an unknown configuration
    model = os.fspath(Path(model).resolve())
    _, layout, _ = _setup(model, options)
    paths = [Path(c).resolve() for c in clips]
    if len(set(paths)) != len(paths):
        raise FormatError("the same clip is listed twice", item="clips")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    targets = [os.fspath(out / f"{n}.npz") for n in clip_names(paths)]
    args = [(os.fspath(p), t, model, options, overwrite) for p, t in zip(paths, targets)]
    if jobs <= 1 or len(args) <= 1:
        outcomes = [_convert_one(*a) for a in args]
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            outcomes = list(pool.map(_convert_one, *zip(*args)))
    report = BatchReport(tuple(outcomes), options, model, layout.model_signature)
    summary = out / SUMMARY_NAME
    text = json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n"
    atomic_write(summary, lambda f: f.write(text.encode()))
    return BatchReport(report.outcomes, options, model, layout.model_signature, os.fspath(summary))
