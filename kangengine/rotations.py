"""Quaternions, rotation vectors, rotation matrices and Euler angles, for numpy and torch.

Conventions (the same everywhere in KangEngine, see ``docs/conventions.md``):

- Quaternions are stored **WXYZ** (scalar first) in the last axis: ``q[..., 0]`` is ``w``.
- Products are **Hamilton** products; ``quat_multiply(a, b)`` is the rotation "apply ``b`` first, then
  ``a``", exactly like the matrix product ``R(a) @ R(b)``.
- Rotations are **active** (they move vectors, ``v' = R v``) in a **right-handed** frame; a rotation
  by a positive angle about an axis turns counter-clockwise when the axis points at the viewer.
- A unit quaternion and its negative are the same rotation. Functions that return "the" quaternion
  of a rotation (``quat_from_matrix``) return the one with ``w >= 0``.
- Rotation vectors (``rotvec``, axis times angle, radians) are the exponential coordinates of a
  rotation; ``quat_to_rotvec`` returns the shortest one (angle in ``[0, pi]``).

Every function takes any number of leading batch dimensions (``(..., 4)``, ``(..., 3)``,
``(..., 3, 3)``), broadcasts its arguments against each other where that is natural, and returns an
array of the same kind as its input: a numpy array for numpy input (Python scalars and lists are
converted with numpy), a torch tensor on the same device for torch input. The floating dtype is kept
(float32 stays float32); integer input becomes float64 (numpy) or torch's default dtype (torch). When
numpy and torch inputs are mixed, the result is torch. ``import kangengine.rotations`` does not
import torch; torch is imported only when a torch tensor arrives.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kangengine.errors import FormatError, ShapeError

__all__ = [
    "quat_multiply",
    "quat_conjugate",
    "quat_inverse",
    "quat_normalize",
    "quat_identity",
    "quat_standardize",
    "quat_rotate",
    "quat_rotate_inverse",
    "quat_from_matrix",
    "quat_to_matrix",
    "quat_from_rotvec",
    "quat_to_rotvec",
    "quat_from_axis_angle",
    "quat_angle",
    "quat_angle_between",
    "quat_slerp",
    "quat_nlerp",
    "quat_swing_twist",
    "quat_from_euler",
    "quat_to_euler",
    "quat_hemisphere_continuity",
    "quat_angular_velocity",
    "quat_wxyz_to_xyzw",
    "quat_xyzw_to_wxyz",
    "wrap_angle",
    "EULER_ORDERS",
]

#: The 12 Euler orders accepted by :func:`quat_from_euler` / :func:`quat_to_euler` (6 Tait-Bryan,
#: then 6 proper Euler). Letters are case-insensitive; extrinsic/intrinsic is a separate keyword.
EULER_ORDERS = ("xyz", "xzy", "yxz", "yzx", "zxy", "zyx", "xyx", "xzx", "yxy", "yzy", "zxz", "zyz")

_AXIS_INDEX = {"x": 0, "y": 1, "z": 2}

# Below these magnitudes a closed form would divide 0 by 0, and a Taylor series is used instead.
_SMALL_ANGLE = 1e-3
# scipy's threshold for gimbal lock in as_euler (second angle within this of 0 or pi).
_GIMBAL_EPS = 1e-7


# ----------------------------------------------------------------------------------------------
# Backend shim: one implementation per function, numpy or torch chosen by the input's type.
# ----------------------------------------------------------------------------------------------


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch"


class _NumpyOps:
    is_torch = False
    sqrt = staticmethod(np.sqrt)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    atan2 = staticmethod(np.arctan2)
    hypot = staticmethod(np.hypot)
    abs = staticmethod(np.abs)
    ceil = staticmethod(np.ceil)
    where = staticmethod(np.where)
    zeros_like = staticmethod(np.zeros_like)
    ones_like = staticmethod(np.ones_like)

    @staticmethod
    def stack(xs, axis=-1):
        return np.stack(xs, axis=axis)

    @staticmethod
    def cat(xs, axis=-1):
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def sum(x, axis=-1, keepdims=False):
        return np.sum(x, axis=axis, keepdims=keepdims)

    @staticmethod
    def clip(x, lo, hi):
        return np.clip(x, lo, hi)

    @staticmethod
    def maximum(x, y):
        return np.maximum(x, y)

    @staticmethod
    def cumprod(x, axis):
        return np.cumprod(x, axis=axis)

    @staticmethod
    def argmax(x, axis):
        return np.argmax(x, axis=axis)

    @staticmethod
    def moveaxis(x, src, dst):
        return np.moveaxis(x, src, dst)

    @staticmethod
    def eps(x) -> float:
        return float(np.finfo(x.dtype).eps)

    @staticmethod
    def cast(x, like):
        return x.astype(like.dtype)

    @staticmethod
    def zeros(shape, like):
        return np.zeros(shape, dtype=like.dtype)


class _TorchOps:
    is_torch = True

    def __init__(self, torch):
        self.torch = torch
        self.sqrt = torch.sqrt
        self.sin = torch.sin
        self.cos = torch.cos
        self.atan2 = torch.atan2
        self.hypot = torch.hypot
        self.abs = torch.abs
        self.ceil = torch.ceil
        self.where = torch.where
        self.zeros_like = torch.zeros_like
        self.ones_like = torch.ones_like

    def stack(self, xs, axis=-1):
        return self.torch.stack(list(xs), dim=axis)

    def cat(self, xs, axis=-1):
        return self.torch.cat(list(xs), dim=axis)

    def sum(self, x, axis=-1, keepdims=False):
        return self.torch.sum(x, dim=axis, keepdim=keepdims)

    def clip(self, x, lo, hi):
        return self.torch.clamp(x, lo, hi)

    def maximum(self, x, y):
        if isinstance(y, (int, float)):
            return self.torch.clamp(x, min=y)
        return self.torch.maximum(x, y)

    def cumprod(self, x, axis):
        return self.torch.cumprod(x, dim=axis)

    def argmax(self, x, axis):
        return self.torch.argmax(x, dim=axis)

    def moveaxis(self, x, src, dst):
        return self.torch.movedim(x, src, dst)

    def eps(self, x) -> float:
        return float(self.torch.finfo(x.dtype).eps)

    def cast(self, x, like):
        return x.to(like.dtype)

    def zeros(self, shape, like):
        return self.torch.zeros(shape, dtype=like.dtype, device=like.device)


_NUMPY_OPS = _NumpyOps()
_TORCH_OPS: _TorchOps | None = None


def _torch_ops() -> _TorchOps:
    global _TORCH_OPS
    if _TORCH_OPS is None:
        import torch  # lazy: only when a torch tensor arrives

        _TORCH_OPS = _TorchOps(torch)
    return _TORCH_OPS


def _coerce(*xs):
    """Convert arguments to one backend and one floating dtype.

    Returns ``(ops, *arrays)``. Torch wins if any argument is a torch tensor; the dtype is the
    promotion of the floating array arguments (Python scalars, lists and integer arrays take it).
    """
    if any(_is_torch(x) for x in xs):
        ops = _torch_ops()
        torch = ops.torch
        device = next(x.device for x in xs if _is_torch(x))
        dtype = None
        for x in xs:
            if _is_torch(x) and x.is_floating_point():
                dt = x.dtype
            elif isinstance(x, (np.ndarray, np.generic)) and np.issubdtype(x.dtype, np.floating):
                dt = torch.from_numpy(np.zeros(0, dtype=x.dtype)).dtype
            else:
                continue
            dtype = dt if dtype is None else torch.promote_types(dtype, dt)
        if dtype is None:
            dtype = torch.get_default_dtype()
        out = []
        for x in xs:
            if _is_torch(x):
                out.append(x if x.dtype == dtype else x.to(dtype))
            else:
                out.append(torch.as_tensor(np.asarray(x), dtype=dtype, device=device))
        return (ops, *out)
    dtypes = [x.dtype for x in xs if isinstance(x, (np.ndarray, np.generic)) and np.issubdtype(x.dtype, np.floating)]
    dtype = np.result_type(*dtypes) if dtypes else np.dtype(np.float64)
    return (_NUMPY_OPS, *(np.asarray(x, dtype=dtype) for x in xs))


def _check_last(x, n: int, func: str, name: str) -> None:
    if x.ndim < 1 or x.shape[-1] != n:
        raise ShapeError(f"{func}: expected shape (..., {n}), got {tuple(x.shape)}", item=name)


def _check_matrix(m, func: str, name: str) -> None:
    if m.ndim < 2 or tuple(m.shape[-2:]) != (3, 3):
        raise ShapeError(f"{func}: expected shape (..., 3, 3), got {tuple(m.shape)}", item=name)


def _mul(ops, a, b):
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return ops.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ]
    )


def _conj(ops, q):
    return ops.cat([q[..., :1], -q[..., 1:]])


def _cross(ops, a, b):
    ax, ay, az = a[..., 0], a[..., 1], a[..., 2]
    bx, by, bz = b[..., 0], b[..., 1], b[..., 2]
    return ops.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx])


def _norm(ops, x, keepdims=False):
    return ops.sqrt(ops.sum(x * x, axis=-1, keepdims=keepdims))


def _normalize(ops, x, eps=1e-12):
    return x / ops.maximum(_norm(ops, x, keepdims=True), eps)


def _standardize(ops, q):
    return ops.where(q[..., :1] < 0, -q, q)


def _rotvec_to_quat(ops, rv):
    a2 = ops.sum(rv * rv, axis=-1)
    small = a2 < _SMALL_ANGLE**2
    # No sqrt(0) and no 0/0 on either branch: values and torch gradients stay finite at 0.
    angle = ops.sqrt(ops.where(small, ops.ones_like(a2), a2))
    # cos(angle/2) and sin(angle/2)/angle, Taylor series below _SMALL_ANGLE (error < 1e-21 there).
    w = ops.where(small, 1.0 - a2 / 8.0 + a2 * a2 / 384.0, ops.cos(0.5 * angle))
    scale = ops.where(small, 0.5 - a2 / 48.0 + a2 * a2 / 3840.0, ops.sin(0.5 * angle) / angle)
    return ops.cat([w[..., None], rv * scale[..., None]])


def _quat_to_rotvec(ops, q):
    q = _standardize(ops, q)
    w = q[..., 0]
    xyz = q[..., 1:]
    n2 = ops.sum(xyz * xyz, axis=-1)
    small = n2 < (_SMALL_ANGLE**2) * (w * w)  # w >= 0 here; False for w == 0 (angle pi)
    n = ops.sqrt(ops.where(small, ops.ones_like(n2), n2))
    safe_w = ops.where(small, w, ops.ones_like(w))
    r2 = n2 / (safe_w * safe_w)
    # The angle 2 atan2(|xyz|, w) is in [0, pi] and accurate near 0 and near pi. For small r = n/w,
    # angle/n = 2 atan(r)/n = (2/w)(1 - r^2/3 + r^4/5 - ...).
    scale = ops.where(small, (2.0 / safe_w) * (1.0 - r2 / 3.0 + r2 * r2 / 5.0), 2.0 * ops.atan2(n, w) / n)
    return xyz * scale[..., None]


# ----------------------------------------------------------------------------------------------
# Basic algebra
# ----------------------------------------------------------------------------------------------


def quat_multiply(a, b):
    """Hamilton product ``a * b`` of WXYZ quaternions.

    ``q = quat_multiply(a, b)`` is the rotation that applies ``b`` first and then ``a`` (like the
    matrix product ``R(a) @ R(b)``). Composing a transform chain: ``world_from_body =
    quat_multiply(world_from_parent, parent_from_body)``.

    Args:
        a: ``(..., 4)`` WXYZ quaternions, float32 or float64, numpy or torch.
        b: ``(..., 4)`` WXYZ quaternions; batch dims broadcast against ``a``'s.

    Returns:
        ``(..., 4)`` WXYZ quaternions (not renormalised), same type, dtype and device as the input.
    """
    ops, a, b = _coerce(a, b)
    _check_last(a, 4, "quat_multiply", "a")
    _check_last(b, 4, "quat_multiply", "b")
    return _mul(ops, a, b)


def quat_conjugate(q):
    """Conjugate ``(w, -x, -y, -z)`` of WXYZ quaternions: the inverse rotation for unit quaternions.

    Args:
        q: ``(..., 4)`` WXYZ quaternions, float32 or float64, numpy or torch.

    Returns:
        ``(..., 4)``, same type, dtype and device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_conjugate", "q")
    return _conj(ops, q)


