"""MinHash-LSH mode: signatures, band selection, and the index end to end on a real PostgreSQL."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from simdb import IncompatibleIndex, Index, SimdbError
from simdb.methods.minhash import signature as minhash
from simdb.pg.clusters import UnionFind
from simdb.samples import corpus
from tests.conftest import examples, on_a_local_copy

CORPUS = list(corpus())

SETTINGS = minhash.MinHashSettings()
TEXT = "近日，国家统计局发布数据显示，全国居民消费价格同比上涨百分之二，其中食品价格上涨较多，市场供应总体充足。"


def test_pinned_signature_digest():
    """The same text gives the same signature on every machine and in every release of this algorithm."""
    from simdb.methods import MinHash

    method = MinHash(SETTINGS)
    assert method.digest(method.sketch(TEXT)) == PINNED_DIGEST


PINNED_DIGEST = "181a245472ac027a"  # recorded when minhash32-v1 was written; a change needs a new ALGORITHM


def test_signature_is_the_same_in_another_process():
    code = ("import sys; from simdb.methods.minhash import signature as minhash; "
            "sys.stdout.write(minhash.to_bytes(minhash.signature(sys.argv[1], minhash.MinHashSettings())).hex())")
    other = subprocess.run([sys.executable, "-c", code, TEXT], capture_output=True, text=True, check=True).stdout
    assert other == minhash.to_bytes(minhash.signature(TEXT, SETTINGS)).hex()


def test_width_case_punctuation_and_script_do_not_change_the_signature():
    variants = ["頭髮乾燥，後來發現和網絡設定有關！", "头发干燥 后来发现和网络设定有关", "头发干燥，后来发现和网络设定有关。"]
    signatures = {minhash.to_bytes(minhash.signature(v, SETTINGS)) for v in variants}
    assert len(signatures) == 1
    english = ["The Quick, Brown Fox!", "the quick brown fox", "ＴＨＥ　ＱＵＩＣＫ　ＢＲＯＷＮ　ＦＯＸ"]
    assert len({minhash.to_bytes(minhash.signature(v, SETTINGS)) for v in english}) == 1


def test_estimate_tracks_exact_jaccard():
    """Over many pairs the estimate's error is that of a binomial with num_perm trials."""
    rng = random.Random(5)
    errors = []
    for _ in range(200):
        universe = rng.sample(range(10**9), 700)
        shared = rng.randrange(50, 300)
        a = np.array(universe[:300], dtype=np.uint64)
        b = np.array(universe[300 - shared:600 - shared], dtype=np.uint64)
        exact = len(set(a.tolist()) & set(b.tolist())) / len(set(a.tolist()) | set(b.tolist()))
        sa_, sb = minhash.signatures([a, b], SETTINGS)
        errors.append(minhash.similarity(sa_, sb) - exact)
    errors = np.array(errors)
    assert abs(errors.mean()) < 0.015  # unbiased
    assert errors.std() < 0.06  # binomial: at most sqrt(0.25 / 128) = 0.044


@pytest.mark.parametrize("threshold", [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95])
@pytest.mark.parametrize("num_perm", [64, 128, 256])
def test_band_choice_follows_the_s_curve(threshold, num_perm):
    bands, rows = minhash.choose_bands(threshold, num_perm)
    assert bands * rows <= num_perm and bands <= minhash.MAX_BANDS
    at_threshold = 1 - (1 - threshold ** rows) ** bands  # the S-curve, written out
    assert at_threshold == pytest.approx(minhash.candidate_probability(threshold, bands, rows))
    assert at_threshold >= minhash.CANDIDATE_RECALL
    # any more rows per band (fewer false candidates) would lose recall at the threshold
    for longer in range(rows + 1, num_perm + 1):
        more = min(num_perm // longer, minhash.MAX_BANDS)
        assert more == 0 or minhash.candidate_probability(threshold, more, longer) < minhash.CANDIDATE_RECALL
    # the curve rises with similarity; at the usual thresholds unrelated documents rarely become candidates
    curve = [minhash.candidate_probability(s / 20, bands, rows) for s in range(21)]
    assert curve == sorted(curve)
    if threshold >= 0.8 and num_perm >= 128:
        assert minhash.candidate_probability(0.2, bands, rows) < 0.1


def test_settings_are_checked():
    with pytest.raises(ValueError, match="multiple of 4"):
        minhash.MinHashSettings(num_perm=130)
    with pytest.raises(ValueError, match="threshold"):
        minhash.MinHashSettings(threshold=1.0)
    with pytest.raises(ValueError, match="do not fit"):
        minhash.MinHashSettings(bands=40, rows=4)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=SETTINGS.num_perm, max_size=SETTINGS.num_perm))
