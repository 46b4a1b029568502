"""Profile templates: ``${name}`` placeholders in the JSON body of a request, and
``${env:NAME}`` references in non-secret settings (the endpoint URL).

Shared by profile validation (which placeholders a template uses) and request building (filling
them), so both read the same syntax.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from fortis.services.common import errors

#: Template placeholders and what they become.
PLACEHOLDERS: dict[str, str] = {
    "image_base64": "the image file, base64 (standard alphabet, padded)",
    "image_url": "a URL the service can fetch the image from (image: url)",
    "image_mime": "image/png or image/jpeg",
    "image_width": "image width, pixels (a number)",
    "image_height": "image height, pixels (a number)",
    "images": "the list of per_image templates, one per image of the request",
}
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def render_template(template: Any, values: Mapping[str, Any]) -> Any:
    """A JSON template with ``${name}`` placeholders filled. A string that is exactly one
    placeholder becomes the value itself (a number, a list); otherwise text is substituted."""
    if isinstance(template, dict):
        return {k: render_template(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [render_template(v, values) for v in template]
    if isinstance(template, str):
        m = _PLACEHOLDER.fullmatch(template)
        if m:
            return values[m.group(1)]
        return _PLACEHOLDER.sub(lambda mm: str(values[mm.group(1)]), template)
    return template


def placeholders_in(template: Any) -> set[str]:
    if isinstance(template, dict):
        return set().union(*(placeholders_in(v) for v in template.values())) if template else set()
    if isinstance(template, list):
        return set().union(*(placeholders_in(v) for v in template)) if template else set()
    if isinstance(template, str):
        return set(_PLACEHOLDER.findall(template))
    return set()


def expand_env(text: str, field_name: str) -> str:
    """``${env:NAME}`` / ``${env:NAME:-default}`` in a non-secret setting (the endpoint URL)."""
    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value:
            return value
        if m.group(2) is not None:
            return m.group(2)
        raise errors.InvalidArgument(field_name, f"environment variable {m.group(1)} is not set "
                                                 "and the setting gives no default")
    return _ENV_REF.sub(sub, text)
