"""Which surrogate models a transfer attack is crafted on (IEEE-A7): names resolved against the
request's own definitions (a tenant's uploaded models, IEEE-P6 label mapping) and the
server's built-in / operator-configured surrogates. Domain code: no gRPC.

- :func:`resolve_surrogates`: the primary ``surrogate`` and the ``ensemble`` (further
  surrogates, IEEE-A7 model ensembles), each loaded once; a definition may not take a
  built-in or operator-configured name, names may not repeat, and every problem names its
  field (``surrogate_models[0].name``, ``ensemble[1]``, ...).
- :func:`check_mapped_labels`: every image's true label must have a surrogate class mapped to
  it, or the surrogate has no loss to follow (``images[3].labels``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import MAX_ENSEMBLE, MAX_SURROGATES
from fortis.services.common.surrogates import SurrogateSpec

__all__ = ["BuiltinLoader", "TenantLoader", "check_mapped_labels", "resolve_surrogates"]

#: (name, field) -> a built-in or operator-configured surrogate (InvalidArgument on field).
BuiltinLoader = Callable[[str, str], Any]
#: (definition, field of the definition, e.g. "surrogate_models[0]") -> a loaded surrogate.
TenantLoader = Callable[[SurrogateSpec, str], Any]


def resolve_surrogates(primary: str, ensemble: Sequence[str],
                       definitions: Sequence[SurrogateSpec], *, builtin: BuiltinLoader,
                       tenant: TenantLoader | None, reserved: Collection[str] = ()
                       ) -> tuple[Any, list[Any]]:
    """(primary surrogate, ensemble surrogates) named by ``primary`` and ``ensemble``.

    ``definitions``: the request's surrogate_models; ``reserved``: the names of the server's
    own surrogates (built-in and operator-configured), which no definition may take."""
    if len(definitions) > MAX_SURROGATES:
        raise InvalidArgument("surrogate_models", f"{len(definitions)} definitions; at most "
                                                  f"{MAX_SURROGATES}")
    if len(ensemble) > MAX_ENSEMBLE:
        raise InvalidArgument("ensemble", f"{len(ensemble)} surrogates; at most {MAX_ENSEMBLE}")
    by_name: dict[str, tuple[int, SurrogateSpec]] = {}
    for i, spec in enumerate(definitions):
        spec.check(f"surrogate_models[{i}]")
        if spec.name in reserved:
            raise InvalidArgument(f"surrogate_models[{i}].name", f"'{spec.name}' is one of "
                                  "this server's surrogates; choose another name")
        if spec.name in by_name:
            raise InvalidArgument(f"surrogate_models[{i}].name", f"'{spec.name}' is defined "
                                  "twice")
        by_name[spec.name] = (i, spec)
    if ensemble and not primary:
        raise InvalidArgument("surrogate", "an ensemble needs its primary surrogate")
    seen = {primary}
    for j, name in enumerate(ensemble):
        if not name:
            raise InvalidArgument(f"ensemble[{j}]", "a surrogate name is required")
        if name in seen:
            raise InvalidArgument(f"ensemble[{j}]", f"'{name}' is already in the ensemble")
        seen.add(name)

    def load(name: str, field: str) -> Any:
        if name in by_name:
            i, spec = by_name[name]
            if tenant is None:
                raise InvalidArgument(f"surrogate_models[{i}]", "uploaded surrogate models are "
                                      "not available on this server")
            return tenant(spec, f"surrogate_models[{i}]")
        return builtin(name, field)

    first = load(primary, "surrogate") if primary else None
    rest = [load(name, f"ensemble[{j}]") for j, name in enumerate(ensemble)]
    return first, rest


def check_mapped_labels(surrogates: Sequence[Any], labels: Sequence[Sequence[int]]) -> None:
    """Each image's true label (its first) must be a target class some class of every
    label-mapped surrogate maps to (``mapped_targets``; surrogates without one are not
    checked here)."""
    for s in surrogates:
        mapped = getattr(s, "mapped_targets", None)
        if mapped is None:
            continue
        for i, labs in enumerate(labels):
            if labs and int(labs[0]) not in mapped:
                raise InvalidArgument(f"images[{i}].labels", f"surrogate '{s.name}' maps none "
                                      f"of its classes to target label {int(labs[0])} (its "
                                      "label_map): it cannot attack this image; map a class "
                                      "to it or leave the image out")
