"""torchserve://, bentoml:// and rayserve:// URLs and label files: every mistake is an InvalidArgument on
``target`` naming the option, before anything is contacted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fortis.adapters import model_servers as ms
from fortis.adapters.registry import backend_for
from fortis.core.task import Task
from fortis.services.common import errors


def _msg(url: str) -> str:
    with pytest.raises(errors.InvalidArgument) as ei:
        ms.parse_url(url)
    (v,) = ei.value.violations
    assert v.field == "target"
    return v.description


def test_defaults_and_forms() -> None:
    o = ms.parse_url("torchserve://ts.example.com/resnet")
    assert (o.transport, o.port, o.path, o.version, o.task, o.output, o.top_k) == (
        "http",
        8080,
        "resnet",
        "",
        Task.CLASSIFICATION,
        "top_k",
        5,
    )
    o = ms.parse_url("torchserve+https://ts.example.com/resnet/2.0?task=detection")
    assert (o.transport, o.port, o.version, o.task, o.base_url) == (
        "https",
        443,
        "2.0",
        Task.DETECTION,
        "https://ts.example.com:443",
    )
    o = ms.parse_url("bentoml://[::1]:3001/classify?input=json&field=photo&concurrency=2")
    assert (o.server, o.port, o.path, o.input, o.field, o.concurrency, o.base_url) == (
        "bentoml",
        3001,
        "classify",
        "json",
        "photo",
        2,
        "http://[::1]:3001",
    )
    assert ms.parse_url("bentoml://h/x").port == 3000
    o = ms.parse_url("rayserve://serve.example.com/models/colours/v2?field=img&input=json")
    assert (o.server, o.port, o.path, o.name, o.input, o.field) == (
        "rayserve",
        8000,
        "models/colours/v2",
        "/models/colours/v2",
        "json",
        "img",
    )
    o = ms.parse_url("rayserve+https://serve.example.com")  # the route "/" of serve.run
    assert (o.port, o.path, o.name, o.input, o.base_url) == (
        443,
        "",
        "/",
        "raw",
        "https://serve.example.com:443",
    )
    assert ms.parse_url("bentoml://h/x").input == "multipart"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("torchserve://h:1/m?colour=red", "option 'colour': unknown option"),
        ("torchserve://h:1/m?top_k=1&top_k=2", "option 'top_k': given twice"),
        ("torchserve://h:99999/m", "bad port"),
        ("torchserve:///m", "no host"),
        ("torchserve://h:1/", "must name one model"),
        ("torchserve://h:1/a/b/c", "must name one model"),
        ("torchserve://h:1/../etc", "may not hold '.', '..'"),
        ("torchserve://h:1/m%2F..%2Fx", "may not hold '.', '..' or encoded slashes"),
        ("bentoml://h:1/a/b", "must name one endpoint"),
        ("bentoml://h:1/x?version=1", "option 'version': unknown option"),
        ("torchserve://h:1/m/1?version=2", "option 'version': the URL path already names"),
        ("torchserve://h:1/m?task=segmentation", "option 'task': 'segmentation' is not"),
        ("torchserve://h:1/m?output=probabilities", "option 'output': 'probabilities' is not one"),
        ("torchserve://h:1/m?output=full_scores", "full_scores needs the label set: labels=FILE"),
        ("torchserve://h:1/m?task=detection&output=top_k", "applies to task=classification only"),
        ("torchserve://h:1/m?top_k=0", "option 'top_k': must be 1..100000, got 0"),
        ("torchserve://h:1/m?top_k=five", "option 'top_k': 'five' is not an integer"),
        ("torchserve://h:1/m?min_score=nan", "option 'min_score': must be a number in 0..1"),
        ("torchserve://h:1/m?min_score=2", "option 'min_score': must be a number in 0..1"),
        ("torchserve://h:1/m?timeout=inf", "option 'timeout': must be a number"),
        ("torchserve://h:1/m?timeout=0", "option 'timeout': must be a number"),
        ("torchserve://h:1/m?concurrency=100000", "option 'concurrency': must be 1..64"),
        ("torchserve://h:1/m?max_answer_bytes=99999999999", "option 'max_answer_bytes': must be"),
        ("torchserve://h:1/m?box_format=ltrb", "option 'box_format': 'ltrb' is not one of"),
        ("bentoml://h:1/x?input=xml", "option 'input': 'xml' is not one of multipart, json"),
        ("bentoml://h:1/x?input=raw", "option 'input': 'raw' is not one of multipart, json"),
        ("rayserve://h:1/x?input=xml", "option 'input': 'xml' is not one of raw, json, multipart"),
        ("rayserve://h:1/x?version=1", "rayserve option 'version': unknown option"),
        ("rayserve://h:1/a/../b", "may not hold '.', '..'"),
        ("rayserve://h:1/a/%2e%2e/b", "may not hold '.', '..'"),
        ("rayserve://h:1/a%2Fb", "may not hold '.', '..' or encoded slashes"),
        ("rayserve://h:1/a%5Cb", "may not hold '.', '..' or encoded slashes"),
        ("rayserve://h:1/" + "a/" * 17, "the path is too long"),
        ("rayserve://h:1/" + "a" * 2000, "the path is too long"),
        ("rayserve://h:1/x?field=", "option 'field': '' is not a parameter name"),
        ("bentoml://h:1/x?field=a%22b", "option 'field': 'a\"b' is not a parameter name"),
        ("kserve://h:1/m", "is not a torchserve://, bentoml:// or rayserve:// URL"),
    ],
)
def test_bad_urls_are_named(url: str, words: str) -> None:
    assert words in _msg(url)


def test_registry_knows_the_schemes() -> None:
    for scheme in (
        "torchserve",
        "torchserve+https",
        "bentoml",
        "bentoml+https",
        "rayserve",
        "rayserve+http",
        "rayserve+https",
    ):
        b = backend_for(f"{scheme}://127.0.0.1:9/m")
        assert isinstance(b, ms.ModelServerBackend)
        b.close()


def _labels(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_label_files(tmp_path: Path) -> None:
    assert ms.read_labels("torchserve", _labels(tmp_path, "a.txt", "cat\n dog \n\n")) == (
        "cat",
        "dog",
    )
    assert ms.read_labels("torchserve", _labels(tmp_path, "b.json", '["cat", "dog"]')) == (
        "cat",
        "dog",
    )
    # TorchServe's index_to_name.json, with ImageNet's [wordnet id, name] values
    doc = {"1": ["n02", "dog"], "0": ["n01", "cat"]}
    assert ms.read_labels("torchserve", _labels(tmp_path, "c.json", json.dumps(doc))) == (
        "cat",
        "dog",
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "holds no class names"),
        ('{"0": "cat", "2": "dog"}', "class indices must be 0..N-1 without gaps"),
        ('{"-1": "cat"}', "key '-1' is not a class index"),
        ('{"0": 7}', "class 0 has no name"),
        ('["cat", 3]', "must hold non-empty strings only"),
        ("[" * 5000 + "]" * 5000, "is not valid JSON"),
        ("cat\ndog\ncat\n", "names a class twice: cat"),
    ],
)
def test_bad_label_files(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="option 'labels'") as ei:
        ms.read_labels("torchserve", _labels(tmp_path, "l.txt", text))
    assert words in ei.value.violations[0].description


def test_label_paths(tmp_path: Path) -> None:
    def msg(path: str) -> str:
        with pytest.raises(errors.InvalidArgument) as ei:
            ms.read_labels("bentoml", path)
        return ei.value.violations[0].description

    assert "is not a file" in msg(str(tmp_path / "missing.txt"))
    assert "is not a file" in msg(str(tmp_path))
    assert "is not a file" in msg(str(tmp_path / ".." / "nowhere" / "x.txt"))
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(17 * 1024 * 1024)
    assert "larger than" in msg(str(big))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00cat")
    assert "cannot read" in msg(str(tmp_path / "bin.txt"))
    # a symlink to a label file is read like the file (the operator names the path)
    real = tmp_path / "real.txt"
    real.write_text("cat\n")
    os.symlink(real, tmp_path / "link.txt")
    assert ms.read_labels("bentoml", str(tmp_path / "link.txt")) == ("cat",)


def test_token_env_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    with pytest.raises(errors.InvalidArgument, match="NO_SUCH_TOKEN_VAR is not set"):
        ms.backend_from_url("torchserve://127.0.0.1:9/m?token_env=NO_SUCH_TOKEN_VAR")


def test_answer_limits() -> None:
    spec = ms.AnswerSpec(task=Task.CLASSIFICATION)
    many = {str(i): 0.0 for i in range(100_001)}
    with pytest.raises(ms.BadAnswer, match="100001 classes; at most 100000"):
        ms.prediction(spec, ms.parse_json(json.dumps(many).encode()), 4, 4)
    wide = json.dumps([[0.0] * 1000] * 1000).encode()  # a million numbers: refused unread
    with pytest.raises(ms.BadAnswer, match="more than 400000 values"):
        ms.parse_json(wide)
    # without a label set, class indices written as digits number themselves
    pred = ms.prediction(spec, {"3": 0.6, "10": 0.4}, 4, 4)
    assert [(c.label, c.name) for c in pred.classification.classes] == [(3, "3"), (10, "10")]
