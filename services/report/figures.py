"""The report's figures (IEEE-P4: a report people read): matplotlib charts drawn with the Agg
backend and embedded in ``report.html`` as ``data:image/svg+xml`` URIs, so the page stays
static and self-contained (no scripts, no network; the page's Content-Security-Policy allows
``data:`` images only).

Each function takes plain numbers the render module shaped from the report document and
returns a :class:`Chart` (the data URI, its alt text and its size in CSS pixels), or ``None``
when there is nothing to draw. What is drawn:

- :func:`corruption_overview`: every corruption's Robustness_Corr against severity
  (IEEE-M2, M7), one small panel each in one figure, worst mean first, with the 95 % Wilson
  band (IEEE-M8) and the clean accuracy (IEEE-M1) dashed.
- :func:`success_vs_queries`: each query attack's success rate within q queries (IEEE-M6),
  read from the proxy ledger's per-image counts.
- :func:`robustness_vs_epsilon`: Robustness_Adv (IEEE-M3) of one attack run at several
  epsilons, with its intervals.
- :func:`degradation_profile`: accuracy per level with its interval and the failure points
  (DEG-2..DEG-4).
- :func:`ndcg_curves`: NDCG@i of each setting's answers against the clean answers (RANK-1).
- :func:`transfer_heatmap`: a CANARY transfer heat map (CAN-7) with every value written in.
- :func:`irt_abilities`: CAN-8 IRT abilities with their intervals.

Figures are deterministic: a fixed ``svg.hashsalt``, no date in the metadata, text kept as
text (``svg.fonttype: none``), so the same report renders byte-identical HTML. Drawing holds
one lock (matplotlib's rc settings are process-wide). Pure domain code (no gRPC).
"""

from __future__ import annotations

import base64
import io
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Chart", "corruption_overview", "degradation_profile", "irt_abilities",
           "ndcg_curves", "robustness_vs_epsilon", "success_vs_queries", "transfer_heatmap"]

#: Process-wide matplotlib settings used while a figure is drawn and saved.
_RC: Final[Any] = {
    "svg.hashsalt": "fortis-report",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"],
    "font.size": 9.0,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 8.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#8a94a3",
    "axes.grid": True,
    "grid.color": "#e3e8ef",
    "grid.linewidth": 0.8,
    "path.simplify": True,
}
_METADATA: Final = {"Date": None, "Creator": "Fortis report", "Format": None, "Type": None}

_BLUE: Final = "#1f5fa8"
_GREEN: Final = "#2e8540"
_RED: Final = "#b42318"
_GREY: Final = "#66707d"
#: Line colours for several series (matplotlib's tab10, colour-blind friendlier first).
_PALETTE: Final = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                   "#e377c2", "#17becf", "#7f7f7f", "#bcbd22", "#393b79", "#637939")
#: At most this many panels / lines / bars in one chart, so the page stays fast and legible.
MAX_PANELS: Final = 30
MAX_LINES: Final = 12
MAX_ROWS: Final = 40

_LOCK = threading.Lock()


@dataclass(frozen=True)
class Chart:
    """One embedded figure: ``src`` a ``data:image/svg+xml;base64`` URI, ``alt`` what it
    shows in words, ``width``/``height`` its natural size in CSS pixels."""

    src: str
    alt: str
    width: int
    height: int


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _t(text: Any, limit: int = 40) -> str:
    """Caller text as matplotlib draws it literally: ``$`` escaped (no mathtext, which
    would fail on a name such as ``$\\foo$``), long names cut with an ellipsis."""
    s = str(text)
    s = s if len(s) <= limit else s[:limit - 1] + "\u2026"
    return s.replace("$", r"\$")


def _pct(x: Any) -> str:
    return f"{100.0 * x:.1f}%" if _finite(x) else "n/a"


def _new_figure(width_in: float, height_in: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _encode(fig: Any, alt: str) -> Chart:
    """The figure as an SVG data URI (deterministic bytes)."""
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata=_METADATA)
    w, h = fig.get_size_inches()
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return Chart(src=f"data:image/svg+xml;base64,{data}", alt=alt, width=round(w * 96),
                 height=round(h * 96))


def _draw(width_in: float, height_in: float, alt: str, paint: Any) -> Chart:
    """Create a figure under the report's rc settings, let ``paint(fig)`` draw it, encode it."""
    import matplotlib

    with _LOCK, matplotlib.rc_context(_RC):
        fig = _new_figure(width_in, height_in)
        paint(fig)
        return _encode(fig, alt)


def _percent_axis(ax: Any, axis: str = "y") -> None:
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MultipleLocator(0.25))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))


# --------------------------------------------------------------------------------------------
# corruptions
# --------------------------------------------------------------------------------------------

