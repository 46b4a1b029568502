"""The attack registry (IEEE-A7/A8/A9, IEEE-M6, PER-3): every attack listed once with a bounded
parameter schema, runs dispatched through the registry (no per-id branches in the engine), the
shared base's budget accounting and projections, and an attack added as one entry."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from fortis.services.common.errors import BudgetExhausted, InvalidArgument, QuotaViolation
from fortis.services.common.params import PARAM_TYPES
from fortis.services.perturbation import engine
from fortis.services.perturbation.attacks import base, registry
from fortis.services.perturbation.attacks.base import (
    STOP_BUDGET,
    STOP_PROXY_BUDGET,
    STOP_SUCCESS,
    AttackContext,
    AttackResult,
    AttackSpec,
    QueryBudget,
    make_result,
    project_l2,
)
from fortis.services.perturbation.catalogue import ATTACKS, attack_spec, list_catalogue

ROOT = Path(__file__).resolve().parents[2]


def test_every_attack_is_listed_once_with_a_schema() -> None:
    assert list(ATTACKS)[:4] == ["fgsm", "bim", "pgd", "mi_fgsm"]  # then the later families
    assert {"square", "hsja", "pertknob"} <= set(ATTACKS)
    assert ATTACKS is registry.ATTACKS
    for spec in ATTACKS.values():
        assert spec.kind in base.ATTACK_KINDS and spec.norms and spec.refs and spec.description
        assert set(spec.norms) <= set(base.NORMS)
        assert spec.untargeted or spec.targeted
        assert spec.needs_surrogate == (spec.kind == "transfer")
        assert spec.is_query_attack == (spec.kind != "transfer")
        assert spec.params, spec.id
        for p in spec.params:
            assert p.type in PARAM_TYPES and p.description, (spec.id, p.name)
            if p.type in ("int", "float"):
                assert p.minimum is not None and p.maximum is not None, (spec.id, p.name)
        assert spec.ieee_ref == spec.refs[0] and spec.norm == spec.norms[0]
    assert ATTACKS["hsja"].norm == "l2" and ATTACKS["square"].norm == "linf"
    assert {s.ieee_ref for s in ATTACKS.values()} == {"IEEE-A7", "IEEE-A8", "PER-3"}
    # the perturbation listing no longer carries attacks
    assert not {it["id"] for it in list_catalogue()} & set(ATTACKS)


def test_describe_and_list_by_kind() -> None:
    d = registry.describe_attack(ATTACKS["pertknob"])
    assert d["kind"] == "decision" and d["norms"] == ["l2"] and d["refs"][0] == "PER-3"
    mode = next(p for p in d["parameters"] if p["name"] == "mode")
    assert mode["choices"] == ["bisection", "linear"] and not mode["required"]
    prop = next(p for p in d["parameters"] if p["name"] == "property")
    assert prop["required"]
    transfer = [a["id"] for a in registry.list_attacks("transfer")]
    assert transfer[:4] == ["fgsm", "bim", "pgd", "mi_fgsm"]
    assert all(a["kind"] == "transfer" for a in registry.list_attacks("transfer"))
    score = [a["id"] for a in registry.list_attacks("score")]
    assert score[0] == "square" and all(ATTACKS[a].kind == "score" for a in score)


def test_unknown_attack_and_bad_params_name_their_field() -> None:
    with pytest.raises(InvalidArgument) as e:
        attack_spec("deepfool")
    assert e.value.violations[0].field == "attack_id"
    item = engine.AttackItem(image_id="a", image=np.zeros((4, 4, 1), np.uint8), labels=(0,))
    with pytest.raises(InvalidArgument) as e:
        engine.run_attack("square", {"epsilon": 3.0, "max_queries": 0}, 0, [item], query=None)
    assert {v.field for v in e.value.violations} == {"params.epsilon", "params.max_queries"}
    with pytest.raises(InvalidArgument) as e:
        engine.run_attack("pertknob", {"property": "per_brightness", "mode": "spiral"}, 0, [item])
    assert e.value.violations[0].field == "params.mode"
    with pytest.raises(InvalidArgument) as e:
        engine.run_attack("square", {"epsilon": 0.1}, 0, [item], query=None)
    assert e.value.violations[0].field == "proxy_session_id"
    with pytest.raises(InvalidArgument) as e:
        engine.run_attack("pgd", {"epsilon": 0.1}, 0, [item])
    assert e.value.violations[0].field == "surrogate"


def test_the_engine_dispatches_through_the_registry_only() -> None:
    """No ``attack_id == "fgsm"`` chains: the engine names no attack id."""
    tree = ast.parse((ROOT / "services/perturbation/engine.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert not strings & set(ATTACKS)


def test_a_new_attack_is_one_module_plus_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake attack added as one entry is validated, listed and run through the engine with
    a context holding the validated params, the criterion and the seed-derived generator."""
    seen: dict[str, AttackContext] = {}

    def run(ctx: AttackContext) -> list[AttackResult]:
        seen["ctx"] = ctx
        noise = ctx.rng().integers(-ctx.params["levels"], ctx.params["levels"] + 1,
                                   size=ctx.images.shape)
        adv = base.clip_to_linf(ctx.images.astype(np.int16) + noise, ctx.images,
                                ctx.params["levels"])
        labels = ctx.label_query()(adv, np.arange(len(adv)))
        ok = ctx.criterion.adversarial_labels(labels, ctx.labels)
        return [make_result(i, ctx.images[i], adv[i], success=bool(ok[i]), queries=1,
                            initially_correct=None, stop_reason=STOP_SUCCESS if ok[i] else STOP_BUDGET)
                for i in range(len(adv))]

    fake = AttackSpec(id="noise_probe", kind="decision", family="random", norms=("linf",),
                      refs=("IEEE-A8",), description="uniform noise, one query", run=run,
                      params=(base.Param(name="levels", type="int", default=3, minimum=0,
                                         maximum=255, description="noise amplitude"),))
    monkeypatch.setattr(registry, "ATTACKS",
                        registry.build((*registry.ATTACKS.values(), fake)))
    assert "noise_probe" in [a["id"] for a in registry.list_attacks()]

    class Labels:
        num_classes = 2
        charged: list[str] = []

        def labels(self, images: np.ndarray, ids: list[str]) -> np.ndarray:
            self.charged.extend(ids)
            return (images.reshape(len(images), -1).mean(axis=1) > 100).astype(np.int64)

        def scores(self, images: np.ndarray, ids: list[str]) -> np.ndarray:
            raise AssertionError("a decision attack reads labels only")

    items = [engine.AttackItem(image_id=f"im{k}", image=np.full((5, 5, 1), 99 + k, np.uint8),
                               labels=(0,)) for k in range(3)]
    q = Labels()
    a = engine.run_attack("noise_probe", {}, 11, items, query=q)
    b = engine.run_attack("noise_probe", {}, 11, items, query=q)
    ctx = seen["ctx"]
    assert ctx.params["levels"] == 3 and ctx.image_ids == ("im0", "im1", "im2")
    assert ctx.labels.tolist() == [0, 0, 0] and ctx.surrogate is None
    assert q.charged == ["im0", "im1", "im2"] * 2
    assert all(r.linf <= 3 / 255 + 1e-12 for r in a)
    assert [r.adversarial.tobytes() for r in a] == [r.adversarial.tobytes() for r in b]
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.build((fake, fake))
    with pytest.raises(ValueError, match="surrogate"):
        AttackSpec(id="x", kind="transfer", family="f", norms=("linf",), refs=("IEEE-A7",),
                   description="d", run=run)


