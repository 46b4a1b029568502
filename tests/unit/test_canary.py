"""CANARY metrics (seed 003, SPEC CAN-1..CAN-5): every metric against values worked out by hand
on tiny inputs, the properties the definitions imply, and the not-available / not-applicable
paths (a value of None with a reason, never 0)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.canary import (
    CTC_GRADES,
    DistsModel,
    acamc,
    attack_cost,
    attack_effect,
    cosine_similarity,
    ctc_grades,
    defence_effect,
    grad_cam,
    haar_dwt2,
    haar_idwt2,
    haar_split,
    load_dists,
    macro_f1,
    model_capability,
    ms_gmsd,
    observable_transfer_rate,
    perturbation_cost,
    resolve_layer,
    successful_examples,
)
from torch import nn


def fields(err: InvalidArgument) -> list[str]:
    return [v.field for v in err.violations]


def json_roundtrip(d: dict) -> dict:
    return json.loads(json.dumps(d, allow_nan=False))


# ------------------------------------------------------------------------------ CAN-1 --------

CAP_LABELS = np.array([0, 0, 1, 2])
CAP_PROBS = np.array([[0.7, 0.2, 0.1],    # right, P_y = 0.7
                      [0.4, 0.5, 0.1],    # wrong (1 for 0), P_y = 0.4
                      [0.1, 0.8, 0.1],    # right, P_y = 0.8
                      [0.3, 0.3, 0.4]])   # right, P_y = 0.4


class TestModelCapability:
    def test_hand_values(self) -> None:
        """CAN-1: CA = 3/4; CC = (0.7 + 0.4 + 0.8 + 0.4) / 4; CF = mean over classes of
        2TP / (2TP + FP + FN) = (2/3 + 2/3 + 1) / 3 = 7/9."""
        out = json_roundtrip(model_capability(CAP_LABELS, CAP_PROBS))
        assert out["n"] == 4
        assert out["CA"]["value"] == pytest.approx(0.75)
        assert out["CA"]["correct"] == 3
        assert out["CC"]["value"] == pytest.approx(0.575)
        assert out["CF"]["value"] == pytest.approx(7 / 9)
        assert out["CF"]["classes"] == 3
        assert all(out[k]["status"] == "ok" for k in ("CA", "CF", "CC"))

    def test_macro_f1_matches_sklearn(self) -> None:
        """CAN-1 CF: the authors compute f1_score(average='macro'); ours agrees, including a
        class that is predicted but never the label and one that is never predicted."""
        sklearn_metrics = pytest.importorskip("sklearn.metrics")
        rng = np.random.default_rng(1)
        y = rng.integers(0, 6, 200)
        p = np.where(rng.random(200) < 0.6, y, rng.integers(0, 8, 200))
        assert macro_f1(y, p) == pytest.approx(
            sklearn_metrics.f1_score(y, p, average="macro"), abs=1e-12)

    def test_labels_only_has_no_cc(self) -> None:
        """CAN-1 CC needs scores: labels-only answers -> not available (None, not 0)."""
        out = model_capability(CAP_LABELS, np.array([0, 1, 1, 2]))
        assert out["CA"]["value"] == pytest.approx(0.75)
        assert out["CC"]["value"] is None
        assert out["CC"]["status"] == "not available"
        assert "labels only" in out["CC"]["reason"]

    def test_argmax_ties_go_to_lowest_index(self) -> None:
        out = model_capability(np.array([0]), np.array([[0.5, 0.5]]))
        assert out["CA"]["value"] == 1.0

    @pytest.mark.parametrize("clean, field", [
        (np.array([[1.5, -0.5, 0.0]] * 4), "clean"),          # logits, not probabilities
        (np.array([[0.5, 0.5, 0.0]] * 3), "clean"),           # wrong N
        (np.array([[np.nan, 0.5, 0.5]] * 4), "clean"),
    ])
    def test_bad_scores_name_the_field(self, clean: np.ndarray, field: str) -> None:
        with pytest.raises(InvalidArgument) as e:
            model_capability(CAP_LABELS, clean)
        assert fields(e.value) == [field]

    def test_label_outside_classes(self) -> None:
        with pytest.raises(InvalidArgument) as e:
            model_capability(np.array([0, 3]), np.array([[0.5, 0.5, 0.0]] * 2))
        assert fields(e.value) == ["labels"]


# ------------------------------------------------------------------------------ CAN-2 --------

Y = np.array([0, 1, 2, 0])
CLEAN = np.array([[0.8, 0.1, 0.1],   # right
                  [0.2, 0.7, 0.1],   # right
                  [0.5, 0.2, 0.3],   # wrong: discarded by every CAN-2 metric
                  [0.6, 0.3, 0.1]])  # right
ADV = np.array([[0.3, 0.6, 0.1],     # -> 1, misclassified
                [0.1, 0.8, 0.1],     # -> 1, attack failed
                [0.1, 0.1, 0.8],
                [0.2, 0.3, 0.5]])    # -> 2, misclassified


class TestAttackEffect:
    def test_hand_values(self) -> None:
        """CAN-2 on the n = 3 correctly classified images:
        MR = 2/3; AIAC = mean(0.6-0.1, 0.8-0.7, 0.5-0.1) = 1/3;
        ARTC = mean(0.8-0.3, 0.7-0.8, 0.6-0.2) = 0.8/3."""
        out = json_roundtrip(attack_effect(Y, CLEAN, ADV))
        assert (out["n"], out["n_total"]) == (3, 4)
        assert out["MR"]["value"] == pytest.approx(2 / 3)
        assert out["MR"]["misclassified"] == 2
        assert out["AIAC"]["value"] == pytest.approx(1 / 3)
        assert out["ARTC"]["value"] == pytest.approx(0.8 / 3)

    def test_tas_targeted(self) -> None:
        """CAN-2 TAS: targets (1, 2, 0, 2); image 0 hits 1, image 1 stays 1, image 3 hits 2."""
        out = attack_effect(Y, CLEAN, ADV, target_labels=np.array([1, 2, 0, 2]))
        assert out["TAS"]["value"] == pytest.approx(2 / 3)

    def test_tas_untargeted_not_applicable(self) -> None:
        out = attack_effect(Y, CLEAN, ADV)
        assert out["TAS"]["value"] is None and out["TAS"]["status"] == "not applicable"

    def test_target_equal_to_label_rejected(self) -> None:
        """CAN-2: 'the image label of a targeted attack must not be the same as the target'."""
        with pytest.raises(InvalidArgument) as e:
            attack_effect(Y, CLEAN, ADV, target_labels=np.array([0, 2, 0, 2]))
        assert fields(e.value) == ["target_labels"]
        assert "image 0" in e.value.message

    def test_labels_only_answers(self) -> None:
        """MR works on labels; AIAC/ARTC need scores -> not available, never 0."""
        out = attack_effect(Y, CLEAN.argmax(1), ADV.argmax(1))
        assert out["MR"]["value"] == pytest.approx(2 / 3)
        for key in ("AIAC", "ARTC"):
            assert out[key]["value"] is None and out[key]["status"] == "not available"

    def test_no_correct_image(self) -> None:
        out = attack_effect(np.array([1, 1]), np.array([[0.9, 0.1]] * 2), np.array([[0.9, 0.1]] * 2))
        assert out["n"] == 0
        assert out["MR"]["value"] is None and out["MR"]["status"] == "not applicable"

    def test_acamc_without_white_box_not_available(self) -> None:
        """CAN-2 ACAMC-A/T need a white-box model."""
        out = attack_effect(Y, CLEAN, ADV)
        for key in ("ACAMC_A", "ACAMC_T"):
            assert out[key]["value"] is None and out[key]["status"] == "not available"
            assert "white-box" in out[key]["reason"]

    def test_white_box_without_images_rejected(self) -> None:
        with pytest.raises(InvalidArgument) as e:
            attack_effect(Y, CLEAN, ADV, white_box=nn.Conv2d(1, 1, 1))
        assert fields(e.value) == ["clean_images"]

    @pytest.mark.parametrize("seed", range(5))
    def test_mr_in_unit_interval(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 4, 50)
        c = rng.dirichlet(np.ones(4), 50)
        a = rng.dirichlet(np.ones(4), 50)
        out = attack_effect(y, c, a)
        if out["n"]:
            assert 0.0 <= out["MR"]["value"] <= 1.0
            assert -1.0 <= out["AIAC"]["value"] <= 1.0 and -1.0 <= out["ARTC"]["value"] <= 1.0

    def test_successful_examples(self) -> None:
        assert successful_examples(Y, CLEAN, ADV).tolist() == [True, False, False, True]


class TestObservableTransferRate:
    OTHERS = {
        # B is wrong on clean image 3, so only images 0 and 1 count: image 0 stays
        # adversarial on both -> 1/2.
        "B": {"clean": np.array([0, 1, 2, 1]), "adversarial": np.array([2, 1, 0, 2])},
        # C counts images 0, 1, 3: only image 3 is misclassified by source and C -> 1/3.
        "C": {"clean": np.array([0, 1, 2, 0]), "adversarial": np.array([0, 0, 2, 1])},
    }

    def test_hand_values(self) -> None:
        """CAN-2 OTR = mean over the other models of the share of images (right on clean for
        both models) misclassified by the source's adversarial example on both: (1/2 + 1/3)/2."""
        out = json_roundtrip(observable_transfer_rate(Y, CLEAN, ADV, self.OTHERS))
        assert out["value"] == pytest.approx(5 / 12)
        assert out["per_model"]["B"]["value"] == pytest.approx(0.5)
        assert out["per_model"]["B"]["n"] == 2
        assert out["per_model"]["C"]["value"] == pytest.approx(1 / 3)
        assert out["models"] == 2

    def test_through_attack_effect(self) -> None:
        out = attack_effect(Y, CLEAN, ADV, transfer=self.OTHERS)
        assert out["OTR"]["value"] == pytest.approx(5 / 12)

    def test_no_other_model_not_applicable(self) -> None:
        out = attack_effect(Y, CLEAN, ADV)
        assert out["OTR"]["value"] is None and out["OTR"]["status"] == "not applicable"

    def test_bad_entry_named(self) -> None:
        with pytest.raises(InvalidArgument) as e:
            observable_transfer_rate(Y, CLEAN, ADV, {"B": {"clean": [0, 1, 2, 0]}})
        assert fields(e.value) == ["transfer.B"]


