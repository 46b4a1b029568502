"""A plan's parties and subjects: its roles, the target (or the targets of a multi-target
plan, each with the surrogate that stands for it), the fast-mode baseline, the dataset, and
the tenant's own surrogates with the checks that tie surrogates to the target's task and
labels (IEEE-P1, IEEE-P3, IEEE-P6, IEEE-A7). Domain code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fortis.core.task import BOX_FORMATS, TASKS, Task
from fortis.infra.storage.blobs import is_blob_id
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import (
    MAX_CLASS_LABEL,
    MAX_DATASET_IMAGES,
    MAX_DATASET_OFFSET,
    MAX_ENSEMBLE,
    MAX_LABEL_MAP,
    MAX_PLAN_STRING_CHARS,
    MAX_SURROGATES,
)
from fortis.services.common.paths import relative_path
from fortis.services.common.prices import split_price
from fortis.services.common.surrogates import (
    BUILTIN_SURROGATE_NAMES,
    BUILTIN_SURROGATE_TASKS,
    SurrogateDefinition,
    SurrogateSpec,
    parse_definition,
    spec_of,
)
from fortis.services.evaluation.plan_fields import Fields, short
from fortis.services.evaluation.plan_model import (
    ANNOTATED_FORMATS,
    DATASETS,
    MAX_MEMBERS,
    MAX_UPLOAD_SHARDS,
    NAMED_CLASS_FORMATS,
    STORE_FORMATS,
    STREAM_FORMATS,
    DatasetRef,
    Member,
    Plan,
    Role,
    S3Location,
    TargetRef,
    UploadLocation,
)

__all__ = ["check_surrogate_labels", "check_surrogate_tasks", "parse_baseline", "parse_dataset",
           "parse_members", "parse_roles", "parse_surrogates", "parse_target", "surrogate_names",
           "surrogate_specs"]

#: An evaluation id (as ``service.check_evaluation_id`` accepts).
_EVALUATION_ID = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}$")


def parse_roles(v: Fields, doc: Mapping[str, Any]) -> dict[str, Role]:
    roles = v.mapping(doc.get("roles"), "roles", required=False)
    v.unknown(roles, "roles", {"requester", "tester", "provider"})
    out = {}
    for r in ("requester", "tester", "provider"):
        rd = v.mapping(roles.get(r), f"roles.{r}", required=False)
        v.unknown(rd, f"roles.{r}", {"name", "organisation"})
        out[r] = Role(name=v.string(rd, "name", f"roles.{r}"),
                      organisation=v.string(rd, "organisation", f"roles.{r}"))
    return out


def parse_members(v: Fields, doc: Mapping[str, Any]) -> tuple[TargetRef, list[Member]]:
    """``targets:`` (a multi-target plan) instead of ``target:``; the first is the primary."""
    if "target" in doc:
        v.bad("targets", "give either target (one model) or targets (several), not both")
    items = v.items(doc, "targets")
    if not items:
        v.bad("targets", "must list at least one target")
        return TargetRef(name=""), []
    if len(items) > MAX_MEMBERS:
        v.bad("targets", f"{len(items):,} targets; at most {MAX_MEMBERS} in one plan")
        items = items[:MAX_MEMBERS]
    members: list[Member] = []
    refs: list[TargetRef] = []
    for i, item in enumerate(items):
        p = f"targets[{i}]"
        t = v.mapping(item, p)
        v.unknown(t, p, {"name", "task", "endpoint", "credentials_ref", "surrogate", "defends"})
        endpoint, price = _endpoint(v, t, p)
        ref = TargetRef(name=v.string(t, "name", p, required=True),
                        task=Task(v.string(t, "task", p, default=Task.CLASSIFICATION,
                                           choices=TASKS)),
                        endpoint=endpoint, price_per_1000=price,
                        credentials_ref=v.string(t, "credentials_ref", p))
        sur = t.get("surrogate")
        if sur is not None and not isinstance(sur, str):
            v.bad(f"{p}.surrogate", "must be the name of one surrogate model")
            sur = ""
        members.append(Member(name=ref.name, surrogate=sur or "",
                              defends=v.string(t, "defends", p), price_per_1000=price))
        refs.append(ref)
    names = [m.name for m in members]
    for i, m in enumerate(members):
        if m.name and names.index(m.name) != i:
            v.bad(f"targets[{i}].name", f"target {short(m.name)} is listed twice")
        if m.defends and m.defends not in names:
            v.bad(f"targets[{i}].defends", f"{short(m.defends)} is not one of the plan's targets")
        if m.defends and m.defends == m.name:
            v.bad(f"targets[{i}].defends", "a model cannot be its own baseline")
        if refs[i].task != refs[0].task:
            v.bad(f"targets[{i}].task", f"every target of one plan has the same task "
                  f"({refs[0].task})")
    return refs[0], members


def _endpoint(v: Fields, t: Mapping[str, Any], p: str) -> tuple[str, float | None]:
    """A target's ``endpoint`` without its ``?price_per_1000=`` (the price the plan
    declares for the target's queries, read by the estimate), and that price."""
    endpoint = v.string(t, "endpoint", p)
    try:
        return split_price(endpoint, f"{p}.endpoint")
    except InvalidArgument as exc:
        v.problems.extend(exc.violations)
        return endpoint.partition("?")[0], None


