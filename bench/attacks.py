#!/usr/bin/env python3
"""Fortis's query attacks (IEEE-A8) against reference implementations, measured fairly.

One JSON row per (attack, model, budget, reference configuration): Fortis and the reference on
the same images, model, bound and per-image query budget; success rate with its standard error
sqrt(p (1 - p) / n), mean/median queries, median norm (the attack's own: L-inf, L2 or L0, in
[0, 1] pixel scale; L0 = pixels changed), wall time, model time, attack compute time and the
ratios Fortis / reference; then the goals as pass/fail fields. Never part of the test run
(tests/reference holds the small, fast checks). ``docs/benchmarks.md`` holds the last results.

    python bench/attacks.py [--rows square,hsja] [--models fmnist,imagenet] [--n 100]
                            [--skip 0] [--budgets 500,1000] [--seed 0] [--out result.json]

ADDING A ROW (other attacks: one entry in ``ROWS`` at the bottom of this file)
------------------------------------------------------------------------------
A row is a :class:`Row`: the Fortis attack id in the registry and its variant choices (e.g.
SimBA's ``basis``; Fortis otherwise runs at its registry defaults, and the bench sets the bound
and the budget; ``fortis.params`` / ``fortis.non_default_params`` in the JSON say what it ran
with), the norm it is judged in, targeted or not, the
budgets, the bound per model (``epsilon={"fmnist": ..., "imagenet": ...}``, [0, 1] scale;
for ``linf`` the bench passes ``floor(eps*255)/255`` to every tool so float and uint8 balls
coincide), ``mode`` ("success": success rate within the bound; "min_norm": the bound is 0 and
the median smallest adversarial norm found within the budget is compared) and its references:
:class:`Reference` (a name, a function ``run(job, oracle, params)`` that runs the tool with
``params``, its settings, and how its queries are charged: ``owner``, ``quantise``,
``memoise``); :func:`both` makes the two configurations of a tool (SETTINGS below). Fortis
itself runs through the
registry (``AttackSpec.run(AttackContext)``, queries through ``ctx.margin_query()`` /
``ctx.decision_query()`` as in production). Example::

    Row(name="simba_dct", attack="simba", params={"basis": "dct"}, norm="l2",
        epsilon={"fmnist": 3.0, "imagenet": 5.0}, budgets=(500, 1000),
        references=both("art", art_simba, owner="single",
                        defaults={"epsilon": 0.1, "freq_dim": 4, "stride": 1},
                        matched={"epsilon": fortis_default("simba", "step_size")}))

A reference's ``run(job, oracle, params)`` gets the images (``job.x`` uint8 N x H x W x C,
``job.y`` labels, ``job.targets`` for targeted rows, ``job.epsilon``, ``job.budget``,
``job.seed``) and ``params``, its settings for this configuration (passed to the tool as
they are), and must make every model call through one of the oracle's adapters:
``oracle.module()`` (an ``nn.Module``: torchattacks, foolbox, anything torch; float NCHW in
[0, 1] -> probabilities), ``oracle.numpy_nchw`` (a function float NCHW numpy -> numpy
probabilities: ART's ``BlackBoxClassifier``), ``oracle.numpy_nhwc255`` (list/array of
H x W x C in [0, 255] -> probabilities: bat). It returns nothing: what counts is what the
oracle saw (the reference's own return value is never trusted). Seed the tool's randomness from
``job.seed`` (torch / numpy global generators: see :func:`seeded`).

SETTINGS (both reported, never only the one that flatters Fortis)
---------------------------------------------------------------
Every reference tool runs at its own documented defaults (its constructor's, read from the
installed source), ``"settings": "reference_defaults"``, and again given Fortis's values
wherever the two differ, ``"settings": "matched"`` (e.g. Square's ``p_init`` 0.8 vs
Fortis's 0.05 and the horizon of its p schedule). Where they coincide it runs once,
``"settings": "defaults=matched"``. Both configurations share what a comparison must fix: the
bound, the query budget (counted by the oracle; a tool's iteration knob is set so the budget,
not its iterations, stops it, except where that knob is also the horizon of the tool's
schedule: ART's ``max_iter`` and bat's ``max_it`` in Square are the budget at their defaults,
as the tools lay the schedule over their run, and Fortis's 10,000 iterations when matched;
memoised ART may then end before its budget, its repeats being free), the model, the seed and
targeting. ``reference_params`` in each
row is what the tool was given. Fortis runs at its registry defaults (what ``fortis attacks
--json`` lists); a row's variant choice, if any, shows in ``fortis.non_default_params``.
Fortis's own attacks standing in where no installable reference exists are marked
``"settings": "fortis_defaults"``. A configuration the tool cannot run is listed under
``skipped`` with the reason.

FAIRNESS
--------
* **One model function.** Every tool, Fortis included, reaches the network through
  :class:`Oracle`: its input is turned into the same contiguous float32 NCHW tensor in
  [0, 1] (``quantise``: rounded to uint8 levels first, what a real target receives), the
  network runs in eval mode under ``torch.inference_mode`` and the answer is the softmax
  probabilities (what a black-box API returns). Only the forward is timed as model time; the
  conversions and the charging are harness time; attack compute = wall - model - harness,
  measured twice: in wall seconds (``compute_s``) and in this thread's CPU seconds
  (``compute_cpu_s``; one torch thread, so the forward runs on it too). The goals use CPU
  time (``compute_ms_per_image``): on a shared machine it is what the attack itself costs,
  wall time also counts the other processes' turns. Tool modules are imported before the
  clocks start.
* **Counted per image.** Every row of a batched call is charged to its image (``owner``:
  Fortis's query index; ``"nearest"`` = the original the point perturbs, checked to lie within
  the bound; ``"nearest_unbounded"`` = the same without that check, for tools that ask points
  outside the ball by design (Bandits' finite-difference probes; still never credited);
  ``"rows"`` = row k is image k, the call has N rows; ``"single"`` = the tool runs one image
  at a time). A point is credited when the criterion holds and it lies within the
  bound, only within the image's first ``budget`` charged queries; an image that succeeded or
  spent its budget stops being charged: later rows are answered (so the tool behaves as
  usual) but never counted or credited, and the run is stopped when every image is done.
  A reference that overruns the budget is thereby scored at the budget.
* **Memoised or not.** ``memoise=True``: an identical point asked again for the same image
  is answered from memory and not charged (ART's SquareAttack re-predicts its current images
  twice per iteration: it is reported both ways, ``art`` and ``art_memo``).
* **torchattacks' ``.train()``.** Tools get a wrapper module that does not own the network, so
  their ``.train()``/``.eval()`` calls cannot reach it; after every run the network's mode and
  weights are checked unchanged (``checks`` in the JSON).
* **Fortis is judged by the oracle too** (its own report must agree: ``checks``).

Models: ``fmnist`` (the project's Fashion-MNIST target CNN, the first ``--n`` test images it
classifies correctly) and ``imagenet`` (MobileNetV2, torchvision weights, on every offline photo
found: Debian darknet's and scikit-image's RGB photos, centre-cropped to 224 x 224; label =
the model's top-1 on the clean photo; how many is in ``setup``). One torch thread.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Literal

import numpy as np
import torch
from fortis.services.common.params import validate_params
from fortis.services.perturbation.attacks.base import AttackContext
from fortis.services.perturbation.attacks.registry import attack_spec
from fortis.services.perturbation.criteria import (
    Criterion,
    Misclassification,
    TargetedMisclassification,
)
from torch import nn

Owner = Literal["nearest", "nearest_unbounded", "rows", "single"]
CHUNK = 64  # rows per distance computation (bounded memory on 224 x 224 photos)
NormName = Literal["linf", "l2", "l0"]
Mode = Literal["success", "min_norm"]


class Done(Exception):  # noqa: N818 - a signal, not an error
    """Raised into a reference tool when every image it attacks is done (succeeded or out of
    budget): the oracle already holds everything that counts."""


class Unsupported(Exception):  # noqa: N818
    """A reference cannot run this row (e.g. no targeted variant): the row is skipped for it."""


# ------------------------------------------------------------------------ the registry types --


@dataclass(frozen=True, kw_only=True)
class Job:
    """One (row, model, budget) cell: what every tool gets."""

    row: Row
    model: str
    x: np.ndarray            # uint8 N x H x W x C
    y: np.ndarray            # int64 N, the clean top-1 (= true label for fmnist)
    targets: np.ndarray | None  # int64 N for targeted rows
    epsilon: float           # the bound in [0, 1] scale (linf: levels / 255); 0 for min_norm
    budget: int              # Q_m per image, the clean image included
    seed: int
    num_classes: int

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def nchw(self) -> np.ndarray:
        """float32 N x C x H x W in [0, 1] (what float tools take)."""
        return np.ascontiguousarray(self.x.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(255)


RunRef = Callable[[Job, "Oracle", Mapping[str, Any]], None]
Settings = Literal["reference_defaults", "matched", "defaults=matched", "fortis_defaults"]
#: a tool setting: a value, or a function of the job (e.g. the budget or the image side)
Setting = Any | Callable[[Job], Any]


@dataclass(frozen=True, kw_only=True)
class Reference:
    """A reference tool for a row, in one configuration. ``run(job, oracle, params)`` runs it
    with ``params`` (``self.params`` resolved for the job; see the module docstring)."""

    name: str
    run: RunRef
    owner: Owner = "nearest"
    quantise: bool = True    # points rounded to uint8 before the model (what a target receives)
    memoise: bool = False    # an identical point re-asked for the same image: answered, not charged
    settings: Settings = "defaults=matched"
    params: Mapping[str, Setting] = field(default_factory=dict)
    note: str = ""

    @property
    def key(self) -> str:
        """Unique within a row: the name, with ``@defaults`` / ``@matched`` where the tool runs
        in both configurations."""
        suffix = {"reference_defaults": "@defaults", "matched": "@matched"}.get(self.settings, "")
        return self.name + suffix

    def resolve(self, job: Job) -> dict[str, Any]:
        return {k: v(job) if callable(v) else v for k, v in self.params.items()}


def both(name: str, run: RunRef, *, defaults: Mapping[str, Setting],
         matched: Mapping[str, Setting], note: str = "", **how: Any) -> tuple[Reference, ...]:
    """A tool whose documented defaults differ from Fortis's settings: one configuration at
    the tool's constructor defaults, one given Fortis's values where the two differ (both
    with the same bound, budget, model, seed and targeting)."""
    return (Reference(name=name, run=run, settings="reference_defaults", params=defaults,
                      note=note, **how),
            Reference(name=name, run=run, settings="matched", params={**defaults, **matched},
                      note=note, **how))


def fortis_default(attack: str, param: str) -> Any:
    """Fortis's registry default of one parameter (what a plan that omits it runs with)."""
    for p in attack_spec(attack).params:
        if p.name == param:
            return p.default
    raise KeyError(f"{attack} has no parameter {param!r}")


