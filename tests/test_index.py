"""The index against numpy brute force, on a real PostgreSQL."""

import random
import time

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import BatchError, IncompatibleIndex, Index, IndexNotFound, InputError, fingerprint
from simdb.bits import hamming_array, to_signed
from simdb.matches import ProbeKeys, distinct, key_matches, shared_key_candidates, shared_key_pairs
from simdb.pg import keyed
from simdb.text import content_hash
from simdb.ingest import FingerprintedBatch, IngestOptions
from simdb.inputs import Document
from simdb.samples import sections
from tests.conftest import assert_consistent, count_rows, examples


def make_batch(fingerprints, prefix):
    batch = FingerprintedBatch()
    for i, fp in enumerate(fingerprints):
        batch.append(f"{prefix}-{i}", fp, content_hash(f"{prefix}-{i}"), 10, {}, f"{prefix}-{i}")
    return batch


def flip(fingerprint, bits):
    for bit in bits:
        fingerprint ^= 1 << bit
    return fingerprint


@given(st.lists(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(-3, 3), st.integers(0, 2)),
                         max_size=30), max_size=4))
def test_distinct_keeps_each_row_once_in_order_as_brute_force_does(chunks):
    """A chunked result's rows (several key columns find one pair again and again), each once, sorted by its
    columns in turn: brute force is Python's set and sort of the tuples."""
    arrays = [np.array(chunk, dtype=np.int64).reshape(-1, 3) for chunk in chunks]
    found = distinct(arrays)
    assert found.dtype == np.int64 and found.shape[1] == 3
    assert [tuple(row) for row in found.tolist()] == sorted({row for chunk in chunks for row in chunk})


class Archive:
    """An index and the same fingerprints in a numpy array, for brute-force answers."""

    def __init__(self, index):
        self.index = index
        self.ids: list[str] = []
        self.fps = np.empty(0, dtype=np.uint64)

    def add(self, fingerprints, prefix):
        self.index.add_fingerprinted(make_batch(fingerprints, prefix), batch=prefix)
        self.ids += [f"{prefix}-{i}" for i in range(len(fingerprints))]
        self.fps = np.concatenate([self.fps, np.array(fingerprints, dtype=np.uint64)])

    def brute_force(self, query, max_distance):
        distances = hamming_array(self.fps, query)
        return sorted((int(d), self.ids[i]) for i in np.flatnonzero(distances <= max_distance) for d in [distances[i]])

    def brute_force_pairs(self, max_distance):
        pairs = set()
        for i in range(len(self.fps)):
            distances = hamming_array(self.fps[i + 1:], int(self.fps[i]))
            for j in np.flatnonzero(distances <= max_distance):
                pairs.add((self.ids[i], self.ids[i + 1 + j], int(distances[j])))
        return pairs


@pytest.fixture(params=[(3, 4), (3, 5), (4, 6)], ids=["k3-blocks4", "k3-blocks5", "k4-blocks6"])
def archive(request, database_url, schema):
    """2,000 random fingerprints, then clusters planted by each test."""
    max_distance, blocks = request.param
    with Index.create(database_url, schema=schema, blocks=blocks, max_distance=max_distance) as index:
        archive = Archive(index)
        rng = random.Random(blocks)
        archive.add([rng.getrandbits(64) for _ in range(2000)], "random")
        yield archive


uint64 = st.integers(0, 2**64 - 1)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=uint64, data=st.data())
def test_index_returns_exactly_the_brute_force_answer(archive, base, data):
    """Neighbours planted at every distance 0..k+2 around a base; the index must agree with brute force."""
    k = archive.index.layout.max_distance
    neighbours = [flip(base, data.draw(st.sets(st.integers(0, 63), min_size=d, max_size=d)))
                  for d in range(k + 3) for _ in range(2)]
    archive.add([base, *neighbours], f"cluster-{len(archive.ids)}")
    for max_distance in (k, 1):
        expected = archive.brute_force(base, max_distance)
        found = sorted((m.distance, m.external_id) for m in archive.index.query_fingerprint(base, max_distance))
        assert found == expected
        batch_found = archive.index.query_fingerprints([base, neighbours[-1]], max_distance)
        assert sorted((m.distance, m.external_id) for m in batch_found[0]) == expected
        assert sorted((m.distance, m.external_id) for m in batch_found[1]) == \
            archive.brute_force(neighbours[-1], max_distance)


