"""Whole-body tracking control: the joint torques and ground forces that realise desired accelerations.

One step of :func:`whole_body_control`, batched over ``W`` worlds (no Python loop over worlds, fixed
iteration counts, no host-device synchronisation):

1. Desired accelerations ``qdd_des [W, nv]`` for *every* DOF, the unactuated free root included (the
   caller forms them as ``qdd_ref + Kp (q_ref (-) q) + Kd (qd_ref - qd)``; the root's pose feedback is
   what keeps the body balanced).
2. The accelerations ``qdd`` closest to them in the weighted norm ``|qdd - qdd_des|^2_Wq`` subject to
   equality rows: the six root rows of ``M qdd + h = S^T tau + J_c^T f`` (no actuator there:
   ``M_root qdd + h_root = G lambda`` with ``f = D lambda``, ``lambda >= 0`` the coefficients of the edges of
   a linearised four-sided friction pyramid per contact point) and the stance bodies' twists brought to
   rest (``J_b qdd = -J_b qd / stance_time``: a body the reference stands on that touches the ground does
   not slip or roll). For a fixed ``lambda`` the best ``qdd`` is a linear least-squares solution;
   substituting it leaves ``min |[G; 0] lambda - w|^2_{S^-1} + eps |lambda|^2`` with ``S = A H^-1 A^T``
   (``A`` the equality rows, ``H = Wq``) and ``w`` what the rows need from the ground at the unconstrained
   optimum. That non-negative least squares is solved by a fixed number of accelerated projected-gradient
   (FISTA) iterations.
3. The joint torques of that plan: ``tau = M qdd + h - J_c^T f`` (root rows zero by construction).

The torques are applied by the caller as the drive's feed-forward inside the implicit step (see
:func:`kangengine.sim.track`), with the implicit PD drives as a damping layer around the planned next
state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import rotations as R
from .dynamics import inverse_dynamics, mass_matrix
from .kinematics import link_jacobians, link_transforms
from .model import Model

__all__ = ["WholeBodyCommand", "whole_body_control", "contact_points", "point_generalized_forces"]


@dataclass(frozen=True, eq=False)
class WholeBodyCommand:
    """What :func:`whole_body_control` plans for ``W`` worlds (``k`` contact points considered per world).

    Attributes:
        tau: ``[W, nv]`` N m (N for slides), joint torques; root rows 0.
        qdd: ``[W, nv]`` planned generalized accelerations (canonical tangent convention).
        contact_force: ``[W, k, 3]`` N, planned ground force on each considered point (world axes; zero
            on points not allowed or not near the ground).
        contact_index: ``[W, k]`` int64, the contact point (``model.contact_point_body`` slot) of each.
        root_wrench_residual: ``[W, 6]`` N and N m, the part of the root wrench of the unconstrained
            optimum (``qdd`` without the root rows) that the contacts cannot supply: how far the wish was
            from what the ground allows.
    """

    tau: torch.Tensor
    qdd: torch.Tensor
    contact_force: torch.Tensor
    contact_index: torch.Tensor
    root_wrench_residual: torch.Tensor


def contact_points(model: Model, pos: torch.Tensor, quat: torch.Tensor) -> torch.Tensor:
    """``[n, C, 3]`` m, world position of the lowest point of every contact sphere, from link origins
    ``pos [n, B, 3]`` and orientations ``quat [n, B, 4]`` (WXYZ)."""
    pb = model.contact_point_body
    centre = pos[:, pb] + R.quat_rotate(quat[:, pb], model.contact_point_local.expand(pos.shape[0], -1, -1))
    r = model.contact_radius
    return centre - torch.stack([torch.zeros_like(r), torch.zeros_like(r), r], -1)


def point_generalized_forces(
    jac: torch.Tensor, pos: torch.Tensor, points: torch.Tensor, body: torch.Tensor, force: torch.Tensor
) -> torch.Tensor:
    """``[n, nv]``: generalized forces ``sum_p J_p^T f_p`` of point forces ``force [n, P, 3]`` (N, world)
    applied at ``points [n, P, 3]`` (m, world) on bodies ``body [n, P]`` (int64), given the link Jacobians
    ``jac [n, B, 6, nv]`` (:func:`~kangengine.sim.link_jacobians`) and link origins ``pos [n, B, 3]``."""
    n, nb = force.shape[0], jac.shape[1]
    lever = points - torch.gather(pos, 1, body[..., None].expand(-1, -1, 3))
    wrench = torch.cat([force, torch.linalg.cross(lever, force)], dim=-1)
    per_body = torch.zeros(n, nb, 6, dtype=force.dtype, device=force.device)
    per_body.scatter_add_(1, body[..., None].expand(-1, -1, 6), wrench)
    return torch.einsum("nbiv,nbi->nv", jac, per_body)


def _pyramid(mu: torch.Tensor) -> torch.Tensor:
    """``[..., 4, 3]`` edges ``e_z + mu (cos a, sin a, 0)``, ``a = 0, 90, 180, 270`` degrees."""
    ang = torch.arange(4, dtype=mu.dtype, device=mu.device) * (math.pi / 2)
    cs = torch.stack([torch.cos(ang), torch.sin(ang), torch.zeros_like(ang)], -1)
    ez = torch.tensor([0.0, 0.0, 1.0], dtype=mu.dtype, device=mu.device)
    return ez + mu[..., None, None] * cs


def _nnls(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, iterations: int, ridge: float) -> torch.Tensor:
    """``[W, n]`` ``argmin_{x >= 0, x = 0 off mask} |a x - b|^2 + eps |x|^2`` for ``a [W, m, n]``,
    ``b [W, m]`` (FISTA with the exact Lipschitz constant; ``eps = ridge`` times it)."""
    a = a * mask[:, None, :]
    at = a.transpose(1, 2)
    lip = torch.linalg.eigvalsh(a @ at)[:, -1].clamp(min=0.0)
    eps = ridge * lip + 1e-12
    step = 1.0 / (lip + eps)
    x = torch.zeros(a.shape[0], a.shape[2], dtype=a.dtype, device=a.device)
    y, t = x, 1.0
    atb = (at @ b[..., None])[..., 0]
    ata = at @ a
    for _ in range(iterations):
        g = (ata @ y[..., None])[..., 0] - atb + eps[:, None] * y
        new = torch.clamp(y - step[:, None] * g, min=0.0)
        t1 = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
        y = new + ((t - 1.0) / t1) * (new - x)
        x, t = new, t1
    return x


def whole_body_control(
    model: Model,
    q: torch.Tensor,
    qd: torch.Tensor,
    qdd_des: torch.Tensor,
    point_allowed: torch.Tensor,
    stance_body: torch.Tensor,
    stance_candidates: torch.Tensor,
    *,
    dof_weight: torch.Tensor,
    stance_time: float,
    friction: torch.Tensor,
    contact_height: float,
    max_points: int,
    iterations: int,
    ridge: float = 1e-3,
) -> WholeBodyCommand:
    """Plan accelerations, ground forces and joint torques for a floating-base model (see the module
    docstring).

    Args:
        model: :class:`~kangengine.sim.Model` with a free root.
        q: ``[W, nq]``; qd: ``[W, nv]`` the current states.
        qdd_des: ``[W, nv]`` desired accelerations (root rows included).
        point_allowed: ``[W, C]`` bool, contact points that may carry load (e.g. on bodies the reference
            stands on).
        stance_body: ``[W, B]`` bool, bodies whose twist should come to rest while one of their contact
            points is within ``contact_height`` of the ground (the reference's stance feet).
        dof_weight: ``[nv]`` weights of ``|qdd - qdd_des|^2`` (kg m^2, kg: e.g. the inertia about each DOF).
        stance_candidates: ``[Bs]`` int64, the bodies that may be stance bodies (a fixed set: static shapes).
        stance_time: s, the stance bodies' target acceleration is ``-twist / stance_time``.
        friction: ``[C]`` Coulomb coefficients of the pyramid (a margin already applied).
        contact_height: m, a point higher than this above the ground carries no load.
        max_points: most points per world considered (the lowest allowed ones).
        iterations: FISTA iterations of the force distribution.
        ridge: relative Tikhonov term of the force distribution (spreads the load over the points).
    Returns:
        :class:`WholeBodyCommand`.
    """
    dtype = q.dtype
    w, nv = q.shape[0], model.nv
    pos, quat = link_transforms(model, q)
    jac = link_jacobians(model, q)  # [W, B, 6, nv]
    mass = mass_matrix(model, q)  # [W, nv, nv]
    bias = inverse_dynamics(model, q, qd, torch.zeros_like(qd))  # h(q, qd)
    # -- contact candidates: the lowest allowed points --------------------------------------------------------
    pts = contact_points(model, pos, quat)
    height = pts[..., 2] - model.contact.ground_height
    k = min(max_points, pts.shape[1])
    score = torch.where(point_allowed, height, torch.full_like(height, math.inf))
    neg, idx = torch.topk(-score, k, dim=1)
    active = (-neg < contact_height).to(dtype)  # [W, k] (inf: not allowed)
    low = torch.full((w, model.num_bodies), math.inf, dtype=dtype, device=q.device)
    low = low.scatter_reduce(1, model.contact_point_body.expand(w, -1), height, "amin")
    p = torch.gather(pts, 1, idx[..., None].expand(-1, -1, 3))
    edges = _pyramid(friction[idx])  # [W, k, 4, 3]
    lever = p - pos[:, :1]  # root rows: force at the root origin, torque about it
    torque = torch.linalg.cross(lever[:, :, None].expand_as(edges), edges)
    g_root = torch.cat([edges, torque], -1).reshape(w, 4 * k, 6).transpose(1, 2)  # [W, 6, 4k]
    mask = active.repeat_interleave(4, dim=1)
    # -- equality rows: the root's Newton-Euler (forces from lambda) and the stance bodies' twists -------------
    dd = torch.float64  # small dense algebra in float64: robust, and independent of the batch position
    jd, md = jac.to(dd), mass.to(dd)
    ns = int(stance_candidates.shape[0])
    on = (stance_body[:, stance_candidates] & (low[:, stance_candidates] < contact_height)).to(dd)  # [W, Bs]
    row_on = torch.cat([torch.ones(w, 6, dtype=dd, device=q.device), on.repeat_interleave(6, dim=1)], 1)
    j_s = jd[:, stance_candidates].reshape(w, 6 * ns, nv)
    a_s = -(j_s @ qd.to(dd)[..., None])[..., 0] / stance_time  # bring the stance twists to rest
    a_mat = torch.cat([md[:, :6, :], j_s], 1) * row_on[..., None]  # [W, m, nv], m = 6 + 6 Bs
    rhs0 = torch.cat([-bias.to(dd)[:, :6], a_s], 1) * row_on  # A qdd = rhs0 + [G lambda; 0]
    hess_d = dof_weight.to(dd).expand(w, nv)
    grad = hess_d * qdd_des.to(dd)
    y = a_mat.transpose(1, 2) / hess_d[..., None]  # H^-1 A^T (H diagonal)
    q0 = grad / hess_d
    s = a_mat @ y
    s = 0.5 * (s + s.transpose(1, 2))
    scale = s.diagonal(dim1=1, dim2=2).amax(-1)
    s = s + torch.diag_embed((1.0 - row_on) + 1e-9 * scale[:, None])  # rows off: a unit (unused) multiplier
    chol_s, _ = torch.linalg.cholesky_ex(s)
    miss = (a_mat @ q0[..., None])[..., 0] - rhs0  # what the rows need from the contact forces at q0
    g_full = torch.cat([g_root.to(dd), torch.zeros(w, 6 * ns, 4 * k, dtype=dd, device=q.device)], 1)
    g_hat = torch.linalg.solve_triangular(chol_s, g_full, upper=False)
    w_hat = torch.linalg.solve_triangular(chol_s, miss[..., None], upper=False)[..., 0]
    lam = _nnls(g_hat, w_hat, mask.to(dd), iterations, ridge)
    resid = (g_full @ lam[..., None])[..., 0] - miss
    qdd = q0 + (y @ torch.cholesky_solve(resid[..., None], chol_s))[..., 0]
    force = (lam.reshape(w, k, 4, 1) * edges.to(dd)).sum(2)  # [W, k, 3]
    body = model.contact_point_body[idx]
    gen = point_generalized_forces(jd, pos.to(dd), p.to(dd), body, force)
    tau = (md @ qdd[..., None])[..., 0] + bias.to(dd) - gen
    tau[:, :6] = 0.0
    return WholeBodyCommand(
        tau=tau.to(dtype),
        qdd=qdd.to(dtype),
        contact_force=force.to(dtype),
        contact_index=idx,
        root_wrench_residual=(-resid[:, :6]).to(dtype),
    )
