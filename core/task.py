"""The task of an image-recognition service: one name for each, compared as values.

:class:`Task` is a :class:`~enum.StrEnum`, so a member equals its plain string
(``Task.DETECTION == "detection"``) and hashes like it: code, stored plans and messages that
still carry the strings keep working while callers move to the enum.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["BOX_FORMATS", "TASKS", "Task"]


class Task(StrEnum):
    """What an image-recognition service answers (IEEE Std 3129-2023 4.7.6)."""

    #: ranked class labels, with or without scores (IEEE-C1/C2)
    CLASSIFICATION = "classification"
    #: boxes with class labels and scores (IEEE-C4)
    DETECTION = "detection"
    #: a class label per pixel (IEEE-C5)
    SEGMENTATION = "segmentation"


#: Every task, in the order the product lists them.
TASKS: Final = tuple(Task)

#: IEEE-C4 box formats of a detection answer or truth; a trailing ``n`` means normalised to
#: [0, 1] by the image size. Here (not beside the numpy conversion in ``boxes``) so that plan
#: validation can name them without importing numpy.
BOX_FORMATS: Final = ("xyxy", "xywh", "cxcywh", "xyxyn", "xywhn", "cxcywhn")
