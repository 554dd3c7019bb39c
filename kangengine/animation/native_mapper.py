"""The CPU strategy of the mapper's 3-hinge hot path: one machine-code pass over frames that reads each body's
local quaternion once and writes its three hinge angles, the cost difference of its two branches and the
branch-crossing flag of consecutive frames.

:meth:`ArticulationMotionMapper._fast_block <kangengine.animation.mapper.ArticulationMotionMapper._fast_block>`
does this in numpy for a group of bodies whose three hinges lie on ``+-e_i, +-e_j, +-e_k`` (x/y/z triplets: the
SMPL humanoid's 23 bodies): :func:`~kangengine.rotations.quat_to_euler` (three ``atan2`` and two ``sqrt`` per
body), the branch cost and the pairing test, each step reading and writing ``[frames, bodies]`` arrays again. Here
it is one pass per frame block: per frame and body the quaternion is read once, everything is computed in
registers (float64, SIMD vectors of 8 bodies) and the results are written once. The numpy path stays the
reference and the fallback (llvmlite missing, other axes, limits that bind, gimbal lock, zero quaternions).

Per frame and body, with the components permuted as :func:`~kangengine.rotations.quat_to_euler` does for the
group's order (``a, b, c, d``): ``t_mid = 2 atan2(|(c, d)|, |(a, b)|) - pi/2`` (Tait-Bryan; proper Euler orders
keep ``[0, pi]``), the outer angles ``atan2`` of the complex products ``(a + ib)(c -+ id)``, times the axis signs.
``atan2`` is evaluated in float64 by octant reduction to ``|u| <= tan(pi/8)`` and the odd Taylor series of
``atan`` to ``u^23`` (truncation below ``1.2e-11`` rad), so angles agree with numpy's ``arctan2`` to about
``1e-11`` rad in float64 (the stored dtype's rounding in float32). Then, as the numpy path:

* ``dcost = w (2 pi - 2 (|t1| + |t3|) + |wrap(2 phi - t2)| - |t2|)`` (limits never bind in such a group);
* ``cross = |d1| + |d3| > pi + (g^2 - e^2) / (2 pi)`` with ``d1``, ``d3`` the wrapped steps of ``t1``, ``t3``
  from the previous frame, ``e`` the step of ``alpha = |wrap(t2 - phi)|`` and ``g = min(alpha_t + alpha_t-1,
  2 pi - alpha_t - alpha_t-1)``; false at the very first frame.

Frames where the middle angle is within ``1e-3`` rad of gimbal lock, or a quaternion is zero, are counted and
the caller recomputes the whole block with numpy (scipy's gimbal convention and the zero-quaternion error
come from there). Compiled code is cached on disk like the forward-kinematics kernels
(:func:`kangengine.animation.kinematics.native.compile_ir`).
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np

from ..errors import ShapeError
from .kinematics import native as _native

__all__ = ["EulerBlockKernel", "PlaceKernel", "euler_block_ir", "euler_block_kernel", "place_ir", "place_kernel"]

_W = 8  # bodies per SIMD vector (float64: one AVX-512 register, two AVX2 ones)
_ATAN_TERMS = 12  # u, u^3 / 3, ..., u^23 / 23: |u| <= tan(pi/8), truncation < 1.2e-11 rad
_FMA = ("contract",)  # the series may fuse multiply-adds
_LOCK_MARGIN = 1e-3  # rad from gimbal lock: the block is left to numpy
_KERNELS: dict = {}
_LOCK = threading.Lock()
_AXIS = {"x": 0, "y": 1, "z": 2}


def _euler_plan(order: str):
    """The index/sign plan of :func:`~kangengine.rotations.quat_to_euler` for an intrinsic ``order``:
    ``(i, j, k, s, symmetric, first, third)`` (same derivation as there)."""
    i, j, k = (_AXIS[c] for c in order.lower())
    i, k = k, i  # intrinsic
    symmetric = i == k
    if symmetric:
        k = 3 - i - j
    s = 1 if (i, j, k) in ((0, 1, 2), (1, 2, 0), (2, 0, 1)) else -1
    return i, j, k, s, symmetric, 2, 0


class _Builder:
    """IR helpers over ``<_W x double>`` vectors for one module (``T``: the stored dtype)."""

    def __init__(self, ir, mod, b, T):
        self.ir, self.mod, self.b, self.T = ir, mod, b, T
        self.D = ir.DoubleType()
        self.V = ir.VectorType(self.D, _W)
        self.I64, self.I8 = ir.IntType(64), ir.IntType(8)
        self.f32 = isinstance(T, ir.FloatType)
        self.fabs, self.sqrt, self.rint = (self.intrinsic(x, 1) for x in ("fabs", "sqrt", "rint"))
        self.vmax, self.vmin = self.intrinsic("maxnum", 2), self.intrinsic("minnum", 2)

    def intrinsic(self, name, arity):
        ir = self.ir
        return ir.Function(self.mod, ir.FunctionType(self.V, [self.V] * arity), name=f"llvm.{name}.v{_W}f64")

    def i64(self, v):
        return self.ir.Constant(self.I64, int(v))

    def splat(self, v):
        return self.ir.Constant(self.V, [float(v)] * _W)

    def call(self, fn, *args):
        return self.b.call(fn, list(args))

    def wrap(self, x):  # x - 2 pi rint(x / 2 pi): |.| of it is what the callers use
        b = self.b
        r = self.call(self.rint, b.fmul(x, self.splat(1.0 / (2.0 * math.pi))))
        return b.fsub(x, b.fmul(r, self.splat(2.0 * math.pi)))

    def atan2(self, y, x):
        """Octant reduction to ``|u| <= tan(pi/8)``, one division, the odd series of atan to
        ``u^(2 _ATAN_TERMS - 1)``; ``atan2(+-0, x < 0) = +-pi`` as numpy (callers pass ``+0.0``)."""
        b, sp = self.b, self.splat
        zero = sp(0.0)
        ax, ay = self.call(self.fabs, x), self.call(self.fabs, y)
        mx, mn = self.call(self.vmax, ax, ay), self.call(self.vmin, ax, ay)
        big = b.fcmp_ordered(">", mn, b.fmul(mx, sp(math.tan(math.pi / 8))))
        num = b.select(big, b.fsub(mn, mx), mn)
        den = b.select(big, b.fadd(mn, mx), mx)
        u = b.fdiv(num, b.select(b.fcmp_ordered("==", den, zero), sp(1.0), den))
        u2 = b.fmul(u, u)
        p = sp((-1) ** (_ATAN_TERMS - 1) / (2 * _ATAN_TERMS - 1))
        for m in range(_ATAN_TERMS - 2, -1, -1):
            p = b.fadd(b.fmul(p, u2, flags=_FMA), sp((-1) ** m / (2 * m + 1)), flags=_FMA)
        r = b.fadd(b.fmul(u, p, flags=_FMA), b.select(big, sp(math.pi / 4), zero), flags=_FMA)
        r = b.select(b.fcmp_ordered(">", ay, ax), b.fsub(sp(math.pi / 2), r), r)
        r = b.select(b.fcmp_ordered("<", x, zero), b.fsub(sp(math.pi), r), r)
        return b.select(b.fcmp_ordered("<", y, zero), b.fsub(zero, r), r)

    def gather(self, base, offsets, ty):  # a vector of scalars at constant element offsets from base
        b = self.b
        v = self.ir.Constant(self.V, self.ir.Undefined)
        for lane in range(_W):
            x = b.load(b.gep(base, [self.i64(offsets[min(lane, len(offsets) - 1)])]))
            v = b.insert_element(v, x if ty is self.D else b.fpext(x, self.D), self.i64(lane))
        return v

    def scatter(self, base, offsets, v, ty):
        b = self.b
        for lane in range(len(offsets)):
            x = b.extract_element(v, self.i64(lane))
            b.store(x if ty is self.D else b.fptrunc(x, ty), b.gep(base, [self.i64(offsets[lane])]))

    def mask(self, idx):
        idx = list(idx)
        return self.ir.Constant(self.ir.VectorType(self.ir.IntType(32), len(idx)), idx)

    def _align(self, ty):
        return 1 if ty is self.I8 else (4 if self.f32 and ty is self.T else 8)

    def vload(self, base, offset, count, ty):  # <count x ty> at element offset ``offset`` of base
        ptr = self.b.bitcast(self.b.gep(base, [self.i64(offset)]), self.ir.VectorType(ty, count).as_pointer())
        return self.b.load(ptr, align=self._align(ty))

    def vstore(self, base, offset, v, ty):
        ptr = self.b.bitcast(self.b.gep(base, [self.i64(offset)]), v.type.as_pointer())
        self.b.store(v, ptr, align=self._align(ty))

    def widen(self, v):  # <W x T> -> <W x double>
        return self.b.fpext(v, self.V) if self.f32 else v

    def narrow(self, v):
        return self.b.fptrunc(v, self.ir.VectorType(self.T, _W)) if self.f32 else v

    def store_lanes(self, base, offset, v, m, ty):  # the first m lanes of v, contiguous
        self.vstore(base, offset, v if m == _W else self.b.shuffle_vector(v, v, self.mask(range(m))), ty)

    def load_quats(self, row, bodies):
        """Components ``(w, x, y, z)`` of the chunk's bodies as 4 vectors (one load when consecutive)."""
        m = len(bodies)
        if all(int(x) == int(bodies[0]) + i for i, x in enumerate(bodies)):
            raw = self.vload(row, int(bodies[0]) * 4, 4 * m, self.T)
            pick = [[4 * min(x, m - 1) + c for x in range(_W)] for c in range(4)]
            return [self.widen(self.b.shuffle_vector(raw, raw, self.mask(p))) for p in pick]
        return [self.gather(row, [int(j) * 4 + c for j in bodies], self.T) for c in range(4)]

    def store_angles(self, row, cols, out):
        """``out[h]`` lanes into q columns ``cols [m][3]`` (one interleaved store when consecutive)."""
        m, q0 = len(cols), int(cols[0][0])
        if all(int(cols[x][h]) == q0 + 3 * x + h for x in range(m) for h in range(3)):
            b = self.b
            t = [self.narrow(v) for v in out]
            lo = b.shuffle_vector(t[0], t[1], self.mask(range(2 * _W)))
            hi = b.shuffle_vector(t[2], t[2], self.mask(list(range(_W)) * 2))
            inter = b.shuffle_vector(lo, hi, self.mask([h * _W + x for x in range(m) for h in range(3)]))
            self.vstore(row, q0, inter, self.T)
        else:
            for h in range(3):
                self.scatter(row, [int(c[h]) for c in cols], out[h], self.T)

    def euler(self, comp, order, signs):
        """Branch 0 ``(t1, t2, t3)`` and the middle angle in ``[0, pi]`` (:func:`quat_to_euler`'s closed form)
        and the sum of squares of the components."""
        b = self.b
        ii, jj, kk, s, symmetric, _, _ = _euler_plan(order)
        qw, qi, qj, qk = comp[0], comp[ii + 1], comp[jj + 1], comp[kk + 1]
        if symmetric:
            a_, bb, c_, ds = qw, qi, qj, qk
        else:
            a_, c_ = b.fsub(qw, qj), b.fadd(qj, qw)
            bb, ds = (b.fadd(qi, qk), b.fsub(qk, qi)) if s > 0 else (b.fsub(qi, qk), b.fadd(qk, qi))
        ab2 = b.fadd(b.fmul(a_, a_), b.fmul(bb, bb))
        cd2 = b.fadd(b.fmul(c_, c_), b.fmul(ds, ds))
        middle = b.fmul(self.splat(2.0), self.atan2(self.call(self.sqrt, cd2), self.call(self.sqrt, ab2)))
        P, Q, bc, ac = b.fmul(a_, ds), b.fmul(bb, ds), b.fmul(bb, c_), b.fmul(a_, c_)
        y1 = b.fsub(bc, P) if s > 0 else b.fadd(bc, P)
        if symmetric:
            y3 = b.fadd(P, bc) if s > 0 else b.fsub(bc, P)
        else:
            y3 = b.fadd(P, bc) if s > 0 else b.fsub(P, bc)
        x1 = b.fadd(ac, Q) if s > 0 else b.fsub(ac, Q)
        x3 = b.fsub(ac, Q) if s > 0 else b.fadd(ac, Q)
        mid = middle if symmetric else b.fsub(middle, self.splat(0.5 * math.pi))
        out = [self.atan2(y3, x3), mid, self.atan2(y1, x1)]  # intrinsic: first = 2, third = 0
        out = [b.fsub(self.splat(0.0), t) if sg < 0 else t for t, sg in zip(out, signs)]
        return out, middle, b.fadd(ab2, cd2)

    def pairing(self, t1, t2, t3, prev, phi):
        """``(cross <_W x i1>, alpha)``: the crossed pairing of this frame with ``prev = (t1, alpha, t3)``."""
        b, sp = self.b, self.splat
        alpha = self.call(self.fabs, self.wrap(b.fsub(t2, sp(phi))))
        d1 = self.call(self.fabs, self.wrap(b.fsub(t1, prev[0])))
        d13 = b.fadd(d1, self.call(self.fabs, self.wrap(b.fsub(t3, prev[2]))))
        da = b.fsub(alpha, prev[1])
        ga = b.fadd(alpha, prev[1])
        ga = self.call(self.vmin, ga, b.fsub(sp(2.0 * math.pi), ga))
        rhs = b.fadd(b.fmul(b.fsub(b.fmul(ga, ga), b.fmul(da, da)), sp(0.5 / math.pi)), sp(math.pi))
        return b.fcmp_ordered(">", d13, rhs), alpha

    def cost_difference(self, t1, t2, t3, phi, weight):
        """``w (2 pi - 2 (|t1| + |t3|) + |wrap(2 phi - t2)| - |t2|)``."""
        b, sp = self.b, self.splat
        a1, a3, a2 = self.call(self.fabs, t1), self.call(self.fabs, t3), self.call(self.fabs, t2)
        t2b = self.call(self.fabs, self.wrap(b.fsub(sp(2.0 * phi), t2)))
        dc = b.fadd(b.fsub(b.fadd(b.fmul(b.fadd(a1, a3), sp(-2.0)), t2b), a2), sp(2.0 * math.pi))
        return b.fmul(dc, sp(weight))


