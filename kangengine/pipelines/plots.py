"""Figures of the workflows: the per-clip validation plot (matplotlib, headless, the ``viz`` extra)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._files import atomic_write

if TYPE_CHECKING:  # the simulator (torch) is not needed to draw a figure
    from ..sim.tracking import TrackingResult

__all__ = ["write_plot"]


def write_plot(path, result: TrackingResult, index: int, report=None) -> Path:
    """PNG of clip ``index``: per-DOF error over time (heat map), body error, the reference's residual and
    unsupported wrench (and root assistance when used), and the contact timeline of the reference and
    the simulation. Headless (matplotlib's Agg canvas); written atomically. Needs the ``viz`` extra."""
    from .._deps import require

    require("matplotlib", "viz")
    from matplotlib.figure import Figure

    i = index
    n = int(result.clip_step_count[i])
    t = np.arange(n) * result.dt
    mg = result.weight
    fig = Figure(figsize=(11, 11), dpi=90)
    axes = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3, 1.3, 2]})
    title = result.clip_names[i]
    if report is not None:
        title += f"  -  {report.verdict.value}"
        if report.reason_codes:
            title += " (" + ", ".join(dict.fromkeys(report.reason_codes)) + ")"
    fig.suptitle(title)
    ext = (0.0, max(t[-1], result.dt), -0.5, len(result.dof_names) - 0.5)
    ax = axes[0]
    img = ax.imshow(
        np.degrees(result.dof_error[i, :n].T),
        aspect="auto",
        origin="lower",
        extent=ext,
        cmap="magma",
        interpolation="nearest",
    )
    ax.set_yticks(range(len(result.dof_names)))
    ax.set_yticklabels(result.dof_names, fontsize=4)
    ax.set_ylabel("DOF error (deg)")
    fig.colorbar(img, ax=ax, pad=0.01)
    ax = axes[1]
    ax.plot(t, result.body_error_mean[i, :n], label="mean over bodies")
    ax.plot(t, result.body_error_max[i, :n], label="max over bodies", alpha=0.7)
    ax.set_ylabel("body error (m)")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    ax.plot(t, result.residual_force[i, :n] / mg, label="residual force (no contact)")
    ax.plot(t, result.unsupported_force[i, :n] / mg, label="unsupported force")
    ax.plot(t, result.unsupported_torque[i, :n] / mg, label="unsupported torque / m g (m)", alpha=0.8)
    if result.settings.root_assist_frequency_hz > 0:
        ax.plot(t, result.assist_force[i, :n] / mg, label="root assistance force", alpha=0.8)
    ax.set_ylabel("/ m g")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[3]
    h = result.reference_contact_height[i, :n]
    f = result.sim_contact_force[i, :n]
    touched = np.flatnonzero((h < 0.03).any(0) | (f > 1.0).any(0))
    names = [result.contact_body_names[b] for b in touched]
    rows = []
    for b in touched:
        rows.append((h[:, b] < 0.03).astype(float))
        rows.append(np.where(f[:, b] > 1.0, 2.0, 0.0))
    if rows:
        ax.imshow(
            np.array(rows),
            aspect="auto",
            origin="lower",
            cmap="Blues",
            vmin=0,
            vmax=2,
            extent=(0.0, max(t[-1], result.dt), -0.5, len(rows) - 0.5),
            interpolation="nearest",
        )
        labels = [f"{nm} {kind}" for nm in names for kind in ("ref", "sim")]
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=6)
    ax.set_ylabel("contact")
    ax.set_xlabel("time (s)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = buf.getvalue()
    return atomic_write(path, lambda fh: fh.write(data))
