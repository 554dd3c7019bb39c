"""Sampling a :class:`~kangengine.animation.library.MotionLibrary`: clip ids, times, poses between stored frames
and the world body state, in torch, without Python loops over queries or host synchronisation.

The interpolation scheme (gather two rows, one lerp, then nlerp or slerp of the quaternion columns) and its
error bound (:func:`nlerp_max_error`) are described in :mod:`kangengine.animation.library`.
"""

from __future__ import annotations

import enum
import math
import warnings

import numpy as np

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

__all__ = ["Interpolation", "nlerp_max_error", "pair_angle_table", "SamplingMixin"]


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


# Smallest frame-pair half-angle the slerp weights use (rad), per dtype: below it sin(t a) / sin(a) equals t to
# a**2 / 6 relative (2e-9 in float32, 2e-17 in float64), far below the dtype's resolution, so slerp needs no
# small-angle branch.
_MIN_PAIR_ANGLE = {"float32": 1e-4, "float64": 1e-8}
_PAIR_CHUNK = 1 << 16  # frames per float64 chunk in pair_angle_table


def pair_angle_table(quats, last_frame):
    """Per frame, what slerp towards the next stored frame of its clip needs: ``[F, k]`` in ``quats``' dtype.

    Args:
        quats: ``[F, 4 k]`` packed rows of ``k`` WXYZ quaternions per frame (a strided view is fine).
        last_frame: ``[F] int64`` packed index of the last frame of each row's clip (the pair of a clip's last
            frame is the frame with itself).

    Returns:
        ``s a`` per quaternion: the 4-D half-angle ``a`` between frame ``f`` and frame ``min(f + 1, last)`` of the
        normalised quaternions (rad, at least ``_MIN_PAIR_ANGLE`` of the dtype, so never 0) signed with ``s``, the
        sign of their dot product (slerp takes the shorter arc). Then ``slerp(q0, q1, t) = (cos(t a) - s cos(a)
        b) q0 + b q1`` with ``b = sin(t a) s / sin(a)`` (:func:`_slerp_weights`). Computed in float64, in chunks
        of frames; one value per quaternion keeps the table (and what a query reads of it) small.
    """
    import torch

    n_frames, k = quats.shape[0], quats.shape[1] // 4
    smallest = _MIN_PAIR_ANGLE[str(quats.dtype).removeprefix("torch.")]
    out = torch.empty((n_frames, k), dtype=quats.dtype, device=quats.device)
    nxt = torch.minimum(torch.arange(1, n_frames + 1, device=quats.device), last_frame)
    for s in range(0, n_frames, _PAIR_CHUNK):
        e = min(n_frames, s + _PAIR_CHUNK)
        q0 = quats[s:e].to(torch.float64).unflatten(1, (k, 4))
        q1 = quats.index_select(0, nxt[s:e]).to(torch.float64).unflatten(1, (k, 4))
        d = (q0 * q1).sum(-1) / (torch.linalg.vector_norm(q0, dim=-1) * torch.linalg.vector_norm(q1, dim=-1))
        sign = torch.where(d < 0, -1.0, 1.0).to(torch.float64)
        out[s:e] = sign * torch.acos(d.abs().clamp(max=1.0)).clamp(min=smallest)
    return out


def _slerp_weights(pairs, w, k: int, x, w0, w1) -> None:
    """Slerp weights from gathered :func:`pair_angle_table` rows ``pairs [n, k]`` and blends ``w [n, 1]``
    (``t`` in [0, 1]): ``w0 [n, k]`` (of frame0) and ``w1 [n, k]`` (of frame1) are written, ``x [n, k]`` is
    scratch. No branch, no host synchronisation."""
    import torch

    a = pairs.abs()
    sign = torch.sign(pairs)
    torch.mul(a, w, out=x)
    torch.sin(x, out=w1)
    w1.mul_(sign / torch.sin(a))
    torch.cos(x, out=w0)
    w0.addcmul_(sign * torch.cos(a), w1, value=-1.0)


def _gather_rows(table, index, out) -> None:
    """``out[i] = table[index[i]]`` (``index_select``); float32 rows of even width move as float64 pairs, which
    is the same bytes in half the elements (about 15 % faster on the CPU)."""
    import torch

    if (
        table.dtype == torch.float32
        and table.shape[1] % 2 == 0
        and table.is_contiguous()
        and out.is_contiguous()
        and table.storage_offset() % 2 == 0
        and out.storage_offset() % 2 == 0
    ):
        torch.index_select(table.view(torch.float64), 0, index, out=out.view(torch.float64))
    else:
        torch.index_select(table, 0, index, out=out)


