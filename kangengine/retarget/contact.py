"""Contact phases of a source foot and the held sole targets of the robot foot (numpy, vectorised over frames).

A foot is in contact while its heel or toe joint is close to its own standing height (its 5th-percentile
height over the clip) and slow. Phases shorter than ``min_phase_s`` are dropped and gaps shorter than that
are closed. During a phase the robot foot is held at one place: its origin at the mean horizontal position
the source asks for, its sole (the configuration's sole points) flat on the ground, turned to the mean
heading of the source foot over the phase. Around a phase the targets follow the source's own motion from
the held place and their weight ramps smoothly over ``blend_s``, so the foot is put down and lifted smoothly.
Where the source has heel and toe, the rear sole points are held only while its heel is down and the front ones
only while its toe is down (the foot rolls over its toe at heel-off as the source's does), and where the source
heel itself wanders more than :data:`HOLD_RADIUS_M` within a phase (a shuffle), the held sole follows the excess.
With ``pivot`` the held foot turns with the source foot frame by frame about its sole centre instead of keeping one
heading per phase.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOLD_RADIUS_M = 0.02
"""m: how far the source heel may wander within a contact phase before the held sole follows it."""

__all__ = [
    "HOLD_RADIUS_M",
    "ContactPhases",
    "detect_contact",
    "contact_phases",
    "held_sole_targets",
    "phase_slide",
    "phase_yaw",
]


@dataclass(frozen=True)
class ContactPhases:
    """Contact of one foot over a clip.

    Attributes:
        in_contact: ``[frames] bool``.
        phase_id: ``[frames] int64``: the phase a frame belongs to, -1 outside phases.
        starts, ends: ``[phases] int64`` first frame and one past the last frame of each phase.
    """

    in_contact: np.ndarray
    phase_id: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @property
    def num_phases(self) -> int:
        return int(self.starts.shape[0])


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` of the runs of True in a ``[frames]`` bool array."""
    m = np.concatenate(([False], mask.astype(bool), [False]))
    d = np.diff(m.astype(np.int8))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _fill_runs(mask: np.ndarray, starts, ends, value: bool) -> np.ndarray:
    out = mask.copy()
    if len(starts):
        delta = np.zeros(mask.shape[0] + 1, dtype=np.int64)
        np.add.at(delta, starts, 1)
        np.add.at(delta, ends, -1)
        sel = np.cumsum(delta[:-1]) > 0
        out[sel] = value
    return out


def detect_contact(heel_world, toe_world, fps: float, *, height_threshold: float, speed_threshold: float):
    """``[frames] bool``: the foot is down (heel or toe low and slow).

    Args:
        heel_world: ``[frames, 3]`` m, world positions of the heel (ankle) joint, Z up.
        toe_world: ``[frames, 3]`` m or ``None``.
        fps: frames per second.
        height_threshold: m above the joint's 5th-percentile height.
        speed_threshold: m/s, horizontal speed.
    """
    down = np.zeros(heel_world.shape[0], dtype=bool)
    for p in (heel_world, toe_world):
        if p is None:
            continue
        p = np.asarray(p, dtype=np.float64)
        h = p[:, 2] - np.percentile(p[:, 2], 5.0)
        v = np.gradient(p[:, :2], axis=0) * fps if p.shape[0] > 1 else np.zeros((1, 2))
        down |= (h < height_threshold) & (np.linalg.norm(v, axis=-1) < speed_threshold)
    return down


def contact_phases(in_contact: np.ndarray, min_frames: int) -> ContactPhases:
    """Clean a contact mask (close gaps and drop phases shorter than ``min_frames``) and number its phases."""
    m = np.asarray(in_contact, dtype=bool)
    n = m.shape[0]
    s, e = _runs(~m)
    short = (e - s) < min_frames
    inner = (s > 0) & (e < n)  # gaps inside the clip only
    m = _fill_runs(m, s[short & inner], e[short & inner], True)
    s, e = _runs(m)
    short = (e - s) < min_frames
    m = _fill_runs(m, s[short], e[short], False)
    s, e = _runs(m)
    pid = np.full(n, -1, dtype=np.int64)
    if len(s):
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, s, 1)
        np.add.at(delta, e, -1)
        inside = np.cumsum(delta[:-1]) > 0
        pid[inside] = np.cumsum(np.isin(np.arange(n), s))[inside] - 1
    return ContactPhases(m, pid, s.astype(np.int64), e.astype(np.int64))


