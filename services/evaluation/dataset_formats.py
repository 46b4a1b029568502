"""Datasets as they are kept on disk (IEEE-P3): COCO JSON and Pascal VOC under the operator's
data root, read as ground truth for detection (IEEE-C4) and segmentation (IEEE-C5). Domain code.

COCO (``dataset: {source: coco, path: annotations/instances_val.json, images: val2017}``)
    ``path`` is the annotations JSON, ``images`` its image folder (default: the JSON's folder),
    both relative to the data root. Images are taken in the order of the JSON's ``images``
    list (``offset``/``limit`` select from it); an image's id is its ``file_name`` (what a
    person looks for in the folder; the numeric COCO id is not unique across files).
    Detection: each annotation's ``bbox`` [x, y, w, h] in pixels (box format ``xywh``) with
    its ``category_id`` as the label; an image without annotations has no objects.
    Segmentation: ``segmentation`` polygons and RLE (compressed or not) rasterised to one
    class map per image: the label per pixel, 0 = background, later (smaller) objects on top.
    Objects with ``iscrowd: 1`` are not truth: left out of the boxes, and their pixels are
    the ignore value 255 in the class map (as the segmentation section's default
    ``ignore_label``), so neither a hit nor a miss there counts.
Pascal VOC (``dataset: {source: voc, path: VOCdevkit/VOC2012, split: val}``)
    ``path`` is the VOC root; the images are those listed in ImageSets/Main/<split>.txt
    (ImageSets/Segmentation/<split>.txt for a segmentation plan), their pixels in
    JPEGImages/<id>.jpg. Detection: Annotations/<id>.xml objects; VOC's boxes are 1-based
    inclusive pixel indices, converted to pixel-edge coordinates as x1 = xmin - 1,
    y1 = ymin - 1, x2 = xmax, y2 = ymax (format ``xyxy``); ``difficult`` objects are not truth.
    Segmentation: SegmentationClass/<id>.png, a palette PNG whose pixel values are the class
    indices (0 background, 1..20 in :data:`VOC_CLASSES` order, 255 = boundary, ignored).
    XML with a DTD or an entity declaration is refused, so no entity is ever expanded.

Labels (IEEE-P6). Without ``dataset.label_map`` a COCO object's label is its category id
and a VOC object's the index of its class in :data:`VOC_CLASSES`. ``label_map`` keys may be
those numbers or the class names (a COCO category's ``name``, a VOC object's ``name``); once
a map is given every class used must be in it (by name or number), so an unmapped class is
an error naming it, never a silent miss.

Confinement and sizes are those of manifests (``datasets.py``): every path is relative,
free of ``..`` and resolves inside the data root (a missing file and one outside read the
same), the JSON and each XML are read bounded, and an image's header is checked before it
is decoded. Errors name ``dataset.path:images[3].file_name``-style places, never a server
path or file content.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path, PurePosixPath
from typing import Any

import cv2
import numpy as np
from fortis.core.task import Task
from fortis.services.common.codec import check_image_header
from fortis.services.common.errors import FailedPrecondition, InvalidArgument
from fortis.services.common.paths import relative_path
from fortis.services.evaluation.dataset_files import (
    MAX_ANNOTATION_BYTES,
    MAX_ID_CHARS,
    MAX_IMAGE_BYTES,
    utf8,
)
from fortis.services.evaluation.dataset_files import decode as _decode
from fortis.services.evaluation.dataset_files import short as _short
from fortis.services.evaluation.dataset_store import DataStore, LocalStore
from fortis.services.evaluation.plan import Plan
from PIL import Image
from pycocotools import mask as coco_mask

__all__ = ["IGNORE", "MAX_POLYGON_STEPS", "MAX_XML_BYTES", "VOC_CLASSES", "Annotated", "annotated_items",
           "load_annotated"]

#: The Pascal VOC classes; a class's label is its index here (0 is the background).
VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car",
               "cat", "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person",
               "pottedplant", "sheep", "sofa", "train", "tvmonitor")
#: Class-map value of pixels that are not truth (COCO crowd regions, VOC boundaries).
IGNORE = 255
#: Largest VOC annotation XML read, bytes (one image's objects).
MAX_XML_BYTES = 1024 * 1024
#: Longest walk of one object's polygon edges by the rasteriser (pixels at its 5x scale):
#: bounds its memory (two ints a step).
MAX_POLYGON_STEPS = 4_000_000
#: Objects of one image. Boxes are cheap to hold but scored pairwise against the answer's;
#: a segmentation object is painted over the whole image, so its count times the image's
#: pixels is bounded too (:data:`MAX_SHAPE_PIXELS`): a 50 MB file may hold ~700k objects.
MAX_OBJECTS_PER_IMAGE = 10_000
MAX_SHAPES_PER_IMAGE = 1_000
MAX_SHAPE_PIXELS = 1_000_000_000
#: A VOC image id: a file name stem, never a path.
_VOC_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
#: A DTD or entity declaration: refused before parsing (no entity expansion of any kind).
_DTD = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


@dataclass(frozen=True)
class Annotated:
    """One image of an annotated dataset, parsed but not decoded: its id, image file (and the
    field naming it), detection boxes in ``box_format`` with mapped labels, and for
    segmentation the COCO shapes (label, segmentation, crowd, field) or the VOC mask file."""

    id: str
    image: Any                            # the store's reference to the image file
    where: str
    box_format: str = "xyxy"
    boxes: list[list[float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    shapes: list[tuple[int, Any, bool, str]] = field(default_factory=list)
    size: tuple[int, int] | None = None       # COCO's declared (width, height), if any
    mask: Any = None                      # the store's reference to a VOC mask file
    mask_where: str = ""


# -- shared --------------------------------------------------------------------------------


def _label(lm: Mapping[int | str, int], number: int | None, name: str, where: str) -> int:
    """A class's service label: by name, then by number through ``label_map``; without a
    map, its number (COCO category id, VOC class index)."""
    if name in lm:
        return int(lm[name])
    if number is not None and number in lm:
        return int(lm[number])
    if lm or number is None:
        raise InvalidArgument(where, f"class {_short(name, 40)}"
                              + (f" ({number})" if number is not None else "")
                              + " has no entry in dataset.label_map (map it by name or number)")
    return number


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise InvalidArgument(where, f"must be a finite number, got {_short(v)}")
    return float(v)


def _root(data_root: Path | DataStore | None) -> DataStore:
    """The store the dataset is read from: a data root folder is the local store."""
    if data_root is None:
        raise FailedPrecondition("dataset.path: annotated datasets are not available on this "
                                 "server: the operator has not configured a data root "
                                 "(fortis serve --data-root DIR) and the plan names no "
                                 "dataset.store")
    return LocalStore(data_root) if isinstance(data_root, Path) else data_root


# -- COCO ----------------------------------------------------------------------------------


def _coco_doc(root: DataStore, path: str) -> dict[str, Any]:
    data = root.read(root.locate(PurePosixPath(), path, "dataset.path"),
                     MAX_ANNOTATION_BYTES, "dataset.path", "annotations file")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise InvalidArgument("dataset.path", f"not JSON at line {exc.lineno} column "
                              f"{exc.colno}: {exc.msg}") from None
    except (RecursionError, ValueError) as exc:   # includes text that is not UTF-8
        raise InvalidArgument("dataset.path", f"not readable JSON ({type(exc).__name__})") \
            from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise InvalidArgument("dataset.path:images", "a COCO annotations file is a JSON object "
                              "with a list 'images' (and 'annotations', 'categories')")
    for key in ("annotations", "categories"):
        if not isinstance(doc.setdefault(key, []), list):
            raise InvalidArgument(f"dataset.path:{key}", "must be a list")
    return doc


def _coco_categories(doc: dict[str, Any]) -> dict[int, str]:
    cats: dict[int, str] = {}
    for k, c in enumerate(doc["categories"]):
        where = f"dataset.path:categories[{k}]"
        if not isinstance(c, dict) or isinstance(c.get("id"), bool) \
                or not isinstance(c.get("id"), int):
            raise InvalidArgument(f"{where}.id", "each category needs an integer id")
        cats[c["id"]] = str(c.get("name", ""))[:256]
    return cats


def _coco_items(plan: Plan, root: DataStore) -> list[Annotated]:
    ds = plan.dataset
    doc = _coco_doc(root, ds.path)
    cats = _coco_categories(doc)
    base = relative_path(ds.images, "dataset.images") if ds.images else PurePosixPath(ds.path).parent
    chosen: dict[Any, int] = {}
    items: list[dict[str, Any]] = []
    for k in range(ds.offset, min(len(doc["images"]), ds.offset + ds.limit)):
        im, where = doc["images"][k], f"dataset.path:images[{k}]"
        if not isinstance(im, dict) or not isinstance(im.get("file_name"), str):
            raise InvalidArgument(f"{where}.file_name", "each image needs a file_name")
        name = im["file_name"]
        if len(name) > MAX_ID_CHARS:
            raise InvalidArgument(f"{where}.file_name", f"at most {MAX_ID_CHARS} characters")
        if not utf8(name):
            raise InvalidArgument(f"{where}.file_name", "must be UTF-8 text (a lone surrogate "
                                  "escape names no file)")
        iid = im.get("id")
        if isinstance(iid, bool) or not isinstance(iid, int | str) or iid in chosen:
            raise InvalidArgument(f"{where}.id", f"a unique integer or string id is needed, "
                                  f"got {_short(iid)}")
        size = None
        if "width" in im or "height" in im:
            size = (int(_number(im.get("width"), f"{where}.width")),
                    int(_number(im.get("height"), f"{where}.height")))
        chosen[iid] = len(items)
        items.append({"id": name, "where": f"{where}.file_name", "size": size,
                      "image": root.locate(base, name, f"{where}.file_name"),
                      "boxes": [], "labels": [], "shapes": []})
    if len({it["id"] for it in items}) != len(items):
        raise InvalidArgument("dataset.path:images", "file_name repeats: image ids must be "
                              "unique")
    lm = plan.dataset.label_map
    seg = plan.target.task == Task.SEGMENTATION
    for j, a in enumerate(doc["annotations"]):
        where = f"dataset.path:annotations[{j}]"
        if not isinstance(a, dict):
            raise InvalidArgument(where, "each annotation is a JSON object")
        slot = chosen.get(a.get("image_id")) if isinstance(a.get("image_id"), int | str) \
            else None
        if slot is None:
            continue                       # an image outside the selection (or unknown)
        cid = a.get("category_id")
        if isinstance(cid, bool) or not isinstance(cid, int) or cid not in cats:
            raise InvalidArgument(f"{where}.category_id", f"not a category of the file: "
                                  f"{_short(cid)}")
        crowd = a.get("iscrowd", 0)
        if crowd not in (0, 1) or isinstance(crowd, float):
            raise InvalidArgument(f"{where}.iscrowd", f"0 or 1, got {_short(crowd)}")
        crowd = bool(crowd)
        it = items[slot]
        if seg:
            if "segmentation" not in a:
                raise InvalidArgument(f"{where}.segmentation", "a segmentation plan needs "
                                      "each object's segmentation")
            label = IGNORE if crowd else _label(lm, cid, cats[cid], f"{where}.category_id")
            if len(it["shapes"]) >= MAX_SHAPES_PER_IMAGE:
                raise InvalidArgument(where, f"more than {MAX_SHAPES_PER_IMAGE} objects on image "
                                      f"{_short(it['id'])}")
            it["shapes"].append((label, a["segmentation"], crowd, f"{where}.segmentation"))
        elif not crowd:                    # crowd regions are not objects to find
            box = a.get("bbox")
            if not isinstance(box, list) or len(box) != 4:
                raise InvalidArgument(f"{where}.bbox", "[x, y, width, height] in pixels is "
                                      "needed")
            if len(it["boxes"]) >= MAX_OBJECTS_PER_IMAGE:
                raise InvalidArgument(where, f"more than {MAX_OBJECTS_PER_IMAGE} objects on "
                                      f"image {_short(it['id'])}")
            b = [_number(x, f"{where}.bbox[{n}]") for n, x in enumerate(box)]
            if b[2] < 0 or b[3] < 0:
                raise InvalidArgument(f"{where}.bbox", "width and height must be >= 0")
            it["boxes"].append(b)
            it["labels"].append(_label(lm, cid, cats[cid], f"{where}.category_id"))
    return [Annotated(id=it["id"], image=it["image"], where=it["where"], box_format="xywh",
                      boxes=it["boxes"], labels=it["labels"], shapes=it["shapes"],
                      size=it["size"]) for it in items]


def _rle_counts(counts: Any, n: int, where: str) -> np.ndarray:
    """Run lengths of a COCO RLE, from a list or COCO's compressed string, checked to cover
    exactly ``n`` pixels (a wrong sum would read or write past the mask). Checked as Python
    integers, before any array exists: in int64 huge runs could wrap around to a sum of
    ``n`` and then make numpy write past its buffer."""
    if isinstance(counts, str):
        s = counts.encode("ascii", "replace")
        out: list[int] = []
        p = 0
        while p < len(s):
            x = k = 0
            more = True
            while more:
                if p >= len(s) or k > 12:
                    raise InvalidArgument(f"{where}.counts", "not a COCO compressed RLE string")
                c = s[p] - 48
                x |= (c & 0x1F) << (5 * k)
                more = bool(c & 0x20)
                p += 1
                k += 1
                if not more and c & 0x10:
                    x |= -1 << (5 * k)
            if len(out) > 2:
                x += out[-2]
            out.append(x)
            if len(out) > n + 1:
                raise InvalidArgument(f"{where}.counts", "more runs than pixels")
    elif isinstance(counts, list) and len(counts) <= n + 1 \
            and all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        out = counts
    else:
        raise InvalidArgument(f"{where}.counts", "run lengths (a list of integers or COCO's "
                              "compressed string) are needed")
    if any(c < 0 or c > n for c in out) or sum(out) != n:
        raise InvalidArgument(f"{where}.counts", f"run lengths must be >= 0 and cover the "
                              f"{n} pixels of the image")
    return np.array(out, dtype=np.int64)


def _shape_mask(seg: Any, h: int, w: int, where: str) -> np.ndarray:
    """One COCO ``segmentation`` as an HxW bool mask: polygons rasterised as COCO's own tools
    do (pycocotools), RLE decoded here with its run lengths checked."""
    if isinstance(seg, dict):
        size = seg.get("size")
        if size != [h, w]:
            raise InvalidArgument(f"{where}.size", f"[{h}, {w}] (the image's height, width) is "
                                  f"needed, got {_short(size)}")
        runs = _rle_counts(seg.get("counts"), h * w, where)
        values = np.arange(len(runs)) % 2 == 1
        return np.repeat(values, runs).reshape((w, h)).T    # COCO RLE is column-major
    if not isinstance(seg, list) or not seg:
        raise InvalidArgument(where, "polygons (lists of x, y) or an RLE object are needed")
    polys = []
    for k, poly in enumerate(seg):
        if not isinstance(poly, list) or len(poly) < 6 or len(poly) % 2 \
                or len(poly) > 2 * 1_000_000:
            raise InvalidArgument(f"{where}[{k}]", "a polygon is an even list of at least 6 "
                                  "numbers (x1, y1, x2, y2, ...)")
        polys.append([_number(v, f"{where}[{k}]") for v in poly])
    # The rasteriser walks every edge pixel by pixel at 5x scale: a few wild coordinates would
    # make it allocate without bound, so the walk is measured first.
    steps = 0.0
    for k, poly in enumerate(polys):
        xy = np.asarray(poly).reshape(-1, 2)
        if np.abs(xy).max() > 4 * max(h, w) + 16:
            raise InvalidArgument(f"{where}[{k}]", f"coordinates far outside the {w}x{h} image")
        steps += float(np.abs(np.diff(np.vstack([xy, xy[:1]]), axis=0)).max(axis=1).sum()) * 5
    if steps > MAX_POLYGON_STEPS:
        raise InvalidArgument(where, f"polygons too long to rasterise (perimeter {steps / 5:.0f}"
                              f" pixels; at most {MAX_POLYGON_STEPS // 5})")
    rles = coco_mask.frPyObjects(polys, h, w)
    return np.asarray(coco_mask.decode(coco_mask.merge(rles)), dtype=bool)


def _coco_class_map(it: Annotated, h: int, w: int) -> np.ndarray:
    if len(it.shapes) * h * w > MAX_SHAPE_PIXELS:
        raise InvalidArgument(it.where, f"{len(it.shapes)} objects on a {w}x{h} image: more "
                              f"than {MAX_SHAPE_PIXELS} object pixels to paint")
    out = np.zeros((h, w), np.int64)
    crowd = np.zeros((h, w), bool)
    areas = []
    for n, (_, seg, is_crowd, where) in enumerate(it.shapes):
        m = _shape_mask(seg, h, w, where)
        if is_crowd:
            crowd |= m
        else:
            areas.append((-int(m.sum()), n))
    # Largest first, so small objects stay visible; each mask is decoded again rather than
    # kept, so memory stays one mask whatever the number of objects.
    for _, n in sorted(areas):
        label, seg, _, where = it.shapes[n]
        out[_shape_mask(seg, h, w, where)] = label
    out[crowd & (out == 0)] = IGNORE
    return out


# -- Pascal VOC ----------------------------------------------------------------------------


def _voc_ids(plan: Plan, root: DataStore, base: PurePosixPath) -> list[tuple[str, str]]:
    """(id, field) of the split's selected images."""
    ds = plan.dataset
    sets = "Segmentation" if plan.target.task == Task.SEGMENTATION else "Main"
    path = root.locate(base, f"ImageSets/{sets}/{ds.split}.txt", "dataset.split")
    data = root.read(path, MAX_ANNOTATION_BYTES, "dataset.split", "image list")
    out: list[tuple[str, str]] = []
    n = 0
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        words = line.split()
        if not words:
            continue
        n += 1
        if n <= ds.offset:
            continue
        if len(out) >= ds.limit:
            break
        iid = words[0].decode("utf-8", "replace")
        if not _VOC_ID.fullmatch(iid):
            raise InvalidArgument(f"dataset.split:{lineno}", f"not an image id (a file name "
                                  f"stem): {_short(iid, 40)}")
        out.append((iid, f"dataset.split:{lineno}"))
    if len({i for i, _ in out}) != len(out):
        raise InvalidArgument("dataset.split", "image ids repeat in the list")
    return out


