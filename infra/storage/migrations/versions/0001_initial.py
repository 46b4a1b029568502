"""The first PostgreSQL schema: the evaluation store's ``evaluations`` and
``items`` and the proxy ledger's ``sessions``, ``queries`` and ``replies``, column for column
as the SQLite files of ``services/evaluation/store.py`` and ``services/proxy/ledger.py``.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TEXT: dict[str, Any] = {"nullable": False, "server_default": ""}


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("evaluation_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("plan_text", sa.Text(), nullable=False),
        sa.Column("plan_name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("error_code", sa.Text(), **_TEXT),
        sa.Column("error_message", sa.Text(), **_TEXT),
        sa.Column("resumed_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("stage", sa.Text(), nullable=False, server_default="plan"),
        sa.Column("items_done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("items_total", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("queries", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("message", sa.Text(), **_TEXT),
        sa.Column("summary_json", sa.Text(), **_TEXT),
        sa.Column("images_done", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("images_total", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("error_status", sa.LargeBinary(), nullable=True),
        sa.Column("report_json", sa.Text(), **_TEXT),
        sa.Column("report_html", sa.Text(), **_TEXT),
        sa.Column("started_at", sa.Float(), nullable=False, server_default="0"),
        sa.Column("finished_at", sa.Float(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("tenant", "evaluation_id", name="evaluations_pkey"),
    )
    op.create_index("evaluations_state", "evaluations", ["state"])
    op.create_table(
        "items",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("evaluation_id", sa.Text(), nullable=False),
        sa.Column("item_key", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("done", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("tenant", "evaluation_id", "item_key", name="items_pkey"),
    )
    op.create_table(
        "sessions",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("query_budget", sa.BigInteger(), nullable=False),
        sa.Column("per_image_budget", sa.BigInteger(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("calls_refused", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("tenant", "session_id", name="sessions_pkey"),
    )
    op.create_index("sessions_id", "sessions", ["session_id"])
    op.create_table(
        "queries",
        sa.Column("entry_id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("origin", sa.Text(), nullable=False),
        sa.Column("image_id", sa.Text(), nullable=False),
        sa.Column("input_sha256", sa.Text(), nullable=False),
        sa.Column("output_summary", sa.Text(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("sent_at", sa.Float(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("entry_id", name="queries_pkey"),
    )
    op.create_index("queries_session", "queries", ["session_id", "tenant", "image_id"])
    op.create_index("queries_status", "queries", ["status"])
    op.create_index("queries_sent_at", "queries", ["sent_at"])
    op.create_table(
        "replies",
        sa.Column("entry_id", sa.BigInteger(), nullable=False),
        sa.Column("prediction", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("entry_id", name="replies_pkey"),
    )


def downgrade() -> None:
    for table in ("replies", "queries", "sessions", "items", "evaluations"):
        op.drop_table(table)
