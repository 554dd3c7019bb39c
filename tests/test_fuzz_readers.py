"""Seeded mutation fuzzing of the file readers (BVH, FBX, MJCF, URDF), on the shared real files.

Each case mutates one real file one of two ways:

* **bytes**: bit flips, random bytes, a boundary integer written over 4 or 8 bytes, a run deleted, duplicated
  or inserted, truncation;
* **fields**: one value the format holds replaced by a hostile one. Text formats (BVH, MJCF, URDF): a number
  becomes NaN, inf, 1e300, 1e-300, 0, a negative, a huge integer or text; a name gets invalid UTF-8; a line is
  duplicated or deleted. Binary FBX: an array's count, encoding or stored length, a record's end offset, or
  one int64/double/float/int32 value inside a property becomes a boundary value.

Every case asserts:

* the reader returns or raises a :class:`~kangengine.errors.KangEngineError`, nothing else;
* what it returns holds no NaN or inf and only unit quaternions (``|norm - 1| <= 1e-4``), and (models)
  non-negative masses;
* Python and numpy memory (``tracemalloc`` peak during the call) stays under
  ``MEMORY_PER_INPUT_BYTE * input bytes + MEMORY_SLACK``. libassimp's and MuJoCo's own C allocations are not
  traced; what libassimp may allocate is capped before it runs by the FBX reader's check of every record,
  array count and compressed length against the file's size.

CI runs ``CASES`` cases per reader and input (the whole file takes well under a minute);
``benchmarks/fuzz_readers.py`` runs many more with the same mutators and prints the outcome counts.
"""

from __future__ import annotations

import math
import random
import re
import struct
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA

from kangengine.errors import KangEngineError

#: Bound on the traced peak memory of one read: this many bytes per input byte, plus ``MEMORY_SLACK``.
MEMORY_PER_INPUT_BYTE = 200
MEMORY_SLACK = 64 * 2**20
CASES = 24

_HOSTILE_NUMBERS = (
    "nan", "inf", "-inf", "NaN", "1e300", "-1e300", "1e-300", "1e39", "3.5e38", "0", "-0", "-1", "-5",
    "99999999999999999999", "1e400", "abc", "0x10", "1e", "",
)  # fmt: skip
_BOUNDARY_INTS = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, 0x7FFFFFF0, 1 << 40)
_BOUNDARY_DOUBLES = (math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, 0.0, 3.5e38, 1e18)


# -- mutators ----------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One random byte-level mutation of ``data``."""
    b = bytearray(data)
    n = len(b)
    kind = rng.randrange(7)
    if kind == 0:  # flip a few bits
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # random bytes
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(n)] = rng.randrange(256)
    elif kind == 2:  # a boundary integer over 4 or 8 bytes
        width = rng.choice((4, 8))
        i = rng.randrange(max(1, n - width))
        v = rng.choice(_BOUNDARY_INTS) & ((1 << (8 * width)) - 1)
        b[i : i + width] = v.to_bytes(width, "little")
    elif kind == 3:  # delete a run
        i = rng.randrange(n)
        del b[i : i + rng.randint(1, 256)]
    elif kind == 4:  # duplicate a run
        i = rng.randrange(n)
        j = min(n, i + rng.randint(1, 256))
        b[j:j] = b[i:j]
    elif kind == 5:  # insert random bytes
        i = rng.randrange(n)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    else:  # truncate
        del b[rng.randrange(1, n) :]
    return bytes(b)


