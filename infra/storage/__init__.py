"""Storage: uploaded blobs, the SQL plumbing of the stores and the ledger, schema versions and
migrations (embedded SQLite files by default, PostgreSQL at scale)."""
