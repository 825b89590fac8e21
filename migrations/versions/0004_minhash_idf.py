"""MinHash indexes and frozen IDF tables.

``documents.signature`` holds a MinHash index's signature (``simhash`` is
then NULL; exactly one of the two is set), and ``idf_terms`` holds the
document frequencies a SimHash index with tfidf weighting was created with.
The analysts' functions and views are recreated for the index's method.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""
from alembic import context, op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from simdb.settings import IndexSettings
    from simdb.sqlapi import create_functions, create_views, drop_functions_and_views

    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    op.alter_column("documents", "simhash", nullable=True)
    op.add_column("documents", sa.Column("signature", sa.LargeBinary))
    op.create_check_constraint("one_sketch", "documents", "(simhash IS NULL) <> (signature IS NULL)")
    op.create_table(
        "idf_terms",
        sa.Column("term", sa.Text, nullable=False),
        sa.Column("documents", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("term", name="pk_idf_terms"),
        comment="SimHash with tfidf weighting: sample documents containing each term, frozen at creation "
                "(digest in settings.idf).",
    )
    new_index = context.config.attributes.get("new_index_idf_terms")
    if new_index:
        with connection.connection.dbapi_connection.cursor() as cursor:
            with cursor.copy("COPY idf_terms (term, documents) FROM STDIN") as copy:
                for row in new_index.items():
                    copy.write_row(row)
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    terms = dict(connection.execute(sa.text("SELECT term, documents FROM idf_terms")).all())
    settings = IndexSettings.from_rows(rows, idf_terms=terms)
    drop_functions_and_views(connection, schema)
    create_functions(connection, schema, settings.layout)
    create_views(connection, schema, settings.layout)


def downgrade() -> None:
    from simdb.settings import IndexSettings
    from simdb.sqlapi import create_functions, create_views, drop_functions_and_views

    schema = context.config.attributes["schema"]
    connection = op.get_bind()
    rows = dict(connection.execute(sa.text("SELECT name, value FROM settings")).all())
    if rows.get("method") == "minhash" or rows.get("idf"):
        raise RuntimeError("this index uses MinHash or IDF weights, which schema revision 0003 cannot hold; "
                           "it cannot be downgraded")
    drop_functions_and_views(connection, schema)
    op.drop_table("idf_terms")
    op.drop_constraint("ck_documents_one_sketch", "documents", type_="check")
    op.drop_column("documents", "signature")
    op.alter_column("documents", "simhash", nullable=False)
    layout = IndexSettings.from_rows(rows).layout
    create_functions(connection, schema, layout)
    create_views(connection, schema, layout)
