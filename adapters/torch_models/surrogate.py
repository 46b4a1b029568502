"""Tenant and operator surrogates (IEEE-A7, IEEE-P6): a TorchScript or ONNX classifier loaded
as a differentiable torch module, wrapped as normalisation -> model -> label mapping; a
detector or segmenter (``task`` and ``outputs`` in its definition) is wrapped with its task
loss by ``task_surrogate.py``.

- Formats: TorchScript (``torch.jit.load``) and ONNX, converted to torch with ``onnx2torch``
  so gradients flow through it (white-box attacks on the surrogate). The format is detected
  from the content when not given: a zip archive is TorchScript, anything else is parsed as
  ONNX (and checked with ``onnx.checker``).
- :class:`MappedSurrogate`: ``(x - mean) / std`` on x in [0, 1], the model, then the target's
  label space: the logit of target class t is ``logsumexp`` of the surrogate logits of the
  classes mapped to t (IEEE-P6: several surrogate classes may map to one target class); a
  target class no surrogate class maps to gets :data:`UNMAPPED_LOGIT` (probability ~0, no
  gradient). An image whose true label has no mapped class is refused by the caller
  (``fortis.services.perturbation.surrogates``).
- :class:`SurrogateCache`: loaded surrogates per (tenant, blob id, spec), LRU-bounded.
- :class:`OperatorSurrogates`: the operator's folder (``fortis serve --surrogate-dir`` /
  ``FORTIS_SURROGATE_DIR``) of ``<name>.json`` manifests in the plan's schema (``model`` is a
  file name in the folder; ``target_labels`` optionally names the target's labels for a
  label_map by name); their names behave like built-ins.

Models are never read from a path a client gives: tenant models come from the blob store
(by id, with the caller's tenant), operator models from the operator's folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from fortis.adapters.stand_ins import package, temporary_modules
from fortis.adapters.torch_models.normalisation import register_normalisation
from fortis.core.task import Task
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.surrogates import (
    SurrogateSpec,
    parse_definition,
    spec_of,
)
from torch import nn

from .classifier import InputSpec

__all__ = ["DEFAULT_CACHE_SIZE", "UNMAPPED_LOGIT", "LoadedSurrogate", "MappedSurrogate",
           "OperatorSurrogates", "SurrogateCache", "TenantSurrogates", "detect_format", "import_onnx2torch",
           "load_network", "load_surrogate"]

#: The logit of a target class no surrogate class maps to: finite (no NaN through losses
#: and ensemble averages), far below any real logit.
UNMAPPED_LOGIT: Final = -1e4
#: Loaded surrogates kept per process (each holds a model in memory).
DEFAULT_CACHE_SIZE: Final = 8
_ZIP = b"PK\x03\x04"
_import_lock = threading.Lock()


def detect_format(head: bytes) -> str:
    """"torchscript" for a zip archive (torch.jit.save), else "onnx"."""
    return "torchscript" if head.startswith(_ZIP) else "onnx"


def import_onnx2torch() -> Any:
    """``onnx2torch`` without torchvision: it imports torchvision at import time for its NMS and
    RoIAlign converters only (detectors, never classifiers). When torchvision is absent (PyPI's
    torchvision pulls a second, CUDA torch), stand-ins that refuse those two ops are present
    while it loads and removed afterwards, as fortis.adapters.vision_targets.mtcnn does."""
    if "onnx2torch" in sys.modules:
        return sys.modules["onnx2torch"]
    with _import_lock:
        if "onnx2torch" in sys.modules:
            return sys.modules["onnx2torch"]
        if importlib.util.find_spec("onnx2torch") is None:
            raise InvalidArgument("format", "ONNX models need the onnx2torch package "
                                            "(pip install onnx onnx2torch)")
        stand_ins: dict[str, types.ModuleType] = {}
        if importlib.util.find_spec("torchvision") is None:

            def _absent(*_a: Any, **_k: Any) -> Any:
                raise NotImplementedError("torchvision ops (NMS, RoIAlign) are not available "
                                          "to ONNX surrogates: a surrogate is a classifier")

            ops = package("torchvision.ops", **{n: _absent for n in (
                "nms", "box_convert", "roi_align", "batched_nms")})
            stand_ins = {"torchvision": package("torchvision", ops=ops), "torchvision.ops": ops}
        with temporary_modules(stand_ins, ("torchvision",)):
            return importlib.import_module("onnx2torch")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def _constants_as_initializers(proto: Any) -> Any:
    """Top-level ``Constant`` nodes holding a tensor become initializers: today's exporters
    (torch.onnx, opset >= 19) write them with opset versions onnx2torch 1.5 has no converter
    for, and an initializer is the same value."""
    graph = proto.graph
    keep = []
    for node in graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and not node.domain and set(attrs) == {"value"} \
                and len(node.output) == 1:
            t = type(attrs["value"].t)()
            t.CopyFrom(attrs["value"].t)
            t.name = node.output[0]
            graph.initializer.append(t)
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    return proto


def load_network(path: Path, fmt: str, field: str) -> nn.Module:
    """The model file at ``path`` (a server-side path: the blob store's or the operator's) as
    an eval-mode torch module; InvalidArgument on ``field`` when it does not load."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        raise InvalidArgument(field, "the model file cannot be read") from None
    detected = detect_format(head)
    fmt = fmt or detected
    if fmt != detected:
        raise InvalidArgument(field, f"declared format {fmt}, but the file is "
                                     f"{'a zip archive (TorchScript)' if detected == 'torchscript' else 'not a zip archive (so not TorchScript)'}")
    if fmt == "torchscript":
        try:
            net = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:   # the caller's file is not a usable model
            raise InvalidArgument(field, f"not a loadable TorchScript model "
                                         f"({_first_line(exc)})") from None
    else:
        import onnx
        onnx2torch = import_onnx2torch()
        try:
            proto = onnx.load(str(path))
            onnx.checker.check_model(proto)
            net = onnx2torch.convert(_constants_as_initializers(proto))
        except InvalidArgument:
            raise
        except Exception as exc:
            raise InvalidArgument(field, f"not a usable ONNX model ({_first_line(exc)})") from None
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


