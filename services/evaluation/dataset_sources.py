"""The readers of the datasets read sample by sample from a store (IEEE-P3), by source:
WebDataset shards (``dataset_streams.py``), Hugging Face folders (``dataset_hf.py``) and
class-folder trees (``dataset_folders.py``). Domain code."""

from __future__ import annotations

from fortis.services.evaluation.dataset_folders import read_folders
from fortis.services.evaluation.dataset_hf import read_hf
from fortis.services.evaluation.dataset_store import DataStore
from fortis.services.evaluation.dataset_streams import Sample, read_webdataset
from fortis.services.evaluation.plan import Plan

__all__ = ["read_samples"]

_READERS = {"webdataset": read_webdataset, "hf": read_hf, "folders": read_folders}


def read_samples(plan: Plan, store: DataStore, *, decode_image: bool = True) -> list[Sample]:
    """The plan's selected samples (images decoded unless only checking, for ValidatePlan)."""
    return _READERS[plan.dataset.source](plan, store, decode_image)
