"""API keys hashed at rest and in memory, key files and their reload (transport
security: keys loaded from a file or secret and stored hashed, rotation without restart;
SPEC section 0: many tenants on one Fortis).

Pure code, real files: parsing of both formats (errors name the line, never quote it),
lookups, several keys per tenant, the watcher's reload on change (rewrite, atomic rename,
Kubernetes-style symlink swap), a malformed or missing file keeping the previous keys, an
empty file revoking them all, the ``fortis keys`` command, and that no plain key is reachable from the key table.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fortis.infra.serving.api_keys import (
    KeyEntry,
    KeyFileWatcher,
    KeyTable,
    hash_api_key,
    key_file_line,
    load_key_file,
    new_api_key,
    parse_api_keys,
    parse_key_file,
)
from fortis.services.common.errors import InvalidArgument


def _line(tenant: str, key: str) -> str:
    """A key-file line computed here from hashlib (not by the code under test)."""
    return f"{tenant} sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def _write_atomic(path: Path, text: str | bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(text if isinstance(text, bytes) else text.encode())
    os.replace(tmp, path)


# -- formats -----------------------------------------------------------------------------------

def test_hash_and_line_match_sha256() -> None:
    key = new_api_key()
    assert hash_api_key(key) == "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    assert key_file_line("team-a", key) == _line("team-a", key)
    with pytest.raises(InvalidArgument) as exc:
        key_file_line("bad tenant", key)
    assert exc.value.violations[0].field == "tenant"


def test_new_keys_are_distinct_and_long() -> None:
    keys = {new_api_key() for _ in range(200)}
    assert len(keys) == 200
    assert all(k.startswith("fk_") and len(k) >= 35 for k in keys)


def test_parse_plain_keys_hashes_them_right_away() -> None:
    entries = parse_api_keys("k1=tenant-a, k2=tenant-b,,k3==x=tenant-a")
    assert [e.tenant for e in entries] == ["tenant-a", "tenant-b", "tenant-a"]
    assert entries[0].digest == hashlib.sha256(b"k1").digest()
    # The key is everything before the last '=' (base64 padding stays in the key).
    assert entries[2].digest == hashlib.sha256(b"k3==x").digest()
    assert all(isinstance(e.digest, bytes) and len(e.digest) == 32 for e in entries)


@pytest.mark.parametrize("text,why", [
    ("secret-key-no-tenant", "entry 1 is not KEY=TENANT"),
    ("ok=t,=tenant", "entry 2 is not KEY=TENANT"),
    ("secret-key=bad tenant!", "entry 1: a tenant name"),
    ("x" * 600 + "=t", "longer than 512"),
])
def test_parse_plain_keys_errors_never_quote_the_key(text: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        parse_api_keys(text, "FORTIS_API_KEYS")
    v = exc.value.violations[0]
    assert v.field == "FORTIS_API_KEYS" and why in v.description
    assert "secret-key" not in str(exc.value) and "xxxxxxxx" not in str(exc.value)


def test_parse_key_file_comments_blank_lines_and_several_keys_per_tenant() -> None:
    k1, k2, k3 = (new_api_key() for _ in range(3))
    text = f"# rotated 2026-11\n\n{_line('tenant-a', k1)}\n  {_line('tenant-a', k2)}  \n" \
           f"{_line('tenant-b', k3).upper().replace('SHA256:', 'sha256:').replace('TENANT-B', 'tenant-b')}\n"
    entries = parse_key_file(text)
    assert [e.tenant for e in entries] == ["tenant-a", "tenant-a", "tenant-b"]
    assert entries[2].digest == hashlib.sha256(k3.encode()).digest()   # upper-case hex accepted


@pytest.mark.parametrize("bad_line,why", [
    ("tenant-a", "expected 'TENANT sha256:<hex>'"),
    ("tenant-a sha256:abc extra", "expected 'TENANT sha256:<hex>'"),
    ("tenant-a fk_plainKeyPastedByMistake", "sha256:<64 hex digits>"),
    ("tenant-a sha256:" + "0" * 63, "sha256:<64 hex digits>"),
    ("tenant-a md5:" + "0" * 64, "sha256:<64 hex digits>"),
    ("ten/ant sha256:" + "0" * 64, "a tenant name"),
    ("* sha256:" + "0" * 64, "a tenant name"),       # the internal tenant is never in a file
    (_line("tenant-a", "k"), "already given to another tenant"),   # tenant-b holds it
])
def test_parse_key_file_names_the_line_never_its_text(bad_line: str, why: str) -> None:
    good = _line("tenant-b", "k")
    with pytest.raises(InvalidArgument) as exc:
        parse_key_file(f"# header\n{good}\n{bad_line}\n")
    v = exc.value.violations[0]
    assert v.field == "api_keys_file" and v.description.startswith("line 3:") and why in v.description
    assert "fk_plainKey" not in str(exc.value)


def test_key_file_without_keys_holds_none(tmp_path: Path) -> None:
    # Emptying the file is how an operator revokes every key: no key, not an error.
    assert parse_key_file("") == [] and parse_key_file("# only a comment\n\n") == []
    big = tmp_path / "big"
    big.write_bytes(b"#" * (4 * 1024 * 1024 + 1))
    with pytest.raises(InvalidArgument, match="larger than"):
        load_key_file(big)
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_key_file(tmp_path / "missing")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidArgument, match="not UTF-8"):
        load_key_file(binary)


# -- the table ---------------------------------------------------------------------------------

def test_table_lookup_sources_and_enabled() -> None:
    assert not KeyTable().enabled and not KeyTable.from_plain({}).enabled
    a1, a2, b1 = "key-a1", "key-a2", "key-b1"
    table = KeyTable.from_plain({a1: "tenant-a", b1: "tenant-b"})
    assert table.enabled
    assert table.tenant_of(a1) == "tenant-a" and table.tenant_of(b1) == "tenant-b"
    assert table.tenant_of("") == "" and table.tenant_of("key-a") == "" and table.tenant_of(a1 + " ") == ""
    assert table.tenant_of("x" * 10_000) == ""
    table.set_source("file", parse_key_file(_line("tenant-a", a2)))
    assert table.tenant_of(a2) == "tenant-a" and table.tenant_of(a1) == "tenant-a"
    table.add_key("internal", "svc", "*")
    assert table.tenant_of("svc") == "*"
    assert table.tenants() == frozenset({"tenant-a", "tenant-b"})      # '*' is not a tenant
    table.set_source("file", parse_key_file(_line("tenant-c", "key-c")))  # replaced as a whole
    assert table.tenant_of(a2) == "" and table.tenant_of("key-c") == "tenant-c"
    assert table.tenants() == frozenset({"tenant-a", "tenant-b", "tenant-c"})
    assert len(table) == 4


def _reachable(root: object) -> list[object]:
    """Every object reachable from ``root`` through the garbage collector's referents."""
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
        if isinstance(obj, dict):             # a str-keyed dict does not report its keys
            todo.extend(obj.keys())
        if hasattr(obj, "__dict__") and not callable(obj):
            todo.append(vars(obj))
    return list(seen.values())


