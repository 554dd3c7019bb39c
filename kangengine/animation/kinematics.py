"""The one forward-kinematics implementation of KangEngine.

Skeletons (:class:`~kangengine.animation.SkeletonState`), articulation coordinates
(:func:`forward_kinematics`) and the simulator all compose transforms down a tree with the code in this
module. It works on numpy arrays and torch tensors alike (CPU or CUDA), keeps the input's dtype and
device, and vectorises over frames (and worlds); the only Python loop is over bodies, which the tree
demands.

Internally each quantity is held as a tuple of per-component 1-D arrays ("structure of arrays", one
array per x/y/z/w component, one element per frame). Constant components (rest offsets, joint axes)
stay Python floats and are folded away, so a hinge about the x axis costs a handful of multiplications.
The algebra runs once per tree on symbols; the recorded straight-line code (temporaries freed after
their last use) is compiled with ``exec`` and replayed on every chunk, so the per-chunk cost is the
array arithmetic, not Python's constant-folding decisions. Large CPU batches are processed in chunks
of ``_CHUNK`` frames on a thread pool.

The same recorded program also exists as structured ops, which :mod:`._native` compiles into a machine
code kernel for this CPU (llvmlite): large numpy / CPU torch batches run that kernel instead of the
replay (see "native kernels" below for the policy). One program, two ways to execute it.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import UnknownNameError

__all__ = ["BodyKinematics", "compose_tree", "tree_plan_from_rest", "TreePlan", "JointStep", "JointFrames"]

# -- component algebra ---------------------------------------------------------------------------------
# A component is a Python float (a constant) or a 1-D array / tensor over frames.


def _c(a) -> bool:
    return isinstance(a, float)


def _mul(a, b):
    if _c(a):
        if _c(b):
            return a * b
        if a == 0.0:
            return 0.0
        if a == 1.0:
            return b
        if a == -1.0:
            return -b
        return b * a
    if _c(b):
        if b == 0.0:
            return 0.0
        if b == 1.0:
            return a
        if b == -1.0:
            return -a
    return a * b


def _add(a, b):
    if _c(a) and a == 0.0:
        return b
    if _c(b) and b == 0.0:
        return a
    return a + b


def _sub(a, b):
    if _c(b) and b == 0.0:
        return a
    if _c(a) and a == 0.0:
        return -b
    return a - b


def _qmul(a, b):
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return (
        _sub(_sub(_sub(_mul(aw, bw), _mul(ax, bx)), _mul(ay, by)), _mul(az, bz)),
        _sub(_add(_add(_mul(aw, bx), _mul(ax, bw)), _mul(ay, bz)), _mul(az, by)),
        _add(_add(_sub(_mul(aw, by), _mul(ax, bz)), _mul(ay, bw)), _mul(az, bx)),
        _add(_sub(_add(_mul(aw, bz), _mul(ax, by)), _mul(ay, bx)), _mul(az, bw)),
    )


def _cross(u, v):
    ux, uy, uz = u
    vx, vy, vz = v
    return (_sub(_mul(uy, vz), _mul(uz, vy)), _sub(_mul(uz, vx), _mul(ux, vz)), _sub(_mul(ux, vy), _mul(uy, vx)))


def _qrot(q, v):
    """Rotate vector v by unit quaternion q: v + 2w (u x v) + 2 u x (u x v)."""
    w = q[0]
    u = q[1:]
    if all(_c(c) for c in v):  # a constant offset: u x (2v) is 2 (u x v) bit for bit, 3 products fewer
        t = _cross(u, tuple(2.0 * c for c in v))
    else:
        t = tuple(_mul(2.0, c) for c in _cross(u, v))
    ut = _cross(u, t)
    return tuple(_add(_add(v[k], _mul(w, t[k])), ut[k]) for k in range(3))


def _vadd(a, b):
    return tuple(_add(x, y) for x, y in zip(a, b))


def _vsub(a, b):
    return tuple(_sub(x, y) for x, y in zip(a, b))


def _normalize4(q, xp):
    n = xp.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    return tuple(c / n for c in q)


# -- tracing -------------------------------------------------------------------------------------------
# The algebra above runs once on symbols; the recorded straight-line code is compiled into a Python
# function that replays it on real arrays without re-deciding constant folding for every chunk.


_TEMP = re.compile(r"\bt\d+\b")


class _Tracer:
    """Records the program twice: as Python source lines (the numpy/torch replay) and as structured
    ``(dest, op, a, b)`` tuples (for the native backend, :mod:`._native`)."""

    def __init__(self):
        self.lines: list[str] = []
        self.ops: list[tuple] = []
        self.count = 0

    def emit(self, expr: str, op: tuple) -> _Sym:
        name = f"t{self.count}"
        self.count += 1
        self.lines.append(f"    {name} = {expr}")
        self.ops.append((name, *op, None) if len(op) == 2 else (name, *op))
        return _Sym(name, self)

    def load(self, array: str, index: str, column: int) -> _Sym:
        """Column ``column`` of a frame of input ``array`` (``array[index]`` in the Python replay)."""
        return self.emit(f"{array}[{index}]", ("load", array, column))


_OPNAMES = {"*": "mul", "+": "add", "-": "sub", "/": "div"}


def _operand(x):
    return x if isinstance(x, float) else x.name


class _Sym:
    __slots__ = ("name", "tracer")

    def __init__(self, name: str, tracer: _Tracer):
        self.name = name
        self.tracer = tracer

    def __str__(self) -> str:
        return self.name

    def _bin(self, op: str, other, reverse: bool = False) -> _Sym:
        o = repr(other) if isinstance(other, float) else str(other)
        a, b = (_operand(other), self.name) if reverse else (self.name, _operand(other))
        return self.tracer.emit(f"{o} {op} {self.name}" if reverse else f"{self.name} {op} {o}", (_OPNAMES[op], a, b))

    def __mul__(self, other):
        return self._bin("*", other)

    def __rmul__(self, other):
        return self._bin("*", other, True)

    def __add__(self, other):
        return self._bin("+", other)

    def __radd__(self, other):
        return self._bin("+", other, True)

    def __sub__(self, other):
        return self._bin("-", other)

    def __rsub__(self, other):
        return self._bin("-", other, True)

    def __truediv__(self, other):
        return self._bin("/", other)

    def __neg__(self):
        return self.tracer.emit(f"-{self.name}", ("neg", self.name))


class _TraceNS:
    """Stands in for numpy/torch while tracing: records calls of the array functions used."""

    def __init__(self, tracer: _Tracer):
        self.tracer = tracer

    def cos(self, x):
        return self.tracer.emit(f"xp.cos({x})", ("cos", x.name))

    def sin(self, x):
        return self.tracer.emit(f"xp.sin({x})", ("sin", x.name))

    def sqrt(self, x):
        return self.tracer.emit(f"xp.sqrt({x})", ("sqrt", x.name))


class _Program:
    """A traced program: calling it runs the Python replay (numpy/torch, any device); ``ops`` and
    ``outputs`` are the same program in structured form for :mod:`._native` (``outputs``: ``(array,
    column within a frame, value)``), whose compiled kernels are kept per dtype in ``native``."""

    def __init__(self, fn: Callable, ops: list[tuple], outputs: list[tuple[str, int, object]]):
        self.fn = fn
        self.ops = ops
        self.outputs = outputs
        self.native: dict = {}

    def __call__(self, *args):
        return self.fn(*args)


def _compile(tracer: _Tracer, args: str, outputs: list[tuple[str, int, object]], name: str) -> _Program:
    """Source of ``def name(args): <trace>; out[s:e, body, k] = value`` compiled with exec."""
    lines = list(tracer.lines)
    flat = [
        (out, b * len(comps) + k, c if isinstance(c, float) else c.name)
        for out, b, comps in outputs
        for k, c in enumerate(comps)
    ]
    for out, b, comps in outputs:
        for k, c in enumerate(comps):
            value = repr(c) if isinstance(c, float) else str(c)
            lines.append(f"    {out}[s:e, {b}, {k}] = {value}")
    # Free every temporary right after its last use, as eager evaluation would: keeps the working set
    # in cache instead of holding thousands of chunk-sized arrays alive until the function returns.
    last_use: dict[str, int] = {}
    for i, line in enumerate(lines):
        for tok in _TEMP.findall(line.split("=", 1)[1]):
            last_use[tok] = i
    frees: dict[int, list[str]] = {}
    for tok, i in last_use.items():
        frees.setdefault(i, []).append(tok)
    body = []
    for i, line in enumerate(lines):
        body.append(line)
        if i in frees:
            body.append("    del " + ", ".join(sorted(frees[i])))
    src = f"def {name}({args}):\n" + "\n".join(body or ["    pass"]) + "\n"
    scope: dict = {}
    exec(compile(src, f"<kangengine-fk {name}>", "exec"), scope)
    return _Program(scope[name], tracer.ops, flat)


# -- plans ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JointStep:
    """One joint applied inside a body's local transform.

    ``kind`` is "free", "ball", "hinge" or "slide"; ``q_offset`` its first entry in ``q``; ``axis`` and
    ``anchor`` are in the body frame; the joint's motion is ``q - ref`` (hinge, slide).
    """

    kind: str
    q_offset: int
    axis: tuple[float, float, float] = (0.0, 0.0, 1.0)
    anchor: tuple[float, float, float] = (0.0, 0.0, 0.0)
    ref: float = 0.0


@dataclass(frozen=True)
class TreePlan:
    """What the tree composition needs: parents (parent-first), rest ``parent_from_body`` transforms,
    and the joint steps of each body (empty for a skeleton, whose local rotations are given)."""

    parents: tuple[int, ...]
    rest_positions: tuple[tuple[float, float, float], ...]
    rest_rotations: tuple[tuple[float, float, float, float], ...]
    steps: tuple[tuple[JointStep, ...], ...]

    @property
    def num_bodies(self) -> int:
        return len(self.parents)


def tree_plan_from_rest(parents: Sequence[int], rest_positions, rest_rotations=None, steps=None) -> TreePlan:
    """Build a :class:`TreePlan` from arrays: ``parents [B]``, ``rest_positions [B, 3]``, optional
    ``rest_rotations [B, 4]`` WXYZ (identity by default) and per-body joint steps."""
    rp = np.asarray(rest_positions, dtype=np.float64).reshape(-1, 3)
    nb = len(parents)
    rr = (
        np.tile([1.0, 0.0, 0.0, 0.0], (nb, 1))
        if rest_rotations is None
        else np.asarray(rest_rotations, dtype=np.float64).reshape(-1, 4)
    )
    return TreePlan(
        parents=tuple(int(p) for p in parents),
        rest_positions=tuple(tuple(float(x) for x in row) for row in rp),
        rest_rotations=tuple(tuple(float(x) for x in row) for row in rr),
        steps=tuple(tuple(s) for s in steps) if steps is not None else tuple(() for _ in range(nb)),
    )


# -- backends -------------------------------------------------------------------------------------------


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


class _NumpyNS:
    cos = staticmethod(np.cos)
    sin = staticmethod(np.sin)
    sqrt = staticmethod(np.sqrt)


def _ns(x):
    if _is_torch(x):
        import torch

        return torch
    return _NumpyNS


_CHUNK = 32768
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor | None:
    global _POOL
    n = os.cpu_count() or 1
    if n <= 1:
        return None
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(n, 8), thread_name_prefix="kangengine-fk")
    return _POOL


def _run_chunks(n: int, fn: Callable[[int, int], None], on_cpu: bool, chunk: int = _CHUNK) -> None:
    if not on_cpu or n <= chunk:
        fn(0, n)
        return
    bounds = [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    pool = _pool()
    if pool is None:
        for s, e in bounds:
            fn(s, e)
    else:
        for f in [pool.submit(fn, s, e) for s, e in bounds]:
            f.result()


# -- native kernels ---------------------------------------------------------------------------------------
# The same traced program, compiled to machine code for this CPU by :mod:`._native` (llvmlite) and run on
# numpy arrays / CPU torch tensors through their data pointers. Policy (environment variable
# ``KANGENGINE_FK_BACKEND``): "auto" (default) uses a native kernel for calls of at least
# ``_NATIVE_MIN_FRAMES`` frames, building it on the first such call (under a second per program and
# dtype, once per process); "native" uses one for every call; "numpy" never. The choice depends on
# the call alone (not on earlier calls), so a given call always takes the same path. Without llvmlite,
# or for torch tensors on CUDA or requiring grad, the Python replay runs.

_NATIVE_MIN_FRAMES = 65536
_NATIVE_CHUNK = 16384
_NATIVE_LOCK = threading.Lock()
_BACKENDS = ("auto", "numpy", "native")
_ENV = "KANGENGINE_FK_BACKEND"


def _backend() -> str:
    mode = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if mode not in _BACKENDS:
        raise UnknownNameError(f"{mode!r} is not a backend; expected one of {', '.join(_BACKENDS)}", item=_ENV)
    return mode


def _float_dtype(x) -> np.dtype | None:
    """numpy dtype of a float32/float64 numpy array or CPU torch tensor not requiring grad, else None."""
    if _is_torch(x):
        import torch

        if x.device.type != "cpu" or x.requires_grad or x.dtype not in (torch.float32, torch.float64):
            return None
        compiler = getattr(torch, "compiler", None)
        if compiler is not None and getattr(compiler, "is_compiling", lambda: False)():
            return None  # inside torch.compile tracing: stay in torch ops (no data pointers)
        return np.dtype(np.float32 if x.dtype == torch.float32 else np.float64)
    if x.dtype in (np.float32, np.float64) and x.dtype.isnative:
        return np.dtype(x.dtype)
    return None


def _native_kernel(prog: _Program, inputs: tuple[str, ...], arrays: Sequence, n: int):
    """The native kernel of ``prog`` (input arrays named ``inputs``, given as ``arrays``) when the policy
    selects one and the arrays are all numpy or all CPU torch of one float dtype, else None."""
    mode = _backend()
    if mode == "numpy" or (mode == "auto" and n < _NATIVE_MIN_FRAMES):
        return None
    dts = {_float_dtype(a) for a in arrays}
    if len(dts) != 1 or None in dts or len({_is_torch(a) for a in arrays}) != 1:
        return None
    (dt,) = dts
    key = (inputs, dt)
    if key in prog.native:
        return prog.native[key]
    with _NATIVE_LOCK:
        if key not in prog.native:
            from . import _native

            kern = None
            if _native.available():
                out_names = list(dict.fromkeys(o for o, _, _ in prog.outputs))
                idx = {a: i for i, a in enumerate(inputs)}
                ops = [(d, op, idx[a], b) if op == "load" else (d, op, a, b) for d, op, a, b in prog.ops]
                outs = [(out_names.index(o), c, v) for o, c, v in prog.outputs]
                try:
                    kern = _native.compile_program(ops, outs, len(inputs), len(out_names), dt)
                except Exception as exc:  # never fail a call over the fast path: replay instead
                    warnings.warn(
                        f"kangengine: native forward-kinematics kernel could not be built ({exc}); "
                        "using the numpy replay",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            prog.native[key] = kern
    return prog.native[key]


def _frame_rows(x):
    """``(array, address, frame_stride)`` of ``x [frames, ...]`` as rows with contiguous columns (a copy
    only when the columns are not contiguous); the stride is in elements, 0 for a broadcast row."""
    if _is_torch(x):
        a = x.reshape(x.shape[0], -1)
        if a.shape[1] > 1 and a.stride(1) != 1 or a.stride(0) < 0:
            a = a.contiguous()
        return a, a.data_ptr(), a.stride(0) if a.shape[0] > 1 else 0
    a = x.reshape(x.shape[0], -1)
    isz = a.itemsize
    if a.shape[1] > 1 and a.strides[1] != isz or a.strides[0] < 0 or a.strides[0] % isz:
        a = np.ascontiguousarray(a)
    return a, a.__array_interface__["data"][0], a.strides[0] // isz if a.shape[0] > 1 else 0


def _run_native(kern, inputs: list, outputs: list, n: int, fallback: Callable[[int, int], None]) -> None:
    """Run ``kern`` over frames ``[0, n)`` in chunks on the thread pool (the calls release the GIL);
    a chunk with sin/cos arguments outside the exact range is recomputed by ``fallback(s, e)``."""
    isz = kern.dtype.itemsize
    ins = [_frame_rows(x) for x in inputs]
    outs = [_frame_rows(x) for x in outputs]  # fresh contiguous arrays: never copied, written in place
    in_args = [(ptr, st) for _, ptr, st in ins]
    out_args = [(ptr, st) for _, ptr, st in outs]

    def chunk(s: int, e: int) -> None:
        bad = kern([(p + s * st * isz, st) for p, st in in_args], [(p + s * st * isz, st) for p, st in out_args], e - s)
        if bad:
            fallback(s, e)

    _run_chunks(n, chunk, True, _NATIVE_CHUNK)
    del ins  # keeps any contiguous copies alive until the kernels have run


# -- the composition --------------------------------------------------------------------------------------


def _local_from_steps(plan: TreePlan, b: int, qcol, xp, record: list | None = None):
    """Body b's parent_from_body transform (components) from its joint steps and q columns.

    With ``record``, appends for every step the joint's frame in the parent body's frame: (anchor
    position, rotation of the frame the joint's axis and velocity are expressed in), taken just before
    the joint applies (a free joint: its position and the parent's axes)."""
    p = plan.rest_positions[b]
    r = plan.rest_rotations[b]
    for st in plan.steps[b]:
        o = st.q_offset
        if st.kind == "free":
            p = (qcol(o), qcol(o + 1), qcol(o + 2))
            r = _normalize4((qcol(o + 3), qcol(o + 4), qcol(o + 5), qcol(o + 6)), xp)
            if record is not None:
                record.append((p, (1.0, 0.0, 0.0, 0.0)))
            continue
        if record is not None:
            record.append((_vadd(p, _qrot(r, st.anchor)), r))
        if st.kind == "slide":
            d = _sub(qcol(o), st.ref)
            p = _vadd(p, tuple(_mul(d, c) for c in _qrot(r, st.axis)))
            continue
        if st.kind == "hinge":
            h = _mul(_sub(qcol(o), st.ref), 0.5)
            c, s = xp.cos(h), xp.sin(h)
            jq = (c, _mul(s, st.axis[0]), _mul(s, st.axis[1]), _mul(s, st.axis[2]))
        else:  # ball
            jq = _normalize4((qcol(o), qcol(o + 1), qcol(o + 2), qcol(o + 3)), xp)
        if any(a != 0.0 for a in st.anchor):
            xa = _vadd(p, _qrot(r, st.anchor))
            r = _qmul(r, jq)
            p = _vsub(xa, _qrot(r, st.anchor))
        else:
            r = _qmul(r, jq)
    return p, r


def _compose(plan: TreePlan, local: Callable[[int], tuple], root_from_world=None):
    """Global (world_from_body) components for every body, given a function returning each body's
    local (parent_from_body) components."""
    gp: list = [None] * plan.num_bodies
    gr: list = [None] * plan.num_bodies
    for b, parent in enumerate(plan.parents):
        p, r = local(b)
        if parent < 0:
            gp[b], gr[b] = p, r
        else:
            gp[b] = _vadd(gp[parent], _qrot(gr[parent], p))
            gr[b] = _qmul(gr[parent], r)
    return gp, gr


@dataclass(frozen=True)
class JointFrames:
    """Result of :meth:`BodyKinematics.joint_frames` (numpy or torch, like the input).

    Attributes:
        body_positions: ``[..., B, 3]`` m, ``world_from_body`` origins.
        body_rotations_wxyz: ``[..., B, 4]`` ``world_from_body`` rotations.
        joint_positions: ``[..., S, 3]`` m, world position of each joint step's anchor.
        joint_rotations_wxyz: ``[..., S, 4]`` world rotation of the frame each joint step's axis and
            velocity are expressed in (just before the joint applies).
        dof_axes: ``[..., V, 3]`` world unit axis of every velocity DOF of the steps, in order (hinge,
            slide: the joint axis; ball: the three axes of its frame; free: world x, y, z for the
            translation then for the rotation), ``V`` = the layout's ``nv``.
    """

    body_positions: object
    body_rotations_wxyz: object
    joint_positions: object
    joint_rotations_wxyz: object
    dof_axes: object


_STEP_DOFS = {"free": 6, "ball": 3, "hinge": 1, "slide": 1}


def _q_columns(tr: _Tracer) -> Callable[[int], _Sym]:
    """``qcol(i)``: the symbol of column ``i`` of the chunk ``qt [nq, n]``, loaded once."""
    cols: dict[int, _Sym] = {}

    def qcol(i: int) -> _Sym:
        if i not in cols:
            cols[i] = tr.load("qt", str(i), i)
        return cols[i]

    return qcol


_PROGRAMS: OrderedDict[TreePlan, dict[str, Callable]] = OrderedDict()
_PROGRAMS_MAX = 64  # plans whose traced programs are kept (least recently built dropped first)


def _programs(plan: TreePlan) -> dict[str, Callable]:
    progs = _PROGRAMS.get(plan)
    if progs is None:
        progs = _PROGRAMS[plan] = {}
        while len(_PROGRAMS) > _PROGRAMS_MAX:
            _PROGRAMS.popitem(last=False)
    else:
        _PROGRAMS.move_to_end(plan)
    return progs


class BodyKinematics:
    """Forward kinematics over a :class:`TreePlan`, for numpy arrays and torch tensors.

    All methods take any leading batch dimensions ``[...]`` and return the same type, dtype and device.
    """

    def __init__(self, plan: TreePlan):
        self.plan = plan
        # Traced programs are shared by every instance with an equal plan (a skeleton loaded again,
        # the same robot in another layout object): tracing and compiling costs tens of milliseconds.
        self._compiled: dict[str, Callable] = _programs(plan)

    # articulation coordinates ------------------------------------------------------------------------
    def _traced_coordinates(self, local: bool):
        key = "local" if local else "world"
        fn = self._compiled.get(key)
        if fn is None:
            tr = _Tracer()
            ns = _TraceNS(tr)
            qcol = _q_columns(tr)

            if local:
                res = [_local_from_steps(self.plan, b, qcol, ns) for b in range(self.plan.num_bodies)]
                gp, gr = [r[0] for r in res], [r[1] for r in res]
            else:
                gp, gr = _compose(self.plan, lambda b: _local_from_steps(self.plan, b, qcol, ns))
            outs = [("out_p", b, gp[b]) for b in range(self.plan.num_bodies)]
            outs += [("out_r", b, gr[b]) for b in range(self.plan.num_bodies)]
            fn = self._compiled[key] = _compile(tr, "qt, xp, out_p, out_r, s, e", outs, f"fk_{key}")
        return fn

    def _traced_local(self, with_translation: bool):
        key = "skeleton_t" if with_translation else "skeleton"
        fn = self._compiled.get(key)
        if fn is None:
            tr = _Tracer()
            plan = self.plan

            def local(b):
                r = tuple(tr.load("rot", f"{b}, {k}", 4 * b + k) for k in range(4))
                if plan.parents[b] < 0:
                    return tuple(tr.load("root", str(k), k) for k in range(3)), r
                if with_translation:
                    return tuple(tr.load("tr", f"{b}, {k}", 3 * b + k) for k in range(3)), r
                return plan.rest_positions[b], r

            gp, gr = _compose(plan, local)
            outs = [("out_p", b, gp[b]) for b in range(plan.num_bodies)]
            outs += [("out_r", b, gr[b]) for b in range(plan.num_bodies)]
            fn = self._compiled[key] = _compile(tr, "rot, tr, root, out_p, out_r, s, e", outs, f"fk_{key}")
        return fn

    # articulation coordinates ------------------------------------------------------------------------
    def from_coordinates(self, q, *, local: bool = False):
        """Body transforms from generalized coordinates.

        Args:
            q: ``[..., nq]`` float32/float64, numpy or torch.
            local: return ``parent_from_body`` transforms instead of ``world_from_body``.
        Returns:
            ``(positions [..., B, 3], rotations_wxyz [..., B, 4])``, m, in world (or parent) frame.
        """
        lead = tuple(q.shape[:-1])
        q2 = q.reshape(-1, q.shape[-1])
        xp = _ns(q)
        fn = self._traced_coordinates(local)

        def chunk(s, e, out_p, out_r):
            qt = q2[s:e].T
            qt = qt.contiguous() if _is_torch(qt) else np.ascontiguousarray(qt)
            fn(qt, xp, out_p, out_r, s, e)

        kern = _native_kernel(fn, ("qt",), (q2,), q2.shape[0])
        return self._run(q2, lead, chunk, None if kern is None else (kern, [q2]))

    def joint_frames(self, q) -> JointFrames:
        """Body transforms plus the world frame of every joint step, from generalized coordinates.

        Same composition as :meth:`from_coordinates`; additionally records, per joint step (the plan's
        steps flattened in body order, i.e. the layout's non-FIXED blocks in order), the world position
        of the joint anchor and the world rotation of the frame in which the joint axis (hinge, slide)
        and the joint velocity (ball: angular velocity in the parent frame) are expressed, i.e. the frame
        just before the joint applies. A free joint reports its body origin and the world axes. This is
        MuJoCo's ``xanchor`` and (rotating the joint axis) ``xaxis``.

        Args:
            q: ``[..., nq]`` float32/float64, numpy or torch.
        Returns:
            :class:`JointFrames` with ``[..., B, 3]``, ``[..., B, 4]``, ``[..., S, 3]``, ``[..., S, 4]``.
        """
        lead = tuple(q.shape[:-1])
        q2 = q.reshape(-1, q.shape[-1])
        xp = _ns(q)
        fn = self._traced_joint_frames()
        n, nb = q2.shape[0], self.plan.num_bodies
        ns = sum(len(st) for st in self.plan.steps)
        # Outputs live component-major ([k, n, frames], frames innermost) and are written through
        # [frames, n, k] views: each traced row write is contiguous and callers that want components
        # (the simulator) get them without a copy; the returned arrays are those [frames, n, k] views.
        if _is_torch(q2):
            import torch

            mk = lambda n_, k_: torch.empty((k_, n_, n), dtype=q2.dtype, device=q2.device).permute(2, 1, 0)
            on_cpu = q2.device.type == "cpu" and not q2.requires_grad
        else:
            mk = lambda n_, k_: np.empty((k_, n_, n), dtype=q2.dtype).transpose(2, 1, 0)
            on_cpu = True
        nd = sum(_STEP_DOFS[st.kind] for steps in self.plan.steps for st in steps)
        out_p, out_r, out_jp, out_jr = mk(nb, 3), mk(nb, 4), mk(ns, 3), mk(ns, 4)
        out_ax = mk(nd, 3)

        def chunk(s, e):
            qt = q2[s:e].T
            qt = qt.contiguous() if _is_torch(qt) else np.ascontiguousarray(qt)
            fn(qt, xp, out_p, out_r, out_jp, out_jr, out_ax, s, e)

        _run_chunks(n, chunk, on_cpu)
        return JointFrames(
            body_positions=out_p.reshape(lead + (nb, 3)),
            body_rotations_wxyz=out_r.reshape(lead + (nb, 4)),
            joint_positions=out_jp.reshape(lead + (ns, 3)),
            joint_rotations_wxyz=out_jr.reshape(lead + (ns, 4)),
            dof_axes=out_ax.reshape(lead + (nd, 3)),
        )

    def _traced_joint_frames(self):
        fn = self._compiled.get("joints")
        if fn is None:
            tr = _Tracer()
            ns = _TraceNS(tr)
            qcol = _q_columns(tr)

            plan = self.plan
            rec: list[list] = [[] for _ in range(plan.num_bodies)]
            gp, gr = _compose(plan, lambda b: _local_from_steps(plan, b, qcol, ns, rec[b]))
            outs = [("out_p", b, gp[b]) for b in range(plan.num_bodies)]
            outs += [("out_r", b, gr[b]) for b in range(plan.num_bodies)]
            k = d = 0
            eye = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
            for b, parent in enumerate(plan.parents):
                for st, (jp, jr) in zip(plan.steps[b], rec[b]):
                    if parent >= 0:
                        jp = _vadd(gp[parent], _qrot(gr[parent], jp))
                        jr = _qmul(gr[parent], jr)
                    outs += [("out_jp", k, jp), ("out_jr", k, jr)]
                    k += 1
                    if st.kind == "free":
                        axes = eye + eye
                    elif st.kind == "ball":
                        axes = tuple(_qrot(jr, e) for e in eye)
                    else:
                        axes = (_qrot(jr, st.axis),)
                    for ax in axes:
                        outs.append(("out_ax", d, ax))
                        d += 1
            fn = self._compiled["joints"] = _compile(
                tr, "qt, xp, out_p, out_r, out_jp, out_jr, out_ax, s, e", outs, "fk_joints"
            )
        return fn

    # skeletons --------------------------------------------------------------------------------------
    def from_local(self, root_translation, local_rotation, local_translation=None):
        """Global transforms of a skeleton from its local rotations.

        Args:
            root_translation: ``[..., 3]``: world position of the root node (m).
            local_rotation: ``[..., B, 4]`` WXYZ: ``parent_from_node`` rotations; the root's is its world
                rotation.
            local_translation: optional ``[..., B, 3]`` per-frame ``parent_from_node`` translations
                (joints with translation channels); the plan's rest positions when omitted. The root's
                entry is ignored (``root_translation`` places the root).
        Returns:
            ``(global_translation [..., B, 3], global_rotation [..., B, 4])``.
        """
        nb = self.plan.num_bodies
        lead = tuple(local_rotation.shape[:-2])
        lr = local_rotation.reshape(-1, nb, 4)
        rt = root_translation.reshape(-1, 3)
        lt = None if local_translation is None else local_translation.reshape(-1, nb, 3)
        if rt.shape[0] != lr.shape[0]:  # broadcast a single root translation / rotation set
            n = max(rt.shape[0], lr.shape[0])
            if rt.shape[0] > lr.shape[0]:  # the frames are the root translation's
                lead = tuple(root_translation.shape[:-1])
            rt = _expand(rt, (n, 3))
            lr = _expand(lr, (n, nb, 4))
        if lt is not None and lt.shape[0] != lr.shape[0]:
            lt = _expand(lt, (lr.shape[0], nb, 3))
        fn = self._traced_local(lt is not None)

        def chunk(s, e, out_p, out_r):
            rot = _soa(lr[s:e], (1, 2, 0))  # [B, 4, n]
            tr = None if lt is None else _soa(lt[s:e], (1, 2, 0))
            root = _soa(rt[s:e], (1, 0))
            fn(rot, tr, root, out_p, out_r, s, e)

        names, arrays = (("rot", "root"), [lr, rt]) if lt is None else (("rot", "tr", "root"), [lr, lt, rt])
        kern = _native_kernel(fn, names, arrays, lr.shape[0])
        return self._run(lr, lead, chunk, None if kern is None else (kern, arrays))

    def _run(self, ref, lead, chunk, native=None):
        """Allocate ``[n, B, 3]``/``[n, B, 4]`` outputs and fill them chunk by chunk: with the native
        kernel ``native = (kernel, input arrays)`` when given, else with the Python replay ``chunk``."""
        n = ref.shape[0]
        nb = self.plan.num_bodies
        if _is_torch(ref):
            out_p = _torch_empty((n, nb, 3), ref)
            out_r = _torch_empty((n, nb, 4), ref)
            on_cpu = ref.device.type == "cpu" and not ref.requires_grad
        else:
            out_p = np.empty((n, nb, 3), dtype=ref.dtype)
            out_r = np.empty((n, nb, 4), dtype=ref.dtype)
            on_cpu = True
        if native is not None and n:
            _run_native(native[0], native[1], [out_p, out_r], n, lambda s, e: chunk(s, e, out_p, out_r))
        else:
            _run_chunks(n, lambda s, e: chunk(s, e, out_p, out_r), on_cpu)
        return out_p.reshape(lead + (nb, 3)), out_r.reshape(lead + (nb, 4))


_MADVISE = None


def _torch_empty(shape, like):
    """``torch.empty`` like ``like``; a large CPU buffer is advised to use transparent huge pages, as numpy
    does for its own arrays (first-touch page faults otherwise cost as much as the kinematics)."""
    import torch

    t = torch.empty(shape, dtype=like.dtype, device=like.device)
    nbytes = t.numel() * t.element_size()
    if t.device.type == "cpu" and nbytes >= (4 << 20) and sys.platform.startswith("linux"):
        global _MADVISE
        if _MADVISE is None:
            try:
                f = ctypes.CDLL(None, use_errno=True).madvise
                f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
                _MADVISE = f
            except (OSError, AttributeError):
                _MADVISE = False
        if _MADVISE:
            addr = t.data_ptr()
            skip = -addr % 4096  # madvise wants a page-aligned start
            _MADVISE(addr + skip, nbytes - skip, 14)  # MADV_HUGEPAGE; advisory, failures are harmless
    return t


def _soa(x, perm):
    if _is_torch(x):
        return x.permute(*perm).contiguous()
    return np.ascontiguousarray(x.transpose(perm))


def _expand(x, shape):
    if _is_torch(x):
        return x.expand(*shape)
    return np.broadcast_to(x, shape)


def compose_tree(parents: Sequence[int], local_translation, local_rotation, root_translation):
    """World transforms of a tree from local ones (convenience wrapper of :class:`BodyKinematics`).

    Args:
        parents: ``[B]`` parent index per node, parent-first, -1 for the root.
        local_translation: ``[B, 3]`` or ``[..., B, 3]`` ``parent_from_node`` translations (m).
        local_rotation: ``[..., B, 4]`` WXYZ ``parent_from_node`` rotations.
        root_translation: ``[..., 3]`` world position of the root.
    Returns:
        ``(global_translation [..., B, 3], global_rotation [..., B, 4])``.
    """
    lt = local_translation
    per_frame = lt.ndim > 2
    rest = (
        np.zeros((len(parents), 3))
        if per_frame
        else np.asarray(lt.detach().cpu().numpy() if _is_torch(lt) else lt, dtype=np.float64)
    )
    kin = BodyKinematics(tree_plan_from_rest(parents, rest))
    return kin.from_local(root_translation, local_rotation, lt if per_frame else None)
