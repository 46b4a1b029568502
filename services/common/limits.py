"""The documented maximum of every field of every request message (docs/limits.md): every
numeric parameter of every RPC has a documented maximum; plans, strings and nesting depth
have limits.

One source of truth per limit:

* the named constants below, imported by the validators that apply them (plans, pagination,
  the proxy, scoring) or checked equal to theirs by ``tests/contract/test_limits_documented.py``;
* :data:`FIELD_LIMITS`, the bound of each request field by its full protobuf name, and
  :data:`ECHO_MESSAGES`, the messages a caller only hands back to be printed in a report
  (their numbers are values, not parameters: no work depends on them, so only their strings
  and lists are bounded);
* :func:`check_message`, which the server's interceptor runs on every request message of every
  service before the servicer sees it: INVALID_ARGUMENT naming the field (``images[3].image_id``,
  ``severity``), never echoing the value past :data:`MAX_ECHO_CHARS`.

What a walk over one message cannot see has its own table beside the code that reads it: the
parameters of each perturbation and attack (their registry schemas, ``ListPerturbations`` /
``ListAttacks``), the parameters of each ``Compute`` metric (``services/scoring/limits.py``,
``ListMetrics``) and the plan's fields (``services/evaluation/plan.py``, with the constants
here). ``docs/limits.md`` is generated from all of them by ``scripts/gen_limits_doc.py``.

Pure code: protobuf messages, no gRPC.

Longer than 600 lines because of its tables: the named constants and :data:`FIELD_LIMITS`
(over 500 lines of data) stay beside the walk that applies them, so one module reads as the
whole documented list (the code alone is about 400 lines).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from fortis.core.task import Task
from fortis.services.common.errors import FieldViolation, InvalidArgument
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

# -- transport -------------------------------------------------------------------------------
#: Largest request message, bytes (``--max-message-bytes``; the server's default).
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
#: Answer bytes one Predict call may bring back (half the message limit): a client splits a
#: segmentation batch so its class maps (int32) and per-pixel probabilities (float16, two
#: classes) stay under it (:func:`request_batches`).
MAX_ANSWER_BYTES_PER_CALL: Final = MAX_MESSAGE_BYTES // 2
#: Estimated answer bytes per pixel of a segmentation answer (class map + probabilities).
SEGMENTATION_ANSWER_BYTES_PER_PIXEL: Final = 8
#: Raw image bytes one request may carry (half the message limit, the rest for framing,
#: ids and the answers a perturbation call streams back): a client splits a batch of large
#: images at it (:func:`request_batches`).
MAX_IMAGE_BYTES_PER_CALL: Final = MAX_MESSAGE_BYTES // 2
#: Most characters of a value quoted back in an error message.
MAX_ECHO_CHARS: Final = 80
#: Most field violations listed in one error.
MAX_VIOLATIONS: Final = 20

# -- identifiers and text --------------------------------------------------------------------
#: Image ids, request ids, query origins.
MAX_ID_CHARS: Final = 256
#: Catalogue ids and names: perturbation, attack, metric, target, surrogate, setting names.
MAX_NAME_CHARS: Final = 128
#: Evaluation ids (``services/evaluation/service.py`` EVALUATION_ID_MAX).
MAX_EVALUATION_ID_CHARS: Final = 100
#: Proxy session ids (``services/proxy/proxy.py`` SESSION_ID_MAX).
MAX_SESSION_ID_CHARS: Final = 200
#: A proxy session's description.
MAX_DESCRIPTION_CHARS: Final = 1000
#: Free text a caller hands over to be printed (reasons, report texts, error strings).
MAX_TEXT_CHARS: Final = 4096
#: Page tokens (``services/common/pagination.py`` MAX_TOKEN_CHARS).
MAX_PAGE_TOKEN_CHARS: Final = 512

# -- pages -----------------------------------------------------------------------------------
#: page_size of every List RPC but the ledger's (0 = the RPC's default).
MAX_PAGE_SIZE: Final = 1000
#: page_size of ListLedgerEntries.
MAX_LEDGER_PAGE_SIZE: Final = 10_000

# -- images and tensors ----------------------------------------------------------------------
#: Images in one request (ApplyPerturbation, RunAttack, Predict): the plan's largest batch.
MAX_IMAGES_PER_REQUEST: Final = 1024
#: Pixels of one image, checked from the header before decoding (``codec.MAX_PIXELS``).
MAX_PIXELS: Final = 40_000_000
#: Bytes of one encoded image.
MAX_IMAGE_BYTES: Final = 64 * 1024 * 1024
#: Dimensions of a tensor's shape.
MAX_TENSOR_DIMS: Final = 8
#: Largest single dimension of a tensor (``fortis.core.tensors.MAX_ELEMENTS`` bounds their product).
MAX_TENSOR_DIM: Final = 1 << 31
#: Width or height of an image, pixels.
MAX_IMAGE_SIDE: Final = 100_000

# -- memory (infra/serving/memory.py): decoded sizes, known before anything is decoded -----
#: Decoded bytes of one request: the sum over its images of width x height x channels x bytes
#: per sample (PNG/JPEG headers) and over its tensors of elements x dtype size
#: (``fortis serve --max-request-decoded-bytes``). One largest RGB image (MAX_PIXELS x 3)
#: fits; sixteen 6000x6000 grey images (576 MB) do not.
MAX_REQUEST_DECODED_BYTES: Final = 128 * 1024 * 1024
#: Decoded bytes one tenant's calls in progress may hold on one server together
#: (``--max-tenant-decoded-bytes``); a call past it is refused at once, released when each
#: call ends (answered, failed or cancelled). Calls between Fortis's services are not counted.
MAX_TENANT_DECODED_BYTES: Final = 256 * 1024 * 1024

# -- uploads (infra/storage/blobs.py; no plan reads the server's disk) ----------------------
#: Bytes of one UploadBlob data chunk (``blobs.MAX_CHUNK_BYTES``).
MAX_UPLOAD_CHUNK_BYTES: Final = 1024 * 1024
#: Declared size of the largest model blob (a TorchScript or ONNX file).
MAX_MODEL_BYTES: Final = 256 * 1024 * 1024
#: Declared size of the largest dataset archive blob (a tar, optionally gzip): a whole COCO,
#: VOC, class-folder or Hugging Face dataset in one upload, still within the tenant's quota.
MAX_ARCHIVE_BYTES: Final = 2 * 1024**3
#: Declared size of the largest blob, an archive (``blobs.MAX_BLOB_BYTES``: image 32 MiB,
#: manifest 16 MiB, model 256 MiB, archive 2 GiB).
MAX_UPLOAD_BYTES: Final = MAX_ARCHIVE_BYTES
#: A blob id, ``sha256:`` and 64 hex digits.
MAX_BLOB_ID_CHARS: Final = 71
#: A blob's media type.
MAX_MEDIA_TYPE_CHARS: Final = 128

# -- tenant surrogates (services/common/surrogates.py; IEEE-A7, IEEE-P6) ----------------------
#: Input height or width of a tenant's surrogate model, pixels (its gradient is computed on
#: images of that size).
MAX_SURROGATE_SIDE: Final = 1024
#: Classes of a tenant's surrogate (its ``labels``, entries of its ``label_map``).
MAX_SURROGATE_CLASSES: Final = 100_000
#: Characters of one surrogate class name.
MAX_SURROGATE_LABEL_CHARS: Final = 256
#: Surrogates a plan (``surrogates``) or a RunAttack request (``surrogate_models``) defines.
MAX_SURROGATES: Final = 16
#: Further surrogates of one attack's ensemble (IEEE-A7 model ensembles).
MAX_ENSEMBLE: Final = 8
#: Largest |mean| and std of a surrogate's input normalisation (x in [0, 1]).
MAX_SURROGATE_NORM: Final = 1000.0
#: Smallest std of a surrogate's input normalisation.
MIN_SURROGATE_STD: Final = 1e-6
#: Largest output position a detector or segmenter surrogate's ``outputs`` may name (its
#: outputs 0..15).
MAX_SURROGATE_OUTPUT: Final = 15
#: Boxes (K) a detector surrogate may return per image (checked when it is loaded).
MAX_SURROGATE_DETECTIONS: Final = 20_000

# -- evaluation artifacts (services/evaluation/store.py; one shared store) --------------------
#: An artifact's name (``adversarial/<attack>-<chunk>.npz``): '/'-separated parts of letters,
#: digits, '_', '-', '.', none starting with '.'.
MAX_ARTIFACT_NAME_CHARS: Final = 200
#: Bytes of one artifact (an attack chunk's adversarial examples, uint8 and float).
MAX_ARTIFACT_BYTES: Final = 1024 * 1024 * 1024

# -- labels and evaluations ------------------------------------------------------------------
#: Largest class label (and number of classes) of a target.
MAX_CLASS_LABEL: Final = 1_000_000
#: Acceptable labels of one image (IEEE-C2/C3 label sets).
MAX_LABELS_PER_IMAGE: Final = 1000
#: Ground-truth boxes of one image (IEEE-C4).
MAX_BOXES_PER_IMAGE: Final = 10_000
#: Classes of interest of a segmentation criterion (IEEE-C5).
MAX_CLASSES_OF_INTEREST: Final = 10_000
#: Images M of one ScoreEvaluation call (IEEE-M8 recommends 10,000).
MAX_EVALUATION_IMAGES: Final = 1_000_000
#: Images of one plan's dataset (``dataset.limit``).
MAX_DATASET_IMAGES: Final = 100_000
#: ``dataset.offset`` of a plan.
MAX_DATASET_OFFSET: Final = 10_000_000
#: Settings (clean + corruptions x severities + attacks + degradation levels) of one scoring call.
MAX_SETTINGS: Final = 10_000
#: A severity (1..5) or incremental degradation level (0..30, DEG-1) of ApplyPerturbation.
MAX_LEVEL: Final = 30
#: A setting's level in ScoreEvaluation (``evaluation_scoring.MAX_LEVEL``).
MAX_SCORING_LEVEL: Final = 1000
#: A rank cut-off k, top-k or quorum q of a correctness rule.
MAX_RANK: Final = 10_000
#: A quorum q of label sets / objects (IEEE-C3).
MAX_QUORUM: Final = 1_000_000
#: An L-inf or L2 distance ([0, 1] pixel scale) handed to scoring.
MAX_DISTANCE: Final = 1e6
#: Largest seed (the plan's ``seed`` and every request's).
MAX_SEED: Final = 2**63 - 1

# -- budgets ---------------------------------------------------------------------------------
#: Q_m, queries per image (IEEE-M6): the attacks' ``max_queries`` and a session's per-image budget.
MAX_QUERIES_PER_IMAGE: Final = 1_000_000
#: A proxy session's total budget (covers MAX_DATASET_IMAGES x MAX_QUERIES_PER_IMAGE).
MAX_SESSION_BUDGET: Final = 10**12

# -- plans -----------------------------------------------------------------------------------
#: Bytes of a plan's text (``plan.MAX_PLAN_BYTES``).
MAX_PLAN_BYTES: Final = 1_000_000
#: Nesting depth of a plan document.
MAX_PLAN_DEPTH: Final = 32
#: Attacks of one plan (corruptions and operators cannot repeat, so the catalogue bounds them).
MAX_PLAN_ATTACKS: Final = 100
#: Characters of any string in a plan (names, roles, endpoint, paths).
MAX_PLAN_STRING_CHARS: Final = 1024
#: Entries of a plan's ``dataset.label_map``.
MAX_LABEL_MAP: Final = 100_000
#: ``execution.batch_size`` of a plan.
MAX_BATCH_SIZE: Final = MAX_IMAGES_PER_REQUEST
#: A report's plan text (``report.convert.MAX_PLAN_BYTES``).
MAX_REPORT_PLAN_BYTES: Final = 1 << 20
#: Entries of any list of a report's parts.
MAX_REPORT_ENTRIES: Final = 100_000

# -- Report examples -------------------------------------------------------------------------
#: Example images one report carries (corruptions, attacks, DEG-4 failure points).
MAX_REPORT_EXAMPLES: Final = 200
#: Bytes of one example PNG, and its largest side in pixels.
MAX_EXAMPLE_PNG_BYTES: Final = 1 << 20
MAX_EXAMPLE_SIDE: Final = 4096
#: Boxes one example draws per list (ground truth, clean answer, perturbed answer).
MAX_EXAMPLE_BOXES: Final = 200
#: Classes of interest one segmentation example's masks name (values 1..255 of an 8-bit PNG).
MAX_EXAMPLE_MASK_CLASSES: Final = 255

# -- Struct parameters -----------------------------------------------------------------------
#: Nesting depth of a ``google.protobuf.Struct`` of parameters (Struct = 1).
MAX_STRUCT_DEPTH: Final = 16
#: Values (numbers, strings, lists, structs) of one Struct, all levels together.
MAX_STRUCT_VALUES: Final = 2_000_000
#: Entries of the ``arrays`` map of one Compute call.
MAX_COMPUTE_ARRAYS: Final = 64

_INT32: Final = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Limit:
    """The bound of one field.

    ``kind``: "integer" / "number" (inclusive ``lo``..``hi``; a number must be finite),
    "text" (``length`` characters), "bytes" (``length`` bytes), "list" (a repeated message or
    a map), "struct" (a Struct of parameters: ``MAX_STRUCT_DEPTH``, ``MAX_STRUCT_VALUES``,
    text and key lengths), "message" (its own fields are bounded), "free" (no bound makes
    sense: ``note`` says why). ``entries``: the most entries of a repeated field (each entry
    then bounded as ``kind`` says). ``note`` says what else checks it or what 0 means."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    length: int | None = None
    entries: int | None = None
    note: str = ""

    def text(self) -> str:
        """The bound as docs/limits.md prints it."""
        if self.kind in ("integer", "number"):
            each = f"{self.kind} in [{_fmt(self.lo)}, {_fmt(self.hi)}]"
            if self.kind == "number":
                each += ", finite"
        elif self.kind == "text":
            each = f"at most {self.length:,} characters"
        elif self.kind == "bytes":
            each = f"at most {self.length:,} bytes"
        elif self.kind == "struct":
            each = (f"nesting depth <= {MAX_STRUCT_DEPTH}, <= {MAX_STRUCT_VALUES:,} values, "
                    f"strings <= {MAX_TEXT_CHARS:,} characters, keys <= {MAX_NAME_CHARS}, "
                    "numbers finite")
        elif self.kind == "message":
            each = "its fields are bounded"
        elif self.kind == "list":
            each = ""
        else:
            each = "no bound"
        if self.entries is not None:
            each = f"at most {self.entries:,} entries" + (f", each {each}" if each else "")
        return f"{each}; {self.note}" if self.note else each