def parse_target(v: Fields, doc: Mapping[str, Any]) -> TargetRef:
    t = v.mapping(doc.get("target"), "target")
    v.unknown(t, "target", {"name", "task", "endpoint", "credentials_ref"})
    endpoint, price = _endpoint(v, t, "target")
    return TargetRef(name=v.string(t, "name", "target", required=True),
                     task=Task(v.string(t, "task", "target", default=Task.CLASSIFICATION,
                                        choices=TASKS)),
                     endpoint=endpoint, price_per_1000=price,
                     credentials_ref=v.string(t, "credentials_ref", "target"))


#: A VOC split: the name of a file in ImageSets/Main (ImageSets/Segmentation), not a path.
_VOC_SPLIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


def _label_map(v: Fields, d: Mapping[str, Any], source: str) -> dict[int | str, int]:
    """``dataset.label_map``: dataset label -> service label (integers). COCO, VOC, HF
    (ClassLabel names) and WebDataset (names in .json) name their classes, so those sources
    also take a class name as the key."""
    label_map: dict[int | str, int] = {}
    lm = d.get("label_map") or {}
    if not isinstance(lm, Mapping):
        v.bad("dataset.label_map", "must be a mapping of dataset label -> service label")
        return label_map
    if len(lm) > MAX_LABEL_MAP:
        v.bad("dataset.label_map", f"{len(lm):,} entries; at most {MAX_LABEL_MAP:,}")
        return label_map
    for k, val in lm.items():
        where = f"dataset.label_map.{str(k)[:40]}"
        key: int | str
        try:
            key = int(k)
        except (TypeError, ValueError, OverflowError):
            if source not in NAMED_CLASS_FORMATS or not isinstance(k, str) or not k.strip() \
                    or len(k) > 256:
                v.bad(where, f"labels must be integers, got {short(k)}: {short(val)}"
                      + ("" if source in NAMED_CLASS_FORMATS else
                         " (class names are keys of sources "
                         f"{', '.join(NAMED_CLASS_FORMATS)} only)"))
                continue
            key = k
        try:
            if isinstance(val, bool):
                raise TypeError
            label = int(val)
        except (TypeError, ValueError, OverflowError):
            v.bad(where, f"the service label must be an integer, got {short(val)}")
            continue
        if not 0 <= label <= MAX_CLASS_LABEL:
            v.bad(where, f"the service label must be in 0..{MAX_CLASS_LABEL}, got {short(val)}")
            continue
        label_map[key] = label
    return label_map


#: An S3 bucket name (the AWS rules, which S3-compatible servers share).
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
#: A name of the tenant's store credentials in the operator's configuration.
_CREDENTIALS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
_REGION = re.compile(r"[a-z0-9][a-z0-9\-]{0,31}")


def _upload_store(v: Fields, raw: Any, source: str) -> UploadLocation | None:
    """``dataset.store.upload``: one archive id, or for WebDataset a list of shard ids."""
    p = "dataset.store.upload"
    ids = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and source != "webdataset":
        v.bad(p, f"source '{source}' reads one archive: name its id ('sha256:...'); a "
              "list of uploads is for WebDataset shards")
        return None
    if not ids or len(ids) > MAX_UPLOAD_SHARDS:
        v.bad(p, f"1..{MAX_UPLOAD_SHARDS} uploaded shards, got {len(ids)}")
        return None
    ok = True
    for k, b in enumerate(ids):
        if not is_blob_id(b):
            where = f"{p}[{k}]" if isinstance(raw, list) else p
            v.bad(where, "the id ('sha256:' and 64 lowercase hex digits) of an uploaded "
                  "archive (fortis upload-dataset --archive)")
            ok = False
    if ok and len(set(ids)) != len(ids):
        v.bad(p, "an uploaded shard is named twice")
    return UploadLocation(blobs=tuple(str(b) for b in ids)) if ok else None


