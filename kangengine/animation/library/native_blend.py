"""The CPU strategy of the library's row blend: one machine-code pass per query that gathers the two stored rows,
lerps them and slerps (or nlerps) their quaternion columns straight into the output row.

:meth:`SamplingMixin._blend_rows <kangengine.animation.library.sampling.SamplingMixin._blend_rows>` computes
``out[i] = blend(table[frame0[i]], table[frame1[i]], w[i])`` for a packed table ``[F, D]``. In torch that is two
row gathers into buffers, a whole-row lerp and a slerp of the quaternion columns (weights, their expansion to four
components, a product and a sum): each step reads and writes ``[n, D]`` again. Here it is one pass: per query the
two source rows are read once, every output value is computed in registers and written once (the memory traffic
of the work itself, the floor). The code is LLVM IR built for the table's shape (width ``D``, quaternion columns,
position columns that take the loop offsets), compiled with llvmlite for this CPU and kept on disk like the
forward-kinematics kernels (:func:`kangengine.animation.kinematics.native.compile_ir`).

Per query ``i`` with ``t = w[i]`` (in ``[0, 1]``), rows ``a = table[frame0[i]]`` and ``b = table[frame1[i]]``:

* every column outside the quaternions: ``torch.lerp``'s formula, ``a + t (b - a)`` for ``t < 0.5`` else
  ``b - (b - a)(1 - t)`` (so ``t = 0`` gives ``a`` and ``t = 1`` gives ``b`` exactly), plus the query's loop
  offset ``off[i, c mod 3]`` on the position columns ``[0, P)`` when offsets are given;
* slerp: ``(cos(t h) - s cos(h) u) q0 + u q1`` with ``u = sin(t h) s / sin(h)``, ``s h`` read from the frame
  pair's row of :func:`~.sampling.pair_angle_table` (one value per quaternion); ``sin`` and ``cos`` of ``h`` and
  of ``t h`` (both in ``[0, pi/2]``) by their Taylor series to a term below the dtype's resolution there (degree
  13/14 in float32, 23/24 in float64), evaluated by Horner's rule in the argument squared;
* nlerp: the lerp, then each quaternion divided by its norm.

Queries run one after another, the columns in SIMD vectors of up to 16 values; there is no branch on the data, no
Python between queries, and every query runs the same instructions, so a result does not depend on the batch.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading

import numpy as np

from ..kinematics import native as _native

__all__ = ["BlendKernel", "LocateKernel", "blend_ir", "blend_kernel", "locate_ir", "locate_kernel"]

_CHUNK = 16  # values per SIMD vector
_TAYLOR = {np.dtype(np.float32): (7, 8), np.dtype(np.float64): (12, 13)}  # terms of sin (x, x^3..), cos (1, ..)
_AHEAD = 4  # queries between a row's prefetch and its use
_THREAD_MIN = 16384  # fewer queries run on the calling thread
_KERNELS: dict = {}
_LOCK = threading.Lock()


def _pieces(start: int, stop: int) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into ``(offset, width)`` pieces of ``_CHUNK`` values, the rest in powers of two."""
    out, c = [], start
    while c < stop:
        w = _CHUNK
        while w > stop - c:
            w //= 2
        out.append((c, w))
        c += w
    return out


