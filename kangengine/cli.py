"""The ``kangengine`` command: ``demo``, ``info``, ``configs``, ``convert``, ``validate``, ``library build``,
``export``, ``preview`` and ``merge``.

``kangengine demo [--out DIR]`` runs the whole pipeline on the shipped example data and ends with a GIF to
open. ``kangengine info MODEL [CLIP ...]`` prints, as JSON, what KangEngine reads from an articulation file
and from motion clips. ``kangengine configs`` lists the shipped retarget configurations and what each maps.
``kangengine convert MODEL INPUT... --config NAME --out DIR`` retargets a dataset (files, folders, globs) onto
the model, one articulation-motion ``.npz`` per clip mirroring the source tree; ``kangengine validate MODEL
INPUT... --out DIR`` tracks every clip in the simulator and writes a report per clip; ``kangengine library
build FOLDER --out FILE`` packs a convert folder into one library file; ``kangengine export`` writes a clip as
BVH, mjlab npz, GMR csv or ProtoMotions; ``kangengine preview`` renders it to a GIF or MP4. Convert and
validate are dataset batches: a ``manifest.jsonl`` that accumulates across runs, resume after any
interruption, ``--workers N`` processes, ``--shard-index I --shard-count N`` for array jobs and ``kangengine
merge DIR`` to combine shards.

Exit status: 0 every clip done, 1 a clip failed (with ``--strict`` also: a clip rejected, or converted with
warnings), 2 bad arguments (one line on stderr, before any work), 130 interrupted (Ctrl-C; what finished is
kept and a rerun resumes), 143 terminated (SIGTERM during ``convert``; likewise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from . import __version__
from .errors import KangEngineError

__all__ = ["main", "describe_model", "describe_clip"]


def describe_model(path, *, order: str = "DFS", free_root: bool = True) -> dict:
    """Summary of an articulation file: counts, layout sizes, signature, joints and DOF names."""
    from .animation import ArticulationCoordinateLayout
    from .asset import load

    desc = load(path, order=order)
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=free_root)
    out = desc.summary()
    out.update(
        {
            "free_root": layout.free_root,
            "nq": layout.nq,
            "nv": layout.nv,
            "model_signature": layout.model_signature,
            "body_names": list(layout.body_names),
            "blocks": [
                {
                    "joint": b.joint_name,
                    "type": b.joint_type.value,
                    "body": b.body_name,
                    "q": [b.q_offset, b.q_dim],
                    "qd": [b.qd_offset, b.qd_dim],
                }
                for b in layout.blocks
            ],
        }
    )
    return out


def describe_clip(path) -> dict:
    """Summary of a motion clip: frames, fps, duration, nodes (skeleton clips) or nq/nv (articulation)."""
    import numpy as np

    from .pipelines import load_motion

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        from ._files import load_npz

        z = load_npz(path, required=("format",), kind="motion")
        fmt = str(z["format"])
        if fmt == "kangengine.articulation_motion":
            return {
                "file": str(path),
                "kind": "articulation_motion",
                "frames": int(z["q"].shape[0]),
                "fps": float(z["fps"]),
                "nq": int(z["q"].shape[1]),
                "nv": int(z["qd"].shape[1]),
                "model_signature": str(z["model_signature"]),
            }
        from .animation import SkeletonMotion

        motion = SkeletonMotion.load_npz(path)
    else:
        motion = load_motion(path)
    gp = np.asarray(motion.numpy().global_translation)
    return {
        "file": str(path),
        "kind": "skeleton_motion",
        "frames": motion.num_frames,
        "fps": motion.fps,
        "duration_s": round(motion.duration, 6),
        "nodes": motion.tree.num_nodes,
        "node_names": list(motion.tree.node_names),
        "root_height_m": {"min": round(float(gp[:, 0, 2].min()), 4), "max": round(float(gp[:, 0, 2].max()), 4)},
        "metadata": {k: v for k, v in motion.metadata.items() if k in ("source_file", "source_units", "up_axis")},
    }


class _UsageError(KangEngineError):
    """Arguments that cannot work together (exit status 2, before any work)."""


class _Parser(argparse.ArgumentParser):
    """``argparse`` that reports a bad argument in one line (``kangengine convert: error: ...``), exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _info(args) -> int:
    from .data import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path

    model = args.model
    clips = list(args.clips)
    if args.example:
        model = str(data_path(CMU_HUMANOID_MJCF))
        clips = [str(data_path(CMU_WALK_BVH))] + clips
    if model is None:
        raise _UsageError("give a MODEL file or --example", item="kangengine info")
    report = {
        "model": describe_model(model, order=args.order, free_root=not args.fixed_root),
        "clips": [describe_clip(c) for c in clips],
    }
    print(json.dumps(report, indent=2))
    return 0