def _xml(data: bytes, where: str) -> ET.Element:
    if b"\x00" in data or data.startswith((b"\xfe\xff", b"\xff\xfe")):
        # a UTF-16 document would hide its declarations from the check below
        raise InvalidArgument(where, "XML must be UTF-8 (or ASCII) text")
    if _DTD.search(data):
        raise InvalidArgument(where, "XML with a DTD or entity declaration is refused")
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise InvalidArgument(where, f"not well-formed XML (line {exc.position[0]}, column "
                              f"{exc.position[1]})") from None
    except (LookupError, ValueError):      # an encoding declaration expat cannot read
        raise InvalidArgument(where, "XML must be UTF-8 (or ASCII) text") from None


def _voc_objects(root_el: ET.Element, lm: Mapping[int | str, int], where: str
                 ) -> tuple[list[list[float]], list[int]]:
    boxes: list[list[float]] = []
    labels: list[int] = []
    objects = root_el.findall("object")
    if len(objects) > MAX_OBJECTS_PER_IMAGE:
        raise InvalidArgument(where, f"more than {MAX_OBJECTS_PER_IMAGE} objects")
    for k, obj in enumerate(objects):
        at = f"{where}:object[{k}]"
        if (obj.findtext("difficult") or "0").strip() == "1":
            continue                       # VOC's own evaluation leaves these out
        name = (obj.findtext("name") or "").strip()
        number = VOC_CLASSES.index(name) if name in VOC_CLASSES else None
        label = _label(lm, number, name, f"{at}.name")
        bb = obj.find("bndbox")
        coords = []
        for tag in ("xmin", "ymin", "xmax", "ymax"):
            text = bb.findtext(tag) if bb is not None else None
            try:
                coords.append(float((text or "").strip()))
            except ValueError:
                raise InvalidArgument(f"{at}.bndbox.{tag}", f"a number is needed, got "
                                      f"{_short(text, 30)}") from None
        x1, y1, x2, y2 = coords[0] - 1, coords[1] - 1, coords[2], coords[3]
        if not all(np.isfinite(coords)) or x2 <= x1 or y2 <= y1:
            raise InvalidArgument(f"{at}.bndbox", "needs xmin <= xmax and ymin <= ymax")
        boxes.append([x1, y1, x2, y2])
        labels.append(label)
    return boxes, labels