# ------------------------------------------------------------------------ Grad-CAM, ACAMC ----


class LinearCam(nn.Module):
    """1x1 conv (1 -> 2 channels, weights w) -> global average pool -> linear V (+ b).
    Grad-CAM by hand: A^k = w_k x, dy^c/dA^k_ij = V_ck / Z, so a_k^c = V_ck / Z and
    L^c = ReLU(sum_k V_ck w_k x / Z)."""

    def __init__(self, w: list[float], v: list[list[float]], b: list[float]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, kernel_size=1, bias=False)
        self.fc = nn.Linear(2, len(v))
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor(w).view(2, 1, 1, 1))
            self.fc.weight.copy_(torch.tensor(v))
            self.fc.bias.copy_(torch.tensor(b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean(dim=(2, 3)))


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3)).eval()


class TestGradCam:
    def test_hand_values(self) -> None:
        """w = (1, -1), V = [[2, 1], [-1, 3]], Z = 4: class 0 -> ReLU(x / 4), class 1 ->
        ReLU(-4 x / 4) = ReLU(-x)."""
        model = LinearCam([1.0, -1.0], [[2.0, 1.0], [-1.0, 3.0]], [0.0, 0.0])
        x = torch.tensor([[1.0, -2.0], [3.0, 0.0]]).view(1, 1, 2, 2)
        m0 = grad_cam(model, x, [0])
        m1 = grad_cam(model, x, [1])
        np.testing.assert_allclose(m0[0], [[0.25, 0.0], [0.75, 0.0]], atol=1e-7)
        np.testing.assert_allclose(m1[0], [[0.0, 2.0], [0.0, 0.0]], atol=1e-7)

    def test_tiny_cnn_shape_and_sign(self) -> None:
        """CAN-2: map at the chosen conv layer's resolution, non-negative (ReLU)."""
        model = tiny_cnn()
        x = torch.rand(5, 3, 8, 8, generator=torch.Generator().manual_seed(1))
        maps = grad_cam(model, x, [0, 1, 2, 0, 1])
        assert maps.shape == (5, 8, 8)
        assert (maps >= 0).all()
        assert resolve_layer(model, None)[1] == "2"           # default: the last Conv2d
        assert grad_cam(model, x, [0] * 5, layer="0").shape == (5, 8, 8)

    def test_identical_inputs_cosine_one(self) -> None:
        """CAN-2: x_a = x gives ACAMC-A = ACAMC-T = 1 (images with an all-zero map excepted)."""
        model = tiny_cnn()
        rng = np.random.default_rng(2)
        imgs = rng.random((6, 8, 8, 3)).astype(np.float32)
        with torch.no_grad():
            y = model(torch.from_numpy(imgs).permute(0, 3, 1, 2)).argmax(1).numpy()
        out = acamc(model, imgs, imgs.copy(), y)
        assert out["n_correct"] == 6
        for key in ("ACAMC_A", "ACAMC_T"):
            assert out[key]["value"] == pytest.approx(1.0, abs=1e-6)
            assert out[key]["n"] + out[key]["zero_maps"] == 6

    def test_acamc_hand_value(self) -> None:
        """w = (1, 2), V = I, b = (0.5, 0): every class map is proportional to x, so
        ACAMC = cos(x, x_a). Image 0: x = e00, x_a = e00 + e01 -> 1/sqrt(2). Image 1 is
        misclassified (dropped); image 2 is black: all-zero map, left out (zero_maps)."""
        model = LinearCam([1.0, 2.0], [[1.0, 0.0], [0.0, 1.0]], [0.5, 0.0])
        x = np.zeros((3, 2, 2, 1))
        xa = np.zeros((3, 2, 2, 1))
        x[0, 0, 0] = 1.0
        xa[0, 0, :2] = 1.0
        x[1, 1, 1] = 1.0
        xa[1] = x[1]
        out = json_roundtrip(attack_effect(
            np.array([0, 1, 0]), np.array([[0.6, 0.4]] * 3), np.array([[0.6, 0.4]] * 3),
            white_box=model, clean_images=x, adv_images=xa, cam_layer="conv"))
        for key in ("ACAMC_A", "ACAMC_T"):
            assert out[key]["value"] == pytest.approx(1 / math.sqrt(2))
            assert (out[key]["n"], out[key]["zero_maps"], out[key]["layer"]) == (1, 1, "conv")

    def test_torch_classifier_is_a_white_box(self) -> None:
        """A TorchClassifier (uint8 images through its own preprocessing) plugs in."""
        from fortis.adapters.torch_models.classifier import InputSpec, TorchClassifier

        clf = TorchClassifier(tiny_cnn(), input_spec=InputSpec(height=8, width=8, channels=3),
                              class_names=["a", "b", "c"], name="tiny", version="0")
        imgs = np.random.default_rng(3).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
        y = clf.predict(imgs)
        out = acamc(clf, imgs, imgs.copy(), y)
        assert out["ACAMC_T"]["value"] == pytest.approx(1.0, abs=1e-6)

    def test_bad_layer_named(self) -> None:
        with pytest.raises(InvalidArgument) as e:
            grad_cam(tiny_cnn(), torch.rand(1, 3, 8, 8), [0], layer="nope")
        assert fields(e.value) == ["layer"]

    def test_cosine_of_zero_map_is_nan(self) -> None:
        sim = cosine_similarity(np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([[1.0, 1.0], [1.0, 0.0]]))
        assert sim[0] == pytest.approx(1 / math.sqrt(2)) and math.isnan(sim[1])


