"""File helpers shared by every writer and reader: atomic writes, pickle-free npz loading, and the restricted
unpickler for the few formats that are pickles (poselib ``.npy``, SMPL ``.pkl`` model files).

The public path of the unpickler helpers is :mod:`kangengine.datasets` (``RestrictedUnpickler``,
``load_pickle``, ``load_npy``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import json
import math
import operator
import os
import pickle
import pickletools
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FileMissingError, FormatError, KangEngineError, NonFiniteError

__all__ = [
    "read_json",
    "atomic_write",
    "write_npz",
    "npz_bytes",
    "load_npz",
    "npz_keys",
    "npz_array",
    "npz_scalar",
    "npz_json",
    "unit_quaternions",
    "QUAT_NORM_TOLERANCE",
    "NPZ_MAX_DEFLATE_RATIO",
    "RestrictedUnpickler",
    "load_pickle",
    "load_npy",
    "loads_restricted",
]


def atomic_write(
    path: str | os.PathLike, write: Callable[[object], None], *, suffix: str = "", durable: bool = True
) -> Path:
    """Write a file so that readers see either the old file or the complete new one.

    ``write(fileobj)`` writes into a temporary file in the destination folder (binary mode); the
    temporary file is flushed, fsynced and renamed over ``path``; on any error it is removed.

    ``durable=False`` skips the ``fsync`` (about 5 ms of waiting per file on an ext4 disk, and 0.3 ms of CPU):
    other processes, and a run after a kill of this one, still see the old file or the complete new one; only
    a crash of the machine before the kernel writes the file back (within about 30 s) can leave the old file,
    an empty one or a torn one under ``path``. For files whose readers check them (an ``.npz``'s members carry
    CRCs that :func:`load_npz` and ``zipfile`` verify) and that can be made again.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


_NPZ_DATE = (1 << 5) | 1  # DOS date 1980-01-01, time 00:00: what np.savez's zipfile members carry
_ZIP_LOCAL = struct.Struct("<IHHHHHIIIHH")
_ZIP_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP_END = struct.Struct("<IHHHHIIH")
_ZIP_SMALL = 0x7FFFFFFF  # beyond: zip64 headers, written by zipfile (np.savez)


