"""From canonical clips to the library's packed frame-major rows (numpy, on the host).

:func:`pack_clips` writes one frame row per stored frame (and, with ``precompute_kinematics``, one kinematics
row), :func:`prepare_backend` the adapter's per-frame arrays; :class:`~kangengine.animation.library.MotionLibrary`
then moves them to its device and appends them to what it stores. The row layouts and the velocity scheme are
described in :mod:`kangengine.animation.library`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import rotations as R
from ...errors import FormatError, ShapeError
from ..skeleton import SkeletonMotion, SkeletonTree
from .columns import SampleColumns, as_numpy

__all__ = ["Clip", "PackedClips", "pack_clips", "prepare_backend"]

_GROUP_FRAMES = 1 << 17  # frames registered per numpy chunk (bounds float64 temporaries)


@dataclass
class Clip:
    """A clip being registered: its name, its canonical motion, what the user passed and its metadata."""

    name: str
    motion: SkeletonMotion  # canonical, numpy
    source: Any  # what the user passed
    metadata: dict


@dataclass(frozen=True, eq=False)
class PackedClips:
    """New clips packed on the host, to be appended to a library's buffers.

    Attributes:
        frames: ``[F, D]`` frame rows in the library's dtype (columns: the ``cols`` given to :func:`pack_clips`).
        kinematics: ``[F, 13 B]`` global body positions, rotations WXYZ, linear and angular velocities (world),
            or ``None`` without ``precompute_kinematics``.
        counts: ``[C] int64`` stored frames per clip.
        fps: ``[C] float64`` 1/s.
        loop_displacement: ``[C, 3] float64`` m, ``root[last] - root[first]`` with z = 0, from the stored (rounded)
            root positions, so loops join exactly.
    """

    frames: np.ndarray
    kinematics: np.ndarray | None
    counts: np.ndarray
    fps: np.ndarray
    loop_displacement: np.ndarray


def pack_clips(
    tree: SkeletonTree, clips: list[Clip], cols: SampleColumns, np_dtype, *, precompute_kinematics: bool
) -> PackedClips:
    """Pack ``clips`` (all on ``tree``) into frame rows laid out as ``cols``, ``np_dtype`` (float32 or float64);
    in groups of clips, so that float64 temporaries stay bounded."""
    nb = tree.num_nodes
    counts = np.array([c.motion.num_frames for c in clips], dtype=np.int64)
    fps = np.array([c.motion.fps for c in clips], dtype=np.float64)
    new_f = int(counts.sum())
    frames = np.empty((new_f, cols.width), dtype=np_dtype)
    kin = np.empty((new_f, 13 * nb), dtype=np_dtype) if precompute_kinematics else None
    disp = np.zeros((len(clips), 3))
    # group clips so that float64 temporaries stay bounded
    starts = np.concatenate([[0], np.cumsum(counts)])
    g0 = 0
    while g0 < len(clips):
        g1 = g0 + 1
        while g1 < len(clips) and starts[g1 + 1] - starts[g0] <= _GROUP_FRAMES:
            g1 += 1
        _pack_group(
            tree,
            clips[g0:g1],
            counts[g0:g1],
            fps[g0:g1],
            cols,
            frames[starts[g0] : starts[g1]],
            None if kin is None else kin[starts[g0] : starts[g1]],
        )
        g0 = g1
    for k in range(len(clips)):  # from the stored (rounded) root positions, so loops join exactly
        disp[k] = _loop_displacement(frames[starts[k] : starts[k + 1], 0:3].astype(np.float64))
    return PackedClips(frames=frames, kinematics=kin, counts=counts, fps=fps, loop_displacement=disp)


def _pack_group(tree, clips, counts, fps, cols, frames_out, kin_out) -> None:
    nb = tree.num_nodes
    rt = np.concatenate([np.asarray(c.motion.root_translation, dtype=np.float64) for c in clips])
    lr = np.concatenate([np.asarray(c.motion.local_rotation, dtype=np.float64) for c in clips])
    lr = R.quat_hemisphere_continuity(R.quat_normalize(lr), axis=0)
    lt = None
    if cols.trans is not None:
        lt = np.concatenate(
            [
                np.broadcast_to(tree.local_translation, (c.motion.num_frames, nb, 3))
                if c.motion.local_translation is None
                else np.asarray(c.motion.local_translation, dtype=np.float64)
                for c in clips
            ]
        )
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    lin, ang = _packed_velocities(rt, lr[:, 0], start, counts, fps)
    frames_out[:, cols.root] = rt
    frames_out[:, cols.rot] = lr.reshape(len(rt), -1)
    frames_out[:, cols.lin] = lin
    frames_out[:, cols.ang] = ang
    if lt is not None:
        frames_out[:, cols.trans] = lt.reshape(len(rt), -1)
    if kin_out is not None:
        gp, gr = tree.kinematics.from_local(rt, lr, lt)
        gr = R.quat_hemisphere_continuity(gr, axis=0)
        glin, gang = _packed_velocities(gp, gr, start, counts, fps)
        for k, a in enumerate((gp, gr, glin, gang)):
            lo = (0, 3 * nb, 7 * nb, 10 * nb)[k]
            kin_out[:, lo : lo + a.shape[1] * a.shape[2]] = a.reshape(len(rt), -1)


def _packed_velocities(p, q, start, count, fps):
    """Finite-difference velocities of packed frames (``p [F, ..., 3]``, ``q [F, ..., 4]``) per clip."""
    f = p.shape[0]
    idx = np.arange(f)
    clip_start = np.repeat(start, count)
    clip_end = clip_start + np.repeat(count, count) - 1
    nxt = np.minimum(idx + 1, clip_end)
    prv = np.maximum(idx - 1, clip_start)
    steps = (nxt - prv).astype(np.float64)
    inv = np.where(steps > 0, np.repeat(fps, count) / np.maximum(steps, 1.0), 0.0)
    inv = inv.reshape((f,) + (1,) * (p.ndim - 1))
    lin = (p[nxt] - p[prv]) * inv
    ang = R.quat_to_rotvec(R.quat_multiply(q[nxt], R.quat_conjugate(q[prv]))) * inv
    return lin, ang


def _loop_displacement(root_positions):
    d = root_positions[-1] - root_positions[0]
    return np.array([d[0], d[1], 0.0])


def prepare_backend(adapter, clips: list[Clip], counts, np_dtype, fields):
    """The adapter's per-frame arrays of ``clips``, flattened into ``[F, Db]`` rows of ``np_dtype``.

    Args:
        adapter: the library's adapter, or ``None`` (then nothing is prepared).
        clips: the clips (``prepare_motion`` receives each ``source`` and its canonical ``motion``).
        counts: ``[C]`` stored frames per clip.
        np_dtype: the library's float dtype (numpy).
        fields: ``[(name, per-frame shape)]`` of the clips stored before, or ``None`` for the first clips.

    Returns:
        ``(rows, fields)``: ``rows [F, Db]`` (``None`` without an adapter) and the fields every clip returned.

    Raises:
        FormatError: ``prepare_motion`` returned no dict, or other fields than earlier clips.
        ShapeError: an array with another frame count than its clip.
    """
    if adapter is None:
        return None, fields
    parts: list[np.ndarray] = []
    for k, c in enumerate(clips):
        arrays = adapter.prepare_motion(c.source, skeleton_motion=c.motion)
        if not isinstance(arrays, dict) or not arrays:
            raise FormatError(
                f"{type(adapter).__name__}.prepare_motion returned {type(arrays).__name__}; "
                "expected a non-empty dict of per-frame arrays",
                item=c.name,
            )
        clip_fields = [(str(name), tuple(np.shape(a)[1:])) for name, a in arrays.items()]
        if fields is None:
            fields = clip_fields
        elif clip_fields != fields:
            raise FormatError(f"prepare_motion returned fields {clip_fields}; earlier clips had {fields}", item=c.name)
        cols = []
        for name, a in arrays.items():
            a = as_numpy(a)
            if a.shape[0] != counts[k]:
                raise ShapeError(
                    f"{type(adapter).__name__}.prepare_motion gave {a.shape[0]} frames of "
                    f"{name!r}; the clip has {counts[k]}",
                    item=c.name,
                )
            cols.append(a.reshape(counts[k], -1).astype(np_dtype, copy=False))
        parts.append(np.concatenate(cols, axis=1))
    return np.concatenate(parts), fields
