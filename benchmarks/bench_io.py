"""Motion file I/O: BVH read and write throughput (MB/s) against ``bvhio`` on the largest shared BVH, and seconds
per FBX load against ``pyassimp.load``, all measured in the same run.

    python benchmarks/bench_io.py [--bvh bvh/cmu/01_01_cgspeed_hops_long.bvh]
        [--small bvh/other/mixamo_rig_freebvh.bvh] [--repeats 15]

Reads are timed on a big (2.07 MB) and a small (0.1 MB) file, wall and CPU time (``time.process_time``), best of
N, one thread. Peers: ``bvhio.readAsBvh`` (parse + Euler -> quaternion per joint and frame, no world transforms; the
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


def _best(fn, repeats: int) -> tuple[float, float]:
    """Smallest wall time and smallest CPU time (``time.process_time``) of ``repeats`` calls (seconds)."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def _read_row(path: Path, repeats: int) -> None:
    """One file: bvhio.readAsBvh against load_bvh (auto units and given units), wall and CPU time, same run."""
    import bvhio

    size = _mb(path)
    motion = ke.io.load_bvh(path)  # warm-up (imports, native parser build)
    ours = _best(lambda: ke.io.load_bvh(path), repeats)
    fixed = _best(lambda: ke.io.load_bvh(path, up_axis="y", scale="cm"), repeats)
    peer = _best(lambda: bvhio.readAsBvh(str(path)), max(3, repeats // 5))
    print(f"BVH read: {path.name}, {size:.3f} MB, {motion.num_frames} frames x {motion.tree.num_nodes} nodes")
    print(f"  bvhio.readAsBvh              : wall {peer[0] * 1e3:8.2f} ms  CPU {peer[1] * 1e3:8.2f} ms")
    for name, t in (("ke.io.load_bvh (auto units) ", ours), ("ke.io.load_bvh (units given)", fixed)):
        print(
            f"  {name} : wall {t[0] * 1e3:8.2f} ms  CPU {t[1] * 1e3:8.2f} ms  "
            f"ratio {peer[0] / t[0]:5.1f}x wall, {peer[1] / t[1]:5.1f}x CPU  ({size / t[0]:6.1f} MB/s)"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bvh", default="bvh/cmu/01_01_cgspeed_hops_long.bvh", help="big BVH file under the data folder")
    ap.add_argument("--small", default="bvh/other/mixamo_rig_freebvh.bvh", help="small BVH file (about 0.1 MB)")
    ap.add_argument("--repeats", type=int, default=15, help="best of N for our readers (the shared machine is noisy)")
    args = ap.parse_args()
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    import bvhio

    print(f"one thread (pure Python peer, single-threaded native parser); {os.cpu_count()} CPUs on the machine")
    path = DATA / args.bvh
    _read_row(path, args.repeats)
    _read_row(DATA / args.small, args.repeats)
    motion = ke.io.load_bvh(path)
    t0 = time.perf_counter()
    bvhio.readAsHierarchy(str(path))
    t_hier = time.perf_counter() - t0
    t_ours = best_of(lambda: ke.io.load_bvh(path), args.repeats)
    print(f"  {path.name}: bvhio.readAsHierarchy {t_hier * 1e3:8.1f} ms, ratio {t_hier / t_ours:6.1f}x (wall)")

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