def _npy_header_of(descr, fortran: bool, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``numpy.lib.format.write_array`` writes (format 1.0, or 2.0 when over 64 KiB)."""
    d = {"descr": descr, "fortran_order": fortran, "shape": shape}
    head = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(head, d)
    except ValueError:
        head = io.BytesIO()
        np.lib.format.write_array_header_2_0(head, d)
    return head.getvalue()


# a batch writes the same few (dtype, shape) pairs again and again; keyed by the dtype's text ('<f4', '<U12')
_npy_header_cached = functools.lru_cache(maxsize=512)(_npy_header_of)


def _npy_member(value) -> tuple[bytes, bytes]:
    """``(npy header, data)`` of one array, as ``numpy.lib.format.write_array`` writes them."""
    arr = np.asanyarray(value)
    if arr.dtype.hasobject:
        raise ValueError(f"object arrays are not written (no pickles): dtype {arr.dtype}")
    fortran = bool(arr.flags.f_contiguous and not arr.flags.c_contiguous)  # numpy's rule (``flags.fnc``)
    descr = np.lib.format.dtype_to_descr(arr.dtype)
    header = (
        _npy_header_cached(descr, fortran, arr.shape)
        if isinstance(descr, str)
        else _npy_header_of(descr, fortran, arr.shape)
    )
    return header, arr.tobytes(order="F" if fortran else "C")


def npz_bytes(arrays: Mapping[str, Any]) -> bytes:
    """The bytes of an uncompressed ``.npz`` holding ``arrays`` (the archive ``np.savez`` writes).

    Each member is ``<key>.npy`` exactly as ``numpy.lib.format.write_array`` writes it, stored (not deflated),
    dated 1980-01-01 as ``np.savez`` dates its members, so the same arrays give the same bytes and ``np.load``,
    ``zipfile`` and :func:`load_npz` read them. The zip headers are packed here in one pass (no member header
    rewritten after its data, no seek); archives of 2 GiB or more are left to ``np.savez`` (zip64 headers).

    Raises:
        ValueError: an object array (no pickles are written).
    """
    parts: list[bytes] = []
    central: list[bytes] = []
    offset = 0
    for key, value in arrays.items():
        header, data = _npy_member(value)
        name = f"{key}.npy".encode()
        flags = 0 if name.isascii() else 0x800  # UTF-8 names
        crc = zlib.crc32(data, zlib.crc32(header))
        size = len(header) + len(data)
        if offset + size > _ZIP_SMALL:
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            return buf.getvalue()
        parts += [_ZIP_LOCAL.pack(0x04034B50, 20, flags, 0, 0, _NPZ_DATE, crc, size, size, len(name), 0), name]
        parts += [header, data]
        central += [
            _ZIP_CENTRAL.pack(
                0x02014B50, (3 << 8) | 20, 20, flags, 0, 0, _NPZ_DATE, crc, size, size, len(name), 0, 0, 0, 0, 0, offset
            ),
            name,
        ]
        offset += _ZIP_LOCAL.size + len(name) + size
    directory = b"".join(central)
    n = len(central) // 2
    return b"".join([*parts, directory, _ZIP_END.pack(0x06054B50, 0, 0, n, n, len(directory), offset, 0)])


def write_npz(path: str | os.PathLike, arrays: Mapping[str, Any], *, durable: bool = True) -> Path:
    """Write ``arrays`` as an uncompressed ``.npz`` (:func:`npz_bytes`: what ``np.savez`` writes) with one
    ``write``, atomically (:func:`atomic_write`; ``durable`` as there).

    About a third of the CPU time of ``np.savez`` into the file for a motion's dozen small arrays (zipfile
    writes each member's header, then its data, then seeks back to rewrite the header).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    Raises:
        ValueError: an object array.
    """
    blob = npz_bytes(arrays)
    return atomic_write(path, lambda f: f.write(blob), suffix=".npz", durable=durable)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Largest ``|norm - 1|`` of a stored quaternion that readers normalise (with a note in the motion's metadata);
#: beyond it the file is refused. Float32 rounding of a unit quaternion is ~1e-7; poselib's float64 backflip
#: clip deviates by 6e-6; a quaternion off by 1e-3 was not written as a rotation.
QUAT_NORM_TOLERANCE = 1e-3

#: Most bytes a deflated zip member can expand to per compressed byte (deflate's limit is about 1032:1).
NPZ_MAX_DEFLATE_RATIO = 1100
_NPY_HEADER_MAX = 65536  # numpy refuses headers over 10000 characters itself


def _npz_fail(msg, path, item=None, exc=None):
    detail = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
    return FormatError(f"{msg}{detail}", path=path, item=item)


def npz_keys(path: str | os.PathLike, *, kind: str = "npz") -> list[str]:
    """The array names of an ``.npz`` file, read from its zip directory only (no member is read).

    Raises:
        FileMissingError: no such file.
        FormatError: not an npz file (not a zip archive).
    """
    path = Path(path)
    if not path.is_file():
        raise FileMissingError(f"no such {kind} file", path=path)
    with _open_zip(path) as zf:
        return [_member_key(i.filename) for i in zf.infolist()]


def _member_key(name: str) -> str:
    return name[:-4] if name.endswith(".npy") else name


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except Exception as exc:  # BadZipFile, OSError, ValueError, struct.error, ...
        raise _npz_fail("not an npz file; expected a zip archive of .npy arrays (np.savez)", path, exc=exc) from exc


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, file_size: int) -> np.ndarray:
    """One ``.npy`` member, with every size its headers claim checked against the bytes that exist."""
    key = _member_key(info.filename)
    if info.header_offset + info.compress_size > file_size:
        raise FormatError(
            f"member claims {info.compress_size} stored bytes at offset {info.header_offset}; the file has "
            f"{file_size} bytes",
            path=path,
            item=key,
        )
    stored = info.compress_type == zipfile.ZIP_STORED
    limit = info.compress_size if stored else NPZ_MAX_DEFLATE_RATIO * info.compress_size
    if info.file_size > limit:
        raise FormatError(
            f"member claims {info.file_size} bytes from {info.compress_size} stored bytes; expected at most {limit}",
            path=path,
            item=key,
        )
    try:
        with zf.open(info) as f:
            head = io.BytesIO(f.read(min(info.file_size, _NPY_HEADER_MAX)))
            shape, fortran, dtype = _npy_header(head)
            if dtype.hasobject:
                raise FormatError(
                    f"is a pickled object array (dtype {dtype}), which is refused; expected a plain array",
                    path=path,
                    item=key,
                )
            nbytes = _claimed_bytes(shape, dtype, path, key)
            offset = head.tell()
            if nbytes != info.file_size - offset:
                raise FormatError(
                    f"header claims shape {shape} of {dtype} ({nbytes} bytes); the member holds "
                    f"{info.file_size - offset} bytes of data",
                    path=path,
                    item=key,
                )
            buf = bytearray(nbytes)
            view = memoryview(buf)
            have = head.readinto(view)
            while have < nbytes:
                n = f.readinto(view[have:])
                if not n:
                    raise FormatError(f"truncated: {have} of {nbytes} data bytes", path=path, item=key)
                have += n
            if f.read(1):  # also makes zipfile check the member's CRC
                raise FormatError(f"more than the {nbytes} data bytes its header claims", path=path, item=key)
    except KangEngineError:
        raise
    except Exception as exc:  # BadZipFile (CRC), zlib.error, EOFError, NotImplementedError, ...
        raise _npz_fail("not a readable npz member", path, key, exc) from exc
    try:
        return np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    except (ValueError, TypeError) as exc:  # a zero itemsize, an odd structured dtype
        raise _npz_fail(f"cannot hold shape {shape} of {dtype}", path, key, exc) from None


def _npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)  # 2.0 and 3.0 share the header layout


def _claimed_bytes(shape, dtype: np.dtype, path, item) -> int:
    n = dtype.itemsize
    for s in shape:
        if not isinstance(s, int) or s < 0:
            raise FormatError(f"header shape {shape}; expected non-negative integers", path=path, item=item)
        n *= s
    return n


def load_npz(
    path: str | os.PathLike,
    *,
    required: tuple[str, ...] = (),
    optional: tuple[str, ...] | None = None,
    kind: str = "npz",
) -> dict:
    """Read arrays of an ``.npz`` file without pickle, bounded by the file's size.

    Only the members named in ``required`` and ``optional`` are read (``optional=None``: every member). Before
    anything is allocated, what each zip and ``.npy`` header claims is checked against the bytes that exist: a
    stored member holds at most the file's size, a deflated one at most :data:`NPZ_MAX_DEFLATE_RATIO` times its
    compressed bytes, and its array exactly the bytes after its header. Memory is therefore bounded by the
    file's size (stored members, what ``np.savez`` writes) or by that ratio (``np.savez_compressed``).

    Returns:
        ``{key: ndarray}`` for the members read (writable arrays, the file's dtypes and shapes).

    Raises:
        FileMissingError: no such file.
        FormatError: not an npz file, a member that holds pickled objects, a header claiming more bytes than
            exist, a corrupt or truncated member, or a missing ``required`` key (each names the file and key).
    """
    path = Path(path)
    if not path.is_file():
        raise FileMissingError(f"no such {kind} file", path=path)
    file_size = path.stat().st_size
    with _open_zip(path) as zf:
        members = {_member_key(i.filename): i for i in zf.infolist()}
        missing = [k for k in required if k not in members]
        if missing:
            raise FormatError(
                f"missing keys {missing}; a {kind} file holds {list(required)} (this one: {sorted(members)[:20]})",
                path=path,
            )
        wanted = list(members) if optional is None else [k for k in (*required, *optional) if k in members]
        return {k: _read_member(zf, members[k], path, file_size) for k in dict.fromkeys(wanted)}


def npz_array(z: Mapping, key: str, path, *, kind: str = "f", ndim: int | None = None, last: int | None = None):
    """``z[key]`` checked: ``kind="f"`` numeric (integers become float64, float16 float32) and finite, ``"i"``
    integer, ``"U"`` text; ``ndim`` dimensions; ``last`` the size of the last axis.

    Raises:
        FormatError, NonFiniteError: naming ``path`` and ``key``.
    """
    a = z[key]
    if kind == "f":
        if a.dtype.kind not in "fiu":
            raise FormatError(f"dtype {a.dtype}; expected floats", path=path, item=key)
        if a.dtype.kind != "f":
            a = a.astype(np.float64)
        elif a.dtype.itemsize < 4:  # float16: upcast (exact), so that checks and normalisation are not rounded
            a = a.astype(np.float32)
        if not np.isfinite(a).all():
            raise NonFiniteError("holds NaN or inf; expected finite numbers", path=path, item=key)
    elif kind == "i" and a.dtype.kind not in "iu":
        raise FormatError(f"dtype {a.dtype}; expected integers", path=path, item=key)
    elif kind == "U" and a.dtype.kind not in "U":
        raise FormatError(f"dtype {a.dtype}; expected text", path=path, item=key)
    if ndim is not None and a.ndim != ndim:
        raise FormatError(f"shape {a.shape}; expected {ndim} dimensions", path=path, item=key)
    if last is not None and (a.ndim == 0 or a.shape[-1] != last):
        raise FormatError(f"shape {a.shape}; expected a last axis of {last}", path=path, item=key)
    return a


def npz_scalar(z: Mapping, key: str, path, *, kind: type = float):
    """The one value of ``z[key]`` as ``float`` (finite), ``int`` or ``str``.

    Raises:
        FormatError: not one value, or not of that kind (naming ``path`` and ``key``).
    """
    a = z[key]
    if a.size != 1:
        raise FormatError(f"shape {a.shape}; expected one value", path=path, item=key)
    v = a.reshape(()).item()
    if kind is str:
        if a.dtype.kind != "U":
            raise FormatError(f"dtype {a.dtype}; expected text", path=path, item=key)
        return str(v)
    ok = a.dtype.kind in ("iu" if kind is int else "fiu")
    if not ok:
        raise FormatError(
            f"is {str(v)[:40]!r} ({a.dtype}); expected {'an integer' if kind is int else 'a number'}",
            path=path,
            item=key,
        )
    try:
        v = kind(v)
    except (OverflowError, ValueError, TypeError):
        raise FormatError(f"is {v!r}; expected a {kind.__name__}", path=path, item=key) from None
    if kind is float and not math.isfinite(v):
        raise FormatError(f"is {v}; expected a finite number", path=path, item=key)
    return v


def npz_json(z: Mapping, key: str, path, *, expect: type = dict):
    """``json.loads`` of the text in ``z[key]``, which must decode to an ``expect``.

    Raises:
        FormatError: not text, not JSON (or nested too deeply), or not an ``expect`` (naming ``path`` and ``key``).
    """
    text = npz_scalar(z, key, path, kind=str)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _npz_fail("is not valid JSON", path, key, exc) from None
    if not isinstance(value, expect):
        raise FormatError(f"holds JSON {type(value).__name__}; expected {expect.__name__}", path=path, item=key)
    return value


def unit_quaternions(q: np.ndarray, *, path=None, item: str = "quaternions", tol: float = QUAT_NORM_TOLERANCE):
    """``q [..., 4]`` (any order) normalised, refusing zero and non-unit quaternions.

    Returns:
        ``(q_unit, note)``: ``q`` itself with ``note=None`` when every norm is 1 to within 8 epsilons of its
        dtype; else ``q`` divided by its norms (same dtype) and a sentence (the largest deviation) for the
        motion's metadata.

    Raises:
        FormatError: a quaternion whose norm differs from 1 by more than ``tol`` (naming ``path``, ``item`` and
            the first bad index).
    """
    norm = np.sqrt(np.einsum("...i,...i->...", q, q, dtype=np.float64))
    dev = np.abs(norm - 1.0)
    if dev.size == 0:
        return q, None
    worst = float(dev.max()) if np.isfinite(dev).all() else math.inf
    if worst > tol:
        bad = np.argwhere(~(dev <= tol))[0]
        raise FormatError(
            f"quaternion {tuple(int(i) for i in bad)} has norm {float(norm[tuple(bad)]):.6g}; expected unit "
            f"quaternions (|norm - 1| <= {tol})",
            path=path,
            item=item,
        )
    eps = float(np.finfo(q.dtype).eps) if q.dtype.kind == "f" else 1e-15
    if worst <= 8 * eps:  # unit to float rounding: kept bit for bit (round trips stay exact)
        return q, None
    note = f"normalised {item}: largest |norm - 1| was {worst:.3g} (tolerance {tol})"
    return (q / norm[..., None]).astype(q.dtype, copy=False), note


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


#: What the restricted unpickler may allocate, per byte of the pickle it reads (plus
#: :data:`PICKLE_BUDGET_SLACK`): arrays, bytes, strings and container copies built by the globals it admits
#: are charged against it before (sized constructors) or as (copies) they are made.
PICKLE_BUDGET_FACTOR = 4
PICKLE_BUDGET_SLACK = 1 << 20


class _Budget:
    """Bytes an unpickler may still allocate through the globals it admits."""

    def __init__(self, limit: int, path, size: int | None):
        self.left = int(limit)
        self.limit = int(limit)
        self.path = path
        self.size = size

    def charge(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            source = f"a {self.size}-byte pickle" if self.size is not None else "this pickle"
            raise FormatError(
                f"{what} asks for {nbytes} bytes; {source} may allocate at most {self.limit} in all "
                f"({self.left} left); expected arrays no larger than the data the file holds",
                path=self.path,
            )
        self.left -= int(nbytes)


def _array_bytes(shape, dtype, budget: _Budget, what: str) -> int:
    try:
        dims = tuple(operator.index(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        itemsize = np.dtype(dtype).itemsize
    except (TypeError, ValueError) as exc:
        raise FormatError(f"{what}: shape {shape!r} / dtype {dtype!r} ({exc})", path=budget.path) from None
    n = max(itemsize, 1)
    for d in dims:
        if d < 0:
            raise FormatError(f"{what}: shape {dims} has a negative size", path=budget.path)
        n *= d
    budget.charge(n, f"{what} of shape {dims}")
    return n


class _PickledArrayBase(np.ndarray):
    """The arrays a restricted pickle builds: ``__setstate__`` checks the state before numpy sees it (numpy
    trusts it: an object array given fewer items than its shape holds NULL pointers and crashes on use)."""

    _budget: _Budget

    def __new__(cls, shape, dtype=float, *rest):
        """``numpy.ndarray(shape, dtype)`` as a pickle's REDUCE calls it, charged first (no buffer arguments)."""
        if rest:
            raise FormatError(
                "refused numpy.ndarray(...) over a buffer; expected (shape, dtype)", path=cls._budget.path
            )
        _array_bytes(shape, dtype, cls._budget, "numpy.ndarray")
        return super().__new__(cls, shape, dtype)

    def __setstate__(self, state):
        budget = type(self)._budget
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise FormatError(f"array state {type(state).__name__}; expected numpy's tuple", path=budget.path)
        shape, dtype, _fortran, data = state[-4:]
        if not isinstance(dtype, np.dtype) or not isinstance(shape, tuple):
            raise FormatError("array state without a shape tuple and a dtype", path=budget.path)
        nbytes = _array_bytes(shape, dtype, budget, "pickled array")
        count = nbytes // max(dtype.itemsize, 1)
        if dtype.hasobject:
            if not isinstance(data, list) or len(data) != count:
                raise FormatError(
                    f"object array of shape {shape} with {len(data) if isinstance(data, list) else 'no'} items; "
                    f"expected a list of {count}",
                    path=budget.path,
                )
        elif not isinstance(data, (bytes, bytearray, str)) or len(data) != nbytes:
            raise FormatError(
                f"array of shape {shape} {dtype} with {len(data) if hasattr(data, '__len__') else 'no'} data "
                f"bytes; expected {nbytes}",
                path=budget.path,
            )
        try:
            super().__setstate__(state)
        except (TypeError, ValueError) as exc:
            raise FormatError(f"bad array state ({exc})", path=budget.path) from None


def _plain(obj, seen: dict):
    """``obj`` with every :class:`_PickledArrayBase` replaced by a plain ``np.ndarray`` view (containers are
    rebuilt or updated in place; cycles are followed once)."""
    key = id(obj)
    if key in seen:
        return seen[key]
    if isinstance(obj, np.ndarray):
        out = obj.view(np.ndarray)
        seen[key] = out
        if out.dtype.hasobject:
            flat = out.reshape(-1)
            for i in range(flat.size):
                flat[i] = _plain(flat[i], seen)
        return out
    if isinstance(obj, list):
        seen[key] = obj
        obj[:] = [_plain(x, seen) for x in obj]
        return obj
    if isinstance(obj, dict):
        seen[key] = obj
        for k in list(obj):
            obj[k] = _plain(obj[k], seen)
        return obj
    if isinstance(obj, tuple):
        out = tuple(_plain(x, seen) for x in obj)
        seen[key] = out
        return out
    return obj


def _shallow_bytes(obj) -> int:
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj) + 64
    if isinstance(obj, (list, tuple, set, frozenset, dict)):
        return 8 * len(obj) + 64
    return 64


def _charged(fn, budget: _Budget, name: str):
    """``fn`` (a builtin type): a size-only argument (``bytearray(10**9)``) is refused before it allocates; any
    result is charged by its size."""

    def call(*args, **kwargs):
        if name in ("bytes", "bytearray") and args and isinstance(args[0], int):
            budget.charge(int(args[0]), f"builtins.{name}({args[0]})")
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)
        budget.charge(_shallow_bytes(out), f"builtins.{name}")
        return out

    call.__name__ = name
    return call