# ------------------------------------------------------------------------------ CAN-3 --------


class TestAttackCost:
    def test_hand_values(self) -> None:
        """CAN-3: CTC = mean seconds, QNC-F/B = mean ledger counts per example."""
        out = json_roundtrip(attack_cost(kind="score", seconds=[1.0, 2.0, 3.0, 6.0],
                                         qnc_forward=[100, 200, 300, 400], qnc_backward=[0] * 4))
        assert out["CTC"]["value"] == pytest.approx(3.0)
        assert out["QNC_F"]["value"] == pytest.approx(250.0)
        assert out["QNC_B"]["value"] == 0.0 and out["QNC_B"]["status"] == "ok"
        assert out["CTC"]["grade"] is None  # no peers timed with it

    def test_include_mask(self) -> None:
        out = attack_cost(kind="white-box", seconds=[1.0, 2.0, 3.0, 6.0],
                          qnc_forward=[100, 200, 300, 400], include=[True, True, False, True])
        assert out["n"] == 3
        assert out["CTC"]["value"] == pytest.approx(3.0)
        assert out["QNC_F"]["value"] == pytest.approx(700 / 3)
        assert out["QNC_B"]["status"] == "not available"

    @pytest.mark.parametrize("kind", ["score", "decision", "black-box"])
    def test_black_box_with_backward_queries_rejected(self, kind: str) -> None:
        """CAN-3: 'The black-box attack QNC_B must be 0, otherwise, the attack will be
        considered a white-box attack.'"""
        with pytest.raises(InvalidArgument) as e:
            attack_cost(kind=kind, qnc_forward=[10, 10, 10], qnc_backward=[0, 5, 0])
        assert fields(e.value) == ["qnc_backward"]
        assert "QNC-B = 0" in e.value.message and "example 1 made 5" in e.value.message

    @pytest.mark.parametrize("kind", ["white-box", "transfer"])
    def test_gradient_attacks_may_go_backward(self, kind: str) -> None:
        out = attack_cost(kind=kind, qnc_forward=[100, 100], qnc_backward=[100, 100])
        assert out["QNC_B"]["value"] == 100.0

    def test_untimed_attack_not_available(self) -> None:
        """Attacks that need prior training (AdvGan) have no CTC: None with a reason."""
        out = attack_cost(kind="score", qnc_forward=[1, 2])
        assert out["CTC"]["value"] is None and out["CTC"]["status"] == "not available"

    @pytest.mark.parametrize("kwargs, field", [
        ({"kind": "grey-box"}, "kind"),
        ({"kind": "score", "qnc_forward": [1.5]}, "qnc_forward"),
        ({"kind": "score", "seconds": [-1.0]}, "seconds"),
        ({"kind": "score", "seconds": [1.0, 2.0], "qnc_forward": [1]}, "seconds"),
        ({"kind": "score", "seconds": [1.0, 2.0], "include": [True]}, "include"),
    ])
    def test_bad_input_named(self, kwargs: dict, field: str) -> None:
        with pytest.raises(InvalidArgument) as e:
            attack_cost(**kwargs)
        assert fields(e.value) == [field]

    def test_grades_five_attacks(self) -> None:
        """CAN-3: five levels by rank, fastest = Very Fast."""
        g = ctc_grades({"a": 0.5, "b": 0.1, "c": 0.3, "d": 0.2, "e": 0.4})
        assert [g[k]["grade"] for k in "bdcea"] == list(CTC_GRADES)

    def test_grades_quintiles_and_ties(self) -> None:
        g = ctc_grades({str(i): float(i) for i in range(10)})
        assert [g[str(i)]["level"] for i in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        t = ctc_grades({"a": 1.0, "b": 1.0, "c": 5.0})
        assert (t["a"]["grade"], t["b"]["grade"], t["c"]["grade"]) == ("Very Fast", "Very Fast",
                                                                       "Slow")

    def test_grades_need_peers(self) -> None:
        g = ctc_grades({"a": 1.0, "b": None})
        assert g["a"]["grade"] is None and g["a"]["status"] == "not applicable"
        assert g["b"]["status"] == "not available"

    def test_grade_among_peers(self) -> None:
        out = attack_cost(kind="white-box", seconds=[9.0, 11.0],
                          ctc_peers={"fgsm": 0.01, "pgd": 0.5, "cw": 30.0, "hsja": 2.0})
        assert out["CTC"]["value"] == pytest.approx(10.0)
        assert out["CTC"]["grade"] == "Slow"  # 3 of 5 faster: floor(5 * 3 / 5) = 3


# ------------------------------------------------------------------------------ CAN-4 --------

X_TINY = np.array([[[0.2], [0.4]], [[0.6], [0.8]]])[None]    # 1 x 2 x 2 x 1
XA_TINY = np.array([[[0.3], [0.4]], [[0.6], [0.5]]])[None]   # delta = [[0.1, 0], [0, -0.3]]


class TestPerturbationCost:
    def test_hand_values(self) -> None:
        """CAN-4: AMD = 0.3; ||delta||_2 = sqrt(0.1), AED = sqrt(0.1) / 4; APCR = 2/4;
        Haar: low = block mean (-0.05 everywhere) -> FD_L = 0.1; high = delta - low =
        [[0.15, 0.05], [0.05, -0.25]] -> FD_H = 0.3."""
        out = json_roundtrip(perturbation_cost(X_TINY, XA_TINY))
        assert out["AMD"]["value"] == pytest.approx(0.3)
        assert out["AED"]["value"] == pytest.approx(math.sqrt(0.1) / 4)
        assert out["APCR"]["value"] == pytest.approx(0.5)
        assert out["AED_FD_L"]["value"] == pytest.approx(0.1)
        assert out["AED_FD_H"]["value"] == pytest.approx(0.3)
        assert out["ALMS"]["value"] is None and out["ALMS"]["status"] == "not applicable"
        assert out["ADMS"]["value"] is None and out["ADMS"]["status"] == "not available"

    def test_nonzero_denominator(self) -> None:
        """CAN-4 literal ||x||_0 (non-zero values of the clean image): 3 here."""
        x = X_TINY.copy()
        x[0, 0, 0, 0] = 0.0
        xa = XA_TINY.copy()
        xa[0, 0, 0, 0] = 0.1
        out = perturbation_cost(x, xa, l0_denominator="nonzero")
        assert out["AED"]["value"] == pytest.approx(math.sqrt(0.1) / 3)
        assert out["APCR"]["value"] == pytest.approx(2 / 3)
        with pytest.raises(InvalidArgument) as e:
            perturbation_cost(np.zeros((1, 2, 2, 1)), xa, l0_denominator="nonzero")
        assert fields(e.value) == ["l0_denominator"]

    def test_uint8_scaled(self) -> None:
        x = np.array([[[51], [102]], [[153], [204]]], dtype=np.uint8)[None]
        xa = np.array([[[77], [102]], [[153], [128]]], dtype=np.uint8)[None]
        out = perturbation_cost(x, xa)
        assert out["AMD"]["value"] == pytest.approx(76 / 255)
        assert out["AED"]["value"] == pytest.approx(math.hypot(26, 76) / 255 / 4)

    def test_change_tolerance_and_include(self) -> None:
        x = np.concatenate([X_TINY, X_TINY])
        xa = np.concatenate([XA_TINY, X_TINY + 1e-4])
        assert perturbation_cost(x, xa)["APCR"]["value"] == pytest.approx((0.5 + 1.0) / 2)
        assert perturbation_cost(x, xa, change_tolerance=1e-3)["APCR"]["value"] == \
            pytest.approx(0.25)
        one = perturbation_cost(x, xa, include=[True, False])
        assert one["n"] == 1 and one["AMD"]["value"] == pytest.approx(0.3)
        none = perturbation_cost(x, xa, include=[False, False])
        assert none["AMD"]["value"] is None and none["AMD"]["status"] == "not applicable"

    def test_identical_images_cost_nothing(self) -> None:
        """CAN-4: x_a = x -> AMD = AED = APCR = FD = ALMS = 0."""
        x = np.random.default_rng(4).random((3, 20, 24, 3))
        out = perturbation_cost(x, x.copy())
        for key in ("AMD", "AED", "APCR", "AED_FD_L", "AED_FD_H", "ALMS"):
            assert out[key]["value"] == pytest.approx(0.0, abs=1e-12), key
            assert out[key]["status"] == "ok"

    def test_fd_energy_split(self) -> None:
        """Orthogonal wavelet: FD_L^2 + FD_H^2 = ||delta||_2^2 per image."""
        rng = np.random.default_rng(5)
        x = rng.random((1, 7, 9, 3))
        xa = np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1)
        out = perturbation_cost(x, xa)
        assert out["AED_FD_L"]["value"] ** 2 + out["AED_FD_H"]["value"] ** 2 == \
            pytest.approx(np.sum((xa - x) ** 2))

    @pytest.mark.parametrize("clean, adv, field", [
        (np.ones((1, 2, 2, 1)) * 1.5, XA_TINY, "clean"),
        (X_TINY, np.ones((1, 2, 3, 1)) * 0.5, "adversarial"),
        (X_TINY, XA_TINY.astype(np.int32), "adversarial"),
    ])
    def test_bad_images_named(self, clean: np.ndarray, adv: np.ndarray, field: str) -> None:
        with pytest.raises(InvalidArgument) as e:
            perturbation_cost(clean, adv)
        assert fields(e.value) == [field]


