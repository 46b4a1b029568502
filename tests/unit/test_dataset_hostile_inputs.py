"""Hostile data owners against the kept-dataset readers: WebDataset shards whose headers make
tarfile read, recurse or remember without bound, names that are not UTF-8, and Arrow streams
read from a store that is not memory-mapped (as from S3). Each is refused with an error naming
the plan field and the shard (or Arrow file), with memory bounded while it is read."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation import dataset_hf
from fortis.services.evaluation.dataset_sources import read_samples
from fortis.services.evaluation.dataset_store import LocalStore

from tests import dataset_builders as build
from tests.unit.test_dataset_streams import _plan, _refused


def _peak(fn: Any) -> tuple[BaseException | None, int]:
    """What ``fn`` raised (None if nothing) and the peak of Python allocations meanwhile."""
    tracemalloc.start()
    try:
        fn()
        err: BaseException | None = None
    except Exception as exc:  # noqa: BLE001 - the caller checks what was raised
        err = exc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, peak


def _wds(tmp_path: Path, name: str) -> Any:
    return _plan({"source": "webdataset", "path": f"w/{name}"})


def _header(kind: bytes, size: int) -> bytes:
    ti = tarfile.TarInfo("././@LongLink" if kind != tarfile.XHDTYPE else "././@PaxHeader")
    ti.type, ti.size = kind, size
    return ti.tobuf(format=tarfile.USTAR_FORMAT)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_gzip_bomb_in_an_extended_header_is_refused_before_it_is_read(tmp_path, kind):
    """A pax header (or GNU long name) declaring 64 MiB, 64 KiB once gzipped: tarfile would
    read it whole into memory (a few MB of gzip can declare gigabytes)."""
    (tmp_path / "w").mkdir()
    size = 64 * 1024 * 1024
    with gzip.open(tmp_path / "w" / "bomb.tar.gz", "wb", compresslevel=9) as g:
        g.write(_header(kind, size))
        zeros = bytes(1 << 20)
        for _ in range(size >> 20):
            g.write(zeros)
    plan = _wds(tmp_path, "bomb.tar.gz")
    err, peak = _peak(lambda: read_samples(plan, LocalStore(tmp_path)))
    assert isinstance(err, InvalidArgument), err
    assert err.violations[0].field == "dataset.path:w/bomb.tar.gz", err.message
    assert "extended header" in err.message, err.message
    assert peak < 16 * 1024 * 1024, peak


def test_chained_extended_headers_are_bounded_not_a_recursion_error(tmp_path):
    """tarfile follows each pax header into the next recursively: 3000 of them overflowed the
    stack (an uncaught RecursionError, INTERNAL)."""
    raw = io.BytesIO()
    rec = b"20 comment=xxxxxxxx\n"
    for _ in range(3000):
        raw.write(_header(tarfile.XHDTYPE, len(rec)) + rec.ljust(512, b"\0"))
    with tarfile.open(fileobj=raw, mode="w") as tf:
        build.add(tf, "a.png", build.png(3))
        build.add(tf, "a.cls", b"1")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "chain.tar").write_bytes(raw.getvalue())
    _refused(
        lambda: read_samples(_wds(tmp_path, "chain.tar"), LocalStore(tmp_path)),
        "dataset.path:w/chain.tar",
        "chained extended headers",
    )


def test_global_pax_records_are_bounded(tmp_path):
    """Global pax headers accumulate for every later member; each is small, together not
    (and tarfile copies them into each member, quadratic time)."""
    (tmp_path / "w").mkdir()
    with tarfile.open(tmp_path / "w" / "g.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        for k in range(20):
            ti = tarfile.TarInfo(f"g{k}")
            ti.type = tarfile.XGLTYPE
            buf = tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
                {f"k{k}": "x" * 8000}, tarfile.XGLTYPE, "utf-8"
            )
            tf.fileobj.write(buf)  # type: ignore[union-attr]
            tf.offset += len(buf)
            build.add(tf, f"a.t{k}", b"")  # a member between: no chain of headers
        build.add(tf, "a.png", build.png(3))
        build.add(tf, "a.cls", b"1")
    _refused(
        lambda: read_samples(_wds(tmp_path, "g.tar"), LocalStore(tmp_path)),
        "dataset.path:w/g.tar",
        "global pax headers",
    )


def test_headers_read_are_not_kept_for_the_whole_shard(tmp_path):
    """A stream's TarFile keeps every TarInfo (with its pax records) it has read: 4000 members
    of pax records: 1500 of 16 KB, 70 KB gzipped, held 24 MB more, a million of them
    gigabytes. (Decompressing holds ~16 MB for a moment whatever the member count.)"""
    (tmp_path / "w").mkdir()
    with (
        gzip.open(tmp_path / "w" / "many.tar.gz", "wb") as g,
        tarfile.open(fileobj=g, mode="w", format=tarfile.PAX_FORMAT) as tf,
    ):
        build.add(tf, "a.png", build.png(3))
        build.add(tf, "a.cls", b"1")
        for _ in range(1500):
            ti = tarfile.TarInfo("a.txt")
            ti.pax_headers = {"comment": "x" * 16000}
            tf.addfile(ti, io.BytesIO(b""))
        build.add(tf, "b.png", build.png(3))
        build.add(tf, "b.cls", b"2")
    plan = _plan({"source": "webdataset", "path": "w/many.tar.gz", "offset": 1})
    out: list[Any] = []
    err, peak = _peak(lambda: out.extend(read_samples(plan, LocalStore(tmp_path))))
    assert err is None, err
    assert [(s.id, s.labels) for s in out] == [("b", (2,))]
    assert peak < 24 * 1024 * 1024, peak


def test_header_bytes_count_against_the_stream_budget(tmp_path, monkeypatch):
    """Empty members cost reading too: 100 headers are 51200 bytes of stream."""
    from fortis.services.evaluation import dataset_streams

    (tmp_path / "w").mkdir()
    with tarfile.open(tmp_path / "w" / "e.tar", "w") as tf:
        for k in range(100):
            build.add(tf, f"e{k}.txt", b"")
        build.add(tf, "a.png", build.png(3))
        build.add(tf, "a.cls", b"1")
    monkeypatch.setattr(dataset_streams, "MAX_STREAM_BYTES", 40_000)
    _refused(
        lambda: read_samples(
            _plan({"source": "webdataset", "path": "w/e.tar", "offset": 100}),
            LocalStore(tmp_path),
        ),
        "dataset.path:w/e.tar",
        "bytes of members",
    )


def test_negative_pax_size_is_refused_not_a_value_error(tmp_path):
    (tmp_path / "w").mkdir()
    with tarfile.open(tmp_path / "w" / "n.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("a.png")
        data = build.png(3)
        ti.size, ti.pax_headers = len(data), {"size": "-4096"}
        tf.addfile(ti, io.BytesIO(data))
        build.add(tf, "a.cls", b"1")
    _refused(
        lambda: read_samples(_wds(tmp_path, "n.tar"), LocalStore(tmp_path)),
        "dataset.path:w/n.tar:a.png",
        "negative sizes",
    )


def test_names_that_are_not_utf8_are_refused_not_internal(tmp_path):
    """Undecodable bytes in a member name, a file name or a COCO file_name escape become lone
    surrogates, which no gRPC message or report can encode (the evaluation failed INTERNAL)."""
    (tmp_path / "w").mkdir()
    with tarfile.open(
        tmp_path / "w" / "s.tar", "w", format=tarfile.GNU_FORMAT, encoding="latin-1"
    ) as tf:
        build.add(tf, "a\xff.png", build.png(3))
        build.add(tf, "a\xff.cls", b"1")
    msg = _refused(
        lambda: read_samples(_wds(tmp_path, "s.tar"), LocalStore(tmp_path)),
        "dataset.path:w/s.tar:a?.png",
        "UTF-8",
    )
    msg.encode("utf-8")
    (tmp_path / "pets" / "cat").mkdir(parents=True)
    (tmp_path / "pets" / "cat" / "1.png").write_bytes(build.png(1))
    os.makedirs(os.fsencode(tmp_path / "pets" / "dog"))
    with open(os.fsencode(tmp_path / "pets" / "dog") + b"/\xff.png", "wb") as f:
        f.write(build.png(2))
    msg = _refused(
        lambda: read_samples(_plan({"source": "folders", "path": "pets"}), LocalStore(tmp_path)),
        "dataset.path",
        "UTF-8",
    )
    msg.encode("utf-8")
    (tmp_path / "a\udcff.png".encode("utf-8", "surrogateescape").decode("latin-1")).write_bytes(
        build.png(1)
    )
    (tmp_path / "ann.json").write_text(
        json.dumps({"images": [{"id": 1, "file_name": "a\udcff.png"}], "categories": []}),
        encoding="utf-8",
    )
    from fortis.services.evaluation.dataset_formats import annotated_items

    msg = _refused(
        lambda: annotated_items(
            _plan({"source": "coco", "path": "ann.json"}, "detection"), LocalStore(tmp_path)
        ),
        "dataset.path:images[0].file_name",
        "UTF-8",
    )
    msg.encode("utf-8")


# -- Arrow (Hugging Face folders) ------------------------------------------------------------


class _Streamed(LocalStore):
    """The data root read as a stream, as an S3 object is (no memory map): the same reader
    path the S3 store takes, on a local file."""

    def local_path(self, ref: Path) -> Path | None:
        return None


def _hf_file(folder: Path, batches: list[Any], schema: Any) -> None:
    import pyarrow as pa

    folder.mkdir(parents=True, exist_ok=True)
    with (
        pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as f,
        pa.ipc.new_stream(f, schema) as w,
    ):
        for b in batches:
            w.write_batch(b)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))


def _rows(n: int, extra: str = "") -> Any:
    import pyarrow as pa

    cols = {
        "image": pa.array([{"bytes": build.png(k), "path": None} for k in range(n)]),
        "label": pa.array([k % 2 for k in range(n)], pa.int64()),
    }
    if extra:
        cols[extra] = pa.array([0] * n, pa.int64())
    return pa.record_batch(cols)


def test_streamed_arrow_batch_larger_than_the_read_bound_is_refused(tmp_path, monkeypatch):
    """From S3 a batch's body is read into memory whole: one declared huge batch must be
    refused, not held (a memory-mapped local file is not read into memory)."""
    big = _rows(40)
    _hf_file(tmp_path / "hf", [big], big.schema)
    monkeypatch.setattr(dataset_hf, "MAX_HF_READ_BYTES", 2000)
    plan = _plan({"source": "hf", "path": "hf"})
    _refused(
        lambda: read_samples(plan, _Streamed(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow",
        "record batch",
    )
    assert len(read_samples(plan, LocalStore(tmp_path))) == 40  # mapped: read in place


def test_endless_empty_record_batches_are_bounded(tmp_path, monkeypatch):
    """Empty batches add no rows, so the row bound never stopped a file (or an S3 stream that
    never ends) of them."""
    rows = _rows(2)
    _hf_file(tmp_path / "hf", [rows.slice(0, 0)] * 30 + [rows], rows.schema)
    monkeypatch.setattr(dataset_hf, "MAX_HF_BATCHES", 20)
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf"}), _Streamed(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow",
        "more than 20 record batches",
    )


def test_arrow_field_names_that_are_not_utf8_are_refused(tmp_path):
    """Found by fuzzing the Arrow file: pyarrow decodes field names on access, raising an
    uncaught UnicodeDecodeError (INTERNAL)."""
    rows = _rows(2, "zzzzQ")
    _hf_file(tmp_path / "hf", [rows], rows.schema)
    f = tmp_path / "hf" / "data-00000-of-00001.arrow"
    f.write_bytes(f.read_bytes().replace(b"zzzzQ", b"zzzz\xff"))
    for store in (LocalStore(tmp_path), _Streamed(tmp_path)):
        _refused(
            lambda store=store: read_samples(_plan({"source": "hf", "path": "hf"}), store),
            "dataset.path/data-00000-of-00001.arrow",
            "schema",
        )


def test_uploaded_archive_with_chained_extended_headers_is_refused_not_internal():
    """The uploaded-archive index scans headers with tarfile too: 3000 chained pax headers
    overflowed its stack (an uncaught RecursionError). The reader here serves the archive's
    bytes from memory, as the blob storage's positional reader serves them from a file."""
    from fortis.services.evaluation.dataset_archive import ArchiveIndex

    raw = io.BytesIO()
    rec = b"20 comment=xxxxxxxx\n"
    for _ in range(3000):
        raw.write(_header(tarfile.XHDTYPE, len(rec)) + rec.ljust(512, b"\0"))
    with tarfile.open(fileobj=raw, mode="w") as tf:
        build.add(tf, "a.png", build.png(3))
    data = raw.getvalue()

    class Bytes:
        size = len(data)

        def read_at(self, offset: int, n: int) -> bytes:
            return data[offset : offset + n]

    with pytest.raises(InvalidArgument) as e:
        ArchiveIndex.scan(Bytes(), "dataset.store.upload")  # type: ignore[arg-type]
    assert e.value.violations[0].field == "dataset.store.upload", e.value.message
