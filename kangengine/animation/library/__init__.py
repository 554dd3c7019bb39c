"""`MotionLibrary`: many clips packed frame-major in torch tensors, sampled for thousands of environments.

Storage (one skeleton for every clip; all clips concatenated frame after frame, "packed" in the
pytorch3d sense):

* ``frames_packed [total_frames, D]``: one row per stored frame holding, in this order, the root position
  (3, m, world), the local rotations ``parent_from_node`` WXYZ of every node (``4 * bodies``; node 0's is
  the root's world rotation), the root linear velocity (3, m/s, world), the root angular velocity
  (3, rad/s, world) and, when any clip has them, the per-frame local translations (``3 * bodies``, m).
* ``kinematics_packed [total_frames, 13 * bodies]`` (``precompute_kinematics=True``): global positions,
  global rotations WXYZ, linear and angular velocities of every body, all in world.
* ``backend_packed [total_frames, Db]`` (with an adapter): the adapter's per-frame native arrays.
* per clip: ``clip_frame_start``, ``clip_frame_count``, ``clip_fps``, ``clip_weight``, ``clip_duration``.

Velocities are defined once, at registration, from the stored frames of each clip (the same scheme as
:attr:`SkeletonMotion.global_velocity` / :attr:`SkeletonMotion.global_angular_velocity`): linear
velocity ``(p[i+1] - p[i-1]) / (2 dt)`` and angular velocity ``log(q[i+1] q[i-1]^-1) / (2 dt)`` (world
frame, left-multiplicative: ``q(t + h) = exp(w h) q(t)``) inside a clip, one-sided differences at its first
and last frame, zero for a one-frame clip; ``dt = 1 / clip fps``. Differences never cross clip boundaries.

Sampling reads the two stored frames around each query time (on the CPU in one compiled pass per query that
writes the output row once, :mod:`.native_blend`; elsewhere with ``index_select`` of whole rows), lerps
positions and velocities, and interpolates rotations with exact slerp (the default, ``interpolation="slerp"``):
``slerp(q0, q1, t) = (cos(t a) - cos(a) b) q0 + b q1`` with ``b = sin(t a) / sin(a)``, ``a`` the half-angle of
the frame pair, read from a per-frame table built once (:func:`~.sampling.pair_angle_table`, one float per
quaternion per frame), so a query costs two ``sin`` and two ``cos`` per quaternion and no branch. The stored
quaternions are made hemisphere-continuous along each clip at registration (``q`` and ``-q`` are the same
rotation). ``interpolation="nlerp"`` blends the whole row with one ``torch.lerp`` and renormalises; between two
neighbouring mocap frames it differs from slerp by at most ``nlerp_max_error(theta) ~= theta**3 / (144 sqrt(3))``
rad (4e-6 rad for 0.1 rad between frames, 5e-4 rad for 0.5 rad). ``tests/test_library.py`` measures both on
real clips.

Nothing in :meth:`MotionLibrary.sample` loops over environments in Python or synchronises with the
device (no ``.item()``, no data-dependent shapes); input checks that would need the device's data run only
on host inputs (lists, numpy arrays, CPU tensors) unless ``check=True`` is passed. The methods can be
captured in a CUDA graph (call once before capturing, as for any torch code).

The package, one idea per module (import downward: ``columns`` -> ``results`` -> ``packing``, ``sampling``,
``fileformat`` -> ``core``):

* ``columns``: the column layouts of the rows (frames, kinematics, the per-clip table, adapter fields).
* ``results``: :class:`MotionSample`, :class:`BodyState`, :class:`PackedMotionBuffers`, views of those rows.
* ``packing``: canonical clips to packed rows (velocities, hemisphere continuity, the adapter's frames).
* ``sampling``: :class:`Interpolation`, :func:`nlerp_max_error` and the sampling methods of the library.
* ``native_blend``: the CPU strategy of sampling, compiled with llvmlite (frame pairs, then gather + blend).
* ``fileformat``: library files (:data:`LIBRARY_FORMAT`, version :data:`LIBRARY_FORMAT_VERSION`).
* ``core``: :class:`MotionLibrary` itself (registration, state, :meth:`~MotionLibrary.save` and
  :meth:`~MotionLibrary.load`).
"""

from ...errors import MixedSkeletonError, UnknownMotionError
from .core import MotionLibrary
from .fileformat import LIBRARY_FORMAT, LIBRARY_FORMAT_VERSION
from .results import BodyState, MotionSample, PackedMotionBuffers
from .sampling import Interpolation, nlerp_max_error

__all__ = [
    "MotionLibrary",
    "MotionSample",
    "BodyState",
    "PackedMotionBuffers",
    "Interpolation",
    "UnknownMotionError",
    "MixedSkeletonError",
    "nlerp_max_error",
    "LIBRARY_FORMAT",
    "LIBRARY_FORMAT_VERSION",
]
