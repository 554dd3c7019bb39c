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
import warnings
from pathlib import Path

import numpy as np

from .. import conventions as axes
from .. import rotations as R
from ..errors import FileMissingError, FormatError, MissingDependencyError, UnitsWarning, UnknownNameError

__all__ = ["load_fbx", "fbx_take_names"]

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


class _Scene:
    """The parts of an assimp scene this module uses, copied into Python/numpy (the scene is released)."""

    def __init__(self, path: Path):
        dll, structs, quat_stride, self.assimp_version = _library()
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
                self.matrices.append(_matrix(n.mTransformation))
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
        ``frames_from_keys`` (``fps`` not given).

    Raises:
        FileMissingError, MissingDependencyError (pyassimp or libassimp missing), FormatError (assimp
        cannot read the file, no animation take, NaN keys), UnknownNameError (unknown ``take``/``root``).
    """
    p = Path(path)
    if not p.is_file():
        raise FileMissingError("no such FBX file", path=p)
    if up_axis not in ("auto", "y", "z"):
        raise FormatError(f"up_axis {up_axis!r}; expected 'auto', 'y' or 'z'", item="up_axis")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise FormatError(f"dtype {dtype}; expected float32 or float64", item="dtype")
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
    n_frames = int(math.floor((t1 - t0) / tps * out_fps + 1e-6)) + 1
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
    tree_t = vec(rest_t[0]) * metres
    lq = quat(lq)
    lt = vec(lt) * metres
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
        "source_units": f"{unit_scale_factor:g} cm",
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
    _warn_if_implausible(motion, p, unit_scale_factor)
    return motion


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