def request_batches(shapes: Any, *, max_images: int = 0, task: str = "",
                    answer_bytes_per_pixel: int = 0) -> list[tuple[int, int]]:
    """[start, stop) ranges that split one batch of images (their H x W x C shapes) into
    requests every service accepts, whatever the plan's batch size or the attack's rows per
    image (:func:`byte_batches`): raw uint8 image bytes, and answers of a segmentation
    target's class maps and probabilities (estimated from the images' sizes) or
    ``answer_bytes_per_pixel`` given by the caller (a perturbation returns images)."""
    per_px = answer_bytes_per_pixel or (SEGMENTATION_ANSWER_BYTES_PER_PIXEL
                                        if task == Task.SEGMENTATION else 0)
    raw, ans = [], []
    for s in shapes:
        dims = [int(d) for d in s]
        px = dims[0] * dims[1] if len(dims) >= 2 else (dims[0] if dims else 1)
        raw.append(px * (dims[2] if len(dims) >= 3 else 1))
        ans.append(px * per_px)
    return byte_batches(raw, max_images=max_images, answer_bytes=ans)


def byte_batches(request_bytes: Sequence[int], *, max_images: int = 0,
                 answer_bytes: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """[start, stop) ranges of consecutive images, each range one request: at most
    ``max_images`` images (0: no limit of the caller's) and never more than
    :data:`MAX_IMAGES_PER_REQUEST`, at most :data:`MAX_IMAGE_BYTES_PER_CALL` of
    ``request_bytes`` and :data:`MAX_ANSWER_BYTES_PER_CALL` of ``answer_bytes``. An image
    larger than a bound alone is a request of its own (the server then names what it
    refuses)."""
    cap = MAX_IMAGES_PER_REQUEST if max_images <= 0 else min(int(max_images),
                                                            MAX_IMAGES_PER_REQUEST)
    answers = answer_bytes if answer_bytes is not None else [0] * len(request_bytes)
    out: list[tuple[int, int]] = []
    start, sent, answered = 0, 0, 0
    for i, (raw, ans) in enumerate(zip(request_bytes, answers, strict=True)):
        if i > start and (i - start >= cap or sent + raw > MAX_IMAGE_BYTES_PER_CALL
                          or answered + ans > MAX_ANSWER_BYTES_PER_CALL):
            out.append((start, i))
            start, sent, answered = i, 0, 0
        sent += raw
        answered += ans
    if start < len(request_bytes):
        out.append((start, len(request_bytes)))
    return out


def _fmt(x: float | None) -> str:
    if x is None:
        return "?"
    if not float(x).is_integer():
        return repr(float(x))
    v = int(x)
    if v > 0 and (v + 1) & v == 0 and v >= 2**31:
        return f"2^{v.bit_length()}-1"
    if v >= 10**12 and str(v).strip("0") == "1":
        return f"10^{len(str(v)) - 1}"
    return f"{v:,}"


def _int(lo: float, hi: float, entries: int | None = None, note: str = "") -> Limit:
    return Limit("integer", lo, hi, entries=entries, note=note)


def _num(lo: float, hi: float, entries: int | None = None, note: str = "") -> Limit:
    return Limit("number", lo, hi, entries=entries, note=note)


def _text(n: int, note: str = "") -> Limit:
    return Limit("text", length=n, note=note)


def _list(n: int, note: str = "") -> Limit:
    return Limit("list", entries=n, note=note)


_MSG = Limit("message")
_STRUCT = Limit("struct", note="each parameter also against its entry's schema")
_PAGE = _int(0, MAX_PAGE_SIZE, note="0 = the RPC's default")
_TOKEN = _text(MAX_PAGE_TOKEN_CHARS, note="opaque; decoded and range-checked by pagination")
_NAME = _text(MAX_NAME_CHARS)
_ID = _text(MAX_ID_CHARS)
_EVAL_ID = _text(MAX_EVALUATION_ID_CHARS, note="safe charset (letters, digits, - _ .)")
_SESSION = _text(MAX_SESSION_ID_CHARS, note="safe charset (letters, digits, - _ . /)")
_SEED = _int(0, MAX_SEED)
_IMAGES = _list(MAX_IMAGES_PER_REQUEST)
_LABELS = _int(0, MAX_CLASS_LABEL, MAX_LABELS_PER_IMAGE)
_UNIT = _num(0.0, 1.0)
_PLAN = _text(MAX_PLAN_BYTES, note=f"UTF-8 bytes; nesting depth <= {MAX_PLAN_DEPTH}, YAML "
              "anchors/aliases refused; each field as in 'Plans' below")
_PERT = "fortis.perturbation.v1."
_SC = "fortis.scoring.v1."
_EV = "fortis.evaluation.v1."
_PX = "fortis.proxy.v1."

#: Full protobuf field name -> its bound. Every field of every request message of every
#: service (recursively) is here or in a message of :data:`ECHO_MESSAGES`; enums and bools
#: are listed as "free" (the servicers refuse unknown enum values naming the field).
FIELD_LIMITS: Final[dict[str, Limit]] = {
    # common
    "fortis.common.v1.Image.image_id": _ID,
    "fortis.common.v1.Image.encoded": Limit(
        "bytes", length=MAX_IMAGE_BYTES,
        note=f"PNG/JPEG; at most {MAX_PIXELS:,} pixels, read from the header before decoding"),
    "fortis.common.v1.Image.tensor": _MSG,
    "fortis.common.v1.Tensor.dtype": Limit("free", note="enum; an unknown dtype is refused"),
    "fortis.common.v1.Tensor.shape": _int(0, MAX_TENSOR_DIM, MAX_TENSOR_DIMS,
                                          note="the product must match data"),
    "fortis.common.v1.Tensor.data": Limit("bytes", length=MAX_MESSAGE_BYTES,
                                          note="the message bound"),
    # evaluation
    _EV + "ValidatePlanRequest.plan": _PLAN,
    _EV + "ValidatePlanRequest.format": Limit("free", note="enum"),
    _EV + "CreateEvaluationRequest.plan": _PLAN,
    _EV + "CreateEvaluationRequest.format": Limit("free", note="enum"),
    _EV + "CreateEvaluationRequest.evaluation_id": _EVAL_ID,
    _EV + "GetEvaluationRequest.evaluation_id": _EVAL_ID,
    _EV + "ListEvaluationsRequest.page_size": _PAGE,
    _EV + "ListEvaluationsRequest.page_token": _TOKEN,
    _EV + "CancelEvaluationRequest.evaluation_id": _EVAL_ID,
    _EV + "WatchEvaluationRequest.evaluation_id": _EVAL_ID,
    _EV + "GetEvaluationReportRequest.evaluation_id": _EVAL_ID,
    # perturbation
    _PERT + "ListPerturbationsRequest.kind": Limit("free", note="enum"),
    _PERT + "ListPerturbationsRequest.page_size": _PAGE,
    _PERT + "ListPerturbationsRequest.page_token": _TOKEN,
    _PERT + "ListAttacksRequest.kind": Limit("free", note="enum"),
    _PERT + "ListAttacksRequest.page_size": _PAGE,
    _PERT + "ListAttacksRequest.page_token": _TOKEN,
    **{_PERT + f"{m}.{f}": lim for m in ("ApplyPerturbationRequest",
                                          "ApplyPerturbationStreamRequest")
       for f, lim in {
           "perturbation_id": _NAME,
           "severity": _int(0, MAX_LEVEL, note="severity 1..5 or level 0..30, as the "
                                               "entry's level kind says"),
           "seed": _SEED,
           "images": _IMAGES,
           "epsilon": _num(0.0, 1.0, note="PER-1 properties"),
           "params": _STRUCT,
           "surrogate": _NAME,
           "labels": _int(0, MAX_CLASS_LABEL, MAX_IMAGES_PER_REQUEST,
                          note="one per image, white-box operators"),
           "response_encoding": Limit("free", note="enum"),
           "request_id": _ID}.items()
       if not (m == "ApplyPerturbationRequest" and f == "request_id")},
    _PERT + "RunAttackRequest.attack_id": _NAME,
    _PERT + "RunAttackRequest.params": _STRUCT,
    _PERT + "RunAttackRequest.seed": _SEED,
    _PERT + "RunAttackRequest.images": _IMAGES,
    _PERT + "RunAttackRequest.proxy_session_id": _SESSION,
    _PERT + "RunAttackRequest.origin": _ID,
    _PERT + "RunAttackRequest.surrogate": _NAME,
    _PERT + "RunAttackRequest.criterion": _MSG,
    _PERT + "RunAttackRequest.ensemble": Limit("text", length=MAX_NAME_CHARS,
                                               entries=MAX_ENSEMBLE),
    _PERT + "RunAttackRequest.surrogate_models": _list(MAX_SURROGATES),
    _PERT + "ValidateAttackRequest.attack_id": _NAME,
    _PERT + "ValidateAttackRequest.params": _STRUCT,
    _PERT + "ValidateAttackRequest.criterion": _MSG,
    _PERT + "ValidateAttackRequest.task": Limit("free", note="enum; unset = classification"),
    _PERT + "ValidateAttackRequest.output_kind": Limit("free", note="enum; unset = unknown"),
    _PERT + "ValidateAttackRequest.surrogate": _NAME,
    _PERT + "ValidateAttackRequest.ensemble": Limit("text", length=MAX_NAME_CHARS,
                                               entries=MAX_ENSEMBLE),
    _PERT + "SurrogateModel.name": _NAME,
    _PERT + "SurrogateModel.model": _text(MAX_BLOB_ID_CHARS, note="an uploaded model's id"),
    _PERT + "SurrogateModel.format": Limit("free", note="enum; an unknown format is refused"),
    _PERT + "SurrogateModel.height": _int(1, MAX_SURROGATE_SIDE),
    _PERT + "SurrogateModel.width": _int(1, MAX_SURROGATE_SIDE),
    _PERT + "SurrogateModel.channels": _int(1, 3, note="1 or 3"),
    _PERT + "SurrogateModel.mean": _num(-MAX_SURROGATE_NORM, MAX_SURROGATE_NORM, 3,
                                        note="one per channel"),
    _PERT + "SurrogateModel.std": _num(MIN_SURROGATE_STD, MAX_SURROGATE_NORM, 3,
                                       note="one per channel"),
    _PERT + "SurrogateModel.labels": Limit("text", length=MAX_SURROGATE_LABEL_CHARS,
                                           entries=MAX_SURROGATE_CLASSES),
    _PERT + "SurrogateModel.label_map": _list(MAX_SURROGATE_CLASSES),
    _PERT + "SurrogateModel.target_classes": _int(1, MAX_CLASS_LABEL),
    _PERT + "SurrogateModel.task": Limit("free", note="enum; unset = classification"),
    _PERT + "SurrogateModel.outputs": _MSG,
    _PERT + "SurrogateOutputs.boxes": _int(0, MAX_SURROGATE_OUTPUT),
    _PERT + "SurrogateOutputs.boxes_normalised": Limit("free", note="bool"),
    _PERT + "SurrogateOutputs.scores": _int(0, MAX_SURROGATE_OUTPUT),
    _PERT + "SurrogateOutputs.scores_are_logits": Limit("free", note="bool"),
    _PERT + "SurrogateOutputs.labels": _int(0, MAX_SURROGATE_OUTPUT),
    _PERT + "SurrogateOutputs.class_logits": _int(0, MAX_SURROGATE_OUTPUT),
    _PERT + "SurrogateOutputs.mask": _int(
        0, MAX_SURROGATE_OUTPUT, note=f"the model's outputs are checked when it is loaded: "
        f"at most {MAX_SURROGATE_DETECTIONS:,} boxes per image, masks at most "
        f"{MAX_SURROGATE_SIDE:,} pixels a side"),
    _PERT + "SurrogateOutputs.mask_kind": Limit("free", note="enum; unset is refused for a "
                                                 "segmenter"),
    _PERT + "SurrogateLabelMapping.surrogate_label": _int(0, MAX_SURROGATE_CLASSES - 1),
    _PERT + "SurrogateLabelMapping.target_label": _int(0, MAX_CLASS_LABEL - 1),
    _PERT + "LabeledImage.image": _MSG,
    _PERT + "LabeledImage.labels": _LABELS,
    _PERT + "LabeledImage.objects": _list(MAX_BOXES_PER_IMAGE),
    _PERT + "LabeledImage.mask": _MSG,
    _PERT + "LabeledImage.no_objects": Limit("free", note="bool"),
    _PERT + "AttackCriterion.kind": Limit("free", note="enum; an unknown kind is refused"),
    _PERT + "AttackCriterion.target_label": _int(0, MAX_CLASS_LABEL),
    _PERT + "AttackCriterion.threshold": _UNIT,
    _PERT + "AttackCriterion.k": _int(0, MAX_RANK, note="0 = the criterion's default"),
    _PERT + "AttackCriterion.detection": _MSG,
    _PERT + "AttackCriterion.segmentation": _MSG,
    _PERT + "DetectionAttackCriterion.iou_threshold": _UNIT,
    _PERT + "DetectionAttackCriterion.score_threshold": _UNIT,
    _PERT + "DetectionAttackCriterion.min_objects": _int(0, MAX_BOXES_PER_IMAGE,
                                                         note="0 = all objects"),
    _PERT + "DetectionAttackCriterion.mode": _NAME,
    _PERT + "DetectionAttackCriterion.k": _int(0, MAX_RANK, note="0 = 5"),
    _PERT + "SegmentationAttackCriterion.classes": _int(0, MAX_CLASS_LABEL,
                                                        MAX_CLASSES_OF_INTEREST),
    _PERT + "SegmentationAttackCriterion.miou_threshold": _UNIT,
    _PERT + "SegmentationAttackCriterion.ignore_label": _int(-1, MAX_CLASS_LABEL),
    _PERT + "SegmentationAttackCriterion.all_absent_incorrect": Limit("free", note="bool"),
    "fortis.common.v1.BoundingBox.x_min": _num(0.0, MAX_IMAGE_SIDE),
    "fortis.common.v1.BoundingBox.y_min": _num(0.0, MAX_IMAGE_SIDE),
    "fortis.common.v1.BoundingBox.x_max": _num(0.0, MAX_IMAGE_SIDE),
    "fortis.common.v1.BoundingBox.y_max": _num(0.0, MAX_IMAGE_SIDE),
    "fortis.common.v1.BoundingBox.label": _int(0, MAX_CLASS_LABEL),
    "fortis.common.v1.BoundingBox.name": _NAME,
    "fortis.common.v1.BoundingBox.score": _UNIT,
    # proxy
    _PX + "ListTargetsRequest.page_size": _PAGE,
    _PX + "ListTargetsRequest.page_token": _TOKEN,
    _PX + "GetTargetInfoRequest.target": _NAME,
    _PX + "CreateSessionRequest.target": _NAME,
    _PX + "CreateSessionRequest.session_id": _SESSION,
    _PX + "CreateSessionRequest.query_budget": _int(0, MAX_SESSION_BUDGET, note="0 = unlimited"),
    _PX + "CreateSessionRequest.per_image_budget": _int(0, MAX_QUERIES_PER_IMAGE,
                                                        note="0 = unlimited"),
    _PX + "CreateSessionRequest.description": _text(MAX_DESCRIPTION_CHARS),
    _PX + "GetSessionRequest.session_id": _SESSION,
    _PX + "PredictRequest.session_id": _SESSION,
    _PX + "PredictRequest.origin": _ID,
    _PX + "PredictRequest.images": _IMAGES,
    _PX + "PredictStreamRequest.request_id": _ID,
    _PX + "PredictStreamRequest.session_id": _SESSION,
    _PX + "PredictStreamRequest.origin": _ID,
    _PX + "PredictStreamRequest.images": _IMAGES,
    _PX + "GetSessionStatsRequest.session_id": _SESSION,
    _PX + "ListLedgerEntriesRequest.session_id": _SESSION,
    _PX + "ListLedgerEntriesRequest.page_size": _int(0, MAX_LEDGER_PAGE_SIZE,
                                                     note="0 = the RPC's default"),
    _PX + "ListLedgerEntriesRequest.page_token": _TOKEN,
    # target (any TargetService behind the proxy)
    "fortis.target.v1.PredictRequest.images": _IMAGES,
    "fortis.target.v1.PredictStreamRequest.request_id": _ID,
    "fortis.target.v1.PredictStreamRequest.images": _IMAGES,
    # report
    "fortis.report.v1.RenderReportRequest.parts": _MSG,
    "fortis.report.v1.ReportParts.plan_text": _text(
        MAX_REPORT_PLAN_BYTES, note="UTF-8 bytes; at most 200,000 values once parsed"),
    "fortis.report.v1.ReportParts.canary": Limit(
        "message", note="CAN-1..4 results as the scoring service's Compute returned them"),
    "fortis.report.v1.ReportParts.benchmark": Limit(
        "message", note="multi-target results (CAN-5/7/8/10) as Compute returned them"),
    "fortis.report.v1.ReportParts.estimate": Limit(
        "message", note="the query estimate beside the ledger's counts, printed in the report"),
    "fortis.report.v1.ReportParts.examples": _list(
        MAX_REPORT_EXAMPLES, note="example images printed in the report"),
    "fortis.report.v1.ExampleImage.original_png": Limit(
        "bytes", length=MAX_EXAMPLE_PNG_BYTES,
        note=f"a PNG of at most {MAX_EXAMPLE_SIDE} x {MAX_EXAMPLE_SIDE} pixels, read from its "
             "header before decoding; re-encoded before it reaches the page"),
    "fortis.report.v1.ExampleImage.perturbed_png": Limit(
        "bytes", length=MAX_EXAMPLE_PNG_BYTES,
        note="as original_png, and of the same size"),
    "fortis.report.v1.ExampleImage.truth_mask_png": Limit(
        "bytes", length=MAX_EXAMPLE_PNG_BYTES,
        note="an 8-bit grey PNG the images' size, values at most the number of mask_classes"),
    "fortis.report.v1.ExampleImage.original_mask_png": Limit(
        "bytes", length=MAX_EXAMPLE_PNG_BYTES, note="as truth_mask_png"),
    "fortis.report.v1.ExampleImage.perturbed_mask_png": Limit(
        "bytes", length=MAX_EXAMPLE_PNG_BYTES, note="as truth_mask_png"),
    "fortis.report.v1.ExampleImage.mask_classes": Limit(
        "text", length=MAX_TEXT_CHARS, entries=MAX_EXAMPLE_MASK_CLASSES,
        note="printed in the report"),
    "fortis.report.v1.ExampleImage.truth_boxes": _list(
        MAX_EXAMPLE_BOXES, note="drawn on the example; finite, x_min <= x_max, y_min <= y_max"),
    "fortis.report.v1.ExampleImage.original_boxes": _list(
        MAX_EXAMPLE_BOXES, note="as truth_boxes"),
    "fortis.report.v1.ExampleImage.perturbed_boxes": _list(
        MAX_EXAMPLE_BOXES, note="as truth_boxes"),
    _SC + "SettingVerdicts.correct": Limit(
        "bytes", length=MAX_EVALUATION_IMAGES // 8,
        note="one bit per image; not read by the report service (the evaluation service "
             "sends none)"),
    # report: the per-image outcomes (checked by services/report/outcomes_part.py)
    "fortis.report.v1.ReportParts.outcomes": _MSG,
    "fortis.report.v1.PerImageOutcomes.image_ids": Limit(
        "text", length=MAX_ID_CHARS, entries=MAX_EVALUATION_IMAGES, note="unique"),
    "fortis.report.v1.PerImageOutcomes.settings": _list(
        MAX_SETTINGS, note="each (kind, name, level) once"),
    "fortis.report.v1.SettingOutcomes.kind": Limit(
        "text", length=MAX_NAME_CHARS,
        note="clean, corruption, transfer_attack, query_attack or degradation"),
    "fortis.report.v1.SettingOutcomes.name": Limit("text", length=MAX_NAME_CHARS),
    "fortis.report.v1.SettingOutcomes.level": _int(0, MAX_SCORING_LEVEL),
    "fortis.report.v1.SettingOutcomes.outcomes": Limit(
        "text", length=MAX_EVALUATION_IMAGES,
        note="exactly one of '1', '0', '-' per image of image_ids"),
    # scoring: ScoreEvaluation
    _SC + "ScoreEvaluationRequest.setup": _MSG,
    _SC + "ScoreEvaluationRequest.setting": _MSG,
    _SC + "ScoringSetup.image_ids": Limit("text", length=MAX_ID_CHARS,
                                          entries=MAX_EVALUATION_IMAGES),
    _SC + "ScoringSetup.classification": _MSG,
    _SC + "ScoringSetup.detection": _MSG,
    _SC + "ScoringSetup.segmentation": _MSG,
    _SC + "ScoringSetup.correctness": _MSG,
    _SC + "ScoringSetup.detection_criterion": _MSG,
    _SC + "ScoringSetup.segmentation_criterion": _MSG,
    _SC + "ScoringSetup.ranking": _MSG,
    _SC + "ClassificationTruth.labels": _list(MAX_EVALUATION_IMAGES),
    _SC + "LabelSet.labels": _LABELS,
    _SC + "DetectionTruth.images": _list(MAX_EVALUATION_IMAGES),
    _SC + "ImageBoxes.boxes": _MSG,
    _SC + "ImageBoxes.labels": _int(0, MAX_CLASS_LABEL, MAX_BOXES_PER_IMAGE),
    _SC + "ImageBoxes.box_format": Limit("free", note="enum"),
    _SC + "ImageBoxes.label_base": _int(0, 1),
    _SC + "ImageBoxes.width": _int(0, MAX_IMAGE_SIDE),
    _SC + "ImageBoxes.height": _int(0, MAX_IMAGE_SIDE),
    _SC + "SegmentationTruth.class_maps": _MSG,
    _SC + "CorrectnessRule.mode": Limit("free", note="enum"),
    _SC + "CorrectnessRule.k": _int(0, MAX_RANK, note="0 = the mode's default"),
    _SC + "CorrectnessRule.threshold": _UNIT,
    _SC + "DetectionCriterion.mode": Limit("free", note="enum"),
    _SC + "DetectionCriterion.k": _int(0, MAX_RANK, note="0 = the mode's default"),
    _SC + "DetectionCriterion.iou_threshold": _UNIT,
    _SC + "DetectionCriterion.confidence_threshold": _UNIT,
    _SC + "DetectionCriterion.aggregate": Limit("free", note="enum"),
    _SC + "DetectionCriterion.q": _int(0, MAX_QUORUM),
    _SC + "SegmentationCriterion.classes": _int(0, MAX_CLASS_LABEL, MAX_CLASSES_OF_INTEREST),
    _SC + "SegmentationCriterion.miou_threshold": _UNIT,
    _SC + "SegmentationCriterion.ignore_label": _int(-1, MAX_CLASS_LABEL),
    _SC + "SegmentationCriterion.all_absent": Limit("free", note="enum"),
    _SC + "RankingOptions.enabled": Limit("free", note="bool"),
    _SC + "RankingOptions.reason": _text(MAX_TEXT_CHARS),
    _SC + "RankingOptions.num_classes": _int(0, MAX_CLASS_LABEL),
    _SC + "SettingAnswers.kind": Limit("free", note="enum"),
    _SC + "SettingAnswers.name": _NAME,
    _SC + "SettingAnswers.level": _int(0, MAX_SCORING_LEVEL,
                                       note="severity 1..5, degradation level 1..1000"),
    _SC + "SettingAnswers.image_index": _int(0, MAX_EVALUATION_IMAGES - 1, MAX_EVALUATION_IMAGES),
    _SC + "SettingAnswers.errors": Limit("text", length=MAX_TEXT_CHARS,
                                         entries=MAX_EVALUATION_IMAGES),
    _SC + "SettingAnswers.classification": _MSG,
    _SC + "SettingAnswers.detection": _MSG,
    _SC + "SettingAnswers.segmentation": _MSG,
    _SC + "SettingAnswers.query_attack": _MSG,
    _SC + "SettingAnswers.sizes": _MSG,
    _SC + "SettingAnswers.excluded": _list(MAX_EVALUATION_IMAGES,
                                           note="one flag per covered image, or none"),
    _SC + "SettingAnswers.excluded_reason": _text(MAX_TEXT_CHARS, note="printed in the report"),
    _SC + "SettingAnswers.fraction_of_pixels_changed": _UNIT,
    _SC + "ClassificationAnswers.labels": _MSG,
    _SC + "ClassificationAnswers.scores": _MSG,
    _SC + "DetectionAnswers.boxes": _MSG,
    _SC + "DetectionAnswers.labels": _MSG,
    _SC + "DetectionAnswers.scores": _MSG,
    _SC + "DetectionAnswers.counts": _MSG,
    _SC + "SegmentationAnswers.class_maps": _MSG,
    _SC + "QueryAttackOutcomes.success": _list(MAX_EVALUATION_IMAGES),
    _SC + "QueryAttackOutcomes.queries": _int(0, MAX_QUERIES_PER_IMAGE, MAX_EVALUATION_IMAGES),
    _SC + "QueryAttackOutcomes.query_budget": _int(0, MAX_QUERIES_PER_IMAGE),
    _SC + "PerturbationSizes.linf": _num(0.0, MAX_DISTANCE, MAX_EVALUATION_IMAGES),
    _SC + "PerturbationSizes.l2": _num(0.0, MAX_DISTANCE, MAX_EVALUATION_IMAGES),
    # evaluation: UploadService
    _EV + "UploadBlobRequest.header": _MSG,
    _EV + "UploadBlobRequest.chunk": Limit("bytes", length=MAX_UPLOAD_CHUNK_BYTES,
                                           note="in order; together exactly header.size"),
    _EV + "UploadHeader.kind": Limit("free", note="enum; unspecified is refused"),
    _EV + "UploadHeader.size": _int(0, MAX_UPLOAD_BYTES, note="image <= 32 MiB, manifest "
                                    "<= 16 MiB, model <= 256 MiB, archive <= 2 GiB; within "
                                    "the tenant's quota"),
    _EV + "UploadHeader.media_type": _text(MAX_MEDIA_TYPE_CHARS),
    _EV + "UploadHeader.expected_sha256": _text(MAX_BLOB_ID_CHARS, note="sha256:<64 hex>"),
    _EV + "GetBlobRequest.blob_id": _text(MAX_BLOB_ID_CHARS, note="sha256:<64 hex>"),
    _EV + "ListBlobsRequest.page_size": _PAGE,
    _EV + "ListBlobsRequest.page_token": _TOKEN,
    _EV + "ListBlobsRequest.kind": Limit("free", note="enum"),
    _EV + "DeleteBlobRequest.blob_id": _text(MAX_BLOB_ID_CHARS, note="sha256:<64 hex>"),
    # scoring: ListMetrics, Compute
    _SC + "ListMetricsRequest.page_size": _PAGE,
    _SC + "ListMetricsRequest.page_token": _TOKEN,
    _SC + "ComputeRequest.metric": _NAME,
    _SC + "ComputeRequest.arrays": _list(MAX_COMPUTE_ARRAYS, note="elements of all arrays "
                                         "together: see Compute below"),
    _SC + "ComputeRequest.ArraysEntry.key": _NAME,
    _SC + "ComputeRequest.ArraysEntry.value": _MSG,
    _SC + "ComputeRequest.params": Limit("struct", note="each parameter also as in "
                                         "'Compute parameters' below"),
}

#: Messages a caller hands back only to be printed in a report (RenderReport's parts: the
#: scoring results, the test definitions, the ledger summary...). Their numbers are values,
#: not parameters -- no work depends on them (NaN prints as "n/a") -- so their numbers are
#: free; their strings and lists are bounded (:data:`ECHO_TEXT`, :data:`ECHO_LIST`).
ECHO_MESSAGES: Final = frozenset({
    "fortis.report.v1.ReportParts", "fortis.report.v1.TargetReport", "fortis.report.v1.Roles",
    "fortis.report.v1.Party", "fortis.report.v1.Environment",
    "fortis.report.v1.TestDefinition", "fortis.report.v1.LedgerSummary",
    "fortis.report.v1.LedgerSummary.SessionsEntry",
    "fortis.report.v1.LedgerSummary.AbortedAttemptSessionsEntry",
    "fortis.report.v1.EvaluationInfo", "fortis.report.v1.DatasetInfo",
    _SC + "ScoreEvaluationResponse", _SC + "IeeeMetrics", _SC + "Rate",
    _SC + "CorruptionMetrics", _SC + "SeverityRobustness", _SC + "Average",
    _SC + "WorstCase", _SC + "SeveritySummary", _SC + "AttackMetrics",
    _SC + "IeeeMetrics.MPerAttackEntry", _SC + "Ranking", _SC + "SettingRanking",
    _SC + "DegradationProfile", _SC + "ProfilePoint", _SC + "FailurePoint",
    _SC + "DegradationProfile.FractionOfPixelsChangedEntry", _SC + "QueryErrors",
    _SC + "SettingErrors", _PERT + "LevelParameters", _PERT + "NamedValue",
    _PERT + "NumberList", _PERT + "Characterisation", _SC + "QueryCurvePoint",
    "fortis.report.v1.ExampleImage", "fortis.report.v1.FailedSetting",
    "fortis.report.v1.ExampleBox", _SC + "SettingVerdicts",
    # the typed CANARY and benchmark parts: the scoring service's Compute results, echoed
    *(f"fortis.report.v1.{name}" for name in (
        "MetricNode", "MetricNode.PerModelEntry", "ModelCapability", "AttackEffect",
        "AttackCost", "PerturbationCost", "CanaryAttack", "CanaryMetrics",
        "CanaryMetrics.AttacksEntry", "Numbers", "NumberMatrix", "NumbersByName",
        "NumbersByName.ValuesEntry", "RateSummary", "AverageSummary", "ModelAttackSummary",
        "ModelSummary", "ModelSummary.CorruptionsEntry", "ModelSummary.AttacksEntry",
        "RankEntry", "RankingResult", "RankingResult.EntriesEntry", "TwoWaySqueeze",
        "TransferSummary", "TransferSummary.BySourceEntry", "TransferSummary.ByTargetEntry",
        "HeatMap", "TwoWayResults", "TwoWayResults.HeatmapsEntry", "FastRank", "IrtSubject",
        "IrtItem", "IrtAcceptance", "IrtSampler", "IrtFit", "IrtFit.SubjectsEntry",
        "IrtFit.ItemsEntry", "IrtResults", "IrtResults.SubjectsEntry",
        "IrtResults.Layer1Entry", "DefenceEffect", "DefenceEffect.AcvEntry", "DefencePair",
        "DefencePair.AttacksEntry", "BenchmarkResults",
        # sequential acceptance's record: the evaluation's stopping points, echoed
        "SequentialResults", "SequentialCriterion", "SequentialSetting",
        # the query estimate beside the ledger's counts
        "EstimateReport", "EstimatedSetting")),
})
ECHO_TEXT: Final = _text(MAX_TEXT_CHARS, note="printed in the report")
ECHO_LIST: Final = _list(MAX_REPORT_ENTRIES, note="printed in the report")
ECHO_TEXTS: Final = Limit("text", length=MAX_TEXT_CHARS, entries=MAX_REPORT_ENTRIES,
                          note="printed in the report")
ECHO_VALUE: Final = Limit("free", note="a value printed in the report, not a parameter: no "
                                       "work depends on it (NaN prints as n/a)")
#: Message types whose content is not walked (their own parsers bound them).
OPAQUE_MESSAGES: Final = frozenset({"google.protobuf.Timestamp", "google.protobuf.Duration"})


def limit_for(fd: FieldDescriptor) -> Limit | None:
    """The documented bound of field ``fd`` (None: undocumented, which the contract test
    forbids)."""
    lim = FIELD_LIMITS.get(fd.full_name)
    if lim is not None:
        return lim
    if fd.containing_type is not None and fd.containing_type.full_name in ECHO_MESSAGES:
        if fd.message_type is not None and not _is_map(fd):
            return ECHO_LIST if _repeated(fd) else _MSG
        if fd.type == FieldDescriptor.TYPE_STRING:
            return ECHO_TEXTS if _repeated(fd) else ECHO_TEXT
        return ECHO_LIST if _repeated(fd) else ECHO_VALUE
    return None


def _repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _is_map(fd: FieldDescriptor) -> bool:
    return bool(fd.message_type is not None and fd.message_type.GetOptions().map_entry)


_INTEGER_TYPES: Final = frozenset({
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64})
_FLOAT_TYPES: Final = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})


