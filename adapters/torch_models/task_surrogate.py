"""A tenant's (or operator's) own detector or segmenter as the surrogate of transfer attacks on a
detection or segmentation target (IEEE-A7 on IEEE-C4 / IEEE-C5), with the task losses of the
built-in ``mtcnn-surrogate`` and ``u2netp-surrogate`` (``fortis.adapters.vision_targets
.surrogates``), read from the outputs the definition declares
(``services/common/surrogates.py``: :class:`SurrogateOutputs`).

**The network.** :class:`TaskNet` resizes an image batch (float N x C x H x W in [0, 1], any
size: detectors and segmenters take the image as it is) to the declared input (bilinear,
anti-aliased when shrinking), converts its channels (RGB -> grey by luminance, grey -> RGB by
repetition), applies ``(x - mean) / std`` and runs the model, whose outputs are a tuple
(a single tensor is output 0).

**Classes.** The surrogate's classes are mapped onto the target's (IEEE-P6) as a classifier's
are: the logit of target class t is the ``logsumexp`` of the logits of the surrogate classes
mapped to t, and a target class nothing maps to gets a finite logit far below any real one.

**Detection** (:class:`DetectorSurrogate`, criterion ``ObjectMissed``): as MTCNN's loss, the
face (here: object) evidence that still stands above the confidence threshold near each
object of interest is pushed down -- per image, minus the sum of ``softplus(e - logit(tau) +
kappa)`` over the boxes near an object (IoU > 0.2 with it, or the box's centre inside it; box
positions held constant in the gradient), where ``e`` is the box's log-odds of being that
object's class: the confidence's logit, combined with the class probability when the model
gives class logits (``log(s p_t) - log(1 - s p_t)``), and only boxes whose class maps to the
object's when it gives class labels; ``tau`` is the criterion's confidence threshold (0.5 when
it names none), ``kappa`` = 2 (a box already well below stops pulling). An image with no
object of interest (met once a box is kept) ascends the strongest evidence of any class; an
image without a reference uses every box. ``ObjectRelabelled`` (every object found as class
T) needs class logits: near each object, the margin of T over the other classes is raised.

**Segmentation** (:class:`SegmenterSurrogate`, criterion ``MIoUBelow``): as U2-Net-p's loss,
each class of interest is pushed off its reference pixels -- per pixel, the class's margin
over the others (``z_c - logsumexp_{u != c} z_u``; for a foreground probability or logit
``l``, the two-class logits are ``[0, l]``, so the margin is ``l`` for the foreground and
``-l`` for the background, exactly the built-in's), clamped at ``-kappa``, averaged within
each class and over the classes, ignored pixels left out. Without a reference mask the
surrogate's own answer (held constant) is the reference.

A definition's outputs are checked when the model is loaded (:func:`check_task_outputs`, on a
blank image of the declared input size), each problem naming ``<definition>.outputs.<name>``.
Domain code: torch and numpy, no gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import torch
import torch.nn.functional as F
from fortis.adapters.torch_models.normalisation import register_normalisation
from fortis.core.boxes import iou_xyxy
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import MAX_SURROGATE_DETECTIONS, MAX_SURROGATE_SIDE
from fortis.services.common.surrogates import SurrogateSpec
from torch import nn

__all__ = ["DetectorSurrogate", "SegmenterSurrogate", "TaskNet", "check_task_outputs",
           "task_surrogate"]

_KAPPA: Final = 2.0
#: The logit of a target class no surrogate class maps to (as ``surrogate.UNMAPPED_LOGIT``).
_UNMAPPED: Final = -1e4
#: Boxes count as near an object above this IoU (or with their centre inside it).
_NEAR_IOU: Final = 0.2
#: Probabilities are clamped this far from 0 and 1 before their logit is taken.
_EPS: Final = 1e-7


class TaskNet(nn.Module):
    """resize -> channels -> normalisation -> the network, its outputs as a tuple."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, net: nn.Module, *, height: int, width: int, channels: int,
                 mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.height, self.width, self.channels = int(height), int(width), int(channels)
        register_normalisation(self, mean, std, channels)

    def forward(self, x: torch.Tensor) -> tuple[Any, ...]:
        if x.ndim != 4 or x.shape[1] not in (1, 3):
            raise InvalidArgument("images", f"a surrogate takes N x 1|3 x H x W images, got "
                                            f"{tuple(x.shape)}")
        if x.shape[1] == 3 and self.channels == 1:
            w = x.new_tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            x = (x * w).sum(dim=1, keepdim=True)
        elif x.shape[1] == 1 and self.channels == 3:
            x = x.expand(-1, 3, -1, -1)
        ih, iw = int(x.shape[-2]), int(x.shape[-1])
        if (ih, iw) != (self.height, self.width):
            x = F.interpolate(x, size=(self.height, self.width), mode="bilinear",
                              align_corners=False,
                              antialias=ih > self.height or iw > self.width)
        out = self.net((x - self.mean) / self.std)
        return tuple(out) if isinstance(out, tuple | list) else (out,)


