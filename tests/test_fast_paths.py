"""The fingerprint's fast paths give exactly what the plain definitions give.

``fold`` replaces characters by their own NFKC forms before asking ``unicodedata`` to normalize what is
left, and the ``auto`` tokenizer counts the tokens of runs read out of text whose punctuation is still
in, segmented in one call: both are held to the straightforward versions on generated text rich in the
characters that make them differ (full-width and compatibility forms, combining marks, Hangul jamo,
punctuation inside scripts without spaces, astral characters) and on every devset text. So are the
regular expressions that strip punctuation and count MinHash's letters without a loop in Python.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

import simdb.methods.minhash.signature as minhash_signature
from simdb.errors import InputError
from simdb.methods.minhash.signature import MinHashSettings, writes_without_spaces
from simdb.text.normalize import (ascii_words, fold, fold_and_simplify, normalize, punctuation_and_symbols,
                                  strip_punctuation)
from simdb.text.scripts import WITHOUT_SPACES_CHARACTER
from simdb.text import segment
from simdb.text.tokenize import _RUNS, TokenizerSettings, count_punctuated, punctuated_tokens, shingles, tokenize
from tests.conftest import examples

_TRICKY = st.sampled_from(list("abcXYZ019 \t\n\u3000\u00a0,.!?;:'\"()[]{}+-*/=<>@#$%^&_~|\\，。！？：；（）《》、…—·「」"
                               "人民日报北京天安门中文與網路設定頭髮後來發現的了是和")
                          + ["\u0e3f", "\u0e4f", "\u30fb", "\u30a0", "\u309b", "สวัส", "ดี", "カタカナ", "ひらがな",
                             "\U0001f600", "\U0001d11e", "\U00020000", "\U0002a6d6", "\uf900", "\u3400", "é", "e\u0301",
                             "\u2f00", "\u3192", "ﬁ", "Ⅻ", "①", "²", "\u0338", "=\u0338", "Ａ", "ＴＥＸＴ", "\u1100\u1161",
                             "\u0301", "\u0327", "\u212b", "\u1161", "\u11a8", "가", "ｶ", "\uff9e", "\uff9f", "ß", "İ",
                             "\u0345", "\u03b9", "ǅ"])


def _tokens_both_ways(text: str, tokenizer: TokenizerSettings) -> tuple[Counter, Counter]:
    return (Counter(tokenize(normalize(text), tokenizer)),
            count_punctuated(fold_and_simplify(text), tokenizer) if normalize(text) else Counter())


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=30).map("".join), st.booleans(), st.booleans())
def test_the_fingerprints_fast_path_gives_the_tokens_of_the_normalized_text(text, hmm, stopwords):
    tokenizer = TokenizerSettings(jieba_hmm=hmm, stopwords=stopwords)
    slow, fast = _tokens_both_ways(text, tokenizer)
    assert fast == slow


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=30).map("".join), st.booleans(), st.booleans())
def test_the_ordered_fast_path_gives_the_tokens_of_the_normalized_text_in_their_order(text, hmm, stopwords):
    """Bigrams are made of neighbouring tokens: the fast path must give the plain path's order too."""
    tokenizer = TokenizerSettings(jieba_hmm=hmm, stopwords=stopwords)
    slow = tokenize(normalize(text), tokenizer)
    assert (punctuated_tokens(fold_and_simplify(text), tokenizer) if normalize(text) else []) == slow


@settings(max_examples=examples(1500), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3), st.sampled_from(["\U00020000", "\U0002c62d", "丵"])),
                max_size=30).map("".join), st.booleans())
def test_the_plain_tokenizer_segments_each_han_run_on_its_own(text, hmm):
    """The plain path (all text with a character beyond the Basic Multilingual Plane) segments every Han run
    of the normalized text in one call, the runs joined by spaces; the definition is one run at a time, by
    jieba itself."""
    tokenizer = TokenizerSettings(jieba_hmm=hmm, stopwords=False)
    normalized = normalize(text)
    han, words, shingled = [], [], []
    for run, nospace, word in _RUNS.findall(normalized):
        if run:
            han.extend(t for t in segment._jieba().lcut(run, HMM=hmm) if not t.isspace())
        elif nospace:
            shingled.extend(shingles(nospace, tokenizer.shingle_size))
        else:
            words.append(word)
    assert tokenize(normalized, tokenizer) == han + words + shingled


def test_tokens_are_grouped_by_kind_each_kind_in_text_order():
    tokens = tokenize(normalize("PostgreSQL 数据库 supports สวัสดี B-tree 索引"), TokenizerSettings(stopwords=False))
    assert tokens == ["数据库", "索引", "postgresql", "supports", "b", "tree", "สวั", "วัส", "ัสด", "สดี"]


@pytest.mark.slow
def test_the_fingerprints_fast_path_gives_the_tokens_of_every_devset_text(devset_texts):
    differing = [text[:60] for text in devset_texts
                 if operator.ne(*_tokens_both_ways(text, TokenizerSettings()))
                 or punctuated_tokens(fold_and_simplify(text)) != tokenize(normalize(text))]
    assert differing == []


@settings(max_examples=examples(5000), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=30).map("".join))
def test_fold_is_nfkc_then_casefold(text):
    assert fold(text) == unicodedata.normalize("NFKC", text).casefold()


@pytest.mark.slow
def test_fold_is_nfkc_then_casefold_on_every_devset_text(devset_texts):
    assert [t[:60] for t in devset_texts if fold(t) != unicodedata.normalize("NFKC", t).casefold()] == []


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=30).map("".join))
def test_punctuation_is_stripped_as_translate_then_collapse_did(text):
    stripped = re.sub(r"\s+", " ", text.translate(dict.fromkeys(punctuation_and_symbols(), " "))).strip()
    assert strip_punctuation(text) == stripped


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=30).map("".join))
def test_minhash_counts_letters_as_a_loop_over_the_characters_did(text):
    letters = sum(1 for c in text if c.isalpha())
    expected = letters > 0 and 4 * len(WITHOUT_SPACES_CHARACTER.findall(text)) >= letters
    assert writes_without_spaces(text) == expected


@settings(max_examples=examples(2000), deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_words_are_the_words_of_the_stripped_text(text):
    assert ascii_words(text) == strip_punctuation(text).split()


def _shingles_or_error(shingles, text, settings):
    try:
        return shingles(text, settings).tolist()
    except InputError as exc:
        return exc.reason


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(st.one_of(_TRICKY, st.text(max_size=3), st.sampled_from(["hello", "world", " "])), max_size=120)
       .map("".join), st.sampled_from([0, 100]))
def test_minhash_shingles_by_table_lookup_are_those_of_the_normalized_text(text, table_from):
    """The fast paths (code points classified by a table; ASCII words by translate) against the definition:
    normalize, then characters or words; with the table used from the first character and from its
    default length."""
    settings_ = MinHashSettings()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(minhash_signature, "TABLE_FROM", table_from)
        fast = _shingles_or_error(minhash_signature.shingle_hashes, text, settings_)
    assert fast == _shingles_or_error(minhash_signature.plain_shingle_hashes, text, settings_)


@pytest.mark.slow
def test_minhash_shingles_by_table_lookup_on_every_devset_text(devset_texts):
    settings_ = MinHashSettings()
    assert [t[:60] for t in devset_texts if not np.array_equal(minhash_signature.shingle_hashes(t, settings_),
                                                                 minhash_signature.plain_shingle_hashes(t, settings_))] == []
