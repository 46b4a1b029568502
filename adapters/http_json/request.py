"""Building the HTTP request a profile describes for a group of images: the image as base64
in a JSON template, the raw bytes, multipart form data, or a URL the service fetches.

Pure functions of the profile and the images (no I/O): the backend adds the auth header
(``auth.auth_headers``) and sends the result through the shared HTTP client.
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fortis.adapters.http_json.profile import Profile
from fortis.adapters.http_json.templates import render_template
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import decode_image, encode_png

USER_AGENT = "fortis-http-json/1"


@dataclass(frozen=True)
class PreparedImage:
    """One image of a call, validated and encoded once (PNG unless it came encoded)."""

    index: int
    image_id: str
    data: bytes
    mime: str
    width: int
    height: int

    @property
    def suffix(self) -> str:
        return ".png" if self.mime == "image/png" else ".jpg"


def mime_of(data: bytes) -> str:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    return "application/octet-stream"


def prepare_image(i: int, img: common_pb2.Image) -> PreparedImage:
    """Validate ``images[i]`` (``InvalidArgument`` names the field) and keep the file bytes the
    service will receive: the encoded file as given, else the raw tensor as PNG."""
    arr = decode_image(img, f"images[{i}]")
    h, w = int(arr.shape[0]), int(arr.shape[1])
    data = img.encoded if img.WhichOneof("content") == "encoded" else encode_png(arr)
    return PreparedImage(index=i, image_id=img.image_id, data=data, mime=mime_of(data),
                         width=w, height=h)


def image_file_name(img: PreparedImage) -> str:
    """An unguessable file name for an image published by URL."""
    return secrets.token_urlsafe(18) + img.suffix


def multipart(fields: Mapping[str, str], file_field: str, files: Sequence[tuple[str, bytes, str]]
              ) -> tuple[bytes, str]:
    """multipart/form-data body and its Content-Type for text ``fields`` and (name, data, mime)
    ``files``, all under ``file_field``."""
    boundary = "fortis-" + uuid.uuid4().hex
    out = bytearray()
    for k, v in fields.items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{quote(k)}\"\r\n\r\n"
                f"{v}\r\n").encode()
    for filename, data, mime in files:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{quote(file_field)}\"; "
                f"filename=\"{quote(filename)}\"\r\nContent-Type: {mime}\r\n\r\n").encode()
        out += data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def image_values(p: Profile, img: PreparedImage, url: str) -> dict[str, Any]:
    """The placeholder values of one image."""
    b64 = base64.b64encode(img.data).decode("ascii") if p.image == "base64" else ""
    return {"image_base64": b64,
            "image_url": url, "image_mime": img.mime, "image_width": img.width,
            "image_height": img.height}


def build_request(p: Profile, group: Sequence[PreparedImage], urls: Sequence[str], label: str
                  ) -> tuple[bytes | None, dict[str, str]]:
    """(body, headers) of the request for ``group`` (``urls``: their URLs for image: url),
    without the auth header."""
    headers: dict[str, str] = {"Accept": "application/json", "User-Agent": USER_AGENT}
    headers.update(p.headers)
    if p.image == "binary":
        headers.setdefault("Content-Type", group[0].mime)
        return group[0].data, headers
    if p.image == "multipart":
        files = [(f"{p.multipart_filename}-{k}{g.suffix}", g.data, g.mime)
                 for k, g in enumerate(group)]
        body, ctype = multipart(p.multipart_fields, p.multipart_file_field, files)
        headers["Content-Type"] = ctype
        return body, headers
    per = [image_values(p, g, urls[k] if urls else "") for k, g in enumerate(group)]
    values: dict[str, Any] = dict(per[0]) if len(group) == 1 else {}
    if p.per_image is not None:
        values["images"] = [render_template(p.per_image, v) for v in per]
    try:
        doc = render_template(p.body, values)
    except KeyError as exc:
        raise errors.FailedPrecondition(f"{label}: placeholder {exc} cannot be used in "
                                        "body when a request carries several images") from None
    headers.setdefault("Content-Type", "application/json")
    return json.dumps(doc, separators=(",", ":")).encode("utf-8"), headers
