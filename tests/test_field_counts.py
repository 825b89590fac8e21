"""``field_counts``: per value of each metadata field an index counts by, the documents stored and how many of them
have an earlier near-duplicate, kept by every ingest chunk and removal (:mod:`simdb.pg.field_counts`).

The oracle is computed from the inputs: each document's metadata as given, and its duplicate decision by brute
force (a document is a duplicate while a document stored before it, and still stored, is within k of it).
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from simdb import Index
from simdb.errors import IncompatibleIndex, SimdbError
from simdb.ingest import FingerprintedBatch
from simdb.text import content_hash
from simdb.pg import migrate
from tests.test_index import flip

K = 4  # the default index's max_distance
SOURCES = ["wire:ap", "wire:reuters", "blog", None, 7, {"nested": [1, 2]}]


class Inputs:
    """What was given to the index: each document's fingerprint and metadata, in the order it was stored."""

    def __init__(self) -> None:
        self.fingerprints: dict[str, int] = {}
        self.metadata: dict[str, dict] = {}
        self.order: list[str] = []
        self.batch_of: dict[str, str] = {}

    def batch(self, name: str, rows: list[tuple[str, int, dict]]) -> FingerprintedBatch:
        made = FingerprintedBatch()
        for external_id, fingerprint, metadata in rows:
            made.append(external_id, fingerprint, content_hash(external_id), 10, metadata, external_id)
        return made

    def stored(self, name: str, rows: list[tuple[str, int, dict]]) -> None:
        for external_id, fingerprint, metadata in rows:
            self.fingerprints[external_id], self.metadata[external_id] = fingerprint, metadata
            self.order.append(external_id)
            self.batch_of[external_id] = name

    def remove(self, external_ids) -> None:
        gone = set(external_ids)
        self.order = [i for i in self.order if i not in gone]

    def expected(self, fields: list[str]) -> dict[tuple[str, str | None], tuple[int, int]]:
        """{(field, value): (documents, duplicates)}: the value as ``metadata ->> field`` gives it (JSON's text of
        a number or an object, NULL for JSON null or no such field)."""
        counts: dict[tuple[str, str | None], list[int]] = {}
        for later, external_id in enumerate(self.order):
            mine = self.fingerprints[external_id]
            duplicate = any((self.fingerprints[earlier] ^ mine).bit_count() <= K for earlier in self.order[:later])
            for field in fields:
                value = self.metadata[external_id].get(field)
                text = None if value is None else value if isinstance(value, str) else \
                    json.dumps(value, separators=(", ", ": "))
                entry = counts.setdefault((field, text), [0, 0])
                entry[0] += 1
                entry[1] += duplicate
        return {key: tuple(value) for key, value in counts.items()}


def kept(engine: sa.Engine, schema: str) -> dict[tuple[str, str | None], tuple[int, int]]:
    with engine.connect() as connection:
        return {(row.field, row.value): (row.documents, row.duplicates) for row in connection.execute(sa.text(
            f"SELECT field, value, documents, duplicates FROM {schema}.field_counts"))}


