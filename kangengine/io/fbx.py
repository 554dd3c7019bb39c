"""FBX motion files, read through pyassimp and the system libassimp (Debian ``libassimp5``).

What is read
    The scene graph (node names, parents, rest ``Lcl`` transforms) and one animation take (position,
    rotation and scaling keys per node). assimp bakes FBX pivots, pre- and post-rotations into the node
    transforms and keys (``IMPORT_FBX_PRESERVE_PIVOTS`` off), so every node is one ``T * R * S``.

Which nodes form the skeleton
    The root is the lowest common ancestor of the animated nodes, moved down through nodes that do not
    move (no keys, or constant keys) and have a single child on the way to the animated nodes (e.g. the
    CMU FBX's ``07_01`` null above ``Hips``, a Blender ``Armature`` object above a single root bone).
    The skeleton is that root and every node below it that holds no mesh (meshes and their subtrees
    are skipped unless animated). ``root=`` picks the root by name. Nodes above the root are folded into
    the root's world transform (their scale into the units).

Time
    The take's keys are resampled on a uniform grid from its first to its last key: by default at the
    file's key rate (``ticks per second / smallest key spacing``, e.g. 120 ticks/s with a key per tick
    gives 120 fps), or at ``fps=``. Positions and scales are interpolated linearly, rotations by slerp
    (shortest path), holding the first/last key outside the keyed range, as assimp does.

Units and axes
    World positions are in the scene's units, ``UnitScaleFactor`` centimetres (assimp's scene metadata;
    1.0 when absent), including the scale of the nodes above the skeleton (a Blender export carries
    ``x100`` on the armature object). They become metres with ``UnitScaleFactor / 100`` and then
    ``scale`` (a multiplier, default 1). The scene's ``UpAxis`` (Y or Z) says whether ``zup_from_yup``
    applies (see :mod:`kangengine.conventions`). Scales on nodes inside the skeleton are assumed uniform:
    rotations are taken from the world matrices with their column lengths divided out.

Why not ``pyassimp.load``: with the Debian library (5.2) it fails on skinned meshes (its ``aiBone``
struct lacks fields the library has: "NULL pointer access") and it turns every key into a Python
object (about a second for a 300-frame clip). This module reads the scene's nodes, animations and
metadata through pyassimp's ctypes structures of those (which match the library) and the library
handle pyassimp finds, and copies the keys with numpy.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np

from .. import conventions as axes
from .. import rotations as R
from ..errors import FileMissingError, FormatError, MissingDependencyError, UnitsWarning, UnknownNameError

__all__ = ["load_fbx", "fbx_take_names", "FBX_PLAUSIBLE_HEIGHT_M"]

#: Standing height (m) a mocap-sized skeleton (>= 20 nodes) must have after the unit conversion; outside it
#: the file's declared unit is taken to be wrong and corrected (``units="auto"``) or refused.
FBX_PLAUSIBLE_HEIGHT_M = (0.2, 3.0)
_MOCAP_NODES = 20
# zlib cannot inflate more than ~1032 bytes per compressed byte; an array count claiming more is corrupt.
_ZLIB_MAX_RATIO = 1032
_ARRAY_ITEM = {"f": 4, "d": 8, "l": 8, "i": 4, "b": 1}
_SCALAR_SIZE = {"Y": 2, "C": 1, "I": 4, "F": 4, "D": 8, "L": 8}
_BINARY_MAGIC = b"Kaydara FBX Binary  \x00"

_META_BOOL, _META_INT32, _META_UINT64, _META_FLOAT, _META_DOUBLE, _META_STRING, _META_VEC3 = range(7)
_LIB = None


def _library():
    """(dll, pyassimp.structs) with the import functions typed; raises MissingDependencyError."""
    global _LIB
    if _LIB is not None:
        return _LIB
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyassimp imports the deprecated distutils
            import pyassimp  # noqa: F401  (finds libassimp at import)
            from pyassimp import helper, structs
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading FBX needs pyassimp ({exc}); install KangEngine with the 'fbx' extra: pip install -e \".[fbx]\"",
            item="pyassimp",
        ) from exc
    except Exception as exc:  # pyassimp.errors.AssimpError: the shared library is missing
        raise MissingDependencyError(
            f"pyassimp cannot load the assimp library ({exc}); install it: apt-get install -y libassimp5",
            item="libassimp",
        ) from exc
    dll = helper.search_library()[-1]
    dll.aiCreatePropertyStore.restype = ctypes.c_void_p
    dll.aiReleasePropertyStore.argtypes = [ctypes.c_void_p]
    dll.aiSetImportPropertyInteger.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    dll.aiImportFileExWithProperties.restype = ctypes.POINTER(structs.Scene)
    dll.aiImportFileExWithProperties.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    dll.aiReleaseImport.argtypes = [ctypes.POINTER(structs.Scene)]
    dll.aiGetErrorString.restype = ctypes.c_char_p
    version = (dll.aiGetVersionMajor(), dll.aiGetVersionMinor())
    # assimp 5.3 added an interpolation field to the key structs: aiQuatKey grew from 24 to 32 bytes.
    quat_stride = 32 if version >= (5, 3) else 24
    _LIB = (dll, structs, quat_stride, version)
    return _LIB


def _string(s) -> str:
    return s.data[: s.length].decode("utf-8", errors="replace")


def _metadata(ptr, structs) -> dict:
    out = {}
    if not ptr:
        return out
    md = ptr.contents
    types = {
        _META_BOOL: ctypes.c_bool,
        _META_INT32: ctypes.c_int32,
        _META_UINT64: ctypes.c_uint64,
        _META_FLOAT: ctypes.c_float,
        _META_DOUBLE: ctypes.c_double,
    }
    for i in range(md.mNumProperties):
        key = _string(md.mKeys[i])
        e = md.mValues[i]
        if not e.mData:
            continue
        if e.mType in types:
            out[key] = ctypes.cast(e.mData, ctypes.POINTER(types[e.mType])).contents.value
        elif e.mType == _META_STRING:
            out[key] = _string(ctypes.cast(e.mData, ctypes.POINTER(structs.String)).contents)
        elif e.mType == _META_VEC3:
            v = ctypes.cast(e.mData, ctypes.POINTER(structs.Vector3D)).contents
            out[key] = (v.x, v.y, v.z)
    return out


def _matrix(m) -> np.ndarray:
    return np.array(
        [[m.a1, m.a2, m.a3, m.a4], [m.b1, m.b2, m.b3, m.b4], [m.c1, m.c2, m.c3, m.c4], [m.d1, m.d2, m.d3, m.d4]],
        dtype=np.float64,
    )


def _keys(ptr, n: int, stride: int, width: int, path, node: str, what: str):
    """(times [n] float64 ticks, values [n, width] float64) from an array of assimp keys."""
    if n == 0:
        return np.zeros(0), np.zeros((0, width))
    raw = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), (n * stride,)).reshape(n, stride)
    t = raw[:, :8].copy().view(np.float64).reshape(n)
    v = raw[:, 8 : 8 + 4 * width].copy().view(np.float32).reshape(n, width).astype(np.float64)
    if not (np.isfinite(t).all() and np.isfinite(v).all()):
        raise FormatError(f"{what} keys of node {node!r} hold NaN or inf", path=path, item=f"{node}.{what}")
    if n > 1 and (np.diff(t) < 0).any():
        raise FormatError(f"{what} key times of node {node!r} are not increasing", path=path, item=f"{node}.{what}")
    return t, v


def _check_fbx_file(path: Path) -> None:
    """Check what the file's headers and array counts claim against its real size, before libassimp
    allocates anything from them (a corrupted count made it allocate 4 GB).

    Binary FBX: every node record must lie inside its parent and the file, its property list must parse to
    exactly its declared length, an uncompressed array's byte length must be its count times the item size,
    and a zlib array must inflate to exactly that many bytes (inflated with that bound, so a lying header
    costs no more than the file's own data). ASCII FBX: no ``*N`` array count may exceed the file's size.
    """
    data = path.read_bytes()
    if data.startswith(_BINARY_MAGIC):
        _check_binary_fbx(data, path)
    elif b"FBXHeaderExtension" in data[:4096]:
        for m in re.finditer(rb"\*\s*(\d{1,30})", data):
            if int(m.group(1)) > len(data):
                raise FormatError(
                    f"an array claims {int(m.group(1))} values but the file has only {len(data)} bytes",
                    path=path,
                    item=f"byte {m.start()}",
                )


def _check_binary_fbx(data: bytes, path: Path) -> None:
    if len(data) < 27:
        raise FormatError("truncated binary FBX header; expected at least 27 bytes", path=path, item="header")
    version = struct.unpack_from("<I", data, 23)[0]
    word = 8 if version >= 7500 else 4
    head = struct.Struct("<QQQ" if word == 8 else "<III")
    stack = [len(data)]  # end offsets of the open records; the file itself first
    pos = 27
    while True:
        end = stack[-1]
        if len(stack) > 1 and pos == end:  # a nested list that ends without a null record
            stack.pop()
            continue
        if pos + head.size + 1 > end:
            if len(stack) == 1:
                return  # the top level may end in a short footer; assimp judges the rest
            raise FormatError("a node record runs past its parent's end", path=path, item=f"byte {pos}: node record")
        end_offset, num_props, props_len = head.unpack_from(data, pos)
        name_len = data[pos + head.size]
        if end_offset == 0 and num_props == 0 and props_len == 0:  # null record: closes the current list
            if len(stack) == 1:
                return
            pos = stack.pop()
            continue
        props_at = pos + head.size + 1 + name_len
        name = data[pos + head.size + 1 : props_at].decode("latin-1")
        item = f"byte {pos}: node {name!r}"
        if end_offset > len(data):
            raise FormatError(
                f"the node record claims to end at byte {end_offset} but the file has {len(data)} bytes; the file is "
                "truncated or corrupted",
                path=path,
                item=item,
            )
        if not (pos < end_offset <= end and props_at + props_len <= end_offset):
            raise FormatError(
                f"the node record claims to end at byte {end_offset} with {props_len} bytes of properties; expected "
                f"it inside its parent (bytes {pos} to {end})",
                path=path,
                item=item,
            )
        _check_properties(data, props_at, num_props, props_len, path, item)
        pos = props_at + props_len
        if pos < end_offset:  # nested records follow
            stack.append(end_offset)


def _check_properties(data: bytes, pos: int, count: int, length: int, path, item: str) -> None:
    end = pos + length
    if count > length:
        raise FormatError(f"{count} properties in {length} bytes", path=path, item=item)
    for k in range(count):
        if pos >= end:
            raise FormatError(f"property {k} starts past the property list's end", path=path, item=item)
        code = chr(data[pos])
        pos += 1
        if code in _ARRAY_ITEM:
            if pos + 12 > end:
                raise FormatError(f"array property {k} header runs past the list", path=path, item=item)
            n, encoding, stored = struct.unpack_from("<III", data, pos)
            pos += 12
            want = n * _ARRAY_ITEM[code]
            if pos + stored > end:
                raise FormatError(
                    f"array property {k} stores {stored} bytes but {end - pos} remain in the record",
                    path=path,
                    item=item,
                )
            if encoding == 0:
                if stored != want:
                    raise FormatError(
                        f"array property {k} claims {n} values ({want} bytes) but stores {stored} bytes",
                        path=path,
                        item=item,
                    )
            elif encoding == 1:
                if want > _ZLIB_MAX_RATIO * stored + 64:
                    raise FormatError(
                        f"array property {k} claims {n} values ({want} bytes) from {stored} compressed bytes; "
                        f"zlib inflates at most {_ZLIB_MAX_RATIO}x",
                        path=path,
                        item=item,
                    )
                try:
                    inflated = len(zlib.decompressobj().decompress(data[pos : pos + stored], want + 1))
                except zlib.error as exc:
                    raise FormatError(
                        f"array property {k} is not valid zlib data ({exc})", path=path, item=item
                    ) from None
                if inflated != want:
                    raise FormatError(
                        f"array property {k} claims {n} values ({want} bytes) but inflates to "
                        f"{inflated if inflated <= want else 'more'} bytes",
                        path=path,
                        item=item,
                    )
            else:
                raise FormatError(
                    f"array property {k} has encoding {encoding}; expected 0 (raw) or 1 (zlib)", path=path, item=item
                )
            pos += stored
        elif code in ("S", "R"):
            if pos + 4 > end:
                raise FormatError(f"string property {k} header runs past the list", path=path, item=item)
            n = struct.unpack_from("<I", data, pos)[0]
            pos += 4 + n
        elif code in _SCALAR_SIZE:
            pos += _SCALAR_SIZE[code]
        else:
            raise FormatError(
                f"property {k} has type code {code!r}; expected one of Y C I F D L S R f d l i b", path=path, item=item
            )
    if pos != end:
        raise FormatError(
            f"the {count} properties take {pos - (end - length)} bytes; the record declares {length}",
            path=path,
            item=item,
        )


class _Scene:
    """The parts of an assimp scene this module uses, copied into Python/numpy (the scene is released)."""

    def __init__(self, path: Path):
        dll, structs, quat_stride, self.assimp_version = _library()
        _check_fbx_file(path)
        store = dll.aiCreatePropertyStore()
        try:
            dll.aiSetImportPropertyInteger(store, b"IMPORT_FBX_PRESERVE_PIVOTS", 0)
            sp = dll.aiImportFileExWithProperties(os.fsencode(path), 0, None, store)
        finally:
            dll.aiReleasePropertyStore(store)
        if not sp:
            err = (dll.aiGetErrorString() or b"").decode("utf-8", errors="replace")
            raise FormatError(f"assimp cannot read it: {err or 'unknown error'}", path=path, item="assimp")
        try:
            s = sp.contents
            self.metadata = _metadata(s.mMetadata, structs)
            self.names: list[str] = []
            self.parents: list[int] = []
            self.matrices: list[np.ndarray] = []
            self.num_meshes: list[int] = []
            stack = [(s.mRootNode, -1)]
            while stack:  # depth first, children in file order
                ptr, parent = stack.pop()
                n = ptr.contents
                idx = len(self.names)
                self.names.append(_string(n.mName))
                self.parents.append(parent)
                mat = _matrix(n.mTransformation)
                if not np.isfinite(mat).all():
                    raise FormatError(
                        f"the transform of node {self.names[-1]!r} holds NaN or inf", path=path, item=self.names[-1]
                    )
                self.matrices.append(mat)
                self.num_meshes.append(int(n.mNumMeshes))
                stack.extend((n.mChildren[i], idx) for i in reversed(range(n.mNumChildren)))
            self.takes = []
            for a in range(s.mNumAnimations):
                an = s.mAnimations[a].contents
                channels = {}
                for c in range(an.mNumChannels):
                    ch = an.mChannels[c].contents
                    node = _string(ch.mNodeName)
                    channels[node] = (
                        _keys(ch.mPositionKeys, ch.mNumPositionKeys, 24, 3, path, node, "position"),
                        _keys(ch.mRotationKeys, ch.mNumRotationKeys, quat_stride, 4, path, node, "rotation"),
                        _keys(ch.mScalingKeys, ch.mNumScalingKeys, 24, 3, path, node, "scaling"),
                    )
                self.takes.append((_string(an.mName), float(an.mDuration), float(an.mTicksPerSecond), channels))
        finally:
            dll.aiReleaseImport(sp)


def fbx_take_names(path) -> list[str]:
    """Names of the animation takes in an FBX file, in file order."""
    return [t[0] for t in _Scene(Path(path)).takes]


def _children(parents) -> list[list[int]]:
    ch = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            ch[p].append(i)
    return ch


def _is_constant(keys) -> bool:
    for _t, v in keys:
        if len(v) > 1 and np.abs(v - v[0]).max() > 1e-6 * max(1.0, float(np.abs(v).max())):
            return False
    return True


def _pick_root(scene: _Scene, channels: dict, root: str | None, path) -> int:
    names = scene.names
    if root is not None:
        if root not in names:
            raise UnknownNameError(f"no node {root!r}; nodes are: {', '.join(names)}", path=path, item="root")
        return names.index(root)
    animated = [i for i, n in enumerate(names) if n in channels]
    if not animated:
        raise FormatError("the take animates no node of the scene", path=path, item="animation")
    chains = []
    for i in animated:
        chain = []
        while i >= 0:
            chain.append(i)
            i = scene.parents[i]
        chains.append(chain[::-1])
    lca = 0
    for depth in range(min(len(c) for c in chains)):
        if len({c[depth] for c in chains}) == 1:
            lca = chains[0][depth]
        else:
            break
    children = _children(scene.parents)
    has_anim = [False] * len(names)
    for i in reversed(range(len(names))):  # parents precede children
        has_anim[i] = has_anim[i] or names[i] in channels
        if scene.parents[i] >= 0 and has_anim[i]:
            has_anim[scene.parents[i]] = True
    r = lca
    while True:
        moving = [c for c in children[r] if has_anim[c]]
        still = names[r] not in channels or _is_constant(channels[names[r]])
        if len(moving) == 1 and still and scene.num_meshes[r] == 0:
            r = moving[0]
        else:
            return r


def _sample_linear(t, v, grid):
    if len(t) == 1:
        return np.repeat(v, len(grid), axis=0)
    i = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(t) - 2)
    span = t[i + 1] - t[i]
    a = np.clip((grid - t[i]) / np.where(span > 0, span, 1.0), 0.0, 1.0)[:, None]
    return v[i] + a * (v[i + 1] - v[i])


def _sample_rotation(t, q, grid):
    q = R.quat_hemisphere_continuity(R.quat_normalize(q), axis=0)
    if len(t) == 1:
        return np.repeat(q, len(grid), axis=0)
    i = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(t) - 2)
    span = t[i + 1] - t[i]
    a = np.clip((grid - t[i]) / np.where(span > 0, span, 1.0), 0.0, 1.0)
    return R.quat_slerp(q[i], q[i + 1], a)


def _rotation_of(lin: np.ndarray) -> np.ndarray:
    """WXYZ rotation of ``[..., 3, 3]`` linear maps ``R @ diag(s)`` (column lengths divided out)."""
    n = np.linalg.norm(lin, axis=-2, keepdims=True)
    return R.quat_normalize(R.quat_from_matrix(lin / np.where(n > 0, n, 1.0)))


def load_fbx(
    path,
    *,
    take: str | int | None = None,
    fps: float | None = None,
    root: str | None = None,
    up_axis: str = "auto",
    scale: float = 1.0,
    units: str = "auto",
    dtype=np.float32,
):
    """Read a skeleton animation from an FBX file into a :class:`~kangengine.animation.SkeletonMotion`.

    Args:
        path: the ``.fbx`` file (any format assimp reads works the same way).
        take: the animation take, by name (e.g. ``"07_01|07_01"``) or index; the first one by default.
        fps: output frame rate; default the file's key rate (ticks per second / smallest key spacing).
        root: name of the skeleton's root node; default chosen as the module docstring says.
        up_axis: ``"auto"`` (the scene's ``UpAxis`` metadata: Y is converted with ``zup_from_yup``, Z kept),
            ``"y"`` or ``"z"`` to override.
        scale: multiplier applied after the file's own unit conversion (``UnitScaleFactor`` cm -> m).
            Example: the CMU FBX files converted by Blender declare one mocap unit as one metre; their true
            unit is 0.0564 m (CMU ``length 0.45``), so ``scale=BVH_LENGTH_UNITS["cmu"]`` gives metres.
        units: ``"auto"`` (default): a mocap-sized skeleton (>= 20 nodes) whose standing height with the
            declared unit (and ``scale``) lies outside :data:`FBX_PLAUSIBLE_HEIGHT_M` is re-read in the unit
            in which a 1.7 m person is nearest, as :func:`~kangengine.io.load_bvh` detects BVH units (the
            height taken as metres: ``< 7.2`` m, ``< 44.9`` CMU units...), and the correction is recorded in
            ``metadata["units_corrected"]``; when no unit makes it plausible the file is refused. The CMU FBX
            files (one CMU unit declared as 1 cm with a x100 node, 25 m tall) become CMU units (1.44 m).
            ``"file"``: keep the declared unit (only a :class:`UnitsWarning` when implausible).
        dtype: float32 (default) or float64 arrays.

    Returns:
        ``SkeletonMotion``: nodes in depth-first file order below ``root``; ``root_translation
        [frames, 3]`` m, ``local_rotation [frames, nodes, 4]`` WXYZ, tree translations from the rest
        (node) transforms, per-frame ``local_translation`` only when some non-root node's keyed
        translation differs from its rest. ``metadata``: ``source_file``, ``source_format="fbx"``,
        ``take``, ``takes``, ``ticks_per_second``, ``key_fps``, ``start_time_s``, ``unit_scale_factor``
        (cm per scene unit), ``scale`` (metres per scene unit applied), ``source_units``, ``up_axis``,
        ``root``, ``folded_ancestors`` (nodes above the root), ``folded_scale`` (scale of the root's world
        matrix per axis), ``skipped_nodes`` (mesh nodes), ``original_names``, ``assimp_version``,
        ``frames_from_keys`` (``fps`` not given), ``height_m`` (standing height after the unit conversion),
        ``units_corrected`` (``None``, or ``{"reason", "unit", "multiplier", "height_declared_m"}``).

    Raises:
        FileMissingError: no such file.
        MissingDependencyError: pyassimp or libassimp missing.
        FormatError: assimp cannot read the file, its headers or array counts claim more than the file holds,
            no animation take, NaN keys or transforms, a take spanning far more frames than it has keys,
            implausible units that no unit corrects.
        UnknownNameError: unknown ``take``/``root``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileMissingError("no such FBX file", path=p)
    if up_axis not in ("auto", "y", "z"):
        raise FormatError(f"up_axis {up_axis!r}; expected 'auto', 'y' or 'z'", item="up_axis")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise FormatError(f"dtype {dtype}; expected float32 or float64", item="dtype")
    if units not in ("auto", "file"):
        raise FormatError(f"units {units!r}; expected 'auto' or 'file'", item="units")
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        scale = float("nan")
    if not (math.isfinite(scale) and scale > 0):
        raise FormatError(f"scale {scale}; expected a multiplier > 0", item="scale")
    scene = _Scene(p)
    if not scene.takes:
        raise FormatError("the file has no animation take; expected a skeleton animation", path=p, item="animation")
    names_all = [t[0] for t in scene.takes]
    if take is None:
        ti = 0
    elif isinstance(take, int) and not isinstance(take, bool):
        if not 0 <= take < len(scene.takes):
            raise UnknownNameError(
                f"take index {take}; the file has {len(scene.takes)} takes: {names_all}", path=p, item="take"
            )
        ti = take
    elif take in names_all:
        ti = names_all.index(take)
    else:
        raise UnknownNameError(f"no take {take!r}; takes are: {', '.join(names_all)}", path=p, item="take")
    take_name, duration, tps, channels = scene.takes[ti]
    if not (math.isfinite(tps) and tps > 0):
        tps = float(scene.metadata.get("CustomFrameRate") or 25.0)  # assimp's default when a file says nothing

    root_idx = _pick_root(scene, channels, root, p)

    # -- time grid ------------------------------------------------------------------------------------
    times = [kt for keys in channels.values() for kt, _ in keys if len(kt)]
    if not times:
        raise FormatError(f"take {take_name!r} has no keys; expected at least one frame", path=p, item="animation")
    t0 = min(float(t[0]) for t in times)
    t1 = max(float(t[-1]) for t in times)
    steps = np.concatenate([np.diff(t) for t in times if len(t) > 1] or [np.zeros(0)])
    steps = steps[steps > 1e-6 * max(1.0, abs(t1))]
    key_dt = float(steps.min()) if steps.size else 1.0
    # Keys sit on a tick grid in practice; snap float jitter (0.9999999974) to it.
    if abs(key_dt - round(key_dt)) < 1e-6 * max(1.0, key_dt) and round(key_dt) > 0:
        key_dt = float(round(key_dt))
    key_fps = tps / key_dt
    out_fps = key_fps if fps is None else float(fps)
    if not (math.isfinite(out_fps) and out_fps > 0):
        raise FormatError(f"fps {fps!r}; expected frames per second > 0", item="fps")
    span_frames = (t1 - t0) / tps * out_fps
    most_keys = max(len(t) for t in times)
    frame_cap = max(16 * most_keys * max(1.0, out_fps / key_fps), 1024)
    if not span_frames < frame_cap:  # also NaN
        raise FormatError(
            f"take {take_name!r} spans {(t1 - t0) / tps:.6g} s from its first to its last key, {span_frames:.6g} "
            f"frames at {out_fps:.6g} fps, but its channels hold at most {most_keys} keys; expected at most "
            f"{frame_cap:.0f} frames "
            "(a corrupted key time or rate; pass a lower fps= to resample a sparse take)",
            path=p,
            item=f"{take_name}.KeyTime",
        )
    n_frames = int(math.floor(span_frames + 1e-6)) + 1
    grid = t0 + np.arange(n_frames, dtype=np.float64) * (tps / out_fps)

    # -- world transforms of the root's ancestors and the skeleton ------------------------------------
    children = _children(scene.parents)
    skeleton, skipped = [], []
    stack = [root_idx]
    has_anim_below = _animated_below(scene, channels)
    while stack:
        i = stack.pop()
        if i != root_idx and scene.num_meshes[i] > 0 and not has_anim_below[i]:
            skipped.append(scene.names[i])
            continue
        skeleton.append(i)
        stack.extend(reversed(children[i]))
    chain = []
    a = scene.parents[root_idx]
    while a >= 0:
        chain.append(a)
        a = scene.parents[a]
    chain = chain[::-1]

    def local(i, animated: bool):
        """(linear [F or 1, 3, 3], translation [F or 1, 3]) of node i."""
        m = scene.matrices[i]
        keys = channels.get(scene.names[i]) if animated else None
        if keys is None:
            return m[None, :3, :3], m[None, :3, 3]
        (pt, pv), (rt, rv), (st, sv) = keys
        tr = _sample_linear(pt, pv, grid) if len(pt) else np.repeat(m[None, :3, 3], n_frames, axis=0)
        if len(rt):
            rot = R.quat_to_matrix(_sample_rotation(rt, rv, grid))
        else:
            rot = np.repeat(_orthonormal(m[:3, :3])[None], n_frames, axis=0)
        sc = (
            _sample_linear(st, sv, grid)
            if len(st)
            else np.repeat(np.linalg.norm(m[:3, :3], axis=0)[None], n_frames, axis=0)
        )
        return rot * sc[:, None, :], tr

    def world(animated: bool):
        lin = {}
        pos = {}
        parent_lin, parent_pos = np.eye(3)[None], np.zeros((1, 3))
        for i in chain:
            li, ti = local(i, animated)
            parent_pos = parent_pos + np.einsum("fij,fj->fi", parent_lin, ti)
            parent_lin = parent_lin @ li
        for i in skeleton:
            li, ti = local(i, animated)
            if i == root_idx:
                pl, pp = parent_lin, parent_pos
            else:
                pl, pp = lin[scene.parents[i]], pos[scene.parents[i]]
            pos[i] = pp + np.einsum("fij,fj->fi", pl, ti)
            lin[i] = pl @ li
        return lin, pos

    rest_lin, rest_pos = world(False)
    anim_lin, anim_pos = world(True)
    folded_scale = np.linalg.norm(rest_lin[root_idx][0], axis=0)

    # -- skeleton arrays ------------------------------------------------------------------------------
    index = {node: k for k, node in enumerate(skeleton)}
    parents = np.array([-1 if i == root_idx else index[scene.parents[i]] for i in skeleton], dtype=np.int64)

    def to_local(lin, pos, nf):
        gq = np.stack([np.broadcast_to(_rotation_of(lin[i]), (nf, 4)) for i in skeleton], axis=1)  # [F, N, 4]
        gp = np.stack([np.broadcast_to(pos[i], (nf, 3)) for i in skeleton], axis=1)  # [F, N, 3]
        pidx = np.where(parents < 0, 0, parents)
        lq = R.quat_multiply(R.quat_conjugate(gq[:, pidx]), gq)
        lt = R.quat_rotate_inverse(gq[:, pidx], gp - gp[:, pidx])
        lq[:, 0] = gq[:, 0]
        lt[:, 0] = gp[:, 0]
        return lq, lt

    rest_q, rest_t = to_local(rest_lin, rest_pos, 1)
    lq, lt = to_local(anim_lin, anim_pos, n_frames)
    lq = R.quat_hemisphere_continuity(R.quat_standardize(lq), axis=0)

    unit_scale_factor = float(scene.metadata.get("UnitScaleFactor", 1.0) or 1.0)
    metres = unit_scale_factor * 0.01 * scale
    up = up_axis
    if up == "auto":
        up_code, sign = int(scene.metadata.get("UpAxis", 1)), int(scene.metadata.get("UpAxisSign", 1))
        if sign != 1 or up_code not in (1, 2):
            raise FormatError(
                f"UpAxis {up_code} with sign {sign}; expected +Y (1) or +Z (2), or pass up_axis='y'/'z'",
                path=p,
                item="UpAxis",
            )
        up = "y" if up_code == 1 else "z"
    vec = axes.vec_zup_from_yup if up == "y" else (lambda v: v)
    quat = axes.quat_zup_from_yup if up == "y" else (lambda q: q)
    height = _standing_height(anim_pos, skeleton, root_idx, up, n_frames) * metres
    multiplier, corrected = _unit_correction(height, len(skeleton), metres, units, p)
    metres *= multiplier
    tree_t = vec(rest_t[0]) * metres
    lq = quat(lq)
    lt = vec(lt) * metres
    _check_result(lq, lt, p)
    moving = np.abs(lt[:, 1:] - tree_t[None, 1:]).max() if len(skeleton) > 1 else 0.0
    size = max(float(np.abs(tree_t[1:]).max()) if len(skeleton) > 1 else 0.0, 1e-9)
    per_frame_t = lt if moving > 1e-5 * size else None

    from ..animation import SkeletonMotion, SkeletonTree

    original = [scene.names[i] for i in skeleton]
    names, used = [], set()
    for nm in original:
        base = nm.replace("/", "_") or "node"
        cand, k = base, 2
        while cand in used:
            cand, k = f"{base}_{k}", k + 1
        used.add(cand)
        names.append(cand)
    tree = SkeletonTree(tuple(names), parents, tree_t)
    meta = {
        "source_file": os.fspath(p),
        "source_format": "fbx",
        "take": take_name,
        "takes": names_all,
        "ticks_per_second": tps,
        "key_fps": key_fps,
        "start_time_s": t0 / tps,
        "unit_scale_factor": unit_scale_factor,
        "scale": metres,
        "source_units": f"{unit_scale_factor:g} cm" if corrected is None else corrected["unit"],
        "height_m": round(height * multiplier, 6),
        "units_corrected": corrected,
        "folded_scale": [float(x) for x in folded_scale],
        "up_axis": up,
        "root": scene.names[root_idx],
        "folded_ancestors": [scene.names[i] for i in chain],
        "skipped_nodes": skipped,
        "original_names": original,
        "assimp_version": ".".join(str(v) for v in scene.assimp_version),
        "frames_from_keys": fps is None,
    }
    motion = SkeletonMotion(
        tree,
        lt[:, 0].astype(dtype),
        lq.astype(dtype),
        out_fps,
        None if per_frame_t is None else per_frame_t.astype(dtype),
        metadata=meta,
    )
    if units == "file":
        _warn_if_implausible(motion, p, unit_scale_factor)
    return motion


def _standing_height(world_pos: dict, skeleton: list[int], root_idx: int, up: str, n_frames: int) -> float:
    """Median over up to 32 frames spread over the take of the extent of the skeleton's nodes (root left
    out, as for BVH) along the up axis, in scene units."""
    rows = np.unique(np.linspace(0, n_frames - 1, min(n_frames, 32)).round().astype(np.int64))
    axis = 1 if up == "y" else 2
    nodes = [i for i in skeleton if i != root_idx] or [root_idx]
    with np.errstate(invalid="ignore", over="ignore"):
        up_pos = np.stack([np.broadcast_to(world_pos[i], (n_frames, 3))[rows, axis] for i in nodes], axis=1)
        return float(np.median(up_pos.max(axis=1) - up_pos.min(axis=1)))


def _unit_correction(height_m: float, num_nodes: int, metres: float, units: str, path) -> tuple[float, dict | None]:
    """(multiplier on the declared metres per scene unit, the recorded correction or None)."""
    lo, hi = FBX_PLAUSIBLE_HEIGHT_M
    if units == "file" or num_nodes < _MOCAP_NODES or lo <= height_m <= hi:
        return 1.0, None
    from .bvh import BVH_LENGTH_UNITS, unit_from_standing_height

    unit = unit_from_standing_height(height_m) if math.isfinite(height_m) else "m"
    multiplier = BVH_LENGTH_UNITS[unit]
    if unit == "m" or not lo <= height_m * multiplier <= hi:
        raise FormatError(
            f"the {num_nodes}-node skeleton stands {height_m:.3g} m tall with the file's declared unit "
            f"({metres:g} m per scene unit) and no length unit makes it {lo:g} to {hi:g} m; pass scale= (metres per "
            "declared metre) or units='file' to keep the declared unit",
            path=path,
            item="UnitScaleFactor",
        )
    reason = (
        f"standing height {height_m:.4g} m with the declared unit is implausible for a {num_nodes}-node mocap "
        f"skeleton; read as {unit} ({multiplier:.6g} m per declared metre): {height_m * multiplier:.4g} m"
    )
    return multiplier, {
        "reason": reason,
        "unit": unit,
        "multiplier": multiplier,
        "height_declared_m": round(height_m, 6),
    }


def _check_result(local_rotation: np.ndarray, local_translation: np.ndarray, path) -> None:
    """What the reader returns is finite with unit quaternions (overflowing keys or transforms are refused)."""
    if not np.isfinite(local_translation).all():
        raise FormatError(
            "node translations overflow to NaN or inf; expected finite positions", path=path, item="translation"
        )
    norm = np.linalg.norm(local_rotation, axis=-1)
    if not (np.isfinite(norm).all() and np.abs(norm - 1.0).max(initial=0.0) < 1e-6):
        raise FormatError(
            "node rotations are not unit quaternions (NaN keys or degenerate transforms)", path=path, item="rotation"
        )


def _warn_if_implausible(motion, path, unit_scale_factor: float) -> None:
    """The file's declared unit is honoured; a mocap-sized skeleton (>= 20 nodes) that comes out
    taller than 3 m or shorter than 0.2 m in the first frame is reported with a :class:`UnitsWarning`."""
    if motion.tree.num_nodes < 20:
        return
    z = np.asarray(motion[0].global_translation)[:, 2]
    height = float(z.max() - z.min())
    if 0.2 <= height <= 3.0:
        return
    warnings.warn(
        f"{os.fspath(path)}: the skeleton is {height:.3g} m tall in its first frame with the file's declared unit "
        f"(UnitScaleFactor {unit_scale_factor:g} cm); if the file's unit is wrong, pass scale= (for CMU mocap "
        f"units: scale=kangengine.io.BVH_LENGTH_UNITS['cmu'])",
        UnitsWarning,
        stacklevel=3,
    )


def _orthonormal(m: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(m, axis=0, keepdims=True)
    return m / np.where(n > 0, n, 1.0)


def _animated_below(scene: _Scene, channels: dict) -> list[bool]:
    out = [scene.names[i] in channels for i in range(len(scene.names))]
    for i in reversed(range(len(scene.names))):
        if out[i] and scene.parents[i] >= 0:
            out[scene.parents[i]] = True
    return out
