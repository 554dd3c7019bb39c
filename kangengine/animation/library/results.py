"""What a :class:`~kangengine.animation.library.MotionLibrary` hands out: :class:`MotionSample`,
:class:`BodyState` and :class:`PackedMotionBuffers`, each a set of views of the library's rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .columns import SampleColumns, sample_columns

__all__ = ["MotionSample", "BodyState", "PackedMotionBuffers", "make_sample"]


@dataclass(frozen=True, eq=False)
class MotionSample:
    """Poses sampled from a :class:`MotionLibrary`, one per query (``n`` queries).

    All tensors are on the library's device; floats have the library's dtype unless said otherwise. The
    pose fields are views into one row buffer ``[n, D]`` (strided, not contiguous; ``.contiguous()`` or
    :meth:`clone` for compact copies).

    Attributes:
        motion_ids: ``[n] int64`` clip ids.
        times: ``[n] float64`` s, the requested times (before looping or clamping).
        frame0, frame1: ``[n] int64`` packed frame indices (rows of ``packed_buffers()``) of the two
            stored frames blended; equal for exact frames.
        blend: ``[n]`` weight of ``frame1`` in ``[0, 1]``.
        loop_offsets: ``[n, 3]`` m, world translation added to every position because of looping
            (``loops * (root_xy[last] - root_xy[first])``, z = 0); ``None`` when not looping.
        root_positions: ``[n, 3]`` m, world position of the root node.
        root_rotations_wxyz: ``[n, 4]`` ``world_from_root`` (a view of ``local_rotations_wxyz[:, 0]``).
        local_rotations_wxyz: ``[n, B, 4]`` ``parent_from_node`` rotations (node 0: the root's world one).
        root_linear_velocities: ``[n, 3]`` m/s, root origin velocity in world.
        root_angular_velocities: ``[n, 3]`` rad/s, root angular velocity in world.
        local_translations: ``[n, B, 3]`` m per-frame ``parent_from_node`` translations, or ``None`` when
            the library stores none (the skeleton's rest translations apply).
        backend_state: what the adapter's ``pack_sample`` returned (simulator-native tensors), or ``None``.
        interpolated: ``False`` for :meth:`MotionLibrary.sample_frames` (exact stored frames).
    """

    motion_ids: Any
    times: Any
    frame0: Any
    frame1: Any
    blend: Any
    loop_offsets: Any
    root_positions: Any
    root_rotations_wxyz: Any
    local_rotations_wxyz: Any
    root_linear_velocities: Any
    root_angular_velocities: Any
    local_translations: Any = None
    backend_state: Any = None
    interpolated: bool = True
    rows: Any = field(default=None, repr=False)

    @property
    def num_samples(self) -> int:
        return int(self.motion_ids.shape[0])

    def __len__(self) -> int:
        return self.num_samples

    def clone(self) -> MotionSample:
        """A copy that no later call overwrites (pose fields compact again, views of a new row buffer)."""
        rows = self.rows.clone()
        cols = sample_columns(self.local_rotations_wxyz.shape[1], self.local_translations is not None)
        return make_sample(
            rows,
            cols,
            motion_ids=self.motion_ids.clone(),
            times=self.times.clone(),
            frame0=self.frame0.clone(),
            frame1=self.frame1.clone(),
            blend=self.blend.clone(),
            loop_offsets=None if self.loop_offsets is None else self.loop_offsets.clone(),
            backend_state=self.backend_state,
            interpolated=self.interpolated,
        )


@dataclass(frozen=True, eq=False)
class BodyState:
    """World-frame state of every body (node) of the skeleton for ``n`` samples.

    Attributes:
        body_positions: ``[n, B, 3]`` m, world.
        body_rotations_wxyz: ``[n, B, 4]`` ``world_from_body``.
        body_linear_velocities: ``[n, B, 3]`` m/s, world (``None`` from
            :meth:`MotionLibrary.forward_kinematics`).
        body_angular_velocities: ``[n, B, 3]`` rad/s, world (``None`` from ``forward_kinematics``).
        rows: ``[n, 13 B]`` the buffer the fields of :meth:`MotionLibrary.sample_kinematics` view (positions,
            rotations, linear and angular velocities, body-major), or ``None``.
    """

    body_positions: Any
    body_rotations_wxyz: Any
    body_linear_velocities: Any = None
    body_angular_velocities: Any = None
    rows: Any = field(default=None, repr=False)


@dataclass(frozen=True, eq=False)
class PackedMotionBuffers:
    """The library's persistent tensors (borrowed views: valid until ``add_motions`` or ``to``).

    Frame-major fields have ``F = total_frames`` rows; clip ``c`` owns rows
    ``clip_frame_start[c] : clip_frame_start[c] + clip_frame_count[c]``. Per-frame fields are strided views
    of ``frames_packed`` / ``kinematics_packed`` / ``backend_packed`` (``.contiguous()`` copies them).

    Attributes:
        frames_packed: ``[F, D]`` canonical rows (the column order: :mod:`kangengine.animation.library`).
        root_positions: ``[F, 3]`` m, world.
        root_rotations_wxyz: ``[F, 4]``.
        local_rotations_wxyz: ``[F, B, 4]`` (hemisphere-continuous along each clip).
        root_linear_velocities, root_angular_velocities: ``[F, 3]`` m/s, rad/s, world.
        local_translations: ``[F, B, 3]`` m, or ``None``.
        kinematics_packed: ``[F, 13 B]`` or ``None`` (without ``precompute_kinematics``).
        global_positions: ``[F, B, 3]`` m, world body positions, or ``None``.
        global_rotations_wxyz: ``[F, B, 4]`` ``world_from_body``, or ``None``.
        global_linear_velocities, global_angular_velocities: ``[F, B, 3]`` m/s, rad/s, world, or ``None``.
        clip_frame_start, clip_frame_count: ``[C] int64``.
        clip_fps, clip_weight, clip_duration: ``[C] float64`` (1/s, unnormalised weight, s).
        clip_loop_displacement: ``[C, 3] float64`` m: ``root[last] - root[first]`` with z = 0.
        backend_packed: ``[F, Db]`` or ``None``; backend: ``{name: [F, ...] view}`` of the adapter's arrays.
    """

    frames_packed: Any
    root_positions: Any
    root_rotations_wxyz: Any
    local_rotations_wxyz: Any
    root_linear_velocities: Any
    root_angular_velocities: Any
    local_translations: Any
    kinematics_packed: Any
    global_positions: Any
    global_rotations_wxyz: Any
    global_linear_velocities: Any
    global_angular_velocities: Any
    clip_frame_start: Any
    clip_frame_count: Any
    clip_fps: Any
    clip_weight: Any
    clip_duration: Any
    clip_loop_displacement: Any
    backend_packed: Any
    backend: dict


def make_sample(rows, cols: SampleColumns, **kw) -> MotionSample:
    """A :class:`MotionSample` whose pose fields view ``rows [n, cols.width]``; ``kw``: the other fields."""
    rot = rows[:, cols.rot].unflatten(1, (cols.bodies, 4))
    return MotionSample(
        root_positions=rows[:, cols.root],
        root_rotations_wxyz=rot[:, 0],
        local_rotations_wxyz=rot,
        root_linear_velocities=rows[:, cols.lin],
        root_angular_velocities=rows[:, cols.ang],
        local_translations=None if cols.trans is None else rows[:, cols.trans].unflatten(1, (cols.bodies, 3)),
        rows=rows,
        **kw,
    )
