"""Whole-clip damped Gauss-Newton (Levenberg-Marquardt) inverse kinematics, vectorised over frames and clips.

Every frame of every clip is one row of a batch: one forward-kinematics call gives every body transform, every
joint anchor and every DOF axis in the world, from which the Jacobians are written analytically: for a DOF
with world axis ``a`` at anchor ``c`` moving point ``x``, ``dx/dq = a x (x - c)`` (rotation) or ``a``
(translation), and the angular Jacobian is ``a``. Residuals (all squared and weighted, per frame):

* point tasks: a point on a robot body (key bodies, held sole points) to a world target (m);
* orientation tasks: ``log(target * current^-1)`` of a robot body (rad);
* ground: every collision point at least its radius above the floor (one-sided, active set per iteration);
* self-collision: every pair of collision capsules (spheres: capsules of length 0) at least ``pair_margin``
  apart beyond their radii (one-sided, on the pairs that come near in the clip);
* posture: the hinges towards the neutral pose (weak);
* temporal smoothness: after the solve, the trajectory is low-passed on the manifold (Gaussian, within each
  clip) and solved again with a pull ``|difference(q, q_smooth)|^2`` towards it, so every frame's normal
  equations stay ``nv x nv`` (one batched Cholesky for all frames) while contacts, floor and limits keep
  priority (or, with ``smoothing_filter_only``, the low-passed trajectory is the answer: a convex combination
  of neighbouring in-limit frames stays in the limits, and a held foot, constant over its phase, stays held).

The normal equations ``H = J^T W J`` are assembled per kinematic chain: the rows of the bodies of one branch
(a leg, an arm with the torso) only depend on that branch's DOFs and the root's, so each group's Jacobian is
``[frames, rows, chain DOFs]`` and its ``J^T J`` is scattered into ``H`` (a third to a sixth of the products of
the dense form on a humanoid). Joint limits are hard bounds: every step is projected back into them
(box-constrained Gauss-Newton); with ``limit_round`` the hinges a step would carry past a bound are first fixed
on it and the other DOFs solved again (one active-set round on the bounds, so a joint at its limit does not
spoil the rest of the chain's step). Each clip is first solved on every ``coarse_stride``-th frame, interpolated on
the manifold, then refined on all frames, then smoothed. The same code runs on CPU and CUDA tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..asset.desc import JointType

__all__ = [
    "IKTasks",
    "solve_clip",
    "robot_dof_tables",
    "smooth_on_manifold",
    "ClipFrames",
    "pair_distances",
    "segment_closest_points",
]


@dataclass(frozen=True)
class IKTasks:
    """The residuals of a batch of frames (torch tensors on the solve device, float dtype of the solve).

    Attributes:
        point_body: ``[P] int64`` body of each point task. point_offset: ``[P, 3]`` m, in the body frame.
        point_target: ``[frames, P, 3]`` m, world. point_weight: ``[frames, P, 3]`` per axis (world x, y, z).
        orient_body: ``[O] int64``. orient_target_wxyz: ``[frames, O, 4]`` world rotations.
        orient_weight: ``[frames, O]``.
        ground_body: ``[G] int64``, ground_offset: ``[G, 3]`` m (body frame), ground_radius: ``[G]`` m: the
            collision points kept above ``ground_height`` (m) with ``ground_weight``.
        posture_weight: weight of the hinges' pull to ``q_neutral`` (``[nq]``).
        posture_dof_weight: ``[V]`` or ``None``: a further pull per DOF (added to ``posture_weight`` on hinges).
        capsule_body: ``[K] int64``, capsule_segment: ``[K, 2, 3]`` m (axis end points, body frame),
            capsule_radius: ``[K]`` m: the robot's collision capsules (``None``: no self-collision);
            pair: ``[C, 2] int64`` the capsule pairs, each kept ``pair_clearance [C]`` (m) apart beyond their
            radii with ``pair_weight``.
    """

    point_body: object
    point_offset: object
    point_target: object
    point_weight: object
    orient_body: object
    orient_target_wxyz: object
    orient_weight: object
    ground_body: object
    ground_offset: object
    ground_radius: object
    ground_height: float
    ground_weight: float
    posture_weight: float
    q_neutral: object
    capsule_body: object = None
    posture_dof_weight: object = None
    capsule_segment: object = None
    capsule_radius: object = None
    pair: object = None
    pair_clearance: object = None
    pair_weight: float = 0.0

    def frames(self, index) -> IKTasks:
        """The tasks of some frames (``index``: a slice or an index tensor)."""
        return replace(
            self,
            point_target=self.point_target[index],
            point_weight=self.point_weight[index],
            orient_target_wxyz=self.orient_target_wxyz[index],
            orient_weight=self.orient_weight[index],
        )

    def with_pairs(self, keep) -> IKTasks:
        """The tasks with only the self-collision pairs ``keep`` (``[C'] int64`` or bool mask), and only the
        capsules those pairs use (renumbered), so the solver places no capsule no pair needs."""
        import torch

        if self.pair is None:
            return self
        pair = self.pair[keep]
        used, inv = torch.unique(pair, return_inverse=True)
        return replace(
            self,
            pair=inv.reshape(pair.shape),
            pair_clearance=self.pair_clearance[keep],
            capsule_body=self.capsule_body[used],
            capsule_segment=self.capsule_segment[used],
            capsule_radius=self.capsule_radius[used],
        )

    @property
    def num_pairs(self) -> int:
        return 0 if self.pair is None else int(self.pair.shape[0])


@dataclass(frozen=True)
class ClipFrames:
    """Where each clip of a batch lies in the frame axis (frames of all clips concatenated, clip-major).

    Attributes:
        clip_frame_start: ``[clips] int64`` first frame of each clip. clip_frame_count: ``[clips] int64``.
    """

    clip_frame_start: np.ndarray
    clip_frame_count: np.ndarray

    @classmethod
    def single(cls, n: int) -> ClipFrames:
        return cls(np.zeros(1, dtype=np.int64), np.array([n], dtype=np.int64))

    @classmethod
    def from_counts(cls, counts) -> ClipFrames:
        c = np.asarray(counts, dtype=np.int64)
        return cls(np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64), c)

    @property
    def num_frames(self) -> int:
        return int(self.clip_frame_count.sum())

    def frame_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(first [frames], last [frames])``: the first and last frame of each frame's clip."""
        lo = np.repeat(self.clip_frame_start, self.clip_frame_count)
        return lo, lo + np.repeat(self.clip_frame_count, self.clip_frame_count) - 1


@dataclass(frozen=True)
class _DofTables:
    dof_step: object  # [V] int64: the joint step of each DOF (index into JointFrames.joint_positions)
    dof_rotational: object  # [V] bool
    moves_body: object  # [V, B] float: 1 where the DOF moves the body
    moves_body_np: np.ndarray  # [V, B] bool (numpy, for planning the row groups)
    hinge_q: object  # [H] int64 q index of each limited scalar joint
    hinge_lo: object  # [H]
    hinge_hi: object  # [H]
    hinge_dof: object  # [H] int64 qd index
    posture_dof: object  # [V] float: 1 on hinge/slide DOFs
    # joint frames derived from the body transforms (one joint per body, no ball): None otherwise
    step_body: object  # [S] int64 body of each joint step
    step_anchor: object  # [S, 3] m, anchor in the body frame
    dof_body: object  # [V] int64 body whose rotation turns the DOF's axis
    dof_axis_local: object  # [V, 3] axis in that body's frame (free DOFs: world axes, body -1 -> identity)
    dof_world: object  # [V] bool: the axis is a world axis (free joint)


def robot_dof_tables(layout, *, dtype, device) -> _DofTables:
    """Per-DOF tables of a layout for the Jacobians and the bounds (see :class:`_DofTables`)."""
    import torch

    steps, rot, owner = [], [], []
    step_body, step_anchor, dof_axis, dof_world = [], [], [], []
    per_body = np.zeros(layout.num_bodies, dtype=np.int64)
    derivable = True
    step = 0
    for b in layout.blocks:
        if b.joint_type is JointType.FIXED:
            continue
        per_body[b.body_index] += 1
        step_body.append(b.body_index)
        step_anchor.append(b.anchor)
        if b.joint_type is JointType.FREE:
            steps += [step] * 6
            rot += [False] * 3 + [True] * 3
            dof_axis += [np.eye(3)[i] for i in (0, 1, 2, 0, 1, 2)]
            dof_world += [True] * 6
            derivable &= layout.parent_indices[b.body_index] < 0
        elif b.joint_type is JointType.BALL:
            steps += [step] * 3
            rot += [True] * 3
            dof_axis += [np.eye(3)[i] for i in range(3)]
            dof_world += [False] * 3
            derivable = False  # the axes are the frame before the ball: needs the joint's own rotation
        else:
            steps.append(step)
            rot.append(b.joint_type is JointType.HINGE)
            dof_axis.append(np.asarray(b.axis if b.axis is not None else (0.0, 0.0, 1.0), dtype=np.float64))
            dof_world.append(False)
        owner += [b.body_index] * b.qd_dim
        step += 1
    derivable &= bool((per_body <= 1).all())
    nb = layout.num_bodies
    parents = layout.parent_indices
    anc = np.zeros((nb, nb), dtype=bool)  # anc[a, b]: a is b or an ancestor of b
    for b in range(nb):
        a = b
        while a >= 0:
            anc[a, b] = True
            a = parents[a]
    moves = anc[np.asarray(owner)]
    hq, lo, hi, hd = [], [], [], []
    post = np.zeros(layout.nv)
    for b in layout.blocks:
        if b.joint_type in (JointType.HINGE, JointType.SLIDE):
            post[b.qd_offset] = 1.0
            if b.limits is not None:
                hq.append(b.q_offset)
                hd.append(b.qd_offset)
                lo.append(b.limits[0])
                hi.append(b.limits[1])

    def t(x, dt=dtype):
        return torch.as_tensor(np.asarray(x), dtype=dt, device=device)

    return _DofTables(
        dof_step=t(steps, torch.int64),
        dof_rotational=t(rot, torch.bool),
        moves_body=t(moves.astype(np.float64)),
        moves_body_np=moves,
        hinge_q=t(hq, torch.int64),
        hinge_lo=t(lo),
        hinge_hi=t(hi),
        hinge_dof=t(hd, torch.int64),
        posture_dof=t(post),
        step_body=t(step_body, torch.int64) if derivable else None,
        step_anchor=t(np.asarray(step_anchor, dtype=np.float64).reshape(-1, 3)) if derivable else None,
        dof_body=t(np.asarray(owner), torch.int64) if derivable else None,
        dof_axis_local=t(np.asarray(dof_axis).reshape(-1, 3)) if derivable else None,
        dof_world=t(dof_world, torch.bool) if derivable else None,
    )


def _quat_mul(a, b):
    import torch

    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        (
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ),
        -1,
    )


def _quat_rotate(q, v):
    """``[..., 3]``: unit WXYZ quaternions ``q [..., 4]`` applied to ``v [..., 3]`` (``v + 2w (u x v) + u x
    2(u x v)``, written per component: ~1.5x faster on the CPU than two ``torch.linalg.cross``)."""
    import torch

    w, x, y, z = q.unbind(-1)
    vx, vy, vz = v.unbind(-1)
    tx, ty, tz = 2.0 * (y * vz - z * vy), 2.0 * (z * vx - x * vz), 2.0 * (x * vy - y * vx)
    return torch.stack(
        (vx + w * tx + (y * tz - z * ty), vy + w * ty + (z * tx - x * tz), vz + w * tz + (x * ty - y * tx)), -1
    )


def _posture_weights(tasks, tables):
    """``[V]`` the posture pull of each DOF (``None``: none): ``posture_weight`` plus ``posture_dof_weight``."""
    if tasks.posture_dof_weight is None:
        return tasks.posture_weight * tables.posture_dof if tasks.posture_weight > 0 else None
    return (tasks.posture_weight + tasks.posture_dof_weight) * tables.posture_dof


def _quat_log(q):
    """Rotation vector of a unit WXYZ quaternion (shortest rotation)."""
    import torch

    q = torch.where(q[..., :1] < 0, -q, q)
    s = torch.linalg.norm(q[..., 1:], dim=-1, keepdim=True)
    angle = 2.0 * torch.atan2(s, q[..., :1])
    scale = torch.where(s > 1e-9, angle / s.clamp_min(1e-12), 2.0 / q[..., :1].clamp_min(1e-12))
    return q[..., 1:] * scale


def _task_points(bpos, brot, parts):
    """World points (or directions) of several sets of body-frame vectors in one gather and one rotation:
    ``parts`` is a list of ``(body [K] int64, local [K, 3])`` (points: the body origin is added) or
    ``(body, local, False)`` (directions: rotated only); returns ``[N, K, 3]`` per part (``bpos [N, B, 3]``,
    ``brot [N, B, 4]`` world_from_body). Fewer, larger tensor ops than one rotation per part."""
    import torch

    sizes = [int(p[0].numel()) for p in parts]
    body = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    local = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    n = bpos.shape[0]
    rotated = _quat_rotate(brot.index_select(1, body), local.expand(n, -1, -1))
    out = [x.contiguous() for x in rotated.split(sizes, 1)] if len(parts) > 1 else [rotated]
    return [x + bpos.index_select(1, p[0]) if len(p) < 3 or p[2] else x for x, p in zip(out, parts)]


@dataclass(frozen=True)
class _Frames:
    body_positions: object  # [N, B, 3]
    body_rotations_wxyz: object  # [N, B, 4]
    joint_positions: object  # [N, S, 3]
    dof_axes: object  # [N, V, 3]


def _joint_frames(q, layout, tables, parts=None):
    """Body transforms, joint anchors and DOF axes in the world at ``q [N, nq]``.

    With one joint per body (no ball) they come from the body transforms alone (``from_coordinates``, the
    native kernel on the CPU when one is built): a hinge's world axis is its body's rotation of its axis and
    its anchor is fixed by its own rotation, so ``anchor_world = body_pos + R_body anchor``. Otherwise the
    traced ``joint_frames`` program gives them.

    ``parts``: ``None``, or a list of ``(body [K], local [K, 3])`` whose world points (:func:`_task_points`) are
    placed in the same rotation as the anchors and axes; then ``(frames, [points [N, K, 3] per part])``."""
    import torch

    kin = layout.kinematics
    parts = parts or []
    if tables.step_body is None:
        fr = kin.joint_frames(q)
        out = _Frames(fr.body_positions, fr.body_rotations_wxyz, fr.joint_positions, fr.dof_axes)
        pts = _task_points(out.body_positions, out.body_rotations_wxyz, parts) if parts else []
        return (out, pts) if parts else out
    bpos, brot = kin.from_coordinates(q)
    sb = tables.step_body
    jpos, ax, *pts = _task_points(
        bpos, brot, [(sb, tables.step_anchor), (tables.dof_body, tables.dof_axis_local, False)] + parts
    )
    ax = torch.where(tables.dof_world[None, :, None], tables.dof_axis_local[None], ax)
    out = _Frames(bpos, brot, jpos, ax)
    return (out, pts) if parts else out


def _dof_moments(frames, tables):
    """``[N, 4, 3, V]``: per DOF the coefficients of ``dx_i/dq = sum_k C[k, i] (x, y, z, 1)_k`` for a world
    point ``x``: rotation ``a x (x - c) = a x x - a x c``, translation ``a``."""
    import torch

    anchor = frames.joint_positions.index_select(1, tables.dof_step)  # [N, V, 3]
    axes = frames.dof_axes  # [N, V, 3]
    rot = tables.dof_rotational.to(axes.dtype)[None, :, None]
    a = axes * rot
    const = axes - a - torch.linalg.cross(a, anchor, dim=-1)  # [N, V, 3]
    ax, ay, az = a.unbind(-1)
    zero = torch.zeros_like(ax)
    # rows i = x, y, z of (a x p) as coefficients of p_x, p_y, p_z
    return torch.stack(
        (
            torch.stack((zero, az, -ay), 1),  # coefficient of p_x in (a x p)_x, _y, _z
            torch.stack((-az, zero, ax), 1),  # of p_y
            torch.stack((ay, -ax, zero), 1),  # of p_z
            const.transpose(1, 2),  # constant term
        ),
        1,
    )  # [N, 4, 3, V]


def _point_jacobian(x, coef, mask):
    """``[N, P, R, c]``: Jacobian of world points ``x [N, P, 3]`` from the per-DOF coefficients ``coef
    [N, 4, R, c]`` (R rows of x, y, z; c DOFs) and ``mask [P, c]`` (1 where the DOF moves the point's body)."""
    n, p = x.shape[:2]
    rows, c = coef.shape[2], coef.shape[3]
    feat = torch_cat_ones(x)
    j = (feat @ coef.reshape(n, 4, rows * c)).view(n, p, rows, c)
    return j * mask[None, :, None, :]


def torch_cat_ones(x):
    """``[..., 4]``: ``(x, y, z, 1)``."""
    import torch

    return torch.cat((x, x.new_ones(x.shape[:-1] + (1,))), -1)


@dataclass(frozen=True)
class _RowGroup:
    """Task rows that depend on one chain of DOFs: ``cols [c]`` (their qd indices), ``flat [c * c]`` (their
    block's entries in a flattened ``[V * V]``), the point / orientation / ground tasks in the group and the
    ``[rows, c]`` masks of the DOFs that move each task's body."""

    cols: object
    flat: object
    points: object
    point_mask: object
    orients: object
    orient_mask: object
    grounds: object
    ground_mask: object
    pairs: object = None
    pair_mask: object = None  # [C, 2, c]


def _chain_groups(bodies: list[np.ndarray], moves: np.ndarray) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Group task bodies by chain: ``[(dof columns, [indices into each of bodies])]``. A body joins the group of
    a deeper body whose DOFs include all of its own (an ancestor on the same branch), else starts one."""
    dofs = {int(b): frozenset(np.flatnonzero(moves[:, b]).tolist()) for arr in bodies for b in arr}
    order = sorted(dofs, key=lambda b: -len(dofs[b]))
    leaves: list[frozenset] = []
    owner = {}
    for b in order:
        fits = [i for i, s in enumerate(leaves) if dofs[b] <= s]
        if fits:
            owner[b] = min(fits, key=lambda i: len(leaves[i]))
        else:
            owner[b] = len(leaves)
            leaves.append(dofs[b])
    out = []
    for i, s in enumerate(leaves):
        idx = [np.flatnonzero([owner[int(b)] == i for b in arr]).astype(np.int64) for arr in bodies]
        out.append((np.array(sorted(s), dtype=np.int64), idx))
    return out


def _row_groups(tasks: IKTasks, tables, nv: int) -> tuple[_RowGroup, ...]:
    """The chain groups of a task set (built once per solve)."""
    import torch

    dev = tables.moves_body.device
    dt = tables.moves_body.dtype
    moves = tables.moves_body_np
    bodies = [tasks.point_body.cpu().numpy(), tasks.orient_body.cpu().numpy(), tasks.ground_body.cpu().numpy()]

    def lt(x):
        return torch.as_tensor(x, dtype=torch.int64, device=dev)

    def mask(cols, body):
        return torch.as_tensor(moves[np.ix_(cols, body)].T.astype(np.float64), dtype=dt, device=dev)

    groups = []
    for cols, (pi, oi, gi) in _chain_groups(bodies, moves):
        flat = (cols[:, None] * nv + cols[None, :]).reshape(-1)
        groups.append(
            _RowGroup(
                cols=lt(cols),
                flat=lt(flat),
                points=lt(pi),
                point_mask=mask(cols, bodies[0][pi]),
                orients=lt(oi),
                orient_mask=mask(cols, bodies[1][oi]),
                grounds=lt(gi),
                ground_mask=mask(cols, bodies[2][gi]),
            )
        )
    if tasks.num_pairs:  # one group per two chains (left arm - left leg, ...): a pair's DOFs are in its bodies' chains
        pb = tasks.capsule_body[tasks.pair].cpu().numpy()
        chains = [frozenset(g.cols.cpu().numpy().tolist()) for g in groups]

        chain_of = {}
        for b in np.unique(pb).tolist():  # per body, not per pair
            own = frozenset(np.flatnonzero(moves[:, b]).tolist())
            fits = [c for c in chains if own <= c]
            chain_of[b] = min(fits, key=len) if fits else own
        sets = [tuple(sorted(chain_of[a] | chain_of[b])) for a, b in pb.tolist()]
        empty = lt(np.zeros(0))
        for key in dict.fromkeys(sets):
            cols = np.array(key, dtype=np.int64)
            sel = np.array([i for i, k in enumerate(sets) if k == key], dtype=np.int64)
            pm = np.stack([moves[np.ix_(cols, pb[sel, k])].T for k in (0, 1)], 1).astype(np.float64)
            groups.append(
                _RowGroup(
                    cols=lt(cols),
                    flat=lt((cols[:, None] * nv + cols[None, :]).reshape(-1)),
                    points=empty,
                    point_mask=None,
                    orients=empty,
                    orient_mask=None,
                    grounds=empty,
                    ground_mask=None,
                    pairs=lt(sel),
                    pair_mask=torch.as_tensor(pm, dtype=dt, device=dev),
                )
            )
    return tuple(groups)


def segment_closest_points(p0, p1, q0, q1):
    """Closest points of segments ``p0-p1`` and ``q0-q1`` (``[..., 3]`` each; a zero-length segment is a
    point): ``(on_p [..., 3], on_q [..., 3])`` (Ericson, Real-Time Collision Detection 5.1.9, vectorised)."""
    d1, d2, r = p1 - p0, q1 - q0, p0 - q0
    a = (d1 * d1).sum(-1)
    e = (d2 * d2).sum(-1)
    f = (d2 * r).sum(-1)
    c = (d1 * r).sum(-1)
    b = (d1 * d2).sum(-1)
    eps = 1e-12
    zero = a.new_zeros(())
    a_s, e_s = a.clamp_min(eps), e.clamp_min(eps)
    denom = a * e - b * b
    s = ((b * f - c * e) / denom.clamp_min(eps)).clamp(0.0, 1.0).where(denom > eps * a_s * e_s, zero)
    t = (b * s + f) / e_s
    s = (-c / a_s).clamp(0.0, 1.0).where(t < 0, ((b - c) / a_s).clamp(0.0, 1.0).where(t > 1, s))
    t = t.clamp(0.0, 1.0)
    # degenerate segments: a point against a segment (or a point)
    s = s.where(e > eps, (-c / a_s).clamp(0.0, 1.0))
    t = t.where(e > eps, zero)
    s = s.where(a > eps, zero)
    t = t.where(a > eps, (f / e_s).clamp(0.0, 1.0).where(e > eps, zero))
    return p0 + d1 * s[..., None], q0 + d2 * t[..., None]


def capsules_world(bpos, brot, body, segment):
    """``[N, K, 2, 3]`` m: capsule axis end points in the world from ``body [K]`` and ``segment [K, 2, 3]``
    (body frames), with ``bpos [N, B, 3]``, ``brot [N, B, 4]`` world_from_body."""
    n = bpos.shape[0]
    return _quat_rotate(brot[:, body, None], segment.expand(n, -1, -1, -1)) + bpos[:, body, None]


def pair_distances(seg_world, pair, radius):
    """Gaps of capsule pairs at some frames (torch).

    Args:
        seg_world: ``[N, K, 2, 3]`` m, capsule end points in the world (:func:`capsules_world`).
        pair: ``[C, 2] int64`` capsule indices of each pair. radius: ``[K]`` m.
    Returns:
        ``(gap [N, C] m (negative: the capsules intersect), normal [N, C, 3] from side 1 to side 0,
        closest point of each side [N, C, 2, 3] m world)``.
    """
    import torch

    a, b = seg_world.index_select(1, pair[:, 0]), seg_world.index_select(1, pair[:, 1])
    pa, pb = segment_closest_points(a[:, :, 0], a[:, :, 1], b[:, :, 0], b[:, :, 1])
    diff = pa - pb
    dist = torch.linalg.norm(diff, dim=-1)
    normal = diff / dist.clamp_min(1e-9)[..., None]
    return dist - radius[pair].sum(-1), normal, torch.stack((pa, pb), 2)


def bounding_gaps(seg_world, pair, radius):
    """``[N, C]`` m: a lower bound of each pair's gap (the capsules' bounding spheres), cheap broad phase."""
    import torch

    mid = 0.5 * (seg_world[:, :, 0] + seg_world[:, :, 1])
    reach = radius + 0.5 * torch.linalg.norm(seg_world[0, :, 1] - seg_world[0, :, 0], dim=-1)
    k = mid.shape[1]
    d = torch.cdist(mid, mid).reshape(mid.shape[0], k * k)[:, pair[:, 0] * k + pair[:, 1]]  # all pairs at once
    return d - reach[pair].sum(-1)


def _normal_equations(q, tasks: IKTasks, tables, layout, groups=None):
    """``(H [N, V, V], g [N, V], cost [N], one_sided)`` of the task residuals at ``q`` (without smoothness);
    ``one_sided``: per chain group with one-sided rows (the collision points' floor clearances, the
    self-collision pairs' gaps beyond their clearance) ``(value [N, R] m, d value/dq [N, R, c], weight,
    cols [c], flat [c * c])``.

    Per chain group (:func:`_row_groups`) the weighted rows (point x, y, z; orientation x, y, z; ground z;
    self-collision gaps) form one ``[N, rows, c]`` Jacobian; its ``J^T J`` and ``J^T r`` are added into ``H``
    and ``g`` at the group's DOFs."""
    import torch

    groups = _row_groups(tasks, tables, layout.nv) if groups is None else groups
    n, nv = q.shape[0], layout.nv
    parts = [(tasks.point_body, tasks.point_offset), (tasks.ground_body, tasks.ground_offset)]
    if tasks.num_pairs:
        parts.append((tasks.capsule_body.repeat_interleave(2), tasks.capsule_segment.reshape(-1, 3)))
    fr, (pt_x, gx, *caps) = _joint_frames(q, layout, tables, parts)
    brot = fr.body_rotations_wxyz
    coef = _dof_moments(fr, tables)
    pt_r = pt_x - tasks.point_target
    pt_s = tasks.point_weight.sqrt()
    no, ng = tasks.orient_body.numel(), tasks.ground_body.numel()
    if no:
        cur = brot.index_select(1, tasks.orient_body)
        conj = cur * torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=q.dtype, device=q.device)
        or_r = -_quat_log(_quat_mul(tasks.orient_target_wxyz, conj))  # [N, O, 3]
        or_s = tasks.orient_weight.sqrt()
        a_rot = (fr.dof_axes * tables.dof_rotational.to(q.dtype)[None, :, None]).transpose(1, 2)  # [N, 3, V]
    one_sided = []
    if ng:
        h = gx[..., 2] - tasks.ground_radius - tasks.ground_height  # [N, G]
        g_s = ((h < 0).to(q.dtype) * tasks.ground_weight).sqrt()
    if tasks.num_pairs:
        seg = caps[0].reshape(n, -1, 2, 3)
        gap, normal, closest = pair_distances(seg, tasks.pair, tasks.capsule_radius)
        gap = gap - tasks.pair_clearance
        c_s = ((gap < 0).to(q.dtype) * tasks.pair_weight).sqrt()
    hess = q.new_zeros((n, nv * nv))
    grad = q.new_zeros((n, nv))
    cost = q.new_zeros(n)
    for g in groups:
        cg = coef.index_select(3, g.cols)  # [N, 4, 3, c]
        c = cg.shape[3]
        js, rs = [], []
        if g.points.numel():
            j = _point_jacobian(pt_x.index_select(1, g.points), cg, g.point_mask)
            s = pt_s.index_select(1, g.points)
            js.append((j * s[..., None]).reshape(n, -1, c))
            rs.append((pt_r.index_select(1, g.points) * s).reshape(n, -1))
        if g.orients.numel():
            j = a_rot.index_select(2, g.cols)[:, None] * g.orient_mask[None, :, None, :]
            s = or_s[:, g.orients, None]
            js.append((j * s[..., None]).reshape(n, -1, c))
            rs.append((or_r.index_select(1, g.orients) * s).reshape(n, -1))
        if g.grounds.numel():
            j = _point_jacobian(gx.index_select(1, g.grounds), cg[:, :, 2:3], g.ground_mask)[:, :, 0]  # [N, Gg, c]
            one_sided.append((h.index_select(1, g.grounds), j, tasks.ground_weight, g.cols, g.flat))
            s = g_s.index_select(1, g.grounds)
            js.append(j * s[..., None])
            rs.append(h.index_select(1, g.grounds).clamp_max(0.0) * s)
        if g.pairs is not None:
            cl = closest.index_select(1, g.pairs)
            ja = _point_jacobian(cl[:, :, 0], cg, g.pair_mask[:, 0])  # [N, Cg, 3, c]
            jb = _point_jacobian(cl[:, :, 1], cg, g.pair_mask[:, 1])
            j = ((ja - jb) * normal[:, g.pairs, :, None]).sum(2)  # [N, Cg, c]
            one_sided.append((gap.index_select(1, g.pairs), j, tasks.pair_weight, g.cols, g.flat))
            s = c_s.index_select(1, g.pairs)
            js.append(j * s[..., None])
            rs.append(gap.index_select(1, g.pairs).clamp_max(0.0) * s)
        jac = torch.cat(js, 1) if len(js) > 1 else js[0]
        res = torch.cat(rs, 1) if len(rs) > 1 else rs[0]
        jt = jac.transpose(1, 2)
        hess.index_add_(1, g.flat, (jt @ jac).reshape(n, -1))
        grad.index_add_(1, g.cols, (jt @ res[..., None])[..., 0])
        cost = cost + (res * res).sum(1)
    hess = hess.view(n, nv, nv)
    # posture (hinges towards neutral)
    pw = _posture_weights(tasks, tables)
    if pw is not None:
        dpost = layout.difference(q, tasks.q_neutral.expand_as(q)) * tables.posture_dof
        grad = grad + pw * dpost
        hess.diagonal(dim1=1, dim2=2).add_(pw * tables.posture_dof)
        cost = cost + (pw * dpost * dpost).sum(1)
    return hess, grad, cost, one_sided


