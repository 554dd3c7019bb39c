"""Every BVH file of the shared data, read by ``load_bvh`` and by ``bvhio.readAsBvh``: the same joints, channels,
per-frame local rotations and positions (to float32 precision: bvhio computes in float32 glm), and the motion
numbers our native row parser gives equal to Python's own ``float`` of each token. The fast hierarchy parser and
the general token parser give the same nodes for every file."""

from __future__ import annotations

import math
import warnings

import bvhio
import numpy as np
import pytest
from conftest import DATA

from kangengine.io import _decimal, bvh, load_bvh

BVH_FILES = sorted(p.relative_to(DATA).as_posix() for p in (DATA / "bvh").rglob("*.bvh"))


def _bvhio_joints(path):
    """bvhio's joints in file (depth-first) order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = bvhio.readAsBvh(str(path))
    out, stack = [], [c.Root]
    while stack:
        j = stack.pop()
        out.append(j)
        stack.extend(reversed(j.Children))
    return c, out


def _motion_text(path):
    data = bvh._normalise(path.read_bytes())
    _, _, start, _ = bvh._split_file(data, path)
    return data, start


def test_the_shared_data_has_bvh_files():
    assert len(BVH_FILES) >= 10


@pytest.mark.parametrize("rel", BVH_FILES)
def test_rotations_and_positions_equal_bvhio(rel):
    path = DATA / rel
    m = load_bvh(path, up_axis="z", scale=1.0, dtype=np.float64)  # file axes and units, as bvhio keeps them
    m32 = load_bvh(path, up_axis="z", scale=1.0)
    c, joints = _bvhio_joints(path)
    names = list(m.tree.node_names)
    original = m.metadata["original_names"]
    rot = np.asarray(m.local_rotation)
    assert m.num_frames == len(c.Root.Keyframes)
    compared = 0
    for j in joints:
        i = original.index(j.Name)
        assert [ch.lower() for ch in j.Channels] == [ch.lower() for ch in m.metadata["channels"][i]]
        np.testing.assert_allclose(np.asarray(m.tree.local_translation)[i], np.array(j.Offset), rtol=1e-6, atol=1e-6)
        ref_q = np.array([[k.Rotation.w, k.Rotation.x, k.Rotation.y, k.Rotation.z] for k in j.Keyframes])
        ours = rot[:, i]
        sign = np.where(np.sum(ours * ref_q, axis=-1, keepdims=True) < 0, -1.0, 1.0)
        np.testing.assert_allclose(ours * sign, ref_q, atol=2e-6, err_msg=f"{rel}: {names[i]}")
        if any(ch.lower().endswith("position") for ch in j.Channels):
            ref_p = np.array([list(k.Position) for k in j.Keyframes])
            got = np.asarray(m.root_translation) if i == 0 else np.asarray(m.local_translation)[:, i]
            scale = max(1.0, float(np.abs(ref_p).max()))
            np.testing.assert_allclose(got, ref_p, atol=2e-6 * scale, err_msg=f"{rel}: {names[i]} position")
        compared += 1
    assert compared == len(joints) == len(original) - len(m.metadata["end_sites"])
    # the default float32 read (numbers and trigonometry in float32) agrees to float32 precision
    np.testing.assert_allclose(np.asarray(m32.local_rotation), rot, rtol=0, atol=1e-6)
    rt = np.asarray(m.root_translation)
    np.testing.assert_allclose(np.asarray(m32.root_translation), rt, rtol=1e-6, atol=1e-6 * max(1.0, np.abs(rt).max()))


@pytest.mark.parametrize("rel", BVH_FILES)
def test_native_rows_equal_python_float_of_every_token(rel):
    path = DATA / rel
    data, start = _motion_text(path)
    rows = [line.split() for line in data[start:].split(b"\n") if line.strip()]
    ref = np.array([[float(t) for t in r] for r in rows], dtype=np.float64)
    got = _decimal.parse_rows(data, start, ref.shape[1])
    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable: the general reader parses the rows")
    assert got is not None, "a plain-decimal BVH file fell back to the general reader"
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("rel", BVH_FILES)
def test_fast_hierarchy_parser_equals_the_token_parser(rel):
    path = DATA / rel
    data = bvh._normalise(path.read_bytes())
    header = bvh._split_file(data, path)[0]
    fast = bvh._parse_hierarchy_fast(header)
    slow = bvh._parse_hierarchy(header, path)
    assert fast is not None
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert {s: getattr(a, s) for s in bvh._Node.__slots__} == {s: getattr(b, s) for s in bvh._Node.__slots__}


def _random_decimal(rng) -> str:
    """A decimal in the form the native parser takes: sign, up to 12 digits, a point, an exponent up to 9."""
    digits = "".join(rng.choice(list("0123456789"), size=int(rng.integers(1, 13))))
    dot = int(rng.integers(0, len(digits) + 1))
    text = digits[:dot] + "." + digits[dot:] if rng.random() < 0.8 else digits
    if rng.random() < 0.3:
        text += str(rng.choice(["e", "E"])) + str(rng.choice(["", "-", "+"])) + str(int(rng.integers(0, 10)))
    return str(rng.choice(["", "-", "+"])) + text


def test_native_parser_is_correctly_rounded_on_random_decimals():
    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    rng = np.random.default_rng(7)
    toks = [_random_decimal(rng) for _ in range(6000)]
    text = "\n".join(" \t".join(toks[i : i + 3]) for i in range(0, len(toks), 3)).encode()
    got = _decimal.parse_rows(text, 0, 3)
    assert got is not None
    np.testing.assert_array_equal(got.reshape(-1), np.array([float(t) for t in toks]))  # strtod's rounding


@pytest.mark.parametrize(
    "text",
    [b"1 2\n3\n", b"1 2 3\n", b"nan 1\n", b"inf 1\n", b"1e 2\n", b"1.2.3 4\n", b"- 2\n", b"1 2x\n",
     b"1234567890123456 1\n", b"1e23 1\n", b"1-2 3\n", b"1e5.0 2\n"],
)  # fmt: skip
def test_native_parser_leaves_anything_unusual_to_the_general_reader(text):
    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    assert _decimal.parse_rows(text, 0, 2) is None


def test_native_parser_accepts_the_plain_forms():
    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    got = _decimal.parse_rows(b"\n -.5\t+2.\r\n\n  \n8.33909e-14 1E5\n-0 1e22", 0, 2)
    np.testing.assert_array_equal(got, [[-0.5, 2.0], [8.33909e-14, 1e5], [-0.0, 1e22]])
    assert math.copysign(1.0, got[2, 0]) == -1.0


def _nodes_equal(a, b) -> bool:
    return len(a) == len(b) and all(
        {s: getattr(x, s) for s in bvh._Node.__slots__} == {s: getattr(y, s) for s in bvh._Node.__slots__}
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("rel", ["bvh/other/bvhio_example.bvh", "bvh/cmu/131_01_3dsmax_walk_mixedorder.bvh"])
def test_fast_hierarchy_parser_on_mutated_headers_agrees_or_defers(rel):
    """Line mutations (dropped, doubled, swapped, a token replaced or joined): the fast parser either gives the
    token parser's nodes or returns None; it never accepts a header the token parser refuses."""
    path = DATA / rel
    header = bvh._split_file(bvh._normalise(path.read_bytes()), path)[0]
    lines = header.split("\n")
    rng = np.random.default_rng(3)
    outcomes = {"same": 0, "deferred": 0}
    for _ in range(300):
        ls = list(lines)
        i, j = (int(v) for v in rng.integers(0, len(ls), size=2))
        kind = int(rng.integers(0, 5))
        if kind == 0:
            del ls[i]
        elif kind == 1:
            ls.insert(i, ls[i])
        elif kind == 2:
            ls[i], ls[j] = ls[j], ls[i]
        elif kind == 3:
            toks = ls[i].split() or [""]
            toks[int(rng.integers(0, len(toks)))] = str(rng.choice(["nan", "{", "}", "x", "1e999", "7", "JOINT"]))
            ls[i] = " ".join(toks)
        else:
            ls[i] = ls[i] + " " + ls[j].strip()
        text = "\n".join(ls)
        fast = bvh._parse_hierarchy_fast(text)
        if fast is None:
            outcomes["deferred"] += 1
            continue
        slow = bvh._parse_hierarchy(text, path)  # raises if the fast parser accepted a bad header
        assert _nodes_equal(fast, slow)
        outcomes["same"] += 1
    assert outcomes["same"] > 10 and outcomes["deferred"] > 10