@pytest.mark.citus
@pytest.mark.slow_on_citus
@pytest.mark.citus_by_id
def test_pairs_equal_brute_force(archive):
    rng = random.Random(11)
    k = archive.index.layout.max_distance
    for cluster in range(30):
        base = rng.getrandbits(64)
        archive.add([base] + [flip(base, rng.sample(range(64), d)) for d in range(k + 2)], f"c{cluster}")
    expected = archive.brute_force_pairs(k)
    found = {(p.a, p.b, p.distance) for p in archive.index.pairs()}
    assert found == expected
    assert len(found) > 30 * k
    in_batch = {(p.a, p.b, p.distance) for p in archive.index.pairs(batch="c3")}
    assert in_batch == {p for p in expected if p[0].startswith("c3-") or p[1].startswith("c3-")}


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 5), st.integers(0, 2)), max_size=30),
                max_size=4),
       st.sampled_from([1, 2**20, 2**40, 2**62]))
def test_distinct_is_every_distinct_row_once_sorted(chunks, scale):
    """Row by row what ``np.unique(axis=0)`` gives (each row once, sorted by the first column, then the second,
    ...); at the larger scales the columns' ranges multiply past 2**63 and the rows are sorted column by column."""
    arrays = [np.array(chunk, dtype=np.int64).reshape(-1, 3) * np.array([scale, scale, 1]) for chunk in chunks]
    rows = sorted({tuple(row) for array in arrays for row in array.tolist()})
    found = distinct(arrays)
    assert found.dtype == np.int64 and found.shape == (len(rows), 3)
    assert [tuple(row) for row in found.tolist()] == rows


key_rows = st.integers(1, 4).flatmap(lambda width: st.tuples(st.just(width), st.lists(
    st.lists(st.integers(0, 3), min_size=width, max_size=width), max_size=40)))


@settings(max_examples=examples(300), deadline=None)
@given(shape_rows=key_rows, batch=st.sampled_from([1, 2, 5, 1 << 20]))
def test_shared_key_pairs_are_every_two_rows_agreeing_on_a_key(shape_rows, batch):
    """Small key ranges make runs of equal keys and whole rows repeated (one class per text copy); small
    batches split the candidates between runs and between pairs of classes."""
    width, rows = shape_rows
    keys = np.array(rows, dtype=np.int64).reshape(len(rows), width)
    expected = [(i, j) for i in range(len(rows)) for j in range(i) if (keys[i] == keys[j]).any()]
    assert [tuple(pair) for pair in shared_key_pairs(keys).tolist()] == expected
    batches = list(shared_key_candidates(keys, batch))
    found = {tuple(pair) for part in batches for pair in part.tolist()}
    assert sorted(found) == expected


@settings(max_examples=examples(300), deadline=None)
@given(width=st.integers(1, 4), data=st.data(), batch=st.sampled_from([1, 2, 5, 1 << 20]),
       table_bits=st.sampled_from([1, 2, None]))
def test_key_matches_are_every_probe_and_row_agreeing_on_a_key_once_per_key(width, data, batch, table_bits):
    """Small key ranges make runs of equal keys on both sides, tiny hash tables buckets of unequal keys
    (negative ones too, as MinHash band keys are); small batches split a row's probes."""
    side = st.lists(st.lists(st.sampled_from([0, 1, 2, 3, 5, -1, -4, 2**62]), min_size=width, max_size=width),
                    max_size=30)
    probes = np.array(data.draw(side), dtype=np.int64).reshape(-1, width)
    rows = np.array(data.draw(side), dtype=np.int64).reshape(-1, width)
    expected = sorted((p, r) for p in range(len(probes)) for r in range(len(rows))
                      for c in range(width) if probes[p, c] == rows[r, c])
    parts = list(key_matches(ProbeKeys(probes, table_bits), rows, batch))
    assert sorted(tuple(pair) for part in parts for pair in part.tolist()) == expected
    assert all(len(part) for part in parts)