def euler_block_ir(dtype, num_bodies: int, bodies, qcols, order: str, signs, phi: float, weight: float) -> str:
    """LLVM IR of the kernel for one group (see the module notes).

    ``bodies [k]`` body indices, ``qcols [k, 3]`` q columns of the three hinges, ``order`` the intrinsic Euler
    order of the axes, ``signs [3]`` their signs, ``phi`` the Davenport phase, ``weight`` the angle weight of
    the branch cost. The function is ``i64 kernel(T* L, T* q, i64 qstride, T* dcost, i8* cross, double* carry,
    i64 has_prev, i64 n)``: ``L [n, num_bodies, 4]`` contiguous, ``q`` rows ``qstride`` elements apart,
    ``dcost``/``cross`` ``[n, k]`` contiguous, ``carry [6, k]`` float64 (``t1``, ``alpha``, ``t3`` of the
    frame before, read when ``has_prev`` and rewritten with the block's last frame; then the running track
    parity (0/1: the xor of the crossings so far), the sum of ``dcost`` and the sum of ``dcost`` where the
    parity is 1, read and updated). Returns the number of
    (frame, body) pairs near gimbal lock or with a zero quaternion (the block must then be recomputed)."""
    from llvmlite import ir

    T = ir.FloatType() if np.dtype(dtype) == np.dtype(np.float32) else ir.DoubleType()
    D, I64, I8 = ir.DoubleType(), ir.IntType(64), ir.IntType(8)
    k = len(bodies)
    chunks = [list(range(c, min(c + _W, k))) for c in range(0, k, _W)]
    mod = ir.Module(name="mapper_euler")
    ptrs = [T.as_pointer(), T.as_pointer(), I64, T.as_pointer(), I8.as_pointer(), D.as_pointer(), I64, I64]
    fn = ir.Function(mod, ir.FunctionType(I64, ptrs), name="kernel")
    pL, pq, qstride, pdc, pcr, pcarry, has_prev, n = fn.args
    for a in (pL, pq, pdc, pcr, pcarry):
        a.add_attribute("noalias")
    entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    B = _Builder(ir, mod, b, T)
    V = B.V
    # carry in: t1, alpha, t3 of the frame before (unused when has_prev == 0)
    init = [[B.gather(pcarry, [r * k + j for j in ch], D) for r in range(6)] for ch in chunks]
    first = b.icmp_signed("==", has_prev, B.i64(0))
    b.cbranch(b.icmp_signed(">", n, B.i64(0)), loop, done)

    b.position_at_end(loop)
    f, bad = b.phi(I64, "f"), b.phi(I64, "bad")
    prev = [[b.phi(V) for _ in range(6)] for _ in chunks]
    f.add_incoming(B.i64(0), entry)
    bad.add_incoming(B.i64(0), entry)
    for pc, ic in zip(prev, init):
        for p, v in zip(pc, ic):
            p.add_incoming(v, entry)
    no_prev = b.and_(first, b.icmp_signed("==", f, B.i64(0)))
    lrow = b.gep(pL, [b.mul(f, B.i64(num_bodies * 4))])
    qrow = b.gep(pq, [b.mul(f, qstride)])
    crow = b.mul(f, B.i64(k))
    drow, xrow = b.gep(pdc, [crow]), b.gep(pcr, [crow])
    new_bad, nexts = bad, []
    for ch, pc in zip(chunks, prev):
        m = len(ch)
        (t1, t2, t3), middle, norm2 = B.euler(B.load_quats(lrow, [bodies[j] for j in ch]), order, signs)
        lock = b.or_(
            b.fcmp_unordered("<", middle, B.splat(_LOCK_MARGIN)),
            b.fcmp_unordered(">", middle, B.splat(math.pi - _LOCK_MARGIN)),
        )
        lock = b.or_(lock, b.fcmp_ordered("==", norm2, B.splat(0.0)))
        for lane in range(m):
            new_bad = b.add(new_bad, b.zext(b.extract_element(lock, B.i64(lane)), I64))
        B.store_angles(qrow, [qcols[j] for j in ch], (t1, t2, t3))
        dc_t = B.narrow(B.cost_difference(t1, t2, t3, phi, float(weight)))
        B.store_lanes(drow, ch[0], dc_t, m, T)
        cr, alpha = B.pairing(t1, t2, t3, pc, phi)
        cr = b.select(no_prev, ir.Constant(cr.type, [0] * _W), cr)
        B.store_lanes(xrow, ch[0], b.zext(cr, ir.VectorType(I8, _W)), m, I8)
        par = b.select(cr, b.fsub(B.splat(1.0), pc[3]), pc[3])  # the track parity after this frame
        dcv = B.widen(dc_t)  # the stored values are summed, as numpy sums them
        total = b.fadd(pc[4], dcv)
        on = b.fadd(pc[5], b.select(b.fcmp_ordered("==", par, B.splat(1.0)), dcv, B.splat(0.0)))
        nexts.append((t1, alpha, t3, par, total, on))
    f1 = b.add(f, B.i64(1))
    end = b.block
    f.add_incoming(f1, end)
    bad.add_incoming(new_bad, end)
    for pc, nx in zip(prev, nexts):
        for p, v in zip(pc, nx):
            p.add_incoming(v, end)
    b.cbranch(b.icmp_signed("<", f1, n), loop, done)

    b.position_at_end(done)
    res = b.phi(I64)
    res.add_incoming(B.i64(0), entry)
    res.add_incoming(new_bad, end)
    finals = [[b.phi(V) for _ in range(6)] for _ in chunks]
    for row, ic, nx in zip(finals, init, nexts):
        for p, a, z in zip(row, ic, nx):
            p.add_incoming(a, entry)
            p.add_incoming(z, end)
    for ch, row in zip(chunks, finals):
        for r in range(6):
            B.scatter(pcarry, [r * k + j for j in ch], row[r], D)
    b.ret(res)
    return str(mod)