def _store(v: Fields, d: Mapping[str, Any],
           source: str) -> S3Location | UploadLocation | None:
    """``dataset.store: {s3: {bucket, prefix, endpoint_url, region, credentials}}`` or
    ``dataset.store: {upload: "sha256:..." | [ids of WebDataset shards]}``."""
    if d.get("store") is None:
        return None
    st = v.mapping(d.get("store"), "dataset.store")
    v.unknown(st, "dataset.store", {"s3", "upload"})
    if "upload" in st:
        if "s3" in st:
            v.bad("dataset.store", "one of s3 and upload")
        if source not in STORE_FORMATS:
            v.bad("dataset.store", f"only sources {', '.join(STORE_FORMATS)} are read from a "
                  "store")
        return _upload_store(v, st.get("upload"), source)
    s3 = v.mapping(st.get("s3"), "dataset.store.s3")
    if not s3:
        return None
    p = "dataset.store.s3"
    v.unknown(s3, p, {"bucket", "prefix", "endpoint_url", "region", "credentials"})
    loc = S3Location(bucket=v.string(s3, "bucket", p, required=True),
                     prefix=v.string(s3, "prefix", p),
                     endpoint_url=v.string(s3, "endpoint_url", p),
                     region=v.string(s3, "region", p),
                     credentials=v.string(s3, "credentials", p, required=True))
    if source not in STORE_FORMATS:
        v.bad("dataset.store", f"only sources {', '.join(STORE_FORMATS)} are read from a "
              "store")
    if loc.bucket and not _S3_BUCKET.fullmatch(loc.bucket):
        v.bad(f"{p}.bucket", f"an S3 bucket name (3-63 lowercase letters, digits, '.', '-'), "
              f"got {short(loc.bucket)}")
    if loc.prefix:
        try:
            relative_path(loc.prefix, f"{p}.prefix", "bucket")
        except InvalidArgument as exc:
            v.bad(f"{p}.prefix", exc.violations[0].description)
    if loc.endpoint_url and (not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?/?",
                                              loc.endpoint_url)):
        v.bad(f"{p}.endpoint_url", "an http(s)://host[:port] URL is needed (no path, no "
              "user information)")
    if loc.region and not _REGION.fullmatch(loc.region):
        v.bad(f"{p}.region", f"a region name, got {short(loc.region)}")
    if loc.credentials and not _CREDENTIALS.fullmatch(loc.credentials):
        v.bad(f"{p}.credentials", "the name of your store credentials as the operator "
              "configured them (letters, digits, '_', '.', '-'); never a key itself")
    return loc