def _cost(q, tasks: IKTasks, tables, layout, prior=None):
    """``[N]`` the weighted squared residuals at ``q`` (what :func:`_normal_equations` linearises; the
    one-sided rows active where violated), from the body transforms alone: the step acceptance test."""
    import torch

    bpos, brot = layout.kinematics.from_coordinates(q)
    n = q.shape[0]
    parts = [(tasks.point_body, tasks.point_offset), (tasks.ground_body, tasks.ground_offset)]
    if tasks.num_pairs:
        parts.append((tasks.capsule_body.repeat_interleave(2), tasks.capsule_segment.reshape(-1, 3)))
    x, gx, *caps = _task_points(bpos, brot, parts)
    cost = (tasks.point_weight * (x - tasks.point_target) ** 2).sum((1, 2))
    if tasks.orient_body.numel():
        conj = brot.index_select(1, tasks.orient_body) * torch.tensor(
            [1.0, -1.0, -1.0, -1.0], dtype=q.dtype, device=q.device
        )
        err = _quat_log(_quat_mul(tasks.orient_target_wxyz, conj))
        cost = cost + (tasks.orient_weight[..., None] * err * err).sum((1, 2))
    if tasks.ground_body.numel():
        h = (gx[..., 2] - tasks.ground_radius - tasks.ground_height).clamp_max(0.0)
        cost = cost + tasks.ground_weight * (h * h).sum(1)
    if tasks.num_pairs:
        seg = caps[0].reshape(n, -1, 2, 3)
        gap = (pair_distances(seg, tasks.pair, tasks.capsule_radius)[0] - tasks.pair_clearance).clamp_max(0.0)
        cost = cost + tasks.pair_weight * (gap * gap).sum(1)
    pw = _posture_weights(tasks, tables)
    if pw is not None:
        d = layout.difference(q, tasks.q_neutral.expand_as(q)) * tables.posture_dof
        cost = cost + (pw * d * d).sum(1)
    if prior is not None:
        d = layout.difference(q, prior[0])
        cost = cost + prior[1] * (d * d).sum(1)
    return cost


