"""Plots: Gantt charts of timelines and bar charts of results (matplotlib, no display).

matplotlib is the optional extra ``plot`` (``pip install 'gradsched[plot]'``): it is
imported only here, only when a plot is drawn, so nothing else needs it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from gradsched.timeline import Timeline

COLORS = {"backward": "#4c72b0", "forward": "#55a868", "comm": "#dd8452", "select": "#8172b3",
          "update": "#937860", "other": "#bbbbbb", "wait": "#c44e52", "host": "#da8bc3"}


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        from gradsched.errors import GradschedError

        raise GradschedError("--plot draws with matplotlib, which is not installed: pip install 'gradsched[plot]' "
                             "(or drop --plot)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt(panels: Sequence[tuple[str, "Timeline"]], path: str | Path) -> None:
    """One horizontal lane per (rank, track); several timelines share one time axis."""
    plt = _pyplot()
    lanes = []
    for label, tl in panels:
        for rank, track in sorted({(e.rank, e.track) for e in tl.events}, key=lambda rt: (rt[0], rt[1] != "compute", rt[1])):
            lanes.append((label, tl, rank, track))
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(lanes) + 1.5))
    for y, (_label, tl, rank, track) in enumerate(lanes):
        spans = [e for e in tl.events if e.rank == rank and e.track == track]
        for cat in {e.cat for e in spans}:
            sel = [(e.start_s * 1e3, e.dur_s * 1e3) for e in spans if e.cat == cat]
            ax.broken_barh(sel, (y - 0.4, 0.8), facecolors=COLORS.get(cat, "#999999"), edgecolor="black",
                           linewidth=0.2, label=cat)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{label} r{rank} {track}".strip() for label, _, rank, track in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper right", fontsize="small")
    fig.tight_layout()
    _save(fig, path)


def bars(labels: Sequence[str], values: Sequence[float], path: str | Path, *, ylabel: str, title: str = "",
         reference: float | None = None) -> None:
    """A bar chart (e.g. iteration time per strategy), with an optional reference line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels) + 2), 4))
    ax.bar(range(len(labels)), values, color="#4c72b0")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if reference is not None:
        ax.axhline(reference, color="#c44e52", linestyle="--", label="lower bound")
        ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    _save(fig, path)


def _save(fig: Any, path: str | Path) -> None:
    """Write the figure in the format its name says (PNG without a suffix); a folder not writable or a
    full disk is one line naming the path."""
    import matplotlib.pyplot as plt

    from gradsched._files import write_text

    buf = io.BytesIO()  # matplotlib's PNG writer lets a failed write pass (a plot to /dev/full "succeeded")
    try:
        fig.savefig(buf, dpi=110, format=Path(path).suffix.lstrip(".").lower() or None)
    finally:
        plt.close(fig)
    write_text(path, buf.getvalue())
