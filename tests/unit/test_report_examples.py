"""Example images of the report: built from what the stages recorded (no target
query), re-made through the perturbation engine exactly as the stages sent them (IEEE-A1..A6,
DEG-4), attack originals / adversarials read back from the stored artifacts (IEEE-A7, CAN-9);
encoded as deterministic PNGs; and in the report service treated as hostile bytes (bounds,
real PNG, re-encoded) with errors naming the field.

Real parts: the Fashion-MNIST CNN answers (in-process, as the proxy's backend does), the
perturbation engine's real algorithms, a real SQLite evaluation store."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.answers import (
    ClassAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)
from fortis.services.evaluation.convert import (
    EXAMPLE_PNG_BYTES,
    EXAMPLES_TOTAL_BYTES,
    example_image,
    example_images,
    png_bytes,
)
from fortis.services.evaluation.examples import answer_text, build_examples, clean_right
from fortis.services.evaluation.ports import AttackOutcome, Example, TargetDescription
from fortis.services.report.convert import build_report
from PIL import Image

from tests.unit.report_parts import make_parts

pytestmark = pytest.mark.usefixtures("one_thread")

LABELS = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
          "Bag", "Ankle boot")


# -- helpers ------------------------------------------------------------------------------------

def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _decode_uri(uri: str) -> np.ndarray:
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    data = base64.b64decode(uri[len(prefix):], validate=True)
    with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
        im.load()
        return np.asarray(im)


def _header_only_png(width: int, height: int) -> bytes:
    """A PNG signature and a valid IHDR chunk declaring ``width`` x ``height``, no pixels."""
    body = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body
            + struct.pack(">I", zlib.crc32(body)))


def _example(kind: int = report_pb2.EXAMPLE_KIND_ATTACK, **kw: Any) -> report_pb2.ExampleImage:
    o = np.zeros((4, 5), np.uint8)
    p = o.copy()
    p[1, 2], p[3, 4] = 10, 5
    fields: dict[str, Any] = dict(kind=kind, setting="fgsm", level=0, image_id="img-1",
                                  original_png=_png(o), perturbed_png=_png(p),
                                  original_answer="Trouser (0.97)",
                                  perturbed_answer="Dress (0.61)", note="first image fooled")
    fields.update(kw)
    return report_pb2.ExampleImage(**fields)


def _report(*examples: report_pb2.ExampleImage) -> dict[str, Any]:
    parts = make_parts()
    parts.examples.extend(examples)
    return build_report(parts)


def _field(exc: pytest.ExceptionInfo[InvalidArgument]) -> str:
    return exc.value.violations[0].field


# -- answers in words -------------------------------------------------------------------------

def test_answers_in_words_for_every_output_kind():
    full = ClassAnswers.from_rows([[1, 3], [7, 1]], [[0.974, 0.02], [0.5, 0.4]], ["", ""])
    assert answer_text(full, 0, LABELS) == "Trouser (0.97)"
    assert answer_text(full, 1, LABELS) == "Sneaker (0.50)"
    only = ClassAnswers.from_rows([[8]], [None], [""])
    assert answer_text(only, 0, LABELS) == "Bag"
    failed = ClassAnswers.failed(1, "UNAVAILABLE: target down")
    assert answer_text(failed, 0, LABELS).startswith("no answer (UNAVAILABLE")
    det = DetectionAnswers(boxes=np.zeros((3, 4), np.float32), labels=np.zeros(3, np.int64),
                           scores=np.ones(3, np.float32), counts=np.array([2, 1, 0]),
                           errors=("", "", ""))
    assert [answer_text(det, i, ()) for i in range(3)] == ["2 boxes", "1 box", "0 boxes"]
    mask = np.zeros((1, 4, 4), np.int64)
    mask[0, :1, :] = 1          # 4 of 16 pixels
    seg = SegmentationAnswers(class_maps=mask, errors=("",), shapes=((4, 4),))
    assert answer_text(seg, 0, ()) == "mask: 25% foreground"
    assert answer_text(None, 0, LABELS) == "not recorded"


def test_clean_right_follows_the_plan_rule():
    """IEEE-C1/C2: top-1, top-k, and a true label's score above the threshold."""
    a = ClassAnswers.from_rows([[3, 1, 0]], [[0.6, 0.3, 0.1]], [""])
    assert clean_right(a, 0, (3,), {"mode": "top1"})
    assert not clean_right(a, 0, (1,), {"mode": "top1"})
    assert clean_right(a, 0, (1,), {"mode": "topk", "k": 2})
    assert not clean_right(a, 0, (0,), {"mode": "topk", "k": 2})
    assert clean_right(a, 0, (1,), {"mode": "threshold", "threshold": 0.25})
    assert not clean_right(a, 0, (1,), {"mode": "threshold", "threshold": 0.35})
    assert not clean_right(ClassAnswers.failed(1, "x"), 0, (3,), {"mode": "top1"})