def test_shared_key_candidates_come_in_batches_of_whole_runs():
    keys = np.array([[k, i] for k in range(3) for i in range(3)], dtype=np.int64)  # 3 runs of 3 in each column
    assert [len(part) for part in shared_key_candidates(keys, 3)] == [3] * 6
    assert [len(part) for part in shared_key_candidates(keys)] == [9, 9]  # no copies: one batch per column


@pytest.mark.parametrize("method", [{}, {"method": "minhash", "num_perm": 16, "threshold": 0.7}],
                         ids=["simhash", "minhash"])
def test_a_chunks_own_pairs_from_memory_equal_brute_force(method):
    """Method.pairs_within (a chunk's pairs, computed in Python) against every pair's distance."""
    from simdb.methods.base import Method

    chosen = Method.named(method.get("method", "simhash")).new(**{k: v for k, v in method.items() if k != "method"})
    rng = np.random.default_rng(5)
    if chosen.name == "simhash":
        base = [int(x) for x in rng.integers(0, 2**63, size=60)]
        sketches = base + [flip(b, rng.choice(64, size=int(rng.integers(0, 6)), replace=False).tolist()) for b in base]
        sketches += sketches[:10]  # copies of one text: whole rows of keys repeated
    else:
        rows = rng.integers(0, 2**32, size=(60, 16), dtype=np.uint32)
        near = rows.copy()
        for row in near:
            row[rng.choice(16, size=int(rng.integers(0, 8)), replace=False)] = 7
        everything = np.concatenate([rows, near, rows[:10]])
        sketches = [row.astype("<u4").tobytes() for row in everything]
    ids = np.arange(100, 100 + len(sketches), dtype=np.int64)
    stored = chosen.stored(sketches)
    k = chosen.max_distance
    keys = chosen.keys(sketches)
    found = {tuple(row) for row in chosen.pairs_within(ids, stored, keys, k).tolist()}
    within, keyed = set(), set()
    for i in range(len(sketches)):
        distances = chosen.distances(sketches[i], stored[:i])
        for j in np.flatnonzero(distances <= k).tolist():
            within.add((int(ids[i]), int(ids[j]), int(distances[j])))
            if (keys[i] == keys[j]).any():
                keyed.add((int(ids[i]), int(ids[j]), int(distances[j])))
    assert found == keyed and len(found) >= 10
    if chosen.name == "simhash":  # the pigeonhole: every pair within k shares a key
        assert keyed == within


SECTION = next(text for _, text in sections() if len(text) > 1400)


@pytest.mark.citus
def test_duplicate_of_points_at_the_earliest_match(index):
    text = SECTION
    first = index.add_many([{"id": "old", "text": text}], batch="one")
    assert (first.new, first.exact_duplicates, first.near_duplicates) == (1, 0, 0)
    second = index.add_many([{"id": "copy", "text": text}, {"id": "edit", "text": text.replace(" the ", " teh ", 2)},
                             {"id": "other", "text": "Nothing like the rest at all, a different subject."}],
                            batch="two")
    assert (second.documents, second.new, second.exact_duplicates, second.near_duplicates) == (3, 1, 1, 1)
    with index.database.engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT id, external_id, duplicate_of FROM documents")).all()
    names = {row.id: row.external_id for row in stored}
    rows = {row.external_id: names.get(row.duplicate_of) for row in stored}
    assert rows == {"old": None, "copy": "old", "edit": "old", "other": None}


@pytest.mark.citus
def test_a_lookup_is_planned_once_per_connection(index):
    """Planning a lookup through every segment's key indexes costs more than running it (1.9 of 2.6 ms at 10M
    documents): the statement is prepared on its first run, and the prepared one answers the same."""
    rng = random.Random(5)
    fingerprints = [rng.getrandbits(64) for _ in range(50)]
    index.add_fingerprinted(make_batch(fingerprints, "p"), batch="p")
    index.database.engine.dispose()  # one connection from here on: the lookup's
    first = index.query_fingerprint(flip(fingerprints[7], [1, 40]))
    assert [(m.external_id, m.distance) for m in first] == [("p-7", 2)]
    with index.database.engine.connect() as connection:
        prepared = connection.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
    lookup = f"FROM {keyed.table(index.settings.method)} WHERE key = ANY" if index.context.keyed else "c JOIN documents d ON d.id = c.document_id"
    assert [s for s in prepared if lookup in s], prepared
    assert index.query_fingerprint(flip(fingerprints[7], [1, 40])) == first


