"""The white-box side of the transfer attacks (IEEE-A7): the surrogate model(s) an attack is
crafted on, seen as one differentiable objective, with the input-transformation boosters and
the model ensembles the standard lists as composable options of *every* gradient attack.

**Surrogates.** A surrogate (``ctx.surrogate``, and ``ctx.ensemble`` for more) has ``.model``
(a torch module: float32 N x C x H x W in [0, 1] -> logits over the *target's* labels: a
tenant's surrogate with its own label set is wrapped in its label mapping when it is loaded,
IEEE-P6), ``.input_spec`` (height, width, channels) and ``.name``. A surrogate of a detector
or a segmenter also has ``task`` ("detection" / "segmentation") and
``task_loss(x, references, criterion) -> per-image loss`` (suppress or relabel the object of
interest; lower the mIoU over the classes of interest), which the attack ascends.

**The objective.** :class:`WhiteBox` gives the batch's loss per image, oriented so that
*ascending* it is the attack's direction: cross-entropy on the true label (untargeted), minus
the cross-entropy on the target label (targeted, ``TargetedMisclassification``), or the task
loss. Attacks take gradients of :meth:`WhiteBox.loss` / :meth:`WhiteBox.logits` with autograd
(``torch.enable_grad``) and run everything else under ``torch.inference_mode``.

**Boosters** (:data:`BOOSTERS`, parameters :data:`BOOSTER_PARAMS`), applied inside
:meth:`WhiteBox.logits` so an attack composes with them without knowing:

* DI, diverse inputs (Xie et al. 2019): with probability ``di_prob`` per gradient step the
  input is shrunk to a random size in ``[di_resize * H, H)`` and zero-padded back to H x W at
  a random offset (the shrinking variant, as torchattacks' DI-FGSM with resize_rate < 1: a
  surrogate of fixed input size takes it).
* TI, translation invariance (Dong et al. 2019): the gradient reaching the input is convolved
  with a ``ti_kernel`` x ``ti_kernel`` Gaussian (nsig 3, as the paper's ``gkern``), through a
  gradient hook on the input.
* SI, scale invariance (Lin et al. 2020): the logits (so the gradient) are averaged over
  ``si_copies`` copies of the input scaled by ``1 / 2^i``.
* Ensembles (Liu et al. 2017; Dong et al. 2018): several surrogates' logits averaged
  (``ensemble_mode: logits``) or their losses averaged (``loss``).

NI (Nesterov look-ahead) and VMI (variance tuning) change the iteration, not the objective:
they are options of the momentum attack (``ifgsm.py``, :data:`MOMENTUM_PARAMS`).

Every random draw comes from the call's seeded generator (``ctx.torch_generator()``).
Domain code: no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import (
    STOP_ITERATIONS,
    AttackContext,
    AttackResult,
    check_surrogate_input,
    clip_to_linf,
    make_result,
)

__all__ = ["BOOSTERS", "BOOSTER_PARAMS", "CHUNK", "MOMENTUM_PARAMS", "Boosters", "WhiteBox",
           "chunks", "crafted", "gaussian_kernel", "quantise", "to_tensor"]

#: Images per forward/backward pass of a transfer attack (bounds memory on large batches).
CHUNK = 32

#: The input-transformation and ensemble boosters (``fortis attacks`` lists them): id ->
#: (paper, what it does, the parameters that switch it on).
BOOSTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "DI": ("Xie et al. 2019, Improving transferability with input diversity",
           "random resize-and-pad of the input at each gradient step", ("di_prob", "di_resize")),
    "TI": ("Dong et al. 2019, Evading defenses by translation-invariant attacks",
           "gradient smoothed with a Gaussian kernel", ("ti_kernel",)),
    "SI": ("Lin et al. 2020, Nesterov accelerated gradient and scale invariance",
           "gradient averaged over copies scaled by 1/2^i", ("si_copies",)),
    "NI": ("Lin et al. 2020, Nesterov accelerated gradient and scale invariance",
           "Nesterov look-ahead of the momentum (momentum attacks)", ("nesterov",)),
    "VMI": ("Wang and He 2021, Enhancing transferability through variance tuning",
            "gradient variance of sampled neighbours added to the momentum (momentum attacks)",
            ("vmi_samples", "vmi_beta")),
    "ensemble": ("Liu et al. 2017; Dong et al. 2018 (ensemble in logits)",
                 "several surrogates: the plan's surrogate list, logits or losses averaged",
                 ("ensemble_mode",)),
}

#: Parameters of the boosters every gradient attack takes (defaults: off).
BOOSTER_PARAMS: tuple[Param, ...] = (
    Param(name="di_prob", type="float", default=0.0, minimum=0.0, maximum=1.0,
          description="DI booster: probability of a random resize-and-pad per gradient step "
                      "(0 = off; the paper uses 0.5)"),
    Param(name="di_resize", type="float", default=0.9, minimum=0.5, maximum=1.0,
          description="DI booster: the input is shrunk to a random size in "
                      "[di_resize*H, H) and padded back"),
    Param(name="ti_kernel", type="int", default=0, minimum=0, maximum=31,
          description="TI booster: side of the Gaussian kernel smoothing the gradient, odd "
                      "(0 = off; the paper uses 15 on 299 px images)"),
    Param(name="si_copies", type="int", default=1, minimum=1, maximum=8,
          description="SI booster: gradient averaged over this many copies scaled by 1/2^i "
                      "(1 = off; the paper uses 5)"),
    Param(name="ensemble_mode", type="string", default="logits", choices=("logits", "loss"),
          description="with several surrogates: average their logits or their losses"),
)

#: Parameters of the momentum iteration (MI-FGSM and its NI / VMI boosters).
MOMENTUM_PARAMS: tuple[Param, ...] = (
    Param(name="decay", type="float", default=1.0, minimum=0.0, maximum=10.0,
          description="momentum decay mu (MI-FGSM; the paper uses 1.0)"),
    Param(name="nesterov", type="bool", default=False,
          description="NI booster: take the gradient at the Nesterov look-ahead point"),
    Param(name="vmi_samples", type="int", default=0, minimum=0, maximum=64,
          description="VMI booster: neighbours sampled per step for variance tuning "
                      "(0 = off; the paper uses 20)"),
    Param(name="vmi_beta", type="float", default=1.5, minimum=0.0, maximum=10.0,
          description="VMI booster: neighbourhood radius as a multiple of epsilon"),
)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 N x H x W x C -> float32 N x C x H x W in [0, 1]."""
    t = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32) / 255.0
    return t.permute(0, 3, 1, 2).contiguous()


