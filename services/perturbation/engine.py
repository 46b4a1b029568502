"""Perturbation engine: applies corruptions and runs attacks. Domain code: no gRPC.

Query attacks reach the target only through a ``QueryClient`` (in production: the
target-proxy service, see ``proxy_client.py``), so every query is counted and recorded by
the proxy. Each image's randomness is derived from (seed, perturbation, severity, image id)
so results do not depend on batching, order or restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.seeding import rng_for, torch_generator_for
from fortis.services.perturbation import attacks
from fortis.services.perturbation.attacks.common import (
    STOP_ALREADY_MISCLASSIFIED,
    STOP_BUDGET,
    STOP_ITERATIONS,
    STOP_SUCCESS,
    AttackResult,
)
from fortis.services.perturbation.catalogue import attack_spec, validate_params
from fortis.services.perturbation.corruptions import CORRUPTIONS, apply_corruption
from fortis.services.perturbation.registry import (
    PERTURBATIONS,
    apply_perturbation,
    check_level,
    make_context,
    perturbation_spec,
)
from fortis.services.perturbation.spec import ApplyContext, PerturbationSpec


class QueryClient(Protocol):
    """Sends images to the target (through the proxy). One image = one query."""

    num_classes: int

    def scores(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        """Dense score matrix n x num_classes (classes not returned score 0)."""
        ...

    def labels(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        """Top-1 labels, n."""
        ...


SurrogateLoader = Callable[[str], Any]   # name -> TorchClassifier-like (model, to_model_input)


@dataclass(frozen=True, kw_only=True)
class AttackItem:
    image_id: str
    image: np.ndarray        # uint8 HxWxC
    labels: tuple[int, ...]  # acceptable labels; the first is the attack's true label


def corrupt(corruption_id: str, severity: int, seed: int,
            items: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
    """Apply one corruption at one severity to each image (IEEE-P5: one per image)."""
    if corruption_id not in CORRUPTIONS:
        raise InvalidArgument("perturbation_id",
                              f"unknown corruption '{corruption_id}'; known: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise InvalidArgument("severity", f"must be an integer in 1..5, got {severity!r}")
    return [apply_corruption(corruption_id, img, severity,
                             rng_for(seed, "corruption", corruption_id, severity, image_id))
            for image_id, img in items]


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
            surrogate: Any = None, labels: Sequence[int] | None = None) -> list[np.ndarray]:
    """Apply any catalogue perturbation at one level to each image (IEEE-P5: one per image).

    ``level``: severity 1..5, degradation level 0..30 or epsilon in [0, 1], as the entry's
    ``level_kind`` says. White-box operators (``needs_model``) take a ``surrogate`` and one
    true label per image. Every problem raises ``InvalidArgument`` naming its field.
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
                _check_surrogate_input(surrogate, shape)
    base = make_context(spec, params, model=surrogate)
    out = []
    for i, (image_id, img) in enumerate(items):
        ctx = base if not spec.needs_model else ApplyContext(
            params=base.params, model=surrogate, label=int(labels[i]))  # type: ignore[index]
        out.append(apply_perturbation(spec.id, img, lv, perturbation_rng(seed, spec, lv, image_id), ctx))
    return out