#: One corruption: (name, mean robustness, [(severity, robustness, ci_low, ci_high), ...]).
CorruptionSeries = tuple[str, Any, Sequence[tuple[int, Any, Any, Any]]]


def corruption_overview(series: Sequence[CorruptionSeries], accuracy: Any) -> Chart | None:
    """Every corruption's Robustness_Corr vs severity (IEEE-M2, M7) in one figure of small
    panels sharing their axes, in the order given (worst mean first), each with its 95 %
    Wilson band (IEEE-M8) and the clean accuracy (IEEE-M1) dashed."""
    drawn = [s for s in series if any(_finite(p[1]) for p in s[2])][:MAX_PANELS]
    if not drawn:
        return None
    ncols = min(5, len(drawn))
    nrows = math.ceil(len(drawn) / ncols)
    sevs = sorted({int(p[0]) for s in drawn for p in s[2]})

    def paint(fig: Any) -> None:
        axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
        for n, ax in enumerate(axes.flat):
            if n >= len(drawn):
                ax.set_visible(False)
                continue
            name, mean, points = drawn[n]
            pts = [p for p in points if _finite(p[1])]
            xs = [int(p[0]) for p in pts]
            band = [p for p in pts if _finite(p[2]) and _finite(p[3])]
            if band:
                ax.fill_between([int(p[0]) for p in band], [p[2] for p in band],
                                [p[3] for p in band], color=_BLUE, alpha=0.18, linewidth=0)
            ax.plot(xs, [p[1] for p in pts], color=_BLUE, marker="o", markersize=3.5,
                    linewidth=1.8)
            if _finite(accuracy):
                ax.axhline(accuracy, color=_GREEN, linestyle="--", linewidth=1.1)
            ax.set_title(f"{_t(name, 28)}  (mean {_pct(mean)})", loc="left")
            ax.set_ylim(0, 1.02)
            ax.set_xlim(sevs[0] - 0.35, sevs[-1] + 0.35)
            ax.set_xticks(sevs)
            _percent_axis(ax)
            if n % ncols == 0:
                ax.set_ylabel("robustness")
            if n >= len(drawn) - ncols:
                ax.set_xlabel("severity")
                ax.tick_params(labelbottom=True)

    worst = drawn[0]
    alt = (f"Robustness against severity for {len(drawn)} corruption(s), worst first; worst: "
           f"{worst[0]} (mean {_pct(worst[1])}). Shaded: 95% confidence interval; dashed: clean "
           f"accuracy {_pct(accuracy)}.")
    return _draw(2.55 * ncols, 1.75 * nrows + 0.2, alt, paint)


# --------------------------------------------------------------------------------------------
# attacks
# --------------------------------------------------------------------------------------------

#: One query attack: (name, budget Q_m or None, [(queries, success rate), ...]).
QuerySeries = tuple[str, Any, Sequence[tuple[Any, Any]]]


def success_vs_queries(series: Sequence[QuerySeries]) -> Chart | None:
    """Each query attack's success rate within q queries (IEEE-M6), a step curve per attack
    from the proxy ledger's per-image counts, its budget Q_m marked."""
    drawn = [(n, b, [(float(q), float(r)) for q, r in pts if _finite(q) and _finite(r)])
             for n, b, pts in series][:MAX_LINES]
    drawn = [d for d in drawn if d[2]]
    if not drawn:
        return None

    def paint(fig: Any) -> None:
        ax = fig.subplots()
        for i, (name, budget, pts) in enumerate(drawn):
            colour = _PALETTE[i % len(_PALETTE)]
            xs = [0.0] + [q for q, _ in pts]
            ys = [0.0] + [r for _, r in pts]
            if _finite(budget) and budget > xs[-1]:
                xs.append(float(budget))
                ys.append(ys[-1])
            ax.step(xs, ys, where="post", color=colour, linewidth=1.8,
                    label=f"{_t(name)} (final {_pct(ys[-1])})")
            if _finite(budget):
                ax.axvline(float(budget), color=colour, linestyle=":", linewidth=1)
        ax.set_xlim(left=0)
        ax.set_ylim(0, 1.02)
        _percent_axis(ax)
        ax.set_xlabel("queries per image (dotted: budget Q_m)")
        ax.set_ylabel("attack success rate")
        ax.legend(loc="lower right", frameon=False)

    alt = ("Attack success rate against the number of queries per image for "
           + ", ".join(f"{n} (reaches {_pct(p[-1][1])})" for n, _, p in drawn) + ".")
    return _draw(6.2, 3.0, alt, paint)


#: One attack run at several epsilons: (attack id, norm, [(epsilon, robustness, lo, hi)]).
EpsilonSeries = tuple[str, Any, Sequence[tuple[Any, Any, Any, Any]]]


