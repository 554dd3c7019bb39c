"""Rigid-body dynamics of a :class:`~kangengine.sim.Model`, batched over worlds: mass matrix (composite
rigid body algorithm), bias forces and inverse dynamics (recursive Newton-Euler), energies, momentum.

Spatial algebra in world axes about the reference point (the root origin at this instant): motion
vectors ``(angular, linear)``, force vectors ``(moment, force)``. The recursions over the tree are written
with the model's tree masks (``dof_moves_body``, ``subtree``, ``dof_frame``) as matrix products, so there
is no Python loop over bodies or worlds here: forward passes (velocities, accelerations) sum the
contributions of every ancestor DOF, backward passes (composite inertias, forces) sum over subtrees.
A body's spatial inertia is kept as ten numbers (mass, first moment, inertia about the origin), which
add up over subtrees.

Velocities ``qd`` and accelerations ``qdd`` use the canonical convention (free root: origin velocity and
angular velocity in world; ball: angular velocity in the parent frame); generalized forces are the duals
(free root: world force at the root origin, world torque about it; ball: torque in the parent frame).
"""

from __future__ import annotations

import torch

from .kinematics import (
    Comps,
    Frames,
    body_twists,
    compute_frames,
    cross,
    dof_path_sums,
    flat_batch,
    rotate,
    rows,
    subtree_sums_,
)
from .model import Model

__all__ = [
    "mass_matrix",
    "bias_forces",
    "inverse_dynamics",
    "forward_dynamics",
    "kinetic_energy",
    "potential_energy",
    "momentum",
    "rnea",
    "spatial_inertias",
    "apply_inertia",
    "composite",
    "joint_space_lower",
    "generalized_forces_t",
    "mass_product_t",
    "mechanical_energy_t",
]


def _cross_motion(a: Comps, b: Comps) -> Comps:
    """Spatial cross product of motion vectors ``a x b`` (6 components each)."""
    wa, va, wb, vb = a[:3], a[3:], b[:3], b[3:]
    return cross(wa, wb) + tuple(x + y for x, y in zip(cross(wa, vb), cross(va, wb)))


def _cross_force(v: Comps, f: Comps) -> Comps:
    """Spatial cross product of a motion vector with a force vector ``v x* f`` (6 components each)."""
    w, lin, n, force = v[:3], v[3:], f[:3], f[3:]
    return tuple(x + y for x, y in zip(cross(w, n), cross(lin, force))) + cross(w, force)


def _body_com(model: Model, fr: Frames) -> Comps:
    """3 x ``[B, W]`` m: body centres of mass relative to the reference origin, world axes."""
    rc = rotate(fr.body_rot, model.step_cache.body_com_t)
    return tuple(p - o + c for p, o, c in zip(fr.body_pos, fr.origin, rc))


def spatial_inertias(model: Model, fr: Frames) -> Comps:
    """10 x ``[B, W]``: spatial inertia of every body about the reference origin, world axes, as
    ``(m, m c_x, m c_y, m c_z, I_xx, I_yy, I_zz, I_xy, I_xz, I_yz)`` (``c``: centre of mass relative to the
    origin; ``I``: rotational inertia about the origin)."""
    r = fr.body_rot
    i00, i01, i02, i11, i12, i22 = model.step_cache.body_inertia_t  # body-frame inertia about the COM, per body
    # R I: rows of R times the constant symmetric I
    ri = []
    for a in range(3):
        ra0, ra1, ra2 = r[3 * a], r[3 * a + 1], r[3 * a + 2]
        ri.append(
            (ra0 * i00 + ra1 * i01 + ra2 * i02, ra0 * i01 + ra1 * i11 + ra2 * i12, ra0 * i02 + ra1 * i12 + ra2 * i22)
        )

    def world(a, b):  # (R I R^T)[a, b]
        return ri[a][0] * r[3 * b] + ri[a][1] * r[3 * b + 1] + ri[a][2] * r[3 * b + 2]

    m = model.step_cache.body_mass_c
    cx, cy, cz = _body_com(model, fr)
    mx, my, mz = m * cx, m * cy, m * cz
    return (
        m.expand_as(cx),
        mx,
        my,
        mz,
        world(0, 0) + my * cy + mz * cz,
        world(1, 1) + mx * cx + mz * cz,
        world(2, 2) + mx * cx + my * cy,
        world(0, 1) - mx * cy,
        world(0, 2) - mx * cz,
        world(1, 2) - my * cz,
    )


