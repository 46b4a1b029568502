"""FAB, the Fast Adaptive Boundary attack (IEEE-A7 transfer, minimal-norm L-inf or L2;
Croce and Hein 2020, "Minimally distorted adversarial examples with a fast adaptive boundary
attack"), crafted white-box on a local surrogate (or an ensemble, with the DI / TI / SI
boosters: ``whitebox.py``) and sent to the target afterwards.

Each iteration, per image, at the current point ``x_k`` (Algorithm 1 of the paper):

1. linearise the classifier: for every class ``j != y`` the hyperplane
   ``f_j(x_k) + grad f_j(x_k) . (z - x_k) = 0`` with ``f_j = Z_j - Z_y``, and pick the one
   closest in the attacked norm, ``|f_j| / ||grad f_j||_q`` (``q`` the dual norm). The
   targeted variant takes the hyperplane ``Z_t = Z_j`` between the target class ``t`` and
   its strongest rival ``j`` at ``x_k`` (the authors' FAB-T fixes the pair ``(y, t)`` and
   counts any misclassification as success; a targeted criterion needs ``t`` on top);
2. project both ``x_k`` and the original ``x`` onto that hyperplane *intersected with the
   box* [0, 1] (:func:`box_projection`: the exact minimal-norm solution, found from the sorted
   breakpoints of a piecewise-linear function; written for this module, not ported);
3. step to the biased combination ``x_{k+1} = proj_box((1 - a)(x_k + eta d_k) +
   a (x + eta d_x))``, ``a = min(||d_k|| / (||d_k|| + ||d_x||), alpha_max)``
   (extrapolation ``eta``);
4. when ``x_{k+1}`` is adversarial, record it and step back towards ``x``:
   ``x_{k+1} <- x + beta (x_{k+1} - x)``.

Restarts after the first run start from a random point at radius
``min(best norm so far, epsilon) / 2`` around ``x`` (the paper's scheme), drawn from the
call's seeded generator. ``epsilon`` (> 0) is also the bound (IEEE-A9): an adversarial beyond
it is not returned. The gradients of all classes are taken with one backward pass per class
(as the authors' code): the cost per iteration grows with the number of classes.

As the other optimisation attacks (``cw.py``), every iterate is judged after uint8 rounding
with the surrogate's plain logits; the smallest-norm such image is returned, else the clean
image. ``success`` None, ``queries`` 0. Registry entry: :data:`SPEC`. Domain code: no gRPC.
"""

from __future__ import annotations

import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import AttackContext, AttackResult, AttackSpec, check_batch, check_linf_epsilon
from .cw import Best, check_int, check_number
from .whitebox import BOOSTER_PARAMS, WhiteBox

#: The norm's default radius of random restarts when no epsilon and no adversarial yet
#: (torchattacks' / the authors' defaults for L-inf and L2).
DEFAULT_RADIUS = {"linf": 0.3, "l2": 1.0}


