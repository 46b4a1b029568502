"""The evaluation runner's ports over gRPC: clients of the proxy, perturbation, scoring and
report services. Transport: the target's answers become arrays by the answer types'
``from_proto`` (``core/answers.py``); the runner's other domain objects become messages in
``convert.py``.

Images travel as raw uint8 tensors (never PNG) between services; answers come back as arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from fortis.core.answers import ANSWER_TYPES
from fortis.core.strategy import OUTPUT_KIND_NAMES, OUTPUT_KINDS, TASK_OF_TYPE, TASK_TYPES
from fortis.core.task import Task
from fortis.core.tensors import array_to_tensor, tensor_to_array
from fortis.infra.serving.server import error_from_rpc
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.scoring.v1 import scoring_pb2 as spb
from fortis.scoring.v1 import scoring_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import add_images, decode_image, fill_image
from fortis.services.common.limits import request_batches
from fortis.services.common.params import Param
from fortis.services.common.surrogates import SurrogateOutputs, SurrogateSpec
from fortis.services.evaluation import convert
from fortis.services.evaluation.answers import (
    Answers,
    concat,
)
from fortis.services.evaluation.ports import (
    AttackEntry,
    AttackOutcome,
    AttackReference,
    Catalogue,
    PerturbationEntry,
    ReportInput,
    Scored,
    ScoringSetup,
    Setting,
    TargetDescription,
    TenantUsage,
)
from google.protobuf import json_format

__all__ = ["GrpcPerturbation", "GrpcProxy", "GrpcReport", "GrpcScoring"]



def _call(fn: Any, req: Any, md: Sequence[tuple[str, str]], timeout: float | None = None) -> Any:
    try:
        return fn(req, metadata=md, timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None


def _per_query(err: errors.FortisError) -> bool:
    """A failed Predict that concerns these images (the target down after the proxy's
    retries, the target refusing the images, an unusable answer), not the evaluation itself
    (unknown session, spent budget, bad credentials). ``TargetFailed`` (the target's own
    error or a malformed answer, not retried) is per query too."""
    if isinstance(err, errors.TargetFailed):
        return True
    return not isinstance(err, errors.BudgetExhausted | errors.NotFound | errors.Unauthenticated
                          | errors.FailedPrecondition | errors.AlreadyExists)


class GrpcProxy:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]],
                 *, batch_limit: int = 256) -> None:
        self.stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        self.md = tuple(metadata)
        self.batch_limit = batch_limit
        #: Per target, the largest batch the proxy sends it in one call (its info); per
        #: session opened here, its target's. A Predict call kept within it fails, when the
        #: target fails, on its own images only (the ledger's rows and the answers agree).
        self._target_batch: dict[str, int] = {}
        self._session_batch: dict[str, int] = {}

    def target_info(self, target: str) -> TargetDescription:
        info = _call(self.stub.GetTargetInfo, proxy_pb2.GetTargetInfoRequest(target=target), self.md, 60).info
        self._target_batch[target] = int(info.input.max_batch_size)
        return TargetDescription(name=info.name, task=TASK_OF_TYPE.get(info.task_type, "unspecified"),
                                 labels=tuple(info.labels), output_kind=OUTPUT_KIND_NAMES.get(info.output_kind, "unspecified"),
                                 top_k=info.top_k, input_height=info.input.height,
                                 input_width=info.input.width, input_channels=info.input.channels,
                                 version=info.version)

    def target_names(self) -> list[str]:
        names: list[str] = []
        token = ""
        while True:
            resp = _call(self.stub.ListTargets, proxy_pb2.ListTargetsRequest(
                page_size=1000, page_token=token), self.md, 60)
            names += [t.name for t in resp.targets]
            token = resp.next_page_token
            if not token:
                return names

    def target_terms(self) -> dict[str, tuple[float, float | None]]:
        """Per target this tenant may query: (images per second, 0 = unlimited; price per
        1000 queries the operator declared, or None)."""
        out: dict[str, tuple[float, float | None]] = {}
        token = ""
        while True:
            resp = _call(self.stub.ListTargets, proxy_pb2.ListTargetsRequest(
                page_size=1000, page_token=token), self.md, 60)
            for t in resp.targets:
                out[t.name] = (float(t.images_per_second),
                               float(t.price_per_1000) if t.HasField("price_per_1000") else None)
            token = resp.next_page_token
            if not token:
                return out

    def tenant_usage(self) -> TenantUsage:
        r = _call(self.stub.GetTenantUsage, proxy_pb2.GetTenantUsageRequest(), self.md, 60)
        return TenantUsage(queries_today=int(r.queries_today),
                           queries_per_day=int(r.queries_per_day),
                           images_per_second=float(r.images_per_second))

    def open_session(self, *, session_id: str, target: str, query_budget: int = 0,
                     per_image_budget: int = 0, description: str = "") -> None:
        _call(self.stub.CreateSession, proxy_pb2.CreateSessionRequest(
            target=target, session_id=session_id, query_budget=query_budget,
            per_image_budget=per_image_budget, description=description), self.md, 60)
        if target not in self._target_batch:
            self.target_info(target)
        self._session_batch[session_id] = self._target_batch[target]

    def predict(self, *, session_id: str, origin: str, task: str,
                images: Sequence[tuple[str, np.ndarray]]) -> Answers:
        """Predict through the proxy in batches of raw tensors. A failed call that concerns
        its images gives per-image errors (recorded in the ledger, scored as incorrect,
        shown in the report); any other failure ends the evaluation."""
        parts: list[Answers] = []
        limit = min(self.batch_limit, self._session_batch.get(session_id) or self.batch_limit)
        for s, e in request_batches([np.shape(a) for _, a in images], max_images=limit,
                                    task=task):
            part = images[s:e]
            req = proxy_pb2.PredictRequest(session_id=session_id, origin=origin)
            add_images(req.images, part)            # in place (codec: fast under upb)
            try:
                resp = self.stub.Predict(req, metadata=self.md, timeout=300)
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                if not _per_query(err):
                    raise err from None
                parts.append(ANSWER_TYPES[task].failed(len(part), str(err)))
                continue
            parts.append(ANSWER_TYPES[task].from_proto(resp.predictions))
        return concat(parts) if parts else ANSWER_TYPES[task].failed(0, "")

    def session_queries(self, session_id: str) -> tuple[int, dict[str, int]]:
        st = _call(self.stub.GetSessionStats, proxy_pb2.GetSessionStatsRequest(session_id=session_id), self.md, 60)
        return int(st.queries_ok), {i.image_id: int(i.queries) for i in st.images}


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return ""


def _param(p: Any) -> Param:
    """A ParameterSpec message as the shared schema."""
    typ = _enum_name(ppb.ParameterType, p.type, "PARAMETER_TYPE_")
    default: Any = None
    if not p.required and p.HasField("default_value"):
        which = p.default_value.WhichOneof("value")
        default = getattr(p.default_value, which) if which else None
    return Param(name=p.name, type=typ, default=default, description=p.description,
                 minimum=p.minimum if p.HasField("minimum") else None,
                 maximum=p.maximum if p.HasField("maximum") else None,
                 choices=tuple(p.choices), one_of=p.one_of)


def catalogue_from_messages(perturbations: Iterable[Any], attacks: Iterable[Any]) -> Catalogue:
    """The evaluation's view of the catalogue from ListPerturbations / ListAttacks entries."""
    perts = {it.id: PerturbationEntry(
        id=it.id, kind=_enum_name(ppb.PerturbationKind, it.kind, "PERTURBATION_KIND_"),
        family=it.family, refs=tuple(it.refs),
        level_kind=_enum_name(ppb.LevelKind, it.level_kind, "LEVEL_KIND_"),
        levels=tuple(it.levels), needs_model=it.needs_model,
        params=tuple(_param(p) for p in it.parameters), info=it) for it in perturbations}
    atts = {a.id: AttackEntry(
        id=a.id, kind=_enum_name(ppb.AttackKind, a.kind, "ATTACK_KIND_"), family=a.family,
        refs=tuple(a.refs), norms=tuple(_enum_name(ppb.Norm, n, "NORM_") for n in a.norms),
        needs_surrogate=a.needs_surrogate, params=tuple(_param(p) for p in a.parameters),
        targeted=a.targeted, untargeted=a.untargeted,
        tasks=tuple(TASK_OF_TYPE[t] for t in a.tasks if t in TASK_OF_TYPE) or (Task.CLASSIFICATION,),
        uses_surrogate=a.uses_surrogate)
        for a in attacks}
    return Catalogue(perturbations=perts, attacks=atts)