def test_a_connection_that_prepares_nothing_is_not_made_to(index):
    """Behind PgBouncer in transaction mode a prepared statement may be gone by the next transaction: a
    connection set to prepare nothing (psycopg's ``prepare_threshold = None``) gets no prepared lookup."""
    rng = random.Random(6)
    fingerprints = [rng.getrandbits(64) for _ in range(20)]
    index.add_fingerprinted(make_batch(fingerprints, "q"), batch="q")
    sa.event.listen(index.database.engine, "connect", lambda dbapi, _: setattr(dbapi, "prepare_threshold", None))
    index.database.engine.dispose()
    for _ in range(8):  # more than psycopg's default threshold, too
        assert [(m.external_id, m.distance) for m in index.query_fingerprint(flip(fingerprints[3], [9]))] == [("q-3", 1)]
    with index.database.engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one() == 0


@pytest.mark.citus
def test_matches_within_a_batch_are_found(index):
    text = SECTION
    summary = index.add_many([{"id": "1", "text": text}, {"id": "2", "text": text}], batch="b")
    assert (summary.new, summary.exact_duplicates, summary.within_batch) == (1, 1, 1)
    assert [(p.a, p.b, p.distance) for p in index.pairs()] == [("1", "2", 0)]


@pytest.mark.citus
def test_a_failing_batch_leaves_nothing(index, admin_engine):
    index.add_many([{"id": "a", "text": "first document text"}], batch="one")
    before = count_rows(admin_engine, index.database.schema)
    with pytest.raises(InputError, match="'a' is already stored with a different text"):
        index.add_many([{"id": "b", "text": "second"}, {"id": "a", "text": "again"}], batch="two")
    with pytest.raises(InputError, match="empty or only whitespace"):
        index.add_many([{"id": "c", "text": "fine"}, {"id": "d", "text": "  "}], batch="three")
    with pytest.raises(BatchError, match="already complete"):
        index.add_many([{"id": "e", "text": "fine"}], batch="one")
    assert count_rows(admin_engine, index.database.schema) == before


@pytest.mark.citus
def test_metadata_and_export(index):
    index.add_many([{"id": 7, "text": "some text here", "source": "web", "tags": ["x", "y"]}], batch="m")
    exported = list(index.export())
    assert exported == [{"id": "7", "simhash": f"{fingerprint('some text here'):016x}", "source": "web",
                         "tags": ["x", "y"]}]


def test_metadata_named_like_export_fields_is_kept(index):
    index.add_many([{"id": "x", "text": "text", "metadata": {"id": "other-system-id", "simhash": "0"}}], batch="m")
    (record,) = index.export()
    assert record == {"id": "x", "simhash": f"{fingerprint('text'):016x}", "metadata.id": "other-system-id",
                      "metadata.simhash": "0"}


def test_documents_without_metadata_are_staged_without_json(index, monkeypatch):
    """Regression: every document's metadata went through psycopg's JSON dumping, ``{}`` included (0.6-1.4 s
    per 100k documents of a chunk's COPY). Documents without metadata are now staged without it and stored
    with ``{}``, as before; the one that has metadata keeps it. (Staging is written by copy_in_columns, which
    dumps JSON itself: both dumpers are watched.)"""
    import psycopg.types.json

    from simdb.pg import copy

    dumped = []
    real, ours = psycopg.types.json._JsonDumper._dumps, copy._jsonb
    monkeypatch.setattr(psycopg.types.json._JsonDumper, "_dumps", lambda obj: dumped.append(obj) or real(obj))
    monkeypatch.setattr(copy, "_jsonb", lambda obj: dumped.append(obj) or ours(obj))
    index.add_many([{"id": f"d{i}", "text": f"text number {i}"} for i in range(50)]
                   + [{"id": "m", "text": "text with metadata", "source": "web"}], batch="m")
    assert dumped == [{"source": "web"}]
    with index.database.engine.connect() as connection:
        stored = dict(connection.exec_driver_sql(f"SELECT external_id, metadata FROM {index.database.schema}"
                                                 ".documents").all())
    assert stored == {**{f"d{i}": {} for i in range(50)}, "m": {"source": "web"}}


