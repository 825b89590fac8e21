"""Text -> tokens -> fingerprint."""

import math
import subprocess
import sys
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import xxhash
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simdb import InputError, fingerprint, hamming
from tests.conftest import Concurrently, examples, use_python_twins
import simdb.methods.simhash.fingerprint as fingerprint_module
from simdb.methods.simhash.fingerprint import (FingerprintSettings, feature_vector, fingerprints, simhash,
                                              simhash_of_hashes, tokens_for, weighted_features)
from simdb.text.normalize import normalize
from simdb.samples import sections
from simdb.settings import CANARY_TEXTS
from simdb.text.tokenize import TokenizerSettings, tokenize

ARTICLE = ("Assert statements are a convenient way to insert debugging assertions into a program. "
           "The simple form is equivalent to raising AssertionError when the expression is false, "
           "and the extended form passes a second expression to the exception as its argument.")


def test_normalize_folds_width_case_and_punctuation():
    assert normalize("ＨＥＬＬＯ，　Ｗｏｒｌｄ！！ 123") == "hello world 123"
    assert normalize("  a\t\nb  ") == "a b"
    assert normalize("Straße") == "strasse"


def test_chinese_goes_through_jieba_and_english_through_words():
    tokens = tokenize(normalize("我们今天在北京大学学习自然语言处理, and we like it"))
    assert "北京大学" in tokens and "自然语言" in tokens
    assert "like" in tokens
    assert "我们" not in tokens and "and" not in tokens  # stop words


def test_scripts_without_spaces_become_shingles():
    assert tokenize("สวัสดีครับ") == ["สวั", "วัส", "ัสด", "สดี", "ดีค", "ีคร", "ครั", "รับ"]


def test_forced_tokenizers():
    text = normalize("Hello big world")
    assert tokenize(text, TokenizerSettings(name="words", stopwords=False)) == ["hello", "big", "world"]
    assert tokenize(text, TokenizerSettings(name="shingles", shingle_size=4))[:2] == ["hell", "ello"]


def test_same_text_same_fingerprint_across_processes():
    here = [fingerprint(text) for text in CANARY_TEXTS]
    code = "from simdb import fingerprint; from simdb.settings import CANARY_TEXTS; " \
           "print(*[fingerprint(t) for t in CANARY_TEXTS])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert [int(v) for v in there.split()] == here


def test_fingerprint_is_pinned():
    # If this changes, the recipe changed: bump fingerprint.ALGORITHM, since
    # every stored index would otherwise mix old and new fingerprints.
    # The settings that are stored with an index (weighting, bigrams) may change their defaults; what an index
    # created under the earlier defaults stores must still give its fingerprints.
    assert f"{fingerprint(ARTICLE):016x}" == "3ce268a456fb35cc"
    assert f"{fingerprint(ARTICLE, FingerprintSettings(weighting='sublinear_tf', bigrams=0)):016x}" == "28c672a431f32108"


def test_near_copies_are_close_and_other_texts_are_not():
    base = fingerprint(ARTICLE)
    assert hamming(base, fingerprint(ARTICLE.upper().replace(",", " ;"))) == 0
    section = next(text for _, text in sections() if len(text) > 1400)
    assert hamming(fingerprint(section), fingerprint(section.replace(" the ", " teh ", 2))) <= 3
    other = fingerprint("PostgreSQL stores tables in heap files and uses B-tree indexes for equality lookups "
                        "and range scans; the planner chooses between sequential and index scans by cost.")
    assert hamming(base, other) > 10


def test_weights_are_sublinear_term_frequency():
    features, weights = weighted_features(["a", "b", "a", "a"], "sublinear_tf")
    assert features == ["a", "b"]
    assert weights.tolist() == pytest.approx([1 + 1.0986122886681098, 1.0])


def _bigram_hash_by_the_definition(first: int, second: int) -> int:
    mask = 2**64 - 1
    x = ((first << 32 | first >> 32) & mask) ^ second
    x = ((x ^ x >> 30) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ x >> 27) * 0x94D049BB133111EB) & mask
    return x ^ x >> 31


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "数据", "索引", "the", "x1"]), min_size=1,
                max_size=120).map(" ".join), st.sampled_from([1, 7, 50]), st.sampled_from(["tf", "sublinear_tf", "binary"]))