def _nearest_contact(phases: ContactPhases) -> tuple[np.ndarray, np.ndarray]:
    """``(frame [frames], distance in frames [frames])``: the nearest contact frame (0, inf without phases)."""
    n = phases.in_contact.shape[0]
    idx = np.arange(n)
    if phases.num_phases == 0:
        return np.zeros(n, dtype=np.int64), np.full(n, np.inf)
    prev = np.maximum.accumulate(np.where(phases.in_contact, idx, -1))
    nxt = np.minimum.accumulate(np.where(phases.in_contact, idx, 2 * n)[::-1])[::-1]
    d_prev = np.where(prev >= 0, idx - prev, np.inf)
    d_next = np.where(nxt < n, nxt - idx, np.inf)
    near = np.where(d_prev <= d_next, prev, nxt).clip(0, n - 1)
    return near, np.minimum(d_prev, d_next)


def held_sole_targets(
    phases: ContactPhases,
    heel_world,
    toe_world,
    foot_forward_world,
    sole_points_foot,
    *,
    ground: float,
    blend_frames: float,
    heel_down=None,
    toe_down=None,
    hold_radius: float = HOLD_RADIUS_M,
    yaw=None,
    pivot: bool = False,
):
    """Sole targets of the robot foot held at one place per phase, and their weights.

    Inside a phase every sole point is at its held place (flat on the floor). Around a phase (``blend_frames``
    before and after) a point keeps its offset from the held place and moves with the source: the rear
    points (``x < 0`` in the foot frame) with the heel, the others with the toe, never below the floor; the
    weight ramps linearly from 1 at the phase to 0. The foot is put down and lifted where it stood.

    Args:
        phases: the foot's :class:`ContactPhases`.
        heel_world: ``[frames, 3]`` m, where the source puts the robot foot origin (its heel/ankle).
        toe_world: ``[frames, 3]`` m, the source toe (``None``: the heel moves the whole sole).
        foot_forward_world: ``[frames, 3]`` the source foot's forward direction (heel to toe), world.
        sole_points_foot: ``[points, 3]`` m, the sole in the foot frame.
        ground: m, floor height.
        blend_frames: ramp length of the weight outside a phase.
        heel_down, toe_down: ``[frames] bool`` or ``None``: where the source heel (toe) is down on its own.
            Given, a phase holds the rear points (``x < 0``) only while the heel is down and the others only
            while the toe is down (a frame of the phase where neither is down holds both), so the foot rolls
            over its toe at heel-off and over its heel at heel-strike as the source's does, each point
            released and put down with the same smooth ramp; the held place is where the heel stands while
            it is down. ``None``: the whole sole is held through the phase.
        hold_radius: m. Where the source heel itself wanders farther than this from the held place during
            a phase (a shuffle or a pivot read as contact), the held sole follows it by the excess, so the
            robot foot never slides more than the source's does and never lags it by more than this.
        yaw: ``[phases]`` rad or ``None``: the heading of the held foot in each phase (its x axis from world +X
            about +Z) instead of the source foot's mean heading (the solver's choice, :func:`phase_yaw`).
        pivot: the held foot turns with the source foot within a phase, frame by frame, about its sole centre
            (a pivot or a twist on the spot is followed without sliding the sole centre), and a point released
            within its phase (the heel at heel-off) rises with the source but keeps its horizontal place on the
            turning foot, as a foot rolling over its toe does. ``yaw`` then sets each phase's mean heading, the
            turns kept about it.
    Returns:
        ``(targets [frames, points, 3] m world, weight [frames, points] in [0, 1])``.
    """
    n = heel_world.shape[0]
    sole = np.asarray(sole_points_foot, dtype=np.float64)
    if phases.num_phases == 0:
        return np.zeros((n, sole.shape[0], 3)), np.zeros((n, sole.shape[0]))
    k = phases.num_phases
    pid = phases.phase_id
    inside = pid >= 0
    rear = sole[:, 0] < 0
    held_heel, held_toe = _held_masks(phases, heel_down, toe_down)
    # the held place: the mean heel position while the heel is down (the whole phase where it never is)
    by = inside & held_heel
    has = np.bincount(pid[by], minlength=k) > 0
    by = by | (inside & ~has[pid.clip(0)])
    if pivot:
        origin_xy, heading = _pivot_placement(phases, heel_world, foot_forward_world, by, sole[:, :2].mean(0))
        origin_xy += _drift_of(pid, by, heel_world[:, :2] - origin_xy, hold_radius)
        if yaw is not None:  # the solver's heading per phase: the source's turns within it kept about it
            mean = _phase_mean_angle(pid, inside, heading, k)
            heading = heading + np.where(inside, (np.asarray(yaw, dtype=np.float64) - mean)[pid.clip(0)], 0.0)
    else:
        cnt = np.bincount(pid[by], minlength=k).astype(np.float64).clip(1.0)
        origin = np.stack([np.bincount(pid[by], heel_world[by, i], minlength=k) for i in range(2)], -1)
        origin /= cnt[:, None]
        fwd = np.stack([np.bincount(pid[inside], foot_forward_world[inside, i], minlength=k) for i in range(2)], -1)
        yaw = np.arctan2(fwd[:, 1], fwd[:, 0]) if yaw is None else np.asarray(yaw, dtype=np.float64)
        origin_xy, heading = origin[pid.clip(0)], yaw[pid.clip(0)]
    origin_z = ground - sole[:, 2].min()  # flat sole on the floor
    targets = np.zeros((n, sole.shape[0], 3))
    weight = np.zeros((n, sole.shape[0]))
    toe_world = heel_world if toe_world is None else toe_world
    frame = np.arange(n)
    for cols, mask, src in ((rear, held_heel, heel_world), (~rear, held_toe, toe_world)):  # two point groups
        if not cols.any():
            continue
        grp = ContactPhases(mask, np.where(mask, pid, -1), phases.starts, phases.ends)
        near, dist = _nearest_contact(grp)
        at = np.where(inside, frame, near)  # the frame whose held placement a frame's targets take
        ramp = np.clip(1.0 - dist / max(blend_frames, 1.0), 0.0, 1.0)
        w = np.where(mask, 1.0, ramp * ramp * (3.0 - 2.0 * ramp))  # smoothstep: no kink where it starts
        c, s = np.cos(heading[at]), np.sin(heading[at])
        pts = sole[cols]
        rx = c[:, None] * pts[None, :, 0] - s[:, None] * pts[None, :, 1]
        ry = s[:, None] * pts[None, :, 0] + c[:, None] * pts[None, :, 1]
        z = np.broadcast_to(pts[None, :, 2] + origin_z, rx.shape)
        held = np.stack([rx + origin_xy[at, None, 0], ry + origin_xy[at, None, 1], z], -1)
        # released: the source's own motion since (or until) the nearest frame this group is held
        move = np.where(mask[:, None], 0.0, (src - src[near]))
        if pivot:  # within its phase a released point rises with the source but keeps its (turning) place
            move[inside, :2] = 0.0
        else:
            move[:, :2] += _drift(pid, mask, src, hold_radius)[near]  # held where the foot is (or was last) held
        tg = held + move[:, None, :]
        tg[..., 2] = np.maximum(tg[..., 2], held[..., 2])
        targets[:, cols] = tg
        weight[:, cols] = w[:, None]
    return targets, weight