@settings(max_examples=examples(30), deadline=None)
def test_band_keys_are_stable_functions_of_the_bands(values):
    signature = np.array(values, dtype=np.uint32)
    keys = minhash.band_keys(signature, SETTINGS)
    changed = signature.copy()
    changed[0] ^= 1
    other = minhash.band_keys(changed, SETTINGS)
    assert other[1:] == keys[1:] and other[0] != keys[0]  # only the band holding position 0 moves
    # the batched form, which ingest uses, gives the same keys row by row
    assert minhash.band_keys_array(np.stack([signature, changed]), SETTINGS).tolist() == [list(keys), list(other)]


def test_a_chunks_own_pairs_join_its_signatures_once(monkeypatch):
    """Regression: ``pairs_within`` joined every signature of the chunk into rows again for each batch of
    candidates (a key column at a time: 22 joins of 51 MB for 100k); now once. The pairs stay every two
    signatures that share a band within the distance, as brute force finds them."""
    from simdb.methods import MinHash

    method = MinHash.new(threshold=0.7, num_perm=16)
    rng = np.random.default_rng(12)
    rows = rng.integers(0, 2**32, size=(80, 16), dtype=np.uint32)
    near = rows[:40].copy()
    for row in near:
        row[rng.choice(16, size=int(rng.integers(0, 6)), replace=False)] = 9
    sketches = [row.astype("<u4").tobytes() for row in np.concatenate([rows, near])]
    ids, keys = np.arange(1, len(sketches) + 1, dtype=np.int64), method.keys(sketches)
    joined, real = [], MinHash._rows
    monkeypatch.setattr(MinHash, "_rows", lambda self, given: joined.append(type(given)) or real(self, given))
    found = {tuple(row) for row in method.pairs_within(ids, method.stored(sketches), keys,
                                                       method.max_distance).tolist()}
    assert [kind for kind in joined if kind is not np.ndarray] == [list]
    expected = {(int(ids[i]), int(ids[j]), int(d)) for i in range(len(sketches)) for j in range(i)
                if (keys[i] == keys[j]).any() and (d := 16 - int((rows_of(sketches[i]) == rows_of(sketches[j])).sum()))
                <= method.max_distance}
    assert found == expected and len(found) >= 30


def rows_of(signature: bytes) -> np.ndarray:
    return np.frombuffer(signature, dtype="<u4")


@pytest.mark.parametrize("layout", [SETTINGS, minhash.MinHashSettings(threshold=0.5, num_perm=16),
                                    minhash.MinHashSettings(threshold=0.95, num_perm=1024)],
                         ids=lambda layout: f"{layout.bands}x{layout.rows}")
def test_band_keys_are_postgresqls_md5_keys_in_every_path(admin_engine, layout, monkeypatch):
    """The keys ingest stores (the compiled path where built, and its hashlib twin) are those SQL computes with
    md5() (band_key_sql: simdb_band_keys and simdb_lookup), for thousands of random signatures and the extremes."""
    from simdb.pg.methods.minhash import band_key_sql
    from tests.conftest import use_python_twins

    rng = np.random.default_rng(36)
    rows = rng.integers(0, 2**32, (3000, layout.num_perm), dtype=np.uint32)
    rows[0], rows[1] = 0, 2**32 - 1
    with admin_engine.connect() as connection:
        in_sql = connection.execute(sa.text(
            f"SELECT ARRAY[{', '.join(band_key_sql(layout, band) for band in range(layout.bands))}] "
            "FROM unnest(CAST(:signatures AS bytea[])) WITH ORDINALITY AS s(signature, n) ORDER BY n"),
            {"signatures": [minhash.to_bytes(row) for row in rows]}).scalars().all()
    assert minhash.band_keys_array(rows, layout).tolist() == in_sql
    with monkeypatch.context() as m:
        use_python_twins(m)
        assert minhash.band_keys_array(rows, layout).tolist() == in_sql