def robustness_vs_epsilon(series: Sequence[EpsilonSeries], accuracy: Any) -> Chart | None:
    """Robustness_Adv (IEEE-M3) against the attack's epsilon, one line per attack run at two
    epsilons or more, with 95 % interval bars (IEEE-M8); the clean accuracy dashed."""
    drawn = []
    for name, norm, pts in series[:MAX_LINES]:
        good = sorted((float(e), float(v), lo, hi) for e, v, lo, hi in pts
                      if _finite(e) and _finite(v))
        if len({e for e, *_ in good}) >= 2:
            drawn.append((name, norm, good))
    if not drawn:
        return None

    def paint(fig: Any) -> None:
        ax = fig.subplots()
        for i, (name, norm, pts) in enumerate(drawn):
            colour = _PALETTE[i % len(_PALETTE)]
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[max(0.0, y - lo) if _finite(lo) else 0.0 for (_, y, lo, _h) in pts],
                   [max(0.0, hi - y) if _finite(hi) else 0.0 for (_, y, _l, hi) in pts]]
            ax.errorbar(xs, ys, yerr=err, color=colour, marker="o", markersize=4,
                        linewidth=1.8, capsize=3, label=_t(name) + (f" ({_t(norm, 12)})" if norm else ""))
        if _finite(accuracy):
            ax.axhline(accuracy, color=_GREEN, linestyle="--", linewidth=1.1,
                       label=f"clean accuracy {_pct(accuracy)}")
        ax.set_ylim(0, 1.02)
        _percent_axis(ax)
        ax.set_xlabel("epsilon (perturbation bound)")
        ax.set_ylabel("Robustness_Adv")
        ax.legend(loc="best", frameon=False)

    alt = ("Robustness under attack against epsilon for " + ", ".join(
        f"{n} ({', '.join(f'{e:g}: {_pct(v)}' for e, v, *_ in p)})" for n, _, p in drawn) + ".")
    return _draw(6.2, 3.0, alt, paint)


# --------------------------------------------------------------------------------------------
# degradation, ranking
# --------------------------------------------------------------------------------------------


def degradation_profile(name: str, rows: Sequence[tuple[Any, Any, Any, Any, Any]],
                        failure_points: Sequence[tuple[float, Any]]) -> Chart | None:
    """One operator's profile (DEG-2, DEG-3): accuracy per level with its 95 % band and the
    mean probability of the true label; the failure points (DEG-4) as dotted thresholds with
    the first level below each marked."""
    pts = sorted((int(lv), float(a), lo, hi, p) for lv, a, lo, hi, p in rows
                 if _finite(lv) and _finite(a))
    if not pts:
        return None

    def paint(fig: Any) -> None:
        ax = fig.subplots()
        xs = [p[0] for p in pts]
        band = [p for p in pts if _finite(p[2]) and _finite(p[3])]
        if band:
            ax.fill_between([p[0] for p in band], [p[2] for p in band], [p[3] for p in band],
                            color=_BLUE, alpha=0.18, linewidth=0, label="95% CI")
        ax.plot(xs, [p[1] for p in pts], color=_BLUE, marker="o", markersize=3.5,
                linewidth=1.8, label="accuracy")
        probs = [(p[0], p[4]) for p in pts if _finite(p[4])]
        if probs:
            ax.plot([x for x, _ in probs], [y for _, y in probs], color=_GREY, linestyle="--",
                    linewidth=1.2, label="mean p(true label)")
        for threshold, level in failure_points:
            ax.axhline(threshold, color="#c9ced6", linestyle=":", linewidth=1)
            if _finite(level):
                ax.axvline(float(level), color=_RED, linestyle=":", linewidth=1.1)
                ax.annotate(f"below {_pct(threshold)} at level {int(level)}",
                            (float(level), threshold), xytext=(4, 4),
                            textcoords="offset points", color=_RED, fontsize=7.5)
        ax.set_ylim(0, 1.05)
        _percent_axis(ax)
        ax.set_xlabel("level (operator applied L times)")
        ax.set_ylabel("accuracy")
        ax.legend(loc="upper right", frameon=False)

    reached = [f"below {_pct(t)} at level {int(lv)}" for t, lv in failure_points if _finite(lv)]
    alt = (f"Degradation profile of {name}: accuracy from {_pct(pts[0][1])} at level "
           f"{pts[0][0]} to {_pct(pts[-1][1])} at level {pts[-1][0]}; failure points: "
           + ("; ".join(reached) if reached else "none reached") + ".")
    return _draw(6.2, 2.9, alt, paint)


