"""Batched forward kinematics of the SMPL humanoid (24 bodies, 69 hinges + free root): frames per second
of ``ke.animation.forward_kinematics`` in numpy and torch over >= 1M frames, against a per-frame
``mujoco.mj_kinematics`` loop measured in the same run.

    python benchmarks/bench_fk.py [--frames 1048576] [--dtype float32]

Calls of this size run the traced program as a native kernel (``KANGENGINE_FK_BACKEND=auto``, built
once per process on the first large call, timed separately below); the numpy replay of the same program
(``KANGENGINE_FK_BACKEND=numpy``) is shown for reference. Rates are best-of-3 wall clock; "cpu" is
frames per CPU-second of the process over the same calls (all threads), which the shared machine
cannot inflate.
"""

from __future__ import annotations

import argparse
import os
import time

import mujoco
import numpy as np
import torch
from _common import DATA

import kangengine as ke


def timed(fn, repeats: int = 3) -> tuple[float, float]:
    """(best wall time, CPU time of the process during that call), seconds."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        fn()
        t, c = time.perf_counter() - t, time.process_time() - c
        best = min(best, (t, c))
    return best


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

    t_base, c_base = timed(baseline, 2)
    base_fps = nb / t_base
    qn = q.astype(args.dtype)
    qt = torch.from_numpy(qn)
    forward = ke.animation.forward_kinematics
    t0 = time.perf_counter()
    forward(layout, qn)  # first large call: builds the native kernel for this dtype
    t_build = time.perf_counter() - t0
    forward(layout, qt)
    rows = [("numpy", timed(lambda: forward(layout, qn))), ("torch (CPU)", timed(lambda: forward(layout, qt)))]
    backend = os.environ.get("KANGENGINE_FK_BACKEND")
    os.environ["KANGENGINE_FK_BACKEND"] = "numpy"
    forward(layout, qn[:1000])
    rows.append(("numpy replay", timed(lambda: forward(layout, qn), 2)))
    os.environ.pop("KANGENGINE_FK_BACKEND")
    if backend is not None:
        os.environ["KANGENGINE_FK_BACKEND"] = backend
    pos, _ = forward(layout, q[:nb])
    err = float(np.abs(pos - xpos[:, 1:]).max())
    print(f"SMPL humanoid FK, {args.frames} frames, {args.dtype}, {os.cpu_count()} CPU threads available")
    print(f"  per-frame mj_kinematics loop : {base_fps:12,.0f} frames/s  ({nb} frames; cpu {nb / c_base:12,.0f})")
    for name, (t, c) in rows:
        rate = args.frames / t
        print(
            f"  kangengine {name:<17} : {rate:12,.0f} frames/s  ratio {rate / base_fps:6.1f}x"
            f"  (cpu {args.frames / c:12,.0f} frames/s, {c / t:.1f} cores)"
        )
    print(f"  first large call (builds the native kernel): {t_build:.2f} s")
    print(f"  max |position - MuJoCo xpos| (float64) = {err:.2e} m")


if __name__ == "__main__":
    main()
