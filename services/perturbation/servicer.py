"""gRPC transport of the perturbation service: decode, call the engine or a registry, encode.

The contract is typed (``fortis.perturbation.v1``): parameter schemas with typed defaults and
bounds, DEG-5 characterisation and stop reasons as enums, level tables as named values, and
images out as raw uint8 tensors (docs/architecture.md: encoded once, where a remote target
needs it; a caller may ask ApplyPerturbation for PNG). Nothing here decides anything the
domain code does not.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from fortis.common.v1 import common_pb2
from fortis.core.strategy import OUTPUT_KIND_NAMES, TASK_OF_TYPE, TASK_TYPES
from fortis.core.task import Task
from fortis.core.tensors import tensor_to_array
from fortis.infra.serving import wire
from fortis.infra.serving.call_context import current_api_key, current_tenant, in_work_slot
from fortis.infra.serving.memory import holding
from fortis.infra.serving.server import call_metadata, error_from_rpc
from fortis.infra.serving.status import status_for
from fortis.infra.serving.wire import Wire
from fortis.perturbation.v1 import perturbation_pb2 as pb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors, limits
from fortis.services.common.codec import decode_image, decode_images
from fortis.services.common.pagination import page_of, page_size
from fortis.services.common.params import Param
from fortis.services.common.stopping import StopCheck, caller_stop
from fortis.services.common.surrogates import SurrogateOutputs, SurrogateSpec
from fortis.services.perturbation import engine, registry
from fortis.services.perturbation.attacks.base import AttackSpec
from fortis.services.perturbation.attacks.registry import ATTACKS, attack_spec
from fortis.services.perturbation.judges import BoxReference, signal_of_output
from fortis.services.perturbation.proxy_client import ProxyQueryClient
from fortis.services.perturbation.registry import PERTURBATIONS, perturbation_spec
from fortis.services.perturbation.spec import PerturbationSpec
from fortis.services.perturbation.style_models import StyleModels, TenantModelBlobs
from fortis.services.perturbation.surrogates import check_mapped_labels, resolve_surrogates
from google.protobuf import json_format

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PerturbationService"].full_name
_KINDS = {"corruption": pb.PERTURBATION_KIND_CORRUPTION, "style": pb.PERTURBATION_KIND_STYLE,
          "degradation": pb.PERTURBATION_KIND_DEGRADATION,
          "property": pb.PERTURBATION_KIND_PROPERTY}
_LEVEL_KINDS = {"severity": pb.LEVEL_KIND_SEVERITY, "level": pb.LEVEL_KIND_LEVEL,
                "epsilon": pb.LEVEL_KIND_EPSILON}
_SCOPES = {"global": pb.SCOPE_GLOBAL, "local": pb.SCOPE_LOCAL}
_RANDOMNESS = {"deterministic": pb.RANDOMNESS_DETERMINISTIC,
               "stochastic": pb.RANDOMNESS_STOCHASTIC}
_DOMAINS = {"colour": pb.DOMAIN_COLOUR, "pixel": pb.DOMAIN_PIXEL}
_PARAM_TYPES = {"float": pb.PARAMETER_TYPE_FLOAT, "int": pb.PARAMETER_TYPE_INT,
                "bool": pb.PARAMETER_TYPE_BOOL, "string": pb.PARAMETER_TYPE_STRING}
_ATTACK_KINDS = {"transfer": pb.ATTACK_KIND_TRANSFER, "score": pb.ATTACK_KIND_SCORE,
                 "decision": pb.ATTACK_KIND_DECISION}
_NORMS = {"l0": pb.NORM_L0, "l2": pb.NORM_L2, "linf": pb.NORM_LINF, "l1": pb.NORM_L1,
          "spatial": pb.NORM_SPATIAL}
_STOP_REASONS = {"success": pb.STOP_REASON_SUCCESS, "budget": pb.STOP_REASON_BUDGET,
                 "already_misclassified": pb.STOP_REASON_ALREADY_MISCLASSIFIED,
                 "budget_exhausted_by_proxy": pb.STOP_REASON_BUDGET_EXHAUSTED_BY_PROXY,
                 "iterations": pb.STOP_REASON_ITERATIONS}
_PAGE_DEFAULT, _PAGE_MAX = 100, 1000
_CRITERIA = {pb.CRITERION_KIND_MISCLASSIFICATION: "misclassification",
             pb.CRITERION_KIND_TARGETED_MISCLASSIFICATION: "targeted_misclassification",
             pb.CRITERION_KIND_CONFIDENT_MISCLASSIFICATION: "confident_misclassification",
             pb.CRITERION_KIND_TOP_K_MISCLASSIFICATION: "top_k_misclassification",
             pb.CRITERION_KIND_ORIGINAL_CLASS_PROBABILITY: "original_class_probability",
             pb.CRITERION_KIND_TARGET_CLASS_PROB_BOOST: "target_class_prob_boost",
             pb.CRITERION_KIND_OBJECT_MISSED: "object_missed",
             pb.CRITERION_KIND_OBJECT_RELABELLED: "object_relabelled",
             pb.CRITERION_KIND_MIOU_BELOW: "miou_below"}


def criterion_spec(msg: pb.AttackCriterion) -> dict[str, Any]:
    """An AttackCriterion message as the engine's plain criterion data (``criteria.
    criterion_from_spec``); an unknown kind names ``criterion.kind``."""
    out: dict[str, Any] = {}
    if msg.kind:
        if msg.kind not in _CRITERIA:
            raise errors.InvalidArgument("criterion.kind", f"unknown criterion kind {msg.kind}")
        out["kind"] = _CRITERIA[msg.kind]
    if msg.HasField("target_label"):
        out["target_label"] = int(msg.target_label)
    if msg.HasField("threshold"):
        out["threshold"] = float(msg.threshold)
    if msg.k:
        out["k"] = int(msg.k)
    if msg.HasField("detection"):
        d = msg.detection
        out["detection"] = {"iou_threshold": float(d.iou_threshold),
                            "min_objects": int(d.min_objects),
                            "mode": d.mode or "threshold", "k": int(d.k) or 5}
        if d.HasField("score_threshold"):
            out["detection"]["score_threshold"] = float(d.score_threshold)
    if msg.HasField("segmentation"):
        g = msg.segmentation
        out["segmentation"] = {"classes": [int(c) for c in g.classes],
                               "miou_threshold": float(g.miou_threshold),
                               "ignore_label": int(g.ignore_label)
                               if g.HasField("ignore_label") else None,
                               "all_absent_incorrect": bool(g.all_absent_incorrect)}
    return out


_MODEL_FORMATS = {pb.MODEL_FORMAT_UNSPECIFIED: "", pb.MODEL_FORMAT_TORCHSCRIPT: "torchscript",
                  pb.MODEL_FORMAT_ONNX: "onnx"}


_MASK_KINDS = {pb.SURROGATE_MASK_KIND_UNSPECIFIED: "",
               pb.SURROGATE_MASK_KIND_CLASS_LOGITS: "class_logits",
               pb.SURROGATE_MASK_KIND_FOREGROUND_PROBABILITY: "probability",
               pb.SURROGATE_MASK_KIND_FOREGROUND_LOGIT: "logit"}


def surrogate_spec(msg: pb.SurrogateModel, where: str) -> SurrogateSpec:
    """A SurrogateModel message as the domain's definition (checked when resolved)."""
    if msg.format not in _MODEL_FORMATS:
        raise errors.InvalidArgument(f"{where}.format", f"unknown model format {msg.format}")
    task = Task.CLASSIFICATION if msg.task == common_pb2.TASK_TYPE_UNSPECIFIED else \
        TASK_OF_TYPE.get(msg.task)
    if task is None:
        raise errors.InvalidArgument(f"{where}.task", f"unknown task {msg.task}")
    o = msg.outputs
    if o.mask_kind not in _MASK_KINDS:
        raise errors.InvalidArgument(f"{where}.outputs.mask_kind",
                                     f"unknown mask kind {o.mask_kind}")
    outputs = SurrogateOutputs(
        boxes=o.boxes if o.HasField("boxes") else None, boxes_normalised=o.boxes_normalised,
        scores=o.scores if o.HasField("scores") else None,
        scores_are_logits=o.scores_are_logits,
        labels=o.labels if o.HasField("labels") else None,
        class_logits=o.class_logits if o.HasField("class_logits") else None,
        mask=o.mask if o.HasField("mask") else None, mask_kind=_MASK_KINDS[o.mask_kind])
    return SurrogateSpec(
        name=msg.name, model=msg.model, format=_MODEL_FORMATS[msg.format], height=msg.height,
        width=msg.width, channels=msg.channels, mean=tuple(msg.mean), std=tuple(msg.std),
        labels=tuple(msg.labels),
        mapping=tuple((int(m.surrogate_label), int(m.target_label)) for m in msg.label_map),
        target_classes=msg.target_classes, task=task, outputs=outputs)


