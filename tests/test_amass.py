"""AMASS / SMPL-family clips (kangengine.datasets.amass) against smplx's own forward pass.

No AMASS data and no SMPL model file may be shipped, so the tests write AMASS-layout npz files and tiny
synthetic body models (random template, shape directions and joint regressor, in the layout smplx reads)
and compare our world joint positions with ``smplx.{SMPL,SMPLH,SMPLX}(...)(...).joints``.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from conftest import data_file

import kangengine as ke
from kangengine import rotations as R
from kangengine.datasets import amass
from kangengine.errors import FileMissingError, FormatError, KangEngineError

smplx = pytest.importorskip("smplx", reason="smplx is in the 'smpl' and 'dev' extras")
torch = pytest.importorskip("torch")

T = 12
NUM_VERTS = {"smpl": 6890, "smplh": 6890, "smplx": 10475}  # smplx selects extra joints by vertex id


def _model_arrays(mt: str, num_shapes: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    kind = amass.BodyModelType(mt)
    nj, nv = kind.num_joints, NUM_VERTS[mt]
    jreg = np.zeros((nj, nv))
    for j in range(nj):
        jreg[j, rng.choice(nv, 6, replace=False)] = rng.dirichlet(np.ones(6))
    parents = amass.joint_parents(mt).astype(np.int64)
    kintree = np.stack([parents, np.arange(nj)]).astype(np.uint32)  # real files: uint32, root parent 2**32-1
    faces = rng.integers(0, nv, size=(64, 3)).astype(np.int64)
    d = {
        "v_template": rng.normal(scale=0.3, size=(nv, 3)),
        "shapedirs": rng.normal(scale=0.02, size=(nv, 3, num_shapes)).astype(np.float32),
        "posedirs": np.zeros((nv, 3, (nj - 1) * 9), np.float32),  # pose blend shapes move vertices, not joints
        "J_regressor": jreg,
        "kintree_table": kintree,
        "weights": np.tile(np.eye(nj)[:1], (nv, 1)),
        "f": faces,
    }
    if mt in ("smplh", "smplx"):
        d |= {
            "hands_componentsl": np.eye(45),
            "hands_componentsr": np.eye(45),
            "hands_meanl": np.zeros(45),
            "hands_meanr": np.zeros(45),
        }
    if mt == "smplx":
        d |= {"lmk_faces_idx": np.arange(10, dtype=np.int64), "lmk_bary_coords": np.full((10, 3), 1 / 3)}
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Synthetic body models in the smplx folder layout, plus an AMASS-layout SMPL-H folder."""
    import scipy.sparse as sp

    root = tmp_path_factory.mktemp("body_models")
    # SMPL as .pkl with a scipy.sparse J_regressor, like the cleaned official files
    d = _model_arrays("smpl", 10, seed=1)
    d["J_regressor"] = sp.csc_matrix(d["J_regressor"])
    (root / "smpl").mkdir()
    with open(root / "smpl" / "SMPL_NEUTRAL.pkl", "wb") as f:
        pickle.dump(d, f, protocol=2)
    (root / "smplh").mkdir()
    np.savez_compressed(root / "smplh" / "SMPLH_MALE.npz", **_model_arrays("smplh", 16, seed=2))
    (root / "smplx").mkdir()
    np.savez_compressed(root / "smplx" / "SMPLX_FEMALE.npz", **_model_arrays("smplx", 400, seed=3))
    return root


def _clip(path, mt: str, *, betas=16, gender="male", rate_key="mocap_framerate", seed=0, **extra):
    rng = np.random.default_rng(seed)
    nj = amass.BodyModelType(mt).num_joints
    poses = rng.normal(scale=0.4, size=(T, nj * 3))
    trans = np.cumsum(rng.normal(scale=0.02, size=(T, 3)), axis=0) + [0.3, -0.2, 0.9]
    arrays = {
        "poses": poses,
        "trans": trans,
        "betas": rng.normal(size=betas),
        "gender": np.array(gender),
        rate_key: np.array(120.0),
    }
    arrays |= extra
    np.savez(path, **arrays)
    return arrays


