"""Two clean-ups of the skeleton retarget (:func:`kangengine.retarget.retarget_motion`), vectorised over frames:

* :func:`despike_rotations`: a source joint rotation that jumps away from its neighbours for one frame (a capture
  glitch) is replaced by the slerp of its neighbours; a genuine fast motion (a turn, a kick) is left alone;
* :func:`plant_feet`: each stance foot of the retargeted motion is held at one place through its contact phase
  (phases from the source's own foot height and speed) by an analytic two-bone leg IK (hip, knee hinge, ankle),
  the pelvis lowered where a leg cannot reach.

Private to ``retarget``: the configuration keys ``despike_acceleration`` and ``plant_feet`` of
:class:`~kangengine.retarget.RetargetConfig` switch them on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import rotations as R

# contact phases of the source's feet
PLANT_HEIGHT = 0.04  # m above the point's running lowest height (the floor under a source drifts)
PLANT_WINDOW_S = 1.5  # s, the window of that running minimum (then mean): longer than a step
PLANT_SPEED = 0.35  # m/s, horizontal speed of the point (central differences)
PLANT_SPEED_LOOSE = 1.0  # m/s, a phase extends over the low frames next to it up to this speed
PLANT_MIN_S = 0.06  # s, shorter contact runs are dropped
PLANT_GAP_S = 0.03  # s, shorter breaks inside a contact run are closed
HEEL_OFF = 0.005  # m: a standing foot rolls onto its toe once the toe is this much lower than the heel
PLANT_RAMP_S = 0.1  # s, the hold fades in before a phase and out after it
PELVIS_SMOOTH_S = 0.25  # s, the window of the pelvis lowering (a slow drop asks little of the contacts)
SWING_LIFT_S = 0.05  # s: a swinging ankle is at least (speed - PLANT_SPEED) times this above a standing one
PLANT_LEVEL_PERCENTILE = 10.0  # the height of a standing point: this percentile of its heights while it stands
REACH = 0.995  # fraction of the straight leg the IK uses at most
MIN_BEND = 0.03  # sin of the least knee bend an IK solution keeps (the hinge's limits start near straight)
SPIKE_MEDIAN_FACTOR = 10.0  # a spike also stands this far above the joint's median deviation


def _angle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[...]`` rad between unit WXYZ quaternions ``a, b [..., 4]`` (sign-blind)."""
    d = np.abs(np.sum(a * b, axis=-1))
    return 2.0 * np.arccos(np.clip(d, 0.0, 1.0))


