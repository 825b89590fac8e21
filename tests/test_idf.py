"""IDF weights: learned from a sample, frozen in the database, checked on open."""

import json
import math

import pytest
import sqlalchemy as sa

from simdb import IncompatibleIndex, Index
from simdb.methods.simhash.fingerprint import IDF_MIN_DF, FingerprintSettings, IdfTable, fingerprint, learn_idf
from simdb.methods import SimHash
from simdb.parallel import TASK_SIZE, map_texts
from simdb.samples import corpus

TEXTS = [r["text"] for r in list(corpus())[:200]]


def test_learned_table_counts_documents_not_occurrences():
    table = IdfTable.learn([["a", "a", "b"], ["a", "c"], ["b"], ["d"]])
    assert table.documents == 4
    assert dict(table.terms) == {"a": 2, "b": 2}  # c and d are below IDF_MIN_DF and weigh as if seen once
    assert IDF_MIN_DF == 2
    assert table.weight("a") == pytest.approx(math.log(5 / 3))
    assert table.weight("c") == table.weight("never seen") == pytest.approx(math.log(5 / 2))


def test_digest_names_the_exact_table():
    table = learn_idf(TEXTS)
    same = IdfTable(documents=table.documents, terms=dict(table.terms))
    assert same.digest == table.digest
    changed = dict(table.terms)
    changed[next(iter(changed))] += 1
    assert IdfTable(documents=table.documents, terms=changed).digest != table.digest
    with pytest.raises(ValueError, match="does not match its digest"):
        IdfTable(documents=table.documents, terms=changed, digest=table.digest).check()


def test_weights_change_the_fingerprint_and_tfidf_needs_a_table():
    table = learn_idf(TEXTS)
    plain = [fingerprint(t) for t in TEXTS[:50]]
    weighted = [fingerprint(t, FingerprintSettings(weighting="tfidf", idf=table, top_features=8, bigrams=0))
                for t in TEXTS[:50]]
    assert sum(a != b for a, b in zip(plain, weighted)) > 40
    with pytest.raises(ValueError, match="needs an IDF table"):
        FingerprintSettings(weighting="tfidf")


def test_table_is_frozen_in_the_index_and_checked_on_open(database_url, schema, admin_engine):
    table = learn_idf(TEXTS)
    with Index.create(database_url, schema=schema, idf=table) as index:
        assert index.settings.fingerprints.weighting == "tfidf"
        assert index.settings.fingerprints.top_features == 8
        before = [index.fingerprint(t) for t in TEXTS[:20]]
        index.add_many([{"id": str(i), "text": t} for i, t in enumerate(TEXTS[:20])], batch="b")
    with admin_engine.connect() as connection:
        stored = connection.execute(sa.text(f"SELECT count(*) FROM {schema}.idf_terms")).scalar_one()
        summary = connection.execute(sa.text(f"SELECT value FROM {schema}.settings WHERE name = 'idf'")).scalar_one()
    assert stored == len(table.terms) and summary["digest"] == table.digest and summary["documents"] == 200
    with Index.open(database_url, schema=schema) as reopened:
        assert [reopened.fingerprint(t) for t in TEXTS[:20]] == before  # same text, same fingerprint
        assert reopened.query(TEXTS[3])[0].external_id == "3"
    with admin_engine.begin() as connection:
        connection.execute(sa.text(f"UPDATE {schema}.idf_terms SET documents = documents + 1 "
                                   f"WHERE term = (SELECT min(term) FROM {schema}.idf_terms)"))
    with pytest.raises(IncompatibleIndex, match="IDF table does not match"):
        Index.open(database_url, schema=schema)


def test_init_learns_from_files_and_reports_bad_input(run, tmp_path, schema, admin_engine):
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "text": "fine"}\n{"id": "2", "text": \n')
    failed = run("init", "--idf-from", str(bad))
    assert failed.exit_code != 0 and f"{bad}:2" in failed.output
    with admin_engine.connect() as connection:  # nothing half-written
        assert connection.execute(sa.text("SELECT count(*) FROM information_schema.tables "
                                          "WHERE table_schema = :s"), {"s": schema}).scalar_one() == 0
    created = run("init", "--idf-from", str(sample))
    assert created.exit_code == 0, created.output
    assert "IDF weights: 200 sample documents" in created.output
    assert "weighting=tfidf" in run("stats").output


def test_indexes_built_by_the_previous_recipe_keep_their_fingerprints(database_url, schema, admin_engine):
    """simhash64-v1 (before OpenCC) is still computed for the indexes that were built with it."""
    from simdb.methods import SimHash
    from simdb.settings import compute_canaries

    v1 = FingerprintSettings(algorithm="simhash64-v1")
    assert fingerprint("頭髮乾燥，後來發現", v1) != fingerprint("头发干燥，后来发现", v1)
    assert fingerprint("頭髮乾燥，後來發現") == fingerprint("头发干燥，后来发现")
    with Index.create(database_url, schema=schema):
        pass
    with admin_engine.begin() as connection:  # what an index written by the previous release stores
        connection.execute(sa.text(f"UPDATE {schema}.settings SET value = to_jsonb(CAST(:v AS text)) "
                                   "WHERE name = 'algorithm'"), {"v": "simhash64-v1"})
        connection.execute(sa.text(f"UPDATE {schema}.settings SET value = CAST(:c AS jsonb) WHERE name = 'canaries'"),
                           {"c": json.dumps(compute_canaries(SimHash(v1)))})
    with Index.open(database_url, schema=schema) as old:
        assert old.settings.fingerprints.algorithm == "simhash64-v1"
        assert old.fingerprint("頭髮乾燥，後來發現") == fingerprint("頭髮乾燥，後來發現", v1)


@pytest.mark.slow
def test_the_sample_is_tokenized_on_every_core_into_the_same_table():
    """``simdb init --idf-from`` tokenizes in a pool of workers; the table is the one one process learns, token
    for token (the texts: enough for several tasks per worker, blank ones left out)."""
    texts = [f"{r['text']} {copy}" for copy in range(4) for r in corpus()] + ["   ", ""]
    assert len(texts) > 2 * TASK_SIZE * 2
    alone = learn_idf(texts)
    pooled = SimHash.learn("idf", texts, lambda function, some: map_texts(function, some, workers=2))
    assert (pooled.documents, pooled.digest) == (alone.documents, alone.digest)
    assert pooled.documents == len(texts) - 2


def test_idf_from_learns_the_table_a_single_process_learns(run, tmp_path, schema, database_url):
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps({"id": str(i), "text": t}, ensure_ascii=False) + "\n"
                              for i, t in enumerate(TEXTS)), encoding="utf-8")
    result = run("init", "--idf-from", str(sample), "--workers", "2")
    assert result.exit_code == 0, result.output
    with Index.open(database_url, schema=schema) as index:
        assert index.settings.fingerprints.idf.digest == learn_idf(TEXTS).digest
