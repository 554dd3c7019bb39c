"""Library files: one ``.safetensors`` file (no pickle) per :class:`~kangengine.animation.library.MotionLibrary`.

Tensors: ``frames_packed``, optional ``kinematics_packed`` and ``backend_packed``, ``clip_frame_start``,
``clip_frame_count``, ``clip_fps``, ``clip_weight``, ``clip_loop_displacement``, ``skeleton_parent_indices``,
``skeleton_local_translation`` and ``clip_metadata_json`` (the clips' metadata, UTF-8 JSON bytes). Metadata:
``format`` (:data:`LIBRARY_FORMAT`), ``format_version`` (:data:`LIBRARY_FORMAT_VERSION`) and ``header`` (JSON:
dtype, node names, whether rows hold local translations and kinematics, interpolation, layout signature, clip
names, adapter and its field shapes).

:func:`write_library_file` and :func:`read_library_file` move a :class:`LibraryFile` to and from disk; what the
library makes of it (device, adapter frames, layout checks) is :meth:`MotionLibrary.load`'s business.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._files import atomic_write
from ...errors import FileMissingError, FormatError, KangEngineError
from ..skeleton import SkeletonTree
from .columns import sample_columns

__all__ = [
    "LIBRARY_FORMAT",
    "LIBRARY_FORMAT_VERSION",
    "LIBRARY_QUAT_TOLERANCE",
    "LibraryFile",
    "write_library_file",
    "read_library_file",
    "encode_clip_metadata",
    "decode_clip_metadata",
    "adapter_name",
    "backend_fields_from_header",
]

LIBRARY_FORMAT = "kangengine.motion_library"
LIBRARY_FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class LibraryFile:
    """The content of a library file. Tensors are on any device for :func:`write_library_file`; from
    :func:`read_library_file` they are on the CPU, views of the file's pages (``safe_open``).

    Attributes:
        skeleton_tree: the one skeleton of every clip.
        dtype: ``torch.float32`` or ``torch.float64``, the dtype of every per-frame float tensor.
        has_local_translations: the frame rows hold per-frame local translations.
        interpolation: ``"nlerp"`` or ``"slerp"``.
        layout_signature: the coordinate layout's ``model_signature`` the clips were made for, or ``None``.
        adapter: ``module.QualName`` of the adapter whose frames ``backend_packed`` holds (:func:`adapter_name`),
            or ``None``.
        backend_fields: ``[(name, per-frame shape)]`` of the adapter's arrays (as read: JSON lists; see
            :func:`backend_fields_from_header`), or ``None``.
        clip_names: ``[C]`` names.
        clip_metadata_json: ``[bytes] uint8`` the clips' metadata dicts as a UTF-8 JSON list
            (:func:`encode_clip_metadata`), or ``None`` (a file without them).
        frames_packed: ``[F, D]`` frame rows (column order: :mod:`kangengine.animation.library`).
        kinematics_packed: ``[F, 13 B]`` or ``None``.
        backend_packed: ``[F, Db]`` or ``None``.
        clip_frame_start, clip_frame_count: ``[C] int64``.
        clip_fps, clip_weight: ``[C] float64`` 1/s, unnormalised sampling weight.
        clip_loop_displacement: ``[C, 3] float64`` m.
    """

    skeleton_tree: SkeletonTree
    dtype: Any
    has_local_translations: bool
    interpolation: str
    layout_signature: str | None
    adapter: str | None
    backend_fields: list | None
    clip_names: list[str]
    clip_metadata_json: Any
    frames_packed: Any
    kinematics_packed: Any
    backend_packed: Any
    clip_frame_start: Any
    clip_frame_count: Any
    clip_fps: Any
    clip_weight: Any
    clip_loop_displacement: Any


def write_library_file(path: str | os.PathLike, file: LibraryFile) -> Path:
    """Write ``file`` to ``path`` atomically (temp file + rename); returns the path written. The file's bytes
    are built in memory first (the library's buffers once more)."""
    import torch
    from safetensors.torch import save

    cpu = lambda x: x.detach().to("cpu").contiguous()
    tree = file.skeleton_tree
    tensors = {
        "frames_packed": cpu(file.frames_packed),
        "clip_frame_start": cpu(file.clip_frame_start),
        "clip_frame_count": cpu(file.clip_frame_count),
        "clip_fps": cpu(file.clip_fps),
        "clip_weight": cpu(file.clip_weight),
        "clip_loop_displacement": cpu(file.clip_loop_displacement),
        "skeleton_parent_indices": torch.tensor(tree.parent_indices.tolist(), dtype=torch.int64),
        "skeleton_local_translation": torch.from_numpy(tree.local_translation.copy()),
    }
    if file.clip_metadata_json is not None:
        tensors["clip_metadata_json"] = file.clip_metadata_json
    if file.kinematics_packed is not None:
        tensors["kinematics_packed"] = cpu(file.kinematics_packed)
    if file.backend_packed is not None:
        tensors["backend_packed"] = cpu(file.backend_packed)
    header = {
        "dtype": str(file.dtype).replace("torch.", ""),
        "node_names": list(tree.node_names),
        "has_local_translations": file.has_local_translations,
        "precompute_kinematics": file.kinematics_packed is not None,
        "interpolation": file.interpolation,
        "layout_signature": file.layout_signature,
        "clip_names": file.clip_names,
        "adapter": file.adapter,
        "backend_fields": None if file.backend_fields is None else [[n, list(s)] for n, s in file.backend_fields],
    }
    meta = {
        "format": LIBRARY_FORMAT,
        "format_version": str(LIBRARY_FORMAT_VERSION),
        "header": json.dumps(header, default=str),
    }
    data = save(tensors, metadata=meta)
    return atomic_write(path, lambda f: f.write(data), suffix=".safetensors")


_REQUIRED = (
    "frames_packed",
    "clip_frame_start",
    "clip_frame_count",
    "clip_fps",
    "clip_weight",
    "clip_loop_displacement",
    "skeleton_parent_indices",
    "skeleton_local_translation",
)
_INTERPOLATIONS = ("nlerp", "slerp")


def _read_safetensors(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # SafetensorError, OSError, ValueError, TypeError from a corrupt header
        raise FormatError(f"not a readable safetensors file ({type(exc).__name__}: {exc})", path=path) from exc
    return meta, tensors


def _read_header(meta: dict, path: Path) -> dict:
    if meta.get("format") != LIBRARY_FORMAT:
        raise FormatError(f"format is {str(meta.get('format'))[:80]!r}; expected {LIBRARY_FORMAT!r}", path=path)
    try:
        version = int(meta.get("format_version", "0"))
    except (TypeError, ValueError):
        raise FormatError(
            f"format_version is {str(meta.get('format_version'))[:40]!r}; expected an integer", path=path
        ) from None
    if version > LIBRARY_FORMAT_VERSION:
        raise FormatError(
            f"format_version {version} is newer than this KangEngine reads ({LIBRARY_FORMAT_VERSION})", path=path
        )
    try:
        header = json.loads(meta.get("header", ""))
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"header is not JSON ({exc})", path=path, item="header") from None
    if not isinstance(header, dict):
        raise FormatError(f"header holds {type(header).__name__}; expected a JSON object", path=path, item="header")
    checks = (
        ("node_names", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of names"),
        ("clip_names", lambda v: isinstance(v, list) and v and all(isinstance(x, str) for x in v), "clip names"),
        ("dtype", lambda v: v in ("float32", "float64"), "'float32' or 'float64'"),
        ("has_local_translations", lambda v: isinstance(v, bool), "true or false"),
        ("interpolation", lambda v: v in _INTERPOLATIONS, f"one of {_INTERPOLATIONS}"),
        ("layout_signature", lambda v: v is None or isinstance(v, str), "a string or null"),
        ("adapter", lambda v: v is None or isinstance(v, str), "a string or null"),
        ("backend_fields", _valid_fields, "null or [[name, [dim, ...]], ...]"),
    )
    header.setdefault("interpolation", "nlerp")
    header.setdefault("has_local_translations", False)
    for key, ok, expected in checks:
        value = header.get(key)
        if not ok(value):
            raise FormatError(f"header {key} is {str(value)[:80]!r}; expected {expected}", path=path, item=key)
    return header


def _valid_fields(v) -> bool:
    if v is None:
        return True
    return isinstance(v, list) and all(
        isinstance(f, list)
        and len(f) == 2
        and isinstance(f[0], str)
        and isinstance(f[1], list)
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 20 for d in f[1])
        for f in v
    )


def _table(tensors: dict, key: str, path: Path, *, kind: str, shape: tuple) -> Any:
    """``tensors[key]`` with a dtype of ``kind`` (``"i"`` integer, ``"f"`` float, ``"u8"`` bytes) and ``shape``
    (``None`` entries: any size)."""
    import torch

    t = tensors[key]
    ok = {
        "i": not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool,
        "f": t.dtype in (torch.float32, torch.float64),
        "u8": t.dtype == torch.uint8,
    }[kind]
    want = "integers" if kind == "i" else ("float32 or float64" if kind == "f" else "uint8 bytes")
    if not ok:
        raise FormatError(f"dtype {t.dtype}; expected {want}", path=path, item=key)
    if t.ndim != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        dims = ", ".join("*" if s is None else str(s) for s in shape)
        raise FormatError(f"shape {tuple(t.shape)}; expected [{dims}]", path=path, item=key)
    return t


def _check_tables(header: dict, tensors: dict, tree: SkeletonTree, path: Path) -> None:
    """Every table against the others: the clip tables describe ``frames_packed`` exactly."""
    import numpy as np
    import torch

    n_clips = len(header["clip_names"])
    dtype = getattr(torch, header["dtype"])
    cols = sample_columns(tree.num_nodes, header["has_local_translations"])
    frames = _table(tensors, "frames_packed", path, kind="f", shape=(None, cols.width))
    if frames.dtype != dtype:
        raise FormatError(f"dtype {frames.dtype}; the header says {header['dtype']}", path=path, item="frames_packed")
    rows = frames.shape[0]
    count = _table(tensors, "clip_frame_count", path, kind="i", shape=(n_clips,)).numpy().astype(np.int64)
    start = _table(tensors, "clip_frame_start", path, kind="i", shape=(n_clips,)).numpy().astype(np.int64)
    fps = _table(tensors, "clip_fps", path, kind="f", shape=(n_clips,)).numpy()
    weight = _table(tensors, "clip_weight", path, kind="f", shape=(n_clips,)).numpy()
    disp = _table(tensors, "clip_loop_displacement", path, kind="f", shape=(n_clips, 3)).numpy()

    def fail(key, what, bad):
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(f"{what} (clip {i} {header['clip_names'][i][:60]!r})", path=path, item=key)

    if (count < 1).any():
        fail("clip_frame_count", f"counts {count[:8].tolist()}...; expected every clip >= 1 frame", count < 1)
    if int(count.sum()) != rows:
        raise FormatError(
            f"counts sum to {int(count.sum())}; frames_packed has {rows} rows", path=path, item="clip_frame_count"
        )
    expected = np.concatenate([[0], np.cumsum(count)[:-1]])
    if (start != expected).any():
        fail("clip_frame_start", "starts differ from the cumulative frame counts", start != expected)
    if not (np.isfinite(fps) & (fps > 0)).all():
        fail("clip_fps", "expected finite frames per second > 0", ~(np.isfinite(fps) & (fps > 0)))
    if not (np.isfinite(weight) & (weight >= 0)).all():
        fail("clip_weight", "expected finite weights >= 0", ~(np.isfinite(weight) & (weight >= 0)))
    if not weight.sum() > 0:
        raise FormatError("all sampling weights are zero; expected a positive sum", path=path, item="clip_weight")
    if not np.isfinite(disp).all():
        fail("clip_loop_displacement", "holds NaN or inf", ~np.isfinite(disp).all(axis=1))
    if "kinematics_packed" in tensors:
        kin = _table(tensors, "kinematics_packed", path, kind="f", shape=(rows, 13 * tree.num_nodes))
        if kin.dtype != dtype:
            raise FormatError(f"dtype {kin.dtype}; the header says {dtype}", path=path, item="kinematics_packed")
    if "clip_metadata_json" in tensors:
        _table(tensors, "clip_metadata_json", path, kind="u8", shape=(None,))
    fields = header.get("backend_fields")
    if (fields is None) != ("backend_packed" not in tensors):
        raise FormatError("backend_packed and the header's backend_fields come together", path=path)
    if fields is not None:
        width = sum(int(np.prod(s)) if s else 1 for _, s in fields)
        _table(tensors, "backend_packed", path, kind="f", shape=(rows, width))


#: Largest ``|norm - 1|`` of a stored rotation a library file may hold. :meth:`MotionLibrary.save` writes unit
#: quaternions (float32 rounding: ~1e-7); the mapped frames are sampled as they are, never renormalised on load.
LIBRARY_QUAT_TOLERANCE = 1e-5


def _check_unit(quats, path: Path, key: str) -> None:
    import torch

    dev = (torch.linalg.vector_norm(quats.double(), dim=-1) - 1).abs()
    if dev.numel() and float(dev.max()) > LIBRARY_QUAT_TOLERANCE:
        row = int(torch.nonzero(dev > LIBRARY_QUAT_TOLERANCE)[0, 0])
        raise FormatError(
            f"row {row} holds a rotation of norm {1 + float(dev[row].max()):.6g}; expected unit quaternions "
            f"(|norm - 1| <= {LIBRARY_QUAT_TOLERANCE})",
            path=path,
            item=key,
        )


def _check_values(file: LibraryFile, path: Path) -> None:
    """The frame data itself: finite, unit root, local and kinematics rotations (O(frames); ``skip_checks``
    skips it)."""
    import torch

    for key, t in (("frames_packed", file.frames_packed), ("kinematics_packed", file.kinematics_packed)):
        if t is not None and not bool(torch.isfinite(t).all()):
            row = int(torch.nonzero(~torch.isfinite(t).all(dim=1))[0, 0])
            raise FormatError(f"holds NaN or inf (row {row})", path=path, item=key)
    b = file.skeleton_tree.num_nodes
    cols = sample_columns(b, file.has_local_translations)
    _check_unit(file.frames_packed[:, cols.rot].unflatten(1, (b, 4)), path, "frames_packed")
    if file.kinematics_packed is not None:
        _check_unit(file.kinematics_packed[:, 3 * b : 7 * b].unflatten(1, (b, 4)), path, "kinematics_packed")
    decode_clip_metadata(file.clip_metadata_json, len(file.clip_names), path=path)


def read_library_file(path: str | os.PathLike, *, skip_checks: bool = False) -> LibraryFile:
    """Read and check a file written by :func:`write_library_file`.

    Always checked (cheap, per clip): the header (a JSON object with names, dtype, interpolation, adapter
    fields of the right types), every tensor's dtype and shape against the header and each other, and the
    clip tables: ``clip_frame_count >= 1`` summing to the rows of ``frames_packed``, ``clip_frame_start`` equal
    to the cumulative counts, ``clip_fps`` finite > 0, ``clip_weight`` finite >= 0 with a positive sum,
    finite loop displacements. Unless ``skip_checks``: the frame data too (finite values, unit quaternions to
    :data:`LIBRARY_QUAT_TOLERANCE`, clip metadata that decodes), which reads every page.

    Raises:
        FileMissingError, FormatError: no such file, not a library file, or inconsistent content (naming the
            file and the table).
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileMissingError("no such motion library file", path=path)
    meta, tensors = _read_safetensors(path)
    header = _read_header(meta, path)
    missing = [k for k in _REQUIRED if k not in tensors]
    if missing:
        raise FormatError(f"missing tensors {missing}", path=path)
    parents = _table(tensors, "skeleton_parent_indices", path, kind="i", shape=(len(header["node_names"]),))
    offsets = _table(tensors, "skeleton_local_translation", path, kind="f", shape=(len(header["node_names"]), 3))
    try:
        tree = SkeletonTree(tuple(header["node_names"]), parents.numpy(), offsets.numpy())
    except KangEngineError as exc:
        raise FormatError(f"bad skeleton ({exc})", path=path, item="skeleton") from exc
    _check_tables(header, tensors, tree, path)
    file = LibraryFile(
        skeleton_tree=tree,
        dtype=getattr(torch, header["dtype"]),
        has_local_translations=header["has_local_translations"],
        interpolation=header["interpolation"],
        layout_signature=header.get("layout_signature"),
        adapter=header.get("adapter"),
        backend_fields=header.get("backend_fields"),
        clip_names=list(header["clip_names"]),
        clip_metadata_json=tensors.get("clip_metadata_json"),
        frames_packed=tensors["frames_packed"],
        kinematics_packed=tensors.get("kinematics_packed"),
        backend_packed=tensors.get("backend_packed"),
        clip_frame_start=tensors["clip_frame_start"].to(torch.int64),
        clip_frame_count=tensors["clip_frame_count"].to(torch.int64),
        clip_fps=tensors["clip_fps"].double(),
        clip_weight=tensors["clip_weight"].double(),
        clip_loop_displacement=tensors["clip_loop_displacement"].double(),
    )
    if not skip_checks:
        _check_values(file, path)
    return file


def encode_clip_metadata(metadata: list[dict]):
    """``[bytes] uint8`` tensor: the clips' metadata dicts as UTF-8 JSON (values JSON cannot hold as strings)."""
    import torch

    meta_json = json.dumps(metadata, default=str).encode()
    return torch.frombuffer(bytearray(meta_json), dtype=torch.uint8)


def decode_clip_metadata(raw, count: int, *, path=None) -> list[dict]:
    """The ``count`` metadata dicts of :func:`encode_clip_metadata`'s ``raw`` (``None`` or another count of
    dicts: ``count`` empty ones).

    Raises:
        FormatError: ``raw`` is not UTF-8 JSON, or not a list of objects (naming ``path`` and the tensor).
    """
    if raw is None or not raw.numel():
        return [{} for _ in range(count)]
    try:
        items = json.loads(bytes(raw.numpy()).decode())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FormatError(f"not UTF-8 JSON ({exc})", path=path, item="clip_metadata_json") from None
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise FormatError("expected a JSON list of objects", path=path, item="clip_metadata_json")
    return items if len(items) == count else [{} for _ in range(count)]


def adapter_name(adapter) -> str:
    """``module.QualName`` of ``adapter``'s class: which adapter's frames a file holds."""
    t = type(adapter)
    return f"{t.__module__}.{t.__qualname__}"


def backend_fields_from_header(stored) -> list[tuple[str, tuple[int, ...]]]:
    """``[(name, per-frame shape)]`` from the header's JSON lists ``[[name, [dim, ...]], ...]``."""
    return [(str(n), tuple(int(v) for v in s)) for n, s in stored]
