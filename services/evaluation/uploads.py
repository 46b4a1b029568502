"""gRPC transport of ``fortis.evaluation.v1.UploadService`` (tenants upload their data, so no
plan reads the server's disk): decode, call :class:`~fortis.infra.storage.blobs.BlobStorage`
(the file store, or PostgreSQL with ``database_url``) in the caller's tenant, encode. Every
decision (limits, quota, header checks, tenancy) is the store's.

An upload that ends early (a refused chunk, a client cancel, a broken stream) is aborted, so
nothing partial is kept.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from fortis.evaluation.v1 import uploads_pb2 as pb
from fortis.evaluation.v1 import uploads_pb2_grpc
from fortis.infra.serving.call_context import current_tenant, in_work_slot
from fortis.infra.storage.blobs import BlobInfo, BlobStorage, BlobUpload
from fortis.services.common import errors
from fortis.services.common.pagination import decode_token, encode_token, page_size, tenant_list
from google.protobuf import timestamp_pb2

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["UploadService"].full_name
KIND_NAMES = {pb.BLOB_KIND_IMAGE: "image", pb.BLOB_KIND_MANIFEST: "manifest",
              pb.BLOB_KIND_MODEL: "model", pb.BLOB_KIND_ARCHIVE: "archive"}
_KIND_ENUMS = {v: k for k, v in KIND_NAMES.items()}
_PAGE_DEFAULT, _PAGE_MAX = 100, 1000


def blob_proto(info: BlobInfo) -> pb.Blob:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(info.created * 1e9))
    return pb.Blob(blob_id=info.blob_id, kind=_KIND_ENUMS[info.kind], size=info.size,
                   create_time=ts, media_type=info.media_type, width=info.width,
                   height=info.height)


def _kind(value: int, field: str, *, allow_unspecified: bool = False) -> str:
    if allow_unspecified and value == pb.BLOB_KIND_UNSPECIFIED:
        return ""
    name = KIND_NAMES.get(value)
    if name is None:
        raise errors.InvalidArgument(field, "one of BLOB_KIND_IMAGE, BLOB_KIND_MANIFEST, "
                                            "BLOB_KIND_MODEL, BLOB_KIND_ARCHIVE is needed")
    return name


class UploadServicer(uploads_pb2_grpc.UploadServiceServicer):
    """Thin transport over one :class:`BlobStorage` (files, or PostgreSQL)."""

    def __init__(self, store: BlobStorage) -> None:
        self.store = store

    def UploadBlob(self, request_iterator: Iterable[Any], context: Any  # noqa: N802
                   ) -> pb.UploadBlobResponse:
        tenant = current_tenant.get()
        upload: BlobUpload | None = None
        try:
            for n, req in enumerate(request_iterator):
                part = req.WhichOneof("part")
                if upload is None:
                    if n != 0 or part != "header":
                        raise errors.InvalidArgument("header", "the first message of an upload "
                                                               "is its header")
                    h = req.header
                    upload = self.store.begin(tenant, kind=_kind(h.kind, "header.kind"),
                                              size=h.size, media_type=h.media_type,
                                              expected_sha256=h.expected_sha256)
                elif part == "chunk":
                    # hashing and writing: in the tenant's share of the CPU
                    in_work_slot(context, functools.partial(upload.write, req.chunk))
                elif part == "header":
                    raise errors.InvalidArgument("header", "only the first message is a header")
                # an empty message (no part) carries nothing: ignored
            if upload is None:
                raise errors.InvalidArgument("header", "an upload starts with its header")
            info, existed = in_work_slot(context, upload.finish)
        finally:
            if upload is not None:
                upload.abort()      # no-op after finish(); else nothing partial is kept
        return pb.UploadBlobResponse(blob=blob_proto(info), already_existed=existed)

    def GetBlob(self, request: Any, context: Any) -> pb.GetBlobResponse:  # noqa: N802
        return pb.GetBlobResponse(blob=blob_proto(
            self.store.get(current_tenant.get(), request.blob_id)))

    def ListBlobs(self, request: Any, context: Any) -> pb.ListBlobsResponse:  # noqa: N802
        size = page_size(request.page_size, default=_PAGE_DEFAULT, maximum=_PAGE_MAX)
        kind = _kind(request.kind, "kind", allow_unspecified=True)
        tenant = current_tenant.get()
        # One tenant's (and one filter's) token is not another's.
        name = tenant_list(f"blobs:{kind or 'all'}", tenant)
        after = None
        if request.page_token:
            pos = decode_token(request.page_token, name, {"t": float, "id": str})
            after = (pos["t"], pos["id"])
        rows = self.store.list(tenant, kind=kind, limit=size + 1, after=after)
        more = len(rows) > size
        rows = rows[:size]
        token = encode_token(name, t=rows[-1].created, id=rows[-1].blob_id.partition(":")[2]) \
            if more and rows else ""
        used, _ = self.store.usage(tenant)
        return pb.ListBlobsResponse(blobs=[blob_proto(r) for r in rows], next_page_token=token,
                                    used_bytes=used, quota_bytes=self.store.quota_bytes)

    def DeleteBlob(self, request: Any, context: Any) -> pb.DeleteBlobResponse:  # noqa: N802
        return pb.DeleteBlobResponse(blob=blob_proto(
            self.store.delete(current_tenant.get(), request.blob_id)))
