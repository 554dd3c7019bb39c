"""`ArticulationMotion`: a sampled articulation trajectory ``q [frames, nq]``, ``qd [frames, nv]``.

Both are float32 numpy arrays in the canonical convention of an
:class:`~kangengine.animation.ArticulationCoordinateLayout` (see its docstring); the motion remembers the
layout's ``model_signature`` so that mappers and adapters can refuse data made for another model.

Files (``save_articulation_motion_npz``): one ``.npz`` without pickle holding ``format``,
``format_version``, ``q``, ``qd``, ``fps``, ``joint_names``, ``dof_names``, ``q_names``,
``model_signature``, ``nq``, ``nv`` and ``units_json``; written atomically.
"""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np

from .._files import load_npz, npz_array, npz_json, npz_scalar, unit_quaternions, write_npz
from ..errors import FormatError, LayoutMismatch, LayoutSignatureWarning, NonFiniteError, ShapeError

__all__ = ["ArticulationMotion", "save_articulation_motion_npz", "load_articulation_motion_npz"]

ARTICULATION_MOTION_FORMAT = "kangengine.articulation_motion"
ARTICULATION_MOTION_VERSION = 1
UNITS = {
    "q": "m for positions and slides, rad for hinges, unit WXYZ quaternions",
    "qd": "m/s and rad/s; free root (origin linear velocity in world, angular velocity in world), "
    "ball angular velocity in the parent frame",
    "fps": "1/s",
}


class ArticulationMotion:
    """``q [frames, nq]`` and ``qd [frames, nv]`` (float32 NumPy) sampled at ``fps``.

    Args:
        q: ``[frames, nq]`` generalized coordinates (converted to float32).
        qd: ``[frames, nv]`` generalized velocities in the layout's canonical tangent convention.
        fps: frames per second (> 0).
        layout_signature: the ``model_signature`` of the layout ``q`` belongs to.
        joint_names: the layout's joint (block) names, kept for files and messages.
        metadata: JSON-serialisable extras (source clip, mapping options, ...).
        skip_checks: do not scan ``q`` and ``qd`` for non-finite values (for producers that checked them on
            the way, e.g. the mapper's native pass); shapes and ``fps`` are still checked.
    """

    __slots__ = ("q", "qd", "_fps", "layout_signature", "joint_names", "metadata")

    def __init__(
        self, q, qd, fps: float, layout_signature: str, *, joint_names=(), metadata=None, skip_checks: bool = False
    ):
        q = np.ascontiguousarray(q, dtype=np.float32)
        qd = np.ascontiguousarray(qd, dtype=np.float32)
        if q.ndim != 2 or qd.ndim != 2 or q.shape[0] != qd.shape[0]:
            raise ShapeError(
                f"q {q.shape} and qd {qd.shape}; expected [frames, nq] and [frames, nv] with the same number of frames",
                item="ArticulationMotion",
            )
        if q.shape[0] == 0:
            raise ShapeError("zero frames; expected at least one", item="ArticulationMotion")
        for name, a in () if skip_checks else (("q", q), ("qd", qd)):
            if not np.isfinite(a).all():
                bad = np.argwhere(~np.isfinite(a))[0]
                raise NonFiniteError(f"non-finite value at frame {bad[0]}, column {bad[1]}", item=name)
        fps = float(fps)
        if not (math.isfinite(fps) and fps > 0):
            raise FormatError(f"fps is {fps}; expected a finite number > 0", item="fps")
        self.q = q
        self.qd = qd
        self._fps = fps
        self.layout_signature = str(layout_signature)
        self.joint_names = tuple(joint_names)
        self.metadata = dict(metadata or {})

    def fps(self) -> float:
        """Frames per second."""
        return self._fps

    @property
    def num_frames(self) -> int:
        return int(self.q.shape[0])

    def __len__(self) -> int:
        return self.num_frames

    @property
    def duration(self) -> float:
        """``(frames - 1) / fps`` seconds."""
        return (self.num_frames - 1) / self._fps

    @property
    def nq(self) -> int:
        return int(self.q.shape[1])

    @property
    def nv(self) -> int:
        return int(self.qd.shape[1])

    def check_layout(self, layout, *, what: str = "motion") -> None:
        """Raise :class:`LayoutMismatch` unless ``nq``, ``nv`` and the signature match ``layout``."""
        if (self.nq, self.nv) != (layout.nq, layout.nv) or self.layout_signature != layout.model_signature:
            raise LayoutMismatch(
                f"{what} has nq={self.nq}, nv={self.nv}, signature {self.layout_signature}; the layout has "
                f"nq={layout.nq}, nv={layout.nv}, signature {layout.model_signature}",
                path=layout.source,
            )

    def __getitem__(self, index: slice) -> ArticulationMotion:
        """Frame slice ``motion[a:b:c]`` (a step ``c`` divides the fps)."""
        if not isinstance(index, slice):
            raise ShapeError("index with a slice of frames", item="ArticulationMotion[...]")
        step = index.step or 1
        return ArticulationMotion(
            self.q[index],
            self.qd[index],
            self._fps / step,
            self.layout_signature,
            joint_names=self.joint_names,
            metadata=self.metadata,
        )

    def __repr__(self) -> str:
        return (
            f"ArticulationMotion(frames={self.num_frames}, nq={self.nq}, nv={self.nv}, fps={self._fps:g}, "
            f"signature={self.layout_signature})"
        )


