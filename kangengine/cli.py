"""The ``kangengine`` command.

``kangengine info MODEL [CLIP ...]`` prints, as JSON, what KangEngine reads from an articulation file
(MJCF ``.xml`` or URDF ``.urdf``: bodies, joints, coordinate layout, signature) and from motion clips.
``kangengine info --example`` does the same on the shipped example model and clip.
``kangengine convert MODEL CLIP... --config NAME --out DIR`` retargets and maps clips onto the model, one
articulation-motion ``.npz`` per clip, resumable, bad clips listed (``--example``: the shipped CMU walk onto
the shipped CMU humanoid).
``kangengine validate MODEL CLIP... --out DIR`` tracks every clip in the simulator and writes a per-clip JSON
report with a verdict, PNG plots and ``summary.csv`` (resumable, bad clips listed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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


def _info(args) -> int:
    from .data import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path

    model = args.model
    clips = list(args.clips)
    if args.example:
        model = str(data_path(CMU_HUMANOID_MJCF))
        clips = [str(data_path(CMU_WALK_BVH))] + clips
    if model is None:
        print("kangengine info: give a MODEL file or --example", file=sys.stderr)
        return 2
    report = {
        "model": describe_model(model, order=args.order, free_root=not args.fixed_root),
        "clips": [describe_clip(c) for c in clips],
    }
    print(json.dumps(report, indent=2))
    return 0


def _convert(args) -> int:
    from .data import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path
    from .pipelines import ConvertOptions, convert_clips

    model, clips, config = args.model, list(args.clips), args.config
    if args.example:
        model, clips = str(data_path(CMU_HUMANOID_MJCF)), [str(data_path(CMU_WALK_BVH))] + clips
        config = config or "cmu_bvh_to_cmu_humanoid"
    if model is None or not clips or config is None:
        print("kangengine convert: give MODEL, CLIP... and --config, or --example", file=sys.stderr)
        return 2
    options = ConvertOptions(
        config=config, free_root=not args.fixed_root, clamp_to_limits=args.clamp, fps=args.fps, order=args.order
    )
    report = convert_clips(clips, model, options=options, out_dir=args.out, overwrite=args.overwrite, jobs=args.jobs)
    counts = report.to_dict()["counts"]
    print(
        json.dumps(
            {
                "summary": report.summary_path,
                "counts": counts,
                "failed": [{"clip": o.source, "error": o.error} for o in report.failed],
            },
            indent=2,
        )
    )
    return 1 if report.failed else 0


def _validate(args) -> int:
    import warnings

    import torch

    from .animation import ArticulationCoordinateLayout, ArticulationMotionMapper
    from .asset import load
    from .data import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path
    from .pipelines import clip_names, load_for_validation, validate
    from .sim import Model, TrackingSettings

    model_path, clips, config = args.model, list(args.clips), args.config
    if args.example:
        model_path, clips = str(data_path(CMU_HUMANOID_MJCF)), [str(data_path(CMU_WALK_BVH))] + clips
        config = config or "cmu_bvh_to_cmu_humanoid"
    if model_path is None or not clips:
        print("kangengine validate: give MODEL and CLIP... (or --example)", file=sys.stderr)
        return 2
    desc = load(model_path, order=args.order)
    layout = ArticulationCoordinateLayout.from_data(data=desc, free_root=not args.fixed_root)
    dtype = torch.float64 if args.float64 else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Model.from_desc(desc, layout, device=args.device, dtype=dtype)
    mapper = ArticulationMotionMapper(layout)
    motions, skipped = {}, {}
    for c, name in zip(clips, clip_names(clips)):
        try:
            motions[name] = load_for_validation(Path(c), layout, desc, config, mapper)
        except Exception as exc:  # a bad clip is listed, never allowed to stop the batch
            skipped[name] = f"{c}: {type(exc).__name__}: {exc}"
    settings = TrackingSettings(dt=args.dt, root_assist_frequency_hz=args.root_assist_hz)
    result = validate(
        model,
        motions,
        out_dir=args.out,
        settings=settings,
        plots=not args.no_plots,
        resume=not args.overwrite,
        batch_size=args.batch_size,
        skipped=skipped,
    )
    clips_out = [{"clip": r.name, "verdict": r.verdict.value, "reasons": list(r.reason_codes)} for r in result.reports]
    skipped_out = [{"clip": s.name, "error": s.error} for s in result.skipped]
    report = {"summary": result.summary_path, "counts": result.counts(), "clips": clips_out, "skipped": skipped_out}
    print(json.dumps(report, indent=2))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kangengine", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="describe an articulation file and motion clips")
    info.add_argument("model", nargs="?", help="MJCF (.xml) or URDF (.urdf) file")
    info.add_argument("clips", nargs="*", help="motion clips (.bvh, .npz, ...)")
    info.add_argument("--example", action="store_true", help="use the shipped example model and clip")
    info.add_argument("--order", default="DFS", choices=["DFS", "BFS"], help="body order (default DFS)")
    info.add_argument("--fixed-root", action="store_true", help="keep the root fixed (no free root block)")
    info.set_defaults(func=_info)
    conv = sub.add_parser("convert", help="retarget and map clips onto a robot, one .npz per clip (resumable)")
    conv.add_argument("model", nargs="?", help="MJCF (.xml) or URDF (.urdf) file")
    conv.add_argument("clips", nargs="*", help="motion clips (.bvh, .fbx, AMASS .npz, poselib .npy)")
    conv.add_argument("--config", help="retarget configuration (e.g. cmu_bvh_to_cmu_humanoid)")
    conv.add_argument("--out", default="kangengine_output", help="output folder (default ./kangengine_output)")
    conv.add_argument("--example", action="store_true", help="the shipped CMU walk onto the shipped CMU humanoid")
    conv.add_argument("--fps", type=float, default=None, help="resample clips to this rate first")
    conv.add_argument("--clamp", action="store_true", help="clamp joint values into their limits")
    conv.add_argument("--fixed-root", action="store_true", help="keep the root fixed (no free root block)")
    conv.add_argument("--order", default="DFS", choices=["DFS", "BFS"], help="body order (default DFS)")
    conv.add_argument("--overwrite", action="store_true", help="redo clips whose output is up to date")
    conv.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    conv.set_defaults(func=_convert)
    val = sub.add_parser("validate", help="track clips in physics: per-clip JSON report, plots, summary.csv")
    val.add_argument("model", nargs="?", help="MJCF (.xml) or URDF (.urdf) file")
    val.add_argument("clips", nargs="*", help="articulation .npz (kangengine convert) or motion files with --config")
    val.add_argument("--config", help="retarget configuration for motion files (e.g. cmu_bvh_to_cmu_humanoid)")
    val.add_argument("--out", default="kangengine_validation", help="output folder (default ./kangengine_validation)")
    val.add_argument("--example", action="store_true", help="the shipped CMU walk on the shipped CMU humanoid")
    val.add_argument("--dt", type=float, default=1 / 60, help="simulator step in seconds (default 1/60)")
    val.add_argument("--root-assist-hz", type=float, default=0.0, help="root assistance frequency (default 0: off)")
    val.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    val.add_argument("--float64", action="store_true", help="simulate in float64 (default float32)")
    val.add_argument("--batch-size", type=int, default=64, help="clips simulated together (default 64)")
    val.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    val.add_argument("--overwrite", action="store_true", help="redo clips whose report is up to date")
    val.add_argument("--fixed-root", action="store_true", help="keep the root fixed (no free root block)")
    val.add_argument("--order", default="DFS", choices=["DFS", "BFS"], help="body order (default DFS)")
    val.set_defaults(func=_validate)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KangEngineError as exc:
        print(f"kangengine: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
