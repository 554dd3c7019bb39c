"""Ground contact of the collision geoms: contact-point kinematics and the mapping of point forces and
point stiffnesses to the tree.

Every supported geom is a set of contact spheres fixed to its link (sphere: its centre; capsule: its two
end spheres, which is exact against a plane; box: its 8 corners; cylinder: 8 points on each rim). A
sphere of radius ``r`` centred at height ``z`` penetrates the ground ``z = ground_height`` by
``depth = r - (z - ground_height)``; its contact point is its lowest point. Slots are padded per contact
body (``Model.contact_valid`` is 0 on padding), so shapes never change.

Point forces and point stiffnesses enter the tree like point masses do: a force ``f`` at ``r`` (relative
to the reference origin) is the spatial force ``(r x f, f)`` on its body; a 3x3 stiffness ``K`` at ``r``
is the 6x6 matrix ``P^T K P`` with ``P = [-[r]x, I]``, summed per body and assembled by the composite
rigid body product, which is far cheaper than forming contact Jacobians.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dynamics import _cross
from .kinematics import Frames
from .model import Model

__all__ = [
    "ContactGeometry",
    "contact_geometry",
    "point_velocities",
    "point_forces_to_bodies",
    "point_stiffness_to_bodies",
    "contact_force_per_body",
]


@dataclass(frozen=True, eq=False)
class ContactGeometry:
    """Contact points of ``W`` worlds at one configuration.

    Attributes:
        position: ``[W, C, 3]`` m, world position of each contact point (lowest point of its sphere).
        offset: ``[W, C, 3]`` m, the same relative to the reference origin (root origin).
        depth: ``[W, C]`` m, penetration into the ground (positive inside, 0 weight on padding slots).
    """

    position: torch.Tensor
    offset: torch.Tensor
    depth: torch.Tensor


def contact_geometry(model: Model, fr: Frames) -> ContactGeometry:
    """Contact points of every slot at the configuration of ``fr``."""
    w = fr.body_pos.shape[0]
    cb = model.contact_body
    rot = fr.body_rot[:, cb]  # [W, Bc, 3, 3]
    centre = (
        fr.body_pos[:, cb, None] + torch.matmul(rot[:, :, None], model.contact_point_local[None, ..., None])[..., 0]
    )
    centre = centre.reshape(w, -1, 3)
    radius = model.contact_radius.reshape(-1)
    lowest = centre - torch.stack([torch.zeros_like(radius), torch.zeros_like(radius), radius], -1)
    depth = radius - (centre[..., 2] - model.contact.ground_height)
    return ContactGeometry(position=lowest, offset=lowest - fr.origin[:, None], depth=depth)


def point_velocities(model: Model, twists: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``[W, C, 3]`` m/s: velocity of each contact point given body twists ``[W, B, 6]`` (angular, velocity
    at the reference origin) and point offsets ``[W, C, 3]``."""
    tw = twists[:, model.contact_point_body]
    return tw[..., 3:] + _cross(tw[..., :3], offset)


def _to_bodies(model: Model, per_slot: torch.Tensor) -> torch.Tensor:
    """Sum ``[W, C, ...]`` over the slots of each contact body and place it in ``[W, B, ...]``."""
    w = per_slot.shape[0]
    nc, width = model.contact_valid.shape
    rest = per_slot.shape[2:]
    per_cbody = per_slot.reshape((w, nc, width) + rest).sum(2)
    out = torch.zeros((w, model.num_bodies) + rest, dtype=per_slot.dtype, device=per_slot.device)
    return out.index_copy(1, model.contact_body, per_cbody)


def point_forces_to_bodies(model: Model, offset: torch.Tensor, force: torch.Tensor) -> torch.Tensor:
    """``[W, B, 6]`` spatial body forces (moment about the reference origin, force) of point forces
    ``force [W, C, 3]`` applied at ``offset [W, C, 3]``."""
    return _to_bodies(model, torch.cat([_cross(offset, force), force], dim=-1))


def point_stiffness_to_bodies(model: Model, offset: torch.Tensor, stiffness: torch.Tensor) -> torch.Tensor:
    """``[W, B, 6, 6]``: ``sum_points P^T diag(k) P`` per body for diagonal world-axis point stiffnesses
    ``stiffness [W, C, 3]`` (rows of ``P``: ``(r x e_i, e_i)``)."""
    w, c = offset.shape[:2]
    rx, ry, rz = offset.unbind(-1)
    z = torch.zeros_like(rx)
    o = torch.ones_like(rx)
    rows = torch.stack(
        [
            torch.stack([z, rz, -ry, o, z, z], -1),
            torch.stack([-rz, z, rx, z, o, z], -1),
            torch.stack([ry, -rx, z, z, z, o], -1),
        ],
        -2,
    )  # [W, C, 3, 6]
    nc, width = model.contact_valid.shape
    rows = rows.reshape(w, nc, width * 3, 6)
    weighted = rows * stiffness.reshape(w, nc, width * 3, 1)
    per_cbody = torch.matmul(weighted.transpose(-1, -2), rows)  # [W, Bc, 6, 6]
    out = torch.zeros((w, model.num_bodies, 6, 6), dtype=offset.dtype, device=offset.device)
    return out.index_copy(1, model.contact_body, per_cbody)


def contact_force_per_body(model: Model, force: torch.Tensor) -> torch.Tensor:
    """``[W, B, 3]`` N: total contact force on each link from per-point forces ``[W, C, 3]`` (world)."""
    return _to_bodies(model, force)
