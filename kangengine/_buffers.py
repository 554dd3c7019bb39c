"""A bounded pool of freed large output buffers, so that a process mapping clip after clip reuses the memory
of the results it has dropped instead of asking the kernel for fresh pages every call.

Why: an array of more than a few MB is its own ``mmap`` (glibc hands blocks above its mmap threshold, at most
32 MiB, straight to and from the kernel), and the kernel zeroes every fresh page when it is first written,
4 KiB at a time, at about 10 GB/s on our machines. For a one-million-frame SMPL humanoid clip that is 0.06 to
0.08 s of system time for the 634 MB of ``q`` and ``qd``, a third of the whole mapping; written again, the same
memory costs nothing extra. Allocators keep freed memory for this reason (glibc for small blocks, jemalloc,
PyTorch's CUDA caching allocator); this pool does it for the large outputs of the passes that write every
element of their arrays (:func:`empty`).

How: each handed-out array is a view of a block (a numpy ``uint8`` array) through a fresh ``np.frombuffer`` array;
when the last view of that array dies (the caller dropped the result and every array derived from it), a
finalizer puts the block back on the free list. A block is never handed out while any view of it lives. The free
list holds at most :func:`set_limit` bytes (default: the smaller of 2 GiB and an eighth of physical memory, or
``KANGENGINE_OUTPUT_POOL_BYTES``); past it the oldest blocks are let go. Requests under 4 MiB are plain
``np.empty`` (glibc already reuses those). A request takes the smallest free block that holds it and
is at most twice its size.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

__all__ = ["empty", "set_limit", "stats", "release"]

_MIN_BYTES = 4 << 20
# reentrant: a finalizer (a dropped result) may run on this thread while it holds the lock, when an allocation
# inside the lock sets off the garbage collector
_lock = threading.RLock()
_free: list[np.ndarray] = []  # oldest first
_counts = {"reused": 0, "fresh": 0, "dropped": 0}


def _default_limit() -> int:
    env = os.environ.get("KANGENGINE_OUTPUT_POOL_BYTES")
    if env is not None:
        try:
            return max(int(env), 0)
        except ValueError:
            from .errors import FormatError

            raise FormatError(
                f"KANGENGINE_OUTPUT_POOL_BYTES={env!r}; expected a whole number of bytes (0 turns the pool off)",
                item="KANGENGINE_OUTPUT_POOL_BYTES",
            ) from None
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 16 << 30
    return min(2 << 30, physical // 8)


_limit = _default_limit()


def _trim() -> None:
    """Let the oldest freed blocks go until what is held fits the limit (the caller holds the lock)."""
    held = sum(b.nbytes for b in _free)
    while _free and held > _limit:
        held -= _free.pop(0).nbytes
        _counts["dropped"] += 1


def _give_back(block: np.ndarray) -> None:
    """Finalizer of a handed-out view: the block joins the free list (the oldest let go past the limit)."""
    with _lock:
        if block.nbytes > _limit:  # could never be held: the blocks held stay
            _counts["dropped"] += 1
            return
        _free.append(block)
        _trim()


def _take(nbytes: int) -> np.ndarray:
    """A block of at least ``nbytes``: a freed one at most twice that size when one is held, else fresh."""
    block = None
    with _lock:
        for b in _free:
            if nbytes <= b.nbytes <= 2 * nbytes and (block is None or b.nbytes < block.nbytes):
                block = b
        for i, b in enumerate(_free):  # by identity (a reentrant give-back may have moved it)
            if b is block:
                del _free[i]
                break
        _counts["fresh" if block is None else "reused"] += 1
    return np.empty(nbytes, dtype=np.uint8) if block is None else block


def _request(shape, dtype) -> tuple[tuple[int, ...], np.dtype, int]:
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    return shape, dtype, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _view(block: np.ndarray, nbytes: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    # np.frombuffer of a memoryview gives an array whose base is a memoryview, not an ndarray, so numpy does not
    # collapse the base chain of later views past it: it lives exactly as long as some view of it does, and its
    # finalizer hands the block back only then (np.frombuffer of the block itself would have the block as base,
    # and views would skip it)
    flat = np.frombuffer(memoryview(block)[:nbytes], dtype=dtype)
    weakref.finalize(flat, _give_back, block).atexit = False
    return flat.reshape(shape)


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array like ``np.empty(shape, dtype)``, from a freed block when one fits.

    Only for arrays whose every element the caller writes before anyone reads it. Writable, aligned as numpy
    aligns its own (block start), ``OWNDATA`` False."""
    shape, dtype, nbytes = _request(shape, dtype)
    if nbytes < _MIN_BYTES or _limit == 0:
        return np.empty(shape, dtype=dtype)
    return _view(_take(nbytes), nbytes, shape, dtype)


def set_limit(nbytes: int) -> int:
    """Set the most bytes of freed blocks the pool keeps (0: keep none, every output fresh memory); returns the
    previous limit. Blocks held past the new limit are let go at once (oldest first)."""
    global _limit
    if int(nbytes) < 0:
        from .errors import FormatError

        raise FormatError(f"output pool limit {nbytes}; expected 0 or more bytes", item="output pool")
    with _lock:
        previous, _limit = _limit, int(nbytes)
        _trim()
    return previous


def stats() -> dict:
    """``{"limit", "held_bytes", "held_blocks", "reused", "fresh", "dropped"}``: the limit and the freed memory
    held now (bytes, blocks), and how many requests reused a block, took fresh memory, and how many freed blocks
    were let go (past the limit) since the process started."""
    with _lock:
        return {
            "limit": _limit,
            "held_bytes": sum(b.nbytes for b in _free),
            "held_blocks": len(_free),
            **_counts,
        }


def release() -> int:
    """Let go of every freed block now (their memory returns to the system); returns the bytes released."""
    with _lock:
        held = sum(b.nbytes for b in _free)
        _free.clear()
    return held
