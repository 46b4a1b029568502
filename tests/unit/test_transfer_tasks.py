"""Transfer attacks (IEEE-A7) on detection and segmentation targets: the differentiable
surrogates ``mtcnn-surrogate`` (MTCNN's P-, R-, O-Net with facenet-pytorch's weights) and
``u2netp-surrogate`` (rembg's u2netp.onnx converted to torch with onnx2torch), on real photos
(scikit-image's astronaut, as the detection / segmentation demos and e2e tests use it).

- the converted U2-Net-p gives onnxruntime's output on the same input, and the surrogate's
  class map is the ``u2netp`` target's on a photo;
- the task losses have gradients that reach the pixels;
- FGSM / PGD ascending them lower the surrogate's own face detections (IEEE-C4) and the
  mIoU of its own mask (IEEE-C5), within the L-inf bound on the uint8 images (IEEE-A9);
- criteria a surrogate cannot serve are refused naming the field.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("vision_setup")


@pytest.fixture(scope="module")
def photos(vision_setup: None) -> dict[str, object]:
    from fortis.adapters.vision_demo import ASTRONAUT_FACE, ASTRONAUT_POLYGON, _photos

    a = _photos()["astronaut"]
    s = 160 / a.shape[0]
    face = np.array(ASTRONAUT_FACE) * s
    small = cv2.resize(a, (160, 160), interpolation=cv2.INTER_AREA)
    pair = np.ascontiguousarray(np.concatenate([small, small[:, ::-1]], axis=1))
    mirror = np.array([320 - face[2], face[1], 320 - face[0], face[3]])
    mask = cv2.fillPoly(np.zeros((512, 512), np.uint8),
                        [np.array(ASTRONAUT_POLYGON, np.int32)], 1)
    return {"full": a, "small": small, "face": face[None], "pair": pair,
            "pair_faces": np.stack([face, mirror]),
            "seg": cv2.resize(a, (128, 128), interpolation=cv2.INTER_AREA),
            "seg_mask": cv2.resize(mask, (128, 128), interpolation=cv2.INTER_NEAREST
                                   ).astype(np.int64)}


@pytest.fixture(scope="module")
def mtcnn(vision_setup: None):
    from fortis.adapters.builtin import load_model

    return load_model("mtcnn-surrogate", "surrogate")


@pytest.fixture(scope="module")
def u2netp(vision_setup: None):
    from fortis.adapters.builtin import load_model

    return load_model("u2netp-surrogate", "surrogate")


def _x(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(img).float().div(255.0).permute(2, 0, 1)[None].contiguous()


def _iou(pred: np.ndarray, ref: np.ndarray) -> float:
    inter = float(((pred == 1) & (ref == 1)).sum())
    union = float(((pred == 1) | (ref == 1)).sum())
    return inter / union if union else 1.0


def test_builtin_surrogates_declare_their_task(mtcnn, u2netp):
    from fortis.services.common.surrogates import BUILTIN_SURROGATE_NAMES, BUILTIN_SURROGATE_TASKS

    for s in (mtcnn, u2netp):
        assert BUILTIN_SURROGATE_TASKS[s.name] == s.task and s.name in BUILTIN_SURROGATE_NAMES
        assert s.input_spec is None and isinstance(s.model, torch.nn.Module)
    from fortis.services.perturbation.attacks.registry import ATTACKS

    for a in ("fgsm", "bim", "pgd", "mi_fgsm"):
        assert set(ATTACKS[a].tasks or ()) == {"classification", "detection", "segmentation"}


def test_converted_u2netp_matches_onnxruntime(u2netp, photos):
    """The torch module converted by onnx2torch gives onnxruntime's saliency on the same
    preprocessed photo (float32 round-off), and the surrogate's class map on a 128 x 128 photo
    (its preprocessing in torch) is the ``u2netp`` target's on nearly every pixel."""
    import onnxruntime as ort
    from fortis.adapters.vision_targets.u2netp import U2NetpTarget

    tgt = U2NetpTarget()
    img = photos["full"]
    x = cv2.resize(img, (320, 320), interpolation=cv2.INTER_AREA).astype(np.float32)
    x /= max(float(x.max()), 1.0)
    x = ((x - tgt._MEAN) / tgt._STD).transpose(2, 0, 1)[None].astype(np.float32)
    sess = ort.InferenceSession(str(U2NetpTarget.model_file()),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0][:, 0]
    with torch.inference_mode():
        got = torch.sigmoid(u2netp.model.net(torch.from_numpy(x))[:, 0]).numpy()
    assert got.shape == ref.shape == (1, 320, 320)
    assert float(np.abs(got - ref).max()) < 1e-4
    seg = photos["seg"]
    ours = u2netp.class_map(seg[None])[0]
    theirs = (tgt._confidence(seg) > 0.5).astype(np.int64)
    assert float((ours == theirs).mean()) > 0.99
    assert _iou(theirs, photos["seg_mask"]) > 0.6          # a real segmentation of the photo


def test_task_losses_have_gradients(mtcnn, u2netp, photos):
    from fortis.services.perturbation.criteria import MIoUBelow, ObjectMissed
    from fortis.services.perturbation.judges import BoxReference

    x = _x(photos["small"]).requires_grad_(True)
    ref = BoxReference.of(photos["face"], [0])
    loss = mtcnn.task_loss(x, [ref], ObjectMissed())
    assert loss.shape == (1,) and float(loss.detach()) < 0     # face evidence to remove
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    # the gradient lives around the face (P-Net cells and R-/O-Net crops near the box)
    gm = g.abs().sum(dim=1)[0]
    x0, y0, x1, y1 = (int(v) for v in photos["face"][0])
    assert float(gm[max(y0 - 12, 0):y1 + 12, max(x0 - 12, 0):x1 + 12].sum()) > 0.9 * float(gm.sum())
    xs = _x(photos["seg"]).requires_grad_(True)
    sl = u2netp.task_loss(xs, [photos["seg_mask"]], MIoUBelow(classes=(1,)))
    (gs,) = torch.autograd.grad(sl.sum(), xs)
    assert sl.shape == (1,) and torch.isfinite(gs).all() and float(gs.abs().sum()) > 0