def rows_of(prefix: str, count: int, base: int, copies_of: list[tuple[str, int]] = ()) -> list[tuple[str, int, dict]]:
    """``count`` documents far from each other (and from other prefixes' bases), then one near copy of each
    (external id, fingerprint) of ``copies_of``; metadata cycles through :data:`SOURCES` and a language."""
    rows = []
    for i in range(count):
        metadata = {"language": "en" if i % 3 else "zh"}
        if SOURCES[i % len(SOURCES)] is not None or i % 2:
            metadata["source"] = SOURCES[i % len(SOURCES)]  # JSON null, or no such field
        rows.append((f"{prefix}-{i}", base ^ (i * 0x0101_0101_0101_0101 * 37) & 0xFFFF_FFFF_FFFF_FFFF, metadata))
    for j, (of, fingerprint) in enumerate(copies_of):
        rows.append((f"{prefix}-copy-{j}", flip(fingerprint, [j % 64, (j + 9) % 64]),
                     {"source": SOURCES[j % 3], "language": "en"}))
    return rows


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_the_counts_are_the_brute_force_counts_through_ingests_removals_and_compactions(database_url, schema,
                                                                                     admin_engine):
    inputs = Inputs()
    with Index.create(database_url, schema=schema, count_by=["source", "language"], segment_size=1000,
                      merge_factor=2, bulk_chunk=1000) as index:
        assert index.settings.count_by == ("source", "language")
        one = rows_of("one", 40, 0x1234_5678_9ABC_DEF0)
        index.add_fingerprinted(inputs.batch("one", one), batch="one")
        inputs.stored("one", one)
        assert kept(admin_engine, schema) == inputs.expected(["source", "language"])
        # copies of batch one's, a copy of a copy (in the same batch), and documents of their own
        two = rows_of("two", 10, 0x0F0F_F0F0_3C3C_C3C3, [(i, inputs.fingerprints[i]) for i in inputs.order[:12]])
        two.append(("two-copy-of-copy", flip(two[-1][1], [40]), {"source": "blog"}))
        index.add_fingerprinted(inputs.batch("two", two), batch="two")
        inputs.stored("two", two)
        expected = inputs.expected(["source", "language"])
        assert kept(admin_engine, schema) == expected and sum(d for _, d in expected.values()) > 12
        # removing what copies point at: they point at another earlier one, or are duplicates no more
        summary = index.remove(ids=["one-0", "one-1", "one-11", "one-5"])
        inputs.remove(["one-0", "one-1", "one-11", "one-5"])
        assert summary.repointed >= 1 and summary.now_original >= 3  # the copy of a copy; one-0's copy, ...
        assert kept(admin_engine, schema) == inputs.expected(["source", "language"])
        index.compact(full=True)
        index.relayout(7)
        assert kept(admin_engine, schema) == inputs.expected(["source", "language"])
        index.remove(batch="one")
        inputs.remove([i for i, b in inputs.batch_of.items() if b == "one"])
        assert kept(admin_engine, schema) == inputs.expected(["source", "language"])
        index.remove(batch="two")
        assert kept(admin_engine, schema) == {}


def test_values_longer_than_an_index_entry_are_counted(database_url, schema, admin_engine):
    """The unique index held each value itself, and a B-tree entry holds at most 2,704 bytes: one long title
    (a field kept as metadata before it was counted) failed its whole chunk, and count-by add on an archive
    holding one failed too (found in review). Values of random hex: compression cannot bring them under."""
    import secrets

    inputs = Inputs()
    long_values = [secrets.token_hex(3000), secrets.token_hex(5000)]
    with Index.create(database_url, schema=schema, count_by=["title"]) as index:
        one = [(f"one-{i}", 0x0123_4567_89AB_CDEF ^ (i * 0x0101_0101_0101_0101 * 37) & 0xFFFF_FFFF_FFFF_FFFF,
                {"title": long_values[i % 2] if i < 4 else "short", "source": long_values[0]}) for i in range(6)]
        one.append(("one-copy", flip(one[0][1], [3]), {"title": long_values[0], "source": "short"}))
        index.add_fingerprinted(inputs.batch("one", one), batch="one")
        inputs.stored("one", one)
        assert kept(admin_engine, schema) == inputs.expected(["title"])
        index.count_by("source")
        assert kept(admin_engine, schema) == inputs.expected(["title", "source"])
        index.remove(ids=["one-0"])
        inputs.remove(["one-0"])
        assert kept(admin_engine, schema) == inputs.expected(["title", "source"])


@pytest.mark.citus
def test_a_field_added_later_is_filled_from_the_stored_documents_and_kept(database_url, schema, admin_engine):
    inputs = Inputs()
    with Index.create(database_url, schema=schema) as index:
        one = rows_of("one", 30, 0x1111_2222_3333_4444)
        two = rows_of("two", 5, 0x5555_6666_7777_8888, [(r[0], r[1]) for r in one[:8]])
        for name, rows in (("one", one), ("two", two)):
            index.add_fingerprinted(inputs.batch(name, rows), batch=name)
            inputs.stored(name, rows)
        assert kept(admin_engine, schema) == {}
        assert index.count_by("source") == len({k for k in inputs.expected(["source"])})
        assert kept(admin_engine, schema) == inputs.expected(["source"])
        with pytest.raises(SimdbError, match="already counts by 'source'"):
            index.count_by("source")
    with Index.open(database_url, schema=schema) as index:  # the index says what it counts by
        assert index.settings.count_by == ("source",)
        three = rows_of("three", 3, 0x0A0A_0A0A_0A0A_0A0A, [(r[0], r[1]) for r in two[:3]])
        index.add_fingerprinted(inputs.batch("three", three), batch="three")
        inputs.stored("three", three)
        assert kept(admin_engine, schema) == inputs.expected(["source"])
        index.count_by("language")
        assert index.counts_by_field().keys() == {"source", "language"}
    assert kept(admin_engine, schema) == inputs.expected(["source", "language"])
    with pytest.raises(IncompatibleIndex, match="count-by add region"):
        Index.create(database_url, schema=schema, exist_ok=True, count_by=["source", "region"])