# -- PNG encoding (evaluation side) -----------------------------------------------------------

def test_png_is_lossless_deterministic_grey_for_one_channel_rgb_for_three():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (28, 28, 1), dtype=np.uint8)
    rgb = rng.integers(0, 256, (9, 13, 3), dtype=np.uint8)
    for arr, mode in ((grey, "L"), (rgb, "RGB")):
        data = png_bytes(arr)
        assert data == png_bytes(arr.copy())
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "PNG" and im.mode == mode
            back = np.asarray(im)
        assert np.array_equal(back.reshape(arr.shape), arr)


def test_an_example_over_the_bounds_is_shown_reduced_and_says_so():
    """A 1500x1500 noise photo's PNG is over 1 MiB: both images are reduced alike to fit."""
    rng = np.random.default_rng(1)
    big = rng.integers(0, 256, (1500, 1500, 3), dtype=np.uint8)
    assert len(png_bytes(big)) > EXAMPLE_PNG_BYTES
    msg = example_image(Example(kind="corruption", setting="gaussian_noise", level=5,
                                image_id="p", original=big, perturbed=255 - big, note="n"))
    assert msg is not None and msg.kind == report_pb2.EXAMPLE_KIND_CORRUPTION
    sizes = []
    for data in (msg.original_png, msg.perturbed_png):
        assert len(data) <= EXAMPLE_PNG_BYTES
        with Image.open(io.BytesIO(data)) as im:
            sizes.append(im.size)
    assert sizes[0] == sizes[1] and sizes[0][0] < 1500
    assert "shown reduced" in msg.note and "1500x1500" in msg.note
    # images of different sizes cannot make a difference image: left out
    assert example_image(Example(kind="attack", setting="a", level=0, image_id="x",
                                 original=big[:10, :10], perturbed=big[:10, :11])) is None


def test_example_images_are_bounded_attacks_first():
    """At most 200, and at most EXAMPLES_TOTAL_BYTES of PNG: attacks are kept before a
    corruption sweep, at full size; a sweep past the budget is shown reduced, all alike,
    rather than left out; the order of those kept is the builder's."""
    img = np.zeros((8, 8, 1), np.uint8)
    many = [Example(kind=k, setting=f"{k}{i}", level=1, image_id=str(i), original=img,
                    perturbed=img) for k, n in (("corruption", 30), ("attack", 200))
            for i in range(n)]
    out = example_images(many)
    assert len(out) == 200 and {m.kind for m in out} == {report_pb2.EXAMPLE_KIND_ATTACK}
    assert [m.setting for m in out] == [f"attack{i}" for i in range(200)]
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, (900, 900, 1), dtype=np.uint8)     # ~0.8 MB per PNG
    big = [Example(kind=k, setting=f"{k}{i}", level=1, image_id=str(i), original=noise,
                   perturbed=255 - noise) for k, n in (("corruption", 4), ("attack", 3))
           for i in range(n)]
    out = example_images(big)
    total = sum(len(m.original_png) + len(m.perturbed_png) for m in out)
    assert total <= EXAMPLES_TOTAL_BYTES
    kept = [m.setting for m in out]
    assert kept == [f"corruption{i}" for i in range(4)] + ["attack0", "attack1", "attack2"]
    assert not any("shown reduced" in m.note for m in out[-3:])
    assert all("shown reduced" in m.note and "900x900" in m.note for m in out[:4])


