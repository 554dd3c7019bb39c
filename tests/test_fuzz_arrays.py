"""Seeded mutation fuzzing of the array readers, on real files.

Inputs are real clips written by our own writers (``SkeletonMotion.save_npz`` of a shared CMU BVH walk,
``save_articulation_motion_npz`` of the shared AMP walk mapped onto the AMP humanoid MJCF, ``MotionLibrary.save``
of the shared AMP clips) and the shared poselib ``.npy`` files. Each case mutates one file three ways: raw bytes
(bit flips, random runs, boundary integers, truncation, duplication, deletion); one ``.npy`` member of an npz
mutated and re-zipped with a correct CRC (so the mutation reaches the array parser, not only the zip check);
or one value replaced by a hostile one (text for numbers, NaN, 0, 1e300, deep JSON, scaled or zero
quaternions, wrong shapes, shifted tables).

Every case asserts:

* the reader returns or raises a :class:`~kangengine.errors.KangEngineError`, nothing else;
* what it returns holds no NaN or inf and only unit quaternions (``|norm - 1| <= 1e-5``);
* Python and numpy memory (``tracemalloc`` peak during the call) stays under
  ``MEMORY_PER_INPUT_BYTE * input bytes + MEMORY_SLACK`` (the readers read only what exists: a header claiming
  gigabytes never allocates them). Torch storage is not traced; library tensors are views of the mapped file,
  whose offsets safetensors checks against the file's size.

CI runs a bounded number of cases per reader (``CASES``); the whole file takes well under a minute.
"""

from __future__ import annotations

import io
import json
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import data_file

from kangengine.errors import KangEngineError

CASES = {"skeleton_npz": 220, "articulation_npz": 160, "poselib": 260, "library": 120, "load_motion": 80}
MEMORY_PER_INPUT_BYTE = 24
MEMORY_SLACK = 4 << 20  # 4 MiB: interpreter and numpy bookkeeping, error messages
QUAT_TOL = 1e-5

_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1]


# -- mutations -----------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    """One random byte-level mutation of ``data``."""
    b = bytearray(data)
    if not b:
        return bytes(rng.integers(0, 256, 16, dtype=np.uint8))
    op = int(rng.integers(7))
    pos = int(rng.integers(len(b)))
    if op == 0:  # bit flips
        for _ in range(int(rng.integers(1, 9))):
            i = int(rng.integers(len(b)))
            b[i] ^= 1 << int(rng.integers(8))
    elif op == 1:  # random run
        n = int(rng.integers(1, 17))
        b[pos : pos + n] = bytes(rng.integers(0, 256, n, dtype=np.uint8))
    elif op == 2:  # boundary integer, little endian
        width = int(rng.choice([1, 2, 4, 8]))
        value = int(rng.choice(_INTERESTING)) & ((1 << (8 * width)) - 1)
        b[pos : pos + width] = value.to_bytes(width, "little")
    elif op == 3:  # truncate
        del b[pos:]
    elif op == 4:  # duplicate a chunk
        n = int(rng.integers(1, 65))
        b[pos:pos] = b[pos : pos + n]
    elif op == 5:  # delete a chunk
        del b[pos : pos + int(rng.integers(1, 65))]
    else:  # digits into text (headers, JSON)
        b[pos : pos + 1] = str(int(rng.choice(_INTERESTING))).encode()
    return bytes(b)


def _npy_bytes(arr: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, arr, allow_pickle=False)
    return f.getvalue()


def rezip(members: dict[str, bytes]) -> bytes:
    """An npz (stored zip) of ``{name: .npy bytes}`` with correct CRCs and a fixed member date (the same
    bytes on every call: ``writestr`` of a name stamps the current time, to 2 s)."""
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)), data)
    return f.getvalue()


