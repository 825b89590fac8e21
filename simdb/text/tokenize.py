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
from dataclasses import dataclass

from .scripts import HAN, OTHER_WITHOUT_SPACES
from .segment import cut

TOKENIZERS = ("auto", "words", "jieba", "shingles")

_RUNS = re.compile(rf"(?P<han>[{HAN}]+)|(?P<nospace>[{OTHER_WITHOUT_SPACES}]+)"
                   rf"|(?P<word>[^\s{HAN}{OTHER_WITHOUT_SPACES}]+)")

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


def tokenize(normalized: str, settings: TokenizerSettings = TokenizerSettings()) -> list[str]:
    """Tokens of already-normalized text (see :func:`simdb.text.normalize.normalize`)."""
    if settings.name == "words":
        tokens = normalized.split()
    elif settings.name == "jieba":
        tokens = jieba_tokens(normalized, settings.jieba_hmm)
    elif settings.name == "shingles":
        tokens = shingles(normalized.replace(" ", ""), settings.shingle_size)
    else:
        tokens = []
        for run in _RUNS.finditer(normalized):
            if run.lastgroup == "han":
                tokens.extend(jieba_tokens(run.group(), settings.jieba_hmm))
            elif run.lastgroup == "nospace":
                tokens.extend(shingles(run.group(), settings.shingle_size))
            else:
                tokens.append(run.group())
    if settings.stopwords:
        kept = [token for token in tokens if token not in STOPWORDS]
        if kept:  # a text made only of stop words still has a fingerprint
            tokens = kept
    return tokens
