"""The CPU strategy of the mapper's 3-hinge hot path, in machine code built for this CPU (llvmlite).

Three kernels, each reading the local quaternions once:

* :func:`fused_ir` (the SMPL humanoid: a free root plus one group of x/y/z hinge triplets and nothing else in q):
  every output of a motion in one pass per frame block: Euler angles, the branch tests, the chosen track
  unwrapped plus ``ref`` into ``q``, central-difference ``qd`` (frame ``t - 2`` read back from ``q``), the root's
  translation, unit quaternion and velocities, and the running track sum, min/max, limit counts and non-finite
  flags (see :meth:`ArticulationMotionMapper._map_fused
  <kangengine.animation.mapper.ArticulationMotionMapper._map_fused>`);
* :func:`euler_block_ir`: the angles, the cost difference of the two branches and the branch-crossing flag of
  consecutive frames, for a triplet group of any other layout;
* :func:`place_ir`: the placing pass after it, when that group holds every hinge.

:meth:`ArticulationMotionMapper._fast_block <kangengine.animation.mapper.ArticulationMotionMapper._fast_block>`
does the first step in numpy for a group of bodies whose three hinges lie on ``+-e_i, +-e_j, +-e_k``:
:func:`~kangengine.rotations.quat_to_euler` (three ``atan2`` and two ``sqrt`` per body), the branch cost and the
pairing test, each step reading and writing ``[frames, bodies]`` arrays again. Here per frame and body the
quaternion is read once, everything is computed in registers (float64, SIMD vectors of 8 bodies; the fused pass
of float32 input in float32 arithmetic, 16 bodies per vector) and the results are written once. The numpy path
stays the reference and the fallback (llvmlite missing, other axes, limits that bind, gimbal lock, zero
quaternions).

Per frame and body, with the components permuted as :func:`~kangengine.rotations.quat_to_euler` does for the
group's order (``a, b, c, d``): ``t_mid = atan2(2 |(a, b)| |(c, d)|, |(a, b)|^2 - |(c, d)|^2) - pi/2`` (the double
angle of ``atan2(|(c, d)|, |(a, b)|)``: one square root; Tait-Bryan; proper Euler orders keep ``[0, pi]``), the
outer angles ``atan2`` of the complex products ``(a + ib)(c -+ id)``, times the axis signs. ``atan2`` is evaluated
in float64 by octant reduction to ``|u| <= tan(pi/8)`` and a near-minimax polynomial of ``atan(u) / u`` of degree
8 in ``u^2`` (:func:`_atan_coefficients`; error below ``2e-14`` rad), so angles agree with numpy's ``arctan2`` to
about ``1e-13`` rad in float64 (the stored dtype's rounding in float32). Then, as the numpy path:

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
import functools
import math
import threading

import numpy as np

from ..errors import ShapeError
from .kinematics import native as _native

__all__ = [
    "EulerBlockKernel",
    "FusedKernel",
    "PlaceKernel",
    "euler_block_ir",
    "euler_block_kernel",
    "fused_ir",
    "fused_kernel",
    "place_ir",
    "place_kernel",
]

_W = 8  # bodies per SIMD vector (float64: one AVX-512 register, two AVX2 ones)
_W_SINGLE = 16  # the fused pass in float32 arithmetic: 16 lanes (one AVX-512 register)
_ATAN_DEGREE = 8  # atan(u) / u as a polynomial of degree 8 in u^2 on |u| <= tan(pi/8): error < 2e-14 rad
_ATAN_DEGREE_SINGLE = 4  # in float32 arithmetic: error < 7.1e-9 rad, below a tenth of float32 rounding at 1 rad
_FMA = ("contract",)  # the series may fuse multiply-adds
_LOCK_MARGIN = 1e-3  # rad from gimbal lock: the block is left to numpy
# The fused pass's loops over the chunks of bodies prefetch the rows of this many frames ahead (the first loop
# over a block reads the quaternions from memory and first writes the rows of q and qd; q and qd are prefetched
# for writing): 0.24 -> 0.19 s per million SMPL frames into fresh arrays, 0.17 -> 0.13 s into written ones
# (docs/mapper.md, Speed).
_PREFETCH_FRAMES = 12
_KERNELS: dict = {}
_LOCK = threading.Lock()
_AXIS = {"x": 0, "y": 1, "z": 2}


@functools.cache
def _atan_coefficients(degree: int = _ATAN_DEGREE) -> tuple[float, ...]:
    """Coefficients ``c_0 .. c_degree`` of ``atan(u) / u ~ sum c_m u^(2m)`` on ``|u| <= tan(pi/8)``: a least-squares
    fit at Chebyshev nodes of ``u^2`` (near-minimax; the error of ``u p(u^2)`` stays below ``2e-14`` rad, where
    the Taylor series needs twelve terms for ``1.2e-11``)."""
    top = math.tan(math.pi / 8) ** 2
    m = 4 * degree
    x = (np.cos(np.pi * (np.arange(m) + 0.5) / m) + 1.0) * (0.5 * top)
    u = np.sqrt(x)
    fit = np.polynomial.chebyshev.Chebyshev.fit(x, np.arctan(u) / u, degree, domain=[0.0, top])
    return tuple(float(c) for c in fit.convert(kind=np.polynomial.Polynomial, domain=[-1, 1], window=[-1, 1]).coef)


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

    def __init__(self, ir, mod, b, T, width: int = _W, *, single: bool = False):
        self.ir, self.mod, self.b, self.T = ir, mod, b, T
        self.W = width  # 0: scalar doubles (the root of the fused kernel)
        self.single = single  # float32 arithmetic (the fused kernel's Euler angles of float32 input)
        self.D = ir.FloatType() if single else ir.DoubleType()
        self.V = self.D if width == 0 else ir.VectorType(self.D, width)
        self.I64, self.I8 = ir.IntType(64), ir.IntType(8)
        self.f32 = isinstance(T, ir.FloatType)
        self.fabs, self.sqrt, self.rint = (self.intrinsic(x, 1) for x in ("fabs", "sqrt", "rint"))
        self.copysign = self.intrinsic("copysign", 2)

    def intrinsic(self, name, arity):
        ir = self.ir
        e = "f32" if self.single else "f64"
        suffix = e if self.W == 0 else f"v{self.W}{e}"
        full = f"llvm.{name}.{suffix}"
        if full in self.mod.globals:  # declared by another function of the module
            return self.mod.globals[full]
        return ir.Function(self.mod, ir.FunctionType(self.V, [self.V] * arity), name=full)

    def fmax(self, x, y):  # x > y ? x : y: one max instruction (llvm.maxnum's NaN rule costs a compare and a blend)
        return self.b.select(self.b.fcmp_ordered(">", x, y), x, y)

    def fmin(self, x, y):
        return self.b.select(self.b.fcmp_ordered("<", x, y), x, y)

    def i64(self, v):
        return self.ir.Constant(self.I64, int(v))

    def splat(self, v):
        return self.ir.Constant(self.V, float(v) if self.W == 0 else [float(v)] * self.W)

    def call(self, fn, *args):
        return self.b.call(fn, list(args))

    def wrap(self, x):  # x - 2 pi rint(x / 2 pi): |.| of it is what the callers use
        b = self.b
        r = self.call(self.rint, b.fmul(x, self.splat(1.0 / (2.0 * math.pi))))
        return b.fsub(x, b.fmul(r, self.splat(2.0 * math.pi)))

    def atan2(self, y, x):
        """Octant reduction to ``|u| <= tan(pi/8)``, one division, a near-minimax polynomial of ``atan(u) / u`` in
        ``u^2`` (:func:`_atan_coefficients`); ``atan2(+-0, x < 0) = +-pi`` as numpy."""
        b, sp = self.b, self.splat
        zero = sp(0.0)
        ax, ay = self.call(self.fabs, x), self.call(self.fabs, y)
        mx, mn = self.fmax(ax, ay), self.fmin(ax, ay)
        big = b.fcmp_ordered(">", mn, b.fmul(mx, sp(math.tan(math.pi / 8))))
        num = b.select(big, b.fsub(mn, mx), mn)
        den = b.select(big, b.fadd(mn, mx), mx)
        u = b.fdiv(num, b.select(b.fcmp_ordered("==", den, zero), sp(1.0), den))
        u2 = b.fmul(u, u)
        coef = _atan_coefficients(_ATAN_DEGREE_SINGLE if self.single else _ATAN_DEGREE)
        p = sp(coef[-1])
        for c in coef[-2::-1]:
            p = b.fadd(b.fmul(p, u2, flags=_FMA), sp(c), flags=_FMA)
        r = b.fadd(b.fmul(u, p, flags=_FMA), b.select(big, sp(math.pi / 4), zero), flags=_FMA)
        r = b.select(b.fcmp_ordered(">", ay, ax), b.fsub(sp(math.pi / 2), r), r)
        r = b.select(b.fcmp_ordered("<", x, zero), b.fsub(sp(math.pi), r), r)
        return self.call(self.copysign, r, y)  # the sign of y, as numpy (atan2(-0, x < 0) = -pi)

    def gather(self, base, offsets, ty):  # a vector of scalars at constant element offsets from base
        b = self.b
        v = self.ir.Constant(self.V, self.ir.Undefined)
        for lane in range(self.W):
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

    def widen(self, v):  # <W x T> -> <W x double> (float32 arithmetic: as stored)
        return self.b.fpext(v, self.V) if self.f32 and not self.single else v

    def narrow(self, v):
        return self.b.fptrunc(v, self.ir.VectorType(self.T, self.W)) if self.f32 and not self.single else v

    def store_lanes(self, base, offset, v, m, ty):  # the first m lanes of v, contiguous
        self.vstore(base, offset, v if m == self.W else self.b.shuffle_vector(v, v, self.mask(range(m))), ty)

    def load_quats(self, row, bodies):
        """Components ``(w, x, y, z)`` of the chunk's bodies as 4 vectors (one load when consecutive)."""
        m = len(bodies)
        if all(int(x) == int(bodies[0]) + i for i, x in enumerate(bodies)):
            raw = self.vload(row, int(bodies[0]) * 4, 4 * m, self.T)
            pick = [[4 * min(x, m - 1) + c for x in range(self.W)] for c in range(4)]
            return [self.widen(self.b.shuffle_vector(raw, raw, self.mask(p))) for p in pick]
        return [self.gather(row, [int(j) * 4 + c for j in bodies], self.T) for c in range(4)]

    def store_angles(self, row, cols, out):
        """``out[h]`` lanes into q columns ``cols [m][3]`` (one interleaved store when consecutive)."""
        m, q0 = len(cols), int(cols[0][0])
        if all(int(cols[x][h]) == q0 + 3 * x + h for x in range(m) for h in range(3)):
            b = self.b
            t = [self.narrow(v) for v in out]
            lo = b.shuffle_vector(t[0], t[1], self.mask(range(2 * self.W)))
            hi = b.shuffle_vector(t[2], t[2], self.mask(list(range(self.W)) * 2))
            inter = b.shuffle_vector(lo, hi, self.mask([h * self.W + x for x in range(m) for h in range(3)]))
            self.vstore(row, q0, inter, self.T)
        else:
            for h in range(3):
                self.scatter(row, [int(c[h]) for c in cols], out[h], self.T)

    def load_angles(self, row, cols):
        """The three vectors :meth:`store_angles` writes, read back from q columns ``cols [m][3]`` (widened)."""
        m, q0 = len(cols), int(cols[0][0])
        if all(int(cols[x][h]) == q0 + 3 * x + h for x in range(m) for h in range(3)):
            raw = self.vload(row, q0, 3 * m, self.T)
            pick = [[3 * min(x, m - 1) + h for x in range(self.W)] for h in range(3)]
            return [self.widen(self.b.shuffle_vector(raw, raw, self.mask(p))) for p in pick]
        return [self.gather(row, [int(c[h]) for c in cols], self.T) for h in range(3)]

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
        # 2 atan2(|(c, d)|, |(a, b)|) as one atan2 of the double angle: one square root instead of two
        root = self.call(self.sqrt, b.fmul(ab2, cd2))
        middle = self.atan2(b.fmul(self.splat(2.0), root), b.fsub(ab2, cd2))
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

    def alpha(self, t2, phi):
        """``|wrap(t2 - phi)|``: the middle angle's distance from the Davenport phase."""
        return self.call(self.fabs, self.wrap(self.b.fsub(t2, self.splat(phi))))

    def pairing(self, t1, t2, t3, prev, phi):
        """``(cross <_W x i1>, alpha)``: the crossed pairing of this frame with ``prev = (t1, alpha, t3)``."""
        b, sp = self.b, self.splat
        alpha = self.alpha(t2, phi)
        d1 = self.call(self.fabs, self.wrap(b.fsub(t1, prev[0])))
        d13 = b.fadd(d1, self.call(self.fabs, self.wrap(b.fsub(t3, prev[2]))))
        da = b.fsub(alpha, prev[1])
        ga = b.fadd(alpha, prev[1])
        ga = self.fmin(ga, b.fsub(sp(2.0 * math.pi), ga))
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
    copysign = B.copysign
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
        mn = b.select(fresh, qv, B.fmin(mn, qv))
        mx = b.select(fresh, qv, B.fmax(mx, qv))
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


