"""MotionLibrary on CUDA: microseconds per ``sample`` and per ``sample`` + ``sample_kinematics`` for 4096 and
65536 environments over a 1M-frame, 24-body library, eager and replayed from a CUDA graph, against the
per-field gather baseline of ``bench_library.py`` (also eager and graphed) measured in the same run.

    python benchmarks/gpu_library.py [--frames 1048576] [--clips 1024] [--iters 200]

Exits with a message (status 0) when CUDA is not available.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import DATA
from bench_library import BaselineLibrary, synthetic_clips

import kangengine as ke
from kangengine.animation import MotionLibrary, SkeletonTree


def cuda_time(fn, iters: int) -> float:
    """Mean seconds per call of ``fn`` over ``iters`` calls, timed with CUDA events after 10 warm-up calls."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def graphed(fn):
    """Capture ``fn()`` (after a warm-up on a side stream, as torch asks) and return (replay, outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph.replay, outputs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=1 << 20)
    ap.add_argument("--clips", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_library.py: CUDA is not available here; nothing to measure (run it on a machine with a GPU).")
        return 0
    dev = torch.device("cuda")
    tree = SkeletonTree.from_articulation(ke.asset.MJCFLoader.load(DATA / "mjcf/protomotions/smpl_humanoid.xml"))
    lib = MotionLibrary(synthetic_clips(tree, args.clips, args.frames // args.clips), precompute_kinematics=True)
    lib.to(dev)
    base = BaselineLibrary(lib)
    print(
        f"MotionLibrary on {torch.cuda.get_device_name()}: {lib.num_motions} clips, {lib.total_frames:,} frames, "
        f"{lib.num_bodies} bodies, float32, torch {torch.__version__}"
    )
    gen = torch.Generator(device=dev).manual_seed(0)
    for n in (4096, 65536):
        ids = lib.sample_motion_ids(n, generator=gen)
        times = lib.sample_times(ids, generator=gen) * 1.5
        times32 = times.float()
        out = lib.sample(ids, times)
        kout = lib.sample_kinematics(out)

        def sample_only(ids=ids, times=times, out=out):
            return lib.sample(ids, times, check=False, out=out)

        def ours(ids=ids, times=times, out=out, kout=kout):
            s = lib.sample(ids, times, check=False, out=out)
            return s, lib.sample_kinematics(s, out=kout)

        def baseline(ids=ids, times32=times32):
            return base.get_motion_state(ids, times32)

        rows = {}
        for name, fn in (("sample", sample_only), ("sample + sample_kinematics", ours), ("baseline", baseline)):
            eager = cuda_time(fn, args.iters)
            replay, outputs = graphed(fn)
            rows[name] = (eager, cuda_time(replay, args.iters), outputs)
        # the graph's outputs equal an eager call with the same inputs
        gs, gk = rows["sample + sample_kinematics"][2]
        es = lib.sample(ids, times)
        ek = lib.sample_kinematics(es)
        err = max(float((gs.rows - es.rows).abs().max()), float((gk.body_positions - ek.body_positions).abs().max()))
        print(f"  n = {n:6d} (graph output vs eager: max |difference| {err:.1e})")
        for name, (eager, graph, _) in rows.items():
            print(f"    {name:<28} eager {eager * 1e6:8.1f} us   CUDA graph {graph * 1e6:8.1f} us")
        b = rows["baseline"]
        o = rows["sample + sample_kinematics"]
        print(f"    ratio vs baseline (sample + kinematics): eager {b[0] / o[0]:.1f}x, CUDA graph {b[1] / o[1]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
