"""Whole-clip damped Gauss-Newton (Levenberg-Marquardt) inverse kinematics, vectorised over frames in torch.

Every frame of a clip is one row of a batch: one forward-kinematics call (:meth:`BodyKinematics.joint_frames`,
the shared traced program) gives every body transform, every joint anchor and every DOF axis in the world,
from which the Jacobians are written analytically: for a DOF with world axis ``a`` at anchor ``c`` moving
point ``x``, ``dx/dq = a x (x - c)`` (rotation) or ``a`` (translation), and the angular Jacobian is ``a``.
Residuals (all squared and weighted, per frame):

* point tasks: a point on a robot body (key bodies, held sole points) to a world target (m);
* orientation tasks: ``log(target * current^-1)`` of a robot body (rad);
* ground: every collision point at least its radius above the floor (one-sided, active set per iteration);
* posture: the hinges towards the neutral pose (weak);
* temporal smoothness: after the solve, the trajectory is low-passed on the manifold (Gaussian) and solved
  again with a pull ``|difference(q, q_smooth)|^2`` towards it, so every frame's normal equations stay
  ``nv x nv`` (one batched Cholesky for the whole clip) while contacts, floor and limits keep priority.

Joint limits are hard bounds: every step is projected back into them (box-constrained Gauss-Newton). The
clip is first solved on every ``coarse_stride``-th frame, interpolated on the manifold, then refined on all
frames, then smoothed. The same code runs on CPU and CUDA tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..asset.desc import JointType

__all__ = ["IKTasks", "solve_clip", "robot_dof_tables", "smooth_on_manifold"]


@dataclass(frozen=True)
class IKTasks:
    """The residuals of a clip (torch tensors on the solve device, float dtype of the solve).

    Attributes:
        point_body: ``[P] int64`` body of each point task. point_offset: ``[P, 3]`` m, in the body frame.
        point_target: ``[frames, P, 3]`` m, world. point_weight: ``[frames, P, 3]`` per axis (world x, y, z).
        orient_body: ``[O] int64``. orient_target_wxyz: ``[frames, O, 4]`` world rotations.
        orient_weight: ``[frames, O]``.
        ground_body: ``[G] int64``, ground_offset: ``[G, 3]`` m (body frame), ground_radius: ``[G]`` m: the
            collision points kept above ``ground_height`` (m) with ``ground_weight``.
        posture_weight: weight of the hinges' pull to ``q_neutral`` (``[nq]``).
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

    def frames(self, index) -> IKTasks:
        """The tasks of some frames (``index``: a slice or an index tensor)."""
        return IKTasks(
            self.point_body,
            self.point_offset,
            self.point_target[index],
            self.point_weight[index],
            self.orient_body,
            self.orient_target_wxyz[index],
            self.orient_weight[index],
            self.ground_body,
            self.ground_offset,
            self.ground_radius,
            self.ground_height,
            self.ground_weight,
            self.posture_weight,
            self.q_neutral,
        )


@dataclass(frozen=True)
class _DofTables:
    dof_step: object  # [V] int64: the joint step of each DOF (index into JointFrames.joint_positions)
    dof_rotational: object  # [V] bool
    moves_body: object  # [V, B] float: 1 where the DOF moves the body
    hinge_q: object  # [H] int64 q index of each limited scalar joint
    hinge_lo: object  # [H]
    hinge_hi: object  # [H]
    hinge_dof: object  # [H] int64 qd index
    posture_dof: object  # [V] float: 1 on hinge/slide DOFs


def robot_dof_tables(layout, *, dtype, device) -> _DofTables:
    """Per-DOF tables of a layout for the Jacobians and the bounds (see :class:`_DofTables`)."""
    import torch

    steps, rot, owner = [], [], []
    step = 0
    for b in layout.blocks:
        if b.joint_type is JointType.FIXED:
            continue
        if b.joint_type is JointType.FREE:
            steps += [step] * 6
            rot += [False] * 3 + [True] * 3
        elif b.joint_type is JointType.BALL:
            steps += [step] * 3
            rot += [True] * 3
        else:
            steps.append(step)
            rot.append(b.joint_type is JointType.HINGE)
        owner += [b.body_index] * b.qd_dim
        step += 1
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
        hinge_q=t(hq, torch.int64),
        hinge_lo=t(lo),
        hinge_hi=t(hi),
        hinge_dof=t(hd, torch.int64),
        posture_dof=t(post),
    )


