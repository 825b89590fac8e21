"""A sample corpus of real text that every Python installation carries.

The base documents are sections of the Python language reference that ship
with CPython itself (``pydoc_data.topics``), so the corpus needs no download.
A seeded fraction of them get edited copies of known kinds (``exact`` reposts too); each copy's
metadata names its ``copy_of`` and ``edit``, so a run can be checked against
what was planted. ``light`` edits should be found as near-duplicates;
``rewrite`` copies (a third of the words replaced) should not.

    python -m simdb.samples corpus.jsonl
    python -m simdb.samples --short short.jsonl   # one sentence each, with small edits

The short corpus (:func:`short_corpus`) is the first sentence of each topic, with copies that change one
word, swap two letters or drop the last words: near-duplicates a short text's SimHash often misses.
"""

from __future__ import annotations

import random
import re
import sys
from . import jsonlines
from collections.abc import Callable, Iterable, Iterator, Sequence

EDITS = ("exact", "typo", "drop_sentence", "boilerplate", "punctuation", "case_whitespace", "rewrite")
_BOILERPLATE = "Reposted from the Python documentation archive. All rights reserved."


def sections(max_chars: int = 1500, min_chars: int = 400) -> Iterator[tuple[str, str]]:
    """(topic, text) chunks of the language reference, cut at paragraph breaks."""
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        chunk: list[str] = []
        size = 0
        for paragraph in re.split(r"\n\s*\n", topics[topic]):
            chunk.append(paragraph)
            size += len(paragraph)
            if size >= max_chars:
                yield topic, "\n\n".join(chunk)
                chunk, size = [], 0
        if size >= min_chars:
            yield topic, "\n\n".join(chunk)


def edit(text: str, kind: str, rng: random.Random) -> str:
    words = text.split(" ")
    if kind == "exact":
        return text
    if kind == "typo":
        for _ in range(3):
            i = rng.randrange(len(words))
            word = words[i]
            if len(word) > 3:
                j = rng.randrange(len(word) - 1)
                words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2:]
        return " ".join(words)
    if kind == "drop_sentence":
        sentences = re.split(r"(?<=\.)\s+", text)
        if len(sentences) > 3:
            del sentences[rng.randrange(len(sentences))]
        return " ".join(sentences)
    if kind == "boilerplate":
        return f"{text}\n\n{_BOILERPLATE}"
    if kind == "punctuation":
        return text.replace(",", " ,").replace(".", "!").replace('"', "'")
    if kind == "case_whitespace":
        return re.sub(r"\s+", "  ", text.upper())
    if kind == "rewrite":
        vocabulary = [w for w in words if w.isalpha()] or ["word"]
        return " ".join(rng.choice(vocabulary) if rng.random() < 0.33 else w for w in words)
    raise ValueError(f"unknown edit {kind!r}")


def corpus(seed: int = 2007, copy_fraction: float = 0.3) -> Iterator[dict]:
    """Base sections and edited copies, as ``{"id", "text", "source", ...}`` records."""
    return _with_copies(sections(), "ref", EDITS, edit, seed, copy_fraction)


def _with_copies(bases: Iterable[tuple[str, str]], prefix: str, edits: Sequence[str],
                 edited: Callable[[str, str, random.Random], str], seed: int,
                 copy_fraction: float) -> Iterator[dict]:
    """Each (topic, text) as a record, and a seeded ``copy_fraction`` of them with an edited copy that names its
    ``copy_of`` and ``edit``."""
    rng = random.Random(seed)
    for number, (topic, text) in enumerate(bases, 1):
        base_id = f"{prefix}-{number:04d}"
        yield {"id": base_id, "text": text, "source": f"python-reference:{topic}"}
        if rng.random() < copy_fraction:
            kind = edits[rng.randrange(len(edits))]
            yield {"id": f"{base_id}-{kind}", "text": edited(text, kind, rng), "source": f"python-reference:{topic}",
                   "copy_of": base_id, "edit": kind}


#: Edits of a short text, each small enough that the copy stays a near-duplicate (Jaccard >= 0.8 of shingles).
SHORT_EDITS = ("one_typo", "dropped_ending", "one_word")


def short_texts(min_words: int = 30, max_chars: int = 320) -> Iterator[tuple[str, str]]:
    """(topic, sentence): the first sentence of each prose paragraph of the language reference, where it is short
    (headings, their underlines and indented code left out) yet has ``min_words``: with fewer, one changed word
    takes a copy below a Jaccard similarity of 0.8 of word 3-grams, and it is no near-duplicate."""
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[topic]):
            if paragraph.startswith(" ") or re.search(r"^[*=~-]{3,}$", paragraph, re.MULTILINE):
                continue
            sentence = re.split(r"(?<=\.)\s", " ".join(paragraph.split()), maxsplit=1)[0]
            if len(sentence.split()) >= min_words and len(sentence) <= max_chars and sentence.endswith("."):
                yield topic, sentence


def short_edit(text: str, kind: str, rng: random.Random) -> str:
    words = text.split(" ")
    long_words = [i for i, word in enumerate(words) if len(word) > 4 and word.isalpha()] or [0]
    i = rng.choice(long_words)
    if kind == "one_typo":  # two neighbouring letters swapped
        j = rng.randrange(1, max(2, len(words[i]) - 2))
        words[i] = words[i][:j] + words[i][j + 1] + words[i][j] + words[i][j + 2:]
    elif kind == "dropped_ending":  # the last words cut off
        words = words[:-2]
    elif kind == "one_word":
        words[i] = rng.choice([w for w in ("several", "certain", "other", "related") if w != words[i]])
    else:
        raise ValueError(f"unknown edit {kind!r}")
    return " ".join(words)


def short_corpus(seed: int = 2007, copy_fraction: float = 0.4) -> Iterator[dict]:
    """Short texts (one sentence each) and edited copies, labelled like :func:`corpus`'s."""
    return _with_copies(short_texts(), "short", SHORT_EDITS, short_edit, seed, copy_fraction)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    short = argv[:1] == ["--short"]
    if len(argv) != 1 + short:
        sys.exit("usage: python -m simdb.samples [--short] OUTPUT.jsonl")
    count = 0
    with open(argv[-1], "w", encoding="utf-8") as out:
        for record in (short_corpus() if short else corpus()):
            out.write(jsonlines.dumps(record) + "\n")
            count += 1
    print(f"wrote {count} {'short texts' if short else 'documents'} to {argv[-1]}")


if __name__ == "__main__":
    main()