def save_articulation_motion_npz(
    path: str | os.PathLike, motion: ArticulationMotion, *, layout=None, durable: bool = True
) -> None:
    """Write ``motion`` to ``path`` as a pickle-free, uncompressed ``.npz`` (atomically: temp file, then rename).

    Args:
        path: destination file.
        motion: the motion.
        layout: optional layout; when given it must match the motion and its DOF/q names are stored.
        durable: ``fsync`` before the rename (``kangengine._files.atomic_write``; ``convert`` passes ``False``
            and checks every member's CRC when it resumes).
    """
    if layout is not None:
        motion.check_layout(layout)
    arrays = {
        "format": np.array(ARTICULATION_MOTION_FORMAT),
        "format_version": np.array(ARTICULATION_MOTION_VERSION),
        "q": motion.q,
        "qd": motion.qd,
        "fps": np.array(motion.fps()),
        "joint_names": np.array(layout.joint_names if layout is not None else motion.joint_names, dtype=np.str_),
        "model_signature": np.array(motion.layout_signature),
        "nq": np.array(motion.nq),
        "nv": np.array(motion.nv),
        "units_json": np.array(json.dumps(UNITS, sort_keys=True)),
        "metadata_json": np.array(json.dumps(motion.metadata, sort_keys=True)),
    }
    if layout is not None:
        arrays["dof_names"] = np.array(layout.dof_names, dtype=np.str_)
        arrays["q_names"] = np.array(layout.q_names, dtype=np.str_)
    write_npz(path, arrays, durable=durable)


def _quaternion_offsets(layout) -> list[int]:
    """The ``q`` offset of every quaternion in ``layout`` (free roots after their position, ball joints)."""
    out = []
    for b in layout.blocks:
        kind = getattr(b.joint_type, "value", b.joint_type)
        if kind == "free":
            out.append(b.q_offset + 3)
        elif kind == "ball":
            out.append(b.q_offset)
    return out


def load_articulation_motion_npz(path: str | os.PathLike, layout) -> ArticulationMotion:
    """Read an articulation motion for ``layout``.

    ``nq`` or ``nv`` different from the layout's raises :class:`LayoutMismatch`; a different
    ``model_signature`` alone warns with :class:`LayoutSignatureWarning` and loads (the motion is then
    tagged with the layout's signature; the file's is kept in ``metadata["file_signature"]``).

    Only the keys this reader uses are read, each checked (one string, one finite number, JSON object,
    finite float arrays); memory is bounded by the file's size. The quaternions of the layout's free and ball
    joints are refused when a norm is off 1 by more than :data:`~kangengine._files.QUAT_NORM_TOLERANCE`
    (1e-3); smaller deviations are normalised (noted in ``metadata["quaternions_normalised"]``).

    Raises:
        FileMissingError: no such file.
        FormatError, NonFiniteError: naming the file and the key. LayoutMismatch: see above.
    """
    z = load_npz(
        path,
        required=("format", "q", "qd", "fps", "model_signature"),
        optional=("format_version", "metadata_json"),
        kind="articulation motion",
    )
    fmt = npz_scalar(z, "format", path, kind=str)
    if fmt != ARTICULATION_MOTION_FORMAT:
        raise FormatError(f"format is {fmt[:80]!r}; expected {ARTICULATION_MOTION_FORMAT!r}", path=path)
    version = npz_scalar(z, "format_version", path, kind=int) if "format_version" in z else 1
    if version > ARTICULATION_MOTION_VERSION:
        raise FormatError(
            f"format_version {version} is newer than this KangEngine reads ({ARTICULATION_MOTION_VERSION})", path=path
        )
    q = npz_array(z, "q", path, ndim=2)
    qd = npz_array(z, "qd", path, ndim=2)
    if q.shape[1] != layout.nq or qd.shape[1] != layout.nv:
        raise LayoutMismatch(
            f"file has nq={q.shape[1]}, nv={qd.shape[1]}; the layout has nq={layout.nq}, nv={layout.nv}", path=path
        )
    sig = npz_scalar(z, "model_signature", path, kind=str)
    meta = npz_json(z, "metadata_json", path) if "metadata_json" in z else {}
    fps = npz_scalar(z, "fps", path)
    offsets = _quaternion_offsets(layout)
    if offsets:
        cols = np.asarray(offsets)[:, None] + np.arange(4)
        unit, note = unit_quaternions(q[:, cols], path=path, item="q (quaternions of free and ball joints)")
        if note is not None:
            q = q.copy()
            q[:, cols] = unit
            meta["quaternions_normalised"] = note
    if sig != layout.model_signature:
        warnings.warn(
            f"{os.fspath(path)}: model signature {sig} differs from the layout's "
            f"{layout.model_signature} (same nq/nv): body order, joint layout, rest pose or limits may "
            "differ",
            LayoutSignatureWarning,
            stacklevel=2,
        )
        meta["file_signature"] = sig
    try:
        return ArticulationMotion(q, qd, fps, layout.model_signature, joint_names=layout.joint_names, metadata=meta)
    except (FormatError, ShapeError, NonFiniteError) as exc:
        raise type(exc)(str(exc), path=path) from exc
