"""Human -> G1 retargeting: frames/s of ``ke.retarget.retarget_to_robot`` on the 2752-frame CMU 01_01 clip, one CPU
thread, against a per-frame differential-IK baseline with ``mink`` (GMR's method: per frame, ``FrameTask`` s on
the same correspondences, weights, offsets and targets (the orientation targets too: ``_build_targets`` gives
both methods the feet's targets calibrated on the source standing flat, ``"orientation_reference": "standing"``),
up to 10 ``solve_ik`` + ``integrate_inplace`` steps
warm-started from the previous frame, stopping when the error gains less than 1 mm; ``daqp``, damping 0.5,
configuration limits). Both results go through the same metrics (``robot_retarget_metrics``) and are printed
beside their speeds.

    python benchmarks/bench_retarget.py [--frames 2752] [--clip bvh/cmu/01_01_cgspeed_hops_long.bvh]
        [--model path/to/g1_29dof.xml] [--device cuda --batch 64]

Wall time and process CPU time are both shown (one thread: they agree unless the machine is loaded; on a loaded
machine the CPU-time ratio is the fairer one). The warm-up builds the native forward-kinematics kernel of the
robot once (one documented large call; it is cached on disk across processes) and says whether it is used.
``--batch`` clips (the same clip repeated) are retarget in one call, on ``--device`` when given.
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
        f"{kb['mean'] * 100:5.2f} cm max {kb['max'] * 100:5.2f} cm | orientation error mean "
        f"{m['orientation_error_deg']['mean']:4.1f} deg max {m['orientation_error_deg']['max']:4.0f} deg | "
        f"floating {m['floating_share'] * 100:5.1f} % | "
        f"slide/phase max {m['slide_per_phase_cm_max']:5.1f} cm, planted {m['planted_speed_cm_s']:5.1f} cm/s | "
        f"penetration {m['penetration_m'] * 100:4.1f} cm | limit hits {m['joint_limit_hits']} | "
        f"joint vel peak {m['joint_velocity_peak_rad_s']:5.1f} rad/s "
        f"(source {m['source_joint_velocity_peak_rad_s']:.1f}), acceleration peak "
        f"{m['joint_acceleration_peak_rad_s2']:.0f} rad/s^2 "
        f"(source {m['source_joint_acceleration_peak_rad_s2']:.0f}) | "
        f"self-collision frames "
        f"{m.get('self_collision_frames', '-')} (source {m.get('source_self_intersection_frames', '-')})"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clip", default="bvh/cmu/01_01_cgspeed_hops_long.bvh")
    ap.add_argument("--frames", type=int, default=2752)
    ap.add_argument("--config", default="cmu_bvh_to_g1")
    ap.add_argument("--model", default=None, help="robot model file instead of the configuration's")
    ap.add_argument("--device", default=None, help="also time a batch of clips on this device (e.g. cuda)")
    ap.add_argument("--batch", type=int, default=0, help="also time this many clips in one call")
    ap.add_argument("--no-mink", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    motion = ke.io.load_bvh(DATA / args.clip)[: args.frames]
    cfg = ke.retarget.load_robot_config(args.config, model=args.model)
    print(f"clip {args.clip}: {motion.num_frames} frames at {motion.fps:.0f} fps; config {cfg.name}; one thread")
    print(f"native FK kernel used by the solver: {_build_native_fk(cfg, args.model)}")
    robot_mod.retarget_to_robot(motion[:64], cfg, model=args.model)  # warm-up (traced kinematics, torch kernels)
    c, w = time.process_time(), time.perf_counter()
    res = ke.retarget.retarget_to_robot(motion, cfg, model=args.model)
    w, c = time.perf_counter() - w, time.process_time() - c
    n = res.motion.num_frames
    _print_metrics("kangengine", res.metrics, n / w, w, c)
    if not args.no_mink:
        layout = res.layout
        src = robot_mod._prepare_source(motion, cfg, None)
        tg = robot_mod._build_targets(cfg, layout, src, None)
        _, desc, mpath = robot_mod.load_robot_model(cfg, args.model)
        gpts = robot_mod.collision_points(desc, layout, cfg)
        cm, wm = time.process_time(), time.perf_counter()
        q = _mink_baseline(cfg, layout, motion, tg, src)
        wm, cm = time.perf_counter() - wm, time.process_time() - cm
        qd = robot_mod._central_velocity(layout, q, src.fps)
        local = robot_mod.motion_local_rotation(motion, src.kept)
        m, _ = robot_retarget_metrics(layout, q, qd, src.fps, cfg, tg, gpts, local, np.zeros(n))
        sc = robot_mod._self_collision(desc, layout, mpath, cfg)
        m.update(robot_mod.self_collision_metrics(layout, q, sc, tg, src, motion))
        _print_metrics("mink", m, n / wm, wm, cm)
        print(f"speed ratio kangengine / mink: {wm / w:.1f}x (cpu {cm / c:.1f}x)")
    if args.batch:
        device = args.device or "cpu"
        print(f"batched on {device}: {args.batch} clips of {n} frames in one call")
        ke.retarget.retarget_to_robot([motion[:64]] * 2, cfg, model=args.model, device=device)  # warm-up
        w, c = time.perf_counter(), time.process_time()
        out = ke.retarget.retarget_to_robot([motion] * args.batch, cfg, model=args.model, device=device)
        w, c = time.perf_counter() - w, time.process_time() - c
        same = max(float(np.abs(r.motion.q - res.motion.q).max()) for r in out)
        print(
            f"{args.batch * n / w:.0f} frames/s (wall {w:.2f} s, cpu {c:.2f} s); largest |q - single clip| {same:.1e}"
        )


def _build_native_fk(cfg, model) -> bool:
    """Build (or load from the disk cache) the robot's native FK kernel with one call of the documented
    build size, and say whether the solver's calls use it."""
    from kangengine.animation.kinematics import _NATIVE_BUILD_FRAMES

    layout = robot_mod.load_robot_model(cfg, model)[0]
    q = torch.as_tensor(np.tile(layout.neutral(), (_NATIVE_BUILD_FRAMES, 1)), dtype=torch.float32)
    layout.kinematics.from_coordinates(q)
    return any(k is not None for k in layout.kinematics._traced_coordinates(False).native.values())


if __name__ == "__main__":
    main()
