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


def read_library_file(path: str | os.PathLike) -> LibraryFile:
    """Read and check a file written by :func:`write_library_file`.

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
    cols = sample_columns(tree.num_nodes, bool(header.get("has_local_translations")))
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
    return LibraryFile(
        skeleton_tree=tree,
        dtype=dtype,
        has_local_translations=bool(header.get("has_local_translations")),
        interpolation=header.get("interpolation", "nlerp"),
        layout_signature=header.get("layout_signature"),
        adapter=header.get("adapter"),
        backend_fields=header.get("backend_fields"),
        clip_names=[str(x) for x in header["clip_names"]],
        clip_metadata_json=tensors.get("clip_metadata_json"),
        frames_packed=frames,
        kinematics_packed=kin,
        backend_packed=tensors.get("backend_packed"),
        clip_frame_start=tensors["clip_frame_start"],
        clip_frame_count=tensors["clip_frame_count"],
        clip_fps=tensors["clip_fps"],
        clip_weight=tensors["clip_weight"],
        clip_loop_displacement=tensors["clip_loop_displacement"],
    )


def encode_clip_metadata(metadata: list[dict]):
    """``[bytes] uint8`` tensor: the clips' metadata dicts as UTF-8 JSON (values JSON cannot hold as strings)."""
    import torch

    meta_json = json.dumps(metadata, default=str).encode()
    return torch.frombuffer(bytearray(meta_json), dtype=torch.uint8)


def decode_clip_metadata(raw, count: int) -> list[dict]:
    """The ``count`` metadata dicts of :func:`encode_clip_metadata`'s ``raw`` (``None`` or another count of
    dicts: ``count`` empty ones)."""
    items = json.loads(bytes(raw.numpy()).decode()) if raw is not None and raw.numel() else []
    return items if len(items) == count else [{} for _ in range(count)]


def adapter_name(adapter) -> str:
    """``module.QualName`` of ``adapter``'s class: which adapter's frames a file holds."""
    t = type(adapter)
    return f"{t.__module__}.{t.__qualname__}"


def backend_fields_from_header(stored) -> list[tuple[str, tuple[int, ...]]]:
    """``[(name, per-frame shape)]`` from the header's JSON lists ``[[name, [dim, ...]], ...]``."""
    return [(str(n), tuple(int(v) for v in s)) for n, s in stored]