def quat_inverse(q):
    """Multiplicative inverse ``conj(q) / |q|^2`` of WXYZ quaternions (need not be unit).

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions, float32 or float64, numpy or torch.

    Returns:
        ``(..., 4)``, same type, dtype and device; ``quat_multiply(q, quat_inverse(q))`` is identity.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_inverse", "q")
    return _conj(ops, q) / ops.sum(q * q, axis=-1, keepdims=True)


def quat_normalize(q, eps: float = 1e-12):
    """Scale quaternions to unit length: ``q / max(|q|, eps)``.

    Args:
        q: ``(..., 4)`` WXYZ quaternions, float32 or float64, numpy or torch.
        eps: lower bound on the norm used as divisor (a zero quaternion stays zero).

    Returns:
        ``(..., 4)`` unit quaternions, same type, dtype and device. The sign is kept.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_normalize", "q")
    return _normalize(ops, q, eps)


def quat_identity(shape=(), *, dtype=np.float64, like=None):
    """Identity quaternions ``(1, 0, 0, 0)`` of shape ``shape + (4,)``.

    Args:
        shape: batch shape, an int or a tuple of ints (``()`` gives a single ``(4,)`` quaternion).
        dtype: numpy dtype of the result (default float64); a torch dtype gives a CPU torch tensor.
            Ignored when ``like`` is given.
        like: a numpy array or torch tensor whose type, floating dtype and device the result takes.

    Returns:
        ``shape + (4,)`` WXYZ identity quaternions.
    """
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape) + (4,)
    if like is not None and _is_torch(like):
        torch = _torch_ops().torch
        dt = like.dtype if like.is_floating_point() else torch.get_default_dtype()
        out = torch.zeros(shape, dtype=dt, device=like.device)
    elif like is not None:
        like = np.asarray(like)
        dt = like.dtype if np.issubdtype(like.dtype, np.floating) else np.float64
        out = np.zeros(shape, dtype=dt)
    elif _is_torch(dtype):
        out = _torch_ops().torch.zeros(shape, dtype=dtype)
    else:
        out = np.zeros(shape, dtype=dtype)
    out[..., 0] = 1
    return out


