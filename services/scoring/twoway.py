"""Two-way "attack effectiveness - model robustness" evaluation (CANARY, seed 003, 3.2.2-3.2.4;
CAN-7, CAN-10).

Pure domain code (no gRPC), numpy only.

Data matrix (CAN-7, seed 003 3.2.2). K attacks run on M models, and every adversarial example
crafted on model i evaluated on every model j, give a K x M x M matrix ``values[k, i, j]`` of
one metric (MR by default). The diagonal ``values[k, i, i]`` is the white-box (red) block
Delta_KM; the off-diagonal entries are the transfer (grey) blocks. NaN marks a block that was
not run.

Two-way squeeze (seed 003 3.2.3). Squeezing Delta_KM along K (mean over attacks) gives one value
per model, which ranks the models' robustness; squeezing along M (mean over models) gives one
value per attack, which ranks the attacks' effectiveness. ``higher_is_more_effective`` says how
the metric reads: True for MR, TAS, AIAC, ARTC (a higher value = a stronger attack = a less
robust model), False for perturbation costs such as AED. Ranks are competition ranks, 1 = best
(most robust model, most effective attack); ``score`` is the squeezed value min-max normalised
over the ranked entries and oriented so that 1 = best.

Incomplete data (seed 003 3.2.3, Fig. 4b: "only need to exclude incomplete items to obtain a
quick ranking"). With ``complete_only`` (the default) the model ranking averages only over the
attacks that were run on *every* ranked model, and the attack ranking only over the models that
*every* ranked attack was run on, so that no entry is averaged over an easier or harder subset
than another. Entries with no data at all are not ranked (rank 0, value NaN). With
``complete_only=False`` every entry is averaged over whatever it has (NaN-aware means).

Transfer (seed 003 3.2.4). Per attack, the M x M block is the transfer heat map (rows: model the
examples were crafted on, columns: model they were evaluated on). Squeezing it along the test
models (off-diagonal mean per row) gives Delta_M^B, how well examples crafted on each model
transfer; along the crafting models (off-diagonal mean per column) Delta_M^T, how vulnerable each
model is to transferred examples; squeezing either again gives the attack's transferability.
Stacking Delta_M^T over the attacks and squeezing along K gives each model's transfer threat.

Fast mode (CAN-10). A stored baseline matrix (``DataMatrix.to_dict`` / ``from_dict``) is
extended by the new model's or attack's blocks only (:func:`add_model`, :func:`add_attack`) and
the ranks and scores are recomputed from the stored data (:func:`fast_rank_model`,
:func:`fast_rank_attack`): nothing of the baseline is re-run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

import numpy as np
from fortis.services.common.errors import FieldViolation, InvalidArgument

__all__ = [
    "DataMatrix",
    "FastRank",
    "HeatMap",
    "Ranking",
    "TransferSummary",
    "TwoWayResult",
    "add_attack",
    "add_model",
    "competition_ranks",
    "fast_rank_attack",
    "fast_rank_model",
    "heatmap_svg",
    "transfer_heatmap",
    "transfer_summary",
    "two_way",
]


# --------------------------------------------------------------------------------------------
# Data matrix
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DataMatrix:
    """The K x M x M data matrix Delta_{KM^2} of one metric (CAN-7).

    ``values[k, i, j]``: the metric of attack ``attacks[k]``'s examples crafted on
    ``models[i]`` and evaluated on ``models[j]``; NaN = not run. The array is copied and made
    read-only."""

    attacks: tuple[str, ...]
    models: tuple[str, ...]
    values: np.ndarray
    metric: str = "MR"
    higher_is_more_effective: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "attacks", tuple(str(a) for a in self.attacks))
        object.__setattr__(self, "models", tuple(str(m) for m in self.models))
        try:
            arr = np.array(self.values, dtype=np.float64, copy=True)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument("values", f"must be a numeric K x M x M array: {exc}") from exc
        k, m = len(self.attacks), len(self.models)
        v: list[FieldViolation] = []
        if arr.shape != (k, m, m):
            v.append(FieldViolation("values", f"shape {arr.shape}; expected (K, M, M) = "
                                              f"({k}, {m}, {m})"))
        elif np.isinf(arr).any():
            v.append(FieldViolation("values", "must be finite (NaN marks a block not run)"))
        for field_name, names in (("attacks", self.attacks), ("models", self.models)):
            if len(set(names)) != len(names):
                v.append(FieldViolation(field_name, "duplicate names"))
        if v:
            raise InvalidArgument.from_violations(v)
        arr.setflags(write=False)
        object.__setattr__(self, "values", arr)

    @property
    def white_box(self) -> np.ndarray:
        """Delta_KM: the K x M diagonal blocks (crafted and evaluated on the same model)."""
        return np.diagonal(self.values, axis1=1, axis2=2).copy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (NaN -> null) for storing a baseline (CAN-10)."""
        return {
            "metric": self.metric,
            "higher_is_more_effective": self.higher_is_more_effective,
            "attacks": list(self.attacks),
            "models": list(self.models),
            "values": [[[None if math.isnan(x) else float(x) for x in row] for row in block]
                       for block in self.values.tolist()],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DataMatrix:
        """Inverse of :meth:`to_dict`."""
        for key in ("attacks", "models", "values"):
            if key not in d:
                raise InvalidArgument(key, "missing from the stored data matrix")
        raw = [[[math.nan if x is None else x for x in row] for row in block]
               for block in d["values"]]
        k, m = len(d["attacks"]), len(d["models"])
        arr = np.array(raw, dtype=np.float64) if raw else np.zeros((0, m, m))
        if k and arr.shape != (k, m, m):
            raise InvalidArgument("values", f"shape {arr.shape}; expected ({k}, {m}, {m})")
        return cls(attacks=tuple(d["attacks"]), models=tuple(d["models"]),
                   values=arr.reshape(k, m, m), metric=str(d.get("metric", "MR")),
                   higher_is_more_effective=bool(d.get("higher_is_more_effective", True)))


# --------------------------------------------------------------------------------------------
# Rankings
# --------------------------------------------------------------------------------------------


def competition_ranks(values: np.ndarray, *, higher_is_better: bool) -> np.ndarray:
    """Competition ranks (1, 2, 2, 4), 1 = best; NaN entries get 0 (not ranked)."""
    v = np.asarray(values, dtype=np.float64)
    key = v if higher_is_better else -v
    ranks = np.zeros(v.shape[0], dtype=np.int64)
    ok = ~np.isnan(key)
    kv = key[ok]
    ranks[ok] = 1 + (kv[None, :] > kv[:, None]).sum(axis=1)
    return ranks


def _oriented_score(values: np.ndarray, higher_is_better: bool) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, np.nan)
    ok = ~np.isnan(v)
    if not ok.any():
        return out
    lo, hi = float(v[ok].min()), float(v[ok].max())
    if hi - lo <= 1e-12:
        out[ok] = 0.5
        return out
    z = (v[ok] - lo) / (hi - lo)
    out[ok] = z if higher_is_better else 1.0 - z
    return out


