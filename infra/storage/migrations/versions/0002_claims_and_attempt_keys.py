"""Work-item leases and idempotent ledger rows.

``items``: ``lease_owner``/``lease_expires`` (seconds since the epoch, the database's
clock), so several workers claim pending items with ``SELECT ... FOR UPDATE SKIP LOCKED`` and
a dead worker's items are claimed again once its lease expires.

``queries``: ``position`` (the image's place in its call attempt) and the unique key
``(tenant, call_id, attempts, position)``: a reservation written twice (a retried worker, a
commit whose answer was lost) is one row; ``owner``: the proxy process that reserved the row
(it holds an advisory lock on that number while it lives), so a starting replica marks only
a dead replica's in-flight rows ``INTERRUPTED``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("items", sa.Column("lease_owner", sa.Text(), nullable=False,
                                     server_default=""))
    op.add_column("items", sa.Column("lease_expires", sa.Float(), nullable=False,
                                     server_default="0"))
    # rows written by 0001 get their id as position: unique, never an attempt's 0..n-1 key
    op.add_column("queries", sa.Column("position", sa.BigInteger(), nullable=True))
    op.execute("UPDATE queries SET position = -entry_id")
    op.alter_column("queries", "position", nullable=False)
    op.add_column("queries", sa.Column("owner", sa.Integer(), nullable=False,
                                       server_default="0"))
    op.create_unique_constraint("queries_attempt_key", "queries",
                                ["tenant", "call_id", "attempts", "position"])


def downgrade() -> None:
    op.drop_constraint("queries_attempt_key", "queries", type_="unique")
    op.drop_column("queries", "owner")
    op.drop_column("queries", "position")
    op.drop_column("items", "lease_expires")
    op.drop_column("items", "lease_owner")
