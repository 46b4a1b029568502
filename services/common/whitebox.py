"""White-box access to a target's own weights: granted by the operator, never implied.

A surrogate that shares its weights with a target answers, without the proxy (no session,
budget, rate limit or ledger row), what the target would: its gradients
(``ApplyPerturbation(model_gradient_descent)``) and, through ``initially_correct`` of a
transfer attack at epsilon 0, its top-1 label for any label the caller tries. Such a surrogate
is a *twin* of the target:

- a built-in model used both as a target (``builtin:<model>``) and as a surrogate (the
  surrogate of the same name; ``mtcnn-surrogate`` and ``u2netp-surrogate`` are ports of the
  ``mtcnn`` and ``u2netp`` targets' own weights);
- an operator surrogate whose manifest declares ``"twin_of": ["<target>", ...]``.

A tenant may name a twin only when the operator granted it white-box access to every target
the twin shares weights with (``fortis serve --whitebox-grant TENANT=TARGET[,TARGET]``,
``TENANT=*`` for all); otherwise PERMISSION_DENIED naming the request's or plan's field. No
tenant has a grant by default; the single-user embedded modes (``fortis serve --no-auth`` or
with its generated key, ``fortis demo``, ``fortis run``) grant their own one tenant. Each use
of a twin is an audit log line (``whitebox_surrogate_used``). Pure shared code.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import structlog
from fortis.services.common.errors import InvalidArgument, PermissionDenied

__all__ = ["ALL_TARGETS", "BUILTIN_TWIN_MODELS", "WhiteboxPolicy", "parse_grants"]

log = structlog.get_logger("fortis.audit")

#: A grant of every target of the server.
ALL_TARGETS: Final = "*"
#: Built-in surrogates that are ports of a built-in target model of another name (the rest
#: share weights with the built-in target model of their own name).
BUILTIN_TWIN_MODELS: Final[Mapping[str, str]] = {"mtcnn-surrogate": "mtcnn",
                                                 "u2netp-surrogate": "u2netp"}


def parse_grants(texts: Iterable[str], where: str = "whitebox_grant"
                 ) -> dict[str, frozenset[str]]:
    """``TENANT=TARGET[,TARGET]`` (repeatable; ``TENANT=*``: every target) -> tenant -> the
    targets granted. InvalidArgument naming ``where`` for a malformed entry."""
    out: dict[str, set[str]] = {}
    for text in texts:
        tenant, sep, rest = str(text).partition("=")
        targets = {t.strip() for t in rest.split(",") if t.strip()}
        if not sep or not tenant.strip() or not targets:
            raise InvalidArgument(where, f"'{str(text)[:100]}': give TENANT=TARGET[,TARGET] "
                                         "(or TENANT=* for every target)")
        out.setdefault(tenant.strip(), set()).update(targets)
    return {k: frozenset(v) for k, v in out.items()}


@dataclass(frozen=True, kw_only=True)
class WhiteboxPolicy:
    """Who may use which twin surrogate.

    ``builtin_targets``: built-in model -> the names of this server's targets serving it
    (a perturbation service run apart from the proxy passes a mapping that asks the proxy;
    its lookups may raise Unavailable, which fails the check); None when nothing can tell:
    then every built-in model counts as a twin of a target of its own name, so nothing opens
    by a missing answer. ``declared_twins``: an operator surrogate's
    ``twin_of`` targets (empty for other names)."""

    grants: Mapping[str, frozenset[str]] = field(default_factory=dict)
    builtin_targets: Mapping[str, Collection[str]] | None = field(default_factory=dict)
    builtin_models: Collection[str] = ()
    declared_twins: Callable[[str], Collection[str]] = lambda name: ()

    def twins(self, surrogate: str) -> tuple[str, ...]:
        """The targets ``surrogate`` shares its weights with (empty: not a twin)."""
        found: list[str] = list(self.declared_twins(surrogate) or ())
        if surrogate in self.builtin_models:
            model = BUILTIN_TWIN_MODELS.get(surrogate, surrogate)
            if self.builtin_targets is None:
                found.append(model)
            else:
                found += list(self.builtin_targets.get(model, ()))
        return tuple(dict.fromkeys(found))

    def granted(self, tenant: str, target: str) -> bool:
        held = self.grants.get(tenant, frozenset())
        return ALL_TARGETS in held or target in held

    def check(self, tenant: str, surrogate: str, field_name: str, *,
              audit: str = "") -> tuple[str, ...]:
        """PermissionDenied naming ``field_name`` unless ``tenant`` may use ``surrogate``;
        returns the targets it is a twin of. ``audit``: the call using it (an audit line is
        written for a twin; "" for a check alone, e.g. validation)."""
        if not surrogate:
            return ()
        twins = self.twins(surrogate)
        if not twins:
            return ()
        missing = [t for t in twins if not self.granted(tenant, t)]
        if missing:
            # The target names are left out: a tenant need not learn targets it cannot see.
            raise PermissionDenied(
                f"surrogate '{surrogate[:100]}' shares its weights with a target of this "
                "server: white-box access to that target has not been granted to this tenant "
                "(the operator grants it with fortis serve --whitebox-grant TENANT=TARGET)",
                field=field_name)
        if audit:
            log.info("whitebox_surrogate_used", audit=True, tenant=tenant, surrogate=surrogate,
                     targets=list(twins), rpc=audit, field=field_name)
        return twins
