"""Rotation helpers against scipy.spatial.transform on 1M rotations, one thread, measured in the same run.

Ours: ``kangengine.rotations`` on WXYZ numpy arrays. Peer: what a scipy user calls for the same result,
``Rotation`` built from XYZW (or matrices, Euler angles) and converted back (``from_quat(xyzw).as_matrix()``,
``from_matrix(m).as_quat()``, ``from_quat(xyzw).as_euler("xyz")``, ``from_euler("xyz", a).as_quat()``,
``(r1 * r2).as_quat()``). Each time is the best of ``--repeats`` calls, CPU time of this process and wall
time; the ratio is scipy's CPU time over ours (> 1: we are faster). Both sides run on one thread
(element-wise numpy and scipy's Cython loops; the thread variables are set before numpy is imported).

    python benchmarks/bench_rotations.py [--n 1000000] [--repeats 5] [--dtype float64]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

from kangengine import rotations as R  # noqa: E402


def best_times(fn, repeats: int) -> tuple[float, float]:
    """Smallest (CPU time of this process, wall time) of ``repeats`` calls of ``fn()``, seconds."""
    cpu = wall = float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpu = min(cpu, time.process_time() - c)
        wall = min(wall, time.perf_counter() - w)
    return cpu, wall


def cases(n: int, dtype, rng):
    """(name, ours, scipy's) per helper, on the same rotations: ``q`` WXYZ for us, ``xyzw`` for scipy."""
    q = R.quat_normalize(rng.normal(size=(n, 4))).astype(dtype)
    q2 = R.quat_normalize(rng.normal(size=(n, 4))).astype(dtype)
    xyzw, xyzw2 = R.quat_wxyz_to_xyzw(q), R.quat_wxyz_to_xyzw(q2)
    m = R.quat_to_matrix(q)
    angles = rng.uniform(-np.pi, np.pi, size=(n, 3)).astype(dtype)
    r, r2 = Rotation.from_quat(xyzw), Rotation.from_quat(xyzw2)
    return [
        ("quat_to_matrix", lambda: R.quat_to_matrix(q), lambda: Rotation.from_quat(xyzw).as_matrix()),
        ("quat_from_matrix", lambda: R.quat_from_matrix(m), lambda: Rotation.from_matrix(m).as_quat()),
        (
            "quat_to_euler",
            lambda: R.quat_to_euler(q, "xyz", extrinsic=True),
            lambda: Rotation.from_quat(xyzw).as_euler("xyz"),
        ),
        (
            "quat_from_euler",
            lambda: R.quat_from_euler(angles, "xyz", extrinsic=True),
            lambda: Rotation.from_euler("xyz", angles).as_quat(),
        ),
        ("quat_multiply", lambda: R.quat_multiply(q, q2), lambda: (r * r2).as_quat()),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="rotations per call")
    ap.add_argument("--repeats", type=int, default=5, help="best of N (the shared machine is noisy)")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    print(f"{args.n:,} rotations, {dtype.name}, one thread, best of {args.repeats} (CPU time | wall time)")
    print(f"  {'':18s} {'kangengine':>19s}   {'scipy':>19s}   ratio (scipy / ours, CPU)")
    for name, ours, peer in cases(args.n, dtype, np.random.default_rng(0)):
        ours(), peer()  # warm-up
        oc, ow = best_times(ours, args.repeats)
        pc, pw = best_times(peer, args.repeats)
        print(
            f"  {name:18s} {oc * 1e3:7.1f} | {ow * 1e3:7.1f} ms   {pc * 1e3:7.1f} | {pw * 1e3:7.1f} ms   "
            f"{pc / oc:5.2f}x  (wall {pw / ow:5.2f}x)"
        )


if __name__ == "__main__":
    main()