@example(" ".join(["alpha"] * 17 + ["beta", "alpha", "gamma", "alpha"]), 7, "binary")
def test_a_fingerprint_with_bigrams_is_the_sign_of_the_exact_sum_of_its_tokens_and_bigrams(text, scale, weighting):
    """The recipe, computed from its definition: every distinct token weighted by its frequency, every
    distinct pair of neighbouring tokens by its frequency times min(1, scale / tokens); the weights are
    doubles (each product rounded once, the same on every machine) and their signed sums exact. Hypothesis
    found the case that tells this apart from weights taken as exact rationals: 21 tokens at scale 7, where
    three bigrams of weight 1/3 cancel a token of weight 1 exactly, and three doubles of 7/21 do not."""
    recipe = FingerprintSettings(weighting=weighting, bigrams=scale, seed=5)
    assert fingerprint(text, recipe) == _fingerprint_by_the_definition(text, recipe)


def _fingerprint_by_the_definition(text: str, recipe: FingerprintSettings) -> int:
    features = [(h, Fraction(w)) for h, w in _features_by_the_definition(text, recipe)]
    expected = 0
    for bit in range(64):
        expected |= (sum(w if h >> bit & 1 else -w for h, w in features) > 0) << bit
    return expected


def _features_by_the_definition(text: str, recipe: FingerprintSettings) -> list[tuple[int, float]]:
    tokens = tokens_for(text, recipe)
    weight = {"tf": float, "binary": lambda n: 1.0, "sublinear_tf": lambda n: 1 + math.log(n)}[recipe.weighting]
    token_hash = {t: xxhash.xxh3_64_intdigest(t.encode(), recipe.seed) for t in tokens}
    features = [(token_hash[t], weight(n)) for t, n in Counter(tokens).items()]
    share = min(1.0, recipe.bigrams / len(tokens))
    return features + [(_bigram_hash_by_the_definition(token_hash[a], token_hash[b]), weight(n) * share)
                       for (a, b), n in Counter(zip(tokens, tokens[1:])).items()]


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.sampled_from(["alpha", "beta", "gamma", "the", "数据", "索引", "的", "x1", "ไทย", "，"]), min_size=1,
                max_size=80).map(" ".join), st.sampled_from([0, 1, 7, 50]),
       st.sampled_from(["tf", "sublinear_tf", "binary"]))
def test_a_texts_feature_vector_is_what_its_fingerprint_signs(text, scale, weighting):
    """feature_vector shows the recipe's features: their SimHash is the text's fingerprint, and with bigrams
    they are the definition's features, weights included (scripts/simhash_ceiling.py compares texts by them)."""
    recipe = FingerprintSettings(weighting=weighting, bigrams=scale, seed=5)
    hashes, weights = feature_vector(text, recipe)
    assert simhash_of_hashes(hashes, weights) == fingerprint(text, recipe)
    assert len(set(hashes.tolist())) == len(hashes)  # one entry per distinct feature
    if scale:
        assert sorted(zip(hashes.tolist(), weights.tolist())) == sorted(_features_by_the_definition(text, recipe))


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.lists(st.sampled_from(["alpha", "beta", "the", "of", "数据索引", "的", "，", "。", "x1", "ไทย"]),
                         min_size=1, max_size=40).map("".join), min_size=1, max_size=12),
       st.sampled_from([1, 3, fingerprint_module.VOCABULARY_LIMIT]), st.sampled_from([1, 5, 256]),
       st.sampled_from([2**62, 64]), st.booleans())
def test_fingerprints_of_a_batch_are_each_texts_own(texts, vocabulary_limit, batch_texts, key_bound, stopwords):
    """Many texts fingerprinted together (ids from a vocabulary kept between calls, which starts again when
    full; features counted and summed for the whole batch; stop words and the spaces between Han runs
    dropped by the vocabulary) give each text the fingerprint its definition gives it alone."""
    recipe = FingerprintSettings(seed=5, tokenizer=TokenizerSettings(stopwords=stopwords))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fingerprint_module, "VOCABULARY_LIMIT", vocabulary_limit)
        patch.setattr(fingerprint_module, "BATCH_TEXTS", batch_texts)
        patch.setattr(fingerprint_module, "KEY_BOUND", key_bound)
        texts = texts + ["   "]  # a text without a fingerprint keeps its place
        results = fingerprints(texts, recipe)
    assert isinstance(results.pop(), InputError)
    assert results == [_fingerprint_by_the_definition(text, recipe) for text in texts[:-1]]


def test_bigrams_tell_word_order_apart():
    words = "archive index segment cluster lookup ingest"
    reordered = "ingest lookup cluster segment index archive"
    assert fingerprint(words, FingerprintSettings(bigrams=0)) == fingerprint(reordered, FingerprintSettings(bigrams=0))
    assert fingerprint(words) != fingerprint(reordered)


