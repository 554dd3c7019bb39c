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
    d = xs[0].dtype if xs and type(xs[0]) is np.ndarray else None
    if d is not None and d.kind == "f" and all(type(x) is np.ndarray and x.dtype == d for x in xs):
        return (_NUMPY_OPS, *xs)  # the common case, as below without the per-argument checks (small-array calls)
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
    """Hamilton product. numpy: the result takes the memory layout of the argument of the full
    broadcast shape (``b`` first; numpy's ``order="K"``), so component-major views stay component-major."""
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    comps = (
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    )
    if ops.is_torch:
        return ops.stack(comps)
    shape = np.broadcast_shapes(a.shape, b.shape)
    like = next((x for x in (b, a) if x.shape == shape), None)
    out = np.empty(shape, dtype=np.result_type(a, b)) if like is None else np.empty_like(like)
    for n, c in enumerate(comps):
        out[..., n] = c
    return out


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
        numpy: the memory layout of the argument with the full broadcast shape is kept (numpy's
        ``order="K"``, ``b`` first): C-contiguous for ordinary input, component-major for a
        component-major view (``np.moveaxis(q_4xN, 0, -1)``).
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


def _matrix_rows(ops, w, x, y, z, rows):
    """The 9 entries of the rotation matrix of ``(w, x, y, z)`` (any scale) in row-major order.

    ``rows`` is a ``[9, ...]`` numpy buffer written in place (no temporaries beyond six products), or
    None (torch: a list of 9 tensors is returned, autograd-friendly).
    """
    s = 2.0 / (w * w + x * x + y * y + z * z)
    xs, ys, zs = x * s, y * s, z * s
    xx, yy, zz = x * xs, y * ys, z * zs
    xy, wz, xz, wy, yz, wx = x * ys, w * zs, x * zs, w * ys, y * zs, w * xs
    if rows is None:
        return [1.0 - (yy + zz), xy - wz, xz + wy, xy + wz, 1.0 - (xx + zz), yz - wx, xz - wy, yz + wx, 1.0 - (xx + yy)]
    for d, a, b in ((0, yy, zz), (4, xx, zz), (8, xx, yy)):
        np.add(a, b, out=rows[d])
        np.subtract(1.0, rows[d], out=rows[d])
    for lo, hi, a, b in ((1, 3, xy, wz), (5, 7, yz, wx), (6, 2, xz, wy)):  # (a - b, a + b)
        np.subtract(a, b, out=rows[lo])
        np.add(a, b, out=rows[hi])
    return rows


# Rotations per block of the numpy quat_to_matrix: the [4, n] and [9, n] blocks stay in the L2 cache.
_MATRIX_BLOCK = 8192


def quat_to_matrix(q):
    """Rotation matrices of WXYZ quaternions.

    ``quat_to_matrix(q) @ v == quat_rotate(q, v)``. Non-unit quaternions are treated as their
    normalised version (the formula divides by ``|q|^2``): ``R = I + s w [v]x + s [v]x^2`` with
    ``s = 2 / |q|^2``, i.e. ``R[0, 0] = 1 - s (y^2 + z^2)``, ``R[0, 1] = s (x y - w z)``, ...

    numpy works through blocks of rotations: the components are transposed into a contiguous
    ``[4, n]`` block, the 9 entries computed into a contiguous ``[9, n]`` block, and one transposing
    copy writes them out (about 25 ns per rotation in float64 on one thread, faster than scipy's
    ``Rotation.from_quat(xyzw).as_matrix()``; ``benchmarks/bench_rotations.py``). torch builds the
    entries with differentiable element-wise ops and stacks them.

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions, float32 or float64, numpy or torch.

    Returns:
        ``(..., 3, 3)`` rotation matrices (active, right-handed, C-contiguous), same type, dtype and
        device.
    """
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_to_matrix", "q")
    lead = tuple(q.shape[:-1])
    if ops.is_torch:
        entries = _matrix_rows(ops, q[..., 0], q[..., 1], q[..., 2], q[..., 3], None)
        return ops.stack(entries).reshape(lead + (3, 3))
    flat = q.reshape(-1, 4)
    n = flat.shape[0]
    out = np.empty((n, 9), dtype=q.dtype)
    block = min(n, _MATRIX_BLOCK)
    comps = np.empty((4, block), dtype=q.dtype)
    rows = np.empty((9, block), dtype=q.dtype)
    for s0 in range(0, n, block):
        m = min(block, n - s0)
        c = comps[:, :m]
        np.copyto(c, flat[s0 : s0 + m].T)
        _matrix_rows(ops, c[0], c[1], c[2], c[3], rows[:, :m])
        np.copyto(out[s0 : s0 + m], rows[:, :m].T)
    return out.reshape(lead + (3, 3))


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


