"""IRT scoring of models, attacks and defences (CANARY, seed 003, section 3.3; CAN-8).

Pure domain code (no gRPC), vectorised with numpy. Every random draw comes from the
``numpy.random.Generator`` passed in: same data + same seed -> the same scores, bit for bit.

Model (CAN-8). Three-parameter logistic item response function, subject i, item j::

    P_ij = c_j + (1 - c_j) / (1 + exp(-D a_j (theta_i - b_j))),   D = 1.702

with the paper's priors theta ~ N(0, 1), log a ~ N(0, 1) (a is log-normal), b ~ N(0, 1),
c ~ Beta(5, 17).

Responses. The paper's items are evaluation metrics, min-max normalised over the subjects to
[0, 1] (:func:`minmax_normalise`), and it takes "the final score as the probability expectation
of getting a full or zero score": the likelihood is the Bernoulli form with the score in the
exponent, ``p(X | Theta) = prod P^X (1 - P)^(1 - X)``, X in [0, 1]. So Fortis uses the
*continuous* normalised metric directly as the response (a fractional Bernoulli likelihood; a
0/1 response is the ordinary 3PL case) and does not binarise. Missing responses (NaN, e.g. a
metric not available for one subject) are left out of the likelihood.

Sampler (the paper's Algorithm 1, Metropolis-Hastings within Gibbs). One chain of length
``chain_length`` (L); at step k:

1. every subject proposes theta'_i ~ N(theta_i, C_theta^2) and accepts with probability
   min(1, p(X_i. | theta'_i, items) p(theta'_i) / p(X_i. | theta_i, items) p(theta_i)). The
   subjects are conditionally independent given the item parameters, so all N proposals are
   drawn and accepted in one vectorised block (exactly N separate MH steps);
2. every item proposes (a'_j, b'_j, c'_j) jointly with a'_j ~ N(a_j, C_a^2), b'_j ~ N(b_j,
   C_b^2), c'_j ~ N(c_j, C_c^2) (Algorithm 1 line 8) and accepts with the ratio of
   likelihood (given the *new* thetas) times the priors p(a) p(b) p(c); all m items in one block.
   A proposal with a <= 0 or c outside (0, 1) has prior density 0 and is rejected.

The proposals are symmetric random walks, so no Hastings correction is needed. After
discarding the first ``burn_in`` (M) steps, the estimates are the means of the chain (Algorithm 1
line 14), with the chain's standard deviations as posterior spreads. The paper gives no
numbers for C_theta, C_a, C_b, C_c, L or M: the defaults below (C_theta = 1, C_a = C_b = 0.3,
C_c = 0.03, L = 7000, M = 3000) are those of the widely used numpy MH-within-Gibbs 3PL sampler
that the paper's algorithm matches (that sampler draws c uniformly in +-0.03; Algorithm 1 says
normal, which is used here). With 20 items they give acceptance rates of about 40-50 %
(theta) and 58 % (items); both rates are reported so that a run can be checked.

Two layers (CAN-8, seed 003 section 3.3): first one IRT fit per metric category (model
capability, attack effect, attack cost, perturbation cost, ...) over that category's metrics,
giving one ability per subject and category; then the category abilities are min-max
normalised over the subjects and used as the items of a second fit, whose ability is the
overall score. The first layer keeps a category with many metrics from outweighing one with
few. :func:`two_layer_irt` returns both layers; ``score`` is the overall ability min-max
normalised to [0, 1] over the subjects (the scale of the paper's Table 9).

Bounded work: :func:`fit_3pl` and :func:`two_layer_irt` take ``should_stop`` (default: never)
and check it every few steps of the chain and between fits, so a caller that has gone (deadline
passed, call cancelled) stops the sampler within a few steps; the check raises DeadlineExceeded
or Cancelled (``stopping.raise_if_stopped``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.stopping import StopCheck, never, raise_if_stopped

__all__ = [
    "D_SCALE",
    "IRTConfig",
    "IRTFit",
    "Metric",
    "TwoLayerResult",
    "fit_3pl",
    "minmax_normalise",
    "rank_descending",
    "simulate_3pl",
    "three_pl",
    "two_layer_irt",
]

#: The logistic scaling constant: within 0.01 of the normal ogive (seed 003, section 3.3).
D_SCALE = 1.702
#: Prior of the guessing parameter c: Beta(alpha, beta) (seed 003).
C_PRIOR = (5.0, 17.0)
_P_EPS = 1e-10   # P is kept in [eps, 1 - eps] inside logarithms
#: The stop check runs at least every this many steps of the chain, and more often when one
#: step is costly (subjects x items large): about every _STOP_CELLS likelihood cells.
_STOP_EVERY = 32
_STOP_CELLS = 200_000


@dataclass(frozen=True, kw_only=True)
class IRTConfig:
    """Settings of the MH-within-Gibbs sampler (Algorithm 1). See the module docstring."""

    chain_length: int = 7000       # L
    burn_in: int = 3000            # M: steps discarded before averaging
    step_theta: float = 1.0        # C_theta
    step_a: float = 0.3            # C_a
    step_b: float = 0.3            # C_b
    step_c: float = 0.03           # C_c
    d: float = D_SCALE
    init_a: float = 1.0
    init_b: float = 0.0
    init_c: float = 0.2

    def __post_init__(self) -> None:
        v: list[FieldViolation] = []
        if self.chain_length < 1:
            v.append(FieldViolation("irt.chain_length", "must be >= 1"))
        if not 0 <= self.burn_in < self.chain_length:
            v.append(FieldViolation("irt.burn_in", "must be in [0, chain_length)"))
        for name in ("step_theta", "step_a", "step_b", "step_c", "d", "init_a"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                v.append(FieldViolation(f"irt.{name}", f"must be a positive number, got {value}"))
        if not 0.0 < self.init_c < 1.0:
            v.append(FieldViolation("irt.init_c", "must be in (0, 1)"))
        if v:
            raise InvalidArgument.from_violations(v)


@dataclass(frozen=True, kw_only=True)
class IRTFit:
    """Posterior means (and spreads) of one 3PL fit.

    ``theta``: ability per subject (higher = better); ``score``: ``theta`` min-max normalised
    over the subjects to [0, 1] (all 0.5 when every subject has the same ability);
    ``rank``: 1 = best ability (ties share the best rank). ``a``, ``b``, ``c``: discrimination,
    difficulty and guessing per item. ``acceptance_theta`` / ``acceptance_items``: the share
    of accepted proposals after burn-in.
    """

    theta: np.ndarray
    theta_sd: np.ndarray
    score: np.ndarray
    rank: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    a_sd: np.ndarray
    b_sd: np.ndarray
    c_sd: np.ndarray
    acceptance_theta: float
    acceptance_items: float
    config: IRTConfig

    def to_dict(self, subjects: Sequence[str] | None = None,
                items: Sequence[str] | None = None) -> dict[str, Any]:
        """JSON-able summary, keyed by subject / item names when given."""
        s = list(subjects) if subjects is not None else [str(i) for i in range(len(self.theta))]
        it = list(items) if items is not None else [str(j) for j in range(len(self.a))]
        return {
            "subjects": {name: {"theta": float(self.theta[i]), "theta_sd": float(self.theta_sd[i]),
                                "score": float(self.score[i]), "rank": int(self.rank[i])}
                         for i, name in enumerate(s)},
            "items": {name: {"a": float(self.a[j]), "b": float(self.b[j]), "c": float(self.c[j])}
                      for j, name in enumerate(it)},
            "acceptance": {"theta": self.acceptance_theta, "items": self.acceptance_items},
            "sampler": {"chain_length": self.config.chain_length, "burn_in": self.config.burn_in},
        }


# --------------------------------------------------------------------------------------------
# Model, simulation, normalisation
# --------------------------------------------------------------------------------------------


def three_pl(theta: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray,
             d: float = D_SCALE) -> np.ndarray:
    """P(theta; a, b, c) = c + (1 - c) / (1 + exp(-d a (theta - b))), broadcast subjects x items
    (``theta`` shape (N,), items shape (m,) -> (N, m)). CAN-8."""
    th = np.asarray(theta, dtype=np.float64)[:, None]
    z = d * np.asarray(a, dtype=np.float64)[None, :] * (th - np.asarray(b, dtype=np.float64)[None, :])
    cc = np.asarray(c, dtype=np.float64)[None, :]
    sig = 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))   # no overflow for large |z|
    return cc + (1.0 - cc) * sig


def simulate_3pl(theta: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                 rng: np.random.Generator, *, continuous: bool = False,
                 concentration: float = 20.0, d: float = D_SCALE) -> np.ndarray:
    """Responses drawn from the 3PL model: 0/1 Bernoulli(P) draws, or (``continuous``) scores
    in [0, 1] drawn from Beta(P * concentration, (1 - P) * concentration), whose mean is P (the
    paper's reading of a score as the expectation of a full mark). For tests and benchmarks."""
    p = three_pl(theta, a, b, c, d)
    if continuous:
        p = np.clip(p, 1e-6, 1 - 1e-6)
        return rng.beta(p * concentration, (1.0 - p) * concentration)
    return (rng.random(p.shape) < p).astype(np.float64)


def minmax_normalise(values: np.ndarray, higher_is_better: Sequence[bool] | None = None,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Min-max normalise each column (metric) of a subjects x metrics matrix to [0, 1] over the
    subjects (seed 003 section 3.3), oriented so that 1 is the best value: a column whose
    ``higher_is_better`` is False is flipped (1 - x). NaN entries stay NaN (missing).

    Returns ``(normalised, informative)``: a column whose non-missing values are all equal
    (max == min) carries no ranking information; it is filled with NaN and marked False in
    ``informative`` so that the IRT fit leaves it out."""
    x = np.array(values, dtype=np.float64, copy=True)
    if x.ndim != 2:
        raise InvalidArgument("values", f"must be a subjects x metrics matrix, got shape {x.shape}")
    if higher_is_better is not None and len(higher_is_better) != x.shape[1]:
        raise InvalidArgument("higher_is_better",
                              f"{len(higher_is_better)} flags for {x.shape[1]} metrics")
    if np.isinf(x).any():
        raise InvalidArgument("values", "must be finite (NaN marks a missing value)")
    out = np.full_like(x, np.nan)
    informative = np.zeros(x.shape[1], dtype=bool)
    for j in range(x.shape[1]):
        col = x[:, j]
        ok = ~np.isnan(col)
        if ok.sum() == 0:
            continue
        lo, hi = float(col[ok].min()), float(col[ok].max())
        if hi <= lo:
            continue
        informative[j] = True
        z = (col - lo) / (hi - lo)
        if higher_is_better is not None and not higher_is_better[j]:
            z = 1.0 - z
        out[:, j] = z
    return out, informative


def rank_descending(values: np.ndarray) -> np.ndarray:
    """Competition ranks, 1 = largest value; equal values share the best rank (1, 2, 2, 4).
    NaN values get rank 0 (not ranked)."""
    v = np.asarray(values, dtype=np.float64)
    ranks = np.zeros(v.shape[0], dtype=np.int64)
    ok = ~np.isnan(v)
    vals = v[ok]
    # rank = 1 + number of strictly larger values
    ranks[ok] = 1 + (vals[None, :] > vals[:, None]).sum(axis=1)
    return ranks


def _scale01(theta: np.ndarray) -> np.ndarray:
    lo, hi = float(np.min(theta)), float(np.max(theta))
    if hi - lo <= 1e-12:
        return np.full_like(theta, 0.5)
    return (theta - lo) / (hi - lo)


# --------------------------------------------------------------------------------------------
# Sampler (Algorithm 1)
# --------------------------------------------------------------------------------------------


def _loglik(x: np.ndarray, w: np.ndarray, theta: np.ndarray, a: np.ndarray, b: np.ndarray,
            c: np.ndarray, d: float) -> np.ndarray:
    """Element-wise fractional-Bernoulli log-likelihood x log P + (1 - x) log(1 - P), zero
    where the response is missing (``w`` = 0; ``x`` holds 0 there). Hot loop: plain float64
    arrays only, no conversions."""
    z = (d * a) * (theta[:, None] - b)
    np.clip(z, -60.0, 60.0, out=z)
    p = c + (1.0 - c) / (1.0 + np.exp(-z))
    np.clip(p, _P_EPS, 1.0 - _P_EPS, out=p)
    return w * (x * np.log(p) + (1.0 - x) * np.log1p(-p))


def _log_prior_items(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """log p(a) + log p(b) + log p(c) up to constants; -inf outside the support."""
    ok = (a > 0) & (c > 0) & (c < 1)
    la = np.log(np.where(ok, a, 1.0))
    cc = np.where(ok, c, 0.5)
    val = (-la - 0.5 * la * la                    # log-normal(0, 1) density of a
           - 0.5 * b * b                          # N(0, 1)
           + (C_PRIOR[0] - 1) * np.log(cc) + (C_PRIOR[1] - 1) * np.log1p(-cc))
    return np.where(ok, val, -np.inf)


def fit_3pl(responses: np.ndarray, rng: np.random.Generator,
            config: IRTConfig | None = None, *, should_stop: StopCheck = never) -> IRTFit:
    """Fit the 3PL model to a subjects x items matrix of responses in [0, 1] (NaN = missing)
    with the MH-within-Gibbs sampler of seed 003's Algorithm 1 (CAN-8). See the module
    docstring for the likelihood, the priors and the proposals. ``should_stop`` is checked
    every few steps, so the chain stops when its caller has gone."""
    cfg = config or IRTConfig()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    x = np.asarray(responses, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise InvalidArgument("responses", f"must be a non-empty subjects x items matrix, got "
                                           f"shape {x.shape}")
    miss = np.isnan(x)
    if np.isinf(x).any() or ((x[~miss] < 0) | (x[~miss] > 1)).any():
        raise InvalidArgument("responses", "must be in [0, 1] (NaN marks a missing response); "
                                           "normalise metrics with minmax_normalise first")
    n, m = x.shape
    w = (~miss).astype(np.float64)
    x = np.where(miss, 0.0, x)
    d = cfg.d

    theta = np.zeros(n)
    a = np.full(m, cfg.init_a)
    b = np.full(m, cfg.init_b)
    c = np.full(m, cfg.init_c)
    ll = _loglik(x, w, theta, a, b, c, d)            # current element-wise log-likelihood
    prior_items = _log_prior_items(a, b, c)

    kept = cfg.chain_length - cfg.burn_in
    sums = np.zeros(n + 3 * m)
    sq = np.zeros(n + 3 * m)
    acc_theta = 0
    acc_items = 0
    every = max(1, min(_STOP_EVERY, _STOP_CELLS // (n * m)))
    for k in range(cfg.chain_length):
        if k % every == 0:
            raise_if_stopped(should_stop, "the IRT sampler")
        # -- subjects: N independent MH steps in one block (Algorithm 1 lines 2-7)
        prop = theta + cfg.step_theta * rng.standard_normal(n)
        ll_prop = _loglik(x, w, prop, a, b, c, d)
        log_alpha = (ll_prop.sum(axis=1) - 0.5 * prop * prop) \
            - (ll.sum(axis=1) - 0.5 * theta * theta)
        take_t = np.log(rng.random(n)) < log_alpha       # u <= alpha, on the log scale
        theta = np.where(take_t, prop, theta)
        ll = np.where(take_t[:, None], ll_prop, ll)

        # -- items: m independent joint MH steps in one block (lines 8-13), given new thetas
        pa = a + cfg.step_a * rng.standard_normal(m)
        pb = b + cfg.step_b * rng.standard_normal(m)
        pc = c + cfg.step_c * rng.standard_normal(m)
        prior_prop = _log_prior_items(pa, pb, pc)
        valid = np.isfinite(prior_prop)
        # evaluate with stand-ins where the proposal is outside the support (rejected anyway)
        ll_prop = _loglik(x, w, theta, np.where(valid, pa, a), np.where(valid, pb, b),
                          np.where(valid, pc, c), d)
        log_alpha = np.where(valid, ll_prop.sum(axis=0) + np.where(valid, prior_prop, 0.0)
                             - ll.sum(axis=0) - prior_items, -np.inf)
        take_i = np.log(rng.random(m)) < log_alpha
        a, b, c = np.where(take_i, pa, a), np.where(take_i, pb, b), np.where(take_i, pc, c)
        prior_items = np.where(take_i, prior_prop, prior_items)
        ll = np.where(take_i[None, :], ll_prop, ll)

        if k >= cfg.burn_in:                              # line 14: average after burn-in
            state = np.concatenate((theta, a, b, c))
            sums += state
            sq += state * state
            acc_theta += int(np.count_nonzero(take_t))
            acc_items += int(np.count_nonzero(take_i))

    mean = sums / kept
    sd = np.sqrt(np.maximum(sq / kept - mean * mean, 0.0))
    th = mean[:n]
    return IRTFit(
        theta=th, theta_sd=sd[:n], score=_scale01(th), rank=rank_descending(th),
        a=mean[n:n + m], b=mean[n + m:n + 2 * m], c=mean[n + 2 * m:],
        a_sd=sd[n:n + m], b_sd=sd[n + m:n + 2 * m], c_sd=sd[n + 2 * m:],
        acceptance_theta=acc_theta / (kept * n), acceptance_items=acc_items / (kept * m),
        config=cfg)


# --------------------------------------------------------------------------------------------
# Two layers (per category, then overall)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One evaluation metric (an IRT item) with its value for every subject.

    ``values[i]`` belongs to subject i (NaN = not available); ``higher_is_better`` is from the
    subjects' point of view (MR is lower-is-better when the subjects are models, higher-is-
    better when they are attacks). ``category`` groups metrics for the first layer (CAN-8)."""

    name: str
    category: str
    values: Sequence[float]
    higher_is_better: bool


@dataclass(frozen=True, kw_only=True)
class TwoLayerResult:
    """Result of :func:`two_layer_irt`.

    ``layer1[category]`` is the fit over that category's metrics (items named in
    ``layer1_items[category]``); ``overall`` the second-layer fit over the categories (items
    named in ``layer2_items``), ``None`` when fewer than two categories were informative (the
    one category's ability is then the overall one). ``theta``/``score``/``rank``: the overall
    ability, the ability min-max normalised to [0, 1] and the rank (1 = best). ``dropped``:
    metrics left out because they do not vary over the subjects (or are all missing) and
    categories left out because none of their metrics varies."""

    subjects: tuple[str, ...]
    layer1: Mapping[str, IRTFit]
    layer1_items: Mapping[str, tuple[str, ...]]
    layer2_items: tuple[str, ...]
    overall: IRTFit | None
    theta: np.ndarray
    score: np.ndarray
    rank: np.ndarray
    dropped: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able tree: per subject the overall theta, score and rank, plus both layers."""
        fit = self.overall if self.overall is not None else (
            next(iter(self.layer1.values())) if len(self.layer1) == 1 else None)
        sd = fit.theta_sd if fit is not None else np.full(len(self.subjects), np.nan)

        def interval(i: int) -> list[float] | None:     # CAN-8: posterior mean +- 1.96 sd
            if not np.isfinite(sd[i]):
                return None
            return [float(self.theta[i] - 1.96 * sd[i]), float(self.theta[i] + 1.96 * sd[i])]

        return {
            "subjects": {s: {"theta": float(self.theta[i]), "score": float(self.score[i]),
                             "rank": int(self.rank[i]),
                             "theta_sd": float(sd[i]) if np.isfinite(sd[i]) else None,
                             "interval95": interval(i)} for i, s in enumerate(self.subjects)},
            "layer1": {cat: fit.to_dict(self.subjects, self.layer1_items[cat])
                       for cat, fit in self.layer1.items()},
            "layer2": (self.overall.to_dict(self.subjects, self.layer2_items)
                       if self.overall is not None else None),
            "dropped": list(self.dropped),
        }


def two_layer_irt(subjects: Sequence[str], metrics: Sequence[Metric],
                  rng: np.random.Generator, config: IRTConfig | None = None, *,
                  should_stop: StopCheck = never) -> TwoLayerResult:
    """Two-layer IRT scores (CAN-8; seed 003 section 3.3): per category, a 3PL fit over the
    category's min-max normalised metrics; then a 3PL fit over the categories' abilities, min-
    max normalised. The fits run in the order the categories first appear in ``metrics``, all
    drawing from ``rng``, so the same inputs and seed give the same scores. ``should_stop``
    is passed to every fit."""
    names = [str(s) for s in subjects]
    n = len(names)
    v: list[FieldViolation] = []
    if n < 2:
        v.append(FieldViolation("subjects", "at least two subjects are needed to normalise "
                                            "and rank"))
    if len(set(names)) != n:
        v.append(FieldViolation("subjects", "duplicate subject names"))
    if not metrics:
        v.append(FieldViolation("metrics", "at least one metric is needed"))
    seen: set[tuple[str, str]] = set()
    for idx, mt in enumerate(metrics):
        if len(mt.values) != n:
            v.append(FieldViolation(f"metrics[{idx}].values",
                                    f"{len(mt.values)} values for {n} subjects ({mt.name})"))
        key = (mt.category, mt.name)
        if key in seen:
            v.append(FieldViolation(f"metrics[{idx}].name",
                                    f"metric {mt.name!r} given twice in category {mt.category!r}"))
        seen.add(key)
    if v:
        raise InvalidArgument.from_violations(v)

    by_cat: dict[str, list[Metric]] = {}
    for mt in metrics:
        by_cat.setdefault(mt.category, []).append(mt)

    dropped: list[str] = []
    layer1: dict[str, IRTFit] = {}
    layer1_items: dict[str, tuple[str, ...]] = {}
    for cat, ms in by_cat.items():
        raw = np.array([[float(val) for val in mt.values] for mt in ms], dtype=np.float64).T
        norm, informative = minmax_normalise(raw, [mt.higher_is_better for mt in ms])
        dropped += [f"{cat}/{mt.name}" for mt, ok in zip(ms, informative, strict=True) if not ok]
        if not informative.any():
            dropped.append(cat)
            continue
        layer1[cat] = fit_3pl(norm[:, informative], rng, config, should_stop=should_stop)
        layer1_items[cat] = tuple(mt.name for mt, ok in zip(ms, informative, strict=True) if ok)

    overall: IRTFit | None = None
    layer2_items: tuple[str, ...] = ()
    if not layer1:
        theta = np.zeros(n)
    elif len(layer1) == 1:
        theta = next(iter(layer1.values())).theta.copy()
    else:
        stacked = np.stack([fit.theta for fit in layer1.values()], axis=1)
        norm2, informative2 = minmax_normalise(stacked)
        if not informative2.any():
            theta = np.zeros(n)
        else:
            overall = fit_3pl(norm2[:, informative2], rng, config, should_stop=should_stop)
            theta = overall.theta.copy()
            layer2_items = tuple(c for c, ok in zip(layer1, informative2, strict=True) if ok)
    return TwoLayerResult(subjects=tuple(names), layer1=layer1, layer1_items=layer1_items,
                          layer2_items=layer2_items, overall=overall, theta=theta,
                          score=_scale01(theta), rank=rank_descending(theta),
                          dropped=tuple(dropped))