def apply_inertia(feat: Comps, motion: Comps) -> Comps:
    """Spatial inertia (ten components) times motion vectors (six): ``(I w + h x v, m v + w x h)`` with
    ``h = m c``."""
    m, hx, hy, hz, ixx, iyy, izz, ixy, ixz, iyz = feat
    wx, wy, wz, vx, vy, vz = motion
    return (
        ixx * wx + ixy * wy + ixz * wz + hy * vz - hz * vy,
        ixy * wx + iyy * wy + iyz * wz + hz * vx - hx * vz,
        ixz * wx + iyz * wy + izz * wz + hx * vy - hy * vx,
        m * vx + wy * hz - wz * hy,
        m * vy + wz * hx - wx * hz,
        m * vz + wx * hy - wy * hx,
    )


def composite(model: Model, c: Comps | torch.Tensor, *, overwrite: bool = False) -> Comps:
    """Sums over each body's subtree, gathered per DOF: k x ``[B, W]`` (or stacked ``[B, k, W]``, summed in
    place when ``overwrite``) -> k x ``[nv, W]`` (views of one ``[nv, k, W]`` tensor)."""
    if isinstance(c, torch.Tensor):
        x = c if overwrite else c.clone()
    else:
        x = torch.stack(c, dim=1)
    return subtree_sums_(model, x).index_select(0, model.dof_body).unbind(1)


def _joint_space_product(model: Model, applied: Comps, motion_rows: torch.Tensor) -> torch.Tensor:
    """The composite-rigid-body assembly ``H[i, j] = s_i . (Xc_body(j) s_j)`` for DOF pairs on one branch.

    Args:
        applied: 6 x ``[nv, W]``: the subtree-composite operator of each DOF's body applied to the DOF's
            motion (``Xc_body(j) s_j``).
        motion_rows: ``[W, nv, 6]`` DOF motions ``s``.
    Returns:
        ``[W, nv, nv]`` symmetric.
    """
    f = torch.stack(applied).permute(2, 0, 1).contiguous()  # [W, 6, nv]
    raw = torch.bmm(motion_rows, f)  # raw[i, j] = s_i . Xc(body j) s_j
    return raw * model.dof_above + (raw * model.dof_above_strict).transpose(-1, -2)


def joint_space_lower(model: Model, applied: Comps, motion_rows: torch.Tensor) -> torch.Tensor:
    """Like :func:`_joint_space_product` but only the lower triangle is right (the upper is partly zero):
    enough for a Cholesky factorisation, which reads the lower triangle only. Relies on the parent-first
    DOF order (an ancestor's DOFs come first).

    The result is a transposed view of a row-major array (column-major storage, LAPACK's layout), so
    factorising it copies without a transpose.

    Args:
        applied: 6 x ``[nv, W]`` as for :func:`_joint_space_product`.
        motion_rows: ``[W, nv, 6]`` DOF motions.
    Returns:
        ``[W, nv, nv]`` (a ``.mT`` view).
    """
    f = torch.stack(applied).permute(2, 0, 1).contiguous()  # [W, 6, nv]
    upper = torch.bmm(motion_rows, f).mul_(model.dof_above)  # [i, j] = s_i . Xc(body j) s_j, body(i) above body(j)
    return upper.mT


def generalized_forces_t(model: Model, motion: Comps, body_force: Comps) -> torch.Tensor:
    """``[nv, W]`` (DOF-major): generalized forces ``sum_b J_b^T f_b`` of spatial body forces ``body_force``
    (6 x ``[B, W]``: moment about the reference origin, force; world axes); ``motion``: the DOF motions
    (``Frames.motion``)."""
    sub = composite(model, body_force)
    out = motion[0] * sub[0]
    for s, f in zip(motion[1:], sub[1:]):
        out = out.addcmul_(s, f)
    return out


def mass_product_t(model: Model, fr: Frames, inertia: Comps, x_t: torch.Tensor) -> torch.Tensor:
    """``[nv, W]``: ``M(q) x`` for DOF-major ``x_t [nv, W]`` at the configuration of ``fr`` (one pass down
    and one up the tree, joint inertia included; no matrix is formed)."""
    tw = dof_path_sums(model, fr.motion_stack * x_t[:, None, :]).unbind(1)
    out = generalized_forces_t(model, fr.motion, apply_inertia(inertia, tw))
    return out.addcmul_(model.dof_armature[:, None], x_t)