def _objects(li: Any, where: str) -> BoxReference | None:
    """A LabeledImage's objects of interest (None: none given, the clean answer's)."""
    if not li.objects:
        return BoxReference.of(np.zeros((0, 4)), np.zeros(0, np.int64)) if li.no_objects \
            else None
    return BoxReference.of([[b.x_min, b.y_min, b.x_max, b.y_max] for b in li.objects],
                           [int(b.label) for b in li.objects], field=f"{where}.objects")


# --------------------------------------------------------------------------------------------
# Catalogue entries -> messages
# --------------------------------------------------------------------------------------------


def parameter_spec(p: Param) -> pb.ParameterSpec:
    """A schema entry as its typed message (the default in the case of its type)."""
    msg = pb.ParameterSpec(name=p.name, type=_PARAM_TYPES[p.type], description=p.description,
                           choices=list(p.choices), required=p.required, one_of=p.one_of,
                           minimum=p.minimum, maximum=p.maximum)
    if p.default is not None:
        v = msg.default_value
        if p.type == "float":
            v.number = float(p.default)
        elif p.type == "int":
            v.integer = int(p.default)
        elif p.type == "bool":
            v.flag = bool(p.default)
        else:
            v.text = str(p.default)
    return msg


def _named_value(name: str, value: Any) -> pb.NamedValue:
    """A number, a list of numbers, or text (anything else as JSON)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return pb.NamedValue(name=name, number=float(value))
    if isinstance(value, str):
        return pb.NamedValue(name=name, text=value)
    if isinstance(value, tuple | list) and all(
            isinstance(x, int | float | np.number) and not isinstance(x, bool) for x in value):
        return pb.NamedValue(name=name, numbers=pb.NumberList(values=[float(x) for x in value]))
    return pb.NamedValue(name=name, text=json.dumps(
        value, default=lambda o: o.item() if isinstance(o, np.generic) else repr(o)))


def _level_rows(spec: PerturbationSpec) -> list[tuple[int, Mapping[str, Any]]]:
    """(level, name -> value) per level-table entry: the registry's ``named_level_table`` when
    it has one, else the entry's mapping keys, ``level_fields``, or "value" / "value_1".."""
    named = getattr(registry, "named_level_table", None)
    levels = [spec.levels[i] if i < len(spec.levels) else i + 1
              for i in range(len(spec.level_table))]
    if named is not None:
        table = named(spec)
        if isinstance(table, Mapping):
            return [(int(lv), vals) for lv, vals in table.items()]
        return list(zip(levels, table, strict=True))
    rows: list[tuple[int, Mapping[str, Any]]] = []
    fields = tuple(getattr(spec, "level_fields", ()) or ())
    for lv, entry in zip(levels, spec.level_table, strict=True):
        if isinstance(entry, Mapping):
            rows.append((lv, {str(k): v for k, v in entry.items()}))
            continue
        parts = list(entry) if isinstance(entry, tuple | list) else [entry]
        names = fields if len(fields) == len(parts) else (
            ("value",) if len(parts) == 1 else tuple(f"value_{i + 1}" for i in range(len(parts))))
        rows.append((lv, dict(zip(names, parts, strict=True))))
    return rows