def _documents(count=300):
    return [{"id": r["id"], "text": r["text"]} for r in list(corpus())[:count]]


@on_a_local_copy
def assert_minhash_consistent(engine, schema, recipe):
    """Brute force: every stored pair is exactly a pair sharing a band within max_distance positions,
    duplicate_of is the earliest such document, clusters are the connected components."""
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            f"SELECT d.id, d.signature, o.id AS dup, d.duplicate_distance, d.cluster_id, d.simhash, "
            f"ARRAY[{', '.join('d.' + c for c in recipe.key_columns)}] AS keys "
            f"FROM {schema}.documents d LEFT JOIN {schema}.documents o ON o.id = d.duplicate_of ORDER BY d.id")).all()
        stored = set(connection.execute(sa.text(f"SELECT a_id, b_id, distance FROM {schema}.near_duplicates")).all())
    signatures = {row.id: np.frombuffer(bytes(row.signature), dtype="<u4") for row in rows}
    expected, forest, earlier = set(), UnionFind(), []
    for row in rows:
        assert row.simhash is None
        assert list(row.keys) == list(minhash.band_keys(signatures[row.id], recipe))
        forest.find(row.id)
        matches = []
        for other_id, other_keys in earlier:
            distance = recipe.num_perm - int(np.count_nonzero(signatures[row.id] == signatures[other_id]))
            if distance <= recipe.max_distance and any(a == b for a, b in zip(row.keys, other_keys)):
                matches.append((other_id, distance))
        assert (row.dup, row.duplicate_distance) == (matches[0] if matches else (None, None))
        for other_id, distance in matches:
            expected.add((other_id, row.id, distance))
            forest.union(other_id, row.id)
        earlier.append((row.id, row.keys))
    assert stored == expected
    assert {row.id: row.cluster_id for row in rows} == {row.id: forest.find(row.id) for row in rows}
    return expected


@pytest.mark.citus
def test_minhash_index_end_to_end(database_url, schema, admin_engine):
    documents = _documents()
    with Index.create(database_url, schema=schema, method="minhash", threshold=0.8) as index:
        assert index.method == "minhash"
        first = index.add_many(documents[:200], batch="one")
        second = index.add_many(documents[200:], batch="two")
        assert first.documents == 200 and second.documents == len(documents) - 200
        pairs = assert_minhash_consistent(admin_engine, schema, index.layout)
        assert len(pairs) > 20  # the corpus holds edited copies
        listed = list(index.pairs())
        assert len(listed) == len(pairs)
        assert all(p.similarity == pytest.approx(1 - p.distance / 128) and p.similarity >= 0.8 for p in listed)
        # a query finds the stored copy of its text, with the index's verification
        target = documents[5]
        matches = index.query(target["text"])
        assert matches[0].external_id == target["id"] and matches[0].similarity == 1.0
        assert index.query_many([target["text"], "completely unrelated words here"])[1] == []
        stricter = index.query(target["text"], max_distance=index.distance_for(0.95))
        assert all(m.similarity >= 0.95 for m in stricter)
        with pytest.raises(SimdbError, match="threshold"):
            index.distance_for(0.5)
        exported = list(index.export())
        assert len(exported) == len(documents) and len(exported[0]["signature"]) == 2 * 4 * 128
        stats = index.stats()
        assert stats["settings"]["method"] == "minhash" and stats["expected_candidates_per_lookup"] is None
        with pytest.raises(SimdbError, match="bands are fixed"):
            index.relayout(5)
        signature_of_target = index.fingerprint(target["text"])
    # reopened in another connection: same settings, same signatures
    with Index.open(database_url, schema=schema) as reopened:
        assert reopened.settings == index.settings
        assert reopened.fingerprint(target["text"]) == signature_of_target
    # the SQL functions give the same band keys and similarities as Python
    with admin_engine.connect() as connection:
        connection.exec_driver_sql(f"SET search_path = {schema}")
        same = connection.exec_driver_sql(
            f"SELECT bool_and(simdb_band_keys(signature) = ARRAY[{', '.join(index.layout.key_columns)}]) "
            "FROM documents").scalar_one()
        assert same
        found = dict(connection.execute(sa.text(
            "SELECT d.external_id, s.similarity FROM simdb_similar(:sig) s JOIN documents d ON d.id = s.document_id"),
            {"sig": signature_of_target}).all())
        assert found == {m.external_id: pytest.approx(m.similarity) for m in index_matches(database_url, schema,
                                                                                         target["text"])}
        view = connection.exec_driver_sql("SELECT min(similarity) FROM near_duplicate_pairs").scalar_one()
        assert view >= 0.8
        looser = dict(connection.execute(sa.text("SELECT * FROM simdb_similar(:sig, 0.5)"),
                                         {"sig": signature_of_target}).all())  # with a NOTICE (tests/test_sql.py)
        assert looser.items() >= {document: s for document, s in connection.execute(sa.text(
            "SELECT * FROM simdb_similar(:sig)"), {"sig": signature_of_target}).all()}.items()
        with pytest.raises(sa.exc.DBAPIError, match="min_similarity must be between 0 and 1"):
            connection.execute(sa.text("SELECT * FROM simdb_similar(:sig, -0.5)"), {"sig": signature_of_target})