def box_projection(g: torch.Tensor, r: torch.Tensor, p: torch.Tensor,
                   norm: str) -> torch.Tensor:
    """The smallest ``d`` (in ``norm``: "linf" or "l2") with ``g . d = r`` and
    ``0 <= p + d <= 1``, row by row (``g``, ``p``: B x D; ``r``: B). Where the hyperplane
    cannot be reached inside the box, the box point furthest along ``g`` (towards it).

    With ``s = sign(r)`` and ``cap_i`` the room coordinate ``i`` has in direction
    ``s * sign(g_i)``, the optimum is ``d_i = s sign(g_i) min(t |g_i|, cap_i)`` (L2, Lagrange
    multiplier ``t``) or ``s sign(g_i) min(t, cap_i)`` (L-inf, radius ``t``): the reached
    value ``H(t) = sum |g_i| min(.)`` is piecewise linear and non-decreasing in ``t``, so the
    breakpoints are sorted, the segment where ``H`` crosses ``|r|`` found, and ``t`` solved on
    it exactly."""
    s = torch.sign(r).view(-1, 1)
    gs = g * s
    a = gs.abs()
    live = a > 0
    cap = torch.where(gs > 0, 1.0 - p, p).clamp_min(0.0)
    big = torch.finfo(g.dtype).max / 4
    if norm == "l2":
        bp = torch.where(live, cap / a.clamp_min(1e-30), torch.full_like(a, big))
        weight = a * a          # slope contributed while unsaturated
    else:
        bp = torch.where(live, cap, torch.full_like(a, big))
        weight = a
    contrib = torch.where(live, a * cap, torch.zeros_like(a))   # value once saturated
    order = torch.argsort(bp, dim=1)
    bps = bp.gather(1, order)
    sat = torch.cumsum(contrib.gather(1, order), dim=1)
    ws = weight.gather(1, order)
    # unsaturated slope after each breakpoint: a suffix sum (exactly 0 past the live coords)
    suffix = torch.flip(torch.cumsum(torch.flip(ws, (1,)), dim=1), (1,))
    slope = torch.nn.functional.pad(suffix[:, 1:], (0, 1))
    h = sat + torch.where(slope > 0, bps * slope, torch.zeros_like(slope))
    h = torch.cummax(h, dim=1).values
    target = r.abs().view(-1, 1)
    k = torch.searchsorted(h.contiguous(), target.contiguous()).clamp(max=g.shape[1] - 1)
    # on segment k the coordinates before k are saturated: solve sat + t * slope = |r|
    prev = (k - 1).clamp_min(0)
    sat_before = torch.where(k > 0, sat.gather(1, prev), torch.zeros_like(target))
    slope_before = torch.where(k > 0, slope.gather(1, prev), suffix[:, :1])
    t = (target - sat_before) / slope_before.clamp_min(1e-30)
    reachable = h[:, -1:] >= target
    last = torch.where(live, bp, torch.zeros_like(bp)).amax(dim=1, keepdim=True)
    t = torch.where(reachable, t, last).clamp_min(0.0)
    step = torch.minimum(t * a if norm == "l2" else t.expand_as(a), cap)
    d = torch.sign(gs) * step
    return torch.where(live & (s != 0), d, torch.zeros_like(d))


def _size(d: torch.Tensor, norm: str) -> torch.Tensor:
    flat = d.flatten(1)
    return flat.abs().amax(dim=1) if norm == "linf" else flat.norm(dim=1)


def _dual(g: torch.Tensor, norm: str) -> torch.Tensor:
    """||g||_q over the last dimension (q = 1 for L-inf, 2 for L2)."""
    return g.abs().sum(dim=-1) if norm == "linf" else g.norm(dim=-1)


