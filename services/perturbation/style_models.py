"""Where ``neural_style`` may read a style model from, carried by each call's ``ApplyContext``.

A value handed in by whoever builds the context (the perturbation servicer, for the calling
tenant), not module state: two tenants' calls in one process each see only their own uploaded
models, and a test names its model folder without patching globals. Its own module so that
``spec.py`` (which defines ``ApplyContext``) can name it without importing the styles.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODEL_ROOT_ENV", "ModelBlobs", "StyleModels", "TenantModelBlobs"]

#: The environment variable naming the operator's folder of style models, used when no root is
#: given (the deployment configures it there, as before).
MODEL_ROOT_ENV = "FORTIS_MODEL_ROOT"

#: ``(blob id, field) -> Path``: the file of a MODEL blob ("sha256:...") the calling tenant
#: uploaded; InvalidArgument on the field for a malformed, unknown or foreign id.
ModelBlobs = Callable[[str, str], Path]

#: ``(tenant, blob id, field) -> Path``: the same for any tenant; bound to the calling tenant
#: once per call (tenant models come in through the upload API, never from a server path).
TenantModelBlobs = Callable[[str, str, str], Path]


@dataclass(frozen=True, kw_only=True)
class StyleModels:
    """``root``: the operator's folder of style models; ``model_path`` is relative to it and
    never leaves it (otherwise any tenant could make the server open any file). None: the
    folder ``$FORTIS_MODEL_ROOT`` names, if any. ``blobs``: resolves ``params.model`` for the
    calling tenant; None: uploaded models are refused."""

    root: Path | None = None
    blobs: ModelBlobs | None = None

    def model_root(self) -> Path | None:
        """The root in force: the one given, else the environment's, else None (refused)."""
        if self.root is not None:
            return self.root
        env = os.environ.get(MODEL_ROOT_ENV, "").strip()
        return Path(env) if env else None
