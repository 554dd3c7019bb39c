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


def point_wrenches(offset: Comps, force: Comps, out: Comps) -> None:
    """Write the spatial forces of point forces (3 x ``[C, W]``) at ``offset`` into ``out`` (6 x ``[C, W]``
    views: moment about the reference origin ``r x f``, then the force; ``force`` may alias ``out[3:]``)."""
    rx, ry, rz = offset
    fx, fy, fz = force
    torch.mul(ry, fz, out=out[0]).addcmul_(rz, fy, value=-1.0)
    torch.mul(rz, fx, out=out[1]).addcmul_(rx, fz, value=-1.0)
    torch.mul(rx, fy, out=out[2]).addcmul_(ry, fx, value=-1.0)
    for o, f in zip(out[3:], force):
        if o.data_ptr() != f.data_ptr():
            o.copy_(f)


def point_stiffness_rows(offset: Comps, neg_yz: Comps, k_tangent: torch.Tensor, k_normal: torch.Tensor, out: Comps):
    """Write the 16 stiffness features of every point stiffness ``diag(k_t, k_t, k_n)`` (world axes, ``[C, W]``
    each) at ``offset`` (3 x ``[C, W]``) into ``out`` (16 x ``[C, W]`` views): ten numbers of the point "mass"
    ``k_t`` (spatial-inertia form) then six moments of ``d = k_n - k_t`` (``d, d r_x, d r_y, d r_x^2,
    d r_x r_y, d r_y^2``); ``neg_yz``: ``(-r_y, -r_z)``. They add up over the points of a body; apply the
    sums with :func:`apply_point_stiffness`."""
    rx, ry, rz = offset
    nry, nrz = neg_yz
    kt = k_tangent
    out[0].copy_(kt)
    kx, ky, kz = torch.mul(kt, rx, out=out[1]), torch.mul(kt, ry, out=out[2]), torch.mul(kt, rz, out=out[3])
    pxx, pyy, pzz = kx * rx, ky * ry, kz * rz
    torch.add(pyy, pzz, out=out[4])
    torch.add(pxx, pzz, out=out[5])
    torch.add(pxx, pyy, out=out[6])
    torch.mul(kx, nry, out=out[7])
    torch.mul(kx, nrz, out=out[8])
    torch.mul(ky, nrz, out=out[9])
    dk = torch.sub(k_normal, kt, out=out[10])
    dx, dy = torch.mul(dk, rx, out=out[11]), torch.mul(dk, ry, out=out[12])
    torch.mul(dx, rx, out=out[13])
    torch.mul(dx, ry, out=out[14])
    torch.mul(dy, ry, out=out[15])


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