def request_fields(root: Descriptor) -> Iterator[tuple[str, FieldDescriptor]]:
    """Every field reachable from request type ``root`` once, as (path, field); a path names
    the field as a caller writes it (``images[].image_id``). Struct and Timestamp are leaves."""
    seen: set[str] = set()
    stack: list[tuple[str, Descriptor]] = [("", root)]
    while stack:
        prefix, md = stack.pop()
        for fd in md.fields:
            if fd.full_name in seen:
                continue
            seen.add(fd.full_name)
            path = f"{prefix}{fd.name}"
            yield path, fd
            sub = fd.message_type
            if sub is None or sub.full_name.startswith("google.protobuf."):
                continue
            if _is_map(fd):
                stack.append((f"{path}[].", sub))
            else:
                stack.append((f"{path}{'[]' if _repeated(fd) else ''}.", sub))


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= MAX_ECHO_CHARS else r[:MAX_ECHO_CHARS] + "..."


def _number_problem(lim: Limit, x: Any, is_float: bool) -> str:
    if is_float and not math.isfinite(x):
        return f"must be a finite number, got {x!r}"
    if lim.lo is not None and lim.hi is not None and not lim.lo <= x <= lim.hi:
        return f"{_short(x)} out of bounds: {lim.kind} in [{_fmt(lim.lo)}, {_fmt(lim.hi)}]"
    return ""


