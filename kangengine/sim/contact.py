"""Ground contact of the collision geoms: contact-point kinematics and the mapping of point forces and
point stiffnesses to the tree.

Every supported geom is a set of contact spheres fixed to its link (sphere: its centre; capsule: its two
end spheres, which is exact against a plane; box: its 8 corners; cylinder: 8 points on each rim;
ellipsoid: its 6 axis ends and 8 diagonal surface points, approximate). A
sphere of radius ``r`` centred at height ``z`` penetrates the ground ``z = ground_height`` by
``depth = r - (z - ground_height)``; its contact point is its lowest point. The number of points ``C`` is
fixed per model, so shapes never change.

Point forces and point stiffnesses enter the tree like point masses do: a force ``f`` at ``r`` (relative
to the reference origin) is the spatial force ``(r x f, f)`` on its body; a diagonal world-axis stiffness
``diag(k_t, k_t, k_n)`` at ``r`` is the 6x6 matrix ``P^T K P`` with ``P = [-[r]x, I]``, which is a point
"mass" ``k_t`` (a spatial inertia) plus a rank-one normal part. Both are summed per body and assembled by
the composite rigid body product, much cheaper than forming contact Jacobians.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dynamics import apply_inertia
from .kinematics import Comps, Frames, cross, gather, rotate, rows, scatter_sum
from .model import Model

__all__ = [
    "ContactGeometry",
    "contact_geometry",
    "contact_force_per_body",
    "point_velocities",
    "point_wrenches",
    "point_stiffness_rows",
    "apply_point_stiffness",
    "SelfContactRows",
    "self_contact_rows",
    "closest_segment_points",
]


@dataclass(frozen=True, eq=False)
class ContactGeometry:
    """Contact points of ``W`` worlds at one configuration.

    Attributes:
        position: 3 x ``[C, W]`` m, world position of each contact point (lowest point of its sphere).
        offset: 3 x ``[C, W]`` m, the same relative to the reference origin (root origin).
        depth: ``[C, W]`` m, penetration into the ground (positive inside).
    """

    position: Comps
    offset: Comps
    depth: torch.Tensor


def contact_geometry(model: Model, fr: Frames) -> ContactGeometry:
    """Contact points at the configuration of ``fr``."""
    pts = gather(fr.body_pos + fr.body_rot, model.contact_point_body)
    local = model.step_cache.contact_point_local_t
    cx, cy, cz = (p + r for p, r in zip(pts[:3], rotate(pts[3:], local)))
    lz = cz - model.step_cache.contact_radius_c
    pos = (cx, cy, lz)
    offset = tuple(p - o for p, o in zip(pos, fr.origin))
    return ContactGeometry(position=pos, offset=offset, depth=model.contact.ground_height - lz)


def point_velocities(model: Model, twists: Comps | torch.Tensor, offset: Comps) -> Comps:
    """3 x ``[C, W]`` m/s: velocity of each contact point given body twists (6 x ``[B, W]``, or stacked
    ``[B, 6, W]``: angular, velocity at the reference origin) and point offsets (3 x ``[C, W]``)."""
    if isinstance(twists, torch.Tensor):
        tw = twists.index_select(0, model.contact_point_body).unbind(1)
    else:
        tw = gather(twists, model.contact_point_body)
    return tuple(v + c for v, c in zip(tw[3:], cross(tw[:3], offset)))


def point_wrenches(offset: Comps, force: Comps) -> Comps:
    """6 x ``[C, W]``: the spatial forces of point forces (3 x ``[C, W]``) at ``offset`` (moment about the
    reference origin ``r x f``, then the force)."""
    rx, ry, rz = offset
    fx, fy, fz = force
    return (ry * fz - rz * fy, rz * fx - rx * fz, rx * fy - ry * fx, fx, fy, fz)


def point_stiffness_rows(offset: Comps, neg_yz: Comps, k_tangent: torch.Tensor, k_normal: torch.Tensor) -> Comps:
    """16 x ``[C, W]``: the stiffness features of every point stiffness ``diag(k_t, k_t, k_n)`` (world axes,
    ``[C, W]`` each) at ``offset`` (3 x ``[C, W]``): ten numbers of the point "mass" ``k_t`` (spatial-inertia
    form) then six moments of ``d = k_n - k_t`` (``d, d r_x, d r_y, d r_x^2, d r_x r_y, d r_y^2``);
    ``neg_yz``: ``(-r_y, -r_z)``. They add up over the points of a body; apply the sums with
    :func:`apply_point_stiffness`. (Plain results, no ``out=`` views, so ``torch.compile`` traces it whole.)"""
    rx, ry, rz = offset
    nry, nrz = neg_yz
    kt = k_tangent
    kx, ky, kz = kt * rx, kt * ry, kt * rz
    pxx, pyy, pzz = kx * rx, ky * ry, kz * rz
    dk = k_normal - kt
    dx, dy = dk * rx, dk * ry
    return (
        kt,
        kx,
        ky,
        kz,
        pyy + pzz,
        pxx + pzz,
        pxx + pyy,
        kx * nry,
        kx * nrz,
        ky * nrz,
        dk,
        dx,
        dy,
        dx * rx,
        dx * ry,
        dy * ry,
    )


def apply_point_stiffness(feat: Comps, motion: Comps) -> Comps:
    """Stiffness features (16 components, :func:`point_stiffness_rows`, summed over points) times motion
    vectors (six): the spatial force ``sum P^T K P s``."""
    m0, m1, m2, f0, f1, f2 = apply_inertia(feat[:10], motion)
    t0, tx, ty, txx, txy, tyy = feat[10:]
    a, b, z = motion[0], motion[1], motion[5]
    pn = ty * a - tx * b + t0 * z  # sum d p (p . s) with p = (r_y, -r_x, 0, 0, 0, 1)
    return (m0 + tyy * a - txy * b + ty * z, m1 - txy * a + txx * b - tx * z, m2, f0, f1, f2 + pn)


def contact_force_per_body(model: Model, force: torch.Tensor) -> torch.Tensor:
    """``[W, B, 3]`` N: total contact force on each link from per-point forces ``[W, C, 3]`` (world), e.g.
    ``torch.cat([result.contact_friction_force, result.contact_normal_force[..., None]], -1)``."""
    comps = force.permute(2, 1, 0).contiguous().unbind(0)
    return rows(scatter_sum(comps, model.contact_point_body, model.num_bodies))


@dataclass(frozen=True, eq=False)
class SelfContactRows:
    """Link-to-link contact pairs of ``W`` worlds at one configuration (``P`` pairs,
    ``Model.self_pair_geom``), linearised like the ground contact: the separation of pair ``p`` after a
    step with velocities ``v`` is ``-depth[p] + h direction[p] . v``.

    Attributes:
        direction: ``[P, nv, W]`` the generalized direction ``(J_a - J_b)^T n`` of each pair (``J``: point
            Jacobians of the two links at the contact point; ``n``: unit normal from the second geom to
            the first), so ``direction . v`` is the separation speed, m/s.
        depth: ``[P, W]`` m, penetration at the start of the step (``r_a + r_b - distance`` of the two
            segments; negative: apart).
        position: 3 x ``[P, W]`` m, contact point (world): midway between the two surfaces.
        normal: 3 x ``[P, W]`` unit normal, from the second geom towards the first (world).
    """

    direction: torch.Tensor
    depth: torch.Tensor
    position: Comps
    normal: Comps


def _dot(a: Comps, b: Comps) -> torch.Tensor:
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def closest_segment_points(p1: Comps, d1: Comps, p2: Comps, d2: Comps) -> tuple[torch.Tensor, torch.Tensor]:
    """Parameters ``(s, t)`` in ``[0, 1]`` (``[n, W]`` each) of the closest points ``p1 + s d1`` and ``p2 + t d2``
    of two segments (3 x ``[n, W]`` start points and direction vectors; a zero direction is a point). The
    clamped solution of Ericson, *Real-Time Collision Detection* 5.1.9, branch-free."""
    eps = 1e-12
    r = tuple(a - b for a, b in zip(p1, p2))
    a, e, f = _dot(d1, d1), _dot(d2, d2), _dot(d2, r)
    c, b = _dot(d1, r), _dot(d1, d2)
    a_safe, e_safe = torch.clamp(a, min=eps), torch.clamp(e, min=eps)
    den = a * e - b * b
    s = torch.where(den > eps * a_safe * e_safe, torch.clamp((b * f - c * e) / torch.clamp(den, min=1e-30), 0, 1), 0)
    t = (b * s + f) / e_safe
    s = torch.where(t < 0, torch.clamp(-c / a_safe, 0, 1), torch.where(t > 1, torch.clamp((b - c) / a_safe, 0, 1), s))
    t = torch.clamp(t, 0, 1)
    point1, point2 = a <= eps, e <= eps
    s = torch.where(point1, 0.0, torch.where(point2, torch.clamp(-c / a_safe, 0, 1), s))
    t = torch.where(point2, 0.0, torch.where(point1, torch.clamp(f / e_safe, 0, 1), t))
    return s, t


def self_contact_rows(model: Model, fr: Frames, pair_sign: torch.Tensor) -> SelfContactRows:
    """The :class:`SelfContactRows` of ``model``'s pairs at the configuration of ``fr``; ``pair_sign``:
    ``[P, nv]``, ``dof_moves_body`` of the first link less that of the second."""
    sc = model.step_cache
    pose = gather(fr.body_pos + fr.body_rot, model.self_geom_body)
    centre = tuple(p + c for p, c in zip(pose[:3], rotate(pose[3:], sc.self_geom_center_t)))
    axis = rotate(pose[3:], sc.self_geom_axis_t)
    start = tuple(c - x for c, x in zip(centre, axis))
    seg = gather(start + tuple(2.0 * x for x in axis), model.self_pair_geom[:, 0])
    seg2 = gather(start + tuple(2.0 * x for x in axis), model.self_pair_geom[:, 1])
    s, t = closest_segment_points(seg[:3], seg[3:], seg2[:3], seg2[3:])
    q1 = tuple(p + s * d for p, d in zip(seg[:3], seg[3:]))
    q2 = tuple(p + t * d for p, d in zip(seg2[:3], seg2[3:]))
    diff = tuple(a - b for a, b in zip(q1, q2))
    dist = torch.sqrt(_dot(diff, diff))
    apart = dist > 1e-9  # coincident axes: push along world z (any direction is a normal)
    safe = torch.where(apart, dist, 1.0)
    normal = (
        torch.where(apart, diff[0] / safe, 0.0),
        torch.where(apart, diff[1] / safe, 0.0),
        torch.where(apart, diff[2] / safe, 1.0),
    )
    r1 = sc.self_geom_radius_c.index_select(0, model.self_pair_geom[:, 0])
    r2 = sc.self_geom_radius_c.index_select(0, model.self_pair_geom[:, 1])
    depth = r1 + r2 - dist
    position = tuple(0.5 * (a + b) + 0.5 * (r2 - r1) * n for a, b, n in zip(q1, q2, normal))
    offset = tuple(p - o for p, o in zip(position, fr.origin))
    wrench = torch.stack(cross(offset, normal) + normal, dim=1)  # [P, 6, W] unit force n at the point
    direction = torch.einsum("jkw,pkw->pjw", fr.motion_stack, wrench) * pair_sign[:, :, None]
    return SelfContactRows(direction=direction, depth=depth, position=position, normal=normal)
