"""A GIF or MP4 a person can open: the robot following a motion, beside the source skeleton, with a time bar.

:func:`render_preview` draws each output frame with MuJoCo's OpenGL renderer (``mjv_updateScene`` +
``mjr_render`` into an offscreen buffer, what ``mujoco.Renderer`` runs) on a headless context: EGL, else
OSMesa (each tried in a short subprocess first, since a process can load only one OpenGL platform; an
explicit ``MUJOCO_GL=egl|osmesa`` or ``PYOPENGL_PLATFORM`` is used as it is). The source skeleton, when
given, is a stick figure of its joint positions drawn with Pillow through the same kind of camera (same
distance, elevation and field of view, centred on its own root, seen from the side of its own direction of
travel: a retarget configuration may turn the motion, as ``cmu_bvh_to_cmu_humanoid`` does by 90 degrees).
When no GL backend works, ``renderer="auto"`` falls back to a Pillow stick figure of the robot's bodies
(forward kinematics) and says so in the result, in the picture's label and in the GIF's comment;
``renderer="mujoco"`` raises
:class:`~kangengine.errors.MissingDependencyError` naming what to install (Debian: ``apt-get install -y
libegl1 libegl-mesa0 libgl1-mesa-dri`` for EGL or ``apt-get install -y libosmesa6`` for OSMesa, plus
``pip install PyOpenGL``).

Camera (free camera, MuJoCo's convention): looks at the root body's horizontal position at the clip's median
root height, from the side of the clip's overall direction of travel (azimuth = heading + 90 degrees),
elevation -12 degrees, distance ``1.6 * body height + 1.5`` m, vertical field of view ``model.vis.global_.fovy``.
Output frames are sampled at ``fps`` (default ``min(motion fps, 25)``) from the nearest motion frame.
"""

from __future__ import annotations

import argparse
import enum
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._files import atomic_write
from ..errors import FormatError, KangEngineError, MissingDependencyError, ShapeError

__all__ = ["PreviewRenderer", "PreviewResult", "Camera", "render_preview", "gl_backend", "add_arguments", "run"]

_BAR = 16  # time bar height, px
_INSTALL = (
    "no headless OpenGL backend works for MuJoCo's renderer; install one (Debian/Ubuntu: "
    "`apt-get install -y libegl1 libegl-mesa0 libgl1-mesa-dri` for EGL, or `apt-get install -y libosmesa6` for "
    "OSMesa; and `pip install PyOpenGL`)"
)
_PROBE = (
    "import mujoco\n"
    "m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom size=\"1\"/></worldbody></mujoco>')\n"
    "r = mujoco.Renderer(m, 8, 8)\n"
    "d = mujoco.MjData(m); mujoco.mj_forward(m, d); r.update_scene(d); r.render(); r.close()\n"
)
_GL_CHOICE: dict = {}  # the probe's answer for this process (the OpenGL platform cannot change once loaded)


class PreviewRenderer(str, enum.Enum):
    """How the robot is drawn: ``auto`` (MuJoCo when a GL backend works, else Pillow), ``mujoco``, ``pillow``."""

    AUTO = "auto"
    MUJOCO = "mujoco"
    PILLOW = "pillow"


@dataclass(frozen=True)
class PreviewResult:
    """What :func:`render_preview` wrote.

    Attributes:
        path: the GIF / MP4. frames: frames written. size: ``(width, height)`` px. fps: frames per second.
        renderer: ``"mujoco-egl"``, ``"mujoco-osmesa"`` or ``"pillow"`` (the fallback stick figure).
        note: why the fallback was used (``None`` with MuJoCo).
    """

    path: str
    frames: int
    size: tuple[int, int]
    fps: float
    renderer: str
    note: str | None = None


