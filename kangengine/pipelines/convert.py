"""Dataset preprocessing: many clips onto one robot, resumable, with bad clips listed and the rest done.

:func:`convert_clips` runs, for every clip, one of two paths, chosen by the kind of the configuration
(:func:`config_kind`):

- a skeleton configuration (``ke.retarget.list_retarget_configs()``): ``load_motion`` -> ``retarget_motion``
  onto the robot's own skeleton -> ``ArticulationMotionMapper.to_articulation_motion``;
- a robot configuration (``ke.retarget.list_robot_configs()``, e.g. ``cmu_bvh_to_g1``): ``load_motion`` ->
  ``retarget_to_robot`` (whole-clip IK with contact-correct feet), whose per-clip metrics are written as
  ``<clip>.metrics.json`` next to the output;

and writes one articulation motion ``.npz`` per clip (atomically), mirroring the tree of the inputs. Each
clip's ``quality`` (:func:`skeleton_quality` / :func:`robot_quality`: joint-limit violations, hinges
re-wrapped from wound angles, how far clamping lifted the reference; or the robot metrics' headline numbers)
is in its manifest line and in the summary, with the worst of the folder in the summary's ``quality``.

Each output records a fingerprint of its input (the clip's bytes, the model file's bytes, the retarget
configuration's content, the options and the KangEngine version); ``manifest.jsonl`` records every finished
clip as it finishes, so a second run (after an interruption of any kind) skips clips that are done, redoes
stale ones, and never stops at a bad clip.
``convert_summary.json`` in the output folder lists every clip ever converted there. It is written from the
manifest at the end of a run (also one ended by Ctrl-C, SIGTERM or an error) and during a run at most every
``summary_every_s`` seconds, so the bookkeeping of a clip costs the same in a batch of ten clips or of a
hundred thousand (re-encoding the whole summary after every clip made it quadratic in the batch's size).
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .._files import atomic_write, load_npz
from ..errors import FileMissingError, FormatError, UnknownNameError

__all__ = [
    "ConvertOptions",
    "ClipOutcome",
    "BatchReport",
    "convert_clips",
    "clip_names",
    "map_clip",
    "merge_manifests",
    "write_convert_summary",
    "config_kind",
    "resolve_model_or_config",
    "skeleton_quality",
    "robot_quality",
    "summary_quality",
    "metrics_path",
    "SUMMARY_NAME",
    "SUMMARY_EVERY_S",
    "CLAMP_LIFT_M",
]

SUMMARY_NAME = "convert_summary.json"
#: default seconds between two writes of the summary during a run (it is always written at the end)
SUMMARY_EVERY_S = 10.0
#: a write of the summary during a run waits at least this many times as long as the previous one took, so
#: the summary's share of a run stays under 1 / (1 + this) however many clips the folder lists
_SUMMARY_SPACING = 20.0
#: a frame whose lowest body clamping raised by more than this (m) counts as lifted off the floor
CLAMP_LIFT_M = 0.01


@dataclass(frozen=True)
class ConvertOptions:
    """What a conversion does (part of every output's fingerprint).

    Attributes:
        config: a shipped retarget configuration (``ke.retarget.list_retarget_configs()`` for skeleton
            targets, ``ke.retarget.list_robot_configs()`` for robots) or a configuration ``.json`` file.
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
        name: the clip's path relative to the batch's root (its name in the manifest).
        fingerprint: of the clip's input (``None`` when the file could not be read).
        warnings: the warnings raised while converting it (``"Category: message"``).
        quality: what a user must see about the converted clip (:func:`skeleton_quality` or
            :func:`robot_quality`); ``None`` when not converted in this run.
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
    name: str = ""
    fingerprint: str | None = None
    warnings: tuple[str, ...] = ()
    quality: dict | None = None


@dataclass(frozen=True)
class BatchReport:
    """Outcomes of one :func:`convert_clips` run, sorted by the clips' relative paths.

    Attributes:
        outcomes: :class:`ClipOutcome` per clip of this run (this shard's clips when sharded).
        options, model, model_signature: what the run converted onto.
        summary_path: ``convert_summary.json``; manifest_path: this run's manifest.
    """

    outcomes: tuple[ClipOutcome, ...]
    options: ConvertOptions
    model: str
    model_signature: str
    summary_path: str | None = None
    manifest_path: str | None = None

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


def clip_names(clips: Sequence[str | os.PathLike]) -> list[str]:
    """One name per clip: its file stem, or ``<stem>-<8 hex of the path>`` for clips that share a stem."""
    stems = [Path(c).stem for c in clips]
    taken = collections.Counter(stems)
    return [
        s if taken[s] == 1 else f"{s}-{hashlib.sha256(os.fsencode(c)).hexdigest()[:8]}" for c, s in zip(clips, stems)
    ]


def _reader_options(path: Path, load_options: Mapping | None) -> tuple[dict, list[str]]:
    """The loader options that apply to ``path``'s reader (chosen from the name as given, never the resolved
    link target), and a note per option that does not apply."""
    from .load import MOTION_LOADERS

    opts = {k: v for k, v in (load_options or {}).items() if v is not None}
    if not opts:
        return {}, []
    ext = path.suffix.lower()
    early = []
    if "units" in opts:  # a BVH length unit name ("cm", "cmu", ...): load_bvh's scale
        units = opts.pop("units")
        if ext == ".bvh":
            opts.setdefault("scale", units)
        else:
            early.append(f"option units={units!r} does not apply to {ext} files: ignored")
    if ext == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                amass = "format" not in z.files
        except Exception:  # the reader reports an unreadable file itself
            amass = True
        accepted = {"model_dir", "model_type", "gender", "fps"} if amass else set()
    else:
        target = MOTION_LOADERS.get(ext)
        if target is None:
            return opts, early  # load_motion refuses the extension and names the readers
        from .load import _resolve

        accepted = set(inspect.signature(_resolve(target)).parameters) - {"path"}
    kept = {k: v for k, v in opts.items() if k in accepted}
    notes = [
        f"option {k}={v!r} does not apply to {ext or 'extensionless'} files: ignored"
        for k, v in opts.items()
        if k not in kept
    ]
    return kept, early + notes


def map_clip(
    path,
    desc,
    mapper,
    config: str,
    *,
    clamp_to_limits: bool = False,
    fps: float | None = None,
    load_options: Mapping | None = None,
):
    """``load_motion`` -> (optional resample to ``fps``) -> ``retarget_motion(config)`` onto ``desc`` ->
    ``mapper.to_articulation_motion``.

    Args:
        load_options: reader keyword arguments (``scale``, ``up_axis``, ``model_dir``, ...); those the clip's
            reader does not take are left out with a :class:`UserWarning`.
    Returns:
        ``(mapping, retarget_result, source_motion)``: the mapper's
        :class:`~kangengine.animation.MappingResult`, the :class:`~kangengine.retarget.RetargetResult`, and
        the clip as read.
    """
    import warnings

    from ..retarget import retarget_motion
    from .load import load_motion

    kw, notes = _reader_options(Path(path), load_options)
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    motion = load_motion(path, **kw)
    if fps is not None:
        motion = motion.resample(fps)
    moved = retarget_motion(motion, config, desc)
    return mapper.to_articulation_motion(moved.motion, clamp_to_limits=clamp_to_limits), moved, motion


def config_kind(config: str | os.PathLike) -> str:
    """Which retargeting a configuration is for: ``"robot"`` (:func:`kangengine.retarget.retarget_to_robot`)
    or ``"skeleton"`` (:func:`kangengine.retarget.retarget_motion` onto the robot's own skeleton).

    Args:
        config: a shipped configuration name or a configuration ``.json`` file.
    Raises:
        UnknownNameError: no such shipped configuration (the message lists both kinds).
        FormatError: a file that is neither kind (no ``joint_mapping``, no ``bodies`` or ``extends``).
    """
    from .._files import read_json
    from ..retarget import list_retarget_configs, list_robot_configs

    name = os.fspath(config)
    kind = _shipped_kinds().get(name)
    if kind is not None:
        return kind
    p = Path(name)
    if p.suffix.lower() == ".json" or p.is_file():
        d = read_json(p, kind="retarget configuration")
        if isinstance(d, dict) and "joint_mapping" in d:
            return "skeleton"
        if isinstance(d, dict) and ("bodies" in d or "extends" in d):
            return "robot"
        raise FormatError(
            "is neither a skeleton configuration (with 'joint_mapping') nor a robot configuration (with 'bodies' "
            "or 'extends')",
            path=p,
            item="config",
        )
    raise UnknownNameError(
        f"no retarget configuration {name!r}; skeleton configurations: {', '.join(list_retarget_configs())}; "
        f"robot configurations: {', '.join(list_robot_configs())}",
        item="config",
    )


_SHIPPED_KINDS: list = [None, {}]  # [signature of the shipped configuration files, {name: kind}]


def _shipped_kinds() -> dict[str, str]:
    """``{shipped configuration name: "robot" | "skeleton"}`` (:func:`kangengine.retarget.list_robot_configs`
    first, then :func:`~kangengine.retarget.list_retarget_configs`), kept while the configuration folder's
    ``*.json`` files keep their names, sizes and modification times (a listing reads and parses every file:
    about a millisecond a batch, and twice)."""
    from importlib.resources import files

    from ..retarget import list_retarget_configs, list_robot_configs

    folder = os.fspath(files("kangengine.retarget") / "configs")
    try:
        with os.scandir(folder) as it:
            signature = sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in it if e.name.endswith(".json"))
    except OSError:
        signature = None
    if signature is None or signature != _SHIPPED_KINDS[0]:
        kinds = dict.fromkeys(list_retarget_configs(), "skeleton")
        kinds.update(dict.fromkeys(list_robot_configs(), "robot"))  # a name of both kinds is a robot one
        _SHIPPED_KINDS[:] = [signature, kinds]
    return _SHIPPED_KINDS[1]


