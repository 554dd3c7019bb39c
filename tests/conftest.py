"""Shared test fixtures: where the third-party test data lives (``../shared/data`` beside the repo, or
``$KANGENGINE_TEST_DATA``), and one torch thread by default.

Torch starts one thread per core; on a shared or loaded machine those threads spin against each other and
the suite spends most of its time in contention (measured on a loaded 2-core machine: 1591 s with the
default threads, 245 s with one). ``KANGENGINE_TEST_THREADS=N`` chooses another count; tests that are
about threading set their own.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _data_dir() -> Path:
    env = os.environ.get("KANGENGINE_TEST_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


DATA = _data_dir()


def _pin_torch_threads() -> None:
    try:
        import torch
    except ImportError:  # the core suite runs without torch-only extras
        return
    torch.set_num_threads(int(os.environ.get("KANGENGINE_TEST_THREADS", "1")))


_pin_torch_threads()

MJCF_COMPILABLE = [
    "mjcf/mujoco/humanoid.xml",
    "mjcf/gymnasium/humanoid.xml",
    "mjcf/dm_control/humanoid_CMU.xml",
    "mjcf/dm_control/model_with_ball_joints.xml",
    "mjcf/dm_control/cartpole.xml",
    "mjcf/protomotions/amp_humanoid.xml",
    "mjcf/protomotions/smpl_humanoid.xml",
    "mjcf/unitree/g1_29dof.nomesh.xml",
    "mjcf/unitree/g1_29dof.xml",  # the mesh model (meshes shipped beside it)
]
MJCF_BROKEN = [
    "mjcf/isaacgymenvs/amp_humanoid.xml",  # material 'grid' not found
    "mjcf/protomotions/g1_bm_no_mesh_box_feet.xml",  # sensor refers to a missing site
]


def crop_bvh(src: Path, dst: Path, frames: int, start: int = 0) -> Path:
    """A real BVH file with only ``frames`` motion rows (from ``start``): same header, ``Frames:`` fixed."""
    head, motion = src.read_text().split("MOTION", 1)
    lines = motion.strip("\n").split("\n")
    rows = lines[2 + start : 2 + start + frames]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(f"{head}MOTION\nFrames: {len(rows)}\n{lines[1]}\n" + "\n".join(rows) + "\n")
    return dst


def data_file(rel: str) -> Path:
    p = DATA / rel
    if not p.is_file():
        pytest.fail(
            f"test data {p} is missing: the tests need ../shared/data beside the repository "
            "(or KANGENGINE_TEST_DATA pointing at it)"
        )
    return p


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.fail(f"test data folder {DATA} is missing (../shared/data or $KANGENGINE_TEST_DATA)")
    return DATA


def infeasible_variants(walk, layout) -> dict:
    """Made-infeasible copies of a walk (an ``ArticulationMotion`` on a free-root ``layout`` heading along -y):
    ``teleport`` (a 0.5 m sideways root jump halfway), ``lifted`` (0.3 m up) and ``skating`` (a stance pose
    whose root slides at 1 m/s while the legs stand still), velocities by the mapper's finite differences."""
    import kangengine as ke

    def with_q(q):
        qd = ke.animation.ArticulationMotionMapper(layout).velocities(q, walk.fps())
        return ke.animation.ArticulationMotion(q, qd, walk.fps(), walk.layout_signature)

    n = walk.num_frames
    teleport = walk.q.copy()
    teleport[n // 2 :, 0] += 0.5
    lifted = walk.q.copy()
    lifted[:, 2] += 0.3
    skating = np.repeat(walk.q[30:31], n, axis=0)
    skating[:, 1] -= np.arange(n) / walk.fps() * 1.0
    return {"teleport": with_q(teleport), "lifted": with_q(lifted), "skating": with_q(skating)}


def free_root_model(desc, dtype=None, **model_kw):
    """``(layout, model)`` of a loaded model description with a free root: the layout from its joints and the
    simulator's :class:`~kangengine.sim.Model` (``dtype`` a torch dtype, float32 by default; ``model_kw`` to
    ``Model.from_desc``, e.g. ``contact=``), the loader's warnings about unsimulated geoms silenced."""
    import warnings

    import torch

    import kangengine as ke

    layout = ke.animation.ArticulationCoordinateLayout.from_data(data=desc, free_root=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ke.sim.Model.from_desc(desc, layout, dtype=dtype or torch.float32, **model_kw)
    return layout, model


def cmu_humanoid(dtype=None, **model_kw):
    """``(desc, layout, model)`` of dm_control's CMU humanoid from the shared data (see :func:`free_root_model`)."""
    import kangengine as ke

    desc = ke.asset.MJCFLoader.load(data_file("mjcf/dm_control/humanoid_CMU.xml"))
    return (desc, *free_root_model(desc, dtype, **model_kw))


def cmu_tracking_efforts() -> dict:
    """dm_control's tracking walker's effort limits for the CMU humanoid (the shipped
    ``kangengine.data.CMU_HUMANOID_TRACKING_EFFORT``): its suite motors are too weak for mocap walks."""
    import kangengine as ke

    return ke.sim.read_effort_limits(ke.data.data_path(ke.data.CMU_HUMANOID_TRACKING_EFFORT))