def quat_standardize(q):
    """Flip the sign of quaternions with ``w < 0`` so that ``w >= 0`` (same rotations).

    Args:
        q: ``(..., 4)`` WXYZ quaternions, float32 or float64, numpy or torch.

    Returns:
        ``(..., 4)``, same type, dtype and device. Quaternions with ``w == 0`` are left as they are.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_standardize", "q")
    return _standardize(ops, q)


def quat_rotate(q, v):
    """Rotate vectors by unit quaternions: ``v' = q v q^-1 = R(q) v`` (active rotation).

    With ``q = world_from_body``, body-frame coordinates ``v`` map to world-frame coordinates.

    Args:
        q: ``(..., 4)`` unit WXYZ quaternions (not renormalised here).
        v: ``(..., 3)`` vectors; batch dims broadcast against ``q``'s.

    Returns:
        ``(..., 3)`` rotated vectors, same type, dtype and device.
    """
    ops, q, v = _coerce(q, v)
    _check_last(q, 4, "quat_rotate", "q")
    _check_last(v, 3, "quat_rotate", "v")
    u = q[..., 1:]
    t = 2.0 * _cross(ops, u, v)
    return v + q[..., :1] * t + _cross(ops, u, t)


def quat_rotate_inverse(q, v):
    """Rotate vectors by the inverse of unit quaternions: ``v' = R(q)^T v``.

    With ``q = world_from_body``, world-frame coordinates ``v`` map to body-frame coordinates.

    Args:
        q: ``(..., 4)`` unit WXYZ quaternions (not renormalised here).
        v: ``(..., 3)`` vectors; batch dims broadcast against ``q``'s.

    Returns:
        ``(..., 3)`` rotated vectors, same type, dtype and device.
    """
    ops, q, v = _coerce(q, v)
    _check_last(q, 4, "quat_rotate_inverse", "q")
    _check_last(v, 3, "quat_rotate_inverse", "v")
    u = -q[..., 1:]
    t = 2.0 * _cross(ops, u, v)
    return v + q[..., :1] * t + _cross(ops, u, t)


# ----------------------------------------------------------------------------------------------
# Matrices, rotation vectors, axis-angle
# ----------------------------------------------------------------------------------------------


def quat_to_matrix(q):
    """Rotation matrices of WXYZ quaternions.

    ``quat_to_matrix(q) @ v == quat_rotate(q, v)``. Non-unit quaternions are treated as their
    normalised version (the formula divides by ``|q|^2``).

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions, float32 or float64, numpy or torch.

    Returns:
        ``(..., 3, 3)`` rotation matrices (active, right-handed), same type, dtype and device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_to_matrix", "q")
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    s = 2.0 / ops.sum(q * q, axis=-1)
    xs, ys, zs = x * s, y * s, z * s
    out = ops.zeros(tuple(q.shape[:-1]) + (3, 3), like=q)
    # Written element by element into one preallocated array: no stacking of temporaries.
    xx, yy, zz = x * xs, y * ys, z * zs
    out[..., 0, 0] = 1.0 - (yy + zz)
    out[..., 1, 1] = 1.0 - (xx + zz)
    out[..., 2, 2] = 1.0 - (xx + yy)
    xy, wz = x * ys, w * zs
    out[..., 0, 1] = xy - wz
    out[..., 1, 0] = xy + wz
    xz, wy = x * zs, w * ys
    out[..., 0, 2] = xz + wy
    out[..., 2, 0] = xz - wy
    yz, wx = y * zs, w * xs
    out[..., 1, 2] = yz - wx
    out[..., 2, 1] = yz + wx
    return out


