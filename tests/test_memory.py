"""Memory is bounded by the chunk and the largest text, not by the archive, and the sketches do not change.

A long text is folded, simplified and tokenized a piece at a time, its SimHash tokens held as ids and its
MinHash shingles hashed a window at a time; the compiled SimHash sums hold what a text has distinct; exact
MinHash decisions hold the texts of a bounded number of documents at once. The measures here are
deterministic: tracemalloc's high-water mark of the Python heap (numpy's arrays included), the texts asked
for at once, and for the compiled code the peak RSS of a fresh process against what its input takes. The
sketches are held to what the whole text gives, with the pieces and windows made small enough that every
devset text is cut into many.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap
import tracemalloc
import unicodedata

import numpy as np
import pytest

import simdb.methods.minhash.signature as minhash_signature
import simdb.methods.simhash.fingerprint as fingerprint_module
import simdb.text.normalize as normalize_module
from simdb import native
from simdb.methods import Method
from simdb.methods.simhash.fingerprint import FingerprintSettings
from simdb.text import t2s
from simdb.text.normalize import PIECE_BOUNDARIES, fold_and_simplify, strip_punctuation, text_pieces
from tests.conftest import DEVSET

SENTENCE = re.compile(r"[^。！？；.!?\n]+[。！？；.!?]?")


def mixed_text(characters: int, seed: int = 7) -> str:
    """Real-looking text of ``characters`` characters: devset sentences, Chinese and English mixed."""
    files = [DEVSET / "docs" / "long-zh.jsonl", DEVSET / "docs" / "long-en.jsonl"]
    if not all(path.exists() for path in files):
        pytest.skip(f"no devset at {DEVSET} (set SIMDB_DEVSET to its folder)")
    sentences = [s for path in files for line in path.open(encoding="utf-8")
                 for s in SENTENCE.findall(json.loads(line)["text"])]
    rng, parts, size = random.Random(seed), [], 0
    while size < characters:
        parts.append(rng.choice(sentences) + " ")
        size += len(parts[-1])
    return "".join(parts)[:characters]


# -- where a text may be cut --------------------------------------------------------------------------------

@pytest.mark.parametrize("boundary", list(PIECE_BOUNDARIES))
def test_a_piece_boundary_changes_nothing_around_it(boundary):
    """Folding, t2s and the tokenizers treat each boundary alone: NFKC and case fold leave it, it composes with
    no character of the Basic Multilingual Plane on either side, no t2s dictionary key holds it, and the
    tokenizers read it as a separator."""
    nfkc = lambda text: unicodedata.normalize("NFKC", text)  # noqa: E731
    assert nfkc(boundary) == boundary == boundary.casefold()
    composes = [c for c in map(chr, range(0x10000)) if not 0xD800 <= ord(c) < 0xE000
                and (nfkc(c + boundary) != nfkc(c) + boundary or nfkc(boundary + c) != boundary + nfkc(c))]
    assert composes == []
    assert [key for key, _ in t2s.dictionary_entries() if boundary in key] == []
    assert strip_punctuation(f"a{boundary}b") == "a b"


def test_text_pieces_cut_only_after_a_boundary_and_join_to_the_text():
    rng = random.Random(3)
    alphabet = "ab中文。 \n\u3000，é\u0301"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        size = rng.randrange(1, 12)
        pieces = list(text_pieces(text, size))
        assert "".join(pieces) == text
        assert all(piece[-1] in PIECE_BOUNDARIES and len(piece) >= size for piece in pieces[:-1])


# -- the same sketches, a piece and a window at a time -------------------------------------------------------

def _sketches(texts: list[str]) -> dict[str, list]:
    simhash, minhash = Method.named("simhash").new(), Method.named("minhash").new()
    old_recipe = FingerprintSettings(bigrams=0)  # indexes created before bigrams: a Counter of the tokens
    return {"simhash": simhash.sketch_many(texts), "minhash": minhash.sketch_many(texts),
            "simhash without bigrams": [fingerprint_module.fingerprint(text, old_recipe) for text in texts],
            "shingle sets": [minhash_signature.shingle_set(text, minhash.settings).tolist() for text in texts],
            "folded": [fold_and_simplify(text) for text in texts]}


def test_small_pieces_and_windows_give_the_sketches_of_the_whole_texts(devset_texts, monkeypatch):
    """Every devset text (and long mixed ones) cut into pieces of 40 characters and shingled 32 at a time gives
    the fingerprints, signatures, shingle sets and folded text it gives whole."""
    rng = random.Random(11)
    texts = rng.sample(devset_texts, 600) + [mixed_text(20_000, seed) for seed in range(3)]
    texts += ["。" * 300 + "一二", "abc " * 200, "日本語のテキスト。" * 50, "\U0001f600 é\u0301 " * 100]
    whole = _sketches(texts)
    for module, name in ((normalize_module, "PIECE_CHARACTERS"), (fingerprint_module, "PIECE_CHARACTERS")):
        monkeypatch.setattr(module, name, 40)
    monkeypatch.setattr(minhash_signature, "WINDOW", 32)
    pieces = _sketches(texts)
    for kind in whole:
        assert [i for i, (a, b) in enumerate(zip(whole[kind], pieces[kind])) if a != b] == [], kind


# -- memory ----------------------------------------------------------------------------------------------------

def _python_peak(function, *arguments) -> int:
    """The high-water mark of the Python heap (numpy's arrays included) while ``function`` runs, in bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        function(*arguments)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("method", ["simhash", "minhash"])
def test_a_long_texts_sketch_holds_a_few_times_the_text(method):
    """A text of 1M characters (as the CLI holds it: a Python string, 2-4 bytes a character) is sketched within
    a few times its UTF-8 size on the Python heap: its tokens as strings took 27 times (SimHash) and its
    shingle arrays 20 times (MinHash)."""
    text = mixed_text(1_000_000)
    sketcher = Method.named(method).new()
    sketcher.sketch_many([text])  # what a process builds once (jieba's and OpenCC's dictionaries, tables) before
    size = len(text.encode("utf-8"))
    peak = _python_peak(sketcher.sketch_many, [text])
    assert peak < 6 * size, f"{method}: {peak / 2**20:.0f} MB for {size / 2**20:.1f} MB of UTF-8"


def test_exact_decisions_hold_the_texts_of_a_bounded_number_of_documents():
    """Exact MinHash decides many candidates a few thousand texts at a time, whatever their number (20,000
    pairs and up to 40,000 texts with their shingle sets were held at once, and a growing archive gives each
    chunk more), and decides each pair as the exact Jaccard of the two texts' shingles says."""
    method = Method.named("minhash").new(verify="exact")
    rng = random.Random(5)
    words = [f"w{i}" for i in range(40)]
    documents = {i: [rng.choice(words) for _ in range(30)] for i in range(1, 12_001)}
    for i in range(6_002, 12_001, 2):  # every other one a copy of its candidate with one word changed
        documents[i] = documents[i - 6_000].copy()
        documents[i][rng.randrange(30)] = rng.choice(words)
    documents = {i: " ".join(text) for i, text in documents.items()}
    later = np.arange(6_001, 12_001)
    candidates = np.stack([later, later - 6_000, np.zeros(len(later), dtype=np.int64)], axis=1)
    asked: list[int] = []

    def texts(ids: np.ndarray) -> dict[int, str]:
        asked.append(len(ids))
        return {int(i): documents[int(i)] for i in ids.tolist()}

    decided = method.decide(candidates, texts, method.max_distance)
    assert max(asked) <= 2_000 and sum(asked) == 12_000

    def jaccard_distance(a: str, b: str) -> int:  # the oracle: shingle sets of the input texts
        x, y = (set(minhash_signature.shingle_hashes(text, method.settings).tolist()) for text in (a, b))
        shared, union = len(x & y), len(x | y)
        return ((union - shared) * 10_000 + union - 1) // union

    expected = [(int(b), int(a), d) for b, a, _ in candidates.tolist()
                if (d := jaccard_distance(documents[b], documents[a])) <= method.max_distance]
    assert [tuple(row) for row in decided.tolist()] == expected


COMPILED_SUMS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from simdb import native
    from simdb.methods.simhash.fingerprint import _COMPILED_WEIGHTINGS, _SUBLINEAR
    compiled = native.module()
    vocabulary = 100
    ids = np.random.default_rng(1).integers(0, vocabulary, int(sys.argv[1]), dtype=np.int64)
    hashes = np.random.default_rng(2).integers(0, 2**63, vocabulary, dtype=np.int64).view(np.uint64)
    kinds, out = np.zeros(vocabulary, dtype=np.int8), np.empty(1, dtype=np.uint64)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    compiled.simhashes(ids, np.array([len(ids)]), hashes, kinds, _SUBLINEAR, out, _COMPILED_WEIGHTINGS["tf"], 50,
                       True)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
""")


@pytest.mark.skipif(not native.enabled(), reason="the compiled module is not built here")
def test_the_compiled_sums_hold_what_a_text_has_distinct_not_a_slot_per_token():
    """4M tokens of 100 distinct ones: the tables were sized by the tokens (249 MB above the ids); they hold the
    distinct tokens and bigrams now (the ids themselves take 32 MB, made before the measure)."""
    done = subprocess.run([sys.executable, "-c", COMPILED_SUMS, str(4_000_000)], capture_output=True, text=True,
                          check=True)
    assert int(done.stdout) < 64 * 2**20, f"{int(done.stdout) / 2**20:.0f} MB"