@dataclass(frozen=True)
class _FieldPlan:
    """What checking one field takes, read once per field descriptor (descriptor attributes
    cost a call into the protobuf runtime each time; every request is checked)."""

    name: str
    lim: Limit | None
    repeated: bool
    is_map: bool
    #: The message kind of the field (or of a map's value): "" for scalars, "struct" for
    #: google.protobuf.Struct, "skip" for other well-known types, "message" otherwise.
    sub: str
    map_value_sub: str
    is_number: bool
    is_float: bool


def _sub_kind(message_type: Any) -> str:
    if message_type is None:
        return ""
    full = message_type.full_name
    if full == "google.protobuf.Struct":
        return "struct"
    if full in OPAQUE_MESSAGES or full.startswith("google.protobuf."):
        return "skip"
    return "message"


_PLANS: dict[Any, _FieldPlan] = {}


def _plan(fd: FieldDescriptor) -> _FieldPlan:
    plan = _PLANS.get(fd)
    if plan is None:
        is_map = _is_map(fd)
        plan = _FieldPlan(
            name=fd.name, lim=limit_for(fd), repeated=_repeated(fd), is_map=is_map,
            sub=_sub_kind(fd.message_type),
            map_value_sub=_sub_kind(fd.message_type.fields_by_name["value"].message_type)
            if is_map else "",
            is_number=fd.type in _INTEGER_TYPES or fd.type in _FLOAT_TYPES,
            is_float=fd.type in _FLOAT_TYPES)
        _PLANS[fd] = plan
    return plan