def quat_from_matrix(m):
    """WXYZ quaternions of rotation matrices (Shepperd's method), with ``w >= 0``.

    For each matrix the largest of ``(trace, m00, m11, m22)`` picks which quaternion component is
    computed from a square root-free large denominator, so the result is accurate to machine
    precision for every rotation, including 180 degree ones.

    Args:
        m: ``(..., 3, 3)`` rotation matrices (orthonormal, det +1), float32 or float64, numpy or torch.

    Returns:
        ``(..., 4)`` unit WXYZ quaternions with ``w >= 0``, same type, dtype and device.
    """
    ops, m = _coerce(m)
    _check_matrix(m, "quat_from_matrix", "m")
    m00, m01, m02 = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    m10, m11, m12 = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    m20, m21, m22 = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    tr = m00 + m11 + m22
    # Each candidate is 4 * q_c * q, where q_c is the component named by the case.
    c_w = ops.stack([1.0 + tr, m21 - m12, m02 - m20, m10 - m01])
    c_x = ops.stack([m21 - m12, 1.0 + m00 - m11 - m22, m01 + m10, m02 + m20])
    c_y = ops.stack([m02 - m20, m01 + m10, 1.0 - m00 + m11 - m22, m12 + m21])
    c_z = ops.stack([m10 - m01, m02 + m20, m12 + m21, 1.0 - m00 - m11 + m22])
    choice = ops.argmax(ops.stack([tr, m00, m11, m22]), axis=-1)[..., None]
    q = ops.where(choice == 0, c_w, ops.where(choice == 1, c_x, ops.where(choice == 2, c_y, c_z)))
    return _standardize(ops, _normalize(ops, q))


def quat_from_rotvec(rv):
    """Exponential map: WXYZ unit quaternions of rotation vectors (axis times angle, radians).

    ``q = (cos(|rv|/2), sin(|rv|/2) rv/|rv|)``; a Taylor series is used for small angles, so tiny
    and zero rotation vectors are exact.

    Args:
        rv: ``(..., 3)`` rotation vectors, radians, float32 or float64, numpy or torch.

    Returns:
        ``(..., 4)`` unit WXYZ quaternions, same type, dtype and device (``w < 0`` for angles
        above pi).
    """
    ops, rv = _coerce(rv)
    _check_last(rv, 3, "quat_from_rotvec", "rv")
    return _rotvec_to_quat(ops, rv)


