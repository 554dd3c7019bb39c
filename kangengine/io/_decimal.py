"""The native kernels of the BVH reader, built with llvmlite: a parser of whitespace-separated decimal numbers (the
motion rows) and the pose extents of the up-axis and unit detection.

:func:`parse_rows`: one pass over the bytes, no Python object per number, written straight into a float64 or
float32 array. It accepts only the plain decimal form almost every BVH writer prints: an optional sign, digits with
at most one ``.``, at most 15 digits, an optional exponent (``e``/``E``, sign, digits), tokens separated by spaces,
tabs and LF line endings, and every non-blank line holding exactly ``columns`` numbers. A number
``sign * m * 10**p`` (``m < 10**15``, ``|p| <= 22``: both exactly representable) is one IEEE multiplication or
division of two exact doubles, so the result is the correctly rounded float64, the same value ``float()``/``strtod``
give (float32: that value rounded once more, as ``astype`` does). Anything else (``nan``/``inf``, letters, more
digits, a larger power of ten, a short or long row) makes :func:`parse_rows` return ``None``: the caller then runs
its general parser, which also says what is wrong and where. The digits are read in tight loops (integer part,
fraction, exponent), not a state machine per character.

:func:`pose_extents`: world positions down a parent-first tree for a few frames and their extent per axis, in one
call instead of a numpy step per tree level.

Without llvmlite (or when the kernels cannot be built) both return ``None``. The built object code is cached on
disk like the forward-kinematics kernels (keyed by the IR, llvmlite, LLVM and the CPU; checksummed, written
atomically), so only the first process on a machine runs LLVM.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from pathlib import Path

import numpy as np

__all__ = ["parse_rows", "pose_extents"]

_MAX_DIGITS = 15  # 10**15 < 2**53: the integer of digits is exact in a double

_POW10 = ", ".join(f"double 1.0e{k}" for k in range(23))

# parse_<t>(buf, n, out, cap, cols) -> count of numbers; -1: not the simple form (the general parser reads it);
# -2: more numbers than ``cap`` (the caller sizes the buffer by the lines and calls again)
_PARSE_TEMPLATE = r"""
define i64 @parse_{name}(ptr noalias %buf, i64 %n, ptr noalias %out, i64 %cap, i64 %cols) {{
entry:
  br label %skip

skip:                                   ; between tokens: whitespace; a newline closes a row
  %i = phi i64 [0, %entry], [%i_ws, %ws], [%i_nl, %nlok], [%i_end, %stored]
  %cnt = phi i64 [0, %entry], [%cnt, %ws], [%cnt, %nlok], [%cnt1, %stored]
  %lt = phi i64 [0, %entry], [%lt, %ws], [0, %nlok], [%lt1, %stored]
  %at_end = icmp uge i64 %i, %n
  br i1 %at_end, label %finish, label %look

look:
  %p = getelementptr inbounds i8, ptr %buf, i64 %i
  %c = load i8, ptr %p
  %is_sp = icmp eq i8 %c, 32
  %c9 = sub i8 %c, 9
  %is_ctl = icmp ult i8 %c9, 5          ; \t \n \v \f \r
  %is_ws = or i1 %is_sp, %is_ctl
  br i1 %is_ws, label %wsc, label %token

wsc:
  %is_nl = icmp eq i8 %c, 10
  br i1 %is_nl, label %nl, label %ws

ws:
  %i_ws = add i64 %i, 1
  br label %skip

nl:
  %l_empty = icmp eq i64 %lt, 0
  %l_full = icmp eq i64 %lt, %cols
  %l_ok = or i1 %l_empty, %l_full
  %i_nl = add i64 %i, 1
  br i1 %l_ok, label %nlok, label %fail

nlok:
  br label %skip

token:                                  ; an optional sign
  %is_minus = icmp eq i8 %c, 45
  %is_plus = icmp eq i8 %c, 43
  %signed = or i1 %is_minus, %is_plus
  %i_s = add i64 %i, 1
  %i0 = select i1 %signed, i64 %i_s, i64 %i
  br label %int

int:                                    ; digits before the point
  %ii = phi i64 [%i0, %token], [%ii1, %intd]
  %acc = phi i64 [0, %token], [%acc1, %intd]
  %nd = phi i64 [0, %token], [%nd1, %intd]
  %ie = icmp uge i64 %ii, %n
  br i1 %ie, label %mant, label %intc

intc:
  %ip = getelementptr inbounds i8, ptr %buf, i64 %ii
  %ic = load i8, ptr %ip
  %id8 = sub i8 %ic, 48
  %isd = icmp ult i8 %id8, 10
  br i1 %isd, label %intd, label %intnd

intd:
  %idd = zext i8 %id8 to i64
  %acc10 = mul i64 %acc, 10
  %acc1 = add i64 %acc10, %idd
  %nd1 = add i64 %nd, 1
  %ii1 = add i64 %ii, 1
  br label %int

intnd:
  %isdot = icmp eq i8 %ic, 46
  br i1 %isdot, label %dot, label %mant

dot:
  %fi0 = add i64 %ii, 1
  br label %frac

frac:                                   ; digits after the point
  %fi = phi i64 [%fi0, %dot], [%fi1, %fracd]
  %facc = phi i64 [%acc, %dot], [%facc1, %fracd]
  %fnd = phi i64 [%nd, %dot], [%fnd1, %fracd]
  %ffr = phi i64 [0, %dot], [%ffr1, %fracd]
  %fe = icmp uge i64 %fi, %n
  br i1 %fe, label %mant, label %fracc

fracc:
  %fp = getelementptr inbounds i8, ptr %buf, i64 %fi
  %fc = load i8, ptr %fp
  %fd8 = sub i8 %fc, 48
  %fisd = icmp ult i8 %fd8, 10
  br i1 %fisd, label %fracd, label %mant

fracd:
  %fdd = zext i8 %fd8 to i64
  %facc10 = mul i64 %facc, 10
  %facc1 = add i64 %facc10, %fdd
  %fnd1 = add i64 %fnd, 1
  %ffr1 = add i64 %ffr, 1
  %fi1 = add i64 %fi, 1
  br label %frac

mant:                                   ; the digits end: at most 15 of them, at least one
  %mi = phi i64 [%ii, %int], [%ii, %intnd], [%fi, %frac], [%fi, %fracc]
  %macc = phi i64 [%acc, %int], [%acc, %intnd], [%facc, %frac], [%facc, %fracc]
  %mnd = phi i64 [%nd, %int], [%nd, %intnd], [%fnd, %frac], [%fnd, %fracc]
  %mfr = phi i64 [0, %int], [0, %intnd], [%ffr, %frac], [%ffr, %fracc]
  %nodig = icmp eq i64 %mnd, 0
  %many = icmp ugt i64 %mnd, 15
  %mbad = or i1 %nodig, %many
  br i1 %mbad, label %fail, label %mend

mend:
  %me = icmp uge i64 %mi, %n
  br i1 %me, label %value, label %mnext

mnext:
  %mp = getelementptr inbounds i8, ptr %buf, i64 %mi
  %mc = load i8, ptr %mp
  %mcl = or i8 %mc, 32
  %is_e = icmp eq i8 %mcl, 101          ; e or E
  br i1 %is_e, label %exp, label %value

exp:                                    ; an exponent: optional sign, at least one digit, at most 400
  %xi0 = add i64 %mi, 1
  %xe0 = icmp uge i64 %xi0, %n
  br i1 %xe0, label %fail, label %xsign

xsign:
  %xp0 = getelementptr inbounds i8, ptr %buf, i64 %xi0
  %xc0 = load i8, ptr %xp0
  %xminus = icmp eq i8 %xc0, 45
  %xplus = icmp eq i8 %xc0, 43
  %xsigned = or i1 %xminus, %xplus
  %xi0s = add i64 %xi0, 1
  %xi1 = select i1 %xsigned, i64 %xi0s, i64 %xi0
  br label %xdig

xdig:
  %xi = phi i64 [%xi1, %xsign], [%xi2, %xdd]
  %xv = phi i64 [0, %xsign], [%xv1, %xdd]
  %xn = phi i64 [0, %xsign], [%xn1, %xdd]
  %xe = icmp uge i64 %xi, %n
  br i1 %xe, label %xend, label %xc

xc:
  %xp = getelementptr inbounds i8, ptr %buf, i64 %xi
  %xch = load i8, ptr %xp
  %xd8 = sub i8 %xch, 48
  %xisd = icmp ult i8 %xd8, 10
  br i1 %xisd, label %xdd, label %xend

xdd:
  %xdv = zext i8 %xd8 to i64
  %xv10 = mul i64 %xv, 10
  %xv1 = add i64 %xv10, %xdv
  %xn1 = add i64 %xn, 1
  %xi2 = add i64 %xi, 1
  %xbig = icmp ugt i64 %xv1, 400
  br i1 %xbig, label %fail, label %xdig

xend:
  %xnone = icmp eq i64 %xn, 0
  %xneg = sub i64 0, %xv
  %xval = select i1 %xminus, i64 %xneg, i64 %xv
  br i1 %xnone, label %fail, label %value

value:                                  ; the token must end at whitespace or at the end of the text
  %vi = phi i64 [%mi, %mend], [%mi, %mnext], [%xi, %xend]
  %vex = phi i64 [0, %mend], [0, %mnext], [%xval, %xend]
  %ve = icmp uge i64 %vi, %n
  br i1 %ve, label %compute, label %vnext

vnext:
  %vp = getelementptr inbounds i8, ptr %buf, i64 %vi
  %vc = load i8, ptr %vp
  %v_sp = icmp eq i8 %vc, 32
  %vc9 = sub i8 %vc, 9
  %v_ctl = icmp ult i8 %vc9, 5
  %v_ws = or i1 %v_sp, %v_ctl
  br i1 %v_ws, label %compute, label %fail

compute:                                ; sign * digits * 10^(exponent - fraction digits): one exact operation
  %pw10 = sub i64 %vex, %mfr
  %plo = icmp slt i64 %pw10, -22
  %phi = icmp sgt i64 %pw10, 22
  %pout = or i1 %plo, %phi
  %full = icmp uge i64 %cnt, %cap
  br i1 %pout, label %fail, label %room

room:
  br i1 %full, label %overflow, label %scale

scale:
  %fa = uitofp i64 %macc to double
  %pneg = icmp slt i64 %pw10, 0
  %pabs_n = sub i64 0, %pw10
  %pabs = select i1 %pneg, i64 %pabs_n, i64 %pw10
  %pwp = getelementptr inbounds [23 x double], ptr @pow10, i64 0, i64 %pabs
  %pwv = load double, ptr %pwp
  %vd = fdiv double %fa, %pwv
  %vm = fmul double %fa, %pwv
  %v = select i1 %pneg, double %vd, double %vm
  %vn = fneg double %v
  %vs = select i1 %is_minus, double %vn, double %v
{convert}
  %op = getelementptr inbounds {type}, ptr %out, i64 %cnt
  store {type} {stored}, ptr %op
  %cnt1 = add i64 %cnt, 1
  %lt1 = add i64 %lt, 1
  br label %stored

stored:
  %i_end = add i64 %vi, 0
  br label %skip

finish:                                 ; the end of the text ends a row
  %e_empty = icmp eq i64 %lt, 0
  %e_full = icmp eq i64 %lt, %cols
  %e_ok = or i1 %e_empty, %e_full
  br i1 %e_ok, label %done, label %fail

done:
  ret i64 %cnt

overflow:
  ret i64 -2

fail:
  ret i64 -1
}}
"""


def _parse_ir() -> str:
    """IR of ``parse_f64`` and ``parse_f32`` (the float64 result rounded once more to float32, as ``astype``)."""
    head = f"@pow10 = private unnamed_addr constant [23 x double] [{_POW10}]\n"
    f64 = _PARSE_TEMPLATE.format(name="f64", type="double", convert="", stored="%vs")
    f32 = _PARSE_TEMPLATE.format(name="f32", type="float", convert="  %vo = fptrunc double %vs to float", stored="%vo")
    return head + f64 + f32


def _extents_ir() -> str:
    """IR of ``extents``: world positions down a parent-first tree per frame, and their extent per axis."""
    # local rotation matrix of (w, x, y, z), the formula of rotations.quat_to_matrix: s = 2 / |q|^2
    lines = []
    a = lines.append
    for k, c in enumerate("wxyz"):
        a(f"  %q{c}p = getelementptr inbounds double, ptr %q, i64 %q{k}")
        a(f"  %{c} = load double, ptr %q{c}p")
    for k, c in enumerate("xyz"):
        a(f"  %t{c}p = getelementptr inbounds double, ptr %t, i64 %t{k}")
        a(f"  %t{c} = load double, ptr %t{c}p")
    a("  %ww = fmul double %w, %w")
    a("  %xx0 = fmul double %x, %x")
    a("  %yy0 = fmul double %y, %y")
    a("  %zz0 = fmul double %z, %z")
    a("  %n1 = fadd double %ww, %xx0")
    a("  %n2 = fadd double %n1, %yy0")
    a("  %n3 = fadd double %n2, %zz0")
    a("  %s2 = fdiv double 2.0, %n3")
    for c in "xyz":
        a(f"  %{c}s = fmul double %{c}, %s2")
    for name, u, v in (
        ("xx", "x", "xs"),
        ("yy", "y", "ys"),
        ("zz", "z", "zs"),
        ("xy", "x", "ys"),
        ("wz", "w", "zs"),
        ("xz", "x", "zs"),
        ("wy", "w", "ys"),
        ("yz", "y", "zs"),
        ("wx", "w", "xs"),
    ):
        a(f"  %{name} = fmul double %{u}, %{v}")
    for d, u, v in ((0, "yy", "zz"), (4, "xx", "zz"), (8, "xx", "yy")):
        a(f"  %d{d} = fadd double %{u}, %{v}")
        a(f"  %l{d} = fsub double 1.0, %d{d}")
    for lo, hi, u, v in ((1, 3, "xy", "wz"), (5, 7, "yz", "wx"), (6, 2, "xz", "wy")):
        a(f"  %l{lo} = fsub double %{u}, %{v}")
        a(f"  %l{hi} = fadd double %{u}, %{v}")
    body = "\n".join(lines)
    # child: W = P.R @ L, p = P.R @ t + P.p (the order of numpy's 4x4 homogeneous product)
    ch = []
    c = ch.append
    for k in range(12):
        c(f"  %pp{k} = getelementptr inbounds double, ptr %pw, i64 {k}")
        c(f"  %P{k} = load double, ptr %pp{k}")
    for r in range(3):
        for col in range(3):
            for k in range(3):
                c(f"  %m{r}{col}{k} = fmul double %P{3 * r + k}, %l{3 * k + col}")
            c(f"  %a{r}{col} = fadd double %m{r}{col}0, %m{r}{col}1")
            c(f"  %W{3 * r + col} = fadd double %a{r}{col}, %m{r}{col}2")
        for k, tc in enumerate("xyz"):
            c(f"  %v{r}{k} = fmul double %P{3 * r + k}, %t{tc}")
        c(f"  %b{r}0 = fadd double %v{r}0, %v{r}1")
        c(f"  %b{r}1 = fadd double %b{r}0, %v{r}2")
        c(f"  %W{9 + r} = fadd double %b{r}1, %P{9 + r}")
    child = "\n".join(ch)
    st_root = "\n".join(
        f"  %rs{k} = getelementptr inbounds double, ptr %wi, i64 {k}\n  store double {v}, ptr %rs{k}"
        for k, v in enumerate([f"%l{j}" for j in range(9)] + ["%tx", "%ty", "%tz"])
    )
    st_child = "\n".join(
        f"  %cs{k} = getelementptr inbounds double, ptr %wi, i64 {k}\n  store double %W{k}, ptr %cs{k}"
        for k in range(12)
    )
    minmax = []
    for k, (v_root, v_child) in enumerate((("%tx", "%W9"), ("%ty", "%W10"), ("%tz", "%W11"))):
        minmax.append(f"  %g{k} = phi double [{v_root}, %root], [{v_child}, %child2]")
    minmax.append("  %use = icmp uge i64 %i, %first")
    for k in range(3):
        minmax.append(f"  %lt{k} = fcmp olt double %g{k}, %lo{k}")
        minmax.append(f"  %gt{k} = fcmp ogt double %g{k}, %hi{k}")
        minmax.append(f"  %lc{k} = and i1 %lt{k}, %use")
        minmax.append(f"  %hc{k} = and i1 %gt{k}, %use")
        minmax.append(f"  %lo{k}n = select i1 %lc{k}, double %g{k}, double %lo{k}")
        minmax.append(f"  %hi{k}n = select i1 %hc{k}, double %g{k}, double %hi{k}")
    mm = "\n".join(minmax)
    phis = "\n".join(
        f"  %lo{k} = phi double [0x7FF0000000000000, %fbody], [%lo{k}n, %stored]\n"
        f"  %hi{k} = phi double [0xFFF0000000000000, %fbody], [%hi{k}n, %stored]"
        for k in range(3)
    )
    outs = "\n".join(
        f"  %e{k} = fsub double %hi{k}, %lo{k}\n  %o{k}p = getelementptr inbounds double, ptr %out, i64 %o{k}\n"
        f"  store double %e{k}, ptr %o{k}p"
        for k in range(3)
    )
    return f"""