def _project_limits(q, tables):
    lo, hi = tables.hinge_lo, tables.hinge_hi
    q[:, tables.hinge_q] = q[:, tables.hinge_q].clamp(lo, hi)
    return q


def _solve(hess, grad):
    """``-H^-1 g`` per frame (Cholesky; a diagonal step where ``H`` is not positive definite)."""
    import torch

    chol, info = torch.linalg.cholesky_ex(hess)
    step = -torch.cholesky_solve(grad[..., None], chol)[..., 0]
    return torch.where((info == 0)[:, None], step, -grad / hess.diagonal(dim1=1, dim2=2))


#: a frame whose largest step (rad / m) is under this has converged: it leaves the iterations
_CONVERGED_STEP = 5e-4


def _active_set_round(hess, grad, step, one_sided):
    """One active-set round: the one-sided rows (floor, pairs) the step would push past their bound join the
    penalty, and those frames only are solved again (``hess``/``grad`` as for ``step``, damping included)."""
    import torch

    n, nv = grad.shape
    news = []
    hit = torch.zeros(n, dtype=torch.bool, device=grad.device)
    for value, jac, _, cols, _ in one_sided:
        new = ((value + (jac @ step[:, cols, None])[..., 0]) < 0) & (value >= 0)
        hit |= new.any(1)
        news.append(new)
    rows = torch.nonzero(hit)[:, 0]
    if rows.numel() == 0:
        return step, None
    r = rows.numel()
    hn = hess[rows].reshape(r, nv * nv)
    gn = grad[rows].clone()
    for (value, jac, weight, cols, flat), new in zip(one_sided, news):
        sw = (new[rows].to(grad.dtype) * weight).sqrt()  # [r, R]
        jn = jac[rows] * sw[..., None]
        jt = jn.transpose(1, 2)
        hn.index_add_(1, flat, (jt @ jn).reshape(r, -1))
        gn.index_add_(1, cols, (jt @ (sw * value[rows])[..., None])[..., 0])
    step[rows] = _solve(hn.view(r, nv, nv), gn)
    return step, (rows, hn.view(r, nv, nv), gn)


