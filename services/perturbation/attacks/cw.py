"""Carlini & Wagner L2 (IEEE-A7 transfer, minimal-norm L2; Carlini and Wagner 2017, "Towards
evaluating the robustness of neural networks"), crafted white-box on a local surrogate (or an
ensemble, with the DI / TI / SI boosters: ``whitebox.py``) and sent to the target afterwards.

Per image it minimises ``||x' - x||_2^2 + c * f(x')`` over the change of variables
``x' = (tanh(w) + 1) / 2`` (the box [0, 1] without clipping) with Adam, where ``f`` is the
paper's margin loss on the logits ``Z``:

* untargeted: ``f(x') = max(Z_y - max_{j != y} Z_j, -kappa)``;
* targeted (``TargetedMisclassification``): ``f(x') = max(max_{j != t} Z_j - Z_t, -kappa)``;

``kappa`` (``confidence``) asks for a margin, which is what makes C&W transfer (the paper's
section on transferability uses kappa up to 40). The constant ``c`` is found per image by a
binary search (``binary_search_steps`` rounds, starting at ``initial_const``; x10 while no
upper bound is known), and each round can stop early when the loss no longer decreases
(``abort_early``, as the authors' code: checked every ``steps // 10`` iterations).

Success is judged as the target will receive the image (IEEE-A9): every iterate is rounded
to uint8, and the smallest-L2 rounded image whose *surrogate* margin is at most ``-kappa``
(plain logits, no boosters) is returned, else the clean image; the binary search also reads
success on the rounded images. ``success`` is None and ``queries`` 0: the
target judges the images later. Registry entry: :data:`SPEC`.

The helpers shared by the four optimisation attacks (``cw``, ``ead``, ``ddn``, ``fab``)
live here: :func:`margins` (the C&W margin), :class:`Best` (the smallest-norm adversarial
after uint8 rounding), :func:`check_number` (parameters when ``run`` is called unvalidated).
Domain code: no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import (
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    check_batch,
    make_result,
)
from .whitebox import BOOSTER_PARAMS, WhiteBox, quantise, to_tensor

__all__ = ["SPEC", "Best", "check_int", "check_number", "distances", "margins",
           "run", "update_consts"]



# --------------------------------------------------------------------------------------------
# Shared by the optimisation attacks
# --------------------------------------------------------------------------------------------


def check_number(params: Mapping[str, Any], name: str, *, minimum: float | None = None,
                 maximum: float | None = None, integer: bool = False,
                 strict_min: bool = False) -> float:
    """``params[name]`` as a finite number within bounds, else InvalidArgument naming
    ``params.<name>`` (the schema validator checks this first; ``run`` may be called with
    unvalidated parameters through the functional API)."""
    v = params.get(name)
    ok = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
    f = float(v) if ok and v is not None else float("nan")
    if not ok or not math.isfinite(f) or (integer and f != int(f)) \
            or (minimum is not None and (f <= minimum if strict_min else f < minimum)) \
            or (maximum is not None and f > maximum):
        lo = "" if minimum is None else (f" > {minimum:g}" if strict_min else f" >= {minimum:g}")
        hi = "" if maximum is None else f" <= {maximum:g}"
        kind = "an integer" if integer else "a finite number"
        raise InvalidArgument(f"params.{name}", f"must be {kind}{lo}{hi}, got {v!r}")
    return f


def check_int(params: Mapping[str, Any], name: str, *, minimum: int) -> int:
    """``params[name]`` as an integer >= ``minimum`` (:func:`check_number`)."""
    return int(check_number(params, name, minimum=minimum, integer=True))


def margins(logits: torch.Tensor, y: torch.Tensor, target: int | None) -> torch.Tensor:
    """The C&W margin per image, < 0 exactly when the criterion is met: ``Z_y - max_{j!=y} Z_j``
    (untargeted) or ``max_{j!=t} Z_j - Z_t`` (targeted on class ``target``)."""
    cls = y if target is None else torch.full_like(y, int(target))
    own = logits.gather(1, cls.view(-1, 1)).squeeze(1)
    others = logits.masked_fill(torch.nn.functional.one_hot(cls, logits.shape[1]).bool(),
                                float("-inf")).amax(dim=1)
    return own - others if target is None else others - own


def distances(adv: np.ndarray, x: np.ndarray, norm: str, beta: float = 0.0) -> np.ndarray:
    """Per image ``||adv - x||`` on uint8 images in [0, 1] scale: "l2", "linf", "l1", or the
    elastic net "en" (``beta * L1 + L2^2``, EAD's decision rule)."""
    d = (adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1) / 255.0
    if norm == "l2":
        return np.sqrt(np.sum(d * d, axis=1))
    if norm == "linf":
        return np.abs(d).max(axis=1, initial=0.0)
    if norm == "l1":
        return np.abs(d).sum(axis=1)
    return beta * np.abs(d).sum(axis=1) + np.sum(d * d, axis=1)


class Best:
    """The smallest-norm adversarial of each image of one chunk *as the target will receive
    it*: every candidate is rounded to uint8 and judged with the surrogate's plain logits
    (no boosters) under ``torch.inference_mode``; it counts when its margin is < 0 and at most
    ``-kappa``. Images never fooled keep the clean image."""

    def __init__(self, wb: WhiteBox, xs: np.ndarray, rows: np.ndarray, *, norm: str,
                 kappa: float = 0.0, beta: float = 0.0, bound: float | None = None) -> None:
        self.wb, self.xs, self.rows = wb, xs, rows
        self.norm, self.kappa, self.beta, self.bound = norm, float(kappa), float(beta), bound
        self.y = wb.labels[torch.from_numpy(rows)]
        self.adv = xs.copy()
        self.dist = np.full(len(xs), np.inf)
        #: Try rounding away from x where rounding to nearest loses the adversarial.
        self.outward = True

    def _adversarial(self, q: np.ndarray, local: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            m = margins(self.wb.plain_logits(to_tensor(q)), self.y[torch.from_numpy(local)],
                        self.wb.target).numpy()
        return (m < 0) & (m <= -self.kappa)

    @property
    def found(self) -> np.ndarray:
        return np.isfinite(self.dist)

    def update(self, cand: torch.Tensor, local: np.ndarray | None = None) -> np.ndarray:
        """Judge float candidates (N x C x H x W in [0, 1]) of the chunk's images ``local``
        (None: all, in order); keep the better ones; return which candidates are adversarial
        after rounding."""
        local = np.arange(len(self.xs)) if local is None else np.asarray(local)
        if len(local) == 0:
            return np.zeros(0, dtype=bool)
        x = self.xs[local]
        q = quantise(cand, x)
        ok = self._adversarial(q, local)
        if self.outward and not ok.all():
            # a candidate that rounding to nearest pulled back across the boundary: round its
            # clear moves (>= 1/4 level) away from x instead (a slightly larger perturbation)
            miss = np.flatnonzero(~ok)
            levels = cand[torch.from_numpy(miss)].detach().permute(0, 2, 3, 1).cpu().numpy() \
                .astype(np.float64) * 255.0
            d = levels - x[miss].astype(np.float64)
            out = np.sign(d) * np.ceil(np.abs(d) - 0.25)
            q2 = np.clip(x[miss].astype(np.float64) + out, 0, 255).astype(np.uint8)
            ok2 = self._adversarial(q2, local[miss])
            q[miss[ok2]] = q2[ok2]
            ok[miss[ok2]] = True
        d = distances(q, x, self.norm, self.beta)
        if self.bound is not None:
            ok &= d <= self.bound + 1e-12
        better = ok & (d < self.dist[local])
        self.dist[local[better]] = d[better]
        self.adv[local[better]] = q[better]
        return ok

    def results(self, start: int, correct: np.ndarray) -> list[AttackResult]:
        return [make_result(start + k, self.xs[k], self.adv[k], success=None, queries=0,
                            initially_correct=bool(correct[k]), stop_reason=STOP_ITERATIONS)
                for k in range(len(self.xs))]


def update_consts(const: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                  success: torch.Tensor) -> None:
    """The C&W binary search on ``c`` (in place): success lowers the upper bound, failure
    raises the lower one; bisect once both are known, else x10."""
    upper.copy_(torch.where(success, torch.minimum(upper, const), upper))
    lower.copy_(torch.where(success, lower, torch.maximum(lower, const)))
    known = upper < 1e10
    const.copy_(torch.where(known, (lower + upper) / 2, const * 10))


# --------------------------------------------------------------------------------------------
# C&W L2
# --------------------------------------------------------------------------------------------


def _to_w(x: torch.Tensor) -> torch.Tensor:
    """Inverse of ``(tanh(w) + 1) / 2`` (kept off +-1 so atanh is finite)."""
    return torch.atanh((2.0 * x - 1.0).clamp(-1 + 1e-6, 1 - 1e-6))


def _from_w(w: torch.Tensor) -> torch.Tensor:
    return (torch.tanh(w) + 1.0) / 2.0


def run(ctx: AttackContext) -> list[AttackResult]:
    """C&W L2 on the context's surrogate(s); one result per image (see the module doc)."""
    p = ctx.params
    steps = check_int(p, "steps", minimum=1)
    search = check_int(p, "binary_search_steps", minimum=1)
    c0 = check_number(p, "initial_const", minimum=0.0, strict_min=True)
    lr = check_number(p, "learning_rate", minimum=0.0, strict_min=True)
    kappa = check_number(p, "confidence", minimum=0.0)
    abort_early = bool(p.get("abort_early", True))
    images, _ = check_batch(ctx.images, ctx.labels)
    wb = WhiteBox.from_ctx(ctx)
    results: list[AttackResult] = []
    with wb:
        for start, rows, xs, x, y, correct in wb.batches(images):
            best = Best(wb, xs, rows, norm="l2", kappa=kappa)
            n = len(xs)
            const = torch.full((n,), c0, dtype=torch.float32)
            lower = torch.zeros(n)
            upper = torch.full((n,), 1e10)
            w0 = _to_w(x)
            for outer in range(search):
                if search >= 10 and outer == search - 1:
                    const = torch.minimum(upper, torch.full_like(upper, 1e10))
                w = w0.clone().requires_grad_(True)
                opt = torch.optim.Adam([w], lr=lr)
                success = np.zeros(n, dtype=bool)
                previous = math.inf
                check_every = max(steps // 10, 1)
                for step in range(steps):
                    with torch.enable_grad():
                        adv = _from_w(w)
                        l2sq = (adv - x).flatten(1).pow(2).sum(dim=1)
                        f = margins(wb.logits(adv), y, wb.target).clamp_min(-kappa)
                        loss = (l2sq + const * f).sum()
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                    with torch.inference_mode():
                        success |= best.update(adv.detach())
                    opt.step()
                    if abort_early and (step + 1) % check_every == 0:
                        value = float(loss.detach())
                        if value > previous * 0.9999:
                            break
                        previous = value
                with torch.inference_mode():
                    success |= best.update(_from_w(w.detach()))
                update_consts(const, lower, upper, torch.from_numpy(success))
            results += best.results(start, correct)
    return results


SPEC = AttackSpec(
    id="cw_l2", minimal_norm=True, kind="transfer", family="optimisation", norms=("l2",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    description="Carlini & Wagner L2 (2017) on the local surrogate: tanh change of variables, "
                "Adam, binary search over c, confidence kappa; the smallest-L2 image "
                "adversarial on the surrogate after uint8 rounding, then sent to the target",
    params=(Param(name="steps", type="int", default=1000, minimum=1, maximum=10000,
                  description="Adam iterations per binary-search round (the paper: up to "
                              "10000, with early abort)"),
            Param(name="binary_search_steps", type="int", default=9, minimum=1, maximum=20,
                  description="rounds of the binary search over the constant c (the paper: 9)"),
            Param(name="initial_const", type="float", default=1e-3, minimum=1e-8,
                  maximum=1e6, description="the first c (the paper: 1e-3)"),
            Param(name="learning_rate", type="float", default=1e-2, minimum=1e-6, maximum=10.0,
                  description="Adam step size in tanh space (the paper: 1e-2)"),
            Param(name="confidence", type="float", default=0.0, minimum=0.0, maximum=1000.0,
                  description="kappa: the logit margin an adversarial must reach (higher "
                              "transfers better; the paper uses 0-40)"),
            Param(name="abort_early", type="bool", default=True,
                  description="stop a round when the loss stops decreasing (checked every "
                              "steps/10 iterations)"),
            *BOOSTER_PARAMS),
    run=run)
