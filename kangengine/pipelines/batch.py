"""Dataset-grade batches shared by ``convert`` and ``validate``: which clips, where their outputs go, what is
done already, and how the work is spread over processes.

- :func:`collect_clips`: files, folders (recursive) and globs -> sorted :class:`ClipSource` list, each with
  its path *as found* (a symlink keeps its own name, so ``clip.bvh`` -> an extensionless blob in a Hugging
  Face cache is read as BVH) and its path relative to the common root of the inputs (mirrored under
  ``--out``).
- :func:`check_out_dir`: the output folder exists (or is made) and takes a file, before any work.
- The manifest (``manifest.jsonl``, or ``manifest.shard-I-of-N.jsonl`` for a shard): one JSON object per line
  per finished clip (``done`` or ``failed``, with its fingerprint, output, error and warnings), appended with a
  single ``write`` so a killed run loses at most the clip in progress; runs accumulate. :func:`append_manifest`
  calls ``fsync`` after each line; :class:`ManifestAppender` (a batch's lines) at most once a second and when
  closed. :func:`read_manifests` gives the latest entry of every clip over every manifest of a folder.
- :func:`run_tasks`: the tasks in this process, in ``workers`` spawned processes that ignore Ctrl-C and
  leave when their parent dies (they poll its pid), or as Ray tasks (``ray="local"`` or a cluster's
  address); results come back to the parent, which alone writes the manifest and the summary, so every
  backend writes the same files. With ``sigterm=True`` a SIGTERM ends the batch the way Ctrl-C does
  (:class:`BatchTerminated`, exit status 143), so the caller's clean-up (the summary) runs first.
"""

from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import KangEngineError

__all__ = [
    "MANIFEST_NAME",
    "ClipSource",
    "OutputFolderError",
    "BatchInterrupted",
    "BatchTerminated",
    "collect_clips",
    "check_out_dir",
    "output_stems",
    "manifest_name",
    "append_manifest",
    "ManifestAppender",
    "read_manifests",
    "clean_stale_temporaries",
    "shard_of",
    "file_sha256",
    "regular_file_problem",
    "run_tasks",
    "RayBackendError",
    "recorded_warnings",
]

MANIFEST_NAME = "manifest.jsonl"
_MANIFEST_GLOB = "manifest*.jsonl"


class OutputFolderError(KangEngineError, OSError):
    """The output folder is a file, cannot be created, or does not take a new file."""


class RayBackendError(KangEngineError):
    """``ray`` was asked for but is not installed, or the Ray cluster at the given address cannot be reached."""


class BatchInterrupted(KangEngineError):
    """Ctrl-C during a batch: ``done`` clips finished in this run (all in the manifest), ``total`` were due."""

    def __init__(self, done: int, total: int, out_dir):
        self.done, self.total = done, total
        super().__init__(
            f"interrupted: {done} of {total} clips finished in this run, listed in the manifest", path=out_dir
        )


