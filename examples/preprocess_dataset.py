"""Dataset preprocessing: a folder of mocap clips converted onto a robot, one joint-coordinate file per clip.

    python examples/preprocess_dataset.py [OUT_DIR] [--clips FOLDER] [--model MJCF] [--config NAME] [--jobs N]

Every ``*.bvh`` in ``--clips`` (default: the clips shipped in ``kangengine.data``, the CMU 02_01 walk) is read,
retargeted onto ``--model`` (default: the shipped CMU humanoid) with the named configuration, mapped to the
model's joint coordinates and written as ``OUT_DIR/<clip>.npz`` with ``OUT_DIR/convert_summary.json``
listing every clip. A clip that fails is listed, not fatal. Run it twice: the second run finds every clip
up to date and converts nothing (the outputs carry a fingerprint of their input).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import kangengine as ke
from kangengine.data import data_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="output folder (default: a new temporary folder)")
    parser.add_argument("--clips", default=str(data_path("cmu_02_01_walk.bvh").parent), help="folder of .bvh clips")
    parser.add_argument("--model", default=str(data_path("humanoid_CMU.xml")), help="MJCF or URDF of the robot")
    parser.add_argument("--config", default="cmu_bvh_to_cmu_humanoid", help="retarget configuration name")
    parser.add_argument("--fps", type=float, default=30.0, help="resample every clip to this rate")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    args = parser.parse_args(argv)

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="kangengine_preprocess_"))
    clips = sorted(Path(args.clips).glob("*.bvh"))
    if not clips:
        parser.error(f"no .bvh clips in {args.clips}")
    options = ke.pipelines.ConvertOptions(config=args.config, fps=args.fps)
    report = ke.pipelines.convert_clips(clips, args.model, options=options, out_dir=out, jobs=args.jobs)

    for outcome in report.outcomes:
        if outcome.status == "failed":
            print(f"failed     {outcome.source}: {outcome.error}")
        elif outcome.status == "up_to_date":
            print(f"up to date {outcome.output}")
        else:
            print(
                f"wrote      {outcome.output}: {outcome.frames} frames at {outcome.fps:g} fps, "
                f"largest residual {outcome.residual_max_rad:.3f} rad"
            )
    print(f"wrote      {report.summary_path}")
    counts = report.to_dict()["counts"]
    print(f"{counts['converted']} converted, {counts['up_to_date']} up to date, {counts['failed']} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