class MappedSurrogate(nn.Module):
    """normalisation -> network -> target-space logits (see the module doc). ``mapping``:
    (surrogate class, target class) pairs; ``target_classes``: the output width."""

    def __init__(self, net: nn.Module, *, mean: Sequence[float], std: Sequence[float],
                 channels: int, num_labels: int, mapping: Sequence[tuple[int, int]],
                 target_classes: int, name: str = "") -> None:
        super().__init__()
        self.net = net
        self.name = name
        self.num_labels = int(num_labels)
        register_normalisation(self, mean, std, channels)
        mask = torch.zeros(target_classes, num_labels, dtype=torch.bool)
        for si, ti in mapping:
            mask[ti, si] = True
        self.register_buffer("mask", mask, persistent=False)
        self.register_buffer("mapped", mask.any(dim=1), persistent=False)

    def surrogate_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The network's own logits for x in [0, 1] (N x num_labels), checked."""
        out = self.net((x - self.get_buffer("mean")) / self.get_buffer("std"))
        if isinstance(out, tuple | list):
            out = out[0]
        if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] != self.num_labels:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InvalidArgument("surrogate", f"surrogate '{self.name}' returned {shape}; "
                                  f"N x {self.num_labels} logits (one per label) are needed")
        return out.to(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.surrogate_logits(x)
        mask = self.get_buffer("mask")
        # A large finite fill, not -inf: logsumexp over a row with no mapped class stays
        # finite (no NaN gradient); such rows are replaced by UNMAPPED_LOGIT below.
        filled = z.unsqueeze(1).masked_fill(~mask.unsqueeze(0), -1e30)
        lse = torch.logsumexp(filled, dim=2)
        return torch.where(self.get_buffer("mapped").unsqueeze(0), lse,
                           torch.full_like(lse, UNMAPPED_LOGIT))


class LoadedSurrogate:
    """What the attacks take (``.model``, ``.input_spec``, ``.name``, ``.feature_model``),
    plus ``mapped_targets`` (target classes some surrogate class maps to) and ``spec``."""

    task = Task.CLASSIFICATION

    def __init__(self, model: MappedSurrogate, spec: SurrogateSpec) -> None:
        self.model = model.eval()
        self.feature_model = model.net
        self.input_spec = InputSpec(height=spec.height, width=spec.width,
                                    channels=spec.channels)
        self.name = spec.name
        self.spec = spec
        self.mapped_targets = spec.mapped_targets()
        self.class_names = tuple(spec.labels)

    def __repr__(self) -> str:
        s = self.input_spec
        return (f"LoadedSurrogate(name={self.name!r}, input={s.height}x{s.width}x{s.channels}, "
                f"labels={len(self.class_names)}, target_classes={self.spec.target_classes})")


def load_surrogate(path: Path, spec: SurrogateSpec, field: str) -> Any:
    """Load and wrap the model file at ``path`` for ``spec``; its output width is checked on
    one blank image (InvalidArgument on ``field`` when it does not take the declared input
    or does not return one logit per label). A detector or segmenter (``spec.task``) is
    wrapped with its task loss and its declared outputs are checked the same way
    (``task_surrogate.py``; problems name ``<definition>.outputs.<name>``)."""
    net = load_network(path, spec.format, field)
    if spec.task != Task.CLASSIFICATION:
        from .task_surrogate import task_surrogate

        return task_surrogate(net, spec, field.removesuffix(".model"))
    model = MappedSurrogate(net, mean=spec.mean, std=spec.std, channels=spec.channels,
                            num_labels=len(spec.labels), mapping=spec.mapping,
                            target_classes=spec.target_classes, name=spec.name)
    probe = torch.zeros(1, spec.channels, spec.height, spec.width)
    try:
        with torch.inference_mode():
            model(probe)
    except InvalidArgument as exc:
        raise InvalidArgument(field, exc.violations[0].description) from None
    except Exception as exc:
        raise InvalidArgument(field, f"the model does not run on a 1 x {spec.channels} x "
                                     f"{spec.height} x {spec.width} input (check input and "
                                     f"the model's expected layout; {_first_line(exc)})") from None
    return LoadedSurrogate(model, spec)


class SurrogateCache:
    """Loaded surrogates by (tenant, blob id, spec key), the least recently used dropped past
    ``size`` entries. Loading happens outside the lock; two concurrent first loads of one key
    both load, and one is kept."""

    def __init__(self, size: int = DEFAULT_CACHE_SIZE) -> None:
        self.size = max(1, int(size))
        self._items: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, key: tuple[Any, ...], load: Callable[[], Any]) -> Any:
        """The loaded surrogate of ``key`` (a classifier's :class:`LoadedSurrogate`, or a
        detector's / segmenter's task surrogate)."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        value = load()
        with self._lock:
            self.loads += 1
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)


class OperatorSurrogates:
    """The operator's surrogate folder: ``<name>.json`` (the plan schema; ``model`` a file
    name beside it; optional ``target_labels``) and the model file. Read when first named;
    a broken manifest is refused naming the field, with the manifest's name."""

    def __init__(self, folder: Path | str | None, cache: SurrogateCache | None = None) -> None:
        self.folder = Path(folder).resolve() if folder else None
        self.cache = cache if cache is not None else SurrogateCache()

    def names(self) -> list[str]:
        if self.folder is None or not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if p.is_file())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def spec(self, name: str) -> tuple[SurrogateSpec, Path]:
        assert self.folder is not None
        manifest = self.folder / f"{name}.json"
        where = f"surrogate-dir {name}.json"
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidArgument("surrogate", f"{where}: not readable JSON "
                                               f"({_first_line(exc)})") from None
        if not isinstance(doc, dict):
            raise InvalidArgument("surrogate", f"{where}: must be a JSON object")
        doc = dict(doc)
        target_labels = doc.pop("target_labels", None)
        doc.pop("twin_of", None)        # read by twin_of(): who may use it, not how it runs
        doc.setdefault("name", name)
        defn, problems = parse_definition(doc, where, model_kind="file")
        if target_labels is not None and (not isinstance(target_labels, list) or not all(
                isinstance(x, str) for x in target_labels)):
            problems.append(FieldViolation(f"{where}.target_labels", "a list of names"))
        if defn is not None and defn.name != name:
            problems.append(FieldViolation(f"{where}.name", f"must be '{name}' (the file's "
                                                            "name)"))
        if problems or defn is None:
            raise InvalidArgument.from_violations(problems[:100])
        if target_labels is None and not defn.label_map:
            target_labels = list(defn.labels)    # the target's labels are the surrogate's
        elif target_labels is None:              # target labels by index only
            top = max([int(v) for _, v in defn.label_map
                       if isinstance(v, int) or str(v).isdigit()] or [0])
            target_labels = [str(i) for i in range(top + 1)]
        spec = spec_of(defn, target_labels, where)
        path = (self.folder / defn.model).resolve()
        if path.parent != self.folder or not path.is_file():
            raise InvalidArgument("surrogate", f"{where}.model: no file '{defn.model}' in the "
                                               "surrogate folder")
        return spec, path

    def twin_of(self, name: str) -> tuple[str, ...]:
        """The targets whose weights the manifest says this surrogate shares (``"twin_of":
        ["target", ...]``; a tenant needs the operator's white-box grant for each:
        services/common/whitebox.py). A manifest that cannot be read, or a ``twin_of`` that
        is not a list of names, counts as a twin of every target ("*"): a typo never opens
        a target's weights."""
        if name not in self:
            return ()
        assert self.folder is not None
        try:
            doc = json.loads((self.folder / f"{name}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return ("*",)
        raw = doc.get("twin_of", []) if isinstance(doc, dict) else None
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
            return ("*",)
        return tuple(raw)

    def load(self, name: str, field: str = "surrogate") -> Any:
        spec, path = self.spec(name)
        st = path.stat()
        key = ("operator", str(path), st.st_mtime_ns, st.st_size, spec.key())
        return self.cache.get(key, lambda: load_surrogate(path, spec, field))


class TenantSurrogates:
    """Tenants' uploaded surrogates: ``path_of(tenant, blob id, field)`` is the blob store's
    (InvalidArgument "no such upload" for an unknown or another tenant's id, the same for
    both), checked on every call before the cache is consulted."""

    def __init__(self, path_of: Callable[[str, str, str], Path],
                 cache: SurrogateCache | None = None) -> None:
        self.path_of = path_of
        self.cache = cache if cache is not None else SurrogateCache()

    def load(self, tenant: str, spec: SurrogateSpec, field: str) -> Any:
        """``field``: the definition's field (``surrogate_models[0]``)."""
        path = self.path_of(tenant, spec.model, f"{field}.model")
        key = ("tenant", tenant, spec.model, spec.key())
        return self.cache.get(key, lambda: load_surrogate(path, spec, f"{field}.model"))