class EulerBlockKernel:
    """A compiled :func:`euler_block_ir` kernel: ``kernel(L, q, dcost, cross, carry, has_prev) -> int``."""

    def __init__(self, engine, address: int, dtype, num_bodies: int, k: int):
        self._engine = engine  # owns the machine code
        self.dtype, self.num_bodies, self.k = np.dtype(dtype), num_bodies, k
        self.from_cache = False
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self._fn = ctypes.CFUNCTYPE(i64, vp, vp, i64, vp, vp, vp, i64, i64)(address)

    def __call__(self, L, q, dcost, cross, carry, has_prev: bool) -> int:
        """Frames of ``L [m, num_bodies, 4]`` (C-contiguous, the kernel's dtype) into ``q [m, nq]`` (rows
        contiguous, same dtype), ``dcost [m, k]``, ``cross [m, k] bool`` (C-contiguous) and ``carry [6, k]
        float64`` (in/out). Returns the count of pairs near gimbal lock or zero (recompute the block)."""
        m = L.shape[0]
        ok = L.flags.c_contiguous and L.dtype == self.dtype and L.shape[1:] == (self.num_bodies, 4)
        ok = ok and q.dtype == self.dtype and q.strides[1] == q.itemsize and q.shape[0] == m
        ok = ok and dcost.flags.c_contiguous and cross.flags.c_contiguous and carry.flags.c_contiguous
        ok = ok and dcost.dtype == self.dtype and cross.dtype == np.bool_ and carry.dtype == np.float64
        ok = ok and dcost.shape == (m, self.k) and cross.shape == (m, self.k) and carry.shape == (6, self.k)
        if not ok:  # the kernel reads and writes raw memory: never with the wrong layout
            raise ShapeError(
                f"got L {L.shape} {L.dtype}, q {q.shape} {q.dtype}, dcost {dcost.shape}, cross {cross.shape}, "
                f"carry {carry.shape}; expected C-contiguous L [m, {self.num_bodies}, 4] {self.dtype}, q rows "
                f"[m, nq] of that dtype, dcost/cross [m, {self.k}], carry [6, {self.k}] float64",
                item="EulerBlockKernel",
            )
        addr = [x.__array_interface__["data"][0] for x in (L, q, dcost, cross, carry)]
        qs = q.strides[0] // q.itemsize
        return int(self._fn(addr[0], addr[1], qs, addr[2], addr[3], addr[4], int(bool(has_prev)), m))


