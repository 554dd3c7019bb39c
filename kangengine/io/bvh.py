"""BVH (Biovision hierarchy) motion files: read into a :class:`~kangengine.animation.SkeletonMotion`, write back.

Reading (:func:`load_bvh`)
    * The hierarchy is parsed token by token (any whitespace, tabs, CRLF / CR / LF / mixed line endings,
      blank lines, names with colons or spaces); the usual one-statement-per-line layout takes a line-based
      fast path that gives the same nodes (anything else goes to the token parser, which also reports errors).
      The motion block is parsed in one native pass (:mod:`kangengine.io._decimal`: plain decimals, correctly
      rounded, every row checked for its column count); other number forms (``nan``, over 15 digits) or a
      machine without llvmlite use one ``numpy.loadtxt`` call, which also says what is wrong and where. Euler
      angles are turned into quaternions with a few vectorised operations per rotation order.
    * Channel semantics (the common reading, the same as ``bvhio`` and Blender): a joint's local transform
      is ``T * R``. ``T`` is the joint's ``OFFSET``, with each ``Xposition``/``Yposition``/``Zposition``
      channel *replacing* that component for the frame. ``R`` is the product of the rotation channels in
      the order they are listed: ``Zrotation Xrotation Yrotation`` is ``R = Rz(z) @ Rx(x) @ Ry(y)``
      (intrinsic ZXY, column vectors). Angles are degrees. Each joint may have its own order.
    * Position channels are kept: the root's give ``root_translation``; those of other joints go into the
      motion's per-frame ``local_translation`` (``None`` when only the root translates).
    * ``End Site`` blocks become leaf nodes named ``<parent>_end`` (``<parent>_end2``... if taken) with
      identity rotation; a leaf ``JOINT`` without ``End Site`` stays a plain node.
    * Axes: the result is Z up, X forward (see :mod:`kangengine.conventions`); a Y-up file is re-expressed
      with ``zup_from_yup`` (every offset, translation and local rotation, so joint frames at zero rotation
      stay aligned with the world axes).
    * Units: metres. See :func:`load_bvh` for the unit detection.

Writing (:func:`save_bvh`) is atomic and round-trips through :func:`load_bvh`.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import re
import stat
import warnings
from pathlib import Path

import numpy as np

from .. import conventions as axes
from .. import rotations as R
from .._files import atomic_write
from ..errors import BVHFrameCountWarning, FileMissingError, FormatError, ShapeError
from ._decimal import parse_rows as parse_decimal_rows
from ._decimal import pose_extents

__all__ = [
    "load_bvh",
    "save_bvh",
    "BVH_LENGTH_UNITS",
    "BVHFrameCountWarning",
    "FRAME_TIME_RANGE_S",
    "MAX_BVH_NODES",
    "unit_from_standing_height",
]

#: Metres per unit for the unit names ``load_bvh(scale=...)`` and ``save_bvh(units=...)`` accept.
#: ``"cmu"`` is the CMU mocap unit (ASF ``length 0.45``: 1 unit = 1/0.45 inch = 0.05644 m).
BVH_LENGTH_UNITS = {"m": 1.0, "cm": 0.01, "mm": 0.001, "in": 0.0254, "cmu": 0.0254 / 0.45}

# Unit detection: standing height in file units -> unit (upper bounds, geometric means between the
# heights of a 1.7 m person in neighbouring units).
_HEIGHT_UNIT_BOUNDS = ((7.2, "m"), (44.9, "cmu"), (106.7, "in"), (537.0, "cm"), (math.inf, "mm"))
_AXIS = {"X": 0, "Y": 1, "Z": 2}
_POS_CHANNELS = {"xposition": 0, "yposition": 1, "zposition": 2}
_ROT_CHANNELS = {"xrotation": "X", "yrotation": "Y", "zrotation": "Z"}
_CHANNEL_NAME = {
    "xposition": "Xposition",
    "yposition": "Yposition",
    "zposition": "Zposition",
    "xrotation": "Xrotation",
    "yrotation": "Yrotation",
    "zrotation": "Zrotation",
}
_UP_AXES = ("auto", "y", "z")
#: Accepted ``Frame Time`` (seconds per frame): 100 kHz to one frame an hour.
FRAME_TIME_RANGE_S = (1e-5, 3600.0)
#: Most nodes (joints and End Sites) a BVH file may declare; the largest real rigs (full fingers, face,
#: twist bones) hold a few hundred.
MAX_BVH_NODES = 4096


# ------------------------------------------------------------------------------------------------------
# hierarchy
# ------------------------------------------------------------------------------------------------------


class _Node:
    __slots__ = (
        "name",
        "parent",
        "offset",
        "channels",
        "line",
        "end_site",
        "has_channels",
        "channels_line",
        "offset_line",
    )

    def __init__(self, name, parent, line, end_site=False):
        self.name = name
        self.parent = parent
        self.offset = None
        self.channels: list[str] = []
        self.line = line
        self.end_site = end_site
        self.has_channels = False
        self.channels_line = 0
        self.offset_line = line


class _Tokens:
    """Whitespace tokens of the hierarchy with their 1-based line numbers."""

    def __init__(self, text: str, path):
        self.path = path
        toks, lines = [], []
        for ln, line in enumerate(text.split("\n"), start=1):
            for t in line.replace("{", " { ").replace("}", " } ").split():
                toks.append(t)
                lines.append(ln)
        self.toks = toks
        self.lines = lines
        self.i = 0
        self.last_line = max(1, text.count("\n") + 1)

    def error(self, msg, line=None):
        line = self.lines[min(self.i, len(self.lines) - 1)] if line is None and self.lines else line
        return FormatError(msg, path=self.path, item=f"line {line or self.last_line}")

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def line(self):
        return self.lines[self.i] if self.i < len(self.lines) else self.last_line

    def next(self, expected: str):
        if self.i >= len(self.toks):
            raise FormatError(
                f"unexpected end of file; expected {expected}", path=self.path, item=f"line {self.last_line}"
            )
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, word: str):
        ln = self.line()
        t = self.next(repr(word))
        if t != word:
            raise FormatError(f"found {t!r}; expected {word!r}", path=self.path, item=f"line {ln}")

    def name_until_brace(self, what: str) -> str:
        ln = self.line()
        parts = []
        while self.peek() is not None and self.peek() != "{":
            if self.line() != ln:
                break
            parts.append(self.next("a name"))
        if not parts and what != "End Site":
            raise FormatError(f"{what} has no name; expected '{what} <name>'", path=self.path, item=f"line {ln}")
        return " ".join(parts)

    def number(self, what: str) -> float:
        ln = self.line()
        t = self.next(what)
        try:
            v = float(t)
        except ValueError:
            raise FormatError(f"{what} value {t!r} is not a number", path=self.path, item=f"line {ln}") from None
        if not math.isfinite(v):
            raise FormatError(f"{what} value {t!r} is not finite", path=self.path, item=f"line {ln}")
        return v


def _parse_offset(tk: _Tokens, node: _Node):
    if node.offset is not None:
        raise tk.error(f"a second OFFSET line for {_what(node)}; expected one OFFSET per block")
    node.offset_line = tk.line()
    tk.next("OFFSET")
    node.offset = [tk.number("OFFSET") for _ in range(3)]


def _parse_joint_head(tk: _Tokens, node: _Node, what: str):
    """After '{': OFFSET and CHANNELS lines (either order, CHANNELS optional)."""
    while tk.peek() is not None and tk.peek().upper() in ("OFFSET", "CHANNELS"):
        if tk.peek().upper() == "OFFSET":
            _parse_offset(tk, node)
        else:
            _parse_channels(tk, node)
    if node.offset is None:
        t = tk.peek()
        raise tk.error(
            f"the block of {what} has no OFFSET; found {t!r}"
            if t is not None
            else f"unexpected end of file in the block of {what}; expected 'OFFSET x y z'",
            None if t is not None else tk.last_line,
        )


def _what(node: _Node) -> str:
    return "an End Site" if node.end_site else f"joint {node.name!r}"


def _parse_channels(tk: _Tokens, node: _Node):
    ln = tk.line()
    if node.has_channels:
        raise FormatError(
            f"a second CHANNELS line for {_what(node)} (the first is on line {node.channels_line}); expected one "
            "CHANNELS line per joint",
            path=tk.path,
            item=f"line {ln}",
        )
    node.has_channels, node.channels_line = True, ln
    tk.next("CHANNELS")
    n_tok = tk.next("a channel count")
    try:
        n = int(n_tok)
    except ValueError:
        raise FormatError(
            f"channel count {n_tok!r} of joint {node.name!r} is not an integer", path=tk.path, item=f"line {ln}"
        ) from None
    if not 0 <= n <= 6:
        raise FormatError(
            f"joint {node.name!r} declares {n} channels; expected 0 to 6", path=tk.path, item=f"line {ln}"
        )
    chans = []
    for _ in range(n):
        cl = tk.line()
        c = tk.next(f"{n} channel names")
        key = c.lower()
        if key not in _CHANNEL_NAME:
            if cl != ln or c in ("JOINT", "End", "}", "{"):
                raise FormatError(
                    f"joint {node.name!r} declares {n} channels but lists {len(chans)}", path=tk.path, item=f"line {ln}"
                )
            raise FormatError(
                f"unknown channel {c!r} of joint {node.name!r}; expected Xposition, Yposition, "
                "Zposition, Xrotation, Yrotation or Zrotation",
                path=tk.path,
                item=f"line {ln}",
            )
        chans.append(key)
    rot = "".join(_ROT_CHANNELS[c] for c in chans if c in _ROT_CHANNELS)
    if len(set(rot)) != len(rot):
        raise FormatError(
            f"unknown rotation order {rot!r} of joint {node.name!r} (an axis repeats); expected distinct axes "
            "such as ZXY or ZYX",
            path=tk.path,
            item=f"line {ln}",
        )
    if len(set(chans)) != len(chans):
        raise FormatError(
            f"joint {node.name!r} lists a channel twice ({' '.join(_CHANNEL_NAME[c] for c in chans)})",
            path=tk.path,
            item=f"line {ln}",
        )
    if tk.peek() is not None and tk.line() == ln and tk.peek().lower() in _CHANNEL_NAME:
        raise FormatError(f"joint {node.name!r} declares {n} channels but lists more", path=tk.path, item=f"line {ln}")
    node.channels = chans


def _parse_hierarchy(text: str, path) -> list[_Node]:
    tk = _Tokens(text, path)
    tk.expect("HIERARCHY")
    ln = tk.line()
    t = tk.next("'ROOT <name>'")
    if t != "ROOT":
        raise FormatError(f"found {t!r}; expected 'ROOT <name>' after HIERARCHY", path=path, item=f"line {ln}")
    nodes: list[_Node] = []
    # iterative descent: stack of the indices of the open joints
    root = _Node(tk.name_until_brace("ROOT"), -1, ln)
    stack = [0]
    nodes.append(root)
    tk.expect("{")
    _parse_joint_head(tk, root, f"ROOT {root.name!r}")
    while stack:
        ln = tk.line()
        t = tk.next("'JOINT', 'End Site' or '}'")
        parent_index = stack[-1]
        parent = nodes[parent_index]
        if t == "}":
            stack.pop()
            continue
        if len(nodes) >= MAX_BVH_NODES:
            raise FormatError(
                f"more than {MAX_BVH_NODES} nodes (joints and End Sites); expected at most {MAX_BVH_NODES}",
                path=path,
                item=f"line {ln}",
            )
        if t == "JOINT":
            node = _Node(tk.name_until_brace("JOINT"), parent_index, ln)
            tk.expect("{")
            _parse_joint_head(tk, node, f"JOINT {node.name!r}")
            stack.append(len(nodes))
            nodes.append(node)
            continue
        if t == "End":
            tk.name_until_brace("End Site")
            tk.expect("{")
            node = _Node(None, parent_index, ln, end_site=True)
            _parse_joint_head(tk, node, f"the End Site of {parent.name!r}")
            if node.channels:
                raise FormatError(
                    f"the End Site of {parent.name!r} has channels; expected only OFFSET", path=path, item=f"line {ln}"
                )
            tk.expect("}")
            nodes.append(node)
            continue
        if t == "ROOT":
            raise FormatError("a second ROOT; expected one skeleton per file", path=path, item=f"line {ln}")
        raise FormatError(
            f"found {t!r} in the block of joint {parent.name!r}; expected 'JOINT', 'End Site' or '}}'",
            path=path,
            item=f"line {ln}",
        )
    ln = tk.line()
    t = tk.peek()
    if t is not None:
        raise FormatError(f"found {t!r} after the hierarchy; expected 'MOTION'", path=path, item=f"line {ln}")
    return nodes


def _parse_hierarchy_fast(text: str) -> list[_Node] | None:
    """The nodes of a hierarchy in the usual one-statement-per-line layout, or ``None`` for anything else.

    Accepts a subset of what :func:`_parse_hierarchy` accepts (each keyword's arguments on its own line, braces
    alone on their lines) and gives the same nodes, line numbers included; a file outside that subset, or with
    any error, returns ``None`` and the token parser reads it (and says what is wrong and where)."""
    nodes: list[_Node] = []
    stack: list[int] = []  # indices of the open blocks
    pending = head = None  # the node whose '{' comes next; the node whose OFFSET/CHANNELS may come
    started = False
    for ln, line in enumerate(text.split("\n"), start=1):
        toks = line.split()
        if not toks:
            continue
        if len(toks) > 1 and ("{" in line or "}" in line):
            return None
        t0 = toks[0]
        if not started:
            if toks != ["HIERARCHY"]:
                return None
            started = True
            continue
        if pending is not None:
            if t0 != "{":
                return None
            stack.append(len(nodes))
            nodes.append(pending)
            head, pending = pending, None
            continue
        if head is not None:
            took = _fast_head_line(head, toks, ln)
            if took:
                continue
            if took is False or head.offset is None:
                return None
            head = None  # the block's head is over
        if not nodes:
            if t0 != "ROOT" or len(toks) < 2:
                return None
            pending = _Node(" ".join(toks[1:]), -1, ln)
            continue
        if not stack:  # something after the root's block
            return None
        top = stack[-1]
        if t0 == "}":
            stack.pop()
            continue
        if nodes[top].end_site or len(nodes) >= MAX_BVH_NODES:
            return None
        if t0 == "JOINT" and len(toks) >= 2:
            pending = _Node(" ".join(toks[1:]), top, ln)
        elif t0 == "End":
            pending = _Node(None, top, ln, end_site=True)
        else:
            return None
    if stack or pending is not None or not nodes:
        return None
    return nodes


def _fast_head_line(head: _Node, toks: list[str], ln: int) -> bool | None:
    """An OFFSET or CHANNELS line of :func:`_parse_hierarchy_fast` into ``head``: True when taken, False when
    unusual (the token parser must read the file), None when the line is neither."""
    key = toks[0].upper()
    if key == "OFFSET":
        if head.offset is not None or len(toks) != 4:
            return False
        try:
            x, y, z = float(toks[1]), float(toks[2]), float(toks[3])
        except ValueError:
            return False
        if not math.isfinite(x - x + y - y + z - z):  # inf - inf is NaN
            return False
        head.offset, head.offset_line = [x, y, z], ln
        return True
    if key == "CHANNELS":
        chans = _fast_channels(toks)
        if chans is None or head.has_channels or head.end_site:
            return False
        head.channels, head.has_channels, head.channels_line = list(chans), True, ln
        return True
    return None


_FAST_CHANNELS: dict[tuple[str, ...], tuple[str, ...] | None] = {}


def _fast_channels(toks: list[str]) -> tuple[str, ...] | None:
    """The channel keys of a ``CHANNELS n names...`` line (all on it, valid and distinct), else ``None``;
    memoised (a file repeats a few channel lines)."""
    key = tuple(toks)
    if key in _FAST_CHANNELS:
        return _FAST_CHANNELS[key]
    chans = None
    try:
        n = int(toks[1]) if len(toks) >= 2 else -1
    except ValueError:
        n = -1
    keys = tuple(c.lower() for c in toks[2:])
    if 0 <= n <= 6 and len(keys) == n and len(set(keys)) == n and all(c in _CHANNEL_NAME for c in keys):
        chans = keys
    if len(_FAST_CHANNELS) < 256:
        _FAST_CHANNELS[key] = chans
    return chans


def _node_names(nodes: list[_Node]) -> tuple[list[str], list[str]]:
    """Unique node names without '/' (end sites ``<parent>_end``), and the original names."""
    names, original = [], []
    used = set()
    for n in nodes:
        if n.end_site:
            base = f"{names[n.parent]}_end"
            original.append("End Site")
        else:
            base = n.name.replace("/", "_")
            original.append(n.name)
        name, k = base, 2
        while name in used:
            name = f"{base}{k}" if n.end_site else f"{base}_{k}"
            k += 1
        used.add(name)
        names.append(name)
    return names, original


# ------------------------------------------------------------------------------------------------------
# motion block
# ------------------------------------------------------------------------------------------------------

_FRAMES_RE = re.compile(rb"\s*Frames\s*:\s*(\S*)\s*")
_FRAME_TIME_RE = re.compile(rb"\s*Frame\s+Time\s*:\s*(\S*)\s*")


def _normalise(text):
    """LF line endings (CRLF and lone CR become LF); works on str and bytes."""
    if isinstance(text, bytes):
        return text.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in text else text
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _motion_line(data: bytes) -> tuple[int, int] | None:
    """``(start, end)`` of the first line that is ``MOTION`` between optional spaces and tabs (the match of
    ``(?m)^[ \\t]*MOTION[ \\t]*$``), found with ``bytes.find`` instead of a regular expression tried at every offset
    of the hierarchy; ``None`` when there is none."""
    i = data.find(b"MOTION")
    while i >= 0:
        start = data.rfind(b"\n", 0, i) + 1
        end = data.find(b"\n", i + 6)
        end = len(data) if end < 0 else end
        if not data[start:i].strip(b" \t") and not data[i + 6 : end].strip(b" \t"):
            return start, end
        i = data.find(b"MOTION", i + 6)
    return None


def _split_file(data: bytes, path):
    """Split LF-normalised bytes into (hierarchy text, {frames, frame_time}: (token, line), offset of the rows,
    line number of the first row)."""
    m = _motion_line(data)
    if m is None:
        header = data.decode("utf-8", errors="replace")
        _parse_hierarchy(header, path)  # a broken or truncated hierarchy says where
        raise FormatError(
            "no MOTION section; expected 'MOTION', 'Frames: N', 'Frame Time: dt' and the rows",
            path=path,
            item=f"line {header.count(chr(10)) + 1}",
        )
    header = data[: m[0]].decode("utf-8", errors="replace")
    pos = data.find(b"\n", m[1])
    pos = len(data) if pos < 0 else pos + 1
    line_no = data.count(b"\n", 0, pos) + 1  # 1-based number of the line starting at pos
    fields = {}
    for key, regex, want in (
        ("frames", _FRAMES_RE, "Frames: <count>"),
        ("frame_time", _FRAME_TIME_RE, "Frame Time: <seconds>"),
    ):
        while True:
            if pos >= len(data):
                raise FormatError(f"unexpected end of file; expected '{want}'", path=path, item=f"line {line_no}")
            nl = data.find(b"\n", pos)
            nl = len(data) if nl < 0 else nl
            line = data[pos:nl]
            pos = nl + 1
            if line.strip():
                break
            line_no += 1
        mm = regex.fullmatch(line)
        if mm is None or not mm.group(1):
            raise FormatError(
                f"found {line.strip().decode('utf-8', 'replace')!r}; expected '{want}'",
                path=path,
                item=f"line {line_no}",
            )
        fields[key] = (mm.group(1).decode("utf-8", "replace"), line_no)
        line_no += 1
    return header, fields, pos, line_no


def _diagnose_rows(body: bytes, first_line: int, nch: int, path):
    """Slow path, only after the fast parse failed: find the first bad row and say what is wrong."""
    for k, line in enumerate(body.split(b"\n")):
        toks = line.split()
        if not toks:
            continue
        ln = first_line + k
        if len(toks) != nch:
            raise FormatError(
                f"{len(toks)} values; expected {nch} (the channels of the hierarchy)", path=path, item=f"line {ln}"
            )
        for j, t in enumerate(toks):
            try:
                float(t)
            except ValueError:
                raise FormatError(
                    f"value {j + 1} {t.decode('utf-8', 'replace')!r} is not a number", path=path, item=f"line {ln}"
                ) from None
    return None


def _row_line(body: bytes, first_line: int, row: int) -> int:
    k = -1
    for i, line in enumerate(body.split(b"\n")):
        if line.strip():
            k += 1
            if k == row:
                return first_line + i
    return first_line + row


_NON_SPACE = re.compile(rb"\S")


def _parse_rows(
    data: bytes, start: int, first_line: int, nch: int, path, dtype=np.float64, rows_hint: int | None = None
) -> np.ndarray:
    """The motion rows ``data[start:]`` as a ``[frames, nch]`` array (the native decimal parser, else one
    ``numpy.loadtxt`` call; no copy of the text); the slow diagnosis runs only when that fails. ``rows_hint``: the
    header's frame count, which sizes the native parser's buffer (any count gives the same rows)."""
    if _NON_SPACE.search(data, start) is None:
        raise FormatError(
            "the motion has zero frames; expected at least one row of values", path=path, item=f"line {first_line}"
        )
    body = memoryview(data)[start:]  # for the error paths only
    if nch == 0:
        body = bytes(body)
        rows = sum(1 for line in body.split(b"\n") if line.strip())
        _diagnose_rows(body, first_line, 0, path)
        return np.zeros((rows, 0))
    try:
        # native one-pass parser: plain decimals only, each below 1e37, so finite in float32 and float64
        values = parse_decimal_rows(data, start, nch, dtype=dtype, rows_hint=rows_hint)
        if values is not None:
            return values
        # exponents past 22, nan/inf, long numbers, ragged rows, no llvmlite: numpy's reader (and its errors)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream = io.BytesIO(data)  # shares the bytes object; no copy
            stream.seek(start)
            values = np.loadtxt(stream, dtype=dtype, comments=None, ndmin=2)
    except ValueError as exc:
        _diagnose_rows(bytes(body), first_line, nch, path)
        raise FormatError(f"unreadable motion rows ({exc})", path=path, item=f"line {first_line}") from exc
    if values.shape[1] != nch:
        _diagnose_rows(bytes(body), first_line, nch, path)
        raise FormatError(f"{values.shape[1]} values per row; expected {nch}", path=path, item=f"line {first_line}")
    finite = np.isfinite(values)
    if not finite.all():
        r, c = np.argwhere(~finite)[0]
        raise FormatError(
            f"value {c + 1} is {values[r, c]}; expected finite numbers",
            path=path,
            item=f"line {_row_line(bytes(body), first_line, int(r))}",
        )
    return values


# ------------------------------------------------------------------------------------------------------
# Euler angles -> quaternions (vectorised, grouped by rotation order)
# ------------------------------------------------------------------------------------------------------


def _channel_quats(angles_deg: np.ndarray, order: str, out_axes: dict[str, int]) -> np.ndarray:
    """WXYZ ``[..., 4]`` of ``R = R_{order[0]} @ R_{order[1]} @ ...`` (intrinsic, the BVH reading).

    ``angles_deg``: ``[..., len(order)]`` degrees, 1 to 3 distinct file axes (``"ZXY"``); ``out_axes`` maps each
    file axis letter to its output axis (identity, or the Y-up -> Z-up cyclic permutation, a rotation, so each
    elementary rotation keeps its angle). Fewer than three channels are padded with the missing axes at 0."""
    letters = "".join("xyz"[out_axes[o]] for o in order)
    if len(letters) < 3:
        pad = 3 - len(letters)
        letters += "".join(c for c in "xyz" if c not in letters)[:pad]
        angles_deg = np.concatenate([angles_deg, np.zeros(angles_deg.shape[:-1] + (pad,), angles_deg.dtype)], -1)
    return R.quat_from_euler(angles_deg, letters, extrinsic=False, degrees=True)


_EULER_CHUNK = 512


_CHANNEL_SPECS: dict[tuple[str, ...], tuple[str, tuple[int, ...], tuple[tuple[int, int], ...]]] = {}


def _channel_spec(channels: list[str]) -> tuple[str, tuple[int, ...], tuple[tuple[int, int], ...]]:
    """``(rotation order, rotation channel positions, ((axis, position), ...) of the position channels)`` of one
    node's channel keys, positions counted within the node's channels; memoised (a file repeats a few lines)."""
    key = tuple(channels)
    spec = _CHANNEL_SPECS.get(key)
    if spec is None:
        order = "".join(_ROT_CHANNELS[c] for c in key if c in _ROT_CHANNELS)
        rot = tuple(k for k, c in enumerate(key) if c in _ROT_CHANNELS)
        pos = tuple((_POS_CHANNELS[c], k) for k, c in enumerate(key) if c in _POS_CHANNELS)
        spec = (order, rot, pos)
        if len(_CHANNEL_SPECS) < 256:
            _CHANNEL_SPECS[key] = spec
    return spec


_CHANNEL_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}


def _channel_names(channels: list[str]) -> tuple[str, ...]:
    """The file's spelling (``Xposition``...) of one node's channel keys; memoised like :func:`_channel_spec`."""
    key = tuple(channels)
    names = _CHANNEL_NAMES.get(key)
    if names is None:
        names = tuple(_CHANNEL_NAME[c] for c in key)
        if len(_CHANNEL_NAMES) < 256:
            _CHANNEL_NAMES[key] = names
    return names


class _Layout:
    """Where each channel of each node lives in a motion row.

    ``rot_groups``: per rotation order, ``(order, node indices [J] intp, rotation columns [J, k] intp)``;
    ``still``: the nodes without rotation channels (end sites); ``pos_nodes``: ``(node, [(axis, column)])`` of the
    nodes with position channels."""

    def __init__(self, nodes: list[_Node]):
        self.num_channels = 0
        groups: dict[str, tuple[list[int], list[list[int]]]] = {}
        self.pos_nodes: list[tuple[int, list[tuple[int, int]]]] = []  # node, [(axis, column)]
        self.still: list[int] = []
        for i, n in enumerate(nodes):
            order, rot, pos = _channel_spec(n.channels)
            base = self.num_channels
            self.num_channels += len(n.channels)
            if order:
                idx, cols = groups.setdefault(order, ([], []))
                idx.append(i)
                cols.append([base + k for k in rot])
            else:
                self.still.append(i)
            if pos:
                self.pos_nodes.append((i, [(a, base + k) for a, k in pos]))
        self.rot_groups = [
            (order, np.array(idx, dtype=np.intp), np.array(cols, dtype=np.intp))
            for order, (idx, cols) in groups.items()
        ]


def _local_arrays(values, nodes, layout: _Layout, offsets, out_axes, vec_index, rot_dtype=np.float64):
    """local rotations [F, N, 4] (``rot_dtype``), root translation [F, 3] and per-frame local translations or
    None (float64, file units, output axes)."""
    nf = values.shape[0]
    nn = len(nodes)
    rot = np.empty((nf, nn, 4), dtype=rot_dtype)
    if layout.still:  # end sites, no rotation channel
        rot[:, layout.still] = (1.0, 0.0, 0.0, 0.0)
    for s0 in range(0, nf, _EULER_CHUNK):  # chunks of frames keep the temporaries in cache
        v = values[s0 : s0 + _EULER_CHUNK]
        for order, idx, cols in layout.rot_groups:
            # float32 trig is SIMD-vectorised (~40x faster than float64 here). The angles are gathered
            # component-major ([k, J, n] in memory, seen as [n, J, k]), so each angle's sines, cosines and
            # products inside quat_from_euler run on contiguous blocks (about 20 % faster than [n, J, k])
            ang = v.T[cols.T].transpose(2, 1, 0).astype(rot_dtype, copy=False)  # [n, J, k] degrees
            rot[s0 : s0 + _EULER_CHUNK, idx] = _channel_quats(ang, order, out_axes)
    root_t = np.empty((nf, 3))
    root_t[:] = offsets[0]
    lt = None
    if any(i != 0 for i, _ in layout.pos_nodes):
        lt = np.empty((nf, nn, 3))
        lt[:] = offsets
    for i, pos in layout.pos_nodes:
        target = root_t if i == 0 else lt[:, i]
        for a, col in pos:
            target[:, vec_index[a]] = values[:, col]
    if lt is not None:
        lt[:, 0] = root_t
    return rot, root_t, lt


# ------------------------------------------------------------------------------------------------------
# detection of up axis and units
# ------------------------------------------------------------------------------------------------------


def _depth_order(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, starts)``: node indices sorted by depth below the root (stable: file order within a depth), and
    the position in ``order`` where each depth starts, one past the last at the end (parents precede children in
    BVH order)."""
    depth = np.zeros(len(parents), dtype=np.int64)
    for i, p in enumerate(parents.tolist()):  # one pass over the nodes: linear in the skeleton size
        if p >= 0:
            depth[i] = depth[p] + 1
    order = np.argsort(depth, kind="stable")
    starts = np.searchsorted(depth[order], np.arange(int(depth.max(initial=0)) + 2))
    return order, starts


