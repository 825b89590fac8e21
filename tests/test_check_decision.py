"""``check`` and ``ingest`` reach each record's status through one decision (:mod:`simdb.decisions`): held equal
record by record (status, ``duplicate_of``, distance) on the input fuzzer's files and on real text, under SimHash,
MinHash and MinHash ``verify="exact"``, against an archive of earlier batches; and ``check`` holds no matching
of its own."""

from __future__ import annotations

import ast
import dataclasses
import json
import random
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdb import Index, InputError
from simdb.check import check
from simdb.ingest import IngestOptions
from simdb.inputs import DEFAULT_MAX_CHARS, Document, read_documents
from tests.conftest import count_rows
from tests.test_input_fuzz import EXAMPLES, MAX_CHARS, compress, empty_archive, files

ROOT = Path(__file__).resolve().parents[1]
DEVSET = Path("/work/shared/devset/docs")
METHODS = {"simhash": {}, "minhash": {"method": "minhash", "threshold": 0.7},
           "minhash-exact": {"method": "minhash", "threshold": 0.7, "verify": "exact"}}


@pytest.fixture(scope="module")
def indexes(server_url):
    """One index per method, emptied by each example."""
    opened = {}
    try:
        for name, options in METHODS.items():
            opened[name] = Index.create(server_url, schema=f"simdb_test_{uuid.uuid4().hex[:12]}", **options)
        yield opened
    finally:
        for index in opened.values():
            with index.database.engine.begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA {index.database.schema} CASCADE")
            index.close()


def essentials(verdicts) -> list:
    """The verdicts but for a reject's wording (ingest meets an id repeated across chunks in SQL)."""
    return [dataclasses.replace(v, reason=None) for v in verdicts]


def check_then_ingest(index, admin_engine, items: list, check_chunk: int, ingest_chunk: int,
                      max_chars: int = MAX_CHARS) -> tuple[list, list]:
    """``check``'s verdicts of ``items`` (nothing stored), then ingest's, recorded, of batch "new"."""
    before = count_rows(admin_engine, index.database.schema)
    checked = list(check(index.context, items, batch="new", max_chars=max_chars, chunk_size=check_chunk))
    assert count_rows(admin_engine, index.database.schema) == before  # nothing stored
    index.ingest(items, IngestOptions(batch="new", chunk_size=ingest_chunk, on_error="skip", max_chars=max_chars,
                                      rejects="/dev/null"))
    return checked, list(index.verdicts("new")) if items else []  # no records, no batch


def with_copies(items: list, pool: list[Document], copies: list[tuple[int, str]]) -> list:
    """``items`` and, at the end, exact or edited copies (under new ids) of documents of ``pool``."""
    extra = []
    for at, kind in copies if pool else ():
        text = pool[at % len(pool)].text
        extra.append(Document(f"copy-{len(extra)}", text if kind == "same" else text + " x"))
    return items + extra


@settings(max_examples=max(10, EXAMPLES // 10), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(method=st.sampled_from(sorted(METHODS)), earlier=st.lists(files(), min_size=1, max_size=2), new=files(),
       copies=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["same", "edited"])), max_size=8),
       check_chunk=st.integers(1, 6), ingest_chunk=st.integers(1, 6))
def test_check_gives_ingests_verdicts_on_fuzzed_files(indexes, admin_engine, tmp_path_factory, method, earlier, new,
                                                      copies, check_chunk, ingest_chunk):
    index = indexes[method]
    empty_archive(admin_engine, index.database.schema)
    folder = tmp_path_factory.mktemp("fuzz")
    stored = []
    for number, (fmt, data, compression) in enumerate([*earlier, new]):
        path = folder / (f"{number}.{fmt}" + (f".{compression}" if compression else ""))
        path.write_bytes(compress(data, compression))
        try:
            items = list(read_documents([str(path)], skip_errors=True, max_chars=MAX_CHARS))
        except InputError:  # an error of the whole file (a header naming a column twice): no records
            items = []
        if number < len(earlier):  # the archive's earlier batches
            index.ingest(items, IngestOptions(batch=f"earlier-{number}", chunk_size=3, on_error="skip",
                                              max_chars=MAX_CHARS, rejects="/dev/null"))
            stored += [item for item in items if isinstance(item, Document)]
    # exact and edited copies of the archive's documents and of the new file's own
    items = with_copies(items, stored + [item for item in items if isinstance(item, Document)], copies)
    checked, ingested = check_then_ingest(index, admin_engine, items, check_chunk, ingest_chunk)
    assert essentials(checked) == essentials(ingested)


def devset(category: str, count: int, seed: int) -> list[Document]:
    """``count`` documents of one devset category, bases with their edited copies, in a shuffled order."""
    path = DEVSET / f"{category}.jsonl"
    if not path.exists():
        pytest.skip(f"no devset at {DEVSET}")
    with path.open(encoding="utf-8") as lines:
        records = [json.loads(line) for _, line in zip(range(count), lines)]
    random.Random(seed).shuffle(records)
    return [Document(record["id"], record["text"]) for record in records]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("category", ["long-en", "short-zh"])
def test_check_gives_ingests_verdicts_on_real_text(indexes, admin_engine, method, category):
    index = indexes[method]
    empty_archive(admin_engine, index.database.schema)
    documents = devset(category, 900, seed=len(method))
    for number, part in enumerate((documents[:250], documents[250:500])):  # the archive's earlier batches
        index.ingest(part, IngestOptions(batch=f"earlier-{number}", chunk_size=100))
    # the new batch: unseen documents, and records already stored (the same id and text)
    items = documents[500:] + documents[100:110]
    checked, ingested = check_then_ingest(index, admin_engine, items, check_chunk=150, ingest_chunk=170,
                                           max_chars=DEFAULT_MAX_CHARS)
    statuses = {v.status for v in ingested}
    assert {"new", "near", "already_stored"} <= statuses, statuses  # the devset has edited copies across batches
    assert essentials(checked) == essentials(ingested)


def imported_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def called_attributes(path: Path) -> set[str]:
    return {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Call)}


MATCHING = {"distances", "pair_distances", "pairs_within", "decide", "candidate_distance_pairs", "earliest",
            "distinct", "key_matches", "shared_key_candidates", "shared_key_pairs", "exact_duplicates"}


def test_check_and_ingest_decide_through_one_function_and_check_matches_nothing_itself():
    check_module, chunks_module = ROOT / "simdb" / "check.py", ROOT / "simdb" / "pg" / "chunks.py"
    for module in (check_module, chunks_module):
        assert "decisions.decide_chunk" in imported_names(module), module
        assert "decide_chunk" in called_attributes(module), module
    # check computes no distance, matches no key and decides no status of its own
    assert not {name for name in imported_names(check_module) if "matches" in name}
    assert not called_attributes(check_module) & MATCHING
    source = check_module.read_text(encoding="utf-8")
    assert not [status for status in ('"exact"', '"near"', '"new"') if status in source]