def _compiling() -> bool:
    """Whether ``torch.compile`` is tracing (no data pointers there: the torch strategy runs)."""
    import torch

    compiler = getattr(torch, "compiler", None)
    return compiler is not None and bool(getattr(compiler, "is_compiling", lambda: False)())


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
                bad queries then give wrong poses: on the CPU an out-of-range id reads clip 0, elsewhere
                garbage or an error inside torch).
            out: a previous :class:`MotionSample` with the same ``n`` (and local translations): its row
                buffer is overwritten in place (no allocation for the pose fields; samples that shared it
                change too). ``None``: a new buffer.

        Returns:
            :class:`MotionSample`; positions lerp, rotations slerp (or nlerp, see ``interpolation``),
            velocities lerp.
        """

        ids, t = self._broadcast(self._ids(motion_ids, check), self._times(times, check), "times")
        n = ids.shape[0]
        located = self._locate_native(ids, t, loop)
        if located is not None:
            g, blend, offsets = located
        else:
            g, blend, offsets = self._locate_torch(ids, t, loop)
        cols = self._cols
        buf = self._out_rows(out, n)
        self._blend_rows(self._frames, g[:n], g[n:], blend, buf, cols.rot, offsets, 3)
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

    def _locate_native(self, ids, t, loop: bool):
        """:meth:`_locate_torch` in one compiled pass (:func:`.native_blend.locate_kernel`) on the CPU, or
        ``None`` where the torch strategy must run."""
        import torch

        if not getattr(self, "_use_native_blend", True) or self.device.type != "cpu" or _compiling():
            return None
        from . import native_blend

        try:
            kern = native_blend.locate_kernel(np.float32 if self.dtype == torch.float32 else np.float64, loop)
        except Exception:  # the blend's own build reports the failure; torch instead
            kern = None
        if kern is None:
            return None
        n = ids.shape[0]
        g = torch.empty(2 * n, dtype=torch.int64)
        blend = torch.empty(n, dtype=self.dtype)
        offsets = torch.empty((n, 3), dtype=self.dtype) if loop else None
        kern(ids, t, self._clip_table, g, blend, blend if offsets is None else offsets)
        return g, blend, offsets

    def _locate_torch(self, ids, t, loop: bool):
        """Per query: the packed frame pair ``g [2 n] int64`` (frame0 then frame1), the blend weight ``[n]`` and
        the loop offsets ``[n, 3]`` (``None`` without ``loop``), in torch ops on any device."""
        import torch

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
        offsets = (cycles[:, None] * clip[:, CLIP_DISPLACEMENT]).to(self.dtype) if loop else None
        return g, blend, offsets

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

    def _blend_rows(self, table, frame0, frame1, blend, out, quat_cols: slice, offsets=None, offset_cols: int = 0):
        """``out = blend(table[frame0], table[frame1], blend)``, plus ``offsets [n, 3]`` (when given) added to each
        of the position columns ``[0, offset_cols)`` (``c`` gets component ``c mod 3``).

        ``frame1`` must be the successor of ``frame0`` in its clip (or ``frame0`` at a clip's end), as
        :meth:`sample` makes it: the slerp reads that frame pair's angle from :func:`pair_angle_table`. On the CPU
        one compiled pass per query does all of it (:mod:`.native_blend`); elsewhere (or without llvmlite) the
        torch strategy :meth:`_blend_rows_torch` runs."""
        import torch

        kern = self._native_blend(table, out, quat_cols, offsets is not None and offset_cols, frame0, blend)
        if kern is not None and not (frame1.is_contiguous() and frame0.dtype == frame1.dtype == torch.int64):
            kern = None
        if kern is not None:
            slerp = self.interpolation is Interpolation.SLERP
            pairs = self._pair_angles(table, quat_cols) if slerp else table
            offsets = table if offsets is None else offsets.contiguous()
            kern(table, pairs, frame0, frame1, blend, offsets, out, threads=torch.get_num_threads())
            return
        self._blend_rows_torch(table, frame0, frame1, blend[:, None], out, quat_cols)
        if offsets is not None and offset_cols == 3:
            out[:, :3] += offsets
        elif offsets is not None and offset_cols:
            self._add_offsets_(out[:, :offset_cols], offsets)

    def _native_blend(self, table, out, quat_cols: slice, offset_cols: int, frame0, blend):
        """The compiled blend (:func:`.native_blend.blend_kernel`) for this call, or ``None`` when the torch
        strategy must run: not on the CPU, inside ``torch.compile``, a tensor requiring grad or not contiguous,
        llvmlite missing, or ``_use_native_blend`` set to ``False`` (the tests compare the two strategies)."""
        import torch

        if not getattr(self, "_use_native_blend", True) or table.device.type != "cpu" or _compiling():
            return None
        if table.requires_grad or not (table.is_contiguous() and out.is_contiguous() and frame0.is_contiguous()):
            return None
        if blend.dtype != table.dtype or not blend.is_contiguous() or table.dtype not in (torch.float32, torch.float64):
            return None
        from . import native_blend

        dt = np.float32 if table.dtype == torch.float32 else np.float64
        k = (quat_cols.stop - quat_cols.start) // 4
        try:
            return native_blend.blend_kernel(
                dt, table.shape[1], quat_cols.start, k, self.interpolation is Interpolation.SLERP, int(offset_cols)
            )
        except Exception as exc:  # never fail a sample over the fast path: torch instead, from now on
            warnings.warn(
                f"kangengine: the native library blend could not be built ({exc}); using torch",
                RuntimeWarning,
                stacklevel=4,
            )
            self._use_native_blend = False
            return None

    def _blend_rows_torch(self, table, frame0, frame1, w, out, quat_cols: slice) -> None:
        """The torch strategy of :meth:`_blend_rows` (without offsets; ``w [n, 1]``): gather the frame0 rows
        straight into ``out`` and the frame1 rows into a scratch buffer, lerp whole rows in place, and slerp (or
        renormalise: nlerp) the quaternion columns."""
        import torch

        n = frame0.shape[0]
        r1 = self._scratch("r1", table, (n, table.shape[1]))
        _gather_rows(table, frame0, out)
        _gather_rows(table, frame1, r1)
        if self.interpolation is not Interpolation.SLERP:
            out.lerp_(r1, w)
            self._normalize_(out[:, quat_cols])
            return
        k = (quat_cols.stop - quat_cols.start) // 4
        # per-quaternion weights on [n, k] (one sin, one cos), expanded to the 4 components by a column gather
        # (broadcasting over a trailing 4 is slow on the CPU); the quaternion columns are blended into a
        # scratch block first, since the whole-row lerp (contiguous, fast) overwrites frame0's values
        p = self._scratch("pair_rows", table, (n, k))
        torch.index_select(self._pair_angles(table, quat_cols), 0, frame0, out=p)
        w0, w1, x = (self._scratch(name, table, (n, k)) for name in ("w0", "w1", "x"))
        _slerp_weights(p, w, k, x, w0, w1)
        rep = self._consts(table)["rep4"][: 4 * k]
        w4, q = self._scratch("w4", table, (n, 4 * k)), self._scratch("q", table, (n, 4 * k))
        torch.mul(out[:, quat_cols], torch.index_select(w0, 1, rep, out=w4), out=q)
        q.addcmul_(r1[:, quat_cols], torch.index_select(w1, 1, rep, out=w4))
        out.lerp_(r1, w)
        out[:, quat_cols] = q

    def _pair_angles(self, table, quat_cols: slice):
        """:func:`pair_angle_table` of ``table``'s quaternion columns, built on first use after the buffers
        change (kept with the scratch buffers, which :meth:`MotionLibrary._set_buffers` clears)."""
        key = ("pairs", table.data_ptr(), tuple(table.shape), quat_cols.start, quat_cols.stop)
        t = self._scratch_cache.get(key)
        if t is None:
            last = self._last_frame_of_row(table)
            t = pair_angle_table(table[:, quat_cols], last)
            self._scratch_cache[key] = t
        return t

    def _last_frame_of_row(self, table):
        """``[F] int64``: the packed index of the last frame of each row's clip."""
        import torch

        count = self.clip_frame_count.to(table.device)
        last = self.clip_frame_start.to(table.device) + count - 1
        return torch.repeat_interleave(last, count, output_size=table.shape[0])

    def _scratch(self, name: str, like, shape: tuple[int, ...]):
        """A reused buffer ``name`` of ``shape`` with ``like``'s dtype and device (large fresh buffers would be
        page-faulted in on every call on the CPU). Not shared between threads: see the class docstring."""
        import torch

        key = (name, like.data_ptr(), tuple(shape))
        buf = self._scratch_cache.get(key)
        if buf is None:
            if sum(1 for k in self._scratch_cache if k[0] != "pairs") >= 32:  # (2 tables x 2 sizes)
                for k in [k for k in self._scratch_cache if k[0] != "pairs"]:
                    del self._scratch_cache[k]
            buf = torch.empty(shape, dtype=like.dtype, device=like.device)
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
            c = {
                "ones4": torch.ones(4, dtype=like.dtype, device=like.device),
                "tile3": eye.repeat(1, self.num_bodies),
                # each column of a [n, B] weight block 4 times: per-quaternion weights to components
                "rep4": torch.arange(self.num_bodies, device=like.device).repeat_interleave(4),
            }
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
        ``precompute_kinematics=True``): positions lerp (plus the sample's loop offset), rotations slerp (or
        nlerp), velocities lerp, between the sample's two stored frames.

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
            if sample.loop_offsets is not None:
                self._add_offsets_(rows[:, 0 : 3 * b], sample.loop_offsets)
        else:
            quats = slice(3 * b, 7 * b)
            self._blend_rows(
                self._kin, sample.frame0, sample.frame1, sample.blend, rows, quats, sample.loop_offsets, 3 * b
            )
        p, r, v, w = kin_views(rows, b)
        return BodyState(
            body_positions=p, body_rotations_wxyz=r, body_linear_velocities=v, body_angular_velocities=w, rows=rows
        )
