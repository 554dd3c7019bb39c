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

import collections
import io
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import rotations as R
from ..animation.skeleton import SkeletonMotion, SkeletonState, SkeletonTree
from ..errors import FileMissingError, FormatError, KangEngineError

__all__ = ["RestrictedUnpickler", "load_pickle", "load_npy", "load_poselib", "load_poselib_motion", "load_npz_motion"]


def _numpy_core(submodule: str):
    """``numpy._core.<submodule>`` (numpy 2) or ``numpy.core.<submodule>`` (numpy 1)."""
    import importlib

    try:
        return importlib.import_module(f"numpy._core.{submodule}")
    except ImportError:  # numpy 1.x
        return importlib.import_module(f"numpy.core.{submodule}")


def _codecs_encode(obj, encoding="utf-8", errors="strict"):
    """What Python 3 pickles of ``bytes`` at protocols 0-2 call (``_codecs.encode(str, "latin1")``); text
    encodings only."""
    import codecs

    if not isinstance(obj, str) or not codecs.lookup(encoding)._is_text_encoding:
        raise FormatError(f"refused _codecs.encode({type(obj).__name__}, {encoding!r}); expected text to bytes")
    return codecs.encode(obj, encoding, errors)


def _default_globals() -> dict[tuple[str, str], Any]:
    multiarray = _numpy_core("multiarray")
    numeric = _numpy_core("numeric")
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("_codecs", "encode"): _codecs_encode,
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        if hasattr(numeric, "_frombuffer"):
            allowed[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    for name in (
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "bytearray",
        "complex",
        "int",
        "float",
        "bool",
        "str",
        "bytes",
    ):
        allowed[("builtins", name)] = getattr(__import__("builtins"), name)
    return allowed


# Python 2 pickles (SMPL model files) name modules the Python 2 way.
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg", "cPickle": "pickle"}


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that rebuilds only numpy arrays and plain Python containers.

    ``find_class`` admits numpy array reconstruction (``numpy.core.multiarray._reconstruct`` and its
    numpy 2 name ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``, numpy
    scalars, ``numpy.core.numeric._frombuffer``), ``collections.OrderedDict`` and the builtin containers
    and scalar types; everything else raises :class:`~kangengine.errors.FormatError` naming the file and
    the global, so no code from the file ever runs. Persistent ids are refused too.

    Args:
        file: a binary file object positioned at the pickle.
        path: the file's path, used in error messages.
        extra_globals: more ``{(module, name): object}`` to admit (the SMPL model reader adds stand-ins
            for ``scipy.sparse`` matrices this way).
        encoding: how to decode Python 2 ``str`` objects (``"latin1"`` keeps numpy buffers intact).
    """

    def __init__(
        self,
        file,
        *,
        path: str | os.PathLike | None = None,
        extra_globals: Mapping[tuple[str, str], Any] | None = None,
        encoding: str = "latin1",
    ):
        super().__init__(file, encoding=encoding, fix_imports=False)
        self._path = path
        self._allowed = _default_globals()
        if extra_globals:
            self._allowed.update(extra_globals)

    def find_class(self, module: str, name: str):
        module = _PY2_MODULES.get(module, module)
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise FormatError(
                f"refused pickled global '{module}.{name}': only numpy arrays, dicts, lists "
                "and scalars are read from pickles",
                path=self._path,
                item=f"{module}.{name}",
            ) from None

    def persistent_load(self, pid):
        raise FormatError(
            f"refused pickle persistent id {pid!r}; expected plain numpy arrays and containers", path=self._path
        )


def _unpickle(fileobj, path, extra_globals=None):
    try:
        return RestrictedUnpickler(fileobj, path=path, extra_globals=extra_globals).load()
    except KangEngineError:
        raise
    except RecursionError:
        raise FormatError("pickle nests too deeply; expected a plain dict of arrays", path=path) from None
    except Exception as exc:
        raise FormatError(f"not a readable pickle ({type(exc).__name__}: {exc})", path=path) from exc


def _check_file(path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileMissingError("no such file", path=path)
    return path


def load_pickle(path: str | os.PathLike, *, extra_globals: Mapping[tuple[str, str], Any] | None = None):
    """Read a pickle file (``.pkl``) through :class:`RestrictedUnpickler`.

    Returns:
        the unpickled object: dicts, lists, tuples, numpy arrays and scalars only.

    Raises:
        FileMissingError: no such file.
        FormatError: a refused global, a truncated or corrupt pickle.
    """
    path = _check_file(path)
    with open(path, "rb") as f:
        return _unpickle(f, path, extra_globals)


def load_npy(path: str | os.PathLike):
    """Read a ``.npy`` file; an object array (a pickled payload) goes through :class:`RestrictedUnpickler`.

    Returns:
        a numpy array; for a 0-d object array (what ``np.save(path, some_dict)`` writes) the object
        itself (``arr.item()``), e.g. poselib's dict.

    Raises:
        FileMissingError, FormatError: no such file, not an ``.npy`` file, a refused pickle global,
        truncated data.
    """
    path = _check_file(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)  # 3.0: same header layout
        except Exception as exc:
            raise FormatError(f"not an .npy file ({type(exc).__name__}: {exc})", path=path) from exc
        if not dtype.hasobject:
            f.seek(0)
            try:
                return np.load(f, allow_pickle=False)
            except Exception as exc:
                raise FormatError(f"truncated or corrupt .npy data ({type(exc).__name__}: {exc})", path=path) from exc
        obj = _unpickle(f, path)
    if isinstance(obj, np.ndarray) and obj.shape == () and obj.dtype.hasobject:
        return obj.item()
    if isinstance(obj, np.ndarray) and tuple(obj.shape) != tuple(shape):
        raise FormatError(f"pickled array has shape {obj.shape}; the header says {shape}", path=path)
    return obj


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
    arr = np.asarray(value)
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
    names = tuple(n.decode() if isinstance(n, bytes) else n for n in names)
    parents = _tensor(st["parent_indices"], path, "skeleton_tree.parent_indices", dims=1, kind="i")
    lt = _tensor(st["local_translation"], path, "skeleton_tree.local_translation", dims=2, last=3)
    try:
        return SkeletonTree(names, parents, lt)
    except KangEngineError as exc:
        raise type(exc)(str(exc), path=path) from exc


def load_poselib(path: str | os.PathLike) -> SkeletonMotion | SkeletonState:
    """Read a poselib ``SkeletonMotion`` or ``SkeletonState`` ``.npy`` file.

    Quaternions are converted from poselib's XYZW to WXYZ and normalised; global rotations
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
    norms = np.linalg.norm(rot, axis=-1)
    if (norms < 1e-6).any():
        raise FormatError("holds zero-length quaternions", path=path, item="rotation")
    wxyz = R.quat_normalize(np.ascontiguousarray(rot[..., [3, 0, 1, 2]]))
    is_local = d.get("is_local", True)
    if isinstance(is_local, np.ndarray):
        is_local = bool(is_local)
    if not isinstance(is_local, (bool, np.bool_)):
        raise FormatError(f"is {is_local!r}; expected True or False", path=path, item="is_local")
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
    except (TypeError, ValueError):
        raise FormatError(f"is {fps!r}; expected a number (frames per second)", path=path, item="fps") from None
    meta = {
        "source": os.fspath(path),
        "format": "poselib",
        "source_dtype": str(dtype),
        "source_quaternion_order": "xyzw",
        "source_is_local": bool(is_local),
    }
    try:
        return SkeletonMotion(tree, state.root_translation, state.local_rotation, fps, metadata=meta)
    except KangEngineError as exc:
        raise type(exc)(str(exc), path=path) from exc


def _loads_restricted(data: bytes, *, path=None):
    """Unpickle bytes through :class:`RestrictedUnpickler` (tests and in-memory payloads)."""
    return _unpickle(io.BytesIO(data), path)


def load_poselib_motion(path: str | os.PathLike) -> SkeletonMotion:
    """:func:`load_poselib` for files that must hold a motion (``ke.io.load_motion`` uses it for ``.npy``).

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


def load_npz_motion(path: str | os.PathLike, **kw) -> SkeletonMotion:
    """Read a motion ``.npz`` of either kind, without pickle (``ke.io.load_motion`` uses it for ``.npz``):
    a file written by ``SkeletonMotion.save_npz`` (key ``format``), or an AMASS / SMPL-family clip (key
    ``poses`` or ``root_orient``; keyword arguments go to :func:`kangengine.datasets.amass.load`).

    Raises:
        FileMissingError, FormatError: no such file; neither layout (the message lists the file's keys).
    """
    path = _check_file(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
    except Exception as exc:
        raise FormatError(f"not a readable npz file ({type(exc).__name__}: {exc})", path=path) from exc
    if "format" in keys:
        if kw:
            raise FormatError(f"options {sorted(kw)} apply to AMASS files only", path=path)
        return SkeletonMotion.load_npz(path)
    if "poses" in keys or "root_orient" in keys:
        from . import amass

        return amass.load(path, **kw)
    raise FormatError(
        f"neither a KangEngine motion (key 'format') nor an AMASS clip (key 'poses'); the file holds {sorted(keys)}",
        path=path,
    )
