"""Sampling a :class:`~kangengine.animation.library.MotionLibrary`: clip ids, times, poses between stored frames
and the world body state, in torch, without Python loops over queries or host synchronisation.

The interpolation scheme (gather two rows, one lerp, then nlerp or slerp of the quaternion columns) and its
error bound (:func:`nlerp_max_error`) are described in :mod:`kangengine.animation.library`.
"""

from __future__ import annotations

import enum
import math

import numpy as np

from ... import rotations as R
from ...errors import MotionError, NonFiniteError, ShapeError, UnknownMotionError
from .columns import (
    CLIP_DISPLACEMENT,
    CLIP_DURATION,
    CLIP_FPS,
    CLIP_LAST,
    CLIP_PERIOD,
    CLIP_START,
    as_numpy,
    kin_views,
)
from .results import BodyState, MotionSample, make_sample

__all__ = ["Interpolation", "nlerp_max_error", "SamplingMixin"]


class Interpolation(str, enum.Enum):
    """How rotations are blended between two neighbouring stored frames."""

    #: normalised lerp (one fused lerp over the whole row, then renormalise); see
    #: :mod:`kangengine.animation.library`
    NLERP = "nlerp"
    #: spherical linear interpolation (constant angular speed; costs a few more operations)
    SLERP = "slerp"


def nlerp_max_error(theta):
    """Largest angle (rad) between ``nlerp(q0, q1, t)`` and ``slerp(q0, q1, t)`` over ``t`` in [0, 1].

    Args:
        theta: rotation angle between ``q0`` and ``q1`` (rad, in ``[0, pi]``), a float or numpy array.
    Returns:
        The same shape, rad. With ``a = theta / 2`` (the quaternions' half angle) nlerp reaches the 4-D angle
        ``atan2(t sin a, 1 - t + t cos a)`` where slerp reaches ``t a``; the rotation error is twice the
        difference, maximised over ``t`` (on a fine grid). For small angles the difference is
        ``a**3 t (1 - t)(1 - 2t) / 3``, largest at ``t = (3 - sqrt(3)) / 6``: ``theta**3 / (144 sqrt(3))``.
    """
    a = np.asarray(theta, dtype=np.float64)[..., None] / 2
    t = np.linspace(0.0, 1.0, 2001)
    phi = np.arctan2(t * np.sin(a), 1 - t + t * np.cos(a))
    return 2 * np.abs(phi - t * a).max(axis=-1)


