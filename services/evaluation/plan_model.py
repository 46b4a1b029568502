"""The parsed test plan (IEEE-P3) as frozen records: what :func:`plan.validate_plan` returns
once every field has been checked. Domain code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fortis.core.criteria import TARGETED_CRITERIA
from fortis.core.task import Task
from fortis.services.common.acceptance import Criterion, SequentialPolicy
from fortis.services.common.surrogates import SurrogateDefinition

__all__ = ["ANNOTATED_FORMATS", "DATASETS", "MAX_MEMBERS", "MAX_UPLOAD_SHARDS",
           "NAMED_CLASS_FORMATS", "STORE_FORMATS", "STREAM_FORMATS", "S3Location",
           "UploadLocation", "AttackTest", "CorruptionTest", "DatasetRef", "DegradationTest", "Member", "Plan", "Role", "TargetRef", "crafted_on"]

#: Where a plan's images may come from (``dataset.source``).
DATASETS = ("fashion-mnist", "imagenet-photos", "manifest", "uploads", "coco", "voc",
            "webdataset", "hf", "folders")
#: The sources that carry boxes and masks as annotation files under the data root
#: (``dataset_formats.py``).
ANNOTATED_FORMATS = ("coco", "voc")
#: The sources kept as streams of samples: WebDataset shards, Hugging Face save_to_disk
#: folders (``dataset_streams.py``, ``dataset_hf.py``; classification and detection) and
#: class-folder trees (``dataset_folders.py``; classification).
STREAM_FORMATS = ("webdataset", "hf", "folders")
#: The sources read from a store (the data root, or ``dataset.store``: an S3 prefix).
STORE_FORMATS = ANNOTATED_FORMATS + STREAM_FORMATS
#: Sources whose class names are label_map keys (IEEE-P6).
NAMED_CLASS_FORMATS = STORE_FORMATS


@dataclass(frozen=True, kw_only=True)
class Role:
    name: str = ""
    organisation: str = ""


@dataclass(frozen=True, kw_only=True)
class TargetRef:
    name: str
    task: Task = Task.CLASSIFICATION
    endpoint: str = ""
    credentials_ref: str = ""
    #: The price per 1000 queries the plan declares (the endpoint's ``?price_per_1000=``,
    #: taken off ``endpoint``); None: none declared.
    price_per_1000: float | None = None


@dataclass(frozen=True, kw_only=True)
class Member:
    """One model of a multi-target plan (CANARY benchmark, CAN-7): a target on this server,
    the surrogate that stands for it when transfer attacks are crafted (its white-box twin;
    "" = attacks are not crafted on it) and, for CAN-5, the member it is the defended version
    of."""

    name: str
    surrogate: str = ""
    defends: str = ""
    #: The price per 1000 queries its endpoint declares (``?price_per_1000=``); None: none.
    price_per_1000: float | None = None


#: Uploaded WebDataset shards one plan may name (``dataset.store.upload``).
MAX_UPLOAD_SHARDS = 1000

#: Models in one multi-target plan (each runs every test of the plan).
MAX_MEMBERS = 8


def crafted_on(attack: str, surrogate: str) -> str:
    """The setting name of a multi-target plan's transfer attack crafted on one model's
    surrogate (CAN-7): ``<attack>.<surrogate>``, e.g. ``pgd.fmnist-cnn-at`` (it names proxy
    sessions and artifacts, so it keeps their charset)."""
    return f"{attack}.{surrogate}"


@dataclass(frozen=True, kw_only=True)
class S3Location:
    """A plan's ``dataset.store.s3``: the bucket and key prefix the dataset's paths are
    relative to, the S3-compatible endpoint (empty: AWS), and the name of the calling
    tenant's credentials as the operator configured them (never a secret in the plan)."""

    bucket: str
    prefix: str = ""
    endpoint_url: str = ""
    region: str = ""
    credentials: str = ""


@dataclass(frozen=True, kw_only=True)
class UploadLocation:
    """A plan's ``dataset.store.upload``: the calling tenant's uploaded dataset archives by
    content id (IEEE-P4: the ids pin the data). One archive holds a COCO, VOC, class-folder
    or Hugging Face folder; for WebDataset each archive is one shard, in the order named."""

    blobs: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class DatasetRef:
    source: str
    split: str = "test"
    limit: int = 100
    offset: int = 0
    #: Dataset label -> service label. Keys are integers; "coco" and "voc" also take class
    #: names (a COCO category's or a VOC object's name), since those datasets name classes.
    label_map: Mapping[int | str, int] = field(default_factory=dict)
    #: source "manifest": a JSON-lines file under the data root; "coco": the annotations JSON;
    #: "voc": the VOC root (the folder holding Annotations/, ImageSets/, JPEGImages/)
    path: str = ""
    images: str = ""        # source "coco": the image folder (default: the JSON's folder)
    manifest: str = ""      # source "uploads": "sha256:..." of the tenant's uploaded manifest
    #: sources "hf" and "webdataset" (detection): the box format of the data ("" = the
    #: source's default: hf "xywh", webdataset "xyxy")
    box_format: str = ""
    #: where the files are read: None = the operator's data root; else an S3 prefix or the
    #: tenant's uploaded archives
    store: S3Location | UploadLocation | None = None


