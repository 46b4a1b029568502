"""Alembic revisions, oldest first (``0001_...``, ``0002_...``)."""
