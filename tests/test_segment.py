"""rjieba (jieba-rs) must segment exactly as jieba does with its HMM off, or fingerprints would change.

jieba is the reference: every comparison runs both on the same text. The devset (real Chinese and
English text: the ``devset_texts`` fixture) is compared whole, raw and normalized; generated text mixes jieba's dictionary words with the characters its segmentation treats
specially (Latin letters and digits it groups, ``+#&._%-``, whitespace, Han outside its main range).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simdb import Index
from simdb.settings import IndexSettings
from simdb.text import segment
from simdb.text.normalize import normalize
from simdb.text.tokenize import _RUNS
from tests.conftest import examples

rjieba = pytest.importorskip("rjieba", reason="rjieba has no wheel for this platform; jieba segments alone")

def reference(text: str) -> list[str]:
    return segment._jieba().lcut(text, HMM=False)


def fast(text: str) -> list[str]:
    return rjieba.cut(text, False)


@pytest.mark.slow
def test_rjieba_gives_jiebas_tokens_on_every_devset_text(devset_texts):
    texts = devset_texts
    differing = []
    compared: set[str] = set()  # a piece met again (most Han runs recur: 219k runs, 96k different) is not cut again
    for text in texts:
        normalized = normalize(text)
        runs = [han for han, _, _ in _RUNS.findall(normalized) if han]
        for piece in (text, normalized, *runs):
            if piece in compared:
                continue
            compared.add(piece)
            if fast(piece) != reference(piece):
                differing.append(piece[:60])
                break
    assert len(texts) > 5000
    assert differing == []


_SPECIAL = list("aZz09+#&._%- \t\n\u3000，。é") + ["\r\n", "ab12", " 12.5% ", "C++", "\u3400", "\u4dbf",
                                                    "\u9fd5", "\u9fd6", "\u9fff", "\uf900", "\U00020000",
                                                    "\U0002a700", "ก", "カ"]


@functools.cache
def dictionary_words() -> list[str]:
    return sorted(word for word, frequency in segment._jieba().FREQ.items() if frequency > 0)


_HAN = st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)
_PIECE = st.one_of(st.integers(min_value=0, max_value=10**9).map(lambda i: ("word", i)),
                   st.text(_HAN, min_size=1, max_size=4).map(lambda t: ("text", t)),
                   st.sampled_from(_SPECIAL).map(lambda t: ("text", t)))


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(_PIECE, min_size=1, max_size=16))
@example([("text", "一一一丵丁"), ("text", "\u3400"), ("word", 0)])  # a tie that jieba-rs broke the other way
def test_rjieba_gives_jiebas_tokens_on_generated_text(pieces):
    words = dictionary_words()
    text = "".join(words[value % len(words)] if kind == "word" else value for kind, value in pieces)
    if not segment.BLOCKS_DIFFER.search(text):  # (where the blocks differ, simdb asks jieba itself)
        assert fast(text) == reference(text)
    assert segment.cut(text) == reference(text)


def test_the_segmenter_is_rjieba_unless_the_hmm_or_the_environment_asks_for_jieba(monkeypatch):
    assert segment.segmenter_name(hmm=False).startswith("rjieba ")
    assert segment.segmenter_name(hmm=True).startswith("jieba ")
    monkeypatch.setenv(segment.SEGMENTER_ENV, "jieba")
    assert segment.segmenter_name(hmm=False).startswith("jieba ")
    monkeypatch.setenv(segment.SEGMENTER_ENV, "rust")
    with pytest.raises(ValueError, match="SIMDB_SEGMENTER='rust' is not a segmenter"):
        segment.segmenter_name()


def test_an_index_records_every_segmenter_that_wrote_to_it(monkeypatch, database_url, schema):
    texts = ["北京天安门广场的升旗仪式吸引了许多游客", "上海浦东新区的金融中心建设进展顺利"]
    with Index.create(database_url, schema=schema) as index:
        assert index.settings.segmenters == (segment.segmenter_name(),)
        index.add_many([{"id": "a", "text": texts[0]}], batch="fast")
    monkeypatch.setenv(segment.SEGMENTER_ENV, "jieba")
    with Index.open(database_url, schema=schema) as index:  # the canaries agree under jieba
        index.add_many([{"id": "b", "text": texts[1]}], batch="reference")
        recorded = index.stats()["segmenters"]
        assert [match.external_id for match in index.query(texts[0], max_distance=0)] == ["a"]
    assert recorded == [f"rjieba {rjieba_version()}", f"jieba {jieba_version()}"]


def rjieba_version() -> str:
    return segment._version("rjieba")


def jieba_version() -> str:
    return segment._version("jieba")


def test_settings_written_before_segmenters_were_recorded_name_jieba():
    rows = IndexSettings.new().to_rows()
    del rows["segmenters"]
    assert IndexSettings.from_rows(rows).segmenters == (f"jieba {jieba_version()}",)

