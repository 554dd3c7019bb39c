"""ArticulationMotion and its npz files."""

from __future__ import annotations

import dataclasses
import os
import warnings

import numpy as np
import pytest
from conftest import data_file

from kangengine.animation import (
    ArticulationCoordinateLayout,
    ArticulationMotion,
    load_articulation_motion_npz,
    save_articulation_motion_npz,
)
from kangengine.asset import MJCFLoader
from kangengine.errors import FormatError, LayoutMismatch, LayoutSignatureWarning, NonFiniteError, ShapeError


@pytest.fixture(scope="module")
def layout():
    return ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml")))


def _quat_columns(layout):
    """The q columns of every quaternion of the layout (free root after its position, ball joints)."""
    starts = [b.q_offset + (3 if b.joint_type.value == "free" else 0) for b in layout.blocks if b.q_dim >= 4]
    return np.asarray(starts)[:, None] + np.arange(4)


def _motion(layout, frames=50):
    rng = np.random.default_rng(0)
    q = np.tile(layout.neutral(), (frames, 1)) + 0.1 * rng.normal(size=(frames, layout.nq))
    cols = _quat_columns(layout)
    q[:, cols] /= np.linalg.norm(q[:, cols], axis=-1, keepdims=True)  # rotations are unit quaternions
    return ArticulationMotion(
        q, rng.normal(size=(frames, layout.nv)), 30.0, layout.model_signature, joint_names=layout.joint_names
    )


def test_types_and_views(layout):
    m = _motion(layout)
    assert m.q.dtype == np.float32 and m.qd.dtype == np.float32
    assert m.fps() == 30.0 and m.num_frames == 50 and m.duration == pytest.approx(49 / 30)
    assert m[::2].fps() == 15.0 and m[::2].num_frames == 25
    m.check_layout(layout)