# -- the fused pass: every output of a motion on the SMPL-like layout in one pass over the frames -------------

_BODY_SLOTS = ("t1", "alpha", "t3", "parity", "diff")  # per body: branch 0 of the frame before, track sums
_HINGE_SLOTS = ("prev", "turns", "min", "max", "count")  # per (body, hinge)
_NONFINITE_SLOT = len(_BODY_SLOTS) + 3 * len(_HINGE_SLOTS)
_ROOT_SLOTS = 6  # normalised root quaternion of the frame before (4), its sign, the non-finite flag
_OVER_TOL = 1e-6  # a limit violation counts above this (the mapper's summary)


def fused_ir(
    dtype,
    num_bodies: int,
    bodies,
    qcols,
    vcols,
    order: str,
    signs,
    phi: float,
    weight: float,
    limits,
    refs,
    root_body: int,
    root_q: int,
    root_v: int,
    nq: int,
    nv: int,
) -> str:
    """LLVM IR of the fused pass over a frame range of a motion whose articulation is a free root plus one group
    of x/y/z hinge triplets with limits that never bind (the SMPL humanoid): per frame it reads each local
    quaternion once and writes, in registers (vectors over bodies: 16 lanes of float32 arithmetic for float32
    input, 8 of float64 otherwise), the chosen branch of each triplet (the track of
    :meth:`~kangengine.animation.ArticulationMotionMapper._place_hinges`, fixed by ``flip``),
    unwrapped against the frame before plus ``ref``; the root translation and sign-continuous unit quaternion;
    and ``qd`` of the frame before (central differences from frame ``t - 2`` read back from ``q``; the root's
    angular velocity as the rotation vector of ``Q[t+1] Q[t-1]^-1``), while it keeps the track parity and
    branch-decision sum, the unwrapping turns, min and max of each hinge, the count of frames more than ``1e-6``
    beyond its limits and a non-finite flag (the state, float64, carried across calls). The frame range is walked
    once per chunk of bodies and once for the root (8 frames per vector), so each loop's running values stay in
    vector registers; the chunk loops prefetch the rows of ``L``, ``q`` and ``qd``
    :data:`_PREFETCH_FRAMES` frames ahead.

    Work the common frame does not need is branched around, per chunk and frame (each branch taken or not for
    all lanes; the results are those of the full computation): branch 1 is formed only when a lane takes it; the
    crossing test proper runs only when a lane's outer angles step by more than 1.5 rad (it cannot hold below);
    in float32 arithmetic, while no lane has turned and no lane steps by 3 rad, the placed value is ``t + ref``
    in float32 (the value the float64 sum rounds to) and the limit count is left alone where ``[-pi, pi] + ref``
    lies within the limits. For Tait-Bryan orders away from gimbal lock (``|t2| < pi/2 - 1e-3``, else the range
    is redone) the branch cost and ``alpha`` need no wrapping (:meth:`_FusedEmitter.branch_tests`).

    ``bodies [k]``, ``qcols``/``vcols [k, 3]`` the q and qd columns of each body's hinges, ``order``/``signs``/
    ``phi``/``weight`` as :func:`euler_block_ir`, ``limits [k, 3, 2]`` (lower, upper; +-inf when unlimited),
    ``refs [k, 3]``; the free root of body ``root_body`` at q columns ``root_q .. root_q + 7`` and qd columns
    ``root_v .. root_v + 6``. Two functions, ``i64 fused0`` (angles from the quaternions; returns the count of
    (frame, body) pairs near gimbal lock or with a zero quaternion, and then leaves the state untouched: the
    caller redoes the range) and ``i64 fused1`` (the branch-0 angles already in q's hinge columns, their cost
    differences and crossing flags in ``dc``/``cr [N, k]``: numpy's :meth:`_fast_block` for such ranges), both
    ``(T* L, T* root, i64 root_stride, T* q, T* qd, T* dc, i8* cr, i8* flip, double* state, i64 s, i64 e,
    double inv_two_dt)`` over frames ``s .. e - 1`` (``e > s``) of the whole arrays ``L [N, num_bodies, 4]``,
    ``q [N, nq]``, ``qd [N, nv]`` (contiguous); ``qd`` rows ``1 .. N - 2`` are written (row ``t - 1`` once frame
    ``t >= 2`` is placed), the caller writes rows 0 and ``N - 1``."""
    from llvmlite import ir

    T = ir.FloatType() if np.dtype(dtype) == np.dtype(np.float32) else ir.DoubleType()
    mod = ir.Module(name="mapper_fused")
    spec = dict(num_bodies=num_bodies, bodies=[int(x) for x in bodies], qcols=_ints(qcols), vcols=_ints(vcols))
    spec.update(order=order, signs=tuple(map(float, signs)), phi=float(phi), weight=float(weight))
    spec.update(limits=np.asarray(limits, dtype=float).tolist(), refs=np.asarray(refs, dtype=float).tolist())
    spec.update(root_body=int(root_body), root_q=int(root_q), root_v=int(root_v), nq=int(nq), nv=int(nv))
    for mode in (0, 1):
        _FusedEmitter(ir, mod, T, mode, spec).emit()
    return str(mod)


def _fused_lanes(dtype) -> int:
    """Bodies per vector of the fused pass: 16 in float32 arithmetic (float32 input), 8 in float64."""
    return _W_SINGLE if np.dtype(dtype) == np.dtype(np.float32) else _W


