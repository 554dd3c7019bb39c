"""poselib .npy files through the restricted unpickler (kangengine.datasets.arrays)."""

from __future__ import annotations

import collections
import os
import pickle

import numpy as np
import pytest
from conftest import DATA, data_file

import kangengine as ke
from kangengine import rotations as R
from kangengine.errors import FileMissingError, FormatError, KangEngineError

POSELIB = [
    "amp_humanoid_walk.npy",
    "amp_humanoid_run.npy",
    "amp_humanoid_backflip.npy",
    "amp_humanoid_tpose.npy",
    "cmu_tpose.npy",
]


def _oracle(name):
    # The shared files are trusted third-party data: numpy's own (unrestricted) loader is the oracle here.
    return np.load(data_file(f"motions/amp_poselib/{name}"), allow_pickle=True).item()


@pytest.mark.parametrize("name", POSELIB)
def test_shared_poselib_files_load_and_match_numpy(name):
    ref = _oracle(name)
    got = ke.datasets.load_poselib(data_file(f"motions/amp_poselib/{name}"))
    tree = got.tree
    assert list(tree.node_names) == [str(x) for x in ref["skeleton_tree"]["node_names"]]
    np.testing.assert_array_equal(tree.parent_indices, ref["skeleton_tree"]["parent_indices"]["arr"])
    np.testing.assert_allclose(tree.local_translation, ref["skeleton_tree"]["local_translation"]["arr"])
    rot_xyzw = ref["rotation"]["arr"]
    np.testing.assert_allclose(got.root_translation, ref["root_translation"]["arr"], atol=1e-6)
    ours = got.local_rotation if ref["is_local"] else got.global_rotation
    want = rot_xyzw[..., [3, 0, 1, 2]]
    np.testing.assert_allclose(R.quat_angle_between(ours, want), 0.0, atol=2e-3)  # float32 files
    assert got.local_rotation.dtype == rot_xyzw.dtype
    if ref["__name__"] == "SkeletonMotion":
        assert isinstance(got, ke.animation.SkeletonMotion)
        assert got.fps == float(ref["fps"])
        assert got.metadata["format"] == "poselib"
    else:
        assert not isinstance(got, ke.animation.SkeletonMotion)


@pytest.mark.parametrize("name", ["amp_humanoid_walk.npy", "amp_humanoid_run.npy"])
def test_global_velocity_equals_poselib_stored_velocity(name):
    # poselib stores gaussian_filter1d(np.gradient(global_translation) * fps, sigma=2, mode="nearest"):
    # np.gradient is central differences inside and one-sided at the ends, the scheme of
    # SkeletonMotion.global_velocity. Agreement checks quaternion order, FK and fps together.
    from scipy.ndimage import gaussian_filter1d

    ref = _oracle(name)
    got = ke.datasets.load_poselib(data_file(f"motions/amp_poselib/{name}"))
    smoothed = gaussian_filter1d(got.global_velocity, 2, axis=0, mode="nearest")
    np.testing.assert_allclose(smoothed, ref["global_velocity"]["arr"], atol=2e-3)


def test_backflip_edge_case_float_fps_and_float64():
    ref = _oracle("amp_humanoid_backflip.npy")
    assert isinstance(ref["fps"], float) and ref["rotation"]["arr"].dtype == np.float64
    m = ke.datasets.load_poselib(data_file("motions/amp_poselib/amp_humanoid_backflip.npy"))
    assert m.fps == 16.0 and m.num_frames == 29
    assert m.local_rotation.dtype == np.float64 and m.root_translation.dtype == np.float64
    assert m.metadata["source_dtype"] == "float64"


def test_global_rotation_file_becomes_local():
    ref = _oracle("cmu_tpose.npy")
    assert ref["is_local"] is False
    s = ke.datasets.load_poselib(data_file("motions/amp_poselib/cmu_tpose.npy"))
    glob = s.global_rotation
    np.testing.assert_allclose(R.quat_angle_between(glob, ref["rotation"]["arr"][..., [3, 0, 1, 2]]), 0, atol=2e-3)
    # the root's local rotation is its global one; a child's is inv(parent) * global
    i = s.tree.index("LeftLeg")
    p = s.tree.parent_indices[i]
    np.testing.assert_allclose(
        R.quat_angle_between(R.quat_multiply(glob[p], s.local_rotation[i]), glob[i]), 0, atol=1e-6
    )


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _write_object_npy(path, payload_bytes):
    # an .npy header for a 0-d object array followed by an arbitrary pickle, as np.save(obj) writes it
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": ()})
        f.write(payload_bytes)


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"rotation": _Evil(marker)}, protocol=2)
    bad = tmp_path / "evil.npy"
    _write_object_npy(bad, payload)
    with pytest.raises(FormatError) as info:
        ke.datasets.load_poselib(bad)
    msg = str(info.value)
    assert str(bad) in msg and "system" in msg and ("posix" in msg or "nt." in msg)
    assert not marker.exists()
    # the same payload as a .pkl
    pkl = tmp_path / "evil.pkl"
    pkl.write_bytes(payload)
    with pytest.raises(FormatError, match="refused pickled global"):
        ke.datasets.load_pickle(pkl)
    assert not marker.exists()
    # numpy itself would have run it: proof that the payload is live
    np.load(bad, allow_pickle=True)
    assert marker.exists()