def _is_config(value: str) -> bool:
    p = Path(value)
    if p.suffix.lower() == ".json":
        return True  # a configuration file, or a missing one that config_kind then names
    if p.is_file():
        return False  # a model file
    try:
        config_kind(value)
    except (UnknownNameError, FormatError, FileMissingError):
        return False
    return True


def resolve_model_or_config(model_or_config: str | None, config: str | None) -> tuple[str | None, str | None]:
    """The ``(model, config)`` of ``kangengine convert MODEL_OR_CONFIG CLIP... [--config NAME]``.

    ``MODEL_OR_CONFIG`` is the robot model file, or a robot configuration (name or ``.json``) whose model is
    then found as :meth:`kangengine.retarget.RobotRetargetConfig.target_model_path` says (the configuration's
    folder, then the folders of ``KANGENGINE_MODEL_PATH``). Anything else is returned unchanged for the caller
    to check.

    Raises:
        FormatError: a configuration given both ways, differently.
        FileMissingError: the robot configuration's model is found nowhere (the places searched are named).
    """
    if model_or_config is None or not _is_config(model_or_config):
        return model_or_config, config
    if config is not None and config != model_or_config:
        raise FormatError(
            f"two configurations ({model_or_config!r} and --config {config!r}); expected MODEL and --config NAME, "
            "or a robot configuration in place of MODEL",
            item="--config",
        )
    if config_kind(model_or_config) != "robot":
        raise FormatError(
            f"{model_or_config!r} is a skeleton configuration; expected the model file first (MODEL --config NAME)",
            item="MODEL_OR_CONFIG",
        )
    from ..retarget.robot_config import RobotRetargetConfig, _config_file

    cfg = RobotRetargetConfig.from_json(_config_file(model_or_config))
    return os.fspath(cfg.target_model_path()), model_or_config