@dataclass(frozen=True)
class Camera:
    """A MuJoCo free camera and its pinhole projection.

    Attributes:
        lookat: ``[frames, 3]`` m, world: the point looked at per output frame.
        distance: m. azimuth, elevation: degrees (MuJoCo's: forward = ``(cos a cos e, sin a cos e, sin e)``).
        fovy: vertical field of view, degrees.
    """

    lookat: np.ndarray
    distance: float
    azimuth: float
    elevation: float
    fovy: float

    def axes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(forward, up, right)`` unit vectors in world (MuJoCo's free camera frame)."""
        a, e = math.radians(self.azimuth), math.radians(self.elevation)
        fwd = np.array([math.cos(a) * math.cos(e), math.sin(a) * math.cos(e), math.sin(e)])
        up = np.array([-math.cos(a) * math.sin(e), -math.sin(a) * math.sin(e), math.cos(e)])
        return fwd, up, np.cross(fwd, up)

    def project(self, points_world, size: tuple[int, int], lookat=None) -> np.ndarray:
        """Pixel coordinates ``[..., 2]`` (x right, y down; float) of ``points_world [frames, ..., 3]`` in an
        image of ``size = (width, height)``, frame ``i`` seen from ``lookat[i]`` (default ``self.lookat``)."""
        w, h = size
        fwd, up, right = self.axes()
        look = np.asarray(self.lookat if lookat is None else lookat, dtype=np.float64)
        p = np.asarray(points_world, dtype=np.float64)
        eye = (look - self.distance * fwd).reshape(look.shape[0], *([1] * (p.ndim - 2)), 3)
        d = p - eye
        depth = d @ fwd
        depth = np.where(depth > 0.05, depth, np.nan)  # behind (or at) the camera: not drawn
        f = 0.5 * h / math.tan(math.radians(self.fovy) / 2)
        px = np.stack([0.5 * w + f * (d @ right) / depth, 0.5 * h - f * (d @ up) / depth], axis=-1)
        return np.clip(px, -4.0 * max(w, h), 5.0 * max(w, h))  # NaN stays NaN


# -- GL -------------------------------------------------------------------------------------------------------


def _probe(backend: str) -> str | None:
    """``None`` when MuJoCo renders with ``backend`` in a fresh process, else the error's last line."""
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if res.returncode == 0:
        return None
    lines = [x for x in (res.stderr or res.stdout).strip().splitlines() if x.strip()]
    return lines[-1] if lines else f"exit status {res.returncode}"


def gl_backend() -> tuple[str | None, str]:
    """The headless OpenGL backend MuJoCo can render with in this process.

    Returns:
        ``(backend, message)``: ``("egl" | "osmesa", "")``, or ``(None, what failed and what to install)``.
        An explicit ``MUJOCO_GL`` / ``PYOPENGL_PLATFORM`` of ``egl`` or ``osmesa`` is the only candidate; an
        OpenGL platform this process already loaded is kept.
    """
    if "backend" in _GL_CHOICE:
        return _GL_CHOICE["backend"], _GL_CHOICE["message"]
    chosen = [os.environ.get(k, "").strip().lower() for k in ("PYOPENGL_PLATFORM", "MUJOCO_GL")]
    chosen = [c for c in chosen if c in ("egl", "osmesa")]
    # an OpenGL platform this process already loaded (or one the user chose) is the only candidate
    candidates = chosen[:1] if chosen or "OpenGL" in sys.modules else ["egl", "osmesa"]
    failures = []
    for backend in candidates:
        why = _probe(backend)
        if why is None:
            _GL_CHOICE.update(backend=backend, message="")
            return backend, ""
        failures.append(f"{backend}: {why}")
    message = f"{_INSTALL}; tried {'; '.join(failures) or 'none (OpenGL already loaded on another platform)'}"
    _GL_CHOICE.update(backend=None, message=message)
    return None, message


class _MuJoCoFrames:
    """Offscreen MuJoCo rendering of one model at one size."""

    def __init__(self, model_path: str, backend: str, size: tuple[int, int]):
        import importlib

        import mujoco

        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
        self.mj = mujoco
        self.model = mujoco.MjModel.from_xml_path(model_path)
        w, h = size
        self.model.vis.global_.offwidth = max(int(self.model.vis.global_.offwidth), w)
        self.model.vis.global_.offheight = max(int(self.model.vis.global_.offheight), h)
        self.data = mujoco.MjData(self.model)
        self.ctx = importlib.import_module(f"mujoco.{backend}").GLContext(w, h)
        self.ctx.make_current()
        self.scene = mujoco.MjvScene(self.model, maxgeom=10000)
        self.con = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.con)
        self.opt = mujoco.MjvOption()
        self.cam = mujoco.MjvCamera()
        self.cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        self.viewport = mujoco.MjrRect(0, 0, w, h)
        self.rgb = np.zeros((h, w, 3), dtype=np.uint8)

    def render(self, qpos, camera: Camera, frame: int) -> np.ndarray:
        mj = self.mj
        self.data.qpos[:] = qpos
        mj.mj_kinematics(self.model, self.data)
        self.cam.lookat[:] = camera.lookat[frame]
        self.cam.distance, self.cam.azimuth, self.cam.elevation = camera.distance, camera.azimuth, camera.elevation
        mj.mjv_updateScene(self.model, self.data, self.opt, None, self.cam, mj.mjtCatBit.mjCAT_ALL, self.scene)
        mj.mjr_render(self.viewport, self.scene, self.con)
        mj.mjr_readPixels(self.rgb, None, self.viewport, self.con)
        return np.flipud(self.rgb).copy()

    def close(self) -> None:
        self.con.free()
        self.ctx.free()


