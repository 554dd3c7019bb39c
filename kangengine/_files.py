"""File helpers shared by every writer and npz reader: atomic writes and pickle-free npz loading."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import FileMissingError, FormatError

__all__ = ["atomic_write", "load_npz"]


def atomic_write(path: str | os.PathLike, write: Callable[[object], None], *, suffix: str = "") -> Path:
    """Write a file so that readers see either the old file or the complete new one.

    ``write(fileobj)`` writes into a temporary file in the destination folder (binary mode); the
    temporary file is flushed, fsynced and renamed over ``path``; on any error it is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load_npz(path: str | os.PathLike, *, required: tuple[str, ...] = (), kind: str = "npz") -> dict:
    """Read every array of an ``.npz`` file without pickle.

    Raises:
        FileMissingError: no such file.
        FormatError: not a readable npz, an object (pickled) array, or a missing ``required`` key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileMissingError(f"no such {kind} file", path=path)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except ValueError as exc:
        raise FormatError(
            f"holds pickled objects, which are refused ({exc}); expected plain arrays", path=path
        ) from exc
    except Exception as exc:
        raise FormatError(f"not a readable npz file ({type(exc).__name__}: {exc})", path=path) from exc
    missing = [k for k in required if k not in data]
    if missing:
        raise FormatError(f"missing keys {missing}; a {kind} file holds {list(required)}", path=path)
    return data