def _bound_round(hess, grad, step, q, tables, floor=None):
    """One active-set round on the joint limits: the hinges the step would carry past a bound are fixed on that
    bound and the frames with one are solved again for the other DOFs (``H_ff d_f = -(g_f + H_fb d_b)``), so a
    joint held at its limit no longer spoils the step of the rest of the chain (a clamped Newton step is not a
    descent direction). ``floor``: the rows, ``H`` and ``g`` of :func:`_active_set_round` where it changed them.
    """
    import torch

    if tables.hinge_q.numel() == 0:
        return step
    qh = q[:, tables.hinge_q]
    dh = step[:, tables.hinge_dof]
    landed = (qh + dh).clamp(tables.hinge_lo, tables.hinge_hi)
    cross = landed != qh + dh  # [N, H]
    rows = torch.nonzero(cross.any(1))[:, 0]
    if rows.numel() == 0:
        return step
    n, nv = grad.shape
    h = hess[rows]
    g = grad[rows].clone()
    if floor is not None:
        pos = torch.full((n,), -1, dtype=torch.int64, device=grad.device)
        pos[floor[0]] = torch.arange(floor[0].numel(), device=grad.device)
        p = pos[rows]
        m = p >= 0
        h[m] = floor[1][p[m]]
        g[m] = floor[2][p[m]]
    r = rows.numel()
    fixed = torch.zeros((r, nv), dtype=torch.bool, device=grad.device)
    fixed[:, tables.hinge_dof] = cross[rows]
    d_fixed = torch.zeros((r, nv), dtype=grad.dtype, device=grad.device)
    d_fixed[:, tables.hinge_dof] = torch.where(cross[rows], landed[rows] - qh[rows], 0.0)
    free = (~fixed).to(grad.dtype)
    g = torch.where(fixed, -d_fixed, g + (h @ d_fixed[..., None])[..., 0])
    h = h * free[:, :, None] * free[:, None, :] + torch.diag_embed(fixed.to(grad.dtype))
    step[rows] = _solve(h, g)
    return step


