"""A native parser of whitespace-separated decimal numbers (the motion rows of BVH files), built with llvmlite.

One pass over the bytes, no Python object per number. It accepts only the plain decimal form almost every BVH
writer prints: an optional sign, digits with at most one ``.``, at most 15 significant digits, tokens separated
by spaces, tabs and LF line endings, and every non-blank line holding exactly ``columns`` numbers. A number
``sign * m / 10**k`` (``m < 10**15`` exactly representable) is one IEEE division of two exact doubles, so the
result is the correctly rounded float64, the same value ``float()``/``strtod`` give. Anything else (an
exponent, ``nan``/``inf``, letters, more digits, a short or long row) makes :func:`parse_rows` return
``None``: the caller then runs its general parser, which also says what is wrong and where.

Without llvmlite (or when the kernel cannot be built) :func:`parse_rows` returns ``None`` as well. The built object
code is cached on disk like the forward-kinematics kernels (keyed by the IR, llvmlite, LLVM and the CPU; checksummed,
written atomically), so only the first process on a machine runs LLVM.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from pathlib import Path

import numpy as np

__all__ = ["parse_rows"]

_MAX_DIGITS = 15  # 10**15 < 2**53: the integer of digits is exact in a double

# parse(buf, n, out, cap, columns) -> count of numbers, or -1 (not the simple form: use the general parser)
_IR = r"""
@pow10 = private unnamed_addr constant [23 x double] [
  double 1.0e0, double 1.0e1, double 1.0e2, double 1.0e3, double 1.0e4, double 1.0e5,
  double 1.0e6, double 1.0e7, double 1.0e8, double 1.0e9, double 1.0e10, double 1.0e11,
  double 1.0e12, double 1.0e13, double 1.0e14, double 1.0e15, double 1.0e16, double 1.0e17,
  double 1.0e18, double 1.0e19, double 1.0e20, double 1.0e21, double 1.0e22]

; the value of a finished token, or a NaN flag (-1 in %bad) when it is not representable exactly enough
define internal double @value(i64 %acc, i64 %fr, i64 %ex, i1 %exneg, i1 %neg, ptr %bad) alwaysinline {
  %frx = icmp slt i64 %fr, 0
  %f = select i1 %frx, i64 0, i64 %fr
  %exn = sub i64 0, %ex
  %e = select i1 %exneg, i64 %exn, i64 %ex
  %p = sub i64 %e, %f
  %lo = icmp slt i64 %p, -22
  %hi = icmp sgt i64 %p, 22
  %out = or i1 %lo, %hi
  br i1 %out, label %oob, label %ok
oob:
  store i1 true, ptr %bad
  ret double 0.0
ok:
  %fa = uitofp i64 %acc to double
  %negp = icmp slt i64 %p, 0
  %pn = sub i64 0, %p
  %k = select i1 %negp, i64 %pn, i64 %p
  %pp = getelementptr inbounds [23 x double], ptr @pow10, i64 0, i64 %k
  %pw = load double, ptr %pp
  br i1 %negp, label %div, label %mul
div:
  %vd = fdiv double %fa, %pw
  br label %sgn
mul:
  %vm = fmul double %fa, %pw
  br label %sgn
sgn:
  %v = phi double [%vd, %div], [%vm, %mul]
  %nv = fneg double %v
  %r = select i1 %neg, double %nv, double %v
  ret double %r
}