# -- drawing --------------------------------------------------------------------------------------------------


def _stick_frames(points_px, parents, size, color, label: str, ground_px=None):
    """Pillow stick figures: ``points_px [frames, nodes, 2]`` joined to their parents."""
    from PIL import Image, ImageDraw

    w, h = size
    out = []
    for i in range(points_px.shape[0]):
        img = Image.new("RGB", (w, h), (236, 238, 242))
        d = ImageDraw.Draw(img)
        if ground_px is not None:
            for a, b in ground_px[i]:
                if np.isfinite(a).all() and np.isfinite(b).all():
                    d.line([tuple(a), tuple(b)], fill=(200, 204, 212), width=1)
        pts = points_px[i]
        ok = np.isfinite(pts).all(axis=-1)
        for j, p in enumerate(parents):
            if p >= 0 and ok[p] and ok[j]:
                d.line([tuple(pts[p]), tuple(pts[j])], fill=color, width=3)
        for x, y in pts[ok]:
            d.ellipse([x - 2.5, y - 2.5, x + 2.5, y + 2.5], fill=(40, 40, 48))
        d.text((6, 4), label, fill=(30, 30, 30))
        out.append(img)
    return out


def _ground_lines(camera: Camera, size, frames: int):
    """Grid lines of the ground (z = 0) around each frame's look-at point, projected: ``[frames, lines, 2, 2]``."""
    look = camera.lookat
    base = np.floor(look[:, :2])
    k = np.arange(-4, 5, dtype=np.float64)
    lines = []
    for axis in (0, 1):
        for off in k:
            a = np.zeros((frames, 3))
            b = np.zeros((frames, 3))
            a[:, axis] = base[:, axis] + off
            b[:, axis] = base[:, axis] + off
            a[:, 1 - axis] = base[:, 1 - axis] - 4
            b[:, 1 - axis] = base[:, 1 - axis] + 4
            lines.append(np.stack([a, b], axis=1))
    seg = np.stack(lines, axis=1)  # [frames, lines, 2, 3]
    return camera.project(seg, size)


def _compose(panels: list, size, t: float, duration: float, note: str):
    from PIL import Image, ImageDraw

    w, h = size
    frame = Image.new("RGB", (w, h), (25, 27, 31))
    x = 0
    for p in panels:
        frame.paste(p, (x, 0))
        x += p.size[0]
    d = ImageDraw.Draw(frame)
    y = h - _BAR
    frac = 0.0 if duration <= 0 else min(max(t / duration, 0.0), 1.0)
    d.rectangle([0, y, w - 1, h - 1], fill=(48, 51, 58))
    d.rectangle([0, y + 3, int(round(frac * (w - 1))), h - 4], fill=(84, 170, 110))
    d.text((6, y + 2), f"t = {t:5.2f} / {duration:.2f} s   {note}", fill=(245, 245, 245))
    return frame


# -- writers --------------------------------------------------------------------------------------------------


def _write_gif(path: Path, frames, fps: float, comment: str) -> None:
    ms = max(int(round(1000.0 / fps)), 20)

    def write(f):
        frames[0].save(
            f, format="GIF", save_all=True, append_images=frames[1:], duration=ms, loop=0, comment=comment.encode()
        )

    atomic_write(path, write, suffix=".gif")


def _ffmpeg() -> str:
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # not installed or no binary for this platform: try the system's
        exe = shutil.which("ffmpeg")
        if exe is None:
            raise MissingDependencyError(
                "writing MP4 needs ffmpeg: `pip install imageio-ffmpeg` or `apt-get install -y ffmpeg` (or write a "
                ".gif instead)",
                item="out",
            ) from None
        return exe