def _pertknob(p: Mapping[str, Any], seed: int, items: Sequence[AttackItem],
              query: QueryClient) -> list[AttackResult]:
    """PER-3 through the proxy, one image at a time (each query is charged to its image id):
    the smallest epsilon of property ``p["property"]`` at which the target's top-1 leaves the
    image's true label (Misclassification, PER-2), within ``max_queries`` per image."""
    from fortis.services.scoring.ieee import ClassPrediction
    from fortis.services.scoring.pertknob import (
        KnobConfig,
        Misclassification,
        Reference,
        pertknob,
        property_perturbation,
    )

    spec = PERTURBATIONS.get(p["property"])
    if spec is None or spec.kind != "property":
        raise InvalidArgument("params.property", f"'{p['property']}' is not a PER-1 property; "
                              "see `fortis perturbations --kind property`")
    if p["mode"] not in ("bisection", "linear"):
        raise InvalidArgument("params.mode", f"must be bisection or linear, got {p['mode']!r}")
    cfg = KnobConfig(mode=p["mode"], cells=int(p["cells"]), budget=int(p["max_queries"]))
    perturb = property_perturbation(spec.id)
    out: list[AttackResult] = []
    for n, it in enumerate(items):
        def ask(imgs: Sequence[np.ndarray], image_id: str = it.image_id) -> list[ClassPrediction]:
            labels = query.labels(np.stack(imgs), [image_id] * len(imgs))
            return [ClassPrediction(labels=(int(x),), scores=None) for x in labels]
        r = pertknob(it.image, perturb, Misclassification(), ask,
                     rng=rng_for(seed, "pertknob", spec.id, it.image_id),
                     reference=Reference(label=it.labels[0]), config=cfg, keep_images=True)
        adv = r.perturbed if r.perturbed is not None else it.image
        stop = {"found": STOP_SUCCESS, "already_met": STOP_ALREADY_MISCLASSIFIED,
                "budget_exhausted": STOP_BUDGET}.get(r.status, STOP_ITERATIONS)
        out.append(AttackResult(index=n, adversarial=adv, adversarial_float=adv.astype(np.float32) / 255.0,
                                success=r.status == "found", queries=r.queries,
                                initially_correct=r.status != "already_met",
                                linf=float(r.linf or 0.0), l2=float(r.l2 or 0.0), stop_reason=stop))
    return out


def _check_surrogate_input(classifier: Any, shape: tuple[int, ...]) -> None:
    spec = classifier.input_spec
    if (shape[0], shape[1], shape[2]) != (spec.height, spec.width, spec.channels):
        raise InvalidArgument(
            "images", f"surrogate '{classifier.name}' takes {spec.height}x{spec.width}x"
            f"{spec.channels} images, got {shape[0]}x{shape[1]}x{shape[2]}; resize the plan's "
            "images to the surrogate's input size")


def run_attack(attack_id: str, params: Mapping[str, Any], seed: int, items: Sequence[AttackItem], *,
               query: QueryClient | None = None, surrogate: Any = None) -> list[AttackResult]:
    """Run one attack on a batch of images; one result per image, in order."""
    spec = attack_spec(attack_id)
    p = validate_params(spec, params)
    if not items:
        return []
    shapes = {it.image.shape for it in items}
    if len(shapes) != 1:
        raise InvalidArgument("images", "all images of one attack call must have the same shape")
    for i, it in enumerate(items):
        if not it.labels:
            raise InvalidArgument(f"images[{i}].labels", "at least one true label is required")
    images = np.stack([it.image for it in items])
    labels = np.array([it.labels[0] for it in items], dtype=np.int64)
    ids = [it.image_id for it in items]
    # One generator per call, derived from the seed and the image ids, so a rerun of the
    # same chunk (e.g. after a restart) is identical.
    key = (attack_id, *ids)
    if spec.kind == "transfer":
        if surrogate is None:
            raise InvalidArgument("surrogate", f"{attack_id} is a transfer attack: name a surrogate model")
        _check_surrogate_input(surrogate, images.shape[1:])
        model = surrogate.model
        if attack_id == "fgsm":
            return attacks.fgsm(model, images, labels, epsilon=p["epsilon"])
        return attacks.pgd(model, images, labels, epsilon=p["epsilon"], steps=p["steps"],
                           step_size=p["step_size"] or None, random_start=p["random_start"],
                           generator=torch_generator_for(seed, *key))
    if query is None:
        raise InvalidArgument("proxy_session_id", f"{attack_id} is a query attack: a proxy session is required")

    def score_query(batch: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return query.scores(batch, [ids[i] for i in idx])

    def label_query(batch: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return query.labels(batch, [ids[i] for i in idx])

    rng = rng_for(seed, *key)
    if attack_id == "square":
        return attacks.square_attack(score_query, images, labels, epsilon=p["epsilon"],
                                     max_queries=p["max_queries"], rng=rng, p_init=p["p_init"])
    if attack_id == "hsja":
        return attacks.hop_skip_jump(label_query, images, labels, epsilon=p["epsilon"],
                                     max_queries=p["max_queries"], rng=rng)
    if attack_id == "pertknob":
        return _pertknob(p, seed, items, query)
    raise InvalidArgument("attack_id", f"attack '{attack_id}' has no runner")
