"""A converted robot motion exported back to BVH, to look at in Blender or any BVH viewer, and read back.

    python examples/export_bvh.py [OUT_DIR] [--rotation-order ZXY]

The shipped CMU walk is converted onto the shipped CMU humanoid with ``ke.pipelines.convert_clips``
(``OUT_DIR/cmu_02_01_walk.npz``: joint coordinates ``q``, ``qd``), read back as an ``ArticulationMotion``,
turned into the robot's own skeleton motion (``ArticulationMotionMapper.to_skeleton_motion``: one node per
body, local rotations from the joints) and written with ``ke.io.save_bvh`` as ``OUT_DIR/cmu_02_01_walk_robot.bvh``
(Y up, centimetres: what Blender's importer expects). The file is then read again with ``ke.io.load_bvh`` and
its joint positions compared with the robot's body positions from forward kinematics.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import kangengine as ke
from kangengine.data import data_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="output folder (default: a new temporary folder)")
    parser.add_argument("--rotation-order", default="ZXY", help="Euler order of the BVH rotation channels")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="kangengine_export_"))

    model = data_path("humanoid_CMU.xml")
    options = ke.pipelines.ConvertOptions(config="cmu_bvh_to_cmu_humanoid")
    report = ke.pipelines.convert_clips([data_path("cmu_02_01_walk.bvh")], model, options=options, out_dir=out)
    if report.failed:
        print(f"conversion failed: {report.failed[0].error}")
        return 1
    converted = Path(report.outcomes[0].output)
    print(f"wrote {converted}")

    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.load(model), free_root=True)
    motion = ke.animation.load_articulation_motion_npz(converted, layout)  # q [frames, 63], qd [frames, 62]
    skeleton_motion = ke.animation.ArticulationMotionMapper(layout).to_skeleton_motion(motion)
    bvh = ke.io.save_bvh(
        out / f"{converted.stem}_robot.bvh",
        skeleton_motion,
        rotation_order=args.rotation_order,
        up_axis="y",
        units="cm",
    )
    print(
        f"wrote {bvh}: {skeleton_motion.num_frames} frames at {skeleton_motion.fps:g} fps, "
        f"{skeleton_motion.tree.num_nodes} joints"
    )

    back = ke.io.load_bvh(bvh, up_axis="y", scale="cm", dtype=np.float64)
    body_pos_world, _ = ke.animation.forward_kinematics(layout, motion.q.astype(np.float64))  # [frames, 31, 3]
    rows = [back.tree.node_names.index(name) for name in layout.body_names]
    error = float(np.abs(np.asarray(back.global_translation)[:, rows] - body_pos_world).max())
    print(f"read it back: {back.num_frames} frames at {back.fps:g} fps; largest joint-to-body distance {error:.1e} m")
    return 0 if error < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
