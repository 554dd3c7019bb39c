"""Rigid-body dynamics of a :class:`~kangengine.sim.Model`, batched over worlds: mass matrix (composite
rigid body algorithm), bias forces and inverse dynamics (recursive Newton-Euler), energies, momentum.

Spatial algebra in world axes about the reference point (the root origin at this instant): motion
vectors ``(angular, linear)``, force vectors ``(moment, force)``. The recursions over the tree are written
with the model's tree masks (``dof_moves_body``, ``subtree``, ``dof_frame``) as batched matrix products,
so there is no Python loop over bodies or worlds here: forward passes (velocities, accelerations) sum the
contributions of every ancestor DOF, backward passes (composite inertias, forces) sum over subtrees.

Velocities ``qd`` and accelerations ``qdd`` use the canonical convention (free root: origin velocity and
angular velocity in world; ball: angular velocity in the parent frame); generalized forces are the duals
(free root: world force at the root origin, world torque about it; ball: torque in the parent frame).
"""

from __future__ import annotations

import torch

from .kinematics import Frames, _flat, body_twists, compute_frames
from .model import Model

__all__ = [
    "mass_matrix",
    "bias_forces",
    "inverse_dynamics",
    "forward_dynamics",
    "kinetic_energy",
    "potential_energy",
    "momentum",
    "spatial_inertias",
    "apply_inertia",
    "composite_rigid_body",
    "joint_space_product",
    "generalized_forces",
]


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ax, ay, az = a.unbind(-1)
    bx, by, bz = b.unbind(-1)
    return torch.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx], dim=-1)