def describe_config(name: str) -> dict:
    """What a retarget configuration maps: name, description, the number of joints (or bodies) mapped and the
    map itself (source -> target), and the default target model, if any.

    Skeleton-to-skeleton configurations are read with ``ke.retarget.load_retarget_config``; a shipped file of
    another kind (a human-to-robot configuration with a ``bodies`` list) is described from its JSON.
    """
    from .retarget import RobotRetargetConfig, list_robot_configs, load_retarget_config

    try:
        cfg = load_retarget_config(name)
    except KangEngineError:
        path = Path(__file__).parent / "retarget" / "configs" / f"{name}.json"
        if name not in list_robot_configs() or not path.is_file():
            raise
        d = RobotRetargetConfig.from_json(path).to_dict()  # with its "extends" chain merged
        mapping = {str(b.get("source")): str(b.get("robot")) for b in d.get("bodies", []) if isinstance(b, dict)}
        target = d.get("target_model") or d.get("target_asset")
        return {
            "name": d.get("name", name),
            "description": str(d.get("description", "")),
            "maps": "bodies",
            "mapped": len(mapping),
            "mapping": mapping,
            "target": None if target is None else Path(target).name,
        }
    return {
        "name": cfg.name or name,
        "description": cfg.description,
        "maps": "joints",
        "mapped": len(cfg.joint_mapping),
        "mapping": dict(cfg.joint_mapping),
        "target": None if cfg.target_asset is None else Path(cfg.target_asset).name,
    }


def _configs(args) -> int:
    import textwrap

    from .retarget import list_retarget_configs, list_robot_configs

    names = args.names or [*list_retarget_configs(), *list_robot_configs()]
    found = [describe_config(n) for n in names]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for c in found:
        target = f", default target {c['target']}" if c["target"] else ""
        print(f"{c['name']}: maps {c['mapped']} {c['maps']}{target}")
        print(textwrap.fill(c["description"], width=100, initial_indent="    ", subsequent_indent="    "))
        pairs = ", ".join(f"{a} -> {b}" for a, b in c["mapping"].items())
        print(textwrap.fill(pairs, width=100, initial_indent="    maps: ", subsequent_indent="          "))
    return 0


# -- convert and validate ------------------------------------------------------------------------------------


def _load_options(args) -> dict:
    if args.scale is not None and args.units is not None:
        raise _UsageError("give --scale or --units, not both", item="--units")
    return {
        k: v
        for k, v in {
            "scale": args.scale,
            "units": args.units,
            "up_axis": args.up_axis,
            "model_dir": args.smpl_model_dir,
        }.items()
        if v is not None
    }


