"""The one forward-kinematics implementation of KangEngine.

Skeletons (:class:`~kangengine.animation.SkeletonState`), articulation coordinates
(:func:`~kangengine.animation.forward_kinematics`) and the simulator all compose transforms down a tree with
:class:`BodyKinematics`. It works on numpy arrays and torch tensors alike (CPU or CUDA), keeps the input's
dtype and device, and vectorises over frames (and worlds); the only Python loop is over bodies, which the
tree demands, and it runs once per tree.

One program, several ways to execute it, one file each:

* :mod:`.plan`: :class:`TreePlan`, what a tree's kinematics is traced from (parents, rest transforms,
  joint steps);
* :mod:`.trace`: the component algebra, run once per plan on symbols, recording the straight-line program
  (constant components folded away);
* :mod:`.replay`: that program compiled into a Python function and replayed on numpy arrays / torch
  tensors, chunk by chunk on a thread pool: the reference the other strategies are tested against;
* :mod:`.native`: the same program compiled into a SIMD kernel for this CPU (llvmlite), run on numpy arrays
  / CPU torch tensors through their data pointers.

This module holds the public API and the choice between the strategies ("native kernels" below).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import UnknownNameError
from .plan import STEP_DOFS, JointStep, TreePlan, tree_plan_from_rest
from .replay import array_namespace, compile_replay, expand, is_torch, run_chunks, soa, torch_empty
from .trace import Trace, trace_coordinates, trace_joint_frames, trace_skeleton

__all__ = ["BodyKinematics", "compose_tree", "tree_plan_from_rest", "TreePlan", "JointStep", "JointFrames"]

# -- native kernels ---------------------------------------------------------------------------------------
# The same traced program, compiled to machine code for this CPU by :mod:`.native` (llvmlite) and run on
# numpy arrays / CPU torch tensors through their data pointers. Policy (environment variable
# ``KANGENGINE_FK_BACKEND``):
#
# * "auto" (default): the fastest strategy for the call's size and device. On the CPU that is the native kernel
#   at every size (measured by benchmarks/bench_fk.py, docs/library.md "Forward kinematics: strategy by size":
#   from 40x faster than the numpy replay at 1 frame to 3-6x at 65536 frames; there is no crossover). It is kept
#   in memory per program and dtype and on disk across processes (:func:`.native.cache_dir`; a new process loads
#   it in milliseconds); when neither holds it, the first CPU call of at least ``_NATIVE_BUILD_FRAMES`` frames
#   builds it (1.4-2 s, once per machine and program). With the default of 1 every CPU call of a process runs the
#   kernel, so a frame's result never depends on which call, batch size or position computed it. Torch tensors on
#   CUDA or requiring grad always run the replay (torch ops: the only strategy there).
# * "native": a kernel for every CPU call (built when missing); "numpy": never.
#
# Without llvmlite (or when a build fails, with a warning) the Python replay runs.
_NATIVE_MIN_FRAMES = 1
_NATIVE_BUILD_FRAMES = 1
_NATIVE_CHUNK = 16384
_NATIVE_LOCK = threading.Lock()
_BACKENDS = ("auto", "numpy", "native")
_ENV = "KANGENGINE_FK_BACKEND"


def _backend() -> str:
    mode = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if mode not in _BACKENDS:
        raise UnknownNameError(f"{mode!r} is not a backend; expected one of {', '.join(_BACKENDS)}", item=_ENV)
    return mode


def _float_dtype(x) -> np.dtype | None:
    """numpy dtype of a float32/float64 numpy array or CPU torch tensor not requiring grad, else None."""
    if is_torch(x):
        import torch

        if x.device.type != "cpu" or x.requires_grad or x.dtype not in (torch.float32, torch.float64):
            return None
        compiler = getattr(torch, "compiler", None)
        if compiler is not None and getattr(compiler, "is_compiling", lambda: False)():
            return None  # inside torch.compile tracing: stay in torch ops (no data pointers)
        return np.dtype(np.float32 if x.dtype == torch.float32 else np.float64)
    if x.dtype in (np.float32, np.float64) and x.dtype.isnative:
        return np.dtype(x.dtype)
    return None


def _native_kernel(prog: _Program, inputs: tuple[str, ...], arrays: Sequence, n: int):
    """The native kernel of ``prog`` (input arrays named ``inputs``, given as ``arrays``) when the policy
    selects one and the arrays are all numpy or all CPU torch of one float dtype, else None."""
    mode = _backend()
    if mode == "numpy" or (mode == "auto" and n < _NATIVE_MIN_FRAMES):
        return None
    dts = {_float_dtype(a) for a in arrays}
    if len(dts) != 1 or None in dts or len({is_torch(a) for a in arrays}) != 1:
        return None
    (dt,) = dts
    key = (inputs, dt)
    if key in prog.native:
        return prog.native[key]
    build = mode == "native" or n >= _NATIVE_BUILD_FRAMES
    if not build and key in prog.not_on_disk:
        return None
    with _NATIVE_LOCK:
        if key not in prog.native:
            from . import native

            kern = None
            if native.available():
                try:
                    kern = native.compile_trace(prog.trace, inputs, dt, cached_only=not build)
                except Exception as exc:  # never fail a call over the fast path: replay instead
                    warnings.warn(
                        f"kangengine: native forward-kinematics kernel could not be built ({exc}); "
                        "using the numpy replay",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                    build = True  # remember the failure: no retry in this process
            if kern is None and not build:
                prog.not_on_disk.add(key)  # looked up once per process; a large call builds it
                return None
            prog.native[key] = kern
    return prog.native[key]


class _Program:
    """A traced program: calling it runs the Python replay (numpy/torch, any device); its native kernels
    (:mod:`.native`) are kept per ``(input names, dtype)`` in ``native`` (None: could not be built);
    ``not_on_disk`` holds the keys a small call found neither in memory nor in the disk cache."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.fn = compile_replay(trace)
        self.native: dict = {}
        self.not_on_disk: set = set()

    def __call__(self, *args):
        return self.fn(*args)