def euler_block_kernel(dtype, num_bodies: int, bodies, qcols, order: str, signs, phi: float, weight: float):
    """The compiled kernel for one group (built once per process, kept on disk across processes), or ``None``
    when llvmlite is not available here or the build fails (the numpy path is used)."""
    key = (np.dtype(dtype).str, num_bodies, tuple(map(int, bodies)), tuple(tuple(map(int, c)) for c in qcols))
    key += (order, tuple(map(float, signs)), float(phi), float(weight))
    with _LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        kern = None
        if _native.available():
            try:
                text = euler_block_ir(dtype, num_bodies, bodies, qcols, order, signs, phi, weight)
                engine, address, cached = _native.compile_ir(
                    lambda: text, _native.host_key("mapper-euler 2", text), "kernel", optimize=True
                )
                kern = EulerBlockKernel(engine, address, dtype, num_bodies, len(bodies))
                kern.from_cache = cached
            except Exception:  # a broken toolchain only costs the fast path
                kern = None
        _KERNELS[key] = kern
        return kern


def place_ir(dtype, k: int, q0: int, hinge_body, hinge_kind, phis, refs) -> str:
    """LLVM IR of the second pass (:meth:`ArticulationMotionMapper._place_hinges` over time, every hinge in
    native groups, hinge columns ``q0 .. q0 + nh`` of q contiguous): per frame and hinge the chosen branch
    (per body: branch 1 where the track parity, the xor of the crossings ``cross [n, k]`` so far, differs from
    ``flip [k]``; branch 1 is outer angles ``t - pi sign(t)``, middle ``wrap(2 phi - t)``), unwrapped against
    the frame before (``rint(step / 2 pi)`` turns), plus ``ref``, written back, with the running min/max.

    ``hinge_body [nh]`` the body (0..k-1) of each hinge, ``hinge_kind [nh]`` 1 for a middle angle else 0,
    ``phis``/``refs [nh]`` constants. The function is ``void place(T* q, i64 qstride, i8* cross, i8* flip,
    double* state, i64 has_prev, i64 n, T* qd, i64 qdstride, i64 v0, double two_dt)`` with ``state [6, nh]``
    float64 in/out: previous branch angle, turns, min, max, the first frame's value (written when
    ``has_prev == 0``) and the track parity (0/1). When ``qd`` is not null, the central differences
    ``(q[t+1] - q[t-1]) / two_dt`` of the placed angles go to ``qd[t, v0 + h]`` for ``t`` in ``[1, n - 2]``
    (rows 0 and ``n - 1`` are scribbled: the
    caller writes them; one call must cover every frame)."""
    from llvmlite import ir

    T = ir.FloatType() if np.dtype(dtype) == np.dtype(np.float32) else ir.DoubleType()
    D, I64, I8 = ir.DoubleType(), ir.IntType(64), ir.IntType(8)
    nh = len(hinge_body)
    chunks = [list(range(c, min(c + _W, nh))) for c in range(0, nh, _W)]
    mod = ir.Module(name="mapper_place")
    args = [T.as_pointer(), I64, I8.as_pointer(), I8.as_pointer(), D.as_pointer(), I64, I64, T.as_pointer()]
    args += [I64, I64, D]
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), args), "place")
    pq, qstride, psel, pflip, pst, has_prev, n, pqd, qdstride, v0, two_dt = fn.args
    for a in (pq, psel, pflip, pst, pqd):
        a.add_attribute("noalias")
    entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    B = _Builder(ir, mod, b, T)
    V, sp = B.V, B.splat
    copysign = ir.Function(mod, ir.FunctionType(V, [V, V]), name=f"llvm.copysign.v{_W}f64")
    init = [[B.gather(pst, [r * nh + j for j in ch], D) for r in range(6)] for ch in chunks]
    I8V = ir.VectorType(I8, _W)

    def body_bytes(row, ch):  # <W x i1>: the byte of each lane's body in ``row``, nonzero
        v = ir.Constant(I8V, ir.Undefined)
        for lane in range(_W):
            v = b.insert_element(
                v, b.load(b.gep(row, [B.i64(int(hinge_body[ch[min(lane, len(ch) - 1)]]))])), B.i64(lane)
            )
        return b.icmp_unsigned("!=", v, ir.Constant(I8V, [0] * _W))

    flips = [body_bytes(pflip, ch) for ch in chunks]
    first = b.icmp_signed("==", has_prev, B.i64(0))
    want_qd = b.icmp_unsigned("!=", b.ptrtoint(pqd, I64), B.i64(0))
    tdt = b.insert_element(ir.Constant(V, ir.Undefined), two_dt, B.i64(0))
    tdt = b.shuffle_vector(tdt, tdt, B.mask([0] * _W))
    b.cbranch(b.icmp_signed(">", n, B.i64(0)), loop, done)

    b.position_at_end(loop)
    f = b.phi(I64, "f")
    f.add_incoming(B.i64(0), entry)
    carried = [[b.phi(V) for _ in range(6)] for _ in chunks]
    back = [[b.phi(V) for _ in range(2)] for _ in chunks]  # placed values of frames f-1, f-2
    for row in back:
        for p in row:
            p.add_incoming(ir.Constant(V, ir.Undefined), entry)
    for row, ic in zip(carried, init):
        for p, v in zip(row, ic):
            p.add_incoming(v, entry)
    fresh = b.and_(first, b.icmp_signed("==", f, B.i64(0)))
    qrow = b.gep(pq, [b.mul(f, qstride)])
    srow = b.gep(psel, [b.mul(f, B.i64(k))])
    fm1 = b.select(b.icmp_signed(">", f, B.i64(0)), b.sub(f, B.i64(1)), B.i64(0))
    drow = b.gep(pqd, [b.add(b.mul(fm1, qdstride), v0)])
    nexts, backs = [], []
    for ch, (prev, turns, mn, mx, first_v, par), (p1, p2), flip in zip(chunks, carried, back, flips):
        m = len(ch)
        raw = B.vload(qrow, q0 + ch[0], m, T)
        t = B.widen(raw if m == _W else b.shuffle_vector(raw, raw, B.mask([min(x, m - 1) for x in range(_W)])))
        par = b.select(body_bytes(srow, ch), b.fsub(sp(1.0), par), par)  # xor of the crossings so far
        s = b.xor(b.fcmp_ordered("==", par, sp(1.0)), flip)
        lanes = [ch[min(x, m - 1)] for x in range(_W)]
        kind = ir.Constant(ir.VectorType(ir.IntType(1), _W), [int(hinge_kind[j]) for j in lanes])
        outer = b.fsub(t, B.call(copysign, sp(math.pi), t))
        y = b.fsub(ir.Constant(V, [2.0 * float(phis[j]) for j in lanes]), t)
        y = B.wrap(y)
        y = b.select(b.fcmp_ordered(">", y, sp(math.pi)), b.fsub(y, sp(2.0 * math.pi)), y)
        y = b.select(b.fcmp_ordered("<=", y, sp(-math.pi)), b.fadd(y, sp(2.0 * math.pi)), y)
        t = b.select(s, b.select(kind, y, outer), t)
        jump = B.call(B.rint, b.fmul(b.fsub(t, prev), sp(1.0 / (2.0 * math.pi))))
        jump = b.select(fresh, sp(0.0), jump)
        turns = b.fadd(turns, jump)
        qv = b.fadd(t, b.fsub(ir.Constant(V, [float(refs[j]) for j in lanes]), b.fmul(turns, sp(2.0 * math.pi))))
        qv_t = B.narrow(qv)
        qv = B.widen(qv_t)  # min/max of the stored values, as numpy takes them
        B.store_lanes(qrow, q0 + ch[0], qv_t, m, T)
        backs.append((qv, p1))
        with b.if_then(want_qd):
            B.store_lanes(drow, ch[0], B.narrow(b.fdiv(b.fsub(qv, p2), tdt)), m, T)
        mn = b.select(fresh, qv, B.call(B.vmin, mn, qv))
        mx = b.select(fresh, qv, B.call(B.vmax, mx, qv))
        nexts.append((t, turns, mn, mx, b.select(fresh, qv, first_v), par))
    f1 = b.add(f, B.i64(1))
    end = b.block
    f.add_incoming(f1, end)
    for row, nx in zip(carried, nexts):
        for p, v in zip(row, nx):
            p.add_incoming(v, end)
    for row, nx in zip(back, backs):
        for p, v in zip(row, nx):
            p.add_incoming(v, end)
    b.cbranch(b.icmp_signed("<", f1, n), loop, done)

    b.position_at_end(done)
    finals = [[b.phi(V) for _ in range(6)] for _ in chunks]
    for row, ic, nx in zip(finals, init, nexts):
        for p, a, z in zip(row, ic, nx):
            p.add_incoming(a, entry)
            p.add_incoming(z, end)
    for ch, row in zip(chunks, finals):
        for r in range(6):
            B.scatter(pst, [r * nh + j for j in ch], row[r], D)
    b.ret_void()
    return str(mod)


