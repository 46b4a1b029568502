"""The diamond-square plasma height map (after FLHerne/mapgen, as ImageNet-C's
``plasma_fractal``): one implementation for every fog and haze in the catalogue, the ImageNet-C
``fog`` corruption (IEEE-A3) and the PER-1 properties ``per_fog`` and ``per_frost``'s haze.

The two differ only in where the random perturbations come from, so that is a callback:
``imagenet_c_noise`` draws each level's values as the reference does (same draws, same order:
tests/reference compares fog pixel for pixel), while the properties pre-draw unit uniforms once
and scale them, so one set of draws gives a coherent map at every epsilon (PER-3).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: ``noise(level, n, wibble)`` -> (3, n, n) float64: what is added to the square centres, then
#: to the two sets of diamond points, of level ``level`` (0 = coarsest; an n x n grid).
PlasmaNoise = Callable[[int, int, float], np.ndarray]


def plasma_mapsize(h: int, w: int) -> int:
    """Smallest power of two >= max(h, w), at least 2: the square map an h x w crop is cut from."""
    return max(2, 1 << (max(h, w) - 1).bit_length())


def imagenet_c_noise(rng: np.random.Generator) -> PlasmaNoise:
    """The reference's perturbations: per level ``wibble * U(-wibble, wibble)`` for the centres
    and the two diamond sets, drawn in one call per level (consecutive doubles, so the same
    values as its three calls)."""
    def noise(level: int, n: int, wibble: float) -> np.ndarray:
        values = rng.uniform(-wibble, wibble, (3, n, n))
        values *= wibble
        return values
    return noise


def diamond_square(mapsize: int, wibbledecay: float, noise: PlasmaNoise) -> np.ndarray:
    """Diamond-square height map, mapsize x mapsize (a power of two), *not* yet normalised
    (the reference then maps it to [0, 1]: (map - min) / (max - min); ``imagenet_c_fog`` does
    that on the part it uses, the PER-1 properties on the whole map).

    Same recurrence as the ImageNet-C ``plasma_fractal`` (itself after FLHerne/mapgen), with
    the same sums in the same order: per level, the square centres, then the two sets of
    diamond points, each plus its value from ``noise`` (``imagenet_c_noise``: the reference's
    draws in its order); wibble starts at 100 and is divided by ``wibbledecay`` per level; the
    toroidal neighbours (``np.roll`` there) come from ``_roll``."""
    assert mapsize >= 2 and mapsize & (mapsize - 1) == 0
    maparray = np.zeros((mapsize, mapsize), dtype=np.float64)
    stepsize = mapsize
    wibble = 100.0
    level = 0
    while stepsize >= 2:
        half = stepsize // 2
        n = mapsize // stepsize
        perturb = noise(level, n, wibble)
        # squares: centre of each square = mean of its 4 corners + wibble
        corner = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        centre = corner + _roll(corner, -1, 0)
        centre += _roll(centre, -1, 1)
        centre /= 4
        centre += perturb[0]
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = centre
        # diamonds: edge midpoints = mean of the two corners and two centres + wibble
        lt = centre + _roll(centre, 1, 0)
        lt += corner + _roll(corner, -1, 1)
        lt /= 4
        lt += perturb[1]
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = lt
        tt = centre + _roll(centre, 1, 1)
        tt += corner + _roll(corner, -1, 0)
        tt /= 4
        tt += perturb[2]
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = tt
        stepsize //= 2
        wibble /= wibbledecay
        level += 1
    return maparray


def _roll(a: np.ndarray, shift: int, axis: int) -> np.ndarray:
    """``np.roll(a, shift, axis)`` for shift +-1 on a 2-D array, without its overhead (the
    plasma map calls it 48 times on mostly tiny arrays)."""
    if axis == 0:
        return np.concatenate((a[-shift:], a[:-shift]), axis=0)
    return np.concatenate((a[:, -shift:], a[:, :-shift]), axis=1)