@dataclass(frozen=True, kw_only=True)
class Ranking:
    """One squeezed sequence with its ranking.

    ``value[e]``: the mean of entry ``names[e]``'s blocks (NaN = no data); ``n[e]``: how many
    blocks were averaged; ``score[e]`` in [0, 1], 1 = best; ``rank[e]``: 1 = best, 0 = not
    ranked. ``over``: the names averaged over (attacks for a model ranking, models for an attack
    ranking). ``higher_is_better`` says how ``value`` reads."""

    names: tuple[str, ...]
    value: np.ndarray
    n: np.ndarray
    score: np.ndarray
    rank: np.ndarray
    over: tuple[str, ...]
    higher_is_better: bool

    def of(self, name: str) -> dict[str, Any]:
        """The entry of one name as a JSON-able dict."""
        e = self.names.index(name)
        return {"value": _f(self.value[e]), "n": int(self.n[e]), "score": _f(self.score[e]),
                "rank": int(self.rank[e]) or None}

    def order(self) -> list[str]:
        """Ranked names, best first (unranked ones left out)."""
        idx = [e for e in np.argsort(self.rank, kind="stable") if self.rank[e] > 0]
        return [self.names[e] for e in idx]

    def to_dict(self) -> dict[str, Any]:
        return {"higher_is_better": self.higher_is_better, "over": list(self.over),
                "entries": {name: self.of(name) for name in self.names}}