def _write_mp4(path: Path, frames, fps: float) -> None:
    exe = _ffmpeg()
    w, h = frames[0].size
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".mp4", dir=path.parent)
    os.close(fd)
    cmd = [exe, "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}"]
    cmd += ["-r", f"{fps:g}", "-i", "-", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264"]
    cmd += ["-pix_fmt", "yuv420p", "-f", "mp4", tmp]
    try:
        data = b"".join(np.asarray(f.convert("RGB"), dtype=np.uint8).tobytes() for f in frames)
        res = subprocess.run(cmd, input=data, capture_output=True, timeout=600)
        if res.returncode != 0:
            raise FormatError(f"ffmpeg failed: {res.stderr.decode(errors='replace').strip()[-300:]}", path=path)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# -- the preview ----------------------------------------------------------------------------------------------


def _camera(root_world: np.ndarray, body_world: np.ndarray, fovy: float) -> Camera:
    travel = root_world[-1, :2] - root_world[0, :2]
    heading = math.degrees(math.atan2(travel[1], travel[0])) if np.linalg.norm(travel) > 0.05 else 0.0
    height = float(np.median(body_world[..., 2].max(axis=-1) - body_world[..., 2].min(axis=-1)))
    look = root_world.astype(np.float64).copy()
    look[:, 2] = float(np.median(root_world[:, 2]))
    return Camera(look, 1.6 * max(height, 0.3) + 1.5, heading + 90.0, -12.0, fovy)


def _source_motion(source):
    from ..animation import SkeletonMotion
    from .load import load_motion

    if source is None or isinstance(source, SkeletonMotion):
        return source
    return load_motion(source)


def render_preview(
    motion,
    model,
    out,
    *,
    source=None,
    fps: float | None = None,
    size: tuple[int, int] = (640, 360),
    renderer: PreviewRenderer | str = PreviewRenderer.AUTO,
    order: str = "DFS",
) -> PreviewResult:
    """Render the robot following ``motion`` (beside ``source``) into a GIF or MP4, headless.

    Args:
        motion: an articulation motion ``.npz`` (``kangengine convert``) or an
            :class:`~kangengine.animation.ArticulationMotion`.
        model: the model file it was made for (MJCF, or URDF MuJoCo compiles).
        out: ``.gif`` (Pillow) or ``.mp4`` (ffmpeg from ``imageio-ffmpeg`` or the system; else
            :class:`~kangengine.errors.MissingDependencyError`), written atomically.
        source: the source clip, a :class:`~kangengine.animation.SkeletonMotion` or any motion file
            (:func:`~kangengine.pipelines.load_motion`): drawn as a stick figure in a right-hand panel, seen
            like the robot relative to its own direction of travel, at the same times (metres, Z up).
        fps: output frame rate (default ``min(motion fps, 25)``); the clip's duration is kept.
        size: ``(width, height)`` px of the whole picture, time bar (16 px) included; with ``source`` each panel
            is half the width.
        renderer: :class:`PreviewRenderer`.
        order: body order of the model.
    Returns:
        :class:`PreviewResult` (with the renderer used and why the fallback was taken).
    Raises:
        FormatError: an output that is not .gif/.mp4, a size under 64 x 48 px, fps <= 0.
        MissingDependencyError: ``renderer="mujoco"`` without a GL backend; MP4 without ffmpeg.
    """
    from ..animation import forward_kinematics
    from .export import load_robot_motion

    out = Path(out)
    kind = out.suffix.lower()
    if kind not in (".gif", ".mp4"):
        raise FormatError(f"preview file extension {kind or '(none)'!r}; expected .gif or .mp4", path=out)
    w, h = (int(size[0]), int(size[1]))
    if w < 64 or h < 48:
        raise FormatError(f"size {size}; expected at least (64, 48) px", item="size")
    mode = PreviewRenderer(getattr(renderer, "value", renderer))
    if kind == ".mp4":
        _ffmpeg()  # fail before rendering
    rm = load_robot_motion(motion, model, order=order)
    src = _source_motion(source)
    m = rm.motion
    rate = float(fps) if fps is not None else min(m.fps(), 25.0)
    if not (math.isfinite(rate) and rate > 0):
        raise FormatError(f"fps {fps}; expected a number > 0", item="fps")
    times = np.arange(int(math.floor(m.duration * rate + 1e-9)) + 1) / rate
    idx = np.clip(np.rint(times * m.fps()).astype(np.int64), 0, m.num_frames - 1)
    body_pos, _ = forward_kinematics(rm.layout, m.q[idx].astype(np.float64))
    panel = ((w // 2) if src is not None else w, h - _BAR)

    backend, note = (None, "pillow renderer chosen") if mode is PreviewRenderer.PILLOW else gl_backend()
    if backend is None and mode is PreviewRenderer.MUJOCO:
        raise MissingDependencyError(note, item="renderer")
    fovy = 45.0
    frames_mj = None
    if backend is not None:
        frames_mj = _MuJoCoFrames(rm.model_path, backend, panel)
        fovy = float(frames_mj.model.vis.global_.fovy)
    camera = _camera(body_pos[:, 0], body_pos, fovy)
    if frames_mj is not None:
        from ..adapters.mujoco import MuJoCoMotionAdapter

        qpos = np.asarray(MuJoCoMotionAdapter(rm.layout, model=frames_mj.model).pack(m).qpos, dtype=np.float64)
        try:
            robot = [frames_mj.render(qpos[j], camera, i) for i, j in enumerate(idx)]
        finally:
            frames_mj.close()
        from PIL import Image, ImageDraw

        robot = [Image.fromarray(x) for x in robot]
        for img in robot:
            ImageDraw.Draw(img).text((6, 4), f"robot (MuJoCo, {backend})", fill=(250, 250, 250))
        used, note = f"mujoco-{backend}", None
    else:
        parents = [int(p) for p in rm.layout.parent_indices]
        robot = _stick_frames(
            camera.project(body_pos, panel),
            parents,
            panel,
            (222, 120, 40),
            "robot (stick figure: no GL)",
            _ground_lines(camera, panel, len(times)),
        )
        used = "pillow"
    panels = [robot]
    if src is not None:
        s = src.numpy()
        sidx = np.clip(np.rint(times * s.fps).astype(np.int64), 0, s.num_frames - 1)
        gpos = np.asarray(s.global_translation, dtype=np.float64)[sidx]
        src_cam = _camera(gpos[:, 0], gpos, camera.fovy)
        src_cam = Camera(src_cam.lookat, camera.distance, src_cam.azimuth, camera.elevation, camera.fovy)
        panels.append(
            _stick_frames(
                src_cam.project(gpos, panel),
                [int(p) for p in s.tree.parent_indices],
                panel,
                (60, 110, 220),
                "source skeleton",
                _ground_lines(src_cam, panel, len(times)),
            )
        )
    label = "renderer: MuJoCo" if used != "pillow" else "renderer: Pillow stick figure (no OpenGL)"
    frames = [_compose([p[i] for p in panels], (w, h), float(t), m.duration, label) for i, t in enumerate(times)]
    if kind == ".gif":
        _write_gif(out, frames, rate, f"kangengine preview; renderer={used}")
    else:
        _write_mp4(out, frames, rate)
    return PreviewResult(os.fspath(out), len(frames), (w, h), rate, used, note)


# -- command line (wired by kangengine.cli as `kangengine preview`) ------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kangengine preview MOTION MODEL --out FILE.gif|.mp4 [--source CLIP] [--fps F] [--size WxH]
    [--renderer auto|mujoco|pillow]``."""
    parser.add_argument("motion", help="articulation motion .npz (from `kangengine convert`)")
    parser.add_argument("model", help="the model file the motion was made for")
    parser.add_argument("--out", required=True, help="the .gif or .mp4 to write")
    parser.add_argument("--source", default=None, help="the source clip, drawn beside the robot")
    parser.add_argument("--fps", type=float, default=None, help="output frame rate (default: min(clip fps, 25))")
    parser.add_argument("--size", default="640x360", help="WIDTHxHEIGHT in pixels (default 640x360)")
    parser.add_argument(
        "--renderer",
        default="auto",
        choices=[r.value for r in PreviewRenderer],
        help="auto: MuJoCo on EGL/OSMesa, else a Pillow stick figure (said in the output); mujoco: no fallback",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``kangengine preview``; prints the file and the renderer used. Returns 0, or 1 on an error (one
    line on stderr). ``args.size`` is ``"WIDTHxHEIGHT"`` or a ``(width, height)`` pair."""
    try:
        size = args.size
        if isinstance(size, str):
            try:
                size = tuple(int(x) for x in size.lower().split("x"))
                if len(size) != 2:
                    raise ValueError
            except ValueError:
                raise ShapeError(f"--size {args.size!r}; expected WIDTHxHEIGHT, e.g. 640x360", item="size") from None
        res = render_preview(
            args.motion, args.model, args.out, source=args.source, fps=args.fps, size=size, renderer=args.renderer
        )
    except KangEngineError as exc:
        print(f"kangengine preview: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"preview: {res.path} ({res.frames} frames, {res.size[0]}x{res.size[1]}, renderer {res.renderer})")
    if res.note:
        print(f"note: {res.note}")
    return 0
