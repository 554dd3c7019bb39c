"""Human -> robot retargeting: :func:`retarget_to_robot` (whole clip, batched IK, contact-correct feet).

Steps (all vectorised over frames):

1. the source motion is turned into the robot's world (``source_to_robot_rotation_wxyz``); leading outlier
   frames (the T-pose frame cgspeed files start with: a jump far larger than the clip's frame-to-frame
   motion) are dropped and recorded; with ``heading_alignment.mode == "initial"`` the clip is turned to start
   facing +X above the origin;
2. key-body targets: the source bodies scaled about the root (``scale``), the floor of the source (its lowest
   points) put at ``ground_height``;
3. contact phases per foot from the source heel/toe heights and speeds (:mod:`.contact`); in a phase the
   robot sole is held flat on the floor at one place; the foot's key targets are lowered by the difference
   of ankle heights (human vs robot) so swing and stance agree;
4. the whole clip is solved by damped Gauss-Newton with analytic Jacobians (:mod:`.solver`), warm-started
   from the source root and heading (robust to any initial heading);
5. any collision point left below the floor lifts the root by that much (recorded), velocities by
   central differences on the manifold, and the metrics of :mod:`.robot_metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import rotations as R
from ..animation.motion import ArticulationMotion
from ..animation.skeleton import SkeletonMotion, SkeletonState
from ..errors import FormatError, ShapeError
from .contact import ContactPhases, contact_phases, detect_contact, held_sole_targets, phase_yaw
from .robot_config import RobotRetargetConfig, load_robot_config, load_robot_model, resolve_source_name
from .robot_metrics import robot_retarget_metrics
from .self_collision import (
    CollisionCapsules,
    capsule_gaps,
    collision_depth,
    pair_clearance,
    robot_capsules,
    self_collision_pairs,
    source_intersections,
)
from .solver import ClipFrames, IKTasks, robot_dof_tables, solve_clip

__all__ = ["RobotRetargetResult", "retarget_to_robot", "SELF_COLLISION_TOLERANCE_M"]

#: two capsule proxies intersecting deeper than this (m) make a self-collision frame in the metrics
SELF_COLLISION_TOLERANCE_M = 1e-3


@dataclass(frozen=True)
class RobotRetargetResult:
    """What :func:`retarget_to_robot` returns.

    Attributes:
        motion: :class:`~kangengine.animation.ArticulationMotion`, ``q [frames, nq]`` and ``qd [frames, nv]``
            float32 in the robot's canonical layout (free root), at the source fps.
        metrics: JSON-ready dict (see :func:`~kangengine.retarget.robot_metrics.robot_retarget_metrics`).
        task_errors: ``[frames, tasks] float32`` m, distance of each key-body task point from its target.
        task_names: ``[tasks]`` ``"robot_body<-source_body"``.
        contact: ``[frames, feet] bool``: the source foot is in a contact phase.
        source_frames: ``[frames] int64`` the source frame each output frame comes from.
        layout: the robot's :class:`~kangengine.animation.ArticulationCoordinateLayout`.
    """

    motion: ArticulationMotion
    metrics: dict
    task_errors: np.ndarray
    task_names: tuple[str, ...]
    contact: np.ndarray
    source_frames: np.ndarray
    layout: object


@dataclass(frozen=True)
class _Source:
    """The source after rotation, trimming and heading alignment (numpy float64)."""

    pos: np.ndarray  # [N, J, 3] m world
    rot: np.ndarray  # [N, J, 4] world_from_joint
    rest_pos: np.ndarray  # [J, 3]
    rest_rot: np.ndarray  # [J, 4]
    names: tuple[str, ...]
    kept: np.ndarray  # [N] source frame indices
    heading: np.ndarray  # [N] rad, yaw of the facing direction
    fps: float


def _leading_outliers(pos: np.ndarray) -> int:
    """Number of leading frames to drop: frames before a jump > max(10 x median jump, 0.1 m) in the first 5."""
    if pos.shape[0] < 4:
        return 0
    jump = np.linalg.norm(np.diff(pos, axis=0), axis=-1).max(-1)  # [N-1]
    thr = max(10.0 * float(np.median(jump)), 0.1)
    bad = np.flatnonzero(jump[:5] > thr)
    return int(bad[-1]) + 1 if bad.size else 0


def _heading(pos, left, right) -> np.ndarray:
    lr = (pos[:, left] - pos[:, right]).mean(1)  # [N, 3]
    fwd = np.stack([lr[:, 1], -lr[:, 0]], -1)  # (left x up) in the horizontal plane
    return np.arctan2(fwd[:, 1], fwd[:, 0])


def _yaw_quat(yaw) -> np.ndarray:
    yaw = np.asarray(yaw, dtype=np.float64)
    return np.stack([np.cos(yaw / 2), np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2)], -1)


def _prepare_source(motion: SkeletonMotion, cfg: RobotRetargetConfig, path) -> _Source:
    m = motion.numpy()
    if not isinstance(m, SkeletonMotion) or m.num_frames < 2:
        raise ShapeError("expected a SkeletonMotion of at least 2 frames", item="motion")
    names = tuple(m.tree.node_names)
    q = np.asarray(cfg.source_to_robot_rotation_wxyz, dtype=np.float64)
    pos = R.quat_rotate(q, np.asarray(m.global_translation, dtype=np.float64))
    rot = R.quat_multiply(q, np.asarray(m.global_rotation, dtype=np.float64))
    rest = SkeletonState.zero_pose(m.tree)
    rest_pos = R.quat_rotate(q, np.asarray(rest.global_translation, dtype=np.float64))
    rest_rot = R.quat_multiply(q, np.asarray(rest.global_rotation, dtype=np.float64))
    drop = _leading_outliers(pos)
    kept = np.arange(drop, pos.shape[0])
    pos, rot = pos[drop:], rot[drop:]
    ha = cfg.heading_alignment
    left = [resolve_source_name(s, names, item="heading_alignment.left", path=path) for s in ha.left]
    right = [resolve_source_name(s, names, item="heading_alignment.right", path=path) for s in ha.right]
    heading = _heading(pos, left, right)
    if ha.mode == "initial":
        turn = _yaw_quat(-heading[0])
        origin = np.array([pos[0, 0, 0], pos[0, 0, 1], 0.0])
        pos = R.quat_rotate(turn, pos - origin)
        rot = R.quat_multiply(turn, rot)
        heading = heading - heading[0]
    return _Source(pos, rot, rest_pos, rest_rot, names, kept, heading, float(m.fps))


def _robot_neutral(layout):
    from ..animation.layout import forward_kinematics

    q0 = layout.neutral()
    p, r = forward_kinematics(layout, q0[None])
    return q0, p[0], r[0]


def _leg_lengths(cfg, layout, src: _Source, ground_src: float, path) -> tuple[float, float]:
    """``(robot, source)`` leg length (m): straight root-to-heel distance in the rest pose plus the heel's
    height above the floor (robot: above its sole points; source: its 5th-percentile height in the clip),
    averaged over the feet."""
    _, npos, _ = _robot_neutral(layout)
    robot, source = [], []
    for i, f in enumerate(cfg.feet):
        b = layout.body_index(f.robot)
        robot.append(np.linalg.norm(npos[b] - npos[0]) - min(p[2] for p in f.sole_points))
        j = resolve_source_name(f.source_heel, src.names, item=f"feet[{i}].source_heel", path=path)
        heel_h = float(np.percentile(src.pos[:, j, 2], 5.0)) - ground_src
        source.append(np.linalg.norm(src.rest_pos[j] - src.rest_pos[0]) + heel_h)
    return float(np.mean(robot)), float(np.mean(source))


def _scale_of(cfg, layout, src: _Source, ground_src: float, path) -> tuple[float, np.ndarray]:
    """``(default scale, per-body scale [bodies])``; ``"auto"``: the ratio of the leg lengths."""
    sc = cfg.scale
    default = sc["default"] if isinstance(sc, dict) else sc
    if default == "auto":
        if not cfg.feet:
            raise FormatError("is 'auto' but the configuration has no feet to measure legs by", path=path, item="scale")
        robot_leg, source_leg = _leg_lengths(cfg, layout, src, ground_src, path)
        default = robot_leg / source_leg
    per_body = np.full(layout.num_bodies, float(default))
    if isinstance(sc, dict):
        for name, v in sc.get("bodies", {}).items():
            per_body[layout.body_index(name)] = v
    return float(default), per_body


@dataclass(frozen=True)
class _Hold:
    """What one foot's held sole targets are built from (:func:`.contact.held_sole_targets`), kept so that the
    held heading can be chosen again after the coarse pass (``solver.held_yaw_from_solve``)."""

    phases: ContactPhases
    heel: np.ndarray  # [N, 3] m, the scaled source heel
    toe: np.ndarray | None  # [N, 3] m
    forward: np.ndarray  # [N, 3] the source foot's forward direction
    sole: np.ndarray  # [S, 3] m, foot frame
    options: dict  # the remaining keyword arguments of held_sole_targets

    def targets(self, yaw=None) -> tuple[np.ndarray, np.ndarray]:
        """``(targets [N, S, 3] m, weight [N, S])`` held at ``yaw [phases]`` rad (``None``: the source's)."""
        return held_sole_targets(self.phases, self.heel, self.toe, self.forward, self.sole, yaw=yaw, **self.options)


@dataclass(frozen=True)
class _Targets:
    key_body: np.ndarray  # [K] robot body
    key_offset: np.ndarray  # [K, 3]
    key_target: np.ndarray  # [N, K, 3]
    key_weight: np.ndarray  # [N, K]
    key_names: tuple[str, ...]
    orient_body: np.ndarray  # [O]
    orient_target: np.ndarray  # [N, O, 4]
    orient_weight: np.ndarray  # [N, O]
    sole_body: np.ndarray  # [S]
    sole_offset: np.ndarray  # [S, 3]
    sole_target: np.ndarray  # [N, S, 3]
    sole_weight: np.ndarray  # [N, S]
    phases: tuple[ContactPhases, ...]
    source_feet: np.ndarray  # [N, feet, 3] scaled source heel positions (for the source's own slide)
    scale: float
    source_joints: np.ndarray  # [N, J, 3] the source joints scaled about the root (its own intersections)
    source_bones: np.ndarray  # [K] source joints of the correspondences (their bones from the parent)
    holds: tuple[_Hold, ...] = ()  # per foot
    orientation_calibration: dict | None = None  # per "standing" body: frames used, tilt removed, or why not


def _build_targets(cfg: RobotRetargetConfig, layout, src: _Source, path) -> _Targets:
    n = src.pos.shape[0]
    _, npos, nrot = _robot_neutral(layout)
    soles = [np.asarray(f.sole_points, dtype=np.float64) for f in cfg.feet]
    foot_bodies = [layout.body_index(f.robot) for f in cfg.feet]
    ground_src = float(np.percentile(src.pos[..., 2].min(1), 2.0))
    scale, per_body = _scale_of(cfg, layout, src, ground_src, path)
    root_src = src.pos[:, 0]
    root_t = np.concatenate([scale * root_src[:, :2], cfg.ground_height + scale * (root_src[:, 2:] - ground_src)], -1)

    def scaled(j: int, body: int) -> np.ndarray:  # [N, 3]
        return root_t + per_body[body] * (src.pos[:, j] - root_src)

    bodies = cfg.bodies
    kb = np.array([layout.body_index(b.robot) for b in bodies], dtype=np.int64)
    ks = [resolve_source_name(b.source, src.names, item=f"bodies[{i}].source", path=path) for i, b in enumerate(bodies)]
    key_target = np.stack([scaled(j, b) for j, b in zip(ks, kb)], 1)
    key_weight = np.broadcast_to(np.array([b.position_weight for b in bodies]), (n, len(bodies))).copy()
    # contacts and held soles
    fps = src.fps
    phases, sole_t, sole_w, sole_b, sole_o, src_feet, ramps, holds, planted = [], [], [], [], [], [], [], [], []
    opts = cfg.contact
    for i, (f, fb, sole) in enumerate(zip(cfg.feet, foot_bodies, soles)):
        heel = resolve_source_name(f.source_heel, src.names, item=f"feet[{i}].source_heel", path=path)
        toe = None
        if f.source_toe is not None:
            toe = resolve_source_name(f.source_toe, src.names, item=f"feet[{i}].source_toe", path=path)
        heel_w = scaled(heel, fb)
        toe_w = None if toe is None else scaled(toe, fb)
        down = detect_contact(
            heel_w, toe_w, fps, height_threshold=opts.height_threshold, speed_threshold=opts.speed_threshold
        )
        ph = contact_phases(down, max(1, round(opts.min_phase_s * fps)))
        if toe_w is not None:
            forward = toe_w - heel_w
        else:
            forward = R.quat_rotate(src.rot[:, heel], np.array([1.0, 0.0, 0.0]))
        th = {"height_threshold": opts.height_threshold, "speed_threshold": opts.speed_threshold}
        heel_down = toe_down = None
        if toe_w is not None:  # heel and toe on their own: the foot rolls over them as the source's does
            heel_down = detect_contact(heel_w, None, fps, **th)
            toe_down = detect_contact(toe_w, None, fps, **th)
        hold = _Hold(
            ph,
            heel_w,
            toe_w,
            forward,
            sole,
            {
                "ground": cfg.ground_height,
                "blend_frames": opts.blend_s * fps,
                "heel_down": heel_down,
                "toe_down": toe_down,
                "pivot": bool(cfg.solver.held_pivot),
                "hold_radius": float(cfg.solver.hold_radius_m),
            },
        )
        holds.append(hold)
        planted.append(ph.in_contact if heel_down is None else ph.in_contact & heel_down & toe_down)
        tgt, wp = hold.targets()
        w = wp.mean(1)  # [N] the share of the sole held
        # the foot's key targets: lowered by the ankle-height difference seen in contact
        if ph.in_contact.any():
            dz = float(np.median(cfg.ground_height - sole[:, 2].min() - heel_w[ph.in_contact, 2]))
            on_foot = kb == fb
            key_target[:, on_foot, 2] += dz
            # a foot point is never asked below where it sits when the sole is flat on the floor
            floor = cfg.ground_height - sole[:, 2].min() + np.array([b.offset[2] for b in bodies])[on_foot]
            key_target[:, on_foot, 2] = np.maximum(key_target[:, on_foot, 2], floor[None])
            key_weight[:, on_foot] *= (1.0 - (1.0 - float(cfg.solver.held_key_share)) * w)[:, None]
        phases.append(ph)
        ramps.append(w)
        sole_t.append(tgt)
        sole_w.append(wp * cfg.solver.contact_weight)
        sole_b += [fb] * sole.shape[0]
        sole_o.append(sole)
        src_feet.append(heel_w)
    # orientations: the source body's rotation from its reference pose, applied to the robot body's neutral one
    oi = [i for i, b in enumerate(bodies) if b.orientation_weight > 0]
    ob = kb[oi]
    oj = [ks[i] for i in oi]
    body_from_target = R.quat_multiply(R.quat_conjugate(src.rest_rot[oj]), nrot[ob])  # [O, 4]
    calibration = {}
    for o, i in enumerate(oi):
        if bodies[i].orientation_reference == "standing":
            f = foot_bodies.index(kb[i])
            body_from_target[o], calibration[bodies[i].robot] = _standing_reference(
                src.rot[:, oj[o]], holds[f].forward, planted[f], nrot[kb[i]], body_from_target[o]
            )
    orient_target = R.quat_normalize(R.quat_multiply(src.rot[:, oj], body_from_target[None]))
    orient_weight = np.broadcast_to(np.array([bodies[i].orientation_weight for i in oi]), (n, len(oi))).copy()
    keep = float(cfg.solver.held_orientation_share)
    for fb, w in zip(foot_bodies, ramps):  # a held foot's orientation comes from its sole (and this share)
        orient_weight[:, ob == fb] *= (1.0 - (1.0 - keep) * w)[:, None]
    names = tuple(f"{b.robot}<-{src.names[j]}" for b, j in zip(bodies, ks))
    nf = len(cfg.feet)
    return _Targets(
        key_body=kb,
        key_offset=np.array([b.offset for b in bodies], dtype=np.float64),
        key_target=key_target,
        key_weight=key_weight,
        key_names=names,
        orient_body=ob,
        orient_target=orient_target.reshape(n, len(oi), 4),
        orient_weight=orient_weight,
        sole_body=np.array(sole_b, dtype=np.int64),
        sole_offset=np.concatenate(sole_o) if nf else np.zeros((0, 3)),
        sole_target=np.concatenate(sole_t, 1) if nf else np.zeros((n, 0, 3)),
        sole_weight=np.concatenate(sole_w, 1) if nf else np.zeros((n, 0)),
        phases=tuple(phases),
        source_feet=np.stack(src_feet, 1) if nf else np.zeros((n, 0, 3)),
        scale=scale,
        source_joints=root_t[:, None] + scale * (src.pos - root_src[:, None]),
        source_bones=np.array(ks, dtype=np.int64),
        holds=tuple(holds),
        orientation_calibration=calibration,
    )


#: fewest planted frames a ``"standing"`` orientation reference is calibrated from (fewer: the rest pose's)
_MIN_STANDING_FRAMES = 3


def _standing_reference(rot, forward, planted, neutral, rest_reference) -> tuple[np.ndarray, dict]:
    """``(source_body_from_target [4], note)``: the rotation that maps the source foot, as it stands planted
    (``planted [N]`` bool), onto a flat robot foot (its neutral rotation ``neutral [4]``) turned to the source
    foot's heel-to-toe heading (``forward [N, 3]``), averaged over the planted frames (sign-aligned mean of
    ``rot^-1 * yaw(forward) * neutral``, ``rot [N, 4]`` world rotations of the source foot). Fewer than
    :data:`_MIN_STANDING_FRAMES` planted frames: ``rest_reference`` and a note saying why."""
    k = int(planted.sum())
    if k < _MIN_STANDING_FRAMES:
        return rest_reference, {"reference": "rest", "planted_frames": k, "reason": "too few planted frames"}
    fw = forward[planted]
    flat = R.quat_multiply(_yaw_quat(np.arctan2(fw[:, 1], fw[:, 0])), neutral[None])
    c = R.quat_multiply(R.quat_conjugate(rot[planted]), flat)
    c = R.quat_normalize((c * np.sign(c @ c[0])[:, None]).mean(0))
    old = R.quat_multiply(rot[planted], rest_reference[None])
    tilt = np.degrees(np.arccos(np.clip(R.quat_rotate(old, np.array([0.0, 0.0, 1.0]))[:, 2], -1.0, 1.0)))
    note = {"reference": "standing", "planted_frames": k, "rest_tilt_deg_mean": float(tilt.mean())}
    return c, note


def _axis_weights(tg: _Targets, sole_xy: float = 1.0) -> np.ndarray:
    """``[N, K + S, 3]`` per-axis weights of the point tasks (key points, then held sole points); ``sole_xy``
    scales the held soles' horizontal weights (their height stays held)."""
    w = np.repeat(np.concatenate([tg.key_weight, tg.sole_weight], 1)[..., None], 3, -1)
    if sole_xy != 1.0:
        w[:, tg.key_weight.shape[1] :, :2] *= sole_xy
    return w


#: the held soles' horizontal weight in the coarse pass when the held heading is the solver's
#: (``solver.held_yaw_from_solve``): weak enough to let the foot turn where the legs want it
_FREE_YAW_SOLE_XY = 0.1


def _emphasise_errors(
    layout,
    q,
    tasks: IKTasks,
    nkey: int,
    floor_m: float,
    peak_m: float,
    orient_floor=0.0,
    orient_peak=0.0,
    peak_max: float = 4.0,
) -> IKTasks:
    """The tasks with each key-body point's weight rescaled per frame by its error ``e`` at ``q [N, nq]`` (the
    coarse pass's solution, interpolated to every frame): ``clamp(floor_m / e, 1, 3)`` (small errors count
    more: the squares then weigh like the distances the mean error adds up, one reweighted least-squares step
    towards it) times ``min(1 + (e / peak_m)^2, peak_max)`` (the worst frames count more: towards the largest
    error).
    0 turns a factor off. ``orient_floor`` / ``orient_peak`` (rad) do the same to each orientation task's weight
    by its angle error (that factor capped at 4).
    """
    import torch

    from .solver import _quat_rotate

    pos, rot = layout.kinematics.from_coordinates(q)
    kb = tasks.point_body[:nkey]
    n = q.shape[0]
    x = pos[:, kb] + _quat_rotate(rot[:, kb], tasks.point_offset[:nkey].expand(n, -1, -1))
    e = torch.linalg.norm(x - tasks.point_target[:, :nkey], dim=-1)  # [N, K] m
    f = torch.ones_like(e)
    if peak_m > 0:
        f = f * (1.0 + (e / peak_m) ** 2).clamp_max(peak_max)
    if floor_m > 0:
        f = f * (floor_m / e.clamp_min(1e-9)).clamp(1.0, 3.0)
    w = tasks.point_weight.clone()
    w[:, :nkey] *= f[..., None]
    from dataclasses import replace

    ow = tasks.orient_weight
    if (orient_floor > 0 or orient_peak > 0) and tasks.orient_body.numel():
        from .solver import _quat_log, _quat_mul

        conj = rot.index_select(1, tasks.orient_body) * rot.new_tensor([1.0, -1.0, -1.0, -1.0])
        a = torch.linalg.norm(_quat_log(_quat_mul(tasks.orient_target_wxyz, conj)), dim=-1)  # [N, O] rad
        g = torch.ones_like(a)
        if orient_peak > 0:
            g = g * (1.0 + (a / orient_peak) ** 2).clamp_max(4.0)
        if orient_floor > 0:
            g = g * (orient_floor / a.clamp_min(1e-9)).clamp(1.0, 3.0)
        ow = ow * g
    return replace(tasks, point_weight=w, orient_weight=ow)


def _foot_forward(layout, q, bodies) -> np.ndarray:
    """``[N, F, 3]``: the x axis of the robot bodies ``bodies [F]`` in the world at ``q [N, nq]`` (torch)."""
    _, rot = layout.kinematics.from_coordinates(q)
    w, x, y, z = rot[:, bodies].double().cpu().numpy().transpose(2, 0, 1)
    return np.stack([1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y + w * z), 2.0 * (x * z - w * y)], -1)