@dataclass(frozen=True, kw_only=True)
class CorruptionTest:
    """One severity-graded perturbation of the plan: a corruption (IEEE-A1..A5) or a style
    change (IEEE-A6), at the listed severities, with optional parameters."""

    id: str
    severities: tuple[int, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DegradationTest:
    """An incremental degradation operator (DEG-1) at the listed levels (1..30), scored as
    degradation profiles with failure points (DEG-2..DEG-4). White-box operators (model
    gradient descent) name the surrogate whose gradient they follow."""

    id: str
    levels: tuple[int, ...]
    surrogate: str = ""


@dataclass(frozen=True, kw_only=True)
class AttackTest:
    id: str
    name: str               # distinct label in the report (default: the id)
    params: Mapping[str, Any]
    surrogate: str = ""
    #: Further surrogates crafted on together with ``surrogate`` (the plan's ``surrogate: [a,
    #: b, ...]``: an IEEE-A7 model ensemble whose first is the primary).
    ensemble: tuple[str, ...] = ()
    limit: int = 0          # attack only the first N images (0 = all)
    #: The success criterion as plain data (RunAttackRequest.criterion): ``kind`` (see
    #: ``core.criteria.ATTACK_CRITERIA``), ``target_label`` (the plan's ``targeted:
    #: {label: N}``), ``threshold``, ``k``, and for detection / segmentation targets the
    #: IEEE-C4 / C5 parameters taken from the plan's ``detection`` / ``segmentation``
    #: sections (one definition with scoring).
    criterion: Mapping[str, Any] = field(default_factory=dict)
    #: CAN-6 evaluation example selection (``select_budget: true`` or its settings: factor,
    #: max_steps, images, alpha; ``selection.py``); empty: the plan's epsilon as given.
    select_budget: Mapping[str, Any] = field(default_factory=dict)

    @property
    def targeted(self) -> bool:
        return self.criterion.get("kind") in TARGETED_CRITERIA

    @property
    def criterion_kind(self) -> str:
        return str(self.criterion.get("kind") or "")


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str
    seed: int
    requester: Role
    tester: Role
    provider: Role
    target: TargetRef
    dataset: DatasetRef
    correctness: Mapping[str, Any]
    corruptions: tuple[CorruptionTest, ...]
    attacks: tuple[AttackTest, ...]
    batch_size: int
    degradation: tuple[DegradationTest, ...] = ()
    #: IEEE-C4 / IEEE-C5 service-type parameters (IEEE-P3), validated by
    #: core/criteria (DetectionCriterion / SegmentationCriterion).
    detection: Mapping[str, Any] = field(default_factory=dict)
    segmentation: Mapping[str, Any] = field(default_factory=dict)
    #: The tenant's own surrogates (IEEE-A7, IEEE-P6): uploaded models the attacks may name.
    surrogates: tuple[SurrogateDefinition, ...] = ()
    #: Acceptance criteria: the report's verdict and ``fortis run``'s exit code.
    acceptance: tuple[Criterion, ...] = ()
    #: CANARY metrics per attack in the report (CAN-1..CAN-4), the plan's ``canary: true``.
    canary: bool = False
    #: Multi-target plans (the plan's ``targets:``; CAN-5/7/8): every model, the first being
    #: ``target``. Empty for a single-target plan.
    members: tuple[Member, ...] = ()
    #: CAN-10 fast mode: a finished multi-target evaluation of this tenant whose models this
    #: plan's target is ranked against, without re-running them (``baseline: {evaluation:}``).
    baseline: str = ""
    #: ``acceptance.sequential``: stop settings once the criteria reading them are decided.
    sequential: SequentialPolicy = SequentialPolicy()
    raw: Mapping[str, Any]

    @property
    def is_benchmark(self) -> bool:
        """A multi-target plan or a fast-mode ranking against a baseline (CANARY)."""
        return len(self.members) > 1 or bool(self.baseline)

