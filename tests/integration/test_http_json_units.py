"""The HTTP/JSON adapter's pure parts (``fortis.adapters.http_json``), without a server: the
answer transforms (boxes, polygons, COCO RLE and PNG masks, score scales, proto3 numbers),
Retry-After parsing, templates, profile parsing and validation, secret references.
"""

from __future__ import annotations

import ast
import base64
import email.utils
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from fortis.adapters import http_client
from fortis.adapters import http_json as hj
from fortis.services.common import errors

from tests.integration._http_json_support import (
    CELL_PHONE,
    DOG,
    PROFILES,
    classes,
    png_b64,
    rle_counts,
    rle_string,
)

# ---------------------------------------------------------------------------------------------
# Unit: transforms
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,values,expected", [
    ("normalized_ltwh", (0.25, 0.5, 0.5, 0.25), (25, 100, 75, 150)),
    ("normalized_xyxy", (0.25, 0.5, 0.75, 0.75), (25, 100, 75, 150)),
    ("pixel_xywh", (25, 100, 50, 50), (25, 100, 75, 150)),
    ("pixel_xyxy", (25, 100, 75, 150), (25, 100, 75, 150)),
])
def test_box_formats(fmt, values, expected):
    assert hj.box_to_pixels(fmt, values, 100, 200) == pytest.approx(expected)


def test_box_format_errors():
    with pytest.raises(ValueError, match="negative"):
        hj.box_to_pixels("pixel_xywh", (0, 0, -1, 5), 10, 10)
    with pytest.raises(ValueError, match="4 numbers"):
        hj.box_to_pixels("pixel_xyxy", (0, 0, 1), 10, 10)
    with pytest.raises(ValueError, match="unknown box format"):
        hj.box_to_pixels("yolo", (0, 0, 1, 1), 10, 10)


def test_polygon_to_bounding_box():
    quad = [(0.1, 0.2), (0.6, 0.25), (0.55, 0.9), (0.05, 0.8)]
    assert hj.polygon_to_box(quad, normalized=True, width=100, height=50) == pytest.approx((5, 10, 60, 45))
    assert hj.polygon_to_box([(3, 4), (9, 1), (5, 7)], normalized=False, width=1, height=1) == (3, 1, 9, 7)
    with pytest.raises(ValueError):
        hj.polygon_to_box([], normalized=True, width=1, height=1)


def test_check_box_outside_inverted_and_tolerance():
    assert hj.check_box((-0.5, 0, 10.4, 5), 10, 5) == (0, 0, 10, 5)      # rounding: clipped
    with pytest.raises(ValueError, match="outside the 10x5 image"):
        hj.check_box((8, 0, 15, 5), 10, 5)
    with pytest.raises(ValueError, match="inverted"):
        hj.check_box((5, 0, 4, 5), 10, 5)
    with pytest.raises(ValueError, match="non-finite"):
        hj.check_box((0, 0, float("nan"), 5), 10, 5)


def test_coco_rle_matches_pycocotools():
    # Vectors from pycocotools.mask.encode (2.0.x) of these masks.
    m = np.zeros((6, 5), bool)
    m[1:4, 1:3] = True
    m[5, 4] = True
    assert hj.coco_rle_counts("7330:N") == [7, 3, 3, 3, 13, 1]
    np.testing.assert_array_equal(hj.decode_coco_rle({"size": [6, 5], "counts": "7330:N"}), m)
    np.testing.assert_array_equal(hj.decode_coco_rle({"size": [6, 5], "counts": [7, 3, 3, 3, 13, 1]}), m)
    m2 = np.zeros((40, 50), bool)
    m2[5:30, 10:45] = True
    m2[32:38, 0:3] = True
    s2 = "P16R1000m7c0`G" + "0" * 67 + "S6"
    np.testing.assert_array_equal(hj.decode_coco_rle({"size": [40, 50], "counts": s2}), m2)
    assert rle_string(rle_counts(m2)) == s2 and rle_string(rle_counts(m)) == "7330:N"


def test_coco_rle_errors():
    with pytest.raises(ValueError, match="cover 29 pixels"):
        hj.decode_coco_rle({"size": [6, 5], "counts": [7, 3, 3, 3, 13]})
    with pytest.raises(ValueError, match="alphabet"):
        hj.decode_coco_rle({"size": [6, 5], "counts": "7 30"})
    with pytest.raises(ValueError, match="ends in the middle"):
        hj.coco_rle_counts("7o")
    with pytest.raises(ValueError, match="size"):
        hj.decode_coco_rle({"counts": [30]})