def test_an_empty_input_records_nothing(index):
    """Issue 9: an empty input made a complete 0-document batch without a word; now it records nothing."""
    summary = index.add_many([], batch="nothing-today")
    assert (summary.documents, summary.new, summary.recorded) == (0, 0, False)
    assert index.stats()["batches"] == []


@pytest.mark.citus
def test_reopening_gives_the_same_answers(database_url, schema):
    texts = [f"document number {i} talks about topic {i % 7} in some detail, at length" for i in range(50)]
    with Index.create(database_url, schema=schema, blocks=5) as index:
        index.add_many([{"id": str(i), "text": t} for i, t in enumerate(texts)], batch="x")
        before = [index.query(t) for t in texts[:10]]
    with Index.open(database_url, schema=schema) as index:
        assert index.layout.blocks == 5
        assert [index.query(t) for t in texts[:10]] == before


def test_open_refuses_other_settings(index, database_url):
    schema = index.database.schema
    with pytest.raises(IncompatibleIndex, match="max_distance: asked 3, stored 4"):
        Index.open(database_url, schema=schema, max_distance=3)
    with pytest.raises(IncompatibleIndex, match="tokenizer: asked 'words', stored 'auto'"):
        Index.create(database_url, schema=schema, exist_ok=True, tokenizer="words")
    with Index.create(database_url, schema=schema, exist_ok=True) as same:
        assert not same.created


def test_changed_fingerprints_are_detected(index, database_url, admin_engine):
    schema = index.database.schema
    with admin_engine.begin() as connection:
        connection.execute(sa.text(
            f"UPDATE {schema}.settings SET value = jsonb_set(value, ARRAY[(SELECT min(k) FROM jsonb_object_keys(value) k)],"
            " '\"0000000000000000\"') WHERE name = 'canaries'"))
    with Index.open(database_url, schema=schema) as reopened:
        with pytest.raises(IncompatibleIndex, match="fingerprints 1 reference text"):
            reopened.query("anything")
        assert reopened.query_fingerprint(0) == []  # lookups by fingerprint need no recomputation


def test_tampered_schema_and_missing_index_are_errors(index, database_url, admin_engine):
    schema = index.database.schema
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"ALTER TABLE {schema}.documents DROP COLUMN key_3")
    with pytest.raises(IncompatibleIndex, match=r"lacks key columns \['key_3'\]"):
        Index.open(database_url, schema=schema)
    with pytest.raises(IndexNotFound, match="simdb init"):
        Index.open(database_url, schema=schema + "_absent")
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {schema}.alembic_version SET version_num = '9999'")
    with pytest.raises(IncompatibleIndex, match="newer simdb"):
        Index.open(database_url, schema=schema)


def test_max_distance_above_the_index_is_refused(index):
    with pytest.raises(Exception, match="between 0 and the index's maximum distance 4"):
        index.query_fingerprint(0, 5)


@pytest.mark.citus
def test_stats(index):
    index.add_many([{"id": str(i), "text": f"text {i} " * 20} for i in range(20)], batch="s")
    stats = index.stats()
    assert stats["documents"] == 20
    assert stats["layout"] == "6 blocks of 10/11 bits, 15 keys of 2 blocks (20/21/22 bits), max distance 4"
    # issue 9: a document is not its own candidate (this counted 4.0 for 20 unrelated documents)
    from collections import Counter
    keys = [index.layout.block_keys(int(e["simhash"], 16)) for e in index.export()]
    buckets = [Counter(row[k] for row in keys) for k in range(len(index.layout.keys))]
    expected = sum(sum(n * (n - 1) for n in b.values()) / 20 for b in buckets)
    assert stats["measured_candidates_per_lookup"] == round(expected, 2)
    assert [b["name"] for b in stats["batches"]] == ["s"]


