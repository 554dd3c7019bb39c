"""The plain numpy/torch execution of a traced program: the reference every other strategy is tested against.

:func:`compile_replay` turns a :class:`~.trace.Trace` into a Python function (compiled with ``exec``) that
evaluates the recorded statements on real arrays, for numpy arrays and torch tensors alike (any device, any
float dtype, autograd included): the per-chunk cost is the array arithmetic, not Python's constant-folding
decisions. Large CPU batches are processed in chunks of :data:`CHUNK` frames on a thread pool
(:func:`run_chunks`, also used by the native kernels of :mod:`.native`).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .trace import Trace, float_literal

__all__ = ["CHUNK", "array_namespace", "compile_replay", "expand", "is_torch", "run_chunks", "soa", "torch_empty"]

_TEMP = re.compile(r"\bt\d+\b")


def compile_replay(trace: Trace) -> Callable:
    """``def name(args): <trace>; out[s:e, row, k] = value`` compiled with exec."""
    lines = list(trace.lines)
    for out, b, values in trace.outputs:
        for k, c in enumerate(values):
            value = float_literal(c) if isinstance(c, float) else str(c)
            lines.append(f"{out}[s:e, {b}, {k}] = {value}")
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
        body.append("    " + line)
        if i in frees:
            body.append("    del " + ", ".join(sorted(frees[i])))
    src = f"def {trace.name}({trace.args}):\n" + "\n".join(body or ["    pass"]) + "\n"
    scope: dict = {}
    exec(compile(src, f"<kangengine-fk {trace.name}>", "exec"), scope)
    return scope[trace.name]


# -- arrays ---------------------------------------------------------------------------------------------


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch")


class _NumpyNS:
    cos = staticmethod(np.cos)
    sin = staticmethod(np.sin)
    sqrt = staticmethod(np.sqrt)


def array_namespace(x):
    """The ``xp`` a replay takes for ``x``: torch for a tensor, else numpy's cos/sin/sqrt."""
    if is_torch(x):
        import torch

        return torch
    return _NumpyNS


_MADVISE = None


def torch_empty(shape, like):
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


def soa(x, perm):
    """``x`` permuted by ``perm`` into a contiguous array: frames innermost, as a replay reads its inputs."""
    if is_torch(x):
        return x.permute(*perm).contiguous()
    return np.ascontiguousarray(x.transpose(perm))


def expand(x, shape):
    """``x`` broadcast to ``shape`` without a copy."""
    if is_torch(x):
        return x.expand(*shape)
    return np.broadcast_to(x, shape)


# -- chunks on a thread pool ------------------------------------------------------------------------------

CHUNK = 32768
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor | None:
    global _POOL
    n = os.cpu_count() or 1
    if n <= 1:
        return None
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(n, 8), thread_name_prefix="kangengine-fk")
    return _POOL


def run_chunks(n: int, fn: Callable[[int, int], None], on_cpu: bool, chunk: int = CHUNK) -> None:
    """Call ``fn(s, e)`` for frames ``[0, n)``: at once off the CPU or for ``n <= chunk``, else in chunks of
    ``chunk`` frames on the thread pool (the calls must release the GIL to run in parallel)."""
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