def _parity(i: int, j: int, k: int) -> float:
    """+1.0 for an even permutation ``(i, j, k)`` of ``(0, 1, 2)``, -1.0 for an odd one."""
    return float((i - j) * (j - k) * (k - i) // 2)


def quat_from_euler(angles, order: str, *, extrinsic: bool, degrees: bool = False):
    """WXYZ quaternions of Euler angles, same conventions as scipy's ``Rotation.from_euler``.

    ``order`` names the axes in the order the angles are listed, e.g. ``"xyz"``: ``angles[..., 0]``
    about x, ``angles[..., 1]`` about y, ``angles[..., 2]`` about z.

    - ``extrinsic=True``: rotations about the fixed world axes, applied in letter order
      (``q = q_z * q_y * q_x`` for ``"xyz"``; scipy ``from_euler("xyz", ...)``).
    - ``extrinsic=False``: intrinsic rotations about the rotating (body) axes
      (``q = q_x * q_y * q_z`` for ``"xyz"``; scipy ``from_euler("XYZ", ...)``).

    The product of the three elementary quaternions is evaluated in closed form from the half-angle
    sines and cosines (one ``sin`` and one ``cos`` of the ``(..., 3)`` half angles, then 12 products),
    which is what the BVH reader runs on every channel of every frame.

    Args:
        angles: ``(..., 3)`` angles in radians (degrees with ``degrees=True``), float32 or float64,
            numpy or torch.
        order: one of the 12 orders in :data:`EULER_ORDERS` (6 Tait-Bryan ``xyz, xzy, yxz, yzx, zxy,
            zyx``, 6 proper Euler ``xyx, xzx, yxy, yzy, zxz, zyz``), case-insensitive.
        extrinsic: required keyword, see above.
        degrees: keyword; True when ``angles`` are in degrees (scipy's ``degrees=True``).

    Returns:
        ``(..., 4)`` unit WXYZ quaternions (sign as scipy's composition gives it, not standardised),
        same type, dtype and device.

    Raises:
        FormatError: unknown ``order`` or non-bool ``extrinsic``.
    """
    order, extrinsic = _check_euler_args(order, extrinsic, "quat_from_euler")
    ops, angles = _coerce(angles)
    _check_last(angles, 3, "quat_from_euler", "angles")
    axes = [_AXIS_INDEX[c] for c in order]
    half = angles * ((math.pi / 360.0) if degrees else 0.5)
    cos, sin = ops.cos(half), ops.sin(half)
    cols = (2, 1, 0) if extrinsic else (0, 1, 2)  # extrinsic "abc" is intrinsic "cba", angles reversed
    if extrinsic:
        axes.reverse()
    c0, c1, c2 = (cos[..., n] for n in cols)
    s0, s1, s2 = (sin[..., n] for n in cols)
    c1c2, s1s2, s1c2, c1s2 = c1 * c2, s1 * s2, s1 * c2, c1 * s2
    i0, i1, i2 = axes
    # q = e0 * e1 * e2 with e_n = (c_n, s_n along axis i_n): each component is a +- b of two products.
    # (slot, +1 add / -1 subtract, a, b); the fourth slot is the axis not named (proper Euler orders).
    if i0 != i2:  # Tait-Bryan
        e = _parity(i0, i1, i2)
        terms = (
            (0, -e, c0 * c1c2, s0 * s1s2),
            (1 + i0, e, s0 * c1c2, c0 * s1s2),
            (1 + i1, -e, c0 * s1c2, s0 * c1s2),
            (1 + i2, e, c0 * c1s2, s0 * s1c2),
        )
        last = None
    else:  # proper Euler: v_k = parity(i0, i1, k) (s0 s1 c2 - c0 s1 s2)
        k = 3 - i0 - i1
        e = _parity(i0, i1, k)
        terms = (
            (0, -1.0, c0 * c1c2, s0 * c1s2),
            (1 + i0, 1.0, c0 * c1s2, s0 * c1c2),
            (1 + i1, 1.0, c0 * s1c2, s0 * s1s2),
        )
        last = (1 + k, e, s0 * s1c2, c0 * s1s2)  # e * (a - b)
    if ops.is_torch:
        comps = [None] * 4
        for slot, sg, a, b in terms:
            comps[slot] = a + b if sg > 0 else a - b
        if last is not None:
            slot, sg, a, b = last
            comps[slot] = (a - b) if sg > 0 else (b - a)
        return ops.stack(comps)
    out = np.empty(angles.shape[:-1] + (4,), dtype=angles.dtype)
    for slot, sg, a, b in terms:
        (np.add if sg > 0 else np.subtract)(a, b, out=out[..., slot])
    if last is not None:
        slot, sg, a, b = last
        np.subtract(a, b, out=out[..., slot]) if sg > 0 else np.subtract(b, a, out=out[..., slot])
    return out


_TWO_PI = 2.0 * math.pi


def _wrap(ops, x):
    """``wrap_angle`` on an array of the backend (see there); numpy returns a new array."""
    if ops.is_torch:
        y = x - _TWO_PI * ops.torch.round(x * (1.0 / _TWO_PI))  # round half to even, like np.rint
        y = ops.where(y > math.pi, y - _TWO_PI, y)
        return ops.where(y <= -math.pi, y + _TWO_PI, y)
    y = np.empty_like(x)
    np.multiply(x, 1.0 / _TWO_PI, out=y)
    np.rint(y, out=y)
    y *= -_TWO_PI
    y += x  # in [-pi, pi] up to rounding; -pi (and anything rounded past the ends) folds below
    if y.size and (y.max() > math.pi or y.min() <= -math.pi):  # two reductions; the folds are rare
        np.add(y, -_TWO_PI, out=y, where=y > math.pi)
        np.add(y, _TWO_PI, out=y, where=y <= -math.pi)
    return y


def wrap_angle(x):
    """Angles wrapped into ``(-pi, pi]`` (``pi`` stays ``pi``; ``-pi`` becomes ``pi``).

    ``y = x - 2 pi rint(x / (2 pi))``, then the ends folded so that exactly ``-pi`` (and ``+-3 pi``,
    ...) give ``+pi``; the same as ``np.angle(np.exp(1j * x))`` except there. The error is about
    ``|x| eps`` (``2 pi`` rounded to the dtype times the number of turns removed), which is also how
    well ``x`` itself is known. float32 compares against ``pi`` rounded to float32, so the float32
    ``pi`` is the upper end. numpy: four passes over the array in place and two reductions; the folds
    run only when an angle falls on or past an end.

    Args:
        x: ``(...)`` angles in radians, any magnitude, float32 or float64, numpy or torch.

    Returns:
        ``(...)`` angles in ``(-pi, pi]`` congruent to ``x`` modulo ``2 pi``, same type, dtype and device.
    """
    ops, x = _coerce(x)
    return _wrap(ops, x)


_XYZW_FROM_WXYZ = (1, 2, 3, 0)
_WXYZ_FROM_XYZW = (3, 0, 1, 2)


def _reorder(q, index, func):
    if _is_torch(q):
        _check_last(q, 4, func, "q")
        return q[..., list(index)]
    q = np.asarray(q)
    _check_last(q, 4, func, "q")
    return q[..., np.array(index, dtype=np.intp)]


def quat_wxyz_to_xyzw(q):
    """Reorder quaternions from WXYZ (KangEngine) to XYZW (scipy, Newton, PhysX, poselib, ``.superdex_bot``).

    The reorder is a gather of the last axis, so any dtype is kept as it is (integer column indices
    too: ``quat_wxyz_to_xyzw(np.arange(s, s + 4))`` are the WXYZ columns in XYZW order).

    Args:
        q: ``(..., 4)`` WXYZ quaternions (or per-component values), numpy (or anything ``np.asarray``
            takes) or torch.

    Returns:
        ``(..., 4)`` XYZW, a new array of the same type, dtype and device.
    """
    return _reorder(q, _XYZW_FROM_WXYZ, "quat_wxyz_to_xyzw")


def quat_xyzw_to_wxyz(q):
    """Reorder quaternions from XYZW (scipy, Newton, PhysX, poselib, ``.superdex_bot``) to WXYZ (KangEngine).

    The reorder is a gather of the last axis, so any dtype is kept as it is.

    Args:
        q: ``(..., 4)`` XYZW quaternions (or per-component values), numpy (or anything ``np.asarray``
            takes) or torch.

    Returns:
        ``(..., 4)`` WXYZ, a new array of the same type, dtype and device.
    """
    return _reorder(q, _WXYZ_FROM_XYZW, "quat_xyzw_to_wxyz")


def quat_to_euler(q, order: str, *, extrinsic: bool, degrees: bool = False):
    """Euler angles of WXYZ quaternions, same conventions and ranges as scipy's ``as_euler``.

    Inverse of :func:`quat_from_euler` with the same ``order`` and ``extrinsic``. Uses the
    closed form of Bernardes & Viollet (2022), as scipy does: with ``(a, b, c, d)`` the permuted
    (Tait-Bryan: sums and differences of the) components, the middle angle is
    ``2 atan2(|(c, d)|, |(a, b)|)`` and the outer ones are ``atan2(b, a) -+ atan2(d, c)``, evaluated as
    one ``atan2`` of the complex products ``(a + ib)(c -+ id)`` each, which lands in ``(-pi, pi]``
    without wrapping (three ``atan2`` per rotation in all).

    Ranges: first and third angles in ``(-pi, pi]``; the middle angle in ``[-pi/2, pi/2]`` for
    Tait-Bryan orders and ``[0, pi]`` for proper Euler orders. In gimbal lock (middle angle within
    1e-7 of its singular value) the third angle is set to 0, as scipy does, without a warning.

    Args:
        q: ``(..., 4)`` non-zero WXYZ quaternions (need not be unit; the components are squared, so
            ``|q|`` between about 1e-150 and 1e150 in float64, 1e-18 and 1e18 in float32), float32 or
            float64, numpy or torch. A numpy view whose last axis is the slowest
            (``np.moveaxis(q_4xN, 0, -1)``) is read without a copy.
        order: one of the 12 orders in :data:`EULER_ORDERS`, case-insensitive.
        extrinsic: required keyword; True for fixed world axes, False for rotating axes.
        degrees: keyword; True returns degrees instead of radians (scipy's ``degrees=True``).

    Returns:
        ``(..., 3)`` angles in radians (or degrees) listed in letter order, same type, dtype and
        device. numpy: the memory layout of ``q`` is kept (numpy's ``order="K"``), so a
        component-major input gives component-major angles (``out[..., n]`` contiguous).

    Raises:
        FormatError: unknown ``order`` or non-bool ``extrinsic``.
    """
    order, extrinsic = _check_euler_args(order, extrinsic, "quat_to_euler")
    ops, q = _coerce(q)
    _check_last(q, 4, "quat_to_euler", "q")
    if q.ndim == 1 and not ops.is_torch:  # the in-place numpy path needs arrays, not scalars
        return quat_to_euler(q[None], order, extrinsic=extrinsic, degrees=degrees)[0]
    i, j, k = (_AXIS_INDEX[c] for c in order)
    if not extrinsic:
        i, k = k, i
    symmetric = i == k
    if symmetric:
        k = 3 - i - j
    s = _parity(i, j, k)  # the k component enters with this sign
    qw, qi, qj, qk = q[..., 0], q[..., i + 1], q[..., j + 1], q[..., k + 1]
    # (a, b, c, d) with d = s * ds: no negation pass for s < 0
    if symmetric:
        a, b, c, ds = qw, qi, qj, qk
    else:
        a, c = qw - qj, qj + qw
        b, ds = (qi + qk, qk - qi) if s > 0 else (qi - qk, qk + qi)
    # half_sum -+ half_diff = atan2(b, a) -+ atan2(d, c) = arg((a + ib)(c -+ id)):
    #   first angle  atan2(b c - a d, a c + b d), third angle  t atan2(a d + b c, a c - b d)
    # (t = s for Tait-Bryan orders, 1 for proper Euler), written with P = a ds, Q = b ds; "+ 0.0" makes a
    # -0.0 numerator +0.0, so atan2 gives +pi, never -pi.
    first, third = (0, 2) if extrinsic else (2, 0)
    if ops.is_torch:
        middle = 2.0 * ops.atan2(ops.sqrt(c * c + ds * ds), ops.sqrt(a * a + b * b))
        P, Q, bc, ac = a * ds, b * ds, b * c, a * c
        y3 = (P + bc if s > 0 else bc - P) if symmetric else (P + bc if s > 0 else P - bc)
        out = [None, middle if symmetric else middle - 0.5 * math.pi, None]
        out[first] = ops.atan2((bc - s * P) + 0.0, ac + s * Q)
        out[third] = ops.atan2(y3 + 0.0, ac - s * Q)
        lock, at_zero = _euler_lock(ops, middle)
        alone = _euler_lock_angle(ops, at_zero, a, b, c, s * ds, extrinsic, symmetric or s > 0 or extrinsic)
        res = ops.stack([ops.where(lock, alone, out[0]), out[1], ops.where(lock, 0.0, out[2])])
        return res * (180.0 / math.pi) if degrees else res
    res = np.empty_like(q[..., :3])  # numpy's order="K": the layout of q
    dst = [res[..., n] for n in range(3)]
    ab, tmp, cd = a * a, b * b, c * c
    ab += tmp
    np.sqrt(ab, out=ab)
    np.multiply(ds, ds, out=tmp)
    cd += tmp
    np.sqrt(cd, out=cd)
    middle = np.arctan2(cd, ab, out=dst[1])
    middle *= 2.0  # [0, pi]
    P, Q, bc, ac = np.multiply(a, ds, out=ab), np.multiply(b, ds, out=cd), np.multiply(b, c, out=tmp), a * c
    y1 = bc - P if s > 0 else bc + P
    if symmetric:
        np.add(P, bc, out=P) if s > 0 else np.subtract(bc, P, out=P)
    else:
        np.add(P, bc, out=P) if s > 0 else np.subtract(P, bc, out=P)
    y3 = P
    x1 = np.add(ac, Q, out=bc) if s > 0 else np.subtract(ac, Q, out=bc)
    x3 = np.subtract(ac, Q, out=Q) if s > 0 else np.add(ac, Q, out=Q)
    y1 += 0.0
    y3 += 0.0
    np.arctan2(y1, x1, out=dst[first])
    np.arctan2(y3, x3, out=dst[third])
    if middle.size and (middle.min() <= _GIMBAL_EPS or middle.max() >= math.pi - _GIMBAL_EPS):
        lock, at_zero = _euler_lock(ops, middle)
        if lock.any():
            a, b, c, d, at_zero = (v[lock] for v in (a, b, c, s * ds, at_zero))
            dst[0][lock] = _euler_lock_angle(ops, at_zero, a, b, c, d, extrinsic, symmetric or s > 0 or extrinsic)
            dst[2][lock] = 0.0
    if not symmetric:
        middle -= 0.5 * math.pi
    if degrees:
        res *= 180.0 / math.pi
    return res


def _euler_lock(ops, middle):
    """Gimbal lock, scipy's test: ``(middle within 1e-7 of 0 or pi, middle within 1e-7 of 0)``."""
    at_zero = middle <= _GIMBAL_EPS
    return at_zero | (ops.abs(middle - math.pi) <= _GIMBAL_EPS), at_zero


def _euler_lock_angle(ops, at_zero, a, b, c, d, extrinsic: bool, keep_sign: bool):
    """The first angle at gimbal lock (the third one is 0): ``2 atan2(b, a)`` where the middle angle is
    0 (``at_zero``), ``-+2 atan2(d, c)`` where it is pi (``-`` extrinsic), as one double-angle ``atan2``
    (in ``(-pi, pi]``); negated when the third angle's sign applies to it (intrinsic Tait-Bryan of an odd
    permutation)."""
    y = ops.where(at_zero, 2.0 * a * b, (-2.0 if extrinsic else 2.0) * c * d)
    x = ops.where(at_zero, a * a - b * b, c * c - d * d)
    return ops.atan2((y if keep_sign else -y) + 0.0, x)


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