def metrics_path(output: str | os.PathLike) -> Path:
    """The metrics file of a robot-retargeted output: ``walk.npz`` -> ``walk.metrics.json`` beside it."""
    out = Path(output)
    return out.with_name(f"{out.stem}.metrics.json")


def robot_quality(metrics: Mapping) -> dict:
    """The headline numbers of :func:`kangengine.retarget.retarget_to_robot`'s metrics (m, cm, shares of
    contact frames, counts of (frame, joint) entries) for a clip's manifest line and the summary."""
    key = metrics.get("key_body_error_m", {})
    return {
        "key_body_error_m_mean": float(key.get("mean", 0.0)),
        "key_body_error_m_max": float(key.get("max", 0.0)),
        "floating_share": float(metrics.get("floating_share", 0.0)),
        "slide_per_phase_cm_max": float(metrics.get("slide_per_phase_cm_max", 0.0)),
        "slide_beyond_source_cm_max": float(metrics.get("slide_beyond_source_cm_max", 0.0)),
        "penetration_m": float(metrics.get("penetration_m", 0.0)),
        "joint_limit_hits": int(metrics.get("joint_limit_hits", 0)),
        "joints_outside_limits": int(metrics.get("joints_outside_limits", 0)),
        "dropped_leading_frames": int(metrics.get("dropped_leading_frames", 0)),
        "scale": float(metrics.get("scale", 0.0)),
    }


def skeleton_quality(mapper_metadata: Mapping, lift_m: np.ndarray) -> dict:
    """What the mapper recorded about a clip (``motion.metadata["mapper"]``) and how far clamping lifted it.

    Args:
        mapper_metadata: the mapper's summary: ``limit_violation_max`` (rad or m, before clamping),
            ``limit_violation_dofs``, ``clamped_max``, ``rewrapped_frames`` (frames per hinge brought back
            from a wound angle).
        lift_m: ``[frames]`` m, height of the lowest body after clamping minus before (:func:`_clamp_lift`).
    Returns:
        ``limit_violation_max``, ``limit_violation_dofs`` (the worst DOF names), ``clamped_max``,
        ``rewrapped_frames`` (``{dof: frames}``), ``clamp_lift_m_max`` and ``clamp_lifted_share`` (share of
        frames lifted by more than :data:`CLAMP_LIFT_M`).
    """
    lift = np.asarray(lift_m, dtype=np.float64)
    return {
        "limit_violation_max": float(mapper_metadata.get("limit_violation_max", 0.0)),
        "limit_violation_dofs": sorted(mapper_metadata.get("limit_violation_dofs", {})),
        "clamped_max": float(mapper_metadata.get("clamped_max", 0.0)),
        "rewrapped_frames": {str(k): int(v) for k, v in mapper_metadata.get("rewrapped_frames", {}).items()},
        "clamp_lift_m_max": float(max(lift.max(), 0.0)) if lift.size else 0.0,
        "clamp_lifted_share": float((lift > CLAMP_LIFT_M).mean()) if lift.size else 0.0,
    }