def _smplx_joints(model_dir, mt, gender, clip):
    poses = torch.as_tensor(clip["poses"])
    betas = torch.as_tensor(clip["betas"])[None].expand(T, -1)
    kw = dict(dtype=torch.float64, batch_size=T)
    if mt == "smpl":
        m = smplx.SMPL(str(model_dir / "smpl" / "SMPL_NEUTRAL.pkl"), num_betas=10, **kw)
        out = m(
            global_orient=poses[:, :3],
            body_pose=poses[:, 3:72],
            betas=betas[:, :10],
            transl=torch.as_tensor(clip["trans"]),
        )
    elif mt == "smplh":
        m = smplx.SMPLH(
            str(model_dir / "smplh" / f"SMPLH_{gender.upper()}.npz"),
            ext="npz",
            use_pca=False,
            flat_hand_mean=True,
            num_betas=16,
            **kw,
        )
        # smplx keeps only 10 betas for models with < 300 shape directions; AMASS (and we) use all 16
        shapedirs = np.load(model_dir / "smplh" / f"SMPLH_{gender.upper()}.npz")["shapedirs"]
        m.shapedirs = torch.as_tensor(shapedirs, dtype=torch.float64)
        out = m(
            global_orient=poses[:, :3],
            body_pose=poses[:, 3:66],
            left_hand_pose=poses[:, 66:111],
            right_hand_pose=poses[:, 111:156],
            betas=betas,
            transl=torch.as_tensor(clip["trans"]),
        )
    else:
        m = smplx.SMPLX(
            str(model_dir / "smplx" / f"SMPLX_{gender.upper()}.npz"),
            use_pca=False,
            flat_hand_mean=True,
            num_betas=16,
            num_expression_coeffs=10,
            **kw,
        )
        out = m(
            global_orient=poses[:, :3],
            body_pose=poses[:, 3:66],
            jaw_pose=poses[:, 66:69],
            leye_pose=poses[:, 69:72],
            reye_pose=poses[:, 72:75],
            left_hand_pose=poses[:, 75:120],
            right_hand_pose=poses[:, 120:165],
            betas=betas,
            expression=torch.zeros(T, 10, dtype=torch.float64),
            transl=torch.as_tensor(clip["trans"]),
        )
    nj = amass.BodyModelType(mt).num_joints
    return out.joints[:, :nj].detach().numpy()


@pytest.mark.parametrize(
    ("mt", "gender", "betas", "rate_key"),
    [
        ("smpl", "neutral", 10, "mocap_framerate"),
        ("smplh", "male", 16, "mocap_framerate"),
        ("smplx", "female", 16, "mocap_frame_rate"),
    ],
)
def test_joints_equal_smplx_forward(tmp_path, model_dir, mt, gender, betas, rate_key):
    clip = _clip(tmp_path / f"{mt}.npz", mt, betas=betas, gender=gender, rate_key=rate_key)
    motion = amass.load(tmp_path / f"{mt}.npz", model_dir=model_dir)
    want = _smplx_joints(model_dir, mt, gender, clip)
    assert motion.tree.num_nodes == want.shape[1] == amass.BodyModelType(mt).num_joints
    np.testing.assert_allclose(motion.global_translation, want, atol=1e-5)
    assert motion.fps == 120.0 and motion.metadata["model_type"] == mt and motion.metadata["gender"] == gender
    assert motion.metadata["num_betas_used"] == betas
    assert motion.tree.node_names == amass.joint_names(mt)


def test_gender_as_bytes_and_model_type_from_file(tmp_path, model_dir):
    clip = _clip(
        tmp_path / "c.npz", "smplx", gender="female", rate_key="mocap_frame_rate", surface_model_type=np.array("smplx")
    )
    clip["gender"] = np.array(b"female")  # 0-d bytes array as some AMASS exports store it
    np.savez(tmp_path / "b.npz", **clip)
    m = amass.load(tmp_path / "b.npz", model_dir=model_dir)
    assert m.metadata["gender"] == "female" and m.metadata["model_type"] == "smplx"
    p = amass.read_params(tmp_path / "b.npz")
    assert p.poses.shape == (T, 55, 3) and p.model_type is amass.BodyModelType.SMPLX
    # split SMPL-X keys (human_body_prior layout) give the same motion
    poses = clip["poses"]
    split = {
        "root_orient": poses[:, :3],
        "pose_body": poses[:, 3:66],
        "pose_jaw": poses[:, 66:69],
        "pose_eye": poses[:, 69:75],
        "pose_hand": poses[:, 75:],
        "trans": clip["trans"],
        "betas": clip["betas"],
        "gender": "female",
        "mocap_frame_rate": 120.0,
    }
    np.savez(tmp_path / "split.npz", **split)
    m2 = amass.load(tmp_path / "split.npz", model_dir=model_dir)
    np.testing.assert_allclose(m2.global_translation, m.global_translation, atol=1e-12)