def _inputs(args, command: str):
    from .data import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path

    model, clips = args.model, list(args.inputs)
    if args.example:
        if model is not None:
            clips = [model] + clips
        model, clips = str(data_path(CMU_HUMANOID_MJCF)), [str(data_path(CMU_WALK_BVH))] + clips
        args.config = args.config or "cmu_bvh_to_cmu_humanoid"
    if model is None or not clips:
        raise _UsageError("give MODEL and INPUT... (clip files, folders, globs), or --example", item=command)
    if not Path(model).is_file():
        raise _UsageError("no such model file; expected MJCF (.xml) or URDF (.urdf)", path=model)
    from .pipelines import MOTION_LOADERS, collect_clips

    try:
        found = collect_clips(clips, extensions=MOTION_LOADERS)
    except KangEngineError as exc:
        raise _UsageError(str(exc)) from None
    if not found:
        raise _UsageError(f"no motion files ({', '.join(sorted(MOTION_LOADERS))}) in {', '.join(clips)}")
    if (args.shard_index is None) != (args.shard_count is None):
        raise _UsageError("give --shard-index and --shard-count together", item="--shard-index")
    if args.shard_count is not None and not (args.shard_count >= 1 and 0 <= args.shard_index < args.shard_count):
        raise _UsageError(f"shard {args.shard_index} of {args.shard_count}; expected 0 <= I < N", item="--shard-index")
    return model, clips


class _Progress:
    """Per-clip status on stderr: a tqdm bar on a terminal (the last clip and the counts beside it; failed,
    warned and rejected clips also as a line above the bar), one ``[done/total] status clip`` line per clip
    when stderr is not a terminal (a log file, a pipe), nothing with ``--quiet``."""

    def __init__(self, command: str, label, status):
        self.command, self.label, self.status = command, label, status
        self.counts: dict[str, int] = {}
        self.bar = None
        self.tty = sys.stderr.isatty()
        self.started = time.time()  # tqdm's clock

    def __call__(self, done: int, total: int, item) -> None:
        text = self.label(item)
        state, notable = self.status(item)
        self.counts[state] = self.counts.get(state, 0) + 1
        if self.tty and self.bar is None:
            try:
                from tqdm import tqdm
            except ImportError:  # an environment installed before tqdm became a dependency: lines instead
                self.tty = False
            else:
                try:
                    known = min(os.get_terminal_size(sys.stderr.fileno())) > 0
                except OSError:
                    known = False
                # a terminal that reports no size (0 x 0): tqdm would draw nothing, so give it one
                size = {"dynamic_ncols": True} if known else {"ncols": 100, "nrows": 24}
                self.bar = tqdm(total=total, desc=self.command, unit="clip", file=sys.stderr, **size)
                self.bar.start_t = self.started  # the bar appears with the first clip: time from the start
        if self.bar is None:
            print(f"[{done}/{total}] {text}", file=sys.stderr, flush=True)
            return
        if notable:
            self.bar.write(f"[{done}/{total}] {text}", file=sys.stderr)
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        name = getattr(item, "name", None) or (item.get("name") if isinstance(item, dict) else "")
        self.bar.set_postfix_str(f"{counts} | {state} {name}", refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _progress(args, command: str, label, status) -> _Progress | None:
    if args.quiet:
        return None
    return _Progress(command, label, status)


def _convert_status(o) -> tuple[str, bool]:
    state = {"up_to_date": "up to date"}.get(o.status, o.status)
    return state, o.status == "failed" or bool(o.warnings)


def _validate_status(e: dict) -> tuple[str, bool]:
    if e["status"] == "failed":
        return "failed", True
    verdict = str(e.get("verdict"))
    return verdict, verdict != "ok" or bool(e.get("warnings"))


def _convert_label(o) -> str:
    if o.status == "failed":
        return f"failed      {o.name}: {o.error}"
    if o.status == "up_to_date":
        return f"up to date  {o.name}"
    note = f", {len(o.warnings)} warning(s)" if o.warnings else ""
    return f"converted   {o.name} ({o.frames} frames, {o.seconds:.1f} s{note})"


def _batch_common(args) -> dict:
    return {
        "overwrite": args.overwrite,
        "workers": args.workers,
        "threads": args.threads,
        "shard_index": args.shard_index,
        "shard_count": args.shard_count,
        "retry_failed": args.retry_failed,
        "ray": args.ray,
    }


def _convert(args) -> int:
    from .pipelines import ConvertOptions, convert_clips
    from .pipelines.convert import resolve_model_or_config

    try:  # MODEL_OR_CONFIG: a robot configuration in place of MODEL brings its own model
        args.model, args.config = resolve_model_or_config(args.model, args.config)
    except KangEngineError as exc:
        raise _UsageError(str(exc)) from None
    model, clips = _inputs(args, "kangengine convert")
    if args.config is None:
        raise _UsageError("give --config NAME (see kangengine configs)", item="kangengine convert")
    _check_config(args.config, robot=True)
    options = ConvertOptions(
        config=args.config, free_root=not args.fixed_root, clamp_to_limits=args.clamp, fps=args.fps, order=args.order
    )
    progress = _progress(args, "convert", _convert_label, _convert_status)
    try:
        report = convert_clips(
            clips,
            model,
            options=options,
            out_dir=args.out,
            load_options=_load_options(args),
            progress=progress,
            **_batch_common(args),
        )
    finally:
        if progress is not None:
            progress.close()
    counts = report.to_dict()["counts"]
    warned = [o for o in report.outcomes if o.warnings]
    summary = {
        "summary": report.summary_path,
        "manifest": report.manifest_path,
        "counts": counts,
        "failed": [{"clip": o.source, "error": o.error} for o in report.failed],
        "warnings": [{"clip": o.name, "warnings": list(o.warnings)} for o in warned],
    }
    print(json.dumps(summary, indent=2))
    return 1 if report.failed or (args.strict and warned) else 0


def _check_config(name: str, *, robot: bool = False) -> None:
    from .pipelines.convert import config_kind
    from .retarget import load_retarget_config

    try:
        if not robot or config_kind(name) == "skeleton":
            load_retarget_config(name)
    except KangEngineError as exc:
        raise _UsageError(str(exc), item="--config") from None


def _settings_file(path: str) -> dict:
    """``{"tracking": {...}, "thresholds": {...}}`` from a TOML or JSON file, every key checked."""
    import tomllib

    from .sim import TrackingSettings, ValidationThresholds

    p = Path(path)
    if not p.is_file():
        raise _UsageError("no such settings file", path=p)
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
        else:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _UsageError(f"not valid {'JSON' if p.suffix.lower() == '.json' else 'TOML'} ({exc})", path=p) from None
    sections = {"tracking": TrackingSettings, "thresholds": ValidationThresholds}
    if not isinstance(data, dict) or set(data) - set(sections):
        extra = sorted(set(data) - set(sections)) if isinstance(data, dict) else type(data).__name__
        raise _UsageError(f"unknown sections {extra}; expected [tracking] and/or [thresholds]", path=p)
    for section, cls in sections.items():
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data.get(section, {})) - set(valid))
        if unknown:
            raise _UsageError(
                f"unknown keys {unknown}; {cls.__name__} has: {', '.join(valid)}", path=p, item=f"[{section}]"
            )
    return {k: dict(data.get(k, {})) for k in sections}


