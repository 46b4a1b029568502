"""Small requests never cost huge memory.

Before the fix, a 563-byte YAML plan of nested aliases ("billion laughs") gave a 72 MB error
string and +792 MB RSS, and a 389 KB PNG declaring 20000x20000 was fully decoded before the pixel
count was checked (+746 MB per request). Checked here: PNG and JPEG headers declaring too many
pixels are refused by ``codec.decode_image_bytes`` and by manifest images before any decoding,
with flat peak memory; YAML anchors/aliases are refused fast with flat memory and a short
message on ``plan``; the depth limit still holds; manifest lines and files are size-bounded.
"""

from __future__ import annotations

import json
import resource
import struct
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest
from fortis.services.common import codec
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation import datasets
from fortis.services.evaluation.datasets import PlanDatasets
from fortis.services.evaluation.plan import MAX_DEPTH, parse_plan_text

MB = 1024 * 1024


def _peak_rss() -> int:
    """Peak resident set size so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss() -> int:
    """Current resident set size, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A tiny PNG whose IHDR declares ``width`` x ``height`` RGB pixels (IDAT: a few rows)."""
    rows = (b"\x00" + b"\x00" * (3 * width)) * 8
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(rows, 9)) + _chunk(b"IEND", b""))


def jpeg_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A real small JPEG whose frame header (SOF0) is rewritten to declare ``width`` x ``height``."""
    ok, buf = cv2.imencode(".jpg", np.zeros((16, 16, 3), np.uint8))
    data = bytearray(buf.tobytes())
    i = data.index(b"\xff\xc0")
    data[i + 5:i + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_the_bombs_are_small_and_declare_20000_squared():
    assert len(png_bomb()) < 2048 and codec.image_header_size(png_bomb()) == (20000, 20000)
    assert len(jpeg_bomb()) < 2048 and codec.image_header_size(jpeg_bomb()) == (20000, 20000)


@pytest.mark.parametrize("bomb", [png_bomb, jpeg_bomb])
def test_pixel_bombs_are_refused_before_decoding(bomb, monkeypatch: pytest.MonkeyPatch):
    """Refused from the header: the decoder is never called (decoding this JPEG bomb with
    OpenCV costs about 2.3 GB)."""
    data = bomb()

    def never(*_: object) -> None:
        raise AssertionError("decoded before the pixel count was checked")

    monkeypatch.setattr(cv2, "imdecode", never)
    peak, now = _peak_rss(), _rss()
    with pytest.raises(InvalidArgument) as e:
        codec.decode_image_bytes(data, "images[0].encoded")
    assert _peak_rss() - peak < 50 * MB and _rss() - now < 50 * MB     # 20000^2 x 3 = 1.2 GB
    assert e.value.violations[0].field == "images[0].encoded"
    assert "20000x20000" in e.value.message and len(e.value.message) < 200


def test_header_reader_handles_real_and_broken_images():
    img = np.zeros((30, 50, 3), np.uint8)
    assert codec.image_header_size(codec.encode_png(img)) == (50, 30)
    for params in ([], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]):
        ok, buf = cv2.imencode(".jpg", img, params)
        assert codec.image_header_size(buf.tobytes()) == (50, 30)
    assert codec.decode_image_bytes(codec.encode_png(img), "x").shape == (30, 50, 3)
    for junk in (b"GIF89a" + b"\x00" * 40, b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"BM" + b"\x00" * 60,
                 png_bomb()[:20], jpeg_bomb()[:8]):
        assert codec.image_header_size(junk) is None
        with pytest.raises(InvalidArgument) as e:
            codec.decode_image_bytes(junk, "f")
        assert e.value.violations[0].field == "f" and "not a decodable" in e.value.message
    with pytest.raises(InvalidArgument, match="empty image"):
        codec.decode_image_bytes(png_bomb(0, 5), "f")