def _normalize_quats_(quats, ones4=None) -> None:
    """Normalise ``quats [n, 4 k]`` (k WXYZ quaternions per row, possibly a strided view) in place.

    With ``ones4`` (a ``[4]`` tensor of ones, the CPU strategy): a reduction or broadcast over an inner
    dimension of 4 is slow in torch on the CPU, so the squared norms come from one matrix-vector product
    and the scale is expanded before one flat multiply. Without it (GPU): ``vector_norm`` and a broadcast
    divide, two kernels."""
    import torch

    n, k4 = quats.shape
    if ones4 is not None and n > 0:
        inv = torch.matmul(quats.square().view(n * (k4 // 4), 4), ones4).rsqrt_()
        quats.mul_(inv.view(n, k4 // 4).repeat_interleave(4, dim=1))
    else:
        q = quats.unflatten(1, (k4 // 4, 4))
        q.div_(torch.linalg.vector_norm(q, dim=-1, keepdim=True))


def _add_offsets_(positions, offsets, tile3=None) -> None:
    """``positions [n, 3 k] += offsets [n, 3]`` for each of the k bodies; with ``tile3`` (``[3, 3 k]``, k
    identity blocks side by side, the CPU strategy) as one small GEMM, else as a broadcast add."""
    if tile3 is not None:
        positions.addmm_(offsets, tile3)
    else:
        positions.unflatten(1, (-1, 3)).add_(offsets[:, None, :])


class SamplingMixin:
    """The sampling methods of :class:`~kangengine.animation.library.MotionLibrary` (its only user).

    They read the library's state and write none of it but the caches ``_scratch_cache`` and ``_const_cache``:
    ``device``, ``dtype``, ``interpolation``, ``adapter``, ``skeleton_tree``, ``num_bodies``, ``num_motions``, the
    packed rows ``_frames``, ``_kin`` and ``_backend`` with their layouts ``_cols`` and ``_backend_slices``, the
    clip tensors ``_clip_table``, ``clip_frame_start``, ``clip_fps``, ``clip_weight`` and the host table ``_host``
    (all set by ``MotionLibrary._init_state`` and ``_set_buffers``).
    """

    # -- inputs ------------------------------------------------------------------------------------------
    def _host_check(self, x, check) -> bool:
        if check is None:
            return not (type(x).__module__.startswith("torch") and x.device.type != "cpu")
        return bool(check)

    def _ids(self, motion_ids, check):
        import torch

        do = self._host_check(motion_ids, check)
        if isinstance(motion_ids, torch.Tensor):
            if motion_ids.is_floating_point() or motion_ids.is_complex() or motion_ids.dtype == torch.bool:
                raise ShapeError(f"dtype {motion_ids.dtype}; expected integer motion ids", item="motion_ids")
            ids = motion_ids.to(device=self.device, dtype=torch.int64)
        else:
            a = np.asarray(motion_ids)
            if a.dtype.kind not in "iu":
                if a.size == 0:
                    a = a.astype(np.int64)
                else:
                    raise ShapeError(f"dtype {a.dtype}; expected integer motion ids", item="motion_ids")
            ids = torch.as_tensor(a.astype(np.int64, copy=False), device=self.device)
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim != 1:
            raise ShapeError(f"shape {tuple(ids.shape)}; expected [n] motion ids", item="motion_ids")
        if do:
            a = as_numpy(motion_ids).reshape(-1)
            bad = (a < 0) | (a >= self.num_motions)
            if bad.any():
                i = int(np.argmax(bad))
                raise UnknownMotionError(
                    f"motion id {int(a[i])} (entry {i}) does not exist; the library holds ids "
                    f"0..{self.num_motions - 1}",
                    item="motion_ids",
                )
        return ids

    def _times(self, times, check, what: str = "times"):
        import torch

        do = self._host_check(times, check)
        if isinstance(times, torch.Tensor):
            t = times.to(device=self.device, dtype=torch.float64)
        else:
            a = np.asarray(times, dtype=np.float64)
            t = torch.as_tensor(a, device=self.device)
        if t.ndim == 0:
            t = t.reshape(1)
        if t.ndim != 1:
            raise ShapeError(f"shape {tuple(t.shape)}; expected [n] (one per motion id) or a scalar", item=what)
        if do:
            a = as_numpy(times).astype(np.float64).reshape(-1)
            bad = ~np.isfinite(a)
            if bad.any():
                i = int(np.argmax(bad))
                raise NonFiniteError(f"{what[:-1]} {a[i]} at entry {i} is not finite; expected seconds >= 0", item=what)
            if (a < 0).any():
                i = int(np.argmax(a < 0))
                raise MotionError(f"{what[:-1]} {a[i]} s at entry {i} is negative; expected >= 0", item=what)
        return t

    @staticmethod
    def _broadcast(ids, x, what: str):
        """``ids [n]`` and ``x [n]`` (either may have one entry, repeated for all)."""
        n, m = ids.shape[0], x.shape[0]
        if n == m:
            return ids, x
        if m == 1:
            return ids, x.expand(n)
        if n == 1:
            return ids.expand(m), x
        raise ShapeError(f"{m} {what} for {n} motion ids; expected one each (or a single one for all)", item=what)

    # -- sampling ----------------------------------------------------------------------------------------
    def sample_motion_ids(self, n: int, *, generator=None):
        """``[n] int64`` clip ids drawn with replacement, with probability proportional to ``clip_weight``.

        ``generator`` (a ``torch.Generator`` on the library's device) makes draws reproducible."""
        import torch

        if int(n) < 0:
            raise ShapeError(f"n = {n}; expected >= 0", item="n")
        if int(n) == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        return torch.multinomial(self.clip_weight, int(n), replacement=True, generator=generator)

    def sample_times(self, motion_ids, *, truncate_time: float = 0.0, generator=None, check=None):
        """``[n] float64`` times (s) uniform in ``[0, duration - truncate_time]`` of each clip (0 when the
        clip is shorter than ``truncate_time``)."""
        import torch

        tt = float(truncate_time)
        if not (math.isfinite(tt) and tt >= 0):
            raise MotionError(f"truncate_time {truncate_time}; expected a finite number >= 0", item="truncate_time")
        ids = self._ids(motion_ids, check)
        span = (self._clip_table[:, CLIP_DURATION].index_select(0, ids) - tt).clamp_(min=0.0)
        return torch.rand(ids.shape, dtype=torch.float64, device=self.device, generator=generator) * span

    def sample(self, motion_ids, times, *, loop: bool = True, check: bool | None = None, out=None) -> MotionSample:
        """Poses of clips ``motion_ids`` at ``times``, blended between the two neighbouring stored frames.

        Args:
            motion_ids: ``[n]`` integer clip ids (list, numpy, tensor).
            times: ``[n]`` seconds >= 0 (or a scalar for all); frame ``k`` of a clip is at ``k / clip_fps``.
            loop: ``True``: time wraps modulo the clip duration ``(frames - 1) / fps`` and the root's
                horizontal displacement over the clip is added once per completed loop (so a looping walk
                keeps walking); ``False``: time clamps to ``[0, duration]``.
            check: ``None`` (default) checks host inputs (ids exist, times finite and >= 0) and skips device
                tensors (checking them would synchronise); ``True`` always checks; ``False`` never (hot path;
                out-of-range ids then read garbage or fail inside torch).
            out: a previous :class:`MotionSample` with the same ``n`` (and local translations): its row
                buffer is overwritten in place (no allocation for the pose fields; samples that shared it
                change too). ``None``: a new buffer.

        Returns:
            :class:`MotionSample`; positions lerp, rotations nlerp (or slerp, see ``interpolation``),
            velocities lerp.
        """
        import torch

        ids, t = self._broadcast(self._ids(motion_ids, check), self._times(times, check), "times")
        n = ids.shape[0]
        clip = self._clip_table.index_select(0, ids)
        fps, dur = clip[:, CLIP_FPS], clip[:, CLIP_DURATION]
        if loop:
            cycles = torch.div(t, clip[:, CLIP_PERIOD], rounding_mode="floor")
            local_t = torch.addcmul(t, cycles, dur, value=-1.0)
        else:
            local_t = torch.minimum(t, dur)
        pos = local_t * fps
        last = clip[:, CLIP_LAST]
        f0 = torch.minimum(torch.floor(pos), last)
        blend = (pos - f0).clamp_(0.0, 1.0).to(self.dtype)
        g = (torch.stack((f0, torch.minimum(f0 + 1.0, last))) + clip[:, CLIP_START]).to(torch.int64).reshape(-1)
        cols = self._cols
        buf = self._out_rows(out, n)
        w = blend[:, None]
        self._blend_rows(self._frames, g[:n], g[n:], w, buf, cols.rot)
        offsets = None
        if loop:
            offsets = (cycles[:, None] * clip[:, CLIP_DISPLACEMENT]).to(self.dtype)
            buf[:, cols.root] += offsets
        backend = None
        if self.adapter is not None:
            b = self._backend.index_select(0, g)
            backend = self.adapter.pack_sample(
                self._backend_dict(b[:n]), self._backend_dict(b[n:]), blend, root_offset=offsets
            )
        return make_sample(
            buf,
            cols,
            motion_ids=ids,
            times=t,
            frame0=g[:n],
            frame1=g[n:],
            blend=blend,
            loop_offsets=offsets,
            backend_state=backend,
            interpolated=True,
        )

    def sample_frames(self, motion_ids, frames, *, check: bool | None = None, out=None) -> MotionSample:
        """The stored frames ``frames`` (clip-local indices ``[n]``) of clips ``motion_ids``, bit for bit.

        ``times`` of the result are ``frames / clip_fps``; ``blend`` is 0 and ``frame0 == frame1``.

        Raises:
            UnknownMotionError: an id out of range; MotionError: a frame outside ``[0, frames)`` of its clip
            (host inputs, or ``check=True``).
        """
        import torch

        ids = self._ids(motion_ids, check)
        if isinstance(frames, torch.Tensor):
            if frames.is_floating_point():
                raise ShapeError(f"dtype {frames.dtype}; expected integer frame indices", item="frames")
            f = frames.to(device=self.device, dtype=torch.int64)
        else:
            a = np.asarray(frames)
            if a.dtype.kind not in "iu":
                raise ShapeError(f"dtype {a.dtype}; expected integer frame indices", item="frames")
            f = torch.as_tensor(a.astype(np.int64), device=self.device)
        f = f.reshape(-1) if f.ndim == 0 else f
        if f.ndim != 1:
            raise ShapeError(f"shape {tuple(f.shape)}; expected [n] frame indices or a scalar", item="frames")
        ids, f = self._broadcast(ids, f, "frames")
        n = ids.shape[0]
        if self._host_check(frames, check) and self._host_check(motion_ids, check):
            fa = np.broadcast_to(as_numpy(frames).reshape(-1), (n,))
            ia = np.broadcast_to(as_numpy(motion_ids).reshape(-1), (n,))
            cnt = self._host["count"][ia]
            bad = (fa < 0) | (fa >= cnt)
            if bad.any():
                i = int(np.argmax(bad))
                raise MotionError(
                    f"frame {int(fa[i])} (entry {i}) is outside clip {int(ia[i])}, which has {int(cnt[i])} frames",
                    item="frames",
                )
        g = self.clip_frame_start.index_select(0, ids) + f
        buf = self._out_rows(out, n)
        torch.index_select(self._frames, 0, g, out=buf)
        blend = torch.zeros(n, dtype=self.dtype, device=self.device)
        t = f.to(torch.float64) / self.clip_fps.index_select(0, ids)
        backend = None
        if self.adapter is not None:
            b = self._backend_dict(self._backend.index_select(0, g))
            backend = self.adapter.pack_sample(b, b, blend, root_offset=None)
        return make_sample(
            buf,
            self._cols,
            motion_ids=ids,
            times=t,
            frame0=g,
            frame1=g,
            blend=blend,
            loop_offsets=None,
            backend_state=backend,
            interpolated=False,
        )

    def _out_rows(self, out, n: int):
        import torch

        if out is None:
            return torch.empty((n, self._cols.width), dtype=self.dtype, device=self.device)
        rows = out.rows
        if (
            rows is None
            or tuple(rows.shape) != (n, self._cols.width)
            or rows.dtype != self.dtype
            or rows.device != self.device
        ):
            raise ShapeError(
                f"out holds rows {None if rows is None else tuple(rows.shape)}; expected "
                f"({n}, {self._cols.width}) {self.dtype} on {self.device}",
                item="out",
            )
        return rows

    def _blend_rows(self, table, frame0, frame1, w, out, quat_cols: slice) -> None:
        """``out = blend(table[frame0], table[frame1], w)``: gather frame0 rows straight into ``out``, lerp in
        place towards the frame1 rows, then renormalise (or slerp) the quaternion columns."""
        import torch

        torch.index_select(table, 0, frame0, out=out)
        r1 = self._scratch(table, frame1.shape[0])
        torch.index_select(table, 0, frame1, out=r1)
        if self.interpolation is Interpolation.SLERP:
            q = R.quat_slerp(out[:, quat_cols].unflatten(1, (-1, 4)), r1[:, quat_cols].unflatten(1, (-1, 4)), w)
            out.lerp_(r1, w)
            out[:, quat_cols] = q.flatten(1)
        else:
            out.lerp_(r1, w)
            self._normalize_(out[:, quat_cols])

    def _scratch(self, table, n: int):
        """A reused ``[n, width]`` buffer for the frame1 rows of ``table`` (large fresh buffers would be
        page-faulted in on every call on the CPU). Not shared between threads: see the class docstring."""
        import torch

        key = (table.data_ptr(), tuple(table.shape), n)
        buf = self._scratch_cache.get(key)
        if buf is None:
            if len(self._scratch_cache) >= 8:
                self._scratch_cache.clear()
            buf = torch.empty((n, table.shape[1]), dtype=table.dtype, device=table.device)
            self._scratch_cache[key] = buf
        return buf

    def _normalize_(self, quats) -> None:
        cpu = quats.device.type == "cpu"
        _normalize_quats_(quats, self._consts(quats)["ones4"] if cpu else None)

    def _add_offsets_(self, positions, offsets) -> None:
        cpu = positions.device.type == "cpu"
        _add_offsets_(positions, offsets, self._consts(positions)["tile3"] if cpu else None)

    def _consts(self, like) -> dict:
        import torch

        key = (like.dtype, like.device)
        c = self._const_cache.get(key)
        if c is None:
            eye = torch.eye(3, dtype=like.dtype, device=like.device)
            c = {"ones4": torch.ones(4, dtype=like.dtype, device=like.device), "tile3": eye.repeat(1, self.num_bodies)}
            self._const_cache[key] = c
        return c

    def _backend_dict(self, rows) -> dict:
        return {name: rows[:, sl].reshape((rows.shape[0],) + shape) for name, sl, shape in self._backend_slices}

    # -- kinematics --------------------------------------------------------------------------------------
    def forward_kinematics(self, sample: MotionSample) -> BodyState:
        """World body positions and rotations of ``sample`` through the skeleton's forward kinematics
        (:meth:`SkeletonTree.kinematics.from_local`, the one FK of KangEngine); velocities are ``None``."""
        p, r = self.skeleton_tree.kinematics.from_local(
            sample.root_positions, sample.local_rotations_wxyz, sample.local_translations
        )
        return BodyState(body_positions=p, body_rotations_wxyz=r)

    def sample_kinematics(self, sample: MotionSample, *, out: BodyState | None = None) -> BodyState:
        """World body state of ``sample`` from the precomputed per-frame kinematics (needs
        ``precompute_kinematics=True``): positions lerp (plus the sample's loop offset), rotations nlerp (or
        slerp), velocities lerp, between the sample's two stored frames.

        At stored frames it equals :meth:`forward_kinematics` of the same sample (to float round-off);
        between frames it blends body transforms instead of local rotations, which differs from
        ``forward_kinematics`` by the second-order interpolation error (see ``docs/library.md``).

        ``out``: a previous result of ``sample_kinematics`` with the same ``n``, whose row buffer is
        overwritten in place (as ``out`` of :meth:`sample`).
        """
        import torch

        if self._kin is None:
            raise MotionError(
                "the library was built without precompute_kinematics=True; use "
                "forward_kinematics(sample) or rebuild with precompute_kinematics=True",
                item="sample_kinematics",
            )
        b = self.num_bodies
        n = sample.frame0.shape[0]
        if out is not None:
            rows = out.rows
            if (
                rows is None
                or tuple(rows.shape) != (n, 13 * b)
                or rows.dtype != self.dtype
                or rows.device != self.device
            ):
                raise ShapeError(
                    f"out holds rows {None if rows is None else tuple(rows.shape)}; expected ({n}, {13 * b}) "
                    f"{self.dtype} on {self.device}",
                    item="out",
                )
        else:
            rows = torch.empty((n, 13 * b), dtype=self.dtype, device=self.device)
        if not sample.interpolated:
            torch.index_select(self._kin, 0, sample.frame0, out=rows)
        else:
            self._blend_rows(self._kin, sample.frame0, sample.frame1, sample.blend[:, None], rows, slice(3 * b, 7 * b))
        if sample.loop_offsets is not None:
            self._add_offsets_(rows[:, 0 : 3 * b], sample.loop_offsets)
        p, r, v, w = kin_views(rows, b)
        return BodyState(
            body_positions=p, body_rotations_wxyz=r, body_linear_velocities=v, body_angular_velocities=w, rows=rows
        )
