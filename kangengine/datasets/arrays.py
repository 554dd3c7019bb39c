"""Motion arrays from files: poselib ``.npy`` clips and states, read without unrestricted pickle.

poselib (IsaacGymEnvs, ASE, ProtoMotions' older tools) saves ``SkeletonMotion`` and ``SkeletonState``
objects with ``np.save(path, state.to_dict())``: a ``.npy`` file holding one object array, i.e. a
pickled ``OrderedDict``. Plain ``np.load`` with pickles allowed would run whatever a file asks for, so
KangEngine reads these files with :class:`RestrictedUnpickler`, which rebuilds only numpy arrays, numpy
dtypes and scalars, ``OrderedDict`` and the builtin containers and scalars; any other global (``os.system``,
``builtins.eval``, a torch tensor, a joblib wrapper, ...) raises :class:`~kangengine.errors.FormatError`
naming the file and the refused global, before anything is called.

The poselib dict layout (what :func:`load_poselib` reads)::

    rotation            {"arr": [..., nodes, 4] XYZW, "context": {"dtype": ...}}  (local if is_local)
    root_translation    {"arr": [..., 3], ...}                                  world, file units
    skeleton_tree       {"node_names": [nodes] str, "parent_indices": {"arr": [nodes] int},
                         "local_translation": {"arr": [nodes, 3]}}
    is_local            bool
    fps                 0-d array or Python number  (SkeletonMotion only)
    global_velocity, global_angular_velocity        (SkeletonMotion only; recomputed, not read)
    __name__            "SkeletonMotion" | "SkeletonState"
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .. import rotations as R
from .._files import load_npy, unit_quaternions
from ..animation.skeleton import SkeletonMotion, SkeletonState, SkeletonTree
from ..errors import FileMissingError, FormatError, KangEngineError

__all__ = ["load_poselib", "load_poselib_motion"]


def _check_file(path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileMissingError("no such file", path=path)
    return path


# -- poselib ---------------------------------------------------------------------------------------------


def _tensor(value, path, key: str, *, dims: int | None = None, last: int | None = None, kind: str = "f") -> np.ndarray:
    """poselib's TensorUtils payload ``{"arr": ndarray, "context": {"dtype": ...}}`` (or a bare array)."""
    if isinstance(value, Mapping):
        if "arr" not in value:
            raise FormatError(
                f"a dict without 'arr' (keys: {sorted(map(str, value))}); expected poselib's "
                "{'arr': array, 'context': {...}}",
                path=path,
                item=key,
            )
        value = value["arr"]
    if not isinstance(value, (np.ndarray, list, tuple)):
        raise FormatError(f"holds {type(value).__name__}; expected an array", path=path, item=key)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged lists, huge ints
        raise FormatError(f"is not an array ({exc})", path=path, item=key) from None
    if kind == "f":
        if arr.dtype.kind not in "fiu":
            raise FormatError(f"dtype {arr.dtype} is not numeric; expected float32 or float64", path=path, item=key)
        if arr.dtype.kind != "f":
            arr = arr.astype(np.float64)
        if not np.isfinite(arr).all():
            raise FormatError("holds NaN or inf; expected finite numbers", path=path, item=key)
    elif arr.dtype.kind not in "iu":
        raise FormatError(f"dtype {arr.dtype}; expected integers", path=path, item=key)
    if dims is not None and arr.ndim != dims:
        raise FormatError(f"shape {arr.shape}; expected {dims} dimensions", path=path, item=key)
    if last is not None and (arr.ndim == 0 or arr.shape[-1] != last):
        raise FormatError(f"shape {arr.shape}; expected a last dimension of {last}", path=path, item=key)
    return arr


def _poselib_tree(d, path) -> SkeletonTree:
    st = d.get("skeleton_tree")
    if not isinstance(st, Mapping):
        raise FormatError("missing or not a dict; expected poselib's skeleton_tree", path=path, item="skeleton_tree")
    for k in ("node_names", "parent_indices", "local_translation"):
        if k not in st:
            raise FormatError(
                f"missing; skeleton_tree holds {sorted(map(str, st))}", path=path, item=f"skeleton_tree.{k}"
            )
    names = st["node_names"]
    if isinstance(names, np.ndarray):
        names = names.tolist()
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, (str, bytes)) for n in names):
        raise FormatError("expected a list of strings", path=path, item="skeleton_tree.node_names")
    try:
        names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    except UnicodeDecodeError as exc:
        raise FormatError(f"a name is not UTF-8 ({exc})", path=path, item="skeleton_tree.node_names") from None
    parents = _tensor(st["parent_indices"], path, "skeleton_tree.parent_indices", dims=1, kind="i")
    lt = _tensor(st["local_translation"], path, "skeleton_tree.local_translation", dims=2, last=3)
    try:
        return SkeletonTree(names, parents, lt)
    except KangEngineError as exc:
        raise type(exc)(str(exc), path=path) from exc


def _flag(value, path, key: str) -> bool:
    """A poselib flag: a bool, or a one-element boolean array."""
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.dtype.kind != "b":
            raise FormatError(
                f"is an array of {value.dtype} {value.shape}; expected True or False", path=path, item=key
            )
        value = bool(value.reshape(()))
    if not isinstance(value, (bool, np.bool_)):
        raise FormatError(f"is {str(value)[:60]!r}; expected True or False", path=path, item=key)
    return bool(value)