def quat_to_rotvec(q):
    """Logarithm map: the shortest rotation vectors (axis times angle) of WXYZ quaternions.

    The angle is ``2 atan2(|xyz|, |w|)`` in ``[0, pi]`` (accurate near 0 and near pi); ``q`` and
    ``-q`` give the same result. A Taylor series handles tiny angles. At exactly pi either of the
    two equivalent vectors may be returned. Non-unit quaternions give the rotation vector of their
    normalised version.

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions, float32 or float64, numpy or torch.

    Returns:
        ``(..., 3)`` rotation vectors in radians, norm in ``[0, pi]``, same type, dtype and device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_to_rotvec", "q")
    return _quat_to_rotvec(ops, q)


def quat_from_axis_angle(axis, angle):
    """WXYZ unit quaternions of rotations by ``angle`` (radians, right-hand rule) about ``axis``.

    Args:
        axis: ``(..., 3)`` non-zero rotation axes (normalised here).
        angle: ``(...)`` angles in radians; broadcasts against ``axis``'s batch dims.

    Returns:
        ``(..., 4)`` unit WXYZ quaternions ``(cos(angle/2), sin(angle/2) axis/|axis|)``, same type,
        dtype and device.
    """
    ops, axis, angle = _coerce(axis, angle)
    _check_last(axis, 3, "quat_from_axis_angle", "axis")
    axis = _normalize(ops, axis)
    half = 0.5 * angle[..., None]
    c = ops.cos(half)
    s = ops.sin(half)
    return ops.cat([c + 0.0 * axis[..., :1], s * axis])


def quat_angle(q):
    """Rotation angles of WXYZ quaternions: ``2 atan2(|xyz|, |w|)`` in ``[0, pi]`` radians.

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions (need not be unit), numpy or torch.

    Returns:
        ``(...)`` angles in radians, same type, dtype and device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_angle", "q")
    return 2.0 * ops.atan2(_norm(ops, q[..., 1:]), ops.abs(q[..., 0]))


def quat_angle_between(a, b):
    """Geodesic distance between rotations: the angle of ``a^-1 * b`` in ``[0, pi]`` radians.

    ``q`` and ``-q`` are the same rotation (distance 0). Uses the ``atan2`` form, so it is accurate
    for nearly equal rotations (no ``acos`` of a number close to 1).

    Args:
        a: ``(..., 4)`` unit WXYZ quaternions.
        b: ``(..., 4)`` unit WXYZ quaternions; batch dims broadcast against ``a``'s.

    Returns:
        ``(...)`` angles in radians, same type, dtype and device.
    """
    ops, a, b = _coerce(a, b)
    _check_last(a, 4, "quat_angle_between", "a")
    _check_last(b, 4, "quat_angle_between", "b")
    d = _mul(ops, _conj(ops, a), b)
    return 2.0 * ops.atan2(_norm(ops, d[..., 1:]), ops.abs(d[..., 0]))


# ----------------------------------------------------------------------------------------------
# Interpolation
# ----------------------------------------------------------------------------------------------


def _interp_prepare(q0, q1, t, func):
    ops, q0, q1, t = _coerce(q0, q1, t)
    _check_last(q0, 4, func, "q0")
    _check_last(q1, 4, func, "q1")
    q1 = ops.where(ops.sum(q0 * q1, axis=-1, keepdims=True) < 0, -q1, q1)
    return ops, q0, q1, t[..., None]


def quat_nlerp(q0, q1, t):
    """Normalised linear interpolation along the shortest path (``q1`` sign-flipped if needed).

    Cheaper than :func:`quat_slerp`; not constant angular speed.

    Args:
        q0: ``(..., 4)`` unit WXYZ quaternions at ``t = 0``.
        q1: ``(..., 4)`` unit WXYZ quaternions at ``t = 1``.
        t: ``(...)`` interpolation parameters (usually in ``[0, 1]``); a scalar or broadcastable.

    Returns:
        ``(..., 4)`` unit WXYZ quaternions (broadcast batch shape), same type, dtype and device.
    """
    ops, q0, q1, t = _interp_prepare(q0, q1, t, "quat_nlerp")
    return _normalize(ops, q0 + t * (q1 - q0))


