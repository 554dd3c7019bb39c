"""The :class:`MotionLibrary` class: registration of clips, the library's state and its files (the sampling
methods come from :class:`~kangengine.animation.library.sampling.SamplingMixin`)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from ...errors import (
    FormatError,
    LayoutMismatch,
    LayoutSignatureWarning,
    MixedSkeletonError,
    MotionError,
    ShapeError,
    UnknownMotionError,
    UnknownNameError,
)
from ..skeleton import SkeletonMotion, SkeletonTree
from .columns import as_numpy, backend_slices, clip_table, kin_views, sample_columns
from .fileformat import (
    LibraryFile,
    adapter_name,
    backend_fields_from_header,
    decode_clip_metadata,
    encode_clip_metadata,
    read_library_file,
    write_library_file,
)
from .packing import Clip, pack_clips, prepare_backend
from .results import PackedMotionBuffers
from .sampling import Interpolation, SamplingMixin

__all__ = ["MotionLibrary"]


class MotionLibrary(SamplingMixin):
    """Reference clips packed in torch tensors for weighted sampling over many environments.

    Args:
        motions: ``SkeletonMotion`` or ``ArticulationMotion`` clips (at least one), all on one skeleton.
            An ``ArticulationMotion`` is converted with ``ArticulationMotionMapper(layout)
            .to_skeleton_motion`` (its layout must not have prismatic joints: skeleton motion cannot
            represent them).
        adapter: optional simulator adapter (:class:`~kangengine.adapters.MotionAdapter`): its
            ``prepare_motion`` runs once per clip here, and every sample carries its ``pack_sample``
            result in ``sample.backend_state``.
        layout: the :class:`ArticulationCoordinateLayout` of ``ArticulationMotion`` inputs (default:
            ``adapter.layout``); its ``model_signature`` is stored as :attr:`layout_signature`.
        device: torch device of every buffer.
        precompute_kinematics: also store global body transforms and velocities per frame, for
            :meth:`sample_kinematics` (13 floats per body per frame).
        keep_source_motions: keep the motions as given, for :meth:`motion`.
        weights: ``[clips]`` sampling weights (>= 0, finite, not all zero); 1 per clip by default.
        names: clip names (default: ``metadata["name"]``, the stem of ``metadata["source"]``, or
            ``"motion_<id>"``).
        dtype: ``torch.float32`` (default) or ``torch.float64`` for every stored float.
        interpolation: :class:`Interpolation`: ``"slerp"`` (default, exact) or ``"nlerp"``.

    A library reuses internal scratch buffers between calls: sample from one thread at a time (or one
    library per thread).

    Raises:
        MotionError: no motions, a motion of another type, prismatic joints, bad weights.
        MixedSkeletonError: clips on different skeletons.
        LayoutMismatch: an ``ArticulationMotion`` made for another layout.
    """

    def __init__(
        self,
        motions,
        *,
        adapter=None,
        layout=None,
        device="cpu",
        precompute_kinematics: bool = False,
        keep_source_motions: bool = False,
        weights=None,
        names=None,
        dtype=None,
        interpolation: Interpolation | str = Interpolation.SLERP,
    ):
        import torch

        layout = layout if layout is not None else getattr(adapter, "layout", None)
        layout_signature = None if layout is None else str(layout.model_signature)
        device = torch.device(device)
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.float64):
            raise FormatError(f"dtype {dtype}; expected torch.float32 or torch.float64", item="dtype")
        self._init_state(
            adapter=adapter,
            layout=layout,
            layout_signature=layout_signature,
            device=device,
            dtype=dtype,
            precompute_kinematics=bool(precompute_kinematics),
            keep_source_motions=bool(keep_source_motions),
            interpolation=Interpolation(interpolation),
            skeleton_tree=None,  # the first clip's
            clip_names=[],
            clip_metadata=[],
            clip_metadata_json=None,
            frames=None,  # no clips yet: add_motions packs them
            kinematics=None,
            backend=None,
            backend_fields=None,
            cols=None,
            host={
                "count": np.zeros(0, np.int64),
                "start": np.zeros(0, np.int64),
                "fps": np.zeros(0),
                "duration": np.zeros(0),
                "weight": np.zeros(0),
                "disp": np.zeros((0, 3)),
            },
        )
        motions = list(motions) if motions is not None else []
        if not motions:
            raise MotionError("a MotionLibrary needs at least one motion; got none", item="motions")
        self.add_motions(motions, weights=weights, names=names)

    # -- state ---------------------------------------------------------------------------------------------
    def _init_state(
        self,
        *,
        adapter,
        layout,
        layout_signature: str | None,
        device,
        dtype,
        precompute_kinematics: bool,
        keep_source_motions: bool,
        interpolation: Interpolation,
        skeleton_tree: SkeletonTree | None,
        clip_names: list[str],
        clip_metadata: list[dict] | None,
        clip_metadata_json,
        **buffers,
    ) -> None:
        """The one constructor of a library's state, shared by ``__init__`` and :meth:`load`: every attribute is
        first written here (the buffers and the tensors derived from them by :meth:`_set_buffers`).

        ``clip_metadata=None`` with ``clip_metadata_json`` (a loaded file's ``[bytes] uint8`` tensor): the
        metadata is decoded on first use. ``buffers``: the keyword arguments of :meth:`_set_buffers`.
        """
        self.adapter = adapter
        self.layout = layout
        self.layout_signature = layout_signature
        self.device = device
        self.dtype = dtype
        self.precompute_kinematics = precompute_kinematics
        self.keep_source_motions = keep_source_motions
        self.interpolation = interpolation
        self.skeleton_tree = skeleton_tree
        self._mapper = None  # built on the first ArticulationMotion
        self._sources: list = []
        self._names = clip_names
        self._clip_metadata = clip_metadata
        self._clip_metadata_raw = clip_metadata_json
        self._const_cache: dict = {}
        self._scratch_cache: dict = {}
        self._set_buffers(**buffers)

    def _set_buffers(self, *, frames, kinematics, backend, backend_fields, cols, host) -> None:
        """The one writer of the packed buffers and of the clip tensors derived from them (construction,
        :meth:`add_motions`, :meth:`to`).

        Args:
            frames: ``[F, D]`` packed frame rows on the library's device, or ``None`` (no clips yet: nothing
                is derived).
            kinematics: ``[F, 13 B]`` or ``None``; backend: ``[F, Db]`` adapter rows or ``None``.
            backend_fields: ``[(name, per-frame shape)]`` of the backend rows, or ``None``.
            cols: the :class:`~kangengine.animation.library.columns.SampleColumns` of ``frames``.
            host: per-clip numpy arrays ``count``, ``start`` (int64), ``fps``, ``duration``, ``weight``
                (float64), ``disp`` (``[C, 3]`` float64).
        """
        self._frames, self._kin, self._backend = frames, kinematics, backend
        self._backend_fields, self._cols, self._host = backend_fields, cols, host
        self._scratch_cache.clear()
        if frames is not None:
            self._build_clip_tensors()

    def _build_clip_tensors(self) -> None:
        import torch

        h, dev = self._host, self.device
        f64 = dict(dtype=torch.float64, device=dev)
        self.clip_frame_start = torch.as_tensor(h["start"], dtype=torch.int64, device=dev)
        self.clip_frame_count = torch.as_tensor(h["count"], dtype=torch.int64, device=dev)
        self.clip_fps = torch.as_tensor(h["fps"], **f64)
        self.clip_weight = torch.as_tensor(h["weight"], **f64)
        self.clip_duration = torch.as_tensor(h["duration"], **f64)
        self.clip_loop_displacement = torch.as_tensor(h["disp"], **f64)
        self._clip_table = torch.as_tensor(clip_table(h), **f64)
        self._backend_slices = backend_slices(self._backend_fields)

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def num_motions(self) -> int:
        """Number of clips."""
        return len(self._names)

    def __len__(self) -> int:
        return self.num_motions

    @property
    def total_frames(self) -> int:
        """Stored frames over all clips."""
        return int(self._frames.shape[0])

    @property
    def num_bodies(self) -> int:
        return self.skeleton_tree.num_nodes

    @property
    def body_names(self) -> tuple[str, ...]:
        return self.skeleton_tree.node_names

    @property
    def clip_names(self) -> tuple[str, ...]:
        return tuple(self._names)

    @property
    def has_local_translations(self) -> bool:
        return self._cols.trans is not None

    def clip_metadata(self, motion_id: int) -> dict:
        """The metadata dict of clip ``motion_id`` (as registered; kept in library files)."""
        i = int(motion_id)
        if not 0 <= i < self.num_motions:
            raise UnknownMotionError(
                f"motion id {i} does not exist; ids are 0..{self.num_motions - 1}", item="motion_id"
            )
        return self._metadata_list()[i]

    def _metadata_list(self) -> list[dict]:
        if self._clip_metadata is None:
            raw, self._clip_metadata_raw = self._clip_metadata_raw, None
            self._clip_metadata = decode_clip_metadata(raw, self.num_motions)
        return self._clip_metadata

    def clip_index(self, name: str) -> int:
        """Id of the clip called ``name``; :class:`UnknownNameError` listing the names otherwise."""
        try:
            return self._names.index(name)
        except ValueError:
            shown = ", ".join(self._names[:20]) + (" ..." if len(self._names) > 20 else "")
            raise UnknownNameError(f"no clip {name!r}; clips are: {shown}") from None

    def motion(self, motion_id: int):
        """The clip ``motion_id`` as it was registered (needs ``keep_source_motions=True``).

        Raises:
            MotionError: the library was built without ``keep_source_motions=True`` (or loaded from a file).
            UnknownMotionError: no such id.
        """
        if not self.keep_source_motions:
            raise MotionError(
                "source motions are not kept; build the library with keep_source_motions=True to use motion(id)",
                item="motion",
            )
        i = int(motion_id)
        if not 0 <= i < self.num_motions:
            raise UnknownMotionError(
                f"motion id {i} does not exist; ids are 0..{self.num_motions - 1}", item="motion_id"
            )
        return self._sources[i]

    def __repr__(self) -> str:
        return (
            f"MotionLibrary(clips={self.num_motions}, frames={self.total_frames}, bodies={self.num_bodies}, "
            f"device={self.device}, dtype={self.dtype}, kinematics={self.precompute_kinematics}, "
            f"adapter={type(self.adapter).__name__ if self.adapter is not None else None})"
        )

    # -- registration ------------------------------------------------------------------------------------
    def add_motions(self, motions, *, weights=None, names=None) -> None:
        """Append clips (ids continue after the existing ones).

        The packed tensors are rebuilt: tensors and views obtained before (``packed_buffers()``, earlier
        samples' ``frame0``/``frame1`` meaning stays valid) do not see the new clips; take them again.

        Args:
            motions: ``SkeletonMotion`` / ``ArticulationMotion`` clips on the library's skeleton.
            weights: their sampling weights (1 each by default).
            names: their names.
        """
        motions = list(motions)
        if not motions:
            return
        first_id = self.num_motions
        if names is not None:
            names = [str(x) for x in names]
            if len(names) != len(motions):
                raise ShapeError(f"{len(names)} names for {len(motions)} motions", item="names")
        w = np.ones(len(motions)) if weights is None else np.asarray(as_numpy(weights), dtype=np.float64).reshape(-1)
        if w.shape != (len(motions),):
            raise ShapeError(f"{w.size} weights for {len(motions)} motions", item="weights")
        if not np.isfinite(w).all() or (w < 0).any():
            raise MotionError(f"weights must be finite and >= 0; got {w.tolist()[:10]}", item="weights")
        if self._host["weight"].sum() + w.sum() <= 0:
            raise MotionError("all sampling weights are zero; expected at least one > 0", item="weights")
        clips = [self._canonical(m, first_id + k, None if names is None else names[k]) for k, m in enumerate(motions)]
        self._append(clips, w)

    def _canonical(self, m, motion_id: int, name: str | None) -> Clip:
        from ..motion import ArticulationMotion

        if isinstance(m, ArticulationMotion):
            sm = self._from_articulation(m, motion_id)
        elif isinstance(m, SkeletonMotion):
            sm = m
        else:
            raise MotionError(
                f"motion {motion_id} is a {type(m).__name__}; expected SkeletonMotion or ArticulationMotion",
                item=f"motions[{motion_id}]",
            )
        if self.skeleton_tree is None:
            self.skeleton_tree = sm.tree
        elif sm.tree is not self.skeleton_tree and not sm.tree.same_as(self.skeleton_tree):
            raise MixedSkeletonError(
                _skeleton_difference(self.skeleton_tree, sm.tree, motion_id), item=f"motions[{motion_id}]"
            )
        meta = dict(getattr(m, "metadata", {}) or {})
        if name is None:
            src = meta.get("source") or meta.get("source_file")
            name = meta.get("name") or (Path(str(src)).stem if src else None)
            name = str(name) if name else f"motion_{motion_id}"
        return Clip(name=name, motion=sm.numpy(), source=m, metadata=meta)

    def _from_articulation(self, m, motion_id: int) -> SkeletonMotion:
        from ...asset.desc import JointType

        if self.layout is None:
            raise LayoutMismatch(
                f"motion {motion_id} is an ArticulationMotion; pass layout= (or an adapter) so "
                "the library can convert it to skeleton motion",
                item=f"motions[{motion_id}]",
            )
        slides = [b.joint_name for b in self.layout.blocks if b.joint_type is JointType.SLIDE]
        if slides:
            raise MotionError(
                f"motion {motion_id}: the layout has prismatic (slide) joints {slides}; skeleton "
                "motion, the library's canonical storage, cannot represent them",
                item=f"motions[{motion_id}]",
            )
        m.check_layout(self.layout, what=f"motion {motion_id}")
        if self._mapper is None:
            from ..mapper import ArticulationMotionMapper

            self._mapper = ArticulationMotionMapper(self.layout)
        return self._mapper.to_skeleton_motion(m)

    def _append(self, clips: list[Clip], weights: np.ndarray) -> None:
        import torch

        tree = self.skeleton_tree
        metadata = self._metadata_list()  # (decoded before the clip count changes)
        has_trans = (self._frames is not None and self._cols.trans is not None) or any(
            c.motion.local_translation is not None for c in clips
        )
        cols = sample_columns(tree.num_nodes, has_trans)
        np_dtype = np.float32 if self.dtype == torch.float32 else np.float64
        packed = pack_clips(tree, clips, cols, np_dtype, precompute_kinematics=self.precompute_kinematics)
        counts, fps = packed.counts, packed.fps
        backend, backend_fields = prepare_backend(self.adapter, clips, counts, np_dtype, self._backend_fields)

        # merge with what is stored
        dev = self.device
        frames_t = torch.from_numpy(packed.frames).to(dev)
        if self._frames is not None:
            old = self._frames
            if self._cols.trans is None and cols.trans is not None:  # widen: rest translations for old clips
                rest = torch.tensor(tree.local_translation.reshape(1, -1), dtype=self.dtype, device=dev)
                old = torch.cat([old, rest.expand(old.shape[0], -1)], dim=1)
            frames_t = torch.cat([old, frames_t])
        kin_t = None if packed.kinematics is None else torch.from_numpy(packed.kinematics).to(dev)
        if kin_t is not None and self._kin is not None:
            kin_t = torch.cat([self._kin, kin_t])
        backend_t = self._backend
        if backend is not None:
            backend_t = torch.from_numpy(backend).to(dev)
            backend_t = backend_t if self._backend is None else torch.cat([self._backend, backend_t])

        h = self._host
        count = np.concatenate([h["count"], counts])
        host = {
            "count": count,
            "fps": np.concatenate([h["fps"], fps]),
            "duration": np.concatenate([h["duration"], (counts - 1) / fps]),
            "weight": np.concatenate([h["weight"], weights]),
            "disp": np.concatenate([h["disp"], packed.loop_displacement]),
            "start": np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64),
        }
        self._names += [c.name for c in clips]
        metadata.extend(c.metadata for c in clips)
        if self.keep_source_motions:
            self._sources += [c.source for c in clips]
        self._set_buffers(
            frames=frames_t, kinematics=kin_t, backend=backend_t, backend_fields=backend_fields, cols=cols, host=host
        )

    def to(self, device) -> MotionLibrary:
        """Move every buffer to ``device`` (no re-registration); returns ``self``. Views taken before
        (``packed_buffers()``, samples) stay on the old device."""
        import torch

        self.device = dev = torch.device(device)
        self._set_buffers(
            frames=self._frames.to(dev),
            kinematics=None if self._kin is None else self._kin.to(dev),
            backend=None if self._backend is None else self._backend.to(dev),
            backend_fields=self._backend_fields,
            cols=self._cols,
            host=self._host,
        )
        return self

    def packed_buffers(self) -> PackedMotionBuffers:
        """The persistent packed tensors (views, no copy); take them again after ``add_motions``/``to``."""
        f, c = self._frames, self._cols
        rot = f[:, c.rot].unflatten(1, (c.bodies, 4))
        kin = (None,) * 4 if self._kin is None else kin_views(self._kin, c.bodies)
        backend = {} if self._backend is None else self._backend_dict(self._backend)
        return PackedMotionBuffers(
            frames_packed=f,
            root_positions=f[:, c.root],
            root_rotations_wxyz=rot[:, 0],
            local_rotations_wxyz=rot,
            root_linear_velocities=f[:, c.lin],
            root_angular_velocities=f[:, c.ang],
            local_translations=None if c.trans is None else f[:, c.trans].unflatten(1, (c.bodies, 3)),
            kinematics_packed=self._kin,
            global_positions=kin[0],
            global_rotations_wxyz=kin[1],
            global_linear_velocities=kin[2],
            global_angular_velocities=kin[3],
            clip_frame_start=self.clip_frame_start,
            clip_frame_count=self.clip_frame_count,
            clip_fps=self.clip_fps,
            clip_weight=self.clip_weight,
            clip_duration=self.clip_duration,
            clip_loop_displacement=self.clip_loop_displacement,
            backend_packed=self._backend,
            backend=backend,
        )

    # -- files -------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the library to one ``.safetensors`` file (no pickle), atomically (temp file + rename).

        Tensors: ``frames_packed``, optional ``kinematics_packed`` and ``backend_packed``,
        ``clip_frame_start``, ``clip_frame_count``, ``clip_fps``, ``clip_weight``, ``clip_loop_displacement``,
        ``skeleton_parent_indices``, ``skeleton_local_translation``. Metadata: ``format``,
        ``format_version`` and ``header`` (JSON: dtype, node names, layout signature, clip names and
        metadata, interpolation, adapter and its field shapes). The file holds the library in memory once
        more while it is written.
        """
        return write_library_file(
            path,
            LibraryFile(
                skeleton_tree=self.skeleton_tree,
                dtype=self.dtype,
                has_local_translations=self._cols.trans is not None,
                interpolation=self.interpolation.value,
                layout_signature=self.layout_signature,
                adapter=None if self.adapter is None else adapter_name(self.adapter),
                backend_fields=self._backend_fields,
                clip_names=self._names,
                clip_metadata_json=encode_clip_metadata(self._metadata_list()),
                frames_packed=self._frames,
                kinematics_packed=self._kin,
                backend_packed=self._backend,
                clip_frame_start=self.clip_frame_start,
                clip_frame_count=self.clip_frame_count,
                clip_fps=self.clip_fps,
                clip_weight=self.clip_weight,
                clip_loop_displacement=self.clip_loop_displacement,
            ),
        )

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        device="cpu",
        mmap: bool = True,
        adapter=None,
        layout=None,
        skip_checks: bool = False,
    ) -> MotionLibrary:
        """Read a file written by :meth:`save`, checked at the boundary (:func:`read_library_file`).

        The header, every tensor's dtype and shape and the clip tables are always checked (per clip, cheap):
        ``clip_frame_start`` must equal the cumulative ``clip_frame_count`` (each >= 1, summing to the packed
        rows), ``clip_fps`` finite > 0, ``clip_weight`` finite >= 0 with a positive sum. The frame data
        (finite, unit quaternions) and the clip metadata are checked too unless ``skip_checks=True``, which
        leaves the mapped pages unread until sampling touches them.

        Args:
            path: the ``.safetensors`` file.
            device: where the buffers go (one host-to-device copy from the mapped file).
            mmap: ``True``: on the CPU the buffers are the file's pages, mapped copy-on-write (nothing is
                read until used, nothing is copied); ``False``: the buffers are read into process memory.
            adapter: optional adapter; when the file holds the same adapter's frames for the same layout
                signature they are used as they are, otherwise ``prepare_motion`` runs on the stored clips.
            layout: optional layout (default ``adapter.layout``); a signature different from the file's warns
                with :class:`LayoutSignatureWarning`.
            skip_checks: skip the scan of the frame data (a trusted file in a hot loop); the tables are still
                checked.

        Raises:
            FileMissingError, FormatError: no such file, not a library file, or inconsistent content (naming
                the file and the table).
        """
        import torch

        path = Path(path)
        file = read_library_file(path, skip_checks=skip_checks)
        lay = layout if layout is not None else getattr(adapter, "layout", None)
        file_sig = file.layout_signature
        if lay is not None and file_sig is not None and str(lay.model_signature) != file_sig:
            warnings.warn(
                f"{os.fspath(path)}: the library was made for layout signature {file_sig}; the given "
                f"layout has {lay.model_signature}: body order, joints, rest pose or limits may differ",
                LayoutSignatureWarning,
                stacklevel=2,
            )

        dev = torch.device(device)

        def place(x):
            if x is None:
                return None
            if dev.type != "cpu":
                return x.to(dev)
            return x if mmap else x.clone()

        interpolation = Interpolation(file.interpolation)
        frames, kin = place(file.frames_packed), place(file.kinematics_packed)
        count = file.clip_frame_count.numpy()
        fps = file.clip_fps.numpy().astype(np.float64)
        host = {
            "count": count.astype(np.int64),
            "fps": fps,
            "duration": (count - 1) / fps,
            "weight": file.clip_weight.numpy().astype(np.float64),
            "disp": file.clip_loop_displacement.numpy().astype(np.float64),
            "start": file.clip_frame_start.numpy().astype(np.int64),
        }
        backend = backend_fields = None
        if file.backend_fields is not None and file.backend_packed is not None:
            same = (
                adapter is not None
                and file.adapter == adapter_name(adapter)
                and (file_sig is None or lay is None or str(lay.model_signature) == file_sig)
            )
            if adapter is None or same:
                backend = place(file.backend_packed)
                backend_fields = backend_fields_from_header(file.backend_fields)
        lib = cls.__new__(cls)
        lib._init_state(
            adapter=adapter,
            layout=lay,
            layout_signature=file_sig if lay is None else str(lay.model_signature),
            device=dev,
            dtype=file.dtype,
            precompute_kinematics=kin is not None,
            keep_source_motions=False,
            interpolation=interpolation,
            skeleton_tree=file.skeleton_tree,
            clip_names=file.clip_names,
            clip_metadata=None,  # decoded from clip_metadata_json on first use
            clip_metadata_json=file.clip_metadata_json,
            frames=frames,
            kinematics=kin,
            backend=backend,
            backend_fields=backend_fields,
            cols=sample_columns(file.skeleton_tree.num_nodes, file.has_local_translations),
            host=host,
        )
        if adapter is not None and lib._backend is None:
            lib._prepare_stored_backend()
        return lib

    def _prepare_stored_backend(self) -> None:
        """The adapter's frames of every stored clip (a loaded library whose file holds none for its adapter)."""
        import torch

        stored = [self._stored_motion(i) for i in range(self.num_motions)]
        clips = [Clip(name=self._names[i], motion=m, source=m, metadata={}) for i, m in enumerate(stored)]
        np_dtype = np.float32 if self.dtype == torch.float32 else np.float64
        backend, backend_fields = prepare_backend(self.adapter, clips, self._host["count"], np_dtype, None)
        self._set_buffers(
            frames=self._frames,
            kinematics=self._kin,
            backend=torch.from_numpy(backend).to(self.device),
            backend_fields=backend_fields,
            cols=self._cols,
            host=self._host,
        )

    def _stored_motion(self, i: int) -> SkeletonMotion:
        """Clip ``i`` rebuilt from the packed frames (numpy float64)."""
        s, c = int(self._host["start"][i]), int(self._host["count"][i])
        rows = self._frames[s : s + c].detach().cpu().numpy().astype(np.float64)
        cols = self._cols
        lt = None if cols.trans is None else rows[:, cols.trans].reshape(c, -1, 3)
        return SkeletonMotion(
            self.skeleton_tree,
            rows[:, cols.root],
            rows[:, cols.rot].reshape(c, -1, 4),
            float(self._host["fps"][i]),
            lt,
            metadata={"name": self._names[i]},
        )


def _skeleton_difference(a: SkeletonTree, b: SkeletonTree, motion_id: int) -> str:
    head = f"motion {motion_id} is on another skeleton than the library's (mixed skeletons): "
    if a.node_names != b.node_names:
        extra = sorted(set(b.node_names) - set(a.node_names))[:8]
        miss = sorted(set(a.node_names) - set(b.node_names))[:8]
        return head + (
            f"node names differ (not in the library: {extra}; missing: {miss}; "
            f"order: {list(b.node_names[:6])}... vs {list(a.node_names[:6])}...)"
        )
    if not np.array_equal(a.parent_indices, b.parent_indices):
        k = int(np.argmax(a.parent_indices != b.parent_indices))
        return head + (
            f"node {a.node_names[k]!r} has parent {int(b.parent_indices[k])}; the library's has "
            f"{int(a.parent_indices[k])}"
        )
    d = np.abs(a.local_translation - b.local_translation).max(axis=1)
    k = int(np.argmax(d))
    return head + (
        f"rest translation of node {a.node_names[k]!r} differs by {d[k]:.3g} m "
        "(retarget or rescale the clip onto one skeleton first)"
    )