def test_png_base64_masks():
    m = np.zeros((7, 9), np.uint8)
    m[2:5, 3:8] = 255
    np.testing.assert_array_equal(hj.decode_png_mask(png_b64(m)), m)
    np.testing.assert_array_equal(hj.decode_png_mask("data:image/png;base64," + png_b64(m)), m)
    np.testing.assert_array_equal(hj.decode_png_mask(png_b64(np.dstack([m, m, m]))), m)
    sixteen = (np.arange(63, dtype=np.uint16).reshape(7, 9) * 1000)
    np.testing.assert_array_equal(hj.decode_png_mask(png_b64(sixteen)), sixteen)
    with pytest.raises(ValueError, match="base64"):
        hj.decode_png_mask("not base64!")
    with pytest.raises(ValueError, match="PNG"):
        hj.decode_png_mask(base64.b64encode(b"garbage").decode())
    colour = np.dstack([m, m // 2, m])
    with pytest.raises(ValueError, match="grey"):
        hj.decode_png_mask(png_b64(colour))


def test_class_map_composition_higher_score_wins():
    a = np.zeros((3, 3), bool)
    a[:2, :2] = True
    b = np.zeros((3, 3), bool)
    b[1:, 1:] = True
    out = hj.compose_class_map([(1, a, 0.9), (2, b, 0.5)], 3, 3, background=0)
    np.testing.assert_array_equal(out, [[1, 1, 0], [1, 1, 2], [0, 2, 2]])


def test_score_scale():
    assert hj.scale_score(87.5, 100) == pytest.approx(0.875)
    assert hj.scale_score(0.3, 1) == pytest.approx(0.3)
    assert hj.scale_score(100.00001, 100) == 1.0
    with pytest.raises(ValueError, match="outside 0-1"):
        hj.scale_score(87.5, 1)
    with pytest.raises(ValueError, match="finite"):
        hj.scale_score(float("inf"), 1)


def test_proto3_numbers():
    assert hj.number(None, what="x") == 0.0                  # omitted zero
    assert hj.number("12.5", what="x") == 12.5               # int64 / special values as strings
    assert hj.number("NaN", what="x") != hj.number("NaN", what="x")
    with pytest.raises(ValueError, match="missing"):
        hj.number(None, what="x", missing_zero=False)
    with pytest.raises(ValueError, match="boolean"):
        hj.number(True, what="x")
    with pytest.raises(ValueError, match="expected a number"):
        hj.number("abc", what="x")


def test_retry_after_parsing():
    assert hj.parse_retry_after("3") == 3.0
    assert hj.parse_retry_after(" 0.5 ") == 0.5
    now = time.time()
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert hj.parse_retry_after(date, now=now) == pytest.approx(10, abs=1.5)
    assert hj.parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0
    assert hj.parse_retry_after("soon") is None and hj.parse_retry_after(None) is None


def test_templates_keep_types_and_substitute_text():
    t = {"requests": "${images}", "n": "${image_width}", "uri": "data:${image_mime};base64,${image_base64}",
         "features": [{"type": "X", "maxResults": 3}]}
    out = hj.render_template(t, {"images": [{"a": 1}], "image_width": 48, "image_mime": "image/png",
                                 "image_base64": "QUJD"})
    assert out == {"requests": [{"a": 1}], "n": 48, "uri": "data:image/png;base64,QUJD",
                   "features": [{"type": "X", "maxResults": 3}]}
    assert hj.placeholders_in(t) == {"images", "image_width", "image_mime", "image_base64"}


def _profile(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "p", "task": "classification", "labels": ["cat", "dog", "bird"],
        "request": {"url": "http://127.0.0.1:9/x", "body": {"img": "${image_base64}"}},
        "response": {"items": "labels", "label": "name", "score": "score"}}
    for k, v in overrides.items():
        node = base
        *path, last = k.split(".")
        for part in path:
            node = node.setdefault(part, {})
        if v is None:
            node.pop(last, None)
        else:
            node[last] = v
    return base


def test_proto3_omitted_fields_in_answers():
    p = hj.parse_profile(_profile(**{"response.missing_items": "empty"}))
    pred = hj.prediction_from_answer(p, {"labels": [{"name": "Dog", "score": 0.8}, {"name": "cat"}]}, 4, 4)
    assert classes(pred) == [(1, "dog", 0.8), (0, "cat", 0.0)]
    assert len(hj.prediction_from_answer(p, {}, 4, 4).classification.classes) == 0
    strict = hj.parse_profile(_profile(**{"response.missing_numbers": "error"}))
    with pytest.raises(ValueError, match="score 'score' is missing"):
        hj.prediction_from_answer(strict, {"labels": [{"name": "cat"}]}, 4, 4)
    with pytest.raises(ValueError, match="items path 'labels' not found"):
        hj.prediction_from_answer(strict, {"other": 1}, 4, 4)
    det = hj.parse_profile(_profile(**{
        "task": "detection", "response.box": {"path": "poly", "format": "normalized_polygon",
                                              "keys": ["x", "y"]}}))
    pred = hj.prediction_from_answer(det, {"labels": [
        {"name": "bird", "score": 0.5, "poly": [{}, {"x": 0.5}, {"x": 0.5, "y": 0.25}, {"y": 0.25}]}]}, 40, 20)
    (b,) = pred.detection.boxes
    assert (b.x_min, b.y_min, b.x_max, b.y_max, b.label) == (0, 0, 20, 5, 2)


def test_label_mapping():
    p = hj.parse_profile(_profile(label_map={"Kitty": "cat"}))
    assert p.label_of("Kitty") == (0, "cat")
    assert p.label_of("DOG") == (1, "dog")             # case-insensitive by default
    assert p.label_of("Zebra") == (-1, "Zebra")        # unknown names kept by name
    assert p.label_of(2) == (2, "bird") and p.label_of(7) == (-1, "7")
    exact = hj.parse_profile(_profile(label_match="exact", unknown_labels="drop"))
    assert exact.label_of("DOG") is None and exact.label_of("dog") == (1, "dog")
    one_based = hj.parse_profile(_profile(**{"response.label_index_base": 1}))
    assert one_based.label_of(1) == (0, "cat")
    with pytest.raises(errors.InvalidArgument, match="label_map.Kitty: maps to 'lion'"):
        hj.parse_profile(_profile(label_map={"Kitty": "lion"}))


def test_classification_output_modes():
    doc = {"labels": [{"name": "dog", "score": 0.2}, {"name": "cat", "score": 0.7},
                      {"name": "cat", "score": 0.1}]}
    full = hj.parse_profile(_profile(output="full_scores"))
    assert classes(hj.prediction_from_answer(full, doc, 4, 4)) == [(0, "cat", 0.7), (1, "dog", 0.2),
                                                                   (2, "bird", 0.0)]
    top1 = hj.parse_profile(_profile(output="top_k", top_k=1))
    assert classes(hj.prediction_from_answer(top1, doc, 4, 4)) == [(0, "cat", 0.7)]
    only = hj.parse_profile(_profile(output="label_only"))
    (c,) = hj.prediction_from_answer(only, doc, 4, 4).classification.classes
    assert (c.label, c.HasField("score")) == (0, False)


def test_profile_validation_names_every_problem():
    with pytest.raises(errors.InvalidArgument) as ei:
        hj.parse_profile(_profile(**{
            "task": "ocr", "colour": 1, "request.auth": {"header": "Authorization", "secret": "AKIAsupersecret"},
            "request.headers": {"X-Api-Key": "abc"}, "request.body": {"img": "${imag}"},
            "response.items": "labels[", "response.score_scale": 10}))
    fields = {v.field for v in ei.value.violations}
    assert {"task", "colour", "request.auth.secret", "request.headers.X-Api-Key", "request.body",
            "response.items", "response.score_scale"} <= fields
    assert "AKIAsupersecret" not in str(ei.value)
    assert "unknown placeholder ${imag}" in str(ei.value)
    with pytest.raises(errors.InvalidArgument, match="response.box: required for task: detection"):
        hj.parse_profile(_profile(task="detection"))
    with pytest.raises(errors.InvalidArgument, match="images_per_request > 1 needs a per_image"):
        hj.parse_profile(_profile(**{"request.images_per_request": 2}))
    with pytest.raises(errors.InvalidArgument, match="not set"):
        hj.parse_profile(_profile(**{"request.url": "${env:FORTIS_TEST_SURELY_UNSET}/x"}))


def test_secret_references(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_text("from-file\n")
    assert hj.SecretRef(f"file:{f}").resolve() == "from-file"
    monkeypatch.setenv("FORTIS_TEST_KEY", "from-env")
    assert hj.SecretRef("env:FORTIS_TEST_KEY").resolve() == "from-env"
    assert "from-env" not in repr(hj.SecretRef("env:FORTIS_TEST_KEY"))
    monkeypatch.delenv("FORTIS_TEST_KEY")
    with pytest.raises(errors.FailedPrecondition, match="env:FORTIS_TEST_KEY"):
        hj.SecretRef("env:FORTIS_TEST_KEY").resolve()
    with pytest.raises(errors.FailedPrecondition, match="cannot read"):
        hj.SecretRef(f"file:{tmp_path / 'none'}").resolve()


def test_no_grpc_in_the_adapter():
    """Every module of the package, and the shared HTTP client it sends through."""
    files = sorted(Path(hj.__file__).parent.glob("*.py")) + [Path(http_client.__file__)]
    assert len(files) > 2
    for f in files:
        tree = ast.parse(f.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m == "grpc" or m.startswith("grpc") or m.endswith("_grpc")
                       for m in mods), (f.name, mods)


def test_vendor_label_maps_are_case_insensitive():
    data = yaml.safe_load((PROFILES / "google-vision-labels.yaml").read_text())
    data["labels_file"] = str(PROFILES / "labels-coco-80.yaml")
    p = hj.parse_profile(data)
    assert p.label_of("Mobile phone") == (CELL_PHONE, "cell phone")
    assert p.label_of("MOBILE PHONE") == (CELL_PHONE, "cell phone")
    assert p.label_of("Dog") == (DOG, "dog")


def test_yaml_dates_in_templates_are_refused():
    with pytest.raises(errors.InvalidArgument, match="quote YAML dates"):
        hj.parse_profile(yaml.safe_load(
            "name: p\ntask: classification\noutput: label_only\n"
            "request: {url: 'http://h/x', body: {img: '${image_base64}', since: 2024-02-01}}\n"
            "response: {items: a, label: b}\n"))

