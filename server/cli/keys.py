"""``fortis keys``: make API keys and the key-file lines that admit them (keys are
stored hashed and rotated without restart).

    fortis keys new --tenant T     a new key (give it to the tenant) and its key-file line
    fortis keys hash --tenant T    the key-file line of a key read from stdin (an existing key)

The server's key file (``fortis serve --api-keys-file``) holds only the lines
``TENANT sha256:<hex>``: the key itself is printed once, here, and stored nowhere by Fortis.
Rotation: append the new line, hand out the new key, remove the old line when the tenant has
switched; the server picks the file up without a restart.
"""

from __future__ import annotations

import argparse
import json
import sys

from fortis.server.cli.output import EXIT_BAD_INPUT, err


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("keys", help="make API keys and their key-file lines "
                        "(fortis serve --api-keys-file)")
    ksub = sp.add_subparsers(dest="keys_command", required=True)
    new = ksub.add_parser("new", help="a new key for a tenant, and its key-file line")
    new.add_argument("--tenant", required=True, help="the tenant the key acts for")
    new.add_argument("--json", action="store_true", help='{"tenant", "api_key", "line"}')
    new.set_defaults(fn=cmd_new)
    hashed = ksub.add_parser("hash", help="the key-file line of an existing key (read from "
                             "stdin, so it stays out of the shell history)")
    hashed.add_argument("--tenant", required=True)
    hashed.set_defaults(fn=cmd_hash)


def cmd_new(ns: argparse.Namespace) -> int:
    from fortis.infra.serving.api_keys import key_file_line, new_api_key
    from fortis.services.common.errors import InvalidArgument

    key = new_api_key()
    try:
        line = key_file_line(ns.tenant, key)
    except InvalidArgument as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    if ns.json:
        print(json.dumps({"tenant": ns.tenant, "api_key": key, "line": line}))
        return 0
    print(f"api key (give it to tenant '{ns.tenant}'; it is not stored anywhere): {key}")
    print("key-file line (append it to the file of --api-keys-file):")
    print(line)
    return 0


def cmd_hash(ns: argparse.Namespace) -> int:
    from fortis.infra.serving.api_keys import MAX_KEY_CHARS, key_file_line
    from fortis.services.common.errors import InvalidArgument

    key = sys.stdin.readline().strip()
    if not key or len(key) > MAX_KEY_CHARS:
        err(f"give the key on stdin (1-{MAX_KEY_CHARS} characters)")
        return EXIT_BAD_INPUT
    try:
        print(key_file_line(ns.tenant, key))
    except InvalidArgument as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    return 0
