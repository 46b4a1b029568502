"""CANARY image-level metrics (seed 003): Grad-CAM and ACAMC (CAN-2), perturbation cost
(CAN-4: AMD, AED, APCR, AED-FD via the Haar DWT, ALMS via MS-GMSD, ADMS via DISTS) against
values worked out by hand, and their not-available / not-applicable paths."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.canary import (
    DistsModel,
    acamc,
    attack_effect,
    cosine_similarity,
    grad_cam,
    haar_dwt2,
    haar_idwt2,
    haar_split,
    load_dists,
    ms_gmsd,
    perturbation_cost,
    resolve_layer,
)
from torch import nn

from tests.unit.scoring_cases import X_TINY, XA_TINY, fields, json_roundtrip

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


# ------------------------------------------------------------------------------ CAN-4 --------


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
