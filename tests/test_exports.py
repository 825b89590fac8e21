"""``export --unique`` and ``--canonical``: which documents they give, held to a brute-force oracle computed from
the input texts, and stable while later batches, removals and merges of clusters happen.

``--unique`` is every stored document whose verdict was ``new`` when it arrived: it duplicated nothing stored
before it. A verdict is history, so later documents that link its cluster to an older one, and removals, do
not change it. ``--canonical`` is one document per cluster as the archive stands now: its earliest.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import Index, SimdbError
from simdb.ingest import IngestOptions
from simdb.inputs import Document
from simdb.pg.clusters import UnionFind
from simdb.samples import corpus
from tests.test_index import make_batch
from tests.test_verdicts import oracle
from tests.conftest import examples

CORPUS = list(corpus())
P, Y = 0x0123_4567_89AB_CDEF, 0x0123_4567_89AB_CDEF ^ 0b1111  # Y is 4 bits from P
X = Y ^ 0b1_0000  # 1 bit from Y, 5 from P


def exported(index: Index, **options) -> list[str]:
    return [record["id"] for record in index.export(**options)]


def minimal_case(index: Index) -> None:
    """Batch one holds P; batch two brings X (near nothing), then Y (near P at 4 and X at 1), which links
    X's cluster to P's: X is the one document of batch two that duplicates nothing stored before it."""
    index.add_fingerprinted(make_batch([P], "one"), batch="one")
    index.add_fingerprinted(make_batch([X, Y], "two"), batch="two")


@pytest.mark.citus
def test_a_document_that_was_new_stays_unique_when_a_later_one_links_it_to_an_older_cluster(index, run):
    minimal_case(index)
    assert [(v.id, v.status, v.duplicate_of, v.distance) for v in index.verdicts("two")] == \
        [("two-0", "new", None, None), ("two-1", "near", "one-0", 4)]
    assert exported(index, batch="two", unique=True) == ["two-0"]
    assert [json.loads(line)["id"] for line in run("export", "--batch", "two", "--unique").stdout.splitlines()] \
        == ["two-0"]
    assert exported(index, unique=True) == ["one-0", "two-0"]
    # one per cluster is another question, with its own name: the cluster {P, X, Y} has P as its earliest
    assert exported(index, canonical=True) == ["one-0"]
    assert exported(index, batch="two", canonical=True) == []
    assert run("export", "--batch", "two", "--canonical").stdout == ""


@pytest.mark.citus
def test_unique_keeps_the_verdict_when_the_document_duplicated_is_removed(index, run):
    minimal_case(index)
    index.add_fingerprinted(make_batch([Y ^ (1 << 40)], "three"), batch="three")  # near Y, later: changes nothing
    assert exported(index, batch="two", unique=True) == ["two-0"]
    index.remove(ids=["one-0"])  # Y duplicated P when it arrived; its verdict is history, and so is its export
    assert [(v.id, v.status, v.duplicate_of) for v in index.verdicts("two")] == \
        [("two-0", "new", None), ("two-1", "near", "one-0")]
    assert exported(index, batch="two", unique=True) == ["two-0"]
    assert exported(index, unique=True) == ["two-0"]
    assert exported(index, canonical=True) == ["two-0"]  # now the earliest of the cluster that is left
    index.remove(ids=["two-0"])
    assert exported(index, batch="two", unique=True) == []


def test_unique_and_canonical_together_are_a_usage_error(index, run):
    minimal_case(index)
    result = run("export", "--unique", "--canonical")
    assert result.exit_code == 2 and "--unique or --canonical, not both" in result.stderr
    with pytest.raises(SimdbError, match="`unique` or `canonical`, not both"):
        list(index.export(unique=True, canonical=True))


def test_documents_stored_before_verdicts_were_kept_are_unique_by_their_duplicate_of(index, admin_engine):
    """An archive from before revision 0005 has no records: its documents are unique when they point at no
    earlier document, and a batch begun then and resumed since is judged so up to its first record."""
    minimal_case(index)
    index.add_fingerprinted(make_batch([X ^ (1 << 50), P ^ (1 << 60), 0x0F0F_0F0F_0F0F_0F0F], "three"),
                            batch="three")
    before = {"two": exported(index, batch="two", unique=True), "three": exported(index, batch="three", unique=True),
              None: exported(index, unique=True)}
    assert before == {"two": ["two-0"], "three": ["three-2"], None: ["one-0", "two-0", "three-2"]}
    schema = index.database.schema
    with admin_engine.begin() as connection:  # as if batches one and two, and three's first record, came before 0005
        connection.execute(sa.text(
            f"DELETE FROM {schema}.records r USING {schema}.batches b WHERE b.id = r.batch_id "
            "AND (b.name IN ('one', 'two') OR (b.name = 'three' AND r.position = 1))"))
    assert {name: exported(index, batch=name, unique=True) for name in before} == before


# -- a property: the oracle from the input texts -------------------------------------------------------

@st.composite
def histories(draw):
    """Batches of corpus texts (near and exact copies abound), some records repeating a stored one (same id and
    text), with removals of stored documents between and after the batches."""
    steps, used, earlier = [], 0, []
    for number in range(draw(st.integers(2, 4))):
        picks = draw(st.lists(st.integers(0, len(CORPUS) - 1), min_size=1, max_size=14))
        records = [Document(f"b{number}-{i}-{CORPUS[p]['id']}", CORPUS[p]["text"]) for i, p in enumerate(picks)]
        if earlier:  # sent again: already stored, or stored anew if it was removed since
            records += draw(st.lists(st.sampled_from(earlier), max_size=2, unique_by=lambda d: d.external_id))
        earlier += records
        steps.append(("ingest", f"b{number}", records, draw(st.integers(1, 9))))
        used += len(records)
        if draw(st.booleans()):
            steps.append(("remove", draw(st.lists(st.integers(0, used - 1), min_size=1, max_size=3, unique=True))))
    return steps


def replay(index: Index, steps) -> dict:
    """Run a history, checking after every batch that the exports of every batch so far are the oracle's;
    returns the oracle's answers at the end."""
    method = index.settings.method
    stored: list = []   # (id, sketch, content hash) of the documents stored, in the order they arrived
    order: list = []    # (id, batch, verdict) of every document stored, in arrival order
    current: dict = {}  # id -> batch of the stored documents
    ingested: list = []
    for step in steps:
        if step[0] == "ingest":
            _, name, records, chunk_size = step
            verdicts = oracle(method, stored, records)
            index.ingest(records, IngestOptions(batch=name, chunk_size=chunk_size))
            for record, (_, status, _, _) in zip(records, verdicts):
                if status in ("new", "exact", "near"):
                    order.append((record.external_id, name, status))
                    current[record.external_id] = name
            ingested.append((name, verdicts))
        else:
            candidates = [external_id for external_id, _, _ in order if external_id in current]
            removed = sorted({candidates[i % len(candidates)] for i in step[1]}) if candidates else []
            if removed:
                index.remove(ids=removed)
                stored[:] = [s for s in stored if s[0] not in removed]
                for external_id in removed:
                    del current[external_id]
        unique = [(i, b) for i, b, status in order if status == "new" and current.get(i) == b]
        for name, verdicts in ingested:  # the same answer after every later step
            assert exported(index, batch=name, unique=True) == [i for i, b in unique if b == name], name
            assert [(v.id, v.status, v.duplicate_of, v.distance) for v in index.verdicts(name)] == verdicts, name
        assert exported(index, unique=True) == [i for i, _ in unique]
    return {"stored": stored, "order": order, "current": current}


def canonical(method, stored: list) -> list[str]:
    """The earliest document of each connected component of the stored pairs, by brute force, in arrival order."""
    forest = UnionFind()
    for i, (_, sketch, _) in enumerate(stored):
        forest.find(i)
        if i:
            distances = method.distances(sketch, [method.stored([s])[0] for _, s, _ in stored[:i]]).tolist()
            for j, distance in enumerate(distances):
                if distance <= method.max_distance:
                    forest.union(j, i)
    return [external_id for i, (external_id, _, _) in enumerate(stored) if forest.find(i) == i]


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@pytest.mark.parametrize("options", [{}, {"method": "minhash", "threshold": 0.7}], ids=["simhash", "minhash"])
@given(steps=histories())
def test_unique_is_every_document_that_was_new_when_it_arrived_whatever_came_after(options, fresh_index, steps):
    with fresh_index(**options) as index:  # each example on an index as created (emptied, not created again)
        found = replay(index, steps)
        method = index.settings.method
        assert exported(index, canonical=True) == canonical(method, found["stored"])
        for name in {b for _, b, _ in found["order"]}:
            assert exported(index, batch=name, canonical=True) == \
                [i for i in canonical(method, found["stored"]) if found["current"][i] == name]