def _hostile_values(arr: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Replacements for one array: wrong kinds, non-finite, extreme, wrong shapes, bad quaternions."""
    out = [
        np.array("abc"),
        np.array(np.nan),
        np.array(np.inf),
        np.array(0.0),
        np.array(-1),
        np.array(1e300),
        np.array(2**63 - 1, dtype=np.int64),
        np.array(2**64 - 1, dtype=np.uint64),
        np.array([1.0, 2.0]),
        np.array(True),
        np.array(1 + 2j),
        np.array("[" * 200_000),
        np.array('{"a": ' * 5000),
        np.array(b"\xff\xfe"),
        np.zeros((0,) + arr.shape[1:], arr.dtype) if arr.ndim else np.zeros(0),
    ]
    if arr.dtype.kind == "f" and arr.size:
        a = arr.copy()
        a.reshape(-1)[int(rng.integers(a.size))] = np.nan
        with np.errstate(all="ignore"):
            out += [a, arr * 0, arr * 1.0005, arr * 1.1, arr * 1e300, arr.astype(np.float16)]
        if arr.ndim:
            out.append(arr[..., :-1])
        if arr.ndim >= 1 and arr.shape[-1] == 4:  # quaternions: one zero, one slightly off, one far off
            for scale in (0.0, 1.0 + 5e-4, 1.01):
                a = arr.copy()
                a.reshape(-1, 4)[int(rng.integers(a.size // 4))] *= scale
                out.append(a)
    if arr.dtype.kind in "iu" and arr.size:
        out += [arr + 1, arr.reshape(-1)[::-1].reshape(arr.shape), -arr - 2, arr.astype(np.float64)]
    if arr.dtype.kind == "U" and arr.ndim:
        out += [arr[:-1], np.array([s + "/x" for s in arr.reshape(-1)]).reshape(arr.shape)]
    return out


def mutate_npz(data: bytes, rng: np.random.Generator) -> bytes:
    """Raw bytes (1/3), one member's bytes re-zipped (1/3), or one value made hostile (1/3)."""
    way = int(rng.integers(3))
    if way == 0:
        return mutate_bytes(data, rng)
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    key = str(rng.choice(sorted(arrays)))
    members = {k: _npy_bytes(v) for k, v in arrays.items()}
    if way == 1:
        members[key] = mutate_bytes(members[key], rng)
    else:
        choice = _hostile_values(arrays[key], rng)
        if rng.random() < 0.1:
            del members[key]
        else:
            members[key] = _npy_bytes(choice[int(rng.integers(len(choice)))])
    return rezip(members)


def mutate_library(data: bytes, rng: np.random.Generator) -> bytes:
    """Raw bytes (1/3; the data region has no checksum), the JSON header edited (1/3), or one table given a
    hostile value and rewritten with safetensors (1/3)."""
    import torch
    from safetensors.torch import load, save

    way = int(rng.integers(3))
    if way == 0:
        return mutate_bytes(data, rng)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    if way == 1:
        meta = header["__metadata__"]
        inner = json.loads(meta["header"])
        edits = [
            lambda: inner.__setitem__("clip_names", inner["clip_names"][:-1]),
            lambda: inner.__setitem__("node_names", inner["node_names"][::-1]),
            lambda: inner.__setitem__("dtype", "float16"),
            lambda: inner.__setitem__("interpolation", "cubic"),
            lambda: inner.__setitem__("has_local_translations", "yes"),
            lambda: inner.__setitem__("backend_fields", [["q", [10**9]]]),
            lambda: inner.pop("node_names"),
            lambda: meta.__setitem__("format_version", "one"),
            lambda: meta.__setitem__("header", "[" * 100_000),
            lambda: meta.__setitem__("header", "17"),
        ]
        edits[int(rng.integers(len(edits)))]()
        if meta.get("header") not in ("17",) and not str(meta.get("header", "")).startswith("["):
            meta["header"] = json.dumps(inner)
        name = str(rng.choice([k for k in header if k != "__metadata__"]))
        if rng.random() < 0.3:  # a tensor entry claiming more data than exists
            header[name]["shape"] = [10**9] + header[name]["shape"][1:]
        raw = json.dumps(header).encode()
        return len(raw).to_bytes(8, "little") + raw + data[8 + n :]
    tensors = load(data)
    meta = header["__metadata__"]
    key = str(rng.choice(sorted(tensors)))
    t = tensors[key]
    choices = [
        torch.roll(t, 1, 0) if t.ndim else t,  # a shifted table
        t * 0,
        t.double() * float("nan"),
        t[:-1] if t.ndim and t.shape[0] > 1 else t.reshape(1, -1),
        t.double() * 1.1,
        -t,
        t.to(torch.float16) if t.is_floating_point() else t.double(),
    ]
    tensors[key] = choices[int(rng.integers(len(choices)))].contiguous()
    return save(tensors, metadata=meta)


# -- checks ----------------------------------------------------------------------------------------------------


def _unit(q, what):
    q = np.asarray(q, dtype=np.float64)
    assert np.isfinite(q).all(), f"{what} holds NaN or inf"
    dev = np.abs(np.linalg.norm(q, axis=-1) - 1)
    assert dev.size == 0 or dev.max() <= QUAT_TOL, f"{what}: a quaternion of norm off by {dev.max():.3g}"


def _finite(a, what):
    assert np.isfinite(np.asarray(a, dtype=np.float64)).all(), f"{what} holds NaN or inf"


def check_skeleton_motion(m):
    _unit(m.local_rotation, "local_rotation")
    _finite(m.root_translation, "root_translation")
    _finite(m.tree.local_translation, "tree.local_translation")
    if m.local_translation is not None:
        _finite(m.local_translation, "local_translation")
    if hasattr(m, "fps"):
        assert np.isfinite(m.fps) and m.fps > 0


def run_case(read, data: bytes, path: Path, check) -> str:
    """Write ``data`` to ``path``, read it under tracemalloc; returns ``"ok"`` or ``"refused"``."""
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = read(path)
    except KangEngineError:
        result = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    bound = MEMORY_PER_INPUT_BYTE * len(data) + MEMORY_SLACK
    assert peak <= bound, f"peak {peak} bytes for a {len(data)}-byte input; bound {bound}"
    if result is None:
        return "refused"
    check(result)
    return "ok"


def fuzz(read, seeds: list[bytes], mutate, check, n: int, tmp_path: Path, suffix: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    counts = {"ok": 0, "refused": 0}
    for case in range(n):
        base = seeds[case % len(seeds)]
        data = mutate(base, rng)
        try:
            counts[run_case(read, data, tmp_path / f"case{suffix}", check)] += 1
        except Exception as exc:  # report the case that failed, reproducibly
            bad = tmp_path / f"failing_case_{case}{suffix}"
            bad.write_bytes(data)
            raise AssertionError(
                f"case {case} (seed {seed}, input kept in {bad}): {type(exc).__name__}: {exc}"
            ) from exc
    return counts


# -- fixtures: real files written by our writers -------------------------------------------------------------


@pytest.fixture(scope="module")
def skeleton_npz(tmp_path_factory) -> bytes:
    from kangengine.io import load_bvh

    m = load_bvh(data_file("bvh/cmu/02_01_cgspeed_walk.bvh"))[:40]
    p = tmp_path_factory.mktemp("seed") / "walk.npz"
    m.save_npz(p)
    return p.read_bytes()


@pytest.fixture(scope="module")
def amp_layout():
    from kangengine.animation import ArticulationCoordinateLayout
    from kangengine.asset import MJCFLoader

    desc = MJCFLoader.load(data_file("mjcf/protomotions/amp_humanoid.xml"), order="DFS")
    return ArticulationCoordinateLayout.from_data(data=desc, free_root=True)


@pytest.fixture(scope="module")
def articulation_npz(tmp_path_factory, amp_layout) -> bytes:
    from kangengine.animation import save_articulation_motion_npz
    from kangengine.animation.mapper import ArticulationMotionMapper
    from kangengine.datasets import load_poselib

    walk = load_poselib(data_file("motions/amp_poselib/amp_humanoid_walk.npy"))[:30]
    motion = ArticulationMotionMapper(amp_layout).to_articulation_motion(walk).motion
    p = tmp_path_factory.mktemp("seed") / "walk_q.npz"
    save_articulation_motion_npz(p, motion, layout=amp_layout)
    return p.read_bytes()


@pytest.fixture(scope="module")
def library_file(tmp_path_factory) -> bytes:
    from kangengine.animation import MotionLibrary
    from kangengine.datasets import load_poselib

    clips = [load_poselib(data_file(f"motions/amp_poselib/amp_humanoid_{n}.npy"))[:12] for n in ("walk", "run")]
    p = tmp_path_factory.mktemp("seed") / "lib.safetensors"
    MotionLibrary(clips).save(p)
    return p.read_bytes()


POSELIB = ["amp_humanoid_walk.npy", "amp_humanoid_run.npy", "amp_humanoid_backflip.npy", "amp_humanoid_tpose.npy"]


# -- the fuzz tests ----------------------------------------------------------------------------------------------


def test_fuzz_skeleton_motion_npz(skeleton_npz, tmp_path):
    from kangengine.animation import SkeletonMotion

    counts = fuzz(
        SkeletonMotion.load_npz,
        [skeleton_npz],
        mutate_npz,
        check_skeleton_motion,
        CASES["skeleton_npz"],
        tmp_path,
        ".npz",
        1,
    )
    assert counts["ok"] >= 5 and counts["refused"] >= 50, counts  # both paths exercised


def test_fuzz_articulation_motion_npz(articulation_npz, amp_layout, tmp_path):
    from kangengine.animation import load_articulation_motion_npz

    quat_cols = [b.q_offset + (3 if b.joint_type.value == "free" else 0) for b in amp_layout.blocks if b.q_dim >= 4]
    cols = np.asarray(quat_cols)[:, None] + np.arange(4)

    def check(m):
        _finite(m.q, "q")
        _finite(m.qd, "qd")
        _unit(m.q[:, cols], "q quaternions")
        assert m.nq == amp_layout.nq and m.nv == amp_layout.nv and m.fps() > 0

    counts = fuzz(
        lambda p: load_articulation_motion_npz(p, amp_layout),
        [articulation_npz],
        mutate_npz,
        check,
        CASES["articulation_npz"],
        tmp_path,
        ".npz",
        2,
    )
    assert counts["ok"] >= 5 and counts["refused"] >= 40, counts


def test_fuzz_poselib_npy(tmp_path):
    from kangengine.animation import SkeletonMotion
    from kangengine.datasets import load_poselib

    seeds = [data_file(f"motions/amp_poselib/{n}").read_bytes() for n in POSELIB]

    def check(m):
        if isinstance(m, SkeletonMotion):
            check_skeleton_motion(m)
        else:
            _unit(m.local_rotation, "local_rotation")
            _finite(m.root_translation, "root_translation")

    counts = fuzz(load_poselib, seeds, mutate_bytes, check, CASES["poselib"], tmp_path, ".npy", 3)
    assert counts["ok"] >= 5 and counts["refused"] >= 50, counts


def test_fuzz_motion_library(library_file, tmp_path):
    import torch

    from kangengine.animation import MotionLibrary

    def check(lib):
        fps = lib.clip_fps.numpy()
        assert np.isfinite(fps).all() and (fps > 0).all()
        ids = torch.arange(lib.num_motions)
        durations = (lib.clip_frame_count.double() - 1) / lib.clip_fps
        for t in (0.0, 0.37):
            s = lib.sample(ids, durations * t, loop=False)
            _finite(s.root_positions, "sampled root_positions")
            _unit(s.local_rotations_wxyz, "sampled local_rotations_wxyz")

    counts = fuzz(MotionLibrary.load, [library_file], mutate_library, check, CASES["library"], tmp_path, ".st", 4)
    assert counts["ok"] >= 5 and counts["refused"] >= 30, counts


def test_fuzz_load_motion_dispatch(skeleton_npz, tmp_path):
    """``load_motion`` on a mutated ``.npz``: the dispatcher itself (zip directory only) never fails otherwise."""
    from kangengine.pipelines import load_motion

    counts = fuzz(
        load_motion, [skeleton_npz], mutate_npz, check_skeleton_motion, CASES["load_motion"], tmp_path, ".npz", 5
    )
    assert counts["refused"] >= 10, counts


def test_mutations_are_reproducible(skeleton_npz):
    a = [mutate_npz(skeleton_npz, np.random.default_rng(9)) for _ in range(2)]
    assert a[0] == a[1] and a[0] != skeleton_npz
