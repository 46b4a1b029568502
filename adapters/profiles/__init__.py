"""YAML profiles of HTTP/JSON vision APIs for ``fortis.adapters.http_json`` (data only; a
package so the files ship with the distribution). See README.md for the format."""
