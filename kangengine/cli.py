"""The ``kangengine`` command.

``kangengine info MODEL [CLIP ...]`` prints, as JSON, what KangEngine reads from an articulation file
(MJCF ``.xml`` or URDF ``.urdf``: bodies, joints, coordinate layout, signature) and from motion clips.
``kangengine info --example`` does the same on the shipped example model and clip.
``kangengine convert MODEL CLIP... --config NAME --out DIR`` retargets and maps clips onto the model, one
articulation-motion ``.npz`` per clip, resumable, bad clips listed (``--example``: the shipped CMU walk onto
the shipped CMU humanoid).
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

    from . import io as ke_io

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
        motion = ke_io.load_motion(path)
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
    from .examples import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path

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
    from .datasets.batch import ConvertOptions, convert_clips
    from .examples import CMU_HUMANOID_MJCF, CMU_WALK_BVH, data_path

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
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KangEngineError as exc:
        print(f"kangengine: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
