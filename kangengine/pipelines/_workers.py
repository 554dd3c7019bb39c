"""Worker-process lifetime: a batch worker must never outlive the process that gives it work.

A ``kangengine convert --workers N`` parent that is killed with SIGKILL runs no clean-up code, so its workers
have to notice on their own. :func:`bind_to_parent`, called first in each worker (the pool initializer of
:mod:`.batch`), asks the Linux kernel to send the worker SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG, SIGKILL)`` through ctypes): immediate, and independent of what the worker is doing
(a long native call that holds the GIL included). Where ``prctl`` is unavailable (macOS, Windows, a libc
without it), a daemon thread polls the parent pid instead. Either way, a parent that died before the call
(the race between spawning and binding) makes the worker leave at once.

multiprocessing's resource tracker, the other process a pool starts, exits by itself once every process
holding its pipe (the parent and the workers) is gone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

__all__ = ["bind_to_parent"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _set_pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, poll_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(1)  # the parent is gone: leave instead of finishing work nobody will record


def bind_to_parent(parent: int, *, poll_s: float = 0.5) -> str:
    """End this process when its parent process ``parent`` ends.

    Args:
        parent: the pid of the process that must outlive this one (``os.getpid()`` of the pool's creator,
            passed to the worker; ``os.getppid()`` inside the worker cannot tell a dead parent from a live one
            once the worker has been re-parented).
        poll_s: seconds between checks of the fallback watchdog thread.
    Returns:
        ``"pdeathsig"`` (the kernel will send SIGKILL when the spawning thread of the parent ends) or
        ``"watchdog"`` (a daemon thread polls ``os.getppid()``).

    When the parent is already gone, this does not return: the process exits at once with status 1.
    """
    how = "pdeathsig" if _set_pdeathsig() else "watchdog"
    if os.getppid() != parent:  # died (or was never our parent) before the binding took effect
        os._exit(1)
    if how == "watchdog":
        threading.Thread(target=_watch, args=(parent, poll_s), daemon=True, name="kangengine-parent-watch").start()
    return how