_NUMBER = re.compile(rb"(?<![A-Za-z_0-9.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_NAME = re.compile(rb'name="([^"]+)"|(?:JOINT|ROOT)[ \t]+(\S+)')


def mutate_text_fields(data: bytes, rng: random.Random) -> bytes:
    """One field-level mutation of a text format (BVH, MJCF, URDF)."""
    kind = rng.randrange(10)
    if kind < 7:  # a number becomes a hostile one (weighted: most of what these files hold is numbers)
        spans = [m.span() for m in _NUMBER.finditer(data)]
        if spans:
            # half the time in the first 8 KB (headers, hierarchies, bodies), else anywhere
            head = [s for s in spans if s[0] < 8192] if rng.random() < 0.5 else spans
            i, j = rng.choice(head or spans)
            return data[:i] + rng.choice(_HOSTILE_NUMBERS).encode() + data[j:]
    if kind == 7:  # a name gets invalid UTF-8
        names = [m for m in _NAME.finditer(data)]
        if names:
            m = rng.choice(names)
            g = 1 if m.group(1) is not None else 2
            i = m.start(g) + rng.randrange(len(m.group(g)))
            return data[:i] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80")) + data[i:]
    lines = data.split(b"\n")
    k = rng.randrange(len(lines))
    if kind == 8:  # duplicate a line
        lines.insert(k, lines[k])
    else:  # delete a line
        del lines[k]
    return b"\n".join(lines)


@dataclass(frozen=True)
class _FbxField:
    offset: int  # byte offset of the value
    kind: str  # "count", "encoding", "stored", "end", or a struct code of a value
    width: int


def fbx_fields(data: bytes) -> list[_FbxField]:
    """Where the binary FBX 7.x file ``data`` keeps its counts, lengths and scalar values (records walked)."""
    version = struct.unpack_from("<I", data, 23)[0]
    word = 8 if version >= 7500 else 4
    head = struct.Struct("<QQQ" if word == 8 else "<III")
    out: list[_FbxField] = []
    scalar = {"Y": ("<h", 2), "C": ("<b", 1), "I": ("<i", 4), "F": ("<f", 4), "D": ("<d", 8), "L": ("<q", 8)}
    stack, pos = [len(data)], 27
    while stack and pos + head.size + 1 <= stack[-1]:
        end_offset, n_props, _ = head.unpack_from(data, pos)
        if end_offset == 0:
            if len(stack) == 1:
                break
            pos = stack.pop()
            continue
        out.append(_FbxField(pos, "end", word))
        p = pos + head.size + 1 + data[pos + head.size]
        for _ in range(n_props):
            code = chr(data[p])
            if code in "fdlib":
                out += [_FbxField(p + 1, "count", 4), _FbxField(p + 5, "encoding", 4), _FbxField(p + 9, "stored", 4)]
                n, enc, stored = struct.unpack_from("<III", data, p + 1)
                if enc == 0 and n:
                    item = {"f": 4, "d": 8, "l": 8, "i": 4, "b": 1}[code]
                    fmt = {"f": "<f", "d": "<d", "l": "<q", "i": "<i", "b": "<b"}[code]
                    out.append(_FbxField(p + 13 + item * random.Random(p).randrange(n), fmt, item))
                p += 13 + stored
            elif code in "SR":
                p += 5 + struct.unpack_from("<I", data, p + 1)[0]
            else:
                fmt, width = scalar[code]
                out.append(_FbxField(p + 1, fmt, width))
                p += 1 + width
        if p < end_offset:
            stack.append(end_offset)
            pos = p
        else:
            pos = end_offset
        while len(stack) > 1 and pos >= stack[-1]:
            pos = stack.pop()
    return out


def mutate_fbx_fields(data: bytes, rng: random.Random, fields: list[_FbxField]) -> bytes:
    """One field-level mutation of a binary FBX: a count, length or value set to a boundary value."""
    f = rng.choice(fields)
    b = bytearray(data)
    if f.kind in ("count", "encoding", "stored", "end"):
        old = int.from_bytes(b[f.offset : f.offset + f.width], "little")
        new = rng.choice((*_BOUNDARY_INTS, old + 1, max(0, old - 1), old * 2, old * 1000))
        b[f.offset : f.offset + f.width] = (new & ((1 << (8 * f.width)) - 1)).to_bytes(f.width, "little")
    elif f.kind in ("<d", "<f"):
        v = rng.choice(_BOUNDARY_DOUBLES)
        if f.kind == "<f" and abs(v) > 3.4e38 and math.isfinite(v):
            v = math.copysign(math.inf, v)
        struct.pack_into(f.kind, b, f.offset, v)
    else:
        bits = 8 * f.width
        v = rng.choice((*_BOUNDARY_INTS, -1, -(2 ** (bits - 1)))) & ((1 << bits) - 1)
        b[f.offset : f.offset + f.width] = v.to_bytes(f.width, "little")
    return bytes(b)


# -- what a result must satisfy ----------------------------------------------------------------------------


def _finite(name: str, arr) -> str | None:
    if arr is None:
        return None
    a = np.asarray(arr, dtype=np.float64)
    return None if np.isfinite(a).all() else f"{name} holds NaN or inf"


def _unit(name: str, q) -> str | None:
    norm = np.linalg.norm(np.asarray(q, dtype=np.float64).reshape(-1, 4), axis=1)
    return None if norm.size == 0 or np.abs(norm - 1.0).max() <= 1e-4 else f"{name} holds non-unit quaternions"


def check_motion(m) -> list[str]:
    """What is wrong with a returned ``SkeletonMotion`` (empty: nothing)."""
    problems = [
        _finite("root_translation", m.root_translation),
        _finite("local_rotation", m.local_rotation),
        _finite("local_translation", m.local_translation),
        _finite("tree.local_translation", m.tree.local_translation),
        _unit("local_rotation", m.local_rotation),
        None if math.isfinite(m.fps) and m.fps > 0 else f"fps {m.fps}",
    ]
    return [p for p in problems if p]


def check_desc(d) -> list[str]:
    """What is wrong with a returned ``ArticulationDesc`` (empty: nothing)."""
    problems = []
    for b in d.bodies:
        problems += [
            _finite(f"body {b.name} pos", b.pos),
            _finite(f"body {b.name} com", b.com),
            _finite(f"body {b.name} inertia", b.inertia),
            _unit(f"body {b.name} quat", b.quat_wxyz),
            None if math.isfinite(b.mass) and b.mass >= 0 else f"body {b.name} mass {b.mass}",
        ]
    for j in d.joints:
        problems += [_finite(f"joint {j.name} axis", j.axis), _finite(f"joint {j.name} range", j.range)]
    for g in d.geoms:
        problems += [_finite(f"geom {g.name} size", g.size), _unit(f"geom {g.name} quat", g.quat_wxyz)]
    problems.append(_finite("gravity", getattr(d, "gravity", None)))
    return [p for p in problems if p]


# -- one case ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reader:
    name: str
    files: tuple[str, ...]  # relative to the shared data
    suffix: str
    load: Callable[[Path], object]
    check: Callable[[object], list[str]]
    binary_fbx: bool = False


def _load_bvh(p):
    from kangengine.io import load_bvh

    return load_bvh(p)


def _load_fbx(p):
    from kangengine.io import load_fbx

    return load_fbx(p)


def _load_mjcf(p):
    from kangengine.asset import MJCFLoader

    return MJCFLoader.load(p)


def _load_urdf(p):
    from kangengine.asset import URDFLoader

    return URDFLoader.load(p, strict=False)


READERS = {
    "bvh": Reader(
        "bvh",
        ("bvh/other/bvhio_example.bvh", "bvh/other/sinusoidal_xyz_noendsite.bvh", "bvh/other/arm_3joint.bvh"),
        ".bvh",
        _load_bvh,
        check_motion,
    ),
    "fbx": Reader("fbx", ("fbx/huesitos.fbx", "fbx/07_01_cmu.fbx"), ".fbx", _load_fbx, check_motion, True),
    "mjcf": Reader(
        "mjcf",
        ("mjcf/dm_control/model_with_ball_joints.xml", "mjcf/mujoco/humanoid.xml"),
        ".xml",
        _load_mjcf,
        check_desc,
    ),
    "urdf": Reader(
        "urdf",
        ("urdf/isaacgymenvs/cartpole.urdf", "urdf/unitree/g1_29dof.nomesh.urdf"),
        ".urdf",
        _load_urdf,
        check_desc,
    ),
}


@dataclass(frozen=True)
class Outcome:
    kind: str  # "loaded", "refused", "crashed" (not a KangEngineError), "bad result", "memory"
    detail: str
    peak_bytes: int


def run_case(reader: Reader, data: bytes, path: Path) -> Outcome:
    """Write ``data`` to ``path``, read it with ``reader`` under tracemalloc, and judge the outcome."""
    path.write_bytes(data)
    bound = MEMORY_PER_INPUT_BYTE * len(data) + MEMORY_SLACK
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = reader.load(path)
        kind, detail = "loaded", ""
    except KangEngineError as exc:
        kind, detail, result = "refused", type(exc).__name__, None
    except Exception as exc:  # what the test is about: nothing but KangEngineError may escape
        kind, detail, result = "crashed", f"{type(exc).__name__}: {str(exc)[:300]}", None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if result is not None:
        problems = reader.check(result)
        if problems:
            kind, detail = "bad result", "; ".join(problems[:3])
    if peak > bound:
        kind, detail = "memory", f"peak {peak / 2**20:.1f} MiB > bound {bound / 2**20:.1f} MiB ({detail})"
    return Outcome(kind, detail, peak)


def cases(reader: Reader, seed: int, count: int):
    """``count`` mutated inputs of ``reader``'s files: (description, bytes), reproducible from ``seed``."""
    rng = random.Random(seed)
    originals = [(rel, (DATA / rel).read_bytes()) for rel in reader.files]
    fields = {rel: fbx_fields(d) for rel, d in originals} if reader.binary_fbx else {}
    for k in range(count):
        rel, data = originals[k % len(originals)]
        if rng.random() < 0.5:
            yield f"{rel} #{k} bytes", mutate_bytes(data, rng)
        elif reader.binary_fbx:
            yield f"{rel} #{k} fields", mutate_fbx_fields(data, rng, fields[rel])
        else:
            yield f"{rel} #{k} fields", mutate_text_fields(data, rng)


# -- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(READERS))
def test_unmutated_files_pass_the_checks(tmp_path, name):
    """The judge itself: every original file loads and passes (else a mutation's verdict would mean nothing)."""
    reader = READERS[name]
    for rel in reader.files:
        out = run_case(reader, (DATA / rel).read_bytes(), tmp_path / f"orig{reader.suffix}")
        assert out.kind == "loaded", (rel, out)


def test_the_judge_catches_what_it_should(tmp_path):
    """The checks fail on a NaN, a non-unit quaternion and a non-KangEngine exception."""
    from kangengine.io import load_bvh

    m = load_bvh(DATA / "bvh/other/arm_3joint.bvh")
    rot = np.asarray(m.local_rotation).copy()
    rot[0, 0] *= 2.0
    bad = type(m)(m.tree, m.root_translation, rot, m.fps, None, metadata=m.metadata, skip_checks=True)
    assert check_motion(bad) == ["local_rotation holds non-unit quaternions"]
    rt = np.asarray(m.root_translation).copy()
    rt[0, 0] = np.nan
    bad = type(m)(m.tree, rt, m.local_rotation, m.fps, None, metadata=m.metadata, skip_checks=True)
    assert check_motion(bad) == ["root_translation holds NaN or inf"]

    def boom(_p):
        raise ValueError("not ours")

    crash = Reader("x", (), ".x", boom, check_motion)
    assert run_case(crash, b"x", tmp_path / "a.x").kind == "crashed"


@pytest.mark.parametrize("name", sorted(READERS))
def test_mutated_files_are_read_or_refused_cleanly(tmp_path, name):
    reader = READERS[name]
    counts: dict[str, int] = {}
    failures = []
    for desc, data in cases(reader, seed=17, count=CASES * len(reader.files)):
        out = run_case(reader, data, tmp_path / f"case{reader.suffix}")
        counts[out.kind] = counts.get(out.kind, 0) + 1
        if out.kind not in ("loaded", "refused"):
            failures.append(f"{desc}: {out.kind}: {out.detail}")
    assert not failures, "\n".join(failures)
    assert counts.get("refused", 0) > 0  # the mutations do reach the checks


# -- issue 17: generated forward-kinematics code and non-finite constants ------------------------------------


def test_generated_fk_code_prints_non_finite_constants_as_python():
    from kangengine.animation.kinematics import BodyKinematics, tree_plan_from_rest
    from kangengine.animation.kinematics.trace import float_literal

    for v in (math.inf, -math.inf, math.nan, 1.5, -0.0, 1e-300):
        back = eval(float_literal(v), {"__builtins__": {"float": float}})  # noqa: S307 - our own literal
        assert back == v or (math.isnan(v) and math.isnan(back))
    # a finite offset whose folded constant overflows (the tracer folds 2 * offset): before issue 17 the
    # generated code read the undefined name ``inf`` (NameError)
    fk = BodyKinematics(tree_plan_from_rest([-1, 0], [[0.0, 0.0, 0.0], [1e308, 0.0, 0.0]]))
    q = np.tile([1.0, 0.0, 0.0, 0.0], (3, 2, 1))
    q[:, 0] = [np.cos(0.5), 0.0, 0.0, np.sin(0.5)]  # a turned root: the offset is rotated, not copied
    with np.errstate(over="ignore", invalid="ignore"):
        pos, rot = fk.from_local(np.zeros((3, 3)), q)
    assert np.isfinite(rot).all() and not np.isfinite(pos[:, 1]).all()  # overflowed, as numpy would


def test_non_finite_rest_values_are_refused_when_the_plan_is_built():
    from kangengine.animation.kinematics import tree_plan_from_rest
    from kangengine.animation.kinematics.plan import JointStep
    from kangengine.errors import NonFiniteError

    with pytest.raises(NonFiniteError, match="rest position of body 1 is \\[0.0, nan, 0.0\\]"):
        tree_plan_from_rest([-1, 0], [[0, 0, 0], [0, np.nan, 0]])
    with pytest.raises(NonFiniteError, match="rest rotation of body 0"):
        tree_plan_from_rest([-1], [[0, 0, 0]], [[np.inf, 0, 0, 0]])
    with pytest.raises(NonFiniteError, match="hinge joint of body 0"):
        tree_plan_from_rest([-1], [[0, 0, 0]], steps=[(JointStep("hinge", 0, axis=(0.0, 0.0, math.nan)),)])