def _clamp_lift(layout, q: np.ndarray, clamped: np.ndarray) -> np.ndarray:
    """``[frames]`` m: the lowest body origin's height with the clamped ``q`` minus with the values before
    clamping (``q - clamped`` on the scalar DOFs); zeros when nothing was clamped."""
    if not clamped.size or not np.any(clamped):
        return np.zeros(q.shape[0])
    from ..animation.layout import forward_kinematics

    scalar = [b for b in layout.blocks if b.q_dim == 1 and b.qd_dim == 1]
    qi = np.array([b.q_offset for b in scalar], dtype=np.int64)
    vi = np.array([b.qd_offset for b in scalar], dtype=np.int64)
    q1 = np.asarray(q, dtype=np.float64)
    q0 = q1.copy()
    q0[:, qi] -= np.asarray(clamped, dtype=np.float64)[:, vi]
    p1, _ = forward_kinematics(layout, q1)
    p0, _ = forward_kinematics(layout, q0)
    return p1[..., 2].min(-1) - p0[..., 2].min(-1)


_WORKER_CACHE: dict = {}


def _setup(model: str, model_sha: str, options: ConvertOptions):
    key = (model_sha, options.order, options.free_root)
    if key not in _WORKER_CACHE:
        from ..animation import ArticulationCoordinateLayout, ArticulationMotionMapper
        from ..asset import load

        _WORKER_CACHE.clear()  # one model per batch: an edited model file replaces the old one
        desc = load(model, order=options.order)
        layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=options.free_root)
        _WORKER_CACHE[key] = (desc, layout, ArticulationMotionMapper(layout))
    return _WORKER_CACHE[key]


def _clip_fingerprint(source_sha: str, job_fingerprint: str) -> str:
    return hashlib.sha256(f"{source_sha}|{job_fingerprint}".encode()).hexdigest()[:32]


