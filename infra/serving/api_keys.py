"""API keys, hashed at rest and in memory, and rotated without a restart (keys are loaded
from a file or a Kubernetes secret; SPEC section 0: one Fortis per organisation, many
tenants).

Pure code, no gRPC (the interceptor that asks :class:`KeyTable` who a caller is lives in
``server.py``):

- A key is only ever kept as ``sha256(key)``: :func:`parse_api_keys` (the ``KEY=TENANT`` demo
  format of ``--api-key`` / ``$FORTIS_API_KEYS``) hashes each key as it reads it; a key file
  holds hashes only (``TENANT sha256:<hex>`` per line, :func:`parse_key_file`). A lookup hashes
  the presented key, finds the digest in an index and confirms it with ``hmac.compare_digest``
  (the index is keyed by SHA-256 digests, which a caller cannot steer, so its timing tells
  nothing about stored keys; about 2 us per call with 10 or 10,000 keys).
- :class:`KeyTable` holds named sources of entries (the command line, the key file, the
  internal service key); each source is replaced as a whole by one reference assignment, so
  a lookup sees either the old or the new set, never a mix, and needs no lock.
- :class:`KeyFileWatcher` re-reads the key file when it changes (device, inode, size or
  mtime; a Kubernetes secret update swaps a symlink, which changes the inode), on a poll or
  on demand (SIGHUP). What a file means is stated here and in the README ("Security
  model"), and tested against a real server:

  * a file with no key lines (empty, or comments and blank lines only) **revokes every key
    it held**: emptying the file is how an operator cuts all access at once, so it must
    work, not be mistaken for an accident;
  * a file that does not parse (a bad line, not UTF-8, too large), or that cannot be read
    (deleted, unreadable), is refused as a whole and **the last good keys stay in force**:
    a half-written or mistyped file must not lock every tenant out. The error is logged
    (``api_keys_reload_failed``, with the line number, never a key or a hash) and counted
    (``fortis_api_keys_reload_errors_total``; ``fortis_api_keys_last_reload_success_
    timestamp_seconds`` stops moving), so an alert can fire.

Several keys per tenant are allowed (old and new overlap during a rotation).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from fortis.services.common import errors

__all__ = ["KeyEntry", "KeyFileCollector", "KeyFileWatcher", "KeyTable", "hash_api_key", "key_file_line",
           "load_key_file", "new_api_key", "parse_api_keys", "parse_key_file"]

log = structlog.get_logger("fortis.api_keys")

#: Prefix of a stored key digest (the only hash the file format knows).
HASH_PREFIX = "sha256:"
#: A tenant name: the charset of tenants everywhere else (target allow-lists, namespaces).
TENANT_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
#: Largest key file read (a million tenants' lines would be ~80 MB; 4 MiB is ~50k lines).
MAX_KEY_FILE_BYTES = 4 * 1024 * 1024
#: Longest key accepted on the command line (a generated key is 35 characters).
MAX_KEY_CHARS = 512


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One key as the server keeps it: its tenant and the SHA-256 digest of the key.

    ``repr`` shows the tenant only, so no log line or traceback prints a digest."""

    tenant: str
    digest: bytes

    def __repr__(self) -> str:
        return f"KeyEntry(tenant={self.tenant!r})"