def _voc_items(plan: Plan, root: DataStore) -> list[Annotated]:
    base = relative_path(plan.dataset.path, "dataset.path")
    out = []
    for iid, where in _voc_ids(plan, root, base):
        image = root.locate(base, f"JPEGImages/{iid}.jpg", f"{where}.image")
        if plan.target.task == Task.SEGMENTATION:
            mask = root.locate(base, f"SegmentationClass/{iid}.png", f"{where}.mask")
            out.append(Annotated(id=iid, image=image, where=f"{where}.image", mask=mask,
                                 mask_where=f"{where}.mask"))
            continue
        at = f"dataset.path:Annotations/{iid}.xml"
        el = _xml(root.read(root.locate(base, f"Annotations/{iid}.xml", at), MAX_XML_BYTES,
                            at, "annotation file"), at)
        boxes, labels = _voc_objects(el, plan.dataset.label_map, at)
        out.append(Annotated(id=iid, image=image, where=f"{where}.image", boxes=boxes,
                             labels=labels))
    return out


def _voc_class_map(root: DataStore, it: Annotated, lm: Mapping[int | str, int], h: int, w: int
                   ) -> np.ndarray:
    """The class indices of a SegmentationClass PNG (palette or grey), mapped through
    ``label_map``; 255 (boundary) stays the ignore value."""
    assert it.mask is not None
    data = root.read(it.mask, MAX_IMAGE_BYTES, it.mask_where, "mask file")
    check_image_header(data, it.mask_where)
    try:
        with Image.open(BytesIO(data)) as im:
            if im.mode not in ("P", "L"):
                raise InvalidArgument(it.mask_where, f"a palette or grey PNG of class indices "
                                      f"is needed, got mode {im.mode}")
            m = np.asarray(im, dtype=np.int64)
    except (OSError, ValueError, Image.DecompressionBombError):
        raise InvalidArgument(it.mask_where, "not a readable PNG") from None
    if m.shape != (h, w):
        raise InvalidArgument(it.mask_where, f"mask is {m.shape[1]}x{m.shape[0]}, image {w}x{h}")
    if not lm:
        return m
    lut = np.arange(256, dtype=np.int64)
    for v in np.unique(m).tolist():
        if v not in (0, IGNORE):
            name = VOC_CLASSES[v] if v < len(VOC_CLASSES) else str(v)
            lut[v] = _label(lm, v, name, it.mask_where)
    if 0 in lm or "background" in lm:
        lut[0] = _label(lm, 0, "background", it.mask_where)
    return lut[m]