def parse_dataset(v: Fields, doc: Mapping[str, Any], task: Task) -> DatasetRef:
    d = v.mapping(doc.get("dataset"), "dataset")
    v.unknown(d, "dataset", {"source", "split", "limit", "offset", "label_map", "path",
                             "manifest", "images", "store", "box_format"})
    source = v.string(d, "source", "dataset", required=True, choices=DATASETS)
    if source in ("voc", "hf"):
        # VOC's own split names (train, val, trainval, or the operator's own list); a
        # DatasetDict's split folders (train, validation, test, ...)
        split = v.string(d, "split", "dataset", default="val" if source == "voc" else "test")
        if not _VOC_SPLIT.fullmatch(split):
            v.bad("dataset.split", f"the name of a {'list in the VOC root' if source == 'voc' else 'split of the DatasetDict'}"
                  f" (letters, digits, '_', '.', '-'), got {short(split)}")
    else:
        split = v.string(d, "split", "dataset", default="test", choices=("test", "train"))
    dataset = DatasetRef(source=source, split=split,
                         limit=v.integer(d, "limit", "dataset", default=100, lo=1,
                                                 hi=MAX_DATASET_IMAGES),
                         offset=v.integer(d, "offset", "dataset", default=0, lo=0,
                                                   hi=MAX_DATASET_OFFSET),
                         label_map=_label_map(v, d, source), path=v.string(d, "path", "dataset"),
                         manifest=v.string(d, "manifest", "dataset"),
                         images=v.string(d, "images", "dataset"),
                         box_format=v.string(d, "box_format", "dataset", choices=BOX_FORMATS),
                         store=_store(v, d, source))
    if dataset.box_format and dataset.source not in ("hf", "webdataset"):
        v.bad("dataset.box_format", "only sources hf and webdataset take a box format (COCO, "
              "VOC and manifests say their own)")
    uploaded_shards = dataset.source == "webdataset" and isinstance(dataset.store,
                                                                      UploadLocation)
    if uploaded_shards and dataset.path:
        v.bad("dataset.path", "uploaded WebDataset shards are named by dataset.store.upload "
              "(each upload is one shard); leave dataset.path out")
    if dataset.source in STREAM_FORMATS and not dataset.path and not uploaded_shards:
        v.bad("dataset.path", {"hf": "source 'hf' needs the folder written by save_to_disk",
                               "webdataset": "source 'webdataset' needs the shards, e.g. "
                               "shards/val-{000..009}.tar",
                               "folders": "source 'folders' needs the folder holding one "
                               "folder per class"}[dataset.source])
    if dataset.source == "folders" and task != Task.CLASSIFICATION:
        v.bad("dataset.source", "source 'folders' holds a class per image: it is read by "
              "classification plans")
    if dataset.source == "manifest" and not dataset.path:
        v.bad("dataset.path", "source 'manifest' needs the path of a JSON-lines manifest")
    if dataset.source == "coco" and not dataset.path:
        v.bad("dataset.path", "source 'coco' needs the path of a COCO annotations JSON "
              "(relative to the data root)")
    if dataset.source == "voc" and not dataset.path:
        v.bad("dataset.path", "source 'voc' needs the path of a VOC root, e.g. "
              "VOCdevkit/VOC2012 (relative to the data root)")
    if dataset.images and dataset.source != "coco":
        v.bad("dataset.images", "only source 'coco' takes an image folder")
    if dataset.source == "uploads" and not is_blob_id(dataset.manifest):
        # uploaded data is named by content id, never by a server path
        v.bad("dataset.manifest", "source 'uploads' needs the id ('sha256:' and 64 lowercase "
              "hex digits) of an uploaded manifest (fortis upload-dataset)")
    if dataset.source != "uploads" and dataset.manifest:
        v.bad("dataset.manifest", "only source 'uploads' takes a manifest id")
    if task != Task.CLASSIFICATION and dataset.source not in ("manifest", "uploads",
                                                              *STORE_FORMATS):
        v.bad("dataset.source", f"a {task} plan needs ground truth: use source 'manifest', "
              "'uploads', 'coco', 'voc', 'hf' or 'webdataset' (boxes or masks per image)")
    elif task == Task.SEGMENTATION and dataset.source in ("hf", "webdataset"):
        v.bad("dataset.source", f"source '{dataset.source}' is read for classification and "
              "detection; for segmentation use 'coco', 'voc' or a manifest")
    if task == Task.CLASSIFICATION and dataset.source in ANNOTATED_FORMATS:
        v.bad("dataset.source", f"source '{dataset.source}' holds boxes and masks: it is read "
              "by detection and segmentation plans (for classification use a manifest)")
    return dataset



def parse_baseline(v: Fields, doc: Mapping[str, Any], members: list[Member]) -> str:
    """CAN-10 fast mode: ``baseline: {evaluation: ID}`` with one target and its surrogate."""
    if "baseline" not in doc:
        return ""
    b = v.mapping(doc.get("baseline"), "baseline")
    v.unknown(b, "baseline", {"evaluation"})
    eid = v.string(b, "evaluation", "baseline", required=True)
    if eid and not _EVALUATION_ID.fullmatch(eid):
        v.bad("baseline.evaluation", "not an evaluation id (letters, digits, '-', '_', '.')")
    if len(members) != 1 or not members[0].surrogate:
        v.bad("baseline", "fast mode ranks one new model: list exactly one entry under "
              "targets, with its surrogate")
    return eid



