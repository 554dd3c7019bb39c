"""Native (LLVM) execution of the traced forward-kinematics programs of :mod:`.trace`.

This is an execution strategy, not a second implementation: the input is the straight-line program the
component algebra of :mod:`.trace` recorded once per tree (the same ops the numpy/torch replay of
:mod:`.replay` runs), and the output is a machine-code function for this CPU that evaluates it on blocks of ``W``
frames held in SIMD registers (``<W x float>`` vectors), built with llvmlite (LLVM's own optimiser and
code generator, the backend numba uses) in well under a second. Per block it

1. copies the used input columns of ``W`` frames into frame-innermost rows (a small transpose in cache),
2. evaluates the whole program on vectors (hinge half-angle sin/cos included, see below),
3. writes the results back frame-major (``[frames, ...]`` like the numpy path).

Nothing crosses into Python between blocks and the call releases the GIL (ctypes), so chunks run in
parallel on the replay's thread pool (:func:`run_kernel`). Results equal the numpy replay to rounding (the
products may be fused into FMAs); the tests compare both to MuJoCo.

**sin/cos.** ``sin`` and ``cos`` of an argument ``x`` are computed together: ``k = rint(x * 2/pi)``,
``r = x - k pi/2`` with pi/2 split into three parts (the first two with enough trailing zero bits that
``k`` times them is exact, so ``r`` is accurate to an ulp), then the Taylor series of sin and cos on
``|r| <= pi/4`` to a term below half an ulp (degree 15/16 in float64, 9/10 in float32) and the quadrant
``k mod 4`` swaps and negates. The reduction is exact for ``|k| < 2**20`` (float64) / ``2**12``
(float32); a frame with any argument beyond ``_TRIG_LIMIT`` (or NaN/inf) is flagged and the caller
recomputes those frames (only them) with numpy's sin/cos, so every input gets a correctly reduced result.

**Batch invariance.** A frame's result does not depend on the batch it is computed in: every lane of every
block (the last, partial block included) runs the one compiled ``compute`` block, lane-wise, so the same
instruction sequence (the same FMA contractions) produces every frame; and the out-of-range fallback
recomputes exactly the flagged frames, never their neighbours.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import struct
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np

from .replay import is_torch, run_chunks
from .trace import Trace

__all__ = [
    "NativeKernel",
    "available",
    "cache_dir",
    "cache_key",
    "compile_ir",
    "compile_program",
    "host_key",
    "compile_trace",
    "kernel_ir",
    "run_kernel",
]

# Frames per SIMD block: one 512-bit register (two 256-bit ones) per value.
_WIDTH = {np.dtype(np.float32): 16, np.dtype(np.float64): 8}
# |argument| above which a block's sin/cos are recomputed by numpy (the reduction is exact below).
_TRIG_LIMIT = {np.dtype(np.float32): 2.0e3, np.dtype(np.float64): 1.0e5}
# Bits of the first two parts of pi/2 (k * part is exact for |k| below 2**(mantissa - bits)).
_PIO2_BITS = {np.dtype(np.float32): 12, np.dtype(np.float64): 33}
# Taylor terms of sin (r, r^3, ...) and cos (1, r^2, ...) on |r| <= pi/4 below half an ulp.
_TAYLOR_TERMS = {np.dtype(np.float32): (5, 6), np.dtype(np.float64): (8, 9)}

_PI = "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863"

_lock = threading.Lock()
_llvm = None  # the llvmlite.binding module once initialised, False when unavailable
_host: tuple[str, str] = ("", "")  # CPU name and features the kernels are built for


def _binding():
    """llvmlite.binding with the native target initialised, or None when llvmlite is missing/broken."""
    global _llvm, _host
    if _llvm is None:
        try:
            import llvmlite.binding as llvm

            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            try:
                features = llvm.get_host_cpu_features().flatten()
            except Exception:  # some platforms cannot report features: generic code for the CPU name
                features = ""
            _host = (llvm.get_host_cpu_name(), features)
            _target_machine(llvm)
            _llvm = llvm
        except Exception:
            _llvm = False
    return _llvm or None


def _target_machine(llvm):
    # A fresh one per kernel: the execution engine takes ownership of (and frees) its target machine.
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=_host[0], features=_host[1], opt=3, jit=True)


def available() -> bool:
    """Whether native kernels can be built here (llvmlite importable, native target usable)."""
    return _binding() is not None


def _pio2_parts(bits: int) -> tuple[float, float, float]:
    """pi/2 = c1 + c2 + c3 (to ~2**-(2 bits + 53)); c1 and c2 carry ``bits`` significant bits."""
    with localcontext() as ctx:
        ctx.prec = 80
        rest = Fraction(Decimal(_PI)) / 2
    parts = []
    for _ in range(2):
        _, e = math.frexp(float(rest))
        scale = Fraction(2) ** (bits - e)
        p = Fraction(math.floor(rest * scale)) / scale
        parts.append(float(p))
        rest -= p
    parts.append(float(rest))
    return tuple(parts)


class NativeKernel:
    """A compiled program: ``kernel(inputs, outputs, n, flags) -> int``.

    ``inputs`` / ``outputs``: sequences of ``(address, frame_stride)`` (element strides between frames;
    0 broadcasts one row to every frame), one per input / output array of the program, each frame's
    columns contiguous. ``flags``: address of a ``uint8`` buffer of at least ``n + W`` bytes (``W`` =
    :attr:`width`, the kernel stores whole blocks): byte ``i`` is set to 1 when frame ``i``'s sin/cos
    arguments were out of the exact range (that frame's results must be recomputed), else 0. Returns the
    number of blocks holding such frames; when it is 0 the flags may be left unwritten.
    """

    def __init__(self, engine, address: int, n_in: int, n_out: int, dtype: np.dtype):
        self._engine = engine  # owns the machine code
        self.n_in, self.n_out, self.dtype = n_in, n_out, dtype
        self.from_cache = False  # whether the object code was loaded from the on-disk cache
        self.width = _WIDTH[np.dtype(dtype)]
        argtypes = [ctypes.c_void_p, ctypes.c_int64] * (n_in + n_out) + [ctypes.c_int64, ctypes.c_void_p]
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int64, *argtypes)(address)

    def __call__(
        self, inputs: Sequence[tuple[int, int]], outputs: Sequence[tuple[int, int]], n: int, flags: int
    ) -> int:
        args = [v for pair in inputs for v in pair] + [v for pair in outputs for v in pair]
        return int(self._fn(*args, n, flags))


class _IR:
    """LLVM IR text of one kernel: straight-line vector code over a block of ``W`` frames."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.f32 = dtype == np.dtype(np.float32)
        self.T = "float" if self.f32 else "double"
        self.W = _WIDTH[dtype]
        self.V = f"<{self.W} x {self.T}>"
        self.sfx = f"v{self.W}{'f32' if self.f32 else 'f64'}"
        self.lines: list[str] = []
        self.count = 0
        self._consts: dict[float, str] = {}

    def tmp(self) -> str:
        self.count += 1
        return f"%v{self.count}"

    def emit(self, rhs: str) -> str:
        name = self.tmp()
        self.lines.append(f"  {name} = {rhs}")
        return name

    def scalar(self, v: float) -> str:
        # IR float literals are the hex of the double; a float constant must be exactly representable.
        v = float(np.float32(v)) if self.f32 else float(v)
        return f"{self.T} 0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"

    def splat(self, v: float) -> str:
        s = self.scalar(v)
        return "<" + ", ".join([s] * self.W) + ">"

    def ivec(self, v: int) -> str:
        it = "i32" if self.f32 else "i64"
        return "<" + ", ".join([f"{it} {v}"] * self.W) + ">"


def _sincos(ir: _IR, x: str, bad: list[str]) -> tuple[str, str]:
    """Emit (cos x, sin x) for a vector value ``x``; appends the out-of-range lane mask to ``bad``."""
    V, W, dt = ir.V, ir.W, ir.dtype
    IT = "i32" if ir.f32 else "i64"
    IV = f"<{W} x {IT}>"
    c1, c2, c3 = _pio2_parts(_PIO2_BITS[dt])
    kx = ir.emit(f"fmul {V} {x}, {ir.splat(2.0 / math.pi)}")
    k = ir.emit(f"call {V} @llvm.rint.{ir.sfx}({V} {kx})")
    r = x
    for c in (c1, c2, c3):  # no fast-math flags: the order of the reduction matters
        p = ir.emit(f"fmul {V} {k}, {ir.splat(c)}")
        r = ir.emit(f"fsub {V} {r}, {p}")
    z = ir.emit(f"fmul contract {V} {r}, {r}")
    ns, nc = _TAYLOR_TERMS[dt]

    def horner(coefs):
        h = ir.splat(coefs[-1])
        for c in reversed(coefs[:-1]):
            h = ir.emit(f"fmul contract {V} {z}, {h}")
            h = ir.emit(f"fadd contract {V} {h}, {ir.splat(c)}")
        return h

    ps = ir.emit(f"fmul contract {V} {r}, {horner([(-1) ** i / math.factorial(2 * i + 1) for i in range(ns)])}")
    pc = horner([(-1) ** i / math.factorial(2 * i) for i in range(nc)])
    ki = ir.emit(f"fptosi {V} {k} to {IV}")
    odd = ir.emit(f"icmp ne {IV} {ir.emit(f'and {IV} {ki}, {ir.ivec(1)}')}, zeroinitializer")
    s0 = ir.emit(f"select <{W} x i1> {odd}, {V} {pc}, {V} {ps}")
    co = ir.emit(f"select <{W} x i1> {odd}, {V} {ps}, {V} {pc}")
    # sin x is negative for k mod 4 in {2, 3}; cos x for k mod 4 in {1, 2}
    sneg = ir.emit(f"icmp ne {IV} {ir.emit(f'and {IV} {ki}, {ir.ivec(2)}')}, zeroinitializer")
    k1 = ir.emit(f"add {IV} {ki}, {ir.ivec(1)}")
    cneg = ir.emit(f"icmp ne {IV} {ir.emit(f'and {IV} {k1}, {ir.ivec(2)}')}, zeroinitializer")
    s = ir.emit(f"select <{W} x i1> {sneg}, {V} {ir.emit(f'fneg {V} {s0}')}, {V} {s0}")
    c = ir.emit(f"select <{W} x i1> {cneg}, {V} {ir.emit(f'fneg {V} {co}')}, {V} {co}")
    ax = ir.emit(f"call {V} @llvm.fabs.{ir.sfx}({V} {x})")
    bad.append(ir.emit(f"fcmp ugt {V} {ax}, {ir.splat(_TRIG_LIMIT[dt])}"))  # unordered: NaN counts
    return c, s


_BINOPS = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}