def _rotate_xy(heading: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``[N, 2]``: ``v [N, 2]`` (or ``[2]``) turned by ``heading [N]`` rad about +Z."""
    c, s = np.cos(heading), np.sin(heading)
    v = np.broadcast_to(v, (heading.shape[0], 2))
    return np.stack([c * v[:, 0] - s * v[:, 1], s * v[:, 0] + c * v[:, 1]], -1)


def _phase_mean_angle(pid, inside, angle, k: int) -> np.ndarray:
    """``[phases]`` rad: the circular mean of ``angle [frames]`` over each phase."""
    s = np.bincount(pid[inside], np.sin(angle[inside]), minlength=k)
    c = np.bincount(pid[inside], np.cos(angle[inside]), minlength=k)
    return np.arctan2(s, c)


def _pivot_placement(phases, heel_world, forward_world, by, centre):
    """``(origin [frames, 2] m, heading [frames] rad)``: the held foot's place and heading per frame in the
    phases (zero outside), turning with the source foot frame by frame about its sole centre.

    The heading is the source foot's (``forward_world [frames, 3]``), unwrapped within each phase; between two
    frames of a phase the foot turns about ``centre [2]`` (m, foot frame), so the sole centre, where the slide
    is measured, stays put (a turn about the held toe points followed CMU 131_01's pivots on the ball of the
    foot closer, 2.70 cm key-body mean instead of 2.72, but carried the sole centre 9.2 cm in a phase of 01_01,
    more than the per-frame mink baseline's 8.4). The origin path is the running sum of those turns, put so that
    its mean over the frames ``by [frames]`` (the heel held) is the source heel's mean there
    (``heel_world [frames, 3]``).
    """
    n = heel_world.shape[0]
    pid = phases.phase_id
    k = phases.num_phases
    raw = np.arctan2(forward_world[:, 1], forward_world[:, 0])
    same = np.zeros(n, dtype=bool)  # frame t and t + 1 in the same phase
    same[:-1] = (pid[:-1] >= 0) & (pid[:-1] == pid[1:])
    step = np.zeros(n)
    step[1:] = np.where(same[:-1], np.angle(np.exp(1j * (raw[1:] - raw[:-1]))), 0.0)
    run = np.cumsum(step)
    start = phases.starts[pid.clip(0)]
    heading = np.where(pid >= 0, raw[start] + run - run[start], 0.0)
    # turning from t to t + 1 about the centre: the origin moves by R(h_t) c - R(h_t+1) c
    shift = np.zeros((n, 2))
    turn = _rotate_xy(heading[:-1], centre) - _rotate_xy(heading[1:], centre)
    shift[1:] = np.where(same[:-1, None], turn, 0.0)
    path = np.cumsum(shift, 0)
    path = path - path[start]
    cnt = np.bincount(pid[by], minlength=k).astype(np.float64).clip(1.0)
    d = heel_world[:, :2] - path
    offset = np.stack([np.bincount(pid[by], d[by, i], minlength=k) for i in range(2)], -1) / cnt[:, None]
    inside = (pid >= 0)[:, None]
    return np.where(inside, path + offset[pid.clip(0)], 0.0), heading


def _drift_of(pid, by, residual, radius: float) -> np.ndarray:
    """``[frames, 2]`` m: the part of ``residual [frames, 2]`` (the source heel less the held origin, mean zero
    over the frames ``by`` of each phase) beyond ``radius``, on the frames ``by``; the other frames of a phase
    take it from the nearest frame ``by`` of their phase (zero outside the phases)."""
    d = np.where(by[:, None], residual, 0.0)
    r = np.linalg.norm(d, axis=-1, keepdims=True)
    ex = d * np.clip(1.0 - radius / np.maximum(r, 1e-12), 0.0, None)
    n = pid.shape[0]
    idx = np.arange(n)
    prev = np.maximum.accumulate(np.where(by, idx, -1))
    nxt = np.minimum.accumulate(np.where(by, idx, n)[::-1])[::-1]
    ok_prev = (prev >= 0) & (pid[prev.clip(0)] == pid)
    ok_next = (nxt < n) & (pid[nxt.clip(max=n - 1)] == pid)
    use_prev = ok_prev & (~ok_next | (idx - prev <= nxt - idx))
    near = np.where(use_prev, prev, np.where(ok_next, nxt, idx)).clip(0, n - 1)
    return np.where(((pid >= 0) & (ok_prev | ok_next))[:, None], ex[near], 0.0)


def phase_yaw(phases: ContactPhases, forward_world, weight=None) -> np.ndarray:
    """``[phases]`` rad: the mean heading of a direction over each phase's frames (circular mean, weighted).

    Args:
        forward_world: ``[frames, 3]`` a direction per frame (e.g. the robot foot's x axis), world, Z up.
        weight: ``[frames]`` or ``None``: each frame's share in its phase's mean.
    """
    pid = phases.phase_id
    inside = pid >= 0
    k = phases.num_phases
    w = np.ones(pid.shape[0]) if weight is None else np.asarray(weight, dtype=np.float64)
    f = np.asarray(forward_world, dtype=np.float64)[:, :2]
    f = f / np.maximum(np.linalg.norm(f, axis=-1, keepdims=True), 1e-12)
    s = [np.bincount(pid[inside], (w * f[:, i])[inside], minlength=k) for i in range(2)]
    return np.arctan2(s[1], s[0])


def _drift(pid, mask, src, radius: float) -> np.ndarray:
    """``[frames, 2]`` m: how far ``src`` wanders beyond ``radius`` from its mean over the held frames of its
    phase (zero outside them and where it stays within)."""
    k = int(pid.max()) + 1
    cnt = np.bincount(pid[mask], minlength=k).astype(np.float64).clip(1.0)
    mean = np.stack([np.bincount(pid[mask], src[mask, i], minlength=k) for i in range(2)], -1) / cnt[:, None]
    d = np.where(mask[:, None], src[:, :2] - mean[pid.clip(0)], 0.0)
    r = np.linalg.norm(d, axis=-1, keepdims=True)
    return d * np.clip(1.0 - radius / np.maximum(r, 1e-12), 0.0, None)


def _held_masks(phases: ContactPhases, heel_down, toe_down) -> tuple[np.ndarray, np.ndarray]:
    """``(heel held [frames], toe held [frames])`` bool inside the phases (see :func:`held_sole_targets`)."""
    c = phases.in_contact
    if heel_down is None or toe_down is None:
        return c, c
    heel = c & np.asarray(heel_down, dtype=bool)
    toe = c & np.asarray(toe_down, dtype=bool)
    neither = c & ~heel & ~toe
    return heel | neither, toe | neither


def phase_slide(phases: ContactPhases, points_world) -> np.ndarray:
    """``[phases]`` m: the largest horizontal distance a point moves from where it was at the phase's first frame.

    Args:
        points_world: ``[frames, 3]`` m.
    """
    if phases.num_phases == 0:
        return np.zeros(0)
    pid = phases.phase_id
    inside = pid >= 0
    start_xy = points_world[phases.starts, :2]
    d = np.zeros(points_world.shape[0])
    d[inside] = np.linalg.norm(points_world[inside, :2] - start_xy[pid[inside]], axis=-1)
    out = np.zeros(phases.num_phases)
    np.maximum.at(out, pid[inside], d[inside])
    return out