def new_api_key() -> str:
    """A new random key (192 bits)."""
    return "fk_" + secrets.token_urlsafe(24)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def hash_api_key(key: str) -> str:
    """``sha256:<hex>`` of ``key``: what a key file stores."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_file_line(tenant: str, key: str) -> str:
    """The key-file line of ``key`` for ``tenant`` (``TENANT sha256:<hex>``)."""
    if not TENANT_RE.fullmatch(tenant):
        raise errors.InvalidArgument("tenant", "a tenant name is 1-64 letters, digits, "
                                     "'-', '_' or '.'")
    return f"{tenant} {hash_api_key(key)}"


def parse_api_keys(text: str, field: str = "api_keys") -> list[KeyEntry]:
    """Parse ``"key1=tenantA,key2=tenantB"`` (``--api-key`` / ``$FORTIS_API_KEYS``, the demo
    format) into hashed entries: the plain keys are not kept. ``field`` names the setting in
    errors, which never quote the entry (it holds a key)."""
    entries: list[KeyEntry] = []
    for n, part in enumerate(filter(None, (p.strip() for p in text.split(","))), 1):
        key, sep, tenant = part.rpartition("=")
        if not sep or not key or not tenant:
            raise errors.InvalidArgument(field, f"entry {n} is not KEY=TENANT")
        if len(key) > MAX_KEY_CHARS:
            raise errors.InvalidArgument(field, f"entry {n}: key longer than {MAX_KEY_CHARS}")
        if not TENANT_RE.fullmatch(tenant):
            raise errors.InvalidArgument(field, f"entry {n}: a tenant name is 1-64 letters, "
                                         "digits, '-', '_' or '.'")
        entries.append(KeyEntry(tenant, _digest(key)))
    return entries


def parse_key_file(text: str, field: str = "api_keys_file") -> list[KeyEntry]:
    """Parse a key file: one ``TENANT sha256:<64 hex>`` per line; blank lines and lines
    starting with ``#`` are ignored, so a file of comments only holds no key (every key
    revoked). Raises InvalidArgument naming the first bad line by number (never its text: it
    may be a key pasted by mistake)."""
    entries: list[KeyEntry] = []
    seen: dict[bytes, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise errors.InvalidArgument(field, f"line {n}: expected 'TENANT sha256:<hex>'")
        tenant, hashed = parts
        if not TENANT_RE.fullmatch(tenant):
            raise errors.InvalidArgument(field, f"line {n}: a tenant name is 1-64 letters, "
                                         "digits, '-', '_' or '.'")
        if not hashed.startswith(HASH_PREFIX) or not _HEX64.fullmatch(hashed[len(HASH_PREFIX):]):
            raise errors.InvalidArgument(field, f"line {n}: the key must be given as "
                                         "sha256:<64 hex digits> (`fortis keys new` prints it)")
        digest = bytes.fromhex(hashed[len(HASH_PREFIX):])
        if seen.setdefault(digest, tenant) != tenant:
            raise errors.InvalidArgument(field, f"line {n}: this key is already given to "
                                         "another tenant")
        entries.append(KeyEntry(tenant, digest))
    return entries


def load_key_file(path: Path, field: str = "api_keys_file") -> list[KeyEntry]:
    """Read and parse a key file (bounded read; not-found and too-large are errors)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise errors.InvalidArgument(field, f"cannot read the key file: "
                                     f"{exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise errors.InvalidArgument(field, f"the key file is larger than {MAX_KEY_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.InvalidArgument(field, "the key file is not UTF-8 text") from None
    return parse_key_file(text, field)


class KeyTable:
    """Who holds which key: named sources of hashed entries, looked up by digest.

    ``enabled`` is False only for a table built with no source at all (auth off, the
    single-user local mode); a table with a key file stays enabled whatever the file holds."""

    def __init__(self, sources: Mapping[str, Iterable[KeyEntry]] | None = None) -> None:
        self._sources: dict[str, tuple[KeyEntry, ...]] = {}
        self._all: tuple[KeyEntry, ...] = ()
        self._tenants: frozenset[str] = frozenset()
        self._index: dict[bytes, KeyEntry] = {}
        self._lock = threading.Lock()      # writers only; readers use the current tuple
        for name, entries in (sources or {}).items():
            self.set_source(name, entries)

    @classmethod
    def from_plain(cls, keys: Mapping[str, str], source: str = "static") -> KeyTable:
        """A table from ``{key: tenant}`` (tests, the embedded runs), hashed right away."""
        return cls({source: [KeyEntry(t, _digest(k)) for k, t in keys.items()]} if keys else None)

    @property
    def enabled(self) -> bool:
        return bool(self._sources)

    def set_source(self, name: str, entries: Iterable[KeyEntry]) -> None:
        """Replace one source's entries (all at once: a lookup sees old or new, never both)."""
        with self._lock:
            self._sources[name] = tuple(entries)
            self._all = tuple(e for es in self._sources.values() for e in es)
            self._tenants = frozenset(e.tenant for e in self._all if e.tenant != "*")
            index: dict[bytes, KeyEntry] = {}
            for e in self._all:             # the first source holding a digest wins
                index.setdefault(e.digest, e)
            self._index = index

    def add_key(self, name: str, key: str, tenant: str) -> None:
        """Add a plain key (hashed here) to source ``name``; the internal service key."""
        with self._lock:
            current = self._sources.get(name, ())
        self.set_source(name, (*current, KeyEntry(tenant, _digest(key))))

    def entries(self) -> tuple[KeyEntry, ...]:
        return self._all

    def tenants(self) -> frozenset[str]:
        """The tenants holding a key now (the internal ``*`` excluded)."""
        return self._tenants

    def source(self, name: str) -> tuple[KeyEntry, ...]:
        return self._sources.get(name, ())

    def tenant_of(self, key: str) -> str:
        """The tenant of ``key``, or "" when no entry matches."""
        if not key or len(key) > MAX_KEY_CHARS:
            return ""
        digest = _digest(key)
        entry = self._index.get(digest)
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            return ""
        return entry.tenant

    def __len__(self) -> int:
        return len(self._all)

    def __repr__(self) -> str:
        return f"KeyTable({len(self._all)} keys, sources={sorted(self._sources)})"


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)          # follows symlinks: a secret update swaps the target
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class KeyFileWatcher:
    """Keeps source ``source`` of ``table`` equal to the key file at ``path``.

    :meth:`start` loads the file (a bad file at start is an error: the server does not start)
    and polls it every ``interval_s`` seconds in a daemon thread; :meth:`check` reloads when
    the file changed and :meth:`reload` unconditionally (SIGHUP). A file without keys
    revokes them all (``api_keys_revoked_all``, a warning); a reload that fails keeps the
    previous entries, logs ``api_keys_reload_failed`` and counts in ``failures`` (exported
    by :class:`KeyFileCollector`)."""

    def __init__(self, path: Path, table: KeyTable, *, source: str = "file",
                 interval_s: float = 2.0) -> None:
        self.path = Path(path)
        self.table = table
        self.source = source
        self.interval_s = interval_s
        self.reloads = 0            # successful loads, the first included
        self.failures = 0
        #: Wall-clock time of the last successful load (0 before the first).
        self.last_success_time = 0.0
        self._sig: tuple[int, int, int, int] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> KeyFileWatcher:
        self._sig = _signature(self.path)
        entries = load_key_file(self.path)
        self.table.set_source(self.source, entries)
        self.reloads += 1
        self.last_success_time = time.time()
        if entries:
            log.info("api_keys_loaded", keys=len(entries),
                     tenants=len({e.tenant for e in entries}))
        else:
            log.warning("api_keys_revoked_all", reason="the key file holds no key")
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="api-key-file-watcher",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive any surprise
                log.error("api_keys_reload_failed", reason="unexpected error")

    def check(self) -> bool:
        """Reload when the file's signature changed; True when new keys are in force."""
        sig = _signature(self.path)
        if sig == self._sig:
            return False
        return self._load(sig)

    def reload(self) -> bool:
        """Reload now, whatever the signature (SIGHUP)."""
        return self._load(_signature(self.path))

    def _load(self, sig: tuple[int, int, int, int] | None) -> bool:
        with self._lock:
            self._sig = sig
            try:
                entries = load_key_file(self.path)
            except errors.InvalidArgument as exc:
                self.failures += 1
                log.error("api_keys_reload_failed", reason=exc.message[:200],
                          kept_keys=len(self.table.source(self.source)))
                return False
            self.table.set_source(self.source, entries)
            self.reloads += 1
            self.last_success_time = time.time()
            if entries:
                log.info("api_keys_reloaded", keys=len(entries),
                         tenants=len({e.tenant for e in entries}))
            else:
                log.warning("api_keys_revoked_all", reason="the key file holds no key")
            return True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


class KeyFileCollector:
    """Prometheus view of a :class:`KeyFileWatcher` (registered on the stack's registry):
    refused reloads, the time of the last good one and the keys the file holds now. A
    collector reads the watcher when scraped, so the watcher needs no registry."""

    def __init__(self, watcher: KeyFileWatcher) -> None:
        self._watcher = watcher

    def collect(self) -> Iterable[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        w = self._watcher
        yield CounterMetricFamily(
            "fortis_api_keys_reload_errors",
            "Reloads of the API key file refused (bad line, unreadable); the last good keys "
            "stay in force", value=w.failures)
        yield GaugeMetricFamily(
            "fortis_api_keys_last_reload_success_timestamp_seconds",
            "Unix time of the last successful load of the API key file",
            value=w.last_success_time)
        yield GaugeMetricFamily(
            "fortis_api_keys_file_keys", "Keys in force from the API key file",
            value=len(w.table.source(w.source)))