def test_amass_layout_model_folder_and_gender_override(tmp_path, model_dir):
    amass_dir = tmp_path / "amass_models" / "smplh" / "female"
    amass_dir.mkdir(parents=True)
    (amass_dir / "model.npz").write_bytes((model_dir / "smplh" / "SMPLH_MALE.npz").read_bytes())
    _clip(tmp_path / "h.npz", "smplh", gender="male")
    a = amass.load(tmp_path / "h.npz", model_dir=tmp_path / "amass_models", gender="female")
    b = amass.load(tmp_path / "h.npz", model_dir=model_dir)
    np.testing.assert_allclose(a.global_translation, b.global_translation, atol=1e-12)
    with pytest.raises(FileMissingError, match="SMPLH_FEMALE"):
        amass.load(tmp_path / "h.npz", model_dir=model_dir, gender="female")


def test_mean_shape_tree_equals_smpl_humanoid_mjcf():
    mjcf = data_file("mjcf/protomotions/smpl_humanoid.xml")
    desc = ke.asset.MJCFLoader.load(mjcf)
    tree = amass.skeleton_tree("smpl")
    assert len(tree.node_names) == 24
    for i, name in enumerate(tree.node_names):
        b = desc.bodies[desc.body_index(name)]
        np.testing.assert_allclose(tree.local_translation[i], b.pos, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(b.quat_wxyz, [1, 0, 0, 0])
        parent = tree.parent_indices[i]
        assert (b.parent < 0 and parent < 0) or desc.bodies[b.parent].name == tree.node_names[parent]
    # the shipped quaternion constant is the zup_from_yup matrix
    np.testing.assert_allclose(
        R.quat_to_matrix(amass.BODY_FROM_SMPL_WXYZ), [[0, 0, 1], [1, 0, 0], [0, 1, 0]], atol=1e-15
    )


def test_mean_shape_motion_equals_smplx_with_a_mean_shape_model(tmp_path):
    # A synthetic SMPL model whose regressor returns the mean-shape joints exactly: smplx forward on it is the
    # oracle for the no-model path (names, frames, root translation, conversions).
    rest = amass.rest_joints("smpl")
    d = _model_arrays("smpl", 10, seed=5)
    d["J_regressor"] = np.zeros_like(d["J_regressor"])
    d["J_regressor"][np.arange(24), np.arange(24)] = 1.0
    d["v_template"][:24] = rest.positions
    d["shapedirs"][:] = 0
    (tmp_path / "smpl").mkdir()
    with open(tmp_path / "smpl" / "SMPL_NEUTRAL.pkl", "wb") as f:
        pickle.dump(d, f, protocol=2)
    clip = _clip(tmp_path / "c.npz", "smpl", betas=10, gender="neutral")
    m = amass.load(tmp_path / "c.npz")
    assert m.metadata["body_model"] == "smpl_humanoid_mean_shape"
    np.testing.assert_allclose(m.global_translation, _smplx_joints(tmp_path, "smpl", "neutral", clip), atol=1e-5)


def test_rest_pose_stands_up_and_world_is_z_up(tmp_path):
    tree = amass.skeleton_tree("smpl")
    s = ke.animation.SkeletonState.zero_pose(tree)
    p = s.global_translation
    head, toe = p[tree.index("Head")], p[tree.index("L_Toe")]
    assert head[2] - toe[2] > 1.2  # +Z up
    assert p[tree.index("L_Hip"), 1] > p[tree.index("R_Hip"), 1]  # +Y left
    assert toe[0] > p[tree.index("L_Ankle"), 0]  # toes point +X
    # AMASS root_orient Rx(+90 deg) stands the SMPL body up along world +Z
    poses = np.zeros((1, 72))
    poses[0, 0] = np.pi / 2
    np.savez(
        tmp_path / "up.npz",
        poses=poses,
        trans=np.zeros((1, 3)),
        betas=np.zeros(10),
        gender="neutral",
        mocap_framerate=30.0,
    )
    m = amass.load(tmp_path / "up.npz")
    g = m.global_translation[0]
    assert g[tree.index("Head"), 2] - g[tree.index("L_Toe"), 2] > 1.2
    # in that pose the body frames are the rest frames turned by Rx(90) about the SMPL x axis (= world y here)
    np.testing.assert_allclose(R.quat_angle(m.local_rotation[0, 1:]), 0, atol=1e-12)


def test_smplh_without_model_keeps_body_joints(tmp_path):
    _clip(tmp_path / "h.npz", "smplh")
    with pytest.warns(UserWarning, match="dropped"):
        m = amass.load(tmp_path / "h.npz")
    assert m.tree.num_nodes == 24 and len(m.metadata["dropped_joints"]) == 30


def test_pkl_body_model_with_chumpy_stub_and_refusals(tmp_path, model_dir, monkeypatch):
    import sys
    import types

    # a pickle naming chumpy.ch.Ch (as official SMPL files do) is rebuilt from its stored array, chumpy never runs
    mod = types.ModuleType("chumpy.ch")

    class Ch:
        pass

    Ch.__module__, Ch.__qualname__ = "chumpy.ch", "Ch"
    mod.Ch = Ch
    pkg = types.ModuleType("chumpy")
    pkg.ch = mod
    monkeypatch.setitem(sys.modules, "chumpy", pkg)
    monkeypatch.setitem(sys.modules, "chumpy.ch", mod)
    d = _model_arrays("smpl", 10, seed=1)
    ch = Ch()
    ch.__dict__ = {"x": d["shapedirs"]}
    d["shapedirs"] = ch
    (tmp_path / "smpl").mkdir()
    with open(tmp_path / "smpl" / "SMPL_NEUTRAL.pkl", "wb") as f:
        pickle.dump(d, f, protocol=2)
    monkeypatch.delitem(sys.modules, "chumpy.ch")
    monkeypatch.delitem(sys.modules, "chumpy")
    _clip(tmp_path / "c.npz", "smpl", betas=10, gender="neutral")
    a = amass.load(tmp_path / "c.npz", model_dir=tmp_path)
    b = amass.load(tmp_path / "c.npz", model_dir=model_dir)
    np.testing.assert_allclose(a.global_translation, b.global_translation, atol=1e-12)

    class Evil:
        def __reduce__(self):
            return (eval, ("1",))

    bad = tmp_path / "evil" / "smpl"
    bad.mkdir(parents=True)
    with open(bad / "SMPL_NEUTRAL.pkl", "wb") as f:
        pickle.dump({"v_template": Evil()}, f)
    with pytest.raises(FormatError, match="builtins.eval"):
        amass.load(tmp_path / "c.npz", model_dir=tmp_path / "evil")


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda a: a.pop("poses"), "poses"),
        (lambda a: a.pop("trans"), "trans"),
        (lambda a: a.__setitem__("poses", np.zeros((T, 70))), "poses"),
        (lambda a: a.__setitem__("poses", np.zeros((0, 156))), "poses"),
        (lambda a: a.__setitem__("trans", np.zeros((T - 1, 3))), "trans"),
        (lambda a: a["poses"].__setitem__((3, 4), np.nan), "poses"),
        (lambda a: a.__setitem__("poses", np.full((T, 156), "x")), "poses"),
        (lambda a: a.pop("mocap_framerate"), "mocap_framerate"),
        (lambda a: a.__setitem__("mocap_framerate", np.array(-5.0)), "mocap_framerate"),
        (lambda a: a.__setitem__("gender", np.array("robot")), "gender"),
        (lambda a: a.__setitem__("betas", np.zeros((2, 3, 4))), "betas"),
        (lambda a: a.__setitem__("poses", np.array([{"a": 1}] * T, dtype=object)), "poses"),
    ],
)
def test_bad_files_name_file_and_key(tmp_path, mutate, key):
    clip = _clip(tmp_path / "ok.npz", "smplh")
    mutate(clip)
    p = tmp_path / "bad.npz"
    np.savez(p, **clip)
    with pytest.raises(KangEngineError) as info:
        amass.load(p)
    assert str(p) in str(info.value) and key in str(info.value)


