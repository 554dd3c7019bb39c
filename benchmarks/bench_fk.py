"""Batched forward kinematics of the SMPL humanoid (24 bodies, 69 hinges + free root): frames per second
of ``ke.animation.forward_kinematics`` in numpy and torch over >= 1M frames, against a per-frame
``mujoco.mj_kinematics`` loop measured in the same run.

    python benchmarks/bench_fk.py [--frames 1048576] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os

import mujoco
import numpy as np
import torch
from _common import DATA, best_of

import kangengine as ke


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=1 << 20)
    ap.add_argument("--baseline-frames", type=int, default=50_000)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    path = DATA / "mjcf/protomotions/smpl_humanoid.xml"
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.MJCFLoader.load(path))
    rng = np.random.default_rng(0)
    q = np.tile(layout.neutral(), (args.frames, 1)) + 0.3 * rng.normal(size=(args.frames, layout.nq))
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)

    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    nb = args.baseline_frames
    xpos = np.empty((nb, m.nbody, 3))
    xquat = np.empty((nb, m.nbody, 4))

    def baseline():
        for i in range(nb):
            d.qpos[:] = q[i]
            mujoco.mj_kinematics(m, d)
            xpos[i] = d.xpos
            xquat[i] = d.xquat

    t_base = best_of(baseline, 2)
    base_fps = nb / t_base
    qn = q.astype(args.dtype)
    qt = torch.from_numpy(qn)
    forward = ke.animation.forward_kinematics
    forward(layout, qn[:1000])
    t_np = best_of(lambda: forward(layout, qn), 3)
    t_th = best_of(lambda: forward(layout, qt), 3)
    pos, _ = forward(layout, q[:nb])
    err = float(np.abs(pos - xpos[:, 1:]).max())
    print(f"SMPL humanoid FK, {args.frames} frames, {args.dtype}, {os.cpu_count()} CPU threads available")
    print(f"  per-frame mj_kinematics loop : {base_fps:12,.0f} frames/s  ({nb} frames)")
    for name, t in (("numpy", t_np), ("torch (CPU)", t_th)):
        rate = args.frames / t
        print(f"  kangengine {name:<17} : {rate:12,.0f} frames/s  ratio {rate / base_fps:6.1f}x")
    print(f"  max |position - MuJoCo xpos| (float64) = {err:.2e} m")


if __name__ == "__main__":
    main()
