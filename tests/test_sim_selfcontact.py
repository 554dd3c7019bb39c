"""Link-to-link contact: pair filtering (parent-child, <exclude>, contype/conaffinity), penetration depths
against MuJoCo's capsule and sphere collisions, and forces equal to the ground-contact law's for the same
depth and speed."""

from __future__ import annotations

import warnings

import mujoco
import numpy as np
import pytest
import torch
from conftest import data_file

import kangengine as ke
from kangengine.asset import MJCFLoader
from kangengine.sim import Control, Simulator, State

# a fixed post (capsule along z) and a slider (capsule along y, tilted) that moves along x through it
CROSS = """<mujoco><option gravity="0 0 0"/><worldbody><body name="base">
<body name="post" pos="0 0 1"><geom name="post" type="capsule" size="0.05 0.3"/></body>
<body name="slider" pos="0 0 1"><joint name="x" type="slide" axis="1 0 0"/>
<geom name="bar" type="capsule" size="0.04 0.2" pos="0 0 0.05" euler="80 0 0"/>
<geom name="ball" type="sphere" size="0.03" pos="0 0.4 0.1"/></body>
<body name="ghost" pos="0 0 1"><joint name="gx" type="slide" axis="1 0 0"/>
<geom name="ghost" type="sphere" size="0.05" contype="2" conaffinity="2"/></body>
</body></worldbody></mujoco>"""

# a sphere on a vertical slide above the ground plane
DROP = """<mujoco><option gravity="0 0 0"/><worldbody><geom name="floor" type="plane" size="5 5 .1"/>
<body name="ball" pos="0 0 0"><joint name="z" type="slide" axis="0 0 1"/>
<geom type="sphere" size="0.05" mass="1"/></body></worldbody></mujoco>"""


def _model(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ke.sim.Model.from_desc(MJCFLoader.load(path), dtype=torch.float64, free_root=False, **kw)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_pairs_respect_parent_child_exclude_and_bitmasks():
    """On the MuJoCo humanoid no pair joins parent and child or an <exclude>d pair of links, every pair passes
    MuJoCo's contype/conaffinity test, and the pairs are exactly those MuJoCo's own filter allows."""
    path = data_file("mjcf/mujoco/humanoid.xml")
    model = _model(path, contact=ke.sim.ContactParams(self_collision=True))
    mj = mujoco.MjModel.from_xml_path(str(path))
    assert model.num_self_pairs > 0
    excluded = {frozenset(p) for p in model.collision_filter_pairs}
    geom_body = dict(zip(model.self_geom_names, model.self_geom_body.tolist()))
    names = model.body_names
    ours = set()
    for a, b in model.self_pair_names:
        ba, bb = names[geom_body[a]], names[geom_body[b]]
        assert frozenset((ba, bb)) not in excluded
        ours.add(frozenset((a, b)))
    # MuJoCo's filter: different bodies, not parent-child (unless the parent is the world), not excluded,
    # compatible bitmasks
    sig = mj.exclude_signature
    mj_excluded = {frozenset((sig[i] >> 16, sig[i] & 0xFFFF)) for i in range(mj.nexclude)}
    geom_name = lambda i: mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_GEOM, i)
    theirs = set()
    for i in range(mj.ngeom):
        for j in range(i + 1, mj.ngeom):
            bi, bj = mj.geom_bodyid[i], mj.geom_bodyid[j]
            if bi == 0 or bj == 0 or bi == bj:
                continue
            if mj.body_parentid[bi] == bj or mj.body_parentid[bj] == bi:
                continue
            if frozenset((bi, bj)) in mj_excluded:
                continue
            if not ((mj.geom_contype[i] & mj.geom_conaffinity[j]) or (mj.geom_contype[j] & mj.geom_conaffinity[i])):
                continue
            theirs.add(frozenset((geom_name(i), geom_name(j))))
    assert ours <= theirs  # ours also skips links welded together or joined through shapeless links
    assert len(theirs - ours) <= len(theirs) // 4


def test_depths_match_mujoco_capsule_and_sphere_collisions(tmp_path):
    path = _write(tmp_path, "cross.xml", CROSS)
    model = _model(path, contact=ke.sim.ContactParams(self_collision=True, enabled=False))
    assert {frozenset(p) for p in model.self_pair_names} == {frozenset(("post", "bar")), frozenset(("post", "ball"))}
    mj = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(mj)
    sim = Simulator(model, dt=0.01)
    xs = np.array([0.2, 0.08, 0.05, 0.01, -0.03, -0.06])
    state = State.from_q(model, np.stack([xs, np.full_like(xs, 3.0)], -1))
    pinned = torch.ones(len(xs), model.nv, dtype=torch.bool)
    result = sim.step(state, Control(pinned=pinned))  # pinned at rest: the end depth is the start depth
    for k, x in enumerate(xs):
        d.qpos[:] = [x, 3.0]
        mujoco.mj_forward(mj, d)
        expected = {}
        for c in d.contact[: d.ncon]:
            pair = frozenset(mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (c.geom1, c.geom2))
            expected[pair] = -c.dist
        for p, pair in enumerate(model.self_pair_names):
            depth = float(result.self_contact_depth[k, p])
            if frozenset(pair) in expected:
                assert depth == pytest.approx(expected[frozenset(pair)], abs=1e-9)
            else:
                assert depth <= 1e-9
        assert int(result.self_contact_count[k]) == sum(v > 0 for v in expected.values())


