"""Column layouts of the library's rows: packed frames, packed kinematics, the per-clip table and the adapter's
fields; and :func:`as_numpy`, the host copy that packing and the input checks share.

The column order of a frame row is described in :mod:`kangengine.animation.library`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "SampleColumns",
    "sample_columns",
    "kin_views",
    "backend_slices",
    "clip_table",
    "CLIP_FPS",
    "CLIP_DURATION",
    "CLIP_PERIOD",
    "CLIP_START",
    "CLIP_LAST",
    "CLIP_DISPLACEMENT",
    "as_numpy",
]


@dataclass(frozen=True)
class SampleColumns:
    """Where each quantity sits in a frame row ``[D]`` for ``bodies`` nodes (``trans`` is ``None`` without
    local translations); ``width`` is ``D``."""

    bodies: int
    root: slice
    rot: slice
    lin: slice
    ang: slice
    trans: slice | None
    width: int


def sample_columns(bodies: int, has_translations: bool) -> SampleColumns:
    """The frame-row layout for ``bodies`` nodes, with or without per-frame local translations."""
    r = 3 + 4 * bodies
    trans = slice(r + 6, r + 6 + 3 * bodies) if has_translations else None
    return SampleColumns(
        bodies,
        slice(0, 3),
        slice(3, r),
        slice(r, r + 3),
        slice(r + 3, r + 6),
        trans,
        r + 6 + (3 * bodies if has_translations else 0),
    )


def kin_views(rows, b: int):
    """Views of kinematics rows ``[n, 13 b]``: positions ``[n, b, 3]``, rotations WXYZ ``[n, b, 4]``, linear
    and angular velocities ``[n, b, 3]``."""
    return (
        rows[:, 0 : 3 * b].unflatten(1, (b, 3)),
        rows[:, 3 * b : 7 * b].unflatten(1, (b, 4)),
        rows[:, 7 * b : 10 * b].unflatten(1, (b, 3)),
        rows[:, 10 * b : 13 * b].unflatten(1, (b, 3)),
    )


def backend_slices(fields: list[tuple[str, tuple[int, ...]]] | None) -> list[tuple[str, slice, tuple[int, ...]]] | None:
    """``(name, columns, per-frame shape)`` of each adapter field in a backend row (``None`` without fields)."""
    if fields is None:
        return None
    s, out = 0, []
    for name, shape in fields:
        w = int(np.prod(shape)) if shape else 1
        out.append((name, slice(s, s + w), shape))
        s += w
    return out


# clip table columns (float64): fps, duration, loop period, start, last frame, loop displacement x y z
CLIP_FPS, CLIP_DURATION, CLIP_PERIOD, CLIP_START, CLIP_LAST, CLIP_DISPLACEMENT = 0, 1, 2, 3, 4, slice(5, 8)


def clip_table(host: dict) -> np.ndarray:
    """``[C, 8] float64`` per-clip table (columns above) from the host arrays ``count``, ``start``, ``fps``,
    ``duration`` and ``disp``; sampling gathers one row per query."""
    period = np.where(host["duration"] > 0, host["duration"], 1.0)
    return np.concatenate(
        [
            host["fps"][:, None],
            host["duration"][:, None],
            period[:, None],
            host["start"][:, None].astype(np.float64),
            (host["count"] - 1)[:, None].astype(np.float64),
            host["disp"],
        ],
        axis=1,
    )


def as_numpy(x):
    """``x`` as a numpy array (a torch tensor is detached and copied to the host)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)