def perturbation_info(spec: PerturbationSpec) -> pb.PerturbationInfo:
    ch = spec.characterisation
    return pb.PerturbationInfo(
        id=spec.id, kind=_KINDS[spec.kind], family=spec.family, ieee_ref=", ".join(spec.refs),
        description=spec.description, stochastic=spec.stochastic,
        severities=list(spec.levels) if spec.level_kind == "severity" else [],
        refs=list(spec.refs), level_kind=_LEVEL_KINDS[spec.level_kind], levels=list(spec.levels),
        characterisation=pb.Characterisation(scope=_SCOPES[ch.scope],
                                             randomness=_RANDOMNESS[ch.randomness],
                                             domain=_DOMAINS[ch.domain]),
        needs_model=spec.needs_model, level_table_doc=spec.level_table_doc,
        parameters=[parameter_spec(p) for p in spec.params],
        level_table=[pb.LevelParameters(level=lv, values=[_named_value(k, v)
                                                          for k, v in vals.items()])
                     for lv, vals in _level_rows(spec)])


def attack_info(spec: AttackSpec) -> pb.AttackInfo:
    return pb.AttackInfo(
        id=spec.id, kind=_ATTACK_KINDS[spec.kind], family=spec.family,
        norms=[_NORMS[n] for n in spec.norms], targeted=spec.targeted,
        untargeted=spec.untargeted, parameters=[parameter_spec(p) for p in spec.params],
        refs=list(spec.refs), description=spec.description,
        needs_surrogate=spec.needs_surrogate, stochastic=spec.stochastic,
        tasks=[TASK_TYPES[t] for t in spec.tasks or ()], uses_surrogate=spec.uses_surrogate,
        minimal_norm=spec.minimal_norm)


