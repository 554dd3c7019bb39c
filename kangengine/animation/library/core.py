"""`MotionLibrary`: many clips packed frame-major in torch tensors, sampled for thousands of environments.

Storage (one skeleton for every clip; all clips concatenated frame after frame, "packed" in the
pytorch3d sense):

* ``frames_packed [total_frames, D]``: one row per stored frame holding, in this order, the root position
  (3, m, world), the local rotations ``parent_from_node`` WXYZ of every node (``4 * bodies``; node 0's is
  the root's world rotation), the root linear velocity (3, m/s, world), the root angular velocity
  (3, rad/s, world) and, when any clip has them, the per-frame local translations (``3 * bodies``, m).
* ``kinematics_packed [total_frames, 13 * bodies]`` (``precompute_kinematics=True``): global positions,
  global rotations WXYZ, linear and angular velocities of every body, all in world.
* ``backend_packed [total_frames, Db]`` (with an adapter): the adapter's per-frame native arrays.
* per clip: ``clip_frame_start``, ``clip_frame_count``, ``clip_fps``, ``clip_weight``, ``clip_duration``.

Velocities are defined once, at registration, from the stored frames of each clip (the same scheme as
:attr:`SkeletonMotion.global_velocity` / :attr:`SkeletonMotion.global_angular_velocity`): linear
velocity ``(p[i+1] - p[i-1]) / (2 dt)`` and angular velocity ``log(q[i+1] q[i-1]^-1) / (2 dt)`` (world
frame, left-multiplicative: ``q(t + h) = exp(w h) q(t)``) inside a clip, one-sided differences at its first
and last frame, zero for a one-frame clip; ``dt = 1 / clip fps``. Differences never cross clip boundaries.

Sampling gathers the two stored frames around each query time with one ``index_select`` of whole rows and
blends them with one ``torch.lerp``; quaternions are then renormalised (normalised lerp, "nlerp"). The
stored quaternions are made hemisphere-continuous along each clip at registration (``q`` and ``-q`` are the
same rotation), so neighbouring frames never need a sign flip. Between two neighbouring mocap frames the
rotation is small and nlerp equals slerp to well below float32 resolution of practical interest: for a
relative rotation ``theta`` between the frames the largest angular difference is
``nlerp_max_error(theta) ~= theta**3 / (144 sqrt(3)) ~= theta**3 / 249`` rad (4e-6 rad for 0.1 rad between
frames, 5e-4 rad for 0.5 rad); pass
``interpolation="slerp"`` for exact slerp. ``tests/test_library.py`` measures both on real clips.

Nothing in :meth:`MotionLibrary.sample` loops over environments in Python or synchronises with the
device (no ``.item()``, no data-dependent shapes); input checks that would need the device's data run only
on host inputs (lists, numpy arrays, CPU tensors) unless ``check=True`` is passed. The methods can be
captured in a CUDA graph (call once before capturing, as for any torch code).
"""

from __future__ import annotations

import enum
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ... import rotations as R
from ..._files import atomic_write
from ...errors import (
    FileMissingError,
    FormatError,
    KangEngineError,
    LayoutMismatch,
    LayoutSignatureWarning,
    MixedSkeletonError,
    MotionError,
    NonFiniteError,
    ShapeError,
    UnknownMotionError,
    UnknownNameError,
)
from ..skeleton import SkeletonMotion, SkeletonTree

__all__ = [
    "MotionLibrary",
    "MotionSample",
    "BodyState",
    "PackedMotionBuffers",
    "Interpolation",
    "UnknownMotionError",
    "MixedSkeletonError",
    "nlerp_max_error",
    "LIBRARY_FORMAT",
    "LIBRARY_FORMAT_VERSION",
]

LIBRARY_FORMAT = "kangengine.motion_library"
LIBRARY_FORMAT_VERSION = 1
_GROUP_FRAMES = 1 << 17  # frames registered per numpy chunk (bounds float64 temporaries)


class Interpolation(str, enum.Enum):
    """How rotations are blended between two neighbouring stored frames."""

    #: normalised lerp (one fused lerp over the whole row, then renormalise); see the module docstring
    NLERP = "nlerp"
    #: spherical linear interpolation (constant angular speed; costs a few more operations)
    SLERP = "slerp"


def nlerp_max_error(theta):
    """Largest angle (rad) between ``nlerp(q0, q1, t)`` and ``slerp(q0, q1, t)`` over ``t`` in [0, 1].

    Args:
        theta: rotation angle between ``q0`` and ``q1`` (rad, in ``[0, pi]``), a float or numpy array.
    Returns:
        The same shape, rad. With ``a = theta / 2`` (the quaternions' half angle) nlerp reaches the 4-D angle
        ``atan2(t sin a, 1 - t + t cos a)`` where slerp reaches ``t a``; the rotation error is twice the
        difference, maximised over ``t`` (on a fine grid). For small angles the difference is
        ``a**3 t (1 - t)(1 - 2t) / 3``, largest at ``t = (3 - sqrt(3)) / 6``: ``theta**3 / (144 sqrt(3))``.
    """
    a = np.asarray(theta, dtype=np.float64)[..., None] / 2
    t = np.linspace(0.0, 1.0, 2001)
    phi = np.arctan2(t * np.sin(a), 1 - t + t * np.cos(a))
    return 2 * np.abs(phi - t * a).max(axis=-1)