class GrpcPerturbation:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = perturbation_pb2_grpc.PerturbationServiceStub(ch)
        self.md = tuple(metadata)

    def catalogue(self) -> Catalogue:
        perts: list[Any] = []
        token = ""
        while True:
            resp = _call(self.stub.ListPerturbations,
                         ppb.ListPerturbationsRequest(page_size=1000, page_token=token), self.md, 60)
            perts += resp.perturbations
            token = resp.next_page_token
            if not token:
                break
        attacks: list[Any] = []
        while True:
            aresp = _call(self.stub.ListAttacks,
                          ppb.ListAttacksRequest(page_size=1000, page_token=token), self.md, 60)
            attacks += aresp.attacks
            token = aresp.next_page_token
            if not token:
                break
        return catalogue_from_messages(perts, attacks)

    def perturb(self, perturbation_id: str, level: int, seed: int,
                images: Sequence[tuple[str, np.ndarray]],
                params: Mapping[str, Any] | None = None, *, surrogate: str = "",
                labels: Sequence[int] | None = None) -> list[np.ndarray]:
        """The perturbed images, in order; a batch of large images goes as several requests
        (``limits.request_batches``: each image's randomness is its own, so the split
        changes no pixel)."""
        out: list[np.ndarray] = []
        labs = [int(x) for x in labels or ()]
        for s, e in request_batches([np.shape(a) for _, a in images],
                                    answer_bytes_per_pixel=4):
            req = ppb.ApplyPerturbationRequest(
                perturbation_id=perturbation_id, severity=level, seed=seed,
                surrogate=surrogate, labels=labs[s:e])
            add_images(req.images, images[s:e])
            if params:
                json_format.ParseDict(dict(params), req.params)
            resp = _call(self.stub.ApplyPerturbation, req, self.md, 600)
            out += [decode_image(m, f"images[{s + k}]") for k, m in enumerate(resp.images)]
        return out

    def validate_attack(self, attack_id: str, params: Mapping[str, Any], *, task: str,
                        output_kind: str = "",
                        criterion: Mapping[str, Any] | None = None, surrogate: str = "",
                        ensemble: Sequence[str] = ()) -> dict[str, Any]:
        req = ppb.ValidateAttackRequest(
            attack_id=attack_id, task=TASK_TYPES.get(task, 0),
            output_kind=OUTPUT_KINDS.get(output_kind, 0), surrogate=surrogate,
            ensemble=list(ensemble))
        json_format.ParseDict(dict(params), req.params)
        if criterion:
            req.criterion.CopyFrom(convert.attack_criterion(criterion))
        resp = _call(self.stub.ValidateAttack, req, self.md, 60)
        return dict(json_format.MessageToDict(resp.params))

    def attack(self, attack_id: str, params: Mapping[str, Any], seed: int,
               images: Sequence[tuple[str, np.ndarray, Sequence[int]]], *,
               session_id: str = "", origin: str = "", surrogate: str = "",
               on_result: Callable[[AttackOutcome], None] | None = None,
               cancelled: Callable[[], bool] | None = None,
               criterion: Mapping[str, Any] | None = None,
               references: Sequence[AttackReference] | None = None,
               ensemble: Sequence[str] = (),
               surrogate_models: Sequence[SurrogateSpec] = ()) -> list[AttackOutcome]:
        """One outcome per image, in order. A batch whose images would pass a request's
        size goes as several RunAttack calls (``limits.request_batches``), in the same proxy
        session."""
        refs = list(references) if references is not None else [None] * len(images)
        parts = request_batches([np.shape(im) for _, im, _ in images])
        if len(parts) > 1:
            return [o for s, e in parts for o in self.attack(
                attack_id, params, seed, images[s:e], session_id=session_id, origin=origin,
                surrogate=surrogate, on_result=on_result, cancelled=cancelled,
                criterion=criterion, references=refs[s:e], ensemble=ensemble,
                surrogate_models=surrogate_models)]
        req = ppb.RunAttackRequest(
            attack_id=attack_id, seed=seed, proxy_session_id=session_id,
            origin=origin, surrogate=surrogate, ensemble=list(ensemble),
            surrogate_models=[surrogate_model(s) for s in surrogate_models])
        for (i, im, lab), ref in zip(images, refs, strict=True):
            li = req.images.add()
            fill_image(li.image, i, im, raw=True)
            li.labels.extend(lab)
            convert.fill_reference(li, ref)
        if criterion:
            req.criterion.CopyFrom(convert.attack_criterion(criterion))
        json_format.ParseDict(dict(params), req.params)
        outs = []
        call = self.stub.RunAttack(req, metadata=self.md, timeout=3600)
        try:
            for r in call:
                o = AttackOutcome(
                    image_id=r.image_id, adversarial=decode_image(r.adversarial, "adversarial"),
                    adversarial_float=tensor_to_array(r.adversarial_float, "adversarial_float"),
                    success=r.success if r.HasField("success") else None, queries=int(r.queries),
                    linf=r.linf, l2=r.l2,
                    stop_reason=_enum_name(ppb.StopReason, r.stop_reason, "STOP_REASON_"),
                    initially_correct=r.initially_correct if r.HasField("initially_correct") else None,
                    signal=r.signal, criterion=r.criterion)
                outs.append(o)
                if on_result is not None:
                    on_result(o)
                if cancelled is not None and cancelled():
                    call.cancel()
                    from fortis.services.evaluation.stages import Cancelled
                    raise Cancelled("cancelled by a caller")
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return outs