@pytest.mark.parametrize(
    "module_name",
    [
        b"builtins\neval",
        b"__builtin__\neval",
        b"subprocess\nPopen",
        b"numpy\nload",
        b"torch._utils\n_rebuild_tensor_v2",
    ],
)
def test_other_globals_are_refused(tmp_path, module_name):
    # protocol-0 GLOBAL opcode: c<module>\n<name>\n ; then call it with a tuple
    payload = b"c" + module_name + b"\n(S'1+1'\ntR."
    with pytest.raises(FormatError, match="refused pickled global"):
        ke.datasets.loads_restricted(payload, path="x.pkl")


def test_restricted_unpickler_admits_numpy_and_containers(tmp_path):
    obj = collections.OrderedDict(
        a=np.arange(6, dtype=np.float32).reshape(2, 3),
        b=[1, 2.5, "x", b"y", (True, None)],
        c={"d": np.float64(3.0)},
        e={1, 2},
        f=np.array(["s", "t"]),
        g=np.int64(7),
        h=complex(1, 2),
        i=np.zeros((2, 2), order="F"),
    )
    for protocol in (0, 2, 4, 5):
        got = ke.datasets.loads_restricted(pickle.dumps(obj, protocol=protocol))
        assert got.keys() == obj.keys()
        np.testing.assert_array_equal(got["a"], obj["a"])
        assert got["a"].dtype == np.float32 and got["c"]["d"] == 3.0 and got["b"] == obj["b"] and got["e"] == {1, 2}
        np.testing.assert_array_equal(got["f"], obj["f"])