def _stop_check(context: Any) -> StopCheck:
    """The call's deadline and cancellation as the engine's stop check."""
    return caller_stop(context.is_active, context.time_remaining)


def _page(items: Sequence[Any], kind: str, request: Any) -> tuple[list[Any], str]:
    size = page_size(request.page_size, default=_PAGE_DEFAULT, maximum=_PAGE_MAX)
    return page_of(items, kind, size, request.page_token)


# --------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------


class PerturbationServicer(perturbation_pb2_grpc.PerturbationServiceServicer):
    def __init__(self, *, proxy_stub: proxy_pb2_grpc.TargetProxyServiceStub | None,
                 surrogate_loader: Callable[[str, str], Any],
                 tenant_surrogates: Callable[[SurrogateSpec, str], Any] | None = None,
                 surrogate_names: Callable[[], Collection[str]] = tuple,
                 surrogate_access: Callable[[str, str, str], Any] | None = None,
                 model_root: Path | None = None,
                 model_blobs: TenantModelBlobs | None = None) -> None:
        """``surrogate_loader``: (name, field) -> a built-in or operator surrogate;
        ``tenant_surrogates``: (definition, its field) -> the calling tenant's uploaded
        surrogate (None: refused); ``surrogate_names``: the names the first resolves, which
        no definition may take (IEEE-A7). ``model_root``: the operator's folder of
        ``neural_style`` models (None: ``$FORTIS_MODEL_ROOT``); ``model_blobs``: (tenant, blob
        id, field) -> an uploaded MODEL blob's file (None: uploaded style models refused)."""
        self.proxy_stub = proxy_stub
        self.surrogate_loader = surrogate_loader
        self.tenant_surrogates = tenant_surrogates
        self.surrogate_names = surrogate_names
        #: (name, field, rpc) -> PermissionDenied naming ``field`` unless the calling tenant
        #: may use this server surrogate (a target's twin needs the operator's white-box
        #: grant: services/common/whitebox.py); rpc "" checks without an audit line.
        self.surrogate_access = surrogate_access or (lambda name, field, rpc: ())
        self.model_root = model_root
        self.model_blobs = model_blobs

    def _style_models(self) -> StyleModels:
        """The models ``neural_style`` may read in this call: the operator's root and the
        calling tenant's uploads only, the tenant bound here, where the call's identity is
        known, so the domain code takes a plain value and reads no call state."""
        blobs = self.model_blobs
        if blobs is None:
            return StyleModels(root=self.model_root)
        return StyleModels(root=self.model_root,
                           blobs=functools.partial(blobs, current_tenant.get()))

    def ListPerturbations(self, request: Any, context: Any) -> pb.ListPerturbationsResponse:
        specs = [s for s in PERTURBATIONS.values()
                 if not request.kind or _KINDS[s.kind] == request.kind]
        page, token = _page(specs, f"perturbations/{request.kind}", request)
        return pb.ListPerturbationsResponse(perturbations=[perturbation_info(s) for s in page],
                                            next_page_token=token)

    def ListAttacks(self, request: Any, context: Any) -> pb.ListAttacksResponse:
        specs = [s for s in ATTACKS.values()
                 if not request.kind or _ATTACK_KINDS[s.kind] == request.kind]
        page, token = _page(specs, f"attacks/{request.kind}", request)
        return pb.ListAttacksResponse(attacks=[attack_info(s) for s in page],
                                      next_page_token=token)

    def _apply(self, req: Any, context: Any, field: int, prefix: bytes = b"") -> Wire:
        """Apply the request's perturbation: the answer in its wire form, ``prefix`` (its other
        fields) then the images as the repeated field ``field`` (see ``wire.py``: a large
        answer built as a message held every other call of the server up)."""
        spec = perturbation_spec(req.perturbation_id)
        images = req.images
        arrays = decode_images(images)
        for i, m in enumerate(images):
            if not m.image_id:
                raise errors.InvalidArgument(f"images[{i}].image_id", "image_id is required")
        if req.response_encoding not in (pb.IMAGE_ENCODING_UNSPECIFIED, pb.IMAGE_ENCODING_PNG):
            raise errors.InvalidArgument("response_encoding",
                                         f"unknown encoding {req.response_encoding}")
        params = json_format.MessageToDict(req.params) if req.HasField("params") else {}
        level = req.epsilon if spec.level_kind == "epsilon" else req.severity
        surrogate = None
        labels = None
        if spec.needs_model:
            if not req.surrogate:
                raise errors.InvalidArgument("surrogate", f"{spec.id} is white-box: name a surrogate model")
            self.surrogate_access(req.surrogate, "surrogate", "ApplyPerturbation")
            surrogate = self.surrogate_loader(req.surrogate, "surrogate")
            labels = list(req.labels)
        out = engine.perturb(spec.id, level, req.seed,
                             [(m.image_id, a) for m, a in zip(images, arrays, strict=True)],
                             params=params, surrogate=surrogate, labels=labels,
                             should_stop=_stop_check(context),
                             style_models=self._style_models())
        raw = req.response_encoding != pb.IMAGE_ENCODING_PNG
        return wire.image_list(field, ((m.image_id, o) for m, o in zip(images, out, strict=True)),
                               raw=raw, prefix=prefix)

    def ApplyPerturbation(self, request: Any, context: Any) -> Wire:
        # decoding, perturbing and building the answer: in the tenant's share of the CPU
        return in_work_slot(context, lambda: self._apply(
            request, context, pb.ApplyPerturbationResponse.IMAGES_FIELD_NUMBER))

    def ApplyPerturbationStream(self, request_iterator: Any, context: Any
                                ) -> Iterator[Wire | pb.ApplyPerturbationStreamResponse]:
        for req in request_iterator:
            try:
                limits.check_message(req)   # in band: the stream goes on
                head = pb.ApplyPerturbationStreamResponse(request_id=req.request_id[:256])
                with holding(req):          # its decoded size, held while it is worked on
                    resp = in_work_slot(context, functools.partial(
                        self._apply, req, context,
                        pb.ApplyPerturbationStreamResponse.IMAGES_FIELD_NUMBER,
                        head.SerializeToString()))
                yield resp
            except (errors.DeadlineExceeded, errors.Cancelled):
                raise                       # the call is over: no answer in band
            except errors.FortisError as exc:
                yield pb.ApplyPerturbationStreamResponse(request_id=req.request_id[:256],
                                                         error=status_for(exc))

    def RunAttack(self, request: Any, context: Any) -> Iterator[Wire]:
        spec = attack_spec(request.attack_id)
        # A query attack mostly waits for the target (each query takes its own share in the
        # proxy when the target runs here); any other attack is computation from start to end.
        items, results = self._run_attack(spec, request, context) if spec.is_query_attack \
            else in_work_slot(context, lambda: self._run_attack(spec, request, context))
        for it, r in zip(items, results, strict=True):
            head = pb.RunAttackResponse(
                image_id=it.image_id, queries=int(r.queries), linf=float(r.linf),
                l2=float(r.l2), stop_reason=_STOP_REASONS[r.stop_reason], signal=r.signal,
                criterion=r.criterion)
            if r.success is not None:
                head.success = bool(r.success)
            if r.initially_correct is not None:
                head.initially_correct = bool(r.initially_correct)
            # the images in their wire form (wire.py): a large one holds no other call up
            yield wire.message(
                head.SerializeToString(),
                wire.image_field(pb.RunAttackResponse.ADVERSARIAL_FIELD_NUMBER, it.image_id,
                                 r.adversarial, raw=True),
                wire.tensor_field(pb.RunAttackResponse.ADVERSARIAL_FLOAT_FIELD_NUMBER,
                                  np.asarray(r.adversarial_float, dtype=np.float32)))

    def _run_attack(self, spec: Any, request: Any, context: Any) -> tuple[list[Any], list[Any]]:
        params = json_format.MessageToDict(request.params) if request.HasField("params") else {}
        items = []
        for i, li in enumerate(request.images):
            if not li.image.image_id:
                raise errors.InvalidArgument(f"images[{i}].image.image_id", "image_id is required")
            items.append(engine.AttackItem(
                image_id=li.image.image_id, image=decode_image(li.image, f"images[{i}].image"),
                labels=tuple(li.labels), objects=_objects(li, f"images[{i}]"),
                mask=tensor_to_array(li.mask, f"images[{i}].mask")
                if li.HasField("mask") else None))
        crit = criterion_spec(request.criterion) if request.HasField("criterion") else None
        query = surrogate = None
        if spec.is_query_attack:
            query = self._query_client(request, spec.id)
        ensemble: list[Any] = []
        if (request.surrogate or request.ensemble) and (spec.needs_surrogate
                                                        or spec.uses_surrogate):
            self._check_surrogates(request, "RunAttack")
            surrogate, ensemble = resolve_surrogates(
                request.surrogate, list(request.ensemble),
                [surrogate_spec(m, f"surrogate_models[{i}]")
                 for i, m in enumerate(request.surrogate_models)],
                builtin=self.surrogate_loader, tenant=self.tenant_surrogates,
                reserved=self.surrogate_names())
            check_mapped_labels([s for s in (surrogate, *ensemble) if s is not None],
                                [it.labels for it in items])
        results = engine.run_attack(spec.id, params, request.seed, items, query=query,
                                    surrogate=surrogate, criterion=crit,
                                    should_stop=_stop_check(context), ensemble=ensemble)
        return items, list(results)

    def _check_surrogates(self, request: Any, rpc: str) -> None:
        """The server surrogates a request names (not its own definitions), each checked
        before anything is loaded or computed on it."""
        own = {m.name for m in getattr(request, "surrogate_models", ())}
        if request.surrogate and request.surrogate not in own:
            self.surrogate_access(request.surrogate, "surrogate", rpc)
        for j, name in enumerate(request.ensemble):
            if name and name not in own:
                self.surrogate_access(name, f"ensemble[{j}]", rpc)

    def ValidateAttack(self, request: Any, context: Any) -> pb.ValidateAttackResponse:
        self._check_surrogates(request, "")
        params = json_format.MessageToDict(request.params) if request.HasField("params") else {}
        crit = criterion_spec(request.criterion) if request.HasField("criterion") else None
        task = TASK_OF_TYPE.get(request.task, Task.CLASSIFICATION)
        signal = signal_of_output(OUTPUT_KIND_NAMES[request.output_kind]) \
            if request.output_kind in OUTPUT_KIND_NAMES else ""
        p = engine.validate_attack(request.attack_id, params, task=task, signal=signal,
                                   criterion=crit)
        out = pb.ValidateAttackResponse()
        json_format.ParseDict(p, out.params)
        return out

    def _query_client(self, request: Any, attack_id: str) -> ProxyQueryClient:
        if self.proxy_stub is None:
            raise errors.FailedPrecondition("this perturbation service has no proxy configured")
        if not request.proxy_session_id:
            raise errors.InvalidArgument("proxy_session_id", f"{attack_id} is a query attack: open a proxy session and name it")
        md = call_metadata(current_api_key.get(), current_tenant.get())
        try:
            sess = self.proxy_stub.GetSession(
                proxy_pb2.GetSessionRequest(session_id=request.proxy_session_id), metadata=md).session
            info = self.proxy_stub.GetTargetInfo(
                proxy_pb2.GetTargetInfoRequest(target=sess.target), metadata=md).info
        except Exception as exc:  # grpc.RpcError
            raise error_from_rpc(exc) from None  # type: ignore[arg-type]
        return ProxyQueryClient(self.proxy_stub, session_id=request.proxy_session_id,
                                origin=request.origin or attack_id, num_classes=len(info.labels),
                                metadata=md,
                                task=TASK_OF_TYPE.get(info.task_type, Task.CLASSIFICATION),
                                output_kind=OUTPUT_KIND_NAMES.get(info.output_kind, "full_scores"))
