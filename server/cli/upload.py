"""``fortis upload`` and ``fortis upload-dataset``: send images, manifests and models to a
running Fortis through ``UploadService`` (no plan reads the server's disk: plans name
uploaded blobs, never a server path).

    fortis upload FILE... [--kind image|manifest|model|archive] --address A    one id per file
    fortis upload-dataset FOLDER_OR_MANIFEST --address A               uploads images + a
                                                                       manifest, prints the
                                                                       plan's dataset snippet
    fortis upload-dataset FOLDER --archive [--format F] --address A    packs the folder into
                                                                       a tar as it is sent,
                                                                       prints the snippet

``upload-dataset`` takes
  - a JSON-lines manifest with the rows of a server-side manifest (``image``/``mask`` paths
    relative to the manifest's folder, ``labels``/``boxes`` as usual): every file it names is
    uploaded and the rows are sent again naming blob ids;
  - a folder holding ``manifest.jsonl`` (the same), or class folders named by their integer
    label (``FOLDER/3/a.png``: a classification dataset, label 3).
Everything goes through ``fortis.client`` like any other client (IEEE-P3: the image source
becomes content ids, so the report's plan repeats the evaluation exactly, IEEE-P4).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fortis.client import FortisClient
from fortis.server.cli.output import EXIT_BAD_INPUT, err
from fortis.server.cli.remote import api_key_of, guarded, tls_of

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_KINDS = ("image", "manifest", "model", "archive")
_FORMATS = ("auto", "coco", "voc", "hf", "folders", "webdataset")


def add_parsers(sub: argparse._SubParsersAction, remote_opts: Any) -> None:  # type: ignore[type-arg]
    """Register ``upload`` and ``upload-dataset``; ``remote_opts`` adds --address/--api-key/TLS."""
    sp = sub.add_parser("upload", help="upload files as blobs of a running Fortis (prints ids)")
    sp.add_argument("files", nargs="+", metavar="FILE")
    sp.add_argument("--kind", choices=_KINDS, default="",
                    help="image, manifest, model or archive (default: from the suffix: "
                    ".png/.jpg/.jpeg image, .jsonl manifest, .pt/.pth model, .tar/.tar.gz/.tgz "
                    "archive)")
    sp.add_argument("--json", action="store_true", help="one JSON object per file")
    remote_opts(sp, required=True)
    sp.set_defaults(fn=guarded(cmd_upload))

    sp = sub.add_parser("upload-dataset", help="upload a folder or manifest of images and "
                        "print the plan's dataset snippet")
    sp.add_argument("source", metavar="FOLDER_OR_MANIFEST")
    sp.add_argument("--json", action="store_true",
                    help='{"manifest", "images", "dataset"} instead of the snippet')
    sp.add_argument("--archive", action="store_true",
                    help="pack the folder into a tar as it is sent and upload it as one archive "
                    "(COCO, VOC, class folders, a Hugging Face save_to_disk folder, or a folder "
                    "of WebDataset .tar shards, each uploaded as one archive)")
    sp.add_argument("--format", choices=_FORMATS, default="auto",
                    help="with --archive: the dataset's format for the printed plan snippet "
                    "(default: recognised from the folder)")
    remote_opts(sp, required=True)
    sp.set_defaults(fn=guarded(cmd_upload_dataset))


def _kind_of(path: Path, given: str) -> str:
    if given:
        return given
    suffix = path.suffix.lower()
    if suffix in _IMAGE_SUFFIXES:
        return "image"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "manifest"
    if suffix in (".pt", ".pth", ".ts", ".torchscript"):
        return "model"
    if suffix in (".tar", ".tgz") or path.name.lower().endswith(".tar.gz"):
        return "archive"
    raise ValueError(f"{path.name}: say what it is with --kind {'|'.join(_KINDS)}")


def _client(ns: argparse.Namespace) -> FortisClient:
    return FortisClient(ns.address, api_key=api_key_of(ns), **tls_of(ns))


def cmd_upload(ns: argparse.Namespace) -> int:
    paths = [Path(f) for f in ns.files]
    try:
        kinds = [_kind_of(p, ns.kind) for p in paths]
    except ValueError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        err(f"not a file: {', '.join(missing[:5])}")
        return EXIT_BAD_INPUT
    with _client(ns) as fc:
        for path, kind in zip(paths, kinds, strict=True):
            blob = fc.upload(path, kind=kind)
            if ns.json:
                print(json.dumps({"file": str(path), "blob_id": blob.blob_id, "kind": blob.kind,
                                  "size": blob.size, "already_existed": blob.already_existed}))
            else:
                print(f"{blob.blob_id}  {path}")
    return 0


def _rows_of(source: Path) -> tuple[list[dict[str, Any]], Path]:
    """The manifest rows of ``source`` and the folder their paths are relative to."""
    manifest = source / "manifest.jsonl" if source.is_dir() else source
    if manifest.is_file():
        rows = []
        for n, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("image"), str):
                raise ValueError(f"{manifest.name}:{n}: each line needs an 'image' path")
            rows.append(row)
        return rows, manifest.parent
    if not source.is_dir():
        raise ValueError(f"{source}: neither a folder nor a manifest file")
    rows = []
    for sub in sorted(source.iterdir(), key=lambda p: p.name):
        if not sub.is_dir():
            continue
        try:
            label = int(sub.name)
        except ValueError:
            raise ValueError(f"{sub.name}: class folders are named by their integer label, or "
                             "give a manifest.jsonl") from None
        for img in sorted(sub.iterdir()):
            if img.suffix.lower() in _IMAGE_SUFFIXES:
                rows.append({"id": f"{sub.name}/{img.stem}",
                             "image": f"{sub.name}/{img.name}", "labels": [label]})
    if not rows:
        raise ValueError(f"{source}: no images found (class folders FOLDER/<label>/*.png or a "
                         "manifest.jsonl)")
    return rows, source


def _format_of(folder: Path) -> str:
    """The dataset format a folder is laid out in (for the plan snippet)."""
    names = {p.name for p in folder.iterdir()}
    if "state.json" in names or "dataset_dict.json" in names:
        return "hf"
    if {"Annotations", "JPEGImages"} <= names:
        return "voc"
    files = [p for p in folder.iterdir() if p.is_file()]
    if files and all(p.name.endswith((".tar", ".tar.gz", ".tgz")) for p in files):
        return "webdataset"
    if any(_coco_json(p) for p in folder.rglob("*.json")):
        return "coco"
    if not files and any(p.is_dir() for p in folder.iterdir()):
        return "folders"
    raise ValueError(f"{folder}: not recognised as COCO, VOC, class folders, a Hugging Face "
                     "folder or WebDataset shards; say which with --format")


def _coco_json(path: Path) -> bool:
    try:
        if path.stat().st_size > 512 * 1024 * 1024:
            return False
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "images" in doc and "annotations" in doc


def _archive_dataset(fc: FortisClient, folder: Path, fmt: str) -> dict[str, Any]:
    """Upload ``folder`` as an archive (or its shards as archives) and return the plan's
    dataset section."""
    top = folder.resolve().name
    if fmt == "webdataset":
        shards = sorted(p for p in folder.iterdir() if p.is_file()
                        and p.name.endswith((".tar", ".tar.gz", ".tgz")))
        if not shards:
            raise ValueError(f"{folder}: no .tar shards")
        return {"source": "webdataset",
                "store": {"upload": [fc.upload(p, kind="archive").blob_id for p in shards]}}
    blob = fc.upload_folder(folder)
    dataset: dict[str, Any] = {"source": fmt, "path": top}
    if fmt == "coco":
        ann = sorted(p for p in folder.rglob("*.json") if _coco_json(p))[0]
        dataset["path"] = f"{top}/{ann.relative_to(folder).as_posix()}"
        folders = sorted({p.parent for p in folder.rglob("*")
                          if p.suffix.lower() in _IMAGE_SUFFIXES})
        if len(folders) == 1 and folders[0] != ann.parent:
            dataset["images"] = f"{top}/{folders[0].relative_to(folder).as_posix()}"
    dataset["store"] = {"upload": blob.blob_id}
    return dataset


def cmd_upload_dataset(ns: argparse.Namespace) -> int:
    if ns.archive:
        folder = Path(ns.source)
        try:
            fmt = ns.format if ns.format != "auto" else _format_of(folder)
            with _client(ns) as fc:
                dataset = _archive_dataset(fc, folder, fmt)
        except (ValueError, OSError) as exc:
            err(str(exc)[:300])
            return EXIT_BAD_INPUT
        if ns.json:
            print(json.dumps({"dataset": dataset}))
        else:
            print("# uploaded as an archive; in your plan:")
            print(f"dataset: {json.dumps(dataset)}")
        return 0
    try:
        rows, base = _rows_of(Path(ns.source))
    except (ValueError, OSError) as exc:
        err(str(exc)[:300])
        return EXIT_BAD_INPUT
    uploaded: dict[str, str] = {}
    with _client(ns) as fc:
        out_rows = []
        for row in rows:
            row = dict(row)
            row.setdefault("id", Path(row["image"]).stem)
            for key in ("image", "mask"):
                rel = row.get(key)
                if not isinstance(rel, str):
                    continue
                if rel not in uploaded:
                    uploaded[rel] = fc.upload(base / rel, kind="image").blob_id
                row[key] = uploaded[rel]
            out_rows.append(row)
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in out_rows)
        manifest = fc.upload(text.encode("utf-8"), kind="manifest")
    dataset = {"source": "uploads", "manifest": manifest.blob_id, "limit": len(out_rows)}
    if ns.json:
        print(json.dumps({"manifest": manifest.blob_id, "images": len(uploaded),
                          "dataset": dataset}))
    else:
        print(f"# {len(out_rows)} rows, {len(uploaded)} files uploaded; in your plan:")
        print(f"dataset: {{source: uploads, manifest: \"{manifest.blob_id}\", "
              f"limit: {len(out_rows)}}}")
    return 0