def _default_globals(budget: _Budget) -> dict[tuple[str, str], Any]:
    multiarray = _numpy_core("multiarray")
    numeric = _numpy_core("numeric")
    array_type = type("ndarray", (_PickledArrayBase,), {"_budget": budget})

    def reconstruct(subtype, shape, dtype):
        if subtype is not array_type:
            raise FormatError(f"refused _reconstruct of {subtype!r}; expected numpy.ndarray", path=budget.path)
        _array_bytes(shape, np.uint8 if isinstance(dtype, bytes) else dtype, budget, "_reconstruct")
        return multiarray._reconstruct(array_type, shape, dtype)

    def scalar(dtype, *data):
        if not isinstance(dtype, np.dtype) or dtype.hasobject:
            raise FormatError(f"refused numpy scalar of {dtype!r}; expected a plain dtype", path=budget.path)
        budget.charge(dtype.itemsize, "numpy scalar")
        return multiarray.scalar(dtype, *data)

    def frombuffer(buf, dtype, shape, order):
        out = numeric._frombuffer(buf, dtype, shape, order)
        budget.charge(out.nbytes, "numpy array from a buffer")
        return out

    def codecs_encode(obj, encoding="utf-8", errors="strict"):
        out = _codecs_encode(obj, encoding, errors)
        budget.charge(len(out), "_codecs.encode")
        return out

    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): array_type,
        ("numpy", "dtype"): np.dtype,
        ("collections", "OrderedDict"): _charged(collections.OrderedDict, budget, "OrderedDict"),
        ("_codecs", "encode"): codecs_encode,
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = scalar
        if hasattr(numeric, "_frombuffer"):
            allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
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
        allowed[("builtins", name)] = _charged(getattr(__import__("builtins"), name), budget, name)
    return allowed