def _build(cls, values: dict, path, section: str):
    try:
        return cls(**values)
    except KangEngineError as exc:
        raise _UsageError(str(exc), path=path, item=f"[{section}]") from None
    except (TypeError, ValueError) as exc:
        raise _UsageError(f"bad value ({exc})", path=path, item=f"[{section}]") from None


def _validation_settings(args):
    from .sim import TrackingSettings, ValidationThresholds

    file = _settings_file(args.settings) if args.settings else {"tracking": {}, "thresholds": {}}
    flags = {
        "dt": args.dt,
        "root_assist_frequency_hz": args.root_assist_hz,
        "drive_frequency_hz": args.drive_hz,
        "iterations": args.iterations,
    }
    tracking = {**file["tracking"], **{k: v for k, v in flags.items() if v is not None}}
    tracking.setdefault("threads", args.threads)  # --threads reaches the simulator (a settings file may say)
    where = args.settings or "the command line"
    return (
        _build(TrackingSettings, tracking, where, "tracking"),
        _build(ValidationThresholds, file["thresholds"], where, "thresholds"),
    )


def _validate_label(e: dict) -> str:
    if e["status"] == "failed":
        return f"failed      {e['clip']}: {e.get('error')}"
    state = "up to date " if e.get("up_to_date") else "validated  "
    reasons = f" ({', '.join(e['reasons'])})" if e.get("reasons") else ""
    return f"{state} {e['clip']}: {e['verdict']}{reasons}"


