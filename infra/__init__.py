"""Infrastructure: what the services run on, not what they mean.

``fortis.infra.storage`` keeps bytes and rows (uploaded blobs on files + SQLite or PostgreSQL,
the SQL plumbing both stores and the ledger share, the schema versions and the Alembic
migrations); ``fortis.infra.serving`` is the gRPC server every service is built with
(authentication, per-tenant admission, the memory budget, the fair CPU share, error mapping,
health, reflection, TLS, metrics). Infrastructure imports the domain (``fortis.core``,
``fortis.services.common``) and never a service, an adapter or the composition roots.
"""