def _iterate(q, tasks, tables, layout, options, iterations: int, prior=None, keep_model: bool = False):
    """Levenberg-Marquardt iterations on every frame of ``q [N, nq]`` at once (frames are independent here).

    ``prior = (q_prior [N, nq], weight)`` adds ``weight * |difference(q, q_prior)|^2`` (the smoothing pass).
    Each frame keeps its own damping: a step that does not lower the frame's cost is refused and the damping
    raised tenfold, an accepted one lowers it threefold (never under ``options.damping``). A frame whose
    accepted step is under :data:`_CONVERGED_STEP` has converged and leaves the batch: the following
    iterations run on the frames still moving only (gathered, then written back).

    ``keep_model``: also return the last iteration's linearisation ``(q_base, hess (damping included), grad,
    one_sided)`` when it covered every frame (else ``None``): :func:`_proximal_smooth` reuses it.
    """
    import torch

    groups = _row_groups(tasks, tables, layout.nv)
    n = q.shape[0]
    q = q.clone()
    cost = q.new_zeros(n)
    damping = q.new_full((n,), float(options.damping))
    active = torch.arange(n, device=q.device)
    model = None
    for _ in range(iterations):
        full = active.numel() == n
        qa = q if full else q[active]
        ta = tasks if full else tasks.frames(active)
        pa = None if prior is None else (prior[0] if full else prior[0][active], prior[1])
        hess, grad, ca, one_sided = _normal_equations(qa, ta, tables, layout, groups)
        diag = hess.diagonal(dim1=1, dim2=2)
        if pa is not None:
            d = layout.difference(qa, pa[0])
            grad = grad + pa[1] * d
            diag.add_(pa[1])
            ca = ca + pa[1] * (d * d).sum(1)
        lam = damping[active]
        diag.add_(lam[:, None])
        step = _solve(hess, grad)
        floor = None
        if one_sided:
            step, floor = _active_set_round(hess, grad, step, one_sided)
        if int(getattr(options, "limit_round", 0)):
            step = _bound_round(hess, grad, step, qa, tables, floor)
        model = (qa, hess, grad, one_sided) if keep_model and full else None
        big = step.abs().amax(1, keepdim=True)
        step = step * (options.max_step / big.clamp_min(options.max_step))
        # projected step: the joints go back inside their limits
        qn = _project_limits(layout.integrate(qa, step), tables)
        cn = _cost(qn, ta, tables, layout, pa)
        ok = cn <= ca * (1.0 + 1e-6) + 1e-12
        q[active] = torch.where(ok[:, None], qn, qa)
        cost[active] = torch.where(ok, cn, ca)
        damping[active] = torch.where(ok, (lam / 3.0).clamp_min(float(options.damping)), lam * 10.0)
        moving = ~ok | (big[:, 0] >= _CONVERGED_STEP)
        active = active[moving]
        if active.numel() == 0:
            break
    return (q, cost, model) if keep_model else (q, cost)


