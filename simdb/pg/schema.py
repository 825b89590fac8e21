"""The tables, as SQLAlchemy Core objects.

This is the current shape of the schema that ``migrations/`` builds, and a new
index is created from it directly (:func:`create_tables`): a test runs
alembic's ``check`` to prove the two agree, another compares the catalog of a
new index with one the migrations made. Tables are created without a
schema name: every connection's ``search_path`` starts with the index's
PostgreSQL schema (``simdb`` unless chosen otherwise), so one database can
hold several indexes.

``documents`` is partitioned by ranges of ``id`` into segments (plain tables
``documents_<first id>``, managed by :mod:`simdb.pg.segments`); its indexes are
partitioned indexes, so every segment has its own. It has one column per block key (``key_0`` .. ``key_{n-1}``), each
with its own B-tree index that also carries ``simhash`` and ``id``, so a
lookup is an index-only scan. A MinHash index stores its signature in
``signature`` (``simhash`` stays NULL) and one key column per band. ``text``
holds each document's text in an index that keeps them (``simdb init
--store-text``; TOAST-compressed, with lz4 where the server has it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.schema import CreateIndex, CreateTable, SetTableComment, conv

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

@functools.cache
def build_metadata(key_columns: tuple[str, ...]) -> sa.MetaData:
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    sa.Table(
        "settings", metadata,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", JSONB, nullable=False),
        comment="What the index is: fingerprint recipe, block layout, canaries. Checked on every open.",
    )
    sa.Table(
        "batches", metadata,
        sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("documents", sa.Integer, nullable=False, server_default="0"),
        sa.Column("new", sa.Integer, nullable=False, server_default="0"),
        sa.Column("exact_duplicates", sa.Integer, nullable=False, server_default="0"),
        sa.Column("near_duplicates", sa.Integer, nullable=False, server_default="0"),
        sa.Column("within_batch", sa.Integer, nullable=False, server_default="0"),
        sa.Column("position", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("rejected", sa.Integer, nullable=False, server_default="0"),
        sa.Column("already_stored", sa.Integer, nullable=False, server_default="0"),
        sa.Column("removed", sa.Integer, nullable=False, server_default="0"),  # removed since (0015)
        # named as migration 0001 left it (its name went through the naming convention twice), as is the
        # check of near_duplicates: a new index is made from these tables (create_tables), alike in every detail
        sa.CheckConstraint(sa.text("status IN ('running', 'complete')"), name=conv("ck_batches_ck_batches_status")),
        comment="One row per ingested batch, with its counts (removed: its documents removed since; it holds "
                "documents - removed).",
    )
    key_column_objects = [sa.Column(name, sa.BigInteger, nullable=False) for name in key_columns]
    documents = sa.Table(
        "documents", metadata,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False,
                  server_default=sa.text("nextval('documents_id_seq'::regclass)")),
        # unique by the ingest's set-based check under its lock: a partitioned table's unique index must
        # contain the partition key
        sa.Column("external_id", sa.Text, nullable=False, index=True),
        sa.Column("batch_id", sa.Integer, nullable=False, index=True),  # no foreign key: checked row by row (0016)
        sa.Column("simhash", sa.BigInteger),
        *key_column_objects,
        sa.Column("content_hash", sa.LargeBinary, nullable=False, index=True),
        sa.Column("length", sa.Integer, nullable=False),
        sa.Column("metadata", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("duplicate_of", sa.BigInteger, index=True),  # no foreign keys into segments (see 0007)
        sa.Column("duplicate_distance", sa.SmallInteger),
        sa.Column("cluster_id", sa.BigInteger, nullable=False, index=True),
        sa.Column("signature", sa.LargeBinary),
        sa.Column("text", sa.Text),  # kept by `simdb init --store-text` (lz4 where the server has it), else NULL
        sa.CheckConstraint(sa.text("(simhash IS NULL) <> (signature IS NULL)"), name="one_sketch"),
        comment="One row per document: fingerprint (signed BIGINT), block keys, and the earliest near-duplicate.",
        postgresql_partition_by="RANGE (id)",
    )
    for name in key_columns:
        sa.Index(f"ix_documents_{name}", documents.c[name], postgresql_include=["simhash", "id"])
    sa.Table(
        "near_duplicates", metadata,
        sa.Column("a_id", sa.BigInteger, primary_key=True),
        sa.Column("b_id", sa.BigInteger, primary_key=True, index=True),
        sa.Column("distance", sa.SmallInteger, nullable=False),
        sa.Column("batch_id", sa.Integer, sa.ForeignKey("batches.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("found_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(sa.text("a_id < b_id"), name=conv("ck_near_duplicates_ck_near_duplicates_ordered")),
        comment="Every near-duplicate pair found at ingest: a was stored before b; batch is b's.",
    )
    clusters = sa.Table(
        "clusters", metadata,
        sa.Column("cluster_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("batches", sa.ARRAY(sa.Text), nullable=False),
        sa.Column("min_similarity", sa.DOUBLE_PRECISION),  # the sketches' similarity of the member least like the earliest
        comment="One row per cluster of two or more documents (cluster_id = its earliest document's id), kept "
                "by every ingest and removal: size, first and last seen, the batches of its members, the "
                "smallest similarity of a member to the earliest (min_similarity).",
    )
    sa.Index("ix_clusters_size", clusters.c.size.desc(), clusters.c.cluster_id)
    sa.Index("ix_clusters_min_similarity", clusters.c.min_similarity, clusters.c.cluster_id)
    records = sa.Table(
        "records", metadata,
        sa.Column("batch_id", sa.Integer, primary_key=True),  # no foreign key (0016): removal deletes the rows
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("external_id", sa.Text),
        sa.Column("document_id", sa.BigInteger),
        sa.Column("duplicate_of", sa.BigInteger),
        sa.Column("distance", sa.SmallInteger),
        sa.Column("path", sa.Text),
        sa.Column("line", sa.BigInteger),
        sa.Column("reason", sa.Text),
        sa.Column("hint", sa.Text),
        sa.Column("duplicate_of_external_id", sa.Text),  # duplicate_of's name, kept when it is removed (0011)
        sa.Column("duplicate_of_batch_id", sa.Integer),  # duplicate_of's batch, kept when it is removed (0017)
        sa.CheckConstraint(sa.text("status IN ('new', 'exact', 'near', 'already_stored', 'rejected')"),
                           name="status"),
        comment="One row per input record of a batch, in input order: what became of it (new, exact, near, "
                "already_stored, rejected), written with its chunk.",
    )
    # the verdicts of a batch that named a document of an earlier batch: "documents of a batch with their earlier
    # duplicates" reads these rows alone, in input order (0017)
    sa.Index("ix_records_earlier_batch", records.c.batch_id, records.c.position,
             postgresql_where=records.c.duplicate_of_batch_id != records.c.batch_id)
    sa.Table(
        "sync_sources", metadata,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("relation", sa.Text),  # schema.table, or NULL when the rows come from a query
        sa.Column("query", sa.Text),
        sa.Column("id_column", sa.Text, nullable=False),
        sa.Column("text_column", sa.Text, nullable=False),
        sa.Column("metadata_columns", sa.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("watermark_column", sa.Text),
        sa.Column("source_url", sa.Text),  # another server, its password left out; NULL: the index's database
        sa.Column("on_change", sa.Text, nullable=False),
        sa.Column("lag", sa.Interval),
        sa.Column("watermark", sa.Text),  # the last committed row's watermark and id, as the source prints them
        sa.Column("last_id", sa.Text),
        sa.Column("batch", sa.Text),  # the batch of the latest run
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("last_run_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(sa.text("(relation IS NULL) <> (query IS NULL)"), name="one_origin"),
        sa.CheckConstraint(sa.text("on_change IN ('keep', 'replace')"), name="on_change"),
        comment="One row per PostgreSQL table or query kept in sync (simdb sync): how to read it, and the "
                "(watermark, id) of the last row a committed chunk stored, written in that chunk's transaction.",
    )
    field_counts = sa.Table(
        "field_counts", metadata,
        sa.Column("field", sa.Text, nullable=False),
        sa.Column("value", sa.Text),  # metadata ->> field: NULL where a document has no such field (or JSON null)
        sa.Column("documents", sa.BigInteger, nullable=False),
        sa.Column("duplicates", sa.BigInteger, nullable=False),
        comment="One row per value of each metadata field the index counts by (settings.count_by; simdb init "
                "--count-by, simdb count-by add): the documents stored with that value (metadata ->> field; NULL: "
                "none) and how many of them have an earlier near-duplicate (duplicate_of), kept by every ingest "
                "chunk and removal (0018).",
    )
    # one row per field and value, NULL a value of its own (PostgreSQL 14 has no NULLS NOT DISTINCT); the value by
    # its digest: a B-tree entry holds at most 2,704 bytes, and a value can be longer
    sa.Index("uq_field_counts_field_value", field_counts.c.field, sa.text("md5(coalesce(value, ''))"),
             sa.text("(value IS NULL)"), unique=True)
    sa.Table(
        "idf_terms", metadata,
        sa.Column("term", sa.Text, primary_key=True),
        sa.Column("documents", sa.Integer, nullable=False),
        comment="SimHash with tfidf weighting: sample documents containing each term, frozen at creation "
                "(digest in settings.idf).",
    )
    return metadata


def create_tables(connection: sa.Connection, key_columns: Sequence[str]) -> None:
    """A new index's tables, in the schema first on the connection's search path, exactly as the migrations
    leave them at the head revision (``tests/test_migrations.py`` compares the two catalogs): the sequence of
    ``documents``' ids, the tables with their constraints, indexes and comments, and lz4 for the texts where
    the server has it (as migration 0008 decides). One script, one round trip."""
    dialect = connection.dialect
    statements = ["CREATE SEQUENCE documents_id_seq AS bigint START WITH 1"]
    for table in build_metadata(tuple(key_columns)).sorted_tables:
        statements += [str(CreateTable(table).compile(dialect=dialect)),
                       *(str(CreateIndex(index).compile(dialect=dialect)) for index in table.indexes),
                       str(SetTableComment(table).compile(dialect=dialect))]
    statements.append("ALTER SEQUENCE documents_id_seq OWNED BY documents.id")
    if connection.exec_driver_sql("SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                                  "WHERE name = 'default_toast_compression'").scalar():
        statements.append("ALTER TABLE documents ALTER COLUMN text SET COMPRESSION lz4")
    connection.connection.dbapi_connection.execute(";\n".join(statements))  # DDL as written: no parameters