def quantise(adv: torch.Tensor, x: np.ndarray, e: int | None = None) -> np.ndarray:
    """float N x C x H x W in [0, 1] -> uint8 N x H x W x C (rounded to nearest), within
    ``e`` levels of ``x`` when ``e`` is given (the L-inf bound, IEEE-A9)."""
    levels = np.rint(adv.detach().permute(0, 2, 3, 1).cpu().numpy().astype(np.float64) * 255.0)
    if e is None:
        return np.clip(levels, 0, 255).astype(np.uint8)
    return clip_to_linf(levels, x, e)


def chunks(n: int, size: int = CHUNK) -> Iterator[tuple[int, np.ndarray]]:
    """(start, batch rows) of the chunks of a batch of ``n`` images."""
    for start in range(0, n, size):
        yield start, np.arange(start, min(n, start + size))


def crafted(images: np.ndarray, advs: Sequence[np.ndarray] | np.ndarray,
            correct: Sequence[bool] | np.ndarray) -> list[AttackResult]:
    """A transfer attack's results: one per image, the uint8 adversarial crafted for it, the
    surrogate's verdict on the clean image; nothing sent to the target yet (success None,
    no queries), stopped after its iterations."""
    return [make_result(i, images[i], advs[i], success=None, queries=0,
                        initially_correct=bool(correct[i]), stop_reason=STOP_ITERATIONS)
            for i in range(len(images))]


def gaussian_kernel(size: int, nsig: float = 3.0) -> torch.Tensor:
    """The TI paper's ``gkern``: a normalised ``size`` x ``size`` Gaussian over [-nsig, nsig]."""
    xs = np.linspace(-nsig, nsig, size)
    k1 = np.exp(-0.5 * xs ** 2) / math.sqrt(2 * math.pi)
    k = np.outer(k1, k1)
    return torch.from_numpy((k / k.sum()).astype(np.float32))


