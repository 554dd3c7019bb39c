"""Batched forward kinematics of the SMPL humanoid (24 bodies, 69 hinges + free root): frames per second
of ``ke.animation.forward_kinematics`` in numpy and torch over >= 1M frames, against a per-frame
``mujoco.mj_kinematics`` loop measured in the same run.

    python benchmarks/bench_fk.py [--frames 1048576] [--dtype float32] [--sizes 256 1024 4096 ...]

Then the crossover: for calls of each size in ``--sizes`` (clip-sized calls), the numpy replay against the
native kernel (already built), for the coordinates FK and the skeleton FK (``from_local``), best-of-N CPU
and wall time of one call; and what the first call of a new process pays for the kernel, with and without the
on-disk kernel cache (each in a fresh subprocess with an empty / the filled cache folder).

Calls of this size run the traced program as a native kernel (``KANGENGINE_FK_BACKEND=auto``, built or
loaded from the on-disk kernel cache on the first call, timed separately below); the numpy replay of the same program
(``KANGENGINE_FK_BACKEND=numpy``) is shown for reference. Rates are best-of-3 wall clock; "cpu" is
frames per CPU-second of the process over the same calls (all threads), which the shared machine
cannot inflate.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
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
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 512, 1024, 2048, 4096, 10_000, 65_536])
    ap.add_argument("--skip-large", action="store_true", help="only the crossover and the cache timings")
    args = ap.parse_args()
    if args.skip_large:
        crossover(args)
        return
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
    crossover(args)


def _with_backend(mode: str, fn):
    old = os.environ.get("KANGENGINE_FK_BACKEND")
    os.environ["KANGENGINE_FK_BACKEND"] = mode
    try:
        return fn()
    finally:
        os.environ.pop("KANGENGINE_FK_BACKEND")
        if old is not None:
            os.environ["KANGENGINE_FK_BACKEND"] = old


_FIRST_CALL = """
import sys, time
import numpy as np
import kangengine as ke
path, dtype = sys.argv[1], sys.argv[2]
layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.MJCFLoader.load(path))
q = np.tile(layout.neutral(), (4096, 1)).astype(dtype)
t = time.perf_counter()
ke.animation.forward_kinematics(layout, q)
print(time.perf_counter() - t)
"""


def first_call(path, dtype: str, cache: str) -> float:
    """Seconds of the first native FK call (4096 frames) of a fresh process with the cache folder ``cache``."""
    env = dict(os.environ, KANGENGINE_CACHE_DIR=cache, KANGENGINE_FK_BACKEND="native")
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL, str(path), dtype], env=env, check=True, capture_output=True
    )
    return float(out.stdout.decode().split()[-1])


def crossover(args) -> None:
    """Numpy replay vs native kernel at clip sizes; first-call cost with and without the kernel cache."""
    path = DATA / "mjcf/protomotions/smpl_humanoid.xml"
    desc = ke.asset.MJCFLoader.load(path)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc)
    tree = ke.animation.SkeletonTree.from_articulation(desc)
    rng = np.random.default_rng(1)
    n = max(args.sizes)
    q = (np.tile(layout.neutral(), (n, 1)) + 0.3 * rng.normal(size=(n, layout.nq))).astype(args.dtype)
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=1, keepdims=True)
    rot = ke.rotations.quat_from_rotvec(0.4 * rng.normal(size=(n, tree.num_nodes, 3))).astype(args.dtype)
    root = rng.normal(size=(n, 3)).astype(args.dtype)
    calls = {
        "coordinates": lambda m: ke.animation.forward_kinematics(layout, q[:m]),
        "skeleton": lambda m: tree.kinematics.from_local(root[:m], rot[:m]),
    }
    for fn in calls.values():  # build both kernels (or load them from the cache)
        _with_backend("native", lambda fn=fn: fn(64))
    print(f"FK crossover, SMPL humanoid, {args.dtype}: one call, best of N (CPU time / wall time)")
    print(
        f"  {'frames':>7} | {'coordinates: numpy':>22} {'native':>18} {'ratio':>6} | {'skeleton: numpy':>22} "
        f"{'native':>18} {'ratio':>6}"
    )
    for m in args.sizes:
        reps = max(3, min(50, 200_000 // m))
        cells = []
        for fn in calls.values():
            tn = _with_backend("numpy", lambda fn=fn, m=m, r=reps: timed(lambda: fn(m), r))
            tk = _with_backend("native", lambda fn=fn, m=m, r=reps: timed(lambda: fn(m), r))
            cells.append(
                f"{tn[1] * 1e3:9.3f} / {tn[0] * 1e3:8.3f} ms {tk[1] * 1e3:7.3f} / {tk[0] * 1e3:6.3f} ms "
                f"{tn[1] / max(tk[1], 1e-9):5.1f}x"
            )
        print(f"  {m:7d} | " + " | ".join(cells))
    with tempfile.TemporaryDirectory() as cache:
        cold = first_call(path, args.dtype, cache)
        warm = first_call(path, args.dtype, cache)
    print(f"  first native call of a new process: {cold:.2f} s with an empty kernel cache, {warm:.2f} s with it")


if __name__ == "__main__":
    main()