def check_surrogate_tasks(v: Fields, names: list[str], raw: Any, p: str, task: Task,
                           doc: Mapping[str, Any]) -> None:
    """A transfer attack is crafted on surrogates of the target's task (IEEE-A7 on IEEE-C4 /
    C5 targets: a detector's or segmenter's ``task_loss``): each name whose task is known --
    a built-in (``BUILTIN_SURROGATE_TASKS``; the others classify) or one of the plan's own
    surrogates (its ``task``, classification by default) -- must match; an operator's
    surrogate is checked when it runs."""
    raw_own = doc.get("surrogates")
    own = {str(d["name"]): Task(d["task"]) if d.get("task") in TASKS else Task.CLASSIFICATION
           for d in (raw_own if isinstance(raw_own, list) else [])
           if isinstance(d, Mapping) and isinstance(d.get("name"), str)}
    for j, name in enumerate(names):
        if name in BUILTIN_SURROGATE_TASKS:
            known = BUILTIN_SURROGATE_TASKS[name]
        elif name in own:
            known = own[name]
        elif name in BUILTIN_SURROGATE_NAMES:
            known = Task.CLASSIFICATION
        else:
            continue
        if known != task:
            fitting = [n for n in BUILTIN_SURROGATE_NAMES
                       if BUILTIN_SURROGATE_TASKS.get(n, Task.CLASSIFICATION) == task]
            where = f"{p}[{j}]" if isinstance(raw, list) else p
            v.bad(where, f"{short(name, 60)} is a {known} surrogate; a transfer attack on a "
                  f"{task} target is crafted on a {task} surrogate (built-in: "
                  f"{', '.join(fitting) or 'none'}; or one of the plan's surrogates with "
                  f"task: {task})")


def surrogate_names(v: Fields, raw: Any, p: str) -> list[str]:
    """An attack's ``surrogate``: a name, or a list of names (an ensemble, the first the
    primary: IEEE-A7)."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and not 1 <= len(raw) <= 1 + MAX_ENSEMBLE:
        v.bad(p, f"an ensemble lists 1 to {1 + MAX_ENSEMBLE} surrogates, got {len(raw)}")
        return []
    out: list[str] = []
    for j, x in enumerate(items):
        where = f"{p}[{j}]" if isinstance(raw, list) else p
        if not isinstance(x, str) or not x.strip() or len(x) > MAX_PLAN_STRING_CHARS:
            v.bad(where, f"must be a surrogate's name, got {short(x)}")
        elif x in out:
            v.bad(where, f"'{short(x, 60)}' is already in the ensemble")
        else:
            out.append(x)
    return out


def parse_surrogates(v: Fields, doc: Mapping[str, Any]) -> list[SurrogateDefinition]:
    """The tenant's own surrogates (IEEE-A7, IEEE-P6; schema: services/common/surrogates.py):
    uploaded models by id, never a path on the server."""
    raw = doc.get("surrogates")
    if raw is None:
        return []
    if not isinstance(raw, list):
        v.bad("surrogates", "must be a list of surrogate definitions")
        return []
    if len(raw) > MAX_SURROGATES:
        v.bad("surrogates", f"{len(raw)} surrogates; at most {MAX_SURROGATES}")
        raw = raw[:MAX_SURROGATES]
    out: list[SurrogateDefinition] = []
    for k, item in enumerate(raw):
        defn, problems = parse_definition(item, f"surrogates[{k}]")
        v.problems.extend(problems)
        if defn is None:
            continue
        if any(d.name == defn.name for d in out):
            v.bad(f"surrogates[{k}].name", f"'{defn.name}' is defined twice")
            continue
        out.append(defn)
    return out


def surrogate_specs(plan: Plan, target_labels: list[str] | tuple[str, ...]
                    ) -> dict[str, SurrogateSpec]:
    """The plan's surrogates resolved against the target's labels (IEEE-P6), by name."""
    return {d.name: spec_of(d, target_labels, f"surrogates[{k}]")
            for k, d in enumerate(plan.surrogates)}


def check_surrogate_labels(plan: Plan, target_labels: list[str] | tuple[str, ...],
                           images: Any, n_images: int) -> None:
    """Every image a transfer attack covers must have a true label that each of its tenant
    surrogates maps a class to (IEEE-P6), or the surrogate has no loss to follow."""
    specs = surrogate_specs(plan, target_labels)
    index = {d.name: k for k, d in enumerate(plan.surrogates)}
    v = Fields()
    for at in plan.attacks:
        n = min(n_images, at.limit) if at.limit else n_images
        for name in (at.surrogate, *at.ensemble):
            if name not in specs:
                continue
            mapped = specs[name].mapped_targets()
            for image_id, _, labels in list(images)[:n]:
                if labels and int(labels[0]) not in mapped:
                    lab = int(labels[0])
                    shown = target_labels[lab] if 0 <= lab < len(target_labels) else lab
                    v.bad(f"surrogates[{index[name]}].label_map", f"image '{image_id}' has "
                          f"target label {lab} ({shown}), which no class of surrogate "
                          f"'{name}' maps to")
                    break
    if v.problems:
        raise InvalidArgument.from_violations(v.problems[:100])