def test_npz_round_trip_is_exact(layout, tmp_path):
    m = _motion(layout)
    path = tmp_path / "clip.npz"
    save_articulation_motion_npz(path, m, layout=layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = load_articulation_motion_npz(path, layout)
    np.testing.assert_array_equal(back.q, m.q)
    np.testing.assert_array_equal(back.qd, m.qd)
    assert back.fps() == 30.0 and back.layout_signature == layout.model_signature
    z = np.load(path, allow_pickle=False)
    assert int(z["format_version"]) == 1 and list(z["dof_names"]) == list(layout.dof_names)
    assert "rad" in str(z["units_json"])


def test_nq_mismatch_raises_and_signature_mismatch_warns(layout, tmp_path):
    m = _motion(layout)
    path = tmp_path / "clip.npz"
    save_articulation_motion_npz(path, m)
    other = ArticulationCoordinateLayout.from_data(data=MJCFLoader.load(data_file("mjcf/gymnasium/humanoid.xml")))
    with pytest.raises(LayoutMismatch, match="nq=28"):
        load_articulation_motion_npz(path, other)
    desc = MJCFLoader.load(data_file("mjcf/mujoco/humanoid.xml"))
    j = dataclasses.replace(desc.joints[1], range=(-0.5, 0.5))
    changed = ArticulationCoordinateLayout.from_data(
        data=dataclasses.replace(desc, joints=(desc.joints[0], j) + desc.joints[2:])
    )
    assert (changed.nq, changed.nv) == (layout.nq, layout.nv)
    with pytest.warns(LayoutSignatureWarning, match="signature"):
        back = load_articulation_motion_npz(path, changed)
    assert back.metadata["file_signature"] == layout.model_signature
    np.testing.assert_array_equal(back.q, m.q)
    with pytest.raises(LayoutMismatch):
        m.check_layout(changed)


def test_bad_inputs(layout, tmp_path):
    q = np.tile(layout.neutral(), (5, 1))
    q[2, 4] = np.nan
    with pytest.raises(NonFiniteError, match="frame 2"):
        ArticulationMotion(q, np.zeros((5, layout.nv)), 30, layout.model_signature)
    with pytest.raises(ShapeError):
        ArticulationMotion(np.zeros((5, layout.nq)), np.zeros((4, layout.nv)), 30, "x")
    with pytest.raises(FormatError, match="fps"):
        ArticulationMotion(np.zeros((5, layout.nq)), np.zeros((5, layout.nv)), float("nan"), "x")
    wrong = tmp_path / "wrong.npz"
    np.savez(
        wrong,
        format=np.array("something.else"),
        q=np.zeros((1, 1)),
        qd=np.zeros((1, 1)),
        fps=np.array(30.0),
        model_signature=np.array("x"),
    )
    with pytest.raises(FormatError, match="expected 'kangengine.articulation_motion'"):
        load_articulation_motion_npz(wrong, layout)
    truncated = tmp_path / "trunc.npz"
    save_articulation_motion_npz(truncated, _motion(layout))
    truncated.write_bytes(truncated.read_bytes()[:200])
    with pytest.raises(FormatError) as e:
        load_articulation_motion_npz(truncated, layout)
    assert "trunc.npz" in str(e.value)


def test_failed_write_keeps_old_file(layout, tmp_path, monkeypatch):
    path = tmp_path / "clip.npz"
    save_articulation_motion_npz(path, _motion(layout))
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")  # where a full disk shows with delayed allocation: the data is in the temp file

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        save_articulation_motion_npz(path, _motion(layout, 10))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["clip.npz"]


def test_written_files_get_the_usual_permissions(layout, tmp_path):
    import os
    import stat

    path = tmp_path / "clip.npz"
    save_articulation_motion_npz(path, _motion(layout))
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


# -- issue 17: the reader checks what it reads ----------------------------------------------------------------


def _saved_arrays(layout, tmp_path):
    path = tmp_path / "clip.npz"
    save_articulation_motion_npz(path, _motion(layout, 12), layout=layout)
    return dict(np.load(path))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("fps", np.array("thirty"), "expected a number"),
        ("fps", np.zeros(3), "expected one value"),
        ("format_version", np.array(np.inf), "expected an integer"),
        ("format_version", np.array("1"), "expected an integer"),
        ("metadata_json", np.array("{'a': 1}"), "not valid JSON"),
        ("metadata_json", np.array("[" * 100_000), "not valid JSON"),
        ("model_signature", np.array([1, 2]), "expected one value"),
        ("q", np.full((12, 28), "x"), "expected floats"),
        ("qd", np.zeros(27), "expected 2 dimensions"),
    ],
)
def test_npz_values_are_checked_and_named(layout, tmp_path, key, value, expected):
    arrays = _saved_arrays(layout, tmp_path)
    arrays[key] = value
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(FormatError) as info:
        load_articulation_motion_npz(bad, layout)
    msg = str(info.value)
    assert str(bad) in msg and key in msg and expected in msg, msg


def test_npz_quaternions_are_refused_or_normalised_with_a_note(layout, tmp_path):
    arrays = _saved_arrays(layout, tmp_path)
    cols = _quat_columns(layout)
    p = tmp_path / "q.npz"
    for scale, refused in ((0.0, True), (1.002, True), (1.0003, False)):
        a = dict(arrays)
        a["q"] = arrays["q"].copy()
        a["q"][5, cols[0]] *= scale
        np.savez(p, **a)
        if refused:
            with pytest.raises(FormatError, match="quaternion") as info:
                load_articulation_motion_npz(p, layout)
            assert str(p) in str(info.value)
        else:
            m = load_articulation_motion_npz(p, layout)
            np.testing.assert_allclose(np.linalg.norm(m.q[:, cols], axis=-1), 1, atol=1e-6)
            np.testing.assert_allclose(m.q[5, cols[0]], arrays["q"][5, cols[0]], atol=1e-6)
            assert "0.0003" in m.metadata["quaternions_normalised"]
