"""What the backend needs of a transport (REST or gRPC), and the error both raise when the
server refuses a request for its size (the backend then halves the batch)."""

from __future__ import annotations

from typing import Protocol

from fortis.adapters.kserve_v2.codec import InTensor, OutTensor
from fortis.adapters.kserve_v2.metadata import ModelMeta
from fortis.adapters.target_errors import TargetResponseError

#: Largest request or answer either transport handles (gRPC message limit, REST body limit).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class MessageTooLarge(TargetResponseError):
    """The server refused a request for its size (gRPC RESOURCE_EXHAUSTED "larger than max",
    HTTP 413); the adapter splits the batch and tries again."""


class Transport(Protocol):
    endpoint: str

    def ready(self) -> bool: ...

    def metadata(self) -> ModelMeta: ...

    def infer(self, tensor: InTensor, output_name: str) -> list[OutTensor]: ...

    def close(self) -> None: ...