def quat_slerp(q0, q1, t):
    """Spherical linear interpolation along the shortest path, constant angular speed.

    ``slerp(q0, q1, t) = q0 * exp(t * log(q0^-1 q1))`` with the shortest ``log``; ``q1`` is
    sign-flipped when ``q0 . q1 < 0``. Below ``sin(theta) = 1e-6`` (``theta`` the 4-D angle between
    the inputs) it is :func:`quat_nlerp`, identical there to machine precision. The maths is the same
    for any component order, so XYZW quaternions interpolate correctly too.

    Args:
        q0: ``(..., 4)`` unit quaternions at ``t = 0``.
        q1: ``(..., 4)`` unit quaternions at ``t = 1``.
        t: ``(...)`` interpolation parameters (usually in ``[0, 1]``); a scalar or broadcastable.

    Returns:
        ``(..., 4)`` unit quaternions (broadcast batch shape), same type, dtype and device.
    """
    ops, q0, q1, t = _interp_prepare(q0, q1, t, "quat_slerp")
    d = ops.clip(ops.abs(ops.sum(q0 * q1, axis=-1, keepdims=True)), 0.0, 1.0)
    sin_theta = ops.sqrt(ops.clip(1.0 - d * d, 0.0, 1.0))
    theta = ops.atan2(sin_theta, d)
    small = sin_theta < 1e-6
    safe = ops.where(small, ops.ones_like(sin_theta), sin_theta)
    s0 = ops.where(small, 1.0 - t, ops.sin((1.0 - t) * theta) / safe)
    s1 = ops.where(small, t, ops.sin(t * theta) / safe)
    return _normalize(ops, s0 * q0 + s1 * q1)


# ----------------------------------------------------------------------------------------------
# Swing-twist
# ----------------------------------------------------------------------------------------------


def quat_swing_twist(q, axis):
    """Split rotations into ``q = swing * twist``, ``twist`` about ``axis``, ``swing`` perpendicular.

    ``axis`` is expressed in the frame on ``q``'s right-hand side (the child/local frame for a
    ``parent_from_child`` rotation), so ``twist`` is applied first, about the child's own axis, and
    ``swing`` (whose rotation axis is perpendicular to ``axis``) follows. ``twist`` is the
    normalised projection of ``q`` onto ``axis``: ``(w, (xyz . a) a) / |.|``. The product
    ``quat_multiply(swing, twist)`` equals ``q`` including its sign; ``swing`` has ``w >= 0`` and
    ``twist`` carries the sign of ``q``'s ``w``. If the projection is zero (a swing of exactly 180
    degrees), ``twist`` is the identity and ``swing == q``.

    Args:
        q: ``(..., 4)`` unit WXYZ quaternions.
        axis: ``(..., 3)`` or ``(3,)`` non-zero twist axes (normalised here), broadcast against ``q``.

    Returns:
        ``(swing, twist)``: two ``(..., 4)`` unit WXYZ quaternion arrays, same type, dtype, device.
    """
    ops, q, axis = _coerce(q, axis)
    _check_last(q, 4, "quat_swing_twist", "q")
    _check_last(axis, 3, "quat_swing_twist", "axis")
    a = _normalize(ops, axis)
    proj = ops.sum(q[..., 1:] * a, axis=-1, keepdims=True) * a
    w = q[..., :1] + 0.0 * proj[..., :1]
    twist = ops.cat([w, proj])
    n = _norm(ops, twist, keepdims=True)
    degenerate = n <= ops.eps(q) ** 2
    identity = ops.cat([ops.ones_like(w), ops.zeros_like(proj)])
    twist = ops.where(degenerate, identity, twist / ops.where(degenerate, ops.ones_like(n), n))
    swing = _mul(ops, q, _conj(ops, twist))
    return swing, twist


# ----------------------------------------------------------------------------------------------
# Euler angles
# ----------------------------------------------------------------------------------------------


def _check_euler_args(order, extrinsic, func):
    if not isinstance(order, str) or order.lower() not in EULER_ORDERS:
        raise FormatError(
            f"{func}: unknown Euler order {order!r}; valid orders are "
            f"{', '.join(EULER_ORDERS)} (letters case-insensitive; choose the convention with the "
            "extrinsic=True/False keyword)",
            item="order",
        )
    if not isinstance(extrinsic, (bool, np.bool_)):
        raise FormatError(
            f"{func}: extrinsic must be True (fixed world axes) or False (rotating axes), got {extrinsic!r}",
            item="extrinsic",
        )
    return order.lower(), bool(extrinsic)


def _elementary(ops, axis: int, angle):
    half = 0.5 * angle
    zero = ops.zeros_like(angle)
    comps = [ops.cos(half), zero, zero, zero]
    comps[axis + 1] = ops.sin(half)
    return ops.stack(comps)


def quat_from_euler(angles, order: str, *, extrinsic: bool):
    """WXYZ quaternions of Euler angles, same conventions as scipy's ``Rotation.from_euler``.

    ``order`` names the axes in the order the angles are listed, e.g. ``"xyz"``: ``angles[..., 0]``
    about x, ``angles[..., 1]`` about y, ``angles[..., 2]`` about z.

    - ``extrinsic=True``: rotations about the fixed world axes, applied in letter order
      (``q = q_z * q_y * q_x`` for ``"xyz"``; scipy ``from_euler("xyz", ...)``).
    - ``extrinsic=False``: intrinsic rotations about the rotating (body) axes
      (``q = q_x * q_y * q_z`` for ``"xyz"``; scipy ``from_euler("XYZ", ...)``).

    Args:
        angles: ``(..., 3)`` angles in radians, float32 or float64, numpy or torch.
        order: one of the 12 orders in :data:`EULER_ORDERS` (6 Tait-Bryan ``xyz, xzy, yxz, yzx, zxy,
            zyx``, 6 proper Euler ``xyx, xzx, yxy, yzy, zxz, zyz``), case-insensitive.
        extrinsic: required keyword, see above.

    Returns:
        ``(..., 4)`` unit WXYZ quaternions (sign as scipy's composition gives it, not standardised),
        same type, dtype and device.

    Raises:
        FormatError: unknown ``order`` or non-bool ``extrinsic``.
    """
    order, extrinsic = _check_euler_args(order, extrinsic, "quat_from_euler")
    ops, angles = _coerce(angles)
    _check_last(angles, 3, "quat_from_euler", "angles")
    q = None
    for n, letter in enumerate(order):
        e = _elementary(ops, _AXIS_INDEX[letter], angles[..., n])
        if q is None:
            q = e
        else:
            q = _mul(ops, e, q) if extrinsic else _mul(ops, q, e)
    return q


