"""Alembic migrations of Fortis's PostgreSQL schema: the evaluation store's and
the proxy ledger's tables. Run by ``fortis db upgrade`` (``infra/storage/sqldb.py``)."""