def test_no_plain_key_is_reachable_from_the_table(tmp_path: Path) -> None:
    plain = {new_api_key(): "tenant-a", new_api_key(): "tenant-b"}
    file_key = new_api_key()
    key_file = tmp_path / "keys"
    key_file.write_text(_line("tenant-c", file_key) + "\n")
    table = KeyTable.from_plain(plain)
    table.set_source("cli", parse_api_keys(",".join(f"{k}={t}" for k, t in plain.items())))
    watcher = KeyFileWatcher(key_file, table, interval_s=0).start()
    assert table.tenant_of(file_key) == "tenant-c"
    assert all(table.tenant_of(k) == t for k, t in plain.items())    # the lookups did happen
    objects = _reachable(table) + _reachable(watcher)
    texts = [o for o in objects if isinstance(o, str | bytes | bytearray)]
    assert texts, "the walk found no strings at all"
    for key in [*plain, file_key]:
        for o in texts:
            found = key in o if isinstance(o, str) else key.encode() in o
            assert not found, "a plain key is reachable from the key table"
    # What the table holds per key: a tenant and a 32-byte digest, nothing else.
    assert all(isinstance(e, KeyEntry) and len(e.digest) == 32 for e in table.entries())
    assert "digest" not in repr(table.entries()) and "sha256" not in repr(table)


# -- the watcher -------------------------------------------------------------------------------

