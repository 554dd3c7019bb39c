"""The forward-kinematics program of a tree, recorded once as straight-line code.

Each quantity is held as a tuple of per-component values ("structure of arrays", one value per x/y/z/w
component). A component is a Python float (a constant: rest offsets, joint axes) or a 1-D array / tensor
over frames; constants are folded away by :func:`mul`, :func:`add` and :func:`sub`, so a hinge about the x
axis costs a handful of multiplications. While tracing, the array components are symbols (named values):
the composition down the tree runs once per plan and every arithmetic op it performs is recorded, twice:

* as Python statements (``t3 = t1 * t2``), which :mod:`.replay` compiles into a numpy/torch function;
* as structured ops ``(dest, op, a, b)``, which :mod:`.native` compiles into a SIMD kernel.

The result is a :class:`Trace`; one program, executed by either strategy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .plan import TreePlan

__all__ = ["Trace", "add", "float_literal", "mul", "sub", "trace_coordinates", "trace_joint_frames", "trace_skeleton"]

# -- component algebra ---------------------------------------------------------------------------------
# A component is a Python float (a constant) or a 1-D array / tensor over frames (or a traced symbol).


def _c(a) -> bool:
    return isinstance(a, float)


def mul(a, b):
    """``a * b`` of two components, folding constants (0, 1 and -1 factors cost nothing)."""
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


def add(a, b):
    """``a + b`` of two components, folding a constant 0."""
    if _c(a) and a == 0.0:
        return b
    if _c(b) and b == 0.0:
        return a
    return a + b


def sub(a, b):
    """``a - b`` of two components, folding a constant 0."""
    if _c(b) and b == 0.0:
        return a
    if _c(a) and a == 0.0:
        return -b
    return a - b


def _qmul(a, b):
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return (
        sub(sub(sub(mul(aw, bw), mul(ax, bx)), mul(ay, by)), mul(az, bz)),
        sub(add(add(mul(aw, bx), mul(ax, bw)), mul(ay, bz)), mul(az, by)),
        add(add(sub(mul(aw, by), mul(ax, bz)), mul(ay, bw)), mul(az, bx)),
        add(sub(add(mul(aw, bz), mul(ax, by)), mul(ay, bx)), mul(az, bw)),
    )


def _cross(u, v):
    ux, uy, uz = u
    vx, vy, vz = v
    return (sub(mul(uy, vz), mul(uz, vy)), sub(mul(uz, vx), mul(ux, vz)), sub(mul(ux, vy), mul(uy, vx)))


def _qrot(q, v):
    """Rotate vector v by unit quaternion q: v + 2w (u x v) + 2 u x (u x v)."""
    w = q[0]
    u = q[1:]
    if all(_c(c) for c in v):  # a constant offset: u x (2v) is 2 (u x v) bit for bit, 3 products fewer
        t = _cross(u, tuple(2.0 * c for c in v))
    else:
        t = tuple(mul(2.0, c) for c in _cross(u, v))
    ut = _cross(u, t)
    return tuple(add(add(v[k], mul(w, t[k])), ut[k]) for k in range(3))


def _vadd(a, b):
    return tuple(add(x, y) for x, y in zip(a, b))


def _vsub(a, b):
    return tuple(sub(x, y) for x, y in zip(a, b))


def _normalize4(q, xp):
    n = xp.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    return tuple(c / n for c in q)


# -- tracing -------------------------------------------------------------------------------------------


class _Tracer:
    """Records the program twice: as Python statements (the numpy/torch replay, :mod:`.replay`) and as
    structured ``(dest, op, a, b)`` tuples (the native backend, :mod:`.native`)."""

    def __init__(self):
        self.lines: list[str] = []
        self.ops: list[tuple] = []
        self.count = 0

    def emit(self, expr: str, op: tuple) -> _Sym:
        name = f"t{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {expr}")
        self.ops.append((name, *op, None) if len(op) == 2 else (name, *op))
        return _Sym(name, self)

    def load(self, array: str, index: str, column: int) -> _Sym:
        """Column ``column`` of a frame of input ``array`` (``array[index]`` in the Python replay)."""
        return self.emit(f"{array}[{index}]", ("load", array, column))


_OPNAMES = {"*": "mul", "+": "add", "-": "sub", "/": "div"}


def float_literal(value: float) -> str:
    """Python source for a float constant: ``repr`` when finite, ``float('inf')`` / ``float('nan')`` when not
    (a folded product can overflow; ``repr`` would print the undefined names ``inf`` and ``nan``)."""
    return repr(value) if math.isfinite(value) else f"float('{value!r}')"


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
        o = float_literal(other) if isinstance(other, float) else str(other)
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


@dataclass(frozen=True)
class Trace:
    """A traced program.

    Attributes:
        name: function name of the replay (``fk_world``, ``fk_joints``, ...).
        args: the replay's parameter list: input arrays, ``xp`` where the program calls cos/sin/sqrt, output
            arrays, then the frame range ``s, e``.
        lines: the program as Python statements ``t<i> = <expr>`` (inputs indexed as in the replay).
        ops: the same program as ``(dest, op, a, b)``: ``op`` is "load" (``a`` input array name, ``b`` column
            within a frame), "add", "sub", "mul", "div" (operands: earlier names or Python floats), "neg",
            "sqrt", "cos", "sin" (``a`` the operand, ``b`` None).
        outputs: ``(array, row, values)``: ``array[s:e, row, k] = values[k]``, each value a name or a float.
    """

    name: str
    args: str
    lines: tuple[str, ...]
    ops: tuple[tuple, ...]
    outputs: tuple[tuple[str, int, tuple], ...]

    @property
    def output_columns(self) -> list[tuple[str, int, object]]:
        """``(array, column within a frame, value)`` for every output component."""
        return [(out, row * len(values) + k, v) for out, row, values in self.outputs for k, v in enumerate(values)]


def _finish(tracer: _Tracer, args: str, outputs: list[tuple[str, int, tuple]], name: str) -> Trace:
    named = tuple((out, b, tuple(c if isinstance(c, float) else c.name for c in comps)) for out, b, comps in outputs)
    return Trace(name=name, args=args, lines=tuple(tracer.lines), ops=tuple(tracer.ops), outputs=named)


def _q_columns(tr: _Tracer) -> Callable[[int], _Sym]:
    """``qcol(i)``: the symbol of column ``i`` of the chunk ``qt [nq, n]``, loaded once."""
    cols: dict[int, _Sym] = {}

    def qcol(i: int) -> _Sym:
        if i not in cols:
            cols[i] = tr.load("qt", str(i), i)
        return cols[i]

    return qcol


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
            d = sub(qcol(o), st.ref)
            p = _vadd(p, tuple(mul(d, c) for c in _qrot(r, st.axis)))
            continue
        if st.kind == "hinge":
            h = mul(sub(qcol(o), st.ref), 0.5)
            c, s = xp.cos(h), xp.sin(h)
            jq = (c, mul(s, st.axis[0]), mul(s, st.axis[1]), mul(s, st.axis[2]))
        else:  # ball
            jq = _normalize4((qcol(o), qcol(o + 1), qcol(o + 2), qcol(o + 3)), xp)
        if any(a != 0.0 for a in st.anchor):
            xa = _vadd(p, _qrot(r, st.anchor))
            r = _qmul(r, jq)
            p = _vsub(xa, _qrot(r, st.anchor))
        else:
            r = _qmul(r, jq)
    return p, r


def _compose(plan: TreePlan, local: Callable[[int], tuple]):
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


def _body_outputs(gp: list, gr: list) -> list[tuple[str, int, tuple]]:
    return [("out_p", b, p) for b, p in enumerate(gp)] + [("out_r", b, r) for b, r in enumerate(gr)]


# -- the programs -----------------------------------------------------------------------------------------


def trace_coordinates(plan: TreePlan, *, local: bool) -> Trace:
    """Body transforms from generalized coordinates: ``world_from_body`` (or ``parent_from_body`` with
    ``local``) of every body from a chunk ``qt [nq, frames]``.

    Replay arguments ``(qt, xp, out_p, out_r, s, e)``; outputs ``out_p [frames, B, 3]``, ``out_r [frames, B, 4]``.
    """
    tr = _Tracer()
    ns = _TraceNS(tr)
    qcol = _q_columns(tr)
    if local:
        res = [_local_from_steps(plan, b, qcol, ns) for b in range(plan.num_bodies)]
        gp, gr = [r[0] for r in res], [r[1] for r in res]
    else:
        gp, gr = _compose(plan, lambda b: _local_from_steps(plan, b, qcol, ns))
    return _finish(tr, "qt, xp, out_p, out_r, s, e", _body_outputs(gp, gr), "fk_local" if local else "fk_world")


def trace_skeleton(plan: TreePlan, *, with_translation: bool) -> Trace:
    """World transforms of a skeleton from its local rotations ``rot [B, 4, frames]``, the root position
    ``root [3, frames]`` and, ``with_translation``, per-frame local translations ``tr [B, 3, frames]`` (else
    the plan's rest positions).

    Replay arguments ``(rot, tr, root, out_p, out_r, s, e)``; outputs as :func:`trace_coordinates`.
    """
    tr = _Tracer()

    def local(b):
        r = tuple(tr.load("rot", f"{b}, {k}", 4 * b + k) for k in range(4))
        if plan.parents[b] < 0:
            return tuple(tr.load("root", str(k), k) for k in range(3)), r
        if with_translation:
            return tuple(tr.load("tr", f"{b}, {k}", 3 * b + k) for k in range(3)), r
        return plan.rest_positions[b], r

    gp, gr = _compose(plan, local)
    name = "fk_skeleton_t" if with_translation else "fk_skeleton"
    return _finish(tr, "rot, tr, root, out_p, out_r, s, e", _body_outputs(gp, gr), name)


_EYE = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))


def trace_joint_frames(plan: TreePlan) -> Trace:
    """Body transforms plus, per joint step, the world anchor, the world rotation of the frame the joint
    acts in and the world axis of each of its velocity DOFs (see ``BodyKinematics.joint_frames``).

    Replay arguments ``(qt, xp, out_p, out_r, out_jp, out_jr, out_ax, s, e)``.
    """
    tr = _Tracer()
    ns = _TraceNS(tr)
    qcol = _q_columns(tr)
    rec: list[list] = [[] for _ in range(plan.num_bodies)]
    gp, gr = _compose(plan, lambda b: _local_from_steps(plan, b, qcol, ns, rec[b]))
    outs = _body_outputs(gp, gr)
    k = d = 0
    for b, parent in enumerate(plan.parents):
        for st, (jp, jr) in zip(plan.steps[b], rec[b]):
            if parent >= 0:
                jp = _vadd(gp[parent], _qrot(gr[parent], jp))
                jr = _qmul(gr[parent], jr)
            outs += [("out_jp", k, jp), ("out_jr", k, jr)]
            k += 1
            if st.kind == "free":
                axes = _EYE + _EYE
            elif st.kind == "ball":
                axes = tuple(_qrot(jr, e) for e in _EYE)
            else:
                axes = (_qrot(jr, st.axis),)
            for ax in axes:
                outs.append(("out_ax", d, ax))
                d += 1
    return _finish(tr, "qt, xp, out_p, out_r, out_jp, out_jr, out_ax, s, e", outs, "fk_joints")