NATIVE_AND_NUMPY = ["bvh/cmu/02_01_cgspeed_walk.bvh", "bvh/bandai_namco_ccbync/dataset-1_walk_normal_001.bvh"]


@pytest.mark.parametrize("rel", NATIVE_AND_NUMPY)
def test_reading_without_the_native_parser_gives_the_same_motion(monkeypatch, rel):
    """No llvmlite (or a failed build): numpy's reader parses the rows; the motion is the same to the bit in
    float64 (both parsers round each decimal correctly)."""
    path = DATA / rel
    fast = load_bvh(path, dtype=np.float64)
    monkeypatch.setattr(_decimal, "_kernel", False)
    slow = load_bvh(path, dtype=np.float64)
    np.testing.assert_array_equal(np.asarray(fast.local_rotation), np.asarray(slow.local_rotation))
    np.testing.assert_array_equal(np.asarray(fast.root_translation), np.asarray(slow.root_translation))
    assert fast.metadata == slow.metadata


def test_native_parser_object_code_is_cached_on_disk_across_processes(tmp_path):
    """A new process loads the parser's object code from the cache folder instead of running LLVM; a corrupt
    cache file is ignored and rewritten."""
    import os
    import subprocess
    import sys

    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    code = (
        "from kangengine.io import _decimal as D; k = D._build(); "
        "print(k.from_cache, D.parse_rows(b'1 -2.5e-1', 0, 2).tolist())"
    )
    env = dict(os.environ, KANGENGINE_CACHE_DIR=str(tmp_path))

    def run():
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    assert run() == "False [[1.0, -0.25]]"
    files = list((tmp_path / "io-native").glob("decimal-*.o"))
    assert len(files) == 1
    assert run() == "True [[1.0, -0.25]]"
    files[0].write_bytes(files[0].read_bytes()[:-8] + b"garbage!")  # checksum no longer matches
    assert run() == "False [[1.0, -0.25]]"
    assert run() == "True [[1.0, -0.25]]"