def _class_mask(labels: int, mapping: Sequence[tuple[int, int]], target_classes: int
                ) -> torch.Tensor:
    """target_classes x labels: which surrogate classes map to each target class."""
    mask = torch.zeros(target_classes, labels, dtype=torch.bool)
    for si, ti in mapping:
        mask[ti, si] = True
    return mask


def _to_target(z: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Surrogate class logits along ``dim`` -> target class logits (logsumexp of the mapped
    ones; unmapped target classes at :data:`_UNMAPPED`)."""
    z = z.movedim(dim, -1)                                   # ... x L
    filled = z.unsqueeze(-2).masked_fill(~mask, -1e30)       # ... x T x L
    lse = torch.logsumexp(filled, dim=-1)
    out = torch.where(mask.any(dim=1), lse, torch.full_like(lse, _UNMAPPED))
    return out.movedim(-1, dim)


def _output(outs: tuple[Any, ...], pos: int, name: str, field: str) -> torch.Tensor:
    if pos >= len(outs):
        raise InvalidArgument(f"{field}.outputs.{name}", f"output {pos} does not exist: the "
                              f"model returns {len(outs)} output(s)")
    t = outs[pos]
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{field}.outputs.{name}", f"output {pos} is a "
                              f"{type(t).__name__}, not a tensor")
    return t


def _refs(references: Sequence[Any], n: int) -> list[Any]:
    refs = list(references)[:n]
    return refs + [None] * (n - len(refs))


class _TaskSurrogate:
    """What a tenant's detector and segmenter surrogates share: the network, the plan's
    definition, its labels and outputs, and which surrogate classes map to which target
    class."""

    task = ""
    input_spec = None

    def __init__(self, model: TaskNet, spec: SurrogateSpec) -> None:
        self.model = model.eval()
        self.spec = spec
        self.name = spec.name
        self.labels = tuple(spec.labels)
        self.outputs = spec.outputs
        self._mask = _class_mask(len(spec.labels), spec.mapping, spec.target_classes)


class DetectorSurrogate(_TaskSurrogate):
    """A detector as the surrogate of transfer attacks on a detection target (module doc)."""

    task = Task.DETECTION

    def __init__(self, model: TaskNet, spec: SurrogateSpec) -> None:
        super().__init__(model, spec)
        #: the target class of each surrogate class (-1: unmapped), for class-label outputs
        self._target_of = np.full(len(spec.labels), -1, dtype=np.int64)
        for si, ti in spec.mapping:
            self._target_of[si] = ti

    def __repr__(self) -> str:
        return f"DetectorSurrogate(name={self.name!r}, labels={len(self.labels)})"

    def detections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                  torch.Tensor | None, torch.Tensor | None]:
        """(boxes N x K x 4 in the image's pixels, detached; confidence logits N x K; target
        class log-probabilities N x K x T or None; target class ids N x K or None)."""
        o, f = self.outputs, self.name
        outs = self.model(x)
        assert o.boxes is not None and o.scores is not None
        boxes = _output(outs, o.boxes, "boxes", f).detach().to(torch.float32)
        h, w = x.shape[-2:]
        if o.boxes_normalised:
            scale = boxes.new_tensor([w, h, w, h])
        else:
            scale = boxes.new_tensor([w / self.model.width, h / self.model.height] * 2)
        boxes = boxes * scale
        s = _output(outs, o.scores, "scores", f).to(torch.float32)
        logit = s if o.scores_are_logits else torch.logit(s.clamp(_EPS, 1 - _EPS))
        logp = cls = None
        if o.class_logits is not None:
            z = _output(outs, o.class_logits, "class_logits", f).to(torch.float32)
            logp = torch.log_softmax(_to_target(z, self._mask, -1), dim=-1)
        elif o.labels is not None:
            lab = _output(outs, o.labels, "labels", f).detach().round().to(torch.int64)
            lab = lab.clamp(0, len(self.labels) - 1)
            cls = torch.from_numpy(self._target_of)[lab]
        return boxes, logit, logp, cls

    def _evidence(self, logit: torch.Tensor, logp: torch.Tensor | None,
                  cls: torch.Tensor | None, t: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(K,) log-odds of each box being an object of class ``t`` (None: of its best
        class), and which boxes may count for it."""
        if logp is None:
            ok = torch.ones_like(logit, dtype=torch.bool)
            if cls is not None:
                ok = cls >= 0 if t is None else cls == t
            elif t is not None and t not in {ti for _, ti in self.spec.mapping}:
                ok = torch.zeros_like(ok)
            return logit, ok
        if t is not None and not 0 <= t < logp.shape[-1]:
            return logit, torch.zeros_like(logit, dtype=torch.bool)
        lp = logp.max(dim=-1).values if t is None else logp[..., t]
        joint = F.logsigmoid(logit) + lp                      # log(s p_t)
        joint = joint.clamp(max=math.log1p(-_EPS))
        return joint - torch.log(-torch.expm1(joint)), torch.ones_like(logit, dtype=torch.bool)

    def task_loss(self, x: torch.Tensor, references: Sequence[Any],
                  criterion: Any) -> torch.Tensor:
        """Per image, the loss to ascend (module doc)."""
        kind = type(criterion).__name__
        if criterion is not None and kind not in ("ObjectMissed", "ObjectRelabelled"):
            raise InvalidArgument("criterion", f"{self.name} is a detection surrogate: it "
                                  f"serves object_missed or object_relabelled, not {kind}")
        relabel = kind == "ObjectRelabelled"
        if relabel and self.outputs.class_logits is None:
            raise InvalidArgument("criterion", f"{self.name} gives no class logits, so it "
                                  "cannot steer an object to another class: use "
                                  "object_missed, or declare outputs.class_logits")
        thr = getattr(criterion, "score_threshold", None) if not relabel else \
            getattr(criterion, "threshold", None)
        p = 0.5 if thr is None else min(max(float(thr), 1e-6), 1 - 1e-6)
        tau = math.log(p / (1 - p))
        boxes, logit, logp, cls = self.detections(x)
        n = x.shape[0]
        out = []
        for k, ref in enumerate(_refs(references, n)):
            b = boxes[k].numpy().reshape(-1, 4)
            lk = logit[k].reshape(-1)
            pk = None if logp is None else logp[k].reshape(lk.shape[0], -1)
            ck = None if cls is None else cls[k].reshape(-1)
            if ref is None:
                e, ok = self._evidence(lk, pk, ck, None)
                out.append(-F.softplus(e[ok] - tau + _KAPPA).sum() if bool(ok.any())
                           else lk.sum() * 0.0)
                continue
            rb = np.asarray(getattr(ref, "boxes", None) if not isinstance(ref, dict)
                            else ref.get("boxes"), dtype=np.float64).reshape(-1, 4)
            rl = np.asarray(getattr(ref, "labels", None) if not isinstance(ref, dict)
                            else ref.get("labels", [0] * len(rb)), dtype=np.int64).reshape(-1)
            if len(rb) == 0:                       # make a box appear (a false detection)
                e, ok = self._evidence(lk, pk, ck, None)
                out.append(e[ok].max() if bool(ok.any()) else lk.sum() * 0.0)
                continue
            centre = (b[:, :2] + b[:, 2:]) / 2
            total = lk.sum() * 0.0
            for r, t in zip(rb, rl, strict=True):
                inside = ((centre[:, 0] >= r[0]) & (centre[:, 0] <= r[2])
                          & (centre[:, 1] >= r[1]) & (centre[:, 1] <= r[3]))
                near = torch.from_numpy((iou_xyxy(b, r[None])[:, 0] > _NEAR_IOU) | inside)
                if relabel:
                    assert pk is not None
                    target = int(criterion.target)
                    others = torch.cat([pk[:, :target], pk[:, target + 1:]], dim=1)
                    margin = pk[:, target] - torch.logsumexp(others, dim=1) \
                        if others.shape[1] else pk[:, target]
                    sel = near
                    if bool(sel.any()):
                        total = total - F.softplus(-margin[sel] + _KAPPA).sum()
                    continue
                e, ok = self._evidence(lk, pk, ck, int(t))
                sel = near & ok
                if bool(sel.any()):
                    total = total - F.softplus(e[sel] - tau + _KAPPA).sum()
            out.append(total)
        return torch.stack(out)


class SegmenterSurrogate(_TaskSurrogate):
    """A segmenter as the surrogate of transfer attacks on a segmentation target (module
    doc)."""

    task = Task.SEGMENTATION

    def __init__(self, model: TaskNet, spec: SurrogateSpec) -> None:
        super().__init__(model, spec)
        self.mapped = frozenset(t for _, t in spec.mapping)

    def __repr__(self) -> str:
        return f"SegmenterSurrogate(name={self.name!r}, labels={len(self.labels)})"

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pixel target class logits N x T x H x W at the image's size."""
        o = self.outputs
        assert o.mask is not None
        z = _output(self.model(x), o.mask, "mask", self.name).to(torch.float32)
        if o.mask_kind != "class_logits":
            lg = z[:, :1] if o.mask_kind == "logit" else \
                torch.logit(z[:, :1].clamp(_EPS, 1 - _EPS))
            z = torch.cat([torch.zeros_like(lg), lg], dim=1)
        z = _to_target(z, self._mask, 1)
        h, w = x.shape[-2:]
        if z.shape[-2:] != (h, w):
            z = F.interpolate(z, size=(h, w), mode="bilinear", align_corners=False)
        return z

    def class_map(self, images: np.ndarray) -> np.ndarray:
        """uint8 N x H x W x C -> int64 N x H x W target classes."""
        x = torch.from_numpy(np.ascontiguousarray(images)).float().div(255.0).permute(0, 3, 1, 2)
        with torch.inference_mode():
            return self.logits(x).argmax(dim=1).numpy().astype(np.int64)

    def task_loss(self, x: torch.Tensor, references: Sequence[Any],
                  criterion: Any) -> torch.Tensor:
        """Per image, the loss to ascend (module doc)."""
        if criterion is not None and type(criterion).__name__ != "MIoUBelow":
            raise InvalidArgument("criterion", f"{self.name} is a segmentation surrogate: it "
                                  f"serves miou_below, not {type(criterion).__name__}")
        classes = tuple(getattr(criterion, "classes", None) or sorted(self.mapped))
        ignore = getattr(criterion, "ignore_label", None)
        unmapped = [c for c in classes if c not in self.mapped]
        if len(unmapped) == len(classes):
            raise InvalidArgument("criterion.classes", f"surrogate '{self.name}' maps none of "
                                  f"its classes to the classes of interest {list(classes)} "
                                  "(its label_map)")
        z = self.logits(x)                                     # N x T x H x W
        n, _, h, w = z.shape
        out = []
        for k, ref in enumerate(_refs(references, n)):
            zk = z[k]
            r = zk.detach().argmax(dim=0).numpy() if ref is None else np.asarray(ref)
            if r.shape != (h, w):
                raise InvalidArgument(f"references[{k}]", f"mask of shape {list(r.shape)} for "
                                      f"an image of {h} x {w}")
            valid = np.ones(r.shape, bool) if ignore is None else r != ignore
            parts = []
            for c in classes:
                if c in unmapped or c >= zk.shape[0]:
                    continue
                sel = torch.from_numpy(valid & (r == c))
                if bool(sel.any()):
                    others = torch.cat([zk[:c], zk[c + 1:]], dim=0)
                    margin = zk[c] - torch.logsumexp(others, dim=0)
                    parts.append(torch.clamp(margin[sel], min=-_KAPPA).mean())
            out.append(-torch.stack(parts).mean() if parts else zk.sum() * 0.0)
        return torch.stack(out)


def check_task_outputs(model: TaskNet, spec: SurrogateSpec, field: str) -> None:
    """Run the model on a blank image of the declared input size and check each declared
    output's shape; InvalidArgument naming ``field.outputs.<name>`` (``field.model`` when the
    model does not run at all)."""
    probe = torch.zeros(1, spec.channels, spec.height, spec.width)
    try:
        with torch.inference_mode():
            outs = model(probe)
    except InvalidArgument:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise InvalidArgument(f"{field}.model", f"the model does not run on a 1 x "
                              f"{spec.channels} x {spec.height} x {spec.width} input (check "
                              f"input and the model's expected layout; {type(exc).__name__}"
                              f"{': ' + first if first else ''})") from None
    o, n_labels = spec.outputs, len(spec.labels)

    def get(name: str, pos: int | None) -> torch.Tensor:
        assert pos is not None
        return _output(outs, pos, name, field)

    def refuse(name: str, t: torch.Tensor, want: str) -> InvalidArgument:
        return InvalidArgument(f"{field}.outputs.{name}", f"output {getattr(o, name)} is "
                               f"{list(t.shape)}; {want} is needed")

    if spec.task == Task.DETECTION:
        boxes = get("boxes", o.boxes)
        if boxes.ndim != 3 or boxes.shape[0] != 1 or boxes.shape[2] != 4:
            raise refuse("boxes", boxes, "N x K x 4 (x_min, y_min, x_max, y_max)")
        k = boxes.shape[1]
        if k > MAX_SURROGATE_DETECTIONS:
            raise InvalidArgument(f"{field}.outputs.boxes", f"{k:,} boxes per image; at most "
                                  f"{MAX_SURROGATE_DETECTIONS:,}")
        scores = get("scores", o.scores)
        if tuple(scores.shape) != (1, k):
            raise refuse("scores", scores, f"N x {k} (one confidence per box)")
        if not o.scores_are_logits and scores.numel() and not bool(
                ((scores >= 0) & (scores <= 1)).all()):
            raise InvalidArgument(f"{field}.outputs.scores", "the confidences are not in "
                                  "[0, 1]: declare kind: logit if they are logits")
        if o.labels is not None:
            lab = get("labels", o.labels)
            if tuple(lab.shape) != (1, k):
                raise refuse("labels", lab, f"N x {k} (one class per box)")
        if o.class_logits is not None:
            z = get("class_logits", o.class_logits)
            if tuple(z.shape) != (1, k, n_labels):
                raise refuse("class_logits", z, f"N x {k} x {n_labels} (one logit per label)")
        return
    mask = get("mask", o.mask)
    c = n_labels if o.mask_kind == "class_logits" else 1
    if mask.ndim != 4 or mask.shape[0] != 1 or mask.shape[1] != c:
        raise refuse("mask", mask, f"N x {c} x h x w"
                     + (" (one logit per label)" if c > 1 else " (the foreground)"))
    if max(mask.shape[2:]) > MAX_SURROGATE_SIDE or min(mask.shape[2:]) < 1:
        raise InvalidArgument(f"{field}.outputs.mask", f"masks of {list(mask.shape[2:])} "
                              f"pixels; 1 to {MAX_SURROGATE_SIDE:,} a side")
    if o.mask_kind == "probability" and mask.numel() and not bool(
            ((mask >= 0) & (mask <= 1)).all()):
        raise InvalidArgument(f"{field}.outputs.mask.kind", "the mask is not in [0, 1]: "
                              "declare kind: logit if it holds logits")


def task_surrogate(net: nn.Module, spec: SurrogateSpec, field: str
                   ) -> DetectorSurrogate | SegmenterSurrogate:
    """``net`` wrapped as the surrogate of its declared task, its outputs checked
    (``field``: the definition, e.g. ``surrogate_models[0]``)."""
    model = TaskNet(net, height=spec.height, width=spec.width, channels=spec.channels,
                    mean=spec.mean, std=spec.std)
    check_task_outputs(model, spec, field)
    if spec.task == Task.DETECTION:
        return DetectorSurrogate(model, spec)
    return SegmenterSurrogate(model, spec)