def _slerp_half(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[..., 4]`` the rotation halfway between unit quaternions ``a`` and ``b`` (shortest arc)."""
    b = np.where(np.sum(a * b, axis=-1, keepdims=True) < 0.0, -b, b)
    m = a + b
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


@dataclass(frozen=True)
class Spike:
    """One corrected frame of one joint: ``frame`` (index in the rotations given), ``joint`` (index),
    ``deviation_rad`` (angle from the slerp midpoint of its neighbours), ``speed_in_rad_s`` and
    ``speed_out_rad_s`` (the jumps into and out of it)."""

    frame: int
    joint: int
    deviation_rad: float
    speed_in_rad_s: float
    speed_out_rad_s: float


def spike_deviation(local_rotation: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(deviation, angle_in, angle_out)``, each ``[T - 2, J]`` rad: for frames ``1 .. T-2`` of
    ``local_rotation [T, J, 4]`` (WXYZ), the angle of each rotation from the slerp midpoint of its two neighbours,
    and the angles from the previous frame and to the next."""
    q = np.asarray(local_rotation, dtype=np.float64)
    prev, mid, nxt = q[:-2], q[1:-1], q[2:]
    return _angle(mid, _slerp_half(prev, nxt)), _angle(prev, mid), _angle(mid, nxt)


def despike_rotations(
    local_rotation: np.ndarray, fps: float, *, max_acceleration: float, median_factor: float = SPIKE_MEDIAN_FACTOR
) -> tuple[np.ndarray, list[Spike]]:
    """Replace single-frame rotation spikes by the slerp of their neighbours.

    A frame ``k`` of joint ``j`` is a spike when its rotation stands away from the midpoint of frames ``k-1`` and
    ``k+1`` by more than ``max_acceleration / (2 fps^2)`` rad (the deviation a constant angular acceleration of
    ``max_acceleration`` rad/s^2 would give; a constant-speed turn gives none) and by more than
    ``median_factor`` times the joint's median deviation over the clip, and both jumps (into and out of it) are
    larger than the deviation's half (it went away and came back). Of two neighbouring spike frames the larger
    is corrected first; the test runs again (three passes at most) on the corrected rotations.

    Args:
        local_rotation: ``[T, J, 4]`` WXYZ local rotations (any float dtype; returned in it).
        fps: frames per second.
        max_acceleration: rad/s^2 (e.g. 8000: human joints reach a few hundred to ~2000).
        median_factor: see above.

    Returns:
        ``(corrected [T, J, 4], spikes)``: the rotations (a copy, unchanged where no spike) and one
        :class:`Spike` per corrected frame, in frame order.
    """
    q = np.array(local_rotation, dtype=np.float64, copy=True)
    spikes: list[Spike] = []
    if q.shape[0] < 3:
        return q.astype(local_rotation.dtype, copy=False), spikes
    limit = float(max_acceleration) / (2.0 * float(fps) ** 2)
    for _ in range(3):
        dev, a_in, a_out = spike_deviation(q)
        floor = median_factor * np.median(dev, axis=0)  # [J]
        hit = (dev > limit) & (dev > floor[None]) & (np.minimum(a_in, a_out) > 0.5 * dev)
        if not hit.any():
            break
        # of neighbouring hits of one joint keep the larger (its neighbours must be sound)
        score = np.where(hit, dev, 0.0)
        left = np.zeros_like(score)
        left[1:] = score[:-1]
        right = np.zeros_like(score)
        right[:-1] = score[1:]
        keep = hit & (score >= left) & (score > right)
        rows, cols = np.nonzero(keep)
        frames = rows + 1
        q[frames, cols] = _slerp_half(q[frames - 1, cols], q[frames + 1, cols])
        spikes += [
            Spike(int(f), int(j), float(dev[f - 1, j]), float(a_in[f - 1, j] * fps), float(a_out[f - 1, j] * fps))
            for f, j in zip(frames, cols)
        ]
    spikes.sort(key=lambda s: (s.frame, s.joint))
    return q.astype(local_rotation.dtype, copy=False), spikes


# -- feet planting --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leg:
    """Bodies of one leg of the target tree: ``thigh`` (its origin is the hip), ``shank`` (the knee, one hinge
    about ``knee_axis`` in the shank's frame), ``foot`` (the ankle; ``heel`` in its frame), ``toe`` (its origin is
    the ball of the foot; ``toe = foot``: none)."""

    name: str
    thigh: int
    shank: int
    foot: int
    toe: int
    knee_axis: np.ndarray  # [3] unit
    heel: np.ndarray  # [3] m, the foot's rearmost sole point in its frame (zeros: the ankle)
    toe_axis: np.ndarray | None = None  # [3] unit: the toe's one hinge in its frame (None: any rotation)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(start, end)`` (end exclusive) of the runs of True in ``mask [T]``."""
    m = np.concatenate([[False], mask, [False]]).astype(np.int8)
    d = np.diff(m)
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _clean(mask: np.ndarray, min_len: int, gap: int) -> np.ndarray:
    """``mask`` with breaks shorter than ``gap`` frames closed, then runs shorter than ``min_len`` dropped."""
    out = mask.copy()
    s, e = _runs(~out)
    inner = (s > 0) & (e < len(out)) & (e - s < gap)
    for a, b in zip(s[inner], e[inner]):
        out[a:b] = True
    s, e = _runs(out)
    for a, b in zip(s[e - s < min_len], e[e - s < min_len]):
        out[a:b] = False
    return out


def contact_mask(point_pos: np.ndarray, fps: float) -> np.ndarray:
    """``[T]`` bool: the frames where a source point (``point_pos [T, 3]`` m, Z up) stands on the ground: within
    ``PLANT_HEIGHT`` of its running lowest height (minimum, then mean, over ``PLANT_WINDOW_S``) and slower than
    ``PLANT_SPEED`` horizontally, each such run grown over the low frames next to it slower than
    ``PLANT_SPEED_LOOSE``; breaks under ``PLANT_GAP_S`` closed and runs under ``PLANT_MIN_S`` dropped."""
    p = np.asarray(point_pos, dtype=np.float64)
    if len(p) < 3:
        return np.zeros(len(p), dtype=bool)
    speed = np.linalg.norm(np.gradient(p[:, :2], axis=0), axis=1) * fps
    from scipy.ndimage import minimum_filter1d, uniform_filter1d

    w = max(1, int(round(PLANT_WINDOW_S * fps))) | 1
    low = p[:, 2] - uniform_filter1d(minimum_filter1d(p[:, 2], w, mode="nearest"), w, mode="nearest")
    strict = (low < PLANT_HEIGHT) & (speed < PLANT_SPEED)
    # hysteresis: a phase is a run of low frames slower than PLANT_SPEED_LOOSE holding a strict frame (a landing
    # heel that still slides on the source belongs to the step it starts)
    loose = (low < PLANT_HEIGHT) & (speed < PLANT_SPEED_LOOSE)
    s, e = _runs(loose)
    run = np.cumsum(np.isin(np.arange(len(p)), s)) - 1
    has = np.bincount(run[loose], weights=strict[loose], minlength=len(s)) > 0
    mask = loose & has[np.maximum(run, 0)]
    return _clean(mask, max(2, int(round(PLANT_MIN_S * fps))), max(1, int(round(PLANT_GAP_S * fps))))


def _phase_offsets(point: np.ndarray, kind: np.ndarray, levels, fps: float) -> tuple[np.ndarray, int]:
    """``([T, 3] offset, phases)`` for one leg: ``kind [T]`` says which of its points ``point [2, T, 3]`` (heel,
    toe) stands in each frame (-1: none). Horizontally, each run of one kind moves that point to its mean position
    over the run (a toe run right after a heel run: where the held foot put the toe); vertically, each stance phase
    (its heel and toe runs) is shifted by one constant that puts its heel's (else its toe's) 10th-percentile height
    over the phase at ``levels[kind]`` (m: one flat floor for every leg). The offsets fade to zero (smoothstep)
    over ``PLANT_RAMP_S`` before and after each phase."""
    T = len(kind)
    on = kind >= 0
    idx = np.arange(T)
    offset = np.zeros((T, 3))
    if not on.any():
        return offset, 0
    held = point[np.where(on, kind, 0), idx]  # [T, 3] the standing point
    change = np.flatnonzero(np.diff(np.concatenate([[-2], kind])) != 0)
    label = np.cumsum(np.isin(idx, change)) - 1  # run of one kind, per frame
    count = np.maximum(np.bincount(label[on], minlength=label.max() + 1), 1).astype(np.float64)
    mean = np.stack([np.bincount(label[on], weights=held[on, i], minlength=len(count)) / count for i in (0, 1)], -1)
    # a toe run right after an ankle run starts where the held foot left the toe (no jump at heel-off)
    first = change[(kind[change] == 1) & (change > 0)]
    first = first[kind[first - 1] == 0]
    for f in first:
        mean[label[f]] = point[1, f - 1, :2] + mean[label[f - 1]] - point[0, f - 1, :2]
    offset[on, :2] = mean[label[on]] - held[on, :2]
    # vertical: one constant per stance phase
    s, e = _runs(on)
    for a, b in zip(s, e):
        k = 0 if (kind[a:b] == 0).any() else 1
        z = point[k, a:b][kind[a:b] == k, 2]
        offset[a:b, 2] = levels[k] - np.percentile(z, PLANT_LEVEL_PERCENTILE)
    # fade: each free frame takes the offset of the nearest phase end before / phase start after it
    ramp = max(1.0, PLANT_RAMP_S * fps)
    last_on = np.maximum.accumulate(np.where(on, idx, -1))
    next_on = np.minimum.accumulate(np.where(on, idx, T)[::-1])[::-1]
    free = ~on

    def fade(gap):
        x = np.clip(1.0 - gap / ramp, 0.0, 1.0)
        return x * x * (3.0 - 2.0 * x)

    f = np.zeros((T, 3))
    has_prev = free & (last_on >= 0)
    f[has_prev] += offset[last_on[has_prev]] * fade(idx - last_on)[has_prev, None]
    has_next = free & (next_on < T)
    f[has_next] += offset[next_on[has_next]] * fade(next_on - idx)[has_next, None]
    offset[free] = f[free]
    return offset, len(s)


def _heel_or_toe(stance: np.ndarray, heel_z: np.ndarray, toe_z: np.ndarray) -> np.ndarray:
    """``[T]`` int: -1 off the ground, 0 standing on the heel, 1 on the toe: each stance phase (``stance [T]``)
    stands on its heel from its start (unless its toe is lower then) until the toe is ``HEEL_OFF`` lower than the
    heel, then on its toe to its end (one switch per step: heel strike, foot flat, heel off)."""
    T = len(stance)
    idx = np.arange(T)
    starts = stance & ~np.concatenate([[False], stance[:-1]])
    run = np.cumsum(starts) - 1
    toe_low = stance & (toe_z < heel_z - HEEL_OFF)
    c = np.cumsum(toe_low)
    before = (c - toe_low)[np.maximum.accumulate(np.where(starts, idx, 0))]  # count before the run's start
    on_toe = (c - before) > 0
    del run
    return np.where(stance, np.where(on_toe, 1, 0), -1)


def _fade(gap: np.ndarray, fps: float) -> np.ndarray:
    """Smoothstep weight, 1 at ``gap = 0`` frames from a phase, 0 from ``PLANT_RAMP_S`` on."""
    x = np.clip(1.0 - gap / max(1.0, PLANT_RAMP_S * fps), 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _held_rotation(q: np.ndarray, on: np.ndarray, fps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(held [T, 4], weight [T])``: in each run of ``on [T]`` the rotation ``q [T, 4]`` of its first frame
    (weight 1); outside, that of the nearest run (weight fading out over ``PLANT_RAMP_S``)."""
    T = len(on)
    idx = np.arange(T)
    if not on.any():
        return q.copy(), np.zeros(T)
    start = np.maximum.accumulate(np.where(on & ~np.concatenate([[False], on[:-1]]), idx, 0))
    last_on = np.maximum.accumulate(np.where(on, idx, -1))
    next_on = np.minimum.accumulate(np.where(on, idx, T)[::-1])[::-1]
    gap_prev = np.where(last_on >= 0, idx - last_on, T)
    gap_next = np.where(next_on < T, next_on - idx, T)
    src = np.where(on, start[idx], np.where(gap_prev <= gap_next, start[np.maximum(last_on, 0)], next_on))
    src = np.clip(src, 0, T - 1)
    weight = np.where(on, 1.0, _fade(np.minimum(gap_prev, gap_next).astype(np.float64), fps))
    return q[src], weight


def _lower_pelvis(hip: np.ndarray, ankle_goal: np.ndarray, reach: np.ndarray, fps: float) -> np.ndarray:
    """``[T]`` m (>= 0) to lower the pelvis by so that every leg reaches its goal (``hip, ankle_goal [L, T, 3]``,
    ``reach [L]``), held over ``PELVIS_SMOOTH_S`` on both sides and smoothed (never below the need)."""
    v = ankle_goal - hip  # [L, T, 3]
    horiz = np.minimum(np.linalg.norm(v[..., :2], axis=-1), reach[:, None] * 0.999)
    need = -np.sqrt(reach[:, None] ** 2 - horiz**2) - v[..., 2]  # lowering that puts the goal at full reach
    need = np.maximum(need.max(axis=0), 0.0)
    if not need.any():
        return need
    from scipy.ndimage import maximum_filter1d, uniform_filter1d

    w = max(1, int(round(PELVIS_SMOOTH_S * fps))) | 1
    # the running mean over w of the running max over 2w - 1 is >= the need at every frame
    return uniform_filter1d(maximum_filter1d(need, 2 * w - 1, mode="nearest"), w, mode="nearest")


def _knee_angle(hip, knee, ankle, axis, dist):
    """``[T]`` rad about the knee's world ``axis [T, 3]`` that puts the ankle at ``dist [T]`` from the hip (the
    nearest reachable distance where none does; of the two solutions the smaller turn)."""
    w = knee - hip
    u = ankle - knee
    wa = np.sum(w * axis, -1)
    ua = np.sum(u * axis, -1)
    p = np.sum(w * u, -1) - wa * ua
    s = np.sum(w * np.cross(axis, u), -1)
    c = 0.5 * (dist**2 - np.sum(w * w, -1) - np.sum(u * u, -1)) - wa * ua
    rho = np.maximum(np.hypot(p, s), 1e-12)
    phi = np.arctan2(s, p)
    delta = np.arccos(np.clip(c / rho, -1.0, 1.0))
    cand = np.stack([R.wrap_angle(phi + delta), R.wrap_angle(phi - delta)])  # [2, T]
    # the bend each gives: axis . (thigh x shank) > 0 is a knee bent the way its hinge bends (angle > 0)
    turned = R.quat_rotate(R.quat_from_axis_angle(np.broadcast_to(axis, (2,) + axis.shape), cand), u)
    bend = np.sum(axis * np.cross(w, turned), -1) / np.maximum(
        np.linalg.norm(w, axis=-1) * np.linalg.norm(u, axis=-1), 1e-12
    )
    ok = bend > MIN_BEND
    pick = np.where(ok[0] & (~ok[1] | (np.abs(cand[0]) <= np.abs(cand[1]))), cand[0], cand[1])
    return np.where(ok.any(0), pick, 0.0)


def _swing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[T, 4]`` the shortest rotation taking direction ``a [T, 3]`` onto ``b [T, 3]``."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    q = np.concatenate([1.0 + np.sum(a * b, -1, keepdims=True), np.cross(a, b)], -1)
    n = np.linalg.norm(q, axis=-1, keepdims=True)
    return np.where(n > 1e-9, q / np.maximum(n, 1e-12), np.array([1.0, 0.0, 0.0, 0.0]))


def plant_feet(
    parents: np.ndarray,
    root: np.ndarray,
    local: np.ndarray,
    kinematics,
    legs: list[Leg],
    source_points: np.ndarray,
    fps: float,
) -> dict:
    """Hold each stance foot at one place through its contact phase, in place on ``root`` and ``local``.

    Args:
        parents: ``[n]`` parent index of each target body.
        root: ``[T, 3]`` float64 m, the target root translation (changed in place: the pelvis lowering).
        local: ``[T, n, 4]`` float64 WXYZ target local rotations (changed in place: thighs, shanks, feet).
        kinematics: the target tree's ``BodyKinematics`` (``from_local(root, local) -> (pos, rot)``).
        legs: the legs to plant.
        source_points: ``[L, 2, T, 3]`` m, each leg's source ankle and toe (its toe row may repeat the ankle) in the
            target's world (after the rotation offset and the scale): the contact phases come from them.
        fps: frames per second.

    Returns:
        ``{"phases": {leg: count}, "pelvis_lowered_max_m": float, "held_fraction": {leg: fraction}}`` for the
        motion's metadata.

    A leg's stance phase is a run of frames where its source ankle or toe stands (:func:`contact_mask`). Within
    it the target foot stands on its heel (the rearmost sole point, ``Leg.heel``) until its toe is lower, then on
    its toe (:func:`_heel_or_toe`); the standing point is held horizontally at its mean position over its run and
    the phase is shifted vertically onto one floor shared by all legs (:func:`_phase_offsets`), the offsets faded in
    and out over ``PLANT_RAMP_S``. A swinging ankle is kept no lower than a standing one (higher the faster it
    moves). Each leg then reaches its ankle goal by turning the knee about its hinge (the hip-ankle distance,
    analytic: :func:`_knee_angle`) and swinging the thigh (the direction); the foot keeps its world rotation and a
    toe on the ground keeps its world pitch about its hinge. Where a goal is farther than the straight leg, the
    pelvis is first lowered (smoothly, :func:`_lower_pelvis`) so that it is not.
    """
    T = len(root)
    pos, rot = kinematics.from_local(root, local)
    goals, hips, reach, kinds, points, info = [], [], [], [], [], {"phases": {}, "held_fraction": {}}
    for i, leg in enumerate(legs):
        stance = contact_mask(source_points[i, 0], fps) | contact_mask(source_points[i, 1], fps)
        heel = pos[:, leg.foot] + R.quat_rotate(rot[:, leg.foot], np.broadcast_to(leg.heel, (T, 3)))
        kinds.append(_heel_or_toe(stance, heel[:, 2], pos[:, leg.toe, 2]))
        points.append(np.stack([heel, pos[:, leg.toe], pos[:, leg.foot]]))  # heel, toe, ankle
    # one floor for all legs: the heights of heels, toes and ankles while they stand, pooled over the legs
    levels = []
    for k in range(3):
        z = np.concatenate([pt[k, kd == k if k < 2 else kd >= 0, 2] for pt, kd in zip(points, kinds)])
        levels.append(float(np.percentile(z, PLANT_LEVEL_PERCENTILE)) if len(z) else -np.inf)
    for i, leg in enumerate(legs):
        kind = kinds[i]
        offset, count = _phase_offsets(points[i][:2], kind, levels[:2], fps)
        goal = pos[:, leg.foot] + offset
        level = levels[2]
        # a swinging ankle no lower than a standing one, and the higher the faster it moves (a foot that moves
        # fast is not on the ground)
        speed = np.linalg.norm(np.gradient(goal[:, :2], axis=0), axis=-1) * fps
        goal[:, 2] = np.maximum(goal[:, 2], level + SWING_LIFT_S * np.maximum(speed - PLANT_SPEED, 0.0))
        # nor its heel or toe under the floor they stand on (the foot moves rigidly with the ankle)
        heel_z, toe_z = (points[i][k, :, 2] + goal[:, 2] - pos[:, leg.foot, 2] for k in (0, 1))
        goal[:, 2] += np.maximum(np.maximum(levels[0] - heel_z, levels[1] - toe_z), 0.0)
        goals.append(goal)
        hips.append(pos[:, leg.thigh])
        thigh = np.linalg.norm(pos[0, leg.shank] - pos[0, leg.thigh])
        shank = np.linalg.norm(pos[0, leg.foot] - pos[0, leg.shank])
        reach.append(REACH * (thigh + shank))
        info["phases"][leg.name] = int(count)
        info["held_fraction"][leg.name] = float((kind >= 0).mean())
    goal = np.stack(goals)
    lower = _lower_pelvis(np.stack(hips), goal, np.array(reach), fps)
    info["pelvis_lowered_max_m"] = float(lower.max()) if T else 0.0
    if lower.any():
        root[:, 2] -= lower
        pos = pos.copy()
        pos[..., 2] -= lower[:, None]
    for i, leg in enumerate(legs):
        hip, knee, ankle = pos[:, leg.thigh], pos[:, leg.shank], pos[:, leg.foot]
        g_shank, g_foot = rot[:, leg.shank], rot[:, leg.foot]
        axis = R.quat_rotate(g_shank, np.broadcast_to(leg.knee_axis, (T, 3)))
        dist = np.minimum(np.linalg.norm(goal[i] - hip, axis=-1), reach[i])
        theta = _knee_angle(hip, knee, ankle, axis, dist)
        turn = np.concatenate([np.cos(theta / 2)[:, None], np.sin(theta / 2)[:, None] * leg.knee_axis], -1)
        local[:, leg.shank] = R.quat_multiply(local[:, leg.shank], turn)
        bent = knee + R.quat_rotate(R.quat_from_axis_angle(axis, theta), ankle - knee)
        swing = _swing(bent - hip, goal[i] - hip)
        parent_rot = rot[:, parents[leg.thigh]]
        local[:, leg.thigh] = R.quat_multiply(
            R.quat_conjugate(parent_rot), R.quat_multiply(swing, R.quat_multiply(parent_rot, local[:, leg.thigh]))
        )
        new_shank = R.quat_multiply(swing, R.quat_multiply(g_shank, turn))
        local[:, leg.foot] = R.quat_multiply(R.quat_conjugate(new_shank), g_foot)
        if leg.toe >= 0 and parents[leg.toe] == leg.foot:  # a standing toe keeps its world rotation
            g_toe = rot[:, leg.toe]
            held, weight = _held_rotation(g_toe, kinds[i] == 1, fps)
            toe_goal = R.quat_multiply(R.quat_conjugate(g_foot), R.quat_slerp(g_toe, held, weight))
            if leg.toe_axis is not None:  # only the turn about the toe's hinge (what a hinge can do)
                change = R.quat_multiply(R.quat_conjugate(local[:, leg.toe]), toe_goal)
                toe_goal = R.quat_multiply(local[:, leg.toe], R.quat_swing_twist(change, leg.toe_axis)[1])
            local[:, leg.toe] = toe_goal
    local /= np.linalg.norm(local, axis=-1, keepdims=True)
    return info
