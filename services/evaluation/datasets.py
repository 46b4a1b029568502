"""The plan's image source (IEEE-P3): built-in datasets available offline. Domain code.

    fashion-mnist     Fashion-MNIST (Debian dataset-fashion-mnist), 28x28 grey, ids fmnist-<split>-NNNNN
    imagenet-photos   natural photos available offline with their ImageNet labels, resized
                      (shorter side 256) and centre-cropped to 224x224, ids photo-<name>

``dataset.label_map`` (IEEE-P6) maps dataset labels to the service's labels.
"""

from __future__ import annotations

from fortis.services.common.errors import FailedPrecondition
from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.runner import LabeledImage


def load_plan_images(plan: Plan) -> list[LabeledImage]:
    ds = plan.dataset
    lm = ds.label_map
    out: list[LabeledImage] = []
    if ds.source == "fashion-mnist":
        from fortis.adapters.torch_models.datasets import load_fashion_mnist
        try:
            images, labels = load_fashion_mnist(ds.split, limit=ds.limit, offset=ds.offset)
        except FileNotFoundError as exc:
            raise FailedPrecondition(str(exc)) from None
        for k, (im, lab) in enumerate(zip(images, labels, strict=True)):
            out.append((f"fmnist-{ds.split}-{ds.offset + k:05d}", im, (lm.get(int(lab), int(lab)),)))
    elif ds.source == "imagenet-photos":
        from fortis.adapters.torch_models.datasets import load_imagenet_photos
        from fortis.adapters.torch_models.mobilenet import preprocess_photo
        photos = load_imagenet_photos()[ds.offset:ds.offset + ds.limit]
        for p in photos:
            out.append((p.image_id, preprocess_photo(p.image),
                        tuple(lm.get(lab, lab) for lab in p.labels)))
    return out
