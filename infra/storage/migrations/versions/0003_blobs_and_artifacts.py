"""Shared uploads and artifacts (pods and worker Job pods share no disk).

``blobs`` + ``blob_chunks``: the uploaded blobs of ``infra/storage/blobs_pg.py``, metadata
column for column as the file store's SQLite index (``infra/storage/blobs.py``), content
in ``bytea`` rows of at most 1 MiB (deleted with their blob).

``artifacts`` + ``artifact_parts``: what an evaluation keeps besides its item results, e.g.
the adversarial examples of its attack stages (``adversarial/<attack>-<chunk>.npz``, CAN-9),
keyed by (tenant, evaluation id, name), content in ``bytea`` parts
(``services/evaluation/store_pg.py``; the SQLite store has the same two tables).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("hex", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("media_type", sa.Text(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "hex", name="blobs_pkey"),
    )
    op.create_index("blobs_by_time", "blobs", ["tenant", sa.text("created DESC"), "hex"])
    op.create_table(
        "blob_chunks",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("hex", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "hex", "seq", name="blob_chunks_pkey"),
        sa.ForeignKeyConstraint(["tenant", "hex"], ["blobs.tenant", "blobs.hex"],
                                ondelete="CASCADE", name="blob_chunks_blob"),
    )
    op.create_table(
        "artifacts",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("evaluation_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "evaluation_id", "name", name="artifacts_pkey"),
    )
    op.create_table(
        "artifact_parts",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("evaluation_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "evaluation_id", "name", "seq",
                                name="artifact_parts_pkey"),
        sa.ForeignKeyConstraint(["tenant", "evaluation_id", "name"],
                                ["artifacts.tenant", "artifacts.evaluation_id",
                                 "artifacts.name"],
                                ondelete="CASCADE", name="artifact_parts_artifact"),
    )


def downgrade() -> None:
    for table in ("artifact_parts", "artifacts", "blob_chunks", "blobs"):
        op.drop_table(table)
