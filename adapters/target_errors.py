"""The errors every remote-target adapter raises, in one place.

The proxy (``fortis.services.proxy.proxy``) records a failed call under the class name
of its error and retries only ``errors.Unavailable``; so the HTTP/JSON and Open Inference
Protocol adapters, over REST or gRPC, share these two classes instead of each defining look-
alikes that would drift apart.
"""

from __future__ import annotations

from fortis.services.common import errors

__all__ = ["TargetResponseError", "TargetUnavailable", "raise_first_failure"]


class TargetResponseError(errors.FortisError):
    """The target answered, but not with something the adapter can use (a bad status, a
    malformed body, an answer that does not fit the profile, a missing output, a wrong shape or
    datatype). Fails the call without retry; the proxy records it for each image (ledger
    status ``TargetResponseError``)."""


class TargetUnavailable(errors.Unavailable):
    """The target could not answer now (overloaded, down, timed out, connection refused); the
    proxy retries, waiting ``retry_after_s`` when the target said how long (Retry-After)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def raise_first_failure(failures: list[errors.FortisError]) -> None:
    """Raises the error a call of several requests (one per image, sent side by side) ends
    with: a failure that retrying cannot fix wins over one the proxy should retry; else the
    first retryable one, waiting as long as the longest Retry-After any of them was given."""
    hard = [e for e in failures if not isinstance(e, errors.Unavailable)]
    if hard:
        raise hard[0]
    wait = max((getattr(e, "retry_after_s", None) or 0.0) for e in failures)
    first = failures[0]
    if wait:
        first.retry_after_s = wait  # type: ignore[attr-defined]
    raise first
