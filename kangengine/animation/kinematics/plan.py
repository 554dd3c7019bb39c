"""What a tree's forward kinematics is traced from: parents, rest transforms and joint steps.

A :class:`TreePlan` is plain, hashable data (tuples of Python floats): equal plans share one traced program
(:mod:`.trace`) and its compiled forms (:mod:`.replay`, :mod:`.native`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import NonFiniteError

__all__ = ["JointStep", "TreePlan", "tree_plan_from_rest", "STEP_DOFS"]

# Velocity DOFs of each joint step kind (free: 3 translational then 3 rotational).
STEP_DOFS = {"free": 6, "ball": 3, "hinge": 1, "slide": 1}


@dataclass(frozen=True)
class JointStep:
    """One joint applied inside a body's local transform.

    ``kind`` is "free", "ball", "hinge" or "slide"; ``q_offset`` its first entry in ``q``; ``axis`` and
    ``anchor`` are in the body frame; the joint's motion is ``q - ref`` (hinge, slide).
    """

    kind: str
    q_offset: int
    axis: tuple[float, float, float] = (0.0, 0.0, 1.0)
    anchor: tuple[float, float, float] = (0.0, 0.0, 0.0)
    ref: float = 0.0


@dataclass(frozen=True)
class TreePlan:
    """What the tree composition needs: parents (parent-first), rest ``parent_from_body`` transforms,
    and the joint steps of each body (empty for a skeleton, whose local rotations are given)."""

    parents: tuple[int, ...]
    rest_positions: tuple[tuple[float, float, float], ...]
    rest_rotations: tuple[tuple[float, float, float, float], ...]
    steps: tuple[tuple[JointStep, ...], ...]

    @property
    def num_bodies(self) -> int:
        return len(self.parents)


def tree_plan_from_rest(parents: Sequence[int], rest_positions, rest_rotations=None, steps=None) -> TreePlan:
    """Build a :class:`TreePlan` from arrays: ``parents [B]``, ``rest_positions [B, 3]``, optional
    ``rest_rotations [B, 4]`` WXYZ (identity by default) and per-body joint steps."""
    rp = np.asarray(rest_positions, dtype=np.float64).reshape(-1, 3)
    nb = len(parents)
    rr = (
        np.tile([1.0, 0.0, 0.0, 0.0], (nb, 1))
        if rest_rotations is None
        else np.asarray(rest_rotations, dtype=np.float64).reshape(-1, 4)
    )
    _check_finite_plan(rp, rr, steps)
    return TreePlan(
        parents=tuple(int(p) for p in parents),
        rest_positions=tuple(tuple(float(x) for x in row) for row in rp),
        rest_rotations=tuple(tuple(float(x) for x in row) for row in rr),
        steps=tuple(tuple(s) for s in steps) if steps is not None else tuple(() for _ in range(nb)),
    )


def _check_finite_plan(rest_positions: np.ndarray, rest_rotations: np.ndarray, steps) -> None:
    """Refuse NaN and infinity in what becomes the constants of the traced program (rest transforms, joint
    axes, anchors and references), naming the body."""
    for what, arr in (("rest position", rest_positions), ("rest rotation", rest_rotations)):
        bad = ~np.isfinite(arr).all(axis=1)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise NonFiniteError(
                f"{what} of body {b} is {arr[b].tolist()}; expected finite numbers", item=f"{what} of body {b}"
            )
    for b, body_steps in enumerate(steps or ()):
        for s in body_steps:
            values = (*s.axis, *s.anchor, s.ref)
            if not all(np.isfinite(values)):
                raise NonFiniteError(
                    f"{s.kind} joint of body {b} has axis {s.axis}, anchor {s.anchor}, ref {s.ref}; expected finite "
                    "numbers",
                    item=f"joint step of body {b}",
                )
