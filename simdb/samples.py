"""A sample corpus of real text that every Python installation carries.

The base documents are sections of the Python language reference that ship
with CPython itself (``pydoc_data.topics``), so the corpus needs no download.
A seeded fraction of them get edited copies of known kinds (``exact`` reposts too); each copy's
metadata names its ``copy_of`` and ``edit``, so a run can be checked against
what was planted. ``light`` edits should be found as near-duplicates;
``rewrite`` copies (a third of the words replaced) should not.

    python -m simdb.samples corpus.jsonl
"""

from __future__ import annotations

import random
import re
import sys
from . import jsonlines
from collections.abc import Iterator

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
    rng = random.Random(seed)
    for number, (topic, text) in enumerate(sections(), 1):
        base_id = f"ref-{number:04d}"
        yield {"id": base_id, "text": text, "source": f"python-reference:{topic}"}
        if rng.random() < copy_fraction:
            kind = EDITS[rng.randrange(len(EDITS))]
            yield {"id": f"{base_id}-{kind}", "text": edit(text, kind, rng), "source": f"python-reference:{topic}",
                   "copy_of": base_id, "edit": kind}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m simdb.samples OUTPUT.jsonl")
    count = 0
    with open(argv[0], "w", encoding="utf-8") as out:
        for record in corpus():
            out.write(jsonlines.dumps(record) + "\n")
            count += 1
    print(f"wrote {count} documents to {argv[0]}")


if __name__ == "__main__":
    main()
