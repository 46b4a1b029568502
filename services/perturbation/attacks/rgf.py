"""RGF and P-RGF, score-based, L2 and L-inf, untargeted and targeted (IEEE-A8, IEEE-A9,
IEEE-M6; Cheng, Dong, Pang, Su & Zhu, "Improving Black-box Adversarial Attacks with a
Transfer-based Prior", NeurIPS 2019).

Per iteration and image (the paper's Algorithm 1; the authors' ``Prior-Guided-RGF``): the loss
``f`` at the iterate is asked once, then ``q`` probes ``x + sigma * u_i`` with unit directions
``u_i``; the estimate is ``g = sum_i (f(x + sigma u_i) - f(x)) / sigma * u_i`` and the step is
``x - lr * g / ||g||_2`` (L2) or ``x - lr * sign(g)`` (L-inf), projected onto the ball and
``[0, 1]``.

* **RGF**: ``u_i`` uniform on the unit sphere, orthogonalised (Gram-Schmidt, as the authors).
* **P-RGF**: ``v`` = the normalised gradient of the surrogate's loss at the iterate (the
  transfer-based prior: ``ctx.surrogate.model``, a local classifier the tester holds;
  ``SPEC_PRIOR.uses_surrogate``). Its cosine with the true gradient, ``alpha``, is estimated
  with queries: ``v^T grad f`` by one probe along ``v`` and ``||grad f||`` by ``S`` probes
  along random unit directions (``||grad f||^2 ~ D/S sum_s (u_s^T grad f)^2``); then the
  paper's optimal ``lambda`` (its eq. 12, ``D`` the dimension, ``q`` the samples):
  ``lambda = 0`` when ``alpha^2 <= 1/(D+2q-2)``, ``1`` when ``alpha^2 >= (2q-1)/(D+2q-2)``,
  else ``(1-alpha^2)(alpha^2(D+2q-2)-1) / (2 alpha^2 D q - alpha^4 D (D+2q-2) - 1)``.
  ``lambda = 1``: ``g = v`` (no more queries); else ``u_i = sqrt(lambda) v + sqrt(1-lambda)
  xi_i`` with ``xi_i`` orthonormal and orthogonal to ``v``.
  The surrogate's loss is its logit margin for the criterion: untargeted ``z_y - max_{j!=y}
  z_j``, targeted ``max_{j!=t} z_j - z_t`` (minimised, like the target's margin).

The loss ``f`` is the criterion's margin (``ctx.margin_query()``, < 0 = success, minimised):
the authors use the C&W margin on logits.

Defaults (:data:`PAPER`): ``q`` = 50 samples, ``S`` = 10 norm samples (P-RGF), L2 lr 2.0,
L-inf lr 0.005. Deviations, on purpose:

* ``sigma``: the paper's 1e-4 ([0, 1] scale, L2 norm of the probe) is far below one uint8
  level: the probe's L2 radius here is ``max(sigma, MIN_PROBE_LEVELS * sqrt(D) / 255)`` (about
  one level per pixel), and the finite difference uses the probe *actually sent*: ``(f(p) -
  f(b)) s / ||s||^2`` with ``s = p - b`` after rounding and projection (``b`` the iterate as
  sent), i.e. the derivative along the direction the target saw.
* Every query is within the bound (probes projected onto the ball and ``[0, 255]``, rounded;
  L2 truncated towards ``x``), so every answer is a success check: an image stops at the call
  where one of its queries has margin < 0. The clean image is the first query (counted) and
  is the first iteration's ``f(x)``; each later iteration asks its iterate once. Q_m is a hard
  cap: an iteration runs with the probes that fit (at least one).
* The iterate is kept in float levels; what is sent and returned is uint8.
* P-RGF without a surrogate is refused (``InvalidArgument``); classification criteria only
  (the prior is a classifier's gradient). The surrogate takes the images as they are
  (``check_surrogate_input``); it is only differentiated, never queried through the proxy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from ._zo import (
    EPSILON_L2,
    ZoNorm,
    ZoSearch,
    check_count,
    check_positive,
    chunks,
    expand,
    l2_norms,
)
from .base import (
    EPSILON_LINF,
    MAX_QUERIES,
    AttackContext,
    AttackResult,
    AttackSpec,
    MarginQuery,
    check_surrogate_input,
)

#: The authors' defaults (README / attack.py): samples 50, norm samples 10, lr per norm.
PAPER: dict[str, Any] = {"samples": 50, "norm_samples": 10, "sigma": 1e-4,
                         "learning_rate": {"l2": 2.0, "linf": 0.005}}
MIN_PROBE_LEVELS = 1.0     # a probe's root-mean-square change per pixel (levels), at least
MAX_ITERATIONS = 1_000_000  # loop cap (Q_m ends it first: every iteration asks >= 1 query)
SURROGATE_CHUNK = 64


def optimal_lambda(alpha: np.ndarray, d: int, q: int) -> np.ndarray:
    """The paper's optimal ``lambda`` (eq. 12) for estimated cosines ``alpha``."""
    a2 = np.clip(np.asarray(alpha, dtype=np.float64) ** 2, 0.0, 1.0)
    lo, hi = 1.0 / (d + 2 * q - 2), (2 * q - 1) / (d + 2 * q - 2)
    den = 2 * a2 * d * q - a2 ** 2 * d * (d + 2 * q - 2) - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        mid = (1 - a2) * (a2 * (d + 2 * q - 2) - 1) / den
    mid = np.clip(np.nan_to_num(mid, nan=0.0), 0.0, 1.0)
    return np.where(a2 <= lo, 0.0, np.where(a2 >= hi, 1.0, mid))


