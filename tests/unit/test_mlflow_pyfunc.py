"""The MLflow pyfunc target's pure half on hostile input: URL options (each error names the
option), and scoring answers that do not fit (NaN, ragged, deeply nested, wrong counts,
unknown labels, a stack trace) -- each a ``TargetResponseError`` naming the part. The answers
of a real ``mlflow models serve`` are checked in tests/integration/test_mlflow_pyfunc.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fortis.adapters.mlflow_pyfunc import (
    detections_of,
    labels_of,
    parse_url,
    predictions_of,
    request_body,
    scores_of,
)
from fortis.adapters.mlflow_pyfunc.backend import server_error
from fortis.adapters.registry import backend_for
from fortis.adapters.target_errors import TargetResponseError
from fortis.services.common.errors import InvalidArgument

URL = "mlflow+http://127.0.0.1:5000"


def test_defaults_and_the_registry():
    o = parse_url(URL)
    assert (o.path, o.request, o.input_kind, o.layout, o.dtype) == (
        "/invocations",
        "inputs",
        "tensor",
        "nhwc",
        "UINT8",
    )
    assert parse_url(f"{URL}/serving/m1/invocations/").path == "/serving/m1/invocations"
    assert parse_url(f"{URL}?request=dataframe_split").input_kind == "bytes"
    assert backend_for(f"{URL}?num_classes=4").labels == ("0", "1", "2", "3")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"{URL}?colour=1", "option 'colour': unknown"),
        (f"{URL}?request=tensors", "option 'request'"),
        (f"{URL}?request=dataframe_split&input=tensor", "option 'input'"),
        (f"{URL}?dtype=UINT8&mean=0.5", "option 'dtype'"),
        (f"{URL}?input=bytes&layout=nchw", "option 'layout'"),
        (f"{URL}?std=0", "option 'std'"),
        (f"{URL}?dtype=FP32&mean=nan", "option 'mean'"),
        (f"{URL}?resize=99999x99999", "option 'resize'"),
        (f"{URL}?num_classes=-3", "option 'num_classes'"),
        (f"{URL}?num_classes=99999999", "option 'num_classes'"),
        (f"{URL}?task=segmentation", "option 'task'"),
        (f"{URL}?box_format=xywh", "option 'box_format': applies to task=detection"),
        (f"{URL}?task=detection&output=labels", "option 'output'"),
        (f"{URL}?task=detection&min_score=2", "option 'min_score'"),
        (f"{URL}?timeout=0", "option 'timeout'"),
        (f"{URL}?column=", "option 'column'"),
        ("mlflow+http://127.0.0.1:5000/a/../../admin", "'..'"),
        ("mlflow+http://127.0.0.1:99999", "bad port"),
        ("mlflow+ftp://h/x", "not an mlflow+http"),
    ],
)
def test_bad_urls_name_the_option(url, words):
    with pytest.raises(InvalidArgument) as ei:
        parse_url(url)
    assert "target" in str(ei.value) and words in str(ei.value)
    if "option" in words:
        assert "mlflow option" in str(ei.value)


def test_a_missing_labels_file_names_the_option(tmp_path):
    with pytest.raises(InvalidArgument, match="mlflow option 'labels': cannot read"):
        backend_for(f"{URL}?labels={tmp_path}/none.txt")


def test_request_bodies():
    x = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    assert json.loads(request_body(parse_url(URL), [x])) == {"inputs": [x.tolist()]}
    assert json.loads(request_body(parse_url(f"{URL}?request=instances"), [x, x])) == {
        "instances": [x.tolist(), x.tolist()]
    }
    doc = json.loads(
        request_body(
            parse_url(f"{URL}?request=dataframe_split&column=img"), [b"\x89PNG1", b"\x89PNG2"]
        )
    )
    assert doc == {"dataframe_split": {"columns": ["img"], "data": [["iVBORzE="], ["iVBORzI="]]}}


def test_scores_labels_and_records():
    p = scores_of([[0.25, 0.75], [1.0, 0.0]], 2, "probabilities")
    assert p.tolist() == [[0.25, 0.75], [1.0, 0.0]]
    recs = scores_of([{"cat": 0.1, "dog": 0.9}], 1, "probabilities")  # a DataFrame's records
    assert recs.tolist() == [[0.1, 0.9]]
    logits = scores_of([[0.0, 0.0]], 1, "logits")
    assert np.allclose(logits, 0.5)
    assert labels_of([2, "cat", [1.0]], 3, ["cat", "dog", "eel"]) == [2, 0, 1]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "malformed JSON"),
        (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
        (b'{"outputs": []}', "no 'predictions'"),
        (b'{"predictions": [[0.5, 0.5]]}', "expected a list of 2 answers"),
        (b'{"predictions": {"a": 1}}', "got dict"),
        (b'{"predictions": [[0.5, 0.5], [0.5]]}', "not a rectangular array"),
        (b'{"predictions": [[NaN, 0.5], [0.5, 0.5]]}', "NaN"),
        (b'{"predictions": [[1e308, 1e308], [0.5, 0.5]]}', "probabilities"),
        (b'{"predictions": [["a", "b"], [0.5, 0.5]]}', "not a rectangular array"),
        (b'{"predictions": [0.5, 0.5]}', "shape [2]"),
        (b'{"predictions": [[], []]}', "shape [2, 0]"),
    ],
)
def test_hostile_score_answers(body, words):
    with pytest.raises(TargetResponseError) as ei:
        scores_of(predictions_of(body, 2), 2, "probabilities")
    assert words in ei.value.message


@pytest.mark.parametrize(
    ("preds", "words"),
    [
        (["cat", "wolf"], "predictions[1]: label 'wolf'"),
        ([0, 7], "predictions[1]: class 7"),
        ([0, -1], "predictions[1]: class -1"),
        ([0, 1.5], "predictions[1]"),
        ([0, True], "predictions[1]"),
        ([0, None], "predictions[1]"),
        ([0, {"x": 1}], "predictions[1]"),
        ([0], "expected a list of 2 answers"),
    ],
)
def test_hostile_label_answers(preds, words):
    with pytest.raises(TargetResponseError) as ei:
        labels_of(preds, 2, ["cat", "dog"])
    assert words in ei.value.message


def test_detections_batched_and_per_image():
    o = parse_url(f"{URL}?task=detection")
    batched = {"boxes": [[[1, 2, 5, 6], [0, 0, 0, 0]]], "scores": [[0.9, 0.0]], "labels": [[1, -1]]}
    (d,) = detections_of(batched, o, [(10, 10)], [(10, 10)], 2)
    assert [(b.x_min, b.y_min, b.x_max, b.y_max, b.label) for b in d.boxes] == [(1, 2, 5, 6, 1)]
    per_image = [
        {"boxes": [[1, 2, 5, 6], [2, 2, 4, 4]], "scores": [0.5, 0.7], "labels": [0, 1]},
        {"boxes": [], "scores": [], "labels": []},
    ]
    a, b = detections_of(per_image, o, [(10, 10), (8, 8)], [(10, 10), (8, 8)], 2)
    assert [x.label for x in a.boxes] == [1, 0] and len(b.boxes) == 0


@pytest.mark.parametrize(
    ("preds", "words"),
    [
        ({"boxes": [[[1, 2, "x", 6]]]}, "predictions.boxes is not a rectangular array"),
        ({"boxes": [[[np.nan, 2, 5, 6]]], "scores": [[0.5]]}, "output 'boxes'"),
        ({"boxes": [[[1, 2, 5, 6]]], "scores": [[0.5, 0.2]]}, "output 'scores'"),
        ({"scores": [[0.5]]}, "no boxes output"),
        (
            [{"boxes": [[1, 2, 5, 6]], "labels": [9]}, {"boxes": []}],
            "predictions[0]: output 'labels'",
        ),
        (["boxes"], "predictions[0]: expected an object"),
    ],
)
def test_hostile_detection_answers(preds, words):
    n = len(preds) if isinstance(preds, list) else 1
    with pytest.raises(TargetResponseError) as ei:
        detections_of(preds, parse_url(f"{URL}?task=detection"), [(10, 10)] * n, [(10, 10)] * n, 2)
    assert words in ei.value.message, ei.value.message


def test_server_errors_keep_the_models_words_not_the_frames():
    body = json.dumps(
        {
            "error_code": "BAD_REQUEST",
            "message": "Encountered an error",
            "stack_trace": 'Traceback (most recent call last):\n  File "/srv/x.py", '
            "line 3, in f\nValueError: bad shape\n",
        }
    ).encode()
    text = server_error(body)
    assert text.startswith("ValueError: bad shape") and "Encountered an error" in text
    assert "/srv/x.py" not in text and "Traceback" not in text
    assert server_error(b"plain failure") == "plain failure"