def _job_fingerprint(model_sha: str, config: dict, options: ConvertOptions, load_options: Mapping | None) -> str:
    """What every output depends on besides its clip: the model file's bytes, the retarget configuration's
    content, the options, the reader options and the KangEngine version."""
    from .. import __version__

    text = json.dumps(
        {
            "model_sha256": model_sha,
            "config": config,
            "options": asdict(options),
            "load_options": {k: v for k, v in sorted((load_options or {}).items()) if v is not None},
            "kangengine": __version__,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class _Task:
    source: str
    name: str
    output: str
    model: str
    model_sha: str
    options: ConvertOptions
    load_options: dict
    job_fingerprint: str
    previous_fingerprint: str | None
    previous_status: str | None
    overwrite: bool
    retry_failed: bool
    robot_config: object | None = None  # the checked RobotRetargetConfig (robot path) or None (skeleton path)


def _convert_skeleton(task: _Task, src: Path) -> tuple:
    """Skeleton path: ``(articulation motion, layout, outcome fields)``."""
    from .batch import recorded_warnings

    desc, layout, mapper = _setup(task.model, task.model_sha, task.options)
    opts = task.options
    with recorded_warnings() as caught:
        mapped, moved, motion = map_clip(
            src,
            desc,
            mapper,
            opts.config,
            clamp_to_limits=opts.clamp_to_limits,
            fps=opts.fps,
            load_options=task.load_options,
        )
    res = np.asarray(mapped.residual_angles, dtype=np.float64)
    art = mapped.motion
    lift = _clamp_lift(layout, np.asarray(art.q), np.asarray(mapped.clamped))
    quality = skeleton_quality(art.metadata.get("mapper", {}), lift)
    art.metadata.update(
        {
            "source_fps": motion.fps,
            "retarget_scale": float(moved.scale),
            "residual_mean_rad": float(res.mean()),
            "residual_max_rad": float(res.max()),
            "clamped_max": float(np.abs(mapped.clamped).max()) if mapped.clamped.size else 0.0,
            "clamp_lift_m_max": quality["clamp_lift_m_max"],
            "clamp_lifted_share": quality["clamp_lifted_share"],
        }
    )
    fields = {"residual_mean_rad": float(res.mean()), "residual_max_rad": float(res.max()), "quality": quality}
    return art, layout, fields, caught, None


def _convert_robot(task: _Task, src: Path) -> tuple:
    """Robot path: ``retarget_to_robot`` on the model of the batch; the metrics go to their own file."""
    import warnings

    from ..retarget import retarget_to_robot
    from .batch import recorded_warnings
    from .load import load_motion

    desc, layout, _ = _setup(task.model, task.model_sha, task.options)
    with recorded_warnings() as caught:
        kw, notes = _reader_options(src, task.load_options)
        for note in notes:
            warnings.warn(note, UserWarning, stacklevel=2)
        motion = load_motion(src, **kw)
        if task.options.fps is not None:
            motion = motion.resample(task.options.fps)
        result = retarget_to_robot(motion, task.robot_config, model=desc)
    art = result.motion
    quality = robot_quality(result.metrics)
    art.metadata.update(
        {
            "source_fps": motion.fps,
            "retarget_scale": float(result.metrics.get("scale", 0.0)),
            "metrics_file": metrics_path(Path(task.output).name).name,
            **{k: quality[k] for k in ("key_body_error_m_mean", "floating_share", "penetration_m")},
        }
    )
    return art, layout, {"quality": quality}, caught, result.metrics


def _write_metrics(task: _Task, fingerprint: str, layout, metrics: dict) -> None:
    body = {
        "format": "kangengine.robot_retarget_metrics",
        "clip": task.name,
        "fingerprint": fingerprint,
        "retarget_config": task.options.config,
        "model_signature": layout.model_signature,
        "metrics": metrics,
    }
    text = json.dumps(body, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write(metrics_path(task.output), lambda f: f.write(text.encode()))


def _convert_one(task: _Task) -> ClipOutcome:
    from ..animation import save_articulation_motion_npz
    from .batch import file_sha256, regular_file_problem

    t0 = time.perf_counter()
    src, out = Path(task.source), Path(task.output)
    fingerprint = None
    try:
        problem = regular_file_problem(task.source)
        if problem is not None:
            raise FormatError(problem, path=src)
        fingerprint = _clip_fingerprint(file_sha256(src), task.job_fingerprint)
        if not task.overwrite and fingerprint == task.previous_fingerprint:
            done = out.is_file() and _existing_fingerprint(out) == fingerprint
            if task.robot_config is not None:
                done = done and metrics_path(out).is_file()
            if task.previous_status == "converted" and done:
                return ClipOutcome(task.source, task.output, "up_to_date", name=task.name, fingerprint=fingerprint)
            if task.previous_status == "failed" and not task.retry_failed:
                return ClipOutcome(task.source, None, "failed_before", name=task.name, fingerprint=fingerprint)
        convert = _convert_robot if task.robot_config is not None else _convert_skeleton
        art, layout, fields, caught, metrics = convert(task, src)
        art.metadata.update(
            {
                "source_file": task.name,  # relative to the batch's root: outputs do not depend on where it lies
                "fingerprint": fingerprint,
                "retarget_config": task.options.config,
            }
        )
        if metrics is not None:  # first the metrics, then the output whose presence says "done"
            _write_metrics(task, fingerprint, layout, metrics)
        # no fsync (5 ms of waiting per clip): a file a machine crash tore fails its CRCs on resume and is redone
        save_articulation_motion_npz(out, art, layout=layout, durable=False)
        return ClipOutcome(
            task.source,
            task.output,
            "converted",
            frames=art.num_frames,
            fps=art.fps(),
            seconds=time.perf_counter() - t0,
            name=task.name,
            fingerprint=fingerprint,
            warnings=tuple(caught),
            **fields,
        )
    except Exception as exc:  # a bad clip is listed, never allowed to stop the batch
        return ClipOutcome(
            task.source,
            None,
            "failed",
            error=f"{type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - t0,
            name=task.name,
            fingerprint=fingerprint,
        )


def _existing_fingerprint(path: Path) -> str | None:
    """The fingerprint an output records, read with every member of the file (each one's CRC checked: the
    outputs are written without ``fsync``, and a machine crash can leave one torn under its final name)."""
    try:
        z = load_npz(path, required=("metadata_json",))
        return json.loads(str(z["metadata_json"])).get("fingerprint")
    except Exception:  # an unreadable, torn or foreign file is stale: it gets rewritten
        return None


def _entry(outcome: ClipOutcome, out: Path) -> dict:
    """The manifest line of a finished clip."""
    return {
        "command": "convert",
        "clip": outcome.name,
        "source": outcome.source,
        "status": "done" if outcome.status == "converted" else "failed",
        "output": None if outcome.output is None else Path(os.path.relpath(outcome.output, out)).as_posix(),
        "fingerprint": outcome.fingerprint,
        "error": outcome.error,
        "warnings": list(outcome.warnings),
        "frames": outcome.frames,
        "fps": outcome.fps,
        "seconds": round(outcome.seconds, 3),
        "residual_mean_rad": outcome.residual_mean_rad,
        "residual_max_rad": outcome.residual_max_rad,
        "quality": outcome.quality,
        "time": time.time(),
    }


def summary_quality(clips: Sequence[Mapping]) -> dict:
    """The worst of the done clips' ``quality`` (their manifest entries), with the clips it concerns.

    Returns:
        ``{"skeleton": {...}, "robot": {...}}`` for the kinds present. Skeleton: ``clips_outside_limits``
        (names of the clips whose reference left a joint range before clamping), ``limit_violation_max``,
        ``clips_rewrapped`` (clips with hinges brought back from wound angles), ``clips_lifted_by_clamping``
        (clips with a frame lifted more than :data:`CLAMP_LIFT_M`), ``clamp_lift_m_max``,
        ``clamp_lifted_share_max``. Robot: the largest ``key_body_error_m_mean``, ``floating_share``,
        ``slide_beyond_source_cm_max`` and ``penetration_m``, and ``clips_outside_limits``.
    """
    done = [(e["clip"], e.get("quality") or {}) for e in clips if e.get("status") == "done"]
    out: dict = {}
    sk = [(c, q) for c, q in done if "limit_violation_max" in q]
    if sk:
        out["skeleton"] = {
            "clips": len(sk),
            "clips_outside_limits": [c for c, q in sk if q["limit_violation_max"] > 0],
            "limit_violation_max": max(q["limit_violation_max"] for _, q in sk),
            "clips_rewrapped": [c for c, q in sk if q["rewrapped_frames"]],
            "clips_lifted_by_clamping": [c for c, q in sk if q["clamp_lifted_share"] > 0],
            "clamp_lift_m_max": max(q["clamp_lift_m_max"] for _, q in sk),
            "clamp_lifted_share_max": max(q["clamp_lifted_share"] for _, q in sk),
        }
    rb = [(c, q) for c, q in done if "key_body_error_m_mean" in q]
    if rb:
        out["robot"] = {
            "clips": len(rb),
            "key_body_error_m_mean_max": max(q["key_body_error_m_mean"] for _, q in rb),
            "floating_share_max": max(q["floating_share"] for _, q in rb),
            "slide_beyond_source_cm_max": max(q["slide_beyond_source_cm_max"] for _, q in rb),
            "penetration_m_max": max(q["penetration_m"] for _, q in rb),
            "clips_outside_limits": [c for c, q in rb if q["joints_outside_limits"] > 0],
        }
    return out


def write_convert_summary(path, entries: Mapping[str, dict], *, run: dict | None = None) -> Path:
    """Write ``convert_summary.json`` (atomically) from manifest entries: every clip ever converted into the
    folder (latest entry of each, with its ``quality``), ``totals`` over them (``done``, ``failed``), the worst
    quality of the folder (:func:`summary_quality`), and, when given, ``run`` (this run's model, options and
    ``counts``).

    The file is one JSON object: its small fields indented, then ``"clips"``, sorted by clip, one clip per line
    (the json module's C encoder: about 16 us a clip, against 40 us for the indented pure-Python encoding)."""
    clips = [entries[k] for k in sorted(entries)]
    totals = {"done": sum(e["status"] == "done" for e in clips), "failed": sum(e["status"] == "failed" for e in clips)}
    head = {"format": "kangengine.convert_summary", **(run or {}), "totals": totals, "quality": summary_quality(clips)}
    text = json.dumps(head, indent=2, sort_keys=True, default=str)[:-2]  # without its closing "\n}"
    lines = ",\n".join(f"    {json.dumps(e, sort_keys=True, default=str)}" for e in clips)
    text += f',\n  "clips": [\n{lines}\n  ]\n}}\n' if clips else ',\n  "clips": []\n}\n'
    return atomic_write(path, lambda f: f.write(text.encode()))


class _SummaryWriter:
    """``convert_summary.json`` of a run: :meth:`write` at its end, :meth:`maybe_write` after each clip (writes
    when the last write is older than ``every_s`` and than :data:`_SUMMARY_SPACING` times its own duration)."""

    def __init__(self, path: Path, entries: dict, run: dict, every_s: float):
        self.path, self.entries, self.run, self.every_s = path, entries, run, float(every_s)
        self.counts: collections.Counter = collections.Counter()
        self.written_at, self.cost_s = time.monotonic(), 0.0

    def count(self, status: str) -> None:
        self.counts[status] += 1

    def maybe_write(self) -> None:
        if time.monotonic() - self.written_at >= max(self.every_s, _SUMMARY_SPACING * self.cost_s):
            self.write()

    def write(self) -> Path:
        t0 = time.monotonic()
        counts = {s: self.counts[s] for s in ("converted", "up_to_date", "failed")}
        path = write_convert_summary(self.path, self.entries, run={**self.run, "counts": counts})
        self.written_at = time.monotonic()
        self.cost_s = self.written_at - t0
        return path


def convert_clips(
    clips: Sequence[str | os.PathLike],
    model: str | os.PathLike | None,
    *,
    options: ConvertOptions,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    workers: int = 1,
    jobs: int | None = None,
    threads: int = 1,
    load_options: Mapping | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    retry_failed: bool = False,
    progress: Callable[[int, int, ClipOutcome], None] | None = None,
    ray: str | None = None,
    summary_every_s: float = SUMMARY_EVERY_S,
) -> BatchReport:
    """Convert motion clips onto an articulation, one ``.npz`` per clip, resumably.

    Args:
        clips: motion files (any :func:`kangengine.pipelines.load_motion` reader: BVH, FBX, AMASS npz,
            poselib npy, SkeletonMotion npz), folders (searched recursively for those extensions) and globs.
            A symlink is read by its own name's extension. A file that is not regular (a FIFO, a device) is
            listed as failed without being opened.
        model: the articulation file (MJCF or URDF) the configuration retargets onto; ``None`` with a robot
            configuration: its own ``target_model`` (found as
            :meth:`kangengine.retarget.RobotRetargetConfig.target_model_path` says).
        options: :class:`ConvertOptions` (the retarget configuration and mapping options). A robot
            configuration (:func:`config_kind`) runs ``retarget_to_robot`` on every clip and writes its metrics
            beside each output (:func:`metrics_path`); it needs a free root and the model's DFS order (the
            configuration's layout signature is checked against the model before any clip).
        out_dir: output folder (created; checked writable before any work). The tree of the inputs, relative
            to their common folder, is mirrored: ``walks/02_01.bvh`` -> ``out_dir/walks/02_01.npz``; plus
            ``manifest.jsonl`` (one line per finished clip, accumulating over runs) and
            ``convert_summary.json`` (every clip ever done with its ``quality``: written at the end of the run,
            and during it every ``summary_every_s``).
        overwrite: redo clips whose output is up to date.
        workers: worker processes (1: in this process); ``jobs`` is its older name.
        threads: torch threads per process.
        load_options: reader keyword arguments (``scale``, ``up_axis``, ``model_dir``, ...), applied to the
            clips whose reader takes them (a note in the clip's warnings for the others).
        shard_index, shard_count: convert only shard ``I`` of ``N`` of the sorted clips (``I, I+N, ...``),
            recorded in ``manifest.shard-I-of-N.jsonl``; :func:`merge_manifests` writes the summary of all.
        retry_failed: convert again clips whose last attempt with the same fingerprint failed (otherwise
            they are reported failed again without being read).
        progress: called in this process after each clip with ``(clips finished, clips due, outcome)``.
        ray: run the clips as Ray tasks: ``"local"`` (an instance on this machine) or a cluster's address
            (:func:`kangengine.pipelines.batch.run_tasks`); the same files as ``workers=1``.
        summary_every_s: seconds between two writes of the summary during the run (at least twenty times as
            long as the last write took); it is written at the end of the run whatever this says, including a
            run ended by Ctrl-C, SIGTERM or an error. The manifest is the record that resume reads.
    Returns:
        :class:`BatchReport` of this run's clips (sorted by relative path); failed clips are listed there,
        in the manifest and in the summary, never raised.
    Raises:
        FormatError: the model cannot be loaded or the configuration does not exist (nothing converted).
        LayoutMismatch: a robot configuration written for another model (nothing converted).
        OutputFolderError: ``out_dir`` is a file or not writable.
        BatchInterrupted: Ctrl-C; the clips finished so far are in the manifest and the summary.
        BatchTerminated: SIGTERM (when its action was the default): the same, then a ``SystemExit`` with status
            143 (:func:`kangengine.pipelines.batch.run_tasks` with ``sigterm=True``).
    """
    from . import batch
    from .load import MOTION_LOADERS

    workers = int(jobs) if jobs is not None else int(workers)
    robot_cfg, config, model = _job_config(options, model)  # fails early on an unknown configuration
    model_sha = batch.file_sha256(model)
    _, layout, _ = _setup(model, model_sha, options)
    if robot_cfg is not None:  # a configuration for another model (or another body order) converts nothing
        robot_cfg.check_model(layout, path=model)
    out = batch.check_out_dir(out_dir)
    sources = batch.collect_clips(clips, extensions=MOTION_LOADERS)
    stems = batch.output_stems([c.rel for c in sources])
    mine = batch.shard_of(list(zip(sources, stems)), shard_index, shard_count)
    manifest = out / batch.manifest_name(shard_index, shard_count)
    summary = out / SUMMARY_NAME
    targets = [out / f"{stem}.npz" for _, stem in mine]
    batch.clean_stale_temporaries(out, [*targets, *(metrics_path(t) for t in targets), summary])
    entries = batch.read_manifests(out, command="convert")
    job_fp = _job_fingerprint(model_sha, config, options, load_options)
    tasks = []
    for (src, _), target in zip(mine, targets):
        prev = entries.get(src.rel, {})
        prev_status = {"done": "converted", "failed": "failed"}.get(prev.get("status"))
        tasks.append(
            (
                _Task(
                    src.path,
                    src.rel,
                    os.fspath(target),
                    model,
                    model_sha,
                    options,
                    dict(load_options or {}),
                    job_fp,
                    prev.get("fingerprint"),
                    prev_status,
                    overwrite,
                    retry_failed,
                    robot_cfg,
                ),
            )
        )
    outcomes: dict[str, ClipOutcome] = {}
    run = {"model": model, "model_signature": layout.model_signature, "options": asdict(options)}
    summary_writer = _SummaryWriter(summary, entries, run, summary_every_s)
    lines = batch.ManifestAppender(manifest)

    def record(outcome: ClipOutcome) -> None:  # O(1) per clip but for the spaced summary writes
        if outcome.status == "failed_before":
            outcome = replace(outcome, status="failed", error=entries[outcome.name].get("error"))
        elif outcome.status != "up_to_date":
            entry = _entry(outcome, out)
            lines.append(entry)
            entries[outcome.name] = entry
        outcomes[outcome.name] = outcome
        summary_writer.count(outcome.status)
        summary_writer.maybe_write()
        if progress is not None:
            progress(len(outcomes), len(tasks), outcome)

    try:
        batch.run_tasks(_convert_one, tasks, workers=workers, threads=threads, on_result=record, ray=ray, sigterm=True)
    except KeyboardInterrupt:
        raise batch.BatchInterrupted(len(outcomes), len(tasks), out) from None
    finally:  # the summary of what the manifest holds, however the run ended
        lines.close()
        summary_writer.write()
    ordered = tuple(outcomes[src.rel] for src, _ in mine)
    return BatchReport(ordered, options, model, layout.model_signature, os.fspath(summary), os.fspath(manifest))


def _job_config(options: ConvertOptions, model) -> tuple:
    """``(robot configuration or None, configuration content for the fingerprint, absolute model path)``."""
    from ..retarget import load_retarget_config, load_robot_config

    if config_kind(options.config) == "robot":
        if not options.free_root:
            raise FormatError(
                f"robot configuration {options.config!r} retargets onto a free root; expected free_root=True",
                item="free_root",
            )
        if model is not None and not Path(model).is_file():
            raise FileMissingError("no such model file", path=model)
        cfg = load_robot_config(options.config, model=model)
        content = {**cfg.to_dict(), "target_model": None}  # the model's bytes are fingerprinted, not its path
        return cfg, content, os.fspath(Path(cfg.target_model).absolute())
    config = load_retarget_config(options.config).to_dict()
    if model is None:
        raise FileMissingError(f"skeleton configuration {options.config!r} needs the model file", item="model")
    model = os.fspath(Path(model).absolute())
    if not Path(model).is_file():
        raise FileMissingError("no such model file", path=model)
    return None, config, model


def merge_manifests(out_dir: str | os.PathLike) -> dict:
    """Combine every manifest of a batch folder (``manifest.jsonl`` and the shards'
    ``manifest.shard-I-of-N.jsonl``) into its summaries: ``convert_summary.json`` for converted clips and,
    for validated ones, ``summary.csv`` (:func:`kangengine.pipelines.validate.write_validation_summary`).

    Returns:
        ``{"convert": {"done": n, "failed": n}, "validate": {...}}`` for the commands found, with the
        summary paths under ``"summaries"``.
    Raises:
        FileMissingError: no manifest in ``out_dir``.
    """
    from . import batch

    out = Path(out_dir)
    if not out.is_dir() or not list(out.glob("manifest*.jsonl")):
        raise FileMissingError("holds no manifest*.jsonl; expected the --out folder of convert or validate", path=out)
    result: dict = {"summaries": []}
    conv = batch.read_manifests(out, command="convert")
    if conv:
        result["summaries"].append(os.fspath(write_convert_summary(out / SUMMARY_NAME, conv)))
        result["convert"] = {s: sum(e["status"] == s for e in conv.values()) for s in ("done", "failed")}
    val = batch.read_manifests(out, command="validate")
    if val:
        from .validate_files import write_validation_summary

        result["summaries"].append(os.fspath(write_validation_summary(out, val)))
        result["validate"] = {
            s: sum(e.get("verdict", e["status"]) == s for e in val.values()) for s in ("ok", "warn", "reject", "failed")
        }
    return result
