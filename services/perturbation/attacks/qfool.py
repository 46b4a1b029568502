"""qFool, decision-based, L2, untargeted and targeted (IEEE-A8, IEEE-A9, IEEE-M6; Liu,
Moosavi-Dezfooli, Frossard, "A Geometry-Inspired Decision-Based Attack", ICCV 2019).

qFool assumes the decision boundary has a low curvature around the data point, so the normal
estimated at one boundary point ``P`` serves along the way: at ``P`` it asks ``n_probes``
random perturbations ``eta_j`` of radius ``omega`` (Gaussian in the image space, or in a
low-frequency DCT subspace of side ``subspace_dim``: the paper's subspace variant), each
answered adversarial (``z_j = +1``) or not (-1); the normalised sum ``xi = sum z_j eta_j``
(accumulated over every estimate made at ``P``) is the normal. Untargeted: the boundary point
along ``xi`` from the original (a search and a bisection) is the new adversarial. Targeted
(the paper starts from an image of the target class): the point ``Q = P + delta xi`` lies
deeper in the target class and the boundary point along ``Q - x`` from the original is the new
adversarial. Estimates are added at the same ``P`` while they pay off: when the last estimate
moved the adversarial by less than ``rate`` (the paper's epsilon, 0.7) times the displacement
per query of the previous one, the current adversarial becomes the new ``P`` and the estimate
restarts there.

Parameters: ``n_probes = 100`` (the paper's per-estimate count), ``rate = 0.7``. The probe
radius: the paper uses a small fixed radius in its normalised input space (``omega_0 = 0.03``)
and rescales it from the fraction of adversarial probes; here ``omega`` starts at
``OMEGA * ||P - x||`` (at least ``0.5 sqrt(d) / 255``, so a probe survives uint8 rounding) and
grows by 1.5 when more than ``70 %`` of the probes are adversarial (the probes do not reach
across the boundary) and shrinks by 1.5 below ``30 %``. (The paper appeared at ICCV 2019;
IEEE Std 3129 lists it as qFool.)

Differences, all on purpose (shared conventions in ``_decision.py``): uniform-noise start
(the paper: Gaussian noise), then the batch's other images (each a counted query; the targeted
start), binary search to the boundary; points rounded to the uint8 image the target receives;
the probes used are the rounded ones sent; the search doubles its step from the current
distance and bisects between the last point that was not adversarial and the first that is;
the clean image is the first query; each image stops at its first success (L2 within
epsilon), at Q_m, or after ``MAX_STALLS`` iterations that send nothing (``iterations``).
Batched: every stage is one query call for all images still running.
"""

from __future__ import annotations

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param
from fortis.services.perturbation.criteria import (
    Criterion,
    Misclassification,
    TargetedMisclassification,
)

from ._decision import (
    INIT_TRIES,
    bisect,
    find_starts,
    line_search,
    low_frequency_noise,
    min_probe_radius,
    prepare,
    probe_normals,
    unit,
    unit_or_random,
)
from .base import (
    MAX_QUERIES,
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    DecisionQuery,
)

N_PROBES = 100          # probes per estimate (the paper's n)
RATE = 0.7              # keep estimating at P while the displacement per query keeps >= 70 %
OMEGA = 0.01            # initial probe radius relative to ||P - x||
OMEGA_GROWTH = 1.5      # probe radius adaptation factor
ADV_HIGH, ADV_LOW = 0.7, 0.3
TARGET_STEP = 1.0       # targeted: Q = P + TARGET_STEP * ||P - x|| * xi
SEARCH_RESERVE = 12     # queries kept back from the probes for the search and bisection
MAX_STALLS = 3          # iterations in a row that send nothing stop an image