class TestHaar:
    def test_hand_coefficients(self) -> None:
        """[[1, 2], [3, 4]]: LL = 10/2 = 5, LH (low along H, high along W) = -1, HL = -2, HH = 0."""
        ll, lh, hl, hh = haar_dwt2(np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 2, 2, 1))
        assert (ll.item(), lh.item(), hl.item(), hh.item()) == pytest.approx((5.0, -1.0, -2.0, 0.0))

    @pytest.mark.parametrize("shape", [(2, 4, 6, 3), (1, 5, 7, 3), (3, 1, 1, 1), (1, 9, 2, 1)])
    def test_perfect_reconstruction(self, shape: tuple[int, ...]) -> None:
        """CAN-4 AED-FD: low + high reconstructions sum to the perturbation; idwt(dwt(x)) = x;
        the transform keeps the energy (odd sizes included)."""
        d = np.random.default_rng(6).normal(size=shape)
        low, high = haar_split(d)
        np.testing.assert_allclose(low + high, d, atol=1e-12)
        bands = haar_dwt2(d)
        np.testing.assert_allclose(haar_idwt2(*bands), d, atol=1e-12)
        assert sum(float(np.sum(b ** 2)) for b in bands) == pytest.approx(float(np.sum(d ** 2)))
        assert float(np.sum(low * high)) == pytest.approx(0.0, abs=1e-9)  # orthogonal parts

    def test_constant_perturbation_is_all_low(self) -> None:
        low, high = haar_split(np.full((1, 4, 4, 1), 0.25))
        np.testing.assert_allclose(low, 0.25)
        np.testing.assert_allclose(high, 0.0, atol=1e-15)


