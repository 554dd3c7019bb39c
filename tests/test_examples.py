"""Every script in ``examples/`` runs on the shipped data and writes what it says it writes.

Each runs as a user would run it (``python examples/<name>.py OUT_DIR`` in a fresh process, one torch thread)
and its files are checked with KangEngine's own readers plus independent ones (numpy, the JSON summary,
``bvhio`` for the exported BVH).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

import kangengine as ke
from kangengine.data import data_path

EXAMPLES = REPO / "examples"


def _run(name: str, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _cmu_layout():
    desc = ke.asset.MJCFLoader.load(data_path("humanoid_CMU.xml"), order="DFS")
    return ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)


def test_every_example_has_a_test():
    scripts = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert scripts == ["export_bvh", "preprocess_dataset", "reward_sampling"]
    for stem in scripts:
        assert f'"{stem}.py"' in (REPO / "tests" / "test_examples.py").read_text()


def test_preprocess_dataset(tmp_path):
    stdout = _run("preprocess_dataset.py", str(tmp_path))
    npz, summary = tmp_path / "cmu_02_01_walk.npz", tmp_path / "convert_summary.json"
    assert f"wrote      {npz}" in stdout and f"wrote      {summary}" in stdout
    assert "1 converted, 0 up to date, 0 failed" in stdout
    report = json.loads(summary.read_text())
    assert report["counts"] == {"converted": 1, "up_to_date": 0, "failed": 0}
    motion = ke.animation.load_articulation_motion_npz(npz, _cmu_layout())
    walk = ke.io.load_bvh(data_path("cmu_02_01_walk.bvh"))
    assert motion.fps() == 30.0 and abs(motion.num_frames - walk.num_frames * 30 / walk.fps) <= 1
    assert np.isfinite(motion.q).all() and motion.q.dtype == np.float32
    # run again: resumable, nothing is redone
    assert "0 converted, 1 up to date, 0 failed" in _run("preprocess_dataset.py", str(tmp_path))


def test_reward_sampling(tmp_path):
    stdout = _run("reward_sampling.py", str(tmp_path), "--envs", "4096", "--steps", "3")
    library_file, rewards_file = tmp_path / "library.safetensors", tmp_path / "rewards.npy"
    assert f"wrote {library_file}" in stdout and f"wrote {rewards_file}" in stdout
    assert "(4096, 31, 3)" in stdout
    rewards = np.load(rewards_file)
    assert rewards.shape == (3, 4096) and rewards.dtype == np.float32
    assert np.all((rewards > 0) & (rewards <= 1)) and rewards.mean() > 0.5
    # environments whose robot trails the reference by ~0 s score ~1: the reward measures tracking
    assert rewards.max() > 0.99
    library = ke.animation.MotionLibrary.load(library_file, layout=_cmu_layout())
    assert library.clip_names == ("walk_120fps", "walk_30fps")
    assert library.packed_buffers().clip_weight.tolist() == [3.0, 1.0]


def test_export_bvh(tmp_path):
    bvhio = pytest.importorskip("bvhio")
    stdout = _run("export_bvh.py", str(tmp_path))
    bvh = tmp_path / "cmu_02_01_walk_robot.bvh"
    assert f"wrote {bvh}" in stdout and "read it back: 343 frames" in stdout
    layout = _cmu_layout()
    motion = ke.animation.load_articulation_motion_npz(tmp_path / "cmu_02_01_walk.npz", layout)
    body_pos_world, _ = ke.animation.forward_kinematics(layout, motion.q.astype(np.float64))
    # an independent reader: bvhio's world positions (Y up, file units cm) against our forward kinematics
    root = bvhio.readAsHierarchy(str(bvh))
    joints = {joint.Name: joint for joint, _, _ in root.layout()}
    assert set(joints) == set(layout.body_names)
    for frame in (0, 171, 342):
        root.loadPose(frame)
        for b in (0, layout.body_names.index("lfoot"), layout.body_names.index("rhand")):
            x, y, z = joints[layout.body_names[b]].PositionWorld
            zup_m = np.array([z, x, y]) / 100.0  # BVH Y up -> our Z up (zup_from_yup), cm -> m
            np.testing.assert_allclose(zup_m, body_pos_world[frame, b], atol=1e-4)
