"""Human -> G1 retargeting: frames/s of ``ke.retarget.retarget_to_robot`` on the 2752-frame CMU 01_01 clip, one CPU
thread, against a per-frame differential-IK baseline with ``mink`` (GMR's method: per frame, ``FrameTask`` s on
the same correspondences, weights, offsets and targets, up to 10 ``solve_ik`` + ``integrate_inplace`` steps
warm-started from the previous frame, stopping when the error gains less than 1 mm; ``daqp``, damping 0.5,
configuration limits). Both results go through the same metrics (``robot_retarget_metrics``) and are printed
beside their speeds.

    python benchmarks/bench_retarget.py [--frames 2752] [--clip bvh/cmu/01_01_cgspeed_hops_long.bvh]
        [--device cuda --batch 64]

Wall time and process CPU time are both shown (one thread: they agree unless the machine is loaded).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import DATA

import kangengine as ke
from kangengine.retarget import robot as robot_mod
from kangengine.retarget.robot_metrics import robot_retarget_metrics


def _mink_baseline(cfg, layout, motion, tg, src):
    """Per-frame mink IK on the key-body tasks (no contact handling: that is what GMR does)."""
    import mink
    import mujoco

    from kangengine.adapters import MuJoCoMotionAdapter

    spec = mujoco.MjSpec.from_file(str(cfg.target_model_path()))
    sites = []
    for i, b in enumerate(cfg.bodies):
        name = f"ke_task_{i}"
        spec.body(b.robot).add_site(name=name, pos=list(b.offset))
        sites.append(name)
    model = spec.compile()
    conf = mink.Configuration(model)
    tasks = [
        mink.FrameTask(
            frame_name=s,
            frame_type="site",
            position_cost=b.position_weight,
            orientation_cost=b.orientation_weight,
            lm_damping=1.0,
        )
        for s, b in zip(sites, cfg.bodies)
    ]
    limits = [mink.ConfigurationLimit(model)]
    orient_of = {int(k): j for j, k in enumerate(np.flatnonzero([b.orientation_weight > 0 for b in cfg.bodies]))}
    adapter = MuJoCoMotionAdapter(layout, model=model)
    n = tg.key_target.shape[0]
    qpos = np.zeros((n, model.nq))
    q0 = model.qpos0.copy()
    q0[:3] = tg.key_target[0, 0]
    conf.update(q0)
    dt = model.opt.timestep
    for t in range(n):  # per frame: this is the baseline's method
        for i, task in enumerate(tasks):
            rot = tg.orient_target[t, orient_of[i]] if i in orient_of else np.array([1.0, 0.0, 0.0, 0.0])
            task.set_target(mink.SE3.from_rotation_and_translation(mink.SO3(rot), tg.key_target[t, i]))
        last = np.inf
        for _ in range(10):
            vel = mink.solve_ik(conf, tasks, dt, "daqp", 5e-1, limits=limits)
            conf.integrate_inplace(vel, dt)
            err = sum(float(np.linalg.norm(task.compute_error(conf)[:3])) for task in tasks)
            if last - err < 1e-3:
                break
            last = err
        qpos[t] = conf.q
    q, _ = adapter.unpack_arrays(qpos, np.zeros((n, model.nv)))
    return q


def _print_metrics(name, m, fps_rate, wall, cpu):
    kb = m["key_body_error_m"]
    print(
        f"{name:10s} {fps_rate:9.0f} frames/s (wall {wall:6.2f} s, cpu {cpu:6.2f} s) | key-body error mean "
        f"{kb['mean'] * 100:5.1f} cm max {kb['max'] * 100:5.1f} cm | floating {m['floating_share'] * 100:5.1f} % | "
        f"slide/phase max {m['slide_per_phase_cm_max']:5.1f} cm, planted {m['planted_speed_cm_s']:5.1f} cm/s | "
        f"penetration {m['penetration_m'] * 100:4.1f} cm | limit hits {m['joint_limit_hits']} | "
        f"joint vel peak {m['joint_velocity_peak_rad_s']:5.1f} rad/s "
        f"(source {m['source_joint_velocity_peak_rad_s']:.1f})"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clip", default="bvh/cmu/01_01_cgspeed_hops_long.bvh")
    ap.add_argument("--frames", type=int, default=2752)
    ap.add_argument("--config", default="cmu_bvh_to_g1")
    ap.add_argument("--device", default=None, help="also time a batch of clips on this device (e.g. cuda)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--no-mink", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    motion = ke.io.load_bvh(DATA / args.clip)[: args.frames]
    cfg = ke.retarget.load_robot_config(args.config)
    print(f"clip {args.clip}: {motion.num_frames} frames at {motion.fps:.0f} fps; config {cfg.name}; one thread")
    robot_mod.retarget_to_robot(motion[:64], cfg)  # warm-up (traced kinematics, torch kernels)
    c, w = time.process_time(), time.perf_counter()
    res = ke.retarget.retarget_to_robot(motion, cfg)
    w, c = time.perf_counter() - w, time.process_time() - c
    n = res.motion.num_frames
    _print_metrics("kangengine", res.metrics, n / w, w, c)
    if not args.no_mink:
        layout = res.layout
        src = robot_mod._prepare_source(motion, cfg, None)
        tg = robot_mod._build_targets(cfg, layout, src, None)
        gpts = robot_mod.collision_points(robot_mod.load_robot_model(cfg)[1], layout, cfg)
        cm, wm = time.process_time(), time.perf_counter()
        q = _mink_baseline(cfg, layout, motion, tg, src)
        wm, cm = time.perf_counter() - wm, time.process_time() - cm
        qd = robot_mod._central_velocity(layout, q, src.fps)
        local = robot_mod.motion_local_rotation(motion, src.kept)
        m, _ = robot_retarget_metrics(layout, q, qd, src.fps, cfg, tg, gpts, local, np.zeros(n))
        _print_metrics("mink", m, n / wm, wm, cm)
        print(f"speed ratio kangengine / mink: {wm / w:.1f}x (cpu {cm / c:.1f}x)")
    if args.device:
        print(f"batched on {args.device}: {args.batch} clips of {n} frames")
        ke.retarget.retarget_to_robot(motion[:64], cfg, device=args.device)
        w = time.perf_counter()
        ke.retarget.retarget_to_robot(motion, cfg, device=args.device, batch=args.batch)
        w = time.perf_counter() - w
        print(f"{args.batch * n / w:.0f} frames/s ({w:.2f} s)")


if __name__ == "__main__":
    main()