def test_query_budget_caps_counts_and_stops_on_proxy_refusal() -> None:
    """IEEE-M6: per image, never past Q_m; a refused call is not counted and stops its images."""
    qb = QueryBudget(3, 2)
    calls: list[list[int]] = []

    def ok(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        calls.append(idx.tolist())
        return np.zeros(len(idx))

    assert qb.ask(ok, np.zeros((3, 1)), np.arange(3)) is not None
    assert qb.ask(ok, np.zeros((1, 1)), np.array([0])) is not None
    assert qb.running().tolist() == [1, 2] and qb.stop[0] == STOP_BUDGET
    with pytest.raises(RuntimeError, match="Q_m"):
        qb.ask(ok, np.zeros((2, 1)), np.array([1, 1]))          # would take image 1 to 3

    def refuse(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        raise BudgetExhausted([QuotaViolation(subject="session", description="spent")])

    assert qb.ask(refuse, np.zeros((1, 1)), np.array([2])) is None
    assert qb.stop[2] == STOP_PROXY_BUDGET and qb.used.tolist() == [2, 1, 1]
    assert qb.running().tolist() == [1]


def test_l2_projection_stays_within_the_bound_after_rounding() -> None:
    """IEEE-A9: rounding towards the original keeps ||adv - x||_2 <= epsilon on uint8."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(9, 7, 3), dtype=np.uint8)
    for eps in (0.0, 0.05, 0.5, 3.0):
        cand = x.astype(np.float64) + rng.normal(0, 40, size=x.shape)
        adv = project_l2(cand, x, eps)
        r = make_result(0, x, adv, success=None, queries=0, initially_correct=None,
                        stop_reason="iterations")
        assert adv.dtype == np.uint8 and r.l2 <= eps + 1e-12


def test_a_transfer_attack_leaves_the_shared_surrogate_in_eval_mode() -> None:
    """The surrogate is cached per process and may be the target itself (the same built-in
    model): a deadline-aware attack (``should_stop``) must give it back in eval mode. Found
    with MobileNetV2 as target and surrogate: after one fgsm the target answered in training
    mode (BatchNorm on batch statistics) and the next evaluation's clean accuracy fell from
    16/16 to 0/16."""
    from fortis.adapters.builtin import load_model

    surrogate = load_model("fmnist-surrogate")
    assert not surrogate.model.training
    items = [engine.AttackItem(image_id=f"im{k}", image=np.full((28, 28, 1), 40 * k, np.uint8),
                               labels=(k,)) for k in range(3)]
    for stop in (engine.never, lambda: False):
        engine.run_attack("fgsm", {"epsilon": 0.1}, 0, items, surrogate=surrogate,
                          should_stop=stop)
        assert not surrogate.model.training
        assert not any(m.training for m in surrogate.model.modules())
