"""Axis conventions: the one Y-up <-> Z-up conversion of KangEngine.

BVH and FBX characters are usually written **Y up** with the character facing **+Z**. KangEngine is
**Z up, X forward**. Every loader and writer uses the fixed proper rotation ``zup_from_yup`` defined here:

    (x, y, z)_yup  ->  (z, x, y)_zup      i.e.  new_x = old_z,  new_y = old_x,  new_z = old_y

so the character's facing direction +Z becomes +X (forward), its up +Y becomes +Z, and its left +X
becomes +Y. It is the rotation by 120 degrees about (1, 1, 1) / sqrt(3) (WXYZ ``(0.5, 0.5, 0.5, 0.5)``),
a cyclic permutation of the axes, so it converts vectors and quaternions exactly (no rounding).

Two kinds of conversion are offered:

* **vectors** (positions, offsets, velocities): :func:`vec_zup_from_yup` / :func:`vec_yup_from_zup`.
* **rotations re-expressed in the other axes** (``C q C^-1``; both the frame a rotation maps from and
  the frame it maps to are converted, as for the local rotations of a skeleton whose joint frames are all
  converted): :func:`quat_zup_from_yup` / :func:`quat_yup_from_zup`. For a WXYZ quaternion that is a
  permutation of its vector part.

To change only the world frame of a ``world_from_body`` rotation (keeping the body frame), left-multiply
by :data:`QUAT_WXYZ_ZUP_FROM_YUP`. Functions take numpy arrays or torch tensors with any leading batch
dimensions and keep type, dtype and device. Whole skeleton motions are converted by
:func:`kangengine.animation.motion_zup_from_yup` / :func:`kangengine.animation.motion_yup_from_zup`.
"""

from __future__ import annotations

import numpy as np

from .errors import ShapeError

__all__ = [
    "MATRIX_ZUP_FROM_YUP",
    "MATRIX_YUP_FROM_ZUP",
    "QUAT_WXYZ_ZUP_FROM_YUP",
    "QUAT_WXYZ_YUP_FROM_ZUP",
    "vec_zup_from_yup",
    "vec_yup_from_zup",
    "quat_zup_from_yup",
    "quat_yup_from_zup",
]

#: ``[3, 3]`` rotation matrix: ``v_zup = MATRIX_ZUP_FROM_YUP @ v_yup``.
MATRIX_ZUP_FROM_YUP = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
MATRIX_ZUP_FROM_YUP.setflags(write=False)
#: ``[3, 3]`` inverse (transpose) of :data:`MATRIX_ZUP_FROM_YUP`.
MATRIX_YUP_FROM_ZUP = MATRIX_ZUP_FROM_YUP.T.copy()
MATRIX_YUP_FROM_ZUP.setflags(write=False)
#: ``[4]`` WXYZ quaternion of :data:`MATRIX_ZUP_FROM_YUP` (120 degrees about (1, 1, 1)).
QUAT_WXYZ_ZUP_FROM_YUP = np.array([0.5, 0.5, 0.5, 0.5])
QUAT_WXYZ_ZUP_FROM_YUP.setflags(write=False)
#: ``[4]`` WXYZ quaternion of :data:`MATRIX_YUP_FROM_ZUP`.
QUAT_WXYZ_YUP_FROM_ZUP = np.array([0.5, -0.5, -0.5, -0.5])
QUAT_WXYZ_YUP_FROM_ZUP.setflags(write=False)

# new component k takes old component _ZUP_FROM_YUP[k]
_VEC_ZUP_FROM_YUP = [2, 0, 1]
_VEC_YUP_FROM_ZUP = [1, 2, 0]
_QUAT_ZUP_FROM_YUP = [0, 3, 1, 2]
_QUAT_YUP_FROM_ZUP = [0, 2, 3, 1]


def _take_last(x, index, n, func):
    if type(x).__module__.startswith("torch"):
        if x.shape[-1] != n:
            raise ShapeError(f"{func}: last axis has size {x.shape[-1]}; expected {n}", item="input")
        import torch

        return x.index_select(-1, torch.as_tensor(index, device=x.device))
    a = np.asarray(x)
    if a.dtype.kind not in "f":
        a = a.astype(np.float64)
    if a.ndim == 0 or a.shape[-1] != n:
        raise ShapeError(f"{func}: shape {a.shape}; expected (..., {n})", item="input")
    return a[..., index]


def vec_zup_from_yup(v):
    """Vectors (positions, offsets, velocities) from Y-up to Z-up axes: ``(x, y, z) -> (z, x, y)``.

    Args:
        v: ``[..., 3]`` numpy array or torch tensor (any unit).
    Returns:
        ``[..., 3]`` new array of the same type, dtype and device.
    """
    return _take_last(v, _VEC_ZUP_FROM_YUP, 3, "vec_zup_from_yup")


def vec_yup_from_zup(v):
    """Inverse of :func:`vec_zup_from_yup`: ``(x, y, z)_zup -> (y, z, x)_yup``."""
    return _take_last(v, _VEC_YUP_FROM_ZUP, 3, "vec_yup_from_zup")


def quat_zup_from_yup(q):
    """Rotations re-expressed from Y-up to Z-up axes: ``C q C^-1`` (WXYZ ``(w, x, y, z) -> (w, z, x, y)``).

    Use it for rotations whose two frames are both converted (a skeleton's local rotations, a
    ``world_from_body`` rotation whose body frame is also re-axed).

    Args:
        q: ``[..., 4]`` WXYZ quaternions, numpy or torch.
    Returns:
        ``[..., 4]`` WXYZ, same type, dtype and device.
    """
    return _take_last(q, _QUAT_ZUP_FROM_YUP, 4, "quat_zup_from_yup")


def quat_yup_from_zup(q):
    """Inverse of :func:`quat_zup_from_yup`: ``C^-1 q C`` (WXYZ ``(w, x, y, z) -> (w, y, z, x)``)."""
    return _take_last(q, _QUAT_YUP_FROM_ZUP, 4, "quat_yup_from_zup")
