"""ArticulationMotionMapper throughput: frames per second of ``mapper.to_articulation_motion`` (q, qd, residuals
and the limit summary) for a smooth motion on the SMPL humanoid (23 x/y/z hinge triplets + free root) and the
Unitree G1 (29 single hinges + free root), against two scipy peers measured in the same run:

- the target's peer: scipy ``Rotation.as_euler("XYZ")`` vectorised over all frames and all hinge bodies at once
  (one ``Rotation`` of ``frames x bodies`` joint rotations ``rest^-1 * local``: the Euler angles alone, no
  branch choice, unwrapping, limits, velocities or residuals), float64 as scipy computes;
- a per-frame scipy loop (what motion libraries do: one ``Rotation.as_euler`` call per frame over all bodies).

Ours is timed three ways: the default (the native llvmlite kernels of ``kangengine.animation.native_mapper`` where
they apply: the SMPL humanoid's x/y/z triplets; the outputs' memory from the output pool of ``kangengine._buffers``,
which reuses the blocks of results the caller has dropped), the same with the pool off (every call's ``q`` and
``qd`` fresh pages the kernel must zero, as the first call of a process or a caller keeping every result sees it),
and the numpy reference path (``mapper.use_native = False``).

One thread (numpy element-wise kernels, no thread pool). Wall time and CPU time (``time.process_time``), best and
median of ``--repeats`` each, ours and the vectorised peer alternating call by call (so both see the load of the
same minutes; the peer as often as ours); on a shared machine the CPU-time ratio is the one to read (the load
average is printed before and after; for our fastest call the user and system seconds and its minor page faults,
counted with ``getrusage``). The input is built and touched before any timing: only the calls are timed.

The memory floor: numpy copying as many bytes as the mapping must read (quaternions, root translations) and write
(``q``, ``qd``), into a fresh array and into a written one, and the page faults of fresh ``q`` and ``qd`` alone (the
kernel zeroing their pages: system time no mapping that returns new arrays avoids).

    python benchmarks/bench_mapper.py [--frames 1048576] [--baseline-frames 4000] [--dtype float32] [--model all]
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
from _common import DATA
from scipy.spatial.transform import Rotation

import kangengine as ke
from kangengine import _buffers
from kangengine import rotations as R
from kangengine.asset import JointType


def _smooth_q(layout, frames, fps, rng):
    """A smooth motion inside the limits: root walking and turning, hinges as sums of sines."""
    t = np.arange(frames) / fps
    q = np.tile(layout.neutral(), (frames, 1))
    q[:, 0] = 0.8 * t
    q[:, 1] = 0.3 * np.sin(0.5 * t)
    q[:, 3:7] = R.quat_from_euler(np.stack([0.1 * np.sin(t), 0.05 * np.cos(t), 0.4 * t], -1), "xyz", extrinsic=True)
    for b in layout.blocks:
        if b.joint_type is not JointType.HINGE:
            continue
        lo, hi = b.limits if b.limits is not None else (-np.pi, np.pi)
        lo, hi = max(lo, -1.2), min(hi, 1.2)
        mid, amp = 0.5 * (lo + hi), 0.45 * (hi - lo)
        f = rng.uniform(0.3, 2.0, size=2)
        q[:, b.q_offset] = mid + amp * (0.7 * np.sin(f[0] * t + rng.uniform(0, 6)) + 0.3 * np.sin(f[1] * t))
    return q


def _scipy_loop(layout, local, root, n):
    """Per-frame scipy baseline: one Rotation.as_euler("XYZ") per frame over all hinge bodies, each hinge
    taking the Euler component of its axis (exact for x/y/z triplets and single x/y/z hinges)."""
    bodies, picks, cols, signs = [], [], [], []
    for b in range(layout.num_bodies):
        hinges = [x for x in layout.blocks_of_body(b) if x.joint_type is JointType.HINGE]
        if not hinges:
            continue
        bodies.append(b)
        for h in hinges:
            axis = int(np.argmax(np.abs(h.axis)))
            picks.append((len(bodies) - 1, axis))
            cols.append(h.q_offset)
            signs.append(np.sign(h.axis[axis]))
    bodies = np.array(bodies)
    rest_inv = Rotation.from_quat(layout.rest_rotations_wxyz[bodies][:, [1, 2, 3, 0]]).inv()
    pb = np.array([p[0] for p in picks])
    pa = np.array([p[1] for p in picks])
    signs = np.array(signs)
    q = np.zeros((n, layout.nq))
    for i in range(n):
        joint = rest_inv * Rotation.from_quat(local[i, bodies][:, [1, 2, 3, 0]])
        e = joint.as_euler("XYZ")
        q[i, cols] = signs * e[pb, pa]
        q[i, 0:3] = root[i]
        q[i, 3:7] = local[i, 0]
    return q


def _stats(times):
    """``(best, median)`` of ``[(wall, cpu), ...]``, each as ``(wall, cpu)``."""
    walls, cpus = sorted(t[0] for t in times), sorted(t[1] for t in times)
    return (walls[0], cpus[0]), (walls[len(walls) // 2], cpus[len(cpus) // 2])


def _scipy_vectorised(layout, local):
    """The target's peer: a function running one ``Rotation.as_euler("XYZ")`` over every frame and hinge body
    (float64) and returning the angles ``[frames, bodies, 3]``. The rest rotations are composed in (``rest^-1 *
    local``) only when one is not the identity, as the mapper does."""
    hinged = [b for b in range(layout.num_bodies) if layout.blocks_of_body(b)]
    bodies = [b for b in hinged if any(x.joint_type is JointType.HINGE for x in layout.blocks_of_body(b))]
    rest = np.asarray(layout.rest_rotations_wxyz)[bodies]
    rest_inv = None
    if not np.allclose(rest, [1.0, 0.0, 0.0, 0.0], atol=1e-15):
        rest_inv = Rotation.from_quat(np.tile(rest[:, [1, 2, 3, 0]], (local.shape[0], 1))).inv()

    def run():
        joint = Rotation.from_quat(local[:, bodies][..., [1, 2, 3, 0]].reshape(-1, 4).astype(np.float64))
        if rest_inv is not None:
            joint = rest_inv * joint
        return joint.as_euler("XYZ").reshape(local.shape[0], len(bodies), 3)

    return run


def _alternating(runs, repeats, around=None):
    """``repeats`` rounds of the functions ``runs {name: fn}``, one call of each per round in turn (so each sees
    the machine's load of the same minutes); per name the ``[(wall, cpu), ...]`` seconds, the ``(user, system,
    minor page faults)`` of its fastest call (CPU) and its last result. A function's previous result is dropped
    before it runs again, as a user's would be (not kept alive while the next one is computed). ``around {name:
    (before, after)}``: untimed calls just before and after that name's timed call."""
    times = {k: [] for k in runs}
    split = {k: (0.0, 0.0, 0, float("inf")) for k in runs}
    result = dict.fromkeys(runs)
    for _ in range(repeats):
        for name, fn in runs.items():
            result[name] = None
            if around and name in around:
                around[name][0]()
            o, f = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            w, c = time.perf_counter(), time.process_time()
            result[name] = fn()
            wall, cpu = time.perf_counter() - w, time.process_time() - c
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
            if around and name in around:
                around[name][1]()
            times[name].append((wall, cpu))
            if cpu < split[name][3]:
                split[name] = (os.times().user - o.user, os.times().system - o.system, faults, cpu)
    return times, {k: v[:3] for k, v in split.items()}, result