def ndcg_curves(series: Sequence[tuple[str, Sequence[Any]]], total: int) -> Chart | None:
    """NDCG@i (RANK-1) of each setting's answers against the clean answers, i = 1..k, one
    line per setting (the ``series`` given: the caller picks the lowest ones when there are
    many; ``total`` says how many there were)."""
    drawn = [(n, [(i + 1, float(v)) for i, v in enumerate(vals) if _finite(v)])
             for n, vals in series[:MAX_LINES]]
    drawn = [d for d in drawn if d[1]]
    if not drawn:
        return None

    def paint(fig: Any) -> None:
        ax = fig.subplots()
        for i, (name, pts) in enumerate(drawn):
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=2.5,
                    linewidth=1.4, color=_PALETTE[i % len(_PALETTE)], label=_t(name))
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("i (top-i classes compared)")
        ax.set_ylabel("NDCG@i")
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)

    shown = f"the {len(drawn)} lowest of {total} settings" if total > len(drawn) else \
        f"{len(drawn)} setting(s)"
    alt = f"NDCG@i curves of {shown}: " + ", ".join(
        f"{n} (NDCG@1 {p[0][1]:.3f})" for n, p in drawn) + "."
    return _draw(7.4, 3.0, alt, paint)


# --------------------------------------------------------------------------------------------
# benchmark across models (CANARY)
# --------------------------------------------------------------------------------------------


def transfer_heatmap(attack: str, metric: str, rows: Sequence[str], cols: Sequence[str],
                     values: Sequence[Sequence[Any]]) -> Chart | None:
    """The CAN-7 transfer heat map of one attack: examples crafted on each row's model
    (its surrogate) and evaluated on each column's model, every value written in; not run =
    an empty cell."""
    rows, cols = list(rows)[:MAX_ROWS], list(cols)[:MAX_ROWS]
    if not rows or not cols:
        return None
    grid = [[float(v) if _finite(v) else math.nan
             for v in (list(values[i]) if i < len(values) else [])[:len(cols)]]
            + [math.nan] * max(0, len(cols) - len(values[i] if i < len(values) else []))
            for i in range(len(rows))]
    if all(math.isnan(v) for row in grid for v in row):
        return None

    def paint(fig: Any) -> None:
        import numpy as np

        ax = fig.subplots()
        ax.grid(False)
        arr = np.ma.masked_invalid(np.array(grid, dtype=float))
        im = ax.imshow(arr, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(cols)), [_t(c, 24) for c in cols], rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), [_t(r, 24) for r in rows])
        ax.set_xlabel("evaluated on")
        ax.set_ylabel("crafted on (surrogate of)")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                text = "—" if math.isnan(v) else f"{v:.2f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=8.5,
                        color="white" if not math.isnan(v) and v < 0.6 else "#1d2430")
        fig.colorbar(im, ax=ax, shrink=0.85, label=_t(metric, 16))
        ax.set_title(f"{_t(attack, 30)}: {_t(metric, 16)} by crafting and evaluated model",
                     loc="left")

    diag = [grid[i][i] for i in range(min(len(rows), len(cols))) if not math.isnan(grid[i][i])]
    alt = (f"Transfer heat map of {attack} ({metric}) over {len(rows)} crafting and "
           f"{len(cols)} evaluated models" + (f"; white-box diagonal from {min(diag):.2f} to "
                                             f"{max(diag):.2f}" if diag else "") + ".")
    side = 0.75 * max(len(cols), 2) + 2.4
    return _draw(min(side, 9.0), min(0.55 * max(len(rows), 2) + 1.6, 8.0), alt, paint)


def irt_abilities(rows: Sequence[tuple[str, Any, Any, Any]]) -> Chart | None:
    """CAN-8 abilities: each model's IRT ability theta as a dot with its interval (theta +-
    1.96 posterior SD where the fit gives one), best at the top."""
    pts = [(n, float(t), lo, hi) for n, t, lo, hi in rows if _finite(t)][:MAX_ROWS]
    if not pts:
        return None
    pts.sort(key=lambda p: p[1])

    def paint(fig: Any) -> None:
        ax = fig.subplots()
        ys = list(range(len(pts)))
        for y, (_, t, lo, hi) in zip(ys, pts, strict=True):
            if _finite(lo) and _finite(hi):
                ax.plot([lo, hi], [y, y], color=_BLUE, linewidth=2.2, alpha=0.45)
            ax.plot([t], [y], "o", color=_BLUE, markersize=6)
        ax.set_yticks(ys, [_t(p[0], 28) for p in pts])
        ax.set_xlabel("ability theta (higher = more robust)")
        ax.grid(axis="y", visible=False)

    alt = "IRT abilities (CAN-8), best first: " + ", ".join(
        f"{n} {t:.2f}" for n, t, *_ in reversed(pts)) + "."
    return _draw(6.2, 0.42 * len(pts) + 1.0, alt, paint)
