"""Which characters belong to which kind of script: the one definition simdb uses.

* Han (CJK unified ideographs, extensions A-G, compatibility ideographs): segmented by jieba.
* Other scripts written without spaces between words (Thai, Lao, Myanmar, Khmer, Japanese kana):
  cut into character shingles, there being no words to split on.

``WITHOUT_SPACES`` is both together: text mostly in them is shingled by characters in MinHash mode.
"""

from __future__ import annotations

import re

HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
OTHER_WITHOUT_SPACES = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u31f0-\u31ff"
WITHOUT_SPACES = HAN + OTHER_WITHOUT_SPACES

HAN_CHARACTER = re.compile(f"[{HAN}]")
#: A character beyond the Basic Multilingual Plane. ``re`` matches a class of BMP characters by table lookup but
#: tests an astral range one by one, so the fast paths' classes hold BMP characters only and text with an
#: astral character goes the plain way.
ASTRAL_CHARACTER = re.compile("[\U00010000-\U0010ffff]")
WITHOUT_SPACES_CHARACTER = re.compile(f"[{WITHOUT_SPACES}]")


def expand(ranges: str) -> list[str]:
    """The characters of a regular-expression class body made only of characters and ``a-b`` ranges, such as
    :data:`HAN`."""
    characters, i = [], 0
    while i < len(ranges):
        if i + 2 < len(ranges) and ranges[i + 1] == "-":
            characters.extend(chr(cp) for cp in range(ord(ranges[i]), ord(ranges[i + 2]) + 1))
            i += 3
        else:
            characters.append(ranges[i])
            i += 1
    return characters


def character_class(characters) -> str:
    """A regular-expression class body (ranges, escaped) matching exactly ``characters``."""
    points = sorted({ord(c) for c in characters})
    parts, i = [], 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        first, last = re.escape(chr(points[i])), re.escape(chr(points[j]))
        parts.append(first if i == j else f"{first}-{last}")
        i = j + 1
    return "".join(parts)