class BatchTerminated(SystemExit):
    """SIGTERM during :func:`run_tasks` with ``sigterm=True`` (raised just after the result being recorded, like
    Ctrl-C), so that ``finally`` blocks run (the summary is written from the manifest). A ``SystemExit`` with
    status 143 (128 + SIGTERM): uncaught, the process ends with the status a SIGTERM'd shell job reports."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


@dataclass(frozen=True)
class ClipSource:
    """One input clip of a batch.

    Attributes:
        path: absolute path as found, not resolved (a symlink keeps its own name and extension).
        rel: POSIX path relative to the common root of the inputs (``walks/02_01.bvh``); the clip's name in
            the manifest and the place of its outputs under ``--out``.
    """

    path: str
    rel: str


def _walk(folder: str, extensions: frozenset[str]) -> Iterable[str]:
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back up the tree
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in filenames:
            if not f.startswith(".") and os.path.splitext(f)[1].lower() in extensions:
                yield os.path.join(dirpath, f)


def collect_clips(inputs: Sequence[str | os.PathLike], *, extensions: Iterable[str]) -> list[ClipSource]:
    """Expand files, folders and globs into the batch's clips, sorted by relative path.

    Args:
        inputs: files (kept whatever their extension, so a bad one is listed as failed), folders (every file
            below them, links followed, whose extension is in ``extensions``; hidden files skipped) and glob
            patterns (``**`` recursive; matched folders are walked).
        extensions: motion extensions, lower case with the dot (``kangengine.pipelines.MOTION_LOADERS``).
    Returns:
        :class:`ClipSource` per distinct file; ``rel`` is relative to the common folder of the inputs (a
        folder itself, a file's parent, a glob's fixed prefix).
    Raises:
        FileMissingError: an input that is neither a file, a folder nor a glob matching anything.
    """
    from ..errors import FileMissingError

    exts = frozenset(e.lower() for e in extensions)
    found: list[str] = []
    roots: list[str] = []
    for item in map(os.fspath, inputs):
        if glob.has_magic(item):
            fixed = item.split("*")[0].split("?")[0].split("[")[0]
            roots.append(os.path.abspath(fixed if fixed.endswith(os.sep) else os.path.dirname(fixed) or "."))
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise FileMissingError("matches no file", path=item)
            for m in matches:
                if os.path.isdir(m):
                    found.extend(_walk(m, exts))
                elif os.path.splitext(m)[1].lower() in exts:
                    found.append(m)
        elif os.path.isdir(item):
            roots.append(os.path.abspath(item))
            found.extend(_walk(item, exts))
        elif os.path.lexists(item):
            roots.append(os.path.dirname(os.path.abspath(item)))
            found.append(item)
        else:
            raise FileMissingError("no such clip, folder or matching glob", path=item)
    paths = sorted(set(os.path.abspath(p) for p in found))
    if not paths:
        return []
    root = os.path.commonpath(roots + [os.path.dirname(p) for p in paths])
    return sorted((ClipSource(p, Path(os.path.relpath(p, root)).as_posix()) for p in paths), key=lambda c: c.rel)


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def output_stems(rels: Sequence[str], *, clean: bool = False) -> list[str]:
    """One output path stem per clip (``rel`` without its extension), unique: clips that would share one
    (``a.bvh`` and ``a.fbx``; with ``clean``, names that clean to the same file name) get ``-<8 hex of rel>``.

    Args:
        rels: the clips' relative paths. clean: replace characters other than letters, digits, ``._-`` in
            each path component by ``_`` (report file names).
    """

    def stem(rel: str) -> str:
        parts = rel.rsplit(".", 1)[0].split("/") if "." in rel.rsplit("/", 1)[-1] else rel.split("/")
        if clean:
            parts = [_SAFE.sub("_", p).strip("._") or "clip" for p in parts]
        return "/".join(parts)

    stems = [stem(r) for r in rels]
    taken = collections.Counter(s.lower() for s in stems)  # case-insensitive file systems
    return [
        s if taken[s.lower()] == 1 else f"{s}-{hashlib.sha256(r.encode()).hexdigest()[:8]}" for r, s in zip(rels, stems)
    ]


def check_out_dir(out: str | os.PathLike) -> Path:
    """Make the output folder (with parents) and check that it takes a new file, before any work.

    Raises:
        OutputFolderError: ``out`` is a file, cannot be created, or refuses a file (read-only, full).
    """
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise OutputFolderError("is a file; expected an output folder", path=p)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputFolderError(
            f"cannot be created ({exc.strerror or exc}); expected a writable folder", path=p
        ) from exc
    try:
        fd, probe = tempfile.mkstemp(prefix=".kangengine-probe.", suffix=".tmp", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputFolderError(f"is not writable ({exc.strerror or exc}); expected a writable folder", path=p) from exc
    return p


def manifest_name(shard_index: int | None = None, shard_count: int | None = None) -> str:
    """``manifest.jsonl``, or ``manifest.shard-I-of-N.jsonl`` for shard ``I`` of ``N``."""
    if shard_count is None or shard_count <= 1:
        return MANIFEST_NAME
    return f"manifest.shard-{shard_index}-of-{shard_count}.jsonl"


def _manifest_line(entry: dict) -> bytes:
    return (json.dumps(entry, sort_keys=True, allow_nan=False) + "\n").encode()


def append_manifest(path: str | os.PathLike, entry: dict) -> None:
    """Append one entry as one line: a single ``write`` to a file opened ``O_APPEND``, then ``fsync``, so the
    line is either in the file whole or not at all after a kill (readers skip a torn last line anyway)."""
    line = _manifest_line(entry)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


class ManifestAppender:
    """A batch's manifest lines: each entry one ``write`` of one line to the file, kept open ``O_APPEND``, as it
    comes; ``fsync`` at most every ``sync_every_s`` seconds and on :meth:`close`.

    What a kill can lose is what :func:`append_manifest` loses: a line is in the page cache, so in the file
    for the next process, once :meth:`append` returns (SIGKILL, SIGTERM and Ctrl-C lose at most the clip in
    progress). Only a crash of the machine itself (power, kernel) can lose more: the lines of the last
    ``sync_every_s`` seconds, whose clips the next run then converts again (their outputs are rewritten
    atomically). One ``fsync`` per clip costs about 5 ms of waiting on an ext4 disk, more than a whole clip's
    CPU time, and a parent collecting results from many workers would be held to 200 clips/s by it.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike, *, sync_every_s: float = 1.0):
        self.path = Path(path)
        self.sync_every_s = float(sync_every_s)
        self._fd: int | None = None
        self._unsynced = False
        self._synced_at = time.monotonic()

    def append(self, entry: dict) -> None:
        """Write ``entry`` as one line (``fsync`` when the last one is older than ``sync_every_s``)."""
        line = _manifest_line(entry)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.write(self._fd, line)
        self._unsynced = True
        if time.monotonic() - self._synced_at >= self.sync_every_s:
            self.sync()

    def sync(self) -> None:
        """``fsync`` the lines written so far."""
        if self._fd is not None and self._unsynced:
            os.fsync(self._fd)
            self._unsynced = False
        self._synced_at = time.monotonic()

    def close(self) -> None:
        """``fsync`` and close (again: nothing)."""
        if self._fd is not None:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> ManifestAppender:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def read_manifests(out_dir: str | os.PathLike, *, command: str | None = None) -> dict[str, dict]:
    """The latest entry of every clip over every manifest (``manifest*.jsonl``) of ``out_dir``.

    Lines are taken in file order, manifests in name order; an entry replaces an earlier one of the same
    clip when its ``time`` is not older. Lines that are not JSON objects with a ``clip`` (a line torn by a
    kill) are skipped. ``command`` keeps only entries of that command (``"convert"``, ``"validate"``).
    """
    latest: dict[str, dict] = {}
    for path in sorted(Path(out_dir).glob(_MANIFEST_GLOB)):
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            continue
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(entry, dict) or not isinstance(entry.get("clip"), str):
                continue
            if command is not None and entry.get("command") != command:
                continue
            old = latest.get(entry["clip"])
            if old is None or float(entry.get("time", 0)) >= float(old.get("time", 0)):
                latest[entry["clip"]] = entry
    return latest


_TMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}(?:\.[A-Za-z0-9]+)?\.tmp$")


def clean_stale_temporaries(out_dir: str | os.PathLike, owned: Iterable[str | os.PathLike]) -> int:
    """Remove the temporary files a killed run left (``atomic_write``'s ``.<name>.<random>.tmp``) whose final
    file is one of ``owned`` (this run's outputs, manifest and summary; another shard's live temporaries
    are left alone). Returns how many were removed."""
    owned_set = {os.path.abspath(p) for p in owned}
    removed = 0
    for dirpath, _, filenames in os.walk(out_dir):
        for f in filenames:
            m = _TMP.match(f)
            if m and os.path.abspath(os.path.join(dirpath, m["name"])) in owned_set:
                try:
                    os.unlink(os.path.join(dirpath, f))
                    removed += 1
                except OSError:
                    pass
    return removed


def shard_of(items: Sequence, shard_index: int | None, shard_count: int | None) -> list:
    """Shard ``I`` of ``N`` of a sorted list: items ``I, I + N, I + 2N, ...`` (all of them without shards).

    Raises:
        KangEngineError: ``I`` not in ``0 .. N-1``.
    """
    if shard_count is None or shard_count <= 1:
        return list(items)
    if shard_index is None or not 0 <= shard_index < shard_count:
        raise KangEngineError(
            f"shard index {shard_index}; expected 0 .. {shard_count - 1} for {shard_count} shards",
            item="--shard-index",
        )
    return list(items[shard_index::shard_count])