def _sample_positions(rot, root_t, lt, offsets, parents, vec_index) -> np.ndarray:
    """Global positions ``[S, N - 1, 3]`` (file axes and units, the root left out, the nodes in depth order) of
    up to 32 frames spread over the clip, from the local arrays already built in output axes (file component
    ``a`` is output component ``vec_index[a]``)."""
    nf = rot.shape[0]
    rows = _sample_rows(nf)
    parents = np.asarray(parents, dtype=np.int64)
    order, starts = _depth_order(parents)
    at = np.empty_like(order)
    at[order] = np.arange(len(order))  # node -> its position in depth order
    parent_at = at[parents[order]]  # the parent's position (meaningless for the root, never read)
    lt_rows = np.repeat(offsets[None], len(rows), axis=0) if lt is None else lt[rows].astype(np.float64)
    # parent_from_node as 4x4 homogeneous matrices, node-major in depth order: each level is a contiguous block,
    # one product per level gives world rotations and positions
    nn = len(order)
    world = np.zeros((nn, len(rows), 4, 4))
    quat = np.ascontiguousarray(rot[rows][:, order].transpose(1, 0, 2), dtype=np.float64)
    world[..., :3, :3] = R.quat_to_matrix(quat)
    world[..., :3, 3] = lt_rows[:, order].transpose(1, 0, 2)
    world[..., 3, 3] = 1.0
    world[0, :, :3, 3] = root_t[rows]  # order[0] is the root
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing skeletons are refused by the caller
        for a, b in zip(starts[1:-1].tolist(), starts[2:].tolist()):  # one vectorised step per tree level
            world[a:b] = world[parent_at[a:b]] @ world[a:b]
    pos = world[..., :3, 3].transpose(1, 0, 2)
    pos = pos[..., list(vec_index)]
    # The root is left out: some skeletons have a ground-projected or static root far from the body.
    return pos[:, 1:] if pos.shape[1] > 1 else pos


