"""Skeleton types with the attribute names poselib users know.

* :class:`SkeletonTree`: node names, parent indices (parent first, root = -1) and rest local
  translations ``parent_from_node`` (m).
* :class:`SkeletonState`: a pose (or a batch of poses): world root translation, ``parent_from_node``
  rotations WXYZ (the root's is its world rotation) and, optionally, per-pose local translations for
  joints whose offsets move (BVH translation channels, joints with offset anchors).
* :class:`SkeletonMotion`: a :class:`SkeletonState` over frames, with ``fps`` and ``metadata``.

Global transforms come from the one forward-kinematics implementation in
:mod:`kangengine.animation.kinematics`. Arrays may be numpy or torch (any device); batch dimensions lead.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import conventions as C
from .. import rotations as R
from .._files import atomic_write, load_npz, npz_array, npz_json, npz_scalar, unit_quaternions
from ..errors import (
    DuplicateNameError,
    FormatError,
    KangEngineError,
    NonFiniteError,
    ShapeError,
    TopologyError,
    UnknownNameError,
)
from .kinematics import BodyKinematics, tree_plan_from_rest

__all__ = ["SkeletonTree", "SkeletonState", "SkeletonMotion", "motion_zup_from_yup", "motion_yup_from_zup"]

SKELETON_MOTION_FORMAT = "kangengine.skeleton_motion"
SKELETON_MOTION_VERSION = 1


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _as_float_array(x, name: str, *, path=None):
    if _is_torch(x):
        if not x.is_floating_point():
            x = x.double()
        return x
    a = np.asarray(x)
    if a.dtype.kind not in "f":
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            raise ShapeError(f"dtype {a.dtype} is not numeric; expected floats", path=path, item=name) from None
    return a


def _finite(x) -> bool:
    if _is_torch(x):
        import torch

        return bool(torch.isfinite(x).all())
    return bool(np.isfinite(x).all())


@dataclass(frozen=True, eq=False)
class SkeletonTree:
    """A kinematic tree of named nodes.

    Attributes:
        node_names: unique names, no ``/``.
        parent_indices: ``[nodes] int64``, parent first, -1 for the root (node 0).
        local_translation: ``[nodes, 3] float64``, m: rest translation of ``parent_from_node``
            (the root's entry is its rest position in world).
    """

    node_names: tuple[str, ...]
    parent_indices: np.ndarray
    local_translation: np.ndarray

    def __post_init__(self):
        names = tuple(str(n) for n in self.node_names)
        parents = np.asarray(self.parent_indices, dtype=np.int64).reshape(-1)
        lt = np.asarray(self.local_translation, dtype=np.float64)
        n = len(names)
        if parents.shape != (n,) or lt.shape != (n, 3):
            raise ShapeError(
                f"{n} names, parent_indices {parents.shape}, local_translation {lt.shape}; "
                f"expected ({n},) and ({n}, 3)",
                item="SkeletonTree",
            )
        if n == 0:
            raise TopologyError("a skeleton needs at least one node", item="SkeletonTree")
        if len(set(names)) != n:
            dup = sorted({x for x in names if names.count(x) > 1})
            raise DuplicateNameError(f"node names used more than once: {dup}", item="SkeletonTree")
        bad = [x for x in names if "/" in x]
        if bad:
            raise DuplicateNameError(f"node names hold the reserved '/': {bad}", item="SkeletonTree")
        if parents[0] != -1 or any(not (0 <= p < i) for i, p in enumerate(parents) if i > 0):
            raise TopologyError(
                f"parent_indices {parents.tolist()} are not parent-first with a single root at index 0",
                item="SkeletonTree",
            )
        if not np.isfinite(lt).all():
            raise NonFiniteError("local_translation holds NaN or inf", item="SkeletonTree")
        parents.setflags(write=False)
        lt.setflags(write=False)
        object.__setattr__(self, "node_names", names)
        object.__setattr__(self, "parent_indices", parents)
        object.__setattr__(self, "local_translation", lt)

    @classmethod
    def from_articulation(cls, data) -> SkeletonTree:
        """One node per body of an :class:`~kangengine.asset.ArticulationDesc` (or a coordinate layout),
        same names and order; local translations are the bodies' rest ``parent_from_body`` offsets.

        The bodies' rest rotations are not part of a tree: a :class:`SkeletonState` of this tree carries
        them in its local rotations (see ``ArticulationMotionMapper.to_skeleton_state``)."""
        if hasattr(data, "bodies"):
            return cls(
                node_names=tuple(b.name for b in data.bodies),
                parent_indices=np.array([b.parent for b in data.bodies]),
                local_translation=np.array([b.pos for b in data.bodies]),
            )
        return cls(
            node_names=data.body_names,
            parent_indices=np.array(data.parent_indices),
            local_translation=data.rest_positions,
        )

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    def __len__(self) -> int:
        return self.num_nodes

    def index(self, name: str) -> int:
        """Index of node ``name``; :class:`UnknownNameError` listing the nodes otherwise."""
        try:
            return self.node_names.index(name)
        except ValueError:
            raise UnknownNameError(f"no node {name!r}; nodes are: {', '.join(self.node_names)}") from None

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parent_indices) if p == node]

    def same_as(self, other: SkeletonTree, *, atol: float = 1e-9) -> bool:
        """Same names, parents and (within ``atol``) translations."""
        return (
            self.node_names == other.node_names
            and np.array_equal(self.parent_indices, other.parent_indices)
            and np.allclose(self.local_translation, other.local_translation, atol=atol)
        )

    @cached_property
    def kinematics(self) -> BodyKinematics:
        return BodyKinematics(tree_plan_from_rest(self.parent_indices, self.local_translation))

    def to_dict(self) -> dict:
        return {
            "node_names": np.array(self.node_names),
            "parent_indices": self.parent_indices,
            "local_translation": self.local_translation,
        }


class SkeletonState:
    """One pose or a batch of poses of a :class:`SkeletonTree`.

    Args:
        tree: the skeleton.
        root_translation: ``[..., 3]`` m, world position of the root node.
        local_rotation: ``[..., nodes, 4]`` WXYZ, ``parent_from_node`` rotations; the root's is its world
            rotation.
        local_translation: optional ``[..., nodes, 3]`` m, per-pose ``parent_from_node`` translations
            (when joints translate); ``tree.local_translation`` when ``None``. The root entry is ignored.
        skip_checks: skip shape and finiteness checks (hot loops).

    Arrays are numpy or torch, float32 or float64, kept as given (no copy).
    """

    __slots__ = ("tree", "root_translation", "local_rotation", "local_translation", "_global")

    def __init__(
        self, tree: SkeletonTree, root_translation, local_rotation, local_translation=None, *, skip_checks: bool = False
    ):
        self.tree = tree
        rt = _as_float_array(root_translation, "root_translation")
        lr = _as_float_array(local_rotation, "local_rotation")
        lt = None if local_translation is None else _as_float_array(local_translation, "local_translation")
        if not skip_checks:
            n = tree.num_nodes
            if lr.ndim < 2 or tuple(lr.shape[-2:]) != (n, 4):
                raise ShapeError(
                    f"shape {tuple(lr.shape)}; expected [..., {n}, 4] (WXYZ per node)", item="local_rotation"
                )
            if tuple(rt.shape) != tuple(lr.shape[:-2]) + (3,):
                raise ShapeError(
                    f"shape {tuple(rt.shape)}; expected {tuple(lr.shape[:-2]) + (3,)}", item="root_translation"
                )
            if lt is not None and tuple(lt.shape) != tuple(lr.shape[:-1]) + (3,):
                raise ShapeError(
                    f"shape {tuple(lt.shape)}; expected {tuple(lr.shape[:-1]) + (3,)}", item="local_translation"
                )
            for name, arr in (("root_translation", rt), ("local_rotation", lr), ("local_translation", lt)):
                if arr is not None and not _finite(arr):
                    raise NonFiniteError("holds NaN or inf", item=name)
        self.root_translation = rt
        self.local_rotation = lr
        self.local_translation = lt
        self._global = None

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def zero_pose(cls, tree: SkeletonTree, *, dtype=np.float64) -> SkeletonState:
        """Identity local rotations, root at its rest translation."""
        lr = np.zeros((tree.num_nodes, 4), dtype=dtype)
        lr[:, 0] = 1
        return cls(tree, tree.local_translation[0].astype(dtype), lr)

    @classmethod
    def from_global(
        cls, tree: SkeletonTree, global_rotation, root_translation, local_translation=None, **kw
    ) -> SkeletonState:
        """Build a state from world rotations ``[..., nodes, 4]``: local = inv(parent global) * global."""
        gr = _as_float_array(global_rotation, "global_rotation")
        parents = tree.parent_indices
        idx = np.where(parents < 0, 0, parents)
        if _is_torch(gr):
            import torch

            idx = torch.as_tensor(idx, device=gr.device)
        parent_rot = gr[..., idx, :]
        local = R.quat_multiply(R.quat_conjugate(parent_rot), gr)
        root = parents < 0
        if root.any():
            local[..., np.flatnonzero(root), :] = gr[..., np.flatnonzero(root), :]
        return cls(tree, root_translation, local, local_translation, **kw)

    # -- derived -------------------------------------------------------------------------------------
    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.local_rotation.shape[:-2])

    @property
    def is_torch(self) -> bool:
        return _is_torch(self.local_rotation)

    def _fk(self):
        if self._global is None:
            self._global = self.tree.kinematics.from_local(
                self.root_translation, self.local_rotation, self.local_translation
            )
        return self._global

    @property
    def global_translation(self):
        """``[..., nodes, 3]`` m, world positions of the nodes."""
        return self._fk()[0]

    @property
    def global_rotation(self):
        """``[..., nodes, 4]`` WXYZ, ``world_from_node`` rotations."""
        return self._fk()[1]

    @property
    def global_transformation(self):
        """``[..., nodes, 7]``: WXYZ rotation then position (m), world frame."""
        p, r = self._fk()
        if _is_torch(p):
            import torch

            return torch.cat([r, p], dim=-1)
        return np.concatenate([r, p], axis=-1)

    def local_translation_or_rest(self):
        """``[..., nodes, 3]``: the per-pose local translations, or the tree's broadcast to the batch."""
        if self.local_translation is not None:
            return self.local_translation
        lt = self.tree.local_translation.astype(_np_dtype(self.local_rotation))
        shape = self.batch_shape + lt.shape
        if self.is_torch:
            import torch

            return torch.as_tensor(lt, device=self.local_rotation.device).expand(*shape)
        return np.broadcast_to(lt, shape)

    def __getitem__(self, index) -> SkeletonState:
        """Index the batch dimensions (e.g. ``state[3]``, ``state[2:5]``)."""
        if not isinstance(index, tuple):
            index = (index,)
        lt = None if self.local_translation is None else self.local_translation[index]
        return SkeletonState(self.tree, self.root_translation[index], self.local_rotation[index], lt, skip_checks=True)

    def numpy(self) -> SkeletonState:
        """A numpy copy (torch tensors are moved to the CPU)."""
        cvt = lambda a: None if a is None else (a.detach().cpu().numpy() if _is_torch(a) else a)
        return SkeletonState(
            self.tree,
            cvt(self.root_translation),
            cvt(self.local_rotation),
            cvt(self.local_translation),
            skip_checks=True,
        )

    def torch(self, device="cpu", dtype=None) -> SkeletonState:
        """Torch tensors on ``device`` (``dtype`` kept unless given)."""
        import torch

        cvt = lambda a: None if a is None else torch.as_tensor(a, device=device, dtype=dtype)
        return SkeletonState(
            self.tree,
            cvt(self.root_translation),
            cvt(self.local_rotation),
            cvt(self.local_translation),
            skip_checks=True,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(nodes={self.tree.num_nodes}, batch_shape={self.batch_shape}, "
            f"{'torch' if self.is_torch else 'numpy'} {self.local_rotation.dtype})"
        )


def _np_dtype(x):
    if _is_torch(x):
        import torch

        return np.float32 if x.dtype == torch.float32 else np.float64
    return x.dtype


class SkeletonMotion(SkeletonState):
    """A :class:`SkeletonState` over frames: arrays are frame-major ``[frames, ...]``.

    Args:
        tree: the skeleton.
        root_translation: ``[frames, 3]`` m, world.
        local_rotation: ``[frames, nodes, 4]`` WXYZ.
        fps: frames per second (the file's real rate; never assumed).
        local_translation: optional ``[frames, nodes, 3]`` per-frame local translations.
        metadata: JSON-serialisable dict (source file, source units, original names, ...).
    """

    __slots__ = ("fps", "metadata", "_vel")

    def __init__(
        self,
        tree: SkeletonTree,
        root_translation,
        local_rotation,
        fps: float,
        local_translation=None,
        *,
        metadata: dict | None = None,
        skip_checks: bool = False,
    ):
        super().__init__(tree, root_translation, local_rotation, local_translation, skip_checks=skip_checks)
        try:
            fps = float(fps)
        except (TypeError, ValueError):
            raise FormatError(f"fps {fps!r} is not a number; expected frames per second > 0", item="fps") from None
        if not (math.isfinite(fps) and fps > 0):
            raise FormatError(f"fps is {fps}; expected a finite number > 0", item="fps")
        if not skip_checks and self.local_rotation.ndim != 3:
            raise ShapeError(
                f"local_rotation has shape {tuple(self.local_rotation.shape)}; a motion expects [frames, nodes, 4]",
                item="local_rotation",
            )
        if not skip_checks and self.local_rotation.shape[0] == 0:
            raise ShapeError("the motion has zero frames; expected at least one", item="local_rotation")
        self.fps = fps
        self.metadata = dict(metadata or {})
        self._vel = None

    @property
    def num_frames(self) -> int:
        return int(self.local_rotation.shape[0])

    def __len__(self) -> int:
        return self.num_frames

    @property
    def duration(self) -> float:
        """Seconds from the first to the last frame: ``(frames - 1) / fps``."""
        return (self.num_frames - 1) / self.fps

    @property
    def _velocities(self):
        if self._vel is None:
            self._vel = self._compute_velocities()
        return self._vel

    def _compute_velocities(self):
        dt = 1.0 / self.fps
        p = self.global_translation
        if self.num_frames == 1:
            v = p * 0
        elif _is_torch(p):
            import torch

            v = torch.empty_like(p)
            v[1:-1] = (p[2:] - p[:-2]) / (2 * dt)
            v[0] = (p[1] - p[0]) / dt
            v[-1] = (p[-1] - p[-2]) / dt
        else:
            v = np.empty_like(p)
            v[1:-1] = (p[2:] - p[:-2]) / (2 * dt)
            v[0] = (p[1] - p[0]) / dt
            v[-1] = (p[-1] - p[-2]) / dt
        w = R.quat_angular_velocity(self.global_rotation, dt, frame="world")
        return v, w

    @property
    def global_velocity(self):
        """``[frames, nodes, 3]`` m/s, world-frame velocity of each node: central differences of
        ``global_translation`` inside, one-sided at the first and last frame."""
        return self._velocities[0]

    @property
    def global_angular_velocity(self):
        """``[frames, nodes, 3]`` rad/s, world-frame angular velocity of each node: central differences
        ``log(q[t+1] q[t-1]^-1) / 2dt`` inside, one-sided at the ends."""
        return self._velocities[1]

    def __getitem__(self, index):
        """``motion[i]`` -> :class:`SkeletonState`; ``motion[a:b:c]`` -> :class:`SkeletonMotion` (a step
        ``c`` divides the fps)."""
        if isinstance(index, slice):
            step = index.step or 1
            if step <= 0:
                raise ShapeError(f"slice step {step}; expected a positive step", item="SkeletonMotion[...]")
            lt = None if self.local_translation is None else self.local_translation[index]
            return SkeletonMotion(
                self.tree,
                self.root_translation[index],
                self.local_rotation[index],
                self.fps / step,
                lt,
                metadata=self.metadata,
            )
        return SkeletonState.__getitem__(self, index)

    def resample(self, fps: float) -> SkeletonMotion:
        """The motion at another frame rate over the same duration (lerp positions, slerp rotations).

        Frame ``k`` of the result is at time ``k / fps``; the last one is the last time <= duration. A frame that
        falls on a source frame (every frame when the source rate is a multiple of ``fps``: 120 -> 30) is that
        frame as it is; only the frames between two source frames are interpolated.
        """
        fps = float(fps)
        if not (math.isfinite(fps) and fps > 0):
            raise FormatError(f"fps is {fps}; expected a finite number > 0", item="resample")
        n = int(math.floor(self.duration * fps + 1e-9)) + 1
        t = np.arange(n, dtype=np.float64) * (self.fps / fps)
        i0 = np.minimum(np.floor(t).astype(np.int64), self.num_frames - 1)
        i1 = np.minimum(i0 + 1, self.num_frames - 1)
        a = t - i0
        lr, rt, lt = self.local_rotation, self.root_translation, self.local_translation
        if _is_torch(lr):
            import torch

            i0, i1 = torch.as_tensor(i0, device=lr.device), torch.as_tensor(i1, device=lr.device)
            a = torch.as_tensor(a, dtype=lr.dtype, device=lr.device)
        else:
            a = a.astype(lr.dtype)
        between = a != 0
        if _is_torch(lr) or between.all():
            rot = R.quat_slerp(lr[i0], lr[i1], a[:, None])
        else:  # frames on source frames are gathered (slerp at 0 gives them to rounding), the others slerped
            rot = lr[i0]
            k = np.flatnonzero(between)
            if len(k):
                rot[k] = R.quat_slerp(lr[i0[k]], lr[i1[k]], a[k][:, None])
        root = rt[i0] + (rt[i1] - rt[i0]) * a[:, None]
        loc = None if lt is None else lt[i0] + (lt[i1] - lt[i0]) * a[:, None, None]
        meta = dict(self.metadata)
        meta["resampled_from_fps"] = self.fps
        return SkeletonMotion(self.tree, root, rot, fps, loc, metadata=meta)

    def _like(self, s: SkeletonState) -> SkeletonMotion:
        return SkeletonMotion(
            self.tree,
            s.root_translation,
            s.local_rotation,
            self.fps,
            s.local_translation,
            metadata=self.metadata,
            skip_checks=True,
        )

    def numpy(self) -> SkeletonMotion:
        return self._like(SkeletonState.numpy(self))

    def torch(self, device="cpu", dtype=None) -> SkeletonMotion:
        return self._like(SkeletonState.torch(self, device, dtype))

    # -- files -----------------------------------------------------------------------------------------
    def save_npz(self, path: str | os.PathLike) -> None:
        """Write the motion to ``path`` (``.npz``, no pickle, written atomically).

        Keys: ``format``, ``version``, ``node_names``, ``parent_indices``, ``tree_local_translation``,
        ``root_translation``, ``local_rotation_wxyz``, ``fps``, optional ``local_translation`` and
        ``metadata_json``."""
        m = self.numpy()
        arrays = {
            "format": np.array(SKELETON_MOTION_FORMAT),
            "version": np.array(SKELETON_MOTION_VERSION),
            "node_names": np.array(self.tree.node_names, dtype=np.str_),
            "parent_indices": self.tree.parent_indices,
            "tree_local_translation": self.tree.local_translation,
            "root_translation": m.root_translation,
            "local_rotation_wxyz": m.local_rotation,
            "fps": np.array(self.fps),
            "metadata_json": np.array(json.dumps(self.metadata, sort_keys=True)),
        }
        if m.local_translation is not None:
            arrays["local_translation"] = m.local_translation
        atomic_write(path, lambda f: np.savez(f, **arrays), suffix=".npz")

    @classmethod
    def load_npz(cls, path: str | os.PathLike) -> SkeletonMotion:
        """Read a file written by :meth:`save_npz` (pickle is refused).

        Only the keys of :meth:`save_npz` are read, each checked: text keys hold one string, ``fps`` one
        finite number > 0, ``metadata_json`` a JSON object, arrays numeric, finite and of the skeleton's shape.
        Quaternions whose norm is off 1 by more than :data:`~kangengine._files.QUAT_NORM_TOLERANCE` (1e-3) are
        refused; smaller deviations are normalised (noted in ``metadata["quaternions_normalised"]`` when larger
        than float rounding). Memory is bounded by the file's size (:func:`~kangengine._files.load_npz`).

        Raises:
            FileMissingError: no such file.
            FormatError, ShapeError, NonFiniteError: naming the file and the key.
        """
        keys = (
            "format",
            "node_names",
            "parent_indices",
            "tree_local_translation",
            "root_translation",
            "local_rotation_wxyz",
            "fps",
        )
        z = load_npz(path, required=keys, optional=("local_translation", "metadata_json"), kind="skeleton motion")
        fmt = npz_scalar(z, "format", path, kind=str)
        if fmt != SKELETON_MOTION_FORMAT:
            raise FormatError(f"format is {fmt[:80]!r}; expected {SKELETON_MOTION_FORMAT!r}", path=path)
        names = npz_array(z, "node_names", path, kind="U", ndim=1)
        parents = npz_array(z, "parent_indices", path, kind="i", ndim=1)
        tree_lt = npz_array(z, "tree_local_translation", path, ndim=2, last=3)
        rt = npz_array(z, "root_translation", path, ndim=2, last=3)
        lr = npz_array(z, "local_rotation_wxyz", path, ndim=3, last=4)
        lt = npz_array(z, "local_translation", path, ndim=3, last=3) if "local_translation" in z else None
        fps = npz_scalar(z, "fps", path)
        meta = npz_json(z, "metadata_json", path) if "metadata_json" in z else {}
        try:
            tree = SkeletonTree(tuple(str(x) for x in names), parents, tree_lt)
            lr, note = unit_quaternions(lr, path=path, item="local_rotation_wxyz")
            if note is not None:
                meta["quaternions_normalised"] = note
            return cls(tree, rt, lr, fps, lt, metadata=meta)
        except KangEngineError as exc:
            if exc.path is not None:
                raise
            raise type(exc)(str(exc), path=path) from exc


def _motion_convert(motion, vec, quat):
    tree = motion.tree
    new_tree = SkeletonTree(tree.node_names, tree.parent_indices, vec(tree.local_translation))
    lt = None if motion.local_translation is None else vec(motion.local_translation)
    return SkeletonMotion(
        new_tree,
        vec(motion.root_translation),
        quat(motion.local_rotation),
        motion.fps,
        lt,
        metadata=dict(motion.metadata),
        skip_checks=True,
    )


def motion_zup_from_yup(motion):
    """A :class:`~kangengine.animation.SkeletonMotion` written in Y-up axes, re-expressed in Z-up axes.

    Every translation (tree offsets, root and per-frame local translations) goes through
    :func:`kangengine.conventions.vec_zup_from_yup` and every local rotation through
    :func:`kangengine.conventions.quat_zup_from_yup`, so global positions become
    ``vec_zup_from_yup(global positions)``. Arrays keep their type, dtype and device.
    """
    return _motion_convert(motion, C.vec_zup_from_yup, C.quat_zup_from_yup)


def motion_yup_from_zup(motion):
    """Inverse of :func:`motion_zup_from_yup`."""
    return _motion_convert(motion, C.vec_yup_from_zup, C.quat_yup_from_zup)
