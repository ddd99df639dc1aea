"""The PostgreSQL backend: the store of record for many replicas (``PostgresStore``), its tables,
its change-log follower. Needs psycopg 3 (a dependency); pgvector is not used."""

from rag.stores.postgres.store import PostgresStore, probe

__all__ = ["PostgresStore", "probe"]