def _held_at_solver_yaw(clip: _Clip, forward: np.ndarray, cfg) -> _Clip:
    """The clip with each foot held, per phase, at the mean heading its robot foot has in ``forward [N, F, 3]``
    (the coarse pass's solution) instead of the source foot's."""
    from dataclasses import replace

    tg = clip.tg
    tgt, wt = [], []
    for i, h in enumerate(tg.holds):
        t, w = h.targets(phase_yaw(h.phases, forward[:, i], h.phases.in_contact))
        tgt.append(t)
        wt.append(w * cfg.solver.contact_weight)
    if not tgt:
        return clip
    return replace(clip, tg=replace(tg, sole_target=np.concatenate(tgt, 1), sole_weight=np.concatenate(wt, 1)))


def collision_points(desc, layout, cfg: RobotRetargetConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(body [G], offset [G, 3] m in the body frame, radius [G] m)``: points that must stay above the floor.

    Spheres: the centre; capsules and cylinders: both ends of the axis (a cylinder's rim is covered by its
    radius, conservatively); boxes: the 8 corners; ellipsoids: the centre with the largest semi-axis; plus the
    sole points of the feet (radius 0). Meshes are not covered (give a model with primitive collision geoms).
    """
    from ..asset.desc import GeomType

    body, off, rad = [], [], []
    for g in () if desc is None else desc.geoms:
        if g.body < 0 or not g.collides or g.type is GeomType.PLANE:
            continue
        c, qg, size = np.asarray(g.pos, float), np.asarray(g.quat_wxyz, float), np.asarray(g.size, float)
        if g.type is GeomType.SPHERE:
            pts, r = [c], size[0]
        elif g.type in (GeomType.CAPSULE, GeomType.CYLINDER):
            axis = R.quat_rotate(qg, np.array([0.0, 0.0, size[1]]))
            pts, r = [c + axis, c - axis], size[0]
        elif g.type is GeomType.BOX:
            corners = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)]) * size
            pts, r = list(c + R.quat_rotate(qg, corners)), 0.0
        elif g.type is GeomType.ELLIPSOID:
            pts, r = [c], size.max()
        else:
            continue
        body += [g.body] * len(pts)
        off += pts
        rad += [r] * len(pts)
    for f in cfg.feet:
        b = layout.body_index(f.robot)
        for p in f.sole_points:
            body.append(b)
            off.append(np.asarray(p, float))
            rad.append(0.0)
    body_a = np.array(body, dtype=np.int64)
    off_a = np.array(off, dtype=np.float64).reshape(-1, 3)
    rad_a = np.array(rad, dtype=np.float64)
    # a sole point at a sphere's lowest point is the same constraint: keep one
    key = np.round(np.concatenate([body_a[:, None], off_a[:, :2], (off_a[:, 2] - rad_a)[:, None]], 1), 6)
    _, first = np.unique(key, axis=0, return_index=True)
    first = np.sort(first)
    return body_a[first], off_a[first], rad_a[first]


@dataclass(frozen=True)
class _Clip:
    """One clip's prepared source, targets and warm start (numpy)."""

    motion: SkeletonMotion
    src: _Source
    tg: _Targets
    q0: np.ndarray  # [N, nq]


def _prepare_clip(motion, cfg, layout, path) -> _Clip:
    src = _prepare_source(motion, cfg, path)
    tg = _build_targets(cfg, layout, src, path)
    # warm start: root on the source's root target, turned to the source heading; joints neutral
    q_neutral = layout.neutral()
    q0 = np.broadcast_to(q_neutral, (src.pos.shape[0], layout.nq)).copy()
    root = layout.blocks[0]
    pelvis_tasks = np.flatnonzero(tg.key_body == root.body_index)
    if pelvis_tasks.size:
        q0[:, root.q_offset : root.q_offset + 3] = tg.key_target[:, pelvis_tasks[0]]
    q0[:, root.q_offset + 3 : root.q_offset + 7] = R.quat_multiply(
        _yaw_quat(src.heading - _robot_heading(cfg, layout)), layout.rest_rotations_wxyz[root.body_index][None]
    )
    return _Clip(motion, src, tg, q0)


def _robot_heading(cfg, layout) -> float:
    """Yaw (rad) the robot faces in its neutral pose, read like the source's: from the robot bodies that
    correspond to the heading-alignment joints (0, facing +X, when none corresponds)."""
    _, npos, _ = _robot_neutral(layout)
    robot_of = {}
    for b in cfg.bodies:
        for alt in b.source.split("|"):
            robot_of.setdefault(alt, layout.body_index(b.robot))
    ha = cfg.heading_alignment
    pairs = []
    for left, right in zip(ha.left, ha.right):
        li = next((robot_of[a] for a in left.split("|") if a in robot_of), None)
        ri = next((robot_of[a] for a in right.split("|") if a in robot_of), None)
        if li is not None and ri is not None:
            pairs.append((li, ri))
    if not pairs:
        return 0.0
    return float(_heading(npos[None], [p[0] for p in pairs], [p[1] for p in pairs])[0])


@dataclass(frozen=True)
class _SelfCollision:
    """The robot's capsule proxies and the pairs checked (see :mod:`.self_collision`)."""

    caps: CollisionCapsules
    pairs: np.ndarray  # [C, 2] capsule indices
    rest_gap: np.ndarray  # [C] m, the gap of each pair in the neutral pose (negative: overlapping proxies)
    clearance: np.ndarray  # [C] m, the gap each pair keeps (:func:`.self_collision.pair_clearance`)


def _self_collision(desc, layout, mpath, cfg) -> _SelfCollision:
    if mpath is None and desc is not None:  # a model given as a description: its meshes from the file it came from
        mpath = desc.source
    caps = robot_capsules(desc, layout, mpath)
    pairs, rest = self_collision_pairs(desc, layout, caps)
    return _SelfCollision(caps, pairs, rest, pair_clearance(rest, float(cfg.solver.self_collision_margin)))


def _tasks(clips: list[_Clip], cfg, layout, ground, sc: _SelfCollision, t, sole_xy: float = 1.0) -> IKTasks:
    """The :class:`IKTasks` of clips solved together (frames concatenated clip by clip)."""
    import torch

    gb, go, gr = ground
    tg0 = clips[0].tg

    def cat(name):
        return np.concatenate([getattr(c.tg, name) for c in clips], 0)

    pair = {}
    if cfg.solver.self_collision_weight > 0 and sc.pairs.size:
        pair = dict(
            capsule_body=t(sc.caps.body, torch.int64),
            capsule_segment=t(sc.caps.segment),
            capsule_radius=t(sc.caps.radius),
            pair=t(sc.pairs, torch.int64),
            pair_clearance=t(sc.clearance),
            pair_weight=float(cfg.solver.self_collision_weight),
        )
    return IKTasks(
        point_body=t(np.concatenate([tg0.key_body, tg0.sole_body]), torch.int64),
        point_offset=t(np.concatenate([tg0.key_offset, tg0.sole_offset])),
        point_target=t(np.concatenate([cat("key_target"), cat("sole_target")], 1)),
        point_weight=t(np.concatenate([_axis_weights(c.tg, sole_xy) for c in clips], 0)),
        orient_body=t(tg0.orient_body, torch.int64),
        orient_target_wxyz=t(cat("orient_target")),
        orient_weight=t(cat("orient_weight")),
        ground_body=t(gb, torch.int64),
        ground_offset=t(go),
        ground_radius=t(gr),
        ground_height=float(cfg.ground_height),
        ground_weight=float(cfg.solver.ground_weight),
        posture_weight=float(cfg.solver.posture_weight),
        q_neutral=t(layout.neutral()),
        posture_dof_weight=_posture_dof_weight(cfg, layout, t),
        **pair,
    )


def _posture_dof_weight(cfg, layout, t):
    """``[nv]`` the further posture pull of the joints in ``solver.posture_joints`` (``None`` when it is empty)."""
    if not cfg.solver.posture_joints:
        return None
    w = np.zeros(layout.nv)
    blocks = {b.joint_name: b for b in layout.blocks}
    for name, v in cfg.solver.posture_joints:
        b = blocks[name]
        w[b.qd_offset : b.qd_offset + b.qd_dim] += v
    return t(w)


def _between_passes(group: list[_Clip], frames: ClipFrames, tasks: IKTasks, cfg, layout, ground, sc, t):
    """``(coarse-pass tasks or None, retask or None)`` for :func:`.solver.solve_clip`: with
    ``solver.held_yaw_from_solve`` the coarse pass holds the soles weakly in the horizontal and the fine pass
    holds each phase's foot at the heading the coarse pass gave it; with ``solver.key_weight_floor_m`` /
    ``key_weight_peak_m`` the fine pass's key-body weights are rescaled by the coarse pass's errors."""
    yaw_free = bool(cfg.solver.held_yaw_from_solve and cfg.feet)
    floor_m, peak_m = float(cfg.solver.key_weight_floor_m), float(cfg.solver.key_weight_peak_m)
    o_floor, o_peak = float(cfg.solver.orient_weight_floor_rad), float(cfg.solver.orient_weight_peak_rad)
    if not (yaw_free or floor_m > 0 or peak_m > 0 or o_floor > 0 or o_peak > 0):
        return None, None
    coarse = _tasks(group, cfg, layout, ground, sc, t, sole_xy=_FREE_YAW_SOLE_XY) if yaw_free else None
    nkey = len(group[0].tg.key_body)

    def retask(q_warm):
        out = tasks
        if yaw_free:
            fwd = _foot_forward(layout, q_warm, [layout.body_index(f.robot) for f in cfg.feet])
            cut = frames.clip_frame_start.tolist()[1:]
            held = [_held_at_solver_yaw(c, f, cfg) for c, f in zip(group, np.split(fwd, cut))]
            out = _tasks(held, cfg, layout, ground, sc, t)
        peak_max = float(cfg.solver.key_weight_peak_max)
        return _emphasise_errors(layout, q_warm, out, nkey, floor_m, peak_m, o_floor, o_peak, peak_max)

    return coarse, retask


def retarget_to_robot(
    motion: SkeletonMotion | Sequence[SkeletonMotion],
    config: RobotRetargetConfig | str,
    *,
    model=None,
    device="cpu",
    dtype: str = "float32",
    max_correction_m: float = 0.05,
) -> RobotRetargetResult | list[RobotRetargetResult]:
    """Put a human motion (or several clips at once) on a robot (see the module docstring for the steps).

    Several clips are solved in one batch: their frames are concatenated clip by clip and every step of the
    solver runs on all of them at once (coarse pass, smoothing and the warm start stay within each clip); clips
    of different fps are solved in one batch per fps. The same code runs on ``device="cuda"``.

    Args:
        motion: the source :class:`~kangengine.animation.SkeletonMotion` (m, Z up; e.g. ``ke.io.load_bvh``),
            or a list of them (each its own clip; the same skeleton naming).
        config: a :class:`~kangengine.retarget.RobotRetargetConfig` or a name/path for
            :func:`~kangengine.retarget.load_robot_config`.
        model: the robot model (file path, ``ArticulationDesc`` or layout) instead of the configuration's;
            its layout signature must be the configuration's.
        device: torch device of the solve (``"cpu"``, ``"cuda"``).
        dtype: ``"float64"`` or ``"float32"`` for the solve (the motion is stored float32).
        max_correction_m: the largest root lift (m) used to clear a collision point from the floor; a frame
            needing more is left as solved and counted in ``metrics["penetration_uncorrected_frames"]``.
    Returns:
        :class:`RobotRetargetResult` (a list of them, in order, for a list of motions).
    Raises:
        UnknownNameError: a source body of the configuration is not in ``motion`` (lists the source's bodies).
        LayoutMismatch: ``model`` has another layout signature than the configuration.
    """
    import torch

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    single = isinstance(motion, SkeletonMotion) or not isinstance(motion, Sequence)
    motions = [motion] if single else list(motion)
    if not motions:
        raise ShapeError("expected a SkeletonMotion or a non-empty list of them", item="motion")
    cfg = config if isinstance(config, RobotRetargetConfig) else load_robot_config(config, model=model)
    layout, desc, mpath = load_robot_model(cfg, model)
    cfg.check_model(layout, path=mpath)
    path = cfg.config_dir
    clips = [_prepare_clip(m, cfg, layout, path) for m in motions]
    tdt = {"float64": torch.float64, "float32": torch.float32}[dtype]

    def t(x, dt=tdt):
        return torch.as_tensor(np.ascontiguousarray(x), dtype=dt, device=device)

    ground = collision_points(desc, layout, cfg)
    sc = _self_collision(desc, layout, mpath, cfg)
    tables = robot_dof_tables(layout, dtype=tdt, device=device)
    solved: list = [None] * len(clips)
    for fps in dict.fromkeys(c.src.fps for c in clips):  # one batch per frame rate
        idx = [i for i, c in enumerate(clips) if c.src.fps == fps]
        group = [clips[i] for i in idx]
        frames = ClipFrames.from_counts([c.q0.shape[0] for c in group])
        tasks = _tasks(group, cfg, layout, ground, sc, t)
        q0 = t(np.concatenate([c.q0 for c in group], 0))
        coarse, retask = _between_passes(group, frames, tasks, cfg, layout, ground, sc, t)
        q, cost = solve_clip(
            layout, tasks, q0, cfg.solver, fps=fps, tables=tables, clips=frames, coarse_tasks=coarse, retask=retask
        )
        q = q.detach().cpu().numpy().astype(np.float64)
        cost = cost.detach().cpu().numpy()
        for i, s, n in zip(idx, frames.clip_frame_start, frames.clip_frame_count):
            solved[i] = (q[s : s + n], cost[s : s + n])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    out = [
        _finish(c, q, cost, layout, cfg, ground, sc, max_correction_m, str(device), dtype, (wall, cpu, len(clips)))
        for c, (q, cost) in zip(clips, solved)
    ]
    return out[0] if single else out


def _finish(clip: _Clip, q, cost, layout, cfg, ground, sc, max_correction_m, device, dtype, timing):
    """The result of one solved clip: floor clearance, velocities, the motion and its metrics."""
    src, tg, motion = clip.src, clip.tg, clip.motion
    gb, go, gr = ground
    n = q.shape[0]
    q, lift, fk = _clear_floor(layout, q, gb, go, gr, cfg.ground_height, max_correction_m)
    fps = src.fps
    qd = _central_velocity(layout, q, fps)
    amotion = ArticulationMotion(
        q,
        qd,
        fps,
        layout.model_signature,
        joint_names=layout.joint_names,
        metadata={
            "retarget_config": cfg.name,
            "source_frames": [int(src.kept[0]), int(src.kept[-1]) + 1],
            "source": dict(getattr(motion, "metadata", {}) or {}).get("source_file"),
        },
    )
    contact = np.stack([p.in_contact for p in tg.phases], 1) if tg.phases else np.zeros((n, 0), bool)
    metrics, task_errors = robot_retarget_metrics(
        layout, q, qd, fps, cfg, tg, ground, motion_local_rotation(motion, src.kept), lift, fk=fk
    )
    metrics.update(self_collision_metrics(layout, q, sc, tg, src, motion, fk=fk))
    wall, cpu, nclips = timing
    metrics.update(
        {
            "frames": int(n),
            "fps": fps,
            "dropped_leading_frames": int(src.kept[0]),
            "scale": tg.scale,
            "orientation_calibration": tg.orientation_calibration or {},
            "solver_cost_mean": float(cost.mean()),
            "jacobian": "analytic",
            "device": device,
            "dtype": dtype,
            "batch_clips": nclips,
            "time_s": wall,
            "cpu_time_s": cpu,
        }
    )
    return RobotRetargetResult(
        amotion, metrics, task_errors.astype(np.float32), tg.key_names, contact, src.kept, layout
    )


def self_collision_metrics(layout, q, sc: _SelfCollision, tg: _Targets, src: _Source, motion, fk=None) -> dict:
    """Robot self-collision frames (capsule proxies, every checked pair: two proxies intersecting by more than
    :data:`SELF_COLLISION_TOLERANCE_M`, or for proxies that overlap at rest, deeper than at rest by more than
    that) next to the source's own intersections
    (capsules around the correspondence bones, :func:`.self_collision.source_intersections`). ``fk``: the body
    transforms at ``q`` if already known."""
    gaps = capsule_gaps(layout, q, sc.caps, sc.pairs, within=0.0, fk=fk)
    depth = collision_depth(gaps, sc.rest_gap[None]) if gaps.size else np.zeros((q.shape[0], 0))
    robot = (depth > SELF_COLLISION_TOLERANCE_M).any(1) if gaps.size else np.zeros(q.shape[0], dtype=bool)
    parents = np.asarray(motion.tree.parent_indices)
    source = source_intersections(tg.source_joints, tg.scale * src.rest_pos, parents, tg.source_bones)
    return {
        "self_collision_frames": int(robot.sum()),
        "self_collision_depth_m": float(max(depth.max(), 0.0)) if depth.size else 0.0,
        "source_self_intersection_frames": int(source.sum()),
        "self_collision_frames_beyond_source": int((robot & ~source).sum()),
        "self_collision_pairs_checked": int(sc.pairs.shape[0]),
        "self_collision_pairs_overlapping_at_rest": int((sc.rest_gap < 0).sum()),
        "self_collision_proxies": {k: sc.caps.kind.count(k) for k in dict.fromkeys(sc.caps.kind)},
    }


def motion_local_rotation(motion: SkeletonMotion, kept: np.ndarray) -> np.ndarray:
    """``[frames, joints, 4]`` the source's local rotations on the kept frames (for its own velocity peaks)."""
    return np.asarray(motion.numpy().local_rotation, dtype=np.float64)[kept]


def _lowest_clearance(layout, q, gb, go, gr, ground, fk=None):
    from ..animation.layout import forward_kinematics

    p, r = forward_kinematics(layout, q) if fk is None else fk
    x = p[:, gb] + R.quat_rotate(r[:, gb], go[None])
    return (x[..., 2] - gr[None] - ground).min(1)  # [N]


def _clear_floor(layout, q, gb, go, gr, ground, limit):
    """Lift the root of every frame with a collision point below the floor by that depth (up to ``limit``):
    ``(q, lift [N] m, (body positions, body rotations) at the lifted q)``."""
    from ..animation.layout import forward_kinematics

    fk = forward_kinematics(layout, q)
    if gb.size == 0:
        return q, np.zeros(q.shape[0]), fk
    low = _lowest_clearance(layout, q, gb, go, gr, ground, fk)
    lift = np.where((low < 0) & (low > -limit), -low, 0.0)
    root = layout.blocks[0]
    q = q.copy()
    q[:, root.q_offset + 2] += lift
    bpos = fk[0].copy()
    bpos[..., 2] += lift[:, None]  # the free root's translation moves every body with it
    return q, lift, (bpos, fk[1])


def _central_velocity(layout, q, fps: float) -> np.ndarray:
    n = q.shape[0]
    if n < 2:
        return np.zeros((n, layout.nv))
    fwd = layout.difference(q[1:], q[:-1], 1.0 / fps)  # [N-1, V]
    qd = np.empty((n, layout.nv))
    qd[0], qd[-1] = fwd[0], fwd[-1]
    qd[1:-1] = 0.5 * (fwd[1:] + fwd[:-1])
    return qd