def surrogate_prior(model: torch.nn.Module, levels: np.ndarray, labels: np.ndarray,
                    target: int | None) -> np.ndarray:
    """Unit-norm gradient (per image, H x W x C, level space) of the surrogate's logit margin
    (untargeted ``z_y - max_{j!=y} z_j``; targeted ``max_{j!=t} z_j - z_t``) at float
    ``levels`` (rows x H x W x C in [0, 255]); zero where the gradient vanishes."""
    out = np.zeros(levels.shape, dtype=np.float32)
    for s in range(0, len(levels), SURROGATE_CHUNK):
        part = slice(s, s + SURROGATE_CHUNK)
        x = torch.from_numpy(np.ascontiguousarray(levels[part], dtype=np.float32) / 255.0)
        x = x.permute(0, 3, 1, 2).contiguous().requires_grad_(True)
        with torch.enable_grad():
            z = model(x)
            if z.ndim != 2:
                raise InvalidArgument("surrogate", f"model must return N x classes logits, "
                                                   f"got {tuple(z.shape)}")
            rows = torch.arange(z.shape[0])
            ref = torch.from_numpy(np.asarray(labels[part], dtype=np.int64)) if target is None \
                else torch.full((z.shape[0],), int(target), dtype=torch.int64)
            if int(ref.max()) >= z.shape[1]:
                raise InvalidArgument("surrogate", f"label {int(ref.max())} out of range for a "
                                                   f"{z.shape[1]}-class surrogate")
            other = z.clone()
            other[rows, ref] = -torch.inf
            m = z[rows, ref] - other.max(dim=1).values
            loss = (m if target is None else -m).sum()
            (grad,) = torch.autograd.grad(loss, x)
        out[part] = grad.permute(0, 2, 3, 1).numpy()
    n = l2_norms(out)
    return out / expand(np.where(n > 0, n, 1.0), out.ndim).astype(np.float32)