@pytest.mark.citus
def test_a_process_that_opened_the_index_before_a_field_was_added_counts_it(database_url, schema, admin_engine):
    """Every writer reads the fields counted under the ingest lock, not from the settings it opened the index
    with: a field another process added since is counted from its next chunk on."""
    inputs = Inputs()
    with Index.create(database_url, schema=schema) as early, Index.open(database_url, schema=schema) as other:
        one = rows_of("one", 12, 0x1357_9BDF_2468_ACE0)
        early.add_fingerprinted(inputs.batch("one", one), batch="one")
        inputs.stored("one", one)
        other.count_by("source")
        assert early.settings.count_by == ()
        two = rows_of("two", 4, 0x7777_0000_7777_0000, [(r[0], r[1]) for r in one[:5]])
        early.add_fingerprinted(inputs.batch("two", two), batch="two")
        inputs.stored("two", two)
        early.remove(ids=["one-2"])
        inputs.remove(["one-2"])
    assert kept(admin_engine, schema) == inputs.expected(["source"])


@pytest.mark.citus
def test_concurrent_ingests_keep_the_counts(database_url, schema, admin_engine):
    """Batches stored at once from threads: the chunks take the ingest lock one after another, and the counts
    are those of the order they were stored in (the documents' ids), decided by brute force."""
    inputs = Inputs()
    with Index.create(database_url, schema=schema, count_by=["source"]) as index:
        first = rows_of("first", 20, 0x2468_1357_ACE0_BDF9)
        index.add_fingerprinted(inputs.batch("first", first), batch="first")
        inputs.stored("first", first)
        batches = {f"t{n}": rows_of(f"t{n}", 6, 0x1111_0000_0000_0000 * (n + 2),
                                    [(r[0], r[1]) for r in first[n * 4:n * 4 + 5]]) for n in range(4)}
        errors: list[BaseException] = []

        def store(name):
            try:
                with Index.open(database_url, schema=schema) as mine:
                    mine.add_fingerprinted(inputs.batch(name, batches[name]), batch=name)
            except BaseException as error:  # re-raised below
                errors.append(error)

        threads = [threading.Thread(target=store, args=(name,)) for name in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
    with admin_engine.connect() as connection:
        order = connection.execute(sa.text(f"SELECT external_id FROM {schema}.documents ORDER BY id")).scalars().all()
    rows = {row[0]: row for rows in batches.values() for row in rows}
    for external_id in order[len(first):]:
        inputs.stored("t", [rows[external_id]])
    assert inputs.order == order
    assert kept(admin_engine, schema) == inputs.expected(["source"])


def test_the_cli_declares_adds_and_lists_the_fields(run, schema, admin_engine, tmp_path):
    records = [{"id": f"r{i}", "text": f"document number {i} about {'cats' if i % 2 else 'dogs'} and nothing else "
                f"at all {i * 7919}", "source": "a" if i % 3 else "b"} for i in range(12)]
    records.append({"id": "copy", "text": records[0]["text"], "source": "c"})
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    created = run("init", "--count-by", "source")
    assert created.exit_code == 0 and "counts by: source" in created.output
    assert run("ingest", str(path), "--batch", "one").exit_code == 0
    sources = Counter(r["source"] for r in records)
    assert kept(admin_engine, schema) == {("source", s): (n, int(s == "c")) for s, n in sources.items()}
    added = run("count-by", "add", "lang")
    assert added.exit_code == 0 and added.output == "counting by 'lang': 1 values\n"
    assert kept(admin_engine, schema)[("lang", None)] == (len(records), 1)
    listed = run("count-by", "list")
    assert listed.output == f"source: 3 values, {len(records)} documents, 1 duplicates\n" \
                            f"lang: 1 values, {len(records)} documents, 1 duplicates\n"
    refused = run("init", "--count-by", "region")
    assert refused.exit_code == 1 and "simdb count-by add region" in refused.output
    again = run("count-by", "add", "source")
    assert again.exit_code == 1 and "already counts by 'source'" in again.output


def test_the_reader_role_reads_the_counts(database_url, schema, admin_engine):
    with Index.create(database_url, schema=schema, count_by=["source"]) as index:
        index.add_many([{"id": "a", "text": "one text of its own", "source": "x"}], batch="one")
        role = f"reader_{schema[-12:]}"
        index.grant_reader(role)
    try:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"SET LOCAL ROLE {role}")
            assert connection.exec_driver_sql(f"SELECT field, value, documents, duplicates FROM {schema}.field_counts"
                                              ).all() == [("source", "x", 1, 0)]
    finally:
        with admin_engine.begin() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.citus