def test_a_manifest_image_bomb_is_refused_before_decoding(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "bomb.png").write_bytes(png_bomb())
    (tmp_path / "m.jsonl").write_text(json.dumps({"image": "bomb.png", "labels": [0]}) + "\n")
    plan: Any = SimpleNamespace(dataset=SimpleNamespace(source="manifest", path="m.jsonl",
                                                        offset=0, limit=10, label_map={}),
                                target=SimpleNamespace(task="classification"))
    monkeypatch.setattr(cv2, "imdecode", None)       # never reached
    peak = _peak_rss()
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, data_root=tmp_path).images(plan)
    assert _peak_rss() - peak < 50 * MB
    assert e.value.violations[0].field == "dataset.path:1.image" and "too large" in e.value.message


def _manifest_plan(path: str) -> Any:
    return SimpleNamespace(dataset=SimpleNamespace(source="manifest", path=path, offset=0,
                                                   limit=10, label_map={}),
                           target=SimpleNamespace(task="classification"))


def test_manifest_lines_and_files_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "long.jsonl").write_bytes(b'{"image": "' + b"a" * (datasets.MAX_LINE_BYTES + 10)
                                          + b'"}\n')
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, data_root=tmp_path).images(_manifest_plan("long.jsonl"))
    assert e.value.violations[0].field == "dataset.path:1" and "longer than" in e.value.message
    assert len(e.value.message) < 200
    (tmp_path / "deep.jsonl").write_text("[" * 50_000 + "\n")
    with pytest.raises(InvalidArgument) as e3:
        PlanDatasets({}, data_root=tmp_path).images(_manifest_plan("deep.jsonl"))
    assert e3.value.violations[0].field == "dataset.path:1" and "[[[" not in e3.value.message
    monkeypatch.setattr(datasets, "MAX_MANIFEST_BYTES", 1000)
    (tmp_path / "big.jsonl").write_bytes(b"\n" * 2000)
    with pytest.raises(InvalidArgument) as e2:
        PlanDatasets({}, data_root=tmp_path).images(_manifest_plan("big.jsonl"))
    assert e2.value.violations[0].field == "dataset.path" and "larger than 1000" in e2.value.message


def billion_laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [
    billion_laughs(),
    "base: &b {id: gaussian_noise}\ncorruptions: [{<<: *b, levels: [1]}]\n",
    "name: &n demo\nseed: 1\n",
    "name: demo\nother: *undefined\n",
])
def test_yaml_anchors_and_aliases_are_refused_fast_with_flat_memory(text):
    assert len(text) < 1024
    peak, t0 = _peak_rss(), time.perf_counter()
    with pytest.raises(InvalidArgument) as e:
        parse_plan_text(text)
    assert time.perf_counter() - t0 < 1.0 and _peak_rss() - peak < 20 * MB
    assert e.value.violations[0].field == "plan" and len(e.value.message) < 300
    assert "aliases" in e.value.message or "anchors" in e.value.message


def test_plain_plans_and_the_depth_limit_still_hold():
    assert parse_plan_text("name: x\nseed: 3\nitems: [1, {a: b}]\n")["items"] == [1, {"a": "b"}]
    assert parse_plan_text('{"name": "j", "seed": 2}') == {"name": "j", "seed": 2}
    for text in ("a: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5),
                 '{"a": ' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}",
                 "a: " + "[" * 100_000):
        with pytest.raises(InvalidArgument) as e:
            parse_plan_text(text)
        assert e.value.violations[0].field == "plan" and len(e.value.message) < 300


def test_yaml_and_json_errors_quote_no_plan_text():
    secret = "S" * 5000
    for text in (f"a: {secret}\n  b: [\n", '{"a": "' + secret + '"', "a: " + "1" * 6000):
        with pytest.raises(InvalidArgument) as e:
            parse_plan_text(text)
        assert "SSSS" not in e.value.message and "1111" not in e.value.message
        assert len(e.value.message) < 300