def _hyperplanes(wb: WhiteBox, v: torch.Tensor, y: torch.Tensor,
                 norm: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The closest linearised boundary at ``v``: (``f``: B, ``grad f``: B x D, logits)."""
    n = v.shape[0]
    u = torch.arange(n)
    with torch.enable_grad():
        x = v.detach().requires_grad_(True)
        logits = wb.logits(x)
        if wb.target is not None:
            t = torch.full_like(y, wb.target)
            rival = logits.detach().clone()
            rival[u, t] = float("-inf")
            diff = logits[u, t] - logits[u, rival.argmax(dim=1)]
            (g,) = torch.autograd.grad(diff.sum(), x)
            return diff.detach(), g.flatten(1), logits.detach()
        k = logits.shape[1]
        grads = []
        for c in range(k):
            (gc,) = torch.autograd.grad(logits[:, c].sum(), x, retain_graph=c < k - 1)
            grads.append(gc.flatten(1))
    jac = torch.stack(grads, dim=1)                        # B x K x D
    lg = logits.detach()
    df = lg - lg[u, y].unsqueeze(1)
    dg = jac - jac[u, y].unsqueeze(1)
    dist = df.abs() / (_dual(dg, norm) + 1e-12)
    dist[u, y] = float("inf")
    closest = dist.argmin(dim=1)
    return df[u, closest], dg[u, closest], lg


def run(ctx: AttackContext) -> list[AttackResult]:
    """FAB on the context's surrogate(s); one result per image (see the module doc)."""
    p = ctx.params
    norm = str(p.get("norm", "linf"))
    if norm not in ("linf", "l2"):
        raise InvalidArgument("params.norm", f"must be linf or l2, got {norm!r}")
    steps = check_int(p, "steps", minimum=1)
    restarts = check_int(p, "restarts", minimum=1)
    alpha_max = check_number(p, "alpha_max", minimum=0.0, maximum=1.0)
    eta = check_number(p, "eta", minimum=1.0)
    beta = check_number(p, "beta", minimum=0.0, maximum=1.0)
    epsilon = check_number(p, "epsilon", minimum=0.0)
    images, _ = check_batch(ctx.images, ctx.labels)
    wb = WhiteBox.from_ctx(ctx)
    gen = ctx.torch_generator()
    results: list[AttackResult] = []
    with wb:
        for start, rows, xs, x, y, correct in wb.batches(images):
            best = Best(wb, xs, rows, norm=norm, bound=epsilon or None)
            n = len(xs)
            shape = x.shape
            x0 = x.flatten(1)
            with torch.inference_mode():
                best.update(x)                     # already adversarial: norm 0
            for restart in range(restarts):
                if restart == 0:
                    x1 = x0.clone()
                else:
                    found = torch.from_numpy(best.dist.copy()).float()
                    radius = torch.minimum(
                        torch.where(torch.isfinite(found), found,
                                    torch.full_like(found, DEFAULT_RADIUS[norm])),
                        torch.full_like(found, epsilon or float("inf"))).view(-1, 1)
                    if norm == "linf":
                        t = torch.rand(x0.shape, generator=gen) * 2 - 1
                        t = t / t.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
                    else:
                        t = torch.randn(x0.shape, generator=gen)
                        t = t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)
                    x1 = (x0 + 0.5 * radius * t).clamp(0.0, 1.0)
                for _ in range(steps):
                    f, g, _logits = _hyperplanes(wb, x1.view(shape), y, norm)
                    with torch.inference_mode():
                        r1 = -f
                        r0 = -f - ((x0 - x1) * g).sum(dim=1)
                        d = box_projection(torch.cat((g, g)), torch.cat((r1, r0)),
                                           torch.cat((x1, x0)), norm)
                        d1, d0 = d[:n], d[n:]
                        a1 = _size(d1, norm).clamp_min(1e-8)
                        a0 = _size(d0, norm).clamp_min(1e-8)
                        alpha = (a1 / (a1 + a0)).clamp(0.0, alpha_max).view(-1, 1)
                        x1 = ((x1 + eta * d1) * (1 - alpha) + (x0 + eta * d0) * alpha) \
                            .clamp(0.0, 1.0)
                        best.update(x1.view(shape))
                        is_adv = (wb.plain_logits(x1.view(shape)).argmax(dim=1) != y) \
                            if wb.target is None else \
                            (wb.plain_logits(x1.view(shape)).argmax(dim=1) == wb.target)
                        x1 = torch.where(is_adv.view(-1, 1), x0 + beta * (x1 - x0), x1)
                    x1 = x1.clone()
            results += best.results(start, correct)
    return results


SPEC = AttackSpec(
    check=check_linf_epsilon,
    id="fab", minimal_norm=True, kind="transfer", family="minimal-norm", norms=("linf", "l2"),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, targeted=True,
    description="Fast Adaptive Boundary attack (Croce and Hein 2020, L-inf or L2) on the local "
                "surrogate: projections onto the closest linearised boundary within the box, "
                "biased towards the original, backward steps, random restarts; the "
                "smallest-norm image adversarial on the surrogate after uint8 rounding, then "
                "sent to the target",
    params=(Param(name="norm", type="string", default="linf", choices=("linf", "l2"),
                  description="the norm minimised (and of epsilon)"),
            Param(name="steps", type="int", default=100, minimum=1, maximum=10000,
                  description="iterations per restart (the paper: 100)"),
            Param(name="restarts", type="int", default=1, minimum=1, maximum=100,
                  description="runs; the first from the image, the others from random points "
                              "(the paper: up to 100)"),
            Param(name="epsilon", type="float", default=0.0, minimum=0.0, maximum=1000.0,
                  description="bound in [0,1] scale (IEEE-A9; L-inf <= 1) and radius of the "
                              "restarts; 0 = unbounded (minimal norm)"),
            Param(name="alpha_max", type="float", default=0.1, minimum=0.0, maximum=1.0,
                  description="largest bias towards the original image (the paper: 0.1)"),
            Param(name="eta", type="float", default=1.05, minimum=1.0, maximum=2.0,
                  description="extrapolation past the boundary (the paper: 1.05)"),
            Param(name="beta", type="float", default=0.9, minimum=0.0, maximum=1.0,
                  description="backward step towards the original after a success (the "
                              "paper: 0.9)"),
            *BOOSTER_PARAMS),
    run=run)