def index_matches(database_url, schema, text):
    with Index.open(database_url, schema=schema) as index:
        return index.query(text)


def test_minhash_index_refuses_other_settings(database_url, schema):
    with Index.create(database_url, schema=schema, method="minhash", threshold=0.8):
        pass
    with pytest.raises(IncompatibleIndex, match="threshold"):
        Index.create(database_url, schema=schema, exist_ok=True, method="minhash", threshold=0.9)
    with Index.create(database_url, schema=schema, exist_ok=True, method="minhash", threshold=0.8) as same:
        assert same.method == "minhash"


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_minhash_through_the_cli(run, tmp_path):
    documents = _documents(120)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in documents))
    created = run("init", "--method", "minhash", "--threshold", "0.7")
    assert created.exit_code == 0 and "bands of" in created.output
    assert run("ingest", str(path), "--batch", "b").exit_code == 0
    pairs = [json.loads(line) for line in run("pairs").output.splitlines()]
    assert pairs and all(p["similarity"] >= 0.7 for p in pairs)
    query = run("query", documents[3]["text"])
    assert query.output.splitlines()[0] == "similarity  id" and documents[3]["id"] in query.output
    assert run("query", "--min-similarity", "0.5", "x").exit_code != 0
    wrong = run("query", "--simhash", "0123456789abcdef")
    assert wrong.exit_code != 0 and "MinHash index" in wrong.output
    stats = run("stats")
    assert "method=minhash" in stats.output
    report = tmp_path / "report.html"
    assert run("report", "--output", str(report)).exit_code == 0
    page = report.read_text()
    assert "Lookup candidates of a sample" in page and "estimated Jaccard similarity of at least 0.703" in page
    mixed = run("init", "--method", "minhash", "--blocks", "5")
    assert mixed.exit_code != 0 and "SimHash options" in mixed.output


def test_simdb_similar_reads_the_band_indexes_not_the_table(database_url, schema, admin_engine):
    """Inside the function a bare ``signature`` is the documents column, not the parameter: a band key computed
    from it matched every row, and every lookup scanned the table. EXPLAIN shows only a Function Scan, so the
    table's own scan counters are read instead."""
    with Index.create(database_url, schema=schema, method="minhash") as index:
        index.add_many([{"id": r["id"], "text": r["text"]} for r in CORPUS[:120]], batch="b")
        signature = index.fingerprint(CORPUS[5]["text"])
        expected = {m.external_id for m in index.query(CORPUS[5]["text"])}

    with admin_engine.connect() as connection:  # one transaction: its own scan counts, no other backend's
        connection.exec_driver_sql(f"SET search_path = {schema}")
        connection.exec_driver_sql("SET enable_seqscan = off")  # 120 rows: a scan would be cheaper, if possible
        found = set(connection.execute(sa.text(
            "SELECT d.external_id FROM simdb_similar(:sig) s JOIN documents d ON d.id = s.document_id"),
            {"sig": signature}).scalars())
        seq_scans, index_scans = connection.execute(sa.text(
            "SELECT sum(seq_scan), sum(coalesce(idx_scan, 0)) FROM pg_stat_xact_user_tables WHERE relid IN "
            "(SELECT inhrelid FROM pg_inherits WHERE inhparent = CAST(:t AS regclass))"),  # every segment
            {"t": f"{schema}.documents"}).one()
    assert found == expected
    assert seq_scans == 0, "simdb_similar scanned the documents table"
    assert index_scans > 0
