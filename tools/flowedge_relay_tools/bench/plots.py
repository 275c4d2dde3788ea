# SPDX-License-Identifier: Apache-2.0
"""Shared matplotlib setup for bench plots: Agg backend (no display), one style, one saver."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import matplotlib
except ImportError as exc:  # an optional dependency: the relay itself never plots
    raise ImportError(
        "plots need matplotlib, an optional dependency of the tooling: "
        "pip install 'flowedge_relay_tools[plots]' (make setup installs it)"
    ) from exc

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

POLICY_STYLE = {
    "edf_admission": {"color": "#1b7837", "marker": "o", "label": "calibrated EDF admission"},
    "edf_adaptive": {"color": "#762a83", "marker": "D",
                     "label": "EDF admission, adaptive cost model"},
    "expire_only": {"color": "#b2182b", "marker": "s", "label": "admission off (expire only)"},
    "queue_timeout": {"color": "#2166ac", "marker": "^", "label": "queue timeout (Triton-style)"},
}


def subplots(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.8):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    return fig, axes.flat if nrows * ncols > 1 else axes[0][0]


def save(fig, path: str | os.PathLike, title: str | None = None, note: str | None = None) -> str:
    """Write the figure as PNG (parent folders created) and close it; returns the path."""
    if title:
        fig.suptitle(title, fontsize=11)
    if note:
        fig.text(0.01, 0.005, note, fontsize=7, color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def ecdf(ax, values, label: str, **kwargs) -> None:
    """Empirical CDF of values (any units) as a step line."""
    import numpy as np

    v = np.sort(np.asarray(values, dtype=float))
    if v.size == 0:
        return
    y = np.arange(1, v.size + 1) / v.size
    ax.step(v, y, where="post", label=label, **kwargs)
