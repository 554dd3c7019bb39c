"""Per-clip quality metrics of a human -> robot retarget (a JSON-ready dict; lengths in m unless named ``_cm``).

* key bodies: distance of each task point from its scaled source target (mean, max, per body, m) and the
  angle of each orientation task (deg);
* feet, per contact phase of the source: the largest horizontal distance the robot sole centre moves from
  where it was put down (cm), next to the same for the scaled source heel; the mean horizontal speed of the
  robot sole centre while planted (cm/s) next to the source's; the share of contact frames whose lowest sole
  point is more than 3 cm above the floor (floating) and their mean height;
* penetration: the deepest collision point below the floor (m) over the clip;
* joint limits: (frame, joint) entries within 1e-4 of a bound;
* peaks of joint speed and acceleration of the robot hinges (rad/s, rad/s^2) next to the source's joints.
"""

from __future__ import annotations

import numpy as np

from .. import rotations as R
from .contact import phase_slide

__all__ = ["robot_retarget_metrics", "FLOATING_HEIGHT_M"]

#: a sole higher than this above the floor while the source foot is planted counts as floating
FLOATING_HEIGHT_M = 0.03


def _stats(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {"mean": 0.0, "max": 0.0}
    return {"mean": float(x.mean()), "max": float(x.max())}


def _speed_peaks(local_rot: np.ndarray, fps: float) -> tuple[float, float]:
    """Peak angular speed (rad/s) and acceleration (rad/s^2) of a skeleton's local joint rotations
    ``[frames, joints, 4]`` WXYZ (the root joint left out): the rotation vectors of the frame-to-frame rotations
    ``q[t+1] q[t]^-1`` (shortest way round) times fps, and their differences times fps. In float32, the product
    written out (a metric: the peaks agree with float64 to ~1e-6 relative)."""
    if local_rot.shape[0] < 3:
        return 0.0, 0.0
    q = np.ascontiguousarray(np.asarray(local_rot)[:, 1:].transpose(2, 0, 1), dtype=np.float32)
    aw, ax, ay, az = q[:, 1:]
    bw, bx, by, bz = q[:, :-1]
    w = aw * bw + ax * bx + ay * by + az * bz  # a * conj(b)
    x = ax * bw - aw * bx - ay * bz + az * by
    y = ay * bw - aw * by - az * bx + ax * bz
    z = az * bw - aw * bz - ax * by + ay * bx
    s = np.sqrt(x * x + y * y + z * z)
    k = np.where(s > 1e-12, 2.0 * np.arctan2(s, np.abs(w)) / np.maximum(s, 1e-12), 2.0)
    k = k * np.where(w < 0, -fps, fps)  # [N-1, J-1]: rad/s per unit of the vector part
    wx, wy, wz = x * k, y * k, z * k
    speed = np.sqrt(wx * wx + wy * wy + wz * wz)
    dx, dy, dz = np.diff(wx, axis=0), np.diff(wy, axis=0), np.diff(wz, axis=0)
    acc = np.sqrt(dx * dx + dy * dy + dz * dz) * fps
    return float(speed.max()), float(acc.max())


def _foot_metrics(layout, bpos, brot, cfg, tg, fps: float) -> dict:
    out = {}
    all_float, all_contact, heights = 0, 0, []
    for i, (f, ph) in enumerate(zip(cfg.feet, tg.phases)):
        b = layout.body_index(f.robot)
        sole = np.asarray(f.sole_points, dtype=np.float64)
        pts = bpos[:, b, None] + R.quat_rotate(brot[:, b, None], sole[None])  # [N, S, 3]
        centre = pts.mean(1)
        low = pts[..., 2].min(1) - cfg.ground_height
        c = ph.in_contact
        slide = phase_slide(ph, centre)
        src_slide = phase_slide(ph, tg.source_feet[:, i])
        v = np.linalg.norm(np.gradient(centre[:, :2], axis=0), axis=-1) * fps
        vs = np.linalg.norm(np.gradient(tg.source_feet[:, i, :2], axis=0), axis=-1) * fps
        floating = c & (low > FLOATING_HEIGHT_M)
        all_float += int(floating.sum())
        all_contact += int(c.sum())
        heights.append(low[c])
        out[f.robot] = {
            "contact_frames": int(c.sum()),
            "phases": ph.num_phases,
            "slide_per_phase_cm": _stats(slide * 100),
            "source_slide_per_phase_cm": _stats(src_slide * 100),
            "slide_beyond_source_cm_max": float((slide - src_slide).max() * 100) if slide.size else 0.0,
            "planted_speed_cm_s": float(v[c].mean() * 100) if c.any() else 0.0,
            "source_planted_speed_cm_s": float(vs[c].mean() * 100) if c.any() else 0.0,
            "floating_share": float(floating.sum() / max(c.sum(), 1)),
            "sole_height_in_contact_m": _stats(low[c]),
        }
    h = np.concatenate(heights) if heights else np.zeros(0)
    return {
        "feet": out,
        "floating_share": float(all_float / max(all_contact, 1)),
        "floating_height_m": _stats(h[h > FLOATING_HEIGHT_M]),
        "slide_per_phase_cm_max": max((v["slide_per_phase_cm"]["max"] for v in out.values()), default=0.0),
        "slide_beyond_source_cm_max": max((v["slide_beyond_source_cm_max"] for v in out.values()), default=0.0),
        "planted_speed_cm_s": float(np.mean([v["planted_speed_cm_s"] for v in out.values()])) if out else 0.0,
        "source_planted_speed_cm_s": float(np.mean([v["source_planted_speed_cm_s"] for v in out.values()]))
        if out
        else 0.0,
    }


def robot_retarget_metrics(layout, q, qd, fps: float, cfg, tg, ground_points, source_local_rot, lift, *, fk=None):
    """``(metrics dict, task_errors [frames, tasks] m)`` of a solved clip (see the module docstring).

    Args:
        layout: the robot layout. q: ``[frames, nq]``, qd: ``[frames, nv]`` float64.
        cfg: the :class:`~kangengine.retarget.RobotRetargetConfig`; tg: the targets the solve used.
        ground_points: ``(body [G], offset [G, 3], radius [G])`` the collision points.
        source_local_rot: ``[frames, joints, 4]`` the source's local rotations (its own speed peaks).
        lift: ``[frames]`` m, root lift applied to clear the floor.
        fk: ``(body positions [frames, B, 3] m, body rotations wxyz [frames, B, 4])`` at ``q`` if already known.
    """
    from ..animation.layout import forward_kinematics

    bpos, brot = forward_kinematics(layout, q) if fk is None else fk
    x = bpos[:, tg.key_body] + R.quat_rotate(brot[:, tg.key_body], tg.key_offset[None])
    err = np.linalg.norm(x - tg.key_target, axis=-1)  # [N, K]
    per_body = {name: float(e) for name, e in zip(tg.key_names, err.mean(0))}
    ori = {}
    if tg.orient_body.size:
        cur = brot[:, tg.orient_body]
        ang = np.degrees(R.quat_angle(R.quat_multiply(tg.orient_target, R.quat_conjugate(cur))))
        ori = _stats(ang)
    gb, go, gr = ground_points
    pen = 0.0
    if gb.size:
        gx = bpos[:, gb] + R.quat_rotate(brot[:, gb], go[None])
        depth = cfg.ground_height - (gx[..., 2] - gr[None])
        pen = float(max(depth.max(), 0.0))
    hinge = [b for b in layout.blocks if b.q_dim == 1 and b.limits is not None]
    hq = np.array([b.q_offset for b in hinge], dtype=np.int64)
    lo = np.array([b.limits[0] for b in hinge])
    hi = np.array([b.limits[1] for b in hinge])
    vals = q[:, hq]
    at_limit = (vals <= lo + 1e-4) | (vals >= hi - 1e-4)
    outside = (vals < lo - 1e-6) | (vals > hi + 1e-6)
    hd = np.array([b.qd_offset for b in hinge], dtype=np.int64)
    vel = np.abs(qd[:, hd])
    acc = np.abs(np.diff(qd[:, hd], axis=0)) * fps if qd.shape[0] > 1 else np.zeros((1, hd.size))
    sv, sa = _speed_peaks(source_local_rot, fps)
    metrics = {
        "key_body_error_m": {**_stats(err), "per_body": per_body},
        "orientation_error_deg": ori,
        **_foot_metrics(layout, bpos, brot, cfg, tg, fps),
        "penetration_m": pen,
        "penetration_corrected_frames": int((lift > 0).sum()),
        "penetration_correction_m_max": float(lift.max()) if lift.size else 0.0,
        "joint_limit_hits": int(at_limit.sum()),
        "joint_limit_frames": int(at_limit.any(1).sum()),
        "joints_outside_limits": int(outside.sum()),
        "joint_velocity_peak_rad_s": float(vel.max()) if vel.size else 0.0,
        "joint_acceleration_peak_rad_s2": float(acc.max()) if acc.size else 0.0,
        "source_joint_velocity_peak_rad_s": sv,
        "source_joint_acceleration_peak_rad_s2": sa,
    }
    return metrics, err