# -- the public API ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JointFrames:
    """Result of :meth:`BodyKinematics.joint_frames` (numpy or torch, like the input).

    Attributes:
        body_positions: ``[..., B, 3]`` m, ``world_from_body`` origins.
        body_rotations_wxyz: ``[..., B, 4]`` ``world_from_body`` rotations.
        joint_positions: ``[..., S, 3]`` m, world position of each joint step's anchor.
        joint_rotations_wxyz: ``[..., S, 4]`` world rotation of the frame each joint step's axis and
            velocity are expressed in (just before the joint applies).
        dof_axes: ``[..., V, 3]`` world unit axis of every velocity DOF of the steps, in order (hinge,
            slide: the joint axis; ball: the three axes of its frame; free: world x, y, z for the
            translation then for the rotation), ``V`` = the layout's ``nv``.
    """

    body_positions: object
    body_rotations_wxyz: object
    joint_positions: object
    joint_rotations_wxyz: object
    dof_axes: object


_PROGRAMS: OrderedDict[TreePlan, dict[str, _Program]] = OrderedDict()
_PROGRAMS_MAX = 64  # plans whose traced programs are kept (least recently built dropped first)


def _programs(plan: TreePlan) -> dict[str, _Program]:
    progs = _PROGRAMS.get(plan)
    if progs is None:
        progs = _PROGRAMS[plan] = {}
        while len(_PROGRAMS) > _PROGRAMS_MAX:
            _PROGRAMS.popitem(last=False)
    else:
        _PROGRAMS.move_to_end(plan)
    return progs


