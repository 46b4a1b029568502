"""CANARY metrics (seed 003, SPEC CAN-1, CAN-2, CAN-3, CAN-5): every metric against values
worked out by hand on tiny inputs, the properties the definitions imply, and the not-available /
not-applicable paths (a value of None with a reason, never 0). The image-level metrics (Grad-CAM,
ACAMC, CAN-4 perturbation cost) are in test_canary_images.py."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.canary import (
    CTC_GRADES,
    attack_cost,
    attack_effect,
    ctc_grades,
    defence_effect,
    macro_f1,
    model_capability,
    observable_transfer_rate,
    perturbation_cost,
    successful_examples,
)
from torch import nn

from tests.unit.scoring_cases import X_TINY, XA_TINY, fields, json_roundtrip

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