def _effort_limits(path: str | None) -> dict | None:
    """``--effort-limits``: a JSON file of joint -> limit, or ``cmu-tracking`` for the shipped table."""
    if path is None:
        return None
    from .data import CMU_HUMANOID_TRACKING_EFFORT, data_path
    from .sim import read_effort_limits

    return read_effort_limits(data_path(CMU_HUMANOID_TRACKING_EFFORT) if path == "cmu-tracking" else path)


def _validate(args) -> int:
    from .pipelines import ValidationOptions, validate_clips

    model, clips = _inputs(args, "kangengine validate")
    if args.config is not None:
        _check_config(args.config)
    settings, thresholds = _validation_settings(args)
    options = ValidationOptions(
        config=args.config,
        order=args.order,
        free_root=not args.fixed_root,
        dtype="float64" if args.float64 else "float32",
        device=args.device,
        plots=not args.no_plots,
        clamp_to_limits=args.clamp,
        fps=args.fps,
        batch_size=args.batch_size,
        effort_limit=_effort_limits(args.effort_limits),
    )
    progress = _progress(args, "validate", _validate_label, _validate_status)
    try:
        report = validate_clips(
            clips,
            model,
            out_dir=args.out,
            options=options,
            settings=settings,
            thresholds=thresholds,
            load_options=_load_options(args),
            progress=progress,
            **_batch_common(args),
        )
    finally:
        if progress is not None:
            progress.close()
    done = [e for e in report.entries if e["status"] == "done"]
    counts = {v: sum(e["verdict"] == v for e in done) for v in ("ok", "warn", "reject")}
    counts["skipped"] = len(report.failed)
    summary = {
        "summary": report.summary_path,
        "manifest": report.manifest_path,
        "counts": counts,
        "clips": [{"clip": e["name"], "verdict": e["verdict"], "reasons": e.get("reasons", [])} for e in done],
        "skipped": [{"clip": e["name"], "error": e.get("error")} for e in report.failed],
    }
    print(json.dumps(summary, indent=2))
    return 1 if report.failed or (args.strict and report.rejected) else 0


def _merge(args) -> int:
    from .pipelines import merge_manifests

    if not Path(args.out_dir).is_dir():
        raise _UsageError("no such folder; expected the --out folder of convert or validate", path=args.out_dir)
    print(json.dumps(merge_manifests(args.out_dir), indent=2))
    return 0


# -- library build, export, preview, demo ---------------------------------------------------------------------


def _need_file(path, what: str, item: str) -> None:
    if path is not None and not Path(path).is_file():
        raise _UsageError(f"no such file; expected {what}", path=path, item=item)


def _need_out_folder(path, item: str = "--out") -> None:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise _UsageError("is a file; expected a folder (created when missing)", path=p, item=item)


def _library_build(args) -> int:
    from .pipelines import library_build

    if not Path(args.folder).is_dir():
        raise _UsageError("no such folder; expected a `kangengine convert` output folder", path=args.folder)
    if args.validation is not None and not Path(args.validation).is_dir():
        raise _UsageError("no such folder; expected a `kangengine validate` output folder", path=args.validation)
    if args.verdicts is not None:
        given = [v.strip() for v in args.verdicts.split(",") if v.strip()]
        bad = [v for v in given if v not in ("ok", "warn", "reject")]
        if bad or not given:
            raise _UsageError(f"verdicts {bad or given}; expected some of ok,warn,reject", item="--verdicts")
    _need_file(args.model, "the model file (MJCF .xml or URDF .urdf)", "--model")
    if Path(args.out).suffix.lower() != ".safetensors" or Path(args.out).is_dir():
        raise _UsageError("expected a .safetensors file name", path=args.out, item="--out")
    return library_build.run(args)


