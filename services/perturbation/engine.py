"""Perturbation engine: applies corruptions and runs attacks. Domain code: no gRPC.

Query attacks reach the target only through a ``QueryClient`` (in production: the
target-proxy service, see ``proxy_client.py``), so every query is counted and recorded by
the proxy. Each image's randomness is derived from (seed, perturbation, severity, image id)
so results do not depend on batching, order or restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import validate_params
from fortis.services.common.seeding import rng_for
from fortis.services.common.stopping import StopCheck, never, raise_if_stopped
from fortis.services.perturbation.attacks.base import (
    AttackContext,
    AttackResult,
    QueryClient,
    check_surrogate_input,
)
from fortis.services.perturbation.attacks.registry import attack_spec
from fortis.services.perturbation.criteria import Criterion, criterion_from_spec
from fortis.services.perturbation.judges import Answer, BoxReference
from fortis.services.perturbation.registry import (
    apply_perturbation,
    check_level,
    make_context,
    perturbation_spec,
)
from fortis.services.perturbation.spec import PerturbationSpec
from fortis.services.perturbation.style_models import StyleModels

__all__ = ["AttackItem", "AttackResult", "QueryClient", "SurrogateLoader",
           "attack_params", "perturb", "perturbation_rng", "run_attack", "validate_attack"]


SurrogateLoader = Callable[[str], Any]   # name -> TorchClassifier-like (model, to_model_input)


@dataclass(frozen=True, kw_only=True)
class AttackItem:
    image_id: str
    image: np.ndarray        # uint8 HxWxC
    labels: tuple[int, ...] = ()   # classification: acceptable labels; the first is the true one
    #: Detection: the objects of interest (pixel xyxy boxes, classes); None: the clean answer's.
    objects: BoxReference | None = None
    #: Segmentation: the reference class map (H x W ints, the image's size); None: the clean
    #: answer's.
    mask: np.ndarray | None = None


def perturbation_rng(seed: int, spec: PerturbationSpec, level: int | float,
                     image_id: str) -> np.random.Generator:
    """The generator of one image under one perturbation.

    Corruptions and styles: one generator per (perturbation, severity, image), as ``corrupt``.
    Incremental operators (DEG-1) and properties (PER-1): the level is *not* part of the key,
    so level L replays levels 1..L-1 exactly (level L = the operator applied to level L-1) and
    a larger epsilon scales the same random pattern (what the PertKnob search needs, PER-3).
    """
    if spec.kind == "corruption":
        return rng_for(seed, "corruption", spec.id, int(level), image_id)
    if spec.level_kind == "severity":
        return rng_for(seed, spec.kind, spec.id, int(level), image_id)
    return rng_for(seed, spec.kind, spec.id, image_id)


def perturb(perturbation_id: str, level: int | float, seed: int,
            items: Sequence[tuple[str, np.ndarray]], *, params: Mapping[str, Any] | None = None,
            surrogate: Any = None, labels: Sequence[int] | None = None,
            should_stop: StopCheck = never,
            style_models: StyleModels | None = None) -> list[np.ndarray]:
    """Apply any catalogue perturbation at one level to each image (IEEE-P5: one per image).

    ``level``: severity 1..5, degradation level 0..30 or epsilon in [0, 1], as the entry's
    ``level_kind`` says. White-box operators (``needs_model``) take a ``surrogate`` and one
    true label per image. Every problem raises ``InvalidArgument`` naming its field.
    ``should_stop`` is polled before each image and, for the incremental operators (level L
    is L applications) and white-box ones, inside the operator, so the caller's deadline or
    cancellation stops the work. ``style_models``: where ``neural_style`` reads its model
    (the operator's root, the calling tenant's uploads; None: see ``ApplyContext``).
    """
    spec = perturbation_spec(perturbation_id)
    level_field = "epsilon" if spec.level_kind == "epsilon" else "severity"
    lv = check_level(spec, level, level_field)
    if spec.needs_model:
        if labels is None or len(labels) != len(items):
            raise InvalidArgument("labels", f"{spec.id} needs one true label per image "
                                  f"({len(items)} images, {0 if labels is None else len(labels)} labels)")
        if surrogate is not None:
            shape = items[0][1].shape if items else None
            if shape is not None and len(shape) == 3:
                check_surrogate_input(surrogate, shape)
    if surrogate is not None:
        surrogate = _StoppingSurrogate(surrogate, should_stop)
    base = make_context(spec, params, model=surrogate, style_models=style_models)
    out = []
    for i, (image_id, img) in enumerate(items):
        raise_if_stopped(should_stop, f"{spec.id}")
        ctx = base if not spec.needs_model else replace(
            base, label=int(labels[i]))  # type: ignore[index]
        out.append(apply_perturbation(spec.id, img, lv, perturbation_rng(seed, spec, lv, image_id), ctx))
    return out


def attack_criterion(task: str, criterion: Criterion | Mapping[str, Any] | None) -> Criterion:
    """The success criterion of an attack on a ``task`` target: given, built from plain data
    (``criteria.criterion_from_spec``: kind, target_label, thresholds, the task's
    parameters), or the task's default (untargeted misclassification, object missed, mIoU
    below the threshold)."""
    crit = criterion if isinstance(criterion, Criterion) else \
        criterion_from_spec(task, criterion)
    if crit.task != task:
        raise InvalidArgument("criterion", f"{crit.name} is a {crit.task} criterion; the target "
                              f"is a {task} target")
    return crit


def check_attack_fits(spec: Any, task: str, signal: str, crit: Criterion) -> None:
    """An attack can run against this target under this criterion: its task types, targeted /
    untargeted support, and a score-based attack needs scores (IEEE-A8: decision-based attacks
    only on a labels-only target). Each refusal names the field and the attack."""
    if not spec.supports_task(task):
        raise InvalidArgument("attack_id", f"{spec.id} does not attack {task} targets (it "
                              f"attacks: {', '.join(spec.tasks or ())})")
    if crit.targeted and not spec.targeted:
        raise InvalidArgument("criterion", f"{spec.id} has no targeted variant "
                              f"({crit.describe()})")
    if not crit.targeted and not spec.untargeted:
        raise InvalidArgument("criterion", f"{spec.id} is targeted only: give a target class")
    if spec.kind == "score" and signal == "labels":
        raise InvalidArgument("attack_id", f"{spec.id} is score-based, but the target returns "
                              "labels only (output kind label_only): use a decision-based "
                              "attack")


def attack_params(spec: Any, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """An attack's parameters as it runs with them: checked against its schema (defaults
    filled in), against its rules between parameters (``AttackSpec.check``) and, for the
    gradient attacks' boosters, theirs; each problem names ``params.<name>``."""
    from fortis.services.perturbation.attacks.whitebox import Boosters

    p = validate_params(spec, params)
    if spec.check is not None:
        spec.check(p)
    if any(q.name == "ti_kernel" for q in spec.params):
        Boosters(p)
    return p