@dataclass(frozen=True, kw_only=True)
class Goal:
    """A pass/fail field: Fortis's ``metric`` over the best of ``against`` (reference names or
    name prefixes; empty = every reference) times ``factor``: success rate >= factor x best,
    median norm <= factor x best (smallest), compute per image <= factor x best (smallest)."""

    name: str
    metric: Literal["success_rate", "median_norm", "compute_ms_per_image"]
    factor: float = 1.0
    against: tuple[str, ...] = ()
    #: only the configurations whose key ends so (``@defaults``: a tool at its own defaults;
    #: ``""`` = a tool that runs once, its defaults being Fortis's); empty = every one
    settings: tuple[str, ...] = ()
    budgets: tuple[int, ...] = ()   # empty = every budget of the row
    models: tuple[str, ...] = ()    # empty = every model of the row


@dataclass(frozen=True, kw_only=True)
class Row:
    """One attack against its references (see the module docstring)."""

    name: str
    attack: str                                  # Fortis registry id
    norm: NormName
    epsilon: Mapping[str, float]                 # model -> bound ([0, 1] scale); min_norm: unused
    budgets: tuple[int, ...]
    references: tuple[Reference, ...]
    params: Mapping[str, Any] = field(default_factory=dict)  # Fortis variant, else defaults
    targeted: bool = False
    mode: Mode = "success"
    models: tuple[str, ...] = ("fmnist", "imagenet")
    goals: tuple[Goal, ...] = ()
    bound_param: str = "epsilon"                 # the Fortis parameter taking the bound
    budget_param: str = "max_queries"
    #: references the compute goal is judged against (empty: every reference); a yardstick
    #: that runs another algorithm (Fortis's Square for NES) is no compute reference
    compute_against: tuple[str, ...] = ()
    note: str = ""


# ------------------------------------------------------------------------------ the oracle --


def _state(net: nn.Module) -> tuple[tuple[bool, ...], str]:
    """(every submodule's training flag, a hash of every parameter and buffer)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in itertools.chain(net.named_parameters(), net.named_buffers()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return tuple(m.training for m in net.modules()), h.hexdigest()


class _ToolModule(nn.Module):
    """What torch tools get: forwards through the oracle, owns no network (its ``.train()`` /
    ``.eval()`` reach only this wrapper). One dummy parameter so tools find a device."""

    def __init__(self, oracle: Oracle) -> None:
        super().__init__()
        self._device_probe = nn.Parameter(torch.zeros(1), requires_grad=False)
        object.__setattr__(self, "_oracle", oracle)  # not a submodule: never trained

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._oracle.forward(x)


class Oracle:
    """The one model function of a run (see FAIRNESS in the module docstring)."""

    def __init__(self, net: nn.Module, job: Job, *, owner: Owner | Literal["index"],
                 quantise: bool, memoise: bool, stop_when_done: bool) -> None:
        self.net, self.job = net, job
        self.owner, self.quantise, self.memoise = owner, quantise, memoise
        self.stop_when_done = stop_when_done
        n = job.n
        self.x01 = torch.from_numpy(job.nchw).to(torch.float64)  # N x C x H x W in [0, 1]
        self.x255 = torch.from_numpy(job.x.transpose(0, 3, 1, 2).astype(np.float64))
        self.flat = self.x01.reshape(n, -1).to(torch.float64)
        self.sq = (self.flat ** 2).sum(1)
        self.counts = np.zeros(n, dtype=np.int64)        # charged queries
        self.first = np.full(n, -1, dtype=np.int64)      # charged query that first succeeded
        self.best = np.full(n, np.inf)                   # smallest adversarial norm charged
        self.adv_norm = np.full(n, np.nan)               # norm of the credited point
        self.extra_rows = 0                              # answered, not charged (done/repeats)
        self.model_s = self.model_cpu = 0.0    # the forward: wall and CPU seconds
        self.oracle_s = self.oracle_cpu = 0.0  # conversions and charging (harness)
        self.forwards = 0
        self.current: int | None = None                  # owner "single": the image attacked
        self.memo: list[dict[bytes, np.ndarray]] = [{} for _ in range(n)]
        self.state0 = _state(net)

    # -- adapters ------------------------------------------------------------------------
    def module(self) -> nn.Module:
        return _ToolModule(self).eval()

    def numpy_nchw(self, batch: np.ndarray) -> np.ndarray:
        return self.forward(torch.from_numpy(np.asarray(batch, dtype=np.float32))).numpy()

    def numpy_nhwc255(self, batch: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
        arr = np.asarray(np.stack(list(batch)) if not isinstance(batch, np.ndarray) else batch,
                         dtype=np.float32)
        return self.forward(torch.from_numpy(arr).permute(0, 3, 1, 2) / 255.0).numpy()

    @contextlib.contextmanager
    def only(self, i: int) -> Iterator[None]:
        """Owner ``single``: every row asked inside is image ``i``'s."""
        self.current = i
        try:
            yield
        finally:
            self.current = None

    def done(self, i: int) -> bool:
        return bool(self.counts[i] >= self.job.budget or
                    (self.job.row.mode == "success" and self.first[i] > 0))

    def all_done(self) -> bool:
        if self.owner == "single" and self.current is not None:
            return self.done(self.current)
        return all(self.done(i) for i in range(self.job.n))

    # -- the model function ----------------------------------------------------------------
    def forward(self, x: torch.Tensor, owners: np.ndarray | None = None) -> torch.Tensor:
        """float N x C x H x W in [0, 1] (any strides) -> float32 probabilities, charged."""
        t0, c0 = time.perf_counter(), time.thread_time()
        model0, model0_cpu = self.model_s, self.model_cpu
        try:
            return self._forward(x, owners)
        finally:
            self.oracle_s += time.perf_counter() - t0 - (self.model_s - model0)
            self.oracle_cpu += time.thread_time() - c0 - (self.model_cpu - model0_cpu)

    def _forward(self, x: torch.Tensor, owners: np.ndarray | None) -> torch.Tensor:
        x = x.detach().to(torch.float32)
        if x.ndim == 3:
            x = x[None]
        b = x.shape[0]
        lev = None
        if self.quantise:  # the uint8 image a target would receive
            lev = torch.clamp(torch.round(x * 255.0), 0, 255)
            x = (lev / 255.0).contiguous()
        else:
            x = x.contiguous()
        own = self._owners(x, lev, owners)
        job = self.job
        # which rows are charged, which answered from memory, which answered uncharged
        keys: list[bytes] = []
        charge = np.zeros(b, dtype=bool)
        memo_hit: dict[int, np.ndarray] = {}
        need: list[int] = []
        pending = self.counts.copy()
        for j in range(b):
            i = int(own[j])
            if self.memoise:
                keys.append(x[j].numpy().tobytes())
                if keys[j] in self.memo[i]:
                    memo_hit[j] = self.memo[i][keys[j]]
                    self.extra_rows += 1
                    continue
            need.append(j)
            if not self.done(i) and pending[i] < job.budget:
                charge[j] = True
                pending[i] += 1
            else:
                self.extra_rows += 1
        probs = np.empty((b, job.num_classes), dtype=np.float32)
        if need:
            batch = x if len(need) == b else \
                x.index_select(0, torch.as_tensor(need, dtype=torch.int64)).contiguous()
            t0, c0 = time.perf_counter(), time.thread_time()
            with torch.inference_mode():
                out = torch.softmax(self.net(batch), dim=1).to(torch.float32).numpy()
            self.model_s += time.perf_counter() - t0
            self.model_cpu += time.thread_time() - c0
            self.forwards += len(need)
            probs[need] = out
        for j, p in memo_hit.items():
            probs[j] = p
        # charge and credit, in row order
        top1 = probs.argmax(axis=1)
        rows = np.flatnonzero(charge)
        if job.targets is not None:
            adversarial = top1[rows] == job.targets[own[rows]]
        else:
            adversarial = top1[rows] != job.y[own[rows]]
        norms = np.full(b, np.nan)
        hit = rows[adversarial]
        if len(hit):
            norms[hit] = self._norms(x, lev, own, hit)
        for j in rows:
            i = int(own[j])
            if self.done(i):  # an earlier row of this call succeeded
                self.extra_rows += 1
                continue
            self.counts[i] += 1
            if self.memoise:
                self.memo[i][keys[j]] = probs[j].copy()
            d = norms[j]
            if math.isnan(d):  # not adversarial
                continue
            self.best[i] = min(self.best[i], d)
            if job.row.mode == "success" and self.first[i] < 0 and self._within(d):
                self.first[i] = self.counts[i]
                self.adv_norm[i] = d
        if self.stop_when_done and self.all_done():
            raise Done
        return torch.from_numpy(probs)

    def _owners(self, x: torch.Tensor, lev: torch.Tensor | None,
                owners: np.ndarray | None) -> np.ndarray:
        b = x.shape[0]
        if owners is not None:
            return np.asarray(owners, dtype=np.int64)
        if self.owner == "single":
            if self.current is None:
                raise RuntimeError("owner 'single': call inside oracle.only(i)")
            return np.full(b, self.current, dtype=np.int64)
        if self.owner == "rows":
            if b != self.job.n:
                raise RuntimeError(f"owner 'rows': a call of {b} rows for {self.job.n} images")
            return np.arange(b, dtype=np.int64)
        own = np.empty(b, dtype=np.int64)
        for s in range(0, b, CHUNK):
            rows = x[s:s + CHUNK].reshape(min(CHUNK, b - s), -1).to(torch.float64)
            own[s:s + CHUNK] = (self.sq[None, :] - 2.0 * rows @ self.flat.T).argmin(dim=1).numpy()
        if self.job.row.mode == "success" and self.owner == "nearest":
            # the point must perturb its owner within the bound
            d = self._norms(x, lev, own, np.arange(b))
            if not all(self._within(v, slack=lev is None) for v in d):
                raise AssertionError(f"a query of {self.job.row.name} lies outside the "
                                     f"{self.job.row.norm} ball of its nearest original")
        return own

    def _norms(self, x: torch.Tensor, lev: torch.Tensor | None, own: np.ndarray,
               rows: np.ndarray) -> np.ndarray:
        """Distances of ``x[rows]`` to their owners ([0, 1] scale; exact on uint8 levels)."""
        out = np.empty(len(rows))
        norm = self.job.row.norm
        for s in range(0, len(rows), CHUNK):
            r = torch.as_tensor(rows[s:s + CHUNK], dtype=torch.int64)
            o = torch.as_tensor(own[rows[s:s + CHUNK]], dtype=torch.int64)
            if lev is not None:
                d = (lev.index_select(0, r).to(torch.float64) - self.x255.index_select(0, o)) / 255
            else:
                d = x.index_select(0, r).to(torch.float64) - self.x01.index_select(0, o)
            if norm == "linf":
                v = d.abs().flatten(1).amax(dim=1)
            elif norm == "l2":
                v = (d ** 2).flatten(1).sum(dim=1).sqrt()
            else:  # l0: pixels with any channel changed (by more than half a level)
                v = (d.abs().amax(dim=1) > 0.5 / 255).flatten(1).sum(dim=1).to(torch.float64)
            out[s:s + len(r)] = v.numpy()
        return out

    def _within(self, d: float, slack: bool = False) -> bool:
        """Within the bound: exact on uint8 levels; ``slack`` for float points (half a level
        L-inf, 1e-3 L2) only when attributing owners."""
        eps = self.job.epsilon
        if self.job.row.norm == "linf":
            return d <= eps + (0.5 / 255 if slack else 1e-9)
        if self.job.row.norm == "l2":
            return d <= eps + (1e-3 if slack else 1e-9)
        return d <= eps + 1e-9

    # -- the outcome -----------------------------------------------------------------------
    def check_net(self) -> dict[str, bool]:
        modes, weights = _state(self.net)
        return {"net_mode_unchanged": modes == self.state0[0],
                "net_weights_unchanged": weights == self.state0[1]}

    def summary(self, wall_s: float, cpu_s: float) -> dict[str, Any]:
        job = self.job
        n = job.n
        ok = self.first > 0
        queries = np.where(ok, self.first, np.minimum(self.counts, job.budget))
        out: dict[str, Any] = {"n": n}
        if job.row.mode == "success":
            out["success_rate"] = _r(ok.mean())
            out["success_rate_se"] = _se(ok.mean(), n)
            out["mean_queries_successful"] = _r(queries[ok].mean()) if ok.any() else None
            out["median_queries_successful"] = _r(np.median(queries[ok])) if ok.any() else None
            out["mean_queries_all"] = _r(queries.mean())
            out["median_norm"] = _r(np.median(self.adv_norm[ok])) if ok.any() else None
        else:
            found = np.isfinite(self.best)
            out["found_adversarial"] = _r(found.mean())
            out["found_adversarial_se"] = _se(found.mean(), n)
            out["median_norm"] = _r(np.median(self.best))  # inf where none was found
            out["mean_queries_all"] = _r(np.minimum(self.counts, job.budget).mean())
        compute = wall_s - self.model_s - self.oracle_s
        compute_cpu = cpu_s - self.model_cpu - self.oracle_cpu
        out.update({
            "max_queries_charged": int(self.counts.max(initial=0)),
            "model_rows": self.forwards, "rows_uncharged": self.extra_rows,
            "wall_s": _r(wall_s, 3), "model_s": _r(self.model_s, 3),
            "harness_s": _r(self.oracle_s, 3), "compute_s": _r(compute, 3),
            "cpu_s": _r(cpu_s, 3), "model_cpu_s": _r(self.model_cpu, 3),
            "compute_cpu_s": _r(compute_cpu, 3),
            "compute_ms_per_image": _r(1000 * compute_cpu / max(n, 1), 2),
            "compute_wall_ms_per_image": _r(1000 * compute / max(n, 1), 2)})
        return out