class TestMsGmsd:
    def test_identical_is_zero(self) -> None:
        x = np.random.default_rng(7).random((2, 17, 17, 3))
        assert ms_gmsd(x, x.copy()) == pytest.approx([0.0, 0.0], abs=1e-12)

    def test_chroma_only_hand_value(self) -> None:
        """Same luma, different colour (flat 32 x 32 images): the gradient term G is 0, so
        MS-GMSDc = (1 - gamma) * 0.01 * c with gamma = 2 / (1 + 0.32) - 1 and c the RMSE of the
        I and Q channels on the 0..255 scale."""
        b = 0.1 * 0.299 / 0.587                      # 0.299 dR + 0.587 dG = 0: same Y
        x = np.full((1, 32, 32, 3), 0.5)
        y = x.copy()
        y[..., 0] += 0.1
        y[..., 1] -= b
        d_i = 255 * (0.5959 * 0.1 + 0.2746 * b)
        d_q = 255 * (0.2115 * 0.1 + 0.5227 * b)
        gamma = 2 / 1.32 - 1
        expected = (1 - gamma) * 0.01 * math.hypot(d_i, d_q)
        assert ms_gmsd(x, y)[0] == pytest.approx(expected, rel=1e-9)

    def test_against_piq_reference_values(self) -> None:
        """Values from piq 0.8.0 ``multi_scale_gmsd(..., chromatic=True)`` (what the CANARY
        authors call) on these seeded inputs: odd sizes (padding) and a grey image."""
        rng = np.random.default_rng(3129)
        x = rng.random((2, 21, 19, 3))
        y = np.clip(x + rng.normal(0, 0.05, x.shape), 0, 1)
        g = rng.random((1, 18, 18, 1))
        h = np.clip(g + rng.normal(0, 0.1, g.shape), 0, 1)
        np.testing.assert_allclose(ms_gmsd(x, y), [0.018632132873970742, 0.011982678826507769],
                                   rtol=1e-9)
        np.testing.assert_allclose(ms_gmsd(g, h), [0.06603191065348277], rtol=1e-9)

    def test_more_noise_scores_higher(self) -> None:
        rng = np.random.default_rng(8)
        x = rng.random((1, 32, 32, 3))
        noise = rng.normal(0, 1, x.shape)
        a = ms_gmsd(x, np.clip(x + 0.02 * noise, 0, 1))[0]
        b = ms_gmsd(x, np.clip(x + 0.2 * noise, 0, 1))[0]
        assert 0 < a < b

    def test_too_small(self) -> None:
        with pytest.raises(InvalidArgument):
            ms_gmsd(np.zeros((1, 16, 40, 1)), np.zeros((1, 16, 40, 1)))