def test_native_parser_holds_about_the_result_in_memory():
    """The output buffer is sized by the lines times the columns, not by the file size (a file of long numbers
    must not cost several times its size)."""
    import tracemalloc

    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    data, start = _motion_text(DATA / "bvh/cmu/01_01_cgspeed_hops_long.bvh")
    tracemalloc.start()
    try:
        got = _decimal.parse_rows(data, start, 96)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.shape == (2752, 96)
    assert peak < 1.1 * got.nbytes + (64 << 10), (peak, got.nbytes, len(data))


@pytest.mark.parametrize("rel", BVH_FILES)
def test_native_float32_rows_and_any_row_hint_give_the_same_numbers(rel):
    """float32 output is the float64 result rounded once more (numpy's ``astype``); the buffer hint (the header's
    frame count, right or wrong) never changes the rows."""
    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    data, start = _motion_text(DATA / rel)
    cols = len(data[start:].split(b"\n", 1)[0].split())
    ref = _decimal.parse_rows(data, start, cols)
    rows = ref.shape[0]
    for hint in (None, 0, 1, rows - 1, rows, rows + 1, 10 * rows, 1 << 40):
        got = _decimal.parse_rows(data, start, cols, rows_hint=hint)
        np.testing.assert_array_equal(got, ref, err_msg=f"rows_hint={hint}")
        got32 = _decimal.parse_rows(data, start, cols, dtype=np.float32, rows_hint=hint)
        assert got32.dtype == np.float32
        np.testing.assert_array_equal(got32, ref.astype(np.float32), err_msg=f"rows_hint={hint}")


