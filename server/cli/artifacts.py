"""``fortis artifacts list|export EVALUATION_ID --tenant T``: what an evaluation
kept besides its results, such as the adversarial examples of its attack stages
(``adversarial/<attack>-<chunk>.npz`` with ``image_ids``, ``adversarial_uint8`` and
``adversarial_float``; SPEC CAN-9), read out of the evaluation store by an operator.

The store is the one the evaluation service and its workers share: PostgreSQL
(``--database-url``, or ``$FORTIS_DATABASE_URL`` which keeps the password out of the process
list) or the SQLite files of a state folder (``--state-dir``, default ``$FORTIS_STATE`` or
``.fortis-state``). Artifacts are read in the tenant's namespace only. ``list`` prints JSON
(name, size, SHA-256, time of each); ``export --out DIR`` writes each as ``DIR/<name>`` (names
are checked by the store: no file lands outside ``DIR``), each checked against its SHA-256,
and prints what it wrote as JSON.

Exit codes: 0 done; 2 bad input, one line naming the setting (``database_url`` with the
password hidden, ``state_dir``, ``tenant``, ``evaluation_id``, ``out``); 1 a store that failed
while reading.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from fortis.server.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, err


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sp = sub.add_parser("artifacts", help="an evaluation's stored artifacts (adversarial "
                        "examples), from the evaluation store")
    asub = sp.add_subparsers(dest="artifacts_command", required=True)
    for name, help_text in (("list", "the evaluation's artifacts, as JSON"),
                            ("export", "write the evaluation's artifacts into a folder")):
        ap = asub.add_parser(name, help=help_text)
        ap.add_argument("evaluation_id")
        ap.add_argument("--tenant", default=os.environ.get("FORTIS_TENANT", ""),
                        help="the evaluation's tenant (default: $FORTIS_TENANT)")
        ap.add_argument("--database-url", metavar="URL",
                        help="PostgreSQL of the evaluation service (default: "
                        "$FORTIS_DATABASE_URL, unless --state-dir is given)")
        ap.add_argument("--state-dir", metavar="DIR",
                        help="the evaluation service's state folder, when it keeps SQLite "
                        "files (default: $FORTIS_STATE or .fortis-state)")
        if name == "export":
            ap.add_argument("--out", required=True, metavar="DIR",
                            help="folder to write the artifacts into (made if missing)")
            ap.add_argument("--name", action="append", metavar="NAME",
                            help="only this artifact (repeatable; default: all)")
            ap.set_defaults(fn=cmd_export)
        else:
            ap.set_defaults(fn=cmd_list)


def _open(ns: argparse.Namespace) -> tuple[Any, str]:
    """The tenant's view of the store the flags name, and how it is shown."""
    from fortis.infra.storage import sqldb
    from fortis.services.common.errors import InvalidArgument

    if not ns.tenant:
        raise InvalidArgument("tenant", "give --tenant TENANT (or set $FORTIS_TENANT)")
    if ns.database_url and ns.state_dir:
        raise InvalidArgument(sqldb.SETTING, "give --database-url or --state-dir "
                              "(state_dir), not both")
    url = ns.database_url or ("" if ns.state_dir else os.environ.get("FORTIS_DATABASE_URL", ""))
    if url:
        from fortis.services.evaluation.store_pg import PgEvaluationStore
        store: Any = PgEvaluationStore(url)
        return store, sqldb.redact_url(url)
    from fortis.services.evaluation.store import EvaluationStore
    state = Path(ns.state_dir or os.environ.get("FORTIS_STATE", ".fortis-state"))
    path = state / "evaluations.sqlite"
    if not path.is_file():
        raise InvalidArgument("state_dir", f"no evaluation store at {path} (give the "
                              "evaluation service's --state-dir, or --database-url)")
    # a reader never migrates the store of a service that may be running on it
    return EvaluationStore(path, migrate=False), str(path)


def _run(ns: argparse.Namespace, action: Any) -> int:
    """``action(tenant's store, shown)`` with the store's errors as one line."""
    from fortis.services.common.errors import FortisError, InvalidArgument, NotFound

    try:
        store, shown = _open(ns)
    except FortisError as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    try:
        view = store.for_tenant(ns.tenant)
        if view.get(ns.evaluation_id) is None:
            raise InvalidArgument("evaluation_id", f"tenant '{ns.tenant[:64]}' has no "
                                  f"evaluation '{ns.evaluation_id[:100]}' in {shown}")
        return int(action(view, shown))
    except (InvalidArgument, NotFound) as exc:
        err(str(exc))
        return EXIT_BAD_INPUT
    except FortisError as exc:
        err(str(exc))
        return EXIT_FAILED
    finally:
        store.close()


def cmd_list(ns: argparse.Namespace) -> int:
    def act(view: Any, shown: str) -> int:
        print(json.dumps({"evaluation_id": ns.evaluation_id, "tenant": ns.tenant,
                          "store": shown, "artifacts": [
                              {"name": a.name, "size": a.size, "sha256": a.sha256,
                               "created_at": a.created_at}
                              for a in view.artifacts(ns.evaluation_id)]}, indent=2))
        return 0
    return _run(ns, act)


def cmd_export(ns: argparse.Namespace) -> int:
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.evaluation.store import check_artifact_name

    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        err(f"out: {out} is not a folder")
        return EXIT_BAD_INPUT

    def act(view: Any, shown: str) -> int:
        infos = view.artifacts(ns.evaluation_id)
        if ns.name:
            known = {a.name for a in infos}
            missing = [n for n in ns.name if n not in known]
            if missing:
                raise InvalidArgument("name", f"no artifact '{missing[0][:200]}' of evaluation "
                                      f"'{ns.evaluation_id[:100]}'")
            infos = [a for a in infos if a.name in set(ns.name)]
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument("out", f"cannot make {out}: {exc.strerror}") from None
        top = out.resolve()
        written, total = [], 0
        for a in infos:
            check_artifact_name(a.name)
            dest = (top / a.name).resolve()
            if not dest.is_relative_to(top):            # cannot happen with a checked name
                raise InvalidArgument("name", "an artifact name leaves the output folder")
            data = view.artifact(ns.evaluation_id, a.name)
            if data is None:                            # removed since it was listed
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.part")
            tmp.write_bytes(data)
            tmp.replace(dest)
            written.append({"name": a.name, "path": str(dest), "size": len(data),
                            "sha256": a.sha256})
            total += len(data)
        print(json.dumps({"evaluation_id": ns.evaluation_id, "tenant": ns.tenant,
                          "store": shown, "out": str(top), "files": written, "bytes": total},
                         indent=2))
        return 0
    return _run(ns, act)