def _memory_floor(motion, result, repeats):
    """Seconds (wall, CPU; best of ``repeats``) numpy needs to move the bytes the mapping must move: read the
    input (quaternions and root translations) and write ``q`` and ``qd`` into fresh arrays, as one copy of that
    many bytes into a new array (the page faults of fresh output included), and into an array written before;
    and the page faults alone (fresh memory of ``q`` and ``qd``'s size, one byte written per 4 KiB page)."""
    n_in = np.asarray(motion.local_rotation).nbytes + np.asarray(motion.root_translation).nbytes
    n_out = result.motion.q.nbytes + result.motion.qd.nbytes
    src = np.ones((n_in + n_out) // 8)
    warm = np.zeros_like(src)
    fresh, touched, faults = [], [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        pages = np.empty(n_out, dtype=np.uint8)
        pages[::4096] = 1  # one byte per 4 KiB page: the kernel maps (and zeroes) the pages of fresh q and qd
        faults.append((time.perf_counter() - w, time.process_time() - c))
        del pages
        w, c = time.perf_counter(), time.process_time()
        out = src.copy()
        fresh.append((time.perf_counter() - w, time.process_time() - c))
        del out
        w, c = time.perf_counter(), time.process_time()
        np.copyto(warm, src)
        touched.append((time.perf_counter() - w, time.process_time() - c))
    return n_in + n_out, _stats(fresh)[0], _stats(touched)[0], _stats(faults)[0]


def _run(name, rel, args):
    rng = np.random.default_rng(0)
    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=ke.asset.MJCFLoader.load(DATA / rel))
    mapper = ke.animation.ArticulationMotionMapper(layout)
    fps = 60.0
    q_true = _smooth_q(layout, args.frames, fps, rng)
    state = mapper.to_skeleton_state(q_true)
    motion = ke.animation.SkeletonMotion(
        mapper.skeleton_tree,
        np.asarray(state.root_translation, dtype=args.dtype),
        np.asarray(state.local_rotation, dtype=args.dtype),
        fps,
    )
    mapper.to_articulation_motion(motion[:2000])  # warm-up (builds or loads the native kernels)

    local = np.asarray(motion.local_rotation)
    ours = lambda: mapper.to_articulation_motion(motion)  # noqa: E731
    runs = {"ours": ours, "fresh": ours, "scipy": _scipy_vectorised(layout, local)}
    limit = _buffers.stats()["limit"]
    pool_off = (lambda: _buffers.set_limit(0), lambda: _buffers.set_limit(limit))  # the pool's release untimed
    times, split, last = _alternating(runs, args.repeats, around={"fresh": pool_off})
    result, euler = last["ours"], last["scipy"]
    del last["fresh"]
    user, system, faults = split["ours"]
    (best_wall, best_cpu), (med_wall, med_cpu) = _stats(times["ours"])
    (fr_wall, fr_cpu), (fr_med_wall, fr_med_cpu) = _stats(times["fresh"])
    fr_user, fr_system, fr_faults = split["fresh"]
    (vec_wall, vec_cpu), (vec_med_wall, vec_med_cpu) = _stats(times["scipy"])
    mapper.use_native = False
    np_times, _, np_last = _alternating({"numpy": lambda: mapper.to_articulation_motion(motion)}, args.repeats)
    np_result = np_last["numpy"]
    (np_wall, np_cpu), _ = _stats(np_times["numpy"])
    mapper.use_native = True
    dt = np.dtype(args.dtype)
    native_used = "fused pass" if mapper._native_fused(dt) else ("kernels" if mapper._native_kernels(dt) else "")
    path_diff = np.abs(result.motion.q.astype(np.float64) - np_result.motion.q).max()
    del np_result, np_last
    nbytes, (floor_wall, floor_cpu), (warm_wall, warm_cpu), (_, fault_cpu) = _memory_floor(motion, result, args.repeats)

    nb = args.baseline_frames
    local64 = np.asarray(state.local_rotation[:nb], dtype=np.float64)
    root64 = np.asarray(state.root_translation[:nb], dtype=np.float64)
    t0 = time.perf_counter()
    q_base = _scipy_loop(layout, local64, root64, nb)
    base_fps = nb / (time.perf_counter() - t0)

    hinge = [b.q_offset for b in layout.blocks if b.joint_type is JointType.HINGE]
    err = np.abs(result.motion.q[:, hinge].astype(np.float64) - q_true[:, hinge]).max()
    err_base = np.abs(q_base[:, hinge] - q_true[:nb, hinge]).max()
    rate, rate_cpu = args.frames / best_wall, args.frames / best_cpu
    print(f"{name}: {layout.num_bodies} bodies, {len(hinge)} hinges, {args.frames} frames, {args.dtype}, one thread")
    print(
        f"  scipy as_euler, all frames x bodies : CPU {vec_cpu:7.3f} s (median {vec_med_cpu:7.3f})  wall "
        f"{vec_wall:7.3f} s (median {vec_med_wall:7.3f})  ({args.frames / vec_cpu:12,.0f} frames/s CPU; Euler only)"
    )
    print(f"  per-frame scipy Euler loop          : {base_fps:12,.0f} frames/s wall ({nb} frames, float64, q only)")
    print(
        f"  kangengine to_articulation_motion   : CPU {best_cpu:7.3f} s (median {med_cpu:7.3f})  wall "
        f"{best_wall:7.3f} s (median {med_wall:7.3f})  ({rate_cpu:12,.0f} frames/s CPU; q, qd, residuals, summary; "
        f"best run: user {user:.2f} s, system {system:.2f} s, {faults} page faults)"
    )
    print(
        f"    the same, output pool off         : CPU {fr_cpu:7.3f} s (median {fr_med_cpu:7.3f})  wall "
        f"{fr_wall:7.3f} s (median {fr_med_wall:7.3f})  (fresh pages every call; best run: user {fr_user:.2f} s, "
        f"system {fr_system:.2f} s, {fr_faults} page faults)"
    )
    print(
        f"  kangengine, numpy reference path    : CPU {np_cpu:7.3f} s  wall {np_wall:7.3f} s  (native "
        f"{native_used or 'not applicable'} by default; max |q native - q numpy| {path_diff:.1e} rad)"
    )
    print(
        f"  memory floor ({nbytes / 1e6:,.0f} MB read + written): numpy copy into a fresh array CPU {floor_cpu:6.3f} s "
        f"(wall {floor_wall:6.3f}), into a written one CPU {warm_cpu:6.3f} s; ours is {best_cpu / warm_cpu:4.1f}x "
        f"the written-array floor (pool off: {fr_cpu / floor_cpu:4.1f}x the fresh-array one); the fresh pages of q "
        f"and qd alone CPU {fault_cpu:6.3f} s"
    )
    print(
        f"  ratio vs vectorised scipy: {vec_cpu / best_cpu:5.2f}x CPU best of {args.repeats}, "
        f"{vec_med_cpu / med_cpu:5.2f}x CPU median, {vec_wall / best_wall:5.2f}x wall (target >= 20x; numpy path "
        f"{vec_cpu / np_cpu:5.2f}x CPU); vs the per-frame loop {rate / base_fps:6.1f}x wall; output pool off "
        f"{vec_cpu / fr_cpu:5.2f}x CPU best, {vec_med_cpu / fr_med_cpu:5.2f}x median"
    )
    print(
        f"  max |q - generating q|: kangengine {err:.1e} rad, scipy loop {err_base:.1e} rad; "
        f"max residual {float(result.residual_angles.max()):.1e} rad; scipy Euler array {euler.shape}"
    )
    print(f"  load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=1 << 20)
    ap.add_argument("--baseline-frames", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--model", default="all", choices=["all", "smpl", "g1"], help="which articulation(s) to map")
    args = ap.parse_args()
    if args.frames < 100_000:
        ap.error("--frames must be at least 100000")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    if args.model in ("all", "smpl"):
        _run("SMPL humanoid", "mjcf/protomotions/smpl_humanoid.xml", args)
    if args.model in ("all", "g1"):
        _run("Unitree G1", "mjcf/unitree/g1_29dof.nomesh.xml", args)


if __name__ == "__main__":
    main()
