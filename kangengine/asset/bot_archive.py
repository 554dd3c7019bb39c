"""Safe extraction of ``.superdex_bot_archive`` files (a zip of one ``.superdex_bot`` and its assets).

The archive is extracted into ``cache_dir/<first 32 hex digits of its SHA-256>/``: first into a fresh temporary
folder inside ``cache_dir``, then renamed into place, so the cache holds either nothing or the complete folder.
Before a byte is written every member is checked: no absolute path (``/x``, ``\\x``, ``C:x``), no ``..``
component, no backslash, no NUL, no symlink or other special file (zip external attributes), no duplicate name,
at most ``max_members`` members, and at most ``max_unpacked_bytes`` in total (the sizes the headers declare, and
again the bytes actually decompressed, since headers can lie). Each resolved destination must lie inside the
temporary folder. Nothing is written outside ``cache_dir``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from ..errors import FileMissingError, FormatError

__all__ = ["ArchiveError", "extract_bot_archive", "default_bot_cache_dir"]

DEFAULT_MAX_UNPACKED_BYTES = 1 << 30  # 1 GiB
DEFAULT_MAX_MEMBERS = 10_000
_CHUNK = 1 << 20


class ArchiveError(FormatError):
    """A bot archive is unsafe or malformed (the message names the member and the rule)."""


def default_bot_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/kangengine/bots``, else ``~/.cache/kangengine/bots``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kangengine" / "bots"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_member(info: zipfile.ZipInfo, path: Path) -> PurePosixPath:
    name = info.filename
    item = f"member {name!r}"
    if "\x00" in name or "\\" in name:
        raise ArchiveError("name holds NUL or a backslash; expected a plain relative path", path=path, item=item)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError("is an absolute path; expected a path relative to the archive", path=path, item=item)
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise ArchiveError("has a '..' component, which could escape the extraction folder", path=path, item=item)
    mode = (info.external_attr >> 16) & 0xFFFF
    if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # no type bits: a plain file
        raise ArchiveError(
            "is a symlink or special file; only regular files and folders are allowed", path=path, item=item
        )
    if info.flag_bits & 0x1:
        raise ArchiveError("is encrypted; expected a plain archive", path=path, item=item)
    return PurePosixPath(*[p for p in parts if p not in ("", ".")])


def extract_bot_archive(
    path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> Path:
    """Extract a ``.superdex_bot_archive`` into the cache (once per content hash) and return its bot file.

    Args:
        path: the archive.
        cache_dir: cache root (default :func:`default_bot_cache_dir`).
        max_unpacked_bytes: cap on the total size of the files.
        max_members: cap on the number of members (files and folders).
    Returns:
        Path of the single ``.superdex_bot`` inside the cached folder.
    Raises:
        FileMissingError; ArchiveError: not a zip, an unsafe member (see the module docstring), a cap exceeded,
        or not exactly one ``.superdex_bot`` in it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileMissingError("no such bot archive", path=path)
    cache = Path(cache_dir) if cache_dir is not None else default_bot_cache_dir()
    digest = _sha256(path)[:32]
    final = cache / digest
    if final.is_dir():
        return _find_bot(final, path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"not a readable zip archive ({exc})", path=path) from exc
    with zf:
        infos = zf.infolist()
        if len(infos) > max_members:
            raise ArchiveError(f"holds {len(infos)} members; the cap is max_members={max_members}", path=path)
        rels, seen, declared = [], set(), 0
        for info in infos:
            rel = _check_member(info, path)
            key = str(rel).lower()
            if key in seen:
                raise ArchiveError("appears twice", path=path, item=f"member {info.filename!r}")
            seen.add(key)
            declared += info.file_size
            if declared > max_unpacked_bytes:
                raise ArchiveError(
                    f"unpacks to more than max_unpacked_bytes={max_unpacked_bytes} bytes",
                    path=path,
                    item=f"member {info.filename!r}",
                )
            rels.append(rel)
        bots = [r for r, i in zip(rels, infos) if not i.is_dir() and r.name.endswith(".superdex_bot")]
        if len(bots) != 1:
            raise ArchiveError(
                f"holds {len(bots)} .superdex_bot files {[str(b) for b in bots]}; expected one", path=path
            )
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.", suffix=".tmp", dir=cache))
        try:
            _extract_all(zf, infos, rels, tmp, path, max_unpacked_bytes)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # another process won the race if it exists; otherwise a real error
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
            raise
    return _find_bot(final, path)


def _extract_all(zf, infos, rels, tmp: Path, path: Path, cap: int) -> None:
    root = tmp.resolve()
    written = 0
    for info, rel in zip(infos, rels):
        if not rel.parts:
            continue
        dest = (root / Path(*rel.parts)).resolve()
        if root not in dest.parents:
            raise ArchiveError(
                "would be written outside the extraction folder", path=path, item=f"member {info.filename!r}"
            )
        try:
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "xb") as out:
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    written += len(chunk)
                    if written > cap:
                        raise ArchiveError(
                            f"decompresses to more than max_unpacked_bytes={cap} bytes (its header declared "
                            f"{info.file_size})",
                            path=path,
                            item=f"member {info.filename!r}",
                        )
                    out.write(chunk)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
            raise ArchiveError(f"cannot be decompressed ({exc})", path=path, item=f"member {info.filename!r}") from exc
        except OSError as exc:  # e.g. a file and a folder of the same name
            raise ArchiveError(f"cannot be written ({exc})", path=path, item=f"member {info.filename!r}") from exc


def _find_bot(folder: Path, path: Path) -> Path:
    bots = [p for p in folder.rglob("*.superdex_bot") if p.is_file()]
    if len(bots) != 1:
        raise ArchiveError(
            f"the cached folder {folder.name} holds {len(bots)} .superdex_bot files; expected one", path=path
        )
    return bots[0]
