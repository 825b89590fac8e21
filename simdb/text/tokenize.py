"""Normalized text -> tokens.

The ``auto`` tokenizer cuts text into runs by script and tokenizes each run the
way that script wants:

* Han characters: jieba's segmentation (dictionary only; its HMM for unknown words is
  off by default because it makes segmentation of the same phrase depend on context),
  run by jieba-rs where that gives the same tokens (:mod:`.segment`);
* scripts written without spaces (Thai, Lao, Khmer, Myanmar, Japanese kana):
  character n-gram shingles, since there are no words to split on;
* everything else: the space-delimited words that normalization left.

Stop words (a short list for Chinese and English) are dropped. The other
tokenizers force one treatment for the whole text: ``words``, ``jieba``, or
``shingles`` (character n-grams, spaces removed).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .. import native
from . import t2s
from .characters import punctuated_runs
from .normalize import ascii_words, fold_and_simplify, strip_punctuation, text_pieces
from .scripts import HAN, OTHER_WITHOUT_SPACES
from .segment import cut, cutter

TOKENIZERS = ("auto", "words", "jieba", "shingles")

_RUNS = re.compile(rf"([{HAN}]+)|([{OTHER_WITHOUT_SPACES}]+)|([^\s{HAN}{OTHER_WITHOUT_SPACES}]+)")

STOPWORDS_ZH = frozenset(
    "的 了 是 在 和 与 及 或 也 都 就 而 着 过 之 于 以 把 被 给 对 从 向 这 那 其 它 "
    "他 她 我 你 们 我们 你们 他们 一个 没有 不 有 为 个 上 中 等 吗 呢 吧 啊 呀 "
    "并 但 则 即 所 这个 那个 这些 那些 如果 因为 所以 可以 已经".split())
STOPWORDS_EN = frozenset(
    "a an the and or but if then of to in on at by for with from as is are was were be been "
    "being it its this that these those there here he she they we you i me my our your his her "
    "their them not no so do does did has have had will would can could shall should may might "
    "into onto than too very also just about over under up down out".split())
STOPWORDS = STOPWORDS_ZH | STOPWORDS_EN


@dataclass(frozen=True)
class TokenizerSettings:
    """Everything that changes which tokens a text yields; stored with the index."""

    name: str = "auto"
    jieba_hmm: bool = False
    shingle_size: int = 3
    stopwords: bool = True

    def __post_init__(self) -> None:
        if self.name not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {self.name!r}: choose one of {', '.join(TOKENIZERS)}")
        if not 1 <= self.shingle_size <= 16:
            raise ValueError(f"shingle size must be between 1 and 16, not {self.shingle_size}")


def shingles(text: str, size: int) -> list[str]:
    """Overlapping character n-grams; a text shorter than ``size`` is one shingle."""
    if len(text) <= size:
        return [text] if text else []
    return [text[i:i + size] for i in range(len(text) - size + 1)]


def jieba_tokens(text: str, hmm: bool) -> list[str]:
    return [token for token in cut(text, hmm) if not token.isspace()]


def _without_stopwords(tokens: list[str], settings: TokenizerSettings) -> list[str]:
    if settings.stopwords:
        kept = [token for token in tokens if token not in STOPWORDS]
        if kept:  # a text made only of stop words still has a fingerprint
            return kept
    return tokens


def tokenize(normalized: str, settings: TokenizerSettings = TokenizerSettings()) -> list[str]:
    """Tokens of already-normalized text (see :func:`simdb.text.normalize.normalize`)."""
    if settings.name == "words":
        tokens = normalized.split()
    elif settings.name == "jieba":
        tokens = jieba_tokens(normalized, settings.jieba_hmm)
    elif settings.name == "shingles":
        tokens = shingles(normalized.replace(" ", ""), settings.shingle_size)
    else:  # grouped by kind, each kind in text order (what the fast path gives)
        han, words, shingled = _auto_kinds(normalized, settings)
        tokens = han + words + shingled
    return _without_stopwords(tokens, settings)


def _auto_kinds(normalized: str, settings: TokenizerSettings) -> tuple[list[str], list[str], list[str]]:
    """The ``auto`` tokenizer's tokens of normalized text by kind, each in text order: the Han tokens, the words,
    the shingles of the scripts without spaces (stop words still in)."""
    han_runs: list[str] = []
    words: list[str] = []
    shingled: list[str] = []
    for han, nospace, word in _RUNS.findall(normalized):
        if han:
            han_runs.append(han)
        elif nospace:
            shingled.extend(shingles(nospace, settings.shingle_size))
        else:
            words.append(word)
    # the Han runs in one call, a space between two: jieba cuts at every space, so each is segmented alone
    return (jieba_tokens(" ".join(han_runs), settings.jieba_hmm) if han_runs else []), words, shingled


def _has_astral(text: str) -> bool:
    """Whether ``text`` holds a character beyond the Basic Multilingual Plane (compiled: without reading it)."""
    return native.has_astral(text)


def _punctuated_parts(folded: str, settings: TokenizerSettings) -> list[str]:
    """The Han tokens (with a ``" "`` between runs), then the words, then the shingles of folded text whose
    punctuation is still in, each kind in text order (by the compiled runs where built: see
    :func:`_punctuated_parts_in_python`)."""
    if folded.isascii():  # no Han, no script without spaces: only words (isascii reads a flag of the string)
        return ascii_words(folded)
    runs = native.runs(folded)
    if runs is None:
        return _punctuated_parts_in_python(folded, settings)
    return _parts_of_runs(runs, settings.shingle_size, cutter(settings.jieba_hmm))


def _parts_of_runs(runs: tuple[str, list[str], list[str], bool], shingle_size: int,
                   cut_: Callable[[str, bool | None], list[str]]) -> list[str]:
    """:func:`_punctuated_parts` of a text's compiled runs."""
    parts, words, shingled = _kinds_of_runs(runs, shingle_size, cut_)  # a new list: extended in place below
    parts += words
    parts += shingled
    return parts


