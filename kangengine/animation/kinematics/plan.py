"""What a tree's forward kinematics is traced from: parents, rest transforms and joint steps.

A :class:`TreePlan` is plain, hashable data (tuples of Python floats): equal plans share one traced program
(:mod:`.trace`) and its compiled forms (:mod:`.replay`, :mod:`.native`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    return TreePlan(
        parents=tuple(int(p) for p in parents),
        rest_positions=tuple(tuple(float(x) for x in row) for row in rp),
        rest_rotations=tuple(tuple(float(x) for x in row) for row in rr),
        steps=tuple(tuple(s) for s in steps) if steps is not None else tuple(() for _ in range(nb)),
    )
