"""Archives written by earlier simdb releases, upgraded to today's schema, answer as they did.

Each fixture in tests/fixtures/revisions is a dump of an index made by the release whose head
migration was that revision, with the answers that release gave (see make_fixtures.py there).
Opening it with today's simdb runs every later migration; the answers must not change, and the
archive must go on working: an interrupted batch resumes, new batches ingest.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import psycopg
import pytest

from simdb import Index
from simdb.samples import corpus
from tests.conftest import assert_consistent
from tests.maintained import assert_maintained

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "revisions"
NAMES = sorted(path.name.removesuffix(".sql.gz") for path in FIXTURES.glob("*.sql.gz"))


def restore(database_url: str, name: str, schema: str) -> dict:
    """Load a fixture dump into ``schema``; returns the answers its release recorded."""
    sql = gzip.decompress((FIXTURES / f"{name}.sql.gz").read_bytes()).decode("utf-8")
    sql = sql.replace(f"simdb_fixture_{name}", schema)
    with psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True) as connection:
        connection.execute(sql)
        connection.execute("RESET search_path")
    return json.loads(gzip.decompress((FIXTURES / f"{name}.json.gz").read_bytes()))


def interrupted_records() -> list[dict]:
    """The input of the batch 'late' that make_fixtures.py interrupted with an empty text at record 651."""
    records = list(corpus())
    return [{"id": f"late-{i}", "text": r["text"] + f" (reposted {i // len(records)})"}
            for i, r in enumerate(records * 2)]


def test_every_revision_has_a_fixture():
    assert {name[1:5] for name in NAMES} == {"0001", "0002", "0003", "0004"}


@pytest.mark.parametrize("name", NAMES)
def test_an_archive_from_an_earlier_release_answers_as_it_did(name, database_url, schema, admin_engine):
    answers = restore(database_url, name, schema)
    with Index.open(database_url, schema=schema) as index:
        assert index.method == answers["method"]
        assert list(index.export()) == answers["export"]
        assert [p.to_json() for p in index.pairs()] == answers["pairs"]
        assert [[m.to_json() for m in index.query(q)] for q in answers["query_texts"]] == answers["queries"]
        batches = [(b["name"], b["status"], b["documents"], b["new"], b["exact_duplicates"], b["near_duplicates"])
                   for b in index.stats()["batches"]]
    assert batches == [(b["name"], b["status"], b["documents"], b["new"], b["exact_duplicates"],
                        b["near_duplicates"]) for b in answers["batches"]]
    with admin_engine.connect() as connection:
        documents = [list(row) for row in connection.exec_driver_sql(
            f"SELECT d.external_id, o.external_id, d.duplicate_distance FROM {schema}.documents d "
            f"LEFT JOIN {schema}.documents o ON o.id = d.duplicate_of ORDER BY d.id")]
        clusters = [list(row) for row in connection.exec_driver_sql(
            f"SELECT d.external_id, c.external_id FROM {schema}.documents d JOIN {schema}.documents c "
            f"ON c.id = d.cluster_id ORDER BY d.id")]
    assert documents == answers["documents"]
    if "clusters" in answers:
        assert clusters == answers["clusters"]
    assert_maintained(admin_engine, schema)  # what migration 0015 filled in
    if answers["method"] == "simhash":  # pairs, duplicate_of and clusters against brute force
        assert_consistent(admin_engine, schema)


@pytest.mark.parametrize("name", [n for n in NAMES if "interrupted" in n or n == "r0004_minhash"])
def test_an_upgraded_archive_resumes_its_interrupted_batch(name, database_url, schema, admin_engine):
    restore(database_url, name, schema)
    records = interrupted_records()
    records[650]["text"] = "now it has text"
    with Index.open(database_url, schema=schema) as index:
        summary = index.add_many(records, batch="late", chunk_size=100, resume=True)
        assert summary.documents == len(records)
        assert {b["name"]: b["status"] for b in index.stats()["batches"]}["late"] == "complete"
        index.add_many([{"id": "after-upgrade", "text": list(corpus())[3]["text"]}], batch="after")
        (match,) = [m for m in index.query(list(corpus())[3]["text"]) if m.external_id == "after-upgrade"]
        assert match.distance == 0
    assert_maintained(admin_engine, schema)
    if index.method == "simhash":
        assert_consistent(admin_engine, schema)