# -- the report service: decoding, difference, hostile bytes -------------------------------------

def test_report_examples_are_data_uris_with_an_amplified_difference():
    r = _report(_example(), _example(kind=report_pb2.EXAMPLE_KIND_CORRUPTION,
                                     setting="gaussian_noise", level=3))
    ex = r["examples"]
    assert [e["kind"] for e in ex] == ["attack", "corruption"]
    a = ex[0]
    assert set(a) == {"kind", "setting", "level", "image_id", "target", "original", "perturbed",
                      "difference", "original_answer", "perturbed_answer", "note"}
    assert a["level"] is None and ex[1]["level"] == 3 and a["target"] is None
    assert a["original_answer"] == "Trouser (0.97)" and a["perturbed_answer"] == "Dress (0.61)"
    orig, pert, diff = (_decode_uri(a[k]) for k in ("original", "perturbed", "difference"))
    assert orig.shape == pert.shape == diff.shape == (4, 5)
    assert pert[1, 2] == 10 and pert[3, 4] == 5
    # |10 - 0| is the largest difference: 255; |5 - 0| scaled alike: 127.5 -> 128
    assert diff[1, 2] == 255 and diff[3, 4] == 128 and int(diff.sum()) == 255 + 128
    assert _report()["examples"] == []


def test_same_images_give_a_black_difference_and_grey_rgb_mix_works():
    rgb = np.full((3, 3, 3), 40, np.uint8)
    grey = np.full((3, 3), 40, np.uint8)
    r = _report(_example(original_png=_png(grey), perturbed_png=_png(rgb)))
    diff = _decode_uri(r["examples"][0]["difference"])
    assert diff.shape == (3, 3, 3) and not diff.any()


def test_examples_from_the_evaluation_render_in_the_report():
    """Example -> ExampleImage (evaluation side) -> report["examples"]: the pixels survive."""
    rng = np.random.default_rng(2)
    o = rng.integers(0, 256, (28, 28, 1), dtype=np.uint8)
    p = o.copy()
    p[0, 0, 0] = 255 - p[0, 0, 0]
    msgs = example_images([Example(kind="degradation", setting="global_blur", level=20,
                                   image_id="i", original=o, perturbed=p, note="DEG-4")])
    ex = _report(*msgs)["examples"][0]
    assert ex["kind"] == "degradation" and ex["level"] == 20 and ex["note"] == "DEG-4"
    assert np.array_equal(_decode_uri(ex["original"]), o[:, :, 0])
    assert np.array_equal(_decode_uri(ex["perturbed"]), p[:, :, 0])
    diff = _decode_uri(ex["difference"])
    assert diff[0, 0] == 255 and int(diff.sum()) == 255


