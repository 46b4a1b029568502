"""COCO JSON and Pascal VOC read from the data root as detection / segmentation truth.

Real files written here (PNG/JPEG by cv2, palette PNGs by Pillow, the COCO JSON and VOC XML
by hand), read by the real port (``datasets.PlanDatasets``) from plans parsed by the real
plan parser: boxes and their formats, crowd and difficult objects left out, class names
mapped through ``dataset.label_map``, masks from polygons and RLE, offset/limit, and the
refusals (paths out of the root, oversize or malformed files, XML entities) naming the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from fortis.services.common.errors import FortisError, InvalidArgument
from fortis.services.evaluation import dataset_formats
from fortis.services.evaluation.datasets import PlanDatasets
from PIL import Image
from pycocotools import mask as coco_mask

CATS = [{"id": 1, "name": "face"}, {"id": 3, "name": "cat"}]


def _plan(dataset: dict[str, Any], task: str = "detection") -> Any:
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    section = ("detection: {mode: threshold, iou_threshold: 0.5}" if task == "detection"
               else "segmentation: {classes: [1], miou_threshold: 0.5}")
    target = "haar-face" if task == "detection" else "u2netp"
    return load_plan(f"name: formats\nseed: 1\ntarget: {{name: {target}, task: {task}}}\n"
                     f"dataset: {json.dumps(dataset)}\n{section}\n"
                     "corruptions: [{id: contrast, severities: [1]}]\n", local_catalogue())


def _img(path: Path, h: int = 16, w: int = 20) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), 90, np.uint8))


def _refused(fn: Any, field: str) -> str:
    with pytest.raises(FortisError) as e:
        fn()
    fields = [v.field for v in e.value.violations] if isinstance(e.value, InvalidArgument) \
        else [e.value.message]
    assert any(f.startswith(field) for f in fields), (fields, e.value.message)
    assert "/tmp" not in e.value.message and "SECRET" not in e.value.message
    return e.value.message


# -- COCO ----------------------------------------------------------------------------------


@pytest.fixture()
def coco(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for name in ("a.png", "b.png", "c.png"):
        _img(root / "coco" / "img" / name)
    rle = np.zeros((16, 20), np.uint8)
    rle[10:14, 12:18] = 1
    compressed = coco_mask.encode(np.asfortranarray(rle))["counts"].decode("ascii")
    crowd = np.zeros((16, 20), np.uint8)
    crowd[0:2, 0:20] = 1
    doc = {
        "images": [{"id": 7, "file_name": "a.png", "width": 20, "height": 16},
                   {"id": 8, "file_name": "b.png"}, {"id": 9, "file_name": "c.png"}],
        "categories": CATS,
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 1, "bbox": [2, 3, 5, 6], "iscrowd": 0,
             "segmentation": [[2, 3, 7, 3, 7, 9, 2, 9]]},
            {"id": 2, "image_id": 7, "category_id": 3, "bbox": [0, 0, 20, 2], "iscrowd": 1,
             "segmentation": {"size": [16, 20], "counts": coco_mask.encode(
                 np.asfortranarray(crowd))["counts"].decode("ascii")}},
            {"id": 3, "image_id": 8, "category_id": 3, "bbox": [12, 10, 6, 4], "iscrowd": 0,
             "segmentation": {"size": [16, 20], "counts": compressed}},
            {"id": 4, "image_id": 99, "category_id": 1, "bbox": [0, 0, 1, 1]},
        ]}
    (root / "coco" / "ann.json").write_text(json.dumps(doc))
    return root


def _coco(**kw: Any) -> dict[str, Any]:
    return {"source": "coco", "path": "coco/ann.json", "images": "coco/img", **kw}


def test_coco_boxes_crowd_left_out_and_images_without_objects(coco):
    truths = PlanDatasets({}, data_root=coco).truths(_plan(_coco()))
    assert list(truths) == ["a.png", "b.png", "c.png"]
    a = truths["a.png"]
    assert a["boxes"] == [[2, 3, 5, 6]] and a["labels"] == [1] and a["box_format"] == "xywh"
    assert a["image_size"] == [20, 16] and a["label_base"] == 0
    assert truths["b.png"]["labels"] == [3]
    assert truths["c.png"]["boxes"] == [] and truths["c.png"]["labels"] == []
    images = PlanDatasets({}, data_root=coco).images(_plan(_coco()))
    assert [(i, im.shape, lab) for i, im, lab in images][0] == ("a.png", (16, 20, 3), ())


def test_coco_category_names_map_through_the_label_map(coco):
    ds = PlanDatasets({}, data_root=coco)
    truths = ds.truths(_plan(_coco(label_map={"face": 0, "3": 5})))
    assert truths["a.png"]["labels"] == [0] and truths["b.png"]["labels"] == [5]
    # once a map is given, an unmapped class is an error naming the annotation
    msg = _refused(lambda: ds.truths(_plan(_coco(label_map={"face": 0}))),
                   "dataset.path:annotations[2].category_id")
    assert "'cat'" in msg and "label_map" in msg


def test_coco_offset_and_limit_select_from_the_images_list(coco):
    truths = PlanDatasets({}, data_root=coco).truths(_plan(_coco(offset=1, limit=1)))
    assert list(truths) == ["b.png"]


def test_coco_image_folder_defaults_to_the_json_folder(coco):
    (coco / "coco" / "img").rename(coco / "img-moved")
    for name in ("a.png", "b.png", "c.png"):
        _img(coco / "coco" / name)
    ds = _coco()
    del ds["images"]
    assert list(PlanDatasets({}, data_root=coco).truths(_plan(ds))) == ["a.png", "b.png",
                                                                        "c.png"]


def test_coco_masks_from_polygons_and_rle_with_crowd_ignored(coco):
    truths = PlanDatasets({}, data_root=coco).truths(_plan(_coco(), task="segmentation"))
    a, b = truths["a.png"], truths["b.png"]
    assert a.shape == (16, 20) and a.dtype == np.int64
    want = np.asarray(coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(
        [[2.0, 3.0, 7.0, 3.0, 7.0, 9.0, 2.0, 9.0]], 16, 20)))).astype(bool)
    assert (a[want] == 1).all() and want.sum() > 20
    assert (a[0:2] == dataset_formats.IGNORE).all()          # the crowd region
    assert set(np.unique(a[~want][2:])) <= {0, dataset_formats.IGNORE}
    expect = np.zeros((16, 20), np.int64)
    expect[10:14, 12:18] = 3
    assert (b == expect).all()                               # compressed RLE, column-major
    assert (truths["c.png"] == 0).all()


@pytest.mark.parametrize("index,seg,field", [
    (2, {"size": [16, 20], "counts": [5, 400]}, "segmentation.counts"),
    (2, {"size": [16, 20], "counts": "\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f"},
     "segmentation.counts"),
    (2, {"size": [20, 16], "counts": [320]}, "segmentation.size"),
    (0, [[1, 2, 3]], "segmentation[0]"),
    (0, [[0, 0, 1e9, 0, 1e9, 1e9]], "segmentation[0]"),
    (0, [[0, 0, 10, 0, 10, 10, 0, 10] * 40_000], "segmentation"),
])
def test_coco_bad_segmentations_are_refused_naming_the_annotation(coco, index, seg, field):
    doc = json.loads((coco / "coco" / "ann.json").read_text())
    doc["annotations"][index]["segmentation"] = seg
    (coco / "coco" / "ann.json").write_text(json.dumps(doc))
    _refused(lambda: PlanDatasets({}, data_root=coco).truths(_plan(_coco(), "segmentation")),
             f"dataset.path:annotations[{index}].{field}")


def test_rle_runs_that_wrap_around_in_int64_are_refused_before_any_array():
    """Four runs of 2**62 and one of 320 sum to 2**64 + 320, which int64 wraps to 320, the
    pixel count of a 16x20 image: checked as int64, the check passed and numpy then wrote
    past its buffer (the process died). Run lengths are checked as Python integers."""
    for counts in ([2 ** 62] * 4 + [320], [2 ** 70], [-1, 321], [321, -1]):
        with pytest.raises(InvalidArgument) as e:
            dataset_formats._rle_counts(counts, 320, "dataset.path:annotations[0].segmentation")
        assert e.value.violations[0].field.endswith("segmentation.counts")
    assert dataset_formats._rle_counts([300, 20], 320, "x").tolist() == [300, 20]


@pytest.mark.parametrize("value", ["0", 2, 0.5, None])
def test_iscrowd_is_0_or_1(coco, value):
    doc = json.loads((coco / "coco" / "ann.json").read_text())
    doc["annotations"][0]["iscrowd"] = value
    (coco / "coco" / "ann.json").write_text(json.dumps(doc))
    _refused(lambda: PlanDatasets({}, data_root=coco).check(_plan(_coco())),
             "dataset.path:annotations[0].iscrowd")


@pytest.mark.parametrize("cid", [[1], {"a": 1}, 1.0, "1", None, True])
def test_a_category_id_that_is_not_an_integer_is_refused_naming_it(coco, cid):
    doc = json.loads((coco / "coco" / "ann.json").read_text())
    doc["annotations"][0]["category_id"] = cid
    (coco / "coco" / "ann.json").write_text(json.dumps(doc))
    _refused(lambda: PlanDatasets({}, data_root=coco).check(_plan(_coco())),
             "dataset.path:annotations[0].category_id")


def test_objects_per_image_are_bounded_and_a_class_map_holds_one_mask_at_a_time(
        coco, monkeypatch):
    """One mask per object kept until painting grew with the objects (400 small triangles
    on a 500x500 image: 175 MB); now each is decoded again when painted, and the objects
    of one image are bounded (a 50 MB file may hold ~700k)."""
    import tracemalloc

    _img(coco / "coco" / "img" / "big.png", 500, 500)
    tri = [[10.0, 10.0, 20.0, 10.0, 15.0, 20.0]]
    ds = PlanDatasets({}, data_root=coco)

    def peak_of(n: int) -> int:
        doc = {"images": [{"id": 1, "file_name": "big.png", "width": 500, "height": 500}],
               "categories": CATS,
               "annotations": [{"id": k, "image_id": 1, "category_id": 1, "iscrowd": 0,
                                "bbox": [10, 10, 10, 10], "segmentation": tri}
                               for k in range(n)]}
        (coco / "coco" / "many.json").write_text(json.dumps(doc))
        tracemalloc.start()
        try:
            truth = ds.truths(_plan(_coco(path="coco/many.json"), "segmentation"))["big.png"]
            assert (truth == 1).sum() > 0
            return int(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    few, many = peak_of(50), peak_of(400)
    assert many - few < 10 * 500 * 500, (few, many)     # not 350 more masks (87 MB)
    plan = _plan(_coco(path="coco/many.json"), "segmentation")
    monkeypatch.setattr(dataset_formats, "MAX_SHAPES_PER_IMAGE", 100)
    monkeypatch.setattr(dataset_formats, "MAX_OBJECTS_PER_IMAGE", 100)
    assert "more than 100 objects" in _refused(lambda: ds.check(plan),
                                               "dataset.path:annotations[100]")
    assert "more than 100 objects" in _refused(
        lambda: ds.check(_plan(_coco(path="coco/many.json"))), "dataset.path:annotations[100]")
    monkeypatch.setattr(dataset_formats, "MAX_SHAPE_PIXELS", 500 * 500 * 50)
    monkeypatch.setattr(dataset_formats, "MAX_SHAPES_PER_IMAGE", 1000)
    assert "object pixels" in _refused(lambda: ds.truths(plan), "dataset.path:images[0]")


@pytest.mark.parametrize("value", [10 ** 30, -1, 2 ** 63])
def test_a_label_map_value_out_of_range_is_refused_at_validation(coco, value):
    from fortis.services.common.limits import MAX_CLASS_LABEL

    with pytest.raises(InvalidArgument) as e:
        _plan(_coco(label_map={"face": value}), "segmentation")
    assert any(v.field == "dataset.label_map.face" and f"0..{MAX_CLASS_LABEL}" in v.description
               for v in e.value.violations), e.value.violations


@pytest.mark.parametrize("field,value", [("path", "../outside.json"), ("path", "/etc/x.json"),
                                         ("images", "../img"), ("images", "/tmp")])
def test_coco_paths_outside_the_root_are_refused(coco, field, value):
    _refused(lambda: PlanDatasets({}, data_root=coco).truths(_plan(_coco(**{field: value}))),
             f"dataset.{field}")


def test_coco_symlink_out_of_the_root_reads_as_missing(coco, tmp_path):
    secret = tmp_path / "other" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"SECRET": 1}')
    os.symlink(secret, coco / "link.json")
    ds = PlanDatasets({}, data_root=coco)
    out = _refused(lambda: ds.truths(_plan(_coco(path="link.json"))), "dataset.path")
    missing = _refused(lambda: ds.truths(_plan(_coco(path="nope.json"))), "dataset.path")
    assert out == missing and "not found under the data root" in out
    doc = json.loads((coco / "coco" / "ann.json").read_text())
    doc["images"][0]["file_name"] = "../../../other/x.png"
    (coco / "coco" / "ann.json").write_text(json.dumps(doc))
    _refused(lambda: ds.check(_plan(_coco())), "dataset.path:images[0].file_name")


def test_coco_oversize_and_malformed_json_are_refused(coco, monkeypatch):
    ds = PlanDatasets({}, data_root=coco)
    (coco / "coco" / "bad.json").write_text('{"images": [}')
    assert "not JSON" in _refused(lambda: ds.truths(_plan(_coco(path="coco/bad.json"))),
                                  "dataset.path")
    (coco / "coco" / "list.json").write_text("[]")
    _refused(lambda: ds.truths(_plan(_coco(path="coco/list.json"))), "dataset.path:images")
    doc = json.loads((coco / "coco" / "ann.json").read_text())
    doc["annotations"][0]["bbox"] = [1, 2, "x", 4]
    (coco / "coco" / "box.json").write_text(json.dumps(doc))
    _refused(lambda: ds.truths(_plan(_coco(path="coco/box.json"))),
             "dataset.path:annotations[0].bbox[2]")
    monkeypatch.setattr(dataset_formats, "MAX_ANNOTATION_BYTES", 100)
    assert "larger than 100 bytes" in _refused(lambda: ds.truths(_plan(_coco())),
                                               "dataset.path")


def test_no_data_root_refuses_coco(coco):
    _refused(lambda: PlanDatasets({}).check(_plan(_coco())), "dataset.path")


def test_plan_fields_of_the_formats_are_checked():
    cases = [({"source": "coco"}, "detection", "dataset.path"),
             ({"source": "coco", "path": "a.json"}, "classification", "dataset.source"),
             ({"source": "voc", "path": "v", "images": "x"}, "detection", "dataset.images"),
             ({"source": "voc", "path": "v", "split": "../x"}, "detection", "dataset.split"),
             ({"source": "manifest", "path": "m.jsonl", "label_map": {"cat": 1}},
              "detection", "dataset.label_map.cat"),
             ({"source": "coco", "path": "a.json", "label_map": {"cat": "one"}},
              "detection", "dataset.label_map.cat")]
    for ds, task, field in cases:
        if task == "classification":
            from fortis.server.app.stack import local_catalogue
            from fortis.services.evaluation.plan import load_plan

            fn: Any = lambda ds=ds: load_plan(  # noqa: E731
                f"name: f\nseed: 1\ntarget: {{name: fmnist-cnn}}\ndataset: {json.dumps(ds)}\n"
                "corruptions: [{id: contrast, severities: [1]}]\n",
                local_catalogue())
        else:
            fn = lambda ds=ds, task=task: _plan(ds, task)  # noqa: E731
        _refused(fn, field)
    plan = _plan({"source": "voc", "path": "VOCdevkit/VOC2012", "label_map": {"cat": 0}})
    assert plan.dataset.split == "val" and plan.dataset.label_map == {"cat": 0}


# -- Pascal VOC ----------------------------------------------------------------------------


def _xml(objects: str, name: str = "x") -> str:
    return (f"<annotation><filename>{name}.jpg</filename><size><width>20</width>"
            f"<height>16</height><depth>3</depth></size>{objects}</annotation>")


def _obj(name: str, box: tuple[int, int, int, int], difficult: int = 0) -> str:
    x1, y1, x2, y2 = box
    return (f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox>"
            f"<xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax>"
            "</bndbox></object>")


@pytest.fixture()
def voc(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    v = root / "VOCdevkit" / "VOC2012"
    ids = ["2007_000001", "2007_000002", "2007_000003"]
    for sets in ("Main", "Segmentation"):
        (v / "ImageSets" / sets).mkdir(parents=True)
        (v / "ImageSets" / sets / "val.txt").write_text("\n".join(ids) + "\n")
    (v / "Annotations").mkdir()
    (v / "SegmentationClass").mkdir()
    for i in ids:
        _img(v / "JPEGImages" / f"{i}.jpg")
    (v / "Annotations" / f"{ids[0]}.xml").write_text(_xml(
        _obj("cat", (3, 4, 10, 12)) + _obj("dog", (1, 1, 20, 16), difficult=1)))
    (v / "Annotations" / f"{ids[1]}.xml").write_text(_xml(_obj("person", (5, 5, 6, 6))))
    (v / "Annotations" / f"{ids[2]}.xml").write_text(_xml(""))
    for k, i in enumerate(ids):
        m = np.zeros((16, 20), np.uint8)
        m[4:12, 3:10] = 8 if k == 0 else 15
        m[3, 2:11] = 255
        im = Image.fromarray(m, mode="L").convert("P")
        im.putpalette([c for j in range(256) for c in (j, 255 - j, (7 * j) % 256)])
        im.save(v / "SegmentationClass" / f"{i}.png")
    return root


def _voc(**kw: Any) -> dict[str, Any]:
    return {"source": "voc", "path": "VOCdevkit/VOC2012", "split": "val", **kw}


def test_voc_boxes_are_converted_and_difficult_objects_left_out(voc):
    truths = PlanDatasets({}, data_root=voc).truths(_plan(_voc()))
    assert list(truths) == ["2007_000001", "2007_000002", "2007_000003"]
    first = truths["2007_000001"]
    assert first["boxes"] == [[2.0, 3.0, 10.0, 12.0]] and first["box_format"] == "xyxy"
    assert first["labels"] == [dataset_formats.VOC_CLASSES.index("cat")] == [8]
    assert truths["2007_000003"]["boxes"] == []
    mapped = PlanDatasets({}, data_root=voc).truths(
        _plan(_voc(label_map={"cat": 0, "person": 1}, offset=0, limit=2)))
    assert [t["labels"] for t in mapped.values()] == [[0], [1]]
    only = PlanDatasets({}, data_root=voc).truths(_plan(_voc(offset=1, limit=1)))
    assert list(only) == ["2007_000002"]


def test_voc_unmapped_class_and_unknown_name_are_named(voc):
    ds = PlanDatasets({}, data_root=voc)
    _refused(lambda: ds.truths(_plan(_voc(label_map={"cat": 0}))),
             "dataset.path:Annotations/2007_000002.xml:object[0].name")
    (voc / "VOCdevkit/VOC2012/Annotations/2007_000002.xml").write_text(
        _xml(_obj("unicorn", (1, 1, 2, 2))))
    _refused(lambda: ds.truths(_plan(_voc())),
             "dataset.path:Annotations/2007_000002.xml:object[0].name")


def test_voc_xml_with_an_entity_or_malformed_is_refused(voc):
    ds = PlanDatasets({}, data_root=voc)
    ann = voc / "VOCdevkit/VOC2012/Annotations/2007_000002.xml"
    ann.write_text('<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">'
                   ']><annotation><object><name>&x;</name></object></annotation>')
    assert "DTD" in _refused(lambda: ds.check(_plan(_voc())),
                             "dataset.path:Annotations/2007_000002.xml")
    ann.write_text(_xml(_obj("cat", (1, 1, 2, 2))), encoding="utf-16")
    assert "UTF-8" in _refused(lambda: ds.truths(_plan(_voc())),
                               "dataset.path:Annotations/2007_000002.xml")
    for enc in ("bogus", "utf-7", "utf-32"):
        ann.write_text(f'<?xml version="1.0" encoding="{enc}"?><annotation/>')
        assert "UTF-8" in _refused(lambda: ds.truths(_plan(_voc())),
                                   "dataset.path:Annotations/2007_000002.xml")
    ann.write_text("<annotation><object>")
    assert "well-formed" in _refused(lambda: ds.truths(_plan(_voc())),
                                     "dataset.path:Annotations/2007_000002.xml")
    ann.write_text(_xml(_obj("cat", (5, 5, 2, 2))))
    _refused(lambda: ds.truths(_plan(_voc())),
             "dataset.path:Annotations/2007_000002.xml:object[0].bndbox")


def test_voc_masks_are_palette_indices_with_boundaries_ignored(voc):
    truths = PlanDatasets({}, data_root=voc).truths(_plan(_voc(), task="segmentation"))
    m = truths["2007_000001"]
    assert m.dtype == np.int64 and m.shape == (16, 20)
    assert m[6, 5] == 8 and m[0, 0] == 0 and m[3, 5] == 255
    mapped = PlanDatasets({}, data_root=voc).truths(
        _plan(_voc(label_map={"cat": 1, "person": 1}), task="segmentation"))
    assert mapped["2007_000001"][6, 5] == 1 and mapped["2007_000002"][6, 5] == 1
    assert mapped["2007_000001"][3, 5] == 255


@pytest.mark.parametrize("path", ["../data", "/etc", "VOCdevkit/../../x"])
def test_voc_root_outside_the_data_root_is_refused(voc, path):
    _refused(lambda: PlanDatasets({}, data_root=voc).truths(_plan(_voc(path=path))),
             "dataset.path")


def test_voc_symlinked_root_and_bad_split_lines(voc, tmp_path):
    outside = tmp_path / "other" / "VOC"
    (outside / "ImageSets" / "Main").mkdir(parents=True)
    (outside / "ImageSets" / "Main" / "val.txt").write_text("SECRET\n")
    os.symlink(outside, voc / "linked")
    ds = PlanDatasets({}, data_root=voc)
    out = _refused(lambda: ds.truths(_plan(_voc(path="linked"))), "dataset.split")
    missing = _refused(lambda: ds.truths(_plan(_voc(split="nope"))), "dataset.split")
    assert out == missing
    (voc / "VOCdevkit/VOC2012/ImageSets/Main/val.txt").write_text("ok_1\n../../etc/passwd\n")
    _refused(lambda: ds.check(_plan(_voc())), "dataset.split:2")


def test_embedded_run_roots_coco_and_voc_at_their_folders(coco, voc, monkeypatch):
    """``fortis run`` (embedded) takes local paths: the data root becomes the folder holding
    the files, and the plan names them relative to it, as a server's plan would."""
    from fortis.server.cli.local import _embedded_manifest_root

    monkeypatch.chdir(coco)
    text, root = _embedded_manifest_root(json.dumps({"dataset": _coco()}))
    ds = json.loads(text)["dataset"]
    assert root == (coco / "coco").resolve() and (ds["path"], ds["images"]) == ("ann.json", "img")
    assert list(PlanDatasets({}, data_root=root).truths(_plan(ds))) == ["a.png", "b.png",
                                                                        "c.png"]
    text, root = _embedded_manifest_root(json.dumps(
        {"dataset": _voc(path=str(voc / "VOCdevkit" / "VOC2012"))}))
    ds = json.loads(text)["dataset"]
    assert root == (voc / "VOCdevkit").resolve() and ds["path"] == "VOC2012"
    assert len(PlanDatasets({}, data_root=root).truths(_plan(ds))) == 3