def _se(p: float, n: int) -> float | None:
    """Standard error of a rate over n images, sqrt(p (1 - p) / n)."""
    return _r(math.sqrt(max(float(p) * (1.0 - float(p)), 0.0) / n)) if n else None


def _r(v: float, nd: int = 4) -> float | None:
    v = float(v)
    if math.isnan(v):
        return None
    return round(v, nd) if math.isfinite(v) else v


# ---------------------------------------------------------------------------- running tools --


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """numpy's and torch's global generators seeded (restored afterwards); ART's unseeded
    ``np.random.RandomState()`` draws seeded too."""
    state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    unseeded = np.random.RandomState
    draws = itertools.count(seed)

    class Seeded(unseeded):  # type: ignore[misc, valid-type]
        def __init__(self, s: Any = None) -> None:
            super().__init__(next(draws) if s is None else s)

    np.random.seed(seed)
    torch.manual_seed(seed)
    setattr(np.random, "RandomState", Seeded)  # noqa: B010
    try:
        yield
    finally:
        setattr(np.random, "RandomState", unseeded)  # noqa: B010
        np.random.set_state(state)
        torch.random.set_rng_state(torch_state)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Tools that print progress (bat, tqdm bars) keep quiet."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


class _QueryClient:
    """Fortis's query client (``base.QueryClient``) over the oracle: uint8 NHWC in."""

    def __init__(self, oracle: Oracle, ids: Sequence[str]) -> None:
        self.oracle = oracle
        self.index = {s: k for k, s in enumerate(ids)}
        self.num_classes = oracle.job.num_classes

    def scores(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        t0, c0 = time.perf_counter(), time.thread_time()
        owners = np.fromiter((self.index[s] for s in image_ids), dtype=np.int64,
                             count=len(image_ids))
        x = torch.from_numpy(np.asarray(images)).permute(0, 3, 1, 2).to(torch.float32) / 255.0
        self.oracle.oracle_s += time.perf_counter() - t0
        self.oracle.oracle_cpu += time.thread_time() - c0
        return self.oracle.forward(x, owners).numpy()

    def labels(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        return self.scores(images, image_ids).argmax(axis=1)


def fortis_params(job: Job) -> dict[str, Any]:
    """What Fortis runs with: its registry defaults, the row's variant choices (``Row.params``)
    and the bench's bound and budget."""
    row = job.row
    return validate_params(attack_spec(row.attack), {**row.params, row.bound_param: job.epsilon,
                                                     row.budget_param: job.budget})


def fortis_non_default(job: Job) -> dict[str, Any]:
    """The parameters Fortis runs with that are not its registry defaults (bound and budget
    aside): empty when the row runs Fortis as a plan that names none would."""
    row = job.row
    used = fortis_params(job)
    return {p.name: used[p.name] for p in attack_spec(row.attack).params
            if p.name not in (row.bound_param, row.budget_param) and p.name in used
            and used[p.name] != p.default}


def run_fortis(job: Job, oracle: Oracle) -> dict[str, Any]:
    """Fortis through its registry, as the perturbation engine runs it. Returns checks."""
    row = job.row
    spec = attack_spec(row.attack)
    params = fortis_params(job)
    ids = tuple(f"img{i}" for i in range(job.n))
    criterion: Criterion = Misclassification()
    if job.targets is not None:
        criterion = TargetedMisclassification(target=int(job.targets[0]))
    ctx = AttackContext(spec=spec, images=job.x, labels=job.y, image_ids=ids,
                        label_sets=tuple((int(v),) for v in job.y),
                        params=MappingProxyType(params), seed=job.seed, criterion=criterion,
                        query=_QueryClient(oracle, ids))  # type: ignore[arg-type]
    results = spec.run(ctx)
    reported_ok = np.array([bool(r.success) for r in results])
    reported_q = np.array([r.queries for r in results])
    checks: dict[str, bool] = {"queries_as_charged": bool(np.array_equal(reported_q,
                                                                         oracle.counts))}
    if row.mode == "success":
        checks["success_as_credited"] = bool(np.array_equal(reported_ok, oracle.first > 0))
        advs = np.stack([r.adversarial for r in results]).astype(np.int64)
        d = (advs - job.x.astype(np.int64)) / 255.0
        if row.norm == "linf":
            within = np.abs(d).reshape(job.n, -1).max(axis=1) <= job.epsilon + 1e-9
        elif row.norm == "l2":
            within = np.sqrt((d ** 2).reshape(job.n, -1).sum(axis=1)) <= job.epsilon + 1e-9
        else:
            within = (np.abs(d).max(axis=3) > 0).reshape(job.n, -1).sum(axis=1) <= job.epsilon
        checks["every_adversarial_within_bound"] = bool(within.all())
    return checks


def timed(job: Job, net: nn.Module, *, owner: Owner | Literal["index"], quantise: bool,
          memoise: bool, body: Callable[[Oracle], Any]) -> tuple[dict[str, Any], Any]:
    oracle = Oracle(net, job, owner=owner, quantise=quantise, memoise=memoise,
                    stop_when_done=owner != "index")
    t0, c0 = time.perf_counter(), time.thread_time()
    out = None
    try:
        out = body(oracle)
    except Done:
        pass
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    summary = oracle.summary(wall, cpu)
    summary["checks"] = oracle.check_net()
    return summary, out


# ------------------------------------------------------------------------------ references --
# Every function gets ``p``: the tool's settings for this configuration (``Reference.params``
# resolved). The rows below state, per tool, its constructor defaults and the values Fortis
# uses where they differ; the function passes ``p`` through and fixes only what a comparison
# must: the bound, the budget (through the oracle, and the tool's own iteration knob set so the
# budget, not the iterations, can stop it), the model, the seed and targeting.


def _art_scores(job: Job, oracle: Oracle) -> Any:
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    c, h, w = job.nchw.shape[1:]
    return BlackBoxClassifierNeuralNetwork(oracle.numpy_nchw, input_shape=(c, h, w),
                                           nb_classes=job.num_classes, channels_first=True,
                                           clip_values=(0.0, 1.0))


def _art_labels(job: Job, oracle: Oracle) -> Any:
    from art.estimators.classification import BlackBoxClassifier

    c, h, w = job.nchw.shape[1:]
    return BlackBoxClassifier(oracle.numpy_nchw, input_shape=(c, h, w),
                              nb_classes=job.num_classes, clip_values=(0.0, 1.0))


def art_square(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``SquareAttack`` (L-inf). ``max_iter`` both sets its iterations and lays its p
    schedule over them (``i / max_iter``)."""
    from art.attacks.evasion import SquareAttack

    if job.targets is not None:
        raise Unsupported("ART's SquareAttack is untargeted only")
    with seeded(job.seed):
        SquareAttack(_art_scores(job, oracle), norm=np.inf, eps=job.epsilon, verbose=False,
                     **p).generate(job.nchw, y=np.eye(job.num_classes)[job.y])


def torchattacks_square(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """torchattacks ``Square`` (L-inf), ``n_queries = Q - 2``: it also asks the clean and the
    stripe-initialised images."""
    import torchattacks

    atk = torchattacks.Square(oracle.module(), norm="Linf", eps=job.epsilon,
                              n_queries=max(job.budget - 2, 1), seed=job.seed, verbose=False,
                              **p)
    labels = torch.from_numpy(job.y)
    if job.targets is not None:
        atk.set_mode_targeted_by_label(quiet=True)
        labels = torch.from_numpy(job.targets)
    atk(torch.from_numpy(job.nchw), labels)


def _bat_module(name: str) -> ModuleType:
    """A module of blackbox-adversarial-toolbox (``bat``) loaded without ``bat/__init__``,
    which imports Google Cloud Vision clients the attacks do not need."""
    key = f"_bat_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.find_spec("bat")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("blackbox-adversarial-toolbox is not installed (dev extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "attacks" / f"{name}.py"
    mspec = importlib.util.spec_from_file_location(key, path)
    assert mspec is not None and mspec.loader is not None
    module = importlib.util.module_from_spec(mspec)
    sys.modules[key] = module
    mspec.loader.exec_module(module)
    return module


class _BatClassifier:
    def __init__(self, oracle: Oracle) -> None:
        self.predict = oracle.numpy_nhwc255


def bat_square(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """bat ``SquareAttack`` (L-inf, images in [0, 255] HWC; clean + stripes + ``max_it - 1``
    iterations; ``max_it`` is also the horizon of its p schedule; it seeds numpy with 0
    itself)."""
    attack = _bat_module("square_attack").SquareAttack(_BatClassifier(oracle))
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed), quiet():
        attack.attack(job.x.astype(np.float32), np.eye(job.num_classes, dtype=bool)[y],
                      targeted=job.targets is not None, epsilon=job.epsilon, **p)


def _side(job: Job) -> int:
    return int(min(job.x.shape[1:3]))


def _simba_dims(job: Job) -> tuple[int, int]:
    """Fortis's SimBA-DCT block and stride for the image side, from its registry defaults
    (``freq_ratio`` 1/8, ``stride_ratio`` 1/32: 4 and 1 at 28 x 28, 28 and 7 at 224 x 224)."""
    side = _side(job)
    return (max(1, round(side * fortis_default("simba", "freq_ratio"))),
            max(1, round(side * fortis_default("simba", "stride_ratio"))))


def art_simba(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``SimBA`` (``attack="px"`` or ``"dct"`` as the row's ``basis``), one image at a time
    (ART loops over images itself), ``max_iter = Q``: the budget stops it. ART has no L2 bound:
    it is credited only with points within the row's bound."""
    from art.attacks.evasion import SimBA

    clf = _art_scores(job, oracle)
    basis = "px" if job.row.params.get("basis", "dct") == "pixel" else "dct"
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed):
        for i in range(job.n):
            attack = SimBA(clf, attack=basis, max_iter=job.budget,
                           targeted=job.targets is not None, verbose=False, **p)
            with oracle.only(i), contextlib.suppress(Done):
                attack.generate(job.nchw[i:i + 1], y=np.eye(job.num_classes)[y[i:i + 1]])


def art_square_l2(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``SquareAttack(norm=2)``, one image at a time: its L2 window update divides by a
    zero norm where a window is blank (NaN points, which no nearest-original charging can
    attribute); those are never credited."""
    from art.attacks.evasion import SquareAttack

    if job.targets is not None:
        raise Unsupported("ART's SquareAttack is untargeted only")
    clf = _art_scores(job, oracle)
    with seeded(job.seed), np.errstate(divide="ignore", invalid="ignore"):
        for i in range(job.n):
            attack = SquareAttack(clf, norm=2, eps=job.epsilon, verbose=False, **p)
            with oracle.only(i), contextlib.suppress(Done):
                attack.generate(job.nchw[i:i + 1], y=np.eye(job.num_classes)[job.y[i:i + 1]])


def torchattacks_square_l2(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """torchattacks ``Square(norm="L2")``, ``n_queries = Q - 2``, one image at a time (some of
    its L2 points leave the ball: they are charged but never credited)."""
    import torchattacks

    atk = torchattacks.Square(oracle.module(), norm="L2", eps=job.epsilon,
                              n_queries=max(job.budget - 2, 1), seed=job.seed, verbose=False,
                              **p)
    labels = torch.from_numpy(job.y)
    if job.targets is not None:
        atk.set_mode_targeted_by_label(quiet=True)
        labels = torch.from_numpy(job.targets)
    for i in range(job.n):
        with oracle.only(i), contextlib.suppress(Done):
            atk(torch.from_numpy(job.nchw[i:i + 1]), labels[i:i + 1])


def art_pixel(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``PixelAttack(th=k)``, one image at a time. ``es=1`` is differential evolution with
    a population of ``400 // dims`` x dims (about the paper's and Fortis's 400); ``es=0`` (its
    default) is CMA-ES from the ``cma`` package. Its ``max_iter`` generations outlast the
    budget at either setting."""
    from art.attacks.evasion import PixelAttack

    if p.get("es", 0) == 0 and importlib.util.find_spec("cma") is None:
        raise Unsupported("ART's default es=0 (CMA-ES) needs the cma package, not installed")
    clf = _art_scores(job, oracle)
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed):
        for i in range(job.n):
            attack = PixelAttack(clf, th=int(job.epsilon), targeted=job.targets is not None,
                                 verbose=False, **p)
            with oracle.only(i), contextlib.suppress(Done):
                attack.generate(job.nchw[i:i + 1], y=y[i:i + 1])


def torchattacks_onepixel(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """torchattacks ``OnePixel(pixels=k)`` (scipy's DE; ``popsize`` is the whole population,
    divided among the dimensions), one image at a time. ``steps`` (generations) is how it
    spends a budget: set so the budget, not the steps, stops it (its default 10 generations of
    ~9 candidates would stop near 100 queries)."""
    import torchattacks

    atk = torchattacks.OnePixel(oracle.module(), pixels=int(job.epsilon),
                                steps=max(job.budget, 10), **p)
    labels = job.y
    if job.targets is not None:
        atk.set_mode_targeted_by_label(quiet=True)
        labels = job.targets
    with seeded(job.seed):
        for i in range(job.n):
            with oracle.only(i), contextlib.suppress(Done):
                atk(torch.from_numpy(job.nchw[i:i + 1]), torch.from_numpy(labels[i:i + 1]))


def art_hsja(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``HopSkipJump`` (L2), one image at a time (ART loops over images itself). Its
    default 50 iterations ask at least 100 x sqrt(t) points each: the budget stops it first."""
    from art.attacks.evasion import HopSkipJump

    clf = _art_labels(job, oracle)
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed):
        for i in range(job.n):
            attack = HopSkipJump(clf, norm=2, verbose=False, targeted=job.targets is not None,
                                 **p)
            with oracle.only(i), contextlib.suppress(Done):
                attack.generate(job.nchw[i:i + 1], y=np.eye(job.num_classes)[y[i:i + 1]])


def _foolbox(job: Job, oracle: Oracle) -> tuple[Any, Any]:
    import foolbox as fb

    model = fb.PyTorchModel(oracle.module(), bounds=(0.0, 1.0), device="cpu")
    if job.targets is not None:
        return model, fb.criteria.TargetedMisclassification(torch.from_numpy(job.targets))
    return model, fb.criteria.Misclassification(torch.from_numpy(job.y))


def foolbox_hsja(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """foolbox 3 ``HopSkipJumpAttack`` (L2, blended-noise start), the whole batch at once as
    foolbox runs (every call has the N images in order). Its default 64 steps ask at least
    100 x sqrt(t) points each: the budget stops it first."""
    import foolbox as fb

    model, criterion = _foolbox(job, oracle)
    with seeded(job.seed):
        fb.attacks.HopSkipJumpAttack(**p).run(model, torch.from_numpy(job.nchw), criterion)


def foolbox_boundary(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """foolbox 3 ``BoundaryAttack`` (L2, blended-noise start), the whole batch per call; its
    default 25,000 steps outlast the budget."""
    import foolbox as fb

    model, criterion = _foolbox(job, oracle)
    with seeded(job.seed):
        fb.attacks.BoundaryAttack(**p).run(model, torch.from_numpy(job.nchw), criterion)


def art_boundary(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``BoundaryAttack`` (L2), one image at a time (ART loops over images itself); its
    default 5,000 iterations outlast the budget. Its default ``targeted=True`` is set to the
    row's targeting (a comparison fixes it)."""
    from art.attacks.evasion import BoundaryAttack

    clf = _art_labels(job, oracle)
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed):
        for i in range(job.n):
            attack = BoundaryAttack(clf, targeted=job.targets is not None, verbose=False, **p)
            with oracle.only(i), contextlib.suppress(Done):
                attack.generate(job.nchw[i:i + 1], y=np.eye(job.num_classes)[y[i:i + 1]])


def art_geoda(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``GeoDA`` (the row's norm; ``max_iter = Q``: the query budget it spreads over its
    iterations), one image at a time. It writes its DCT basis to the working directory (a
    temporary one here) and builds it with ``np.mat``, gone in NumPy 2 (``np.asmatrix`` stands
    in); untargeted only; square images only."""
    import tempfile

    from art.attacks.evasion import GeoDA

    if job.targets is not None:
        raise Unsupported("ART's GeoDA is untargeted only")
    clf = _art_scores(job, oracle)
    had_mat = hasattr(np, "mat")
    if not had_mat:
        np.mat = np.asmatrix  # type: ignore[attr-defined]
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), seeded(job.seed):
            for i in range(job.n):
                try:
                    attack = GeoDA(clf, norm=np.inf if job.row.norm == "linf" else 2,
                                   max_iter=job.budget, verbose=False, **p)
                except (IndexError, RecursionError) as e:  # its query plan needs Q >~ 100
                    raise Unsupported(f"ART's GeoDA cannot plan {job.budget} queries") from e
                with oracle.only(i), contextlib.suppress(Done):
                    attack.generate(job.nchw[i:i + 1],
                                    y=np.eye(job.num_classes)[job.y[i:i + 1]])
    finally:
        if not had_mat:
            del np.mat  # type: ignore[attr-defined]


def fortis_hsja_ref(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """Fortis's own HopSkipJump (``hsja.py``) as the yardstick of attacks with no installable
    reference (QEBA is HopSkipJump with subspace probes; qFool and SurFree are compared with
    it in their papers), with the paper's noise start as those attacks have (``start="noise"``;
    Fortis's default batch start is measured in its own rows): uint8 images, each row charged
    to its image."""
    from fortis.services.perturbation.attacks import hop_skip_jump

    def labels(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.asarray(images)).permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return oracle.forward(x, np.asarray(idx)).numpy().argmax(axis=1)

    criterion: Criterion = Misclassification()
    if job.targets is not None:
        criterion = TargetedMisclassification(target=int(job.targets[0]))
    hop_skip_jump(labels, job.x, job.y, epsilon=job.epsilon, max_queries=job.budget,
                  rng=np.random.default_rng(job.seed), criterion=criterion, start="noise")


def art_zoo(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART ``ZooAttack`` (ZOO-ADAM), one image at a time; no L2 bound of its own: credited
    within the row's. Its default 10 iterations of ``2 x nb_parallel`` points outlast a budget
    of 1,000 queries."""
    from art.attacks.evasion import ZooAttack

    clf = _art_scores(job, oracle)
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed):
        for i in range(job.n):
            attack = ZooAttack(clf, targeted=job.targets is not None, batch_size=1,
                               verbose=False, **p)
            with oracle.only(i), contextlib.suppress(Done):
                attack.generate(job.nchw[i:i + 1], y=np.eye(job.num_classes)[y[i:i + 1]])


def bat_bandits(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """bat ``BanditsAttack`` (Bandits-T, L-inf, no data prior, cross-entropy; 3 queries per
    iteration: two probes and the iterate, so ``max_it = Q // 3``; untargeted only), the whole
    batch at once. Given one image, bat takes another path ("vertical") that adds the clipped
    perturbation to the iterate a second time instead of projecting it, so its iterates leave
    the ball (measured: bat reports successes the bound does not allow); with several images
    it projects correctly. Its probes are not projected onto the ball by design: owners are
    the nearest originals without the bound check, and only points within it are credited."""
    if job.targets is not None:
        raise Unsupported("bat's BanditsAttack is untargeted only")
    attack = _bat_module("bandits_attack").BanditsAttack(_BatClassifier(oracle))
    if job.n < 2:
        raise Unsupported("bat's BanditsAttack projects correctly only on two or more images")
    with seeded(job.seed), quiet():
        attack.attack(job.x.astype(np.float64), job.y, epsilon=job.epsilon,
                      max_it=max(job.budget // 3, 1), **p)


def fortis_square_ref(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """Fortis's own Square Attack (L-inf ``square.py`` or L2 ``square_l2.py`` as the row's
    norm, at its defaults) as the yardstick of score-based attacks with no installable
    reference (NES, RGF, SignHunter): uint8 images, each row charged to its image."""
    from fortis.services.perturbation.attacks.base import margins_of
    from fortis.services.perturbation.attacks.square import square_attack
    from fortis.services.perturbation.attacks.square_l2 import square_l2_attack

    def scores(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.asarray(images)).permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return oracle.forward(x, np.asarray(idx)).numpy()

    criterion: Criterion = Misclassification()
    if job.targets is not None:
        criterion = TargetedMisclassification(target=int(job.targets[0]))
    margin = margins_of(scores, job.y, criterion)
    if job.row.norm == "l2":
        square_l2_attack(margin, job.x, job.y, epsilon=job.epsilon, max_queries=job.budget,
                         rng=np.random.default_rng(job.seed))
    else:
        square_attack(None, job.x, job.y, epsilon=job.epsilon, max_queries=job.budget,
                      rng=np.random.default_rng(job.seed), margin=margin)


def art_nes(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """ART's NES: its ``QueryEfficientGradientEstimationClassifier`` (Ilyas et al.'s
    antithetic Gaussian estimate: ``num_basis`` draws, each asked at ``x - sigma u`` and
    ``x + sigma u``, of the cross-entropy loss) under ART's ``ProjectedGradientDescentNumpy``
    (L-inf sign steps or L2 steps as the row's norm, projected onto the ball), the whole batch
    (the estimator loops over images itself, one call per image). ``max_iter`` is set so the
    budget, not the iterations, stops it. Its probes leave the ball where the iterate is on
    its edge (as the paper's): owners are the nearest originals without the bound check, and
    only points within it are credited."""
    from art.attacks.evasion import ProjectedGradientDescentNumpy
    from art.estimators.classification import QueryEfficientGradientEstimationClassifier

    p = dict(p)
    est = QueryEfficientGradientEstimationClassifier(
        _art_scores(job, oracle), num_basis=int(p.pop("num_basis")),
        sigma=float(p.pop("sigma")), round_samples=float(p.pop("round_samples")))
    y = job.targets if job.targets is not None else job.y
    with seeded(job.seed):
        ProjectedGradientDescentNumpy(
            est, norm=np.inf if job.row.norm == "linf" else 2, eps=job.epsilon,
            max_iter=job.budget // (2 * est.num_basis) + 2, targeted=job.targets is not None,
            verbose=False, **p).generate(job.nchw, y=np.eye(job.num_classes)[y])


def _natural_direction_per_image(samples: np.ndarray, g: np.ndarray,
                                 gamma: np.ndarray) -> np.ndarray:
    """ZO-NGD's ``F^{-1} g`` one image at a time (Fortis's implementation before it solved the
    images of a chunk as one stacked system): the yardstick of that batching."""
    k, q, d = samples.shape
    out = np.empty((k, d), dtype=np.float64)
    for j in range(k):
        gj = samples[j][np.any(samples[j] != 0, axis=1)].astype(np.float64)
        v = g[j].astype(np.float64)
        if not len(gj):
            out[j] = v / gamma[j]
            continue
        n = len(gj)
        small = n * gamma[j] * np.eye(n) + gj @ gj.T
        out[j] = (v - gj.T @ np.linalg.solve(small, gj @ v)) / gamma[j]
    return out


def fortis_ngd_unbatched(job: Job, oracle: Oracle, p: Mapping[str, Any]) -> None:
    """Fortis's ZO-NGD exactly as the Fortis row runs it (the registry, the row's norm and
    defaults), with the natural-gradient direction solved per image
    (:func:`_natural_direction_per_image`): no installable reference exists, so its compute
    is compared with its own per-image version (same queries, same results)."""
    from fortis.services.perturbation.attacks import ngd as ngd_mod

    batched = ngd_mod.natural_direction
    ngd_mod.natural_direction = _natural_direction_per_image  # type: ignore[assignment]
    try:
        run_fortis(job, oracle)
    finally:
        ngd_mod.natural_direction = batched  # type: ignore[assignment]


# ------------------------------------------------------------------------------ the models --


def load_fmnist(n: int) -> tuple[nn.Module, np.ndarray, np.ndarray, dict[str, Any]]:
    from fortis.adapters.builtin import load_model
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    clf = load_model("fmnist-cnn")
    images, labels = load_fashion_mnist("test")
    head = images[: 4 * n]
    ok = np.flatnonzero(clf.predict(head) == labels[: 4 * n])[:n]
    return clf.model.eval(), images[ok], labels[ok], {
        "model": "fmnist-cnn (project's Fashion-MNIST target CNN)", "n_images": len(ok),
        "images": f"first {len(ok)} Fashion-MNIST test images the target classifies correctly"}


def offline_photos() -> list[tuple[str, np.ndarray]]:
    """Every offline RGB photo: Debian darknet's and scikit-image's."""
    from fortis.adapters.torch_models.datasets import DARKNET_DIR
    from PIL import Image

    out: list[tuple[str, np.ndarray]] = []
    for p in sorted(DARKNET_DIR.glob("*.jpg")):
        with Image.open(p) as im:
            out.append((f"darknet/{p.stem}", np.asarray(im.convert("RGB"), dtype=np.uint8)))
    try:
        import skimage.data as sk
    except ImportError:
        sk = None
    for name in ("astronaut", "chelsea", "coffee", "rocket", "stereo_motorcycle",
                 "hubble_deep_field", "immunohistochemistry", "retina", "colorwheel"):
        try:
            img = getattr(sk, name)() if sk is not None else None
        except Exception:  # noqa: BLE001 - a missing data file: skip the photo
            img = None
        if isinstance(img, tuple):
            img = img[0]
        if img is not None and img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3:
            out.append((f"skimage/{name}", np.ascontiguousarray(img)))
    for extra in (Path("/usr/share/matplotlib/sample_data/grace_hopper.jpg"),):
        if extra.is_file():
            with Image.open(extra) as im:
                out.append(("grace_hopper", np.asarray(im.convert("RGB"), dtype=np.uint8)))
    return out


def load_imagenet() -> tuple[nn.Module, np.ndarray, np.ndarray, dict[str, Any]]:
    from fortis.adapters.torch_models.mobilenet import load_mobilenet_v2, preprocess_photo

    net = load_mobilenet_v2().eval()
    photos = offline_photos()
    x = np.stack([preprocess_photo(img) for _, img in photos])
    with torch.inference_mode():
        logits = net(torch.from_numpy(x).permute(0, 3, 1, 2).float().div(255).contiguous())
    y = logits.argmax(1).numpy().astype(np.int64)
    return net, x, y, {
        "model": "MobileNetV2 (torchvision weights mobilenet_v2-b0353104.pth)",
        "n_images": len(x), "images": [name for name, _ in photos],
        "labels": "the model's top-1 on the clean 224 x 224 centre crop"}


MODEL_LOADERS: dict[str, Callable[[int], tuple[nn.Module, np.ndarray, np.ndarray,
                                               dict[str, Any]]]] = {
    "fmnist": load_fmnist,
    "imagenet": lambda n: load_imagenet(),
}


# --------------------------------------------------------------------------- goals, tables --


def tolerance(a: float, b: float, n: int) -> float:
    """Two standard errors of the difference of two binomial proportions of n trials."""
    p = (a + b) / 2
    return max(2.0 * math.sqrt(2.0 * p * (1.0 - p) / n), 1.0 / n)


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
        return None
    if math.isinf(a) or math.isinf(b):
        return None
    return round(a / b, 3)


RATIO_KEYS = ("success_rate", "found_adversarial", "mean_queries_successful",
              "mean_queries_all", "median_norm", "wall_s", "model_s", "compute_s",
              "compute_cpu_s",
              "compute_ms_per_image")


def _matches(key: str, against: tuple[str, ...], settings: tuple[str, ...] = ()) -> bool:
    name, _, config = key.partition("@")  # either configuration of a tool counts
    if settings and (("@" + config) if config else "") not in settings:
        return False
    return not against or any(name == a or name.startswith(a + "_") for a in against)


COMPUTE_GOAL = "compute_per_image_at_most_fastest_reference"


def judge(row: Row, model: str, budget: int, fortis: dict[str, Any],
          refs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    goals = list(row.goals)
    goals.append(Goal(name="success_not_worse_than_best_reference", metric="success_rate")
                 if row.mode == "success" else
                 Goal(name="median_norm_not_worse_than_best_reference", metric="median_norm"))
    goals.append(Goal(name=COMPUTE_GOAL, metric="compute_ms_per_image",
                      against=row.compute_against))
    out = []
    for g in goals:
        if (g.budgets and budget not in g.budgets) or (g.models and model not in g.models):
            continue
        pool = {k: v.get(g.metric) for k, v in refs.items()
                if _matches(k, g.against, g.settings)}
        pool = {k: v for k, v in pool.items() if isinstance(v, int | float)}
        ours = fortis.get(g.metric)
        if not pool or not isinstance(ours, int | float):
            out.append({"goal": g.name, "pass": None, "why": "no value"})
            continue
        if g.metric == "success_rate":
            best_name = max(pool, key=lambda k: pool[k])
            best = pool[best_name]
            if g.factor == 1.0:  # "not worse": within two standard errors
                passed = ours >= best - tolerance(ours, best, fortis["n"])
            else:
                passed = ours >= g.factor * best
        else:
            best_name = min(pool, key=lambda k: pool[k])
            best = pool[best_name]
            passed = ours <= g.factor * best
        out.append({"goal": g.name, "metric": g.metric, "factor": g.factor,
                    "fortis": ours, "best_reference": best_name, "reference": best,
                    "ratio": _ratio(ours, best), "pass": bool(passed)})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the JSON rows (one line per reference configuration, Fortis
    first; success or found rate with its standard error)."""
    head = (f"{'attack':<18}{'model':<9}{'Q':>6} {'tool':<22}{'settings':<19}{'succ':>6}"
            f"{'se':>6}{'q_mean':>8}{'norm_med':>10}{'wall_s':>8}{'comp_ms/img':>12}")
    lines = [head, "-" * len(head)]
    seen: set[tuple[str, str, int]] = set()
    for r in rows:
        key = (r["row"], r["model"], r["budget"])
        fortis = "defaults" if not r["fortis"].get("non_default_params") else "variant"
        tools = ([("fortis", fortis, r["fortis"])] if key not in seen else []) + \
            [(r["reference"], r["settings"], r["ref"])]
        seen.add(key)
        for name, setting, s in tools:
            succ = s.get("success_rate", s.get("found_adversarial"))
            se = s.get("success_rate_se", s.get("found_adversarial_se"))
            q = s.get("mean_queries_successful", s.get("mean_queries_all"))
            lines.append(f"{r['row']:<18}{r['model']:<9}{r['budget']:>6} {name:<22}"
                         f"{setting:<19}{_fmt(succ):>6}{_fmt(se):>6}{_fmt(q, 1):>8}"
                         f"{_fmt(s.get('median_norm')):>10}{_fmt(s['wall_s'], 2):>8}"
                         f"{_fmt(s['compute_ms_per_image'], 2):>12}")
    return "\n".join(lines)


def _fmt(v: Any, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)


# ---------------------------------------------------------------------------------- main --


def run_row(row: Row, model: str, budgets: Sequence[int], net: nn.Module, x: np.ndarray,
            y: np.ndarray, num_classes: int, seed: int, log: Callable[[str], None],
            only_refs: set[str] | None = None,
            skipped: list[dict[str, Any]] | None = None,
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    targets = None
    if row.targeted:  # one target class for the batch (a criterion has one); not the true one
        t = int(np.random.default_rng(seed).integers(num_classes))
        keep = y != t
        x, y = x[keep], y[keep]
        targets = np.full(len(y), t, dtype=np.int64)
    rows_out, goals_out = [], []
    skipped = [] if skipped is None else skipped
    for budget in budgets:
        if row.mode == "min_norm":
            eps = 0.0
        elif row.norm == "linf":
            eps = math.floor(row.epsilon[model] * 255 + 1e-6) / 255
        else:
            eps = float(row.epsilon[model])
        job = Job(row=row, model=model, x=x, y=y, targets=targets, epsilon=eps, budget=budget,
                  seed=seed, num_classes=num_classes)
        fortis, checks = timed(job, net, owner="index", quantise=True, memoise=False,
                               body=lambda o, j=job: run_fortis(j, o))
        fortis["checks"].update(checks or {})
        fortis["params"] = {k: v for k, v in fortis_params(job).items()
                            if k not in (row.bound_param, row.budget_param)}
        fortis["non_default_params"] = fortis_non_default(job)
        log(f"{row.name} {model} Q={budget} fortis: {_brief(fortis)}")
        refs: dict[str, dict[str, Any]] = {}
        used: dict[str, Reference] = {}
        for ref in row.references:
            if only_refs and ref.name not in only_refs and ref.key not in only_refs:
                continue
            params = ref.resolve(job)
            try:
                s, _ = timed(job, net, owner=ref.owner, quantise=ref.quantise,
                             memoise=ref.memoise,
                             body=lambda o, j=job, r=ref, kw=params: r.run(j, o, kw))
            except (ImportError, Unsupported) as e:
                log(f"  {ref.key}: skipped ({e})")
                skipped.append({"row": row.name, "model": model, "budget": budget,
                                "reference": ref.name, "settings": ref.settings,
                                "reference_params": params, "why": str(e)})
                continue
            s["params"] = params
            refs[ref.key], used[ref.key] = s, ref
            log(f"  {ref.key}: {_brief(s)}")
        verdicts = judge(row, model, budget, fortis, refs)
        compute_goal = next((g for g in verdicts if g["goal"] == COMPUTE_GOAL), {})
        for key, s in refs.items():
            ref = used[key]
            rows_out.append({
                "compute_ratio": _ratio(fortis.get("compute_ms_per_image"),
                                        s.get("compute_ms_per_image")),
                "goal": {"name": COMPUTE_GOAL, "pass": compute_goal.get("pass"),
                         "fastest_reference": compute_goal.get("best_reference"),
                         "ratio_to_fastest": compute_goal.get("ratio"),
                         "judged_against_this": _matches(key, row.compute_against)},
                "row": row.name, "attack": row.attack, "model": model, "budget": budget,
                "epsilon": eps, "epsilon_levels": round(eps * 255) if row.norm == "linf" else None,
                "norm": row.norm, "targeted": row.targeted, "mode": row.mode,
                "n_images": job.n, "reference": ref.name, "settings": ref.settings,
                "reference_params": s.pop("params"),
                "reference_setup": {"owner": ref.owner, "quantised": ref.quantise,
                                    "memoised": ref.memoise, "note": ref.note},
                "fortis": fortis, "ref": s,
                "ratio": {k: _ratio(fortis.get(k), s.get(k)) for k in RATIO_KEYS
                          if k in fortis and k in s},
                # the row's goals (Fortis against the best qualifying reference), pass/fail
                "goals": {g["goal"]: g["pass"] for g in verdicts}})
        for g in verdicts:
            goals_out.append({"row": row.name, "model": model, "budget": budget, **g})
    return rows_out, goals_out


def _brief(s: dict[str, Any]) -> str:
    keys = ("success_rate", "found_adversarial", "mean_queries_all", "median_norm", "wall_s",
            "model_s", "compute_s", "compute_cpu_s")
    return " ".join(f"{k}={s[k]}" for k in keys if k in s)


def _warm_imports() -> None:
    """Import every reference tool before any clock starts (a first import is not compute)."""
    for mod in ("art.attacks.evasion", "art.estimators.classification", "torchattacks",
                "foolbox"):
        with contextlib.suppress(ImportError):
            importlib.import_module(mod)
    for name in ("square_attack", "simba_attack", "bandits_attack"):
        with contextlib.suppress(ImportError):
            _bat_module(name)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "numpy": np.__version__, "machine": platform.machine()}
    for dist in ("adversarial-robustness-toolbox", "torchattacks", "foolbox",
                 "blackbox-adversarial-toolbox"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="row names, comma-separated (default: all)")
    ap.add_argument("--models", default="fmnist,imagenet")
    ap.add_argument("--refs", default="", help="only these references (default: all)")
    ap.add_argument("--budgets", default="", help="override every row's budgets")
    ap.add_argument("--n", type=int, default=100, help="Fashion-MNIST images")
    ap.add_argument("--skip", type=int, default=0,
                    help="Fashion-MNIST: leave out the first SKIP correctly classified test "
                         "images (a held-out slice: --skip 100 --n 100 = images 100-199)")
    ap.add_argument("--n-imagenet", type=int, default=0, help="at most this many photos (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="write the JSON here too")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("TQDM_DISABLE", "1")
    wanted = {s for s in args.rows.split(",") if s}
    models = [m for m in args.models.split(",") if m]
    only_refs = {s for s in args.refs.split(",") if s} or None
    budgets_override = tuple(int(b) for b in args.budgets.split(",") if b)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = {"platform": platform.platform(), "cpus": os.cpu_count(),
               "processor": platform.processor() or platform.machine(),
               "python": platform.python_version(), "torch": torch.__version__,
               "load_average": [round(v, 2) for v in os.getloadavg()]}
    command = " ".join(["python", *sys.argv] if argv is None else
                       ["python", "bench/attacks.py", *argv])
    log(f"machine: {json.dumps(machine)}")
    log(f"command: {command}")
    report: dict[str, Any] = {"setup": {"machine": machine, "command": command,
                                        "versions": _versions(), "seed": args.seed,
                                        "torch_threads": torch.get_num_threads(),
                                        "models": {}},
                              "rows": [], "goals": [], "skipped": []}
    _warm_imports()
    t0 = time.perf_counter()
    for model in models:
        rows = [r for r in ROWS if model in r.models and (not wanted or r.name in wanted)]
        if not rows:
            continue
        net, x, y, info = MODEL_LOADERS[model](args.n + (args.skip if model == "fmnist" else 0))
        if model == "fmnist" and args.skip:
            x, y = x[args.skip:], y[args.skip:]
            info["n_images"] = len(x)
            info["images"] += f", less the first {args.skip} of them"
        if model == "imagenet" and args.n_imagenet:
            x, y = x[: args.n_imagenet], y[: args.n_imagenet]
            info["n_images"] = len(x)
            info["images"] = info["images"][: args.n_imagenet]
        report["setup"]["models"][model] = info
        num_classes = 1000 if model == "imagenet" else 10
        for row in rows:
            r, g = run_row(row, model, budgets_override or row.budgets, net, x, y, num_classes,
                           args.seed, log, only_refs, report["skipped"])
            report["rows"] += r
            report["goals"] += g
    report["setup"]["total_wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    log(table(report["rows"]))
    for g in report["goals"]:
        log(f"goal {g['row']} {g['model']} Q={g['budget']} {g['goal']}: "
            f"{'PASS' if g['pass'] else 'FAIL' if g['pass'] is False else 'n/a'} "
            f"(fortis {g.get('fortis')} vs {g.get('best_reference')} {g.get('reference')}, "
            f"ratio {g.get('ratio')})")


# -------------------------------------------------------------------------------- ROWS ----
# One entry per attack row (see ADDING A ROW in the module docstring). Keep Square and HSJA
# first; append yours below them. Every tool whose constructor defaults differ from Fortis's
# settings runs twice (``both``): at those defaults and given Fortis's values; the dicts
# below are the tools' documented defaults (their installed source) and the matched values.


def _q(job: Job) -> int:
    return job.budget


def _q_at_least_n_iters(attack: str) -> Callable[[Job], int]:
    """Fortis lays the Square schedule over ``max(n_iters, Q)`` iterations."""
    return lambda job: max(int(fortis_default(attack, "n_iters")), job.budget)


def _square_refs(attack: str) -> tuple[Reference, ...]:
    """ART (every forward charged, and memoised), torchattacks and bat (L-inf only) for
    Square. Each tool lays the p schedule over its own run by default (ART and bat over their
    ``max_iter``/``max_it`` = the budget, torchattacks ``resc_schedule`` over ``n_queries``);
    Fortis over ``n_iters`` = 10,000 iterations (the paper's), so matched runs lay it there."""
    p_fortis = fortis_default(attack, "p_init")
    horizon = _q_at_least_n_iters(attack)
    art_defaults = {"p_init": 0.8, "max_iter": _q, "nb_restarts": 1}
    art_matched = {"p_init": p_fortis, "max_iter": horizon}
    if attack == "square":
        art_defaults["batch_size"] = 128
    run_art = art_square if attack == "square" else art_square_l2
    owner: Owner = "nearest" if attack == "square" else "single"
    refs = (*both("art", run_art, defaults=art_defaults, matched=art_matched, owner=owner,
                  note="every forward charged (3 per iteration)"),
            *both("art_memo", run_art, defaults=art_defaults, matched=art_matched, owner=owner,
                  memoise=True, note="repeated points answered from memory, not charged"),
            *both("torchattacks", torchattacks_square if attack == "square"
                  else torchattacks_square_l2,
                  defaults={"p_init": 0.8, "resc_schedule": True, "loss": "margin",
                            "n_restarts": 1},
                  matched={"p_init": p_fortis, "resc_schedule": False}, owner=owner))
    if attack == "square":  # bat's p_init default is Fortis's; its schedule horizon is not
        refs += both("bat", bat_square,
                     defaults={"p_init": 0.05, "max_it": lambda j: max(j.budget - 1, 2),
                               "loss_type": "margin_loss"},
                     matched={"p_init": p_fortis, "max_it": horizon})
    return refs


HSJA_REFS = (
    # ART's and foolbox's defaults are Fortis's gradient-estimation settings (100 initial /
    # 10,000 max evaluations, geometric step search, gamma 1): one run each. The start is not
    # a setting of theirs (noise); hsja_noise_start runs Fortis from noise.
    Reference(name="art_float", run=art_hsja, owner="single", quantise=False,
              params={"max_iter": 50, "max_eval": 10_000, "init_eval": 100, "init_size": 100,
                      "batch_size": 64},
              note="ART's own regime: float points reach the network"),
    Reference(name="art_uint8", run=art_hsja, owner="single", quantise=True,
              params={"max_iter": 50, "max_eval": 10_000, "init_eval": 100, "init_size": 100,
                      "batch_size": 64},
              note="points rounded to uint8 (what a target receives), as Fortis"),
    Reference(name="foolbox", run=foolbox_hsja, owner="rows", quantise=False,
              params={"steps": 64, "initial_gradient_eval_steps": 100,
                      "max_gradient_eval_steps": 10_000,
                      "stepsize_search": "geometric_progression", "gamma": 1.0},
              note="float points, whole batch per call"),
)


def _square_yardstick_row(name: str, norm: NormName) -> Row:
    """A row for a score-based attack with no installable reference: Fortis's own Square
    (L-inf or L2, as the row's norm, at its defaults) is its yardstick."""
    linf = norm == "linf"
    return Row(name=name, attack=name, norm=norm,
               epsilon={"fmnist": 0.1, "imagenet": 0.05} if linf else
               {"fmnist": 2.0, "imagenet": 5.0}, budgets=(500, 1000),
               references=(Reference(name="fortis_square" if linf else "fortis_square_l2",
                                     run=fortis_square_ref, owner="nearest",
                                     settings="fortis_defaults",
                                     note="no installable reference: Fortis's Square"
                                     + ("" if linf else " L2")),))


def _nes_row(name: str, norm: NormName) -> Row:
    """NES against ART's NES estimator under ART's PGD (compute and success judged against
    it), with Fortis's Square as a second yardstick of success. ART's estimator has no
    defaults for its draws and probe scale (Fortis's are given to both configurations);
    PGD's step (0.1) and the estimator's unrounded probes are its defaults, Fortis's learning
    rate and uint8 probes the matched values."""
    square = _square_yardstick_row(name, norm)
    art = both("art", art_nes, owner="nearest_unbounded",
               defaults={"num_basis": fortis_default(name, "samples") // 2,
                         "sigma": fortis_default(name, "sigma"), "round_samples": 0.0,
                         "eps_step": 0.1},
               matched={"eps_step": fortis_default(name, "learning_rate"),
                        "round_samples": 1.0 / 255},
               note="probes outside the ball: credited within the bound")
    return Row(name=name, attack=name, norm=norm, epsilon=square.epsilon,
               budgets=square.budgets, references=(*art, *square.references),
               compute_against=("art",))


def _ngd_row(name: str, norm: NormName) -> Row:
    """ZO-NGD: no installable reference; its compute against its own per-image version,
    its success against Fortis's Square."""
    square = _square_yardstick_row(name, norm)
    own = Reference(name="fortis_ngd_unbatched", run=fortis_ngd_unbatched, owner="nearest",
                    settings="fortis_defaults",
                    note="Fortis's ZO-NGD solving F^-1 g one image at a time")
    return Row(name=name, attack=name, norm=norm, epsilon=square.epsilon,
               budgets=square.budgets, references=(own, *square.references),
               compute_against=("fortis_ngd_unbatched",))


def _simba_refs() -> tuple[Reference, ...]:
    return both("art", art_simba, owner="single",
                defaults={"epsilon": 0.1, "freq_dim": 4, "stride": 1, "order": "random"},
                matched={"epsilon": fortis_default("simba", "step_size"),
                         "freq_dim": lambda j: _simba_dims(j)[0],
                         "stride": lambda j: _simba_dims(j)[1]},
                note="no L2 bound of its own: credited within the row's")


def _geoda_refs() -> tuple[Reference, ...]:
    from fortis.services.perturbation.attacks.geoda import SUB_DIM_FRACTION

    return both("art", art_geoda, owner="single", quantise=False,
                defaults={"sub_dim": 10, "bin_search_tol": 0.1, "lambda_param": 0.6,
                          "sigma": 0.0002, "batch_size": 64},
                matched={"sub_dim": lambda j: max(1, round(_side(j) * SUB_DIM_FRACTION))},
                note="float points, max_iter = Q; Fortis's probe radius is floored to survive "
                     "uint8 rounding, not a setting ART takes")


BOUNDARY_REFS = (
    *both("foolbox", foolbox_boundary, owner="rows", quantise=False,
          defaults={"steps": 25_000, "spherical_step": 0.01, "source_step": 0.01,
                    "step_adaptation": 1.5, "update_stats_every_k": 10},
          matched={"spherical_step": fortis_default("boundary", "spherical_step"),
                   "source_step": fortis_default("boundary", "source_step"),
                   "step_adaptation": fortis_default("boundary", "step_adaptation")},
          note="float points, whole batch per call"),
    *both("art", art_boundary, owner="single", quantise=False,
          defaults={"delta": 0.01, "epsilon": 0.01, "step_adapt": 0.667, "max_iter": 5000,
                    "num_trial": 25, "sample_size": 20, "init_size": 100, "batch_size": 64},
          matched={"delta": fortis_default("boundary", "spherical_step"),
                   "epsilon": fortis_default("boundary", "source_step"),
                   "step_adapt": round(1.0 / fortis_default("boundary", "step_adaptation"), 4)},
          note="float points, one image at a time"),
)


def _zoo_large(job: Job) -> bool:
    """Fortis reduces the attack space (and samples by importance) only on images larger than
    its ``reduced`` grid."""
    return _side(job) > int(fortis_default("zoo", "reduced"))


ZOO_REFS = both(
    "art", art_zoo, owner="single",
    defaults={"confidence": 0.0, "learning_rate": 0.01, "max_iter": 10,
              "binary_search_steps": 1, "initial_const": 1e-3, "abort_early": True,
              "use_resize": True, "use_importance": True, "nb_parallel": 128,
              "variable_h": 1e-4},
    # Fortis probes one uint8 level (ART's 1e-4 rounds away in what a target receives), fixes
    # c (no search), never stops early and works in the image space up to its reduced side
    matched={"learning_rate": fortis_default("zoo", "learning_rate"), "max_iter": _q,
             "initial_const": fortis_default("zoo", "const"), "abort_early": False,
             "use_resize": _zoo_large, "use_importance": _zoo_large,
             "nb_parallel": fortis_default("zoo", "batch"), "variable_h": 1.0 / 255},
    note="no L2 bound of its own: credited within the row's")

BANDITS_REFS = (
    # bat scales its exploration noise by 255 (its images are in [0, 255]) but not the
    # parameter: its ``exploration`` e is Fortis's 255 e. fd_eta and image_lr it scales.
    *both("bat", bat_bandits, owner="nearest_unbounded",
          defaults={"fd_eta": 0.1, "image_lr": 0.01, "online_lr": 100, "exploration": 1.0},
          matched={"fd_eta": fortis_default("bandits", "fd_eta"),
                   "image_lr": fortis_default("bandits", "image_lr"),
                   "online_lr": fortis_default("bandits", "online_lr"),
                   "exploration": round(fortis_default("bandits", "exploration") / 255, 6)},
          note="probes outside the ball: credited within the bound; no tiling prior option"),
    Reference(name="fortis_square", run=fortis_square_ref, owner="nearest",
              settings="fortis_defaults", note="yardstick: Fortis's Square"),
)

PIXEL_REFS = (
    *both("art", art_pixel, owner="single", defaults={"es": 0, "max_iter": 100},
          matched={"es": 1},
          note="es=1: differential evolution, population ~400 as Fortis's popsize"),
    *both("torchattacks", torchattacks_onepixel, owner="single", defaults={"popsize": 10},
          matched={"popsize": fortis_default("single_pixel", "popsize")}),
)

_MIN_NORM_HSJA = (Reference(name="fortis_hsja", run=fortis_hsja_ref, owner="nearest",
                            settings="fortis_defaults",
                            note="no installable reference: Fortis's HopSkipJump"),)

ROWS: tuple[Row, ...] = (
    Row(name="square", attack="square", norm="linf",
        epsilon={"fmnist": 0.1, "imagenet": 0.05}, budgets=(500, 1000),
        references=_square_refs("square"),
        goals=(Goal(name="square_success_1.1x_best_reference_at_its_defaults",
                    metric="success_rate", factor=1.1, settings=("@defaults", "")),)),
    Row(name="hsja", attack="hsja", norm="l2", epsilon={"fmnist": 1.5, "imagenet": 5.0},
        budgets=(300, 1000), references=HSJA_REFS),
    Row(name="hsja_min_norm", attack="hsja", norm="l2", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=HSJA_REFS,
        goals=(Goal(name="hsja_median_l2_0.9x_art", metric="median_norm", factor=0.9,
                    against=("art",)),)),
    # the paper's noise start (Fortis's default starts from the batch's nearest adversarial
    # image: hsja.py): the like-for-like algorithm comparison with ART and foolbox
    Row(name="hsja_noise_start", attack="hsja", norm="l2", mode="min_norm", epsilon={},
        params={"start": "noise"}, budgets=(300, 1000), references=HSJA_REFS,
        goals=(Goal(name="hsja_median_l2_0.9x_art", metric="median_norm", factor=0.9,
                    against=("art",)),)),
    # SimBA's basis is which attack runs (pixel or DCT), not a tuning
    Row(name="simba_pixel", attack="simba", norm="l2", params={"basis": "pixel"},
        epsilon={"fmnist": 2.0, "imagenet": 5.0}, budgets=(500, 1000),
        references=_simba_refs()),
    Row(name="simba_dct", attack="simba", norm="l2", params={"basis": "dct"},
        epsilon={"fmnist": 2.0, "imagenet": 5.0}, budgets=(500, 1000),
        references=_simba_refs()),
    Row(name="square_l2", attack="square_l2", norm="l2",
        epsilon={"fmnist": 2.0, "imagenet": 5.0}, budgets=(500, 1000),
        references=_square_refs("square_l2")),
    Row(name="single_pixel", attack="single_pixel", norm="l0",
        epsilon={"fmnist": 1, "imagenet": 1}, budgets=(500, 1000), references=PIXEL_REFS),
    # decision-based, minimal-norm: median norm at equal budget
    Row(name="boundary", attack="boundary", norm="l2", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=BOUNDARY_REFS),
    Row(name="geoda", attack="geoda", norm="l2", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=_geoda_refs()),
    Row(name="geoda_linf", attack="geoda_linf", norm="linf", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=_geoda_refs()),
    Row(name="qeba", attack="qeba", norm="l2", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=_MIN_NORM_HSJA),
    Row(name="qfool", attack="qfool", norm="l2", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=_MIN_NORM_HSJA),
    Row(name="surfree", attack="surfree", norm="l2", mode="min_norm", epsilon={},
        budgets=(300, 1000), references=_MIN_NORM_HSJA),
    # score-based gradient estimation; no installable reference for NES, SignHunter, RGF,
    # ZO-NGD: Fortis's Square (L-inf / L2) is their yardstick. P-RGF needs a surrogate, which
    # run_fortis does not pass: no row (tests/reference shows its claim).
    Row(name="zoo", attack="zoo", norm="l2",
        epsilon={"fmnist": 2.0, "imagenet": 5.0}, budgets=(500, 1000), models=("fmnist",),
        references=ZOO_REFS),
    Row(name="bandits", attack="bandits", norm="linf",
        epsilon={"fmnist": 0.1, "imagenet": 0.05}, budgets=(500, 1000),
        references=BANDITS_REFS),
    *(_square_yardstick_row(name, norm) for name, norm in (
        ("bandits_l2", "l2"), ("signhunter", "linf"), ("signhunter_l2", "l2"), ("rgf", "l2"),
        ("rgf_linf", "linf"))),
    *(_nes_row(name, norm) for name, norm in (("nes", "linf"), ("nes_l2", "l2"))),
    *(_ngd_row(name, norm) for name, norm in (("ngd", "linf"), ("ngd_l2", "l2"))),
)


if __name__ == "__main__":
    main()
