"""Ground contact of the collision geoms: contact-point kinematics and the mapping of point forces and
point stiffnesses to the tree.

Every supported geom is a set of contact spheres fixed to its link (sphere: its centre; capsule: its two
end spheres, which is exact against a plane; box: its 8 corners; cylinder: 8 points on each rim). A
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

from .dynamics import _cross, apply_inertia
from .kinematics import Frames
from .model import Model

__all__ = [
    "ContactGeometry",
    "contact_geometry",
    "point_velocities",
    "point_forces_to_bodies",
    "point_stiffness_features",
    "apply_point_stiffness",
    "contact_force_per_body",
]


@dataclass(frozen=True, eq=False)
class ContactGeometry:
    """Contact points of ``W`` worlds at one configuration.

    Attributes:
        position: ``[W, C, 3]`` m, world position of each contact point (lowest point of its sphere).
        offset: ``[W, C, 3]`` m, the same relative to the reference origin (root origin).
        depth: ``[W, C]`` m, penetration into the ground (positive inside).
    """

    position: torch.Tensor
    offset: torch.Tensor
    depth: torch.Tensor


def contact_geometry(model: Model, fr: Frames) -> ContactGeometry:
    """Contact points at the configuration of ``fr``."""
    pb = model.contact_point_body
    centre = fr.body_pos[:, pb] + torch.matmul(fr.body_rot[:, pb], model.contact_point_local[..., None])[..., 0]
    radius = model.contact_radius
    lowest = torch.cat([centre[..., :2], (centre[..., 2] - radius)[..., None]], dim=-1)
    depth = model.contact.ground_height - lowest[..., 2]
    return ContactGeometry(position=lowest, offset=lowest - fr.origin[:, None], depth=depth)


def point_velocities(model: Model, twists: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``[W, C, 3]`` m/s: velocity of each contact point given body twists ``[W, B, 6]`` (angular, velocity
    at the reference origin) and point offsets ``[W, C, 3]``."""
    tw = twists[:, model.contact_point_body]
    return tw[..., 3:] + _cross(tw[..., :3], offset)


def _to_bodies(model: Model, per_point: torch.Tensor) -> torch.Tensor:
    """Sum ``[W, C, k]`` over the points of each body: ``[W, B, k]``."""
    w, _, k = per_point.shape
    out = torch.zeros((w, model.num_bodies, k), dtype=per_point.dtype, device=per_point.device)
    return out.index_add_(1, model.contact_point_body, per_point)


def point_forces_to_bodies(model: Model, offset: torch.Tensor, force: torch.Tensor) -> torch.Tensor:
    """``[W, B, 6]`` spatial body forces (moment about the reference origin, force) of point forces
    ``force [W, C, 3]`` applied at ``offset [W, C, 3]``."""
    return _to_bodies(model, torch.cat([_cross(offset, force), force], dim=-1))


def point_stiffness_features(
    model: Model, offset: torch.Tensor, k_tangent: torch.Tensor, k_normal: torch.Tensor
) -> torch.Tensor:
    """``[W, B, 16]`` per-body sums of point stiffnesses ``diag(k_t, k_t, k_n)`` (world axes) at ``offset``:
    ten numbers of the point "mass" ``k_t`` (spatial-inertia form) then six moments of ``k_n - k_t``
    (``sum d, d r_x, d r_y, d r_x^2, d r_x r_y, d r_y^2``). Apply with :func:`apply_point_stiffness`."""
    rx, ry, rz = offset.unbind(-1)
    kt = k_tangent
    dk = k_normal - k_tangent
    xx, yy, zz = rx * rx, ry * ry, rz * rz
    feats = torch.stack(
        [
            kt,
            kt * rx,
            kt * ry,
            kt * rz,
            kt * (yy + zz),
            kt * (xx + zz),
            kt * (xx + yy),
            -kt * rx * ry,
            -kt * rx * rz,
            -kt * ry * rz,
            dk,
            dk * rx,
            dk * ry,
            dk * xx,
            dk * rx * ry,
            dk * yy,
        ],
        dim=-1,
    )
    return _to_bodies(model, feats)


def apply_point_stiffness(feat: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
    """Stiffness features (``[..., 16]``, :func:`point_stiffness_features`) times motion vectors ``[..., 6]``:
    the spatial force ``sum P^T K P s``."""
    out = apply_inertia(feat[..., :10], motion)
    t0, tx, ty, txx, txy, tyy = feat[..., 10:].unbind(-1)
    a, b, z = motion[..., 0], motion[..., 1], motion[..., 5]
    pn = ty * a - tx * b + t0 * z  # sum d p (p . s) with p = (r_y, -r_x, 0, 0, 0, 1)
    m0 = tyy * a - txy * b + ty * z
    m1 = -txy * a + txx * b - tx * z
    zero = torch.zeros_like(m0)
    return out + torch.stack([m0, m1, zero, zero, zero, pn], dim=-1)


def contact_force_per_body(model: Model, force: torch.Tensor) -> torch.Tensor:
    """``[W, B, 3]`` N: total contact force on each link from per-point forces ``[W, C, 3]`` (world)."""
    return _to_bodies(model, force)