def _export(args) -> int:
    from .pipelines import export

    _need_file(args.motion, "an articulation motion .npz (from `kangengine convert`)", "MOTION")
    _need_file(args.model, "the model file the motion was made for (MJCF .xml or URDF .urdf)", "MODEL")
    return export.run(args)


def _preview_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise _UsageError(f"{text!r}; expected WIDTHxHEIGHT, e.g. 640x360", item="--size") from None
    if w < 64 or h < 48:
        raise _UsageError(f"{text!r}; expected at least 64x48 pixels", item="--size")
    return w, h


def _preview(args) -> int:
    from .pipelines import preview

    _need_file(args.motion, "an articulation motion .npz (from `kangengine convert`)", "MOTION")
    _need_file(args.model, "the model file the motion was made for (MJCF .xml or URDF .urdf)", "MODEL")
    _need_file(args.source, "a motion file (BVH, FBX, AMASS .npz, ...)", "--source")
    if Path(args.out).suffix.lower() not in (".gif", ".mp4"):
        raise _UsageError("expected a .gif or .mp4 file name", path=args.out, item="--out")
    if args.fps is not None and not args.fps > 0:
        raise _UsageError(f"{args.fps}; expected a frame rate > 0", item="--fps")
    args.size = _preview_size(args.size) if isinstance(args.size, str) else args.size
    return preview.run(args)


def _demo(args) -> int:
    import math

    from .pipelines import demo

    _need_out_folder(args.out)
    if args.seconds is not None and not (args.seconds > 0 and math.isfinite(args.seconds)):
        raise _UsageError(f"{args.seconds}; expected a number of seconds > 0", item="--seconds")
    if not (args.root_assist_hz >= 0 and math.isfinite(args.root_assist_hz)):
        raise _UsageError(
            f"{args.root_assist_hz}; expected a frequency >= 0 (0: no assistance)", item="--root-assist-hz"
        )
    return demo.run(args)


# -- the parser ----------------------------------------------------------------------------------------------

_EXAMPLES = {
    "info": """example:
  kangengine info --example                      # the shipped CMU humanoid and CMU walk
  kangengine info robot.xml clips/walk.bvh       # bodies, joints, nq/nv, signature; frames, fps of the clip""",
    "configs": """example:
  kangengine configs                             # every shipped configuration and what it maps
  kangengine configs cmu_bvh_to_cmu_humanoid --json""",
    "convert": """example:
  kangengine convert --example --out converted   # the shipped CMU walk onto the shipped CMU humanoid
  kangengine convert humanoid_CMU.xml mocap/ --config cmu_bvh_to_cmu_humanoid --out converted \\
      --fps 30 --workers 4                       # mocap/a/b.bvh -> converted/a/b.npz, manifest.jsonl
  kangengine convert humanoid_CMU.xml 'mocap/**/*.bvh' --config cmu_bvh_to_cmu_humanoid --out converted \\
      --shard-index 0 --shard-count 8            # one SLURM array task; then: kangengine merge converted""",
    "validate": """example:
  kangengine validate --example --root-assist-hz 1 --out reports
  kangengine validate humanoid_CMU.xml converted/ --out reports --settings tracking.toml --strict
      # tracking.toml: [tracking] root_assist_frequency_hz = 1.0   [thresholds] body_error_ok = 0.06""",
    "demo": """example:
  kangengine demo                                # everything on the shipped walk, into ./kangengine_demo
  kangengine demo --out /tmp/demo --renderer pillow   # no OpenGL: the stick-figure preview""",
    "library": """example:
  kangengine library build converted --out walks.safetensors
  kangengine library build converted --out walks.safetensors --verdicts ok,warn --validation reports""",
    "library build": """example:
  kangengine library build converted --out walks.safetensors   # every clip of a convert folder
  kangengine library build converted --out walks.safetensors --verdicts ok,warn --validation reports
      # only clips whose report in reports/ (kangengine validate converted --out reports) is ok or warn""",
    "export": """example:
  kangengine export converted/walk.npz humanoid_CMU.xml --format bvh --out walk.bvh   # for Blender
  kangengine export converted/walk.npz g1.xml --format mjlab --out walk_mjlab.npz     # mjlab / BeyondMimic
  kangengine export converted/walk.npz g1.xml --format gmr_csv --out exported/        # exported/walk.csv""",
    "preview": """example:
  kangengine preview converted/walk.npz humanoid_CMU.xml --out walk.gif --source mocap/walk.bvh
  kangengine preview converted/walk.npz humanoid_CMU.xml --out walk.mp4 --fps 30 --size 960x540""",
    "merge": """example:
  kangengine merge converted                     # after every shard finished: one summary of all shards""",
}