def _transpose(ir: _IR, vecs: list[str]) -> list[str]:
    """Transpose ``W`` vectors of ``W`` lanes (``out[j][r] = vecs[r][j]``): log2(W) stages of pairwise
    shuffles, each swapping the off-diagonal blocks of the next smaller block size."""
    W, V = ir.W, ir.V
    v = list(vecs)
    b = W // 2
    while b >= 1:
        lo = "<" + ", ".join(f"i32 {l if not l & b else W + l - b}" for l in range(W)) + ">"
        hi = "<" + ", ".join(f"i32 {l + b if not l & b else W + l}" for l in range(W)) + ">"
        new = list(v)
        for i in range(W):
            if not i & b:
                new[i] = ir.emit(f"shufflevector {V} {v[i]}, {V} {v[i + b]}, <{W} x i32> {lo}")
                new[i + b] = ir.emit(f"shufflevector {V} {v[i]}, {V} {v[i + b]}, <{W} x i32> {hi}")
        v = new
        b //= 2
    return v


def _groups(cols, last: int, W: int) -> tuple[list[int], list[int]]:
    """Split ``cols`` (columns of one array) into starts of whole ``W``-column groups inside ``[0, last]``
    that contain at least one of them, and the columns left over."""
    starts, rest = [], []
    for c0 in range(0, last + 1, W):
        inside = [c for c in range(c0, c0 + W) if c in cols]
        if inside and c0 + W - 1 <= last:
            starts.append(c0)
        else:
            rest += inside
    return starts, rest


