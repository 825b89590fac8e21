"""The compiled fast paths (simdb/csrc/) give exactly what their Python twins give.

Each compiled function is held to the Python function that defines it (simdb/native.py lists the pairs), on
every devset text, on generated text rich in the characters that make paths differ (full-width and
compatibility forms, combining marks, Hangul jamo, scripts without spaces, astral characters, the Han
characters jieba-rs segments differently), on every character of the Basic Multilingual Plane alone and on
every canonical composition pair; and whole fingerprints and MinHash signatures are held to the
pure-Python pipeline.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdb import native
from tests.conftest import examples, use_python_twins
from simdb.methods.minhash import signature as minhash_signature
from simdb.methods.minhash.signature import MinHashSettings
from simdb.methods.simhash import fingerprint as fp
from simdb.methods.simhash.fingerprint import FingerprintSettings, fingerprints, simhashes_of_tokens
from simdb.text.normalize import fold_and_simplify, fold_in_python
from simdb.text.scripts import ASTRAL_CHARACTER
from simdb.text import t2s
from simdb.text.segment import BLOCKS_DIFFER
from simdb.text.tokenize import TokenizerSettings, punctuated_parts, punctuated_parts_many, punctuated_runs

compiled = native.module()
needs_native = pytest.mark.skipif(compiled is None, reason="simdb._native is not built here, or SIMDB_NATIVE=off")

_CHARACTERS = st.sampled_from(
    list("abcXYZ019 \t\n\u3000\u00a0,.!?;'\"()+-_~|，。！？：；（）《》、…—·「」人民日报北京中文與網路設定頭髮後來的了是和")
    + ["\u0e3f", "สวัส", "ดี", "カタカナ", "ひらがな", "\u30fb", "\U0001f600", "\U00020000", "\uf900", "\u3400",
       "\u9fd6", "\u9fff", "é", "e\u0301", "\u2f00", "\u3192", "ﬁ", "Ⅻ", "①", "²", "\u0338", "=\u0338", "Ａ",
       "ＴＥＸＴ", "\u1100\u1161", "\u0301", "\u212b", "\u1161", "\u11a8", "가", "ｶ", "\uff9e", "ß", "İ", "\u0345",
       "ǅ", "\ud800", "\u0cd5", "\u0f71"])
_TEXT = st.lists(_CHARACTERS, max_size=40).map("".join)


def test_the_compiled_module_is_built_here():
    """The build compiles it wherever a C compiler is at hand, as on the machines the tests run on: without
    it, the comparisons below would be skipped and the speed would be the pure-Python one."""
    if native.mode() == "off":
        pytest.skip("SIMDB_NATIVE=off turns the compiled paths off")
    assert native.enabled(), "simdb._native was not compiled: see `pip install -v -e .`"
    assert compiled is not None and native.description() == "on"



def test_the_cached_tables_are_those_built_from_the_definitions(tmp_path, monkeypatch):
    """Issue 38: every command spent 0.6 s building the compiled paths' character tables. They are cached in a
    file: what a later process reads is what the definitions build, and a damaged file is built again."""
    from simdb.text import characters

    built = (*characters.fold_tables(), characters.character_classes())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert characters.native_tables() == built  # built, and written
    [cached] = (tmp_path / "simdb").iterdir()

    def no_building():
        raise AssertionError("built again although the cache file holds the tables")

    with monkeypatch.context() as patched:
        patched.setattr(characters, "fold_tables", no_building)
        assert characters.native_tables() == built
    cached.write_bytes(cached.read_bytes()[:1000])
    assert characters.native_tables() == built  # built again, and written whole
    with monkeypatch.context() as patched:
        patched.setattr(characters, "fold_tables", no_building)
        assert characters.native_tables() == built

@needs_native
def test_fold_agrees_with_python_on_every_character_alone():
    for cp in range(0x10000):
        character = chr(cp)
        folded = compiled.fold(character)
        assert folded is None or folded == fold_in_python(character), hex(cp)


@needs_native
def test_fold_sends_every_canonical_composition_pair_to_python_or_agrees():
    """A character that composes with the one before it must never be folded by table lookup alone."""
    checked = 0
    for cp in range(0x110000):
        decomposition = unicodedata.decomposition(chr(cp))
        if decomposition and not decomposition.startswith("<") and len(decomposition.split()) == 2:
            pair = "".join(chr(int(part, 16)) for part in decomposition.split())
            for text in (pair, "x" + pair + "中"):
                folded = compiled.fold(text)
                assert folded is None or folded == fold_in_python(text), ascii(text)
            checked += 1
    assert checked > 900


@needs_native
@settings(max_examples=examples(400), deadline=None)
@given(_TEXT)
def test_fold_agrees_with_python(text):
    folded = compiled.fold(text)
    assert folded is None or folded == fold_in_python(text)


def _runs_in_python(folded: str):
    not_han, nospace, word = punctuated_runs()
    han = not_han.sub(" ", folded)
    return han, word.findall(folded), nospace.findall(folded), BLOCKS_DIFFER.search(han) is not None


@needs_native
@settings(max_examples=examples(400), deadline=None)
@given(_TEXT)
def test_runs_agree_with_the_regexes(text):
    folded = fold_in_python(text)
    runs = compiled.runs(folded)
    if ASTRAL_CHARACTER.search(folded):
        assert runs is None and compiled.has_astral(folded)
    else:
        assert runs == _runs_in_python(folded) and not compiled.has_astral(folded)


@needs_native
def test_the_compiled_paths_agree_on_every_devset_text(devset_texts):
    taken = 0
    for text in devset_texts:
        folded = compiled.fold(text)
        assert folded is None or folded == fold_in_python(text)
        runs = compiled.runs(fold_in_python(text))
        assert runs is None or runs == _runs_in_python(fold_in_python(text))
        taken += folded is not None and runs is not None
    assert taken > 0.95 * len(devset_texts)  # real text takes the compiled paths, not the Python ones


@needs_native
@settings(max_examples=examples(400), deadline=None)
@given(_TEXT)
def test_any_marked_agrees_with_may_change(text):
    marks = t2s.marks()
    if marks is None:
        pytest.skip("OpenCC's dictionaries cannot be read here")
    assert compiled.any_marked(text, marks) == t2s.may_change(text)


@needs_native
def test_any_marked_agrees_on_every_character_and_devset_text(devset_texts):
    marks = t2s.marks()
    if marks is None:
        pytest.skip("OpenCC's dictionaries cannot be read here")
    for cp in range(0x110000):
        character = chr(cp)
        assert compiled.any_marked(character, marks) == t2s.may_change(character), hex(cp)
    for text in devset_texts:
        assert compiled.any_marked(text, marks) == t2s.may_change(text)


def _parts_one_by_one(texts, simplify_script=True):
    return [punctuated_parts(fold_and_simplify(text, simplify_script)) for text in texts]


@needs_native
@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_TEXT, max_size=12), st.booleans())
def test_a_batch_of_texts_has_each_texts_own_tokens(texts, simplify_script):
    """``punctuated_parts_many`` (fold, the t2s check and the runs of a batch in one call) gives each text it
    takes what the text alone gets; a text it leaves (None) is one the plain way must take."""
    texts = [t for t in texts if "\ud800" not in t or not simplify_script]  # (OpenCC cannot encode those)
    batch = punctuated_parts_many(texts, TokenizerSettings(), simplify_script)
    assert len(batch) == len(texts)
    for text, parts, alone in zip(texts, batch, _parts_one_by_one(texts, simplify_script)):
        assert parts is None or parts == alone, ascii(text)
        if parts is None:
            assert compiled.fold(text) is None or ASTRAL_CHARACTER.search(text) or ASTRAL_CHARACTER.search(
                fold_and_simplify(text, simplify_script)), ascii(text)


@needs_native
def test_a_batch_of_devset_texts_has_each_texts_own_tokens(devset_texts):
    batch = punctuated_parts_many(devset_texts)
    assert all(parts is None or parts == alone for parts, alone in zip(batch, _parts_one_by_one(devset_texts)))
    assert sum(parts is not None for parts in batch) > 0.95 * len(devset_texts)
    # the texts OpenCC may change are converted and stay on the batch path too
    converted = [text for text in devset_texts if t2s.may_change(fold_in_python(text))]
    assert len(converted) > 100
    assert sum(parts is not None for parts in punctuated_parts_many(converted)) > 0.9 * len(converted)


@needs_native
def test_without_t2s_dictionaries_the_batch_leaves_every_text_to_the_plain_way(devset_texts, monkeypatch):
    monkeypatch.setattr(t2s, "marks", lambda: None)
    assert punctuated_parts_many(devset_texts[:50]) == [None] * 50
    assert punctuated_parts_many(devset_texts[:50], simplify_script=False) == _parts_one_by_one(devset_texts[:50],
                                                                                                 False)
    assert fingerprints(devset_texts[:50], FingerprintSettings()) == [
        fp.fingerprint(text, FingerprintSettings()) for text in devset_texts[:50]]


@pytest.fixture
def python_only(monkeypatch):
    """Every compiled path off: the Python twins alone."""
    use_python_twins(monkeypatch)


def _tokens_of(texts):
    return [punctuated_parts(fold_and_simplify(text)) for text in texts]


def _both_ways(token_lists, settings_, monkeypatch):
    fast = simhashes_of_tokens(token_lists, settings_)
    with monkeypatch.context() as m:
        use_python_twins(m)
        plain = simhashes_of_tokens(token_lists, settings_)
    return fast, plain


_TOKENS = st.lists(st.lists(st.sampled_from(["a", "b", "c", "的", "了", "the", "of", " ", "数据", "库", "x" * 20,
                                             "中文"]), min_size=1, max_size=30), min_size=1, max_size=12)


@needs_native
@settings(max_examples=examples(300), deadline=None)
@given(_TOKENS, st.sampled_from(["tf", "sublinear_tf", "binary"]), st.sampled_from([0, 1, 3, 50, 1000]),
       st.booleans(), st.integers(0, 2**64 - 1))
def test_simhashes_agree_with_numpy(token_lists, weighting, bigrams, stopwords, seed):
    """Few distinct tokens, so equal weights cancel and sums land exactly on zero: both decide those exactly."""
    if not bigrams:
        token_lists = token_lists[:1]  # simhashes_of_tokens serves the bigram recipes; the plain one too
    settings_ = FingerprintSettings(tokenizer=TokenizerSettings(stopwords=stopwords), weighting=weighting,
                                    bigrams=bigrams, seed=seed)
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, plain = _both_ways(token_lists, settings_, monkeypatch)
    assert fast == plain


@needs_native
def test_simhashes_of_long_texts_agree_with_numpy(monkeypatch):
    """Past FEW_FEATURES features the compiled sums go through byte bins."""
    words = [f"w{i % 701}" for i in range(5000)]
    token_lists = [words[:n] for n in (10, 255, 256, 257, 600, 5000)] + [["的"] * 400, [" "] * 3 + ["a"]]
    for weighting in ("tf", "sublinear_tf", "binary"):
        fast, plain = _both_ways(token_lists, FingerprintSettings(weighting=weighting), monkeypatch)
        assert fast == plain


@needs_native
def test_a_vocabulary_that_starts_again_mid_batch_gives_the_same_fingerprints(monkeypatch):
    monkeypatch.setattr(fp, "VOCABULARY_LIMIT", 64)
    fp._vocabulary.cache_clear()
    try:
        token_lists = [[f"t{i}-{j}" for j in range(40)] for i in range(6)]
        fast, plain = _both_ways(token_lists, FingerprintSettings(), monkeypatch)
        assert fast == plain
    finally:
        fp._vocabulary.cache_clear()


@needs_native
@pytest.mark.parametrize("settings_", [
    FingerprintSettings(),
    pytest.param(FingerprintSettings(weighting="sublinear_tf", bigrams=0), marks=pytest.mark.slow),
    pytest.param(FingerprintSettings(tokenizer=TokenizerSettings(stopwords=False)), marks=pytest.mark.slow)],
    ids=["default", "sublinear-no-bigrams", "no-stopwords"])
def test_devset_fingerprints_are_those_of_the_pure_python_pipeline(devset_texts, monkeypatch, settings_):
    """The other settings on every devset text are ``slow`` (issue 35: the whole suite runs them, as
    ``tests/test_fast_paths.py``'s devset runs); ``-m "not slow"`` holds them to Python on generated tokens
    (``test_simhashes_agree_with_numpy``: every weighting, bigrams and stopwords) and on long texts."""
    fast = fingerprints(devset_texts, settings_)
    with monkeypatch.context() as m:
        use_python_twins(m)
        plain = fingerprints(devset_texts, settings_)
    assert fast == plain


def _instruction_sets() -> list[int]:
    """The instruction sets ``minhashes`` can run here (1 baseline, 2 AVX2, 3 AVX-512)."""
    found, one = [], np.zeros(1, dtype=np.uint64)
    for isa in (1, 2, 3):
        try:
            compiled.minhashes(one, np.ones(1, dtype=np.int64), one | 1, one, np.empty(1, dtype=np.uint32), isa)
        except ValueError:
            continue
        found.append(isa)
    return found


@needs_native
@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=300), min_size=1, max_size=8),
       st.sampled_from([16, 128, 1024]), st.integers(0, 2**63))
def test_minhashes_agree_with_numpy_on_every_instruction_set(hash_sets, num_perm, seed):
    """Hashes at the ends of the range included (0, 2**64 - 1, where a * h + b wraps around)."""
    a, b = MinHashSettings(num_perm=num_perm, seed=seed).permutations
    lengths = np.array([len(h) for h in hash_sets], dtype=np.int64)
    values = np.array([v for h in hash_sets for v in h], dtype=np.uint64)
    expected = minhash_signature._signatures_in_numpy(values, lengths, a, b,
                                                      np.empty((len(hash_sets), num_perm), dtype=np.uint32))
    for isa in [0, *_instruction_sets()]:
        out = np.empty((len(hash_sets), num_perm), dtype=np.uint32)
        compiled.minhashes(values, lengths, a, b, out, isa)
        assert (out == expected).all(), isa


@needs_native
def test_devset_signatures_are_those_of_numpy(devset_texts, monkeypatch):
    assert 1 in _instruction_sets()
    settings_ = MinHashSettings()
    hash_sets = [minhash_signature.shingle_hashes(text, settings_) for text in devset_texts]
    fast = minhash_signature.signatures(hash_sets, settings_)
    with monkeypatch.context() as m:
        use_python_twins(m)
        plain = minhash_signature.signatures(hash_sets, settings_)
    assert (fast == plain).all()


@needs_native
@settings(max_examples=examples(100), deadline=None)
@given(st.integers(0, 50), st.sampled_from([16, 128, 1024]), st.floats(0.3, 0.95), st.integers(0, 2**32))
def test_band_keys_agree_with_hashlib(texts, num_perm, threshold, seed):
    """Every layout's bands (1 to 64 of them, a row up to whole signatures), signatures of random values and
    of the extremes (0, 2**32 - 1): the keys PostgreSQL's md5() gives too (tests/test_minhash.py)."""
    settings_ = MinHashSettings(num_perm=num_perm, threshold=threshold)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 2**32, (texts, num_perm), dtype=np.uint32)
    rows[: texts // 4] = rng.choice(np.array([0, 2**32 - 1], dtype=np.uint32), (texts // 4, num_perm))
    expected = np.full((texts, settings_.bands), 7, dtype=np.int64)
    minhash_signature._band_keys_in_python(rows, num_perm, settings_.rows, expected)
    out = np.full((texts, settings_.bands), 7, dtype=np.int64)
    assert compiled.band_keys(rows, num_perm, settings_.rows, out) is None
    assert out.tolist() == expected.tolist()
    assert minhash_signature.band_keys_array(rows, settings_).tolist() == expected.tolist()
    assert [list(minhash_signature.band_keys(row, settings_)) for row in rows] == expected.tolist()


@needs_native
def test_band_keys_of_a_slice_and_of_another_byte_order_are_those_of_the_stored_bytes():
    """A strided view and big-endian values are the stored little-endian bytes' keys (band_keys_array makes
    them contiguous little-endian; the compiled function takes only C-contiguous 4-byte items)."""
    settings_ = MinHashSettings()
    rows = np.random.default_rng(3).integers(0, 2**32, (40, 256), dtype=np.uint32)
    view = rows[::2, ::2]
    expected = [list(minhash_signature.band_keys(row, settings_)) for row in view]
    assert minhash_signature.band_keys_array(view, settings_).tolist() == expected
    assert minhash_signature.band_keys_array(view.astype(">u4"), settings_).tolist() == expected
    with pytest.raises(ValueError):
        compiled.band_keys(view, 128, settings_.rows, np.empty((20, settings_.bands), dtype=np.int64))


@needs_native
def test_bad_arguments_are_errors_not_crashes():
    ids = np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="shorter"):
        compiled.token_ids([["a", "b"], ["c", "d"]], {"a": 0}, ids)
    with pytest.raises(ValueError, match="longer"):
        compiled.token_ids([["a"]], {"a": 0}, ids)
    hashes, kinds, out = np.zeros(2, dtype=np.uint64), np.zeros(2, dtype=np.int8), np.zeros(1, dtype=np.uint64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        compiled.simhashes(np.array([5], dtype=np.int64), np.array([1], dtype=np.int64), hashes, kinds,
                           fp._SUBLINEAR, out, 0, 50, True)
    with pytest.raises(ValueError, match="add up"):
        compiled.simhashes(np.array([0], dtype=np.int64), np.array([2], dtype=np.int64), hashes, kinds,
                           fp._SUBLINEAR, out, 0, 50, True)
    with pytest.raises(TypeError):
        compiled.fold(b"bytes")
    with pytest.raises(ValueError, match="8,192 bytes"):
        compiled.any_marked("text", b"\0" * 100)
    with pytest.raises(TypeError):
        compiled.any_marked(b"bytes", b"\0" * 8192)
    with pytest.raises(ValueError, match="8,192 bytes"):
        compiled.auto_runs(["text"], b"\0" * 100)
    with pytest.raises(TypeError):
        compiled.auto_runs(["text", b"bytes"], None)
    with pytest.raises(TypeError):
        compiled.auto_runs(("a tuple",), None)
    one, four = np.ones(4, dtype=np.uint64), np.empty(4, dtype=np.uint32)
    with pytest.raises(ValueError, match="at least one shingle"):
        compiled.minhashes(one, np.array([0, 4], dtype=np.int64), one, one, np.empty(8, dtype=np.uint32))
    with pytest.raises(ValueError, match="add up"):
        compiled.minhashes(one, np.array([3], dtype=np.int64), one, one, four)
    with pytest.raises(ValueError, match="texts x permutations"):
        compiled.minhashes(one, np.array([4], dtype=np.int64), one, one, np.empty(3, dtype=np.uint32))
    with pytest.raises(ValueError, match="same 1 to 1024"):
        compiled.minhashes(one, np.array([4], dtype=np.int64), one, one[:2], four)
    with pytest.raises(ValueError, match="instruction set 7"):
        compiled.minhashes(one, np.array([4], dtype=np.int64), one, one, four, 7)
    with pytest.raises(ValueError, match="items of 4 bytes"):
        compiled.minhashes(one, np.array([4], dtype=np.int64), one, one, np.empty(4, dtype=np.uint64))
    signatures, keys = np.zeros((2, 16), dtype=np.uint32), np.empty((2, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="whole rows"):
        compiled.band_keys(signatures, 24, 4, keys)
    with pytest.raises(ValueError, match="whole rows"):
        compiled.band_keys(signatures, 16, 17, keys)
    with pytest.raises(ValueError, match="whole rows"):
        compiled.band_keys(signatures, 16, 0, keys)
    with pytest.raises(ValueError, match="texts x bands"):
        compiled.band_keys(signatures, 16, 4, np.empty(7, dtype=np.int64))
    with pytest.raises(ValueError, match="within the signature"):
        compiled.band_keys(signatures, 16, 5, keys)
    with pytest.raises(ValueError, match="items of 8 bytes"):
        compiled.band_keys(signatures, 16, 4, np.empty((2, 4), dtype=np.int32))
    with pytest.raises(ValueError, match="items of 4 bytes"):
        compiled.band_keys(signatures.view(np.uint8), 16, 4, keys)
    with pytest.raises(BufferError):
        compiled.band_keys(signatures, 16, 4, bytes(64))  # read-only
    # a num_perm whose bytes overflow Py_ssize_t was a division by zero (SIGFPE), not an error
    with pytest.raises(ValueError, match="whole rows"):
        compiled.band_keys(signatures, 2**62, 1, keys)


@needs_native
def test_token_ids_hands_back_the_new_tokens_in_order():
    ids = np.zeros(5, dtype=np.int64)
    assert compiled.token_ids([["a", "b"], ["c", "a", "b"]], {"a": 7}, ids) == ["b", "c", "b"]
    assert ids.tolist() == [7, -1, -1, 7, -1]
    assert compiled.token_ids([["a"], []], {"a": 7}, ids[:1]) == []
