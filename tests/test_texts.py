"""Texts kept in the index, and MinHash decided by the exact Jaccard similarity of the texts' shingles.

The oracle here is independent of simdb's shingling: the generated texts are lower-case ASCII words
separated by single spaces, whose shingles are plainly the tuples of three consecutive words, and a
pair is a near-duplicate when 5 x shared >= 4 x all (Jaccard >= 0.8, in integers).
"""

from __future__ import annotations

import json
import math
import random
import string
from fractions import Fraction

import numpy as np
import pytest
import sqlalchemy as sa

from simdb import Index
from simdb.diff import changed_characters, diff, elided
from simdb.errors import IncompatibleIndex, SimdbError
from simdb.ingest import FingerprintedBatch
from simdb.methods.minhash.signature import EXACT_MISS, MinHashSettings

THRESHOLD = Fraction(4, 5)


def generated(seed: int = 14, bases: int = 36, variants: int = 4) -> list[dict]:
    """Bases of 40-160 random words, each with copies that have 1 to len/10 words replaced: Jaccard from
    about 0.55 to 0.97, many of them close to 0.8. Shuffled, so copies often come before their base."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8))) for _ in range(4000)]
    texts = []
    for _ in range(bases):
        words = rng.choices(vocabulary, k=rng.randint(40, 160))
        texts.append(words)
        for _ in range(variants):
            copy = list(words)
            for position in rng.sample(range(len(copy)), rng.randint(1, len(copy) // 10)):
                copy[position] = rng.choice(vocabulary)
            texts.append(copy)
    texts.append(list(texts[0]))  # an exact copy
    rng.shuffle(texts)
    return [{"id": f"g-{i:03d}", "text": " ".join(words)} for i, words in enumerate(texts)]


def shingles(text: str) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[i:i + 3]) for i in range(max(len(words) - 2, 1))}


def jaccard(a: set, b: set) -> Fraction:
    return Fraction(len(a & b), len(a | b))


def exact_distance(similarity: Fraction) -> int:
    """What the index stores: ceil((1 - J) x 10,000)."""
    return math.ceil((1 - similarity) * 10_000)


def oracle(documents: list[dict]) -> dict[tuple[str, str], Fraction]:
    """{(earlier id, later id): Jaccard} of every pair at or above the threshold, in input order."""
    sets = [shingles(d["text"]) for d in documents]
    return {(documents[i]["id"], documents[j]["id"]): similarity
            for j in range(len(documents)) for i in range(j)
            if (similarity := jaccard(sets[i], sets[j])) >= THRESHOLD}


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_exact_minhash_pairs_clusters_and_verdicts_are_the_oracles(database_url, schema, admin_engine, monkeypatch):
    from simdb.methods import minhash

    monkeypatch.setattr(minhash, "DECIDE_TEXTS", 7)  # the decisions of a chunk come in several batches
    documents = generated()
    expected = oracle(documents)
    first, second = documents[:100], documents[100:]
    with Index.create(database_url, schema=schema, method="minhash", verify="exact") as index:
        method = index.settings.method
        # the data can tell the two modes apart: the signatures' estimate decides some of these pairs wrongly
        sketches = [method.sketch(d["text"]) for d in documents]
        estimated = {(documents[i]["id"], documents[j]["id"]) for j in range(len(documents)) for i in range(j)
                     if method.settings.num_perm - np.count_nonzero(np.frombuffer(sketches[i], "<u4")
                                                                     == np.frombuffer(sketches[j], "<u4"))
                     <= MinHashSettings(threshold=0.8).max_distance}
        assert estimated != set(expected) and len(expected) > 50

        index.add_many(first, batch="first", chunk_size=37)
        predicted = index.check_many(second)  # what an ingest would record, before it runs
        index.add_many(second, batch="second", chunk_size=37)
        pairs = {(p.a, p.b): p for p in index.pairs()}
        assert set(pairs) == set(expected)
        for key, pair in pairs.items():
            assert pair.distance == exact_distance(expected[key])
            assert pair.similarity == pytest.approx(1 - pair.distance / 10_000)
        # every document's duplicate_of is its earliest near-duplicate, stored by the exact distance
        order = {d["id"]: i for i, d in enumerate(documents)}
        recorded = {v.id: v for batch in ("first", "second") for v in index.verdicts(batch)}
        for document in documents:
            earlier = sorted((order[a], a) for a, b in expected if b == document["id"])
            verdict = recorded[document["id"]]
            assert verdict.duplicate_of == (earlier[0][1] if earlier else None), document["id"]
            if earlier:
                assert verdict.distance == exact_distance(expected[(earlier[0][1], document["id"])])
        assert [(v.id, v.status, v.duplicate_of, v.distance) for v in predicted] == \
            [(v.id, v.status, v.duplicate_of, v.distance) for v in index.verdicts("second")]
        # a query by text is decided as ingest decides
        sets = {d["id"]: shingles(d["text"]) for d in documents}
        for document in documents[::17]:
            found = {m.external_id: m.distance for m in index.query(document["text"])}
            assert found == {other: exact_distance(jaccard(sets[document["id"]], sets[other])) for other in sets
                             if jaccard(sets[document["id"]], sets[other]) >= THRESHOLD}
    with admin_engine.connect() as connection:
        clusters = dict(connection.exec_driver_sql(
            f"SELECT d.external_id, c.external_id FROM {schema}.documents d "
            f"JOIN {schema}.documents c ON c.id = d.cluster_id").all())
        view = connection.exec_driver_sql(
            f"SELECT a_external_id, b_external_id, similarity, a_text, b_text FROM {schema}.near_duplicate_pairs"
        ).all()
    parent = {d["id"]: d["id"] for d in documents}

    def root(node: str) -> str:
        while parent[node] != node:
            node = parent[node]
        return node

    for a, b in expected:
        ra, rb = root(a), root(b)
        parent[max(ra, rb, key=order.get)] = min(ra, rb, key=order.get)
    assert clusters == {d["id"]: root(d["id"]) for d in documents}
    texts = {d["id"]: d["text"] for d in documents}
    assert {(a, b) for a, b, *_ in view} == set(expected)
    assert all(at == texts[a] and bt == texts[b] and similarity == pytest.approx(1 - exact_distance(
        expected[(a, b)]) / 10_000) for a, b, similarity, at, bt in view)


def test_the_signature_stage_lets_through_what_the_texts_may_accept():
    settings = MinHashSettings(threshold=0.8, verify="exact")
    assert settings.max_distance == 2000 and settings.scale == 10_000
    wide = settings.candidate_distance(settings.max_distance)
    positions = next(x for x in range(129) if settings.distances_of(np.array([x]))[0] == wide)
    # the chance that a pair of Jaccard exactly 0.8 has more differing positions, summed exactly
    miss = sum(Fraction(math.comb(128, x)) * Fraction(1, 5) ** x * Fraction(4, 5) ** (128 - x)
               for x in range(positions + 1, 129))
    assert miss <= EXACT_MISS < miss * 10 ** 3 and positions > 25  # 25.6 differ on average at 0.8
    assert MinHashSettings(threshold=0.8).candidate_distance(26) == 26  # estimate mode: the distance itself
    with pytest.raises(ValueError, match="multiple of 0.0001"):
        MinHashSettings(threshold=0.80005, verify="exact")
    with pytest.raises(ValueError, match="verify must be one of"):
        MinHashSettings(verify="roughly")


def test_an_exact_index_keeps_texts_and_refuses_fingerprints_without_them(database_url, schema):
    with Index.create(database_url, schema=schema, method="minhash", verify="exact") as index:
        assert index.settings.texts
        sketch = index.fingerprint("one two three four")
        with pytest.raises(SimdbError, match="decides by the documents' texts"):
            index.add_fingerprinted(FingerprintedBatch(["x"], [sketch], [b"h" * 16], [18], [{}], ["api"]),
                                    batch="fingerprints")
        assert index.stats()["documents"] == 0
    with Index.open(database_url, schema=schema) as reopened:
        assert reopened.settings.texts and reopened.settings.method.needs_texts


def test_store_text_keeps_texts_and_an_index_without_them_says_so(database_url, schema, admin_engine):
    documents = [{"id": "a", "text": "头发干燥后来发现，软件与网络设定有关。" * 3},
                 {"id": "b", "text": "頭髮乾燥後來發現，软件与网络设定有关！" * 3}]  # kept as written
    with Index.create(database_url, schema=schema, store_text=True) as index:
        index.add_many(documents, batch="one")
        assert [index.document(d["id"]).text for d in documents] == [d["text"] for d in documents]
        shown = index.document("b")
        assert (shown.batch, shown.cluster, shown.duplicate_of) == ("one", "a", "a")
        assert index.distance_between(index.document("a"), shown) == shown.duplicate_distance
        with pytest.raises(SimdbError, match="no document with id 'zz'"):
            index.document("zz")
    with admin_engine.connect() as connection:
        compression = connection.exec_driver_sql(
            f"SELECT DISTINCT attcompression FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' AND a.attname = 'text' "
            "AND c.relkind IN ('r', 'p')").scalars().all()
        lz4 = connection.exec_driver_sql(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'").scalar()
    assert compression == (["l"] if lz4 else [""])  # every segment and the parent
    with pytest.raises(IncompatibleIndex, match="store_text: asked True, stored False"):
        Index.create(database_url, schema=schema + "_plain", exist_ok=True).close()
        Index.create(database_url, schema=schema + "_plain", exist_ok=True, store_text=True).close()
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema}_plain CASCADE")


@pytest.mark.citus
def test_show_prints_a_document_and_a_diff_of_two(run, tmp_path, schema):
    path = tmp_path / "docs.jsonl"
    base = "今天天气很好，我们去公园散步。然后去图书馆看书，晚上回家做饭。" * 4
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in (
        {"id": "a", "text": base}, {"id": "b", "text": base.replace("图书馆", "博物馆", 1)})), encoding="utf-8")
    assert run("init", "--method", "minhash", "--verify", "exact").exit_code == 0
    assert run("ingest", str(path), "--batch", "one").exit_code == 0
    one = run("show", "a")
    assert one.exit_code == 0 and base in one.output and "cluster: a" in one.output
    two = run("show", "a", "b", "--context", "10")
    assert two.exit_code == 0, two.output
    assert "[-图书-]{+博物+}" in two.output and "near-duplicates at the index's maximum distance 2000" in two.output
    assert "diff: 2 characters only in a, 2 only in b" in two.output
    shown = json.loads(run("show", "a", "b", "--json").output)
    assert shown["near_duplicates"] and "".join(r["text"] for r in shown["diff"] if r["kind"] != "added") == base
    missing = run("show", "nope")
    assert missing.exit_code != 0 and "no document with id 'nope'" in missing.output


def test_show_without_texts_says_how_to_keep_them(run, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "some words to keep"}) + "\n")
    assert run("init").exit_code == 0 and run("ingest", str(path)).exit_code == 0
    shown = run("show", "a")
    assert shown.exit_code == 0 and "--store-text" in shown.output


@pytest.mark.parametrize(("a", "b"), [
    ("abc\ndef\n", "abc\ndxf\n"), ("", "new"), ("same", "same"), ("头发干燥后来发现", "頭髮乾燥后来发现了"),
    ("line one\nline two\nline three\n", "line one\nline 2\nline three\nline four\n")])
def test_the_diff_spells_both_texts(a, b):
    runs = diff(a, b)
    assert "".join(t for kind, t in runs if kind != "added") == a
    assert "".join(t for kind, t in runs if kind != "removed") == b
    assert all(kind != runs[i + 1][0] for i, (kind, _) in enumerate(runs[:-1]))  # runs are merged


def test_elided_keeps_the_context_of_each_change():
    runs = diff("x" * 500 + "A" + "y" * 500, "x" * 500 + "B" + "y" * 500)
    short = elided(runs, 10)
    assert short == [("same", " … " + "x" * 10), ("removed", "A"), ("added", "B"), ("same", "y" * 10 + " … ")]


def test_migrations_add_the_text_column_to_an_existing_archive(database_url, schema, admin_engine):
    """An index at revision 0007 gains documents.text (NULL for what it stored) and the views' new columns."""
    from simdb.pg import migrate

    with Index.create(database_url, schema=schema) as index:
        index.add_many([{"id": "a", "text": "alpha beta gamma delta"}, {"id": "b", "text": "alpha beta gamma delta!"}],
                       batch="one")
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"SET search_path TO {schema}")
        migrate.downgrade(connection, schema, "0007")
        assert "text" not in {c["name"] for c in sa.inspect(connection).get_columns("documents", schema=schema)}
    with Index.open(database_url, schema=schema) as index:
        assert index.document("a").text is None and not index.settings.texts
        assert [p.a for p in index.pairs()] == ["a"]
    with admin_engine.connect() as connection:
        row = connection.exec_driver_sql(
            f"SELECT similarity, a_text FROM {schema}.near_duplicate_pairs").one()
    assert row.a_text is None and row.similarity == pytest.approx(1.0)