@pytest.mark.parametrize("speed", [0.0, -0.4, 0.3])
def test_forces_equal_the_ground_law_at_the_same_depth(tmp_path, speed):
    """The slider's bar driven into the post at ``speed`` (pinned) and a sphere driven into the ground at the
    same depth and speed: the same normal force, ``stiffness * depth - damping * separation speed``."""
    params = ke.sim.ContactParams(stiffness=2e4, damping=300.0, self_collision=True)
    cross = _model(_write(tmp_path, "cross.xml", CROSS), contact=params)
    drop = _model(_write(tmp_path, "drop.xml", DROP), contact=params)
    h, depth0 = 0.01, 0.012
    x0 = 0.05 + 0.04 - depth0  # the bar's axis passes the post's at the bar's height: distance = x
    a = Simulator(cross, dt=h).step(
        State.from_q(cross, [x0, 3.0], [speed, 0.0]),
        Control(pinned=torch.ones(1, 2, dtype=torch.bool), pinned_qd=torch.tensor([[speed, 0.0]], dtype=torch.float64)),
    )
    z0 = 0.05 - depth0
    b = Simulator(drop, dt=h).step(
        State.from_q(drop, [z0], [speed]),
        Control(pinned=torch.ones(1, 1, dtype=torch.bool), pinned_qd=torch.tensor([[speed]], dtype=torch.float64)),
    )
    bar = cross.self_pair_names.index(("post", "bar"))
    expected = params.stiffness * (depth0 - h * speed) - params.damping * speed
    assert float(b.contact_depth[0, 0]) == pytest.approx(depth0 - h * speed, abs=1e-12)
    assert float(a.self_contact_depth[0, bar]) == pytest.approx(depth0 - h * speed, abs=1e-9)
    assert float(b.contact_normal_force[0, 0]) == pytest.approx(expected, rel=1e-9)
    assert float(a.self_contact_force[0, bar]) == pytest.approx(float(b.contact_normal_force[0, 0]), rel=1e-6)


def test_overlapping_links_are_pushed_apart(tmp_path):
    """Free of pins, a slider started inside the post is pushed out along x (it is the only DOF the pair
    moves) and leaves with the energy the penalty stored less what its damper took; the ghost, whose
    bitmask matches neither, never moves; the tree solver is refused for self-collision."""
    params = ke.sim.ContactParams(self_collision=True, damping=20.0)
    model = _model(_write(tmp_path, "cross.xml", CROSS), contact=params)
    sim = Simulator(model, dt=0.005)
    state = State.from_q(model, [0.06, 3.0])
    for _ in range(200):
        result = sim.step(state)
        state = result.state
    assert float(state.q[0, 0]) > 0.1  # out of contact (0.05 + 0.04) and moving away
    assert int(result.self_contact_count[0]) == 0
    kinetic = float(ke.sim.kinetic_energy(model, state.q, state.qd)[0])
    stored = 0.5 * params.stiffness * (0.09 - 0.06) ** 2
    assert 0.2 * stored < kinetic < stored
    assert float(state.qd[0, 0]) > 0 and float(state.qd[0, 1]) == 0.0
    with pytest.raises(ValueError, match="self-collision"):
        Simulator(model, dt=0.005, solver="tree")


def test_humanoid_self_penetration_is_flagged_with_mujocos_depths():
    """Random (often self-penetrating) poses of the MuJoCo humanoid: every link-to-link contact MuJoCo finds
    between two geoms we pair has our depth (the deepest of MuJoCo's contacts of that pair), and every pair
    we report overlapping MuJoCo reports too, so a pose with hands or limbs through the body is flagged."""
    path = data_file("mjcf/mujoco/humanoid.xml")
    params = ke.sim.ContactParams(self_collision=True)
    model = ke.sim.Model.from_desc(MJCFLoader.load(path), dtype=torch.float64, contact=params)
    mj = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(mj)
    rng = np.random.default_rng(7)
    n = 24
    q = model.layout.neutral() + 1.2 * rng.normal(size=(n, model.nq))
    q[:, :3] = [0.0, 0.0, 3.0]  # far above the floor: only link-to-link contacts
    q[:, 3:7] /= np.linalg.norm(q[:, 3:7], axis=-1, keepdims=True)
    from kangengine.sim.contact import self_contact_rows
    from kangengine.sim.kinematics import compute_frames

    sign = model.dof_moves_body[model.self_geom_body[model.self_pair_geom[:, 0]]]
    rows = self_contact_rows(model, compute_frames(model, torch.as_tensor(q)), sign)
    depth = rows.depth.t().numpy()  # [n, P]
    index = {frozenset(p): k for k, p in enumerate(model.self_pair_names)}
    flagged = 0
    for w in range(n):
        d.qpos[:] = q[w]
        mujoco.mj_forward(mj, d)
        theirs = {}
        for c in d.contact[: d.ncon]:
            pair = frozenset(mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (c.geom1, c.geom2))
            if pair in index:
                theirs[pair] = max(theirs.get(pair, -np.inf), -c.dist)
        for pair, k in index.items():
            if pair in theirs:
                assert depth[w, k] == pytest.approx(theirs[pair], abs=1e-9)
            else:
                assert depth[w, k] <= 1e-9
        flagged += bool(theirs)
    assert flagged >= n // 3  # the poses do penetrate, and we see it