def _kinds_of_runs(runs: tuple[str, list[str], list[str], bool], shingle_size: int,
                   cut_: Callable[[str, bool | None], list[str]]) -> tuple[list[str], list[str], list[str]]:
    """The Han tokens, the words and the shingles of a text's compiled runs."""
    han, words, nospace_runs, differs = runs
    shingled: list[str] = []
    for run in nospace_runs:
        shingled += shingles(run, shingle_size)
    return (cut_(han, differs) if len(han) > han.count(" ") else []), words, shingled


def _punctuated_parts_in_python(folded: str, settings: TokenizerSettings) -> list[str]:
    """:func:`_punctuated_parts` by its regexes (the compiled twin reads the same runs in one pass)."""
    parts, words, shingled = _punctuated_kinds_in_python(folded, settings)
    return parts + words + shingled


def _punctuated_kinds_in_python(folded: str, settings: TokenizerSettings
                                ) -> tuple[list[str], list[str], list[str]]:
    """The Han tokens, the words and the shingles of folded text, by its regexes."""
    not_han, nospace, word = punctuated_runs()
    # the Han runs, one space between two: jieba cuts at every space, so each run is segmented on its own
    han = not_han.sub(" ", folded)
    shingled: list[str] = []
    if nospace.search(folded):
        for run in nospace.findall(folded):
            shingled += shingles(run, settings.shingle_size)
    return (cut(han, settings.jieba_hmm) if han.strip() else []), word.findall(folded), shingled


def punctuated_kinds(folded: str, settings: TokenizerSettings = TokenizerSettings()
                     ) -> tuple[list[str], list[str], list[str]]:
    """:func:`punctuated_parts` of folded text by kind: the Han tokens, the words, the shingles (each in text
    order, stop words and the spaces between Han runs possibly still in, to be dropped with the rest of a
    text's tokens). A long text's pieces are read this way (:func:`text_pieces`): each kind of the whole
    text is its pieces' tokens of that kind, one after another."""
    if settings.name != "auto":
        raise ValueError("punctuated_kinds is the auto tokenizer's")
    if folded.isascii():
        return [], ascii_words(folded), []
    if _has_astral(folded):  # rare: the plain way
        return _auto_kinds(strip_punctuation(folded), settings)
    runs = native.runs(folded)
    if runs is None:
        return _punctuated_kinds_in_python(folded, settings)
    return _kinds_of_runs(runs, settings.shingle_size, cutter(settings.jieba_hmm))


def punctuated_parts(folded: str, settings: TokenizerSettings = TokenizerSettings()) -> list[str]:
    """The ``auto`` tokens of folded text whose punctuation is still in, in order (the Han tokens, then the words,
    then the shingles, each kind in text order), before :func:`dropped` drops the spaces between Han runs and
    the stop words; empty when the text has none. The fast path of fingerprints with bigrams, which drop
    those tokens for a whole batch at once."""
    if settings.name != "auto":
        raise ValueError("punctuated_parts is the auto tokenizer's")
    if not folded.isascii() and _has_astral(folded):  # rare: the plain way (nothing left to drop)
        return tokenize(strip_punctuation(folded), settings)
    return _punctuated_parts(folded, settings)