def _proximal_smooth(model, q_smooth, tasks, tables, layout, options, weight: float):
    """The smoothing pass on the last pass's linearisation (no new Jacobians): per frame the step ``d`` from that
    pass's base ``q0`` minimising its quadratic model plus ``weight |difference(q0 + d, q_smooth)|^2``
    (``(H + weight I) d = -(g + weight difference(q0, q_smooth))``, the one-sided rows' active set, limits and
    step bound as in :func:`_iterate`); a frame keeps ``q_smooth`` where that lowers its true cost less.
    Returns ``(q [N, nq], cost [N])``."""
    import torch

    q0, hess, grad, one_sided = model
    hess = hess.clone()
    hess.diagonal(dim1=1, dim2=2).add_(weight)
    grad = grad + weight * layout.difference(q0, q_smooth)
    step = _solve(hess, grad)
    floor = None
    if one_sided:
        step, floor = _active_set_round(hess, grad, step, one_sided)
    if int(getattr(options, "limit_round", 0)):
        step = _bound_round(hess, grad, step, q0, tables, floor)
    big = step.abs().amax(1, keepdim=True)
    step = step * (options.max_step / big.clamp_min(options.max_step))
    qn = _project_limits(layout.integrate(q0, step), tables)
    prior = (q_smooth, weight)
    cn = _cost(qn, tasks, tables, layout, prior)
    cs = _cost(q_smooth, tasks, tables, layout, prior)
    ok = cn <= cs * (1.0 + 1e-6) + 1e-12
    return torch.where(ok[:, None], qn, q_smooth), torch.where(ok, cn, cs)