def qfool_attack(query: DecisionQuery, images: np.ndarray, labels: np.ndarray, *,
                 epsilon: float, max_queries: int, rng: np.random.Generator,
                 criterion: Criterion | None = None, spent: np.ndarray | None = None,
                 n_probes: int = N_PROBES, rate: float = RATE, subspace_dim: int = 0,
                 init_tries: int = INIT_TRIES) -> list[AttackResult]:
    """Run qFool (L2) on a batch through a decision query; one :class:`AttackResult` per
    image, in order (IEEE-A8, IEEE-M6). A :class:`TargetedMisclassification` ``criterion``
    selects the targeted variant (the query must judge that criterion); ``subspace_dim`` > 0:
    probes in the lowest ``subspace_dim x subspace_dim`` DCT frequencies."""
    if int(n_probes) < 1:
        raise InvalidArgument("n_probes", f"must be >= 1, got {n_probes!r}")
    if not np.isfinite(rate) or not 0.0 < rate < 1.0:
        raise InvalidArgument("rate", f"must be in (0, 1), got {rate!r}")
    if int(subspace_dim) < 0:
        raise InvalidArgument("subspace_dim", f"must be >= 0, got {subspace_dim!r}")
    crit = criterion if criterion is not None else Misclassification()
    targeted = isinstance(crit, TargetedMisclassification)
    oracle, labels, active = prepare(query, images, labels, epsilon=epsilon, norm="l2",
                                     max_queries=max_queries, spent=spent)
    if not len(active):
        return oracle.results()
    shape = oracle.shape
    d = oracle.d
    delta_min = min_probe_radius(d)
    has, starts = find_starts(oracle, active, labels, crit, rng, init_tries)
    active, starts = active[has], starts[has]
    cur = oracle.xf.copy()
    cur[active] = bisect(oracle, active, oracle.xf[active], starts)
    anchor = cur.copy()
    acc = np.zeros((oracle.n, d))
    n_at = np.zeros(oracle.n, dtype=np.int64)
    prev_rate = np.full(oracle.n, np.nan)
    omega = np.zeros(oracle.n)
    dist = np.zeros(oracle.n)
    if len(active):
        dist[active] = oracle.distances(np.rint(cur[active] * 255.0), active)
        omega[active] = np.maximum(OMEGA * dist[active], delta_min)
    stalls = np.zeros(oracle.n, dtype=np.int64)

    def draw(m: int) -> np.ndarray:
        if subspace_dim:
            return unit(low_frequency_noise(rng, m, shape, (int(subspace_dim),) * 2))
        return unit(rng.standard_normal((m, *shape)))

    while True:
        run = oracle.running()
        if not len(run):
            break
        before = oracle.sent(run)
        counts = np.clip(oracle.remaining(run) - SEARCH_RESERVE, 1, int(n_probes))
        normal, frac = probe_normals(oracle, run, anchor[run], counts, omega[run], draw,
                                     baseline=False)
        acc[run] += normal * counts[:, None]
        n_at[run] += counts
        omega[run] = np.where(frac > ADV_HIGH, omega[run] * OMEGA_GROWTH,
                              np.where(frac < ADV_LOW, omega[run] / OMEGA_GROWTH, omega[run]))
        omega[run] = np.clip(omega[run], delta_min, np.maximum(dist[run], delta_min))
        moving = oracle.is_running(run)
        run, before = run[moving], before[moving]
        if not len(run):
            continue
        xi = unit_or_random(acc[run], rng)
        x = oracle.xf[run].reshape(len(run), -1)
        if targeted:
            q = anchor[run].reshape(len(run), -1) + (TARGET_STEP * dist[run])[:, None] * xi
            direction = unit_or_random(q - x, rng)
        else:
            direction = xi
        found, pts = line_search(oracle, run, direction.reshape(cur[run].shape), dist[run])
        new_dist = oracle.distances(np.rint(pts * 255.0), run)
        better = found & (new_dist < dist[run])
        cur[run[better]] = pts[better]
        dist[run[better]] = new_dist[better]
        # keep estimating at the anchor while it pays off, else restart from the new point
        moved = np.sqrt(np.sum((cur[run] - anchor[run]).reshape(len(run), -1) ** 2, axis=1))
        per_query = moved / np.maximum(n_at[run], 1)
        restart = np.isfinite(prev_rate[run]) & (per_query < rate * prev_rate[run])
        prev_rate[run] = per_query
        r = run[restart]
        anchor[r] = cur[r]
        acc[r] = 0.0
        n_at[r] = 0
        prev_rate[r] = np.nan
        omega[r] = np.maximum(OMEGA * dist[r], delta_min)
        stalls[run] = np.where(oracle.sent(run) > before, 0, stalls[run] + 1)
        oracle.stop(run[stalls[run] >= MAX_STALLS], STOP_ITERATIONS)
    return oracle.results()


def run(ctx: AttackContext) -> list[AttackResult]:
    p = ctx.params
    return qfool_attack(ctx.decision_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                        max_queries=p["max_queries"], rng=ctx.rng(), criterion=ctx.criterion,
                        spent=ctx.spent(), n_probes=p["n_probes"],
                        subspace_dim=p["subspace_dim"])


SPEC = AttackSpec(
    id="qfool", minimal_norm=True, kind="decision", family="decision-based", norms=("l2",),
    refs=("IEEE-A8", "IEEE-A9", "IEEE-M6"),
    description="qFool (Liu et al. 2019; L2, decision-based, minimal-norm): boundary normal "
                "estimated at one boundary point from many probes (low curvature), searched "
                "along from the original; success = the criterion holds within L2 <= epsilon",
    params=(Param(name="epsilon", type="float", minimum=0.0, maximum=1e4,
                  description="L2 bound in [0,1] pixel scale (IEEE-A9)"), MAX_QUERIES,
            Param(name="n_probes", type="int", default=N_PROBES, minimum=1, maximum=100_000,
                  description="probes per normal estimate"),
            Param(name="subspace_dim", type="int", default=0, minimum=0, maximum=4096,
                  description="probes in the lowest subspace_dim x subspace_dim DCT "
                              "frequencies (the paper's subspace variant); 0 = image space")),
    targeted=True, run=run)