def punctuated_parts_many(texts: list[str], settings: TokenizerSettings = TokenizerSettings(),
                          simplify_script: bool = True) -> list[list[str] | None]:
    """``punctuated_parts(fold_and_simplify(text, simplify_script), settings)`` of each text, where the
    compiled paths take it the whole way, and None for each other text (the caller takes it the plain way):
    fold, the t2s check and the runs of the whole batch in one compiled call, OpenCC only for the texts it
    may change, and the segmenter chosen once. A short text's fingerprint spends a third of its time in the
    calls between those stages otherwise. All None where the compiled module is not built, or where t2s's
    dictionaries cannot be read (every Han text is then converted)."""
    marks = t2s.marks() if simplify_script else None
    if settings.name != "auto" or (simplify_script and marks is None):
        return [None] * len(texts)
    cut_, size, convert, runs_of = cutter(settings.jieba_hmm), settings.shingle_size, t2s.convert, native.runs
    parts: list[list[str] | None] = []
    for runs in native.auto_runs(texts if isinstance(texts, list) else list(texts), marks):
        if runs.__class__ is str:  # folded text that OpenCC may change
            runs = runs_of(convert(runs))
        parts.append(None if runs is None else _parts_of_runs(runs, size, cut_))
    return parts


def dropped(tokens: list[str], settings: TokenizerSettings = TokenizerSettings()) -> list[str]:
    """``tokens`` without the spaces between Han runs and, unless every token is one, without stop words."""
    return _without_stopwords([token for token in tokens if token != " "], settings)


def punctuated_tokens(folded: str, settings: TokenizerSettings = TokenizerSettings()) -> list[str]:
    """``tokenize(strip_punctuation(folded))`` without building the stripped text, as :func:`count_punctuated`
    does, but in order: the Han tokens, then the words, then the shingles, each kind in text order. The tests
    hold the two equal."""
    return dropped(punctuated_parts(folded, settings), settings)


def count_punctuated(folded: str, settings: TokenizerSettings = TokenizerSettings()) -> Counter:
    """The ``auto`` tokens of folded (for ``simhash64-v2`` also simplified) text whose punctuation and symbols
    are still in, counted: ``Counter(tokenize(strip_punctuation(folded)))`` without building the stripped
    text, with one call of the segmenter and no loop over the tokens in Python. The fingerprint's fast path
    (a SimHash does not depend on the order of its features); the tests hold the two equal.
    """
    if settings.name != "auto":
        raise ValueError("count_punctuated is the auto tokenizer's")
    if _has_astral(folded):  # rare: the plain way
        return Counter(tokenize(strip_punctuation(folded), settings))
    return _counted(Counter(_punctuated_parts(folded, settings)), settings)


def _counted(counts: Counter, settings: TokenizerSettings) -> Counter:
    """The counts of a text's ``auto`` parts without the spaces between Han runs and, unless every token is one,
    the stop words."""
    counts.pop(" ", None)  # (only the Han tokens hold spaces)
    if settings.stopwords:
        dropped = STOPWORDS.intersection(counts)
        if len(dropped) < len(counts):  # a text made only of stop words still has a fingerprint
            for token in dropped:
                del counts[token]
    return counts


def count_pieces(text: str, settings: TokenizerSettings, simplify_script: bool, size: int) -> Counter:
    """``count_punctuated(fold_and_simplify(text, simplify_script), settings)`` a piece of ``size`` characters
    at a time (:func:`text_pieces`), so that no list of the whole text's tokens is ever built."""
    counts: Counter = Counter()
    for kinds in kinds_in_pieces(text, settings, simplify_script, size):
        for tokens in kinds:
            counts.update(tokens)
    return _counted(counts, settings)


def kinds_in_pieces(text: str, settings: TokenizerSettings, simplify_script: bool, size: int
                    ) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """:func:`punctuated_kinds` of ``fold_and_simplify(text, simplify_script)``, a piece of about ``size``
    characters at a time (:func:`text_pieces`): the whole text's tokens of each kind are the pieces' tokens of
    that kind, one piece after another (with a space between Han runs dropped or added, which the tokens'
    users drop anyway)."""
    for piece in text_pieces(text, size):
        yield punctuated_kinds(fold_and_simplify(piece, simplify_script), settings)
