"""Mass properties of closed triangle meshes (uniform density), for bot links whose inertia comes from geometry.

Reads ``.stl`` (binary or ASCII), ``.obj`` (``v``/``f`` records), ``.off`` and ``.ply`` (ASCII and binary, the
``vertex`` ``x y z`` and ``face`` ``vertex_indices`` elements); polygons are fan-triangulated. The
integrals are exact for the polyhedron: the mesh is split into signed tetrahedra against the origin and the
volume, first moment and second moment ``C = integral of x x^T dV`` summed in closed form (for the tetrahedron
``0, a, b, c``: ``det[a b c] / 120 * (a a^T + b b^T + c c^T + s s^T)``, ``s = a + b + c``), vectorised over the
triangles. A mesh with inward-facing triangles (negative total volume) is integrated with the sign flipped; a mesh
whose volume is zero (flat) or whose triangles are inconsistently wound (a directed edge used twice, which
MuJoCo's compiler refuses too) is refused; open edges are accepted. Other formats (``.mochi.h5``, ``.mochi.json``,
``.glb``, ``.dae``) are refused with :class:`MeshError`: they are not read here.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import rotations as R
from ..errors import FileMissingError, FormatError

__all__ = ["MeshError", "MeshMassProperties", "load_triangle_mesh", "mesh_mass_properties", "MESH_SUFFIXES"]

MESH_SUFFIXES = (".stl", ".obj", ".off", ".ply")


class MeshError(FormatError):
    """A mesh file cannot be read or integrated (unsupported format, malformed, open or flat)."""


@dataclass(frozen=True, eq=False)
class MeshMassProperties:
    """Attributes: volume (m^3), mass (kg), com (``[3] float64`` m), inertia (``[3, 3] float64`` kg m^2 about
    the COM), all in the frame the vertices were given in."""

    volume: float
    mass: float
    com: np.ndarray
    inertia: np.ndarray


def load_triangle_mesh(path: str | os.PathLike) -> np.ndarray:
    """Triangles of a mesh file. Returns ``[triangles, 3, 3] float64`` (vertex coordinates as stored)."""
    path = Path(path)
    if not path.is_file():
        raise FileMissingError("no such mesh file", path=path)
    suffix = path.suffix.lower()
    if suffix not in MESH_SUFFIXES:
        raise MeshError(
            f"mesh format {suffix!r} cannot be integrated here; supported: {', '.join(MESH_SUFFIXES)}", path=path
        )
    data = path.read_bytes()
    try:
        if suffix == ".stl":
            tris = _stl(data)
        elif suffix == ".obj":
            tris = _obj(data.decode("utf-8", "replace"))
        elif suffix == ".ply":
            tris = _ply(data)
        else:
            tris = _off(data.decode("utf-8", "replace"))
    except (ValueError, IndexError, KeyError, struct.error) as exc:
        raise MeshError(f"malformed {suffix} file ({exc})", path=path) from exc
    if tris.shape[0] == 0:
        raise MeshError("has no triangles", path=path)
    if not np.all(np.isfinite(tris)):
        raise MeshError("has non-finite vertex coordinates", path=path)
    return tris


def _stl(data: bytes) -> np.ndarray:
    if len(data) >= 84:
        (n,) = struct.unpack_from("<I", data, 80)
        if 84 + 50 * n == len(data):
            rec = np.dtype([("normal", "<f4", 3), ("v", "<f4", (3, 3)), ("attr", "<u2")])
            return np.frombuffer(data, dtype=rec, count=n, offset=84)["v"].astype(np.float64)
    text = data.decode("ascii", "replace")
    if not text.lstrip().startswith("solid"):
        raise ValueError("neither binary STL (size does not match its triangle count) nor ASCII STL")
    verts = [line.split()[1:4] for line in text.splitlines() if line.strip().startswith("vertex")]
    if len(verts) % 3:
        raise ValueError(f"{len(verts)} vertex lines is not a multiple of 3")
    return np.array(verts, dtype=np.float64).reshape(-1, 3, 3)


def _fan(vertices: np.ndarray, faces: list[list[int]]) -> np.ndarray:
    tris = [(f[0], f[k], f[k + 1]) for f in faces for k in range(1, len(f) - 1)]
    return vertices[np.array(tris, dtype=np.int64).reshape(-1, 3)]


def _obj(text: str) -> np.ndarray:
    verts, faces = [], []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "v":
            verts.append([float(x) for x in parts[1:4]])
        elif parts[0] == "f":
            idx = [int(p.split("/")[0]) for p in parts[1:]]
            faces.append([i - 1 if i > 0 else len(verts) + i for i in idx])
    return _fan(np.array(verts, dtype=np.float64).reshape(-1, 3), faces)


def _off(text: str) -> np.ndarray:
    tokens = [t for line in text.splitlines() for t in line.split("#")[0].split()]
    if not tokens or not tokens[0].endswith("OFF"):
        raise ValueError("no OFF header")
    nv, nf = int(tokens[1]), int(tokens[2])
    pos = 4
    verts = np.array(tokens[pos : pos + 3 * nv], dtype=np.float64).reshape(nv, 3)
    pos += 3 * nv
    faces = []
    for _ in range(nf):
        k = int(tokens[pos])
        faces.append([int(t) for t in tokens[pos + 1 : pos + 1 + k]])
        pos += 1 + k
    return _fan(verts, faces)


def _check_orientation(tris: np.ndarray, path) -> None:
    """Refuse a mesh in which a directed edge occurs twice (two neighbouring triangles wound oppositely), as
    MuJoCo's compiler does: its signed volumes would cancel wrongly. Open edges are accepted."""
    verts, inv = np.unique(tris.reshape(-1, 3), axis=0, return_inverse=True)
    tri = inv.reshape(-1, 3)
    edges = np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]])
    edges = edges[edges[:, 0] != edges[:, 1]]
    keys, counts = np.unique(edges[:, 0] * len(verts) + edges[:, 1], return_counts=True)
    if np.any(counts > 1):
        k = int(keys[np.argmax(counts > 1)])
        a, b = verts[k // len(verts)], verts[k % len(verts)]
        raise MeshError(
            f"faces have inconsistent orientation ({int((counts > 1).sum())} edges are shared by triangles wound "
            f"the same way, e.g. {a.tolist()} -> {b.tolist()}); expected a consistently oriented mesh",
            path=path,
        )


_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2", "ushort": "u2",
    "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4", "float": "f4", "float32": "f4",
    "double": "f8", "float64": "f8",
}  # fmt: skip
_STRUCT = {"i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "f4": "f", "f8": "d"}


def _ply_header(data: bytes):
    end = data.find(b"end_header")
    if not data.startswith(b"ply") or end < 0:
        raise ValueError("no PLY header")
    body = data.index(b"\n", end) + 1
    fmt, elements = None, []
    for line in data[:body].decode("ascii").splitlines():
        p = line.split()
        if p and p[0] == "format":
            fmt = p[1]
        elif p and p[0] == "element":
            elements.append((p[1], int(p[2]), []))
        elif p and p[0] == "property":
            elements[-1][2].append((p[4], (p[2], p[3])) if p[1] == "list" else (p[2], p[1]))
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise ValueError(f"unknown PLY format {fmt!r}")
    return fmt, elements, body


def _ply(data: bytes) -> np.ndarray:
    fmt, elements, pos = _ply_header(data)
    tokens = data[pos:].split() if fmt == "ascii" else None
    pos = 0 if tokens is not None else pos  # a token index for ASCII, a byte offset for binary
    end = "<" if fmt == "binary_little_endian" else ">"
    values: dict[str, object] = {}
    for name, count, props in elements:
        if all(isinstance(t, str) for _n, t in props):  # fixed-size records: one vectorised read
            if tokens is not None:
                rows = np.array(tokens[pos : pos + count * len(props)], dtype=np.float64).reshape(count, len(props))
                pos += count * len(props)
                values[name] = {n: rows[:, k] for k, (n, _t) in enumerate(props)}
            else:
                dt = np.dtype([(n, end + _PLY_TYPES[t]) for n, t in props])
                rec = np.frombuffer(data, dtype=dt, count=count, offset=pos)
                pos += dt.itemsize * count
                values[name] = {n: rec[n].astype(np.float64) for n, _t in props}
        else:
            values[name], pos = _ply_lists(data, tokens, pos, count, props, end)
    v = values["vertex"]
    verts = np.stack([v["x"], v["y"], v["z"]], axis=1)
    faces = values["face"].get("vertex_indices", values["face"].get("vertex_index"))
    return _fan(verts, faces)


def _ply_lists(data, tokens, pos, count, props, end):
    """Records with list properties, read one by one; returns {property: [values per record]}."""
    out: dict[str, list] = {n: [] for n, _t in props}
    for _ in range(count):
        for n, t in props:
            if tokens is not None:
                k = int(tokens[pos]) if not isinstance(t, str) else 1
                start = pos + (0 if isinstance(t, str) else 1)
                item = [int(float(x)) for x in tokens[start : start + k]]
                pos = start + k
            elif isinstance(t, str):
                code = end + _STRUCT[_PLY_TYPES[t]]
                (x,) = struct.unpack_from(code, data, pos)
                item, pos = [x], pos + struct.calcsize(code)
            else:
                code, each = end + _STRUCT[_PLY_TYPES[t[0]]], _STRUCT[_PLY_TYPES[t[1]]]
                (k,) = struct.unpack_from(code, data, pos)
                pos += struct.calcsize(code)
                item = list(struct.unpack_from(f"{end}{k}{each}", data, pos))
                pos += struct.calcsize(f"{end}{k}{each}")
            out[n].append(item)
    return out, pos


def mesh_mass_properties(
    triangles: np.ndarray,
    *,
    density: float | None = None,
    mass: float | None = None,
    scale=(1.0, 1.0, 1.0),
    rotation_wxyz=(1.0, 0.0, 0.0, 0.0),
    translation=(0.0, 0.0, 0.0),
    path=None,
) -> MeshMassProperties:
    """Mass properties of a closed mesh of uniform density, after placing it: ``x = rotate(rotation_wxyz,
    scale * v) + translation``.

    Args:
        triangles: ``[triangles, 3, 3] float64`` vertex coordinates (m after scaling).
        density: kg/m^3 (default 1000 when ``mass`` is not given); mass: kg (the density follows from it).
        path: the mesh file, for error messages.
    """
    _check_orientation(np.asarray(triangles, dtype=np.float64), path)
    v = np.asarray(triangles, dtype=np.float64) * np.asarray(scale, dtype=np.float64)
    v = R.quat_rotate(np.asarray(rotation_wxyz, dtype=np.float64), v) + np.asarray(translation, dtype=np.float64)
    a, b, c = v[:, 0], v[:, 1], v[:, 2]
    det = np.einsum("ij,ij->i", a, np.cross(b, c))
    volume = det.sum() / 6.0
    extent = float(np.ptp(v.reshape(-1, 3), axis=0).max())
    if not abs(volume) > 1e-9 * extent**3:
        raise MeshError(f"encloses no volume ({volume:.3g} m^3); expected a closed triangle mesh", path=path)
    sign = 1.0 if volume > 0 else -1.0
    volume, det = abs(volume), det * sign
    s = a + b + c
    first = (det[:, None] * s).sum(axis=0) / 24.0
    second = np.einsum("i,ij,ik->jk", det, a, a) + np.einsum("i,ij,ik->jk", det, b, b)
    second = (second + np.einsum("i,ij,ik->jk", det, c, c) + np.einsum("i,ij,ik->jk", det, s, s)) / 120.0
    rho = (mass / volume) if mass is not None else (1000.0 if density is None else density)
    m = rho * volume
    com = first / volume
    cov = rho * second - m * np.outer(com, com)
    inertia = np.trace(cov) * np.eye(3) - cov
    return MeshMassProperties(volume=float(volume), mass=float(m), com=com, inertia=0.5 * (inertia + inertia.T))