def _wrap_pi(ops, x):
    # (-2pi, 2pi] -> (-pi, pi]; the cheap form for angles known to lie in that range
    x = ops.where(x > math.pi, x - 2.0 * math.pi, x)
    return ops.where(x <= -math.pi, x + 2.0 * math.pi, x)


def wrap_angle(x):
    """Angles wrapped into ``(-pi, pi]`` (``pi`` stays ``pi``; ``-pi`` becomes ``pi``).

    Args:
        x: ``(...)`` angles in radians, any magnitude, numpy or torch (float32 or float64).
    Returns:
        ``(...)`` angles in ``(-pi, pi]`` congruent to ``x`` modulo ``2 pi``, same type, dtype and device.
    """
    ops, x = _coerce(x)
    two_pi = 2.0 * math.pi
    y = x - two_pi * ops.ceil((x - math.pi) / two_pi)
    # rounding can leave y a hair outside the interval; fold it back
    y = ops.where(y > math.pi, y - two_pi, y)
    return ops.where(y <= -math.pi, y + two_pi, y)


def quat_wxyz_to_xyzw(q):
    """Reorder quaternions from WXYZ (KangEngine) to XYZW (scipy, Newton, PhysX, poselib, ``.superdex_bot``).

    Args:
        q: ``(..., 4)`` WXYZ quaternions, numpy or torch.
    Returns:
        ``(..., 4)`` XYZW, a new array of the same type, dtype and device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_wxyz_to_xyzw", "q")
    return ops.cat([q[..., 1:], q[..., :1]])


def quat_xyzw_to_wxyz(q):
    """Reorder quaternions from XYZW (scipy, Newton, PhysX, poselib, ``.superdex_bot``) to WXYZ (KangEngine).

    Args:
        q: ``(..., 4)`` XYZW quaternions, numpy or torch.
    Returns:
        ``(..., 4)`` WXYZ, a new array of the same type, dtype and device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_xyzw_to_wxyz", "q")
    return ops.cat([q[..., 3:], q[..., :3]])


def quat_to_euler(q, order: str, *, extrinsic: bool):
    """Euler angles of WXYZ quaternions, same conventions and ranges as scipy's ``as_euler``.

    Inverse of :func:`quat_from_euler` with the same ``order`` and ``extrinsic``. Uses the
    closed form of Bernardes & Viollet (2022), as scipy does.

    Ranges: first and third angles in ``(-pi, pi]``; the middle angle in ``[-pi/2, pi/2]`` for
    Tait-Bryan orders and ``[0, pi]`` for proper Euler orders. In gimbal lock (middle angle within
    1e-7 of its singular value) the third angle is set to 0, as scipy does, without a warning.

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions (need not be unit), float32 or float64, numpy or
            torch.
        order: one of the 12 orders in :data:`EULER_ORDERS`, case-insensitive.
        extrinsic: required keyword; True for fixed world axes, False for rotating axes.

    Returns:
        ``(..., 3)`` angles in radians listed in letter order, same type, dtype and device.

    Raises:
        FormatError: unknown ``order`` or non-bool ``extrinsic``.
    """
    order, extrinsic = _check_euler_args(order, extrinsic, "quat_to_euler")
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_to_euler", "q")
    i, j, k = (_AXIS_INDEX[c] for c in order)
    if not extrinsic:
        i, k = k, i
    symmetric = i == k
    if symmetric:
        k = 3 - i - j
    sign = (i - j) * (j - k) * (k - i) // 2  # +1 for an even permutation, -1 for an odd one
    qw, qi, qj, qk = q[..., 0], q[..., i + 1], q[..., j + 1], q[..., k + 1] * sign
    if symmetric:
        a, b, c, d = qw, qi, qj, qk
    else:
        a, b, c, d = qw - qj, qi + qk, qj + qw, qk - qi
    middle = 2.0 * ops.atan2(ops.hypot(c, d), ops.hypot(a, b))  # [0, pi]
    half_sum = ops.atan2(b, a)
    half_diff = ops.atan2(d, c)
    case1 = ops.abs(middle) <= _GIMBAL_EPS
    case2 = ops.abs(middle - math.pi) <= _GIMBAL_EPS
    singular = case1 | case2
    zero = ops.zeros_like(middle)
    first_idx, third_idx = (0, 2) if extrinsic else (2, 0)
    singular0 = ops.where(case1, 2.0 * half_sum, (-2.0 if extrinsic else 2.0) * half_diff)
    out = [zero, zero, zero]
    out[first_idx] = ops.where(singular, singular0 if first_idx == 0 else zero, half_sum - half_diff)
    out[third_idx] = ops.where(singular, singular0 if third_idx == 0 else zero, half_sum + half_diff)
    if not symmetric:
        out[third_idx] = sign * out[third_idx]
        middle = middle - 0.5 * math.pi
    out[1] = middle
    return ops.stack([_wrap_pi(ops, out[0]), out[1], _wrap_pi(ops, out[2])])


