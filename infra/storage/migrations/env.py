"""Alembic environment of Fortis: run programmatically with a connection handed
over in ``config.attributes["connection"]`` by ``infra/storage/sqldb.py`` (no alembic.ini,
no URL in any file)."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("Fortis migrations run through `fortis db upgrade --database-url URL`")
context.configure(connection=connection, target_metadata=None, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