# C901 exempt: an IR emitter, one branch per op kind and block shape.
def kernel_ir(ops, outputs, n_in: int, n_out: int, dtype) -> str:
    """LLVM IR of a program.

    A block of ``W`` frames is moved between the frame-major arrays and the frame-innermost vectors by
    ``W x W`` register transposes (whole blocks) or element by element (the last, partial block).

    Args:
        ops: ``(dest, op, a, b)`` in program order; ``op`` is "load" (``a`` input array, ``b`` column),
            "add", "sub", "mul", "div" (operands: names of earlier values or Python floats), "neg", "sqrt",
            "cos", "sin" (``a`` the operand).
        outputs: ``(array, column, value)`` with ``value`` a name or a float.
        n_in, n_out: number of input / output arrays.
        dtype: float32 or float64.
    """
    dt = np.dtype(dtype)
    ir = _IR(dt)
    V, W, T = ir.V, ir.W, ir.T
    isz = dt.itemsize
    loads = {}  # (array, column) -> scratch row
    for _, op, a, b in ops:
        if op == "load":
            loads.setdefault((a, b), len(loads))
    n_rows_in = max(len(loads), 1)
    vals: dict[str, str] = {}

    def val(x) -> str:
        return ir.splat(x) if isinstance(x, float) else vals[x]

    def xin(row: int) -> str:
        return ir.emit(f"getelementptr inbounds {T}, ptr %xin, i64 {row * W}")

    def element(array: str, j: int, col: int) -> str:
        """Pointer to column ``col`` of frame ``i0 + j`` of ``%{array}`` (frame stride ``%s{array}``)."""
        idx = ir.emit(f"mul i64 {ir.emit(f'add i64 %i0, {j}')}, %s{array}")
        return ir.emit(f"getelementptr inbounds {T}, ptr %{array}, i64 {ir.emit(f'add i64 {idx}, {col}')}")

    # whole block in: W frames x W columns per vector load, transposed into column vectors
    ir.lines = []
    for a in range(n_in):
        cols = {c: r for (k, c), r in loads.items() if k == a}
        if not cols:
            continue
        starts, rest = _groups(cols, max(cols), W)
        for c0 in starts:
            rows = []
            for j in range(W):
                rows.append(ir.emit(f"load {V}, ptr {element(f'in{a}', j, c0)}, align {isz}"))
            for lane, vec in enumerate(_transpose(ir, rows)):
                if c0 + lane in cols:
                    ir.lines.append(f"  store {V} {vec}, ptr {xin(cols[c0 + lane])}, align 64")
        for c in rest:
            for j in range(W):
                x = ir.emit(f"load {T}, ptr {element(f'in{a}', j, c)}")
                slot = ir.emit(f"getelementptr inbounds {T}, ptr %xin, i64 {cols[c] * W + j}")
                ir.lines.append(f"  store {T} {x}, ptr {slot}")
    gather_full = ir.lines

    ir.lines = []
    for (a, col), row in loads.items():
        vals[f"load{a},{col}"] = ir.emit(f"load {V}, ptr {xin(row)}, align 64")
    trig: dict[str, tuple[str, str]] = {}
    bad: list[str] = []
    for dest, op, a, b in ops:
        if op == "load":
            vals[dest] = vals[f"load{a},{b}"]
        elif op in _BINOPS:
            vals[dest] = ir.emit(f"{_BINOPS[op]} contract {V} {val(a)}, {val(b)}")
        elif op == "neg":
            vals[dest] = ir.emit(f"fneg {V} {val(a)}")
        elif op == "sqrt":
            vals[dest] = ir.emit(f"call contract {V} @llvm.sqrt.{ir.sfx}({V} {val(a)})")
        elif op in ("cos", "sin"):
            if a not in trig:
                trig[a] = _sincos(ir, val(a), bad)
            vals[dest] = trig[a][0 if op == "cos" else 1]
        else:
            raise ValueError(f"unknown op {op!r} in traced program")
    if bad:
        acc = bad[0]
        for m in bad[1:]:
            acc = ir.emit(f"or <{W} x i1> {acc}, {m}")
        lanes = "<" + ", ".join(f"i64 {i}" for i in range(W)) + ">"
        mi = ir.emit(f"insertelement <{W} x i64> poison, i64 %m, i64 0")
        ms = ir.emit(f"shufflevector <{W} x i64> {mi}, <{W} x i64> poison, <{W} x i32> zeroinitializer")
        live = ir.emit(f"icmp ult <{W} x i64> {lanes}, {ms}")  # lanes past the last frame do not count
        lanes_bad = ir.emit(f"and <{W} x i1> {acc}, {live}")
        anyb = ir.emit(f"call i1 @llvm.vector.reduce.or.v{W}i1(<{W} x i1> {lanes_bad})")
        ir.lines.append(f"  %badz = zext i1 {anyb} to i64")
        # per frame: 1 where its arguments were out of range (whole block stored; the buffer has W spare bytes)
        flags = ir.emit(f"zext <{W} x i1> {lanes_bad} to <{W} x i8>")
        fp = ir.emit("getelementptr inbounds i8, ptr %flags, i64 %i0")
        ir.lines.append(f"  store <{W} x i8> {flags}, ptr {fp}, align 1")
    else:  # no sin/cos: nothing is ever out of range, the flags are not written
        ir.lines.append("  %badz = add i64 0, 0")
    compute = ir.lines

    # whole block out: W output columns transposed into W frame vectors, one vector store per frame
    ir.lines = []
    for a in range(n_out):
        cols = {c: v for k, c, v in outputs if k == a}
        if not cols:
            continue
        starts, rest = _groups(cols, max(cols), W)
        starts = [c0 for c0 in starts if all(c0 + lane in cols for lane in range(W))]
        rest = sorted(set(cols) - {c0 + lane for c0 in starts for lane in range(W)})
        for c0 in starts:
            for j, vec in enumerate(_transpose(ir, [val(cols[c0 + lane]) for lane in range(W)])):
                ir.lines.append(f"  store {V} {vec}, ptr {element(f'out{a}', j, c0)}, align {isz}")
        for c in rest:
            for j in range(W):
                x = ir.emit(f"extractelement {V} {val(cols[c])}, i64 {j}")
                ir.lines.append(f"  store {T} {x}, ptr {element(f'out{a}', j, c)}")
    scatter_full = ir.lines

    ir.lines = []  # partial block: through the scratch rows, element by element
    for row, (_, _, v) in enumerate(outputs):
        p = ir.emit(f"getelementptr inbounds {T}, ptr %xout, i64 {row * W}")
        ir.lines.append(f"  store {V} {val(v)}, ptr {p}, align 64")
    scatter_part = ir.lines

    args = [f"ptr noalias nocapture readonly %in{k}, i64 %sin{k}" for k in range(n_in)]
    args += [f"ptr noalias nocapture %out{k}, i64 %sout{k}" for k in range(n_out)]
    out = [
        f"declare {V} @llvm.rint.{ir.sfx}({V})",
        f"declare {V} @llvm.fabs.{ir.sfx}({V})",
        f"declare {V} @llvm.sqrt.{ir.sfx}({V})",
        f"declare i1 @llvm.vector.reduce.or.v{W}i1(<{W} x i1>)",
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
        "",
        f"define i64 @kernel({', '.join(args + ['i64 %n', 'ptr noalias nocapture %flags'])}) nounwind {{",
        "entry:",
        f"  %xin = alloca [{n_rows_in * W} x {T}], align 64",
        f"  %xout = alloca [{max(len(outputs), 1) * W} x {T}], align 64",
        # lanes past the last frame of a partial block read zeros, never uninitialised memory
        f"  call void @llvm.memset.p0.i64(ptr align 64 %xin, i8 0, i64 {n_rows_in * W * isz}, i1 false)",
        "  br label %head",
        "head:",
        "  %i0 = phi i64 [0, %entry], [%i0n, %next]",
        "  %nbad = phi i64 [0, %entry], [%nbad2, %next]",
        "  %more = icmp slt i64 %i0, %n",
        "  br i1 %more, label %block, label %exit",
        "block:",
        "  %rem = sub i64 %n, %i0",
        f"  %short = icmp slt i64 %rem, {W}",
        f"  %m = select i1 %short, i64 %rem, i64 {W}",
        "  br i1 %short, label %gather, label %gather_full",
        "gather_full:",
        *gather_full,
        "  br label %compute",
        "gather:",  # input rows of a partial block: xin[row, j] = in_a[(i0 + j) * stride_a + column]
        "  %j = phi i64 [0, %block], [%jn, %gather]",
        "  %fj = add i64 %i0, %j",
    ]
    for k in range(n_in):
        out.append(f"  %gb{k} = mul i64 %fj, %sin{k}")
    for (a, col), row in loads.items():
        out += [
            f"  %ga{row} = add i64 %gb{a}, {col}",
            f"  %gp{row} = getelementptr inbounds {T}, ptr %in{a}, i64 %ga{row}",
            f"  %gv{row} = load {T}, ptr %gp{row}",
            f"  %gx{row} = add i64 %j, {row * W}",
            f"  %gq{row} = getelementptr inbounds {T}, ptr %xin, i64 %gx{row}",
            f"  store {T} %gv{row}, ptr %gq{row}",
        ]
    out += ["  %jn = add i64 %j, 1", "  %jd = icmp eq i64 %jn, %m", "  br i1 %jd, label %compute, label %gather"]
    out += ["compute:", *compute, "  %nbad2 = add i64 %nbad, %badz"]
    out += ["  br i1 %short, label %scatter_part, label %scatter_full", "scatter_full:", *scatter_full]
    out += ["  br label %next", "scatter_part:", *scatter_part, "  br label %scatter", "scatter:"]
    out += ["  %s = phi i64 [0, %scatter_part], [%sn, %scatter]", "  %fs = add i64 %i0, %s"]
    for k in range(n_out):
        out.append(f"  %sb{k} = mul i64 %fs, %sout{k}")
    for row, (a, col, _) in enumerate(outputs):
        out += [
            f"  %sx{row} = add i64 %s, {row * W}",
            f"  %sq{row} = getelementptr inbounds {T}, ptr %xout, i64 %sx{row}",
            f"  %sv{row} = load {T}, ptr %sq{row}",
            f"  %sa{row} = add i64 %sb{a}, {col}",
            f"  %sp{row} = getelementptr inbounds {T}, ptr %out{a}, i64 %sa{row}",
            f"  store {T} %sv{row}, ptr %sp{row}",
        ]
    out += [
        "  %sn = add i64 %s, 1",
        "  %sd = icmp eq i64 %sn, %m",
        "  br i1 %sd, label %next, label %scatter",
        "next:",
        f"  %i0n = add i64 %i0, {W}",
        "  br label %head",
        "exit:",
        "  ret i64 %nbad",
        "}",
    ]
    return "\n".join(out) + "\n"