class _Walk:
    def __init__(self) -> None:
        self.problems: list[FieldViolation] = []

    def bad(self, field: str, message: str) -> None:
        if len(self.problems) < MAX_VIOLATIONS:
            self.problems.append(FieldViolation(field, message))

    def message(self, msg: Message, prefix: str) -> None:
        for fd, value in msg.ListFields():
            if len(self.problems) >= MAX_VIOLATIONS:
                return
            plan = _plan(fd)
            self.field(plan, value, f"{prefix}.{plan.name}" if prefix else plan.name)

    def field(self, plan: _FieldPlan, value: Any, name: str) -> None:
        lim = plan.lim
        if lim is None or lim.kind == "free":
            if plan.sub and not plan.repeated:
                self.sub(plan.sub, value, name)
            return
        if plan.repeated:
            n = len(value)
            if lim.entries is not None and n > lim.entries:
                self.bad(name, f"{n:,} entries; at most {lim.entries:,}")
                return
            if plan.is_map:
                if plan.map_value_sub:
                    for key in value:
                        self.sub(plan.map_value_sub, value[key],
                                 f"{name}.{str(key)[:MAX_ECHO_CHARS]}")
                return
            if plan.sub:
                for i, item in enumerate(value):
                    self.sub(plan.sub, item, f"{name}[{i}]")
                    if len(self.problems) >= MAX_VIOLATIONS:
                        return
                return
            if lim.kind in ("text", "bytes") or plan.is_number:
                for i, item in enumerate(value):
                    if self.scalar(plan, lim, item, name, i):
                        return
            return
        if plan.sub:
            self.sub(plan.sub, value, name)
        else:
            self.scalar(plan, lim, value, name)

    def sub(self, kind: str, value: Message, name: str) -> None:
        if kind == "struct":
            self.struct(value, name)
        elif kind == "message":
            self.message(value, name)

    def scalar(self, plan: _FieldPlan, lim: Limit, value: Any, name: str,
               index: int | None = None) -> bool:
        """Check one scalar (``index``: its place in a repeated field); True when refused."""
        problem = ""
        if lim.kind in ("text", "bytes"):
            if lim.length is not None and len(value) > lim.length:
                unit = "characters" if lim.kind == "text" else "bytes"
                problem = f"{len(value):,} {unit}; at most {lim.length:,}"
        elif lim.kind in ("integer", "number") and plan.is_number:
            problem = _number_problem(lim, value, plan.is_float)
        if problem:
            self.bad(name if index is None else f"{name}[{index}]", problem)
        return bool(problem)

    def struct(self, root: Message, name: str) -> None:
        """Depth, size and string bounds of a Struct, iteratively (a Struct 10,000 deep must
        not exhaust the stack)."""
        count = 0
        stack: list[tuple[Message, str, int]] = [(root, name, 1)]
        while stack:
            node, path, depth = stack.pop()
            if depth > MAX_STRUCT_DEPTH:
                self.bad(name, f"nested more than {MAX_STRUCT_DEPTH} levels deep")
                return
            kind = node.DESCRIPTOR.full_name
            if kind == "google.protobuf.Struct":
                children = []
                for key, val in node.fields.items():
                    if len(key) > MAX_NAME_CHARS:
                        self.bad(path, f"a key of {len(key):,} characters; at most "
                                       f"{MAX_NAME_CHARS}")
                        return
                    children.append((val, f"{path}.{key}"))
            else:   # ListValue
                children = [(val, f"{path}[{i}]") for i, val in enumerate(node.values)]
            count += len(children)
            if count > MAX_STRUCT_VALUES:
                self.bad(name, f"more than {MAX_STRUCT_VALUES:,} values")
                return
            for val, p in children:
                which = val.WhichOneof("kind")
                if which == "struct_value":
                    stack.append((val.struct_value, p, depth + 1))
                elif which == "list_value":
                    stack.append((val.list_value, p, depth + 1))
                elif which == "string_value" and len(val.string_value) > MAX_TEXT_CHARS:
                    self.bad(p, f"{len(val.string_value):,} characters; at most "
                                f"{MAX_TEXT_CHARS:,}")
                    return
                elif which == "number_value" and not math.isfinite(val.number_value):
                    self.bad(p, f"must be a finite number, got {val.number_value!r}")
                    return


def check_message(msg: Message, prefix: str = "") -> None:
    """Refuse a request message any of whose fields is past its documented bound
    (:func:`limit_for`): one :class:`InvalidArgument` listing up to :data:`MAX_VIOLATIONS`
    violations, each naming the field as the caller wrote it. Unset fields are not checked
    (proto3: 0 and "" mean "the default")."""
    walk = _Walk()
    walk.message(msg, prefix)
    if walk.problems:
        raise InvalidArgument.from_violations(walk.problems)


M = TypeVar("M", bound=Message)


def checked(msg: M) -> M:
    """``msg`` after :func:`check_message` (for streams of requests)."""
    check_message(msg)
    return msg


def echoed_id(request_id: str) -> str:
    """A stream request's ``request_id`` as an answer may echo it: unchanged within
    :data:`MAX_ID_CHARS`, else empty (an over-long id is refused, never sent back)."""
    return request_id if len(request_id) <= MAX_ID_CHARS else ""