def regular_file_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a clip without blocking (a FIFO, a device, a folder, a dangling link),
    or ``None`` for a regular file. Checked before the file is opened."""
    try:
        st = os.stat(path)  # follows links: a link to a regular file is fine
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        return f"is {kind}; expected a regular motion file"
    return None


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class recorded_warnings:
    """Context manager recording the warnings raised inside it as ``"Category: message"`` strings (each
    once, in order), instead of printing them."""

    def __enter__(self) -> list[str]:
        self._cm = warnings.catch_warnings(record=True)
        self._caught = self._cm.__enter__()
        warnings.simplefilter("always")
        self.messages: list[str] = []
        return self.messages

    def __exit__(self, *exc):
        for w in self._caught:
            text = f"{w.category.__name__}: {w.message}"
            if text not in self.messages:
                self.messages.append(text)
        return self._cm.__exit__(*exc)


# -- processes ------------------------------------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)  # the parent is gone (killed): leave instead of finishing work nobody will record
        time.sleep(0.5)


def _worker_init(parent: int, threads: int, init: Callable | None, init_args: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    from ._workers import bind_to_parent  # the kernel kills this worker when its parent dies (prctl PDEATHSIG)

    bind_to_parent(parent)
    set_threads(threads)
    if init is not None:
        init(*init_args)


def set_threads(threads: int) -> None:
    """Torch intra-op threads of this process (only when torch is already loaded or needed later: the
    environment variable is set too, for a torch imported afterwards)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def run_tasks(
    fn: Callable,
    tasks: Sequence[tuple],
    *,
    workers: int = 1,
    threads: int = 1,
    initializer: Callable | None = None,
    initargs: tuple = (),
    on_result: Callable[[object], None],
    ray: str | None = None,
    sigterm: bool = False,
) -> None:
    """Run ``fn(*task)`` for every task and hand each result to ``on_result`` (in this process, as each task
    finishes).

    Args:
        workers: processes (1: in this process, in order). Workers are spawned, ignore SIGINT and exit when
            this process dies (they poll its pid), so a SIGKILL of the parent leaves no process behind.
            With ``ray``: the most tasks in flight at once and the CPUs of a local instance (1: no limit,
            and a local instance with every CPU of this machine).
        threads: torch threads per process.
        initializer, initargs: run once in each worker (and once here when ``workers`` is 1; with ``ray``,
            once in each Ray worker process before its first task).
        ray: run the tasks as Ray tasks (one CPU each) instead: ``"local"`` starts a Ray instance on this
            machine for the batch (dashboard off) and stops it after; any other value is the address of a
            running cluster (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``), to which this process
            connects as a driver and from which it disconnects after. When Ray is already initialised in
            this process (``ray.init`` by the caller), that instance is used and left running. ``fn``, the
            tasks and the results travel by pickle; the paths in the tasks (model, clips, output folder)
            must be the same on every node (a shared file system) and KangEngine installed on each.
        sigterm: a SIGTERM to this process raises :class:`BatchTerminated` the way Ctrl-C raises
            ``KeyboardInterrupt`` (after the result being recorded; workers stopped), when called from the main
            thread and SIGTERM has its default action (a handler of the caller's is left alone).
    Raises:
        KeyboardInterrupt: after the workers were stopped (the results handed over so far are kept).
        BatchTerminated: SIGTERM with ``sigterm=True``, likewise.
        RayBackendError: ``ray`` given but not installed, or the cluster unreachable (before any task ran).
    """
    with _deferred_interrupts(sigterm=sigterm) as guard:
        if ray is not None:
            if tasks:
                _run_ray(fn, tasks, ray, workers, threads, initializer, initargs, lambda r: guard.record(on_result, r))
            return
        if workers <= 1 or len(tasks) <= 1:
            set_threads(threads)
            if initializer is not None:
                initializer(*initargs)
            for t in tasks:
                guard.record(on_result, fn(*t))
            return
        _run_pool(fn, tasks, workers, threads, initializer, initargs, lambda r: guard.record(on_result, r))


