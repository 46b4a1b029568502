"""FortisClient: the typed, deadline-bounded Python client of a running Fortis."""

from __future__ import annotations

import builtins
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from fortis.client._pagination import iter_pages
from fortis.client.archive import folder_entries, tar_chunks, tar_digest
from fortis.client.errors import (
    DeadlineExceeded,
    FortisError,
    InvalidArgument,
    Unavailable,
    from_rpc_error,
)
from fortis.client.types import (
    Attack,
    Evaluation,
    LedgerEntry,
    Page,
    Perturbation,
    Progress,
    SessionStats,
    Target,
)
from fortis.evaluation.v1 import evaluation_pb2 as ev_pb
from fortis.evaluation.v1 import evaluation_pb2_grpc, uploads_pb2_grpc
from fortis.evaluation.v1 import uploads_pb2 as up_pb
from fortis.perturbation.v1 import perturbation_pb2, perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

#: Metadata key carrying the API key (the server's auth interceptor reads it).
API_KEY_HEADER = "x-api-key"
#: Largest message sent or received: a report with inline plots is a few MB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Longest a single Watch stream runs before it is reopened. Bounds every call, so a silently
#: dead connection is noticed within this time even when the caller waits without a timeout.
WATCH_SEGMENT_S = 300.0
#: Reconnection attempts in a row after a dropped Watch stream before giving up.
WATCH_RECONNECTS = 5
#: Bytes per UploadBlob data message (the server's limit).
UPLOAD_CHUNK_BYTES = 1024 * 1024
_BLOB_KINDS = {"image": up_pb.BLOB_KIND_IMAGE, "manifest": up_pb.BLOB_KIND_MANIFEST,
               "model": up_pb.BLOB_KIND_MODEL, "archive": up_pb.BLOB_KIND_ARCHIVE}
_BLOB_KIND_NAMES = {v: k for k, v in _BLOB_KINDS.items()}


@dataclass(frozen=True)
class Blob:
    """An uploaded blob's metadata (UploadService): ``blob_id`` is "sha256:<hex>" of the
    content; plans name it (``dataset: {source: uploads, manifest: ...}``, neural_style
    ``model``)."""

    blob_id: str
    kind: str
    size: int
    created: float
    media_type: str = ""
    width: int = 0
    height: int = 0
    already_existed: bool = False

    @classmethod
    def from_proto(cls, b: Any, already_existed: bool = False) -> Blob:
        return cls(blob_id=b.blob_id, kind=_BLOB_KIND_NAMES.get(b.kind, "unspecified"),
                   size=b.size, created=b.create_time.ToNanoseconds() / 1e9,
                   media_type=b.media_type, width=b.width, height=b.height,
                   already_existed=already_existed)



def _read_pem(path: str | Path | None, field: str) -> bytes | None:
    if path is None or path == "":
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(field, f"cannot read '{str(path)[:200]}': "
                              f"{exc.strerror or type(exc).__name__}") from None


def _channel_credentials(ca: str | Path | None, cert: str | Path | None,
                         key: str | Path | None) -> grpc.ChannelCredentials:
    """TLS credentials: the CA to trust (None: the system's roots) and, for mTLS, this
    client's certificate and key (both or neither)."""
    if bool(cert) != bool(key):
        raise InvalidArgument("tls_cert" if key else "tls_key",
                              "a client certificate needs its key, and a key its certificate")
    return grpc.ssl_channel_credentials(root_certificates=_read_pem(ca, "tls_ca"),
                                        private_key=_read_pem(key, "tls_key"),
                                        certificate_chain=_read_pem(cert, "tls_cert"))