class Boosters:
    """The booster settings of one run, read from the attack's validated parameters."""

    def __init__(self, params: Any) -> None:
        p = dict(params)
        self.di_prob = float(p.get("di_prob", 0.0) or 0.0)
        self.di_resize = float(p.get("di_resize", 0.9) or 0.9)
        self.ti_kernel = int(p.get("ti_kernel", 0) or 0)
        if self.ti_kernel and self.ti_kernel % 2 == 0:
            raise InvalidArgument("params.ti_kernel", f"must be odd (or 0 = off), got {self.ti_kernel}")
        self.si_copies = int(p.get("si_copies", 1) or 1)
        self.ensemble_mode = str(p.get("ensemble_mode", "logits") or "logits")

    def names(self) -> list[str]:
        """The boosters switched on (report: which boosters crafted the images)."""
        out = []
        if self.di_prob > 0:
            out.append("DI")
        if self.ti_kernel > 1:
            out.append("TI")
        if self.si_copies > 1:
            out.append("SI")
        return out


def _surrogates(ctx: AttackContext) -> list[Any]:
    if ctx.surrogate is None:
        raise InvalidArgument("surrogate", f"{ctx.spec.id} is a transfer attack: name a surrogate model")
    out = [ctx.surrogate, *getattr(ctx, "ensemble", ())]
    for s in out:
        check_surrogate_input(s, ctx.images.shape[1:])
    return out