def random_dists_files(tmp_path: Path) -> tuple[Path, Path]:
    """Random VGG16 + alpha/beta, in the files' real layouts (torchvision keys; DISTS
    weights.pt) -- the real ones cannot be downloaded here."""
    torch.manual_seed(9)
    convs = {0: (3, 64), 2: (64, 64), 5: (64, 128), 7: (128, 128), 10: (128, 256),
             12: (256, 256), 14: (256, 256), 17: (256, 512), 19: (512, 512), 21: (512, 512),
             24: (512, 512), 26: (512, 512), 28: (512, 512)}
    state = {}
    for i, (cin, cout) in convs.items():
        conv = nn.Conv2d(cin, cout, 3, padding=1)
        assert conv.bias is not None
        state[f"features.{i}.weight"] = conv.weight.detach()
        state[f"features.{i}.bias"] = conv.bias.detach()
    state["classifier.0.weight"] = torch.zeros(2, 2)   # ignored
    vgg = tmp_path / "vgg16.pth"
    torch.save(state, vgg)
    ab = tmp_path / "weights.pt"
    torch.save({"alpha": torch.rand(1, 1475, 1, 1) * 0.1 + 0.05,
                "beta": torch.rand(1, 1475, 1, 1) * 0.1 + 0.05}, ab)
    return vgg, ab