def test_truncated_and_missing(tmp_path):
    _clip(tmp_path / "ok.npz", "smpl", betas=10)
    raw = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(FormatError, match="cut.npz"):
        amass.load(tmp_path / "cut.npz")
    with pytest.raises(FileMissingError):
        amass.load(tmp_path / "none.npz")
    with pytest.raises(FileMissingError, match="SMPL_NEUTRAL"):
        amass.load(tmp_path / "ok.npz", model_dir=tmp_path / "no_models", gender="neutral")
    with pytest.raises(FormatError, match="model_type"):
        amass.load(tmp_path / "ok.npz", model_type="mano")
    with pytest.raises(KangEngineError, match="values per frame"):
        amass.load(tmp_path / "ok.npz", model_type="smplx")


def test_bad_body_model_files(tmp_path):
    _clip(tmp_path / "ok.npz", "smplh")
    d = _model_arrays("smplh", 16)
    (tmp_path / "m" / "smplh").mkdir(parents=True)
    d["J_regressor"] = d["J_regressor"][:50]
    np.savez(tmp_path / "m" / "smplh" / "SMPLH_MALE.npz", **d)
    with pytest.raises(FormatError, match="J_regressor"):
        amass.load(tmp_path / "ok.npz", model_dir=tmp_path / "m")
    d = _model_arrays("smplh", 16)
    d["kintree_table"] = d["kintree_table"][:, ::-1]
    np.savez(tmp_path / "m" / "smplh" / "SMPLH_MALE.npz", **d)
    with pytest.raises(FormatError, match="kintree_table"):
        amass.load(tmp_path / "ok.npz", model_dir=tmp_path / "m")
    d = _model_arrays("smplh", 16)
    d["v_template"] = np.array([object()] * 3, dtype=object)
    np.savez(tmp_path / "m" / "smplh" / "SMPLH_MALE.npz", **d)
    with pytest.raises(FormatError, match="pickled object array"):
        amass.load(tmp_path / "ok.npz", model_dir=tmp_path / "m")