; extents(q [frames, nodes, 4] WXYZ, t [frames, nodes, 3], parent [nodes] (parent-first, -1 root), nodes, frames,
;         work [nodes, 12], out [frames, 3]) -> 0, or -1 when a parent does not precede its node
define i64 @extents(ptr noalias %q, ptr noalias %t, ptr noalias %parent, i64 %nodes, i64 %frames, ptr noalias %work,
                    ptr noalias %out) {{
entry:
  %many = icmp ugt i64 %nodes, 1
  %first = select i1 %many, i64 1, i64 0   ; the root is left out unless it is alone
  br label %fhead
fhead:
  %s = phi i64 [0, %entry], [%s1, %fend]
  %fdone = icmp sge i64 %s, %frames
  br i1 %fdone, label %ok, label %fbody
fbody:
  %row = mul i64 %s, %nodes
  br label %nhead
nhead:
  %i = phi i64 [0, %fbody], [%i1, %stored]
{phis}
  %ndone = icmp sge i64 %i, %nodes
  br i1 %ndone, label %fend, label %nbody
nbody:
  %k = add i64 %row, %i
  %q0 = mul i64 %k, 4
  %q1 = add i64 %q0, 1
  %q2 = add i64 %q0, 2
  %q3 = add i64 %q0, 3
  %t0 = mul i64 %k, 3
  %t1 = add i64 %t0, 1
  %t2 = add i64 %t0, 2
{body}
  %wo = mul i64 %i, 12
  %wi = getelementptr inbounds double, ptr %work, i64 %wo
  %pap = getelementptr inbounds i64, ptr %parent, i64 %i
  %par = load i64, ptr %pap
  %isroot = icmp slt i64 %par, 0
  br i1 %isroot, label %root, label %child
root:
{st_root}
  br label %stored
child:
  %late = icmp sge i64 %par, %i
  br i1 %late, label %fail, label %child2
child2:
  %po = mul i64 %par, 12
  %pw = getelementptr inbounds double, ptr %work, i64 %po
{child}
{st_child}
  br label %stored
stored:
{mm}
  %i1 = add i64 %i, 1
  br label %nhead
fend:
  %o0 = mul i64 %s, 3
  %o1 = add i64 %o0, 1
  %o2 = add i64 %o0, 2
{outs}
  %s1 = add i64 %s, 1
  br label %fhead
ok:
  ret i64 0
fail:
  ret i64 -1
}}
"""


_MODULE_IR = _parse_ir() + _extents_ir()  # one module, one build, one cache file

_lock = threading.Lock()
_kernel = None  # the ctypes function once built; False when it cannot be built here
_CACHE_MAGIC = b"KANGENGINE-DECIMAL-OBJECT 1\n"  # bump when the build options change (part of the key)


def _cache_path(llvm, cpu: str, features: str) -> Path:
    """Where the object code for this machine lives: the native-kernel cache folder's sibling ``io-native``
    (see :func:`kangengine.animation.kinematics.native.cache_dir`), named by a hash of the IR, llvmlite, LLVM
    and the CPU."""
    import llvmlite

    from ..animation.kinematics.native import cache_dir

    h = hashlib.sha256()
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    for part in (_CACHE_MAGIC.decode(), _MODULE_IR, llvmlite.__version__, llvm_version, cpu, features):
        h.update(part.encode())
        h.update(b"\0")
    return cache_dir().parent / "io-native" / f"decimal-{h.hexdigest()}.o"


def _compile(llvm):
    """(engine, address of ``parse``, whether the object code came from the on-disk cache)."""
    from ..animation.kinematics.native import read_cached_object, write_cached_object

    cpu = llvm.get_host_cpu_name()
    try:
        features = llvm.get_host_cpu_features().flatten()
    except Exception:  # some platforms cannot report features: generic code for the CPU name
        features = ""
    path = _cache_path(llvm, cpu, features)
    obj = read_cached_object(path, _CACHE_MAGIC)
    mod = llvm.parse_assembly(_MODULE_IR if obj is None else "")  # an empty module when the object code is cached
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
    if obj is None and hasattr(llvm, "create_pass_builder"):  # llvmlite >= 0.44 (the new pass manager)
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
        pb.getModulePassManager().run(mod, pb)  # mem2reg and the rest: the variables live in registers
    built: list[bytes] = []
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.set_object_cache(lambda _m, buf: built.append(bytes(buf)), lambda _m: obj)
    engine.finalize_object()
    addresses = {name: engine.get_function_address(name) for name in ("parse_f64", "parse_f32", "extents")}
    if not all(addresses.values()):
        raise RuntimeError("the native BVH module lacks an entry point")
    if obj is None and built:
        write_cached_object(path, built[0], _CACHE_MAGIC)
    return engine, addresses, obj is not None


def _build():
    """The compiled parser (a ctypes function) or ``False`` when llvmlite is missing or the build fails. The
    object code is kept on disk (``io-native`` beside the FK kernel cache), so a new process loads it instead of
    running LLVM again."""
    global _kernel
    with _lock:
        if _kernel is None:
            try:
                import llvmlite.binding as llvm

                llvm.initialize_native_target()
                llvm.initialize_native_asmprinter()
                engine, addresses, from_cache = _compile(llvm)
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                parse = ctypes.CFUNCTYPE(i64, ptr, i64, ptr, i64, i64)
                fn = parse(addresses["parse_f64"])
                fn.parse = {np.dtype(np.float64): fn, np.dtype(np.float32): parse(addresses["parse_f32"])}
                fn.extents = ctypes.CFUNCTYPE(i64, ptr, ptr, ptr, i64, i64, ptr, ptr)(addresses["extents"])
                fn._engine = engine  # the engine owns the machine code: keep it alive with the functions
                fn.from_cache = from_cache
                _kernel = fn
            except Exception:
                _kernel = False
    return _kernel


def parse_rows(data: bytes, start: int, columns: int, *, dtype=np.float64, rows_hint: int | None = None):
    """The numbers of ``data[start:]`` as ``[rows, columns]`` ``dtype`` (float64 or float32), or ``None``.

    ``data``: LF-normalised bytes; ``columns`` > 0. ``None`` when the text is not in the simple decimal form
    (see the module notes: exponents past 22, ``nan``, letters, over 15 digits, a line without exactly ``columns``
    numbers) or the native parser is unavailable; the caller then parses with its general reader. Zero rows
    give a ``[0, columns]`` array. float32 values are the float64 ones rounded once more (as ``astype``).
    ``rows_hint`` (the ``Frames:`` count of a BVH header) sizes the output buffer without counting the lines
    first; a file with more rows than that costs one more pass (the lines are counted and the parse repeated).
    """
    fn = _kernel if _kernel is not None else _build()
    if not fn or columns <= 0:
        return None
    dtype = np.dtype(dtype)
    kernel = fn.parse[dtype]
    n = len(data) - start
    most = n // 2 + 1  # a number takes a character and a separator
    cap = (rows_hint + 1) * columns if rows_hint is not None and rows_hint >= 0 else most + 1
    addr = np.frombuffer(data, dtype=np.uint8).ctypes.data + start  # the bytes themselves, no copy
    for _ in range(2):
        if cap > most:
            # a line holds at most ``columns`` numbers: the buffer is about the size of the result (what numpy's
            # reader would hold too), never a multiple of the file
            cap = min(most, (data.count(b"\n", start) + 1) * columns)
        out = np.empty(cap, dtype=dtype)
        count = int(kernel(addr, n, out.ctypes.data, cap, columns))
        if count != -2:  # -2: more rows than the hint
            break
        cap = most + 1
    if count < 0:
        return None
    return out[:count].reshape(count // columns, columns)


def pose_extents(quat_wxyz: np.ndarray, translation: np.ndarray, parents: np.ndarray) -> np.ndarray | None:
    """Per-frame extent of a tree's world joint positions, ``[frames, 3]`` float64, or ``None`` without the kernel.

    ``quat_wxyz [frames, nodes, 4]`` float64 ``parent_from_node`` rotations (any non-zero scale: each is
    normalised, as :func:`kangengine.rotations.quat_to_matrix` does), ``translation [frames, nodes, 3]`` float64
    ``parent_from_node`` translations (the root's: its world position), ``parents [nodes]`` int64, parent-first
    (``parents[i] < i``, ``-1`` for the root). The extent along each axis is the largest minus the smallest world
    position over the nodes after the root (the root alone when it is the only node). The same products as a
    4x4 homogeneous composition down the tree, in float64: one native call instead of a numpy step per level.
    Raises ``ValueError`` when a parent does not precede its node.
    """
    fn = _kernel if _kernel is not None else _build()
    if not fn:
        return None
    frames, nodes = quat_wxyz.shape[:2]
    quat = np.ascontiguousarray(quat_wxyz, dtype=np.float64)
    trans = np.ascontiguousarray(translation, dtype=np.float64)
    par = np.ascontiguousarray(parents, dtype=np.int64)
    if quat.shape != (frames, nodes, 4) or trans.shape != (frames, nodes, 3) or par.shape != (nodes,) or nodes == 0:
        raise ValueError(
            f"pose_extents: shapes {quat.shape}, {trans.shape}, {par.shape}; expected [F, N, 4], "
            "[F, N, 3] and [N] with N > 0"
        )
    work = np.empty((nodes, 12))
    out = np.empty((frames, 3))
    if (
        fn.extents(
            quat.ctypes.data, trans.ctypes.data, par.ctypes.data, nodes, frames, work.ctypes.data, out.ctypes.data
        )
        < 0
    ):
        raise ValueError("pose_extents: a parent index does not precede its node")
    return out