def test_stats_of_a_large_archive_sample_its_buckets_without_bias(database_url, schema, monkeypatch):
    """Every fingerprint stored four times, and no two fingerprints sharing a 25-bit key: every bucket of
    every key holds four documents, so a sample's mean must equal the whole archive's, whichever documents
    it draws."""
    from simdb.pg import reads

    rng = random.Random(4)
    fingerprints = [rng.getrandbits(64) for _ in range(700)] * 4
    index = Index.create(database_url, schema=schema, blocks=5, max_distance=3)
    index.add_fingerprinted(make_batch(fingerprints, "four"), batch="four")
    exact = index.stats(exact=True)
    assert exact["measured_from_sample"] is None and exact["measured_candidates_per_lookup"] == 30  # 10 keys
    assert index.stats()["measured_from_sample"] is None  # 2,800 documents: measured whole
    monkeypatch.setattr(reads, "STATS_SAMPLE", 50)
    sampled = index.stats()
    assert sampled["measured_from_sample"] == 50
    assert sampled["measured_candidates_per_lookup"] == exact["measured_candidates_per_lookup"]
    assert {(b["key"], b["value"], b["documents"]) for b in sampled["largest_key_buckets"]} <= \
        {(column, value, n) for column in index.layout.key_columns for value, n in bucket_sizes(index, column)}
    index.close()


def bucket_sizes(index, column):
    with index.database.engine.connect() as connection:
        return connection.exec_driver_sql(f"SELECT {column}, count(*) FROM documents GROUP BY 1").all()


def test_signed_storage_of_high_fingerprints(index):
    high = [2**64 - 1, 2**63, 2**63 - 1, 0]
    index.add_fingerprinted(make_batch(high, "h"), batch="h")
    with index.database.engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT simhash FROM documents ORDER BY id")).scalars().all()
    assert stored == [to_signed(v) for v in high]
    assert [e["simhash"] for e in index.export()] == [f"{v:016x}" for v in high]
    assert [m.external_id for m in index.query_fingerprint(2**64 - 1, 0)] == ["h-0"]


@pytest.mark.citus
def test_exact_duplicates_across_segments_and_within_the_chunk_match_the_content_hash_oracle(index, admin_engine):
    """Exact duplicates are read from the distance-0 pairs: the same text is stored (in any segment) or comes
    earlier in the chunk. A document with the same fingerprint but another text is a near-duplicate."""
    from simdb.pg import segments

    with index.database.engine.begin() as connection:
        segments.save_policy(connection, segments.SegmentPolicy(size=40))
    rng = np.random.default_rng(11)
    fps = [int(v) for v in rng.integers(0, 2**63, 150, dtype=np.int64)]
    stored = FingerprintedBatch()
    for i, fp in enumerate(fps):
        stored.append(f"s-{i}", fp, content_hash(f"text {i}"), 10, {}, f"s:{i}")
    index.add_fingerprinted(stored, batch="stored")
    new = FingerprintedBatch()
    texts = [5, 77, 149, 1000, 1001, 1000, 5, 2000]  # stored (three segments), new, new, earlier in chunk, ...
    fresh = {text: int(v) for text, v in zip((1000, 1001, 2000), rng.integers(0, 2**63, 3, dtype=np.int64))}
    for i, text in enumerate(texts):
        new.append(f"n-{i}", fps[text] if text < 150 else fresh[text], content_hash(f"text {text}"), 10, {}, f"n:{i}")
    new.append("n-same-fingerprint", fps[6], content_hash("another text"), 10, {}, "n:8")
    summary = index.add_fingerprinted(new, batch="new")
    with index.database.engine.connect() as connection:
        assert len(segments.list_segments(connection, distributed=index.context.distributed)) >= 4
    with admin_engine.connect() as connection:
        statuses = dict(connection.execute(sa.text(
            f"SELECT r.external_id, r.status FROM {index.database.schema}.records r "
            f"JOIN {index.database.schema}.batches b ON b.id = r.batch_id WHERE b.name = 'new'")).all())
    seen, oracle = {f"text {i}" for i in range(150)}, {}
    for i, text in enumerate(texts):
        oracle[f"n-{i}"] = "exact" if f"text {text}" in seen else ("near" if text < 150 else "new")
        seen.add(f"text {text}")
    oracle["n-same-fingerprint"] = "near"
    assert statuses == oracle
    assert (summary.exact_duplicates, summary.near_duplicates) == (5, 1)


