"""Importing a package that imports torchvision, without torchvision (PyPI's torchvision pulls a
second, CUDA torch): stand-in modules are present in ``sys.modules`` only while the import runs.

Used by ``vision_targets.mtcnn`` (facenet-pytorch's detector imports two torchvision names)
and ``torch_models.surrogate`` (onnx2torch imports torchvision for its NMS / RoIAlign
converters only).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["package", "temporary_modules"]


def package(name: str, **attrs: object) -> types.ModuleType:
    """An empty package module ``name`` (importable as a parent) with ``attrs`` set."""
    mod = types.ModuleType(name)
    mod.__path__ = []  # type: ignore[attr-defined]
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


@contextmanager
def temporary_modules(added: Mapping[str, types.ModuleType],
                      prefixes: tuple[str, ...]) -> Iterator[None]:
    """``added`` in ``sys.modules`` (where nothing of that name is) for the ``with`` body;
    afterwards every module whose top-level name is in ``prefixes`` that the body brought in,
    and every stand-in still there, is removed: a later real import must not find them."""
    before = set(sys.modules)
    for name, mod in added.items():
        sys.modules.setdefault(name, mod)
    try:
        yield
    finally:
        for name in list(sys.modules):
            if name not in before and name.split(".")[0] in prefixes:
                del sys.modules[name]
        for name, mod in added.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]