def _f(x: float) -> float | None:
    return None if math.isnan(float(x)) else float(x)


def _ranking(names: Sequence[str], block: np.ndarray, over: Sequence[str],
             higher_is_better: bool) -> Ranking:
    """Squeeze ``block`` (entries x over) along axis 1 with a NaN-aware mean."""
    has = ~np.isnan(block)
    n = has.sum(axis=1)
    total = np.where(has, block, 0.0).sum(axis=1)
    value = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    return Ranking(names=tuple(names), value=value, n=n.astype(np.int64),
                   score=_oriented_score(value, higher_is_better),
                   rank=competition_ranks(value, higher_is_better=higher_is_better),
                   over=tuple(over), higher_is_better=higher_is_better)


@dataclass(frozen=True, kw_only=True)
class TwoWayResult:
    """CAN-7 two-way squeeze of Delta_KM.

    ``model_robustness``: per model, the mean over attacks (rank 1 = most robust);
    ``attack_effectiveness``: per attack, the mean over models (rank 1 = most effective)."""

    metric: str
    model_robustness: Ranking
    attack_effectiveness: Ranking
    complete_only: bool

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "complete_only": self.complete_only,
                "model_robustness": self.model_robustness.to_dict(),
                "attack_effectiveness": self.attack_effectiveness.to_dict()}


def two_way(data: DataMatrix, *, complete_only: bool = True) -> TwoWayResult:
    """The two-way squeeze of the white-box blocks Delta_KM (CAN-7; see the module docstring
    for ``complete_only``)."""
    wb = data.white_box                                    # K x M
    has = ~np.isnan(wb)
    effective = data.higher_is_more_effective
    if complete_only:
        rows_any = has.any(axis=1)                         # attacks with any data
        cols_any = has.any(axis=0)                         # models with any data
        # model ranking: attacks run on every model that has data
        att_ok = has[:, cols_any].all(axis=1) & rows_any if cols_any.any() else rows_any
        # attack ranking: models every attack with data was run on
        mod_ok = has[rows_any, :].all(axis=0) & cols_any if rows_any.any() else cols_any
        wb_m = np.where(att_ok[:, None], wb, np.nan)
        wb_k = np.where(mod_ok[None, :], wb, np.nan)
        over_m = tuple(a for a, ok in zip(data.attacks, att_ok, strict=True) if ok)
        over_k = tuple(m for m, ok in zip(data.models, mod_ok, strict=True) if ok)
    else:
        wb_m, wb_k = wb, wb
        over_m, over_k = data.attacks, data.models
    models = _ranking(data.models, wb_m.T, over_m, higher_is_better=not effective)
    attacks = _ranking(data.attacks, wb_k, over_k, higher_is_better=effective)
    return TwoWayResult(metric=data.metric, model_robustness=models,
                        attack_effectiveness=attacks, complete_only=complete_only)