class BodyKinematics:
    """Forward kinematics over a :class:`TreePlan`, for numpy arrays and torch tensors.

    All methods take any leading batch dimensions ``[...]`` and return the same type, dtype and device.
    """

    def __init__(self, plan: TreePlan):
        self.plan = plan
        # Traced programs are shared by every instance with an equal plan (a skeleton loaded again,
        # the same robot in another layout object): tracing and compiling costs tens of milliseconds.
        self._compiled: dict[str, _Program] = _programs(plan)

    # traced programs, one per kind of call, built on first use --------------------------------------
    def _traced_coordinates(self, local: bool) -> _Program:
        key = "local" if local else "world"
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = _Program(trace_coordinates(self.plan, local=local))
        return fn

    def _traced_local(self, with_translation: bool) -> _Program:
        key = "skeleton_t" if with_translation else "skeleton"
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._compiled[key] = _Program(trace_skeleton(self.plan, with_translation=with_translation))
        return fn

    def _traced_joint_frames(self) -> _Program:
        fn = self._compiled.get("joints")
        if fn is None:
            fn = self._compiled["joints"] = _Program(trace_joint_frames(self.plan))
        return fn

    # articulation coordinates ------------------------------------------------------------------------
    def from_coordinates(self, q, *, local: bool = False):
        """Body transforms from generalized coordinates.

        Args:
            q: ``[..., nq]`` float32/float64, numpy or torch.
            local: return ``parent_from_body`` transforms instead of ``world_from_body``.
        Returns:
            ``(positions [..., B, 3], rotations_wxyz [..., B, 4])``, m, in world (or parent) frame.
        """
        lead = tuple(q.shape[:-1])
        q2 = q.reshape(-1, q.shape[-1])
        xp = array_namespace(q)
        fn = self._traced_coordinates(local)

        def chunk(s, e, out_p, out_r):
            qt = q2[s:e].T
            qt = qt.contiguous() if is_torch(qt) else np.ascontiguousarray(qt)
            fn(qt, xp, out_p, out_r, s, e)

        kern = _native_kernel(fn, ("qt",), (q2,), q2.shape[0])
        return self._run(q2, lead, chunk, None if kern is None else (kern, [q2]))

    def joint_frames(self, q) -> JointFrames:
        """Body transforms plus the world frame of every joint step, from generalized coordinates.

        Same composition as :meth:`from_coordinates`; additionally records, per joint step (the plan's
        steps flattened in body order, i.e. the layout's non-FIXED blocks in order), the world position
        of the joint anchor and the world rotation of the frame in which the joint axis (hinge, slide)
        and the joint velocity (ball: angular velocity in the parent frame) are expressed, i.e. the frame
        just before the joint applies. A free joint reports its body origin and the world axes. This is
        MuJoCo's ``xanchor`` and (rotating the joint axis) ``xaxis``.

        Args:
            q: ``[..., nq]`` float32/float64, numpy or torch.
        Returns:
            :class:`JointFrames` with ``[..., B, 3]``, ``[..., B, 4]``, ``[..., S, 3]``, ``[..., S, 4]``.
        """
        lead = tuple(q.shape[:-1])
        q2 = q.reshape(-1, q.shape[-1])
        xp = array_namespace(q)
        fn = self._traced_joint_frames()
        n, nb = q2.shape[0], self.plan.num_bodies
        ns = sum(len(st) for st in self.plan.steps)
        # Outputs live component-major ([k, n, frames], frames innermost) and are written through
        # [frames, n, k] views: each traced row write is contiguous and callers that want components
        # (the simulator) get them without a copy; the returned arrays are those [frames, n, k] views.
        if is_torch(q2):
            import torch

            mk = lambda n_, k_: torch.empty((k_, n_, n), dtype=q2.dtype, device=q2.device).permute(2, 1, 0)
            on_cpu = q2.device.type == "cpu" and not q2.requires_grad
        else:
            mk = lambda n_, k_: np.empty((k_, n_, n), dtype=q2.dtype).transpose(2, 1, 0)
            on_cpu = True
        nd = sum(STEP_DOFS[st.kind] for steps in self.plan.steps for st in steps)
        out_p, out_r, out_jp, out_jr = mk(nb, 3), mk(nb, 4), mk(ns, 3), mk(ns, 4)
        out_ax = mk(nd, 3)

        def chunk(s, e):
            qt = q2[s:e].T
            qt = qt.contiguous() if is_torch(qt) else np.ascontiguousarray(qt)
            fn(qt, xp, out_p, out_r, out_jp, out_jr, out_ax, s, e)

        run_chunks(n, chunk, on_cpu)
        return JointFrames(
            body_positions=out_p.reshape(lead + (nb, 3)),
            body_rotations_wxyz=out_r.reshape(lead + (nb, 4)),
            joint_positions=out_jp.reshape(lead + (ns, 3)),
            joint_rotations_wxyz=out_jr.reshape(lead + (ns, 4)),
            dof_axes=out_ax.reshape(lead + (nd, 3)),
        )

    # skeletons --------------------------------------------------------------------------------------
    def from_local(self, root_translation, local_rotation, local_translation=None):
        """Global transforms of a skeleton from its local rotations.

        Args:
            root_translation: ``[..., 3]``: world position of the root node (m).
            local_rotation: ``[..., B, 4]`` WXYZ: ``parent_from_node`` rotations; the root's is its world
                rotation.
            local_translation: optional ``[..., B, 3]`` per-frame ``parent_from_node`` translations
                (joints with translation channels); the plan's rest positions when omitted. The root's
                entry is ignored (``root_translation`` places the root).
        Returns:
            ``(global_translation [..., B, 3], global_rotation [..., B, 4])``.
        """
        nb = self.plan.num_bodies
        lead = tuple(local_rotation.shape[:-2])
        lr = local_rotation.reshape(-1, nb, 4)
        rt = root_translation.reshape(-1, 3)
        lt = None if local_translation is None else local_translation.reshape(-1, nb, 3)
        if rt.shape[0] != lr.shape[0]:  # broadcast a single root translation / rotation set
            n = max(rt.shape[0], lr.shape[0])
            if rt.shape[0] > lr.shape[0]:  # the frames are the root translation's
                lead = tuple(root_translation.shape[:-1])
            rt = expand(rt, (n, 3))
            lr = expand(lr, (n, nb, 4))
        if lt is not None and lt.shape[0] != lr.shape[0]:
            lt = expand(lt, (lr.shape[0], nb, 3))
        fn = self._traced_local(lt is not None)

        def chunk(s, e, out_p, out_r):
            rot = soa(lr[s:e], (1, 2, 0))  # [B, 4, n]
            tr = None if lt is None else soa(lt[s:e], (1, 2, 0))
            root = soa(rt[s:e], (1, 0))
            fn(rot, tr, root, out_p, out_r, s, e)

        names, arrays = (("rot", "root"), [lr, rt]) if lt is None else (("rot", "tr", "root"), [lr, lt, rt])
        kern = _native_kernel(fn, names, arrays, lr.shape[0])
        return self._run(lr, lead, chunk, None if kern is None else (kern, arrays))

    def _run(self, ref, lead, chunk, kernel=None):
        """Allocate ``[n, B, 3]``/``[n, B, 4]`` outputs and fill them chunk by chunk: with the native
        kernel ``kernel = (kernel, input arrays)`` when given, else with the Python replay ``chunk``."""
        n = ref.shape[0]
        nb = self.plan.num_bodies
        if is_torch(ref):
            out_p = torch_empty((n, nb, 3), ref)
            out_r = torch_empty((n, nb, 4), ref)
            on_cpu = ref.device.type == "cpu" and not ref.requires_grad
        else:
            out_p = np.empty((n, nb, 3), dtype=ref.dtype)
            out_r = np.empty((n, nb, 4), dtype=ref.dtype)
            on_cpu = True
        if kernel is not None and n:
            from . import native

            fallback = lambda s, e: chunk(s, e, out_p, out_r)
            native.run_kernel(kernel[0], kernel[1], [out_p, out_r], n, fallback, chunk=_NATIVE_CHUNK)
        else:
            run_chunks(n, lambda s, e: chunk(s, e, out_p, out_r), on_cpu)
        return out_p.reshape(lead + (nb, 3)), out_r.reshape(lead + (nb, 4))


def compose_tree(parents: Sequence[int], local_translation, local_rotation, root_translation):
    """World transforms of a tree from local ones (convenience wrapper of :class:`BodyKinematics`).

    Args:
        parents: ``[B]`` parent index per node, parent-first, -1 for the root.
        local_translation: ``[B, 3]`` or ``[..., B, 3]`` ``parent_from_node`` translations (m).
        local_rotation: ``[..., B, 4]`` WXYZ ``parent_from_node`` rotations.
        root_translation: ``[..., 3]`` world position of the root.
    Returns:
        ``(global_translation [..., B, 3], global_rotation [..., B, 4])``.
    """
    lt = local_translation
    per_frame = lt.ndim > 2
    rest = (
        np.zeros((len(parents), 3))
        if per_frame
        else np.asarray(lt.detach().cpu().numpy() if is_torch(lt) else lt, dtype=np.float64)
    )
    kin = BodyKinematics(tree_plan_from_rest(parents, rest))
    return kin.from_local(root_translation, local_rotation, lt if per_frame else None)