def test_0018_goes_down_and_up_and_the_counts_start_from_an_added_field(database_url, schema, admin_engine):
    inputs = Inputs()
    with Index.create(database_url, schema=schema, count_by=["source"]) as index:
        one = rows_of("one", 10, 0x0123_4567_89AB_CDEF)
        index.add_fingerprinted(inputs.batch("one", one), batch="one")
        inputs.stored("one", one)
        layout = index.settings.layout
    with admin_engine.begin() as connection:
        connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        migrate.downgrade(connection, schema, "0017")
        assert connection.execute(sa.text("SELECT to_regclass('field_counts')")).scalar() is None
        assert connection.execute(sa.text("SELECT count(*) FROM settings WHERE name = 'count_by'")).scalar() == 0
    # opened as a user opens an index at 0017: upgraded on open (on Citus, the check of its distributed tables
    # asked for field_counts before the upgrade had made it, and every distributed archive refused to open)
    with Index.open(database_url, schema=schema) as index:
        assert index.settings.count_by == ()
        assert index.settings.layout == layout
    assert kept(admin_engine, schema) == {}
    with Index.open(database_url, schema=schema) as index:
        assert index.settings.count_by == ()
        index.count_by("source")
        two = rows_of("two", 3, 0x7654_3210_FEDC_BA98, [(r[0], r[1]) for r in one[:4]])
        index.add_fingerprinted(inputs.batch("two", two), batch="two")
        inputs.stored("two", two)
    assert kept(admin_engine, schema) == inputs.expected(["source"])


@pytest.mark.slow
def test_a_batch_killed_before_its_last_commit_and_resumed_is_counted_once(database_url, schema, admin_engine,
                                                                           tmp_path):
    """``simdb ingest`` SIGKILLed after its first chunks committed and before its last: the resumed batch's counts
    are those of every record stored once, duplicates decided by brute force (the verdicts' oracle)."""
    from simdb.inputs import Document
    from tests.test_resume import CORPUS, killed_at, simdb
    from tests.test_verdicts import oracle

    with Index.create(database_url, schema=schema, count_by=["source"]) as index:
        method = index.settings.method
    records = [{"id": r["id"], "text": r["text"], **({"source": f"s{i % 4}"} if i % 5 else {})}
               for i, r in enumerate(CORPUS[:60])]
    records += [{"id": f"copy-{r['id']}", "text": r["text"], "source": "copies"} for r in CORPUS[:10]]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    command = ["ingest", str(path), "--batch", "b", "--chunk-size", "25", "--workers", "1",
               "--database-url", database_url, "--schema", schema]
    killed = killed_at("before-last-commit", *command)
    assert killed.returncode == -9, killed.stderr
    assert simdb(*command, "--resume").returncode == 0
    verdicts = oracle(method, [], [Document(r["id"], r["text"]) for r in records])
    expected: dict[tuple[str, str | None], list[int]] = {}
    for record, (_, status, _, _) in zip(records, verdicts):
        entry = expected.setdefault(("source", record.get("source")), [0, 0])
        entry[0] += 1
        entry[1] += status in ("exact", "near")
    assert kept(admin_engine, schema) == {key: tuple(value) for key, value in expected.items()}
    assert expected[("source", "copies")] == [10, 10]


@pytest.mark.parametrize("edited", ['"source"', '["source", "source"]', '["source", " "]'],
                         ids=["not-a-list", "a-name-twice", "a-blank-name"])
def test_an_index_whose_fields_counted_were_edited_into_nonsense_does_not_open(database_url, schema, admin_engine,
                                                                              edited):
    """A name twice would have every chunk count its documents twice; a blank one names no field."""
    Index.create(database_url, schema=schema, count_by=["source"]).close()
    with admin_engine.begin() as connection:
        connection.execute(sa.text(f"UPDATE {schema}.settings SET value = CAST(:value AS jsonb) "
                                   "WHERE name = 'count_by'"), {"value": edited})
    with pytest.raises(IncompatibleIndex, match="settings were edited by hand"):
        Index.open(database_url, schema=schema)