def _poselib_dict(frames=5, nodes=3, dtype=np.float32, fps=30):
    fps = np.array(fps)
    rng = np.random.default_rng(0)
    q = rng.normal(size=(frames, nodes, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    t = lambda a, dt=dtype: {"arr": np.asarray(a, dtype=dt), "context": {"dtype": np.dtype(dt).name}}
    return collections.OrderedDict(
        rotation=t(q),
        root_translation=t(rng.normal(size=(frames, 3))),
        skeleton_tree={
            "node_names": ["a", "b", "c"][:nodes],
            "parent_indices": t([-1, 0, 1][:nodes], np.int64),
            "local_translation": t(rng.normal(size=(nodes, 3))),
        },
        is_local=True,
        fps=fps,
        __name__="SkeletonMotion",
    )


def test_round_trip_of_np_save(tmp_path):
    d = _poselib_dict()
    p = tmp_path / "clip.npy"
    np.save(p, d)
    m = ke.datasets.load_poselib(p)
    np.testing.assert_allclose(m.local_rotation, d["rotation"]["arr"][..., [3, 0, 1, 2]], atol=1e-6)
    np.testing.assert_allclose(m.root_translation, d["root_translation"]["arr"])
    assert m.fps == 30.0 and m.tree.node_names == ("a", "b", "c")


def _bad(tmp_path, mutate, name="bad.npy"):
    d = _poselib_dict()
    mutate(d)
    p = tmp_path / name
    np.save(p, d)
    return p


@pytest.mark.parametrize(
    ("mutate", "item"),
    [
        (lambda d: d.pop("rotation"), "rotation"),
        (lambda d: d.pop("fps"), "fps"),
        (lambda d: d.__setitem__("fps", "fast"), "fps"),
        (lambda d: d["rotation"]["arr"].__setitem__((0, 0, 0), np.nan), "rotation"),
        (lambda d: d.__setitem__("rotation", {"arr": np.zeros((0, 3, 4), np.float32)}), "rotation"),
        (lambda d: d.__setitem__("rotation", {"arr": np.ones((5, 3, 3), np.float32)}), "rotation"),
        (lambda d: d.__setitem__("rotation", {"arr": np.ones((5, 2, 4), np.float32)}), "rotation"),
        (lambda d: d.__setitem__("rotation", {"arr": np.array([["x"] * 4] * 3)}), "rotation"),
        (lambda d: d.__setitem__("root_translation", {"arr": np.zeros((4, 3), np.float32)}), "root_translation"),
        (lambda d: d["skeleton_tree"].pop("parent_indices"), "skeleton_tree.parent_indices"),
        (lambda d: d.__setitem__("__name__", "Mesh"), "__name__"),
        (lambda d: d.__setitem__("is_local", "yes"), "is_local"),
    ],
)
def test_bad_poselib_files_name_file_and_key(tmp_path, mutate, item):
    p = _bad(tmp_path, mutate)
    with pytest.raises(KangEngineError) as info:
        ke.datasets.load_poselib(p)
    assert str(p) in str(info.value) and item in str(info.value)


def test_truncated_and_missing_files(tmp_path):
    src = data_file("motions/amp_poselib/amp_humanoid_walk.npy").read_bytes()
    for cut in (10, 200, len(src) // 2, len(src) - 3):
        p = tmp_path / f"cut{cut}.npy"
        p.write_bytes(src[:cut])
        with pytest.raises(FormatError) as info:
            ke.datasets.load_poselib(p)
        assert str(p) in str(info.value)
    with pytest.raises(FileMissingError):
        ke.datasets.load_poselib(tmp_path / "nope.npy")
    txt = tmp_path / "text.npy"
    txt.write_text("hello")
    with pytest.raises(FormatError, match="not an .npy"):
        ke.datasets.load_poselib(txt)
    plain = tmp_path / "plain.npy"
    np.save(plain, np.zeros(3))
    with pytest.raises(FormatError, match="expected poselib"):
        ke.datasets.load_poselib(plain)
    assert isinstance(ke.datasets.load_npy(plain), np.ndarray)


def test_data_dir_is_present():
    assert (DATA / "motions" / "amp_poselib").is_dir()


def test_load_motion_dispatches_npy_to_poselib(tmp_path):
    m = ke.pipelines.load_motion(data_file("motions/amp_poselib/amp_humanoid_run.npy"))
    assert isinstance(m, ke.animation.SkeletonMotion) and m.num_frames == 82 and m.fps == 60.0
    with pytest.raises(FormatError, match="SkeletonState"):
        ke.pipelines.load_motion(data_file("motions/amp_poselib/cmu_tpose.npy"))
    # a KangEngine npz still goes to SkeletonMotion.load_npz, and an unknown npz names its keys
    m.save_npz(tmp_path / "run.npz")
    again = ke.pipelines.load_motion(tmp_path / "run.npz")
    np.testing.assert_allclose(again.local_rotation, m.local_rotation)
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(FormatError, match=r"\['a'\]"):
        ke.pipelines.load_motion(tmp_path / "other.npz")


# -- issue 17: bounded memory, no crash, checked values ---------------------------------------------------------


def _peak(fn):
    """``(exception or result, tracemalloc peak in bytes)`` of ``fn()``."""
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
    except Exception as exc:  # returned, for the caller to check its type
        out = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return out, peak


def test_37_byte_npy_with_bytearray_is_refused_without_allocating(tmp_path):
    # GLOBAL builtins.bytearray, BININT 1.9e9, TUPLE1, REDUCE: numpy's header for a 0-d object array before it
    bad = tmp_path / "tiny.npy"
    _write_object_npy(bad, b"\x80\x02c__builtin__\nbytearray\nJ\x00\x00\x00\x70\x85R.")
    out, peak = _peak(lambda: ke.datasets.load_npy(bad))
    assert isinstance(out, FormatError) and str(bad) in str(out) and "bytearray" in str(out)
    assert peak < 2 << 20, peak  # before the fix: 1.9 GB


@pytest.mark.parametrize(
    ("what", "payload"),
    [
        ("bytes8 length", b"\x80\x04\x8e" + (1_900_000_000).to_bytes(8, "little") + b"abc."),
        ("bytearray8 length", b"\x80\x05\x96" + (1_900_000_000).to_bytes(8, "little") + b"abc."),
        (
            "_reconstruct shape",
            b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\x00\x00\x70\x85C\x01b\x87R.",
        ),
        ("ndarray(shape)", b"\x80\x02cnumpy\nndarray\nJ\x00\x00\x00\x70\x85R."),
    ],
)
def test_pickle_claims_are_bounded_by_the_input_size(what, payload):
    out, peak = _peak(lambda: ke.datasets.loads_restricted(payload, path="claim.pkl"))
    assert isinstance(out, FormatError) and "claim.pkl" in str(out), (what, out)
    assert peak < 2 << 20, (what, peak)  # CPython's unpickler allocates a counted length before reading it


def test_object_array_with_fewer_items_than_its_shape_is_refused_not_crashing(tmp_path):
    # numpy's __setstate__ trusts the state: 1 item for shape (3,) leaves NULL pointers and printing segfaults.
    # Run in a child process so that the old behaviour fails this test instead of killing the test run.
    import subprocess
    import sys

    payload = (
        b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85C\x01b\x87R(K\x01K\x03\x85"
        b"cnumpy\ndtype\nX\x02\x00\x00\x00O8K\x00K\x01\x87R(K\x03X\x01\x00\x00\x00|NNNJ\xff\xff\xff\xffJ\xff\xff"
        b"\xff\xffK?tb\x89]K\x01atb."
    )
    code = (
        "import sys\nfrom kangengine.datasets import loads_restricted\nfrom kangengine.errors import FormatError\n"
        "try:\n    print(repr(loads_restricted(sys.stdin.buffer.read())))\n"
        "except FormatError as e:\n    print('refused:', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-500:]
    assert r.stdout.decode().startswith("refused:") and "expected a list of 3" in r.stdout.decode()


def test_npy_header_claiming_more_than_the_file_is_refused_before_allocating(tmp_path):
    p = tmp_path / "claim.npy"
    with open(p, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (250_000_000,)})
        f.write(b"\0" * 64)
    out, peak = _peak(lambda: ke.datasets.load_npy(p))
    assert isinstance(out, FormatError) and "2000000000 bytes" in str(out) and str(p) in str(out)
    assert peak < 2 << 20, peak
    np.save(p, np.arange(6.0).reshape(2, 3))  # the real thing still loads, exactly
    np.testing.assert_array_equal(ke.datasets.load_npy(p), np.arange(6.0).reshape(2, 3))


def test_is_local_array_is_a_format_error(tmp_path):
    for value, ok in ((np.array([True, False]), False), (np.array(True), True), (np.array([1]), False)):
        p = _bad(tmp_path, lambda d, v=value: d.__setitem__("is_local", v))
        if ok:
            assert ke.datasets.load_poselib(p).num_frames > 0
        else:
            with pytest.raises(FormatError, match="is_local") as info:
                ke.datasets.load_poselib(p)
            assert str(p) in str(info.value)


def test_zero_and_non_unit_quaternions_are_refused_or_normalised_with_a_note(tmp_path):
    from kangengine._files import QUAT_NORM_TOLERANCE

    ref = _poselib_dict()["rotation"]["arr"]
    for scale, refused in ((0.0, True), (1.01, True), (1 + QUAT_NORM_TOLERANCE * 2, True), (1.0005, False)):

        def mutate(d, s=scale):
            d["rotation"]["arr"][3, 2] *= s

        p = _bad(tmp_path, mutate)
        if refused:
            with pytest.raises(FormatError, match=r"quaternion \(3, 2\)") as info:
                ke.datasets.load_poselib(p)
            assert str(p) in str(info.value) and "rotation" in str(info.value)
        else:
            m = ke.datasets.load_poselib(p)
            np.testing.assert_allclose(np.linalg.norm(m.local_rotation, axis=-1), 1, atol=1e-6)
            assert "was 0.0005 (tolerance 0.001)" in m.metadata["quaternions_normalised"]
            # the direction is kept: the normalised quaternion is the file's divided by its norm (scipy as oracle)
            from scipy.spatial.transform import Rotation

            want = Rotation.from_quat(ref[3, 2].astype(np.float64)).as_quat()  # XYZW, normalised by scipy
            np.testing.assert_allclose(m.local_rotation[3, 2][[1, 2, 3, 0]], want, atol=1e-6)
    # the shared clips are unit to float rounding: no note, except the float64 backflip (6e-6 off)
    assert (
        "quaternions_normalised"
        not in ke.datasets.load_poselib(data_file("motions/amp_poselib/amp_humanoid_walk.npy")).metadata
    )
    flip = ke.datasets.load_poselib(data_file("motions/amp_poselib/amp_humanoid_backflip.npy"))
    assert "was 6.22e-06" in flip.metadata["quaternions_normalised"]


def test_bad_node_name_bytes_and_ragged_arrays_are_format_errors(tmp_path):
    p = _bad(tmp_path, lambda d: d["skeleton_tree"].__setitem__("node_names", [b"\xff\xfe"] * 15))
    with pytest.raises(FormatError, match="UTF-8"):
        ke.datasets.load_poselib(p)
    p = _bad(tmp_path, lambda d: d.__setitem__("root_translation", {"arr": [[1.0, 2.0], [3.0]]}))
    with pytest.raises(FormatError, match="root_translation"):
        ke.datasets.load_poselib(p)