def test_simhash_of_one_feature_is_its_hash():
    import xxhash
    assert simhash(["x"], __import__("numpy").ones(1), 5) == xxhash.xxh3_64_intdigest(b"x", 5)


def test_punctuation_only_text_still_has_a_fingerprint():
    assert fingerprint("!!!") == fingerprint("！！！")
    assert tokens_for("the of and", FingerprintSettings()) == ["the", "of", "and"]


@pytest.mark.parametrize("text", ["", "   ", "\n\t\u3000"])
def test_empty_text_is_an_error(text):
    with pytest.raises(InputError, match="empty or only whitespace"):
        fingerprint(text)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=3), st.sampled_from([1.0, 1.0 + math.log(2), 1.0 + math.log(3),
                                                                              0.1, 2.5 * math.log(7), 1e-3])),
                min_size=1, max_size=40, unique_by=lambda feature: feature[0]),
       st.randoms(use_true_random=False))
def test_simhash_is_the_sign_of_the_exact_sum_whatever_the_order_of_its_features(features, random):
    """Equal weights cancel to exactly zero, where a floating-point sum can land on either side depending on
    its order and on the CPU's BLAS kernel: a fingerprint must not depend on either."""
    names = [name for name, _ in features]
    weights = [weight for _, weight in features]
    expected = 0
    for bit in range(64):
        exact = sum((Fraction(w) if xxhash.xxh3_64_intdigest(n.encode(), 5) >> bit & 1 else -Fraction(w))
                    for n, w in zip(names, weights))
        expected |= (exact > 0) << bit
    order = list(range(len(names)))
    random.shuffle(order)
    assert simhash(names, np.array(weights), 5) == expected
    assert simhash([names[i] for i in order], np.array([weights[i] for i in order]), 5) == expected


class _Recorded(np.ndarray):
    """An array that notes how many threads numpy's BLAS may use whenever it takes part in a ufunc."""

    threads: list = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from threadpoolctl import threadpool_info
        _Recorded.threads.append(max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"))
        inputs = [np.asarray(x) if isinstance(x, _Recorded) else x for x in inputs]
        return getattr(ufunc, method)(*inputs, **kwargs)


def test_the_bit_sums_hold_blas_to_one_thread(monkeypatch):
    """OpenBLAS's pool, woken for a small product, spin-waits after it: a worker took 1,160 us of CPU a
    document where one thread takes 730, from the other worker and the database. (The compiled sums use no
    BLAS: this is the pure-Python path's.)"""
    use_python_twins(monkeypatch)
    _Recorded.threads = []
    monkeypatch.setattr(fingerprint_module, "_BYTE_BITS", fingerprint_module._BYTE_BITS.view(_Recorded))
    texts = ["数据库索引的近似重复检测", "near duplicate detection in a text archive", "第三个文本"]
    assert fingerprints(texts, FingerprintSettings()) == [fingerprint(t) for t in texts]
    assert _Recorded.threads and set(_Recorded.threads) == {1}


def test_threads_fingerprinting_at_once_each_get_their_texts_own_fingerprints(monkeypatch):
    """The process's vocabulary (token ids, their hashes and kinds) is shared by every thread: two ingests in one
    process fingerprint at once, and the compiled sums run without the GIL. One thread's new tokens (or the
    vocabulary starting again when full) between another's lookup of its ids and its sums gave that thread ids
    outside its arrays ("a token id outside the vocabulary", seen in a run of concurrent keyed ingests), or ids
    of another vocabulary: fingerprints of other tokens, silently. Oracle: each text's definition, alone."""
    import random

    recipe = FingerprintSettings(seed=11)
    shared = fingerprint_module._Vocabulary(recipe.seed, limit=400)  # starts again often
    monkeypatch.setattr(fingerprint_module, "_vocabulary", lambda seed: shared)
    rng = random.Random(3)
    per_thread = [[" ".join(f"t{rng.randrange(3000)}" for _ in range(30)) for _ in range(40)] for _ in range(4)]
    expected = [[_fingerprint_by_the_definition(text, recipe) for text in texts] for texts in per_thread]
    wrong: list[int] = []

    def run(number: int) -> None:
        for _ in range(15):
            if fingerprints(per_thread[number], recipe) != expected[number]:
                wrong.append(number)

    with Concurrently() as threads:  # re-raises any thread's error
        for number in range(4):
            threads.start(run, number)
        threads.results()
    assert not wrong
