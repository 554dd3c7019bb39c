"""File helpers shared by every writer and reader: atomic writes, pickle-free npz loading, and the restricted
unpickler for the few formats that are pickles (poselib ``.npy``, SMPL ``.pkl`` model files).

The public path of the unpickler helpers is :mod:`kangengine.datasets` (``RestrictedUnpickler``,
``load_pickle``, ``load_npy``).
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FileMissingError, FormatError, KangEngineError

__all__ = ["atomic_write", "load_npz", "RestrictedUnpickler", "load_pickle", "load_npy", "loads_restricted"]


def atomic_write(path: str | os.PathLike, write: Callable[[object], None], *, suffix: str = "") -> Path:
    """Write a file so that readers see either the old file or the complete new one.

    ``write(fileobj)`` writes into a temporary file in the destination folder (binary mode); the
    temporary file is flushed, fsynced and renamed over ``path``; on any error it is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load_npz(path: str | os.PathLike, *, required: tuple[str, ...] = (), kind: str = "npz") -> dict:
    """Read every array of an ``.npz`` file without pickle.

    Raises:
        FileMissingError: no such file.
        FormatError: not a readable npz, an object (pickled) array, or a missing ``required`` key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileMissingError(f"no such {kind} file", path=path)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except ValueError as exc:
        raise FormatError(
            f"holds pickled objects, which are refused ({exc}); expected plain arrays", path=path
        ) from exc
    except Exception as exc:
        raise FormatError(f"not a readable npz file ({type(exc).__name__}: {exc})", path=path) from exc
    missing = [k for k in required if k not in data]
    if missing:
        raise FormatError(f"missing keys {missing}; a {kind} file holds {list(required)}", path=path)
    return data


# -- restricted unpickling ------------------------------------------------------------------------------


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


def loads_restricted(data: bytes, *, path=None):
    """Unpickle bytes through :class:`RestrictedUnpickler` (in-memory payloads; ``path`` names them in errors)."""
    return _unpickle(io.BytesIO(data), path)