class TestAdms:
    def test_not_available_without_weights(self) -> None:
        """CAN-4 ADMS: DISTS needs user-supplied VGG weights; without them None + reason."""
        out = perturbation_cost(X_TINY, XA_TINY)
        assert out["ADMS"]["value"] is None
        assert "supplied by the user" in out["ADMS"]["reason"]

    def test_with_user_weights(self, tmp_path: Path) -> None:
        vgg, ab = random_dists_files(tmp_path)
        dists = load_dists(vgg, ab)
        assert isinstance(dists, DistsModel)
        rng = np.random.default_rng(10)
        x = rng.random((2, 32, 32, 3))
        xa = np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1)
        same = perturbation_cost(x, x.copy(), dists=dists)
        assert same["ADMS"]["value"] == pytest.approx(0.0, abs=1e-5)
        diff = perturbation_cost(x, xa, dists=dists)
        assert diff["ADMS"]["status"] == "ok" and diff["ADMS"]["value"] > 1e-4
        grey = perturbation_cost(x[..., :1], xa[..., :1], dists=dists)   # grey -> RGB
        assert grey["ADMS"]["value"] > 0

    def test_bad_files_named(self, tmp_path: Path) -> None:
        vgg, ab = random_dists_files(tmp_path)
        with pytest.raises(InvalidArgument) as e:
            load_dists(tmp_path / "missing.pth", ab)
        assert fields(e.value) == ["vgg16_weights"]
        with pytest.raises(InvalidArgument) as e:
            load_dists(vgg, vgg)
        assert fields(e.value) == ["dists_weights"]
        bad = tmp_path / "bad.pth"
        torch.save({"features.0.weight": torch.zeros(1)}, bad)
        with pytest.raises(InvalidArgument) as e:
            load_dists(bad, ab)
        assert fields(e.value) == ["vgg16_weights"]