@pytest.mark.parametrize(("bad", "field", "words"), [
    ({"perturbed_png": _png(np.random.default_rng(0).integers(0, 256, (4, 5), np.uint8))[:50]},
     "perturbed_png", "not a valid PNG"),
    ({"original_png": b""}, "original_png", "required"),
    ({"perturbed_png": _header_only_png(10000, 10000)}, "perturbed_png", "10000x10000"),
    ({"perturbed_png": _header_only_png(0, 5)}, "perturbed_png", "0x5"),
    ({"original_png": b"\x89PNG\r\n\x1a\n" + b"\0" * (1 << 20)}, "original_png", "at most"),
    ({"perturbed_png": _png(np.zeros((4, 6), np.uint8))}, "perturbed_png", "same size"),
    ({"kind": 0}, "kind", "ExampleKind"),
    ({"kind": 99}, "kind", "ExampleKind"),
    ({"setting": ""}, "setting", "required"),
    ({"note": "x" * 5000}, "note", "at most"),
])
def test_hostile_example_bytes_are_refused_naming_the_field(bad, field, words):
    """RenderReport is a public RPC: truncated, empty, bomb-sized, oversized, mismatched."""
    with pytest.raises(InvalidArgument) as e:
        _report(_example(), _example(**bad))
    assert _field(e) == f"parts.examples[1].{field}" and words in str(e.value)


def test_a_jpeg_is_not_a_png():
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 5), np.uint8)).save(buf, format="JPEG")
    with pytest.raises(InvalidArgument) as e:
        _report(_example(perturbed_png=buf.getvalue()))
    assert _field(e) == "parts.examples[0].perturbed_png" and "not a PNG" in str(e.value)


def test_a_png_whose_body_disagrees_with_its_header_is_refused():
    """Header says 4x5, the IDAT holds garbage: decoding fails, named, no crash."""
    good = _png(np.zeros((4, 5), np.uint8))
    broken = good[:41] + bytes(b ^ 0xFF for b in good[41:-12]) + good[-12:]
    with pytest.raises(InvalidArgument) as e:
        _report(_example(original_png=broken))
    assert _field(e) == "parts.examples[0].original_png"


def test_at_most_200_examples():
    small = _example()
    assert len(_report(*[small] * 200)["examples"]) == 200
    with pytest.raises(InvalidArgument) as e:
        _report(*[small] * 201)
    assert _field(e) == "parts.examples" and "201" in str(e.value)


def test_the_page_gets_only_re_encoded_pngs():
    """Text chunks of a caller's PNG (anything but pixels) never reach the page."""
    from PIL import PngImagePlugin
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "<script>alert(1)</script>")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 5), np.uint8)).save(buf, format="PNG", pnginfo=info)
    assert b"<script>" in buf.getvalue()
    ex = _report(_example(original_png=buf.getvalue()))["examples"][0]
    data = base64.b64decode(ex["original"].split(",", 1)[1])
    assert b"<script>" not in data and b"tEXt" not in data


# -- building the examples from a run -----------------------------------------------------------

class _LocalProxy:
    """The proxy's part in-process: the real Fashion-MNIST CNN answers each image, and every
    image sent is kept (what the target received)."""

    def __init__(self, model: Any) -> None:
        from fortis.adapters.torch_target import ClassifierTarget
        self.target = ClassifierTarget(model)
        self.sent: list[tuple[str, str, str, np.ndarray]] = []

    def open_session(self, **_: Any) -> None:
        return None

    def predict(self, *, session_id: str, origin: str, task: str,
                images: Any) -> ClassAnswers:
        self.sent += [(session_id, origin, i, np.array(im)) for i, im in images]
        return ClassAnswers.from_proto(self.target.predict([image_msg(i, im, raw=True)
                                                            for i, im in images]))


class _LocalPerturbation:
    """The perturbation service's engine in-process (its real algorithms). ``attack`` stands in
    for a transfer attack: each image inverted (a big change the CNN often gets wrong)."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.calls = 0

    def perturb(self, perturbation_id: str, level: int, seed: int, images: Any,
                params: Any = None, *, surrogate: str = "", labels: Any = None) -> list[np.ndarray]:
        from fortis.services.perturbation.engine import perturb
        self.calls += 1
        if self.broken:
            raise errors.Unavailable("perturbation service down")
        return perturb(perturbation_id, level, seed, images, params=params, labels=labels)

    def attack(self, attack_id: str, params: Any, seed: int, images: Any,
               **_: Any) -> list[AttackOutcome]:
        return [AttackOutcome(image_id=i, adversarial=255 - im,
                              adversarial_float=(255 - im).astype(np.float32) / 255,
                              success=None, queries=0, linf=1.0, l2=1.0, stop_reason="",
                              initially_correct=None) for i, im, _ in images]


PLAN = """
name: examples-unit
seed: 7
roles: {tester: {name: t, organisation: o}}
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 12}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 4]}
  - {id: contrast, severities: [3]}