def _quat_mul(a, b):
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    import torch

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
    import torch

    w, u = q[..., :1], q[..., 1:]
    t = 2.0 * torch.linalg.cross(u, v, dim=-1)
    return v + w * t + torch.linalg.cross(u, t, dim=-1)


def _quat_log(q):
    """Rotation vector of a unit WXYZ quaternion (shortest rotation)."""
    import torch

    q = torch.where(q[..., :1] < 0, -q, q)
    s = torch.linalg.norm(q[..., 1:], dim=-1, keepdim=True)
    angle = 2.0 * torch.atan2(s, q[..., :1])
    scale = torch.where(s > 1e-9, angle / s.clamp_min(1e-12), 2.0 / q[..., :1].clamp_min(1e-12))
    return q[..., 1:] * scale


def _dof_moments(frames, tables):
    """``[N, 4, 3, V]``: per DOF the coefficients of ``dx_i/dq = sum_k C[k, i] (x, y, z, 1)_k`` for a world
    point ``x``: rotation ``a x (x - c) = a x x - a x c``, translation ``a``."""
    import torch

    anchor = frames.joint_positions[:, tables.dof_step]  # [N, V, 3]
    axes = frames.dof_axes  # [N, V, 3]
    rot = tables.dof_rotational.to(axes.dtype)[None, :, None]
    a = axes * rot
    const = axes - a - torch.linalg.cross(a, anchor, dim=-1)  # [N, V, 3]
    ax, ay, az = a.unbind(-1)
    zero = torch.zeros_like(ax)
    # rows i = x, y, z of (a x p) as coefficients of p_x, p_y, p_z
    coef = torch.stack(
        (
            torch.stack((zero, az, -ay), 1),  # coefficient of p_x in (a x p)_x, _y, _z
            torch.stack((-az, zero, ax), 1),  # of p_y
            torch.stack((ay, -ax, zero), 1),  # of p_z
            const.transpose(1, 2),  # constant term
        ),
        1,
    )  # [N, 4, 3, V]
    return coef


def _point_jacobian(x, body, coef, tables, out):
    """Write the Jacobian ``[N, P, 3, V]`` of world points ``x [N, P, 3]`` on bodies ``body [P]`` into ``out``
    (a view of that shape; ``[N, P, 1, V]``: the z row only): one batched product of ``(x, y, z, 1)`` with the
    per-DOF coefficients, then the mask of the DOFs that move each body."""
    import torch

    n, p = x.shape[:2]
    rows = out.shape[2]
    c = coef[:, :, 3 - rows :] if rows < 3 else coef  # [N, 4, rows, V]
    feat = torch.cat((x, x.new_ones((n, p, 1))), -1)  # [N, P, 4]
    j = (feat @ c.reshape(n, 4, -1)).view(n, p, rows, -1)
    torch.mul(j, tables.moves_body[:, body].T[None, :, None, :], out=j)
    out.copy_(j)


