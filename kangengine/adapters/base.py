"""The `MotionAdapter` protocol: how a simulator adapter plugs into :class:`~kangengine.animation.MotionLibrary`.

An adapter converts canonical motion (DESIGN.md §3: WXYZ, world-frame free-root velocities,
parent-frame ball velocities) into one simulator's native buffers and back. Inside a library it is used
in two steps:

1. **Registration** (once per clip, numpy): ``prepare_motion(motion, skeleton_motion=...)`` returns a
   dict of per-frame native arrays, each ``[frames, ...]`` float. The library packs them frame-major into
   torch tensors next to its canonical buffers (``packed_buffers().backend``).
2. **Sampling** (every control step, torch, no Python loop over environments, no host sync): the library
   gathers the two neighbouring frames of every query, ``frames0[name][n, ...]`` and
   ``frames1[name][n, ...]``, and calls ``pack_sample(frames0, frames1, blend, root_offset=...)`` with
   ``blend [n]`` in ``[0, 1]`` (0 gives ``frames0``) and an optional world translation ``root_offset
   [n, 3]`` (the library's loop displacement) to add to the root position. The result, a dataclass of
   tensors on the same device, becomes ``sample.backend_state``.

Details the library guarantees (``MotionLibrary``): ``prepare_motion`` receives the clip as the user gave it
(an ``ArticulationMotion`` or a ``SkeletonMotion``; a ``SkeletonMotion`` rebuilt from the stored frames when
a library file is loaded without the adapter's frames) and the canonical ``skeleton_motion`` (numpy). The
arrays are stored in the library's dtype (float32 by default). At sampling time ``frames0``/``frames1``
hold views (possibly strided) of freshly gathered rows: ``pack_sample`` must not write into them; for
exact stored frames (``sample_frames``) both are the same dict and ``blend`` is zero; ``root_offset`` is
``None`` when the query does not loop (``loop=False`` or ``sample_frames``). Library files keep the prepared
arrays with the adapter's class name and reuse them when the same adapter class and layout signature load
them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["MotionAdapter"]


@runtime_checkable
class MotionAdapter(Protocol):
    """What :class:`~kangengine.animation.MotionLibrary` needs from a simulator adapter."""

    #: the canonical coordinate layout the adapter converts from
    layout: Any

    def prepare_motion(self, motion, *, skeleton_motion=None) -> dict:
        """Per-frame native arrays for one clip.

        Args:
            motion: the clip as registered: an ``ArticulationMotion`` (its ``q``/``qd`` can be reused) or a
                ``SkeletonMotion`` on the layout's skeleton.
            skeleton_motion: the canonical ``SkeletonMotion`` the library stores for this clip.
        Returns:
            ``{name: ndarray [frames, ...]}``, float32 or float64, every array with the same frame count.
        """
        ...

    def pack_sample(self, frames0: dict, frames1: dict, blend, *, root_offset=None):
        """Blend two gathered native frames into a backend state.

        Args:
            frames0, frames1: ``{name: Tensor [n, ...]}`` as produced by :meth:`prepare_motion`, gathered.
            blend: ``[n]`` tensor, weight of ``frames1``.
            root_offset: optional ``[n, 3]`` world translation added to the root position.
        Returns:
            A dataclass of ``[n, ...]`` tensors on the input device (e.g. ``qpos``/``qvel`` for MuJoCo).
        """
        ...