class FortisClient:
    """Client of a running Fortis (``fortis serve``). Use it as a context manager.

    Every call has a deadline (``timeout_s``; ``watch``/``wait`` take their own) and raises the
    :mod:`fortis.client.errors` class the server raised, with its details.

    TLS (a server started with ``--tls-cert``): ``tls_ca`` is the CA file that signed the
    server's certificate (``tls=True`` alone trusts the system's roots); ``tls_cert`` and
    ``tls_key`` are this client's certificate and key when the server requires one (mTLS);
    ``tls_server_name`` is the name to verify when it is not the host of ``address``.
    """

    def __init__(self, address: str, *, api_key: str = "", timeout_s: float = 60.0,
                 tls: bool = False, tls_ca: str | Path | None = None,
                 tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                 tls_server_name: str = "") -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._md: tuple[tuple[str, str], ...] = ((API_KEY_HEADER, api_key),) if api_key else ()
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if tls or tls_ca or tls_cert or tls_key or tls_server_name:
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._ch = grpc.secure_channel(
                address, _channel_credentials(tls_ca, tls_cert, tls_key), options=options)
        else:
            self._ch = grpc.insecure_channel(address, options=options)
        self._evaluations = evaluation_pb2_grpc.EvaluationServiceStub(self._ch)
        self._proxy = proxy_pb2_grpc.TargetProxyServiceStub(self._ch)
        self._perturbation = perturbation_pb2_grpc.PerturbationServiceStub(self._ch)
        self._uploads = uploads_pb2_grpc.UploadServiceStub(self._ch)

    def close(self) -> None:
        self._ch.close()

    def __enter__(self) -> FortisClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return method(request, metadata=self._md, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    # -- evaluations ------------------------------------------------------------------------
    def validate(self, plan_text: str) -> dict[str, Any]:
        """Check a plan on the server without running it (ValidatePlan): its name and test
        counts; an invalid plan raises :class:`InvalidArgument` naming every bad field."""
        resp = self._call(self._evaluations.ValidatePlan, ev_pb.ValidatePlanRequest(plan=plan_text))
        return {"plan_name": resp.plan_name, "corruptions": resp.corruptions,
                "attacks": resp.attacks, "degradation_operators": resp.degradation_operators}

    def estimate(self, plan_text: str) -> dict[str, Any]:
        """The target queries a plan will make (ValidatePlan's estimate), as plain data:
        ``images``, ``batch_size``, ``fixed``, ``upper_bound``, ``expected`` (None when
        unknown), ``expected_from``, ``settings`` (per setting: ``stage``, ``setting``,
        ``kind`` "fixed" or "upper_bound", ``images``, ``per_image``, ``fixed``,
        ``upper_bound``, ``expected``, ``target``), ``durations`` (per rate limit: ``limit``,
        ``rate``, ``unit``, ``seconds_fixed``, ``seconds_upper_bound``), ``price`` (None, or
        ``per_1000``, ``source``, ``fixed``, ``upper_bound``), ``tenant_queries_today`` and
        ``tenant_queries_per_day`` (0 = no quota). An invalid plan raises
        :class:`InvalidArgument` naming every bad field."""
        resp = self._call(self._evaluations.ValidatePlan, ev_pb.ValidatePlanRequest(plan=plan_text))
        e = resp.estimate
        kinds = {ev_pb.QUERY_COUNT_KIND_FIXED: "fixed",
                 ev_pb.QUERY_COUNT_KIND_UPPER_BOUND: "upper_bound"}
        return {
            "plan_name": resp.plan_name, "images": e.images, "batch_size": e.batch_size,
            "fixed": e.fixed, "upper_bound": e.upper_bound,
            "expected": e.expected if e.HasField("expected") else None,
            "expected_from": e.expected_from,
            "settings": [{"stage": s.stage, "setting": s.setting,
                          "kind": kinds.get(s.kind, "unspecified"), "images": s.images,
                          "per_image": s.per_image, "fixed": s.fixed,
                          "upper_bound": s.upper_bound,
                          "expected": s.expected if s.HasField("expected") else None,
                          "target": s.target} for s in e.settings],
            "durations": [{"limit": d.limit, "rate": d.rate, "unit": d.unit,
                           "seconds_fixed": d.seconds_fixed,
                           "seconds_upper_bound": d.seconds_upper_bound} for d in e.durations],
            "price": {"per_1000": e.price.per_1000, "source": e.price.source,
                      "fixed": e.price.fixed, "upper_bound": e.price.upper_bound}
            if e.HasField("price") else None,
            "tenant_queries_today": e.tenant_queries_today,
            "tenant_queries_per_day": e.tenant_queries_per_day}

    def submit(self, plan_text: str, evaluation_id: str = "") -> Evaluation:
        """Validate and start a plan (YAML or JSON). Submitting the same ``evaluation_id``
        again returns the existing evaluation (idempotent)."""
        resp = self._call(self._evaluations.CreateEvaluation, ev_pb.CreateEvaluationRequest(
            plan=plan_text, evaluation_id=evaluation_id))
        return Evaluation.from_proto(resp.evaluation)

    def get(self, evaluation_id: str) -> Evaluation:
        resp = self._call(self._evaluations.GetEvaluation,
                          ev_pb.GetEvaluationRequest(evaluation_id=evaluation_id))
        return Evaluation.from_proto(resp.evaluation)

    def cancel(self, evaluation_id: str) -> Evaluation:
        resp = self._call(self._evaluations.CancelEvaluation,
                          ev_pb.CancelEvaluationRequest(evaluation_id=evaluation_id))
        return Evaluation.from_proto(resp.evaluation)

    def list_evaluations(self, page_size: int = 50, page_token: str = "") -> Page[Evaluation]:
        """One page of evaluations, newest first."""
        resp = self._call(self._evaluations.ListEvaluations, ev_pb.ListEvaluationsRequest(
            page_size=page_size, page_token=page_token))
        return Page([Evaluation.from_proto(e) for e in resp.evaluations], resp.next_page_token)

    def iter_evaluations(self, page_size: int = 50) -> Iterator[Evaluation]:
        """Every evaluation of the tenant, newest first, fetching pages as needed."""
        return iter_pages(lambda token: self.list_evaluations(page_size, token))

    def list(self, page_size: int = 50) -> builtins.list[Evaluation]:
        """Every evaluation (all pages), newest first."""
        return builtins.list(self.iter_evaluations(page_size))

    def watch(self, evaluation_id: str, *, timeout_s: float | None = None
              ) -> Iterator[Evaluation]:
        """The evaluation on every change, ending with its final state.

        A dropped stream is reopened (the state in between is read with ``get``, so no final
        state is missed). Raises :class:`DeadlineExceeded` if it has not ended within
        ``timeout_s`` seconds (None: wait as long as it runs).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        failures = 0
        while True:
            segment = WATCH_SEGMENT_S
            if deadline is not None:
                segment = min(segment, deadline - time.monotonic())
                if segment <= 0:
                    raise DeadlineExceeded(
                        f"evaluation '{evaluation_id}' has not ended after {timeout_s} s")
            try:
                stream = self._evaluations.WatchEvaluation(
                    ev_pb.WatchEvaluationRequest(evaluation_id=evaluation_id),
                    metadata=self._md, timeout=segment)
                for resp in stream:
                    failures = 0
                    ev = Evaluation.from_proto(resp.evaluation)
                    yield ev
                    if ev.finished:
                        return
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, Unavailable):
                    failures += 1
                    if failures > WATCH_RECONNECTS:
                        raise err from None
                    time.sleep(min(0.25 * 2 ** failures, 5.0))
                elif not isinstance(err, DeadlineExceeded):     # a segment ended: reopen
                    raise err from None
            # The stream ended or dropped without a final state: read it, then reopen.
            try:
                ev = self.get(evaluation_id)
            except Unavailable:
                continue
            if ev.finished:
                yield ev
                return

    def wait(self, evaluation_id: str, *, timeout_s: float | None = None,
             on_progress: Callable[[Progress], None] | None = None) -> Evaluation:
        """Follow the evaluation until it ends and return its final state; ``on_progress`` is
        called on every change. Raises :class:`DeadlineExceeded` after ``timeout_s``."""
        last: Evaluation | None = None
        for ev in self.watch(evaluation_id, timeout_s=timeout_s):
            last = ev
            if on_progress is not None:
                on_progress(ev.progress)
        if last is None:    # cannot happen: watch ends only after a final state
            raise FortisError(f"evaluation '{evaluation_id}': no state received")
        return last

    def report_files(self, evaluation_id: str) -> tuple[str, str]:
        """(report.json, report.html) of a finished evaluation, as text."""
        r = self._call(self._evaluations.GetEvaluationReport,
                       ev_pb.GetEvaluationReportRequest(evaluation_id=evaluation_id))
        return r.report_json, r.report_html

    def report(self, evaluation_id: str) -> dict[str, Any]:
        """report.json of a finished evaluation, parsed."""
        value: dict[str, Any] = json.loads(self.report_files(evaluation_id)[0])
        return value

    def write_report(self, evaluation_id: str, out_dir: str | Path) -> tuple[Path, Path]:
        """Write report.json and report.html into ``out_dir`` (created); returns both paths."""
        js, html = self.report_files(evaluation_id)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(js, encoding="utf-8")
        (out / "report.html").write_text(html, encoding="utf-8")
        return out / "report.json", out / "report.html"

    # -- proxy and catalogue ----------------------------------------------------------------
    def session_stats(self, session_id: str) -> SessionStats:
        """Query counts of one proxy session (e.g. "EV_ID/clean"), from the ledger."""
        return SessionStats.from_proto(self._call(
            self._proxy.GetSessionStats, proxy_pb2.GetSessionStatsRequest(session_id=session_id)))

    def list_ledger_entries(self, session_id: str, page_size: int = 500,
                            page_token: str = "") -> Page[LedgerEntry]:
        """One page of a session's ledger, oldest first."""
        resp = self._call(self._proxy.ListLedgerEntries, proxy_pb2.ListLedgerEntriesRequest(
            session_id=session_id, page_size=page_size, page_token=page_token))
        return Page([LedgerEntry.from_proto(e) for e in resp.entries], resp.next_page_token)

    def iter_ledger_entries(self, session_id: str, page_size: int = 500
                            ) -> Iterator[LedgerEntry]:
        """Every ledger entry of a session, oldest first, fetching pages as needed."""
        return iter_pages(lambda token: self.list_ledger_entries(session_id, page_size, token))

    def _all_pages(self, call: Any, request_type: Any, field: str) -> builtins.list[Any]:
        items: builtins.list[Any] = []
        token = ""
        while True:
            resp = self._call(call, request_type(page_size=1000, page_token=token))
            items += list(getattr(resp, field))
            token = resp.next_page_token
            if not token:
                return items

    # -- uploads (no plan reads the server's disk) -----------------------------------------
    def upload(self, data: str | Path | bytes, kind: str = "image", *, media_type: str = "",
               timeout_s: float | None = None) -> Blob:
        """Upload a file (path) or bytes as a blob of ``kind`` ("image", "manifest", "model",
        "archive": a tar or .tar.gz of a dataset), streamed in 1 MiB chunks with its declared
        size and SHA-256 (the server checks both). Uploading the same content again returns
        the same blob (``already_existed``)."""
        if kind not in _BLOB_KINDS:
            raise InvalidArgument("kind", f"one of {', '.join(_BLOB_KINDS)}")
        if isinstance(data, bytes | bytearray):
            blob = bytes(data)
            size, digest = len(blob), hashlib.sha256(blob).hexdigest()

            def chunks() -> Iterator[bytes]:
                for i in range(0, len(blob), UPLOAD_CHUNK_BYTES):
                    yield blob[i:i + UPLOAD_CHUNK_BYTES]
        else:
            path = Path(data)
            h = hashlib.sha256()
            size = 0
            with path.open("rb") as f:
                while piece := f.read(UPLOAD_CHUNK_BYTES):
                    h.update(piece)
                    size += len(piece)
            digest = h.hexdigest()

            def chunks() -> Iterator[bytes]:
                with path.open("rb") as f:
                    while piece := f.read(UPLOAD_CHUNK_BYTES):
                        yield piece

        def requests() -> Iterator[Any]:
            yield up_pb.UploadBlobRequest(header=up_pb.UploadHeader(
                kind=_BLOB_KINDS[kind], size=size, media_type=media_type,
                expected_sha256=f"sha256:{digest}"))
            for c in chunks():
                yield up_pb.UploadBlobRequest(chunk=c)

        try:
            resp = self._uploads.UploadBlob(requests(), metadata=self._md,
                                            timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return Blob.from_proto(resp.blob, resp.already_existed)

    def upload_folder(self, folder: str | Path, *, timeout_s: float | None = None) -> Blob:
        """Pack a dataset folder (COCO, VOC, class folders, a Hugging Face ``save_to_disk``
        folder) into a tar as it is sent and upload it as an ``archive``; nothing is written to
        disk. Members are named under the folder's name (``coco/ann.json``), so a plan reads
        ``dataset: {source: coco, path: coco/ann.json, store: {upload: <blob_id>}}``. The tar
        is reproducible: the same folder gives the same blob id."""
        entries = folder_entries(Path(folder))
        size, digest = tar_digest(entries)

        def requests() -> Iterator[Any]:
            yield up_pb.UploadBlobRequest(header=up_pb.UploadHeader(
                kind=up_pb.BLOB_KIND_ARCHIVE, size=size, media_type="application/x-tar",
                expected_sha256=f"sha256:{digest}"))
            for c in tar_chunks(entries, UPLOAD_CHUNK_BYTES):
                yield up_pb.UploadBlobRequest(chunk=c)

        try:
            resp = self._uploads.UploadBlob(requests(), metadata=self._md,
                                            timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return Blob.from_proto(resp.blob, resp.already_existed)

    def get_blob(self, blob_id: str) -> Blob:
        """An uploaded blob's metadata (NotFound for an unknown or another tenant's id)."""
        return Blob.from_proto(self._call(self._uploads.GetBlob,
                                          up_pb.GetBlobRequest(blob_id=blob_id)).blob)

    def list_blobs(self, kind: str = "", page_size: int = 100,
                   page_token: str = "") -> Page[Blob]:
        """One page of the tenant's blobs, newest first (``kind`` filters)."""
        resp = self._call(self._uploads.ListBlobs, up_pb.ListBlobsRequest(
            page_size=page_size, page_token=page_token,
            kind=_BLOB_KINDS.get(kind, up_pb.BLOB_KIND_UNSPECIFIED)))
        return Page([Blob.from_proto(b) for b in resp.blobs], resp.next_page_token)

    def delete_blob(self, blob_id: str) -> Blob:
        """Delete an uploaded blob."""
        return Blob.from_proto(self._call(self._uploads.DeleteBlob,
                                          up_pb.DeleteBlobRequest(blob_id=blob_id)).blob)

    def perturbations(self) -> builtins.list[Perturbation]:
        """The perturbation catalogue: corruptions, styles, degradation operators, properties."""
        return [Perturbation.from_proto(p) for p in self._all_pages(
            self._perturbation.ListPerturbations, perturbation_pb2.ListPerturbationsRequest,
            "perturbations")]

    def attacks(self) -> builtins.list[Attack]:
        """The attack registry (transfer, score- and decision-based)."""
        return [Attack.from_proto(a) for a in self._all_pages(
            self._perturbation.ListAttacks, perturbation_pb2.ListAttacksRequest, "attacks")]

    def targets(self) -> builtins.list[Target]:
        """The targets the proxy serves."""
        return [Target.from_proto(t) for t in self._all_pages(
            self._proxy.ListTargets, proxy_pb2.ListTargetsRequest, "targets")]