class WhiteBox:
    """The batch's surrogate objective with boosters and ensembles (see the module doc).

    ``labels`` are the batch's true labels (target label space); ``target`` the targeted
    label (None: untargeted); ``references`` per image for detection / segmentation
    surrogates. Row indices passed to :meth:`loss` select images of the batch.
    """

    def __init__(self, surrogates: Sequence[Any], *, labels: np.ndarray,
                 boosters: Boosters | None = None, target: int | None = None,
                 references: Sequence[Any] = (), criterion: Any = None,
                 generator: torch.Generator | None = None) -> None:
        if not surrogates:
            raise InvalidArgument("surrogate", "name a surrogate model")
        self.surrogates = list(surrogates)
        self.models = [s.model for s in self.surrogates]
        self.task = str(getattr(self.surrogates[0], "task", None) or Task.CLASSIFICATION)
        for s in self.surrogates[1:]:
            if str(getattr(s, "task", None) or Task.CLASSIFICATION) != self.task:
                raise InvalidArgument("surrogate", "an ensemble mixes surrogates of different tasks")
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        self.boosters = boosters or Boosters({})
        self.target = None if target is None else int(target)
        self.references = tuple(references)
        self.criterion = criterion
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self._kernel: torch.Tensor | None = None
        self._modes: list[bool] = []
        #: The un-boosted logits of the last :meth:`loss` call when it computed them on the
        #: input itself (no DI / SI transform), detached; else None.
        self.last_plain: torch.Tensor | None = None

    @classmethod
    def from_ctx(cls, ctx: AttackContext) -> WhiteBox:
        target = getattr(ctx.criterion, "target", None) if getattr(ctx.criterion, "targeted",
                                                                   False) else None
        return cls(_surrogates(ctx), labels=ctx.labels, boosters=Boosters(ctx.params),
                   target=target, references=ctx.references, criterion=ctx.criterion,
                   generator=ctx.torch_generator())

    # -- model state ----------------------------------------------------------------------

    def __enter__(self) -> WhiteBox:
        self._modes = [m.training for m in self.models]
        for m in self.models:
            m.eval()
        return self

    def __exit__(self, *exc: object) -> None:
        for m, mode in zip(self.models, self._modes, strict=False):
            m.train(mode)

    @property
    def targeted(self) -> bool:
        return self.target is not None

    def batches(self, images: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray,
                                                            torch.Tensor, torch.Tensor,
                                                            np.ndarray]]:
        """Per chunk of the batch's uint8 ``images``: (start, rows, uint8 images, float
        tensor, true labels, whether the surrogate gets each clean image right)."""
        for start, rows in chunks(len(images)):
            xs = images[rows]
            x = to_tensor(xs)
            yield start, rows, xs, x, self._y(rows, len(rows)), self.check_classifier(x, rows)

    # -- forward passes -------------------------------------------------------------------

    def plain_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Ensemble-averaged logits without boosters (clean predictions, success checks)."""
        outs = [m(x) for m in self.models]
        return outs[0] if len(outs) == 1 else torch.stack(outs).mean(dim=0)

    def check_classifier(self, x: torch.Tensor, rows: np.ndarray | None = None) -> np.ndarray:
        """Whether the surrogate(s) classify each image correctly (initially_correct), after
        checking the logits' shape and the labels' range."""
        if self.task != Task.CLASSIFICATION:
            return np.ones(x.shape[0], dtype=bool)
        y = self._y(rows, x.shape[0])
        with torch.inference_mode():
            logits = self.plain_logits(x)
        return self.correct_from(logits, y)

    def correct_from(self, logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        """:meth:`check_classifier` on logits already computed (the first gradient step's
        clean forward pass: :attr:`last_plain`), so no forward pass is spent on it."""
        logits = logits.detach()
        self._check_logits(logits, y)
        return (logits.argmax(dim=1) == y).numpy()

    def _diverse(self, x: torch.Tensor) -> torch.Tensor:
        b = self.boosters
        if b.di_prob <= 0 or float(torch.rand(1, generator=self.generator)) >= b.di_prob:
            return x
        h, w = x.shape[-2:]
        lo_h, lo_w = max(1, int(h * b.di_resize)), max(1, int(w * b.di_resize))
        if lo_h >= h and lo_w >= w:
            return x
        frac = float(torch.rand(1, generator=self.generator))
        rh = lo_h + int(frac * (h - lo_h)) if h > lo_h else h
        rw = lo_w + int(frac * (w - lo_w)) if w > lo_w else w
        small = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False)
        top = int(torch.randint(0, h - rh + 1, (1,), generator=self.generator))
        left = int(torch.randint(0, w - rw + 1, (1,), generator=self.generator))
        return F.pad(small, (left, w - rw - left, top, h - rh - top), value=0.0)

    def _smooth_hook(self, x: torch.Tensor) -> None:
        k = self.boosters.ti_kernel
        if k <= 1 or not x.requires_grad:
            return
        if self._kernel is None or self._kernel.shape[-1] != k:
            self._kernel = gaussian_kernel(k)
        c = x.shape[1]
        weight = self._kernel.expand(c, 1, k, k).contiguous()
        x.register_hook(lambda g: F.conv2d(g, weight, padding=k // 2, groups=c))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Boosted, ensemble-averaged logits of ``x`` (differentiable): TI smooths the
        gradient reaching ``x``, SI averages over scaled copies, DI transforms each copy."""
        self._smooth_hook(x)
        total = None
        for i in range(self.boosters.si_copies):
            xi = x if i == 0 else x / float(2 ** i)
            out = self.plain_logits(self._diverse(xi))
            total = out if total is None else total + out
        assert total is not None
        return total / self.boosters.si_copies

    def _y(self, rows: np.ndarray | None, n: int) -> torch.Tensor:
        return self.labels if rows is None else self.labels[torch.from_numpy(np.asarray(rows))]

    def loss(self, x: torch.Tensor, rows: np.ndarray | None = None) -> torch.Tensor:
        """Per-image loss to *ascend* (N): CE on the true label, minus CE on the target label
        (targeted), or the surrogate's task loss; boosters and ensembles applied: the loss is
        averaged over the SI copies (as the SI paper averages their gradients), each copy
        DI-transformed, over the surrogates' averaged logits (``ensemble_mode: logits``) or
        their averaged losses (``loss``). ``rows``: the batch indices of ``x``'s images
        (None: all, in order)."""
        if self.task != Task.CLASSIFICATION:
            return self._task_loss(x, rows)
        y = self._y(rows, x.shape[0])
        self._smooth_hook(x)
        self.last_plain = None
        by_loss = self.boosters.ensemble_mode == "loss" and len(self.models) > 1
        total = None
        for i in range(self.boosters.si_copies):
            xi = x if i == 0 else x / float(2 ** i)
            xd = self._diverse(xi)
            if by_loss:
                part = torch.stack([self._ce(m(xd), y) for m in self.models]).mean(dim=0)
            else:
                out = self.plain_logits(xd)
                self._check_logits(out, y)
                if i == 0 and xd is x:
                    self.last_plain = out.detach()
                part = self._ce(out, y)
            total = part if total is None else total + part
        assert total is not None
        return total if self.boosters.si_copies == 1 else total / self.boosters.si_copies

    def _check_logits(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        """Refuse, naming the field, what cross-entropy would fail on: logits that are not
        N x classes, a label or a target label out of the surrogate's range."""
        if logits.ndim != 2:
            raise InvalidArgument("surrogate", f"model must return N x classes logits, got "
                                  f"{tuple(logits.shape)}")
        if y.numel() and int(y.max()) >= logits.shape[1]:
            raise InvalidArgument("labels", f"label {int(y.max())} out of range for a "
                                  f"{logits.shape[1]}-class surrogate")
        if self.target is not None and not 0 <= self.target < logits.shape[1]:
            raise InvalidArgument("criterion.target_label", f"{self.target} out of range for a "
                                  f"{logits.shape[1]}-class surrogate")

    def _ce(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.target is not None:
            t = torch.full_like(y, self.target)
            return -F.cross_entropy(logits, t, reduction="none")
        return F.cross_entropy(logits, y, reduction="none")

    def _task_loss(self, x: torch.Tensor, rows: np.ndarray | None) -> torch.Tensor:
        refs = self.references
        idx = range(x.shape[0]) if rows is None else [int(r) for r in rows]
        chosen = [refs[i] if i < len(refs) else None for i in idx]
        self._smooth_hook(x)
        total = None
        for i in range(self.boosters.si_copies):
            xi = x if i == 0 else x / float(2 ** i)
            xd = self._diverse(xi)
            for s in self.surrogates:
                part = s.task_loss(xd, chosen, self.criterion)
                total = part if total is None else total + part
        assert total is not None
        return total / (self.boosters.si_copies * len(self.surrogates))

    def grad(self, x: torch.Tensor, rows: np.ndarray | None = None) -> torch.Tensor:
        """d sum(loss) / dx at ``x`` (boosted): the direction that ascends each image's loss.
        Summed, not averaged, so an image's gradient does not depend on its batch."""
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(self.loss(x, rows).sum(), x)
        return g

    # -- feature layers -------------------------------------------------------------------

    def _feature_model(self) -> torch.nn.Module:
        """The module whose layer names the tester knows: the surrogate's ``feature_model``
        when it has one (a tenant's model inside its normalisation and label mapping), else
        its model without Fortis's stopping wrapper."""
        m = getattr(self.surrogates[0], "feature_model", None)
        if isinstance(m, torch.nn.Module):
            return m
        m = self.models[0]
        while isinstance(getattr(m, "inner", None), torch.nn.Module):
            m = m.inner
        return m

    def layer_names(self) -> list[str]:
        """The named modules of the first surrogate (feature-layer attacks)."""
        return [n for n, _ in self._feature_model().named_modules() if n]

    def features(self, x: torch.Tensor, layer: str, field: str = "params.layer") -> torch.Tensor:
        """The output of ``layer`` (a module name of the first surrogate) for ``x``; the
        forward pass runs the whole surrogate (its normalisation included)."""
        modules = dict(self._feature_model().named_modules())
        mod = modules.get(layer) if layer else None
        if mod is None:
            names = self.layer_names()
            shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
            raise InvalidArgument(field, f"unknown layer {layer!r} of surrogate "
                                  f"'{getattr(self.surrogates[0], 'name', '?')}'; layers: {shown}")
        box: list[torch.Tensor] = []

        def hook(_m: Any, _i: Any, out: Any) -> None:
            box.append(out[0] if isinstance(out, tuple) else out)

        handle = mod.register_forward_hook(hook)
        try:
            self.models[0](x)
        finally:
            handle.remove()
        return box[0]
