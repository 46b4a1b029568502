"""IEEE-A1 noise corruptions: gaussian_noise, shot_noise (Poisson), impulse_noise
(salt-and-pepper), random_impulse_noise (random-valued impulse, a Fortis addition) and
speckle_noise, on uint8 images (see the package docstring for the speed choices)."""

from __future__ import annotations

import functools

import cv2
import numpy as np
from fortis.services.perturbation.corruptions import sampling
from fortis.services.perturbation.corruptions.pixels import cv_any

# Severity tables (index 0 = severity 1). ImageNet-C values from imagecorruptions 1.1.2.

#: IEEE-A1 gaussian_noise: standard deviation of the additive noise, [0, 1] pixel scale.
GAUSSIAN_NOISE_SIGMA = (0.08, 0.12, 0.18, 0.26, 0.38)
#: IEEE-A1 shot_noise: photon count per unit intensity (lower = noisier); x' = Poisson(x*c)/c.
SHOT_NOISE_PHOTONS = (60, 25, 12, 5, 3)
#: IEEE-A1 impulse_noise: fraction of pixel values replaced, half by 0 and half by 1
#: (salt-and-pepper, per channel value as skimage.util.random_noise mode='s&p').
IMPULSE_NOISE_AMOUNT = (0.03, 0.06, 0.09, 0.17, 0.27)
#: IEEE-A1 random_impulse_noise (Fortis): fraction of pixel values replaced by a uniform random
#: value (random-valued impulse noise); same amounts as impulse_noise.
RANDOM_IMPULSE_AMOUNT = IMPULSE_NOISE_AMOUNT
#: IEEE-A1 speckle_noise: standard deviation of the multiplicative noise; x' = x + x*N(0, c).
SPECKLE_NOISE_SIGMA = (0.15, 0.2, 0.35, 0.45, 0.6)


# IEEE-A1 noise

def gaussian_noise(img: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    z = sampling.standard_normal(rng, img.shape)
    return cv2.addWeighted(img, 1.0, z, 255.0 * sigma, 0.0, dtype=cv2.CV_8U)


@functools.cache
def _shot_levels(photons: int) -> np.ndarray:
    t = np.arange(256, dtype=np.float64)
    return np.rint(np.clip(t / photons, 0.0, 1.0) * 255.0).astype(np.uint8)


def shot_noise(img: np.ndarray, photons: int, rng: np.random.Generator) -> np.ndarray:
    return cv2.LUT(sampling.truncated_poisson(rng, img, photons), _shot_levels(photons))


def impulse_noise(img: np.ndarray, amount: float, rng: np.random.Generator) -> np.ndarray:
    h, w, c = img.shape
    u = rng.random((h, w * c), dtype=np.float32)
    if u.size == 1:      # OpenCV would read a 1x1 array next to a number as two scalars
        out = np.where(u < amount, np.where(u < amount / 2.0, 255, 0), img.reshape(1, 1))
        return out.astype(np.uint8)
    hit = cv_any.compare(u, float(amount), cv2.CMP_LT)          # 255 where salt or pepper
    salt = cv_any.compare(u, float(amount) / 2.0, cv2.CMP_LT)   # 255 where salt
    kept = cv2.bitwise_and(img.reshape(h, w * c), cv2.bitwise_not(hit))
    return cv2.bitwise_or(kept, salt)


def random_impulse_noise(img: np.ndarray, amount: float,
                         rng: np.random.Generator) -> np.ndarray:
    hit = rng.random(img.shape, dtype=np.float32) < amount
    values = rng.integers(0, 256, size=img.shape, dtype=np.uint8)
    return np.where(hit, values, img)


def speckle_noise(img: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    gain = cv2.addWeighted(sampling.standard_normal(rng, img.shape), float(sigma), img, 0.0, 1.0,
                           dtype=cv2.CV_32F)                 # 1 + sigma * z
    return cv2.multiply(img, gain, dtype=cv2.CV_8U)
