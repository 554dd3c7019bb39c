"""Motion file I/O: BVH read and write throughput (MB/s) against ``bvhio`` on the largest shared BVH, and seconds
per FBX load against ``pyassimp.load``, all measured in the same run.

    python benchmarks/bench_io.py [--bvh bvh/cmu/01_01_cgspeed_hops_long.bvh] [--repeats 5]

Peers: ``bvhio.readAsBvh`` (parse + Euler -> quaternion per joint and frame, no world transforms; the
lightest bvhio read), ``bvhio.readAsHierarchy`` (what bvhio users call to get joint transforms),
``bvhio.writeBvh`` (writes the container readAsBvh returns), ``pyassimp.load`` (pyassimp's own scene
reader; it cannot read the skinned Blender files with Debian's libassimp 5.2).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

from _common import DATA, best_of

import kangengine as ke


def _mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bvh", default="bvh/cmu/01_01_cgspeed_hops_long.bvh", help="BVH file under the data folder")
    ap.add_argument("--repeats", type=int, default=15, help="best of N for our readers (the shared machine is noisy)")
    args = ap.parse_args()
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    import bvhio

    path = DATA / args.bvh
    size = _mb(path)
    motion = ke.io.load_bvh(path)  # warm-up (imports, FK compile for the unit detection)
    t_ours = best_of(lambda: ke.io.load_bvh(path), args.repeats)
    t_fixed = best_of(lambda: ke.io.load_bvh(path, up_axis="y", scale="cmu"), args.repeats)
    t_bvhio = best_of(lambda: bvhio.readAsBvh(str(path)), 3)
    t0 = time.perf_counter()
    bvhio.readAsHierarchy(str(path))
    t_hier = time.perf_counter() - t0

    print(
        f"BVH read: {path.name}, {size:.2f} MB, {motion.num_frames} frames x {motion.tree.num_nodes} nodes, "
        f"{os.cpu_count()} CPU threads available"
    )
    print(f"  bvhio.readAsBvh              : {size / t_bvhio:8.1f} MB/s  ({t_bvhio * 1e3:8.1f} ms)")
    print(f"  bvhio.readAsHierarchy        : {size / t_hier:8.1f} MB/s  ({t_hier * 1e3:8.1f} ms)")
    print(
        f"  ke.io.load_bvh (auto units)  : {size / t_ours:8.1f} MB/s  ({t_ours * 1e3:8.1f} ms)  "
        f"ratio {t_bvhio / t_ours:5.1f}x readAsBvh, {t_hier / t_ours:6.1f}x readAsHierarchy"
    )
    print(
        f"  ke.io.load_bvh (units given) : {size / t_fixed:8.1f} MB/s  ({t_fixed * 1e3:8.1f} ms)  "
        f"ratio {t_bvhio / t_fixed:5.1f}x readAsBvh"
    )

    with tempfile.TemporaryDirectory() as tmp:
        ours_out = Path(tmp) / "ours.bvh"
        peer_out = Path(tmp) / "bvhio.bvh"
        container = bvhio.readAsBvh(str(path))
        t_w = best_of(lambda: ke.io.save_bvh(ours_out, motion), 3)
        t_wb = best_of(lambda: bvhio.writeBvh(str(peer_out), container, percision=6), 2)
        print("BVH write (same motion, 6 decimals):")
        print(f"  bvhio.writeBvh               : {_mb(peer_out) / t_wb:8.1f} MB/s  ({t_wb * 1e3:8.1f} ms)")
        print(
            f"  ke.io.save_bvh               : {_mb(ours_out) / t_w:8.1f} MB/s  ({t_w * 1e3:8.1f} ms)  "
            f"ratio {t_wb / t_w:5.1f}x (time)"
        )

    print("FBX load (seconds per file):")
    try:
        import pyassimp
    except Exception as exc:  # pragma: no cover - no libassimp
        print(f"  skipped: pyassimp unavailable ({exc})")
        return
    for rel in ("fbx/07_01_cmu.fbx", "fbx/animation_with_skeleton.fbx", "fbx/huesitos.fbx"):
        f = DATA / rel
        ke.io.load_fbx(f)
        t = best_of(lambda f=f: ke.io.load_fbx(f), args.repeats)
        line = f"  {f.name:<28} ke.io.load_fbx {t:7.4f} s"
        try:
            t0 = time.perf_counter()
            with pyassimp.load(str(f)):
                pass
            tp = time.perf_counter() - t0
            line += f"   pyassimp.load {tp:7.4f} s   ratio {tp / t:6.1f}x"
        except Exception as exc:
            line += f"   pyassimp.load fails: {type(exc).__name__}: {exc}"
        print(line)


if __name__ == "__main__":
    main()