def mechanical_energy_t(
    model: Model, fr: Frames, inertia: Comps, twists: torch.Tensor, qd_t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kinetic [W], gravitational [W])`` J at the configuration of ``fr`` (:func:`kinetic_energy` and
    :func:`potential_energy` from quantities a step already has).

    Args:
        inertia: :func:`spatial_inertias`; twists: ``[B, 6, W]`` body twists of ``qd_t`` (``[nv, W]``).
    """
    tw = twists.unbind(1)
    kin = 0.5 * (torch.stack(tw, 1) * torch.stack(apply_inertia(inertia, tw), 1)).sum((0, 1))
    kin = kin + 0.5 * (model.dof_armature[:, None] * qd_t * qd_t).sum(0)
    sc = model.step_cache
    gx, gy, gz = sc.gravity_t
    mg = sc.body_mass_c * sc.body_gravity_c  # [B, 1]
    first = (inertia[1] * gx + inertia[2] * gy + inertia[3] * gz) * sc.body_gravity_c  # m g . c (about origin)
    ox, oy, oz = fr.origin
    pot = -(first.sum(0) + mg.sum() * (ox[0] * gx + oy[0] * gy + oz[0] * gz))
    return kin, pot


def _gravity_forces(model: Model, inertia: Comps) -> Comps:
    """6 x ``[B, W]`` spatial gravity force on every body (off where ``body_gravity`` is 0)."""
    scale = model.step_cache.body_gravity_c
    m = inertia[0] * scale
    h = tuple(x * scale for x in inertia[1:4])
    g = model.step_cache.gravity_t
    return cross(h, g) + (m * g[0], m * g[1], m * g[2])


def _mass_matrix(model: Model, fr: Frames, inertia: Comps) -> torch.Tensor:
    m = _joint_space_product(model, apply_inertia(composite(model, inertia), fr.motion), fr.motion_rows)
    return m + torch.diag_embed(model.dof_armature.expand(m.shape[0], -1))


def rnea(
    model: Model,
    fr: Frames,
    inertia: Comps,
    qd: torch.Tensor,
    qdd: torch.Tensor | None,
    gravity: bool = True,
    twists_out: list | None = None,
    dof_major: bool = False,
    twists: torch.Tensor | None = None,
) -> torch.Tensor:
    """Recursive Newton-Euler at the configuration of ``fr`` (no shape checks): ``tau = M qdd + c(q, qd)``.

    Args:
        fr: :func:`~kangengine.sim.kinematics.compute_frames` at ``q``; inertia: :func:`spatial_inertias`.
        qd, qdd: ``[W, nv]`` (``[nv, W]`` with ``dof_major``); ``qdd = None``: zero.
        gravity: include gravity in ``c``.
        twists_out: a list to which the body twists ``[B, 6, W]`` are appended.
        twists: the body twists ``[B, 6, W]`` of ``qd`` when the caller has them (one pass fewer).
    Returns:
        ``[W, nv]`` N m / N (``[nv, W]`` with ``dof_major``).
    """
    s = fr.motion
    qd_t = qd if dof_major else qd.t().contiguous()
    sv_stack = fr.motion_stack * qd_t[:, None, :]  # [nv, 6, W]
    n, k, w = sv_stack.shape
    sv = sv_stack.unbind(1)
    vel_stack = dof_path_sums(model, sv_stack) if twists is None else twists  # [B, 6, W]
    vel = vel_stack.unbind(1)
    if twists_out is not None:
        twists_out.append(vel_stack)
    frame_vel = (model.dof_frame @ sv_stack.view(n, k * w)).view(n, k, w).unbind(1)  # 6 x [nv, W]
    acc_terms = _cross_motion(frame_vel, sv)
    if qdd is not None:
        qdd_t = qdd if dof_major else qdd.t().contiguous()
        acc_terms = tuple(a.addcmul_(c, qdd_t) for a, c in zip(acc_terms, s))
    acc = dof_path_sums(model, torch.stack(acc_terms, dim=1)).unbind(1)
    uniform = gravity and model.step_cache.uniform_gravity
    if uniform:  # gravity as a base acceleration: I (a - g) = I a - (h x g, m g)
        g_world = model.step_cache.gravity_t
        acc = acc[:3] + tuple(a - g if g != 0.0 else a for a, g in zip(acc[3:], g_world))
    f = tuple(a.add_(b) for a, b in zip(apply_inertia(inertia, acc), _cross_force(vel, apply_inertia(inertia, vel))))
    if gravity and not uniform:
        f = tuple(a - g for a, g in zip(f, _gravity_forces(model, inertia)))
    tau = generalized_forces_t(model, s, f)
    if qdd is not None:
        tau = tau.addcmul_(model.dof_armature[:, None], qdd_t)
    return tau if dof_major else tau.t()


def mass_matrix(model: Model, q: torch.Tensor) -> torch.Tensor:
    """Joint-space inertia matrix by the composite rigid body algorithm, joint inertia (armature) added
    to the diagonal.

    Args:
        q: ``[..., nq]``, model dtype and device.
    Returns:
        ``[..., nv, nv]`` symmetric positive definite, kg m^2 / kg, canonical velocity basis.
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    fr = compute_frames(model, q2)
    m = _mass_matrix(model, fr, spatial_inertias(model, fr))
    return m.reshape(lead + m.shape[1:])