# --------------------------------------------------------------------------------------------
# Transfer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TransferSummary:
    """Seed 003 3.2.4 squeezes of the off-diagonal (transfer) blocks.

    ``by_source[k, i]``: Delta_M^B of attack k, mean over test models j != i (how well examples
    crafted on model i transfer); ``by_target[k, j]``: Delta_M^T, mean over crafting models
    i != j (how vulnerable model j is to transferred examples); ``attack_transferability``:
    per attack, the mean of all its off-diagonal blocks (rank 1 = transfers best);
    ``model_transfer_robustness``: per model, ``by_target`` averaged over the attacks (rank 1 =
    least affected by transferred examples)."""

    attacks: tuple[str, ...]
    models: tuple[str, ...]
    by_source: np.ndarray
    by_target: np.ndarray
    attack_transferability: Ranking
    model_transfer_robustness: Ranking

    def to_dict(self) -> dict[str, Any]:
        def table(arr: np.ndarray) -> dict[str, dict[str, float | None]]:
            return {a: {m: _f(arr[k, i]) for i, m in enumerate(self.models)}
                    for k, a in enumerate(self.attacks)}
        return {"by_source": table(self.by_source), "by_target": table(self.by_target),
                "attack_transferability": self.attack_transferability.to_dict(),
                "model_transfer_robustness": self.model_transfer_robustness.to_dict()}


def _nanmean(arr: np.ndarray, axis: int) -> np.ndarray:
    has = ~np.isnan(arr)
    n = has.sum(axis=axis)
    total = np.where(has, arr, 0.0).sum(axis=axis)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def transfer_summary(data: DataMatrix) -> TransferSummary:
    """Delta_M^B, Delta_M^T and their squeezes for every attack (seed 003 3.2.4)."""
    k, m = len(data.attacks), len(data.models)
    off = data.values.copy()
    off[:, np.arange(m), np.arange(m)] = np.nan            # transfer blocks only
    by_source = _nanmean(off, axis=2)                      # K x M (crafted on i)
    by_target = _nanmean(off, axis=1)                      # K x M (evaluated on j)
    effective = data.higher_is_more_effective
    att = _ranking(data.attacks, off.reshape(k, m * m), data.models, higher_is_better=effective)
    mod = _ranking(data.models, by_target.T, data.attacks, higher_is_better=not effective)
    return TransferSummary(attacks=data.attacks, models=data.models, by_source=by_source,
                           by_target=by_target, attack_transferability=att,
                           model_transfer_robustness=mod)


@dataclass(frozen=True, kw_only=True)
class HeatMap:
    """The transfer heat map of one attack (CAN-7): ``values[i, j]`` = examples crafted on
    ``rows[i]`` evaluated on ``cols[j]``; ``svg``: a self-contained rendering (or None)."""

    attack: str
    metric: str
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    values: np.ndarray
    svg: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"attack": self.attack, "metric": self.metric, "rows": list(self.rows),
                "cols": list(self.cols),
                "values": [[_f(x) for x in row] for row in self.values.tolist()]}


def transfer_heatmap(data: DataMatrix, attack: str, *, render_svg: bool = True,
                     vmin: float | None = 0.0, vmax: float | None = 1.0) -> HeatMap:
    """The M x M transfer matrix of ``attack`` as data and (optionally) as an SVG heat map.
    ``vmin``/``vmax``: the colour scale (0..1 suits rates such as MR; None = the data's range)."""
    if attack not in data.attacks:
        raise InvalidArgument("attack", f"unknown attack {attack!r}; known: "
                                        f"{', '.join(data.attacks)}")
    mat = data.values[data.attacks.index(attack)].copy()
    svg = (heatmap_svg(mat, rows=data.models, cols=data.models,
                       title=f"{data.metric} transfer: {attack}", vmin=vmin, vmax=vmax)
           if render_svg else None)
    return HeatMap(attack=attack, metric=data.metric, rows=data.models, cols=data.models,
                   values=mat, svg=svg)