_MODEL_FORMATS = {"": ppb.MODEL_FORMAT_UNSPECIFIED, "torchscript": ppb.MODEL_FORMAT_TORCHSCRIPT,
                  "onnx": ppb.MODEL_FORMAT_ONNX}


def surrogate_model(spec: SurrogateSpec) -> ppb.SurrogateModel:
    """A plan's surrogate, resolved against the target's labels, as its message."""
    return ppb.SurrogateModel(
        name=spec.name, model=spec.model, format=_MODEL_FORMATS[spec.format],
        height=spec.height, width=spec.width, channels=spec.channels, mean=list(spec.mean),
        std=list(spec.std), labels=list(spec.labels),
        label_map=[ppb.SurrogateLabelMapping(surrogate_label=s, target_label=t)
                   for s, t in spec.mapping],
        target_classes=spec.target_classes,
        task=TASK_TYPES[spec.task],
        outputs=_surrogate_outputs(spec.outputs) if spec.task != Task.CLASSIFICATION else None)


_MASK_KINDS = {"class_logits": ppb.SURROGATE_MASK_KIND_CLASS_LOGITS,
               "probability": ppb.SURROGATE_MASK_KIND_FOREGROUND_PROBABILITY,
               "logit": ppb.SURROGATE_MASK_KIND_FOREGROUND_LOGIT}