def _run_pool(fn, tasks, workers, threads, initializer, initargs, on_result) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)),
        mp_context=mp.get_context("spawn"),
        initializer=_worker_init,
        initargs=(os.getpid(), threads, initializer, initargs),
    )
    try:
        pending = {pool.submit(fn, *t) for t in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_result(f.result())
    except BaseException:
        manager = getattr(pool, "_executor_manager_thread", None)
        for p in list(getattr(pool, "_processes", {}).values()):  # do not wait for clips in progress
            p.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        # Join the pool's manager thread (quick: its workers are gone). Left running, it closes its wakeup pipe
        # while the interpreter's exit hook writes to it: CPython 3.11 prints "OSError: Bad file descriptor"
        # from concurrent.futures at exit after a signalled run.
        if manager is not None:
            manager.join(timeout=30)
        raise
    pool.shutdown(wait=True)


class _deferred_interrupts:
    """Ctrl-C raises ``KeyboardInterrupt`` at once (with ``sigterm``, SIGTERM raises :class:`BatchTerminated`),
    except while a result is being recorded (manifest line, summary): then it is raised just after, so the
    manifest and the count of finished clips agree."""

    def __init__(self, *, sigterm: bool = False):
        self.sigterm = sigterm

    def __enter__(self):
        self.pending: type[BaseException] | None = None
        self.recording = False
        self.previous: dict = {}
        if threading.current_thread() is threading.main_thread():
            self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handler)
            if self.sigterm and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                self.previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum, frame):
        error = BatchTerminated if signum == signal.SIGTERM else KeyboardInterrupt
        if self.recording:
            self.pending = self.pending or error
        else:
            raise error()

    def record(self, on_result, result) -> None:
        self.recording = True
        try:
            on_result(result)
        finally:
            self.recording = False
        if self.pending is not None:
            raise self.pending()

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            if previous is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signum, previous)
        return False


# -- Ray ------------------------------------------------------------------------------------------------------

_RAY_INITIALISED: list = []  # (initializer, initargs) already run in this Ray worker process


def _ray_call(fn: Callable, task: tuple, threads: int, initializer: Callable | None, initargs: tuple):
    """One task in a Ray worker process: its torch threads set (before every task: Ray reuses worker processes
    across tasks and may reset ``OMP_NUM_THREADS`` to the task's CPUs), the initializer run once per process,
    then ``fn(*task)``."""
    set_threads(threads)
    if initializer is not None and (initializer, initargs) not in _RAY_INITIALISED:
        initializer(*initargs)
        _RAY_INITIALISED.append((initializer, initargs))
    return fn(*task)


def _ray_connect(address: str, workers: int):
    """``(ray module, whether this call started or connected it)``; ``ray.init`` with the start cost kept low."""
    try:
        import ray
    except ImportError as exc:
        raise RayBackendError(
            f"needs the ray package ({exc}); install it with: pip install 'kangengine[ray]'", item="--ray"
        ) from None
    if ray.is_initialized():
        return ray, False
    import logging

    if address == "local":
        kwargs = {"num_cpus": workers if workers > 1 else None, "include_dashboard": False}
    else:
        kwargs = {"address": address}
    try:
        ray.init(**kwargs, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayBackendError(
            f"cannot start or reach Ray at {address!r} ({' '.join(str(exc).split())}); expected 'local' or a "
            "running cluster's address",
            item="--ray",
        ) from None
    return ray, True


def _run_ray(fn, tasks, address, workers, threads, initializer, initargs, on_result) -> None:
    ray, owned = _ray_connect(address, int(workers))
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
    limit = int(workers) if workers > 1 else len(tasks)
    queue = iter(tasks)
    pending: list = []
    try:
        for task in queue:  # keep ``limit`` tasks in flight, record each result as it comes
            pending.append(remote.remote(fn, task, threads, initializer, initargs))
            if len(pending) >= limit:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    on_result(ray.get(ref))
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                on_result(ray.get(ref))
    except BaseException:
        for ref in pending:  # do not wait for clips in progress
            ray.cancel(ref, force=True)
        raise
    finally:
        if owned:
            ray.shutdown()