# -- the port's view -------------------------------------------------------------------------


def annotated_items(plan: Plan, data_root: Path | DataStore | None) -> list[Annotated]:
    """The plan's images of a COCO / VOC dataset, annotations parsed and every path confined,
    nothing decoded (what ValidatePlan checks before a run)."""
    root = _root(data_root)
    if plan.dataset.source == "coco":
        return _coco_items(plan, root)
    return _voc_items(plan, root)


def load_annotated(plan: Plan, data_root: Path | DataStore | None, *, truths: bool = True
                   ) -> list[tuple[str, np.ndarray, Any]]:
    """(id, RGB image, ground truth) per selected image: detection ``{boxes, labels,
    box_format, label_base, image_size}``, segmentation an HxW int64 class map (None for
    every image when ``truths`` is false: the images alone)."""
    out: list[tuple[str, np.ndarray, Any]] = []
    root = _root(data_root)
    for it in annotated_items(plan, root):
        img = _decode(root.read(it.image, MAX_IMAGE_BYTES, it.where, "image file"), it.where,
                      cv2.IMREAD_COLOR)
        h, w = img.shape[:2]
        if it.size is not None and it.size != (w, h):
            raise InvalidArgument(it.where, f"the image is {w}x{h}, the annotations say "
                                  f"{it.size[0]}x{it.size[1]}")
        truth: Any = None
        if not truths:
            pass
        elif plan.target.task == Task.SEGMENTATION:
            truth = _voc_class_map(root, it, plan.dataset.label_map, h, w) \
                if it.mask is not None \
                else _coco_class_map(it, h, w)
        else:
            truth = {"boxes": it.boxes, "labels": it.labels, "box_format": it.box_format,
                     "label_base": 0, "image_size": [w, h]}
        out.append((it.id, img, truth))
    return out

