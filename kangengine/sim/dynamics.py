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
    "composite_rigid_body",
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


def _skew(c: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(c[..., 0])
    x, y, zz = c.unbind(-1)
    return torch.stack([torch.stack([z, -zz, y], -1), torch.stack([zz, z, -x], -1), torch.stack([-y, x, z], -1)], -2)


def body_com_world(model: Model, fr: Frames) -> torch.Tensor:
    """``[W, B, 3]`` m: body centres of mass relative to the reference origin, world axes."""
    return fr.body_pos - fr.origin[:, None] + torch.matmul(fr.body_rot, model.body_com[..., None])[..., 0]


def spatial_inertias(model: Model, fr: Frames) -> torch.Tensor:
    """``[W, B, 6, 6]`` spatial inertia of every body about the reference origin, world axes."""
    m = model.body_mass[None, :, None, None]
    c = body_com_world(model, fr)
    ic = fr.body_rot @ model.body_inertia @ fr.body_rot.transpose(-1, -2)
    cx = _skew(c)
    eye = torch.eye(3, dtype=c.dtype, device=c.device)
    top = torch.cat([ic - m * (cx @ cx), m * cx], dim=-1)
    bottom = torch.cat([-m * cx, m * eye.expand_as(ic)], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def _subtree_sum(model: Model, x: torch.Tensor) -> torch.Tensor:
    """Sum ``x [W, B, ...]`` over each body's subtree."""
    shape = x.shape
    return torch.matmul(model.subtree, x.reshape(shape[0], shape[1], -1)).reshape(shape)


def composite_rigid_body(model: Model, inertia: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
    """The composite-rigid-body product ``sum_b J_b^T X_b J_b`` for per-body 6x6 matrices ``X [W, B, 6, 6]``
    (spatial inertias for the mass matrix; any symmetric per-body stiffness works the same way).

    ``H[i, j] = s_i^T Xc(deeper of body(i), body(j)) s_j`` where ``Xc`` sums ``X`` over a subtree, for DOFs
    on one branch, else 0.

    Returns:
        ``[W, nv, nv]``.
    """
    xc = _subtree_sum(model, inertia)
    f = torch.matmul(xc[:, model.dof_body], motion[..., None])[..., 0]  # [W, nv, 6]
    raw = torch.matmul(motion, f.transpose(-1, -2))  # raw[i, j] = s_i . Xc(body j) s_j
    return torch.where(model.dof_above > 0, raw, raw.transpose(-1, -2)) * model.dof_coupled


def generalized_forces(model: Model, motion: torch.Tensor, body_force: torch.Tensor) -> torch.Tensor:
    """``[W, nv]``: generalized forces ``sum_b J_b^T f_b`` of spatial body forces ``[W, B, 6]`` (moment about
    the reference origin, force; world axes)."""
    sub = _subtree_sum(model, body_force)
    return (motion * sub[:, model.dof_body]).sum(-1)


def gravity_forces(model: Model, fr: Frames, inertia: torch.Tensor | None = None) -> torch.Tensor:
    """``[W, B, 6]`` spatial gravity force on every body (switched off where ``body_gravity`` is 0)."""
    c = body_com_world(model, fr)
    force = (model.body_mass * model.body_gravity)[None, :, None] * model.gravity
    force = force.expand_as(c)
    return torch.cat([_cross(c, force), force], dim=-1)


def _mass_matrix(model: Model, fr: Frames, inertia: torch.Tensor) -> torch.Tensor:
    m = composite_rigid_body(model, inertia, fr.motion)
    return m + torch.diag_embed(model.armature.expand(m.shape[0], -1))


def _rnea(
    model: Model, fr: Frames, inertia: torch.Tensor, qd: torch.Tensor, qdd: torch.Tensor | None, gravity: bool = True
) -> torch.Tensor:
    s = fr.motion
    sv = s * qd[..., None]
    vel = torch.matmul(model.dof_moves_body, sv)  # [W, B, 6]
    frame_vel = torch.matmul(model.dof_frame, sv)  # [W, nv, 6]
    acc_terms = cross_motion(frame_vel, sv)
    if qdd is not None:
        acc_terms = acc_terms + s * qdd[..., None]
    acc = torch.matmul(model.dof_moves_body, acc_terms)
    momentum = torch.matmul(inertia, vel[..., None])[..., 0]
    f = torch.matmul(inertia, acc[..., None])[..., 0] + cross_force(vel, momentum)
    if gravity:
        f = f - gravity_forces(model, fr)
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
    e = 0.5 * (vel * torch.matmul(inertia, vel[..., None])[..., 0]).sum((-1, -2))
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
    h = torch.matmul(inertia, vel[..., None])[..., 0].sum(1)  # about the reference origin
    ang = h[:, :3] + _cross(fr.origin, h[:, 3:])
    out = torch.cat([ang, h[:, 3:]], dim=-1)
    return out.reshape(lead + (6,))
