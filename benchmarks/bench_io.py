"""Motion file I/O: BVH read and write throughput (MB/s) against ``bvhio`` on the largest shared BVH, and seconds
per FBX load against ``pyassimp.load``, all measured in the same run.

    python benchmarks/bench_io.py [--bvh bvh/cmu/01_01_cgspeed_hops_long.bvh]
        [--small bvh/other/mixamo_rig_freebvh.bvh] [--repeats 15] [--rounds 9]

Reads are timed on a big (2.07 MB) and a small (0.1 MB) file, wall and CPU time (``time.process_time``), one
thread, in interleaved rounds (each round: our reader ``--repeats // 3`` times each way, then the peer once), so a
load change on a shared machine hits both sides alike; the median over all calls is the headline ratio (the best
of each side is printed beside it). Peers: ``bvhio.readAsBvh`` (parse + Euler -> quaternion per joint and frame,
no world transforms; the lightest bvhio read), ``bvhio.readAsHierarchy`` (what bvhio users call to get joint
transforms), ``bvhio.writeBvh`` (writes the container readAsBvh returns), ``pyassimp.load`` (pyassimp's own scene
reader; it cannot read the skinned Blender files with Debian's libassimp 5.2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from _common import DATA, best_of

import kangengine as ke


def _mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def _timed(fn) -> tuple[float, float]:
    """Wall and CPU time (``time.process_time``) of one call of ``fn()`` (seconds)."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _read_row(path: Path, repeats: int, rounds: int) -> None:
    """One file: bvhio.readAsBvh against load_bvh (auto units and given units), wall and CPU time, interleaved
    rounds; medians (and bests) over all calls of each."""
    import bvhio

    size = _mb(path)
    motion = ke.io.load_bvh(path)  # warm-up (imports, native parser build)
    bvhio.readAsBvh(str(path))
    each = max(1, repeats // 3)
    times: dict[str, list[tuple[float, float]]] = {"peer": [], "auto": [], "given": []}
    for _ in range(rounds):
        for _ in range(each):
            times["auto"].append(_timed(lambda: ke.io.load_bvh(path)))
            times["given"].append(_timed(lambda: ke.io.load_bvh(path, up_axis="y", scale="cm")))
        times["peer"].append(_timed(lambda: bvhio.readAsBvh(str(path))))
    med = {k: tuple(statistics.median(t[i] for t in v) for i in (0, 1)) for k, v in times.items()}
    best = {k: tuple(min(t[i] for t in v) for i in (0, 1)) for k, v in times.items()}
    print(
        f"BVH read: {path.name}, {size:.3f} MB, {motion.num_frames} frames x {motion.tree.num_nodes} nodes "
        f"({rounds} rounds: {len(times['auto'])} calls of ours each way, {len(times['peer'])} of the peer)"
    )
    p, pb = med["peer"], best["peer"]
    print(
        f"  bvhio.readAsBvh              : median wall {p[0] * 1e3:8.2f} ms  CPU {p[1] * 1e3:8.2f} ms   "
        f"(best {pb[0] * 1e3:.2f} / {pb[1] * 1e3:.2f})"
    )
    for key, name in (("auto", "ke.io.load_bvh (auto units) "), ("given", "ke.io.load_bvh (units given)")):
        t, tb = med[key], best[key]
        print(
            f"  {name} : median wall {t[0] * 1e3:8.2f} ms  CPU {t[1] * 1e3:8.2f} ms   ratio {p[0] / t[0]:5.1f}x wall, "
            f"{p[1] / t[1]:5.1f}x CPU  ({size / t[0]:6.1f} MB/s); best {tb[0] * 1e3:.2f} / {tb[1] * 1e3:.2f} ms, "
            f"ratio of bests {pb[0] / tb[0]:.1f}x wall, {pb[1] / tb[1]:.1f}x CPU"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bvh", default="bvh/cmu/01_01_cgspeed_hops_long.bvh", help="big BVH file under the data folder")
    ap.add_argument("--small", default="bvh/other/mixamo_rig_freebvh.bvh", help="small BVH file (about 0.1 MB)")
    ap.add_argument(
        "--repeats", type=int, default=15, help="calls of our readers per file and way is this x rounds / 3"
    )
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the BVH read rows (peer once each)")
    args = ap.parse_args()
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    import bvhio

    print(f"one thread (pure Python peer, single-threaded native parser); {os.cpu_count()} CPUs on the machine")
    path = DATA / args.bvh
    _read_row(path, args.repeats, args.rounds)
    _read_row(DATA / args.small, args.repeats, 3 * args.rounds)  # a small file: more rounds for the same time
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
