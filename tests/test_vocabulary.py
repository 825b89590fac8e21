"""One SQL vocabulary for both methods, the neighbours and cluster views, and the maintained clusters table.

Each answer is checked against what Python computes from the stored pairs and sketches, on a SimHash
index and on MinHash indexes (estimate and exact), and every lookup's plan, function bodies included
(auto_explain with nested statements), must read the indexes, not scan ``documents``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import sqlalchemy as sa

from simdb import Index
from simdb.bits import to_unsigned
from simdb.pg.methods import sql_of
from simdb.samples import corpus
from tests.conftest import Concurrently, assert_clusters_table, explained
from tests.maintained import assert_maintained
from tests.test_texts import THRESHOLD, exact_distance, generated, jaccard, shingles

#: Connections a test's lookups run on side by side (each document's lookups on one of them).
LOOKUP_THREADS = 4

SETTINGS = {"simhash": {"store_text": True}, "minhash": {"method": "minhash"},
            "minhash-exact": {"method": "minhash", "verify": "exact"}}


@pytest.fixture(params=list(SETTINGS))
def archive(request, database_url, backend, admin_engine, read_only_archives):
    """An index of each kind with two batches, built once per backend and kind for the tests that read it;
    yields (index, its documents as ingested)."""
    def build(schema, stack):
        documents = list(corpus()) if request.param == "simhash" else generated(seed=3, bases=20)
        index = stack.enter_context(Index.create(database_url, schema=schema, **SETTINGS[request.param]))
        half = len(documents) // 2
        index.add_many(documents[:half], batch="first", chunk_size=50)
        index.add_many(documents[half:], batch="second", chunk_size=50)
        return index, documents

    with read_only_archives.use((database_url, request.param), admin_engine, backend, build) as built:
        yield built


def signed(fingerprint: int) -> int:
    """A fingerprint as the BIGINT column stores it."""
    return fingerprint - (1 << 64) if fingerprint >= 1 << 63 else fingerprint


def rows(index: Index, statement: str, **params) -> list[sa.Row]:
    with index.database.engine.connect() as connection:
        connection.exec_driver_sql(f"SET search_path TO {index.database.schema}")
        return connection.execute(sa.text(statement), params).all()


@pytest.mark.citus
def test_neighbours_are_every_stored_pair_from_both_sides(archive):
    index, documents = archive
    method = index.settings.method
    names = {row.id: (row.external_id, row.batch) for row in rows(
        index, "SELECT d.id, d.external_id, b.name AS batch FROM documents d JOIN batches b ON b.id = d.batch_id")}
    pairs = rows(index, "SELECT a_id, b_id, distance FROM near_duplicates")
    expected = {(names[b][0], names[b][1], names[a][0], names[a][1], True, d) for a, b, d in pairs} | \
               {(names[a][0], names[a][1], names[b][0], names[b][1], False, d) for a, b, d in pairs}
    view = rows(index, "SELECT external_id, batch, neighbour_external_id, neighbour_batch, neighbour_is_earlier, "
                       "distance, similarity FROM document_neighbours")
    assert {tuple(row[:6]) for row in view} == expected and len(view) == 2 * len(pairs) > 20
    assert all(row.similarity == pytest.approx(method.similarity(row.distance), abs=1e-6) for row in view)
    # every stored document's, with and without neighbours: routed on Citus, milliseconds each (0021)
    answers = {name: rows(index, "SELECT * FROM simdb_neighbours(:id)", id=name)
               for name in sorted({name for name, _ in names.values()})}
    assert sorted(row for found in answers.values() for row in found) == sorted(rows(
        index, "SELECT * FROM document_neighbours"))
    assert all(row.external_id == name for name, found in answers.items() for row in found)
    assert rows(index, "SELECT * FROM simdb_neighbours('no such document')") == []
    assert rows(index, "SELECT * FROM simdb_neighbours(NULL)") == []
    if method.name == "minhash" and method.settings.exact:
        return  # by the texts: test_every_lookup_on_an_exact_index_gives_the_exact_jaccard_of_the_inputs
    # a brute force over the inputs: every two documents within the index's distance, by their sketches
    sketches = {d["id"]: index.fingerprint(d["text"]) for d in documents}
    order = sorted(sketches)
    brute = {}
    for position, name in enumerate(order):
        others = order[position + 1:]
        if others:
            stored = [signed(sketches[o]) if method.name == "simhash" else sketches[o] for o in others]
            for other, distance in zip(others, method.distances(sketches[name], stored)):
                if distance <= method.max_distance:
                    brute[name, other] = brute[other, name] = int(distance)
    assert {(row.external_id, row.neighbour_external_id): row.distance
            for found in answers.values() for row in found} == brute and len(brute) > 20


#: What a Citus plan shows where it moves rows between nodes: a repartition join's jobs, a subplan's results
#: broadcast to the workers, a query pulled to the coordinator.
NOT_ROUTED = re.compile(r"MapMergeJob|Repartition|Subplan|intermediate result|[Bb]roadcast|Distributed Subplan")


@pytest.mark.citus
def test_simdb_neighbours_on_citus_runs_statements_that_each_go_to_the_shards_they_read(archive, backend):
    """On a distributed index, simdb_neighbours (a repartition join of the pairs with both their documents, 0.5-5 s a
    call) runs one statement a step: no repartition, subplan or broadcast, at most one task per shard, and the
    neighbours fetched from the shards that hold them alone (0021)."""
    if backend != "citus":
        pytest.skip("one server: simdb_neighbours reads the view through the indexes "
                    "(test_every_lookup_reads_the_indexes_inside_function_bodies_too)")
    index, _ = archive
    shards = rows(index, "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = CAST('documents' AS regclass)")[0][0]
    # a document with neighbours on both sides (earlier and later), and one with a single neighbour
    both = rows(index, "SELECT external_id FROM document_neighbours GROUP BY external_id "
                       "HAVING bool_or(neighbour_is_earlier) AND bool_or(NOT neighbour_is_earlier) LIMIT 1")
    single = rows(index, "SELECT external_id FROM document_neighbours GROUP BY external_id HAVING count(*) = 1 "
                         "LIMIT 1")[0][0]
    names = [*(row[0] for row in both), single]
    expected = [sorted(rows(index, "SELECT * FROM document_neighbours WHERE external_id = :n", n=name))
                for name in names]
    method = index.settings.method
    exact = method.name == "minhash" and method.settings.exact
    if exact:  # a stored signature is answered with its document's stored pairs (0021: one statement, not two)
        signature, stored_id = rows(index, "SELECT signature, id FROM documents WHERE external_id = :n", n=names[0])[0]
        pairs = {row.neighbour_id: row.distance for row in expected[0]}
    engine = index.database.engine
    with explained(engine) as plans:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"SET search_path TO {index.database.schema}")
            answers = [sorted(connection.execute(sa.text("SELECT * FROM simdb_neighbours(:n)"), {"n": name}).all())
                       for name in names]
    assert answers == expected and all(expected)
    if exact:  # (auto_explain of its aggregate over the shards fails in Citus: its pairs' statement explained alone)
        assert dict(rows(index, "SELECT * FROM simdb_near(:s)", s=signature)) == {stored_id: 0, **pairs}
        definition = rows(index, "SELECT pg_get_functiondef(CAST('simdb_lookup(bytea, integer)' AS regprocedure))")
        statements = re.findall(r"RETURN QUERY (SELECT [^;]*near_duplicates[^;]*);", definition[0][0])
        assert len(statements) == 1, definition  # one statement reads the pairs (two subplans, a UNION ALL)
        statement = statements[0].replace("stored_id", str(stored_id)).replace("max_distance", "10000")
        plan = "\n".join(row[0] for row in rows(index, "EXPLAIN " + statement))
        assert not NOT_ROUTED.search(plan) and re.findall(r"Task Count: (\d+)", plan) == [str(shards)], plan
    body = [plan for plan in plans if "simdb_neighbours(" not in plan.split("\n", 1)[0]]
    distributed = [plan for plan in body if "Citus Adaptive" in plan]
    assert len(distributed) >= 3 * len(names), body  # the document, its pairs, its neighbours: each a statement
    for plan in distributed:
        assert not NOT_ROUTED.search(plan), plan
        tasks = [int(count) for count in re.findall(r"Task Count: (\d+)", plan)]
        assert len(tasks) == 1 and tasks[0] <= shards, plan
    # the single neighbour's row is read on its one shard
    fetches = [plan for plan in distributed if "ANY(pair_neighbours)" in plan]
    assert fetches and "Task Count: 1\n" in fetches[-1], fetches
    assert all("Citus" in plan or "documents" not in plan and "near_duplicates" not in plan for plan in body)


@pytest.mark.citus
def test_clusters_and_their_members_are_what_the_documents_say(archive, admin_engine):
    index, documents = archive
    method = index.settings.method
    assert_clusters_table(admin_engine, index.database.schema)
    assert_maintained(admin_engine, index.database.schema)
    texts = {d["id"]: d["text"] for d in documents}
    clusters = rows(index, "SELECT cluster_id, canonical_id, size, canonical_text FROM duplicate_clusters")
    assert clusters and all(c.canonical_text in (None, texts[c.canonical_id]) for c in clusters)
    assert any(c.canonical_text is not None for c in clusters) == index.settings.texts
    sketches = {row.id: row.sketch for row in rows(
        index, f"SELECT id, {sql_of(method).sketch_column[0]} AS sketch FROM documents")}
    members = rows(index, "SELECT cluster_id, document_id, cluster_size, similarity_to_canonical, "
                          "cluster_min_similarity FROM cluster_members")
    by_cluster: dict[int, list] = {}
    for member in members:
        by_cluster.setdefault(member.cluster_id, []).append(member)
    assert {c.cluster_id: c.size for c in clusters} == {c: len(m) for c, m in by_cluster.items()}
    for cluster_id, found in by_cluster.items():
        if method.name == "minhash":  # the sketches' estimate: the share of positions that agree
            canonical = np.frombuffer(sketches[cluster_id], "<u4")
            similarity = np.array([np.count_nonzero(canonical == np.frombuffer(sketches[m.document_id], "<u4"))
                                   for m in found]) / method.settings.num_perm
        else:
            similarity = np.array([1 - (to_unsigned(sketches[cluster_id]) ^ to_unsigned(sketches[m.document_id]))
                                   .bit_count() / 64 for m in found])
        assert [m.similarity_to_canonical for m in found] == pytest.approx(similarity.tolist(), abs=1e-6)
        assert [m.cluster_min_similarity for m in found] == pytest.approx([min(similarity)] * len(found), abs=1e-6)


@pytest.mark.citus
def test_similar_and_near_answer_on_both_methods(archive):
    index, documents = archive
    method = index.settings.method
    probe = documents[5]["text"]
    sketch = index.fingerprint(probe)
    if method.name == "simhash":
        fingerprint = signed(sketch)
        near = rows(index, "SELECT document_id, distance FROM simdb_near(:f)", f=fingerprint)
        similar = rows(index, "SELECT document_id, similarity FROM simdb_similar(:f)", f=fingerprint)
        assert {(d, 1 - n / 64) for d, n in near} == {tuple(row) for row in similar}  # multiples of 1/64: exact
        assert {d for d, s in rows(index, "SELECT * FROM simdb_similar(:f, 0.99)", f=fingerprint)} == \
            {d for d, n in near if n == 0}
        with pytest.raises(sa.exc.DBAPIError, match="min_similarity must be between 0 and 1"):
            rows(index, "SELECT * FROM simdb_similar(:f, 1.5)", f=fingerprint)
    else:
        similar = rows(index, "SELECT document_id, similarity FROM simdb_similar(:s)", s=sketch)
        near = rows(index, "SELECT document_id, distance FROM simdb_near(:s)", s=sketch)
        assert near and {d for d, _ in near} == {d for d, _ in similar}
        stored = {row.id: row.signature for row in rows(index, "SELECT id, signature FROM documents")}
        for document_id, distance in near:  # the estimate, in the index's unit (exact indexes: the test below)
            assert method.settings.exact or \
                distance == int(method.distances(sketch, [stored[document_id]])[0]) <= method.max_distance
        with pytest.raises(sa.exc.DBAPIError, match="max_distance must be between 0 and"):
            rows(index, "SELECT * FROM simdb_near(:s, -1)", s=sketch)


def test_every_lookup_reads_the_indexes_inside_function_bodies_too(archive):
    index, documents = archive
    method = index.settings.method
    sketch = index.fingerprint(documents[5]["text"])
    if method.name == "simhash":
        sketch = signed(sketch)
    cluster = rows(index, "SELECT cluster_id FROM clusters ORDER BY size DESC LIMIT 1")[0][0]
    name = rows(index, "SELECT external_id FROM document_neighbours LIMIT 1")[0][0]
    queries = [("SELECT * FROM simdb_near(:s)", {"s": sketch}), ("SELECT * FROM simdb_similar(:s)", {"s": sketch}),
               ("SELECT * FROM simdb_neighbours(:n)", {"n": name}),
               ("SELECT * FROM document_neighbours WHERE external_id = :n", {"n": name}),
               ("SELECT * FROM duplicate_clusters ORDER BY size DESC, cluster_id LIMIT 10", {}),
               ("SELECT * FROM cluster_members WHERE cluster_id = :c", {"c": cluster})]
    engine = index.database.engine
    with explained(engine) as plans:
        with engine.connect() as connection:
            connection.exec_driver_sql("SET enable_seqscan = off")  # small tables: a scan would be cheaper
            for statement, params in queries:
                assert connection.execute(sa.text(statement), params).all() is not None
    scans = [plan for plan in plans if re.search(r"Seq Scan on (documents|clusters|near_duplicates)", plan)]
    assert not scans, scans[0]
    # function bodies were explained, not only the calls
    assert any("simdb_near" not in plan.split("\n", 1)[0] and "key_" in plan for plan in plans)


@pytest.mark.parametrize("settings", [["--idf-from", "sample.jsonl"], ["--method", "minhash", "--verify", "exact"]],
                         ids=["simhash-idf", "minhash-exact"])
def test_simdb_fingerprint_sketches_a_text_as_the_index_does(run, tmp_path, monkeypatch, schema, database_url,
                                                             settings):
    import json

    monkeypatch.chdir(tmp_path)
    documents = list(corpus())[:80]
    (tmp_path / "sample.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    assert run("init", *settings).exit_code == 0
    assert run("ingest", "sample.jsonl", "--batch", "one").exit_code == 0
    text = documents[7]["text"]
    printed = run("fingerprint", "--index", text)
    assert printed.exit_code == 0, printed.output
    with Index.open(database_url, schema=schema) as index:
        sketch = index.fingerprint(text)
        expected = index.settings.method.format(sketch) if index.method == "minhash" else f"{sketch:016x}"
        assert printed.output.strip() == expected
        assert run("fingerprint", text).output.strip() != expected  # the default settings sketch it otherwise
        found = rows(index, "SELECT d.external_id FROM simdb_similar(" + (
            "decode(:sketch, 'hex')" if index.method == "minhash" else "simdb_fingerprint_from_hex(:sketch)")
            + ") s JOIN documents d ON d.id = s.document_id", sketch=printed.output.strip())
    assert documents[7]["id"] in {row.external_id for row in found}


@pytest.mark.citus
def test_every_lookup_on_an_exact_index_gives_the_exact_jaccard_of_the_inputs(database_url, schema):
    """On a MinHash index deciding by the texts, simdb_similar, simdb_near and simdb_neighbours give each stored
    document's near-duplicates by the exact Jaccard of the inputs' shingles (the lookups gave the signatures'
    estimate, and missed pairs whose estimate fell below the threshold), and the same numbers as the stored
    pairs."""
    documents = generated(seed=5, bases=16)
    sets = {d["id"]: shingles(d["text"]) for d in documents}
    with Index.create(database_url, schema=schema, method="minhash", verify="exact") as index:
        index.add_many(documents[:40], batch="first", chunk_size=25)
        index.add_many(documents[40:], batch="second", chunk_size=25)
        stored = rows(index, "SELECT d.id, d.external_id, d.signature FROM documents d ORDER BY d.id")
        names = {row.id: row.external_id for row in stored}
        # a signature stands for the earliest stored document that has it
        first_with = {}
        for row in stored:
            first_with.setdefault(bytes(row.signature), row.external_id)

        def lookups_of(row) -> bool:
            """Every lookup of one stored document checked; whether the estimate tells it from the exact Jaccard."""
            query = first_with[bytes(row.signature)]
            expected = {other: jaccard(sets[query], sets[other]) for other in sets
                        if jaccard(sets[query], sets[other]) >= THRESHOLD}
            similar = {names[d]: s for d, s in rows(index, "SELECT * FROM simdb_similar(:s)", s=row.signature)}
            near = {names[d]: n for d, n in rows(index, "SELECT * FROM simdb_near(:s)", s=row.signature)}
            assert near == {other: exact_distance(j) for other, j in expected.items()}, row.external_id
            assert similar == {other: (10_000 - exact_distance(j)) / 10_000 for other, j in expected.items()}
            neighbours = {r.neighbour_external_id: (r.distance, r.similarity) for r in rows(
                index, "SELECT * FROM simdb_neighbours(:id)", id=query)}
            assert neighbours == {other: (near[other], similar[other]) for other in near if other != query}
            estimate = {names[d] for d, _ in rows(
                index, "SELECT id, simdb_similarity(signature, :s) AS e FROM documents "
                       "WHERE simdb_similarity(signature, :s) >= 0.8", s=row.signature)}
            return estimate != set(expected)

        # the documents' lookups side by side (on Citus each simdb_neighbours call was a repartition join that
        # mostly waited on its nodes, 0.5-0.8 s of wall, before 0021 routed it)
        with Concurrently(workers=LOOKUP_THREADS) as threads:
            for row in stored:
                threads.start(lookups_of, row)
            differ = sum(threads.results())
        assert differ > 0  # the data tells the estimate from the exact Jaccard
        # a signature no stored document has: the estimate, and a NOTICE that says so
        unknown = bytes(reversed(bytes(stored[0].signature)))
        with index.database.engine.connect() as connection:
            connection.exec_driver_sql(f"SET search_path TO {index.database.schema}")
            said, raw = [], connection.connection.dbapi_connection
            raw.add_notice_handler(handler := lambda notice: said.append(notice.message_primary))
            connection.execute(sa.text("SELECT * FROM simdb_similar(:s)"), {"s": unknown}).all()
            raw.remove_notice_handler(handler)  # the connection goes back to the pool
        assert len(said) == 1 and "no stored document has this signature" in said[0] and "estimate" in said[0]


@pytest.mark.citus
def test_a_similarity_is_one_type_and_prints_as_the_fraction_it_is(archive):
    index, documents = archive
    method = index.settings.method
    scale = method.settings.scale if method.name == "minhash" else 64
    types = rows(index, "SELECT DISTINCT pg_typeof(similarity)::text FROM near_duplicate_pairs UNION ALL "
                        "SELECT DISTINCT pg_typeof(similarity)::text FROM document_neighbours UNION ALL "
                        "SELECT DISTINCT pg_typeof(similarity_to_canonical)::text FROM cluster_members")
    assert {t for t, in types} == {"double precision"}
    sketch = index.fingerprint(documents[5]["text"])
    sketch = signed(sketch) if method.name == "simhash" else sketch
    (returned,) = rows(index, "SELECT pg_typeof(similarity)::text FROM simdb_similar(:s) LIMIT 1", s=sketch)
    assert returned == ("double precision",)
    pairs = rows(index, "SELECT distance, similarity, similarity::text AS printed, a_batch, b_batch, batch, "
                        "a_id, b_id FROM near_duplicate_pairs")
    batches = {row.id: row.batch for row in rows(
        index, "SELECT d.id, b.name AS batch FROM documents d JOIN batches b ON b.id = d.batch_id")}
    assert pairs and all(row.similarity == (scale - row.distance) / scale == method.similarity(row.distance)
                         and row.printed == repr(row.similarity).removesuffix(".0") for row in pairs)
    assert all((row.a_batch, row.b_batch) == (batches[row.a_id], batches[row.b_id]) and row.batch == row.b_batch
               for row in pairs)
    assert {row.a_batch for row in pairs} >= {"first"} and {row.b_batch for row in pairs} >= {"second"}


@pytest.mark.citus
def test_the_other_methods_functions_say_which_method_the_index_is(archive):
    index, documents = archive
    method = index.settings.method
    other = ["SELECT simdb_hamming(1, 2)", "SELECT simdb_fingerprint_hex(1)", "SELECT * FROM simdb_near(1)",
             "SELECT * FROM simdb_similar(1)"] if method.name == "minhash" else \
        ["SELECT simdb_similarity('\\x00'::bytea, '\\x00'::bytea)", "SELECT simdb_band_keys('\\x00'::bytea)",
         "SELECT * FROM simdb_near('\\x00'::bytea)", "SELECT * FROM simdb_similar('\\x00'::bytea, 0.9)"]
    this = "MinHash" if method.name == "minhash" else "SimHash"
    for statement in other:
        with pytest.raises(sa.exc.DBAPIError) as raised:
            rows(index, statement)
        message = raised.value.orig.diag.message_primary
        assert f"this index is {this}" in message and "give a" in message and "\n" not in message, statement


def test_a_view_reads_only_the_tables_a_query_needs(archive):
    """The similarity histogram through near_duplicate_pairs read every pair's two documents and batches (1.2-1.8 s
    at 1M documents, 5-10 ms from near_duplicates): the pair's documents and batches are joined only where a
    query reads them."""
    index, documents = archive
    plans = {statement: "\n".join(row[0] for row in rows(index, "EXPLAIN " + statement)) for statement in (
        "SELECT similarity, count(*) FROM near_duplicate_pairs GROUP BY similarity",
        "SELECT b_batch, count(*) FROM near_duplicate_pairs GROUP BY b_batch")}
    for statement, plan in plans.items():
        assert "near_duplicates" in plan and "documents" not in plan, (statement, plan)
    assert rows(index, "SELECT count(*) FROM near_duplicate_pairs") == \
        rows(index, "SELECT count(*) FROM near_duplicates")
