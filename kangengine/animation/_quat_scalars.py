"""Scalar quaternion and angle helpers for numba kernels, inlined where they are called.

One copy of the per-element formulas that the compiled loops of :mod:`.native_mapper_mixed`,
:mod:`kangengine.retarget._skeleton_kernels` and :mod:`kangengine.sim.fast_kernel` share; each matches its
numpy counterpart in :mod:`kangengine.rotations` to float64 rounding. Quaternions are ``(w, x, y, z)`` scalars.
This module imports numba at import time: import it only from modules that do.

numba's on-disk cache keys a kernel by its own file, not by the files it inlines from: after editing this
module, clear the ``__pycache__`` entries of the kernels that use it (a fresh checkout has none).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["qmul", "rotvec", "wrap"]

_PI = math.pi
_TWO_PI = 2.0 * math.pi
SMALL_ANGLE = 1e-3  # rotations' small-angle threshold (their Taylor series below it)


@njit(cache=True, inline="always", error_model="numpy")
def qmul(aw, ax, ay, az, bw, bx, by, bz):
    """Hamilton product ``a * b`` of two ``(w, x, y, z)`` quaternions given as eight floats; a 4-tuple."""
    return (
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    )


@njit(cache=True, inline="always", error_model="numpy")
def wrap(x):
    """``rotations.wrap_angle`` of one float64 (rad, into ``(-pi, pi]``)."""
    y = x + (-_TWO_PI) * np.rint(x * (1.0 / _TWO_PI))
    if y > _PI:
        y -= _TWO_PI
    elif y <= -_PI:
        y += _TWO_PI
    return y


@njit(cache=True, inline="always", error_model="numpy")
def rotvec(w, x, y, z):
    """``rotations.quat_to_rotvec`` of one quaternion (rad; standardised to ``w >= 0``, the small-angle series
    below :data:`SMALL_ANGLE`); a 3-tuple."""
    if w < 0.0:
        w, x, y, z = -w, -x, -y, -z
    n2 = x * x + y * y + z * z
    if n2 < (SMALL_ANGLE * SMALL_ANGLE) * (w * w):
        r2 = n2 / (w * w)
        scale = (2.0 / w) * (1.0 - r2 / 3.0 + r2 * r2 / 5.0)
    else:
        n = math.sqrt(n2)
        scale = 2.0 * math.atan2(n, w) / n
    return x * scale, y * scale, z * scale