def _hex(v: float) -> str:
    """An IR float literal: the hex of the double (a float constant must be exactly representable)."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(v)))[0]:016X}"


class _Emitter:
    def __init__(self, dtype: np.dtype):
        self.f32 = dtype == np.dtype(np.float32)
        self.T = "float" if self.f32 else "double"
        self.size = dtype.itemsize
        self.lines: list[str] = []
        self.count = 0

    def emit(self, rhs: str) -> str:
        self.count += 1
        name = f"%t{self.count}"
        self.lines.append(f"  {name} = {rhs}")
        return name

    def scalar(self, v: float) -> str:
        return _hex(float(np.float32(v)) if self.f32 else float(v))

    def vt(self, w: int) -> str:
        return f"<{w} x {self.T}>"

    def splat(self, v: float, w: int) -> str:
        return "<" + ", ".join([f"{self.T} {self.scalar(v)}"] * w) + ">"

    def bcast(self, x: str, w: int) -> str:
        """A scalar SSA value ``x`` in all ``w`` lanes."""
        v = self.emit(f"insertelement <1 x {self.T}> poison, {self.T} {x}, i64 0")
        return self.emit(f"shufflevector <1 x {self.T}> {v}, <1 x {self.T}> poison, <{w} x i32> zeroinitializer")

    def load(self, base: str, col: int, w: int) -> str:
        p = self.emit(f"getelementptr inbounds {self.T}, ptr {base}, i64 {col}")
        return self.emit(f"load {self.vt(w)}, ptr {p}, align {self.size}")

    def store(self, v: str, base: str, col: int, w: int) -> None:
        p = self.emit(f"getelementptr inbounds {self.T}, ptr {base}, i64 {col}")
        self.lines.append(f"  store {self.vt(w)} {v}, ptr {p}, align {self.size}")

    def shuffle(self, v: str, w_in: int, idx: list[int]) -> str:
        mask = "<" + ", ".join(f"i32 {i}" for i in idx) + ">"
        return self.emit(f"shufflevector {self.vt(w_in)} {v}, {self.vt(w_in)} poison, <{len(idx)} x i32> {mask}")


def _horner(e: _Emitter, z: str, coefs: list[float], w: int) -> str:
    V = e.vt(w)
    h = e.splat(coefs[-1], w)
    for c in reversed(coefs[:-1]):
        h = e.emit(f"fmul contract {V} {z}, {h}")
        h = e.emit(f"fadd contract {V} {h}, {e.splat(c, w)}")
    return h


def blend_ir(dtype, width: int, quat_start: int, quats: int, slerp: bool, offset_cols: int) -> str:
    """LLVM IR of ``void blend(table, pairs, frame0, frame1, w, offsets, out, n)`` for rows of ``width`` values
    with ``quats`` WXYZ quaternions from column ``quat_start``; ``offset_cols`` position columns from column 0
    take the loop offsets (0: no offsets argument is read). See the module docstring."""
    dt = np.dtype(dtype)
    e = _Emitter(dt)
    T = e.T
    k, qc, D = quats, quat_start, width
    sfx = lambda w: f"v{w}{'f32' if e.f32 else 'f64'}"  # noqa: E731 (intrinsic name suffix)
    r0, r1, o = "%row0", "%row1", "%orow"
    off4 = None
    if offset_cols:
        comps = [e.load("%offi", c, 1) for c in range(3)]
        v = f"<4 x {T}> zeroinitializer"
        for c in (0, 1, 2):
            x = e.emit(f"extractelement <1 x {T}> {comps[c]}, i64 0")
            v = e.emit(f"insertelement {v}, {T} {x}, i64 {c}")
            v = f"<4 x {T}> {v}"
        off4 = v.split()[-1]
    low = e.emit(f"fcmp olt {T} %wi, {e.scalar(0.5)}")
    omw = e.emit(f"fsub {T} {e.scalar(1.0)}, %wi")

    def lerp(c0: int, w: int) -> str:
        V = e.vt(w)
        a, b = e.load(r0, c0, w), e.load(r1, c0, w)
        d = e.emit(f"fsub {V} {b}, {a}")
        wv, omv = e.bcast("%wi", w), e.bcast(omw, w)
        lo = e.emit(f"fadd {V} {a}, {e.emit(f'fmul {V} {wv}, {d}')}")
        hi = e.emit(f"fsub {V} {b}, {e.emit(f'fmul {V} {d}, {omv}')}")
        return e.emit(f"select i1 {low}, {V} {lo}, {V} {hi}")

    for seg in ((0, qc), (qc + 4 * k, D)):
        for c0, w in _pieces(*seg):
            v = lerp(c0, w)
            if off4 is not None and c0 < offset_cols:
                idx = [(c0 + lane) % 3 if c0 + lane < offset_cols else 3 for lane in range(w)]
                v = e.emit(f"fadd {e.vt(w)} {v}, {e.shuffle(off4, 4, idx)}")
            e.store(v, o, c0, w)

    if slerp:
        ns, nc = _TAYLOR[dt]
        sin_c = [(-1) ** i / math.factorial(2 * i + 1) for i in range(ns)]
        cos_c = [(-1) ** i / math.factorial(2 * i) for i in range(nc)]
        for j0, kw in _pieces(0, k):
            V = e.vt(kw)
            hs = e.load("%prow", j0, kw)  # s h: the pair's half-angle signed for the shorter arc
            h = e.emit(f"call {V} @llvm.fabs.{sfx(kw)}({V} {hs})")
            sg = e.emit(f"call {V} @llvm.copysign.{sfx(kw)}({V} {e.splat(1.0, kw)}, {V} {hs})")
            zh = e.emit(f"fmul {V} {h}, {h}")
            sf = e.emit(f"fdiv {V} {sg}, {e.emit(f'fmul contract {V} {h}, {_horner(e, zh, sin_c, kw)}')}")
            cf = e.emit(f"fmul {V} {sg}, {_horner(e, zh, cos_c, kw)}")
            wv = e.bcast("%wi", kw)
            x = e.emit(f"fmul {V} {wv}, {h}")
            z = e.emit(f"fmul {V} {x}, {x}")
            sn = e.emit(f"fmul contract {V} {x}, {_horner(e, z, sin_c, kw)}")
            cs = _horner(e, z, cos_c, kw)
            u1 = e.emit(f"fmul {V} {sn}, {sf}")
            u0 = e.emit(f"fsub {V} {cs}, {e.emit(f'fmul {V} {cf}, {u1}')}")
            for q0, cq in _pieces(j0, j0 + kw):  # up to 4 quaternions (16 values) per vector
                if cq > 4:
                    sub = [(q0 + s, 4) for s in range(0, cq, 4)]
                else:
                    sub = [(q0, cq)]
                for qs, n4 in sub:
                    idx = [qs - j0 + lane // 4 for lane in range(4 * n4)]
                    W0, W1 = e.shuffle(u0, kw, idx), e.shuffle(u1, kw, idx)
                    VV = e.vt(4 * n4)
                    col = qc + 4 * qs
                    a, b = e.load(r0, col, 4 * n4), e.load(r1, col, 4 * n4)
                    res = e.emit(
                        f"fadd contract {VV} {e.emit(f'fmul contract {VV} {a}, {W0}')}, "
                        f"{e.emit(f'fmul contract {VV} {b}, {W1}')}"
                    )
                    e.store(res, o, col, 4 * n4)
    else:
        for c0, w in _pieces(qc, qc + 4 * k):
            V = e.vt(w)
            v = lerp(c0, w)
            sq = e.emit(f"fmul {V} {v}, {v}")
            s1 = e.emit(f"fadd {V} {sq}, {e.shuffle(sq, w, [lane ^ 1 for lane in range(w)])}")
            s2 = e.emit(f"fadd {V} {s1}, {e.shuffle(s1, w, [lane ^ 2 for lane in range(w)])}")
            nrm = e.emit(f"call {V} @llvm.sqrt.v{w}{'f32' if e.f32 else 'f64'}({V} {s2})")
            e.store(e.emit(f"fdiv {V} {v}, {nrm}"), o, c0, w)

    body = e.lines
    decls = ["declare void @llvm.prefetch.p0(ptr, i32, i32, i32)"]
    for w in (1, 2, 4, 8, 16):
        decls += [f"declare {e.vt(w)} @llvm.fabs.{sfx(w)}({e.vt(w)})"]
        decls += [f"declare {e.vt(w)} @llvm.copysign.{sfx(w)}({e.vt(w)}, {e.vt(w)})"]
    decls += sorted(
        {f"declare {e.vt(w)} @llvm.sqrt.v{w}{'f32' if e.f32 else 'f64'}({e.vt(w)})" for w in (1, 2, 4, 8, 16)}
    )
    lines = [
        *decls,
        "",
        "define void @blend(ptr noalias nocapture readonly %table, ptr noalias nocapture readonly %pairs, "
        "ptr noalias nocapture readonly %frame0, ptr noalias nocapture readonly %frame1, "
        "ptr noalias nocapture readonly %w, ptr noalias nocapture readonly %offsets, ptr noalias nocapture %out, "
        "i64 %n) nounwind {",
        "entry:",
        "  %any = icmp sgt i64 %n, 0",
        "  br i1 %any, label %row, label %exit",
        "row:",
        "  %i = phi i64 [0, %entry], [%inext, %row]",
        "  %f0p = getelementptr inbounds i64, ptr %frame0, i64 %i",
        "  %f0 = load i64, ptr %f0p, align 8",
        "  %f1p = getelementptr inbounds i64, ptr %frame1, i64 %i",
        "  %f1 = load i64, ptr %f1p, align 8",
        f"  %wp = getelementptr inbounds {T}, ptr %w, i64 %i",
        f"  %wi = load {T}, ptr %wp, align {e.size}",
        f"  %r0i = mul i64 %f0, {D}",
        f"  %row0 = getelementptr inbounds {T}, ptr %table, i64 %r0i",
        f"  %r1i = mul i64 %f1, {D}",
        f"  %row1 = getelementptr inbounds {T}, ptr %table, i64 %r1i",
        f"  %pi = mul i64 %f0, {k}",
        f"  %prow = getelementptr inbounds {T}, ptr %pairs, i64 %pi",
        f"  %oi = mul i64 %i, {D}",
        f"  %orow = getelementptr inbounds {T}, ptr %out, i64 %oi",
        "  %offk = mul i64 %i, 3",
        f"  %offi = getelementptr inbounds {T}, ptr %offsets, i64 %offk",
        *_prefetch(e, D, k if slerp else 0),
        *body,
        "  %inext = add i64 %i, 1",
        "  %done = icmp eq i64 %inext, %n",
        "  br i1 %done, label %exit, label %row",
        "exit:",
        "  ret void",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _prefetch(e: _Emitter, width: int, pair_width: int) -> list[str]:
    """IR asking for the rows of query ``i + _AHEAD`` (the last query's when past the end) to be fetched into
    the cache while query ``i`` is computed: the rows are random, so the hardware prefetcher cannot guess them."""
    T, sz = e.T, e.size
    out = [
        f"  %pfa = add i64 %i, {_AHEAD}",
        "  %pfl = add i64 %n, -1",
        "  %pfc = icmp slt i64 %pfa, %pfl",
        "  %pfi = select i1 %pfc, i64 %pfa, i64 %pfl",
    ]
    for name, base, idx, w in (("a", "%table", "%frame0", width), ("b", "%table", "%frame1", width)) + (
        (("c", "%pairs", "%frame0", pair_width),) if pair_width else ()
    ):
        out += [
            f"  %pf{name}p = getelementptr inbounds i64, ptr {idx}, i64 %pfi",
            f"  %pf{name}f = load i64, ptr %pf{name}p, align 8",
            f"  %pf{name}r = mul i64 %pf{name}f, {w}",
            f"  %pf{name}q = getelementptr inbounds {T}, ptr {base}, i64 %pf{name}r",
        ]
        for line in range(0, w * sz + 63, 64):
            out += [
                f"  %pf{name}{line} = getelementptr inbounds i8, ptr %pf{name}q, i64 {min(line, w * sz - 1)}",
                f"  call void @llvm.prefetch.p0(ptr %pf{name}{line}, i32 0, i32 3, i32 1)",
            ]
    return out


class BlendKernel:
    """A compiled :func:`blend_ir`: ``kernel(table, pairs, frame0, frame1, w, offsets, out)`` on CPU tensors.

    Args (of the call):
        table: ``[F, width]`` contiguous, the kernel's dtype; pairs: ``[F, quats]`` contiguous
            (:func:`~.sampling.pair_angle_table` of the table's quaternion columns; ignored by nlerp, pass any
            tensor); frame0, frame1: ``[n] int64`` contiguous rows of ``table`` (in range: not checked);
        w: ``[n]`` contiguous, ``t`` in ``[0, 1]``; offsets: ``[n, 3]`` contiguous (read when the kernel was
            built with offset columns; else ignored); out: ``[n, width]`` contiguous, written.
    """

    def __init__(self, engine, address: int, from_cache: bool):
        self._engine = engine  # owns the machine code
        self.from_cache = from_cache
        self._fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 7), ctypes.c_int64)(address)

    def __call__(self, table, pairs, frame0, frame1, w, offsets, out, *, threads: int = 1) -> None:
        """Blend ``n = frame0.shape[0]`` queries; with ``threads > 1`` and at least ``_THREAD_MIN`` queries, in
        ``threads`` contiguous slices on the forward-kinematics thread pool (the calls release the GIL; each
        query's result is the same either way)."""
        n = int(frame0.shape[0])
        tp, pp, f0, f1, wp, op, oo = (x.data_ptr() for x in (table, pairs, frame0, frame1, w, offsets, out))
        if threads <= 1 or n < _THREAD_MIN:
            self._fn(tp, pp, f0, f1, wp, op, oo, n)
            return
        from ..kinematics.replay import run_chunks

        sz, width = out.element_size(), out.shape[1]

        def run(s: int, e: int) -> None:
            self._fn(tp, pp, f0 + 8 * s, f1 + 8 * s, wp + sz * s, op + 3 * sz * s, oo + width * sz * s, e - s)

        run_chunks(n, run, True, -(-n // threads))


def blend_kernel(dtype, width: int, quat_start: int, quats: int, slerp: bool, offset_cols: int) -> BlendKernel | None:
    """The compiled blend for this shape (built once per process, kept on disk across processes), or ``None`` when
    llvmlite is not available here."""
    dt = np.dtype(dtype)
    key = (dt.str, int(width), int(quat_start), int(quats), bool(slerp), int(offset_cols))
    kern = _KERNELS.get(key)
    if kern is not None or key in _KERNELS:
        return kern
    with _LOCK:
        if key not in _KERNELS:
            kern = None
            if _native.available():
                text = blend_ir(dt, width, quat_start, quats, slerp, offset_cols)
                engine, address, cached = _native.compile_ir(
                    lambda: text, _native.host_key("library-blend 3", text), "blend", optimize=False
                )
                kern = BlendKernel(engine, address, cached)
            _KERNELS[key] = kern
    return _KERNELS[key]


# -- locating the frame pair of each query ------------------------------------------------------------------


def locate_ir(dtype, loop: bool) -> str:
    """LLVM IR of ``void locate(ids, id_stride, times, time_stride, clips, frames, blend, offsets, clips_count, n)``:
    per query the clip row ``clips[ids[i]]`` (``[C, 8] float64``, columns of :func:`~.columns.clip_table`), the
    looped or clamped local time, the packed frame pair (``frames[i]``, ``frames[n + i]``, int64), the blend weight
    (``blend[i]``, ``dtype``) and, with ``loop``, the loop offset ``offsets[i, :]`` (``dtype``). The float64
    operations are :meth:`~.sampling.SamplingMixin.sample`'s torch ones, in the same order (``torch.div``'s
    floor rounding included), so both strategies give the same frames, weights and offsets. Unchecked bad input
    (``check=False``) cannot make it or the blend read outside the tables: an id outside ``[0, clips_count)``
    reads clip 0, a NaN time the clip's last frame, a negative clamped time its first."""
    e = _Emitter(np.dtype(dtype))
    T = e.T
    L = [
        "declare double @llvm.floor.f64(double)",
        "declare double @llvm.fma.f64(double, double, double)",
        "declare double @llvm.minnum.f64(double, double)",
        "declare double @llvm.maxnum.f64(double, double)",
        "declare double @llvm.copysign.f64(double, double)",
        "",
        "define void @locate(ptr noalias nocapture readonly %ids, i64 %ids_stride, ptr noalias nocapture readonly "
        "%times, i64 %times_stride, ptr noalias nocapture readonly %clips, ptr noalias nocapture %frames, "
        "ptr noalias nocapture %blend, ptr noalias nocapture %offsets, i64 %nclips, i64 %n) nounwind {",
        "entry:",
        "  %any = icmp sgt i64 %n, 0",
        "  br i1 %any, label %row, label %exit",
        "row:",
        "  %i = phi i64 [0, %entry], [%inext, %tail]",
        "  %idk = mul i64 %i, %ids_stride",
        "  %idp = getelementptr inbounds i64, ptr %ids, i64 %idk",
        "  %id0 = load i64, ptr %idp, align 8",
        # memory safety with check=False: an id outside [0, clips) reads clip 0 instead of memory past the table
        "  %idbad = icmp uge i64 %id0, %nclips",
        "  %id = select i1 %idbad, i64 0, i64 %id0",
        "  %tk = mul i64 %i, %times_stride",
        "  %tp = getelementptr inbounds double, ptr %times, i64 %tk",
        "  %t = load double, ptr %tp, align 8",
        "  %cr = mul i64 %id, 8",
        "  %crow = getelementptr inbounds double, ptr %clips, i64 %cr",
    ]
    for c, name in enumerate(("fps", "dur", "period", "start", "last", "dx", "dy", "dz")):
        L += [
            f"  %c{c}p = getelementptr inbounds double, ptr %crow, i64 {c}",
            f"  %{name} = load double, ptr %c{c}p, align 8",
        ]
    if loop:  # cycles = torch.div(t, period, rounding_mode="floor"), local = t - cycles * dur
        L += [
            "  %mod = frem double %t, %period",
            "  %tm = fsub double %t, %mod",
            "  %div0 = fdiv double %tm, %period",
            "  %modnz = fcmp une double %mod, 0.0",
            "  %bneg = fcmp olt double %period, 0.0",
            "  %mneg = fcmp olt double %mod, 0.0",
            "  %sgn = xor i1 %bneg, %mneg",
            "  %adj = and i1 %modnz, %sgn",
            "  %div1 = fsub double %div0, 1.0",
            "  %div = select i1 %adj, double %div1, double %div0",
            "  %fl0 = call double @llvm.floor.f64(double %div)",
            "  %fr = fsub double %div, %fl0",
            f"  %up = fcmp ogt double %fr, {_hex(0.5)}",
            "  %fl1 = fadd double %fl0, 1.0",
            "  %fl = select i1 %up, double %fl1, double %fl0",
            "  %q = fdiv double %t, %period",
            "  %z = call double @llvm.copysign.f64(double 0.0, double %q)",
            "  %divnz = fcmp une double %div, 0.0",
            "  %cycles = select i1 %divnz, double %fl, double %z",
            "  %ncyc = fneg double %cycles",  # torch.addcmul rounds once (a fused multiply-add)
            "  %local = call double @llvm.fma.f64(double %ncyc, double %dur, double %t)",
        ]
    else:
        L += ["  %tlt = fcmp olt double %t, %dur", "  %local = select i1 %tlt, double %t, double %dur"]
    L += [
        "  %pos = fmul double %local, %fps",
        "  %pf = call double @llvm.floor.f64(double %pos)",
        "  %flt = fcmp olt double %pf, %last",
        "  %f0c = select i1 %flt, double %pf, double %last",  # NaN: the last frame
        "  %fneg = fcmp olt double %f0c, 0.0",  # a negative time unchecked (check=False): the first frame
        "  %f0 = select i1 %fneg, double 0.0, double %f0c",
        "  %bl0 = fsub double %pos, %f0",
        "  %bl1 = call double @llvm.maxnum.f64(double %bl0, double 0.0)",
        "  %bl = call double @llvm.minnum.f64(double %bl1, double 1.0)",
        "  %f0n = fadd double %f0, 1.0",
        "  %f1lt = fcmp olt double %f0n, %last",
        "  %f1 = select i1 %f1lt, double %f0n, double %last",
        "  %g0d = fadd double %f0, %start",
        "  %g1d = fadd double %f1, %start",
        "  %g0 = fptosi double %g0d to i64",
        "  %g1 = fptosi double %g1d to i64",
        "  %g0p = getelementptr inbounds i64, ptr %frames, i64 %i",
        "  store i64 %g0, ptr %g0p, align 8",
        "  %ni = add i64 %n, %i",
        "  %g1p = getelementptr inbounds i64, ptr %frames, i64 %ni",
        "  store i64 %g1, ptr %g1p, align 8",
        f"  %blt = {'fptrunc double %bl to float' if e.f32 else 'fadd double %bl, 0.0'}",
        f"  %blp = getelementptr inbounds {T}, ptr %blend, i64 %i",
        f"  store {T} %blt, ptr %blp, align {e.size}",
    ]
    if loop:
        L += ["  %o3 = mul i64 %i, 3"]
        for c, name in enumerate(("dx", "dy", "dz")):
            L += [
                f"  %od{c} = fmul double %cycles, %{name}",
                f"  %ot{c} = {f'fptrunc double %od{c} to float' if e.f32 else f'fadd double %od{c}, 0.0'}",
                f"  %oi{c} = add i64 %o3, {c}",
                f"  %op{c} = getelementptr inbounds {T}, ptr %offsets, i64 %oi{c}",
                f"  store {T} %ot{c}, ptr %op{c}, align {e.size}",
            ]
    L += [
        "  br label %tail",
        "tail:",
        "  %inext = add i64 %i, 1",
        "  %done = icmp eq i64 %inext, %n",
        "  br i1 %done, label %exit, label %row",
        "exit:",
        "  ret void",
        "}",
    ]
    return "\n".join(L) + "\n"


class LocateKernel:
    """A compiled :func:`locate_ir`: ``kernel(ids, times, clips, frames, blend, offsets)`` on CPU tensors
    (``ids [n] int64`` and ``times [n] float64`` with any stride, 0 included; ``clips [C, 8] float64``
    contiguous; outputs ``frames [2 n] int64``, ``blend [n]`` and ``offsets [n, 3]`` contiguous, written; with a
    clamping kernel ``offsets`` is not touched). Ids out of range read clip 0 (memory safety, not a check)."""

    def __init__(self, engine, address: int):
        self._engine = engine
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fn = ctypes.CFUNCTYPE(None, p, i, p, i, p, p, p, p, i, i)(address)

    def __call__(self, ids, times, clips, frames, blend, offsets) -> None:
        n = int(ids.shape[0])
        self._fn(
            ids.data_ptr(),
            ids.stride(0),
            times.data_ptr(),
            times.stride(0),
            clips.data_ptr(),
            frames.data_ptr(),
            blend.data_ptr(),
            offsets.data_ptr(),
            int(clips.shape[0]),
            n,
        )


def locate_kernel(dtype, loop: bool) -> LocateKernel | None:
    """The compiled :func:`locate_ir` for ``dtype`` and ``loop`` (cached like :func:`blend_kernel`), or ``None``
    without llvmlite."""
    key = ("locate", np.dtype(dtype).str, bool(loop))
    if key in _KERNELS:
        return _KERNELS[key]
    with _LOCK:
        if key not in _KERNELS:
            kern = None
            if _native.available():
                text = locate_ir(dtype, loop)
                engine, address, _ = _native.compile_ir(
                    lambda: text, _native.host_key("library-locate 4", text), "locate", optimize=False
                )
                kern = LocateKernel(engine, address)
            _KERNELS[key] = kern
    return _KERNELS[key]