def bias_forces(model: Model, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """Coriolis, centrifugal and gravity forces ``c(q, qd)`` (MuJoCo's ``qfrc_bias``): the generalized force
    needed for zero acceleration, ``M qdd + c = tau``.

    Args:
        q: ``[..., nq]``; qd: ``[..., nv]``.
    Returns:
        ``[..., nv]`` N m / N.
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    qd2, _ = flat_batch(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    c = rnea(model, fr, spatial_inertias(model, fr), qd2, None)
    return c.reshape(lead + c.shape[1:])


def inverse_dynamics(model: Model, q: torch.Tensor, qd: torch.Tensor, qdd: torch.Tensor) -> torch.Tensor:
    """Generalized forces that produce ``qdd`` (recursive Newton-Euler, gravity and joint inertia included;
    no contact, limits, damping or friction): ``tau = M(q) qdd + c(q, qd)``.

    Args:
        q: ``[..., nq]``; qd, qdd: ``[..., nv]`` (canonical convention).
    Returns:
        ``[..., nv]`` N m / N; for a free root the first six entries are the world force at the root
        origin and the world torque about it that the motion needs (the "residual wrench").
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    qd2, _ = flat_batch(model, qd, model.nv, "qd")
    qdd2, _ = flat_batch(model, qdd, model.nv, "qdd")
    fr = compute_frames(model, q2)
    tau = rnea(model, fr, spatial_inertias(model, fr), qd2, qdd2)
    return tau.reshape(lead + tau.shape[1:])


def forward_dynamics(model: Model, q: torch.Tensor, qd: torch.Tensor, tau: torch.Tensor | None = None) -> torch.Tensor:
    """Accelerations ``qdd = M^-1 (tau - c(q, qd))`` of the unconstrained tree (no contact, limits, damping).

    Args:
        q: ``[..., nq]``; qd: ``[..., nv]``; tau: ``[..., nv]`` generalized forces (zero when omitted).
    Returns:
        ``[..., nv]``.
    """
    q2, lead = flat_batch(model, q, model.nq, "q")
    qd2, _ = flat_batch(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    inertia = spatial_inertias(model, fr)
    rhs = -rnea(model, fr, inertia, qd2, None)
    if tau is not None:
        rhs = rhs + flat_batch(model, tau, model.nv, "tau")[0]
    m = _mass_matrix(model, fr, inertia)
    qdd = torch.cholesky_solve(rhs[..., None], torch.linalg.cholesky(m))[..., 0]
    return qdd.reshape(lead + qdd.shape[1:])


def kinetic_energy(model: Model, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """``[...]`` J: summed link kinetic energy plus joint-inertia energy ``1/2 armature qd^2``."""
    q2, lead = flat_batch(model, q, model.nq, "q")
    qd2, _ = flat_batch(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    vel = body_twists(model, fr.motion, qd2.t().contiguous())
    e = 0.5 * (rows(vel) * rows(apply_inertia(spatial_inertias(model, fr), vel))).sum((-1, -2))
    e = e + 0.5 * (model.dof_armature * qd2 * qd2).sum(-1)
    return e.reshape(lead)


def potential_energy(model: Model, q: torch.Tensor) -> torch.Tensor:
    """``[...]`` J: gravitational potential energy ``-sum_b m_b g . c_b`` (world origin at zero)."""
    q2, lead = flat_batch(model, q, model.nq, "q")
    fr = compute_frames(model, q2)
    c = tuple(x + o for x, o in zip(_body_com(model, fr), fr.origin))
    sc = model.step_cache
    mg = sc.body_mass_c * sc.body_gravity_c
    e = -(mg * (c[0] * sc.gravity_t[0] + c[1] * sc.gravity_t[1] + c[2] * sc.gravity_t[2])).sum(0)
    return e.reshape(lead)


def momentum(model: Model, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """``[..., 6]``: total (angular momentum about the world origin, linear momentum), world axes,
    kg m^2/s and kg m/s (joint inertia not included: it models rotors, not link motion)."""
    q2, lead = flat_batch(model, q, model.nq, "q")
    qd2, _ = flat_batch(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    vel = body_twists(model, fr.motion, qd2.t().contiguous())
    h = rows(apply_inertia(spatial_inertias(model, fr), vel)).sum(1)  # about the reference origin
    o = rows(fr.origin)[:, 0]
    ang = h[:, :3] + torch.linalg.cross(o, h[:, 3:])
    return torch.cat([ang, h[:, 3:]], dim=-1).reshape(lead + (6,))