# ------------------------------------------------------------------------------ CAN-5 --------

D_LABELS = np.array([0, 1, 2, 0])
BASE_CLEAN = np.array([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.7, 0.2, 0.1]])
DEF_CLEAN = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.1, 0.4], [0.8, 0.1, 0.1]])
BASE_ADV = np.array([[0.2, 0.7, 0.1], [0.3, 0.3, 0.4], [0.3, 0.3, 0.4], [0.4, 0.5, 0.1]])
DEF_ADV = np.array([[0.5, 0.4, 0.1], [0.3, 0.3, 0.4], [0.3, 0.3, 0.4], [0.3, 0.6, 0.1]])


class TestDefenceEffect:
    def test_hand_values(self) -> None:
        """CAN-5: image 1 rectified, image 2 sacrificed -> RR = SR = 1/4; CA 3/4 both (AV 0);
        CF 0.6 both (FV 0); CC 0.675 -> 0.625 (CV -0.05). ARAC/AITC on images 0 and 3 (both
        models right): ARAC = mean(0.7 - 0.5, 0.5 - 0.6) = 0.05, AITC = mean(0.5 - 0.2,
        0.3 - 0.4) = 0.1."""
        out = json_roundtrip(defence_effect(
            D_LABELS, baseline_clean=BASE_CLEAN, defended_clean=DEF_CLEAN,
            baseline_adv=BASE_ADV, defended_adv=DEF_ADV))
        assert out["RR"]["value"] == pytest.approx(0.25)
        assert out["SR"]["value"] == pytest.approx(0.25)
        assert out["AV"]["value"] == pytest.approx(0.0)
        assert out["FV"]["value"] == pytest.approx(0.0)
        assert out["baseline"]["CF"]["value"] == pytest.approx(0.6)
        assert out["CV"]["value"] == pytest.approx(-0.05)
        assert (out["CV"]["baseline"], out["CV"]["defended"]) == pytest.approx((0.675, 0.625))
        assert out["ARAC"]["value"] == pytest.approx(0.05)
        assert out["AITC"]["value"] == pytest.approx(0.1)
        assert out["ARAC"]["n"] == 2

    def test_acv_deltas(self) -> None:
        """CAN-5 ACV = X_Def - X_Ori; a metric missing on either side -> not available."""
        base = {"MR": {"value": 0.9, "status": "ok"}, "AMD": 0.03, "ADMS": {"value": None}}
        dfd = {"MR": {"value": 0.4, "status": "ok"}, "AMD": 0.05, "ADMS": {"value": None}}
        out = defence_effect(D_LABELS, baseline_clean=BASE_CLEAN, defended_clean=DEF_CLEAN,
                             baseline_attack=base, defended_attack=dfd)
        assert out["ACV"]["MR"]["value"] == pytest.approx(-0.5)
        assert out["ACV"]["AMD"]["value"] == pytest.approx(0.02)
        for key in ("AED", "ADMS"):
            assert out["ACV"][key]["value"] is None
            assert out["ACV"][key]["status"] == "not available"

    def test_acv_from_real_reports(self) -> None:
        base = {**attack_effect(Y, CLEAN, ADV), **perturbation_cost(X_TINY, XA_TINY)}
        out = defence_effect(Y, baseline_clean=CLEAN, defended_clean=CLEAN,
                             baseline_attack=base, defended_attack=base)
        assert out["ACV"]["MR"]["value"] == 0.0 and out["ACV"]["AED"]["value"] == 0.0
        assert out["ACV"]["ALMS"]["value"] is None

    def test_labels_only(self) -> None:
        out = defence_effect(D_LABELS, baseline_clean=BASE_CLEAN.argmax(1),
                             defended_clean=DEF_CLEAN.argmax(1))
        assert out["RR"]["value"] == pytest.approx(0.25)
        assert out["CV"]["value"] is None and out["CV"]["status"] == "not available"
        assert out["ARAC"]["value"] is None and out["AITC"]["status"] == "not available"
        assert out["ACV"]["MR"]["value"] is None