def cross_motion(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spatial cross product of motion vectors ``a x b`` (``[..., 6]`` each)."""
    wa, va = a[..., :3], a[..., 3:]
    wb, vb = b[..., :3], b[..., 3:]
    return torch.cat([_cross(wa, wb), _cross(wa, vb) + _cross(va, wb)], dim=-1)


def cross_force(v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Spatial cross product of a motion vector with a force vector ``v x* f`` (``[..., 6]`` each)."""
    w, lin = v[..., :3], v[..., 3:]
    n, force = f[..., :3], f[..., 3:]
    return torch.cat([_cross(w, n) + _cross(lin, force), _cross(w, force)], dim=-1)


def body_com_world(model: Model, fr: Frames) -> torch.Tensor:
    """``[W, B, 3]`` m: body centres of mass relative to the reference origin, world axes."""
    return fr.body_pos - fr.origin[:, None] + torch.matmul(fr.body_rot, model.body_com[..., None])[..., 0]


def spatial_inertias(model: Model, fr: Frames) -> torch.Tensor:
    """``[W, B, 10]`` spatial inertia of every body about the reference origin, world axes, as its ten
    numbers ``(m, m c_x, m c_y, m c_z, I_xx, I_yy, I_zz, I_xy, I_xz, I_yz)`` (``c``: centre of mass relative
    to the origin; ``I``: rotational inertia about the origin). Sums of these are the inertias of unions of
    bodies, which is what the composite rigid body algorithm needs; :func:`apply_inertia` multiplies."""
    m = model.body_mass[None, :, None]
    c = body_com_world(model, fr)
    ic = fr.body_rot @ model.body_inertia @ fr.body_rot.transpose(-1, -2)
    cx, cy, cz = c.unbind(-1)
    mc = m[..., 0]
    cc = cx * cx + cy * cy + cz * cz
    return torch.stack(
        [
            mc.expand_as(cx),
            mc * cx,
            mc * cy,
            mc * cz,
            ic[..., 0, 0] + mc * (cc - cx * cx),
            ic[..., 1, 1] + mc * (cc - cy * cy),
            ic[..., 2, 2] + mc * (cc - cz * cz),
            ic[..., 0, 1] - mc * cx * cy,
            ic[..., 0, 2] - mc * cx * cz,
            ic[..., 1, 2] - mc * cy * cz,
        ],
        dim=-1,
    )


def apply_inertia(feat: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
    """Spatial inertia (ten numbers, :func:`spatial_inertias`) times motion vectors: the momentum / force
    ``(I w + h x v, m v + w x h)`` with ``h = m c``. Shapes ``[..., 10]`` and ``[..., 6]`` -> ``[..., 6]``."""
    m, hx, hy, hz, ixx, iyy, izz, ixy, ixz, iyz = feat.unbind(-1)
    wx, wy, wz, vx, vy, vz = motion.unbind(-1)
    return torch.stack(
        [
            ixx * wx + ixy * wy + ixz * wz + hy * vz - hz * vy,
            ixy * wx + iyy * wy + iyz * wz + hz * vx - hx * vz,
            ixz * wx + iyz * wy + izz * wz + hx * vy - hy * vx,
            m * vx + wy * hz - wz * hy,
            m * vy + wz * hx - wx * hz,
            m * vz + wx * hy - wy * hx,
        ],
        dim=-1,
    )


def _subtree_sum(model: Model, x: torch.Tensor) -> torch.Tensor:
    """Sum ``x [W, B, ...]`` over each body's subtree."""
    shape = x.shape
    return torch.matmul(model.subtree, x.reshape(shape[0], shape[1], -1)).reshape(shape)


def joint_space_product(model: Model, applied: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
    """The composite-rigid-body assembly ``H[i, j] = s_i . (Xc_body(j) s_j)`` for DOF pairs on one branch.

    Args:
        applied: ``[W, nv, 6]``: the subtree-composite operator of each DOF's body applied to the DOF's
            motion (``Xc_body(j) s_j``).
        motion: ``[W, nv, 6]`` DOF motions ``s``.
    Returns:
        ``[W, nv, nv]`` symmetric.
    """
    raw = torch.matmul(motion, applied.transpose(-1, -2))  # raw[i, j] = s_i . Xc(body j) s_j
    return raw * model.dof_above + (raw * model.dof_above_strict).transpose(-1, -2)


def composite_rigid_body(model: Model, inertia: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
    """``sum_b J_b^T I_b J_b`` for per-body spatial inertias ``inertia [W, B, 10]`` (composite rigid body
    algorithm: subtree sums, then one product per DOF pair on a branch). Returns ``[W, nv, nv]``."""
    xc = _subtree_sum(model, inertia)[:, model.dof_body]
    return joint_space_product(model, apply_inertia(xc, motion), motion)


def generalized_forces(model: Model, motion: torch.Tensor, body_force: torch.Tensor) -> torch.Tensor:
    """``[W, nv]``: generalized forces ``sum_b J_b^T f_b`` of spatial body forces ``[W, B, 6]`` (moment about
    the reference origin, force; world axes)."""
    sub = _subtree_sum(model, body_force)
    return (motion * sub[:, model.dof_body]).sum(-1)


def gravity_forces(model: Model, inertia: torch.Tensor) -> torch.Tensor:
    """``[W, B, 6]`` spatial gravity force on every body (switched off where ``body_gravity`` is 0)."""
    scale = model.body_gravity[:, None]
    mass = inertia[..., :1] * scale
    h = inertia[..., 1:4] * scale
    g = model.gravity.expand_as(h)
    return torch.cat([_cross(h, g), mass * g], dim=-1)


def _mass_matrix(model: Model, fr: Frames, inertia: torch.Tensor) -> torch.Tensor:
    m = composite_rigid_body(model, inertia, fr.motion)
    return m + torch.diag_embed(model.armature.expand(m.shape[0], -1))


def _rnea(
    model: Model,
    fr: Frames,
    inertia: torch.Tensor,
    qd: torch.Tensor,
    qdd: torch.Tensor | None,
    gravity: bool = True,
) -> torch.Tensor:
    s = fr.motion
    sv = s * qd[..., None]
    vel = torch.matmul(model.dof_moves_body, sv)  # [W, B, 6]
    frame_vel = torch.matmul(model.dof_frame, sv)  # [W, nv, 6]
    acc_terms = cross_motion(frame_vel, sv)
    if qdd is not None:
        acc_terms = acc_terms + s * qdd[..., None]
    acc = torch.matmul(model.dof_moves_body, acc_terms)
    f = apply_inertia(inertia, acc) + cross_force(vel, apply_inertia(inertia, vel))
    if gravity:
        f = f - gravity_forces(model, inertia)
    tau = generalized_forces(model, s, f)
    if qdd is not None:
        tau = tau + model.armature * qdd
    return tau


def mass_matrix(model: Model, q: torch.Tensor) -> torch.Tensor:
    """Joint-space inertia matrix by the composite rigid body algorithm, joint inertia (armature) added
    to the diagonal.

    Args:
        q: ``[..., nq]``, model dtype and device.
    Returns:
        ``[..., nv, nv]`` symmetric positive definite, kg m^2 / kg, canonical velocity basis.
    """
    q2, lead = _flat(model, q, model.nq, "q")
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
    q2, lead = _flat(model, q, model.nq, "q")
    qd2, _ = _flat(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    c = _rnea(model, fr, spatial_inertias(model, fr), qd2, None)
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
    q2, lead = _flat(model, q, model.nq, "q")
    qd2, _ = _flat(model, qd, model.nv, "qd")
    qdd2, _ = _flat(model, qdd, model.nv, "qdd")
    fr = compute_frames(model, q2)
    tau = _rnea(model, fr, spatial_inertias(model, fr), qd2, qdd2)
    return tau.reshape(lead + tau.shape[1:])


def forward_dynamics(model: Model, q: torch.Tensor, qd: torch.Tensor, tau: torch.Tensor | None = None) -> torch.Tensor:
    """Accelerations ``qdd = M^-1 (tau - c(q, qd))`` of the unconstrained tree (no contact, limits, damping).

    Args:
        q: ``[..., nq]``; qd: ``[..., nv]``; tau: ``[..., nv]`` generalized forces (zero when omitted).
    Returns:
        ``[..., nv]``.
    """
    q2, lead = _flat(model, q, model.nq, "q")
    qd2, _ = _flat(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    inertia = spatial_inertias(model, fr)
    rhs = -_rnea(model, fr, inertia, qd2, None)
    if tau is not None:
        rhs = rhs + _flat(model, tau, model.nv, "tau")[0]
    m = _mass_matrix(model, fr, inertia)
    qdd = torch.cholesky_solve(rhs[..., None], torch.linalg.cholesky(m))[..., 0]
    return qdd.reshape(lead + qdd.shape[1:])


def kinetic_energy(model: Model, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """``[...]`` J: summed link kinetic energy plus joint-inertia energy ``1/2 armature qd^2``."""
    q2, lead = _flat(model, q, model.nq, "q")
    qd2, _ = _flat(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    inertia = spatial_inertias(model, fr)
    vel = body_twists(model, fr.motion, qd2)
    e = 0.5 * (vel * apply_inertia(inertia, vel)).sum((-1, -2))
    e = e + 0.5 * (model.armature * qd2 * qd2).sum(-1)
    return e.reshape(lead)


def potential_energy(model: Model, q: torch.Tensor) -> torch.Tensor:
    """``[...]`` J: gravitational potential energy ``-sum_b m_b g . c_b`` (world origin at zero)."""
    q2, lead = _flat(model, q, model.nq, "q")
    fr = compute_frames(model, q2)
    c = body_com_world(model, fr) + fr.origin[:, None]
    e = -((model.body_mass * model.body_gravity)[None, :, None] * c * model.gravity).sum((-1, -2))
    return e.reshape(lead)


def momentum(model: Model, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """``[..., 6]``: total (angular momentum about the world origin, linear momentum), world axes,
    kg m^2/s and kg m/s (joint inertia not included: it models rotors, not link motion)."""
    q2, lead = _flat(model, q, model.nq, "q")
    qd2, _ = _flat(model, qd, model.nv, "qd")
    fr = compute_frames(model, q2)
    inertia = spatial_inertias(model, fr)
    vel = body_twists(model, fr.motion, qd2)
    h = apply_inertia(inertia, vel).sum(1)  # about the reference origin
    ang = h[:, :3] + _cross(fr.origin, h[:, 3:])
    out = torch.cat([ang, h[:, 3:]], dim=-1)
    return out.reshape(lead + (6,))