def _random_tree(rng, nodes):
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, nodes)])
    return parents


@pytest.mark.parametrize("rel", BVH_FILES)
def test_native_detection_extents_equal_the_numpy_levels(rel):
    """The up-axis and unit detection: the native extents kernel against the numpy composition level by level
    (4x4 homogeneous products) on the sampled frames of every shared file, and the median extent the reader uses."""
    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    m = load_bvh(DATA / rel, up_axis="y", scale=1.0, dtype=np.float64)
    rot, rt = np.asarray(m.local_rotation), np.asarray(m.root_translation)
    lt = None if m.local_translation is None else np.asarray(m.local_translation)
    offsets, parents = np.asarray(m.tree.local_translation), np.asarray(m.tree.parent_indices)
    pos = bvh._sample_positions(rot, rt, lt, offsets, parents, (0, 1, 2))
    rows = bvh._sample_rows(rot.shape[0])
    trans = np.repeat(offsets[None], len(rows), axis=0) if lt is None else lt[rows]
    trans[:, 0] = rt[rows]
    got = _decimal.pose_extents(rot[rows], trans, parents)
    np.testing.assert_allclose(got, pos.max(axis=1) - pos.min(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        bvh._detection_extent(rot, rt, lt, offsets, parents, (0, 1, 2)), bvh._median_extent(pos), rtol=1e-12
    )


def test_native_detection_extents_on_random_trees_match_scipy():
    """Random trees and rotations (unnormalised quaternions, as the matrix formula divides by the norm): world
    positions composed with scipy's rotations, extents of all nodes after the root."""
    from scipy.spatial.transform import Rotation

    if _decimal._build() is False:
        pytest.skip("llvmlite unavailable")
    rng = np.random.default_rng(11)
    for nodes in (1, 2, 7, 40):
        parents = _random_tree(rng, nodes)
        quat = rng.normal(size=(5, nodes, 4)) * rng.uniform(0.5, 2.0, size=(5, nodes, 1))
        trans = rng.normal(size=(5, nodes, 3)) * 10
        got = _decimal.pose_extents(quat, trans, parents)
        rot = Rotation.from_quat(quat[..., [1, 2, 3, 0]].reshape(-1, 4)).as_matrix().reshape(5, nodes, 3, 3)
        world_r, world_p = np.empty_like(rot), np.empty_like(trans)
        for i, p in enumerate(parents):
            if p < 0:
                world_r[:, i], world_p[:, i] = rot[:, i], trans[:, i]
            else:
                world_r[:, i] = world_r[:, p] @ rot[:, i]
                world_p[:, i] = world_p[:, p] + np.einsum("fij,fj->fi", world_r[:, p], trans[:, i])
        kept = world_p[:, 1:] if nodes > 1 else world_p
        np.testing.assert_allclose(got, kept.max(axis=1) - kept.min(axis=1), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="precede"):
        _decimal.pose_extents(np.ones((1, 2, 4)), np.zeros((1, 2, 3)), np.array([-1, 1]))


def test_motion_line_search_equals_the_regular_expression():
    """The ``MOTION`` line found with ``bytes.find`` is the match of the multiline regular expression, on texts
    with decoys (MOTION inside names, after other words, with spaces, tabs, at the start and the end)."""
    import re

    regex = re.compile(rb"(?m)^[ \t]*MOTION[ \t]*$")
    pieces = [b"MOTION", b" MOTION", b"\tMOTION \t", b"JOINT MOTION", b"MOTIONS", b"xMOTION", b"", b"  ", b"HIERARCHY"]
    rng = np.random.default_rng(5)
    for _ in range(2000):
        text = b"\n".join(pieces[int(k)] for k in rng.integers(0, len(pieces), size=int(rng.integers(0, 6))))
        m = regex.search(text)
        assert bvh._motion_line(text) == (None if m is None else (m.start(), m.end())), text