def test_criteria_the_surrogates_cannot_serve_are_refused(mtcnn, u2netp, photos):
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.perturbation.criteria import MIoUBelow, ObjectRelabelled

    x = _x(photos["small"])
    with pytest.raises(InvalidArgument) as e:
        mtcnn.task_loss(x, [None], ObjectRelabelled(target=1))
    assert e.value.violations[0].field == "criterion" and "one class" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        u2netp.task_loss(_x(photos["seg"]), [None], MIoUBelow(classes=(1, 3)))
    assert e.value.violations[0].field == "criterion.classes"
    with pytest.raises(InvalidArgument) as e:
        u2netp.task_loss(_x(photos["seg"]), [np.zeros((5, 5), np.int64)], MIoUBelow(classes=(1,)))
    assert e.value.violations[0].field == "references[0]"
    # through the engine: a relabelling criterion on the MTCNN surrogate names the criterion
    from fortis.services.perturbation.engine import AttackItem, run_attack

    with pytest.raises(InvalidArgument) as e:
        run_attack("fgsm", {"epsilon": 0.05}, 0, [AttackItem(image_id="a", image=photos["small"])],
                   surrogate=mtcnn, criterion={"kind": "object_relabelled", "target_label": 0})
    assert e.value.violations[0].field == "criterion"


def _bounded(r, x: np.ndarray, eps: float) -> None:
    a = r.adversarial
    assert a.dtype == np.uint8 and a.shape == x.shape
    d = np.abs(a.astype(np.int64) - x.astype(np.int64))
    assert int(d.max()) <= int(np.floor(eps * 255 + 1e-9)) and r.linf <= eps + 1e-9


def test_fgsm_and_pgd_on_the_mtcnn_surrogate_remove_its_faces(mtcnn, photos):
    """IEEE-C4 ObjectMissed against the photos' face boxes: FGSM lowers the face score, PGD
    (10 x, L-inf 0.05) leaves the surrogate's cascade no face."""
    from fortis.services.perturbation.engine import AttackItem, run_attack
    from fortis.services.perturbation.judges import BoxReference

    crit = {"kind": "object_missed"}
    items = [AttackItem(image_id="astronaut", image=photos["small"],
                        objects=BoxReference.of(photos["face"], [0])),
             AttackItem(image_id="pair", image=photos["pair"],
                        objects=BoxReference.of(photos["pair_faces"], [0, 0]))]
    clean = [mtcnn.detect(it.image[None])[0] for it in items]
    assert [len(b) for b, _ in clean] == [1, 2] and min(float(p.min()) for _, p in clean) > 0.99
    fg = run_attack("fgsm", {"epsilon": 0.05}, 3, items[:1], surrogate=mtcnn, criterion=crit)
    _bounded(fg[0], items[0].image, 0.05)
    after = mtcnn.detect(fg[0].adversarial[None])[0][1]
    assert (after.max() if len(after) else 0.0) < clean[0][1].max()
    pg = run_attack("pgd", {"epsilon": 0.05, "steps": 10}, 3, items, surrogate=mtcnn,
                    criterion=crit)
    for it, r in zip(items, pg, strict=True):
        _bounded(r, it.image, 0.05)
        assert r.success is None and r.queries == 0        # judged later, on the target
    assert [len(mtcnn.detect(r.adversarial[None])[0][0]) for r in pg] == [0, 0]
    # no reference: every face the surrogate finds is suppressed
    free = run_attack("pgd", {"epsilon": 0.05, "steps": 10}, 3,
                      [AttackItem(image_id="astronaut", image=photos["small"])],
                      surrogate=mtcnn, criterion=crit)
    assert len(mtcnn.detect(free[0].adversarial[None])[0][0]) == 0


def test_pgd_on_the_u2netp_surrogate_lowers_its_miou(u2netp, photos):
    """IEEE-C5 MIoUBelow over the salient class: PGD (3 x, L-inf 0.03) against the photo's
    ground-truth mask lowers the surrogate's IoU against its own clean mask well below the
    plan-style threshold; without a reference (the surrogate's own answer) too."""
    from fortis.services.perturbation.engine import AttackItem, run_attack

    img, gt = photos["seg"], photos["seg_mask"]
    clean = u2netp.class_map(img[None])[0]
    crit = {"kind": "miou_below", "segmentation": {"classes": [1], "miou_threshold": 0.5}}
    params = {"epsilon": 0.03, "steps": 3}
    (r,) = run_attack("pgd", params, 5, [AttackItem(image_id="a", image=img, mask=gt)],
                      surrogate=u2netp, criterion=crit)
    _bounded(r, img, 0.03)
    adv = u2netp.class_map(r.adversarial[None])[0]
    print(f"u2netp-surrogate PGD 3x0.03: IoU vs clean {_iou(adv, clean):.3f}, vs truth "
          f"{_iou(clean, gt):.3f} -> {_iou(adv, gt):.3f}")
    assert _iou(adv, clean) < 0.5 and _iou(adv, gt) < _iou(clean, gt) - 0.2
    (f,) = run_attack("fgsm", {"epsilon": 0.03}, 5, [AttackItem(image_id="a", image=img)],
                      surrogate=u2netp, criterion=crit)
    _bounded(f, img, 0.03)
    assert _iou(u2netp.class_map(f.adversarial[None])[0], clean) < 0.9