# -- the on-disk cache of built kernels --------------------------------------------------------------------
# A built kernel's object code is kept in the user cache folder, so that a new process loads it in
# milliseconds instead of running LLVM's optimiser and code generator again (1-6 s for a humanoid's program).
# The file name is a hash of everything the machine code depends on: the program (ops, outputs, arity, dtype),
# this file's source (the code generator), the llvmlite and LLVM versions, the CPU name and its features. Each
# file holds a magic line, the SHA-256 of the object code, then the object code; a file that does not check out
# is ignored (and rewritten). Files are written atomically (temp file + rename); a cache folder that cannot be
# written only costs the rebuild.
_CACHE_MAGIC = b"KANGENGINE-FK-OBJECT 1\n"
_CACHE_ENV = "KANGENGINE_CACHE_DIR"
_source_digest: str | None = None


def cache_dir() -> Path:
    """Folder of the native kernel cache: ``$KANGENGINE_CACHE_DIR/fk-native`` when set, else
    ``$XDG_CACHE_HOME/kangengine/fk-native`` (default ``~/.cache/kangengine/fk-native``; on Windows
    ``%LOCALAPPDATA%``)."""
    root = os.environ.get(_CACHE_ENV)
    if root:
        return Path(root) / "fk-native"
    base = os.environ.get("XDG_CACHE_HOME") or os.environ.get("LOCALAPPDATA") or str(Path.home() / ".cache")
    return Path(base) / "kangengine" / "fk-native"


