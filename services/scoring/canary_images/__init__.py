"""CANARY image-level metrics (seed 003, Sun et al. 2023): perturbation cost (CAN-4) and the
Grad-CAM maps behind ACAMC (CAN-2). Pure domain code (no gRPC), numpy and torch only.

One module per concern:

``common``      result nodes (``ok`` / ``not available`` / ``not applicable``, never a silent
                0) and the image checks, shared with :mod:`fortis.services.scoring.canary`.
``haar``        one-level orthonormal 2-D Haar DWT (AED-FD).
``similarity``  MS-GMSD (ALMS) and DISTS (ADMS, user-supplied weights).
``cost``        :func:`perturbation_cost` (CAN-4: AMD, AED, APCR, AED-FD, ALMS, ADMS).
``gradcam``     Grad-CAM and :func:`acamc` (CAN-2: ACAMC-A/T).

The public names are re-exported here (and by ``fortis.services.scoring.canary``).
"""

from __future__ import annotations

from fortis.services.scoring.canary_images.common import (
    NOT_APPLICABLE,
    NOT_AVAILABLE,
    OK,
    check_images,
    check_mask,
    mean_node,
    missing_node,
    ok_node,
    to_unit,
)
from fortis.services.scoring.canary_images.cost import perturbation_cost
from fortis.services.scoring.canary_images.gradcam import (
    WhiteBoxModel,
    acamc,
    cosine_similarity,
    grad_cam,
    resolve_layer,
)
from fortis.services.scoring.canary_images.haar import haar_dwt2, haar_idwt2, haar_split
from fortis.services.scoring.canary_images.similarity import (
    MS_GMSD_MIN_SIZE,
    MS_GMSD_SCALE_WEIGHTS,
    DistsModel,
    load_dists,
    ms_gmsd,
)

__all__ = [
    "MS_GMSD_MIN_SIZE",
    "MS_GMSD_SCALE_WEIGHTS",
    "NOT_APPLICABLE",
    "NOT_AVAILABLE",
    "OK",
    "DistsModel",
    "WhiteBoxModel",
    "acamc",
    "check_images",
    "check_mask",
    "cosine_similarity",
    "grad_cam",
    "haar_dwt2",
    "haar_idwt2",
    "haar_split",
    "load_dists",
    "mean_node",
    "missing_node",
    "ms_gmsd",
    "ok_node",
    "perturbation_cost",
    "resolve_layer",
    "to_unit",
]