def _surrogate_outputs(o: SurrogateOutputs) -> ppb.SurrogateOutputs:
    """A detector's or segmenter's declared outputs as their message."""
    return ppb.SurrogateOutputs(
        boxes=o.boxes, boxes_normalised=o.boxes_normalised, scores=o.scores,
        scores_are_logits=o.scores_are_logits, labels=o.labels, class_logits=o.class_logits,
        mask=o.mask, mask_kind=_MASK_KINDS.get(o.mask_kind, ppb.SURROGATE_MASK_KIND_UNSPECIFIED))


class GrpcScoring:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = scoring_pb2_grpc.ScoringServiceStub(ch)
        self.md = tuple(metadata)

    def score(self, setup: ScoringSetup, settings: Iterable[Setting]) -> Scored:
        def stream() -> Iterator[spb.ScoreEvaluationRequest]:
            yield spb.ScoreEvaluationRequest(setup=convert.scoring_setup(setup))
            for s in settings:
                yield spb.ScoreEvaluationRequest(setting=convert.setting(s))
        resp = _call(self.stub.ScoreEvaluation, stream(), self.md, 900)
        return Scored(summary=convert.summary(resp), metrics=resp)

    def compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One entry of the open metric catalogue (Struct result: numbers are doubles)."""
        req = spb.ComputeRequest(metric=metric)
        for name, arr in arrays.items():
            req.arrays[name].CopyFrom(array_to_tensor(np.asarray(arr)))
        if params:
            json_format.ParseDict(dict(params), req.params)
        resp = _call(self.stub.Compute, req, self.md, 600)
        return json_format.MessageToDict(resp.result)


class GrpcReport:
    def __init__(self, ch: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = report_pb2_grpc.ReportServiceStub(ch)
        self.md = tuple(metadata)

    def render(self, parts: ReportInput) -> tuple[str, str]:
        resp = _call(self.stub.RenderReport,
                     report_pb2.RenderReportRequest(parts=convert.report_parts(parts)), self.md, 600)
        return resp.report_json, resp.report_html