def cache_key(ops, outputs, n_in: int, n_out: int, dtype) -> str:
    """Hex SHA-256 naming the cached object code of a program on this machine (see the notes above)."""
    global _source_digest
    llvm = _binding()
    if _source_digest is None:
        _source_digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    import llvmlite

    h = hashlib.sha256()
    for part in (
        _source_digest,
        llvmlite.__version__,
        ".".join(map(str, llvm.llvm_version_info)) if llvm is not None else "",
        _host[0],
        _host[1],
        np.dtype(dtype).str,
        f"{n_in},{n_out}",
        repr(list(outputs)),
        repr(list(ops)),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def read_cached_object(path: Path, magic: bytes = _CACHE_MAGIC) -> bytes | None:
    """The object code stored at ``path`` by :func:`write_cached_object` with the same ``magic``, or ``None``
    when the file is missing, unreadable, of another kind or corrupt (its SHA-256 does not match)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(magic)
    if not data.startswith(magic) or len(data) < head + 32:
        return None
    digest, obj = data[head : head + 32], data[head + 32 :]
    return obj if obj and hashlib.sha256(obj).digest() == digest else None


def write_cached_object(path: Path, obj: bytes, magic: bytes = _CACHE_MAGIC) -> None:
    """Store object code at ``path`` atomically as ``magic``, its SHA-256, then the bytes; a read-only or
    full cache folder is no error (the next process builds again)."""
    from ..._files import atomic_write

    try:
        atomic_write(path, lambda f: f.write(magic + hashlib.sha256(obj).digest() + obj))
    except OSError:
        pass


def compile_ir(
    ir_text: Callable[[], str],
    key: str,
    entry: str,
    *,
    cache: bool = True,
    cached_only: bool = False,
    optimize: bool = True,
) -> tuple[object, int, bool] | None:
    """Machine code for this CPU of the LLVM IR module ``ir_text()`` (called only when it must be built), through
    the on-disk cache (:func:`cache_dir`, file ``<key>.o``; ``key`` must name everything the code depends on).

    Returns ``(engine, address of entry, loaded from the cache)`` (keep ``engine`` alive while the code runs), or
    ``None`` with ``cached_only=True`` when the cache does not hold ``key``. ``optimize``: run LLVM's module
    optimisation pipeline before code generation (the code generator itself always optimises; a traced FK
    program is straight-line code with its constants folded already, where the pipeline costs 60 % of the build
    time and gains nothing measurable). Raises when llvmlite is missing."""
    llvm = _binding()
    if llvm is None:
        raise RuntimeError("llvmlite is not available")
    path = cache_dir() / f"{key}.o" if cache or cached_only else None
    obj = read_cached_object(path) if path is not None else None
    if obj is None and cached_only:
        return None
    text = "" if obj is not None else ir_text()
    built: list[bytes] = []
    with _lock:  # LLVM contexts are not shared between threads while compiling
        mod = llvm.parse_assembly(text)  # an empty module when the object code comes from the cache
        mod.verify()
        tm = _target_machine(llvm)
        if obj is None and optimize and hasattr(llvm, "create_pass_builder"):  # llvmlite >= 0.44
            pto = llvm.create_pipeline_tuning_options(speed_level=2)
            pb = llvm.create_pass_builder(tm, pto)
            pb.getModulePassManager().run(mod, pb)
        engine = llvm.create_mcjit_compiler(mod, tm)
        if path is not None:
            engine.set_object_cache(lambda _m, buf: built.append(bytes(buf)), lambda _m: obj)
        engine.finalize_object()
        address = engine.get_function_address(entry)
    if not address:
        raise RuntimeError(f"the native kernel has no entry point {entry!r}")
    if path is not None and obj is None and built:
        write_cached_object(path, built[0])
    return engine, address, obj is not None


def host_key(*parts: str) -> str:
    """Hex SHA-256 of ``parts`` and of what machine code depends on here (llvmlite and LLVM versions, CPU name and
    features): a :func:`compile_ir` key."""
    llvm = _binding()
    import llvmlite

    h = hashlib.sha256()
    version = ".".join(map(str, llvm.llvm_version_info)) if llvm is not None else ""
    for part in (llvmlite.__version__, version, _host[0], _host[1], *parts):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_program(
    ops, outputs, n_in: int, n_out: int, dtype, *, cache: bool = True, cached_only: bool = False
) -> NativeKernel | None:
    """Compile a traced program (see :func:`kernel_ir`) for this CPU. Raises when llvmlite is missing.

    ``cache``: load the object code from the on-disk cache (:func:`cache_dir`) when it holds this program for
    this machine, else build it and store it there. ``NativeKernel.from_cache`` tells which happened.
    ``cached_only``: return ``None`` instead of building when the cache does not hold the program."""
    built = compile_ir(
        lambda: kernel_ir(ops, outputs, n_in, n_out, dtype),
        cache_key(ops, outputs, n_in, n_out, dtype),
        "kernel",
        cache=cache,
        cached_only=cached_only,
        optimize=False,
    )
    if built is None:
        return None
    engine, address, from_cache = built
    kern = NativeKernel(engine, address, n_in, n_out, np.dtype(dtype))
    kern.from_cache = from_cache
    return kern


def compile_trace(
    trace: Trace, inputs: Sequence[str], dtype, *, cache: bool = True, cached_only: bool = False
) -> NativeKernel | None:
    """Compile ``trace`` for this CPU, its input arrays in the order ``inputs`` (names from the trace's
    ``load`` ops) and its output arrays in the order they first appear in ``trace.outputs``."""
    columns = trace.output_columns
    out_names = list(dict.fromkeys(o for o, _, _ in columns))
    idx = {a: i for i, a in enumerate(inputs)}
    ops = [(d, op, idx[a], b) if op == "load" else (d, op, a, b) for d, op, a, b in trace.ops]
    outs = [(out_names.index(o), c, v) for o, c, v in columns]
    return compile_program(ops, outs, len(inputs), len(out_names), dtype, cache=cache, cached_only=cached_only)


def _frame_rows(x):
    """``(array, address, frame_stride)`` of ``x [frames, ...]`` as rows with contiguous columns (a copy
    only when the columns are not contiguous); the stride is in elements, 0 for a broadcast row."""
    if is_torch(x):
        a = x.reshape(x.shape[0], -1)
        if a.shape[1] > 1 and a.stride(1) != 1 or a.stride(0) < 0:
            a = a.contiguous()
        return a, a.data_ptr(), a.stride(0) if a.shape[0] > 1 else 0
    a = x.reshape(x.shape[0], -1)
    isz = a.itemsize
    if a.shape[1] > 1 and a.strides[1] != isz or a.strides[0] < 0 or a.strides[0] % isz:
        a = np.ascontiguousarray(a)
    return a, a.__array_interface__["data"][0], a.strides[0] // isz if a.shape[0] > 1 else 0


def run_kernel(
    kern: NativeKernel, inputs: list, outputs: list, n: int, fallback: Callable[[int, int], None], *, chunk: int
) -> None:
    """Run ``kern`` over frames ``[0, n)`` of numpy arrays / CPU torch tensors ``inputs`` and ``outputs``
    (``[frames, ...]`` each) in chunks of ``chunk`` frames on the thread pool (the calls release the GIL).

    The frames whose sin/cos arguments were outside the kernel's exact range, and only those, are recomputed
    by ``fallback(s, e)`` (the replay of frames ``[s, e)``), one call per run of consecutive such frames: a
    frame's result never depends on the other frames of the batch, its position or the batch size."""
    isz = kern.dtype.itemsize
    ins = [_frame_rows(x) for x in inputs]
    outs = [_frame_rows(x) for x in outputs]  # fresh contiguous arrays: never copied, written in place
    in_args = [(ptr, st) for _, ptr, st in ins]
    out_args = [(ptr, st) for _, ptr, st in outs]

    def run(s: int, e: int) -> None:
        flags = np.empty(e - s + kern.width, dtype=np.uint8)
        ptr = flags.__array_interface__["data"][0]
        bad = kern(
            [(p + s * st * isz, st) for p, st in in_args], [(p + s * st * isz, st) for p, st in out_args], e - s, ptr
        )
        if bad:
            for a, b in _runs(flags[: e - s]):
                fallback(s + a, s + b)

    run_chunks(n, run, True, chunk)
    del ins  # keeps any contiguous copies alive until the kernels have run


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of the runs of nonzero entries of ``flags [n] uint8``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags != 0, [0])).astype(np.int8)))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))