def validate_attack(attack_id: str, params: Mapping[str, Any] | None, *,
                    task: str = Task.CLASSIFICATION, signal: str = "",
                    criterion: Criterion | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Whether an attack can run with these parameters and this criterion against a target of
    ``task`` giving ``signal`` ("" = not known: not checked), before any image: every rule
    :func:`run_attack` applies first. Returns the parameters it would run with."""
    spec = attack_spec(attack_id)
    p = attack_params(spec, params)
    crit = attack_criterion(task, criterion)
    check_attack_fits(spec, task, signal or "scores", crit)
    return p


def run_attack(attack_id: str, params: Mapping[str, Any], seed: int, items: Sequence[AttackItem], *,
               query: QueryClient | None = None, surrogate: Any = None,
               criterion: Criterion | Mapping[str, Any] | None = None,
               should_stop: StopCheck = never,
               ensemble: Sequence[Any] = ()) -> list[AttackResult]:
    """Run one attack on a batch of images; one result per image, in order.

    Dispatches through the attack registry (``attacks/registry.py``): the id is looked up, the
    parameters validated against the entry's schema (``common.params``), and the entry's
    ``run`` called with an :class:`AttackContext`. The task is the query client's (``task``:
    classification when it does not say); ``criterion`` is the success criterion (default:
    the task's, e.g. untargeted misclassification, IEEE-A7/A8), checked against the attack's
    task types and targeted support (:func:`check_attack_fits`). A transfer attack needs a
    surrogate, a query attack a query client (the proxy, IEEE-M6); a query attack with
    ``uses_surrogate`` gets the surrogate when one is given. ``should_stop`` is polled before
    every query a query attack sends and every forward pass of a surrogate, so a caller's
    deadline or cancellation stops any attack within one step. Each result carries
    the signal the attack read and the criterion in words. A transfer attack's task is its
    surrogate's (``task``: classification when it does not say); ``ensemble`` are further
    surrogates it is crafted on together with ``surrogate`` (IEEE-A7 model ensembles)."""
    spec = attack_spec(attack_id)
    p = attack_params(spec, params)
    if not items:
        return []
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(tuple(it.image.shape), []).append(i)
    if len(groups) > 1:
        # Images of different sizes (e.g. detection photos): one attack run per size, in
        # order of first appearance; each image's result back in its place.
        out: list[AttackResult | None] = [None] * len(items)
        for idx in groups.values():
            part = run_attack(attack_id, params, seed, [items[i] for i in idx], query=query,
                              surrogate=surrogate, criterion=criterion,
                              should_stop=should_stop, ensemble=ensemble)
            for i, r in zip(idx, part, strict=True):
                out[i] = r
        return [r for r in out if r is not None]
    task = str(getattr(query, "task", None) or Task.CLASSIFICATION) if spec.is_query_attack \
        else str(getattr(surrogate, "task", None) or Task.CLASSIFICATION)
    crit = attack_criterion(task, criterion)
    signal = str(getattr(query, "signal", None) or "scores") if query is not None else ""
    check_attack_fits(spec, task, signal, crit)
    references = _references(task, items)
    if spec.needs_surrogate and surrogate is None:
        raise InvalidArgument("surrogate", f"{attack_id} is a transfer attack: name a surrogate model")
    if spec.is_query_attack and query is None:
        raise InvalidArgument("proxy_session_id", f"{attack_id} is a query attack: a proxy session is required")
    raise_if_stopped(should_stop, attack_id)
    if query is not None:
        query = _StoppingQuery(query, should_stop)
    if surrogate is not None:
        surrogate = _StoppingSurrogate(surrogate, should_stop)
    if ensemble and not spec.needs_surrogate:
        raise InvalidArgument("ensemble", f"{attack_id} is not a transfer attack: it takes no "
                              "ensemble of surrogates")
    extra = tuple(_StoppingSurrogate(s, should_stop) for s in ensemble)
    ctx = AttackContext(
        spec=spec, images=np.stack([it.image for it in items]),
        labels=np.array([it.labels[0] if it.labels else 0 for it in items], dtype=np.int64),
        image_ids=tuple(it.image_id for it in items),
        label_sets=tuple(tuple(int(v) for v in it.labels) for it in items),
        params=MappingProxyType(p), seed=seed, criterion=crit,
        query=query if spec.is_query_attack else None,
        surrogate=surrogate if (spec.needs_surrogate or spec.uses_surrogate) else None,
        ensemble=extra, references=references)
    results = spec.run(ctx)
    used = ctx.used_signal() if spec.is_query_attack else ""
    if spec.kind == "decision" and used:
        # a decision-based attack reads only the criterion's verdict (the segmentation
        # verdict is the class map's, whatever probabilities came with it)
        used = {"labels": "labels", "probabilities": "decisions from masks"}.get(
            used, f"decisions from {used}")
    words = crit.describe()
    for r in results:
        r.signal, r.criterion = used, words
    return results


def _references(task: str, items: Sequence[AttackItem]) -> tuple[Any, ...]:
    """The criterion's reference per image (checked): classification needs a true label per
    image; detection takes the objects of interest, segmentation a mask of the image's size
    (None: the clean answer's)."""
    if task == Task.CLASSIFICATION:
        for i, it in enumerate(items):
            if not it.labels:
                raise InvalidArgument(f"images[{i}].labels", "at least one true label is required")
        return ()
    if task == Task.DETECTION:
        return tuple(it.objects for it in items)
    out: list[np.ndarray | None] = []
    for i, it in enumerate(items):
        if it.mask is None:
            out.append(None)
            continue
        m = np.asarray(it.mask)
        if m.shape != it.image.shape[:2] or m.dtype.kind not in "iu":
            raise InvalidArgument(f"images[{i}].mask", f"must be an integer [height, width] map "
                                  f"of the image's size {list(it.image.shape[:2])}, got "
                                  f"{m.dtype} {list(m.shape)}")
        out.append(m.astype(np.int64))
    return tuple(out)


class _StoppingQuery:
    """A query client that polls ``should_stop`` before each call (every query an attack
    sends goes through ``scores`` or ``labels``); everything else is the wrapped client's."""

    def __init__(self, inner: QueryClient, should_stop: StopCheck) -> None:
        self._inner = inner
        self._should_stop = should_stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def scores(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        raise_if_stopped(self._should_stop, "the attack")
        return self._inner.scores(images, image_ids)

    def labels(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        raise_if_stopped(self._should_stop, "the attack")
        return self._inner.labels(images, image_ids)

    def predictions(self, images: np.ndarray, image_ids: Sequence[str]) -> list[Answer]:
        raise_if_stopped(self._should_stop, "the attack")
        return list(self._inner.predictions(images, image_ids))  # type: ignore[attr-defined]


class _StoppingModule(torch.nn.Module):
    """A surrogate's module that polls ``should_stop`` before each forward pass."""

    def __init__(self, inner: torch.nn.Module, should_stop: StopCheck) -> None:
        super().__init__()
        self.inner = inner
        self._should_stop = should_stop
        # In the inner module's mode, not nn.Module's default (training): an attack that
        # restores the mode it found (gradient.py: ``model.train(was_training)``) would
        # otherwise leave the shared, cached surrogate in training mode, and with it a
        # built-in target that is the same model (BatchNorm on batch statistics).
        self.train(inner.training)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise_if_stopped(self._should_stop, "the computation")
        return self.inner(*args, **kwargs)


class _StoppingSurrogate:
    """A surrogate (``.model``, ``.input_spec``, ...) whose model stops on ``should_stop``."""

    def __init__(self, inner: Any, should_stop: StopCheck) -> None:
        self._inner = inner
        self._should_stop = should_stop
        self.model = inner.model if should_stop is never else _StoppingModule(inner.model,
                                                                               should_stop)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def task_loss(self, x: Any, references: Any, criterion: Any) -> Any:
        """A detector's or segmenter's loss (its own forward passes), polled as the model."""
        raise_if_stopped(self._should_stop, "the computation")
        return self._inner.task_loss(x, references, criterion)