def load_poselib(path: str | os.PathLike) -> SkeletonMotion | SkeletonState:
    """Read a poselib ``SkeletonMotion`` or ``SkeletonState`` ``.npy`` file.

    Quaternions are converted from poselib's XYZW to WXYZ. A quaternion whose norm is off 1 by more than
    :data:`~kangengine._files.QUAT_NORM_TOLERANCE` (1e-3; zero ones included) is refused; smaller deviations
    (float32 rounding, 6e-6 in the float64 backflip clip) are normalised and, when larger than 8 float
    epsilons, noted in ``metadata["quaternions_normalised"]``. Global rotations
    (``is_local=False``) are converted to local ones. Arrays keep the file's float dtype (poselib clips
    are float32; some, like ``amp_humanoid_backflip.npy``, are float64). No unit or axis change is
    made: the files are Z up already, in the units they were written in (metres for the AMP clips; the
    CMU T-pose is in CMU's inch-based units, see ``metadata``-free :class:`SkeletonState`).

    Args:
        path: the ``.npy`` file.

    Returns:
        :class:`~kangengine.animation.SkeletonMotion` (``__name__ == "SkeletonMotion"``):
        ``local_rotation [frames, nodes, 4]`` WXYZ, ``root_translation [frames, 3]``, ``fps`` from the file
        (an array or a Python number), ``metadata`` with ``source``, ``format="poselib"``, ``source_dtype``;
        or :class:`~kangengine.animation.SkeletonState` (``"SkeletonState"``), batch shape as stored.

    Raises:
        FileMissingError: no such file.
        FormatError: a refused pickle global, a missing key, a wrong shape, NaN, a missing or bad fps.
    """
    path = _check_file(path)
    d = load_npy(path)
    if not isinstance(d, Mapping):
        raise FormatError(
            f"holds {type(d).__name__}; expected poselib's pickled dict (np.save of to_dict())", path=path
        )
    kind = d.get("__name__", "SkeletonMotion" if "fps" in d else "SkeletonState")
    if kind not in ("SkeletonMotion", "SkeletonState"):
        raise FormatError(
            f"__name__ is {kind!r}; expected 'SkeletonMotion' or 'SkeletonState'", path=path, item="__name__"
        )
    for k in ("rotation", "root_translation", "skeleton_tree"):
        if k not in d:
            raise FormatError(f"missing; the file holds {sorted(map(str, d))}", path=path, item=k)
    tree = _poselib_tree(d, path)
    n = tree.num_nodes
    rot = _tensor(d["rotation"], path, "rotation", last=4)
    if rot.ndim < 2 or rot.shape[-2] != n:
        raise FormatError(f"shape {rot.shape}; expected [..., {n}, 4] for {n} nodes", path=path, item="rotation")
    if kind == "SkeletonMotion" and rot.ndim != 3:
        raise FormatError(f"shape {rot.shape}; a SkeletonMotion holds [frames, nodes, 4]", path=path, item="rotation")
    if kind == "SkeletonMotion" and rot.shape[0] == 0:
        raise FormatError("zero frames; expected at least one", path=path, item="rotation")
    dtype = rot.dtype
    root = _tensor(d["root_translation"], path, "root_translation", last=3).astype(dtype, copy=False)
    if root.shape != rot.shape[:-2] + (3,):
        raise FormatError(f"shape {root.shape}; expected {rot.shape[:-2] + (3,)}", path=path, item="root_translation")
    unit, note = unit_quaternions(rot, path=path, item="rotation")
    wxyz = R.quat_xyzw_to_wxyz(unit)
    is_local = _flag(d.get("is_local", True), path, "is_local")
    if is_local:
        state = SkeletonState(tree, root, wxyz)
    else:
        state = SkeletonState.from_global(tree, wxyz, root)
    if kind == "SkeletonState":
        return state
    if "fps" not in d:
        raise FormatError("missing; a SkeletonMotion file must say its frame rate", path=path, item="fps")
    fps = d["fps"]
    try:
        fps = float(np.asarray(fps).reshape(()))
    except (TypeError, ValueError, OverflowError):
        raise FormatError(
            f"is {str(fps)[:60]!r}; expected a number (frames per second)", path=path, item="fps"
        ) from None
    meta = {
        "source": os.fspath(path),
        "format": "poselib",
        "source_dtype": str(dtype),
        "source_quaternion_order": "xyzw",
        "source_is_local": bool(is_local),
    }
    if note is not None:
        meta["quaternions_normalised"] = note
    try:
        return SkeletonMotion(tree, state.root_translation, state.local_rotation, fps, metadata=meta)
    except KangEngineError as exc:
        raise type(exc)(str(exc), path=path) from exc


def load_poselib_motion(path: str | os.PathLike) -> SkeletonMotion:
    """:func:`load_poselib` for files that must hold a motion (``ke.pipelines.load_motion`` uses it for ``.npy``).

    Raises:
        FormatError: the file holds a ``SkeletonState`` (a single pose) rather than a ``SkeletonMotion``.
    """
    m = load_poselib(path)
    if not isinstance(m, SkeletonMotion):
        raise FormatError(
            "holds a poselib SkeletonState (a pose, no fps); expected a SkeletonMotion. Read poses "
            "with kangengine.datasets.load_poselib",
            path=path,
            item="__name__",
        )
    return m