def _add_batch_arguments(p: argparse.ArgumentParser, default_out: str) -> None:
    p.add_argument("model", nargs="?", help="MJCF (.xml) or URDF (.urdf) file")
    p.add_argument("inputs", nargs="*", help="clip files, folders (searched recursively) and globs")
    p.add_argument("--out", default=default_out, help=f"output folder (default ./{default_out})")
    p.add_argument("--example", action="store_true", help="the shipped CMU walk and CMU humanoid")
    p.add_argument("--fps", type=float, default=None, help="resample motion files to this rate first")
    p.add_argument(
        "--clamp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="clamp joint values into their limits (default: on, for convert and validate alike)",
    )
    p.add_argument("--fixed-root", action="store_true", help="keep the root fixed (no free root block)")
    p.add_argument("--order", default="DFS", choices=["DFS", "BFS"], help="body order (default DFS)")
    p.add_argument("--overwrite", action="store_true", help="redo clips that are done and up to date")
    p.add_argument("--retry-failed", action="store_true", help="try again clips that failed with the same input")
    p.add_argument("--workers", type=_positive_int, default=1, help="worker processes (default 1)")
    p.add_argument("--jobs", dest="workers", type=_positive_int, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=_positive_int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--shard-index", type=int, default=None, metavar="I", help="this shard, 0 .. N-1")
    p.add_argument("--shard-count", type=_positive_int, default=None, metavar="N", help="number of shards")
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the clips as Ray tasks: 'local' (a Ray instance on this machine, --workers CPUs) or a running "
        "cluster's address ('auto', HOST:6379); paths must be shared by every node (pip install 'kangengine[ray]')",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 also for rejected clips (convert: warnings)")
    p.add_argument("--quiet", action="store_true", help="no per-clip progress lines on stderr")
    g = p.add_argument_group("reader options (passed to the reader of each clip that takes them)")
    g.add_argument("--scale", type=float, default=None, help="metres per file unit (BVH) or scale factor (FBX)")
    g.add_argument("--units", choices=["m", "cm", "mm", "in", "cmu"], default=None, help="BVH length unit")
    g.add_argument("--up-axis", choices=["auto", "y", "z"], default=None, help="the files' up axis (BVH, FBX)")
    g.add_argument("--smpl-model-dir", default=None, help="folder of the SMPL-family body models (AMASS)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}; expected 1 or more")
    return value


def _subparser(sub, name: str, help_text: str, *, example: str | None = None):
    p = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_EXAMPLES[example or name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"kangengine {__version__}")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``kangengine`` argument parser (every subcommand, its flags and a worked example in its help)."""
    from .pipelines import demo, export, library_build, preview

    parser = _Parser(
        prog="kangengine",
        description="Human motion capture onto robots, checked in physics, packed and exported.",
        epilog="first steps: kangengine demo  (then: kangengine COMMAND --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kangengine {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = _subparser(sub, "info", "describe an articulation file and motion clips (JSON)")
    info.add_argument("model", nargs="?", help="MJCF (.xml) or URDF (.urdf) file")
    info.add_argument("clips", nargs="*", help="motion clips (.bvh, .npz, ...)")
    info.add_argument("--example", action="store_true", help="use the shipped example model and clip")
    info.add_argument("--order", default="DFS", choices=["DFS", "BFS"], help="body order (default DFS)")
    info.add_argument("--fixed-root", action="store_true", help="keep the root fixed (no free root block)")
    info.set_defaults(func=_info)
    cfg = _subparser(sub, "configs", "list the shipped retarget configurations and what each maps")
    cfg.add_argument("names", nargs="*", help="configurations to show (default: all shipped)")
    cfg.add_argument("--json", action="store_true", help="print JSON (with the whole joint map)")
    cfg.set_defaults(func=_configs)
    conv = _subparser(sub, "convert", "retarget a dataset onto a robot: one .npz per clip, resumable")
    _add_batch_arguments(conv, "kangengine_output")
    conv.add_argument("--config", help="retarget configuration (see kangengine configs)")
    conv.set_defaults(func=_convert)
    val = _subparser(sub, "validate", "track clips in physics: a verdict and report per clip, resumable")
    _add_batch_arguments(val, "kangengine_validation")
    val.add_argument("--config", help="retarget configuration for motion files (articulation .npz need none)")
    val.add_argument("--settings", metavar="FILE", help="TOML/JSON: [tracking] and [thresholds], any field")
    val.add_argument("--dt", type=float, default=None, help="simulator step in seconds (default 1/60)")
    val.add_argument("--root-assist-hz", type=float, default=None, help="root assistance frequency (0: off)")
    val.add_argument(
        "--effort-limits",
        metavar="FILE",
        help="JSON of joint name -> effort limit (N m) replacing the model's; 'cmu-tracking': dm_control's "
        "tracking walker's limits for the CMU humanoid (its suite motors are too weak for mocap)",
    )
    val.add_argument("--drive-hz", type=float, default=None, help="joint drive natural frequency (default 2)")
    val.add_argument("--iterations", type=_positive_int, default=None, help="Newton iterations per step")
    val.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    val.add_argument("--float64", action="store_true", help="simulate in float64 (default float32)")
    val.add_argument("--batch-size", type=_positive_int, default=64, help="clips simulated together (default 64)")
    val.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    val.set_defaults(func=_validate)
    lib = _subparser(sub, "library", "pack converted clips into one MotionLibrary file (library build)")
    lib_sub = lib.add_subparsers(dest="library_command", required=True, metavar="build")
    build = _subparser(
        lib_sub, "build", "pack a convert folder into one .safetensors MotionLibrary file", example="library build"
    )
    library_build.add_arguments(build)
    build.set_defaults(func=_library_build)
    exp = _subparser(sub, "export", "write a converted clip as BVH, mjlab npz, GMR csv or ProtoMotions .motion")
    export.add_arguments(exp)
    exp.set_defaults(func=_export)
    prev = _subparser(sub, "preview", "render a converted clip to a GIF or MP4 (the robot beside the source)")
    preview.add_arguments(prev)
    prev.set_defaults(func=_preview)
    dem = _subparser(sub, "demo", "the whole pipeline on the shipped example data, ending with a GIF to open")
    demo.add_arguments(dem)
    dem.set_defaults(func=_demo)
    merge = _subparser(sub, "merge", "combine the manifests of shards into the folder's summary")
    merge.add_argument("out_dir", help="the --out folder the shards wrote into")
    merge.set_defaults(func=_merge)
    return parser


def main(argv=None) -> int:
    """Run the ``kangengine`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    # before torch is loaded: idle OpenMP threads sleep instead of spinning (spinning threads made a
    # simulator step 15x slower on a machine whose other cores are busy; docs/cli.md has the numbers)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from .pipelines.batch import BatchInterrupted, BatchTerminated, OutputFolderError

    args = build_parser().parse_args(argv)
    prog = f"kangengine {args.command}" + (f" {args.library_command}" if args.command == "library" else "")
    try:
        return args.func(args)
    except BatchInterrupted as exc:
        print(f"{prog}: {exc}; run the same command again to resume", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{prog}: interrupted before any clip finished", file=sys.stderr)
        return 130
    except BatchTerminated:
        print(f"{prog}: terminated (SIGTERM); what finished is in the manifest: run again to resume", file=sys.stderr)
        return 143
    except (_UsageError, OutputFolderError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KangEngineError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