# ----------------------------------------------------------------------------------------------
# Time series
# ----------------------------------------------------------------------------------------------


def _time_axis(q, axis, func):
    nd = q.ndim
    ax = axis + nd if axis < 0 else axis
    if not 0 <= ax < nd - 1:
        raise ShapeError(
            f"{func}: time axis {axis} is not a batch axis of an array of shape {tuple(q.shape)} "
            "(the last axis holds the 4 quaternion components)",
            item="axis",
        )
    return ax


def quat_hemisphere_continuity(q, *, axis: int = 0):
    """Flip quaternion signs along time so consecutive quaternions have a non-negative dot product.

    Each frame is compared with the already-fixed previous frame (the flips accumulate), so a whole
    sequence ends up on one continuous path, ready for per-component filtering or interpolation.
    The rotations are unchanged. Frame 0 keeps its sign. Vectorised with a cumulative product.

    Args:
        q: ``[frames, ..., 4]`` WXYZ quaternions (frame-major by default), numpy or torch.
        axis: the time axis (default 0); must not be the last axis.

    Returns:
        Same shape, type, dtype and device as ``q``.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_hemisphere_continuity", "q")
    ax = _time_axis(q, axis, "quat_hemisphere_continuity")
    x = ops.moveaxis(q, ax, 0)
    if x.shape[0] < 2:
        return q + 0.0
    dots = ops.sum(x[1:] * x[:-1], axis=-1, keepdims=True)
    one = ops.ones_like(dots)
    flips = ops.cat([one[:1], ops.where(dots < 0, -one, one)], axis=0)
    return ops.moveaxis(x * ops.cumprod(flips, 0), 0, ax)


def quat_angular_velocity(q, dt, *, frame: str):
    """Angular velocity (rad/s) of a sampled rotation trajectory by finite differences.

    ``frame="world"``: ``w`` such that ``q(t + h) = exp(w h) * q(t)`` (left-multiplicative update,
    the KangEngine convention for free roots), i.e. ``w = log(q[t+1] * q[t]^-1) / dt``; expressed in
    the frame on ``q``'s left (world for ``world_from_body``).
    ``frame="body"``: ``w = log(q[t]^-1 * q[t+1]) / dt``, i.e. ``q(t + h) = q(t) * exp(w h)``;
    expressed in the frame on ``q``'s right (the body/child frame).

    Central differences ``log(q[t+1] q[t-1]^-1) / (2 dt)`` (or the body analogue) in the interior,
    one-sided differences at the first and last frames; a single frame gives zeros. ``log`` is
    :func:`quat_to_rotvec` (shortest path), so the rotation between the two frames used must stay
    below pi (``|w| * 2 dt < pi``).

    Args:
        q: ``[frames, ..., 4]`` unit WXYZ quaternions, frame-major, numpy or torch.
        dt: time step in seconds, a positive scalar or an array broadcastable to ``q.shape[1:-1]``
            (e.g. one per clip).
        frame: required keyword, ``"world"`` or ``"body"``.

    Returns:
        ``[frames, ..., 3]`` angular velocities in rad/s, same type, dtype and device as ``q``.

    Raises:
        FormatError: ``frame`` not in ``{"world", "body"}`` or a non-positive scalar ``dt``.
    """
    if frame not in ("world", "body"):
        raise FormatError(
            f"quat_angular_velocity: unknown frame {frame!r}; valid frames are 'world', 'body'",
            item="frame",
        )
    if isinstance(dt, (int, float)) and not dt > 0:
        raise FormatError(f"quat_angular_velocity: dt must be positive, got {dt!r}", item="dt")
    ops, q, dt = _coerce(q, dt)
    _check_last(q, 4, "quat_angular_velocity", "q")
    if q.ndim < 2:
        raise ShapeError(f"quat_angular_velocity: expected shape [frames, ..., 4], got {tuple(q.shape)}", item="q")
    n = q.shape[0]
    dt = dt[..., None]
    if n < 2:
        return ops.zeros_like(q[..., 1:]) + 0.0 * dt
    q_next = ops.cat([q[1:], q[-1:]], axis=0)
    q_prev = ops.cat([q[:1], q[:-1]], axis=0)
    if frame == "world":
        d = _mul(ops, q_next, _conj(ops, q_prev))
    else:
        d = _mul(ops, _conj(ops, q_prev), q_next)
    steps = ops.zeros((n,) + (1,) * (q.ndim - 1), like=q) + 2.0
    steps[0] = 1.0
    steps[-1] = 1.0
    return _quat_to_rotvec(ops, d) / (steps * dt)