def test_watcher_reloads_on_change_and_keeps_keys_on_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "api-keys"
    path.write_text(_line("tenant-a", "old") + "\n")
    table = KeyTable()
    watcher = KeyFileWatcher(path, table, interval_s=0).start()
    assert table.tenant_of("old") == "tenant-a" and watcher.reloads == 1
    assert watcher.check() is False                      # unchanged: not re-read

    _write_atomic(path, f"{_line('tenant-a', 'old')}\n{_line('tenant-a', 'new')}\n")  # overlap
    assert watcher.check() is True
    assert table.tenant_of("old") == table.tenant_of("new") == "tenant-a"

    _write_atomic(path, _line("tenant-a", "new") + "\n")                # old key removed
    assert watcher.check() is True
    assert table.tenant_of("old") == "" and table.tenant_of("new") == "tenant-a"

    for bad in ("tenant-a sha256:nothex\n", "tenant-a\n", b"tenant-a \xff\n"):
        _write_atomic(path, bad)
        assert watcher.check() is False
        assert table.tenant_of("new") == "tenant-a", f"keys lost after bad file {bad!r}"
    assert watcher.failures == 3

    path.unlink()                                                        # deleted: keep
    assert watcher.check() is False and table.tenant_of("new") == "tenant-a"
    path.write_text(_line("tenant-b", "newer") + "\n")                    # back: loaded
    assert watcher.check() is True
    assert table.tenant_of("newer") == "tenant-b" and table.tenant_of("new") == ""

    # In-place rewrite (same inode) of a different size is seen too; reload() forces.
    path.write_text(_line("tenant-b", "newer") + "\n# rotated\n")
    assert watcher.check() is True
    assert watcher.reload() is True

    # Emptied (or comments only): every key of the file revoked, not kept.
    before = watcher.last_success_time
    _write_atomic(path, "# access withdrawn\n")
    assert watcher.check() is True and watcher.failures == 4      # 3 bad files + 1 deleted
    assert table.tenant_of("newer") == "" and table.source("file") == ()
    assert watcher.last_success_time >= before > 0


def test_watcher_follows_a_kubernetes_secret_symlink_swap(tmp_path: Path) -> None:
    """A Secret volume: keys -> ..data/keys, ..data -> ..<timestamp>; an update writes a new
    timestamped folder and renames a new ..data symlink over the old one."""
    mount = tmp_path / "secret"
    mount.mkdir()

    def publish(version: str, text: str) -> None:
        folder = mount / f"..{version}"
        folder.mkdir()
        (folder / "keys").write_text(text)
        tmp_link = mount / "..data_tmp"
        tmp_link.symlink_to(folder.name)
        os.replace(tmp_link, mount / "..data")

    publish("v1", _line("tenant-a", "k1"))
    (mount / "keys").symlink_to("..data/keys")
    table = KeyTable()
    watcher = KeyFileWatcher(mount / "keys", table, interval_s=0).start()
    assert table.tenant_of("k1") == "tenant-a"
    publish("v2", _line("tenant-a", "k2"))
    assert watcher.check() is True
    assert table.tenant_of("k2") == "tenant-a" and table.tenant_of("k1") == ""


def test_watcher_thread_polls(tmp_path: Path) -> None:
    import time

    path = tmp_path / "keys"
    path.write_text(_line("tenant-a", "k1"))
    table = KeyTable()
    watcher = KeyFileWatcher(path, table, interval_s=0.05).start()
    try:
        _write_atomic(path, _line("tenant-a", "k2"))
        deadline = time.monotonic() + 5
        while table.tenant_of("k2") != "tenant-a" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert table.tenant_of("k2") == "tenant-a" and table.tenant_of("k1") == ""
    finally:
        watcher.close()
    assert watcher._thread is not None and not watcher._thread.is_alive()


def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("tenant-a not-a-hash\n")
    with pytest.raises(InvalidArgument) as exc:
        KeyFileWatcher(path, KeyTable(), interval_s=0).start()
    assert exc.value.violations[0].field == "api_keys_file"


# -- fortis keys -------------------------------------------------------------------------------

@pytest.fixture()
def restore_logging() -> Iterator[None]:
    """``fortis.server.cli.main`` points structlog at this test's captured stderr, which closes
    when the test ends: later tests' log lines must not go there."""
    import structlog

    old = structlog.get_config()
    yield
    structlog.configure(**old)


def test_fortis_keys_new_prints_a_key_and_the_line_that_admits_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        restore_logging: None) -> None:
    import io

    from fortis.server.cli.main import main

    assert main(["keys", "new", "--tenant", "team-x", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tenant"] == "team-x" and out["line"] == _line("team-x", out["api_key"])
    table = KeyTable({"file": parse_key_file(out["line"])})
    assert table.tenant_of(out["api_key"]) == "team-x"

    assert main(["keys", "new", "--tenant", "team-y"]) == 0
    text = capsys.readouterr().out
    key = text.split(": ")[1].split()[0]
    assert _line("team-y", key) in text

    monkeypatch.setattr("sys.stdin", io.StringIO(key + "\n"))
    assert main(["keys", "hash", "--tenant", "team-z"]) == 0
    assert capsys.readouterr().out.strip() == _line("team-z", key)
    assert main(["keys", "new", "--tenant", "no spaces"]) == 2