define i64 @parse(ptr noalias %buf, i64 %n, ptr noalias %out, i64 %cap, i64 %cols) {
entry:
  %i.a = alloca i64
  %acc.a = alloca i64
  %nd.a = alloca i64
  %fr.a = alloca i64
  %neg.a = alloca i1
  %tok.a = alloca i1
  %cnt.a = alloca i64
  %lt.a = alloca i64
  %ex.a = alloca i64
  %exneg.a = alloca i1
  %es.a = alloca i64     ; exponent state: 0 none, 1 after e, 2 after its sign, 3 with digits
  %bad.a = alloca i1
  store i64 0, ptr %i.a
  store i64 0, ptr %cnt.a
  store i64 0, ptr %lt.a
  store i1 false, ptr %bad.a
  br label %reset

reset:                          ; a new token
  store i64 0, ptr %acc.a
  store i64 0, ptr %nd.a
  store i64 -1, ptr %fr.a
  store i1 false, ptr %neg.a
  store i1 false, ptr %tok.a
  store i64 0, ptr %ex.a
  store i1 false, ptr %exneg.a
  store i64 0, ptr %es.a
  br label %loop

loop:
  %i = load i64, ptr %i.a
  %at_end = icmp eq i64 %i, %n
  br i1 %at_end, label %finish, label %body

body:
  %p = getelementptr inbounds i8, ptr %buf, i64 %i
  %c = load i8, ptr %p
  %i1 = add i64 %i, 1
  store i64 %i1, ptr %i.a
  %d8 = sub i8 %c, 48
  %isd = icmp ult i8 %d8, 10
  %d = zext i8 %d8 to i64
  %es = load i64, ptr %es.a
  br i1 %isd, label %digit, label %notdigit

digit:
  store i1 true, ptr %tok.a
  %inexp = icmp ugt i64 %es, 0
  br i1 %inexp, label %expdigit, label %mantdigit

expdigit:
  %ex = load i64, ptr %ex.a
  %ex10 = mul i64 %ex, 10
  %ex1 = add i64 %ex10, %d
  store i64 %ex1, ptr %ex.a
  store i64 3, ptr %es.a
  %exbig = icmp ugt i64 %ex1, 400
  br i1 %exbig, label %fail, label %loop

mantdigit:
  %acc = load i64, ptr %acc.a
  %acc10 = mul i64 %acc, 10
  %acc1 = add i64 %acc10, %d
  store i64 %acc1, ptr %acc.a
  %nd = load i64, ptr %nd.a
  %nd1 = add i64 %nd, 1
  store i64 %nd1, ptr %nd.a
  %fr = load i64, ptr %fr.a
  %has_dot = icmp sge i64 %fr, 0
  %fr_inc = add i64 %fr, 1
  %fr1 = select i1 %has_dot, i64 %fr_inc, i64 %fr
  store i64 %fr1, ptr %fr.a
  %too_many = icmp ugt i64 %nd1, 15
  br i1 %too_many, label %fail, label %loop

notdigit:
  %is_sp = icmp eq i8 %c, 32
  %c9 = sub i8 %c, 9
  %is_ctl = icmp ult i8 %c9, 5           ; \t \n \v \f \r
  %ws = or i1 %is_sp, %is_ctl
  br i1 %ws, label %space, label %other

space:
  %tok = load i1, ptr %tok.a
  br i1 %tok, label %emit, label %eol

emit:
  %e_nd = load i64, ptr %nd.a
  %e_es = load i64, ptr %es.a
  %e_cnt = load i64, ptr %cnt.a
  %nodig = icmp eq i64 %e_nd, 0
  %e_open = icmp ult i64 %e_es, 3
  %e_some = icmp ugt i64 %e_es, 0
  %e_half = and i1 %e_open, %e_some     ; an exponent without digits
  %full = icmp uge i64 %e_cnt, %cap
  %b1 = or i1 %nodig, %e_half
  %b2 = or i1 %b1, %full
  br i1 %b2, label %fail, label %store

store:
  %s_acc = load i64, ptr %acc.a
  %s_fr = load i64, ptr %fr.a
  %s_ex = load i64, ptr %ex.a
  %s_exneg = load i1, ptr %exneg.a
  %s_neg = load i1, ptr %neg.a
  %val = call double @value(i64 %s_acc, i64 %s_fr, i64 %s_ex, i1 %s_exneg, i1 %s_neg, ptr %bad.a)
  %bad = load i1, ptr %bad.a
  br i1 %bad, label %fail, label %store2

store2:
  %op = getelementptr inbounds double, ptr %out, i64 %e_cnt
  store double %val, ptr %op
  %cnt1 = add i64 %e_cnt, 1
  store i64 %cnt1, ptr %cnt.a
  %lt = load i64, ptr %lt.a
  %lt1 = add i64 %lt, 1
  store i64 %lt1, ptr %lt.a
  br label %eol

eol:
  %is_nl = icmp eq i8 %c, 10
  br i1 %is_nl, label %newline, label %reset

newline:
  %l = load i64, ptr %lt.a
  %empty = icmp eq i64 %l, 0
  %rowok = icmp eq i64 %l, %cols
  %lineok = or i1 %empty, %rowok
  store i64 0, ptr %lt.a
  br i1 %lineok, label %reset, label %fail

other:
  %o_tok = load i1, ptr %tok.a
  %o_nd = load i64, ptr %nd.a
  %is_dot = icmp eq i8 %c, 46
  br i1 %is_dot, label %dot, label %not_dot

dot:
  %o_fr = load i64, ptr %fr.a
  %second_dot = icmp sge i64 %o_fr, 0
  %dot_in_exp = icmp ugt i64 %es, 0
  %dot_bad = or i1 %second_dot, %dot_in_exp
  store i64 0, ptr %fr.a
  store i1 true, ptr %tok.a
  br i1 %dot_bad, label %fail, label %loop

not_dot:
  %is_e = icmp eq i8 %c, 101
  %is_E = icmp eq i8 %c, 69
  %is_ee = or i1 %is_e, %is_E
  br i1 %is_ee, label %expo, label %sign_chk

expo:
  %has_dig = icmp ugt i64 %o_nd, 0
  %no_exp = icmp eq i64 %es, 0
  %e_ok = and i1 %has_dig, %no_exp
  store i64 1, ptr %es.a
  br i1 %e_ok, label %loop, label %fail

sign_chk:
  %is_minus = icmp eq i8 %c, 45
  %is_plus = icmp eq i8 %c, 43
  %is_sign = or i1 %is_minus, %is_plus
  br i1 %is_sign, label %sign, label %fail

sign:
  %after_e = icmp eq i64 %es, 1
  br i1 %after_e, label %expsign, label %mantsign

expsign:
  store i1 %is_minus, ptr %exneg.a
  store i64 2, ptr %es.a
  br label %loop

mantsign:
  store i1 %is_minus, ptr %neg.a
  store i1 true, ptr %tok.a
  br i1 %o_tok, label %fail, label %loop

finish:                          ; the end of the text ends a line
  %f_tok = load i1, ptr %tok.a
  br i1 %f_tok, label %femit, label %fline

femit:
  %f_nd = load i64, ptr %nd.a
  %f_es = load i64, ptr %es.a
  %f_cnt = load i64, ptr %cnt.a
  %f_nodig = icmp eq i64 %f_nd, 0
  %f_open = icmp ult i64 %f_es, 3
  %f_some = icmp ugt i64 %f_es, 0
  %f_half = and i1 %f_open, %f_some
  %f_full = icmp uge i64 %f_cnt, %cap
  %fb1 = or i1 %f_nodig, %f_half
  %fb2 = or i1 %fb1, %f_full
  br i1 %fb2, label %fail, label %fstore

fstore:
  %fs_acc = load i64, ptr %acc.a
  %fs_fr = load i64, ptr %fr.a
  %fs_ex = load i64, ptr %ex.a
  %fs_exneg = load i1, ptr %exneg.a
  %fs_neg = load i1, ptr %neg.a
  %fval = call double @value(i64 %fs_acc, i64 %fs_fr, i64 %fs_ex, i1 %fs_exneg, i1 %fs_neg, ptr %bad.a)
  %fbad = load i1, ptr %bad.a
  br i1 %fbad, label %fail, label %fstore2

fstore2:
  %fop = getelementptr inbounds double, ptr %out, i64 %f_cnt
  store double %fval, ptr %fop
  %fcnt1 = add i64 %f_cnt, 1
  store i64 %fcnt1, ptr %cnt.a
  %flt = load i64, ptr %lt.a
  %flt1 = add i64 %flt, 1
  store i64 %flt1, ptr %lt.a
  br label %fline

fline:
  %fl = load i64, ptr %lt.a
  %fempty = icmp eq i64 %fl, 0
  %frowok = icmp eq i64 %fl, %cols
  %flineok = or i1 %fempty, %frowok
  br i1 %flineok, label %done, label %fail

done:
  %total = load i64, ptr %cnt.a
  ret i64 %total

fail:
  ret i64 -1
}
"""

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
    for part in (_CACHE_MAGIC.decode(), _IR, llvmlite.__version__, llvm_version, cpu, features):
        h.update(part.encode())
        h.update(b"\0")
    return cache_dir().parent / "io-native" / f"decimal-{h.hexdigest()}.o"


def _cache_read(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_CACHE_MAGIC)
    digest, obj = data[head : head + 32], data[head + 32 :]
    ok = data.startswith(_CACHE_MAGIC) and obj and hashlib.sha256(obj).digest() == digest
    return obj if ok else None


def _cache_write(path: Path, obj: bytes) -> None:
    from .._files import atomic_write

    try:
        atomic_write(path, lambda f: f.write(_CACHE_MAGIC + hashlib.sha256(obj).digest() + obj))
    except OSError:  # a read-only or full cache folder only costs the next process the build
        pass


def _compile(llvm):
    """(engine, address of ``parse``, whether the object code came from the on-disk cache)."""
    cpu = llvm.get_host_cpu_name()
    try:
        features = llvm.get_host_cpu_features().flatten()
    except Exception:  # some platforms cannot report features: generic code for the CPU name
        features = ""
    path = _cache_path(llvm, cpu, features)
    obj = _cache_read(path)
    mod = llvm.parse_assembly(_IR if obj is None else "")  # an empty module when the object code is cached
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
    if obj is None and hasattr(llvm, "create_pass_builder"):  # llvmlite >= 0.44 (the new pass manager)
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
        pb.getModulePassManager().run(mod, pb)  # mem2reg and the rest: the variables live in registers
    built: list[bytes] = []
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.set_object_cache(lambda _m, buf: built.append(bytes(buf)), lambda _m: obj)
    engine.finalize_object()
    address = engine.get_function_address("parse")
    if not address:
        raise RuntimeError("the decimal parser has no entry point")
    if obj is None and built:
        _cache_write(path, built[0])
    return engine, address, obj is not None


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
                engine, address, from_cache = _compile(llvm)
                fn = ctypes.CFUNCTYPE(
                    ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64
                )(address)
                fn._engine = engine  # the engine owns the machine code: keep it alive with the function
                fn.from_cache = from_cache
                _kernel = fn
            except Exception:
                _kernel = False
    return _kernel


def parse_rows(data: bytes, start: int, columns: int) -> np.ndarray | None:
    """The numbers of ``data[start:]`` as ``[rows, columns]`` float64, or ``None``.

    ``data``: LF-normalised bytes; ``columns`` > 0. ``None`` when the text is not in the simple decimal form
    (see the module notes: exponents, ``nan``, letters, over 15 digits, a line without exactly ``columns``
    numbers) or the native parser is unavailable; the caller then parses with its general reader. Zero rows
    give a ``[0, columns]`` array.
    """
    fn = _kernel if _kernel is not None else _build()
    if not fn or columns <= 0:
        return None
    n = len(data) - start
    # a number takes a character and a separator, and a line holds at most ``columns`` of them: the buffer is
    # about the size of the result (what numpy's reader would hold too), never a multiple of the file
    cap = min(n // 2 + 1, (data.count(b"\n", start) + 1) * columns)
    out = np.empty(cap, dtype=np.float64)
    addr = np.frombuffer(data, dtype=np.uint8).ctypes.data + start  # the bytes themselves, no copy
    count = int(fn(addr, n, out.ctypes.data, cap, columns))
    if count < 0:
        return None
    return out[:count].reshape(count // columns, columns)