def test_smplx_extra_object_keys_are_not_unpickled(tmp_path, model_dir):
    # real SMPL-X .npz files carry pickled dicts (joint2num, part2num) next to the arrays: they are never read
    d = dict(np.load(model_dir / "smplx" / "SMPLX_FEMALE.npz"))
    d["joint2num"] = np.array({"pelvis": 0}, dtype=object)
    (tmp_path / "smplx").mkdir()
    np.savez(tmp_path / "smplx" / "SMPLX_FEMALE.npz", **d)
    _clip(tmp_path / "x.npz", "smplx", gender="female")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = amass.load(tmp_path / "x.npz", model_dir=tmp_path)
    b = amass.load(tmp_path / "x.npz", model_dir=model_dir)
    np.testing.assert_allclose(a.global_translation, b.global_translation, atol=1e-12)


def test_load_motion_dispatches_amass_npz(tmp_path, model_dir):
    _clip(tmp_path / "c.npz", "smplh", gender="male")
    a = ke.pipelines.load_motion(tmp_path / "c.npz", model_dir=model_dir)
    b = amass.load(tmp_path / "c.npz", model_dir=model_dir)
    np.testing.assert_allclose(a.global_translation, b.global_translation)


# -- issue 17: AMASS npz reads only its keys, each checked --------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("mocap_framerate", np.array(["a", "b"]), "expected one value"),
        ("mocap_framerate", np.array("120"), "expected a number"),
        ("mocap_framerate", np.array(np.nan), "finite"),
        ("surface_model_type", np.array([1, 2]), "expected one string"),
        ("gender", np.array(3.0), "expected a string"),
    ],
)
def test_scalar_keys_are_checked_and_named(tmp_path, key, value, expected):
    p = tmp_path / "bad.npz"
    _clip(p, "smpl", **{key: value})
    with pytest.raises(FormatError) as info:
        amass.load(p)
    msg = str(info.value)
    assert str(p) in msg and key in msg and expected in msg, msg


def test_only_the_clip_keys_are_read_and_random_bytes_are_not_an_npz(tmp_path):
    import tracemalloc

    p = tmp_path / "big.npz"
    _clip(p, "smpl", dmpl_cache=np.zeros(4_000_000))  # 32 MB that read_params never needs
    tracemalloc.start()
    try:
        params = amass.read_params(p)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert params.num_frames == T and peak < 4 << 20, peak
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(1).integers(0, 256, 2048, dtype=np.uint8).tobytes())
    with pytest.raises(FormatError, match="not an npz file"):
        amass.load(noise)