def smooth_on_manifold(layout, q, sigma_frames: float, clips: ClipFrames | None = None):
    """Gaussian low-pass of a trajectory ``q [N, nq]`` (torch) on the configuration manifold, within each clip.

    ``q_s[t] = integrate(q[t], sum_k g_k difference(q[t + k], q[t]))`` with normalised Gaussian weights ``g_k``
    over ``|k| <= 2 sigma`` (indices clamped at the ends of the frame's clip); one vectorised pass per offset.
    """
    import torch

    n = q.shape[0]
    half = int(math.ceil(2.0 * sigma_frames))
    if half < 1 or n < 2:
        return q
    clips = ClipFrames.single(n) if clips is None else clips
    lo, hi = (torch.as_tensor(x, device=q.device) for x in clips.frame_bounds())
    ks = range(-half, half + 1)
    g = [math.exp(-0.5 * (k / sigma_frames) ** 2) for k in ks]
    g = [w / sum(g) for w in g]
    t = torch.arange(n, device=q.device)
    acc = torch.zeros((n, layout.nv), dtype=q.dtype, device=q.device)
    for w, k in zip(g, ks):
        if k:
            acc = acc + w * layout.difference(q[torch.minimum(torch.maximum(t + k, lo), hi)], q)
    return layout.integrate(q, acc)