def rgf_attack(margin: MarginQuery, images: np.ndarray, labels: np.ndarray, *,
               epsilon: float, max_queries: int, rng: np.random.Generator,
               norm: ZoNorm = "l2", samples: int = 50, sigma: float = 1e-4,
               learning_rate: float | None = None, surrogate: torch.nn.Module | None = None,
               target: int | None = None, norm_samples: int = 10,
               spent: np.ndarray | None = None) -> list[AttackResult]:
    """RGF (``surrogate=None``) or P-RGF (a torch surrogate taking float NCHW in [0, 1],
    returning logits; ``target``: the targeted criterion's class, for its loss) on a batch;
    one :class:`AttackResult` per image, in order. ``sigma`` / ``learning_rate`` in [0, 1]
    pixel scale (L2 norms for L2; per pixel for the L-inf sign step)."""
    zs = ZoSearch(margin, images, labels, norm=norm, epsilon=epsilon,
                  max_queries=max_queries, spent=spent)
    q = check_count(samples, "samples")
    s_norm = check_count(norm_samples, "norm_samples")
    lr = check_positive(PAPER["learning_rate"][norm] if learning_rate is None
                        else learning_rate, "learning_rate") * 255.0
    sig = max(check_positive(sigma, "sigma") * 255.0, MIN_PROBE_LEVELS * math.sqrt(zs.d))
    if zs.n == 0:
        return []
    m0 = zs.start()
    adv = zs.x.copy()
    f_base = np.where(np.isnan(m0), np.inf, m0)     # f at the iterate as last sent
    base = zs.images.copy()                         # that iterate (uint8)
    for _ in range(MAX_ITERATIONS):
        active = zs.running()
        if not len(active):
            break
        for idx in chunks(active, q + s_norm + 2, zs.d):
            _iteration(zs, idx, adv, f_base, base, rng=rng, q=q, s_norm=s_norm, sig=sig, lr=lr,
                       surrogate=surrogate, target=target)
    zs.finish(zs.running())
    return zs.results()


def _unit(v: np.ndarray) -> np.ndarray:
    n = l2_norms(v)
    return v / expand(np.maximum(n, 1e-12), v.ndim).astype(np.float32)