# Python 2 pickles (SMPL model files) name modules the Python 2 way.
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg", "cPickle": "pickle"}


def _remaining_bytes(file) -> int | None:
    try:
        pos = file.tell()
        end = file.seek(0, os.SEEK_END)
        file.seek(pos)
        return end - pos
    except (AttributeError, OSError, ValueError):
        return None


def _check_opcodes(data: bytes, path) -> None:
    """Walk the opcodes of the pickle in ``data`` without building anything: every length a counted opcode
    claims (``BINBYTES8``, ``BYTEARRAY8``, ...) must fit in the bytes that exist. CPython's unpickler allocates
    the claimed length before reading (a 20-byte pickle claiming 1.9 GB allocates 1.9 GB)."""
    try:
        for _ in pickletools.genops(io.BytesIO(data)):
            pass
    except (ValueError, EOFError, OverflowError, MemoryError) as exc:  # truncated, unknown opcode, bad text
        raise FormatError(f"not a readable pickle ({exc})", path=path) from None


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that rebuilds only numpy arrays and plain Python containers, in memory
    bounded by the pickle's size.

    ``find_class`` admits numpy array reconstruction (``numpy.core.multiarray._reconstruct`` and its
    numpy 2 name ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``, numpy
    scalars, ``numpy.core.numeric._frombuffer``), ``collections.OrderedDict`` and the builtin containers
    and scalar types; everything else raises :class:`~kangengine.errors.FormatError` naming the file and
    the global, so no code from the file ever runs. Persistent ids are refused too.

    Memory: before unpickling, the opcodes are walked (:mod:`pickletools`) so that no length a counted opcode
    claims exceeds the bytes that exist; the admitted globals charge what they build (array sizes from shapes,
    ``bytearray(n)``, container copies) against a budget of :data:`PICKLE_BUDGET_FACTOR` bytes per pickle byte
    plus :data:`PICKLE_BUDGET_SLACK`, checked before a sized allocation; array states are checked against
    their shape and dtype before numpy sees them. Arrays come back as plain ``np.ndarray``.

    Args:
        file: a binary file object positioned at the pickle.
        path: the file's path, used in error messages.
        extra_globals: more ``{(module, name): object}`` to admit (the SMPL model reader adds stand-ins
            for ``scipy.sparse`` matrices this way).
        encoding: how to decode Python 2 ``str`` objects (``"latin1"`` keeps numpy buffers intact).
        max_bytes: the allocation budget; default from the bytes left in ``file`` (a stream that cannot
            seek: 1 GiB).
    """

    def __init__(
        self,
        file,
        *,
        path: str | os.PathLike | None = None,
        extra_globals: Mapping[tuple[str, str], Any] | None = None,
        encoding: str = "latin1",
        max_bytes: int | None = None,
    ):
        super().__init__(file, encoding=encoding, fix_imports=False)
        self._file = file
        self._path = path
        size = _remaining_bytes(file)
        if max_bytes is None:
            max_bytes = (1 << 30) if size is None else PICKLE_BUDGET_FACTOR * size + PICKLE_BUDGET_SLACK
        self._budget = _Budget(max_bytes, path, size)
        self._allowed = _default_globals(self._budget)
        if extra_globals:
            self._allowed.update(extra_globals)

    def load(self):
        """Unpickle one object (opcode lengths checked first when the file can seek)."""
        pos = None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            pos = self._file.tell()
        if pos is not None and self._budget.size is not None:
            _check_opcodes(self._file.read(), self._path)
            self._file.seek(pos)
        return _plain(super().load(), {})

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

    Memory is bounded by the file's size: the header is read from the file's first 64 KiB, a plain array must
    hold exactly the bytes its header claims, and a pickle is unpickled within the unpickler's budget.

    Returns:
        a numpy array; for a 0-d object array (what ``np.save(path, some_dict)`` writes) the object
        itself (``arr.item()``), e.g. poselib's dict.

    Raises:
        FileMissingError, FormatError: no such file, not an ``.npy`` file, a header claiming more data than
            the file holds, a refused pickle global, truncated data.
    """
    path = _check_file(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = io.BytesIO(f.read(min(size, _NPY_HEADER_MAX)))
        try:
            shape, fortran, dtype = _npy_header(head)
        except Exception as exc:
            raise FormatError(f"not an .npy file ({type(exc).__name__}: {exc})", path=path) from exc
        offset = head.tell()
        f.seek(offset)
        if not dtype.hasobject:
            nbytes = _claimed_bytes(shape, dtype, path, "header")
            if nbytes != size - offset:
                raise FormatError(
                    f"header claims shape {shape} of {dtype} ({nbytes} bytes); the file holds {size - offset} "
                    "bytes of data",
                    path=path,
                )
            try:
                arr = np.fromfile(f, dtype=dtype, count=nbytes // dtype.itemsize) if nbytes else None
                if arr is None:
                    arr = np.zeros(0, dtype)
                return arr.reshape(shape, order="F" if fortran else "C")
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


def read_json(path: str | os.PathLike, *, kind: str = "JSON"):
    """The parsed content of a JSON file (configurations, reports).

    Raises:
        FileMissingError: no such file (the message says which ``kind`` of file was expected).
        FormatError: not UTF-8 or not valid JSON.
    """
    import json

    p = Path(path)
    if not p.is_file():
        raise FileMissingError(f"no such {kind}", path=p)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FormatError(f"not valid JSON ({type(exc).__name__}: {exc})", path=p) from exc