@pytest.mark.citus
def test_a_document_linking_two_earlier_ones_in_its_chunk_joins_their_clusters(index, admin_engine):
    """Regression (issue 9): y is within 3 bits of p and of x, which are 6 bits apart; all three are one
    cluster. merge_clusters relabelled only the later side of each pair, so x kept its own cluster."""
    index.add_fingerprinted(make_batch([0, 0b111111, 0b111], "c"), batch="c")
    with admin_engine.connect() as connection:
        clusters = connection.execute(sa.text(
            f"SELECT external_id, cluster_id FROM {index.database.schema}.documents ORDER BY id")).all()
    assert len({cluster for _, cluster in clusters}) == 1
    assert_consistent(admin_engine, index.database.schema)


def test_a_batch_built_whole_is_stored_as_one_appended_to(index):
    """Benchmarks build a FingerprintedBatch from lists; its records get positions 1, 2, 3, ... as append gives."""
    whole = FingerprintedBatch(["w-0", "w-1"], [1, 2], [content_hash("w-0"), content_hash("w-1")], [3, 3], [{}, {}],
                               ["w-0", "w-1"])
    assert whole.positions == [1, 2]
    assert index.add_fingerprinted(whole, batch="whole").documents == 2
    assert [(v.position, v.id, v.status) for v in index.verdicts("whole")] == [(1, "w-0", "new"), (2, "w-1", "near")]
    with pytest.raises(ValueError, match="one id, sketch"):
        FingerprintedBatch(["a"], [], [], [], [], [])


def test_a_batch_lasts_from_its_first_read_to_its_last_commit(index, admin_engine, schema):
    """batch_summary.duration once began after the first chunk was fingerprinted (0.34 s for a 38 s ingest)."""
    def slowly():
        time.sleep(1.5)  # reading and fingerprinting take this long before the first chunk reaches the database
        yield Document("slow-0", "a document that took its time to arrive")
        yield Document("slow-1", "another document that took its time to arrive")

    index.ingest(slowly(), IngestOptions(batch="slow"))
    with admin_engine.connect() as connection:
        duration = connection.execute(sa.text(
            f"SELECT extract(epoch FROM duration) FROM {schema}.batch_summary WHERE name = 'slow'")).scalar_one()
    assert duration >= 1.5


def test_a_batch_of_lookups_gives_each_match_its_stored_metadata(index):
    """``query_fingerprints`` reads the matches' metadata with them (an empty one comes back from the server as
    NULL, not decoded): each match carries the metadata it was stored with, ``{}`` where it had none, a dict of
    its own that a caller may change without changing another match's, as ``query_fingerprint`` gives."""
    rng = random.Random(12)
    stored = [rng.getrandbits(64) for _ in range(40)]
    batch = FingerprintedBatch()
    for i, fp in enumerate(stored):
        batch.append(f"d{i}", fp, content_hash(f"d{i}"), 10, {"n": i, "tag": ["x"]} if i % 3 == 0 else {}, f"d{i}")
    index.add_fingerprinted(batch, batch="b")
    probes = [flip(stored[i], [i % 64]) for i in range(40)]
    found = index.query_fingerprints(probes, connections=1)
    assert [[(m.external_id, m.metadata) for m in matches] for matches in found] == \
        [[(f"d{i}", {"n": i, "tag": ["x"]} if i % 3 == 0 else {})] for i in range(40)]
    assert found == [index.query_fingerprint(probe) for probe in probes]
    found[1][0].metadata["changed"] = True
    assert found[2][0].metadata == {}