def _fused_state_size(k: int, lanes: int) -> int:
    nch = -(-k // lanes)
    return (_NONFINITE_SLOT + 1) * nch * lanes + _ROOT_SLOTS


class _FusedEmitter:
    """Emits one function of :func:`fused_ir` (``mode`` 0 or 1) into ``mod``; ``spec`` the layout constants.

    The frame range is walked once per chunk of 16 (float32) or 8 (float64) bodies and once for the root (each
    loop's running values fit in the vector registers; a range of 1024 frames is 0.4 MB of quaternions, so the
    later loops read it from the cache); the values of frame ``t - 2`` that the central differences need are read
    back from ``q``."""

    def __init__(self, ir, mod, T, mode: int, spec: dict):
        self.ir, self.mod, self.T, self.mode, self.spec = ir, mod, T, mode, spec
        self.D, self.I64, self.I8 = ir.DoubleType(), ir.IntType(64), ir.IntType(8)
        k = len(spec["bodies"])
        self.W = self.SW = _fused_lanes(np.float32 if isinstance(T, ir.FloatType) else np.float64)  # SW: the state's
        self.chunks = [list(range(c, min(c + self.W, k))) for c in range(0, k, self.W)]
        self.nch = len(self.chunks)
        self.nvec = _NONFINITE_SLOT + 1
        self.root_off = self.nvec * self.nch * self.SW
        self.pair = False  # two frames per vector (use_width)

    # -- small helpers ---------------------------------------------------------------------------------
    def slot(self, r, c):
        return (r * self.nch + c) * self.SW

    @staticmethod
    def hslot(name, h):
        return len(_BODY_SLOTS) + 3 * _HINGE_SLOTS.index(name) + h

    def lane_consts(self, ch, table, *index, offset=0.0, builder=None, rounding=0):
        """A constant vector of ``table[body][index...] + offset`` in ``builder``'s type (default :attr:`B`); in
        float32 arithmetic ``rounding`` +1 / -1 rounds each value up / down to float32 (``x < c`` for a float32
        ``x`` is then ``x < ceil32(c)`` exactly, ``x > c`` is ``x > floor32(c)``)."""
        B = builder or self.B
        return self.ir.Constant(
            B.V, self.lane_values(ch, table, *index, offset=offset, single=B.single, rounding=rounding)
        )

    def lane_values(self, ch, table, *index, offset=0.0, single=False, rounding=0):
        """The floats of :meth:`lane_consts`."""
        out = []
        for j in self.lane_bodies(ch):
            v = table[j]
            for i in index:
                v = v[i]
            v = float(v) + offset
            if single and rounding and math.isfinite(v):
                v32 = np.float32(v)
                if (rounding > 0 and float(v32) < v) or (rounding < 0 and float(v32) > v):
                    v32 = np.nextafter(v32, np.float32(rounding * np.inf))
                v = float(v32)
            out.append(v)
        return out

    def padded_load(self, base, offset, m, ty):  # m contiguous values, the last repeated into the unused lanes
        B = self.B
        raw = B.vload(base, offset, m, ty)
        return raw if m == self.W else self.b.shuffle_vector(raw, raw, B.mask([min(x, m - 1) for x in range(self.W)]))

    def from_state(self, r, v):
        """Slot ``r`` of the state (float64 lanes) as the loop carries it: the track sums in float64, the limit
        counts as ``<8 x i32>``, the rest in the arithmetic's type."""
        b = self.b
        if r == _BODY_SLOTS.index("diff"):
            return v
        if r in self._count_slots:
            return b.fptosi(v, self.I32V)
        return b.fptrunc(v, self.B.V) if self.B.single else v

    def to_state(self, r, v):
        b = self.b
        if r == _BODY_SLOTS.index("diff"):
            return v
        if r in self._count_slots:
            return b.sitofp(v, self.Dv.V)
        return b.fpext(v, self.Dv.V) if self.B.single else v

    @property
    def _count_slots(self):
        return [self.hslot("count", h) for h in range(3)]

    def finite(self, v, builder):
        return self.b.fcmp_ordered("<", builder.call(builder.fabs, v), builder.splat(math.inf))

    def root_vector(self, r, bad, start, end):
        """The root 8 frames per vector over ``start .. end - 1`` (possibly none; :func:`_root_vector_frames`)."""
        return self.guarded("root_vec", r, bad, start, end, lambda: _root_vector_frames(self, r, bad, start, end))

    def zext_any(self, mask):  # <n x i1> -> i64, nonzero when a lane is set
        n = mask.type.count
        return self.b.zext(self.b.bitcast(mask, self.ir.IntType(n)), self.I64)

    def any_lane(self, mask):  # <W x i1> -> i64 (nonzero when a lane is set)
        return self.b.zext(self.b.bitcast(mask, self.ir.IntType(self.W)), self.I64)

    # -- the function ----------------------------------------------------------------------------------
    def emit(self):
        ir, D, I64, I8, T = self.ir, self.D, self.I64, self.I8, self.T
        args = [T.as_pointer(), T.as_pointer(), I64, T.as_pointer(), T.as_pointer(), T.as_pointer(), I8.as_pointer()]
        args += [I8.as_pointer(), D.as_pointer(), I64, I64, D]
        fn = self.fn = ir.Function(self.mod, ir.FunctionType(I64, args), name=f"fused{self.mode}")
        self.pL, self.prt, self.rts, self.pq, self.pqd, self.pdc, self.pcr, pflip, pst, self.s, self.e, inv2dt = fn.args
        for a in (self.pL, self.prt, self.pq, self.pqd, self.pdc, self.pcr, pflip, pst):
            a.add_attribute("noalias")
        entry = fn.append_basic_block("entry")
        b = self.b = ir.IRBuilder(entry)
        self.S = _Builder(ir, self.mod, b, T, width=0)
        self.inv2dt = inv2dt
        B = self.use_width(self.SW)
        bad = B.i64(0)
        finals = []
        for c, ch in enumerate(self.chunks):
            B = self.use_width(self.chunk_width(ch))
            init = [self.from_state(r, B.vload(pst, self.slot(r, c), self.W, D)) for r in range(self.nvec)]
            marks = self.padded_load(pflip, ch[0], len(ch), I8)
            flip = b.icmp_unsigned("!=", marks, ir.Constant(self.I8V, [0] * self.W))
            if self.paired(ch):
                fin, bad = self.paired_loops(c, ch, init, bad, flip)
            else:
                fin, bad = self.loop(f"c{c}", init, bad, functools.partial(self.chunk, ch, flip=flip), prefetch=True)
            finals.append(fin)
        init = [b.load(b.gep(pst, [B.i64(self.root_off + i)])) for i in range(_ROOT_SLOTS)]
        # the root: frames before 2 and the last (e - h) % 8 one at a time, the rest 8 frames per vector
        h = self.imin(self.e, self.imax(self.s, B.i64(2)))
        v_end = b.add(h, b.mul(b.sdiv(b.sub(self.e, h), B.i64(8)), B.i64(8)))
        root_final, bad = self.loop("root_head", init, bad, self.root, start=self.s, end=h)
        root_final, bad = self.root_vector(root_final, bad, h, v_end)
        root_final, bad = self.loop("root_tail", root_final, bad, self.root, start=v_end, end=self.e)
        keep, out = fn.append_basic_block("keep"), fn.append_basic_block("out")
        ok = b.icmp_signed("==", bad, B.i64(0)) if self.mode == 0 else ir.Constant(ir.IntType(1), 1)
        b.cbranch(ok, keep, out)
        b.position_at_end(keep)
        for c, fin in enumerate(finals):
            self.use_width(self.chunk_width(self.chunks[c]))
            for r, x in enumerate(fin):
                B.vstore(pst, self.slot(r, c), self.to_state(r, x), D)
        for i, x in enumerate(root_final):
            b.store(x, b.gep(pst, [B.i64(self.root_off + i)]))
        b.branch(out)
        b.position_at_end(out)
        b.ret(bad)

    def paired(self, ch) -> bool:
        """Whether the chunk's frames go two per vector (:meth:`paired_loops`): a chunk of at most 8 bodies in
        float32 arithmetic, mode 0."""
        return self.mode == 0 and self.SW == 2 * _W and len(ch) <= _W

    def lane_bodies(self, ch) -> list:
        """The body of each lane (the last body repeated into unused lanes; two frames per vector: twice)."""
        n = _W if self.pair else self.W
        return [ch[min(x % n, len(ch) - 1)] for x in range(self.W)]

    def paired_loops(self, c, ch, init, bad, flip):
        """A chunk of at most 8 bodies (8 lanes, ``init`` its carried values) with frames ``f, f + 1`` in the low
        and high 8 lanes of one 16-lane vector from frame 2 on: one frame's chain of
        dependent arithmetic is what an 8-lane loop waits on, so two frames per iteration take the time of one.
        Frames before 2 and an odd last frame go one per 8-lane vector (:meth:`chunk` both: with two frames per
        vector, what one frame passes to the next is taken across the halves: :meth:`before`, :meth:`later`,
        :meth:`carry_up`)."""
        b, B = self.b, self.B
        single = functools.partial(self.chunk, ch, flip=flip)
        h = self.imin(self.e, self.imax(self.s, B.i64(2)))
        p_end = b.add(h, b.mul(b.sdiv(b.sub(self.e, h), B.i64(2)), B.i64(2)))
        cur, bad = self.loop(f"c{c}_head", init, bad, single, start=self.s, end=h, prefetch=True)
        cur = self.pair_in(cur)
        self.use_width(2 * _W, pair=True)
        flip2 = b.shuffle_vector(flip, flip, B.mask(list(range(_W)) * 2))
        body = functools.partial(self.chunk, ch, flip=flip2)
        cur, bad = self.loop(f"c{c}_pairs", cur, bad, body, start=h, end=p_end, prefetch=True, step=2)
        cur = self.pair_out(cur)
        self.use_width(_W)
        return self.loop(f"c{c}_tail", cur, bad, single, start=p_end, end=self.e, prefetch=True)

    def _slot_kind(self, r) -> str:
        """How a carried value combines over the two frames of a pair: ``last`` (the value of the later frame:
        branch 0, parity, placed angle, turns), ``sum`` (track sums, limit counts), ``min``/``max``."""
        if r == _BODY_SLOTS.index("diff") or r in self._count_slots:
            return "sum"
        if r == _NONFINITE_SLOT:
            return "max"
        if r >= len(_BODY_SLOTS):
            name = _HINGE_SLOTS[(r - len(_BODY_SLOTS)) // 3]
            if name in ("min", "max"):
                return name
        return "last"

    def pair_in(self, cur):
        """8-lane carried values -> 16 lanes: the frame before in both halves; sums 0 in the high half."""
        b, B = self.b, self.B
        out = []
        for r, v in enumerate(cur):
            other = _zero_vector(v.type) if self._slot_kind(r) == "sum" else v
            out.append(b.shuffle_vector(v, other, B.mask(range(2 * _W))))
        return out

    def pair_out(self, cur):
        """16-lane carried values -> 8 lanes: the later frame's, the halves' sum, min or max."""
        b = self.b
        lo, hi = self.B8.mask(range(_W)), self.B8.mask(range(_W, 2 * _W))
        out = []
        for r, v in enumerate(cur):
            kind = self._slot_kind(r)
            x, y = b.shuffle_vector(v, v, lo), b.shuffle_vector(v, v, hi)
            if kind == "last":
                out.append(y)
            elif kind == "sum":
                out.append(b.add(x, y) if isinstance(v.type.element, self.ir.IntType) else b.fadd(x, y))
            else:
                cmp = "<" if kind == "min" else ">"
                out.append(b.select(b.fcmp_ordered(cmp, x, y), x, y))
        return out

    def before(self, carried, x):
        """Per lane, the value of the frame before: the carried later frame for the low half, ``x``'s low half
        (frame ``f``) for the high half."""
        return self.b.shuffle_vector(carried, x, self.B.mask(list(range(_W, 2 * _W)) + list(range(2 * _W, 3 * _W))))

    def later(self, x):
        """The later frame's half of ``x`` in both halves."""
        return self.b.shuffle_vector(x, x, self.B.mask(list(range(_W, 2 * _W)) * 2))

    def carry_up(self, x):
        """``x``'s low half moved to the high half, zeros below (what frame ``f`` adds to frame ``f + 1``)."""
        return self.b.shuffle_vector(
            _zero_vector(x.type), x, self.B.mask(list(range(_W)) + list(range(2 * _W, 3 * _W)))
        )

    def pair_quats(self, ch):
        """The chunk's quaternion components of frames ``f`` (low lanes) and ``f + 1`` (high lanes)."""
        b, B, spec = self.b, self.B, self.spec
        bodies = [int(spec["bodies"][j]) for j in ch]
        m, row = len(bodies), spec["num_bodies"] * 4
        pad = [min(x, m - 1) for x in range(_W)]
        if all(x == bodies[0] + i for i, x in enumerate(bodies)):
            ra = B.vload(self.lrow, bodies[0] * 4, 4 * m, self.T)
            rb = B.vload(self.lrow, row + bodies[0] * 4, 4 * m, self.T)
            picks = [[4 * x + c for x in pad] + [4 * m + 4 * x + c for x in pad] for c in range(4)]
            return [B.widen(b.shuffle_vector(ra, rb, B.mask(p))) for p in picks]
        return [
            B.gather(self.lrow, [bodies[x] * 4 + c for x in pad] + [row + bodies[x] * 4 + c for x in pad], self.T)
            for c in range(4)
        ]

    def store_rows(self, row, stride, cols, vecs):
        """:meth:`_Builder.store_angles` of ``vecs`` into ``row``; two frames per vector: the low half there, the
        high half into the next row (``stride`` elements on)."""
        if not self.pair:
            return self.B.store_angles(row, cols, vecs)
        b, B8 = self.b, self.B8
        for half, at in ((range(_W), row), (range(_W, 2 * _W), b.gep(row, [B8.i64(stride)]))):
            B8.store_angles(at, cols, [b.shuffle_vector(v, v, B8.mask(half)) for v in vecs])

    def load_rows(self, row, stride, cols):
        """What :meth:`store_rows` writes, read back."""
        if not self.pair:
            return self.B.load_angles(row, cols)
        b, B8 = self.b, self.B8
        lo, hi = B8.load_angles(row, cols), B8.load_angles(b.gep(row, [B8.i64(stride)]), cols)
        return [b.shuffle_vector(x, y, self.B.mask(range(2 * _W))) for x, y in zip(lo, hi)]

    def chunk_width(self, ch) -> int:
        """Lanes of a chunk's vectors: a last chunk of at most 8 bodies (float32) goes 8 wide."""
        return 8 if len(ch) <= 8 else self.SW

    def use_width(self, w: int, pair: bool = False):
        """Emit the following per-body code ``w`` lanes wide (the builders, vector types and splats); ``pair``:
        two frames of at most 8 bodies per vector (:meth:`paired_loops`)."""
        ir, b, T = self.ir, self.b, self.T
        f32 = isinstance(T, ir.FloatType)
        self.W, self.pair = w, pair
        self.B8 = _Builder(ir, self.mod, b, T, _W, single=f32)  # one frame's half of a paired vector
        B = self.B = _Builder(ir, self.mod, b, T, w, single=f32)  # float32 input: float32 arithmetic
        self.Dv = _Builder(ir, self.mod, b, T, w)  # float64 vectors: track sums, placed values before rounding
        self.copysign = B.copysign
        self.I1V, self.I8V = ir.VectorType(ir.IntType(1), w), ir.VectorType(self.I8, w)
        self.I32V = ir.VectorType(ir.IntType(32), w)
        x = b.fptrunc(self.inv2dt, B.D) if f32 else self.inv2dt
        v = b.insert_element(ir.Constant(B.V, ir.Undefined), x, B.i64(0))
        self.inv2dt_v = b.shuffle_vector(v, v, B.mask([0] * w))
        return B

    def imin(self, x, y):
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def imax(self, x, y):
        return self.b.select(self.b.icmp_signed(">", x, y), x, y)

    def loop(self, name, init, bad_in, body, start=None, end=None, prefetch=False, step=1):
        """A loop over frames ``s .. e - 1`` carrying ``init`` (and the bad flags); ``body(cur)`` returns the next
        values, the bad flags of this frame (i64) and a callback storing the rates of the frame before (run from
        frame 2 on). Returns the final values and flags (the loop runs at least once; with ``start``/``end``
        over frames ``start .. end - 1``, possibly none). ``prefetch``: each frame first asks for the rows of
        ``L``, ``q`` and ``qd`` :data:`_PREFETCH_FRAMES` ahead (:meth:`prefetch_rows`). ``step``: frames per
        iteration (``end - start`` a multiple of it; the body handles frames ``f .. f + step - 1``)."""
        if start is None:
            return self._loop(name, init, bad_in, body, self.s, self.e, prefetch, step)
        return self.guarded(
            name, init, bad_in, start, end, lambda: self._loop(name, init, bad_in, body, start, end, prefetch, step)
        )

    def guarded(self, name, init, bad_in, start, end, emit):
        """``emit()`` (a loop from ``start``) when ``start < end``, else ``init`` and ``bad_in`` unchanged."""
        b = self.b
        pre = b.block
        run, after = self.fn.append_basic_block(f"{name}_run"), self.fn.append_basic_block(f"{name}_skip")
        b.cbranch(b.icmp_signed("<", start, end), run, after)
        b.position_at_end(run)
        nxt, new_bad = emit()
        last = b.block
        b.branch(after)
        b.position_at_end(after)
        out = []
        for x, y in zip(list(init) + [bad_in], list(nxt) + [new_bad]):
            p = b.phi(x.type)
            p.add_incoming(x, pre)
            p.add_incoming(y, last)
            out.append(p)
        return out[:-1], out[-1]

    def prefetch_rows(self, f, rows=1):
        """Prefetch hints for frames ``f + _PREFETCH_FRAMES`` onwards (``rows`` of them): their rows of ``L`` for
        reading, of ``q`` and ``qd`` for writing, one per 64-byte line from the first row's start (the rows are
        contiguous, so the lines of consecutive frames cover the arrays; a hint past an array's end is dropped by
        the CPU, never faults)."""
        ir, b, B, spec = self.ir, self.b, self.B, self.spec
        i8p, i32 = self.I8.as_pointer(), ir.IntType(32)
        name = "llvm.prefetch.p0" if _opaque_pointers() else "llvm.prefetch.p0i8"
        fn = self.mod.globals.get(name) or ir.Function(
            self.mod, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name=name
        )
        ahead = b.add(f, B.i64(_PREFETCH_FRAMES))
        size = 4 if B.f32 else 8
        for base, width, write in (
            (self.pL, spec["num_bodies"] * 4, 0),
            (self.pq, spec["nq"], 1),
            (self.pqd, spec["nv"], 1),
        ):
            row = b.bitcast(b.gep(base, [b.mul(ahead, B.i64(width))]), i8p)
            for line in range(-(-rows * width * size // 64)):
                args = [
                    b.gep(row, [B.i64(64 * line)]),
                    ir.Constant(i32, write),
                    ir.Constant(i32, 3),
                    ir.Constant(i32, 1),
                ]
                b.call(fn, args)

    def _loop(self, name, init, bad_in, body, start, end, prefetch=False, step=1):
        b, B = self.b, self.B
        pre = b.block
        head = self.fn.append_basic_block(f"{name}_loop")
        b.branch(head)
        b.position_at_end(head)
        f, bad = b.phi(self.I64, "f"), b.phi(self.I64, "bad")
        f.add_incoming(start, pre)
        bad.add_incoming(bad_in, pre)
        cur = [b.phi(x.type) for x in init]
        for p, x in zip(cur, init):
            p.add_incoming(x, pre)
        self.frame = f
        self.fresh = b.icmp_signed("==", f, B.i64(0))
        self.write_qd = b.icmp_signed(">=", f, B.i64(2))
        self.qrow = b.gep(self.pq, [b.mul(f, B.i64(self.spec["nq"]))])
        fm2 = b.select(self.write_qd, b.sub(f, B.i64(2)), f)  # row t - 2 (read only from frame 2 on)
        self.qrow2 = b.gep(self.pq, [b.mul(fm2, B.i64(self.spec["nq"]))])
        self.qdrow = b.gep(self.pqd, [b.mul(b.add(fm2, B.i64(1)), B.i64(self.spec["nv"]))])
        self.lrow = b.gep(self.pL, [b.mul(f, B.i64(self.spec["num_bodies"] * 4))])
        if prefetch:
            self.prefetch_rows(f, step)
        nxt, flags, store_rates = body(cur)
        with b.if_then(self.write_qd):
            store_rates()
        f1 = b.add(f, B.i64(step))
        new_bad = b.or_(bad, flags)
        tail = b.block
        f.add_incoming(f1, tail)
        bad.add_incoming(new_bad, tail)
        for p, x in zip(cur, nxt):
            p.add_incoming(x, tail)
        after = self.fn.append_basic_block(f"{name}_done")
        b.cbranch(b.icmp_signed("<", f1, end), head, after)
        b.position_at_end(after)
        return nxt, new_bad

    def branch0(self, ch, cur):
        """Branch-0 angles, cost difference, crossing flag, ``alpha`` and the bad flags of this frame."""
        b, B, ir, spec = self.b, self.B, self.ir, self.spec
        m, phi = len(ch), spec["phi"]
        if self.mode == 0:
            E = B  # float32 input: the angles in float32 arithmetic (8 lanes are half the work of doubles)
            quats = self.pair_quats(ch) if self.pair else E.load_quats(self.lrow, [spec["bodies"][j] for j in ch])
            raw, middle, norm2 = E.euler(quats, spec["order"], spec["signs"])
            lock = b.or_(
                b.fcmp_unordered("<", middle, E.splat(_LOCK_MARGIN)),
                b.fcmp_unordered(">", middle, E.splat(math.pi - _LOCK_MARGIN)),
            )
            flags = self.any_lane(b.or_(lock, b.fcmp_ordered("==", norm2, E.splat(0.0))))
            prev = cur[:3]
            if self.pair:  # frame f + 1 pairs with frame f
                alpha = self.tait_bryan_alpha(raw[1]) if self.tait_bryan else B.alpha(raw[1], phi)
                prev = [self.before(cur[0], raw[0]), self.before(cur[1], alpha), self.before(cur[2], raw[2])]
            if self.tait_bryan:
                dc, cr, alpha = self.branch_tests(raw, prev)
            else:
                dc = B.widen(B.narrow(B.cost_difference(*raw, phi, float(spec["weight"]))))  # as numpy stores it
                cr, alpha = B.pairing(*raw, prev, phi)
            if not self.pair:  # (two frames per vector start at frame 2)
                cr = b.select(self.fresh, ir.Constant(self.I1V, [0] * self.W), cr)
        else:
            krow = b.mul(self.frame, B.i64(len(spec["bodies"])))
            raw = B.load_angles(self.qrow, [spec["qcols"][j] for j in ch])
            dc = B.widen(self.padded_load(b.gep(self.pdc, [krow]), ch[0], m, self.T))
            marks = self.padded_load(b.gep(self.pcr, [krow]), ch[0], m, self.I8)
            cr = b.icmp_unsigned("!=", marks, ir.Constant(self.I8V, [0] * self.W))
            alpha = B.alpha(raw[1], phi)
            flags = B.i64(0)
        return raw, dc, cr, alpha, flags

    @property
    def tait_bryan(self) -> bool:
        """Distinct axes (``phi = pi/2``): the kernel's own middle angle is within ``pi/2 - 1e-3`` of 0."""
        return not _euler_plan(self.spec["order"])[4] and self.spec["phi"] == 0.5 * math.pi

    def tait_bryan_alpha(self, t2):
        """``alpha`` of a Tait-Bryan middle angle away from gimbal lock: ``|wrap(t2 - pi/2)| = pi/2 - t2``."""
        return self.b.fsub(self.B.splat(0.5 * math.pi), t2)

    def branch_tests(self, raw, cur):
        """:meth:`_Builder.cost_difference` and :meth:`_Builder.pairing` of Tait-Bryan angles away from gimbal
        lock (``|t2| < pi/2 - 1e-3``, else the block is redone): ``|wrap(pi - t2)| = pi - |t2|``, ``alpha =
        |wrap(t2 - pi/2)| = pi/2 - t2``, the wrapped steps of the outer angles ``min(|d|, 2 pi - |d|)`` (``|d| <=
        2 pi``); the crossing test proper only when some lane steps more than 1.5 rad (its right-hand side is at
        least ``pi - pi^2 / (2 pi) = pi/2`` there)."""
        b, B, sp = self.b, self.B, self.B.splat
        t1, t2, t3 = raw
        fabs = B.fabs
        a1, a2, a3 = (B.call(fabs, x) for x in raw)
        dc = b.fmul(
            b.fadd(b.fmul(b.fadd(b.fadd(a1, a3), a2), sp(-2.0), flags=_FMA), sp(3.0 * math.pi), flags=_FMA),
            sp(self.spec["weight"]),
        )
        alpha = self.tait_bryan_alpha(t2)
        two_pi = sp(2.0 * math.pi)

        def step(x, p):
            d = B.call(fabs, b.fsub(x, p))
            return B.fmin(d, b.fsub(two_pi, d))

        d13 = b.fadd(step(t1, cur[0]), step(t3, cur[2]))
        far = self.any_lane(b.fcmp_ordered(">", d13, sp(1.5)))
        none = self.ir.Constant(self.I1V, [0] * self.W)
        (cr,) = self.either(far, lambda: [self._cross(d13, alpha, cur[1])], lambda: [none])
        return dc, cr, alpha

    def _cross(self, d13, alpha, alpha_prev):
        b, sp = self.b, self.B.splat
        da = b.fsub(alpha, alpha_prev)
        ga = b.fadd(alpha, alpha_prev)
        ga = self.B.fmin(ga, b.fsub(sp(2.0 * math.pi), ga))
        rhs = b.fadd(b.fmul(b.fsub(b.fmul(ga, ga), b.fmul(da, da)), sp(0.5 / math.pi)), sp(math.pi))
        return b.fcmp_ordered(">", d13, rhs)

    def chunk(self, ch, cur, flip):
        """Frame ``f`` of one chunk of bodies (up to 16 lanes)."""
        b, B, sp, spec = self.b, self.B, self.B.splat, self.spec
        raw, dc, cr, alpha, flags = self.branch0(ch, cur)
        last = self.later(cur[3]) if self.pair else cur[3]
        flips = b.xor(cr, self.carry_up(cr)) if self.pair else cr  # frame f's crossing flips frame f + 1's too
        par = b.select(flips, b.fsub(sp(1.0), last), last)
        on_track1 = b.fcmp_ordered("==", par, sp(1.0))
        dcd = b.fpext(dc, self.Dv.V) if B.single else dc  # the sum in float64 (1M frames)
        # sum of dc on track 0 less the sum on track 1: negative when the track that starts on branch 1 is cheaper
        diff = b.fadd(cur[4], b.select(on_track1, b.fsub(self.Dv.splat(0.0), dcd), dcd))
        other = b.xor(on_track1, flip)  # this frame takes branch 1
        nxt = [None] * self.nvec
        nxt[:5] = [raw[0], alpha, raw[2], par, diff]
        g = [{name: cur[self.hslot(name, h)] for name in _HINGE_SLOTS} for h in range(3)]
        t = self.chosen(ch, raw, other)
        if self.pair:
            for h in range(3):
                g[h]["prev"], g[h]["turns"] = self.before(g[h]["prev"], t[h]), self.later(g[h]["turns"])
        placed = self.place_all(ch, t, g)
        for h in range(3):
            turns, qv, count = placed[h]
            upd = {"prev": t[h], "turns": turns, "min": B.fmin(qv, g[h]["min"]), "max": B.fmax(qv, g[h]["max"])}
            upd["count"] = count  # (the state starts at +inf / -inf; a NaN qv leaves min and max)
            for name, x in upd.items():
                nxt[self.hslot(name, h)] = x
        placed = [x[1] for x in placed]
        nonfinite = cur[_NONFINITE_SLOT]
        if self.mode == 1:  # numpy's angles may be NaN (NaN input); the kernel's own never are (gimbal test)
            bad = self.finite(placed[0], B)
            bad = b.not_(b.and_(b.and_(bad, self.finite(placed[1], B)), self.finite(placed[2], B)))
            nonfinite = b.select(bad, sp(1.0), nonfinite)
        nxt[_NONFINITE_SLOT] = nonfinite
        cols = [spec["qcols"][j] for j in ch]
        vcols = [spec["vcols"][j] for j in ch]
        self.store_rows(self.qrow, spec["nq"], cols, placed)

        def store_rates():  # (q[t] - q[t-2]) / (2 dt) into row t - 1
            back = self.load_rows(self.qrow2, spec["nq"], cols)
            rates = [b.fmul(b.fsub(x, y), self.inv2dt_v) for x, y in zip(placed, back)]
            self.store_rows(self.qdrow, spec["nv"], vcols, rates)

        return nxt, flags, store_rates

    def chosen(self, ch, raw, other):
        """The chosen branch of each hinge: branch 0 ``raw``, branch 1 where ``other`` (outer angles ``t - pi
        sign(t)``, the middle one ``wrap(2 phi - t)`` in ``(-pi, pi]``); computed only when a lane takes it."""
        b, B, sp = self.b, self.B, self.B.splat
        two_pi = 2.0 * math.pi

        def alts():
            out = []
            for h in range(3):
                t = raw[h]
                if h == 1:
                    y = B.wrap(b.fsub(sp(2.0 * self.spec["phi"]), t))
                    y = b.select(b.fcmp_ordered(">", y, sp(math.pi)), b.fsub(y, sp(two_pi)), y)
                    alt = b.select(b.fcmp_ordered("<=", y, sp(-math.pi)), b.fadd(y, sp(two_pi)), y)
                else:
                    alt = b.fsub(t, B.call(self.copysign, sp(math.pi), t))
                out.append(b.select(other, alt, t))
            return out

        return self.either(self.any_lane(other), alts, lambda: list(raw))

    def either(self, cond_i64, then_fn, else_fn):
        """Values of ``then_fn()`` where ``cond_i64 != 0`` else of ``else_fn()`` (a branch: one side runs)."""
        b = self.b
        yes, no, join = (self.fn.append_basic_block(x) for x in ("yes", "no", "join"))
        b.cbranch(b.icmp_unsigned("!=", cond_i64, self.B.i64(0)), yes, no)
        b.position_at_end(yes)
        a = then_fn()
        ya = b.block
        b.branch(join)
        b.position_at_end(no)
        c = else_fn()
        na = b.block
        b.branch(join)
        b.position_at_end(join)
        out = []
        for x, y in zip(a, c):
            p = b.phi(x.type)
            p.add_incoming(x, ya)
            p.add_incoming(y, na)
            out.append(p)
        return out

    def place_all(self, ch, t, g):
        """``[(turns, placed value, count)]`` of the three hinges: ``t`` unwrapped against the frame before, plus
        ``ref``, rounded to the stored dtype (float32 arithmetic: ``t + (ref - 2 pi turns)`` in float64 rounded
        once), and the count of frames beyond the limits by more than ``1e-6``. With float32 arithmetic, when no
        lane has turned so far and no lane steps by 3 rad or more (no turn now: ``rint(step / 2 pi) = 0``), the
        value is ``t + ref`` in float32 (``ref`` a float32: the same value) and, where ``[-pi, pi] + ref`` lies
        within the limits, the count is unchanged. Two frames per vector: frame ``f``'s turn adds to frame
        ``f + 1``'s turns (:meth:`carry_up`)."""
        b, B, sp, spec = self.b, self.B, self.B.splat, self.spec
        two_pi = 2.0 * math.pi
        Dv = self.Dv

        def limit_count(h, qv):  # frames beyond the limits by more than 1e-6 (the largest violation: min, max)
            lo = self.lane_consts(ch, spec["limits"], h, 0, offset=-_OVER_TOL, rounding=1)
            hi = self.lane_consts(ch, spec["limits"], h, 1, offset=_OVER_TOL, rounding=-1)
            beyond = b.or_(b.fcmp_ordered("<", qv, lo), b.fcmp_ordered(">", qv, hi))
            return b.sub(g[h]["count"], b.sext(beyond, self.I32V))  # true is -1

        def wide():
            out = []
            for h in range(3):
                # t is in [-pi, pi] and prev starts at 0: the first frame's jump is rint(<= 1/2) = 0 without a test
                jump = B.call(B.rint, b.fmul(b.fsub(t[h], g[h]["prev"]), sp(1.0 / two_pi)))
                turns = b.fadd(g[h]["turns"], b.fadd(jump, self.carry_up(jump)) if self.pair else jump)
                ref = self.lane_consts(ch, spec["refs"], h, builder=Dv)
                if B.single:  # t + ref - 2 pi turns in float64, rounded once (as the float64 mapping rounds it)
                    off = b.fsub(ref, b.fmul(b.fpext(turns, Dv.V), Dv.splat(two_pi)))
                    qv = b.fptrunc(b.fadd(b.fpext(t[h], Dv.V), off), B.V)
                else:
                    qv = B.widen(B.narrow(b.fadd(t[h], b.fsub(ref, b.fmul(turns, sp(two_pi))))))
                out += [turns, qv, limit_count(h, qv)]
            return out

        refs = np.asarray(spec["refs"], dtype=np.float64)[ch]
        if not (B.single and np.array_equal(refs.astype(np.float32).astype(np.float64), refs)):
            out = wide()
            return [out[3 * h : 3 * h + 3] for h in range(3)]
        # the count is unchanged where every t + ref (|t| <= float32(pi)) lies within the thresholds it is compared to
        lo = [self.lane_values(ch, spec["limits"], h, 0, offset=-_OVER_TOL, single=True, rounding=1) for h in range(3)]
        hi = [self.lane_values(ch, spec["limits"], h, 1, offset=_OVER_TOL, single=True, rounding=-1) for h in range(3)]
        top = np.float32(math.pi)
        lanes = self.lane_bodies(ch)
        r32 = np.asarray(spec["refs"], dtype=np.float64)[lanes].astype(np.float32).T  # [3, W]
        inside = [
            bool(np.all(np.float32(lo[h]) <= -top + r32[h]) and np.all(np.float32(hi[h]) >= top + r32[h]))
            for h in range(3)
        ]

        def narrow():
            out = []
            for h in range(3):
                ref = self.lane_consts(ch, spec["refs"], h)
                qv = t[h] if not refs[:, h].any() else b.fadd(t[h], ref)
                out += [g[h]["turns"], qv, g[h]["count"] if inside[h] else limit_count(h, qv)]
            return out

        zero = sp(0.0)
        need = None
        for h in range(3):
            far = b.fcmp_unordered(">=", B.call(B.fabs, b.fsub(t[h], g[h]["prev"])), sp(3.0))
            x = b.or_(far, b.fcmp_unordered("!=", g[h]["turns"], zero))
            need = x if need is None else b.or_(need, x)
        out = self.either(self.any_lane(need), wide, narrow)
        return [out[3 * h : 3 * h + 3] for h in range(3)]

    def root(self, r):
        """Frame ``f`` of the free root: translation, sign-continuous unit quaternion (``w >= 0`` at frame 0) and
        the rates of the frame before (origin velocity, angular velocity in world)."""
        b, S, B, spec, T = self.b, self.S, self.B, self.spec, self.T
        rb, rq, rv = spec["root_body"], spec["root_q"], spec["root_v"]
        comp = [S.widen(b.load(b.gep(self.lrow, [B.i64(rb * 4 + i)]))) for i in range(4)]
        n2 = _sum_sq(b, comp)
        flags = b.zext(b.fcmp_ordered("==", n2, S.splat(0.0)), self.I64)
        inv = b.fdiv(S.splat(1.0), S.call(S.sqrt, n2))
        qn = [b.fmul(x, inv) for x in comp]
        dot = b.fadd(b.fadd(b.fmul(qn[0], r[0]), b.fmul(qn[1], r[1])), b.fadd(b.fmul(qn[2], r[2]), b.fmul(qn[3], r[3])))
        sgn = b.select(b.fcmp_ordered("<", dot, S.splat(0.0)), b.fsub(S.splat(0.0), r[4]), r[4])
        start = b.select(b.fcmp_ordered("<", qn[0], S.splat(0.0)), S.splat(-1.0), S.splat(1.0))
        sgn = b.select(self.fresh, start, sgn)
        bad = b.not_(self.finite(n2, S))
        Q, P = [], []
        for i in range(4):
            x = b.fmul(qn[i], sgn)
            xt = b.fptrunc(x, T) if B.f32 else x
            b.store(xt, b.gep(self.qrow, [B.i64(rq + 3 + i)]))
            Q.append(S.widen(xt))
        rrow = b.gep(self.prt, [b.mul(self.frame, self.rts)])
        for i in range(3):
            x = b.load(b.gep(rrow, [B.i64(i)]))
            b.store(x, b.gep(self.qrow, [B.i64(rq + i)]))
            P.append(S.widen(x))
            bad = b.or_(bad, b.not_(self.finite(P[-1], S)))
        nonfinite = b.select(bad, S.splat(1.0), r[5])

        def store_rates():
            back = [S.widen(b.load(b.gep(self.qrow2, [B.i64(rq + i)]))) for i in range(7)]
            lin = [b.fmul(b.fsub(P[i], back[i]), self.inv2dt) for i in range(3)]
            ang = _rotvec_rate(b, S, Q, back[3:], self.inv2dt)
            for i, x in enumerate(lin + ang):
                b.store(b.fptrunc(x, T) if B.f32 else x, b.gep(self.qdrow, [B.i64(rv + i)]))

        return qn + [sgn, nonfinite], flags, store_rates


@functools.cache
def _opaque_pointers() -> bool:
    """Whether llvmlite's LLVM takes opaque pointers (LLVM 17 and later): intrinsics over pointers are then named
    ``.p0``, not ``.p0i8``."""
    from llvmlite import binding

    return binding.llvm_version_info[0] >= 17


def _zero_vector(ty):
    """The constant zero of vector type ``ty`` (integer or floating elements)."""
    from llvmlite import ir

    zero = 0 if isinstance(ty.element, ir.IntType) else 0.0
    return ir.Constant(ty, [zero] * ty.count)


def _lanes_of_rows(b, B, base, stride, col, first, count, ty):
    """``<count x double>`` of ``base[(first + j) * stride + col]`` for lanes ``j`` (widened from ``ty``)."""
    v = B.ir.Constant(B.V, B.ir.Undefined)
    for j in range(count):
        x = b.load(b.gep(base, [b.add(b.mul(b.add(first, B.i64(j)), stride), B.i64(col))]))
        v = b.insert_element(v, b.fpext(x, B.D) if isinstance(ty, B.ir.FloatType) else x, B.i64(j))
    return v


def _sum_sq(b, xs):
    out = b.fmul(xs[0], xs[0])
    for x in xs[1:]:
        out = b.fadd(out, b.fmul(x, x))
    return out


def _root_vector_frames(em, r, bad_in, start, end):
    """The root of frames ``start .. end - 1`` (``start >= 2``, a multiple of 8 frames), 8 frames per
    ``<8 x double>`` (see :meth:`_FusedEmitter.root`): the sign continuity as a prefix product of the signs of
    consecutive dot products, the rates of frame ``t - 1`` from frame ``t - 2`` two lanes back; the quaternions
    read as one 4-vector per frame and ``q``/``qd`` written as two overlapping 4-vectors per row (transposed in
    registers)."""
    ir, b, T, spec = em.ir, em.b, em.T, em.spec
    V8 = _Builder(ir, em.mod, b, T, 8)
    I64 = em.I64
    rb, rq, rv, nq, nv = spec["root_body"], spec["root_q"], spec["root_v"], spec["nq"], spec["nv"]
    nq64, nv64, nl64 = V8.i64(nq), V8.i64(nv), V8.i64(spec["num_bodies"] * 4)
    pre = b.block
    undef = ir.Constant(V8.V, ir.Undefined)
    # carried: qn of the frame before and its sign in lane 7, the stored Q and P of frames t-2, t-1 in lanes 6, 7
    qn0 = [b.insert_element(undef, r[i], V8.i64(7)) for i in range(4)]
    sg0 = b.insert_element(undef, r[4], V8.i64(7))
    back = b.sub(start, V8.i64(2))
    stored0 = []
    for i in range(7):
        two = _lanes_of_rows(b, V8, em.pq, nq64, rq + i, back, 2, T)
        stored0.append(b.shuffle_vector(undef, two, V8.mask([0] * 6 + [8, 9])))
    head = em.fn.append_basic_block("root_vec_loop")
    b.branch(head)
    b.position_at_end(head)
    f, bad, nonfinite = b.phi(I64), b.phi(I64), b.phi(V8.D)
    qn_prev, sg_prev, st_prev = [b.phi(V8.V) for _ in range(4)], b.phi(V8.V), [b.phi(V8.V) for _ in range(7)]
    for p, x in zip([f, bad, nonfinite, *qn_prev, sg_prev, *st_prev], [start, bad_in, r[5], *qn0, sg0, *stored0]):
        p.add_incoming(x, pre)
    TV = ir.VectorType(T, 8)
    # the 8 frames' root quaternions: one 4-vector load per frame, transposed to 4 vectors of 8 frames
    rows = [_vec_at(b, em.pL, b.add(b.mul(b.add(f, V8.i64(j)), nl64), V8.i64(rb * 4)), 4) for j in range(8)]
    comp = [b.fpext(x, V8.V) if em.B.f32 else x for x in _transpose(b, V8, rows, 4)]
    n2 = _sum_sq(b, comp)
    zero = b.fcmp_ordered("==", n2, V8.splat(0.0))
    flags = em.zext_any(zero)
    inv = b.fdiv(V8.splat(1.0), V8.call(V8.sqrt, n2))
    qn = [b.fmul(x, inv) for x in comp]
    shift1 = V8.mask([7] + list(range(8, 15)))  # lane j: frame f + j - 1
    dot = _sum_sq_pairs(b, [b.shuffle_vector(p, x, shift1) for p, x in zip(qn_prev, qn)], qn)
    sg = b.select(b.fcmp_ordered("<", dot, V8.splat(0.0)), V8.splat(-1.0), V8.splat(1.0))
    for k in (1, 2, 4):  # prefix product over the lanes
        sg = b.fmul(sg, b.shuffle_vector(V8.splat(1.0), sg, V8.mask([0] * k + list(range(8, 16 - k)))))
    sg = b.fmul(sg, b.shuffle_vector(sg_prev, sg_prev, V8.mask([7] * 8)))
    bad_v = b.not_(em.finite(n2, V8))
    Q, P, Qt, Pt = [], [], [], []
    for i in range(4):
        x = b.fmul(qn[i], sg)
        Qt.append(b.fptrunc(x, TV) if em.B.f32 else x)
        Q.append(b.fpext(Qt[-1], V8.V) if em.B.f32 else Qt[-1])
    for i in range(3):
        v = ir.Constant(TV, ir.Undefined)
        for j in range(8):
            fj = b.add(f, V8.i64(j))
            v = b.insert_element(v, b.load(b.gep(em.prt, [b.add(b.mul(fj, em.rts), V8.i64(i))])), V8.i64(j))
        Pt.append(v)
        P.append(b.fpext(v, V8.V) if em.B.f32 else v)
        bad_v = b.or_(bad_v, b.not_(em.finite(P[-1], V8)))
    # q[f + j, rq .. rq + 7] as two 4-vectors per frame, overlapping in column rq + 3 (the same value)
    _store_rows(b, V8, em.pq, f, 0, nq64, rq, _transpose(b, V8, Pt + Qt[:1], 8))
    _store_rows(b, V8, em.pq, f, 0, nq64, rq + 3, _transpose(b, V8, Qt, 8))
    nonfinite_next = b.select(b.icmp_unsigned("!=", em.zext_any(bad_v), V8.i64(0)), ir.Constant(V8.D, 1.0), nonfinite)
    shift2 = V8.mask([6, 7] + list(range(8, 14)))  # lane j: frame f + j - 2
    stored = P + Q
    back = [b.shuffle_vector(p, x, shift2) for p, x in zip(st_prev, stored)]
    inv2dt = b.shuffle_vector(b.insert_element(undef, em.inv2dt, V8.i64(0)), undef, V8.mask([0] * 8))
    lin = [b.fmul(b.fsub(P[i], back[i]), inv2dt) for i in range(3)]
    ang = _rotvec_rate(b, V8, Q, back[3:], inv2dt)
    rates = [b.fptrunc(x, TV) if em.B.f32 else x for x in lin + ang]
    # qd[f + j - 1, rv .. rv + 6] as two 4-vectors per frame, overlapping in column rv + 2
    _store_rows(b, V8, em.pqd, f, -1, nv64, rv, _transpose(b, V8, rates[:4], 8))
    _store_rows(b, V8, em.pqd, f, -1, nv64, rv + 2, _transpose(b, V8, rates[2:], 8))
    f8, new_bad = b.add(f, V8.i64(8)), b.or_(bad, flags)
    last = b.block
    for p, x in zip([f, bad, nonfinite, *qn_prev, sg_prev, *st_prev], [f8, new_bad, nonfinite_next, *qn, sg, *stored]):
        p.add_incoming(x, last)
    after = em.fn.append_basic_block("root_vec_done")
    b.cbranch(b.icmp_signed("<", f8, end), head, after)
    b.position_at_end(after)
    out = [b.extract_element(x, V8.i64(7)) for x in qn] + [b.extract_element(sg, V8.i64(7)), nonfinite_next]
    return out, new_bad


def _vec_at(b, base, index, count):
    """``<count x T>`` at element ``index`` (an i64 value) of ``base`` (``T*``)."""
    from llvmlite import ir

    elem = base.type.pointee
    ptr = b.bitcast(b.gep(base, [index]), ir.VectorType(elem, count).as_pointer())
    return b.load(ptr, align=_elem_bytes(elem))


def _elem_bytes(elem) -> int:
    from llvmlite import ir

    return 4 if isinstance(elem, ir.FloatType) else 8


def _transpose(b, B, vecs, n):
    """``[k]`` vectors of ``n`` lanes -> ``[n]`` vectors of ``k`` lanes (``out[j][i] = vecs[i][j]``; ``k`` a power
    of 2): one long vector by pairwise concatenation, then one shuffle per output."""
    k = len(vecs)
    parts = list(vecs)
    while len(parts) > 1:
        w = parts[0].type.count
        parts = [b.shuffle_vector(x, y, B.mask(range(2 * w))) for x, y in zip(parts[::2], parts[1::2])]
    whole = parts[0]
    return [b.shuffle_vector(whole, whole, B.mask([i * n + j for i in range(k)])) for j in range(n)]


def _store_rows(b, B, base, f, delta, stride, col, rows):
    """``rows[j]`` at row ``f + j + delta`` (``stride`` elements apart), column ``col`` of ``base``."""
    for j, r in enumerate(rows):
        idx = b.add(b.mul(b.add(f, B.i64(j + delta)), stride), B.i64(col))
        ptr = b.bitcast(b.gep(base, [idx]), r.type.as_pointer())
        b.store(r, ptr, align=_elem_bytes(r.type.element))


def _sum_sq_pairs(b, xs, ys):
    out = b.fmul(xs[0], ys[0])
    for x, y in zip(xs[1:], ys[1:]):
        out = b.fadd(out, b.fmul(x, y))
    return out


def _rotvec_rate(b, S, Q, Q2, inv2dt):
    """``quat_to_rotvec(Q Q2^-1) * inv2dt`` in scalars (:func:`~kangengine.rotations.quat_to_rotvec`: the shortest
    rotation, the series of ``2 atan(r) / n`` below the small-angle bound)."""
    aw, ax, ay, az = Q
    cw, cx, cy, cz = Q2[0], b.fsub(S.splat(0.0), Q2[1]), b.fsub(S.splat(0.0), Q2[2]), b.fsub(S.splat(0.0), Q2[3])

    def comb(*terms):  # sum of +-products
        out = None
        for sign, x, y in terms:
            t = b.fmul(x, y)
            out = t if out is None else (b.fadd(out, t) if sign > 0 else b.fsub(out, t))
        return out

    rw = comb((1, aw, cw), (-1, ax, cx), (-1, ay, cy), (-1, az, cz))
    rx = comb((1, aw, cx), (1, ax, cw), (1, ay, cz), (-1, az, cy))
    ry = comb((1, aw, cy), (-1, ax, cz), (1, ay, cw), (1, az, cx))
    rz = comb((1, aw, cz), (1, ax, cy), (-1, ay, cx), (1, az, cw))
    flip = b.fcmp_ordered("<", rw, S.splat(0.0))
    rw, rx, ry, rz = (b.select(flip, b.fsub(S.splat(0.0), v), v) for v in (rw, rx, ry, rz))
    n2 = b.fadd(b.fadd(b.fmul(rx, rx), b.fmul(ry, ry)), b.fmul(rz, rz))
    small_angle = 1e-3  # rotations._SMALL_ANGLE
    small = b.fcmp_ordered("<", n2, b.fmul(S.splat(small_angle**2), b.fmul(rw, rw)))
    n = S.call(S.sqrt, b.select(small, S.splat(1.0), n2))
    safe_w = b.select(small, rw, S.splat(1.0))
    r2 = b.fdiv(n2, b.fmul(safe_w, safe_w))
    series = b.fadd(b.fsub(S.splat(1.0), b.fmul(r2, S.splat(1.0 / 3.0))), b.fmul(b.fmul(r2, r2), S.splat(0.2)))
    series = b.fmul(b.fdiv(S.splat(2.0), safe_w), series)
    exact = b.fdiv(b.fmul(S.splat(2.0), S.atan2(n, rw)), n)
    scale = b.fmul(b.select(small, series, exact), inv2dt)
    return [b.fmul(v, scale) for v in (rx, ry, rz)]


class FusedKernel:
    """The compiled :func:`fused_ir` pair (:meth:`bind` checks the arrays and returns the runner) and readers of
    the state (:meth:`body`, :meth:`hinge`, :meth:`nonfinite`)."""

    def __init__(self, engine, addresses, dtype, num_bodies: int, k: int, nq: int, nv: int):
        self._engine = engine
        self.dtype, self.num_bodies, self.k, self.nq, self.nv = np.dtype(dtype), num_bodies, k, nq, nv
        self.from_cache = False
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        proto = ctypes.CFUNCTYPE(i64, vp, vp, i64, vp, vp, vp, vp, vp, vp, i64, i64, ctypes.c_double)
        self._fns = [proto(a) for a in addresses]
        self._w = _fused_lanes(dtype)
        self._nch = -(-k // self._w)

    def new_state(self) -> np.ndarray:
        """The state ``[size] float64`` for a pass from frame 0 (zeros; min +inf, max -inf)."""
        state = np.zeros(_fused_state_size(self.k, self._w))
        for name, v in (("min", np.inf), ("max", -np.inf)):
            for h in range(3):
                r = len(_BODY_SLOTS) + 3 * _HINGE_SLOTS.index(name) + h
                state[r * self._nch * self._w : (r + 1) * self._nch * self._w] = v
        return state

    def _row(self, state, r: int) -> np.ndarray:
        n = self._nch * self._w
        return state[r * n : (r + 1) * n][: self.k]

    def body(self, state, name: str) -> np.ndarray:
        """``[k]`` float64 per body: ``t1``, ``alpha``, ``t3`` (branch 0 of the last frame), ``parity``, ``diff``
        (the sum of the branch cost differences where the parity is 0 less their sum where it is 1: negative when
        the track that starts on branch 1 is the cheaper one)."""
        r = _BODY_SLOTS.index(name)
        return self._row(state, r)

    def hinge(self, state, name: str) -> np.ndarray:
        """``[k, 3]`` float64 per body and hinge: ``min``, ``max``, ``count`` (frames beyond the limits by more than
        ``1e-6``), ``turns``, ``prev`` (see :func:`fused_ir`)."""
        rows = [len(_BODY_SLOTS) + 3 * _HINGE_SLOTS.index(name) + h for h in range(3)]
        return np.stack([self._row(state, r) for r in rows], axis=-1)

    def nonfinite(self, state) -> bool:
        """Whether a written q value was NaN or infinite (the root's included)."""
        r = _NONFINITE_SLOT
        root = (_NONFINITE_SLOT + 1) * self._nch * self._w
        return bool(self._row(state, r).any() or state[root + _ROOT_SLOTS - 1])

    def bind(self, L, root, q, qd, flip, state, fps: float, dc=None, cr=None):
        """Check the arrays once and return ``run(s, e, mode) -> int`` over frames ``s .. e - 1`` (``0 <= s < e <=
        N``): ``L [N, num_bodies, 4]``, ``root [N, 3]`` (rows of contiguous values) into ``q [N, nq]`` and ``qd [N,
        nv]`` (C-contiguous; all the kernel's dtype), ``flip [k] bool``, ``state`` (:meth:`new_state`, in/out);
        mode 1 reads the branch-0 angles from q and ``dc [N, k]`` (dtype), ``cr [N, k] bool`` (C-contiguous).
        ``run`` returns the count of pairs near gimbal lock or zero (mode 0; the state is then untouched). ``run``
        holds references to the arrays (the machine code has only their addresses), so arrays passed as
        temporaries stay alive while it does; they must not be resized."""
        N = L.shape[0]
        ok = L.flags.c_contiguous and L.dtype == self.dtype and L.shape[1:] == (self.num_bodies, 4)
        ok = ok and q.flags.c_contiguous and q.dtype == self.dtype and q.shape == (N, self.nq)
        ok = ok and qd.flags.c_contiguous and qd.dtype == self.dtype and qd.shape == (N, self.nv)
        ok = ok and root.dtype == self.dtype and root.shape == (N, 3) and root.strides[1] == root.itemsize
        ok = ok and flip.flags.c_contiguous and flip.dtype == np.bool_ and flip.shape == (self.k,)
        size = _fused_state_size(self.k, self._w)
        ok = ok and state.flags.c_contiguous and state.dtype == np.float64 and state.shape == (size,)
        has_rows = dc is not None and cr is not None
        if has_rows:
            ok = ok and dc.flags.c_contiguous and cr.flags.c_contiguous and dc.dtype == self.dtype
            ok = ok and dc.shape == (N, self.k) and cr.dtype == np.bool_ and cr.shape == (N, self.k)
        if not ok:  # the kernel reads and writes raw memory: never with the wrong layout
            raise ShapeError(
                f"got L {L.shape} {L.dtype}, root {root.shape}, q {q.shape} {q.dtype}, qd {qd.shape} {qd.dtype}; "
                f"expected C-contiguous L [N, {self.num_bodies}, 4], q [N, {self.nq}], qd [N, {self.nv}] of "
                f"{self.dtype}, root [N, 3], flip [{self.k}] bool, a new_state() state and (mode 1) dc/cr "
                f"[N, {self.k}]",
                item="FusedKernel",
            )
        arrays = (L, root, q, qd, dc, cr, flip, state)
        addr = [0 if x is None else x.__array_interface__["data"][0] for x in arrays]
        rts = root.strides[0] // root.itemsize
        inv2dt = 1.0 / (2.0 * (1.0 / float(fps)))  # as velocities: 1 / (2 dt)
        fns = self._fns

        def run(s: int, e: int, mode: int, _alive=arrays) -> int:
            if not (0 <= s < e <= N and mode in (0, 1) and (mode == 0 or has_rows)):
                raise ShapeError(f"frames {s}..{e}, mode {mode}; expected 0 <= s < e <= {N}", item="FusedKernel")
            return int(fns[mode](addr[0], addr[1], rts, *addr[2:], s, e, inv2dt))

        return run


def fused_kernel(
    dtype,
    num_bodies: int,
    bodies,
    qcols,
    vcols,
    order: str,
    signs,
    phi: float,
    weight: float,
    limits,
    refs,
    root_body: int,
    root_q: int,
    root_v: int,
    nq: int,
    nv: int,
):
    """The compiled :func:`fused_ir` pair (built once per process, kept on disk), or ``None`` (the mapper's other
    paths are used)."""
    args = (np.dtype(dtype).str, num_bodies, tuple(map(int, bodies)), _ints(qcols), _ints(vcols), order)
    args += (tuple(map(float, signs)), float(phi), float(weight), repr(np.asarray(limits, float).tolist()))
    args += (repr(np.asarray(refs, float).tolist()), root_body, root_q, root_v, nq, nv)
    key = ("fused",) + args
    with _LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        kern = None
        if _native.available():
            try:
                text = fused_ir(
                    dtype,
                    num_bodies,
                    bodies,
                    qcols,
                    vcols,
                    order,
                    signs,
                    phi,
                    weight,
                    limits,
                    refs,
                    root_body,
                    root_q,
                    root_v,
                    nq,
                    nv,
                )
                engine, address, cached = _native.compile_ir(
                    lambda: text, _native.host_key("mapper-fused 1", text), "fused0", optimize=True
                )
                kern = FusedKernel(
                    engine, (address, engine.get_function_address("fused1")), dtype, num_bodies, len(bodies), nq, nv
                )
                kern.from_cache = cached
            except Exception:  # a broken toolchain only costs the fast path
                kern = None
        _KERNELS[key] = kern
        return kern


def _ints(a):
    return tuple(tuple(map(int, row)) for row in np.asarray(a))