def test_the_report_shows_pairs_side_by_side_and_clusters_with_their_texts(database_url, schema):
    from simdb.report import build_report

    base = "今天天气很好，我们去公园散步。然后去图书馆看书，晚上回家做饭。" * 4
    with Index.create(database_url, schema=schema, method="minhash", verify="exact") as index:
        index.add_many([{"id": "a", "text": base}, {"id": "b", "text": base.replace("图书馆", "博物馆<&>", 1)},
                        {"id": "c", "text": base}], batch="one")
        page = build_report(index)
    pairs = page[page.index("Pairs whose texts differ"):]
    assert ('<del><span class="mark">[-</span>图书<span class="mark">-]</span></del>' in pairs
            and '<ins><span class="mark">{+</span>博物<span class="mark">+}</span></ins>' in pairs)
    assert "&lt;&amp;&gt;" in pairs
    assert "<code>a</code> (earlier) and <code>c</code>" not in pairs  # an exact copy is no pair to look at
    assert "今天天气很好，我们去公园散步。" in page[page.index("Largest clusters"):page.index("Pairs whose texts differ")]


def test_the_report_of_an_index_without_texts_says_how_to_keep_them(index):
    from simdb.report import build_report

    index.add_many([{"id": "a", "text": "alpha beta gamma delta"}, {"id": "b", "text": "alpha beta gamma delta!"}],
                   batch="one")
    assert "simdb init --store-text</code> to see pairs side by side" in build_report(index)


def test_elided_with_no_context_keeps_only_the_changes():
    runs = diff("x" * 50 + "A" + "y" * 50 + "B" + "z" * 50, "x" * 50 + "C" + "y" * 50 + "D" + "z" * 50)
    assert "".join(t for _, t in elided(runs, 0)) == " … AC … BD … "


def test_the_diff_of_long_texts_without_line_breaks_finishes_and_spells_both():
    from simdb import diff as diff_module

    a = "".join(f"第{i}句话讲了一件事。" for i in range(20_000))  # 200k characters on one line
    b = a.replace("第500句", "第五百句").replace("第19000句", "第一万九千句")
    runs = diff(a, b)  # sentence by sentence first: a character diff of the whole took minutes
    assert "".join(t for k, t in runs if k != "added") == a and "".join(t for k, t in runs if k != "removed") == b
    assert changed_characters(runs) == (8, 6)  # "500" and "19000" against "五百" and "一万九千"
    long_a, long_b = "甲" * (diff_module.MAX_CHARACTER_RUN + 1), "乙" * 10
    assert diff(long_a, long_b) == [("removed", long_a), ("added", long_b)]
