"""Figures of the workflows: the per-clip validation plot (matplotlib, headless, the ``viz`` extra).

:func:`validation_figure` draws one clip of a :class:`~kangengine.sim.TrackingResult` so that it reads at a
glance: the verdict and its reasons (with their numbers) as the title; the joints the tracker followed worst
(the ``top_dofs`` largest RMS errors, not every DOF); the body error on a log scale against the verdict's
thresholds (ok, reject, fall); the wrench the contacts cannot explain against its threshold; the contacts of
the reference and of the simulation side by side, grouped per foot (left foot, right foot, ... from the
body names); the fall marked in every panel, and the time after the simulation stopped shaded.
:func:`write_plot` writes it as a PNG, atomically.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._files import atomic_write

if TYPE_CHECKING:  # the simulator (torch) is not needed to draw a figure
    from ..sim.tracking import TrackingResult

__all__ = ["validation_figure", "write_plot", "contact_groups"]

_VERDICT_COLOR = {"ok": "#1a7f37", "warn": "#b35900", "reject": "#c62828"}
_FALL_COLOR = "#c62828"
_REF_COLOR, _SIM_COLOR = "#4a7fd1", "#e07b28"
_SIDE = {"l": "left", "left": "left", "r": "right", "right": "right"}
_KIND = (
    ("foot", re.compile(r"foot|toe|ankle|heel|sole")),
    ("hand", re.compile(r"hand|wrist|finger|palm|thumb")),
    ("knee", re.compile(r"knee|shin|tibia|calf")),
)


def _side_and_kind(name: str) -> tuple[str | None, str | None]:
    n = name.lower()
    tokens = [t for t in re.split(r"[^a-z0-9]+", n) if t]
    side = next((_SIDE[t] for t in tokens if t in ("left", "right")), None)
    if side is None and tokens and tokens[0] in ("l", "r"):
        side = _SIDE[tokens[0]]
    kind = next((k for k, rx in _KIND if rx.search(n)), None)
    if side is None and n[:1] in ("l", "r") and any(rx.match(n, 1) for _, rx in _KIND):
        side = _SIDE[n[0]]  # CMU style: lfoot, rtoes, lhand
    return side, kind


def contact_groups(names) -> list[tuple[str, list[int]]]:
    """Contact bodies grouped per foot (or hand) from their names.

    Args:
        names: the contact body names (``TrackingResult.contact_body_names``).
    Returns:
        ``[(label, [index, ...]), ...]``: ``"left foot"`` for ``lfoot``/``ltoes`` (CMU), ``left_ankle_roll_link``
        (G1), ``L_Ankle``/``L_Toe`` (SMPL), ...; a body whose side or kind the name does not tell is a group of
        its own, labelled with its name. Groups in order of first appearance, indices in input order.
    """
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        side, kind = _side_and_kind(str(name))
        label = f"{side} {kind}" if side and kind else (f"{side} {name}" if side else str(name))
        groups.setdefault(label, []).append(i)
    return list(groups.items())


def _runs(mask: np.ndarray, dt: float) -> list[tuple[float, float]]:
    """``(start s, length s)`` of each run of True in ``mask [frames]``."""
    m = np.concatenate([[False], np.asarray(mask, dtype=bool), [False]])
    edges = np.flatnonzero(np.diff(m.astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]
    return [(float(a) * dt, float(b - a) * dt) for a, b in zip(starts, ends)]


def _threshold(ax, y: float, label: str, color: str, style: str = "--") -> None:
    ax.axhline(y, color=color, linestyle=style, linewidth=1.0, label=label, gid="threshold")


def validation_figure(result: TrackingResult, index: int, report=None, *, thresholds=None, top_dofs: int = 12):
    """The validation plot of clip ``index`` as a matplotlib :class:`~matplotlib.figure.Figure` (not shown).

    Args:
        result: the :class:`~kangengine.sim.TrackingResult` of a :func:`~kangengine.sim.track` call.
        index: the clip in ``result``.
        report: its :class:`~kangengine.pipelines.ClipReport` (verdict, reasons and ``fell_at_s`` in the title);
            without it the fall is taken from ``result.fell_step``.
        thresholds: the :class:`~kangengine.sim.ValidationThresholds` the verdict used (default: the defaults).
        top_dofs: how many DOFs the error panel shows (the largest RMS errors over the simulated frames).
    Returns:
        The figure: 4 axes (DOF error heat map with its colour bar as a 5th, body error, unsupported wrench,
        contacts). Threshold lines carry ``gid="threshold"``, the fall line ``gid="fall"``.
    """
    from .._deps import require

    require("matplotlib", "viz")
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    from ..sim.verdict import ValidationThresholds

    th = thresholds if thresholds is not None else ValidationThresholds()
    i = int(index)
    n = int(result.clip_step_count[i])
    dt = float(result.dt)
    t = np.arange(n) * dt
    t_end = max(n * dt, dt)
    mg = float(result.weight)
    simulated = np.asarray(result.simulated[i, :n], dtype=bool)
    ns = int(simulated.sum()) if simulated.any() else n
    fell_s = None
    if report is not None and report.metrics.get("fell_at_s") is not None:
        fell_s = float(report.metrics["fell_at_s"])
    elif int(result.fell_step[i]) >= 0:
        fell_s = float(result.fell_step[i]) * dt

    fig = Figure(figsize=(11, 11.5), dpi=90)
    axes = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": [2.4, 1.5, 1.3, 1.6]})
    title, color = result.clip_names[i], "black"
    if report is not None:
        verdict = report.verdict.value
        color = _VERDICT_COLOR.get(verdict, "black")
        title += f"  -  {verdict.upper()}"
        if report.reason_codes:
            title += " (" + ", ".join(dict.fromkeys(report.reason_codes)) + ")"
    assist = result.settings.root_assist_frequency_hz
    title += f"   [root assistance {assist:g} Hz]" if assist > 0 else ""
    fig.suptitle(title, color=color, fontsize=13, fontweight="bold", y=0.995)
    if report is not None:
        lines = [r.message for r in report.reasons if r.severity.value != "info"][:4]
        lines = [x if len(x) <= 150 else x[:147] + "..." for x in lines]
        if lines:
            fig.text(0.01, 0.962, "\n".join(lines), fontsize=7.5, va="top", ha="left", color="#333333", gid="reasons")

    # 1. the DOFs tracked worst
    ax = axes[0]
    err = np.degrees(np.asarray(result.dof_error[i, :n], dtype=np.float64))  # [n, D]
    d_all = err.shape[1]
    rms = np.sqrt((err[simulated] ** 2).mean(0)) if simulated.any() else np.zeros(d_all)
    k = min(int(top_dofs), d_all)
    top = np.argsort(-rms, kind="stable")[:k][::-1]  # largest at the top
    shown = err[:, top].T.copy()
    shown[:, ~simulated] = np.nan
    import matplotlib as mpl

    cmap = mpl.colormaps["magma"].with_extremes(bad="#d9d9d9")  # not simulated: grey
    img = ax.imshow(
        shown,
        aspect="auto",
        origin="lower",
        extent=(0.0, t_end, -0.5, k - 0.5),
        cmap=cmap,
        interpolation="nearest",
        vmin=0.0,
    )
    ax.set_yticks(range(k))
    ax.set_yticklabels([f"{result.dof_names[j]}  {rms[j]:.{1 if rms[j] < 10 else 0}f} deg" for j in top], fontsize=8)
    ax.set_ylabel(f"DOF error (deg)\n{k} worst of {d_all} (RMS)", fontsize=9)
    fig.colorbar(img, ax=ax, pad=0.01, fraction=0.03).set_label("deg", fontsize=8)

    # 2. body error against the thresholds
    ax = axes[1]
    floor = 1e-3
    cut = np.where(simulated, 1.0, np.nan)  # after a stop the state is frozen: its error means nothing
    ax.plot(t, np.maximum(result.body_error_mean[i, :n], floor) * cut, color="#1f4e9c", label="mean over bodies")
    ax.plot(t, np.maximum(result.body_error_max[i, :n], floor) * cut, color="#7aa6e8", label="max over bodies")
    _threshold(ax, th.body_error_ok, f"ok: clip mean <= {th.body_error_ok:g} m", _VERDICT_COLOR["ok"])
    _threshold(ax, th.body_error_reject, f"reject: clip mean > {th.body_error_reject:g} m", _VERDICT_COLOR["warn"])
    _threshold(ax, th.fall_body_error, f"fall: mean > {th.fall_body_error:g} m", _FALL_COLOR, ":")
    ax.set_yscale("log")
    peak = float(np.max(result.body_error_max[i, :n][simulated], initial=floor))
    ax.set_ylim(floor, max(peak, th.fall_body_error) * 2.5)
    ax.set_ylabel("body error (m)", fontsize=9)
    ax.legend(fontsize=7, loc="best", ncol=2, framealpha=0.9)

    # 3. what the contacts cannot explain (and the help given)
    ax = axes[2]
    ax.plot(t, result.unsupported_force[i, :n] / mg, color="#6a3d9a", label="unsupported force / m g")
    ax.plot(t, result.unsupported_torque[i, :n] / mg, color="#2a9d8f", label="unsupported torque / m g (m)", ls="-.")
    _threshold(ax, th.unsupported_force, f"force limit {th.unsupported_force:g}", "#6a3d9a")
    _threshold(ax, th.unsupported_torque, f"torque limit {th.unsupported_torque:g} m", "#2a9d8f")
    if assist > 0:
        ax.plot(t, result.assist_force[i, :n] / mg, color="#888888", label="root assistance force / m g")
        _threshold(ax, th.assist_force_ok, f"assistance ok <= {th.assist_force_ok:g} (mean)", "#888888", ":")
    seen = np.concatenate([result.unsupported_force[i, :n][simulated], result.unsupported_torque[i, :n][simulated]])
    ax.set_ylim(0.0, max(float(np.max(seen / mg, initial=0.0)) * 1.15, th.unsupported_force * 1.5))
    ax.set_ylabel("reference wrench\n/ m g", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=3, framealpha=0.9)

    # 4. contacts, grouped per foot: reference (upper half of a row) and simulation (lower half)
    ax = axes[3]
    h = np.asarray(result.reference_contact_height[i, :n])
    f = np.asarray(result.sim_contact_force[i, :n])
    ref_on = h < result.settings.contact_height
    sim_on = (f > 1.0) & simulated[:, None]
    touched = np.flatnonzero(ref_on.any(0) | sim_on.any(0))  # bodies that never touch are left out
    groups = [
        (label, [int(touched[j]) for j in members])
        for label, members in contact_groups([result.contact_body_names[b] for b in touched])
    ]
    if not groups:
        ax.text(0.5, 0.5, "no contact in the reference or the simulation", transform=ax.transAxes, ha="center")
    row, ticks, labels = 0.0, [], []
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    for g, (label, members) in enumerate(groups):
        if g:
            ax.axhline(row - 0.35, color="#999999", linewidth=0.8)
        start = row
        for b in members:
            ax.broken_barh(_runs(ref_on[:, b], dt), (row + 0.02, 0.4), facecolors=_REF_COLOR)
            ax.broken_barh(_runs(sim_on[:, b], dt), (row - 0.42, 0.4), facecolors=_SIM_COLOR)
            ticks.append(row)
            labels.append(result.contact_body_names[b])
            row += 1.0
        ax.text(1.005, (start + row - 1.0) / 2, label, transform=trans, fontsize=9, va="center", ha="left")
        row += 0.7
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(-0.7, max(row - 0.7, 0.5) + 0.8)  # headroom for the legend
    ax.set_ylabel("contact", fontsize=9)
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color=_REF_COLOR, label=f"reference: point < {result.settings.contact_height * 100:g} cm"),
            Patch(color=_SIM_COLOR, label="simulation: ground force > 1 N"),
        ],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=2,
        framealpha=0.9,
    )
    ax.set_xlabel("time (s)")
    ax.set_xlim(0.0, t_end)

    # the fall and the time not simulated, in every panel
    for ax in axes:
        if ns < n:
            ax.axvspan(ns * dt, t_end, color="#bbbbbb", alpha=0.35, lw=0, gid="stopped")
        if fell_s is not None:
            ax.axvline(fell_s, color=_FALL_COLOR, linewidth=1.6, gid="fall")
    if fell_s is not None:
        axes[0].annotate(
            f"fell at {fell_s:.2f} s",
            xy=(fell_s, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 3),
            textcoords="offset points",
            color=_FALL_COLOR,
            fontsize=9,
            fontweight="bold",
        )
    if ns < n:
        axes[1].text(
            (ns * dt + t_end) / 2, floor * 1.5, "not simulated (stopped)", ha="center", fontsize=8, color="#555555"
        )
    fig.tight_layout(rect=(0, 0, 0.93, 0.955 if report is not None and report.reasons else 0.975))
    return fig


def write_plot(path, result: TrackingResult, index: int, report=None, *, thresholds=None) -> Path:
    """PNG of clip ``index`` (:func:`validation_figure`), headless (matplotlib's Agg canvas), written
    atomically. Needs the ``viz`` extra. Returns the path."""
    fig = validation_figure(result, index, report, thresholds=thresholds)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = buf.getvalue()
    return atomic_write(path, lambda fh: fh.write(data))
