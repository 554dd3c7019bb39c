"""The output pool (``kangengine._buffers``): a freed block is reused only once every view of it has died, never
while one lives; a request takes a block of about its size; the limit bounds what is held;
and the mapper's results from reused memory equal those from fresh memory, a result kept alive untouched by
later calls."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from conftest import data_file

from kangengine import _buffers
from kangengine.animation import ArticulationCoordinateLayout, ArticulationMotionMapper, SkeletonMotion
from kangengine.asset import MJCFLoader
from kangengine.errors import FormatError

BIG = (1 << 20, 3)  # 12 MiB of float32: above the pool's 4 MiB floor


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture(autouse=True)
def _empty_pool():
    _buffers.release()
    limit = _buffers.set_limit(1 << 30)
    yield
    _buffers.set_limit(limit)
    _buffers.release()


def test_a_block_comes_back_only_when_its_last_view_dies():
    a = _buffers.empty(BIG, np.float32)
    addr = _addr(a)
    assert a.flags.c_contiguous and a.flags.writeable and a.shape == BIG and a.dtype == np.float32
    views = [a[::2].T, a.reshape(-1)[5:], a.view(np.int32), np.asarray(a), torch.from_numpy(a)]
    del a
    for i in range(len(views)):
        gc.collect()
        assert _buffers.stats()["held_blocks"] == 0, f"given back while view {i} ({type(views[i]).__name__}) lives"
        b = _buffers.empty(BIG, np.float32)  # must be fresh memory, not the live one
        assert not (_addr(b) <= addr < _addr(b) + b.nbytes)
        del b
        _buffers.release()
        views[i] = None
    assert _buffers.stats()["held_blocks"] == 1
    c = _buffers.empty(BIG, np.float32)
    assert _addr(c) == addr and _buffers.stats()["held_blocks"] == 0


def test_sizes_are_matched_and_small_requests_are_plain_numpy():
    a = _buffers.empty(BIG, np.float64)  # a 24 MiB block
    a.fill(7.0)
    addr = _addr(a)
    del a
    quarter = _buffers.empty((1 << 20,), np.float32)  # 4 MiB: the block is more than twice it, not used
    assert _addr(quarter) != addr and _buffers.stats()["held_blocks"] == 1
    tiny = _buffers.empty((1 << 18,), np.float64)  # 2 MiB: under the 4 MiB floor, plain numpy
    assert tiny.flags.owndata and _buffers.stats()["held_blocks"] == 1
    half = _buffers.empty(BIG, np.float32)  # half the block's bytes: fits (at most twice the request)
    assert _addr(half) == addr and half.shape == BIG and half.dtype == np.float32
    assert _buffers.stats()["held_blocks"] == 0


def test_the_limit_bounds_what_is_held_oldest_let_go_first():
    _buffers.set_limit(30 << 20)  # room for two 12 MiB blocks
    blocks = [_buffers.empty(BIG, np.float32) for _ in range(3)]
    addrs = [_addr(b) for b in blocks]
    before = _buffers.stats()["dropped"]
    blocks.clear()
    s = _buffers.stats()
    assert s["held_blocks"] == 2 and s["held_bytes"] <= 30 << 20 and s["dropped"] == before + 1
    assert _addr(_buffers.empty(BIG, np.float32)) in addrs[1:]  # the first one freed (the oldest) was let go
    assert _buffers.set_limit(0) == 30 << 20 and _buffers.stats()["held_bytes"] == 0
    a = _buffers.empty(BIG, np.float32)
    del a
    assert _buffers.stats()["held_blocks"] == 0  # limit 0: nothing kept
    with pytest.raises(FormatError, match="expected 0 or more bytes"):
        _buffers.set_limit(-1)


def test_a_bad_limit_in_the_environment_is_refused_naming_it():
    env = dict(os.environ, KANGENGINE_OUTPUT_POOL_BYTES="lots")
    r = subprocess.run([sys.executable, "-c", "import kangengine._buffers"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "KANGENGINE_OUTPUT_POOL_BYTES" in r.stderr and "whole number" in r.stderr
    env["KANGENGINE_OUTPUT_POOL_BYTES"] = "12345"
    code = "from kangengine import _buffers; print(_buffers.stats()['limit'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "12345"


def test_threads_never_share_a_live_block():
    errors = []

    def work(k):
        for i in range(40):
            a = _buffers.empty((1 << (20 + i % 2),), np.float32)
            a.fill(k)
            b = _buffers.empty((1 << 20,), np.float32)
            b.fill(-k)
            if not ((a == k).all() and (b == -k).all()):  # another thread wrote into a live block
                errors.append((k, i))
            del a, b

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _buffers.stats()["reused"] > 0


def test_mapper_results_from_reused_memory_equal_fresh_ones_and_kept_results_stay_untouched():
    layout = ArticulationCoordinateLayout.from_data(
        data=MJCFLoader.load(data_file("mjcf/protomotions/smpl_humanoid.xml"))
    )
    mapper = ArticulationMotionMapper(layout)
    if mapper._native_fused(np.float32) is None:
        pytest.skip("the fused native pass is not available here (llvmlite missing)")
    rng = np.random.default_rng(3)
    n = 20000  # q and qd of 6 MB each: from the pool
    t = np.arange(n) / 30.0
    q = np.tile(layout.neutral(), (n, 1))
    q[:, 7:] += 0.4 * np.sin(t[:, None] * rng.uniform(0.5, 2.0, layout.nq - 7) + rng.uniform(0, 6, layout.nq - 7))
    q[:, 0] = 0.5 * t
    st = mapper.to_skeleton_state(q)
    motion = SkeletonMotion(
        mapper.skeleton_tree, st.root_translation.astype(np.float32), st.local_rotation.astype(np.float32), 30.0
    )
    first = mapper.to_articulation_motion(motion).motion
    kept_q, kept_qd, addr = first.q.copy(), first.qd.copy(), _addr(first.q)
    assert not first.q.flags.owndata  # from the pool
    np.testing.assert_allclose(first.q[:, 7:], q[:, 7:], atol=1e-5)
    scribble = _buffers.empty(first.q.shape, first.q.dtype)  # other pooled work while the result is kept
    scribble.fill(np.nan)
    second = mapper.to_articulation_motion(motion).motion
    assert _addr(second.q) != addr
    np.testing.assert_array_equal(first.q, kept_q)
    np.testing.assert_array_equal(first.qd, kept_qd)
    del first, second, scribble
    gc.collect()
    reused = mapper.to_articulation_motion(motion).motion
    assert _buffers.stats()["reused"] >= 2
    np.testing.assert_array_equal(reused.q, kept_q)
    np.testing.assert_array_equal(reused.qd, kept_qd)
    _buffers.set_limit(0)
    fresh = mapper.to_articulation_motion(motion).motion
    assert fresh.q.flags.owndata
    np.testing.assert_array_equal(fresh.q, kept_q)
    np.testing.assert_array_equal(fresh.qd, kept_qd)