def _sample_rows(nf: int) -> list[int]:
    """Up to 32 frame indices spread over ``nf`` frames: ``round(i (nf - 1) / 31)``, in integers (the rows of
    ``np.linspace(0, nf - 1, 32).round()``: no quotient is within 1/62 of a half)."""
    if nf <= 32:
        return list(range(nf))
    return sorted({(2 * i * (nf - 1) + 31) // 62 for i in range(32)})


def _detection_extent(rot, root_t, lt, offsets, parents, vec_index) -> np.ndarray:
    """``[3]`` per-axis median over up to 32 frames spread over the clip of the per-frame extent of the joint
    positions (file axes and units, the root left out; see :func:`_median_extent`), from the local arrays in
    output axes. One native call (:func:`kangengine.io._decimal.pose_extents`) where the kernel is available,
    else the same products level by level in numpy (:func:`_sample_positions`)."""
    rows = _sample_rows(rot.shape[0])
    quat = rot[rows].astype(np.float64)
    if lt is None:
        trans = np.empty((len(rows),) + offsets.shape)
        trans[:] = offsets
    else:
        trans = lt[rows]  # a copy (fancy index), float64
    trans[:, 0] = root_t[rows]
    ext = pose_extents(quat, trans, np.asarray(parents, dtype=np.int64))
    if ext is None:
        return _median_extent(_sample_positions(rot, root_t, lt, offsets, parents, vec_index))
    ext = np.sort(ext[:, list(vec_index)], axis=0)
    mid = len(rows) // 2
    return ext[mid] if len(rows) % 2 else (ext[mid - 1] + ext[mid]) / 2.0  # np.median's middle value(s)


def _median_extent(pos: np.ndarray) -> np.ndarray:
    """``[3]`` per-axis median over the sampled frames of the extent of the joint positions ``pos [S, N, 3]``:
    the up axis is the taller of Y and Z (Y on a tie), the standing height the extent along it."""
    return np.median(pos.max(axis=1) - pos.min(axis=1), axis=0)


def unit_from_standing_height(h: float) -> str:
    """The length unit (a key of :data:`BVH_LENGTH_UNITS`) in which a standing human ``h`` file units tall is
    nearest 1.7 m: ``h < 7.2`` metres, ``< 44.9`` CMU units, ``< 106.7`` inches, ``< 537`` cm, else mm."""
    for bound, unit in _HEIGHT_UNIT_BOUNDS:
        if h < bound:
            return unit
    return "mm"  # pragma: no cover


# ------------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------------


_OUT_AXES: dict[str, dict[str, int]] = {}


def _out_axes(up: str) -> dict[str, int]:
    """File axis letter -> output axis index: identity for a Z-up file, ``zup_from_yup`` for a Y-up one."""
    if up not in _OUT_AXES:
        if up == "y":
            _OUT_AXES[up] = {f: int(np.flatnonzero(axes.MATRIX_ZUP_FROM_YUP[:, _AXIS[f]])[0]) for f in "XYZ"}
        else:
            _OUT_AXES[up] = dict(_AXIS)
    return _OUT_AXES[up]


# no blocking on a FIFO before fstat says it is not a regular file; binary on Windows
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def _read_bytes(path) -> bytes:
    """The bytes of a regular file (one open, one fstat, reads until the end); ``FileMissingError`` for a missing
    path or anything that is not a regular file."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise FileMissingError("no such BVH file", path=Path(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileMissingError("no such BVH file", path=Path(path))
        parts = []
        while True:  # one read of the whole file, then the empty read at its end (a growing file is read on)
            chunk = os.read(fd, max(st.st_size, 1 << 16) + 1)
            if not chunk:
                break
            parts.append(chunk)
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def load_bvh(path, *, up_axis: str = "auto", scale: float | str | None = None, dtype=np.float32):
    """Read a BVH file into a :class:`~kangengine.animation.SkeletonMotion` (metres, Z up, X forward, WXYZ).

    Args:
        path: the ``.bvh`` file.
        up_axis: the file's up axis: ``"y"`` (the BVH convention; converted with ``zup_from_yup``), ``"z"``
            (kept), or ``"auto"``: of Y and Z, the axis along which the skeleton is taller, as the median
            over up to 32 frames spread over the clip of the per-frame extent of all joint positions (Y on
            a tie). The root node is left out of these extents (some skeletons have a static or
            ground-projected root away from the body).
        scale: metres per file unit, or a unit name from :data:`BVH_LENGTH_UNITS` (``"cm"``, ``"in"``...).
            ``None`` detects it from the skeleton's standing height ``h`` in file units (the same median
            per-frame extent, along the up axis, end sites included), taking the unit in which a 1.7 m person
            is nearest: ``h < 7.2`` m, ``< 44.9`` CMU units (0.05644 m), ``< 106.7`` inches, ``< 537`` cm,
            else mm. Give ``scale`` for anything that is not a standing human (robots, animals, children in
            cm may be read as inches).
        dtype: dtype of the motion's arrays, float32 (default, as KangEngine stores motion) or float64.
            The rows are parsed and the Euler angles converted in ``dtype`` (float32 parsing rounds each
            decimal once, to float32's ~7 significant digits).

    Returns:
        ``SkeletonMotion`` with ``fps = 1 / Frame Time``, or the integer (or NTSC ``1000 n / 1001``) rate
        that the printed Frame Time rounds to within half a unit of its last digit (``0.008333`` -> 120 fps,
        not 120.0048), and, in file order (depth first), one node per
        joint plus one leaf ``<parent>_end`` per End Site. ``root_translation [frames, 3]`` m,
        ``local_rotation [frames, nodes, 4]`` WXYZ, ``local_translation [frames, nodes, 3]`` m when a
        non-root joint has position channels (else ``None``). ``metadata`` (JSON-serialisable):
        ``source_file``, ``source_format="bvh"``, ``source_units`` (unit name, or ``"given"``),
        ``units_detected`` (bool), ``scale`` (metres per file unit applied), ``height_file_units``,
        ``up_axis`` (``"y"``/``"z"``), ``up_axis_detected``, ``frame_time`` and ``frame_time_s`` (the printed
        Frame Time, s), ``fps_from_frame_time`` (its exact reciprocal), ``fps_snapped`` (bool), ``header_frames``,
        ``channels`` (per node, the file's channel names; ``[]`` for end sites), ``rotation_orders``
        (per node, e.g. ``"ZXY"``), ``original_names`` (per node; ``"End Site"`` for end sites),
        ``end_sites`` (node names).

    Raises:
        FileMissingError: no such file.
        FormatError: malformed hierarchy or motion (the message names the file and the line): truncated
            file, wrong number of values in a row, non-numeric value, NaN or inf, unknown channel or
            repeated rotation axis, zero frames, bad ``Frames``/``Frame Time`` lines (a negative frame count;
            a Frame Time outside :data:`FRAME_TIME_RANGE_S`), a second ``OFFSET`` or ``CHANNELS`` line in one
            joint's block, more than :data:`MAX_BVH_NODES` nodes, offsets or position channels whose
            positions would overflow ``dtype``.

    Warns:
        BVHFrameCountWarning: the ``Frames:`` count differs from the number of rows (the rows are used).
    """
    if up_axis not in _UP_AXES:
        raise FormatError(f"up_axis {up_axis!r}; expected one of {_UP_AXES}", item="up_axis")
    metres_per_unit, unit_name = _resolve_scale(scale)
    data = _normalise(_read_bytes(path))
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark
        data = data[3:]
    header, fields, rows_at, first_line = _split_file(data, path)
    nodes = _parse_hierarchy_fast(header) or _parse_hierarchy(header, path)
    layout = _Layout(nodes)

    frames_tok, frames_line = fields["frames"]
    try:
        header_frames = int(frames_tok)
    except ValueError:
        raise FormatError(
            f"frame count {frames_tok!r} is not an integer", path=path, item=f"line {frames_line}"
        ) from None
    if header_frames < 0:
        raise FormatError(
            f"Frames: {header_frames}; expected a frame count >= 0", path=path, item=f"line {frames_line}"
        )
    ft_tok, ft_line = fields["frame_time"]
    frame_time, fps, fps_snapped = _frame_rate(ft_tok, path, ft_line)

    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise FormatError(f"dtype {dtype}; expected float32 or float64", item="dtype")
    values = _parse_rows(data, rows_at, first_line, layout.num_channels, path, dtype, header_frames)
    offsets_file = np.fromiter(itertools.chain.from_iterable([n.offset for n in nodes]), np.float64, 3 * len(nodes))
    offsets_file = offsets_file.reshape(len(nodes), 3)
    _check_magnitudes(nodes, offsets_file, values, layout, metres_per_unit, dtype, path)
    nf = values.shape[0]
    if nf != header_frames:
        warnings.warn(
            BVHFrameCountWarning(
                f"{os.fspath(path)}: line {frames_line}: the header says {header_frames} "
                f"frames but the file has {nf} rows; using the {nf} rows"
            ),
            stacklevel=2,
        )

    parents = [n.parent for n in nodes]
    up, up_detected, height = up_axis, False, None

    def build(up_: str):
        out_axes = _out_axes(up_)
        vec_index = tuple(out_axes[f] for f in "XYZ")  # file component a goes to output component vec_index[a]
        offsets = np.empty_like(offsets_file)
        offsets[:, list(vec_index)] = offsets_file
        return (offsets, vec_index, *_local_arrays(values, nodes, layout, offsets, out_axes, vec_index, dtype))

    # Y up is the BVH convention: build for it first; detection runs on those arrays (a Z-up file is rebuilt).
    offsets, vec_index, rot, root_t, lt = build("z" if up_axis == "z" else "y")
    if up_axis == "auto" or scale is None:
        ext = _detection_extent(rot, root_t, lt, offsets, parents, vec_index)
        if up_axis == "auto":
            up, up_detected = ("z" if ext[2] > ext[1] else "y"), True
            if up == "z":
                offsets, vec_index, rot, root_t, lt = build("z")
        height = float(ext[1 if up == "y" else 2])
        if scale is None:
            unit_name = unit_from_standing_height(height)
            metres_per_unit = BVH_LENGTH_UNITS[unit_name]

    names, original = _node_names(nodes)
    from ..animation import SkeletonMotion, SkeletonTree

    s = metres_per_unit
    tree = SkeletonTree(tuple(names), np.array(parents, dtype=np.int64), offsets * s)
    meta = {
        "source_file": os.fspath(path),
        "source_format": "bvh",
        "source_units": unit_name,
        "units_detected": scale is None,
        "scale": s,
        "height_file_units": None if height is None else round(height, 6),
        "up_axis": up,
        "up_axis_detected": up_detected,
        "frame_time": frame_time,
        "frame_time_s": frame_time,
        "fps_from_frame_time": 1.0 / frame_time,
        "fps_snapped": fps_snapped,
        "header_frames": header_frames,
        "channels": [list(_channel_names(n.channels)) for n in nodes],
        "rotation_orders": [_channel_spec(n.channels)[0] for n in nodes],
        "original_names": original,
        "end_sites": [names[i] for i, n in enumerate(nodes) if n.end_site],
    }
    return SkeletonMotion(
        tree,
        (root_t * s).astype(dtype),
        np.ascontiguousarray(rot),
        fps,
        None if lt is None else (lt * s).astype(dtype),
        metadata=meta,
        skip_checks=True,
    )


def _frame_rate(token: str, path, line: int) -> tuple[float, float, bool]:
    """(Frame Time in seconds as printed, fps, whether fps was snapped) of a ``Frame Time:`` token.

    A printed Frame Time is a rounded ``1 / fps``: ``0.008333`` reads as 120.0048 fps. The rates whose
    ``1 / fps`` prints as the token lie within half a unit of its last digit (+-5e-7 s for ``0.008333``:
    119.995 to 120.010 fps). When exactly one integer rate ``n`` lies there (else exactly one NTSC rate
    ``1000 n / 1001``), that is the file's rate; otherwise (``0.0081``: 123 and 124 both print so)
    ``1 / Frame Time`` is kept as is. The printed value stays in ``metadata["frame_time_s"]``.
    """
    import decimal

    lo, hi = FRAME_TIME_RANGE_S
    try:
        exact = decimal.Decimal(token)
        frame_time = float(exact)
    except (decimal.InvalidOperation, ValueError, OverflowError):
        exact, frame_time = None, float("nan")
    if not (math.isfinite(frame_time) and lo <= frame_time <= hi):
        raise FormatError(
            f"Frame Time {token!r}; expected seconds per frame in [{lo:g}, {hi:g}] (a rate of "
            f"{1 / hi:.3g} to {1 / lo:g} fps)",
            path=path,
            item=f"line {line}",
        )
    half_unit = 0.5 * 10.0 ** int(exact.as_tuple().exponent)
    rate = 1.0 / frame_time
    # the rates whose Frame Time prints as this token: 1 / (frame_time +- half a unit of the last digit)
    slowest = 1.0 / (frame_time + half_unit)
    fastest = 1.0 / (frame_time - half_unit) if frame_time > half_unit else math.inf
    for per in (1.0, 1.001):  # integer rates first, then NTSC rates n / 1.001
        first, last = math.ceil(slowest * per), math.floor(fastest * per) if math.isfinite(fastest) else math.inf
        if first >= 1 and first == last:  # exactly one such rate: the printed value means it
            snapped = first / per
            return frame_time, snapped, snapped != rate
    return frame_time, rate, False


def _check_magnitudes(
    nodes, offsets_file: np.ndarray, values: np.ndarray, layout: _Layout, metres_per_unit: float, dtype, path
) -> None:
    """Refuse offsets and position channels whose joint positions could overflow ``dtype`` (inf or NaN after
    scaling to metres, or after summing down a chain of joints). Bound: the sum over nodes of the largest of
    each node's offset (``offsets_file [nodes, 3]``) and position-channel magnitudes."""
    limit = float(np.finfo(dtype).max) / 16.0 / metres_per_unit  # in file units
    offsets = np.abs(offsets_file).max(axis=1)
    per_node = offsets.copy()
    for i, pos in layout.pos_nodes:
        cols = [c for _, c in pos]
        per_node[i] = max(per_node[i], float(np.abs(values[:, cols]).max(initial=0.0)))
    with np.errstate(over="ignore"):
        reach = float(per_node.sum())
    if reach < limit:
        return
    i = int(np.argmax(per_node))
    what = "OFFSET" if per_node[i] == offsets[i] else "position channels"
    raise FormatError(
        f"{what} of {_what(nodes[i])} reach {per_node[i]:.3g} file units and the skeleton {reach:.3g}: joint "
        f"positions would overflow {np.dtype(dtype).name}; expected a skeleton within {limit:.3g} file units",
        path=path,
        item=f"line {nodes[i].offset_line if what == 'OFFSET' else nodes[i].channels_line}",
    )


def _resolve_scale(scale) -> tuple[float, str]:
    if scale is None:
        return 1.0, "detect"
    if isinstance(scale, str):
        if scale not in BVH_LENGTH_UNITS:
            raise FormatError(
                f"unknown unit {scale!r}; expected one of {sorted(BVH_LENGTH_UNITS)} or metres per unit as a number",
                item="scale",
            )
        return BVH_LENGTH_UNITS[scale], scale
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise FormatError(
            f"scale {scale!r}; expected metres per file unit (a number > 0) or a unit name", item="scale"
        ) from None
    if not (math.isfinite(s) and s > 0):
        raise FormatError(f"scale {scale!r}; expected metres per file unit > 0", item="scale")
    return s, "given"


# ------------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------------


def _check_order(order) -> str:
    if not isinstance(order, str) or len(order) != 3 or set(order.upper()) != set("XYZ"):
        raise FormatError(
            f"rotation_order {order!r}; expected a permutation of 'XYZ' such as 'ZYX' or 'ZXY'", item="rotation_order"
        )
    return order.upper()


def _format_rows(values: np.ndarray) -> bytes:
    """Rows of ``%.6f`` numbers separated by spaces."""
    if values.shape[1] == 0:
        return b"\n" * values.shape[0]
    fmt = " ".join(["%.6f"] * values.shape[1]) + "\n"
    return "".join([fmt % tuple(r) for r in values.tolist()]).encode("ascii")


def save_bvh(path, motion, *, rotation_order: str = "ZYX", up_axis: str = "y", units: str | float = "cm"):
    """Write a :class:`~kangengine.animation.SkeletonMotion` to a BVH file (atomically).

    Args:
        path: destination ``.bvh``.
        motion: the motion (numpy or torch; metres, Z up, WXYZ).
        rotation_order: rotation channels of every joint, e.g. ``"ZYX"`` writes ``Zrotation Yrotation
            Xrotation`` (``R = Rz Ry Rx``, intrinsic, degrees).
        up_axis: ``"y"`` writes the Y-up BVH convention (inverse of ``zup_from_yup``); ``"z"`` keeps Z up.
        units: a unit name from :data:`BVH_LENGTH_UNITS` or metres per file unit.

    The root gets ``Xposition Yposition Zposition`` + rotations. Other joints get rotation channels, and
    position channels too when the motion has per-frame ``local_translation`` that moves them (or when its
    ``metadata["channels"]`` says the source had them). Leaf nodes listed in ``metadata["end_sites"]``
    become ``End Site`` blocks (their rotation is not stored); other leaves are written as joints without
    End Site. ``Frame Time`` is ``1 / fps``. Numbers are written with 6 decimals.

    Raises:
        FormatError: bad ``rotation_order``, ``up_axis`` or ``units``; ShapeError: empty motion.
    """
    order = _check_order(rotation_order)
    if up_axis not in ("y", "z"):
        raise FormatError(f"up_axis {up_axis!r}; expected 'y' or 'z'", item="up_axis")
    if isinstance(units, str):
        if units not in BVH_LENGTH_UNITS:
            raise FormatError(f"unknown unit {units!r}; expected one of {sorted(BVH_LENGTH_UNITS)}", item="units")
        per_unit = 1.0 / BVH_LENGTH_UNITS[units]
    else:
        per_unit = 1.0 / float(units)

    m = motion.numpy()
    tree = m.tree
    n = tree.num_nodes
    nf = m.num_frames
    if nf == 0:
        raise ShapeError("the motion has zero frames", item="motion")
    names = [str(x) for x in tree.node_names]
    meta = m.metadata or {}
    end_sites = set(meta.get("end_sites", ()))
    children = [[] for _ in range(n)]
    for i, p in enumerate(tree.parent_indices):
        if p >= 0:
            children[int(p)].append(i)
    is_end = [bool(names[i] in end_sites and not children[i] and i != 0) for i in range(n)]

    to_file_vec = axes.vec_yup_from_zup if up_axis == "y" else (lambda a: np.asarray(a, dtype=np.float64))
    to_file_quat = axes.quat_yup_from_zup if up_axis == "y" else (lambda a: np.asarray(a, dtype=np.float64))
    offsets = to_file_vec(np.asarray(tree.local_translation, dtype=np.float64)) * per_unit
    root_t = to_file_vec(np.asarray(m.root_translation, dtype=np.float64)) * per_unit
    q = to_file_quat(np.asarray(m.local_rotation, dtype=np.float64))
    lt = None
    if m.local_translation is not None:
        lt = to_file_vec(np.asarray(m.local_translation, dtype=np.float64)) * per_unit

    src_channels = meta.get("channels")
    had_pos = [False] * n
    if isinstance(src_channels, list) and len(src_channels) == n:
        had_pos = [any(str(c).lower().endswith("position") for c in ch) for ch in src_channels]
    moving = [False] * n
    if lt is not None:
        tol = 1e-7 * per_unit
        moving = list((np.abs(lt - offsets[None]).max(axis=(0, 2)) > tol) | np.array(had_pos))

    # columns: per joint [pos(3)] + rot(3)
    joints = [i for i in range(n) if not is_end[i]]
    angles = R.quat_to_euler(q[:, joints], order.lower(), extrinsic=False, degrees=True)  # [F, J, 3] letter order
    angles = np.unwrap(angles, axis=0, period=360.0)  # continuous curves; the rotations are unchanged
    blocks = []
    for k, i in enumerate(joints):
        if i == 0:
            blocks.append(root_t)
        elif moving[i]:
            blocks.append(lt[:, i])
        blocks.append(angles[:, k])
    values = np.concatenate(blocks, axis=1)

    lines = ["HIERARCHY"]
    rot_names = " ".join(f"{a}rotation" for a in order)

    def emit(i, depth):
        ind = "\t" * depth
        if is_end[i]:
            o = offsets[i]
            lines.extend([f"{ind}End Site", f"{ind}{{", f"{ind}\tOFFSET {o[0]:.6f} {o[1]:.6f} {o[2]:.6f}", f"{ind}}}"])
            return
        lines.append(f"{ind}{'ROOT' if i == 0 else 'JOINT'} {names[i]}")
        lines.append(f"{ind}{{")
        o = offsets[i]
        lines.append(f"{ind}\tOFFSET {o[0]:.6f} {o[1]:.6f} {o[2]:.6f}")
        if i == 0 or moving[i]:
            lines.append(f"{ind}\tCHANNELS 6 Xposition Yposition Zposition {rot_names}")
        else:
            lines.append(f"{ind}\tCHANNELS 3 {rot_names}")
        for c in children[i]:
            emit(c, depth + 1)
        lines.append(f"{ind}}}")

    emit(0, 0)
    lines += ["MOTION", f"Frames: {nf}", f"Frame Time: {1.0 / m.fps:.10g}", ""]
    head = "\n".join(lines).encode("utf-8")
    body = _format_rows(values)

    def write(f):
        f.write(head)
        f.write(body)

    atomic_write(path, write, suffix=".bvh")
    return Path(path)