def _normal_equations(q, tasks: IKTasks, tables, layout):
    """``(H [N, V, V], g [N, V], cost [N], ground)`` of the task residuals at ``q`` (without smoothness);
    ``ground``: ``(clearance [N, G] m, dz/dq [N, G, V])`` of the collision points, or ``None``.

    The rows (point x, y, z; orientation x, y, z; ground z) are written into one ``[N, M, V]`` Jacobian
    scaled by the square roots of their weights; ``H = J^T J`` and ``g = J^T r`` are two batched products."""
    import torch

    fr = layout.kinematics.joint_frames(q)
    bpos, brot = fr.body_positions, fr.body_rotations_wxyz
    n, nv = q.shape[0], layout.nv
    npt, no, ng = tasks.point_body.numel(), tasks.orient_body.numel(), tasks.ground_body.numel()
    m_rows = 3 * npt + 3 * no + ng
    jac = q.new_empty((n, m_rows, nv))
    res = q.new_empty((n, m_rows))
    wts = q.new_empty((n, m_rows))
    moments = _dof_moments(fr, tables)
    # point tasks
    x = bpos[:, tasks.point_body] + _quat_rotate(brot[:, tasks.point_body], tasks.point_offset.expand(n, -1, -1))
    _point_jacobian(x, tasks.point_body, moments, tables, jac[:, : 3 * npt].view(n, npt, 3, nv))
    res[:, : 3 * npt] = (x - tasks.point_target).reshape(n, -1)
    wts[:, : 3 * npt] = tasks.point_weight.reshape(n, -1)
    # orientation tasks
    o0 = 3 * npt
    if no:
        cur = brot[:, tasks.orient_body]
        conj = cur * torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=q.dtype, device=q.device)
        err = _quat_log(_quat_mul(tasks.orient_target_wxyz, conj))  # [N, O, 3]
        a_rot = (fr.dof_axes * tables.dof_rotational.to(q.dtype)[None, :, None]).transpose(1, 2)  # [N, 3, V]
        jac[:, o0 : o0 + 3 * no].view(n, no, 3, nv)[:] = (
            a_rot[:, None] * tables.moves_body[:, tasks.orient_body].T[None, :, None, :]
        )
        res[:, o0 : o0 + 3 * no] = -err.reshape(n, -1)
        wts[:, o0 : o0 + 3 * no] = tasks.orient_weight[:, :, None].expand(-1, -1, 3).reshape(n, -1)
    # ground: one-sided, only the z row of the points below the floor
    g0 = o0 + 3 * no
    ground = None
    if ng:
        gx = bpos[:, tasks.ground_body] + _quat_rotate(
            brot[:, tasks.ground_body], tasks.ground_offset.expand(n, -1, -1)
        )
        h = gx[..., 2] - tasks.ground_radius - tasks.ground_height  # [N, G]
        jg = jac[:, g0:].view(n, ng, 1, nv)
        _point_jacobian(gx, tasks.ground_body, moments, tables, jg)
        res[:, g0:] = h.clamp_max(0.0)
        wts[:, g0:] = (h < 0).to(q.dtype) * tasks.ground_weight
        ground = (h, jg[:, :, 0].clone())
    sw = wts.sqrt()
    js = jac * sw[..., None]
    rs = res * sw
    hess = js.transpose(1, 2) @ js
    grad = (js.transpose(1, 2) @ rs[..., None])[..., 0]
    cost = (rs * rs).sum(1)
    # posture (hinges towards neutral)
    if tasks.posture_weight > 0:
        dpost = layout.difference(q, tasks.q_neutral.expand_as(q)) * tables.posture_dof
        grad = grad + tasks.posture_weight * dpost
        hess.diagonal(dim1=1, dim2=2).add_(tasks.posture_weight * tables.posture_dof)
        cost = cost + tasks.posture_weight * (dpost * dpost).sum(1)
    return hess, grad, cost, ground


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


def _iterate(q, tasks, tables, layout, options, iterations: int, prior=None):
    """Damped Gauss-Newton iterations on every frame of ``q [N, nq]`` at once (frames are independent here).

    ``prior = (q_prior [N, nq], weight)`` adds ``weight * |difference(q, q_prior)|^2`` (the smoothing pass).
    """
    import torch

    cost = q.new_zeros(q.shape[0])
    for _ in range(iterations):
        hess, grad, cost, ground = _normal_equations(q, tasks, tables, layout)
        diag = hess.diagonal(dim1=1, dim2=2)
        if prior is not None:
            d = layout.difference(q, prior[0])
            grad = grad + prior[1] * d
            diag.add_(prior[1])
            cost = cost + prior[1] * (d * d).sum(1)
        diag.add_(options.damping)
        step = _solve(hess, grad)
        if ground is not None:
            # one active-set round: points the step would push below the floor join the penalty (those
            # frames only are solved again)
            h, jg = ground
            new = ((h + (jg @ step[..., None])[..., 0]) < 0) & (h >= 0)
            rows = torch.nonzero(new.any(1))[:, 0]
            if rows.numel():
                swn = (new[rows].to(q.dtype) * tasks.ground_weight).sqrt()  # [r, G]
                jn = jg[rows] * swn[..., None]
                hn = hess[rows] + jn.transpose(1, 2) @ jn
                gn = grad[rows] + (jn.transpose(1, 2) @ (swn * h[rows])[..., None])[..., 0]
                step[rows] = _solve(hn, gn)
        big = step.abs().amax(1, keepdim=True)
        step = step * (options.max_step / big.clamp_min(options.max_step))
        # projected step: the joints go back inside their limits
        q = _project_limits(layout.integrate(q, step), tables)
    return q, cost