degradation:
  - {id: global_blur, levels: [2, 20]}
attacks:
  - {id: fgsm, name: invert, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
execution: {batch_size: 5}
"""


@pytest.fixture(scope="module")
def catalogue():
    from fortis.server.app.stack import local_catalogue
    return local_catalogue()


def _run(tmp_path: Any, fmnist_target: Any, images: Any, catalogue: Any,
         perturbation: _LocalPerturbation) -> tuple[Any, list[Any], _LocalProxy]:
    """The clean, corruption, degradation and transfer stages of PLAN, run for real."""
    from fortis.services.evaluation.plan import load_plan
    from fortis.services.evaluation.stages import (
        CleanStage,
        CorruptionStage,
        DegradationStage,
        Progress,
        RunContext,
        TransferAttackStage,
    )
    from fortis.services.evaluation.stages.base import chunks
    from fortis.services.evaluation.store import EvaluationStore

    plan = load_plan(PLAN, catalogue)
    store = EvaluationStore(tmp_path / "ev.sqlite").for_tenant("t1")
    store.insert(evaluation_id="ev1", tenant="t1", plan_text=PLAN, plan_name="p")
    proxy = _LocalProxy(fmnist_target)
    x, y = images
    rows = [(f"fm-{k:03d}", x[k], (int(y[k]),)) for k in range(12)]
    target = TargetDescription(name="fmnist-cnn", task="classification", labels=LABELS,
                               output_kind="full_scores", top_k=0, input_height=28,
                               input_width=28, input_channels=1, version="1")
    ctx = RunContext(evaluation_id="ev1", plan=plan, plan_text=PLAN, store=store,
                     proxy=proxy, perturbation=perturbation,  # type: ignore[arg-type]
                     scoring=None, report=None, images=rows,  # type: ignore[arg-type]
                     target=target, progress=Progress(store, "ev1"),
                     chunk_ranges=chunks(12, plan.batch_size), parallel=1)
    settings = []
    for stage in (CleanStage(plan, 12), CorruptionStage(plan, 12, catalogue),
                  DegradationStage(plan, 12, catalogue), TransferAttackStage(plan, 12, catalogue)):
        settings += stage.run(ctx)
    return ctx, settings, proxy


def _metrics(settings: list[Any], ctx: Any) -> scoring_pb2.ScoreEvaluationResponse:
    """A scoring answer with DEG-4 failure points of global_blur: level 20 for 0.9 and 0.5
    (one example for both), one unreached (no example); its image: the first the target got
    wrong at level 20."""
    deg = next(s for s in settings if s.kind == "degradation" and s.level == 20)
    wrong = next(i for i in range(12) if not clean_right(deg.answers, i, ctx.images[i][2],
                                                         {"mode": "top1"}))
    image_id = ctx.images[wrong][0]
    resp = scoring_pb2.ScoreEvaluationResponse()
    p = resp.degradation.add(name="global_blur", m=12, applicable=True)
    p.failure_points.add(threshold=0.9, reached=True, level=20, accuracy=0.4,
                         example_image=image_id)
    p.failure_points.add(threshold=0.5, reached=True, level=20, accuracy=0.4,
                         example_image=image_id)
    p.failure_points.add(threshold=0.1, reached=False)
    return resp


def test_examples_are_what_the_target_received_with_its_recorded_answers(
        tmp_path, fmnist_target, fmnist_test_images, catalogue):
    """IEEE-A1..A6 / DEG-4: the corrupted and degraded example images, re-made through the
    perturbation engine, equal the images the stages sent; IEEE-A7: the adversarial is the
    stored one of the first image fooled (found in its chunk of 5); the answers shown are
    the recorded ones; and building them sends nothing to the target."""
    ctx, settings, proxy = _run(tmp_path, fmnist_target, fmnist_test_images, catalogue,
                                _LocalPerturbation())
    sent_before = len(proxy.sent)
    assert sent_before == 12 * (1 + 3 + 2 + 1)
    examples = build_examples(ctx, settings, _metrics(settings, ctx))
    assert len(proxy.sent) == sent_before                       # no target query
    sent = {(origin, i): im for _, origin, i, im in proxy.sent}

    def words(origin: str, image_id: str) -> str:
        ans = proxy.target.predict([image_msg(image_id, sent[(origin, image_id)], raw=True)])
        c = ans[0].classification.classes[0]
        return f"{LABELS[c.label]} ({c.score:.2f})"

    clean = next(s for s in settings if s.kind == "clean")
    first_right = next(i for i in range(12) if clean_right(clean.answers, i, ctx.images[i][2],
                                                            {"mode": "top1"}))
    corr = [e for e in examples if e.kind == "corruption"]
    assert [(e.setting, e.level) for e in corr] == [("gaussian_noise", 1), ("gaussian_noise", 4),
                                                     ("contrast", 3)]
    for e in corr:
        assert e.image_id == ctx.images[first_right][0]
        assert np.array_equal(e.original, ctx.images[first_right][1])
        assert np.array_equal(e.perturbed, sent[(f"{e.setting}@{e.level}", e.image_id)])
        assert e.perturbed_answer == words(f"{e.setting}@{e.level}", e.image_id)
        assert e.original_answer == words("clean", e.image_id)

    (att,) = [e for e in examples if e.kind == "attack"]
    adv = next(s for s in settings if s.kind == "transfer_attack")
    fooled = [i for i in range(12)
              if clean_right(clean.answers, i, ctx.images[i][2], {"mode": "top1"})
              and not clean_right(adv.answers, i, ctx.images[i][2], {"mode": "top1"})]
    assert fooled, "inverting Fashion-MNIST images fools the CNN on some"
    assert att.image_id == ctx.images[fooled[0]][0] and att.setting == "invert"
    assert np.array_equal(att.perturbed, sent[("invert", att.image_id)])
    assert np.array_equal(att.perturbed, 255 - ctx.images[fooled[0]][1])
    assert att.perturbed_answer == words("invert", att.image_id)
    assert "first image invert fooled" in att.note

    (deg,) = [e for e in examples if e.kind == "degradation"]
    assert (deg.setting, deg.level) == ("global_blur", 20)
    assert np.array_equal(deg.perturbed, sent[("global_blur@20", deg.image_id)])
    assert deg.perturbed_answer == words("global_blur@20", deg.image_id)
    assert "90% and 50%" in deg.note and "DEG-4" in deg.note


def test_a_failing_perturbation_service_never_fails_the_evaluation(
        tmp_path, fmnist_target, fmnist_test_images, catalogue):
    """Examples that need the perturbation service are left out (logged), at most 5 tries;
    the attack example (stored artifact) is still made."""
    ctx, settings, _ = _run(tmp_path, fmnist_target, fmnist_test_images, catalogue,
                            _LocalPerturbation())
    broken = _LocalPerturbation(broken=True)
    ctx.perturbation = broken
    examples = build_examples(ctx, settings, _metrics(settings, ctx))
    assert [e.kind for e in examples] == ["attack"]
    assert broken.calls == 3 + 1                # 3 corruption severities, 1 failure point
    # no stored adversarials (another evaluation's view): that example is left out too
    from dataclasses import replace
    assert build_examples(replace(ctx, evaluation_id="ev-other"), settings, None) == []
