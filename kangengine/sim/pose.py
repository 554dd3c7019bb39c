"""The pose controller's Cartesian part: link position and rotation targets as implicit PD rows of the step.

A :class:`PoseTargets` passed as ``Control(pose_targets=...)`` adds, per targeted link, three position rows
``p(q) - p_target`` (world axes, a point fixed in the link) and/or three rotation rows
``rotvec(R(q) R_target^T)`` (world axes) to the step's incremental potential, each a spring ``k`` and a damper
``c`` on its rate (``J v``: the point's velocity, the link's angular velocity), linearised over the step like
the cycle joints (:mod:`kangengine.sim.constraints`). With joint-space targets in the same ``Control``
(``q_target``, the PD drives) the controller is hybrid: both are terms of one Newton solve, so a stiff
Cartesian target never makes the step explicit. The force on the link is ``-(k e + c J v)`` (N, or N m for
the rotation rows), the generalized force ``J^T`` times it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import rotations as R
from ..errors import ShapeError, UnknownNameError
from .constraints import ConstraintRows, point_jacobians

__all__ = ["PoseTargets"]


@dataclass(frozen=True, eq=False)
class PoseTargets:
    """Cartesian targets of ``T`` links for ``W`` worlds (build with :meth:`from_names`).

    Attributes:
        link_index: ``[T]`` long, the targeted links (body indices).
        point_local: ``[T, 3]`` m, the point of each link brought to its position target (link frame).
        position_world: ``[W, T, 3]`` m, world targets of those points, or ``None`` (rotation only).
        rotation_wxyz: ``[W, T, 4]`` WXYZ ``world_from_link`` targets, or ``None`` (position only).
        position_stiffness, position_damping: N/m, N s/m.
        rotation_stiffness, rotation_damping: N m/rad, N m s/rad.
    """

    link_index: torch.Tensor
    point_local: torch.Tensor
    position_world: torch.Tensor | None = None
    rotation_wxyz: torch.Tensor | None = None
    position_stiffness: float = 2000.0
    position_damping: float = 50.0
    rotation_stiffness: float = 50.0
    rotation_damping: float = 2.0

    @classmethod
    def from_names(
        cls,
        model,
        links: Sequence[str],
        *,
        position_world: torch.Tensor | None = None,
        rotation_wxyz: torch.Tensor | None = None,
        point_local: torch.Tensor | None = None,
        position_stiffness: float = 2000.0,
        position_damping: float = 50.0,
        rotation_stiffness: float = 50.0,
        rotation_damping: float = 2.0,
    ) -> PoseTargets:
        """Targets for the links named ``links`` of ``model`` (tensors in the model's dtype and device).

        Raises:
            UnknownNameError: a link name is not a body of the model (the bodies are listed).
            ShapeError: a target has the wrong shape, or neither target is given.
        """
        names = model.body_names
        idx = []
        for name in links:
            if name not in names:
                raise UnknownNameError(
                    f"no link {name!r}; links are: {', '.join(names)}", path=model.layout.source, item="pose target"
                )
            idx.append(names.index(name))
        if point_local is None:
            point_local = torch.zeros(len(idx), 3, dtype=model.dtype, device=model.device)
        out = cls(
            link_index=torch.as_tensor(idx, dtype=torch.long, device=model.device),
            point_local=point_local,
            position_world=position_world,
            rotation_wxyz=rotation_wxyz,
            position_stiffness=float(position_stiffness),
            position_damping=float(position_damping),
            rotation_stiffness=float(rotation_stiffness),
            rotation_damping=float(rotation_damping),
        )
        given = position_world if position_world is not None else rotation_wxyz
        out.check(model, given.shape[0] if isinstance(given, torch.Tensor) else 0)
        return out

    def check(self, model, num_worlds: int) -> None:
        """Raise :class:`ShapeError` naming the field unless the targets fit ``num_worlds`` worlds."""
        t = int(self.link_index.numel())
        if self.position_world is None and self.rotation_wxyz is None:
            raise ShapeError("give position_world, rotation_wxyz or both", path=model.layout.source, item="pose target")
        for name, x, shape in (
            ("point_local", self.point_local, (t, 3)),
            ("position_world", self.position_world, (num_worlds, t, 3)),
            ("rotation_wxyz", self.rotation_wxyz, (num_worlds, t, 4)),
        ):
            if x is None:
                continue
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape:
                got = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
                raise ShapeError(
                    f"expected a torch tensor {list(shape)}, got {got}", path=model.layout.source, item=f"pose.{name}"
                )
            if x.dtype != model.dtype or x.device != model.device:
                raise ShapeError(
                    f"expected {model.dtype} on {model.device}, got {x.dtype} on {x.device}",
                    path=model.layout.source,
                    item=f"pose.{name}",
                )

    def rows_at(self, model, frames) -> ConstraintRows:
        """The controller's rows at the step's frames: values ``[6T or 3T, W]``, Jacobians ``[W, ., nv]``."""
        w = frames.motion_stack.shape[-1]
        parts = []
        if self.position_world is not None:
            pos, jac = point_jacobians(model, frames, self.link_index, self.point_local)
            err = (pos - self.position_world).reshape(w, -1).t()
            parts.append(
                ConstraintRows.springs(
                    err, jac.reshape(w, -1, model.nv), self.position_stiffness, self.position_damping
                )
            )
        if self.rotation_wxyz is not None:
            quat = frames.body_quat[:, self.link_index]  # [W, T, 4] world_from_link
            err = R.quat_to_rotvec(R.quat_multiply(quat, R.quat_conjugate(self.rotation_wxyz)))  # world axes
            ang = frames.motion_rows[..., :3]  # [W, nv, 3]
            mask = model.dof_moves_body[self.link_index][None, :, :, None]  # [1, T, nv, 1]
            jac = (ang[:, None] * mask).transpose(-1, -2)  # [W, T, 3, nv]
            parts.append(
                ConstraintRows.springs(
                    err.reshape(w, -1).t(), jac.reshape(w, -1, model.nv), self.rotation_stiffness, self.rotation_damping
                )
            )
        return parts[0].concat(parts[1]) if len(parts) == 2 else parts[0]
