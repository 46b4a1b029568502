"""TLS for clients and mTLS between services (``--tls-cert``, ``--tls-key``, ``--tls-ca``;
SPEC section 0: one shared Fortis, many tenants).

Pure code (no gRPC): the settings, reading and checking the PEM files, and noticing when they
change. ``server.py`` turns them into gRPC credentials (the server factory, ``channel()``).

- A server with :class:`TlsSettings` listens on a TLS port only (no plain-text port beside it).
  Its certificate, key and CA are re-read when one of the files changes, without a restart:
  gRPC asks :class:`PemReloader` before every new connection's handshake; files that
  do not load (a key that does not match its certificate, a half-written file) are refused
  and the previous ones stay in use. Connections already open keep their session.
- ``client_auth="require"``: every client must present a certificate signed by the CA
  (``ca_file``), or the handshake fails. grpcio's Python API has two modes only (no client
  certificate requested, or one required and verified), so there is no "optional" mode: a
  certificate that is asked for but not required could not be verified.
- The internal channels of a service (evaluation -> perturbation/scoring/report/proxy,
  perturbation -> proxy; embedded mode's loopback calls too) trust the CA and present the
  service's own certificate as client certificate (mTLS). They verify the name
  ``server_name`` when given, else the host they dial.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
from fortis.services.common import errors

__all__ = ["CLIENT_AUTH", "PemFiles", "PemReloader", "TlsSettings", "channel_options", "load_pem"]

log = structlog.get_logger("fortis.tls")

#: ``--tls-client-auth`` values: no client certificate asked, or one required from the CA.
CLIENT_AUTH = ("none", "require")
#: Largest certificate/key/CA file read (a long chain is a few tens of KB).
MAX_PEM_BYTES = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """A service's TLS identity and what it asks of its clients."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    client_auth: str = "none"
    #: The name internal channels verify in the other services' certificates (default: the
    #: host they dial), e.g. when certificates name a Kubernetes Service, not an address.
    server_name: str = ""

    def __post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH:
            raise errors.InvalidArgument("tls_client_auth", f"one of {', '.join(CLIENT_AUTH)}")
        if self.client_auth == "require" and self.ca_file is None:
            raise errors.InvalidArgument("tls_ca", "--tls-client-auth require needs --tls-ca "
                                         "(the CA that signs client certificates)")
        if len(self.server_name) > 253:
            raise errors.InvalidArgument("tls_server_name", "longer than 253 characters")


@dataclass(frozen=True, repr=False)
class PemFiles:
    """The contents of the three files (``repr`` hides them: a private key)."""

    cert: bytes
    key: bytes
    ca: bytes | None


def _read(path: Path, field: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise errors.InvalidArgument(field, f"cannot read '{str(path)[:200]}': "
                                     f"{exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_PEM_BYTES:
        raise errors.InvalidArgument(field, f"'{str(path)[:200]}' is larger than {MAX_PEM_BYTES} bytes")
    return data


def load_pem(tls: TlsSettings) -> PemFiles:
    """Read the three files and check they are usable (the key matches the certificate, the
    CA parses) with the ``ssl`` module before gRPC sees them; InvalidArgument naming the
    setting otherwise (never the key's content)."""
    pem = PemFiles(_read(tls.cert_file, "tls_cert"), _read(tls.key_file, "tls_key"),
               _read(tls.ca_file, "tls_ca") if tls.ca_file is not None else None)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError, ValueError):
        raise errors.InvalidArgument("tls_cert", "the certificate and key do not load as a "
                                     "PEM pair (is the key the certificate's?)") from None
    if pem.ca is not None:
        try:
            ctx.load_verify_locations(cadata=pem.ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            raise errors.InvalidArgument("tls_ca", "the CA file holds no PEM certificate") from None
    return pem


def _signature(tls: TlsSettings) -> tuple[tuple[int, int, int, int] | None, ...]:
    out = []
    for p in (tls.cert_file, tls.key_file, tls.ca_file):
        try:
            st = os.stat(p) if p is not None else None
        except OSError:
            st = None
        out.append(None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class PemReloader:
    """Called before each new connection's handshake (gRPC's certificate configuration
    fetcher, wrapped in ``server.py``): new :class:`PemFiles` when a file changed and the new
    set loads, else None (keep the current one). A stat of three files per new connection;
    no work per call. Never raises (it runs inside gRPC's handshake)."""

    def __init__(self, tls: TlsSettings) -> None:
        self.tls = tls
        self._sig = _signature(tls)
        self.initial = load_pem(tls)
        self.reloads = 0
        self._lock = threading.Lock()

    def __call__(self) -> PemFiles | None:
        try:
            sig = _signature(self.tls)
            with self._lock:
                if sig == self._sig:
                    return None
                self._sig = sig
                try:
                    pem = load_pem(self.tls)
                except errors.InvalidArgument as exc:
                    log.error("tls_reload_failed", reason=exc.message[:200])
                    return None
                self.reloads += 1
            log.info("tls_reloaded", reloads=self.reloads)
            return pem
        except Exception:  # noqa: BLE001 - never break a handshake; keep the current files
            log.error("tls_reload_failed", reason="unexpected error")
            return None


def channel_options(tls: TlsSettings) -> list[tuple[str, str]]:
    """Channel options for ``tls``: the name to verify when it is not the dialed host."""
    return [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