def _probe(zs: ZoSearch, idx: np.ndarray, base: np.ndarray, adv: np.ndarray, u: np.ndarray,
           sig: float, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Ask ``counts[j]`` probes ``adv + sig * u[j, :counts[j]]`` for each image ``idx[j]``;
    (margins k x n, actual steps k x n x ..., valid mask k x n) or None (refused)."""
    k, n = u.shape[:2]
    valid = np.arange(n)[None, :] < counts[:, None]
    owners = np.repeat(idx, counts)
    sent = zs.feasible((adv[idx][:, None] + sig * u)[valid], owners)
    m = zs.ask(sent, owners)
    if m is None:
        return None
    mm = np.zeros((k, n))
    mm[valid] = m
    steps = np.zeros(u.shape, dtype=np.float32)
    steps[valid] = sent.astype(np.float32) - base[owners].astype(np.float32)
    return mm, steps, valid


def _derivs(mm: np.ndarray, steps: np.ndarray, valid: np.ndarray,
            f0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per probe the directional derivative along its actual unit step and that unit step."""
    k, n = mm.shape
    flat = steps.reshape(k * n, -1)
    norms = np.sqrt(np.einsum("ij,ij->i", flat, flat)).reshape(k, n)
    ok = valid & (norms > 0) & np.isfinite(f0)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(ok, (mm - f0[:, None]) / np.where(norms > 0, norms, 1.0), 0.0)
    unit = steps / np.where(norms > 0, norms, 1.0).reshape((k, n) + (1,) * (steps.ndim - 2))
    return d, unit


def _iteration(zs: ZoSearch, idx: np.ndarray, adv: np.ndarray, f_base: np.ndarray,
               base: np.ndarray, *, rng: np.random.Generator, q: int, s_norm: int,
               sig: float, lr: float, surrogate: torch.nn.Module | None,
               target: int | None) -> None:
    """One RGF / P-RGF iteration for images ``idx`` (the iterate's f is known: ``f_base``)."""
    k, shape, d = len(idx), zs.shape, zs.d
    room = zs.remaining(idx)
    g = np.zeros((k,) + shape, dtype=np.float32)
    lam = np.zeros(k)
    prior = None
    if surrogate is not None:
        prior = surrogate_prior(surrogate, adv[idx], zs.labels[idx], target)
        # alpha: one probe along v, s_norm along random unit directions (within the room)
        extra = np.minimum(1 + s_norm, room)
        u = np.concatenate([prior[:, None], _unit(rng.standard_normal(
            (k, s_norm) + shape, dtype=np.float32).reshape(k * s_norm, *shape)).reshape(
            (k, s_norm) + shape)], axis=1)
        got = _probe(zs, idx, base, adv, u, sig, extra)
        if got is None:
            return
        mm, steps, valid = got
        der, unit = _derivs(mm, steps, valid, f_base[idx])
        room = zs.remaining(idx)
        along = der[:, 0]
        # ||grad f||^2 ~ D / S * sum (u_s^T grad f)^2 on the random probes that were sent
        ns = np.maximum(valid[:, 1:].sum(axis=1), 1)
        gnorm = np.sqrt(d / ns * (der[:, 1:] ** 2).sum(axis=1))
        with np.errstate(invalid="ignore", divide="ignore"):
            alpha = np.where(gnorm > 0, np.abs(along) / gnorm, 0.0)
        has_prior = l2_norms(prior) > 0
        lam = np.where(has_prior, optimal_lambda(np.minimum(alpha, 1.0), d, q), 0.0)
        # lambda = 1: the prior itself, oriented by the measured derivative
        g = np.where(expand(lam >= 1.0, g.ndim), prior * expand(np.sign(along), g.ndim)
                     .astype(np.float32), g)
    need = np.where(lam >= 1.0, 0, np.minimum(q, room))
    live = np.array([not zs.done(int(i)) for i in idx], dtype=bool)
    need = np.where(live, need, 0)
    if need.any():
        xi = rng.standard_normal((k, q) + shape, dtype=np.float32).reshape(k, q, d)
        if prior is not None:
            v = prior.reshape(k, d)
            xi -= np.einsum("kq,kd->kqd", np.einsum("kqd,kd->kq", xi, v), v)
        # orthonormal directions (Gram-Schmidt by QR), as the authors
        basis = torch.linalg.qr(torch.from_numpy(np.ascontiguousarray(
            np.transpose(xi, (0, 2, 1)))))[0].numpy()                # k x d x min(d, q)
        dirs = np.zeros((k, q, d), dtype=np.float32)
        nb = basis.shape[2]
        dirs[:, :nb] = np.transpose(basis, (0, 2, 1))
        if nb < q:                                                   # q > d: plain draws
            dirs[:, nb:] = xi[:, nb:] / np.maximum(
                np.linalg.norm(xi[:, nb:], axis=2, keepdims=True), 1e-12)
        if prior is not None:
            dirs = (np.sqrt(lam)[:, None, None] * prior.reshape(k, 1, d)
                    + np.sqrt(1.0 - lam)[:, None, None] * dirs)
        u = dirs.reshape((k, q) + shape).astype(np.float32)
        got = _probe(zs, idx, base, adv, u, sig, need)
        if got is None:
            return
        mm, steps, valid = got
        der, unit = _derivs(mm, steps, valid, f_base[idx])
        est = np.einsum("kn,kn...->k...", der.astype(np.float32), unit)
        g = np.where(expand(need > 0, g.ndim), est, g)
    live = np.array([not zs.done(int(i)) for i in idx], dtype=bool) & (l2_norms(g) > 0)
    sel = idx[live]
    if not len(sel):
        return
    gs = g[live]
    if zs.norm == "linf":
        new = adv[sel] - lr * np.sign(gs)
    else:
        new = adv[sel] - (lr * gs / expand(np.maximum(l2_norms(gs), 1e-12), gs.ndim))
    adv[sel] = zs.project(new.astype(np.float32), sel)
    room = zs.remaining(sel)
    ok = room >= 1
    sel = sel[ok]
    if not len(sel):
        return
    sent = zs.feasible(adv[sel], sel)
    m = zs.ask(sent, sel)                         # f at the new iterate (a success check)
    if m is not None:
        f_base[sel] = m
        base[sel] = sent


def _run(norm: ZoNorm, prior: bool):
    def run(ctx: AttackContext) -> list[AttackResult]:
        p = ctx.params
        model = None
        target = None
        if prior:
            if ctx.surrogate is None:
                raise InvalidArgument("surrogate", "prgf (P-RGF) needs a surrogate model for its "
                                                   "transfer-based prior")
            check_surrogate_input(ctx.surrogate, ctx.images.shape[1:])
            model = ctx.surrogate.model
            if ctx.task != Task.CLASSIFICATION:
                raise InvalidArgument("criterion", "P-RGF's prior is a classifier's gradient: "
                                                   "classification criteria only")
            target = getattr(ctx.criterion, "target", None) if \
                getattr(ctx.criterion, "targeted", False) else None
        return rgf_attack(ctx.margin_query(), ctx.images, ctx.labels, epsilon=p["epsilon"],
                          max_queries=p["max_queries"], rng=ctx.rng(), norm=norm,
                          samples=p["samples"], sigma=p["sigma"],
                          learning_rate=p["learning_rate"], surrogate=model, target=target,
                          norm_samples=p.get("norm_samples", PAPER["norm_samples"]),
                          spent=ctx.spent())
    return run


def _params(norm: ZoNorm, prior: bool) -> tuple[Param, ...]:
    out: tuple[Param, ...] = (
        EPSILON_LINF if norm == "linf" else EPSILON_L2, MAX_QUERIES,
        Param(name="samples", type="int", default=PAPER["samples"], minimum=1, maximum=10_000,
              description="q: probes per gradient estimate"),
        Param(name="sigma", type="float", default=PAPER["sigma"], minimum=1e-8, maximum=1e3,
              description="probe L2 radius, [0,1] scale (raised to ~1 uint8 level per pixel)"),
        Param(name="learning_rate", type="float", default=PAPER["learning_rate"][norm],
              minimum=1e-6, maximum=1e4,
              description="step: its L2 norm (L2) or per pixel (L-inf sign step), [0,1] scale"),
    )
    if prior:
        out += (Param(name="norm_samples", type="int", default=PAPER["norm_samples"],
                      minimum=1, maximum=10_000,
                      description="S: probes estimating ||grad f|| for the optimal lambda"),)
    return out


_REFS = ("IEEE-A8", "IEEE-A9", "IEEE-M6")

SPEC = AttackSpec(
    id="rgf", kind="score", family="score-based", norms=("l2",), refs=_REFS,
    description="RGF (Cheng et al., NeurIPS 2019): random gradient-free estimate with "
                "orthogonal directions, normalised L2 steps; untargeted or targeted",
    params=_params("l2", False), targeted=True, run=_run("l2", False))

SPEC_LINF = AttackSpec(
    id="rgf_linf", kind="score", family="score-based", norms=("linf",), refs=_REFS,
    description="RGF (Cheng et al., NeurIPS 2019), L-inf sign steps; untargeted or targeted",
    params=_params("linf", False), targeted=True, run=_run("linf", False))

SPEC_PRIOR = AttackSpec(
    id="prgf", kind="score", family="score-based", norms=("l2",), refs=_REFS,
    description="P-RGF (Cheng et al., NeurIPS 2019): RGF biased towards a local surrogate's "
                "gradient with the optimal lambda estimated by queries, L2; untargeted or "
                "targeted; needs the plan's surrogate",
    params=_params("l2", True), targeted=True, uses_surrogate=True,
    tasks=(Task.CLASSIFICATION,), run=_run("l2", True))

SPEC_PRIOR_LINF = AttackSpec(
    id="prgf_linf", kind="score", family="score-based", norms=("linf",), refs=_REFS,
    description="P-RGF (Cheng et al., NeurIPS 2019), L-inf sign steps; untargeted or "
                "targeted; needs the plan's surrogate",
    params=_params("linf", True), targeted=True, uses_surrogate=True,
    tasks=(Task.CLASSIFICATION,), run=_run("linf", True))