def smooth_on_manifold(layout, q, sigma_frames: float):
    """Gaussian low-pass of a trajectory ``q [N, nq]`` (torch) on the configuration manifold.

    ``q_s[t] = integrate(q[t], sum_k g_k difference(q[t + k], q[t]))`` with normalised Gaussian weights ``g_k``
    over ``|k| <= 2 sigma`` (indices clamped at the ends); one vectorised pass per offset ``k``.
    """
    import torch

    n = q.shape[0]
    half = int(math.ceil(2.0 * sigma_frames))
    if half < 1 or n < 2:
        return q
    ks = range(-half, half + 1)
    g = torch.tensor([math.exp(-0.5 * (k / sigma_frames) ** 2) for k in ks], dtype=q.dtype, device=q.device)
    g = g / g.sum()
    t = torch.arange(n, device=q.device)
    acc = torch.zeros((n, layout.nv), dtype=q.dtype, device=q.device)
    for w, k in zip(g, ks):
        if k:
            acc = acc + w * layout.difference(q[(t + k).clamp(0, n - 1)], q)
    return layout.integrate(q, acc)


def solve_clip(layout, tasks: IKTasks, q_init, options, *, fps: float, tables=None):
    """Solve the clip: a coarse pass on every ``options.coarse_stride``-th frame (interpolated on the manifold
    as the warm start), all frames, then the smoothing pass (a pull towards the low-passed solution, with every
    task still on: contacts, floor and limits stay as solved).

    Args:
        layout: the robot's :class:`~kangengine.animation.ArticulationCoordinateLayout` (free root).
        tasks: :class:`IKTasks` for every frame.
        q_init: ``[frames, nq]`` torch, the warm start (root from the source, joints neutral).
        options: :class:`~kangengine.retarget.robot_config.SolverOptions`.
        fps: frames per second of the clip (the smoothing width is in seconds).
    Returns:
        ``(q [frames, nq], cost [frames])`` torch, on ``q_init``'s device and dtype.
    """
    import torch

    tables = tables or robot_dof_tables(layout, dtype=q_init.dtype, device=q_init.device)
    q = _project_limits(q_init.clone(), tables)
    n = q.shape[0]
    stride = int(options.coarse_stride)
    if stride > 1 and n > 2 * stride and options.coarse_iterations > 0:
        idx = torch.arange(0, n, stride, device=q.device)
        if int(idx[-1]) != n - 1:
            idx = torch.cat([idx, torch.tensor([n - 1], device=q.device)])
        qc, _ = _iterate(q[idx], tasks.frames(idx), tables, layout, options, int(options.coarse_iterations))
        # interpolate the coarse solution onto every frame (geodesic, per segment)
        t = torch.arange(n, device=q.device)
        seg = torch.searchsorted(idx, t, right=True).clamp(1, idx.numel() - 1) - 1
        a, b = idx[seg], idx[seg + 1]
        alpha = ((t - a).to(q.dtype) / (b - a).to(q.dtype))[:, None]
        q = _project_limits(layout.integrate(qc[seg], layout.difference(qc[seg + 1], qc[seg]) * alpha), tables)
    q, cost = _iterate(q, tasks, tables, layout, options, int(options.iterations))
    if options.smoothness_weight > 0 and options.smoothing_iterations > 0:
        q_smooth = smooth_on_manifold(layout, q, options.smoothing_s * fps)
        prior = (q_smooth, float(options.smoothness_weight))
        q, cost = _iterate(q_smooth, tasks, tables, layout, options, int(options.smoothing_iterations), prior)
    return q, cost
