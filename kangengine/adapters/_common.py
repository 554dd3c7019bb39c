"""Helpers shared by the simulator adapters (private).

- :func:`dfs_block_order`: the depth-first (MJCF pre-order) order of a layout's joint blocks, the order
  MuJoCo and Newton's MJCF importer use, whatever body order the layout was built in.
- :class:`ColumnMap`: where each native ``q``/``qd`` column comes from in the canonical vectors.
- :func:`as_articulation_motion`: the motion a ``prepare_motion`` call works on (an ``ArticulationMotion``
  as given, a ``SkeletonMotion`` through ``ArticulationMotionMapper``).
- :func:`blend_frames`: the torch blend ``pack_sample`` uses (lerp for vectors, shortest-path slerp for
  quaternion groups), vectorised over samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rotations as R
from ..asset.desc import JointType
from ..errors import LayoutMismatch, ShapeError

__all__ = [
    "as_state_arrays",
    "gather_columns",
    "rotate_columns",
    "dfs_block_order",
    "ColumnMap",
    "column_map",
    "as_articulation_motion",
    "blend_frames",
    "format_mismatches",
    "torch_index",
]


def dfs_body_order(layout) -> tuple[int, ...]:
    """Body indices in depth-first pre-order, siblings in layout order."""
    parents = layout.parent_indices
    children: list[list[int]] = [[] for _ in parents]
    roots = []
    for b, p in enumerate(parents):
        (roots if p < 0 else children[p]).append(b)
    out: list[int] = []
    stack = list(reversed(roots))
    while stack:
        b = stack.pop()
        out.append(b)
        stack.extend(reversed(children[b]))
    return tuple(out)


def dfs_block_order(layout) -> tuple[int, ...]:
    """Block indices in the depth-first pre-order of the layout's body tree.

    Siblings keep their order in the layout (BFS and DFS loaders both keep the file's sibling order), so
    for a layout built with ``order="DFS"`` this is ``range(len(layout.blocks))``; for a BFS layout it is
    the order MuJoCo (and Newton's MJCF importer) lays the same joints out in.
    """
    body_order = dfs_body_order(layout)
    by_body: dict[int, list[int]] = {}
    for i, blk in enumerate(layout.blocks):
        by_body.setdefault(blk.body_index, []).append(i)
    out = []
    for b in body_order:
        out += by_body.get(b, [])
    return tuple(out)


@dataclass(frozen=True)
class ColumnMap:
    """Native columns in terms of canonical ones.

    Attributes:
        block_order: canonical block indices in native order.
        q_index: ``[nq] int64``: native ``q`` column ``k`` holds canonical column ``q_index[k]``.
        qd_index: ``[nv] int64``: the same for velocities.
        q_inverse, qd_inverse: the inverse permutations (canonical column ``k`` is native ``q_inverse[k]``).
    """

    block_order: tuple[int, ...]
    q_index: np.ndarray
    qd_index: np.ndarray
    q_inverse: np.ndarray
    qd_inverse: np.ndarray

    @property
    def identity(self) -> bool:
        return bool(
            np.array_equal(self.q_index, np.arange(self.q_index.size))
            and np.array_equal(self.qd_index, np.arange(self.qd_index.size))
        )


def column_map(layout, block_order) -> ColumnMap:
    """:class:`ColumnMap` of ``layout`` for blocks taken in ``block_order``."""
    q_idx: list[int] = []
    v_idx: list[int] = []
    for i in block_order:
        b = layout.blocks[i]
        q_idx += range(b.q_offset, b.q_offset + b.q_dim)
        v_idx += range(b.qd_offset, b.qd_offset + b.qd_dim)
    qi = np.array(q_idx, dtype=np.int64)
    vi = np.array(v_idx, dtype=np.int64)
    qinv = np.empty_like(qi)
    qinv[qi] = np.arange(qi.size)
    vinv = np.empty_like(vi)
    vinv[vi] = np.arange(vi.size)
    for a in (qi, vi, qinv, vinv):
        a.setflags(write=False)
    return ColumnMap(tuple(block_order), qi, vi, qinv, vinv)


def as_articulation_motion(layout, motion, *, skeleton_motion=None):
    """The ``ArticulationMotion`` an adapter packs for ``motion``.

    An ``ArticulationMotion`` is used as it is (its signature must match the layout); a ``SkeletonMotion``
    is mapped with ``ArticulationMotionMapper(layout).to_articulation_motion(...)``. When ``motion`` is
    neither, ``skeleton_motion`` is mapped.
    """
    from ..animation.motion import ArticulationMotion

    if isinstance(motion, ArticulationMotion):
        motion.check_layout(layout)
        return motion
    source = motion if _is_skeleton_motion(motion) else skeleton_motion
    if source is None or not _is_skeleton_motion(source):
        raise ShapeError(
            f"got {type(motion).__name__}; expected an ArticulationMotion or a SkeletonMotion",
            item="prepare_motion(motion)",
        )
    from ..animation.mapper import ArticulationMotionMapper

    return ArticulationMotionMapper(layout).to_articulation_motion(source).motion


def _is_skeleton_motion(x) -> bool:
    from ..animation.skeleton import SkeletonMotion

    return isinstance(x, SkeletonMotion)


def format_mismatches(what: str, problems: list[str]) -> str:
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"{what} does not match the layout ({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n{lines}"


def check_2d(name: str, x, width: int, *, source=None):
    if x.ndim != 2 or x.shape[1] != width:
        raise ShapeError(f"shape {tuple(x.shape)}; expected [frames, {width}]", path=source, item=name)


def float_dtype(*arrays):
    """float64 when any input is float64, else float32."""
    return np.float64 if any(np.asarray(a).dtype == np.float64 for a in arrays) else np.float32


def torch_index(index: np.ndarray, like):
    import torch

    return torch.as_tensor(index, dtype=torch.long, device=like.device)


def blend_frames(x0, x1, blend, quat_columns=None):
    """Blend native frames: lerp every column, then slerp the quaternion column groups.

    Args:
        x0, x1: ``[n, width]`` torch tensors.
        blend: ``[n]`` weight of ``x1``.
        quat_columns: ``[k, 4] int64`` column indices of each quaternion, in storage order (WXYZ or XYZW).
    Returns:
        ``[n, width]``.
    """
    t = blend.to(x0.dtype).reshape(-1, 1)
    out = x0 + (x1 - x0) * t
    if quat_columns is not None and len(quat_columns):
        cols = torch_index(np.asarray(quat_columns).reshape(-1), x0)
        k = len(quat_columns)
        qa = x0[:, cols].reshape(-1, k, 4)
        qb = x1[:, cols].reshape(-1, k, 4)
        # slerp is the same maths in any component order, so XYZW columns need no permutation
        out[:, cols] = R.quat_slerp(qa, qb, t).reshape(-1, k * 4)
    return out


def slerp_rotvec_columns(x0, x1, t, cols):
    """Geodesic blend of rotation-vector triples stored in columns of ``x0``/``x1`` ``[n, width]``.

    ``cols`` is ``[k, 3]`` (the x, y, z columns of each triple). The result ``[n, k, 3]``-worth of columns is
    ``log(slerp(exp(r0), exp(r1), t))`` (shortest path), computed component-wise on ``[n, k]`` tensors so
    that every torch kernel runs on contiguous data. ``t``: ``[n, 1]``.
    Returns ``(rx, ry, rz)``, each ``[n, k]``.
    """
    import torch

    idx = [torch_index(np.ascontiguousarray(cols[:, c]), x0) for c in range(3)]

    def exp(x):
        rx, ry, rz = (x.index_select(1, i) for i in idx)
        theta = torch.sqrt(rx * rx + ry * ry + rz * rz)
        half = 0.5 * theta
        small = theta < 1e-4
        k = torch.where(small, 0.5 - theta * theta / 48.0, torch.sin(half) / torch.where(small, 1.0, theta))
        return torch.cos(half), k * rx, k * ry, k * rz

    w0, a0, b0, c0 = exp(x0)
    w1, a1, b1, c1 = exp(x1)
    d = w0 * w1 + a0 * a1 + b0 * b1 + c0 * c1
    sign = torch.where(d < 0, -1.0, 1.0)
    d = (d * sign).clamp(max=1.0)
    sin_theta = torch.sqrt((1.0 - d * d).clamp(min=0.0))
    theta = torch.atan2(sin_theta, d)
    small = sin_theta < 1e-6
    safe = torch.where(small, 1.0, sin_theta)
    s0 = torch.where(small, 1.0 - t, torch.sin((1.0 - t) * theta) / safe)
    s1 = torch.where(small, t, torch.sin(t * theta) / safe) * sign
    w = s0 * w0 + s1 * w1
    a = s0 * a0 + s1 * a1
    b = s0 * b0 + s1 * b1
    c = s0 * c0 + s1 * c1
    flip = torch.where(w < 0, -1.0, 1.0)  # shortest rotation vector
    w = w * flip
    vn = torch.sqrt(a * a + b * b + c * c)
    small = vn < 1e-6 * w
    norm = torch.sqrt(w * w + vn * vn)  # slerp output is unit up to rounding; the angle uses the ratio only
    k = torch.where(small, 2.0 / norm, 2.0 * torch.atan2(vn, w) / torch.where(small, 1.0, vn)) * flip
    return k * a, k * b, k * c


def quaternion_columns(layout, cmap: ColumnMap, *, offset_in_block: dict) -> np.ndarray:
    """``[k, 4]`` native column indices of every quaternion (free root and ball blocks).

    ``offset_in_block`` maps a :class:`JointType` to where its quaternion starts inside the block's native
    ``q`` (free: 3, ball: 0).
    """
    native_start = {}
    pos = 0
    for i in cmap.block_order:
        native_start[i] = pos
        pos += layout.blocks[i].q_dim
    rows = []
    for i in cmap.block_order:
        b = layout.blocks[i]
        if b.joint_type in offset_in_block:
            s = native_start[i] + offset_in_block[b.joint_type]
            rows.append([s, s + 1, s + 2, s + 3])
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def require_layout_match(motion, layout) -> None:
    if motion.layout_signature != layout.model_signature or (motion.nq, motion.nv) != (layout.nq, layout.nv):
        raise LayoutMismatch(
            f"motion has nq={motion.nq}, nv={motion.nv}, signature {motion.layout_signature}; the adapter's layout "
            f"has nq={layout.nq}, nv={layout.nv}, signature {layout.model_signature}",
            path=layout.source,
        )


ROTATING = (JointType.FREE, JointType.BALL)


def as_state_arrays(layout, q, qd):
    """``q [frames, nq]`` and ``qd [frames, nv]`` as numpy arrays of one float dtype (a single frame becomes
    one row), checked against ``layout``.

    Raises:
        ShapeError: wrong widths, or different frame counts.
    """
    q = np.asarray(q)
    qd = np.asarray(qd)
    dtype = float_dtype(q, qd)
    q = np.atleast_2d(q).astype(dtype, copy=False)
    qd = np.atleast_2d(qd).astype(dtype, copy=False)
    check_2d("q", q, layout.nq, source=layout.source)
    check_2d("qd", qd, layout.nv, source=layout.source)
    if q.shape[0] != qd.shape[0]:
        raise ShapeError(f"q has {q.shape[0]} frames and qd {qd.shape[0]}; expected the same", item="qd")
    return q, qd


def gather_columns(x, index: np.ndarray, *, identity: bool | None = None) -> np.ndarray:
    """``x[:, index]`` as a new C-contiguous array: a plain copy when ``index`` is ``arange`` (pass
    ``identity`` when it is known), ``np.take`` along the columns otherwise (about twice as fast as fancy
    indexing)."""
    if identity is None:
        identity = bool(index.size == x.shape[1] and np.array_equal(index, np.arange(index.size)))
    if identity:
        return np.array(x, order="C", copy=True)
    return np.take(x, index, axis=1)


def rotate_columns(quat_src, quat_cols: np.ndarray, v, v_cols: np.ndarray, *, inverse: bool) -> None:
    """In place: ``v[:, v_cols[k]] <- R(q_k) v[:, v_cols[k]]`` (``R(q_k)^T`` when ``inverse``) for every k,
    with ``q_k`` the WXYZ quaternion in columns ``quat_cols[k]`` of ``quat_src``, normalised on the fly.

    Args:
        quat_src: ``[frames, width]`` array holding the quaternions (not written).
        quat_cols: ``[k, 4] int64`` its columns of each quaternion, in W, X, Y, Z order.
        v: ``[frames, width2]`` array holding the vectors (written).
        v_cols: ``[k, 3] int64`` its columns of each vector.
    Component-wise on ``[frames, k]`` arrays: no ``[frames, k, 4]`` temporaries, no per-frame loop.
    """
    if not len(quat_cols):
        return
    w, a, b, c = (np.take(quat_src, quat_cols[:, i], axis=1) for i in range(4))
    inv = 1.0 / np.sqrt(w * w + a * a + b * b + c * c)
    w *= inv
    s = -inv if inverse else inv
    a *= s
    b *= s
    c *= s
    x, y, z = (np.take(v, v_cols[:, i], axis=1) for i in range(3))
    # t = 2 u x v; v' = v + w t + u x t
    tx = 2.0 * (b * z - c * y)
    ty = 2.0 * (c * x - a * z)
    tz = 2.0 * (a * y - b * x)
    v[:, v_cols[:, 0]] = x + w * tx + (b * tz - c * ty)
    v[:, v_cols[:, 1]] = y + w * ty + (c * tx - a * tz)
    v[:, v_cols[:, 2]] = z + w * tz + (a * ty - b * tx)