class PlaceKernel:
    """A compiled :func:`place_ir` kernel: ``kernel(q, cross, flip, state, has_prev)``."""

    def __init__(self, engine, address: int, dtype, k: int, q0: int, nh: int):
        self._engine = engine
        self.dtype, self.k, self.q0, self.nh = np.dtype(dtype), k, q0, nh
        self.from_cache = False
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self._fn = ctypes.CFUNCTYPE(None, vp, i64, vp, vp, vp, i64, i64, vp, i64, i64, ctypes.c_double)(address)

    def __call__(self, q, cross, flip, state, has_prev: bool, qd=None, v0: int = 0, fps: float = 1.0) -> None:
        """Frames of ``q [m, nq]`` (rows contiguous, the kernel's dtype; hinge columns rewritten in place),
        ``cross [m, k] bool`` C-contiguous (the crossings), ``flip [k] bool`` (track 0 is the worse one),
        ``state [6, nh] float64`` (in/out); with ``qd
        [m, nv]`` (rows contiguous, same dtype, ``has_prev`` False: all frames in one call) the hinges' central
        differences at ``fps`` into columns ``v0 .. v0 + nh`` of rows ``1 .. m - 2``."""
        m = q.shape[0]
        ok = q.dtype == self.dtype and q.strides[1] == q.itemsize and q.shape[1] >= self.q0 + self.nh
        ok = ok and cross.flags.c_contiguous and cross.dtype == np.bool_ and cross.shape == (m, self.k)
        ok = ok and flip.flags.c_contiguous and flip.dtype == np.bool_ and flip.shape == (self.k,)
        ok = ok and state.flags.c_contiguous and state.dtype == np.float64 and state.shape == (6, self.nh)
        if not ok:
            raise ShapeError(
                f"got q {q.shape} {q.dtype}, cross {cross.shape} {cross.dtype}, flip {flip.shape}, state "
                f"{state.shape}; expected q rows of {self.dtype} with columns {self.q0}..{self.q0 + self.nh}, "
                f"cross [m, {self.k}] bool, flip [{self.k}] bool, state [6, {self.nh}] float64",
                item="PlaceKernel",
            )
        if qd is not None:
            ok = qd.dtype == self.dtype and qd.strides[1] == qd.itemsize and qd.shape[0] == m and not has_prev
            if not (ok and 0 <= v0 and v0 + self.nh <= qd.shape[1]):
                raise ShapeError(
                    f"got qd {qd.shape} {qd.dtype}, v0 {v0}; expected rows of {self.dtype} for all {m} frames "
                    f"with columns {v0}..{v0 + self.nh}",
                    item="PlaceKernel",
                )
        addr = [x.__array_interface__["data"][0] for x in (q, cross, flip, state)]
        qd_addr, qd_stride = (0, 0) if qd is None else (qd.__array_interface__["data"][0], qd.strides[0] // qd.itemsize)
        two_dt = 2.0 * (1.0 / float(fps))  # as velocities: 2 dt
        self._fn(
            addr[0],
            q.strides[0] // q.itemsize,
            addr[1],
            addr[2],
            addr[3],
            int(bool(has_prev)),
            m,
            qd_addr,
            qd_stride,
            int(v0),
            two_dt,
        )


def place_kernel(dtype, k: int, q0: int, hinge_body, hinge_kind, phis, refs):
    """The compiled :func:`place_ir` kernel (cached like :func:`euler_block_kernel`), or ``None``."""
    key = ("place", np.dtype(dtype).str, k, q0, tuple(map(int, hinge_body)), tuple(map(int, hinge_kind)))
    key += (tuple(map(float, phis)), tuple(map(float, refs)))
    with _LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        kern = None
        if _native.available():
            try:
                text = place_ir(dtype, k, q0, hinge_body, hinge_kind, phis, refs)
                engine, address, cached = _native.compile_ir(
                    lambda: text, _native.host_key("mapper-place 3", text), "place", optimize=True
                )
                kern = PlaceKernel(engine, address, dtype, k, q0, len(hinge_body))
                kern.from_cache = cached
            except Exception:
                kern = None
        _KERNELS[key] = kern
        return kern