#: Sequential colour ramp (viridis anchors), low -> high.
_RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def _colour(t: float) -> str:
    t = min(max(t, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    rgb = [round(_RAMP[i][c] + f * (_RAMP[i + 1][c] - _RAMP[i][c])) for c in range(3)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def heatmap_svg(matrix: np.ndarray, *, rows: Sequence[str], cols: Sequence[str], title: str = "",
                vmin: float | None = None, vmax: float | None = None, decimals: int = 2,
                row_axis: str = "crafted on", col_axis: str = "evaluated on",
                cell: int = 44) -> str:
    """A self-contained SVG heat map (no scripts, fonts or external references): one coloured
    cell per entry with its value printed, NaN cells grey with "n/a", a colour bar, every text
    XML-escaped."""
    mat = np.asarray(matrix, dtype=np.float64)
    if mat.shape != (len(rows), len(cols)):
        raise InvalidArgument("matrix", f"shape {mat.shape} for {len(rows)} rows x "
                                        f"{len(cols)} columns")
    finite = mat[~np.isnan(mat)]
    lo = vmin if vmin is not None else (float(finite.min()) if finite.size else 0.0)
    hi = vmax if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    span = hi - lo if hi > lo else 1.0
    char = 7
    left = 24 + char * max([len(str(r)) for r in rows] + [4])
    top = 40 + char * max([len(str(c)) for c in cols] + [4])
    width = left + cell * len(cols) + 90
    height = top + cell * len(rows) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>",
           f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
           f'<text x="4" y="{top - 6}" fill="#444">{escape(row_axis)} \u2193</text>',
           f'<text x="{left}" y="32" fill="#444">{escape(col_axis)} \u2192</text>']
    for j, c in enumerate(cols):
        x = left + cell * j + cell // 2
        out.append(f'<text x="{x}" y="{top - 6}" transform="rotate(-60 {x} {top - 6})">'
                   f"{escape(str(c))}</text>")
    for i, r in enumerate(rows):
        y = top + cell * i
        out.append(f'<text x="{left - 6}" y="{y + cell // 2 + 4}" text-anchor="end">'
                   f"{escape(str(r))}</text>")
        for j, c in enumerate(cols):
            x = left + cell * j
            v = float(mat[i, j])
            tip = escape(f"{r} -> {c}: " + ("n/a" if math.isnan(v) else f"{v:.{decimals}f}"))
            if math.isnan(v):
                out.append(f'<g><title>{tip}</title><rect x="{x}" y="{y}" '
                           f'width="{cell}" height="{cell}" fill="#d9d9d9" stroke="#fff"/>'
                           f'<text x="{x + cell // 2}" y="{y + cell // 2 + 4}" '
                           f'text-anchor="middle" fill="#666">n/a</text></g>')
                continue
            t = (v - lo) / span
            ink = "#000" if t > 0.6 else "#fff"
            out.append(f'<g><title>{tip}</title><rect x="{x}" y="{y}" '
                       f'width="{cell}" height="{cell}" fill="{_colour(t)}" stroke="#fff"/>'
                       f'<text x="{x + cell // 2}" y="{y + cell // 2 + 4}" text-anchor="middle" '
                       f'fill="{ink}">{v:.{decimals}f}</text></g>')
    bx = left + cell * len(cols) + 20
    bh = cell * max(len(rows), 1)
    steps = 20
    for s in range(steps):
        out.append(f'<rect x="{bx}" y="{top + bh * s / steps:.1f}" width="14" '
                   f'height="{bh / steps + 0.5:.1f}" fill="{_colour(1 - s / (steps - 1))}"/>')
    out.append(f'<text x="{bx + 18}" y="{top + 10}">{hi:.{decimals}f}</text>')
    out.append(f'<text x="{bx + 18}" y="{top + bh}">{lo:.{decimals}f}</text>')
    out.append("</svg>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Fast mode (CAN-10)
# --------------------------------------------------------------------------------------------


def _as_array(x: Any, shape: tuple[int, ...], field_name: str) -> np.ndarray:
    try:
        arr = np.array(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(field_name, f"must be numeric: {exc}") from exc
    if arr.shape != shape:
        raise InvalidArgument(field_name, f"shape {arr.shape}; expected {shape}")
    return arr


def add_model(data: DataMatrix, name: str, *, white_box: Sequence[float] | np.ndarray,
              crafted_on_new: np.ndarray | None = None,
              evaluated_on_new: np.ndarray | None = None) -> DataMatrix:
    """The baseline extended by one model (CAN-10): ``white_box[k]`` = attack k crafted on and
    evaluated on the new model (NaN = not run); optionally ``crafted_on_new[k, j]`` (examples
    crafted on the new model, evaluated on baseline model j) and ``evaluated_on_new[k, i]``
    (crafted on baseline model i, evaluated on the new one). Blocks not given are NaN."""
    if name in data.models:
        raise InvalidArgument("name", f"model {name!r} is already in the baseline")
    k, m = len(data.attacks), len(data.models)
    vals = np.full((k, m + 1, m + 1), np.nan)
    vals[:, :m, :m] = data.values
    vals[:, m, m] = _as_array(white_box, (k,), "white_box")
    if crafted_on_new is not None:
        vals[:, m, :m] = _as_array(crafted_on_new, (k, m), "crafted_on_new")
    if evaluated_on_new is not None:
        vals[:, :m, m] = _as_array(evaluated_on_new, (k, m), "evaluated_on_new")
    return DataMatrix(attacks=data.attacks, models=(*data.models, name), values=vals,
                      metric=data.metric, higher_is_more_effective=data.higher_is_more_effective)


def add_attack(data: DataMatrix, name: str, *,
               values: np.ndarray | Sequence[float]) -> DataMatrix:
    """The baseline extended by one attack (CAN-10): ``values`` is its M x M block (crafted on
    i, evaluated on j) or just its M white-box values (transfer blocks NaN)."""
    if name in data.attacks:
        raise InvalidArgument("name", f"attack {name!r} is already in the baseline")
    m = len(data.models)
    arr = np.array(values, dtype=np.float64)
    if arr.shape == (m,):
        block = np.full((m, m), np.nan)
        block[np.arange(m), np.arange(m)] = arr
    else:
        block = _as_array(arr, (m, m), "values")
    return DataMatrix(attacks=(*data.attacks, name), models=data.models,
                      values=np.concatenate([data.values, block[None]], axis=0),
                      metric=data.metric, higher_is_more_effective=data.higher_is_more_effective)


@dataclass(frozen=True, kw_only=True)
class FastRank:
    """Fast-mode result (CAN-10): the extended matrix, its two-way squeeze and the new entry's
    place (``rank`` 1 = best, ``of`` = how many entries were ranked, ``score`` in [0, 1])."""

    name: str
    kind: str                      # "model" | "attack"
    rank: int | None
    of: int
    score: float | None
    value: float | None
    result: TwoWayResult
    data: DataMatrix

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "rank": self.rank, "of": self.of,
                "score": self.score, "value": self.value, "two_way": self.result.to_dict()}


def fast_rank_model(baseline: DataMatrix, name: str, *, white_box: Sequence[float] | np.ndarray,
                    crafted_on_new: np.ndarray | None = None,
                    evaluated_on_new: np.ndarray | None = None,
                    complete_only: bool = True) -> FastRank:
    """Rank a new model against a stored baseline without re-running it (CAN-10)."""
    data = add_model(baseline, name, white_box=white_box, crafted_on_new=crafted_on_new,
                     evaluated_on_new=evaluated_on_new)
    res = two_way(data, complete_only=complete_only)
    r = res.model_robustness
    e = r.of(name)
    return FastRank(name=name, kind="model", rank=e["rank"], of=int((r.rank > 0).sum()),
                    score=e["score"], value=e["value"], result=res, data=data)


def fast_rank_attack(baseline: DataMatrix, name: str, *, values: np.ndarray | Sequence[float],
                     complete_only: bool = True) -> FastRank:
    """Rank a new attack against a stored baseline without re-running it (CAN-10)."""
    data = add_attack(baseline, name, values=values)
    res = two_way(data, complete_only=complete_only)
    r = res.attack_effectiveness
    e = r.of(name)
    return FastRank(name=name, kind="attack", rank=e["rank"], of=int((r.rank > 0).sum()),
                    score=e["score"], value=e["value"], result=res, data=data)