def _coarse_plan(clips: ClipFrames, stride: int):
    """``(coarse frames [M], segment start position [N], alpha [N])`` (numpy) of the coarse pass: every
    ``stride``-th frame of each clip and its last; each frame interpolates between two coarse frames of its
    clip (positions into the coarse list)."""
    idx, lo_pos, alpha = [], [], []
    for s, c in zip(clips.clip_frame_start.tolist(), clips.clip_frame_count.tolist()):  # per clip, not per frame
        local = np.arange(0, c, stride)
        if local[-1] != c - 1:
            local = np.append(local, c - 1)
        base = len(idx) and sum(len(x) for x in idx)
        t = np.arange(c)
        seg = np.clip(np.searchsorted(local, t, side="right"), 1, len(local) - 1) - 1
        a, b = local[seg], local[seg + 1]
        idx.append(local + s)
        lo_pos.append(seg + base)
        alpha.append((t - a) / np.maximum(b - a, 1))
    return np.concatenate(idx), np.concatenate(lo_pos), np.concatenate(alpha)


def _near_pairs(q, tasks, layout, cull_m: float):
    """Indices of the self-collision pairs whose gap comes within ``cull_m`` of its clearance in some frame."""
    import torch

    bpos, brot = layout.kinematics.from_coordinates(q)
    seg = capsules_world(bpos, brot, tasks.capsule_body, tasks.capsule_segment)
    slack = tasks.pair_clearance + cull_m
    near = torch.nonzero((bounding_gaps(seg, tasks.pair, tasks.capsule_radius) < slack).any(0))[:, 0]
    gap, _, _ = pair_distances(seg, tasks.pair[near], tasks.capsule_radius)
    return near[(gap < slack[near]).any(0)]


def solve_clip(
    layout,
    tasks: IKTasks,
    q_init,
    options,
    *,
    fps: float,
    tables=None,
    clips: ClipFrames | None = None,
    coarse_tasks: IKTasks | None = None,
    retask=None,
):
    """Solve a batch of clips: a coarse pass on every ``options.coarse_stride``-th frame of each clip
    (interpolated on the manifold as the warm start), all frames (then, with ``options.refine_share``, one more
    iteration on that share of each clip's costliest frames), then the smoothing pass (a pull towards the
    low-passed solution, with every task still on: contacts, floor and limits stay as solved). Self-collision
    pairs (if any) are kept to those that come near in the interpolated warm start.

    Args:
        layout: the robot's :class:`~kangengine.animation.ArticulationCoordinateLayout` (free root).
        tasks: :class:`IKTasks` for every frame of every clip.
        q_init: ``[frames, nq]`` torch, the warm start (root from the source, joints neutral).
        options: :class:`~kangengine.retarget.robot_config.SolverOptions`.
        fps: frames per second of the clips (the smoothing width is in seconds).
        clips: where each clip lies in the frame axis (default: one clip).
        coarse_tasks: the tasks of the coarse pass if not ``tasks`` (all frames; only the coarse ones are used).
        retask: ``None`` or a function of the warm start ``q [frames, nq]`` (the interpolated coarse pass)
            returning the :class:`IKTasks` of the fine and smoothing passes instead of ``tasks`` (the robot
            path reweights the key bodies and chooses the held feet's heading there); not called when the
            clips are too short for a coarse pass (``tasks`` are used then).
    Returns:
        ``(q [frames, nq], cost [frames])`` torch, on ``q_init``'s device and dtype.
    """
    import torch

    tables = tables or robot_dof_tables(layout, dtype=q_init.dtype, device=q_init.device)
    q = _project_limits(q_init.clone(), tables)
    n = q.shape[0]
    clips = ClipFrames.single(n) if clips is None else clips
    stride = int(options.coarse_stride)
    first = tasks if coarse_tasks is None else coarse_tasks
    no_pairs = first.with_pairs(torch.zeros(first.num_pairs, dtype=torch.bool, device=q.device))
    coarse = stride > 1 and int(clips.clip_frame_count.min()) > 2 * stride and options.coarse_iterations > 0
    if coarse:
        idx, lo_pos, alpha = _coarse_plan(clips, stride)
        idx_t = torch.as_tensor(idx, device=q.device)
        qc, _ = _iterate(q[idx_t], no_pairs.frames(idx_t), tables, layout, options, int(options.coarse_iterations))
        lo_t = torch.as_tensor(lo_pos, device=q.device)
        a_t = torch.as_tensor(alpha, dtype=q.dtype, device=q.device)[:, None]
        q = _project_limits(layout.integrate(qc[lo_t], layout.difference(qc[lo_t + 1], qc[lo_t]) * a_t), tables)
    if retask is not None and coarse:  # the new tasks are chosen from the coarse pass's solution
        tasks = retask(q)
    all_pairs = tasks
    if tasks.num_pairs:
        tasks = all_pairs.with_pairs(_near_pairs(q, all_pairs, layout, 0.05))
    reuse = bool(getattr(options, "smoothing_reuse", 0))
    q, cost, model = _iterate(q, tasks, tables, layout, options, int(options.iterations), keep_model=True)
    share = float(getattr(options, "refine_share", 0.0))
    if share > 0 and n > 1:  # one more iteration on the frames the fine pass left costliest, in each clip
        top = torch.cat(
            [
                s + torch.topk(cost[s : s + c], max(1, min(c, int(math.ceil(share * c))))).indices
                for s, c in zip(clips.clip_frame_start.tolist(), clips.clip_frame_count.tolist())  # per clip
            ]
        )
        q_top, c_top = _iterate(q[top], tasks.frames(top), tables, layout, options, 1)
        q, cost = q.clone(), cost.clone()
        q[top], cost[top] = q_top, c_top
        model = None
    if options.smoothness_weight > 0 and options.smoothing_iterations > 0:
        q_smooth = smooth_on_manifold(layout, q, options.smoothing_s * fps, clips)
        if int(getattr(options, "smoothing_filter_only", 0)):  # the low-passed solution itself, no step
            return q_smooth, _cost(q_smooth, tasks, tables, layout)
        if reuse and model is not None and int(options.smoothing_iterations) == 1:
            return _proximal_smooth(model, q_smooth, tasks, tables, layout, options, float(options.smoothness_weight))
        if tasks.num_pairs:  # the pairs the refined motion brings near
            tasks = all_pairs.with_pairs(_near_pairs(q_smooth, all_pairs, layout, 0.03))
        prior = (q_smooth, float(options.smoothness_weight))
        q, cost = _iterate(q_smooth, tasks, tables, layout, options, int(options.smoothing_iterations), prior)
    return q, cost