# ---------------------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------------------


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
        cols = _sample_columns(self.local_rotations_wxyz.shape[1], self.local_translations is not None)
        return _make_sample(
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
        frames_packed: ``[F, D]`` canonical rows (see the module docstring for the column order).
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


# ---------------------------------------------------------------------------------------------------------
# column layouts
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SampleColumns:
    bodies: int
    root: slice
    rot: slice
    lin: slice
    ang: slice
    trans: slice | None
    width: int


def _sample_columns(bodies: int, has_translations: bool) -> _SampleColumns:
    r = 3 + 4 * bodies
    trans = slice(r + 6, r + 6 + 3 * bodies) if has_translations else None
    return _SampleColumns(
        bodies,
        slice(0, 3),
        slice(3, r),
        slice(r, r + 3),
        slice(r + 3, r + 6),
        trans,
        r + 6 + (3 * bodies if has_translations else 0),
    )


def _make_sample(rows, cols: _SampleColumns, **kw) -> MotionSample:
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


def _kin_views(rows, b: int):
    return (
        rows[:, 0 : 3 * b].unflatten(1, (b, 3)),
        rows[:, 3 * b : 7 * b].unflatten(1, (b, 4)),
        rows[:, 7 * b : 10 * b].unflatten(1, (b, 3)),
        rows[:, 10 * b : 13 * b].unflatten(1, (b, 3)),
    )


# clip table columns (float64): fps, duration, loop period, start, last frame, loop displacement x y z
_FPS, _DUR, _PERIOD, _START, _LAST, _DISP = 0, 1, 2, 3, 4, slice(5, 8)


# ---------------------------------------------------------------------------------------------------------
# registration helpers (numpy, float64)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Clip:
    name: str
    motion: SkeletonMotion  # canonical, numpy
    source: Any  # what the user passed
    metadata: dict


def _np(x):
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


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


def _normalize_quats_(quats, ones4=None) -> None:
    """Normalise ``quats [n, 4 k]`` (k WXYZ quaternions per row, possibly a strided view) in place.

    With ``ones4`` (a ``[4]`` tensor of ones, the CPU strategy): a reduction or broadcast over an inner
    dimension of 4 is slow in torch on the CPU, so the squared norms come from one matrix-vector product
    and the scale is expanded before one flat multiply. Without it (GPU): ``vector_norm`` and a broadcast
    divide, two kernels."""
    import torch

    n, k4 = quats.shape
    if ones4 is not None and n > 0:
        inv = torch.matmul(quats.square().view(n * (k4 // 4), 4), ones4).rsqrt_()
        quats.mul_(inv.view(n, k4 // 4).repeat_interleave(4, dim=1))
    else:
        q = quats.unflatten(1, (k4 // 4, 4))
        q.div_(torch.linalg.vector_norm(q, dim=-1, keepdim=True))


def _add_offsets_(positions, offsets, tile3=None) -> None:
    """``positions [n, 3 k] += offsets [n, 3]`` for each of the k bodies; with ``tile3`` (``[3, 3 k]``, k
    identity blocks side by side, the CPU strategy) as one small GEMM, else as a broadcast add."""
    if tile3 is not None:
        positions.addmm_(offsets, tile3)
    else:
        positions.unflatten(1, (-1, 3)).add_(offsets[:, None, :])


def _loop_displacement(root_positions):
    d = root_positions[-1] - root_positions[0]
    return np.array([d[0], d[1], 0.0])


# ---------------------------------------------------------------------------------------------------------
# the library
# ---------------------------------------------------------------------------------------------------------


class MotionLibrary:
    """Reference clips packed in torch tensors for weighted sampling over many environments.

    Args:
        motions: ``SkeletonMotion`` or ``ArticulationMotion`` clips (at least one), all on one skeleton.
            An ``ArticulationMotion`` is converted with ``ArticulationMotionMapper(layout)
            .to_skeleton_motion`` (its layout must not have prismatic joints: skeleton motion cannot
            represent them).
        adapter: optional simulator adapter (:class:`~kangengine.adapters.MotionAdapter`): its
            ``prepare_motion`` runs once per clip here, and every sample carries its ``pack_sample``
            result in ``sample.backend_state``.
        layout: the :class:`ArticulationCoordinateLayout` of ``ArticulationMotion`` inputs (default:
            ``adapter.layout``); its ``model_signature`` is stored as :attr:`layout_signature`.
        device: torch device of every buffer.
        precompute_kinematics: also store global body transforms and velocities per frame, for
            :meth:`sample_kinematics` (13 floats per body per frame).
        keep_source_motions: keep the motions as given, for :meth:`motion`.
        weights: ``[clips]`` sampling weights (>= 0, finite, not all zero); 1 per clip by default.
        names: clip names (default: ``metadata["name"]``, the stem of ``metadata["source"]``, or
            ``"motion_<id>"``).
        dtype: ``torch.float32`` (default) or ``torch.float64`` for every stored float.
        interpolation: :class:`Interpolation` (``"nlerp"`` default, or ``"slerp"``).

    A library reuses internal scratch buffers between calls: sample from one thread at a time (or one
    library per thread).

    Raises:
        MotionError: no motions, a motion of another type, prismatic joints, bad weights.
        MixedSkeletonError: clips on different skeletons.
        LayoutMismatch: an ``ArticulationMotion`` made for another layout.
    """

    def __init__(
        self,
        motions,
        *,
        adapter=None,
        layout=None,
        device="cpu",
        precompute_kinematics: bool = False,
        keep_source_motions: bool = False,
        weights=None,
        names=None,
        dtype=None,
        interpolation: Interpolation | str = Interpolation.NLERP,
    ):
        import torch

        self.adapter = adapter
        self.layout = layout if layout is not None else getattr(adapter, "layout", None)
        self.layout_signature = None if self.layout is None else str(self.layout.model_signature)
        self.device = torch.device(device)
        self.dtype = torch.float32 if dtype is None else dtype
        if self.dtype not in (torch.float32, torch.float64):
            raise FormatError(f"dtype {self.dtype}; expected torch.float32 or torch.float64", item="dtype")
        self.precompute_kinematics = bool(precompute_kinematics)
        self.keep_source_motions = bool(keep_source_motions)
        self.interpolation = Interpolation(interpolation)
        self.skeleton_tree: SkeletonTree | None = None
        self._mapper = None
        self._sources: list = []
        self._names: list[str] = []
        self._clip_metadata: list[dict] | None = []
        self._clip_metadata_raw = None
        self._frames = self._kin = self._backend = None
        self._backend_fields: list[tuple[str, tuple[int, ...]]] | None = None
        self._const_cache: dict = {}
        self._scratch_cache: dict = {}
        self._host = {
            "count": np.zeros(0, np.int64),
            "start": np.zeros(0, np.int64),
            "fps": np.zeros(0),
            "duration": np.zeros(0),
            "weight": np.zeros(0),
            "disp": np.zeros((0, 3)),
        }
        motions = list(motions) if motions is not None else []
        if not motions:
            raise MotionError("a MotionLibrary needs at least one motion; got none", item="motions")
        self.add_motions(motions, weights=weights, names=names)

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def num_motions(self) -> int:
        """Number of clips."""
        return len(self._names)

    def __len__(self) -> int:
        return self.num_motions

    @property
    def total_frames(self) -> int:
        """Stored frames over all clips."""
        return int(self._frames.shape[0])

    @property
    def num_bodies(self) -> int:
        return self.skeleton_tree.num_nodes

    @property
    def body_names(self) -> tuple[str, ...]:
        return self.skeleton_tree.node_names

    @property
    def clip_names(self) -> tuple[str, ...]:
        return tuple(self._names)

    @property
    def has_local_translations(self) -> bool:
        return self._cols.trans is not None

    def clip_metadata(self, motion_id: int) -> dict:
        """The metadata dict of clip ``motion_id`` (as registered; kept in library files)."""
        i = int(motion_id)
        if not 0 <= i < self.num_motions:
            raise UnknownMotionError(
                f"motion id {i} does not exist; ids are 0..{self.num_motions - 1}", item="motion_id"
            )
        return self._metadata_list()[i]

    def _metadata_list(self) -> list[dict]:
        if self._clip_metadata is None:
            raw, self._clip_metadata_raw = self._clip_metadata_raw, None
            items = json.loads(bytes(raw.numpy()).decode()) if raw is not None and raw.numel() else []
            self._clip_metadata = items if len(items) == self.num_motions else [{} for _ in range(self.num_motions)]
        return self._clip_metadata

    def clip_index(self, name: str) -> int:
        """Id of the clip called ``name``; :class:`UnknownNameError` listing the names otherwise."""
        try:
            return self._names.index(name)
        except ValueError:
            shown = ", ".join(self._names[:20]) + (" ..." if len(self._names) > 20 else "")
            raise UnknownNameError(f"no clip {name!r}; clips are: {shown}") from None

    def motion(self, motion_id: int):
        """The clip ``motion_id`` as it was registered (needs ``keep_source_motions=True``).

        Raises:
            MotionError: the library was built without ``keep_source_motions=True`` (or loaded from a file).
            UnknownMotionError: no such id.
        """
        if not self.keep_source_motions:
            raise MotionError(
                "source motions are not kept; build the library with keep_source_motions=True to use motion(id)",
                item="motion",
            )
        i = int(motion_id)
        if not 0 <= i < self.num_motions:
            raise UnknownMotionError(
                f"motion id {i} does not exist; ids are 0..{self.num_motions - 1}", item="motion_id"
            )
        return self._sources[i]

    def __repr__(self) -> str:
        return (
            f"MotionLibrary(clips={self.num_motions}, frames={self.total_frames}, bodies={self.num_bodies}, "
            f"device={self.device}, dtype={self.dtype}, kinematics={self.precompute_kinematics}, "
            f"adapter={type(self.adapter).__name__ if self.adapter is not None else None})"
        )

    # -- registration ------------------------------------------------------------------------------------
    def add_motions(self, motions, *, weights=None, names=None) -> None:
        """Append clips (ids continue after the existing ones).

        The packed tensors are rebuilt: tensors and views obtained before (``packed_buffers()``, earlier
        samples' ``frame0``/``frame1`` meaning stays valid) do not see the new clips; take them again.

        Args:
            motions: ``SkeletonMotion`` / ``ArticulationMotion`` clips on the library's skeleton.
            weights: their sampling weights (1 each by default).
            names: their names.
        """
        motions = list(motions)
        if not motions:
            return
        first_id = self.num_motions
        if names is not None:
            names = [str(x) for x in names]
            if len(names) != len(motions):
                raise ShapeError(f"{len(names)} names for {len(motions)} motions", item="names")
        w = np.ones(len(motions)) if weights is None else np.asarray(_np(weights), dtype=np.float64).reshape(-1)
        if w.shape != (len(motions),):
            raise ShapeError(f"{w.size} weights for {len(motions)} motions", item="weights")
        if not np.isfinite(w).all() or (w < 0).any():
            raise MotionError(f"weights must be finite and >= 0; got {w.tolist()[:10]}", item="weights")
        if self._host["weight"].sum() + w.sum() <= 0:
            raise MotionError("all sampling weights are zero; expected at least one > 0", item="weights")
        clips = [self._canonical(m, first_id + k, None if names is None else names[k]) for k, m in enumerate(motions)]
        self._append(clips, w)

    def _canonical(self, m, motion_id: int, name: str | None) -> _Clip:
        from ..motion import ArticulationMotion

        if isinstance(m, ArticulationMotion):
            sm = self._from_articulation(m, motion_id)
        elif isinstance(m, SkeletonMotion):
            sm = m
        else:
            raise MotionError(
                f"motion {motion_id} is a {type(m).__name__}; expected SkeletonMotion or ArticulationMotion",
                item=f"motions[{motion_id}]",
            )
        if self.skeleton_tree is None:
            self.skeleton_tree = sm.tree
        elif sm.tree is not self.skeleton_tree and not sm.tree.same_as(self.skeleton_tree):
            raise MixedSkeletonError(
                _skeleton_difference(self.skeleton_tree, sm.tree, motion_id), item=f"motions[{motion_id}]"
            )
        meta = dict(getattr(m, "metadata", {}) or {})
        if name is None:
            src = meta.get("source") or meta.get("source_file")
            name = meta.get("name") or (Path(str(src)).stem if src else None)
            name = str(name) if name else f"motion_{motion_id}"
        return _Clip(name=name, motion=sm.numpy(), source=m, metadata=meta)

    def _from_articulation(self, m, motion_id: int) -> SkeletonMotion:
        from ...asset.desc import JointType

        if self.layout is None:
            raise LayoutMismatch(
                f"motion {motion_id} is an ArticulationMotion; pass layout= (or an adapter) so "
                "the library can convert it to skeleton motion",
                item=f"motions[{motion_id}]",
            )
        slides = [b.joint_name for b in self.layout.blocks if b.joint_type is JointType.SLIDE]
        if slides:
            raise MotionError(
                f"motion {motion_id}: the layout has prismatic (slide) joints {slides}; skeleton "
                "motion, the library's canonical storage, cannot represent them",
                item=f"motions[{motion_id}]",
            )
        m.check_layout(self.layout, what=f"motion {motion_id}")
        if self._mapper is None:
            from ..mapper import ArticulationMotionMapper

            self._mapper = ArticulationMotionMapper(self.layout)
        return self._mapper.to_skeleton_motion(m)

    def _append(self, clips: list[_Clip], weights: np.ndarray) -> None:
        import torch

        tree = self.skeleton_tree
        nb = tree.num_nodes
        metadata = self._metadata_list()  # (decoded before the clip count changes)
        counts = np.array([c.motion.num_frames for c in clips], dtype=np.int64)
        fps = np.array([c.motion.fps for c in clips], dtype=np.float64)
        has_trans = (self._frames is not None and self._cols.trans is not None) or any(
            c.motion.local_translation is not None for c in clips
        )
        cols = _sample_columns(nb, has_trans)
        new_f = int(counts.sum())
        np_dtype = np.float32 if self.dtype == torch.float32 else np.float64
        frames = np.empty((new_f, cols.width), dtype=np_dtype)
        kin = np.empty((new_f, 13 * nb), dtype=np_dtype) if self.precompute_kinematics else None
        disp = np.zeros((len(clips), 3))
        # group clips so that float64 temporaries stay bounded
        starts = np.concatenate([[0], np.cumsum(counts)])
        g0 = 0
        while g0 < len(clips):
            g1 = g0 + 1
            while g1 < len(clips) and starts[g1 + 1] - starts[g0] <= _GROUP_FRAMES:
                g1 += 1
            self._pack_group(
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
        backend = self._prepare_backend(clips, counts, np_dtype)

        # merge with what is stored
        dev = self.device
        frames_t = torch.from_numpy(frames).to(dev)
        if self._frames is not None:
            old = self._frames
            if self._cols.trans is None and cols.trans is not None:  # widen: rest translations for old clips
                rest = torch.tensor(tree.local_translation.reshape(1, -1), dtype=self.dtype, device=dev)
                old = torch.cat([old, rest.expand(old.shape[0], -1)], dim=1)
            frames_t = torch.cat([old, frames_t])
        kin_t = None if kin is None else torch.from_numpy(kin).to(dev)
        if kin_t is not None and self._kin is not None:
            kin_t = torch.cat([self._kin, kin_t])
        if backend is not None:
            backend_t = torch.from_numpy(backend).to(dev)
            self._backend = backend_t if self._backend is None else torch.cat([self._backend, backend_t])
        self._frames, self._kin, self._cols = frames_t, kin_t, cols
        self._scratch_cache.clear()

        h = self._host
        h["count"] = np.concatenate([h["count"], counts])
        h["fps"] = np.concatenate([h["fps"], fps])
        h["duration"] = np.concatenate([h["duration"], (counts - 1) / fps])
        h["weight"] = np.concatenate([h["weight"], weights])
        h["disp"] = np.concatenate([h["disp"], disp])
        h["start"] = np.concatenate([[0], np.cumsum(h["count"])[:-1]]).astype(np.int64)
        self._names += [c.name for c in clips]
        metadata.extend(c.metadata for c in clips)
        if self.keep_source_motions:
            self._sources += [c.source for c in clips]
        self._build_clip_tensors()

    def _pack_group(self, clips, counts, fps, cols, frames_out, kin_out) -> None:
        tree = self.skeleton_tree
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

    def _prepare_backend(self, clips, counts, np_dtype):
        if self.adapter is None:
            return None
        parts: list[np.ndarray] = []
        for k, c in enumerate(clips):
            arrays = self.adapter.prepare_motion(c.source, skeleton_motion=c.motion)
            if not isinstance(arrays, dict) or not arrays:
                raise FormatError(
                    f"{type(self.adapter).__name__}.prepare_motion returned {type(arrays).__name__}; "
                    "expected a non-empty dict of per-frame arrays",
                    item=c.name,
                )
            fields = [(str(name), tuple(np.shape(a)[1:])) for name, a in arrays.items()]
            if self._backend_fields is None:
                self._backend_fields = fields
            elif fields != self._backend_fields:
                raise FormatError(
                    f"prepare_motion returned fields {fields}; earlier clips had {self._backend_fields}", item=c.name
                )
            cols = []
            for name, a in arrays.items():
                a = _np(a)
                if a.shape[0] != counts[k]:
                    raise ShapeError(
                        f"{type(self.adapter).__name__}.prepare_motion gave {a.shape[0]} frames of "
                        f"{name!r}; the clip has {counts[k]}",
                        item=c.name,
                    )
                cols.append(a.reshape(counts[k], -1).astype(np_dtype, copy=False))
            parts.append(np.concatenate(cols, axis=1))
        return np.concatenate(parts)

    def _build_clip_tensors(self) -> None:
        import torch

        h, dev = self._host, self.device
        f64 = dict(dtype=torch.float64, device=dev)
        self.clip_frame_start = torch.as_tensor(h["start"], dtype=torch.int64, device=dev)
        self.clip_frame_count = torch.as_tensor(h["count"], dtype=torch.int64, device=dev)
        self.clip_fps = torch.as_tensor(h["fps"], **f64)
        self.clip_weight = torch.as_tensor(h["weight"], **f64)
        self.clip_duration = torch.as_tensor(h["duration"], **f64)
        self.clip_loop_displacement = torch.as_tensor(h["disp"], **f64)
        period = np.where(h["duration"] > 0, h["duration"], 1.0)
        table = np.concatenate(
            [
                h["fps"][:, None],
                h["duration"][:, None],
                period[:, None],
                h["start"][:, None].astype(np.float64),
                (h["count"] - 1)[:, None].astype(np.float64),
                h["disp"],
            ],
            axis=1,
        )
        self._clip_table = torch.as_tensor(table, **f64)
        self._backend_slices = None
        if self._backend_fields is not None:
            s, out = 0, []
            for name, shape in self._backend_fields:
                w = int(np.prod(shape)) if shape else 1
                out.append((name, slice(s, s + w), shape))
                s += w
            self._backend_slices = out

    def to(self, device) -> MotionLibrary:
        """Move every buffer to ``device`` (no re-registration); returns ``self``. Views taken before
        (``packed_buffers()``, samples) stay on the old device."""
        import torch

        self.device = torch.device(device)
        self._scratch_cache.clear()
        self._frames = self._frames.to(self.device)
        self._kin = None if self._kin is None else self._kin.to(self.device)
        self._backend = None if self._backend is None else self._backend.to(self.device)
        self._build_clip_tensors()
        return self

    # -- inputs ------------------------------------------------------------------------------------------
    def _host_check(self, x, check) -> bool:
        if check is None:
            return not (type(x).__module__.startswith("torch") and x.device.type != "cpu")
        return bool(check)

    def _ids(self, motion_ids, check):
        import torch

        do = self._host_check(motion_ids, check)
        if isinstance(motion_ids, torch.Tensor):
            if motion_ids.is_floating_point() or motion_ids.is_complex() or motion_ids.dtype == torch.bool:
                raise ShapeError(f"dtype {motion_ids.dtype}; expected integer motion ids", item="motion_ids")
            ids = motion_ids.to(device=self.device, dtype=torch.int64)
        else:
            a = np.asarray(motion_ids)
            if a.dtype.kind not in "iu":
                if a.size == 0:
                    a = a.astype(np.int64)
                else:
                    raise ShapeError(f"dtype {a.dtype}; expected integer motion ids", item="motion_ids")
            ids = torch.as_tensor(a.astype(np.int64, copy=False), device=self.device)
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim != 1:
            raise ShapeError(f"shape {tuple(ids.shape)}; expected [n] motion ids", item="motion_ids")
        if do:
            a = _np(motion_ids).reshape(-1)
            bad = (a < 0) | (a >= self.num_motions)
            if bad.any():
                i = int(np.argmax(bad))
                raise UnknownMotionError(
                    f"motion id {int(a[i])} (entry {i}) does not exist; the library holds ids "
                    f"0..{self.num_motions - 1}",
                    item="motion_ids",
                )
        return ids

    def _times(self, times, check, what: str = "times"):
        import torch

        do = self._host_check(times, check)
        if isinstance(times, torch.Tensor):
            t = times.to(device=self.device, dtype=torch.float64)
        else:
            a = np.asarray(times, dtype=np.float64)
            t = torch.as_tensor(a, device=self.device)
        if t.ndim == 0:
            t = t.reshape(1)
        if t.ndim != 1:
            raise ShapeError(f"shape {tuple(t.shape)}; expected [n] (one per motion id) or a scalar", item=what)
        if do:
            a = _np(times).astype(np.float64).reshape(-1)
            bad = ~np.isfinite(a)
            if bad.any():
                i = int(np.argmax(bad))
                raise NonFiniteError(f"{what[:-1]} {a[i]} at entry {i} is not finite; expected seconds >= 0", item=what)
            if (a < 0).any():
                i = int(np.argmax(a < 0))
                raise MotionError(f"{what[:-1]} {a[i]} s at entry {i} is negative; expected >= 0", item=what)
        return t

    @staticmethod
    def _broadcast(ids, x, what: str):
        """``ids [n]`` and ``x [n]`` (either may have one entry, repeated for all)."""
        n, m = ids.shape[0], x.shape[0]
        if n == m:
            return ids, x
        if m == 1:
            return ids, x.expand(n)
        if n == 1:
            return ids.expand(m), x
        raise ShapeError(f"{m} {what} for {n} motion ids; expected one each (or a single one for all)", item=what)

    # -- sampling ----------------------------------------------------------------------------------------
    def sample_motion_ids(self, n: int, *, generator=None):
        """``[n] int64`` clip ids drawn with replacement, with probability proportional to ``clip_weight``.

        ``generator`` (a ``torch.Generator`` on the library's device) makes draws reproducible."""
        import torch

        if int(n) < 0:
            raise ShapeError(f"n = {n}; expected >= 0", item="n")
        if int(n) == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        return torch.multinomial(self.clip_weight, int(n), replacement=True, generator=generator)

    def sample_times(self, motion_ids, *, truncate_time: float = 0.0, generator=None, check=None):
        """``[n] float64`` times (s) uniform in ``[0, duration - truncate_time]`` of each clip (0 when the
        clip is shorter than ``truncate_time``)."""
        import torch

        tt = float(truncate_time)
        if not (math.isfinite(tt) and tt >= 0):
            raise MotionError(f"truncate_time {truncate_time}; expected a finite number >= 0", item="truncate_time")
        ids = self._ids(motion_ids, check)
        span = (self._clip_table[:, _DUR].index_select(0, ids) - tt).clamp_(min=0.0)
        return torch.rand(ids.shape, dtype=torch.float64, device=self.device, generator=generator) * span

    def sample(self, motion_ids, times, *, loop: bool = True, check: bool | None = None, out=None) -> MotionSample:
        """Poses of clips ``motion_ids`` at ``times``, blended between the two neighbouring stored frames.

        Args:
            motion_ids: ``[n]`` integer clip ids (list, numpy, tensor).
            times: ``[n]`` seconds >= 0 (or a scalar for all); frame ``k`` of a clip is at ``k / clip_fps``.
            loop: ``True``: time wraps modulo the clip duration ``(frames - 1) / fps`` and the root's
                horizontal displacement over the clip is added once per completed loop (so a looping walk
                keeps walking); ``False``: time clamps to ``[0, duration]``.
            check: ``None`` (default) checks host inputs (ids exist, times finite and >= 0) and skips device
                tensors (checking them would synchronise); ``True`` always checks; ``False`` never (hot path;
                out-of-range ids then read garbage or fail inside torch).
            out: a previous :class:`MotionSample` with the same ``n`` (and local translations): its row
                buffer is overwritten in place (no allocation for the pose fields; samples that shared it
                change too). ``None``: a new buffer.

        Returns:
            :class:`MotionSample`; positions lerp, rotations nlerp (or slerp, see ``interpolation``),
            velocities lerp.
        """
        import torch

        ids, t = self._broadcast(self._ids(motion_ids, check), self._times(times, check), "times")
        n = ids.shape[0]
        clip = self._clip_table.index_select(0, ids)
        fps, dur = clip[:, _FPS], clip[:, _DUR]
        if loop:
            cycles = torch.div(t, clip[:, _PERIOD], rounding_mode="floor")
            local_t = torch.addcmul(t, cycles, dur, value=-1.0)
        else:
            local_t = torch.minimum(t, dur)
        pos = local_t * fps
        last = clip[:, _LAST]
        f0 = torch.minimum(torch.floor(pos), last)
        blend = (pos - f0).clamp_(0.0, 1.0).to(self.dtype)
        g = (torch.stack((f0, torch.minimum(f0 + 1.0, last))) + clip[:, _START]).to(torch.int64).reshape(-1)
        cols = self._cols
        buf = self._out_rows(out, n)
        w = blend[:, None]
        self._blend_rows(self._frames, g[:n], g[n:], w, buf, cols.rot)
        offsets = None
        if loop:
            offsets = (cycles[:, None] * clip[:, _DISP]).to(self.dtype)
            buf[:, cols.root] += offsets
        backend = None
        if self.adapter is not None:
            b = self._backend.index_select(0, g)
            backend = self.adapter.pack_sample(
                self._backend_dict(b[:n]), self._backend_dict(b[n:]), blend, root_offset=offsets
            )
        return _make_sample(
            buf,
            cols,
            motion_ids=ids,
            times=t,
            frame0=g[:n],
            frame1=g[n:],
            blend=blend,
            loop_offsets=offsets,
            backend_state=backend,
            interpolated=True,
        )

    def sample_frames(self, motion_ids, frames, *, check: bool | None = None, out=None) -> MotionSample:
        """The stored frames ``frames`` (clip-local indices ``[n]``) of clips ``motion_ids``, bit for bit.

        ``times`` of the result are ``frames / clip_fps``; ``blend`` is 0 and ``frame0 == frame1``.

        Raises:
            UnknownMotionError: an id out of range; MotionError: a frame outside ``[0, frames)`` of its clip
            (host inputs, or ``check=True``).
        """
        import torch

        ids = self._ids(motion_ids, check)
        if isinstance(frames, torch.Tensor):
            if frames.is_floating_point():
                raise ShapeError(f"dtype {frames.dtype}; expected integer frame indices", item="frames")
            f = frames.to(device=self.device, dtype=torch.int64)
        else:
            a = np.asarray(frames)
            if a.dtype.kind not in "iu":
                raise ShapeError(f"dtype {a.dtype}; expected integer frame indices", item="frames")
            f = torch.as_tensor(a.astype(np.int64), device=self.device)
        f = f.reshape(-1) if f.ndim == 0 else f
        if f.ndim != 1:
            raise ShapeError(f"shape {tuple(f.shape)}; expected [n] frame indices or a scalar", item="frames")
        ids, f = self._broadcast(ids, f, "frames")
        n = ids.shape[0]
        if self._host_check(frames, check) and self._host_check(motion_ids, check):
            fa = np.broadcast_to(_np(frames).reshape(-1), (n,))
            ia = np.broadcast_to(_np(motion_ids).reshape(-1), (n,))
            cnt = self._host["count"][ia]
            bad = (fa < 0) | (fa >= cnt)
            if bad.any():
                i = int(np.argmax(bad))
                raise MotionError(
                    f"frame {int(fa[i])} (entry {i}) is outside clip {int(ia[i])}, which has {int(cnt[i])} frames",
                    item="frames",
                )
        g = self.clip_frame_start.index_select(0, ids) + f
        buf = self._out_rows(out, n)
        torch.index_select(self._frames, 0, g, out=buf)
        blend = torch.zeros(n, dtype=self.dtype, device=self.device)
        t = f.to(torch.float64) / self.clip_fps.index_select(0, ids)
        backend = None
        if self.adapter is not None:
            b = self._backend_dict(self._backend.index_select(0, g))
            backend = self.adapter.pack_sample(b, b, blend, root_offset=None)
        return _make_sample(
            buf,
            self._cols,
            motion_ids=ids,
            times=t,
            frame0=g,
            frame1=g,
            blend=blend,
            loop_offsets=None,
            backend_state=backend,
            interpolated=False,
        )

    def _out_rows(self, out, n: int):
        import torch

        if out is None:
            return torch.empty((n, self._cols.width), dtype=self.dtype, device=self.device)
        rows = out.rows
        if (
            rows is None
            or tuple(rows.shape) != (n, self._cols.width)
            or rows.dtype != self.dtype
            or rows.device != self.device
        ):
            raise ShapeError(
                f"out holds rows {None if rows is None else tuple(rows.shape)}; expected "
                f"({n}, {self._cols.width}) {self.dtype} on {self.device}",
                item="out",
            )
        return rows

    def _blend_rows(self, table, frame0, frame1, w, out, quat_cols: slice) -> None:
        """``out = blend(table[frame0], table[frame1], w)``: gather frame0 rows straight into ``out``, lerp in
        place towards the frame1 rows, then renormalise (or slerp) the quaternion columns."""
        import torch

        torch.index_select(table, 0, frame0, out=out)
        r1 = self._scratch(table, frame1.shape[0])
        torch.index_select(table, 0, frame1, out=r1)
        if self.interpolation is Interpolation.SLERP:
            q = R.quat_slerp(out[:, quat_cols].unflatten(1, (-1, 4)), r1[:, quat_cols].unflatten(1, (-1, 4)), w)
            out.lerp_(r1, w)
            out[:, quat_cols] = q.flatten(1)
        else:
            out.lerp_(r1, w)
            self._normalize_(out[:, quat_cols])

    def _scratch(self, table, n: int):
        """A reused ``[n, width]`` buffer for the frame1 rows of ``table`` (large fresh buffers would be
        page-faulted in on every call on the CPU). Not shared between threads: see the class docstring."""
        import torch

        key = (table.data_ptr(), tuple(table.shape), n)
        buf = self._scratch_cache.get(key)
        if buf is None:
            if len(self._scratch_cache) >= 8:
                self._scratch_cache.clear()
            buf = torch.empty((n, table.shape[1]), dtype=table.dtype, device=table.device)
            self._scratch_cache[key] = buf
        return buf

    def _normalize_(self, quats) -> None:
        cpu = quats.device.type == "cpu"
        _normalize_quats_(quats, self._consts(quats)["ones4"] if cpu else None)

    def _add_offsets_(self, positions, offsets) -> None:
        cpu = positions.device.type == "cpu"
        _add_offsets_(positions, offsets, self._consts(positions)["tile3"] if cpu else None)

    def _consts(self, like) -> dict:
        import torch

        key = (like.dtype, like.device)
        c = self._const_cache.get(key)
        if c is None:
            eye = torch.eye(3, dtype=like.dtype, device=like.device)
            c = {"ones4": torch.ones(4, dtype=like.dtype, device=like.device), "tile3": eye.repeat(1, self.num_bodies)}
            self._const_cache[key] = c
        return c

    def _backend_dict(self, rows) -> dict:
        return {name: rows[:, sl].reshape((rows.shape[0],) + shape) for name, sl, shape in self._backend_slices}

    # -- kinematics --------------------------------------------------------------------------------------
    def forward_kinematics(self, sample: MotionSample) -> BodyState:
        """World body positions and rotations of ``sample`` through the skeleton's forward kinematics
        (:meth:`SkeletonTree.kinematics.from_local`, the one FK of KangEngine); velocities are ``None``."""
        p, r = self.skeleton_tree.kinematics.from_local(
            sample.root_positions, sample.local_rotations_wxyz, sample.local_translations
        )
        return BodyState(body_positions=p, body_rotations_wxyz=r)

    def sample_kinematics(self, sample: MotionSample, *, out: BodyState | None = None) -> BodyState:
        """World body state of ``sample`` from the precomputed per-frame kinematics (needs
        ``precompute_kinematics=True``): positions lerp (plus the sample's loop offset), rotations nlerp (or
        slerp), velocities lerp, between the sample's two stored frames.

        At stored frames it equals :meth:`forward_kinematics` of the same sample (to float round-off);
        between frames it blends body transforms instead of local rotations, which differs from
        ``forward_kinematics`` by the second-order interpolation error (see ``docs/library.md``).

        ``out``: a previous result of ``sample_kinematics`` with the same ``n``, whose row buffer is
        overwritten in place (as ``out`` of :meth:`sample`).
        """
        import torch

        if self._kin is None:
            raise MotionError(
                "the library was built without precompute_kinematics=True; use "
                "forward_kinematics(sample) or rebuild with precompute_kinematics=True",
                item="sample_kinematics",
            )
        b = self.num_bodies
        n = sample.frame0.shape[0]
        if out is not None:
            rows = out.rows
            if (
                rows is None
                or tuple(rows.shape) != (n, 13 * b)
                or rows.dtype != self.dtype
                or rows.device != self.device
            ):
                raise ShapeError(
                    f"out holds rows {None if rows is None else tuple(rows.shape)}; expected ({n}, {13 * b}) "
                    f"{self.dtype} on {self.device}",
                    item="out",
                )
        else:
            rows = torch.empty((n, 13 * b), dtype=self.dtype, device=self.device)
        if not sample.interpolated:
            torch.index_select(self._kin, 0, sample.frame0, out=rows)
        else:
            self._blend_rows(self._kin, sample.frame0, sample.frame1, sample.blend[:, None], rows, slice(3 * b, 7 * b))
        if sample.loop_offsets is not None:
            self._add_offsets_(rows[:, 0 : 3 * b], sample.loop_offsets)
        p, r, v, w = _kin_views(rows, b)
        return BodyState(
            body_positions=p, body_rotations_wxyz=r, body_linear_velocities=v, body_angular_velocities=w, rows=rows
        )

    def packed_buffers(self) -> PackedMotionBuffers:
        """The persistent packed tensors (views, no copy); take them again after ``add_motions``/``to``."""
        f, c = self._frames, self._cols
        rot = f[:, c.rot].unflatten(1, (c.bodies, 4))
        kin = (None,) * 4 if self._kin is None else _kin_views(self._kin, c.bodies)
        backend = {} if self._backend is None else self._backend_dict(self._backend)
        return PackedMotionBuffers(
            frames_packed=f,
            root_positions=f[:, c.root],
            root_rotations_wxyz=rot[:, 0],
            local_rotations_wxyz=rot,
            root_linear_velocities=f[:, c.lin],
            root_angular_velocities=f[:, c.ang],
            local_translations=None if c.trans is None else f[:, c.trans].unflatten(1, (c.bodies, 3)),
            kinematics_packed=self._kin,
            global_positions=kin[0],
            global_rotations_wxyz=kin[1],
            global_linear_velocities=kin[2],
            global_angular_velocities=kin[3],
            clip_frame_start=self.clip_frame_start,
            clip_frame_count=self.clip_frame_count,
            clip_fps=self.clip_fps,
            clip_weight=self.clip_weight,
            clip_duration=self.clip_duration,
            clip_loop_displacement=self.clip_loop_displacement,
            backend_packed=self._backend,
            backend=backend,
        )

    # -- files -------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the library to one ``.safetensors`` file (no pickle), atomically (temp file + rename).

        Tensors: ``frames_packed``, optional ``kinematics_packed`` and ``backend_packed``,
        ``clip_frame_start``, ``clip_frame_count``, ``clip_fps``, ``clip_weight``, ``clip_loop_displacement``,
        ``skeleton_parent_indices``, ``skeleton_local_translation``. Metadata: ``format``,
        ``format_version`` and ``header`` (JSON: dtype, node names, layout signature, clip names and
        metadata, interpolation, adapter and its field shapes). The file holds the library in memory once
        more while it is written.
        """
        import torch
        from safetensors.torch import save

        cpu = lambda x: x.detach().to("cpu").contiguous()
        tensors = {
            "frames_packed": cpu(self._frames),
            "clip_frame_start": cpu(self.clip_frame_start),
            "clip_frame_count": cpu(self.clip_frame_count),
            "clip_fps": cpu(self.clip_fps),
            "clip_weight": cpu(self.clip_weight),
            "clip_loop_displacement": cpu(self.clip_loop_displacement),
            "skeleton_parent_indices": torch.tensor(self.skeleton_tree.parent_indices.tolist(), dtype=torch.int64),
            "skeleton_local_translation": torch.from_numpy(self.skeleton_tree.local_translation.copy()),
        }
        meta_json = json.dumps(self._metadata_list(), default=str).encode()
        tensors["clip_metadata_json"] = torch.frombuffer(bytearray(meta_json), dtype=torch.uint8)
        if self._kin is not None:
            tensors["kinematics_packed"] = cpu(self._kin)
        if self._backend is not None:
            tensors["backend_packed"] = cpu(self._backend)
        header = {
            "dtype": str(self.dtype).replace("torch.", ""),
            "node_names": list(self.skeleton_tree.node_names),
            "has_local_translations": self._cols.trans is not None,
            "precompute_kinematics": self._kin is not None,
            "interpolation": self.interpolation.value,
            "layout_signature": self.layout_signature,
            "clip_names": self._names,
            "adapter": None if self.adapter is None else _qualname(self.adapter),
            "backend_fields": None if self._backend_fields is None else [[n, list(s)] for n, s in self._backend_fields],
        }
        meta = {
            "format": LIBRARY_FORMAT,
            "format_version": str(LIBRARY_FORMAT_VERSION),
            "header": json.dumps(header, default=str),
        }
        data = save(tensors, metadata=meta)
        return atomic_write(path, lambda f: f.write(data), suffix=".safetensors")

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, device="cpu", mmap: bool = True, adapter=None, layout=None
    ) -> MotionLibrary:
        """Read a file written by :meth:`save`.

        Args:
            path: the ``.safetensors`` file.
            device: where the buffers go (one host-to-device copy from the mapped file).
            mmap: ``True``: on the CPU the buffers are the file's pages, mapped copy-on-write (nothing is
                read until used, nothing is copied); ``False``: the buffers are read into process memory.
            adapter: optional adapter; when the file holds the same adapter's frames for the same layout
                signature they are used as they are, otherwise ``prepare_motion`` runs on the stored clips.
            layout: optional layout (default ``adapter.layout``); a signature different from the file's warns
                with :class:`LayoutSignatureWarning`.

        Raises:
            FileMissingError, FormatError: no such file, not a library file, or inconsistent content.
        """
        import torch
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise FileMissingError("no such motion library file", path=path)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                meta = f.metadata() or {}
                names = set(f.keys())
                tensors = {k: f.get_tensor(k) for k in names}
        except (SafetensorError, OSError, ValueError) as exc:
            raise FormatError(f"not a readable safetensors file ({exc})", path=path) from exc
        if meta.get("format") != LIBRARY_FORMAT:
            raise FormatError(f"format is {meta.get('format')!r}; expected {LIBRARY_FORMAT!r}", path=path)
        version = int(meta.get("format_version", "0"))
        if version > LIBRARY_FORMAT_VERSION:
            raise FormatError(
                f"format_version {version} is newer than this KangEngine reads ({LIBRARY_FORMAT_VERSION})", path=path
            )
        required = (
            "frames_packed",
            "clip_frame_start",
            "clip_frame_count",
            "clip_fps",
            "clip_weight",
            "clip_loop_displacement",
            "skeleton_parent_indices",
            "skeleton_local_translation",
        )
        missing = [k for k in required if k not in names]
        if missing:
            raise FormatError(f"missing tensors {missing}", path=path)
        try:
            header = json.loads(meta["header"])
            tree = SkeletonTree(
                tuple(header["node_names"]),
                tensors["skeleton_parent_indices"].numpy(),
                tensors["skeleton_local_translation"].numpy(),
            )
        except (KeyError, ValueError, KangEngineError) as exc:
            raise FormatError(f"bad header or skeleton ({exc})", path=path) from exc
        dtype = {"float32": torch.float32, "float64": torch.float64}.get(header.get("dtype"))
        frames = tensors["frames_packed"]
        cols = _sample_columns(tree.num_nodes, bool(header.get("has_local_translations")))
        count = tensors["clip_frame_count"].numpy()
        problems = []
        if dtype is None or frames.dtype != dtype:
            problems.append(f"frames_packed is {frames.dtype}, header says {header.get('dtype')}")
        if frames.ndim != 2 or frames.shape[1] != cols.width:
            problems.append(f"frames_packed has shape {tuple(frames.shape)}; expected [frames, {cols.width}]")
        if int(count.sum()) != frames.shape[0] or (count < 1).any():
            problems.append(f"clip_frame_count sums to {int(count.sum())}; frames_packed has {frames.shape[0]} rows")
        if len(header.get("clip_names", ())) != count.shape[0]:
            problems.append(f"{len(header.get('clip_names', ()))} clip names for {count.shape[0]} clips")
        kin = tensors.get("kinematics_packed")
        if kin is not None and tuple(kin.shape) != (frames.shape[0], 13 * tree.num_nodes):
            problems.append(f"kinematics_packed has shape {tuple(kin.shape)}")
        if problems:
            raise FormatError("; ".join(problems), path=path)

        lay = layout if layout is not None else getattr(adapter, "layout", None)
        file_sig = header.get("layout_signature")
        if lay is not None and file_sig is not None and str(lay.model_signature) != file_sig:
            warnings.warn(
                f"{os.fspath(path)}: the library was made for layout signature {file_sig}; the given "
                f"layout has {lay.model_signature}: body order, joints, rest pose or limits may differ",
                LayoutSignatureWarning,
                stacklevel=2,
            )

        dev = torch.device(device)

        def place(x):
            if x is None:
                return None
            if dev.type != "cpu":
                return x.to(dev)
            return x if mmap else x.clone()

        lib = cls.__new__(cls)
        lib.adapter = adapter
        lib.layout = lay
        lib.layout_signature = file_sig if lay is None else str(lay.model_signature)
        lib.device = dev
        lib.dtype = dtype
        lib.precompute_kinematics = kin is not None
        lib.keep_source_motions = False
        lib.interpolation = Interpolation(header.get("interpolation", "nlerp"))
        lib.skeleton_tree = tree
        lib._mapper = None
        lib._sources = []
        lib._names = [str(x) for x in header["clip_names"]]
        lib._clip_metadata = None  # decoded from clip_metadata_json on first use
        lib._clip_metadata_raw = tensors.get("clip_metadata_json")
        lib._cols = cols
        lib._frames = place(frames)
        lib._kin = place(kin)
        fps = tensors["clip_fps"].numpy().astype(np.float64)
        lib._host = {
            "count": count.astype(np.int64),
            "fps": fps,
            "duration": (count - 1) / fps,
            "weight": tensors["clip_weight"].numpy().astype(np.float64),
            "disp": tensors["clip_loop_displacement"].numpy().astype(np.float64),
            "start": tensors["clip_frame_start"].numpy().astype(np.int64),
        }
        lib._backend = None
        lib._backend_fields = None
        lib._const_cache = {}
        lib._scratch_cache = {}
        stored = header.get("backend_fields")
        if stored is not None and "backend_packed" in tensors:
            same = (
                adapter is not None
                and header.get("adapter") == _qualname(adapter)
                and (file_sig is None or lay is None or str(lay.model_signature) == file_sig)
            )
            if adapter is None or same:
                lib._backend = place(tensors["backend_packed"])
                lib._backend_fields = [(str(n), tuple(int(v) for v in s)) for n, s in stored]
        lib._build_clip_tensors()
        if adapter is not None and lib._backend is None:
            stored = [lib._stored_motion(i) for i in range(lib.num_motions)]
            clips = [_Clip(name=lib._names[i], motion=m, source=m, metadata={}) for i, m in enumerate(stored)]
            np_dtype = np.float32 if dtype == torch.float32 else np.float64
            lib._backend = torch.from_numpy(lib._prepare_backend(clips, lib._host["count"], np_dtype)).to(dev)
            lib._build_clip_tensors()
        return lib

    def _stored_motion(self, i: int) -> SkeletonMotion:
        """Clip ``i`` rebuilt from the packed frames (numpy float64)."""
        s, c = int(self._host["start"][i]), int(self._host["count"][i])
        rows = self._frames[s : s + c].detach().cpu().numpy().astype(np.float64)
        cols = self._cols
        lt = None if cols.trans is None else rows[:, cols.trans].reshape(c, -1, 3)
        return SkeletonMotion(
            self.skeleton_tree,
            rows[:, cols.root],
            rows[:, cols.rot].reshape(c, -1, 4),
            float(self._host["fps"][i]),
            lt,
            metadata={"name": self._names[i]},
        )


def _qualname(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _skeleton_difference(a: SkeletonTree, b: SkeletonTree, motion_id: int) -> str:
    head = f"motion {motion_id} is on another skeleton than the library's (mixed skeletons): "
    if a.node_names != b.node_names:
        extra = sorted(set(b.node_names) - set(a.node_names))[:8]
        miss = sorted(set(a.node_names) - set(b.node_names))[:8]
        return head + (
            f"node names differ (not in the library: {extra}; missing: {miss}; "
            f"order: {list(b.node_names[:6])}... vs {list(a.node_names[:6])}...)"
        )
    if not np.array_equal(a.parent_indices, b.parent_indices):
        k = int(np.argmax(a.parent_indices != b.parent_indices))
        return head + (
            f"node {a.node_names[k]!r} has parent {int(b.parent_indices[k])}; the library's has "
            f"{int(a.parent_indices[k])}"
        )
    d = np.abs(a.local_translation - b.local_translation).max(axis=1)
    k = int(np.argmax(d))
    return head + (
        f"rest translation of node {a.node_names[k]!r} differs by {d[k]:.3g} m "
        "(retarget or rescale the clip onto one skeleton first)"
    )
